"""bench/variants.py's pure-Python parts without a GPU: the exact count of visible (i, j) pairs (against the tests'
reference mask; chunks included), the cells (the chunk cells too), the interleaved timing loop (with a stand-in for
torch.cuda), the markdown table and the argument checks, the --backward cells, FLOPs and report, FA3's not-applicable
cells; and bench/flashcore_ctypes.py's variant arguments and backward struct size through the stub library (a 0.6 one,
a 0.5 one and a 0.4 one), with the backward params of the variant cells (variants.flashcore_backward_params)."""

import ctypes
import sys

import pytest

from conftest import REPO_ROOT, build_stub

sys.path.insert(0, str(REPO_ROOT / "bench"))

import variants  # noqa: E402


@pytest.mark.parametrize("sq, sk", [(1, 1), (9, 9), (7, 20), (20, 7), (64, 64)])
@pytest.mark.parametrize("causal, window, chunk", [
    (True, (-1, -1), 0), (False, (-1, -1), 0), (True, (3, 0), 0), (True, (0, 7), 0), (False, (2, 5), 0),
    (False, (-1, 4), 0), (True, (-1, -1), 8), (False, (10, 10), 6), (True, (5, 0), 16),
    (True, (-1, -1), 1), (False, (-1, -1), 1), (False, (-1, -1), 3), (True, (-1, -1), 100), (True, (2, 0), 5),
])
def test_visible_pairs_count_the_reference_mask(sq, sk, causal, window, chunk):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    from reference import variant_mask

    want = int(variant_mask(sq, sk, causal, window, chunk).sum())
    assert variants.visible_pairs(sq, sk, causal, window, chunk) == want


def test_visible_pairs_closed_forms():
    S, left = 32768, 4095
    # Causal: S (S + 1) / 2, the diagonal included (not the anchors' S * S / 2).
    assert variants.visible_pairs(S, S, True) == S * (S + 1) // 2
    # A causal window of left + 1 keys: a triangle for the first rows, then left + 1 keys per row.
    assert variants.visible_pairs(S, S, True, (left, 0)) == (left + 1) * (left + 2) // 2 + (S - 1 - left) * (left + 1)
    assert variants.visible_pairs(S, S, True, (S, 0)) == variants.visible_pairs(S, S, True)
    # Causal chunks of c keys (c divides S): S / c causal triangles of c (c + 1) / 2 pairs.
    for S, c in variants.CHUNK_CELLS:
        assert variants.visible_pairs(S, S, True, (-1, -1), c) == (S // c) * c * (c + 1) // 2
    # A chunk that does not divide S: the last chunk is a partial triangle.
    assert variants.visible_pairs(10, 10, True, (-1, -1), 4) == 10 + 10 + 3
    assert variants.visible_pairs(S, S, True, (-1, -1), S) == variants.visible_pairs(S, S, True)
    assert variants.visible_pairs(S, S, True, (-1, -1), 1) == S


def test_cells():
    cells = variants.make_cells(variants.GROUPS, [8192, 16384, 32768], 32768, 4096, 50.0)
    windows = [c for c in cells if c["group"] == "window"]
    assert [(c["S"], c["B"]) for c in windows] == [(8192, 4), (16384, 2), (32768, 1)]
    assert all(c["variant"] == {"window_size": (4095, 0)} and c["base"] == {} for c in windows)
    softcap = [c for c in cells if c["group"] == "softcap"]
    assert [(c["S"], c["B"], c["variant"]) for c in softcap] == [(8192, 4, {"softcap": 50.0})]
    sinks = [c for c in cells if c["group"] == "sinks"]
    assert [c["variant"] for c in sinks] == [{"sinks": True}, {"window_size": (127, 0), "sinks": True}]
    assert sinks[1]["base"] == {"window_size": (127, 0)}
    assert variants.make_cells(["softcap"], [8192], 32768, 4096, 30.0)[0]["name"] == "softcap 30"
    assert variants.fa3_lacks({"sinks": True}) and variants.fa3_lacks({"softcap": 50.0}) is None
    # Llama 4's chunked layers: chunk 2048 at 8k, 8192 at 16k and 32k, causal, against FlashCore's causal call.
    chunks = [c for c in cells if c["group"] == "chunk"]
    assert [(c["name"], c["S"], c["B"], c["variant"], c["base"], c["base_name"]) for c in chunks] == [
        ("chunk 2048", 8192, 4, {"attention_chunk": 2048}, {}, "causal"),
        ("chunk 8192", 16384, 2, {"attention_chunk": 8192}, {}, "causal"),
        ("chunk 8192", 32768, 1, {"attention_chunk": 8192}, {}, "causal"),
    ]
    assert variants.flops_of(chunks[2], chunks[2]["variant"], 32, 128) == 4.0 * 1 * 32 * 128 * 4 * 8192 * 8193 // 2
    assert variants.fa3_lacks(chunks[0]["variant"]) is None  # FA3's forward takes attention_chunk
    assert "backward does not take attention_chunk" in variants.fa3_lacks(chunks[0]["variant"], backward=True)
    assert variants.fa3_lacks({"softcap": 50.0}, backward=True) is None
    refused = variants.fa3_refusal(chunks[0]["variant"], RuntimeError("attention_chunk must be a power of 2"))
    assert refused == {"error": "FA3 refused attention_chunk=2048: RuntimeError: attention_chunk must be a power of 2",
                       "not_applicable": True, "tflops": None}
    assert variants.fa3_refusal({"softcap": 50.0}, RuntimeError("boom")) == {"error": "RuntimeError: boom",
                                                                             "tflops": None}
    # FLOPs: 4 * B * Hq * D * the pairs of the call's own mask.
    cell = windows[0]
    assert variants.flops_of(cell, cell["variant"], 32, 128) == \
        4.0 * 4 * 32 * 128 * variants.visible_pairs(8192, 8192, True, (4095, 0))
    assert variants.flops_of(cell, cell["base"], 32, 128) == 4.0 * 4 * 32 * 128 * 8192 * 8193 // 2


@pytest.mark.parametrize("left, cap, with_sinks, chunk", [(7, 0.0, True, 0), (-1, 0.7, False, 0), (20, 1.5, True, 0),
                                                         (-1, 0.0, False, 16), (-1, 0.0, False, 20), (5, 0.7, True, 9)])
def test_flexattention_side_matches_the_reference(left, cap, with_sinks, chunk):
    """The FlexAttention calls the bench makes (window and chunk mask_mod, softcap score_mod, sinks folded in from its
    LSE), run eagerly on the CPU, against the float64 reference of the variants."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="no FlexAttention in this torch")
    from reference import reference_variants

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 64, 16, generator=gen)
    k, v = (torch.randn(2, 2, 64, 16, generator=gen) for _ in range(2))
    sinks = torch.randn(4, generator=gen) * 2
    block_mask = flex.create_block_mask(variants.window_mask_mod(left, chunk), None, None, 64, 64, device="cpu",
                                        BLOCK_SIZE=16)
    score_mod = variants.softcap_score_mod(torch, cap) if cap else None
    out, lse = flex.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=True,
                                   return_lse=True)
    if with_sinks:
        out = variants.fold_sinks(torch, out, lse, sinks)
    want, _ = reference_variants(*(t.transpose(1, 2) for t in (q, k, v)), True, None, (left, 0), cap,
                                 sinks if with_sinks else None, chunk)
    torch.testing.assert_close(out.transpose(1, 2).double(), want, atol=1e-5, rtol=1e-5)


class _FakeCuda:
    """torch.cuda's Event and synchronize, recording the calls' order on a fake clock (1 ms per call)."""

    def __init__(self):
        self.log = []
        self.clock = 0.0

    def synchronize(self):
        self.log.append("sync")

    def Event(self, enable_timing=False):  # noqa: N802 - torch's name
        cuda = self

        class Event:
            def record(self):
                self.t = cuda.clock

            def elapsed_time(self, other):
                return other.t - self.t

        return Event()


class _FakeTorch:
    def __init__(self):
        self.cuda = _FakeCuda()


def test_interleaved_times_take_turns():
    fake = _FakeTorch()

    def system(name):
        def call(i):
            fake.cuda.log.append((name, i))
            fake.cuda.clock += 1.0 if name == "a" else 2.0
        return call

    sleeps = []
    times = variants.interleaved_times(fake, {"a": system("a"), "b": system("b")}, nsets=3, warmup=2, iters=5,
                                       rounds=3, sleep=lambda: sleeps.append(len(fake.cuda.log)))
    assert times == {"a": [1.0] * 6, "b": [2.0] * 6}  # ceil(5 / 3) = 2 turns per round, 3 rounds
    calls = [entry for entry in fake.cuda.log if entry != "sync"]
    assert calls[:4] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]  # warm-up
    timed = calls[4:]
    assert [n for n, _ in timed] == ["a", "b", "a", "b", "b", "a", "b", "a", "a", "b", "a", "b"]  # reversed in round 2
    assert [i for n, i in timed if n == "a"] == [0, 1, 2, 0, 1, 2]  # buffer sets rotate (i % nsets)
    assert len(sleeps) == 3


def _cell(name, S, tflops, ms, base_name="causal", group="window", diff=None):
    systems = {n: {"tflops": t, "median_ms": m, "error": None if t else "failed"}
               for n, (t, m) in zip(("flashcore", "flashcore_base", "flex", "fa3"), zip(tflops, ms))}
    return {"group": group, "name": name, "S": S, "B": 32768 // S, "base_name": base_name, "systems": systems,
            "diff": diff or {}}


def test_table_and_markdown():
    c = _cell("window 4096", 16384, (300.0, 500.0, 150.0, 320.0), (1.0, 3.0, 2.0, 0.9), diff={"flex": 2e-3})
    lines = variants.table([c])
    assert lines[0].startswith("| variant | S | B | FlashCore | FC baseline | FlexAttention | FA3 | speedup vs "
                               "baseline")
    assert "| window 4096 | 16384 | 2 | 300 | 500 (causal) | 150 | 320 | 3.00x | 0.60 | 2.00 | 0.94 | flex: 2.0e-03 |" \
        in lines
    sinks = _cell("sinks", 8192, (400.0, 420.0, 300.0, None), (1.0, 0.95, 1.3, None), "no sinks", "sinks")
    sinks["systems"]["fa3"] = {"tflops": None, "error": "FA3 (this build) has no attention sinks",
                               "not_applicable": True}
    assert "| sinks | 8192 | 4 | 400 | 420 (no sinks) | 300 | n/a | 0.95x | 0.95 | 1.33 | — | — |" in \
        variants.table([sinks])
    meta = {"gpu": "test GPU", "torch": "-", "cuda": "-", "flashcore": "-", "fa3": "-", "heads_q": 32, "heads_kv": 8,
            "head_dim": 128, "tokens": 32768, "method": "-"}
    text = variants.markdown(meta, [c, sinks])
    assert "window: geometric means of FlashCore's TFLOPS over its baseline's 0.60, over FlexAttention's 2.00" in text
    assert "errors" not in text  # not applicable is not an error
    assert "\nn/a: FA3: FA3 (this build) has no attention sinks (sinks S=8192)\n" in text  # but its reason is given
    chunk = _cell("chunk 8192", 32768, (380.0, 500.0, 200.0, None), (0.7, 2.0, 1.3, None), group="chunk")
    chunk["systems"]["fa3"] = variants.fa3_refusal({"attention_chunk": 8192}, RuntimeError("no chunk here"))
    assert "| chunk 8192 | 32768 | 1 | 380 | 500 (causal) | 200 | n/a | 2.86x | 0.76 | 1.90 | — | — |" in \
        variants.table([chunk])
    text = variants.markdown(meta, [chunk])
    assert "n/a: FA3: FA3 refused attention_chunk=8192: RuntimeError: no chunk here (chunk 8192 S=32768)" in text
    assert "chunk: geometric means of FlashCore's TFLOPS over its baseline's 0.76, over FlexAttention's 1.90" in text


def test_main_rejects_bad_arguments():
    for argv in (["--systems", "flashcore,fa4"], ["--groups", "alibi"], ["--groups", "chunks"], ["--seqlens", "8k"],
                 ["--iters", "0"],
                 ["--heads-q", "30", "--heads-kv", "8"], ["--softcap", "0"], ["--backward", "--seqlens", "8k"],
                 ["--backward", "--groups", "window,alibi"]):
        with pytest.raises(SystemExit):
            variants.main(argv)


# ---------------------------------------------------------------------------------------------------------------
# --backward: the backward cells (a sliding window of 4096 at 8k and 16k, softcap 50), their FLOPs, the report.


def test_backward_defaults_and_cells():
    assert variants.resolve_defaults(None, None, False) == (list(variants.GROUPS), [8192, 16384, 32768])
    groups, seqlens = variants.resolve_defaults(None, None, True)
    assert (groups, seqlens) == (["window", "softcap"], [8192, 16384])
    assert variants.resolve_defaults("sinks, window", "4096", True) == (["sinks", "window"], [4096])
    with pytest.raises(ValueError, match="comma list of ints"):
        variants.resolve_defaults(None, "8k", True)
    # The defaults of main: 32k tokens, window 4096, softcap 50 (bf16, d128, 32 query / 8 KV heads).
    cells = variants.make_cells(groups, seqlens, 32768, 4096, 50.0)
    assert [(c["name"], c["S"], c["B"], c["variant"], c["base"]) for c in cells] == [
        ("window 4096", 8192, 4, {"window_size": (4095, 0)}, {}),
        ("window 4096", 16384, 2, {"window_size": (4095, 0)}, {}),
        ("softcap 50", 8192, 4, {"softcap": 50.0}, {}),
    ]
    for c in cells:
        assert variants.fa3_lacks(c["variant"]) is None  # FA3's train build has backward, local and softcap
    # The backward's FLOPs: 2.5x the forward's on the same exact visible pairs (FlashAttention's count).
    window = cells[1]
    want = 2.5 * 4.0 * 2 * 32 * 128 * variants.visible_pairs(16384, 16384, True, (4095, 0))
    assert variants.backward_flops_of(window, window["variant"], 32, 128) == want
    assert variants.backward_flops_of(window, window["base"], 32, 128) == 2.5 * 4.0 * 2 * 32 * 128 * 16384 * 16385 // 2
    assert variants.BWD_FLOP_FACTOR == 2.5


def test_backward_markdown():
    c = _cell("window 4096", 8192, (250.0, 400.0, 120.0, 300.0), (2.0, 6.0, 4.0, 1.7), diff={"fa3": 3e-3})
    meta = {"gpu": "test GPU", "torch": "-", "cuda": "-", "flashcore": "-", "fa3": "-", "heads_q": 32, "heads_kv": 8,
            "head_dim": 128, "tokens": 32768, "method": "-", "pass": "backward"}
    text = variants.markdown(meta, [c])
    assert text.startswith("# FlashCore attention variants (backward)")
    assert "(the backward: 2.5x the forward's FLOPs on them)" in text
    assert "| window 4096 | 8192 | 4 | 250 | 400 (causal) | 120 | 300 | 3.00x | 0.62 | 2.08 | 0.83 | fa3: 3.0e-03 |" \
        in text
    meta["pass"] = "forward"
    assert variants.markdown(meta, [c]).startswith("# FlashCore attention variants (forward)")


def test_main_without_a_gpu_parses_backward_arguments(monkeypatch):
    """--backward with its defaults parses; without CUDA main returns 3 before any measurement."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert variants.main(["--backward"]) == 3
    assert variants.main(["--backward", "--groups", "window,softcap,sinks", "--seqlens", "8192"]) == 3
    assert variants.main(["--groups", "chunk"]) == 3 and variants.main(["--backward", "--groups", "chunk"]) == 3


# ---------------------------------------------------------------------------------------------------------------
# bench/flashcore_ctypes.py through the stub library.


def test_flashcore_ctypes_variants(stub_library):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashcore_ctypes
    from flashcore import _lib

    fc = flashcore_ctypes.FlashCoreLib(stub_library)
    q = torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)
    sinks = torch.zeros(4)
    params = fc.params_for(q, k, k, torch.empty_like(q), causal=True, window_size=(7, 0), softcap=50.0, sinks=sinks)
    assert (params.local, params.window_size_left, params.softcap, params.sinks) == (1, 7, 50.0, sinks.data_ptr())
    assert params.attention_chunk == 0
    params = fc.params_for(q, k, k, torch.empty_like(q), causal=True, attention_chunk=8192)
    assert (params.local, params.attention_chunk, params.causal) == (0, 8192, 1)
    with pytest.raises(ValueError, match="sinks must be a contiguous float32"):
        fc.params_for(q, k, k, torch.empty_like(q), sinks=sinks.double())
    assert fc.has_backward()
    assert fc.new_backward_params().struct_size == ctypes.sizeof(_lib.AttentionParamsStruct)


def test_flashcore_backward_params_with_variants(stub_library):
    """The backward cells' FlashCore params (variants.flashcore_backward_params over flashcore_ctypes): the forward's
    window, softcap and sinks, dsinks, and a workspace of the size the library asks for them."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashcore_ctypes

    fc = flashcore_ctypes.FlashCoreLib(stub_library)
    q = torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)
    o, dout = torch.empty_like(q), torch.empty_like(q)
    lse = torch.empty(2, 4, 16)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(k))
    sinks, dsinks = torch.zeros(4), torch.empty(4)
    params, keep = variants.flashcore_backward_params(fc, q, k, k, o, lse, dout, grads, True, (4095, 0), 50.0, sinks,
                                                      dsinks)
    assert (params.local, params.window_size_left, params.softcap, params.causal) == (1, 4095, 50.0, 1)
    assert (params.sinks, params.dsinks, params.dq) == (sinks.data_ptr(), dsinks.data_ptr(), grads[0].data_ptr())
    assert params.workspace_size == fc.backward_workspace_size(params) and keep == []  # the stub's size: no new one
    plain, _ = variants.flashcore_backward_params(fc, q, k, k, o, lse, dout, grads, True)
    assert (plain.local, plain.softcap, plain.sinks, plain.dsinks, plain.attention_chunk) == (0, 0.0, None, None, 0)
    chunked, _ = variants.flashcore_backward_params(fc, q, k, k, o, lse, dout, grads, True, attention_chunk=8192)
    assert (chunked.local, chunked.attention_chunk, chunked.causal) == (0, 8192, 1)


def test_flashcore_backward_params_with_a_05_library(c_compiler, header_text, tmp_path):
    """A 0.5 library (whose backward refuses the variants): RuntimeError naming 0.6 for a backward with a variant or
    dsinks, recorded in the bench's cell; the plain backward's params are made."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashcore_ctypes
    from flashcore import _lib

    fc = flashcore_ctypes.FlashCoreLib(build_stub(c_compiler, tmp_path, "libflashcore_v5.so",
                                                  "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V5_SIZE"))
    assert fc.new_backward_params().struct_size == _lib.ATTENTION_PARAMS_V5_SIZE
    q = torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)
    grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(k))
    args = (fc, q, k, k, torch.empty_like(q), torch.empty(2, 4, 16), torch.empty_like(q), grads, True)
    with pytest.raises(RuntimeError, match="backward with window_size needs a 0.6 library or newer"):
        variants.flashcore_backward_params(*args, (4095, 0), 0.0)
    with pytest.raises(RuntimeError, match="backward with softcap, sinks needs a 0.6 library"):
        variants.flashcore_backward_params(*args, (-1, -1), 50.0, torch.zeros(4), torch.empty(4))
    with pytest.raises(RuntimeError, match="backward with attention_chunk needs a 0.6 library"):
        variants.flashcore_backward_params(*args, attention_chunk=8192)
    params, _ = variants.flashcore_backward_params(*args)
    assert params.local == 0 and params.struct_size == _lib.ATTENTION_PARAMS_V5_SIZE


def test_flashcore_ctypes_with_a_04_library(c_compiler, header_text, tmp_path):
    """A 0.4 library: the backward runs with its 648-byte struct; a variant is RuntimeError naming it."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashcore_ctypes
    from flashcore import _lib

    path = build_stub(c_compiler, tmp_path, "libflashcore_v4.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V4_SIZE")
    fc = flashcore_ctypes.FlashCoreLib(path)
    assert fc.has_backward()
    assert fc.new_backward_params().struct_size == _lib.ATTENTION_PARAMS_V4_SIZE
    q = torch.zeros(2, 4, 16, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)
    assert fc.params_for(q, k, k, torch.empty_like(q), causal=True).struct_size == _lib.ATTENTION_PARAMS_V4_SIZE
    with pytest.raises(RuntimeError, match="window_size is set, but .*0.5 library or newer"):
        fc.params_for(q, k, k, torch.empty_like(q), causal=True, window_size=(7, 0))

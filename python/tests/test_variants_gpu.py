"""The attention variants on the GPU (C ABI 0.5, issue #72): sliding windows, softcap, attention sinks and chunked
attention (attention_chunk, Llama 4), alone and together, against the float64 reference (reference.reference_variants,
itself checked against the definitions in test_variants_cpu.py), through flashcore.attention, sdpa, varlen_attention and
attention_with_kvcache (dense and paged caches, decoding with split-KV), GQA / MQA, Sq != Sk, rows that see no key,
torch.compile and CUDA graphs.

Error rule (the project's): err(flashcore) <= 2 * err(baseline) + atol, both against the float64 reference, where the
baseline is the same attention computed by PyTorch at the inputs' precision the way a flash kernel rounds (scores and
softmax in float32 from the 16-bit inputs, P rounded to the input dtype before P V, accumulated in float32): SDPA cannot
take softcap or sinks, so it cannot be the baseline here. LSE within 2e-3 absolute / 1e-3 relative.

Needs torch, a CUDA GPU and a libflashcore.so of 0.5 or newer (skips otherwise, naming the reason); the chunk cases a
library with chunked attention (one whose kernels predate it refuses attention_chunk with the reserved field's message:
those cases skip quoting it; any other refusal fails them)."""

import math
from typing import Optional

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib  # noqa: E402
from reference import reference_variants, variant_mask  # noqa: E402
from test_attention_gpu import ATOL, _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_paged_cpu import paginate  # noqa: E402
from test_varlen_cpu import cu_seqlens  # noqa: E402

LSE_ATOL, LSE_RTOL = 2e-3, 1e-3


@pytest.fixture(scope="module")
def vcaps(caps):
    """The capabilities, once the library is known to read the variant fields (0.5)."""
    lib = _lib.load()
    if not lib.has_variants():
        pytest.skip(f"{lib.path} ({lib.version_string()}) predates the attention variants (0.5 needed)")
    return caps


# A library whose kernels predate chunked attention (the C ABI reserved attention_chunk from 0.5 on) refuses it with
# this message (ValueError, naming the field).
CHUNK_RESERVED = "chunked attention is not in this version yet"
_CHUNK_PROBE: dict = {}


def chunk_refusal(caps, device) -> Optional[str]:
    """None when the loaded library runs attention_chunk, else the refusal of a library that predates chunked attention
    (asked once, with one small call). Any other error of that call is raised: it fails the test that asked."""
    if "refusal" not in _CHUNK_PROBE:
        dtype = torch.bfloat16 if "bfloat16" in caps.dtypes else torch.float16
        head_dim = 128 if 128 in caps.head_dims else caps.head_dims[0]
        q, k, v = _inputs(device, dtype, 1, 130, 130, 2, 1, head_dim)
        try:
            flashcore.attention(q, k, v, causal=True, attention_chunk=64)
            torch.cuda.synchronize()
            _CHUNK_PROBE["refusal"] = None
        except ValueError as exc:
            if CHUNK_RESERVED not in str(exc):
                raise
            _CHUNK_PROBE["refusal"] = str(exc)
    return _CHUNK_PROBE["refusal"]


def need_chunks(caps, device, kwargs=None) -> None:
    """Skip (quoting the library) when the case sets attention_chunk (kwargs None: it does) and the library predates
    chunked attention."""
    if kwargs is not None and not kwargs.get("attention_chunk"):
        return
    reason = chunk_refusal(caps, device)
    if reason is not None:
        pytest.skip(f"the loaded library predates chunked attention: {reason}")


def _inputs(device, dtype, batch, sq, sk, hq, hkv, d, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(batch, s, h, d, device=device, dtype=dtype, generator=gen)
                 for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))


def _sinks(device, hq, seed=1, scale=2.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(hq, device=device, generator=gen) * scale


def baseline(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, sinks=None,
             attention_chunk=0):
    """The attention at the inputs' precision, rounded as a flash kernel rounds it (module docstring): out in q's
    dtype, (B, Sq, Hq, v's head dim). Whole score matrices: for the moderate shapes of these tests."""
    batch, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    if sk == 0:  # no key: every row is 0 (with or without sinks)
        return q.new_zeros(q.shape[:3] + v.shape[3:])
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(d)
    kt, vt = (t.transpose(1, 2).repeat_interleave(hq // hkv, dim=1).float() for t in (k, v))  # (B, Hq, Sk, D)
    scores = (q.transpose(1, 2).float() @ kt.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~variant_mask(sq, sk, causal, window_size, attention_chunk, q.device), -math.inf)
    row_max = scores.amax(dim=-1, keepdim=True)
    if sinks is not None:
        row_max = torch.maximum(row_max, sinks.float()[None, :, None, None])
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
    p = torch.exp(scores - row_max)
    denominator = p.sum(-1, keepdim=True)
    if sinks is not None:
        denominator = denominator + torch.exp(sinks.float()[None, :, None, None] - row_max)
    out = (p.to(q.dtype).float() @ vt) / torch.where(denominator > 0, denominator, 1.0)
    return out.transpose(1, 2).to(q.dtype)


def check(q, k, v, out, lse=None, **variants):
    """out (and lse) of a dense call against the float64 reference, with the error rule above."""
    ref_out, ref_lse = reference_variants(q, k, v, **variants)
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "non-finite output"
    base = (baseline(q, k, v, **variants).double() - ref_out).abs().max().item()
    err = (out.double() - ref_out).abs().max().item()
    assert err <= 2 * base + ATOL[q.dtype], f"error {err:.3g} vs baseline {base:.3g} ({variants})"
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite) and (lse[~finite] == -math.inf).all()
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=LSE_ATOL, rtol=LSE_RTOL)


def _kwargs(variants, device, hq):
    """flashcore's keyword arguments for a parametrized case (sinks drawn on the device)."""
    kwargs = dict(variants)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = _sinks(device, hq)
    return kwargs


WINDOWS = [
    dict(causal=True, window_size=(0, 0)),
    dict(causal=True, window_size=(1, 0)),
    dict(causal=True, window_size=(127, 0)),
    dict(causal=True, window_size=(128, -1)),
    dict(causal=True, window_size=(1000, 0)),
    dict(causal=False, window_size=(100, 50)),
    dict(causal=False, window_size=(-1, 64)),
    dict(causal=False, window_size=(64, -1)),
    dict(causal=False, window_size=(0, 0)),
]
WINDOW_IDS = ["c0", "c1", "c127", "c128", "c1000", "w100-50", "right64", "left64", "diag"]


@pytest.mark.parametrize("window", WINDOWS, ids=WINDOW_IDS)
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (300, 300), (1000, 1000), (100, 777), (777, 100)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_windows(vcaps, cuda, dtype, head_dim, sq, sk, window):
    _need(vcaps, dtype, head_dim)
    q, k, v = _inputs(cuda, dtype, 2, sq, sk, 8, 2, head_dim)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **window)
    check(q, k, v, out, lse, **window)


CHUNKS = [
    dict(causal=True, attention_chunk=1),
    dict(causal=True, attention_chunk=64),
    dict(causal=True, attention_chunk=100),  # not a multiple of any tile
    dict(causal=True, attention_chunk=128),
    dict(causal=True, attention_chunk=200),
    dict(causal=True, attention_chunk=8192),  # larger than every sequence here
    dict(causal=False, attention_chunk=77),
    dict(causal=False, attention_chunk=256),
    dict(causal=True, window_size=(50, 0), attention_chunk=128),  # the window inside the chunk, and across its start
    dict(causal=False, window_size=(100, 30), attention_chunk=96),
]
CHUNK_IDS = ["c-chunk1", "c-chunk64", "c-chunk100", "c-chunk128", "c-chunk200", "c-chunk8192", "chunk77", "chunk256",
             "c50-chunk128", "w100-30-chunk96"]


@pytest.mark.parametrize("chunk", CHUNKS, ids=CHUNK_IDS)
@pytest.mark.parametrize("sq, sk", [(1, 1), (17, 17), (300, 300), (1000, 1000), (100, 777), (777, 100)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_chunks(vcaps, cuda, dtype, head_dim, sq, sk, chunk):
    """Chunked attention (FlashAttention-3's attention_chunk) alone, under causal and with a window, GQA 4: Sq > Sk puts
    the first rows' diagonal below 0 (chunk -1: no key, out 0, lse -inf)."""
    _need(vcaps, dtype, head_dim)
    need_chunks(vcaps, cuda)
    q, k, v = _inputs(cuda, dtype, 2, sq, sk, 8, 2, head_dim, seed=2)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **chunk)
    check(q, k, v, out, lse, **chunk)


@pytest.mark.parametrize("heads", [(8, 8), (32, 8), (8, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_chunks_with_every_variant(vcaps, cuda, dtype, heads):
    """attention_chunk with causal, a window, softcap, sinks and a softmax scale together, Sq != Sk."""
    _need(vcaps, dtype, 128)
    need_chunks(vcaps, cuda)
    q, k, v = _inputs(cuda, dtype, 2, 1500, 1700, *heads, 128, seed=14)
    variants = dict(causal=True, window_size=(255, 0), softcap=4.0, sinks=_sinks(cuda, heads[0]), softmax_scale=0.2,
                    attention_chunk=300)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **variants)
    check(q, k, v, out, lse, **variants)


def test_llama4_chunked_sequence(vcaps, cuda):
    """Llama 4's chunked layers: causal, attention_chunk=8192 on a 16k sequence (GQA 4). The rows of the second chunk
    see only its keys: they are causal attention of the second chunk alone (FlashCore's plain call on the slices,
    another kernel path, so not bit for bit), as the first chunk's rows are of the first; the last rows against
    float64."""
    _need(vcaps, torch.bfloat16, 128)
    need_chunks(vcaps, cuda)
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 16384, 16384, 8, 2, 128, seed=15)
    out, lse = flashcore.attention(q, k, v, causal=True, attention_chunk=8192, return_lse=True)
    for part in (slice(0, 8192), slice(8192, 16384)):
        alone = flashcore.attention(q[:, part], k[:, part], v[:, part], causal=True)
        torch.testing.assert_close(out[:, part].float(), alone.float(), atol=2e-2, rtol=2e-2)
    rows = slice(16384 - 500, 16384)
    ref_out, ref_lse = reference_variants(q[:, rows], k, v, True, None, (-1, -1), 0.0, None, 8192)
    err = (out[:, rows].double() - ref_out).abs().max().item()
    base = (baseline(q[:, rows], k, v, True, None, attention_chunk=8192).double() - ref_out).abs().max().item()
    assert err <= 2 * base + ATOL[torch.bfloat16]
    torch.testing.assert_close(lse[:, :, rows].double(), ref_lse, atol=LSE_ATOL, rtol=LSE_RTOL)


@pytest.mark.parametrize("softcap", [1.0, 5.0, 30.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_softcap(vcaps, cuda, dtype, head_dim, causal, softcap):
    _need(vcaps, dtype, head_dim)
    q, k, v = _inputs(cuda, dtype, 2, 513, 513, 8, 8, head_dim, seed=3)
    q = q * 3  # scores of several units: the cap bites
    out, lse = flashcore.attention(q, k, v, causal=causal, softcap=softcap, return_lse=True)
    check(q, k, v, out, lse, causal=causal, softcap=softcap)


@pytest.mark.parametrize("scale", [0.5, 2.0, 10.0])  # 10: the sink dominates most rows
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sinks(vcaps, cuda, dtype, head_dim, causal, scale):
    _need(vcaps, dtype, head_dim)
    q, k, v = _inputs(cuda, dtype, 2, 333, 700, 8, 2, head_dim, seed=4)
    sinks = _sinks(cuda, 8, scale=scale)
    out, lse = flashcore.attention(q, k, v, causal=causal, sinks=sinks, softmax_scale=0.1, return_lse=True)
    check(q, k, v, out, lse, causal=causal, sinks=sinks, softmax_scale=0.1)


def test_sinks_in_other_dtypes_and_strides(vcaps, cuda):
    """A strided view of sinks is copied, float64 ones (exact float32 values) converted: the float32 result, bit for
    bit; bf16 sinks (a model's parameter) give the result of their float32 values."""
    _need(vcaps, torch.bfloat16, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 200, 200, 8, 8, 128, seed=5)
    sinks = _sinks(cuda, 16)[::2]
    want = flashcore.attention(q, k, v, causal=True, sinks=sinks.contiguous())
    for given in (sinks, sinks.double()):
        torch.testing.assert_close(flashcore.attention(q, k, v, causal=True, sinks=given), want, atol=0, rtol=0)
    got = flashcore.attention(q, k, v, causal=True, sinks=sinks.bfloat16())
    check(q, k, v, got, causal=True, sinks=sinks.bfloat16().float())


def test_rows_without_keys(vcaps, cuda):
    """Sq > Sk under causal: the first Sq - Sk rows see no key: out 0, lse the sink (-inf without sinks); a window
    (0, 0) without causal past the keys too."""
    _need(vcaps, torch.bfloat16, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 300, 100, 8, 2, 128, seed=6)
    sinks = _sinks(cuda, 8)
    out, lse = flashcore.attention(q, k, v, causal=True, sinks=sinks, window_size=(50, 0), return_lse=True)
    assert (out[:, :200] == 0).all()
    torch.testing.assert_close(lse[:, :, :200], sinks[None, :, None].expand(2, 8, 200), atol=1e-6, rtol=0)
    check(q, k, v, out, lse, causal=True, sinks=sinks, window_size=(50, 0))
    out, lse = flashcore.attention(q, k, v, window_size=(0, 0), return_lse=True)
    assert (out[:, :200] == 0).all() and (lse[:, :, :200] == -math.inf).all()
    check(q, k, v, out, lse, window_size=(0, 0))


@pytest.mark.parametrize("heads", [(8, 8), (32, 8), (8, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_all_together(vcaps, cuda, dtype, heads):
    _need(vcaps, dtype, 128)
    q, k, v = _inputs(cuda, dtype, 2, 1500, 1700, *heads, 128, seed=7)
    variants = dict(causal=True, window_size=(255, 0), softcap=4.0, sinks=_sinks(cuda, heads[0]), softmax_scale=0.2)
    out, lse = flashcore.attention(q, k, v, return_lse=True, **variants)
    check(q, k, v, out, lse, **variants)


def test_long_window_sequence(vcaps, cuda):
    """A 16k sequence with a 4096 window (issue #72's target shape, smaller batch): blocks outside every row's window
    are skipped, the rows inside agree."""
    _need(vcaps, torch.bfloat16, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 16384, 16384, 4, 1, 128, seed=8)
    out, lse = flashcore.attention(q, k, v, causal=True, window_size=(4095, 0), return_lse=True)
    rows = slice(16384 - 700, 16384)  # the float64 reference on the last rows only (their keys: the last window)
    ref_out, ref_lse = reference_variants(q[:, rows], k, v, True, None, (4095, 0))  # Sq < Sk: bottom-right aligned
    err = (out[:, rows].double() - ref_out).abs().max().item()
    base = (baseline(q[:, rows], k, v, True, None, (4095, 0)).double() - ref_out).abs().max().item()
    assert err <= 2 * base + ATOL[torch.bfloat16]
    torch.testing.assert_close(lse[:, :, rows].double(), ref_lse, atol=LSE_ATOL, rtol=LSE_RTOL)
    # The first 4096 rows: the window holds every key before them, so they are plain causal attention (another
    # kernel path, so not bit for bit).
    full = flashcore.attention(q[:, :4096], k[:, :4096], v[:, :4096], causal=True)
    torch.testing.assert_close(out[:, :4096].float(), full.float(), atol=2e-2, rtol=2e-2)


def test_sdpa(vcaps, cuda):
    _need(vcaps, torch.bfloat16, 64)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 257, 257, 8, 4, 64, seed=9)
    sinks = _sinks(cuda, 8)
    got = flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, window_size=(31, 0), softcap=3.0,
                         sinks=sinks)
    check(q, k, v, got.transpose(1, 2), causal=True, window_size=(31, 0), softcap=3.0, sinks=sinks)


# ---------------------------------------------------------------------------------------------------------------
# Packed (varlen) batches and KV caches: the masks align per sequence.


VARLEN_CASES = [
    dict(causal=True, window_size=(63, 0)),
    dict(causal=False, window_size=(40, 20), softcap=3.0),
    dict(causal=True, sinks=True),
    dict(causal=True, window_size=(100, 0), softcap=5.0, sinks=True),
    dict(causal=True, attention_chunk=100),
    dict(causal=False, attention_chunk=64),
    dict(causal=True, window_size=(40, 0), softcap=3.0, sinks=True, attention_chunk=160),
]
VARLEN_IDS = ["window", "window-softcap", "sinks", "all", "c-chunk100", "chunk64", "all-chunk160"]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=VARLEN_IDS)
@pytest.mark.parametrize("lengths", [([17, 0, 1, 300, 1000, 64], None), ([1, 5, 200, 64, 700], [7, 0, 300, 64, 100])],
                         ids=["self", "cross"])
def test_varlen(vcaps, cuda, case, lengths):
    _need(vcaps, torch.bfloat16, 128)
    need_chunks(vcaps, cuda, case)
    lens_q, lens_k = lengths[0], lengths[1] or lengths[0]
    gen = torch.Generator(device=cuda).manual_seed(10)
    q = torch.randn(sum(lens_q), 8, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(sum(lens_k), 2, 128, device=cuda, dtype=torch.bfloat16, generator=gen) for _ in range(2))
    kwargs = _kwargs(case, cuda, 8)
    out, lse = flashcore.varlen_attention(q, k, v, cu_seqlens(lens_q, cuda), cu_seqlens(lens_k, cuda), max(lens_q),
                                          max(lens_k), return_lse=True, **kwargs)
    sq = sk = 0
    for nq, nk in zip(lens_q, lens_k):
        if nq:
            check(q[None, sq:sq + nq], k[None, sk:sk + nk], v[None, sk:sk + nk], out[None, sq:sq + nq],
                  lse[None, :, sq:sq + nq], **kwargs)
        sq, sk = sq + nq, sk + nk


@pytest.mark.parametrize("case", VARLEN_CASES, ids=VARLEN_IDS)
@pytest.mark.parametrize("seqlen_q", [1, 16])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged64"])
def test_kvcache(vcaps, cuda, case, seqlen_q, paged):
    """Decode (Sq = 1: split-KV on the sm90 backend) and chunked prefill against a cache with NaN past each length:
    the window and chunks align to each sequence's own last key."""
    _need(vcaps, torch.bfloat16, 128)
    need_chunks(vcaps, cuda, case)
    lengths = [1, 4000, 63, 700, 2048] if seqlen_q == 1 else [16, 333, 2048]
    q, k, v = _inputs(cuda, torch.bfloat16, len(lengths), seqlen_q, 4096, 16, 4, 128, seed=11)
    for b, n in enumerate(lengths):
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    kwargs = _kwargs(case, cuda, 16)
    cache = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32, device=cuda))
    kc, vc = k, v
    if paged:
        kc, vc, cache["block_table"] = paginate(k, v, lengths, 64)
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, return_softmax_lse=True, **cache, **kwargs)
    for b, n in enumerate(lengths):
        check(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], out[b:b + 1], lse[b:b + 1], **kwargs)


def test_kvcache_append_with_window(vcaps, cuda):
    _need(vcaps, torch.bfloat16, 128)
    lengths = [10, 0, 500]
    q, k, v = _inputs(cuda, torch.bfloat16, 3, 3, 1024, 8, 2, 128, seed=12)
    k_new, v_new = (torch.randn(3, 3, 2, 128, device=cuda, dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out = flashcore.attention_with_kvcache(q, k, v, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True,
                                           window_size=(7, 0), sinks=_sinks(cuda, 8))
    for b, n in enumerate(lengths):
        check(q[b:b + 1], k[b:b + 1, :n + 3], v[b:b + 1, :n + 3], out[b:b + 1], causal=True, window_size=(7, 0),
              sinks=_sinks(cuda, 8))


# ---------------------------------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, autograd.


@pytest.mark.parametrize("chunk", [0, 300], ids=["window", "window-chunk"])
def test_compile_and_cuda_graph(vcaps, cuda, chunk):
    """torch.compile fullgraph, and a captured graph replayed with new inputs and new sinks (read at each replay)."""
    _need(vcaps, torch.bfloat16, 128)
    need_chunks(vcaps, cuda, dict(attention_chunk=chunk))
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 1024, 1024, 8, 2, 128, seed=13)
    sinks = _sinks(cuda, 8)

    def fn(q, k, v, sinks):
        return flashcore.attention(q, k, v, causal=True, window_size=(127, 0), softcap=5.0, sinks=sinks,
                                   attention_chunk=chunk)

    eager = fn(q, k, v, sinks)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)(q, k, v, sinks)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
    static = [t.clone() for t in (q, k, v, sinks)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*static)
    new = [t * 0.5 for t in (q, k, v)] + [sinks + 1.0]
    for target, value in zip(static, new):
        target.copy_(value)
    graph.replay()
    torch.testing.assert_close(captured, fn(*new), atol=0, rtol=0)


"""The attention variants (C ABI 0.5, issue #72: window_size, softcap, sinks, attention_chunk) without a GPU: the
float64 reference against a loop-by-loop reading of the definitions, the front ends' argument errors (each naming the
argument), the C params the ops fill (through the host-only stub library, and a 0.4-sized one that refuses them), the
custom ops with the kernel emulated on the CPU by the float64 reference (results, LSE with sinks, rows without keys,
fake tensors, opcheck, torch.compile), and (since 0.6) the variants' backward: gradients of q, k, v and sinks through
attention / sdpa / varlen_attention (and through lse) with the kernel's formulas emulated, against float64 autograd;
attention_chunk in both passes (the op arguments, the backward ops' and the emulated kernels').

The kernels themselves run in test_variants_gpu.py."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from conftest import build_stub  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import emulate_on_cpu, reference_variant_grads, reference_variants, variant_mask  # noqa: E402
from test_varlen_cpu import _packed, cu_seqlens, emulate_serving_on_cpu, ref_varlen  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402


def _qkv(b=2, sq=16, sk=16, hq=4, hkv=2, d=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, s, h, d, generator=gen).to(dtype) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))


def _sinks(hq=4, seed=1, scale=2.0):
    return torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.fixture
def emulated(monkeypatch):
    emulate_on_cpu(monkeypatch)
    emulate_serving_on_cpu(monkeypatch)


# ---------------------------------------------------------------------------------------------------------------
# The reference (which the GPU tests trust) against the definitions, one (i, j) pair at a time.


def _sees_by_definition(i, j, sq, sk, causal, window, chunk):
    d = sk - sq
    left, right = window
    if causal and j > i + d:
        return False
    if left != -1 and j < i + d - left:
        return False
    if right != -1 and not causal and j > i + d + right:
        return False
    if chunk > 0 and math.floor(j / chunk) != math.floor((i + d) / chunk):
        return False
    return True


@pytest.mark.parametrize("sq, sk", [(9, 9), (5, 13), (13, 5)])
@pytest.mark.parametrize("causal, window, chunk", [
    (False, (-1, -1), 0), (True, (-1, -1), 0), (False, (2, 1), 0), (True, (3, -1), 0), (False, (-1, 0), 0),
    (False, (0, -1), 0), (True, (-1, -1), 4), (False, (-1, -1), 3), (True, (2, 0), 4), (False, (1, 2), 5),
    (False, (-1, -1), 1), (True, (-1, -1), 1), (False, (-1, -1), 20), (True, (-1, -1), 20), (False, (3, -1), 2),
])
def test_mask_follows_the_definition(sq, sk, causal, window, chunk):
    got = variant_mask(sq, sk, causal, window, chunk)
    want = torch.tensor([[_sees_by_definition(i, j, sq, sk, causal, window, chunk) for j in range(sk)]
                         for i in range(sq)])
    assert torch.equal(got, want)


def test_reference_follows_the_definitions():
    """out and lse of one small problem computed term by term: s = softcap tanh(scale q.k / softcap) on the visible
    pairs, lse = log(sum_j exp(s_j) + exp(sink)), out = sum_j exp(s_j - lse) v_j; a row without keys: 0 and the sink."""
    q, k, v = _qkv(b=1, sq=6, sk=9, hq=2, hkv=1, d=8, dtype=torch.float64)
    sinks = torch.tensor([0.7, -1.3])
    scale, cap, window = 0.4, 1.5, (2, 1)
    out, lse = reference_variants(q, k, v, True, scale, window, cap, sinks, 3, max_scores=7)  # several row blocks
    for h in range(2):
        for i in range(6):
            terms = []
            for j in range(9):
                if _sees_by_definition(i, j, 6, 9, True, window, 3):
                    s = scale * float(q[0, i, h] @ k[0, j, 0])
                    terms.append((cap * math.tanh(s / cap), v[0, j, 0]))
            denominator = sum(math.exp(s) for s, _ in terms) + math.exp(float(sinks[h]))
            assert lse[0, h, i].item() == pytest.approx(math.log(denominator), rel=1e-12)
            want = sum((math.exp(s) / denominator * vj for s, vj in terms), torch.zeros(8, dtype=torch.float64))
            torch.testing.assert_close(out[0, i, h], want, rtol=1e-12, atol=1e-12)
    # With sinks, a row that sees nothing has out 0 and lse = its head's sink.
    out, lse = reference_variants(q, k[:, :0], v[:, :0], False, None, (-1, -1), 0.0, sinks, 0)
    assert torch.all(out == 0) and torch.equal(lse[0], sinks.double()[:, None].expand(2, 6))


# ---------------------------------------------------------------------------------------------------------------
# Argument errors, each naming the argument, before the library is called.


BAD_ARGUMENTS = [
    (dict(window_size=4), TypeError, "window_size must be a pair"),
    (dict(window_size=(4,)), TypeError, "window_size must be a pair"),
    (dict(window_size=(4, 0, 1)), TypeError, "window_size must be a pair"),
    (dict(window_size=None), TypeError, "window_size must be a pair"),
    (dict(window_size=(1.5, 0)), TypeError, r"window_size\[0\] \(left\) must be an int"),
    (dict(window_size=(3, True)), TypeError, r"window_size\[1\] \(right\) must be an int"),
    (dict(window_size=(-2, 0)), ValueError, r"window_size\[0\] \(left\) must be -1 \(unbounded\)"),
    (dict(window_size=(0, 2**31)), ValueError, r"window_size\[1\] \(right\) must be -1 \(unbounded\)"),
    (dict(softcap=-1.0), ValueError, "softcap must be 0.0"),
    (dict(softcap=float("nan")), ValueError, "softcap must be 0.0"),
    (dict(softcap=float("inf")), ValueError, "softcap must be 0.0"),
    (dict(softcap=1e-50), ValueError, "softcap must be 0.0"),  # a C float would make it 0.0: "no softcap"
    (dict(softcap="30"), TypeError, "softcap must be a float"),
    (dict(softcap=True), TypeError, "softcap must be a float"),
    (dict(attention_chunk=-1), ValueError, "attention_chunk must be 0"),
    (dict(attention_chunk=2**31), ValueError, "attention_chunk must be 0"),
    (dict(attention_chunk=64.0), TypeError, "attention_chunk must be an int"),
    (dict(attention_chunk=True), TypeError, "attention_chunk must be an int"),
    (dict(sinks=[0.0] * 4), TypeError, "sinks must be a torch.Tensor"),
    (dict(sinks=torch.zeros(4, dtype=torch.int32)), TypeError, "sinks must be a float32 tensor"),
    (dict(sinks=torch.zeros(4).to(torch.float8_e4m3fn)), TypeError, "sinks must be a float32 tensor"),
    (dict(sinks=torch.zeros(5)), ValueError, r"sinks must have shape \(num_heads_q,\) = \(4,\)"),
    (dict(sinks=torch.zeros(1, 4)), ValueError, r"sinks must have shape \(num_heads_q,\) = \(4,\)"),
    (dict(sinks=torch.zeros(4, device="meta")), ValueError, "sinks is on meta"),
]


def _call(entry, q, k, v, **kwargs):
    if entry == "attention":
        return flashcore.attention(q, k, v, **kwargs)
    if entry == "kvcache":
        return flashcore.attention_with_kvcache(q, k, v, **kwargs)
    if entry == "sdpa":
        return flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), **kwargs)
    lens = [q.shape[1]] * q.shape[0]
    cu = cu_seqlens(lens)
    return flashcore.varlen_attention(*(t.flatten(0, 1) for t in (q, k, v)), cu, cu, q.shape[1], q.shape[1], **kwargs)


# Every entry point with every bad argument (sdpa has no attention_chunk: test_sdpa_has_no_attention_chunk).
BAD_CALLS = [pytest.param(entry, kwargs, exc, match, id=f"{entry}-{next(iter(kwargs))}-{i}")
             for entry in ("attention", "kvcache", "varlen", "sdpa")
             for i, (kwargs, exc, match) in enumerate(BAD_ARGUMENTS)
             if not (entry == "sdpa" and "attention_chunk" in kwargs)]


@pytest.mark.parametrize("entry, kwargs, exc, match", BAD_CALLS)
def test_bad_variant_arguments(emulated, entry, kwargs, exc, match):
    q, k, v = _qkv()
    with pytest.raises(exc, match="^FlashCore: " + match):
        _call(entry, q, k, v, **kwargs)


@pytest.mark.parametrize("entry", ["attention", "varlen", "kvcache"])
@pytest.mark.parametrize("kind", ["int", "numpy"])
def test_attention_chunk_reaches_the_launch(emulated, monkeypatch, entry, kind):
    """Each front end passes attention_chunk on to the launch as a plain int (FA3's name and meaning; a numpy integer
    too); 0 launches the plain call."""
    chunk = 64 if kind == "int" else pytest.importorskip("numpy", reason="numpy is not installed").int32(5)
    launched = []
    for name in ("_launch", "_launch_varlen"):
        real = getattr(_ops, name)
        monkeypatch.setattr(_ops, name,
                            lambda *a, real=real, **kw: launched.append(kw.get("variants")) or real(*a, **kw))
    q, k, v = _qkv()
    _call(entry, q, k, v, causal=True, attention_chunk=chunk)
    assert launched[-1].attention_chunk == int(chunk) and type(launched[-1].attention_chunk) is int
    assert _ops.variant_names(launched[-1], True) == [f"attention_chunk={int(chunk)}"]
    _call(entry, q, k, v, causal=True, attention_chunk=0)
    assert launched[-1] is None


@pytest.mark.parametrize("op", ["attention_fwd", "attention_kvcache_fwd", "varlen_attention_fwd",
                                "attention_variants_bwd", "varlen_attention_variants_bwd"])
def test_ops_check_attention_chunk(op):
    """The custom ops check attention_chunk as the front ends do (they can be called directly), on fake tensors."""
    with FakeTensorMode():
        q = torch.empty(2, 17, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 33, 2, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 8, 17, device="cuda")
        cu = torch.tensor([0, 17, 34], dtype=torch.int32, device="cuda")
        qp, kp = q.flatten(0, 1), k.flatten(0, 1)
        lens = torch.full((2,), 33, dtype=torch.int32, device="cuda")
        calls = {
            "attention_fwd": lambda **kw: torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, **kw),
            "attention_kvcache_fwd": lambda **kw: torch.ops.flashcore.attention_kvcache_fwd(q, k, k, lens, True, 0.0,
                                                                                            True, **kw),
            "varlen_attention_fwd": lambda **kw: torch.ops.flashcore.varlen_attention_fwd(
                qp, kp, kp, cu, torch.tensor([0, 33, 66], dtype=torch.int32, device="cuda"), None, 17, 33, True, 0.0,
                True, **kw),
            "attention_variants_bwd": lambda **kw: torch.ops.flashcore.attention_variants_bwd(q, q, k, k, q, lse, True,
                                                                                              0.0, **kw),
            "varlen_attention_variants_bwd": lambda **kw: torch.ops.flashcore.varlen_attention_variants_bwd(
                qp, qp, kp, kp, qp, lse.new_empty(8, 34), cu, torch.tensor([0, 33, 66], dtype=torch.int32,
                                                                           device="cuda"), 17, 33, True, 0.0, **kw),
        }
        got = calls[op](attention_chunk=8192)
        assert got[0].shape == (q if "varlen" not in op else qp).shape
        with pytest.raises(ValueError, match="^FlashCore: attention_chunk must be 0 \\(none\\) or a positive int"):
            calls[op](attention_chunk=-1)


def test_sdpa_has_no_attention_chunk():
    q, k, v = (t.transpose(1, 2) for t in _qkv())
    with pytest.raises(TypeError, match="attention_chunk"):
        flashcore.sdpa(q, k, v, attention_chunk=64)


@pytest.mark.parametrize("kwargs", [dict(window_size=(4, 0)), dict(softcap=30.0), dict(sinks=torch.zeros(4))],
                         ids=["window", "softcap", "sinks"])
def test_8bit_calls_refuse_the_variants(emulated, kwargs):
    name = next(iter(kwargs))
    q, k, v = _qkv(d=128)
    with pytest.raises(ValueError, match=f"^FlashCore: {name} is set, but 8-bit attention"):
        flashcore.attention(q, k, v, precision="fp8", **kwargs)
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    with pytest.raises(ValueError, match=f"^FlashCore: {name} is set, but 8-bit attention"):
        flashcore.attention(q8, k8, v8, **kwargs)


def test_default_values_are_no_variant(emulated, monkeypatch):
    """The defaults (and None softcap, a causal (-1, right) window) launch the plain call, which a 0.4 library runs."""
    launched = []
    real = _ops._launch
    monkeypatch.setattr(_ops, "_launch", lambda *a, **kw: launched.append(kw) or real(*a, **kw))
    q, k, v = _qkv()
    flashcore.attention(q, k, v)
    flashcore.attention(q, k, v, window_size=[-1, -1], softcap=None, attention_chunk=0, sinks=None)
    assert launched == [{}, {}]
    flashcore.attention(q, k, v, causal=True, window_size=(-1, 5))  # the window of a causal call ends at 0 anyway
    variants = launched[-1]["variants"]
    assert not _ops.variant_names(variants, True)


# ---------------------------------------------------------------------------------------------------------------
# The C params (through the stub library: real ctypes, CPU tensors for their addresses).


def _abi_tensors(sq=16, sk=16, hq=4, hkv=2):
    q, k, v = _qkv(sq=sq, sk=sk, hq=hq, hkv=hkv)
    return q, k, v, torch.empty_like(q), torch.empty(2, hq, sq)


def test_kernel_params_carry_the_variants(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v, out, lse = _abi_tensors()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    params = _ops.kernel_params(lib, q, k, v, out, lse, False, 0.0,
                                variants=_ops.Variants(7, 3, 30.0, sinks, 1024))
    assert (params.local, params.window_size_left, params.window_size_right, params.softcap, params.sinks,
            params.attention_chunk, params.reserved4) == (1, 7, 3, 30.0, sinks.data_ptr(), 1024, 0)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap, seen.sinks,
            seen.attention_chunk) == (1, 7, 3, 30.0, sinks.data_ptr(), 1024)
    plain = _ops.kernel_params(lib, q, k, v, out, lse, True, 0.0)
    assert (plain.local, plain.softcap, plain.sinks, plain.attention_chunk) == (0, 0.0, None, 0)
    with pytest.raises(ValueError, match="contiguous float32 sinks"):
        _ops.kernel_params(lib, q, k, v, out, lse, False, 0.0, variants=_ops.Variants(sinks=sinks.double()))


def test_kernel_params_varlen_and_paged_carry_the_variants(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v, cu_q, cu_k = _packed([3, 5], [4, 6])
    out = torch.empty_like(q)
    params = _ops.kernel_params(lib, q, k, v, out, None, True, 0.0, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                max_seqlen_q=5, max_seqlen_k=6, variants=_ops.Variants(2, -1, 0.0, None, 4))
    assert (params.local, params.window_size_left, params.causal, params.attention_chunk) == (1, 2, 1, 4)
    assert params.cu_seqlens_q == cu_q.data_ptr()


@pytest.fixture
def stub_v4_library(c_compiler, header_text, tmp_path):
    return build_stub(c_compiler, tmp_path, "libflashcore_v4.so",
                      "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V4_SIZE")


def test_a_04_library_refuses_the_variants(use_library, stub_v4_library):
    """A 0.4 library (648-byte params) runs plain calls; a variant it cannot read is RuntimeError naming it, before
    anything is launched, rather than attention without it."""
    use_library(stub_v4_library)
    lib = _lib.load()
    q, k, v, out, lse = _abi_tensors()
    params = _ops.kernel_params(lib, q, k, v, out, lse, True, 0.0)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V4_SIZE
    _ops.kernel_params(lib, q, k, v, out, lse, True, 0.0, variants=_ops.Variants(-1, 3))  # plain causal
    for variants, name in ((_ops.Variants(5, 0), "window_size"), (_ops.Variants(softcap=2.0), "softcap"),
                           (_ops.Variants(sinks=torch.zeros(4)), "sinks"),
                           (_ops.Variants(attention_chunk=8), "attention_chunk")):
        with pytest.raises(RuntimeError, match=f"{name} is set, but .*0.5 library or newer is needed"):
            _ops.kernel_params(lib, q, k, v, out, lse, True, 0.0, variants=variants)


# ---------------------------------------------------------------------------------------------------------------
# The ops with the kernel emulated by the float64 reference: the wiring of every argument.


VARIANT_CASES = [
    dict(causal=True, window_size=(5, 0)),
    dict(causal=False, window_size=(3, 6)),
    dict(causal=False, window_size=(-1, 2)),
    dict(causal=True, softcap=0.5),
    dict(causal=False, sinks="sinks"),
    dict(causal=True, window_size=(4, 0), softcap=1.5, sinks="sinks"),
    dict(causal=True, attention_chunk=8),
    dict(causal=False, attention_chunk=5),
    dict(causal=False, attention_chunk=1),
    dict(causal=True, window_size=(6, 0), softcap=1.5, sinks="sinks", attention_chunk=7),
]
CASE_IDS = ["causal-window", "window", "right-only", "softcap", "sinks", "all", "causal-chunk8", "chunk5", "chunk1",
            "all-chunk7"]


def _case(case, hq=4, dtype=torch.float32):
    kwargs = dict(case)
    if kwargs.get("sinks") == "sinks":
        kwargs["sinks"] = _sinks(hq).to(dtype)
    return kwargs


def _reference(q, k, v, kwargs, scale=None):
    sinks = kwargs.get("sinks")
    return reference_variants(q, k, v, kwargs.get("causal", False), scale, kwargs.get("window_size", (-1, -1)),
                              kwargs.get("softcap", 0.0), None if sinks is None else sinks.float(),
                              kwargs.get("attention_chunk", 0))


@pytest.mark.parametrize("case", VARIANT_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("sq, sk", [(24, 24), (10, 30), (30, 10)])
def test_emulated_attention(emulated, case, sq, sk):
    q, k, v = _qkv(sq=sq, sk=sk, hq=4, hkv=2)
    kwargs = _case(case, dtype=torch.bfloat16)  # bf16 sinks: converted to float32 by the front end
    out, lse = flashcore.attention(q, k, v, return_lse=True, softmax_scale=0.3, **kwargs)
    want_out, want_lse = _reference(q, k, v, kwargs, 0.3)
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse.float(), atol=1e-5, rtol=1e-5, equal_nan=True)
    # The variant made a difference (else this test could not tell a dropped argument).
    plain, _ = reference_variants(q, k, v, kwargs.get("causal", False), 0.3)
    assert (plain - want_out).abs().max() > 0.05


@pytest.mark.parametrize("case", VARIANT_CASES, ids=CASE_IDS)
def test_emulated_sdpa_kvcache_varlen(emulated, case):
    kwargs = _case(case)
    q, k, v = _qkv(sq=12, sk=12)
    want, want_lse = _reference(q, k, v, kwargs)
    sdpa_kwargs = {key: val for key, val in kwargs.items() if key not in ("causal", "attention_chunk")}
    if "attention_chunk" not in kwargs:
        got = flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=kwargs.get("causal", False),
                             **sdpa_kwargs).transpose(1, 2)
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
    # KV cache: 20 slots, 12 used; the window and chunks align to each sequence's last key.
    cache_k, cache_v = (torch.cat([t, torch.full_like(t[:, :8], float("nan"))], dim=1) for t in (k, v))
    lengths = torch.tensor([12, 12], dtype=torch.int32)
    got, lse = flashcore.attention_with_kvcache(q, cache_k, cache_v, cache_seqlens=lengths, return_softmax_lse=True,
                                                **kwargs)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse.float(), atol=1e-5, rtol=1e-5)
    # Varlen: sequences of different lengths, each aligned on its own.
    qp, kp, vp, cu_q, cu_k = _packed([5, 9], [7, 12])
    got, lse = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, return_lse=True, **kwargs)
    variants = _ops.Variants(*kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0), kwargs.get("sinks"),
                             kwargs.get("attention_chunk", 0))
    want, want_lse = ref_varlen(qp, kp, vp, [5, 9], [7, 12], kwargs.get("causal", False), None, None, variants)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq, sk", [(24, 24), (10, 30), (30, 10), (1, 50)])
def test_chunk_larger_than_the_sequence(emulated, sq, sk):
    """A chunk that holds every key and the last query's diagonal (Sk - 1 < c) restricts nothing where Sq <= Sk: the
    call equals the one without it. With Sq > Sk, the rows whose diagonal i + Sk - Sq is negative lie in chunk -1 and
    see no key (out 0, lse -inf)."""
    q, k, v = _qkv(sq=sq, sk=sk)
    for causal in (False, True):
        out, lse = flashcore.attention(q, k, v, causal=causal, attention_chunk=sk + 7, return_lse=True)
        plain, plain_lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
        # (The emulation runs the plain call in float32 and the chunked one in float64: equal within rounding.)
        blind = max(0, sq - sk)  # rows 0 .. sq - sk - 1
        assert torch.all(out[:, :blind] == 0) and torch.all(lse[:, :, :blind] == -math.inf)
        torch.testing.assert_close(out[:, blind:].float(), plain[:, blind:].float(), atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[:, :, blind:], plain_lse[:, :, blind:], atol=1e-5, rtol=1e-5)


def test_kvcache_decode_chunk(emulated):
    """A decoding step (Sq = 1) with attention_chunk c: the keys of the last key's chunk in each sequence's own length
    (Llama 4's chunked layers), nothing before it; likewise a 3-token step appended to the cache."""
    q, k, v = _qkv(sq=1, sk=40)
    lengths = torch.tensor([40, 23], dtype=torch.int32)
    got = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lengths, attention_chunk=16, causal=True)
    for b, n in enumerate(lengths.tolist()):
        start = (n - 1) // 16 * 16  # 32 and 16
        alone, _ = reference_variants(q[b:b + 1], k[b:b + 1, start:n], v[b:b + 1, start:n], False, None)
        torch.testing.assert_close(got[b:b + 1].float(), alone.float(), atol=1e-2, rtol=1e-2)
    q3, k_new, v_new = _qkv(sq=3, sk=3, seed=5)
    cache_k, cache_v = (torch.cat([t, torch.zeros_like(t[:, :8])], dim=1) for t in (k, v))
    got = flashcore.attention_with_kvcache(q3, cache_k, cache_v, k=k_new, v=v_new, cache_seqlens=lengths,
                                           attention_chunk=16, causal=True)
    for b, n in enumerate(lengths.tolist()):  # keys n .. n + 2 are the new ones; query r sits at n + r
        keys, values = cache_k[b:b + 1, :n + 3], cache_v[b:b + 1, :n + 3]
        want, _ = reference_variants(q3[b:b + 1], keys, values, True, None, (-1, -1), 0.0, None, 16)
        torch.testing.assert_close(got[b:b + 1].float(), want.float(), atol=1e-2, rtol=1e-2)
    assert torch.equal(cache_k[0, 40:43], k_new[0])  # (the append itself)


def test_kvcache_decode_window(emulated):
    """A decoding step (Sq = 1) with window (N - 1, 0): the last N keys of each sequence's own length."""
    q, k, v = _qkv(sq=1, sk=40)
    lengths = torch.tensor([40, 23], dtype=torch.int32)
    got = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=lengths, window_size=(7, 0), causal=True)
    for b, n in enumerate(lengths.tolist()):
        want, _ = reference_variants(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], True, None, (7, 0))
        alone, _ = reference_variants(q[b:b + 1], k[b:b + 1, n - 8:n], v[b:b + 1, n - 8:n], False, None)
        torch.testing.assert_close(want, alone)  # the reference agrees: the last 8 keys, nothing else
        torch.testing.assert_close(got[b:b + 1].float(), want.float(), atol=1e-2, rtol=1e-2)


def test_rows_without_keys_get_the_sink(emulated):
    """Sk = 0: out 0 and lse = sinks[h] (the sink is the denominator's only term), for every entry point; -inf
    without sinks."""
    q, k, v = _qkv(sq=5, sk=0)
    sinks = _sinks()
    out, lse = flashcore.attention(q, k, v, return_lse=True, sinks=sinks)
    assert torch.all(out == 0) and torch.equal(lse, sinks[None, :, None].expand(2, 4, 5))
    _, lse = flashcore.attention(q, k, v, return_lse=True)
    assert torch.all(lse == -math.inf)
    out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=torch.zeros(2, dtype=torch.int32),
                                                return_softmax_lse=True, sinks=sinks)
    assert torch.all(out == 0) and torch.equal(lse, sinks[None, :, None].expand(2, 4, 5))
    qp = q.flatten(0, 1)
    empty = torch.zeros(3, dtype=torch.int32)
    out, lse = flashcore.varlen_attention(qp, k.flatten(0, 1), v.flatten(0, 1), cu_seqlens([5, 5]), empty, 5, 0,
                                          return_lse=True, sinks=sinks)
    assert torch.all(out == 0) and torch.equal(lse, sinks[:, None].expand(4, 10))
    # And a row that sees nothing because of the mask (causal with Sq > Sk) in the reference the emulation uses.
    q, k, v = _qkv(sq=6, sk=3)
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True, sinks=sinks)
    assert torch.all(out[:, :3] == 0) and torch.equal(lse[:, :, :3], sinks[None, :, None].expand(2, 4, 3))


def test_gqa_and_mqa(emulated):
    for hq, hkv in ((8, 2), (8, 1)):
        q, k, v = _qkv(sq=20, sk=20, hq=hq, hkv=hkv)
        sinks = _sinks(hq)
        out = flashcore.attention(q, k, v, causal=True, window_size=(6, 0), sinks=sinks, softcap=2.0)
        want, _ = reference_variants(q, k, v, True, None, (6, 0), 2.0, sinks)
        torch.testing.assert_close(out.float(), want.float(), atol=1e-2, rtol=1e-2)
        out = flashcore.attention(q, k, v, causal=True, attention_chunk=6, sinks=sinks)
        want, _ = reference_variants(q, k, v, True, None, (-1, -1), 0.0, sinks, 6)
        torch.testing.assert_close(out.float(), want.float(), atol=1e-2, rtol=1e-2)


# ---------------------------------------------------------------------------------------------------------------
# The backward (since 0.6): the variants' gradients, sinks included, with the kernel emulated
# (reference.variant_backward_fp64, the kernel's formulas) against float64 autograd of the definitions
# (reference.reference_variant_grads).

# bf16 rounding of gradients (and of O, which D = rowsum(dO * O) reads, as the kernel does), against float64: relative
# to the largest gradient (GRAD_TOL for those of magnitude ~1).
GRAD_TOL = dict(atol=2e-2, rtol=2e-2)

BACKWARD_CASES = [  # (name, flashcore keyword arguments; "sinks" is drawn by _case)
    ("window-c4", dict(causal=True, window_size=(4, 0))),
    ("window-diag", dict(window_size=(0, 0))),
    ("window-left3", dict(window_size=(3, -1))),
    ("window-right5", dict(window_size=(-1, 5))),
    ("window-c3-unbounded", dict(causal=True, window_size=(3, -1))),
    ("softcap", dict(softcap=2.0)),
    ("softcap-causal-window", dict(causal=True, softcap=2.0, window_size=(6, 0))),
    ("sinks", dict(sinks="sinks")),
    ("sinks-causal", dict(causal=True, sinks="sinks")),
    ("sinks-window", dict(causal=True, window_size=(5, 0), sinks="sinks")),
    ("all", dict(window_size=(7, 2), softcap=1.5, sinks="sinks")),
    ("chunk-c8", dict(causal=True, attention_chunk=8)),
    ("chunk5", dict(attention_chunk=5)),
    ("chunk1", dict(attention_chunk=1)),
    ("chunk-c64", dict(causal=True, attention_chunk=64)),  # larger than the sequences
    ("chunk-c4-window", dict(causal=True, window_size=(5, 0), attention_chunk=4)),
    ("chunk-all", dict(window_size=(7, 2), softcap=1.5, sinks="sinks", attention_chunk=6)),
]


def _leaves(b=2, sq=16, sk=16, hq=4, hkv=2, d=64, seed=0, scale_q=2.0):
    """q (scaled: scores of a few units, so that the softcap bites), k, v in bf16, requiring grad, and dout."""
    q, k, v = _qkv(b, sq, sk, hq, hkv, d, seed=seed)
    q = (q.float() * scale_q).to(q.dtype)
    dout = torch.randn(b, sq, hq, d, generator=torch.Generator().manual_seed(seed + 7)).to(q.dtype)
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), dout


def _want(q, k, v, dout, kwargs, scale=None, dlse=None):
    sinks = kwargs.get("sinks")
    return reference_variant_grads(q, k, v, dout, kwargs.get("causal", False), scale,
                                   kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0),
                                   None if sinks is None else sinks.detach().float(),
                                   kwargs.get("attention_chunk", 0), dlse=dlse)


def _check(got, want, names=("dq", "dk", "dv", "dsinks")):
    for name, g, w in zip(names, got, want):
        if w is None:
            assert g is None, f"{name}: a gradient where none was expected"
            continue
        assert g is not None, f"{name} missing"
        atol = GRAD_TOL["atol"] * max(1.0, w.abs().max().item())
        torch.testing.assert_close(g.double(), w, atol=atol, rtol=GRAD_TOL["rtol"], msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name, case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
@pytest.mark.parametrize("sq, sk, hkv", [(16, 16, 2), (11, 19, 1), (19, 11, 4)], ids=["square", "sq<sk-mqa",
                                                                                     "sq>sk-mha"])
def test_attention_grads(emulated, name, case, sq, sk, hkv):
    """q, k, v (and sinks, which require grad) through flashcore.attention: every gradient as float64 autograd's."""
    kwargs = _case(case)
    if "sinks" in kwargs:
        kwargs["sinks"].requires_grad_()
    q, k, v, dout = _leaves(sq=sq, sk=sk, hkv=hkv)
    out = flashcore.attention(q, k, v, **kwargs)
    out.backward(dout)
    sinks = kwargs.get("sinks")
    want = _want(q, k, v, dout, kwargs)
    _check((q.grad, k.grad, v.grad, None if sinks is None else sinks.grad), want)
    for t in (q, k, v):
        assert t.grad.dtype == t.dtype and t.grad.stride() == t.stride()
    if sinks is not None:
        assert sinks.grad.dtype == torch.float32 and sinks.grad.shape == (4,)


def test_sdpa_grads(emulated):
    """sdpa's (B, H, S, D) tensors with a window, softcap and sinks: gradients in the inputs' layout, as float64's."""
    q, k, v, dout = _leaves(2, 21, 21, 4, 2)
    qb, kb, vb = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    sinks = _sinks().requires_grad_()
    out = flashcore.sdpa(qb, kb, vb, is_causal=True, window_size=(5, 0), softcap=2.5, sinks=sinks, scale=0.2)
    out.backward(dout.transpose(1, 2))
    want = reference_variant_grads(q, k, v, dout, True, 0.2, (5, 0), 2.5, sinks.detach())
    _check((qb.grad.transpose(1, 2), kb.grad.transpose(1, 2), vb.grad.transpose(1, 2), sinks.grad), want)
    for t in (qb, kb, vb):
        assert t.grad.is_contiguous()


def test_grads_of_sinks_alone(emulated):
    """Sinks that require grad (gpt-oss's are a parameter, bf16 here), q, k, v that do not: the sinks' gradient, in
    their dtype (the front end converted them to float32, autograd converts the gradient back), as float64's."""
    q, k, v, dout = (t.detach() if t.requires_grad else t for t in _leaves())
    sinks = _sinks().to(torch.bfloat16).requires_grad_()
    out = flashcore.attention(q, k, v, causal=True, window_size=(3, 0), sinks=sinks)
    assert out.requires_grad
    out.backward(dout)
    assert sinks.grad.dtype == torch.bfloat16
    want = _want(q, k, v, dout, dict(causal=True, window_size=(3, 0), sinks=sinks))
    torch.testing.assert_close(sinks.grad.double(), want[3], **GRAD_TOL)


def test_sinks_that_do_not_require_grad_get_none(emulated, monkeypatch):
    """Sinks that do not require grad (a buffer): no dsinks is asked of the library (return_dsinks=False), none
    returned; q, k, v's gradients as float64's."""
    seen = []
    real = _ops._launch_backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("dsinks"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "_launch_backward", spy)
    q, k, v, dout = _leaves()
    sinks = _sinks()
    flashcore.attention(q, k, v, sinks=sinks).backward(dout)
    assert seen == [None] and sinks.grad is None
    _check((q.grad, k.grad, v.grad), _want(q, k, v, dout, dict(sinks=sinks))[:3])
    sinks.requires_grad_()
    for t in (q, k, v):
        t.grad = None
    flashcore.attention(q, k, v, sinks=sinks).backward(dout)
    assert seen[1] is not None and seen[1].shape == (4,) and seen[1].dtype == torch.float32


@pytest.mark.parametrize("case", [dict(causal=True, window_size=(4, 0)), dict(softcap=1.5, window_size=(5, 3)),
                                  dict(causal=True, sinks="sinks"), dict(window_size=(-1, 4), softcap=2.0,
                                                                         sinks="sinks"),
                                  dict(causal=True, attention_chunk=6, sinks="sinks"), dict(attention_chunk=5)],
                         ids=["window", "softcap-window", "sinks", "all", "chunk-sinks", "chunk"])
def test_grads_through_lse(emulated, case):
    """A loss on out and lse: the gradient through lse (one more backward call with v = e_0, dO = g e_0, O = 0, and
    the sinks' share of lse added on the host) reaches q, k and the sinks as float64 autograd's; v gets none from
    it. Rows without keys (lse = -inf without sinks) pass nothing."""
    kwargs = _case(case)
    if "sinks" in kwargs:
        kwargs["sinks"].requires_grad_()
    q, k, v, dout = _leaves(1, 24, 16)
    out, lse = flashcore.attention(q, k, v, return_lse=True, softmax_scale=0.3, **kwargs)
    dlse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(3))
    torch.autograd.backward([out, lse], [dout, dlse])
    sinks = kwargs.get("sinks")
    want = _want(q, k, v, dout, kwargs, scale=0.3, dlse=dlse)
    _check((q.grad, k.grad, v.grad, None if sinks is None else sinks.grad), want)
    for t in (q, k, v) + (() if sinks is None else (sinks,)):
        t.grad = None
    _, lse = flashcore.attention(q, k, v, return_lse=True, softmax_scale=0.3, **kwargs)
    lse[torch.isfinite(lse)].sum().backward()  # lse alone
    want = _want(q, k, v, torch.zeros(q.shape), kwargs, scale=0.3, dlse=torch.ones(lse.shape))
    _check((q.grad, k.grad, v.grad, None if sinks is None else sinks.grad), want)
    assert torch.all(v.grad == 0)


def test_direct_op_without_lse_recomputes_it(emulated):
    """torch.ops.flashcore.attention_fwd(..., return_lse=False) with variants on inputs that require grad: the
    backward gets lse by running the forward again, with the variants."""
    q, k, v, dout = _leaves()
    sinks = _sinks().requires_grad_()
    out, lse = _ops.attention_fwd(q, k, v, True, 0.0, False, window_size_left=5, softcap=2.0, sinks=sinks)
    assert lse.shape == (0,)
    out.backward(dout)
    want = _want(q, k, v, dout, dict(causal=True, window_size=(5, -1), softcap=2.0, sinks=sinks))
    _check((q.grad, k.grad, v.grad, sinks.grad), want)


def test_front_ends_ask_for_lse_when_differentiated(emulated, monkeypatch):
    """With variants the front ends ask for lse whenever the call will be differentiated, sinks that require grad
    included (the backward reads it); not otherwise."""
    calls = []
    real = _ops.attention_fwd

    def spy(*args, **kwargs):
        calls.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "attention_fwd", spy)
    q, k, v = _qkv()
    sinks = _sinks()
    flashcore.attention(q, k, v, softcap=2.0, sinks=sinks)
    flashcore.attention(q, k, v, softcap=2.0, sinks=sinks.requires_grad_())
    with torch.no_grad():
        flashcore.attention(q, k, v, softcap=2.0, sinks=sinks)
    flashcore.sdpa(*(t.transpose(1, 2).requires_grad_() for t in (q, k, v)), window_size=(3, 3))
    assert calls == [False, True, False, True]


@pytest.mark.parametrize("chunk", [0, 4], ids=["window", "window-chunk"])
def test_varlen_grads(emulated, chunk):
    """Packed sequences with a window, softcap and sinks (which require grad), and attention_chunk: each sequence's
    gradients as float64 autograd's (the chunks aligned per sequence); the sinks' gradient summed over the
    sequences."""
    lens_q, lens_k = [5, 9, 1], [7, 12, 4]
    qp, kp, vp, cu_q, cu_k = _packed(lens_q, lens_k)
    qp, kp, vp = (t.requires_grad_() for t in (qp, kp, vp))
    sinks = _sinks().requires_grad_()
    dout = torch.randn(qp.shape, generator=torch.Generator().manual_seed(4)).to(qp.dtype)
    out = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, causal=True, window_size=(3, 0), softcap=2.0,
                                     sinks=sinks, attention_chunk=chunk)
    out.backward(dout)
    total = torch.zeros(4, dtype=torch.float64)
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        one = lambda t, s: t.detach()[s][None]  # noqa: E731
        want = reference_variant_grads(one(qp, qs), one(kp, ks), one(vp, ks), one(dout, qs), True, None, (3, 0), 2.0,
                                       sinks.detach(), chunk)
        _check((qp.grad[qs][None], kp.grad[ks][None], vp.grad[ks][None]), want[:3])
        total += want[3]
    torch.testing.assert_close(sinks.grad.double(), total, **GRAD_TOL)


def test_varlen_without_sinks_grad_and_lse_grad(emulated):
    """Varlen with variants: q alone requiring grad runs (no dsinks); a gradient through its lse is still refused."""
    qp, kp, vp, cu_q, cu_k = _packed([5, 9], [7, 12])
    qp.requires_grad_()
    out = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, softcap=3.0)
    out.float().sum().backward()
    assert qp.grad is not None and torch.isfinite(qp.grad).all()
    out, lse = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, softcap=3.0, return_lse=True)
    with pytest.raises(NotImplementedError, match="gradient through varlen_attention's lse"):
        torch.autograd.backward([out, lse], [torch.ones_like(out), torch.ones_like(lse)])


def test_kvcache_backward_still_raises(emulated):
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flashcore.attention_with_kvcache(q, k.detach(), v.detach(), window_size=(3, 0), causal=True)
    with pytest.raises(NotImplementedError, match="KV-cache"):
        out.float().sum().backward()


@pytest.mark.parametrize("entry", ["attention", "direct-op", "varlen"])
def test_backward_gets_the_forward_chunk(emulated, monkeypatch, entry):
    """The backward runs with the forward's attention_chunk (the autograd formula keeps it): through the front ends,
    and through the op called without lse (the backward's recomputed forward takes it too)."""
    seen = []
    for name in ("_launch_backward", "_launch_varlen_backward"):
        real = getattr(_ops, name)
        monkeypatch.setattr(_ops, name, lambda *a, real=real, **kw: seen.append(kw.get("variants")) or real(*a, **kw))
    if entry == "varlen":
        qp, kp, vp, cu_q, cu_k = _packed([5, 9], [7, 12])
        qp.requires_grad_()
        out = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, causal=True, attention_chunk=3)
        out.float().sum().backward()
    else:
        q, k, v, dout = _leaves()
        if entry == "attention":
            out = flashcore.attention(q, k, v, attention_chunk=3)
        else:
            out, lse = _ops.attention_fwd(q, k, v, False, 0.0, False, attention_chunk=3)
            assert lse.shape == (0,)
        out.backward(dout)
        _check((q.grad, k.grad, v.grad), _want(q, k, v, dout, dict(attention_chunk=3))[:3])
    assert [variants.attention_chunk for variants in seen] == [3]


def test_backward_of_a_window_that_is_plain_causal_runs(emulated, monkeypatch):
    """causal=True with window_size=(-1, right) is causal attention (the right bound is 0): the plain backward."""
    seen = []
    real = _ops._launch_backward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("variants"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_ops, "_launch_backward", spy)
    q, k, v, dout = _leaves()
    flashcore.attention(q, k, v, causal=True, window_size=(-1, 3)).backward(dout)
    assert seen == [None]
    _check((q.grad, k.grad, v.grad), _want(q, k, v, dout, dict(causal=True))[:3])


@pytest.mark.parametrize("chunk", [0, 5], ids=["window", "window-chunk"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_backward(emulated, backend, chunk):
    """torch.compile(fullgraph=True) of a loss through flashcore.attention with a window, softcap and sinks (and
    attention_chunk), then .backward(): the joint graph traces attention_variants_bwd (fake), and the gradients, the
    sinks' included, equal eager's."""
    torch._dynamo.reset()

    def loss(q, k, v, sinks, dout):
        out = flashcore.attention(q, k, v, causal=True, window_size=(4, 0), softcap=2.0, sinks=sinks,
                                  attention_chunk=chunk)
        return (out.float() * dout).sum()

    compiled = torch.compile(loss, fullgraph=True, backend=backend)
    q, k, v, dout = _leaves(sq=17, sk=17)
    sinks = _sinks().requires_grad_()
    compiled(q, k, v, sinks, dout.float()).backward()
    got = [t.grad for t in (q, k, v, sinks)]
    for t in (q, k, v, sinks):
        t.grad = None
    loss(q, k, v, sinks, dout.float()).backward()
    for g, t in zip(got, (q, k, v, sinks)):
        torch.testing.assert_close(g, t.grad, atol=0, rtol=0)


def test_variants_backward_ops_fake_and_opcheck(emulated):
    """attention_variants_bwd: schema, fake propagation (dsinks float32 (Hq,) or an empty (0,)), argument checks,
    opcheck; and opcheck of the forward op with sinks that require grad (its autograd formula, AOT dispatch)."""
    args = {a.name: a for a in torch.ops.flashcore.attention_variants_bwd.default._schema.arguments}
    # attention_chunk last: the 0.6 op's arguments keep their positions.
    assert list(args)[-7:] == ["deterministic", "window_size_left", "window_size_right", "softcap", "sinks",
                               "return_dsinks", "attention_chunk"]
    assert (str(args["attention_chunk"].type), args["attention_chunk"].default_value) == ("int", 0)
    assert len(torch.ops.flashcore.attention_variants_bwd.default._schema.returns) == 4
    vargs = [a.name for a in torch.ops.flashcore.varlen_attention_variants_bwd.default._schema.arguments]
    # The varlen op: the same seven, then (0.9) seqused_q and seqused_k.
    assert vargs[-9:-2] == list(args)[-7:] and vargs[-2:] == ["seqused_q", "seqused_k"]
    with FakeTensorMode():
        q = torch.empty(2, 17, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 33, 2, 64, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(2, 8, 17, device="cuda")
        sinks = torch.empty(8, device="cuda")
        dq, dk, dv, ds = torch.ops.flashcore.attention_variants_bwd(q, q, k, k, q, lse, True, 0.0, False, 5, -1, 2.0,
                                                                    sinks, True)
        assert (dq.shape, dk.shape, dv.shape, ds.shape, ds.dtype) == (q.shape, k.shape, k.shape, (8,), torch.float32)
        ds = torch.ops.flashcore.attention_variants_bwd(q, q, k, k, q, lse, True, 0.0, False, sinks=sinks)[3]
        assert ds.shape == (0,)
        with pytest.raises(ValueError, match="return_dsinks=True needs sinks"):
            torch.ops.flashcore.attention_variants_bwd(q, q, k, k, q, lse, True, 0.0, False, return_dsinks=True)
        with pytest.raises(ValueError, match="sinks must have shape"):
            torch.ops.flashcore.attention_variants_bwd(q, q, k, k, q, lse, True, 0.0, sinks=sinks[:4])
    q, k, v = _qkv(sq=17, sk=33)
    sinks = _sinks()
    out, lse = _ops.attention_fwd(q, k, v, True, 0.0, True, window_size_left=5, softcap=2.0, sinks=sinks)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flashcore.attention_variants_bwd.default,
                          (dout, q, k, v, out, lse, True, 0.0, False, 5, -1, 2.0, sinks, True))
    out, lse = _ops.attention_fwd(q, k, v, True, 0.0, True, softcap=2.0, sinks=sinks, attention_chunk=6)
    torch.library.opcheck(torch.ops.flashcore.attention_variants_bwd.default,
                          (dout, q, k, v, out, lse, True, 0.0, False, -1, -1, 2.0, sinks, True, 6))
    torch.library.opcheck(torch.ops.flashcore.attention_fwd.default,
                          (q.requires_grad_(), k, v, False, 0.3, True),
                          dict(window_size_left=3, window_size_right=2, softcap=2.0, sinks=sinks.requires_grad_(),
                               attention_chunk=7),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_dynamic"))


# ---------------------------------------------------------------------------------------------------------------
# The custom ops: schema, fake tensors, opcheck, torch.compile.


def test_op_schemas_take_the_variants():
    for op in ("attention_variants_bwd", "varlen_attention_variants_bwd"):
        args = {a.name: a for a in getattr(torch.ops.flashcore, op).default._schema.arguments}
        names = ("window_size_left", "window_size_right", "softcap", "sinks", "attention_chunk")
        assert [str(args[n].type) for n in names] == ["int", "int", "float", "Optional[Tensor]", "int"], op
        assert args["attention_chunk"].default_value == 0, op
    for op in ("attention_fwd", "attention_kvcache_fwd", "varlen_attention_fwd"):
        args = {a.name: a for a in getattr(torch.ops.flashcore, op).default._schema.arguments}
        names = ("window_size_left", "window_size_right", "softcap", "sinks", "attention_chunk")
        assert [str(args[n].type) for n in names] == ["int", "int", "float", "Optional[Tensor]", "int"], op
        assert (args["window_size_left"].default_value, args["window_size_right"].default_value,
                args["softcap"].default_value, args["sinks"].default_value,
                args["attention_chunk"].default_value) == (-1, -1, 0.0, None, 0), op


def test_fake_tensors():
    with FakeTensorMode():
        q = torch.empty(2, 17, 8, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(2, 33, 2, 64, dtype=torch.bfloat16, device="cuda")
        sinks = torch.empty(8, device="cuda")
        out, lse = torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, window_size_left=5, softcap=3.0,
                                                     sinks=sinks, attention_chunk=8192)
        assert out.shape == q.shape and lse.shape == (2, 8, 17)
        with pytest.raises(ValueError, match="sinks must have shape"):
            torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, sinks=torch.empty(4, device="cuda"))
        with pytest.raises(TypeError, match="sinks must be float32 here"):
            torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, sinks=sinks.half())


def test_opcheck(emulated):
    q, k, v = _qkv(sq=17, sk=33)
    sinks = _sinks()
    for args in ((q, k, v, True, 0.0, True), (q, k, v, False, 0.3, False)):
        for chunk in (0, 8):
            torch.library.opcheck(torch.ops.flashcore.attention_fwd.default, args,
                                  dict(window_size_left=5, window_size_right=2, softcap=3.0, sinks=sinks,
                                       attention_chunk=chunk),
                                  test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("chunk", [0, 8], ids=["window", "window-chunk"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(emulated, backend, chunk):
    torch._dynamo.reset()
    q, k, v = _qkv(sq=17, sk=17)
    sinks = _sinks()

    def fn(q, k, v, sinks):
        out, lse = flashcore.attention(q, k, v, causal=True, window_size=(4, 0), softcap=2.0, sinks=sinks,
                                       return_lse=True, attention_chunk=chunk)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(compiled(q, k, v, sinks), fn(q, k, v, sinks)):
        torch.testing.assert_close(got, want)


def test_exported_names():
    assert _ops.Variants()._fields == ("window_size_left", "window_size_right", "softcap", "sinks", "attention_chunk")
    assert _ops.variant_names(_ops.Variants(3, 0, 2.0, torch.zeros(1), 4), True) == [
        "window_size=(3, 0)", "softcap=2.0", "sinks", "attention_chunk=4"]
    assert _ops.variant_names(None, False) == [] and _ops.variant_names(_ops.Variants(-1, 7), True) == []

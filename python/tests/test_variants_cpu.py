"""The attention variants (C ABI 0.5, issue #72: window_size, softcap, sinks, attention_chunk) without a GPU: the
float64 reference against a loop-by-loop reading of the definitions, the front ends' argument errors (each naming the
argument), the C params the ops fill (through the host-only stub library, and a 0.4-sized one that refuses them), the
custom ops with the kernel emulated on the CPU by the float64 reference (results, LSE with sinks, rows without keys,
fake tensors, opcheck, torch.compile), and the backward's NotImplementedError naming the variant.

The kernels themselves run in test_variants_gpu.py."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from conftest import build_stub  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import emulate_on_cpu, reference_variants, variant_mask  # noqa: E402
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


@pytest.mark.parametrize("entry", ["attention", "varlen_attention", "attention_with_kvcache"])
def test_attention_chunk_is_refused_naming_it(emulated, entry):
    # The C ABI reserves attention_chunk; this version has no kernel path for it: every front end refuses it up front.
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="attention_chunk=64"):
        if entry == "attention":
            flashcore.attention(q, k, v, causal=True, attention_chunk=64)
        elif entry == "varlen_attention":
            cu = torch.tensor([0, q.shape[1]], dtype=torch.int32)
            flashcore.varlen_attention(q[0], k[0], v[0], cu, cu, q.shape[1], q.shape[1], causal=True,
                                       attention_chunk=64)
        else:
            flashcore.attention_with_kvcache(q, k, v, causal=True, attention_chunk=64)


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
    assert (seen.local, seen.window_size_left, seen.window_size_right, seen.softcap, seen.sinks) == (
        1, 7, 3, 30.0, sinks.data_ptr())
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
]
CASE_IDS = ["causal-window", "window", "right-only", "softcap", "sinks", "all"]


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


# ---------------------------------------------------------------------------------------------------------------
# The backward: NotImplementedError naming the variant (never the gradients of plain attention).


@pytest.mark.parametrize("kwargs, needle", [
    (dict(window_size=(4, 0), causal=True), r"window_size=\(4, 0\)"),
    (dict(softcap=30.0), "softcap=30.0"),
    (dict(sinks="sinks"), "sinks"),
])
def test_backward_raises_naming_the_variant(emulated, kwargs, needle):
    kwargs = _case(kwargs)
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flashcore.attention(q, k, v, **kwargs)  # the forward runs with inputs that require grad
    with pytest.raises(NotImplementedError, match=f"backward of attention with {needle}.* not supported yet"):
        out.float().sum().backward()
    out = flashcore.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), **{key: val for key, val in kwargs.items()
                                                                      if key not in ("causal", "attention_chunk")})
    if any(key in kwargs for key in ("window_size", "softcap", "sinks")):
        with pytest.raises(NotImplementedError, match="not supported yet"):
            out.float().sum().backward()
    with torch.no_grad():
        assert flashcore.attention(q, k, v, **kwargs).shape == q.shape


def test_backward_of_sinks_alone_raises(emulated):
    """Sinks that require grad (gpt-oss's are a parameter), q, k, v that do not: still no made-up gradient."""
    q, k, v = _qkv()
    sinks = _sinks().requires_grad_()
    out = flashcore.attention(q, k, v, sinks=sinks)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match="with sinks"):
        out.float().sum().backward()


def test_backward_of_a_window_that_is_plain_causal_runs(emulated):
    """causal=True with window_size=(-1, right) is causal attention (the right bound is 0): its backward exists."""
    q, k, v = (t.requires_grad_() for t in _qkv())
    flashcore.attention(q, k, v, causal=True, window_size=(-1, 3)).float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_varlen_and_kvcache_backward_raise(emulated):
    qp, kp, vp, cu_q, cu_k = _packed([5, 9], [7, 12])
    qp.requires_grad_()
    out = flashcore.varlen_attention(qp, kp, vp, cu_q, cu_k, 9, 12, softcap=3.0)
    with pytest.raises(NotImplementedError, match=r"backward of varlen attention .* with softcap=3.0"):
        out.float().sum().backward()
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = flashcore.attention_with_kvcache(q, k.detach(), v.detach(), window_size=(3, 0), causal=True)
    with pytest.raises(NotImplementedError, match="KV-cache"):
        out.float().sum().backward()


# ---------------------------------------------------------------------------------------------------------------
# The custom ops: schema, fake tensors, opcheck, torch.compile.


def test_op_schemas_take_the_variants():
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
                                                     sinks=sinks)
        assert out.shape == q.shape and lse.shape == (2, 8, 17)
        with pytest.raises(ValueError, match="sinks must have shape"):
            torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, sinks=torch.empty(4, device="cuda"))
        with pytest.raises(TypeError, match="sinks must be float32 here"):
            torch.ops.flashcore.attention_fwd(q, k, k, True, 0.0, True, sinks=sinks.half())


def test_opcheck(emulated):
    q, k, v = _qkv(sq=17, sk=33)
    sinks = _sinks()
    for args in ((q, k, v, True, 0.0, True), (q, k, v, False, 0.3, False)):
        torch.library.opcheck(torch.ops.flashcore.attention_fwd.default, args,
                              dict(window_size_left=5, window_size_right=2, softcap=3.0, sinks=sinks),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph(emulated, backend):
    torch._dynamo.reset()
    q, k, v = _qkv(sq=17, sk=17)
    sinks = _sinks()

    def fn(q, k, v, sinks):
        out, lse = flashcore.attention(q, k, v, causal=True, window_size=(4, 0), softcap=2.0, sinks=sinks,
                                       return_lse=True)
        return out * 2, lse

    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    for got, want in zip(compiled(q, k, v, sinks), fn(q, k, v, sinks)):
        torch.testing.assert_close(got, want)


def test_exported_names():
    assert _ops.Variants()._fields == ("window_size_left", "window_size_right", "softcap", "sinks", "attention_chunk")
    assert _ops.variant_names(_ops.Variants(3, 0, 2.0, torch.zeros(1), 4), True) == [
        "window_size=(3, 0)", "softcap=2.0", "sinks", "attention_chunk=4"]
    assert _ops.variant_names(None, False) == [] and _ops.variant_names(_ops.Variants(-1, 7), True) == []

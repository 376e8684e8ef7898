"""flashcore.attention's 8-bit path on the GPU: float8_e4m3fn inputs with descales, and precision="fp8".

Rules (P, the softmax probabilities, is quantized to e4m3 in the kernel, as in FlashAttention-3's FP8 path):
  - e4m3 inputs, against the float64 attention of the dequantized inputs (stored * descale): relative RMSE of O
    <= 0.035 and max |O - ref| <= 0.08 * max |ref| + 1e-2; lse within 2e-2.
  - precision="fp8" from 16-bit N(0, 1) inputs, against the float64 attention of the unquantized inputs: relative
    RMSE <= 0.07.
Outputs are poisoned (NaN) before each call, so a row the kernel leaves unwritten fails. Needs torch, a CUDA GPU
served by the sm90 backend and a libflashcore.so with e4m3 kernels (FLASHCORE_LIBRARY=build/lib/libflashcore.so);
skips with the reason otherwise."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import dequantize, reference_fp64, rel_rmse  # noqa: E402

E4M3 = torch.float8_e4m3fn
RMSE_8BIT = 0.035
MAX_ERR_8BIT = (0.08, 1e-2)  # max |O - ref| <= a * max |ref| + b
LSE_ATOL = 2e-2
# The 8-bit MMA accumulates Q K^T with fewer bits than fp32: the LSE error grows with the scores' magnitude.
LSE_RTOL = 2e-3
RMSE_PRECISION_FP8 = 0.07


@pytest.fixture(scope="module")
def caps(cuda):
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported:
        pytest.skip(f"the library has no kernel for this GPU (sm_{caps.device_arch}; compiled: {caps.archs})")
    if caps.device_backend != "sm90":
        pytest.skip(f"the 8-bit path needs the sm90 backend; this GPU (sm_{caps.device_arch}) is served by "
                    f"{caps.device_backend!r}")
    if "float8_e4m3fn" not in caps.dtypes:
        pytest.skip(f"the library has no e4m3 kernels (compiled dtypes: {caps.dtypes})")
    return caps


def _need(cuda, head_dim, causal=False):
    dims = _ops._fp8_head_dims(_lib.load(), cuda, causal)
    if head_dim not in dims:
        pytest.skip(f"no 8-bit kernel for head_dim {head_dim}{' causal' if causal else ''} (8-bit head dims: {dims})")


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs allocated by the op start as NaN (out and lse) instead of uninitialised memory."""
    empty_outputs = _ops._empty_outputs

    def nan_outputs(q, return_lse, out_dtype=None):
        out, lse = empty_outputs(q, return_lse, out_dtype)
        return out.fill_(math.nan), lse.fill_(math.nan)

    monkeypatch.setattr(_ops, "_empty_outputs", nan_outputs)


def _inputs(device, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, seed=0, spread=False):
    """N(0, 1) q, k, v (B, S, H, D); with spread, every (batch, head) gets its own magnitude (1/4 .. 4), so that the
    descales differ."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = []
    for seqlen, heads in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv)):
        t = torch.randn(batch, seqlen, heads, head_dim, device=device, generator=gen)
        if spread:
            t = t * torch.exp2(torch.randint(-2, 3, (batch, 1, heads, 1), device=device, generator=gen).float())
        tensors.append(t.to(dtype))
    return tuple(tensors)


def _quantized(q, k, v):
    """((q8, k8, v8), (q_descale, k_descale, v_descale)), one factor per (batch, KV head)."""
    heads_kv = k.shape[2]
    (q8, qd), (k8, kd), (v8, vd) = (flashcore.quantize_fp8(t, num_heads_kv=heads_kv) for t in (q, k, v))
    return (q8, k8, v8), (qd, kd, vd)


def _fp8_call(q8, k8, v8, descales, **kwargs):
    qd, kd, vd = descales
    return flashcore.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, **kwargs)


def check_8bit(out, lse, q8, k8, v8, descales, causal, softmax_scale=None):
    """out (and lse) of an e4m3 call against the float64 reference of the dequantized inputs."""
    deq = [dequantize(t, d) for t, d in zip((q8, k8, v8), descales)]
    ref, ref_lse = reference_fp64(*deq, causal=causal, softmax_scale=softmax_scale)
    assert out.shape == q8.shape
    assert torch.isfinite(out).all(), "non-finite output (an unwritten row keeps the NaN poison)"
    err = rel_rmse(out, ref)
    max_err = (out.double() - ref).abs().max().item()
    bound = MAX_ERR_8BIT[0] * ref.abs().max().item() + MAX_ERR_8BIT[1]
    assert err <= RMSE_8BIT, f"relative RMSE {err:.4f} > {RMSE_8BIT}"
    assert max_err <= bound, f"max error {max_err:.4g} > {bound:.4g}"
    empty_rows = torch.isneginf(ref_lse).transpose(1, 2)  # (B, Sq, Hq): rows that see no key
    assert torch.all(out[empty_rows] == 0)
    if lse is not None:
        assert lse.shape == (q8.shape[0], q8.shape[2], q8.shape[1]) and lse.dtype == torch.float32
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite) and torch.all(torch.isneginf(lse[~finite]))
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=LSE_ATOL, rtol=LSE_RTOL)
    return err


# ---------------------------------------------------------------------------------------------------------------
# Accuracy.

SEQLENS = [(1, 1), (17, 17), (113, 113), (1, 113), (17, 300), (113, 17), (4097, 4097)]
HEADS = [(4, 4), (8, 2), (8, 1)]  # MHA, GQA 4, MQA


@pytest.mark.parametrize("out_dtype", [None, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("heads", HEADS, ids=[f"hq{a}-hkv{b}" for a, b in HEADS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_e4m3_matches_reference(caps, cuda, poisoned, head_dim, causal, heads, seqlens, out_dtype):
    _need(cuda, head_dim, causal)
    seqlen_q, seqlen_k = seqlens
    batch = 1 if max(seqlens) > 1024 else 2
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, batch, seqlen_q, seqlen_k, *heads, head_dim,
                                                 spread=True))
    if descales[0].numel() > 1:  # (one batch entry and one KV head: a single descale)
        assert len({round(d, 6) for d in descales[0].flatten().tolist()}) > 1, "expected distinct descales"
    out, lse = _fp8_call(q8, k8, v8, descales, causal=causal, return_lse=True, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or torch.bfloat16)
    check_8bit(out, lse, q8, k8, v8, descales, causal)


@pytest.mark.parametrize("seqlens", [(113, 113), (1, 300), (300, 17), (4097, 4097)],
                         ids=["sq113", "sq1-sk300", "sq300-sk17", "sq4097"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_e5m2_matches_reference(caps, cuda, poisoned, head_dim, causal, seqlens):
    """float8_e5m2 q, k, v (P stays e4m3 in the kernel): the same path and tolerance as e4m3 inputs."""
    if "float8_e5m2" not in caps.dtypes:
        pytest.skip(f"the library has no e5m2 kernels (compiled dtypes: {caps.dtypes})")
    dims = _ops._fp8_head_dims(_lib.load(), cuda, causal, _lib.DTYPE_FP8_E5M2)
    if head_dim not in dims:
        pytest.skip(f"no e5m2 kernel for head_dim {head_dim} (e5m2 head dims: {dims})")
    seqlen_q, seqlen_k = seqlens
    batch = 1 if max(seqlens) > 1024 else 2
    q, k, v = _inputs(cuda, torch.float32, batch, seqlen_q, seqlen_k, 8, 2, head_dim, spread=True)
    descales = tuple(torch.rand(batch, 2, device=cuda) / 16 + 1 / 32 for _ in range(3))  # stored ~ N(0, 1) * 16..32
    q8, k8, v8 = (dequantize(t, 1 / d).float().to(torch.float8_e5m2) for t, d in zip((q, k, v), descales))
    out, lse = _fp8_call(q8, k8, v8, descales, causal=causal, return_lse=True)
    assert out.dtype == torch.bfloat16
    check_8bit(out, lse, q8, k8, v8, descales, causal)


def test_e4m3_without_descales(caps, cuda, poisoned):
    """None descales mean 1: e4m3 values used as they are; one descale given, the others 1."""
    _need(cuda, 128)
    q, k, v = (t.to(E4M3) for t in _inputs(cuda, torch.float32, 2, 200, 333, 8, 2, 128))
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    check_8bit(out, lse, q, k, v, (None, None, None), False)
    kd = torch.rand(2, 2, device=cuda) + 0.5
    out = flashcore.attention(q, k, v, k_descale=kd)
    check_8bit(out, None, q, k, v, (None, kd, None), False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_e4m3_softmax_scale(caps, cuda, poisoned, causal):
    _need(cuda, 128, causal)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 77, 200, 8, 2, 128, spread=True))
    out, lse = _fp8_call(q8, k8, v8, descales, causal=causal, softmax_scale=0.03, return_lse=True)
    check_8bit(out, lse, q8, k8, v8, descales, causal, softmax_scale=0.03)


def test_e4m3_rows_without_keys(caps, cuda, poisoned):
    _need(cuda, 128, True)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 4, 128))
    out, lse = _fp8_call(q8, k8, v8, descales, causal=True, return_lse=True)
    empty = 40 - 16  # query i sees key j iff j <= i - 24
    assert torch.all(out[:, :empty] == 0) and torch.all(lse[:, :, :empty] == -math.inf)
    check_8bit(out, lse, q8, k8, v8, descales, True)


PRECISION_SEQLENS = [(1, 1), (113, 113), (17, 300), (4097, 4097)]


@pytest.mark.parametrize("other_out", [False, True], ids=["out-same", "out-other"])
@pytest.mark.parametrize("seqlens", PRECISION_SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in PRECISION_SEQLENS])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_precision_fp8_matches_unquantized_reference(caps, cuda, poisoned, dtype, head_dim, causal, heads, seqlens,
                                                     other_out):
    _need(cuda, head_dim, causal)
    out_dtype = ({torch.bfloat16: torch.float16, torch.float16: torch.bfloat16}[dtype] if other_out else None)
    seqlen_q, seqlen_k = seqlens
    batch = 1 if max(seqlens) > 1024 else 2
    q, k, v = _inputs(cuda, dtype, batch, seqlen_q, seqlen_k, *heads, head_dim)
    out, lse = flashcore.attention(q, k, v, causal=causal, precision="fp8", out_dtype=out_dtype, return_lse=True)
    assert out.shape == q.shape and out.dtype == (out_dtype or dtype)
    assert torch.isfinite(out).all()
    ref, ref_lse = reference_fp64(q, k, v, causal=causal)
    err = rel_rmse(out, ref)
    assert err <= RMSE_PRECISION_FP8, f"relative RMSE {err:.4f} > {RMSE_PRECISION_FP8}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    # Scores of quantized q and k (a single key's lse is its score, off by up to a few percent of it).
    torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=0.25, rtol=LSE_RTOL)


def test_out_dtype_of_a_16bit_call(caps, cuda, poisoned):
    """A native 16-bit call writes O in its input dtype: another out_dtype is refused with a message naming it; with
    precision="fp8" it is allowed (bf16 in, fp16 out)."""
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 100, 100, 8, 2, 128)
    with pytest.raises((TypeError, ValueError), match="out_dtype"):
        flashcore.attention(q, k, v, causal=True, out_dtype=torch.float16)
    _need(cuda, 128, True)
    out = flashcore.attention(q, k, v, causal=True, out_dtype=torch.float16, precision="fp8")
    assert out.dtype == torch.float16
    ref, _ = reference_fp64(q, k, v, causal=True)
    assert rel_rmse(out, ref) < RMSE_PRECISION_FP8


# ---------------------------------------------------------------------------------------------------------------
# Determinism, layouts, workspace reuse.


def test_bit_identical_reruns(caps, cuda, poisoned):
    _need(cuda, 128, True)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 500, 700, 8, 2, 128, spread=True))
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 500, 700, 8, 2, 128, seed=1)
    first = _fp8_call(q8, k8, v8, descales, causal=True, return_lse=True)
    first_auto = flashcore.attention(q, k, v, causal=True, precision="fp8")
    # A larger call in between: the per-stream workspace grows and holds other scratch.
    (b8, c8, d8), big = _quantized(*_inputs(cuda, torch.bfloat16, 2, 3000, 3000, 8, 8, 128, seed=2))
    _fp8_call(b8, c8, d8, big)
    for _ in range(2):
        again = _fp8_call(q8, k8, v8, descales, causal=True, return_lse=True)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
        assert torch.equal(flashcore.attention(q, k, v, causal=True, precision="fp8"), first_auto)


def test_strided_e4m3_inputs(caps, cuda, poisoned):
    """(B, H, S, D) storage and head slices reach the kernel without copies (16-byte strides) and give the
    contiguous inputs' result."""
    _need(cuda, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 97, 97, 8, 2, 128)
    q8 = flashcore.quantize_fp8(q.transpose(1, 2), layout="bhsd", num_heads_kv=2)[0].transpose(1, 2)  # a view
    qd = flashcore.quantize_fp8(q, num_heads_kv=2)[1]
    kv = torch.cat([k, v, k], dim=2)  # (B, S, 6, D): heads 0-1 k, 2-3 v
    kv8, kvd = flashcore.quantize_fp8(kv)
    k8, v8, kd, vd = kv8[:, :, 0:2], kv8[:, :, 2:4], kvd[:, 0:2], kvd[:, 2:4]
    for t in (q8, k8, v8):
        assert not t.is_contiguous() and not _ops.kernel_operand(t)[2], "expected a zero-copy operand"
    out = _fp8_call(q8, k8, v8, (qd, kd, vd))
    want = _fp8_call(q8.contiguous(), k8.contiguous(), v8.contiguous(), (qd, kd.contiguous(), vd.contiguous()))
    assert torch.equal(out, want)
    check_8bit(out, None, q8, k8, v8, (qd, kd, vd), False)


def test_runs_on_a_side_stream(caps, cuda, poisoned):
    _need(cuda, 128)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 256, 256, 8, 2, 128))
    want = _fp8_call(q8, k8, v8, descales)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = _fp8_call(q8, k8, v8, descales)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


def test_empty_sizes(caps, cuda):
    _need(cuda, 128)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 0, 16, 4, 4, 128))
    assert _fp8_call(q8, k8, v8, descales).shape == (2, 0, 4, 128)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 16, 0, 4, 4, 128))
    out, lse = _fp8_call(q8, k8, v8, descales, return_lse=True)
    assert out.dtype == torch.bfloat16 and torch.all(out == 0) and torch.all(lse == -math.inf)


# ---------------------------------------------------------------------------------------------------------------
# torch.compile and CUDA graphs.


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(caps, cuda, dynamic):
    _need(cuda, 128, True)
    torch._dynamo.reset()

    def fn(q8, k8, v8, qd, kd, vd, q, k, v):
        out, lse = flashcore.attention(q8, k8, v8, causal=True, return_lse=True, q_descale=qd, k_descale=kd,
                                       v_descale=vd)
        auto = flashcore.attention(q, k, v, causal=True, precision="fp8", out_dtype=torch.float16)
        return out.float() * 2, lse, auto

    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for seqlen in (64, 100):
        q, k, v = _inputs(cuda, torch.bfloat16, 2, seqlen, seqlen, 8, 2, 128)
        (q8, k8, v8), (qd, kd, vd) = _quantized(q, k, v)
        args = (q8, k8, v8, qd, kd, vd, q, k, v)
        for got, want in zip(compiled(*args), fn(*args)):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_cuda_graph_capture_and_replay(caps, cuda):
    """The 8-bit op in a CUDA graph (its workspace allocated and zeroed inside the capture), replayed with new
    inputs and descales: the eager results, bit for bit."""
    _need(cuda, 128, True)
    shape = (2, 200, 300, 8, 4, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, *shape)
    (q8, k8, v8), (qd, kd, vd) = _quantized(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside capture
        flashcore.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        flashcore.attention(q, k, v, causal=True, precision="fp8")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flashcore.attention(q8, k8, v8, causal=True, return_lse=True, q_descale=qd, k_descale=kd,
                                       v_descale=vd)
        auto = flashcore.attention(q, k, v, causal=True, precision="fp8")
    for seed in (1, 2):
        new = _inputs(cuda, torch.bfloat16, *shape, seed=seed, spread=True)
        (new8, newd) = _quantized(*new)
        for dst, src in zip((q8, k8, v8, qd, kd, vd, q, k, v), (*new8, *newd, *new)):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse = _fp8_call(*new8, newd, causal=True, return_lse=True)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
        assert torch.equal(auto, flashcore.attention(*new, causal=True, precision="fp8"))
        check_8bit(out, lse, *new8, newd, True)


# ---------------------------------------------------------------------------------------------------------------
# V transposed once (fp8_transpose_v, v_transposed=True).


@pytest.mark.parametrize("shape", [(2, 113, 1000, 4, 2, 64, False), (2, 777, 1000, 8, 2, 128, True),
                                   (3, 1, 17, 2, 2, 128, False), (1, 300, 4097, 2, 1, 256, True)],
                         ids=["d64", "d128-gqa-causal", "d128-sq1-sk17", "d256-sk4097-causal"])
def test_v_transposed_is_bit_identical(caps, cuda, poisoned, shape):
    batch, sq, sk, hq, hkv, d, causal = shape
    _need(cuda, d, causal)
    (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, batch, sq, sk, hq, hkv, d, spread=True))
    vt = flashcore.fp8_transpose_v(v8)
    assert vt.dtype == torch.uint8 and vt.shape == (batch, hkv, d, (sk + 127) // 128 * 128)
    want, want_lse = _fp8_call(q8, k8, v8, descales, causal=causal, return_lse=True)
    got, got_lse = _fp8_call(q8, k8, vt, descales, causal=causal, return_lse=True, v_transposed=True)
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
    check_8bit(got, got_lse, q8, k8, v8, descales, causal)
    # Strided (non-contiguous) V is transposed the same.
    v_strided = torch.empty(batch, sk, hkv, d + 32, device=cuda, dtype=v8.dtype)[..., :d]
    v_strided.copy_(v8)
    assert torch.equal(flashcore.fp8_transpose_v(v_strided), vt)


def test_v_transposed_compiles_and_captures(caps, cuda):
    _need(cuda, 128, True)
    torch._dynamo.reset()

    def fn(q8, k8, v8, qd, kd, vd):
        vt = flashcore.fp8_transpose_v(v8)
        return flashcore.attention(q8, k8, vt, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                                   v_transposed=True)

    compiled = torch.compile(fn, fullgraph=True)
    (q8, k8, v8), (qd, kd, vd) = _quantized(*_inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128))
    want = _fp8_call(q8, k8, v8, (qd, kd, vd), causal=True)
    assert torch.equal(compiled(q8, k8, v8, qd, kd, vd), want)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(q8, k8, v8, qd, kd, vd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(q8, k8, v8, qd, kd, vd)
    new8, newd = _quantized(*_inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128, seed=3, spread=True))
    for dst, src in zip((q8, k8, v8, qd, kd, vd), (*new8, *newd)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _fp8_call(*new8, newd, causal=True))


# ---------------------------------------------------------------------------------------------------------------
# Errors on CUDA tensors; FlashAttention-3 when importable.


def test_errors_on_cuda(caps, cuda):
    _need(cuda, 128)
    (q8, k8, v8), (qd, kd, vd) = _quantized(*_inputs(cuda, torch.bfloat16, 2, 16, 16, 4, 2, 128))
    with pytest.raises(ValueError, match="k_descale is on cpu"):
        flashcore.attention(q8, k8, v8, q_descale=qd, k_descale=kd.cpu(), v_descale=vd)
    with pytest.raises(ValueError, match="already float8_e4m3fn"):
        flashcore.attention(q8, k8, v8, precision="fp8")
    with pytest.raises(ValueError, match="q_descale is for 8-bit \\(float8\\) inputs only"):
        flashcore.attention(q8.bfloat16(), k8.bfloat16(), v8.bfloat16(), q_descale=qd)
    with pytest.raises(TypeError, match="dense batches only"):
        flashcore.attention_with_kvcache(q8, k8, v8, cache_seqlens=4)
    if 64 not in _ops._fp8_head_dims(_lib.load(), cuda, False):
        q, k, v = (t.to(E4M3) for t in _inputs(cuda, torch.float32, 1, 16, 16, 2, 2, 64))
        with pytest.raises(ValueError, match="head_dim 64 has no 8-bit kernel"):
            flashcore.attention(q, k, v)
        with pytest.raises(ValueError, match="head_dim 64 has no 8-bit kernel"):
            flashcore.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), precision="fp8")


def test_against_flash_attention_3(caps, cuda):
    """FlashAttention-3's FP8 on the same e4m3 inputs and descales: FlashCore's error against the float64 reference
    is no worse than 1.25x FA3's (+ 0.002)."""
    fa3 = pytest.importorskip("flash_attn_interface", reason="FlashAttention-3 (flash_attn_interface) not installed")
    _need(cuda, 128, True)
    for causal in (False, True):
        (q8, k8, v8), descales = _quantized(*_inputs(cuda, torch.bfloat16, 2, 1000, 1000, 8, 2, 128, spread=True))
        ours = _fp8_call(q8, k8, v8, descales, causal=causal)
        qd, kd, vd = descales
        theirs = fa3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
        theirs = theirs[0] if isinstance(theirs, tuple) else theirs
        ref, _ = reference_fp64(*(dequantize(t, d) for t, d in zip((q8, k8, v8), descales)), causal=causal)
        assert rel_rmse(ours, ref) <= 1.25 * rel_rmse(theirs, ref) + 0.002

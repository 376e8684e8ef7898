"""flashcore.attention / flashcore.sdpa on the GPU against torch SDPA.

Error rule: err(flashcore) <= 2 * err(SDPA at the same dtype) + atol, both measured against fp32 math-backend
SDPA on upcast inputs. Needs torch, a CUDA GPU and libflashcore.so (FLASHCORE_LIBRARY=build/lib/libflashcore.so)."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import reference  # noqa: E402

ATOL = {torch.float16: 1e-3, torch.bfloat16: 5e-3}


@pytest.fixture(scope="module")
def caps(cuda):
    try:
        caps = flashcore.capabilities()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not caps.device_supported:
        pytest.skip(f"the library has no kernel for this GPU (sm_{caps.device_arch}; compiled: {caps.archs})")
    return caps


def _need(caps, dtype, head_dim):
    if str(dtype).replace("torch.", "") not in caps.dtypes or head_dim not in caps.head_dims:
        pytest.skip(f"{dtype} / head_dim {head_dim} not compiled in ({caps.dtypes}, {caps.head_dims})")


def _inputs(device, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    return q, k, v


def check_against_sdpa(q, k, v, causal, softmax_scale=None, out=None, lse=None):
    if out is None:
        out, lse = flashcore.attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True)
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype  # (B, Sq, Hq, v's head dim)
    ref_out, ref_lse = reference(q, k, v, causal, softmax_scale)
    base_out, _ = reference(q, k, v, causal, softmax_scale, upcast=False)
    err = (out.float() - ref_out).abs().max().item()
    base_err = (base_out.float() - ref_out).abs().max().item()
    assert err <= 2 * base_err + ATOL[q.dtype], f"flashcore error {err:.3g} vs SDPA {q.dtype} error {base_err:.3g}"
    if lse is not None:
        assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        torch.testing.assert_close(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)
    return out


SEQLENS = [(1, 1), (17, 17), (113, 113), (128, 128), (1, 113), (17, 113), (113, 17), (4097, 4097)]
HEADS = [(4, 4), (4, 2), (16, 2), (8, 1)]  # MHA, GQA 2, GQA 8, MQA


@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("heads", HEADS, ids=[f"hq{a}-hkv{b}" for a, b in HEADS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_matches_sdpa(caps, cuda, dtype, head_dim, causal, heads, seqlens):
    _need(caps, dtype, head_dim)
    seqlen_q, seqlen_k = seqlens
    batch = 1 if max(seqlens) > 1024 else 2
    check_against_sdpa(*_inputs(cuda, dtype, batch, seqlen_q, seqlen_k, *heads, head_dim), causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_custom_softmax_scale(caps, cuda, dtype):
    _need(caps, dtype, 128)
    check_against_sdpa(*_inputs(cuda, dtype, 2, 77, 200, 8, 2, 128), True, softmax_scale=0.3)


def test_rows_without_keys_are_zero(caps, cuda):
    _need(caps, torch.bfloat16, 64)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 4, 64)
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    empty = 40 - 16  # query i sees key j iff j <= i - 24
    assert torch.all(out[:, :empty] == 0) and torch.all(lse[:, :, :empty] == -math.inf)
    check_against_sdpa(q, k, v, True, out=out, lse=lse)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_front_end(caps, cuda, causal):
    _need(caps, torch.float16, 128)
    q, k, v = _inputs(cuda, torch.float16, 2, 256, 256, 8, 2, 128)
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # genuine (B, H, S, D) tensors
    out = flashcore.sdpa(qb, kb, vb, is_causal=causal, enable_gqa=True)
    assert out.shape == qb.shape
    expected = torch.nn.functional.scaled_dot_product_attention(
        qb.float(), kb.float(), vb.float(), is_causal=causal, enable_gqa=True
    )
    check_against_sdpa(q, k, v, causal, out=out.transpose(1, 2))
    assert (out.float() - expected).abs().max().item() < 2e-2


def test_strided_inputs_pass_through(caps, cuda):
    _need(caps, torch.bfloat16, 64)
    base_q = torch.randn(2, 8, 97, 64, device=cuda, dtype=torch.bfloat16)  # (B, H, S, D)
    base_kv = torch.randn(2, 97, 6, 64, device=cuda, dtype=torch.bfloat16)  # (B, S, H, D), heads sliced below
    q = base_q.transpose(1, 2)
    k, v = base_kv[:, :, 1:3], base_kv[:, :, 4:6]
    for t in (q, k, v):
        assert not _ops.kernel_operand(t)[2], "expected a zero-copy operand"
    out = flashcore.attention(q, k, v, causal=True)
    contiguous = flashcore.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    torch.testing.assert_close(out, contiguous, atol=0, rtol=0)
    check_against_sdpa(q, k, v, True, out=out)


def test_strided_inputs_that_need_copies(caps, cuda):
    _need(caps, torch.float16, 64)
    flat = torch.randn(2 * 50 * 4 * 64 + 1, device=cuda, dtype=torch.float16)
    q = flat[1:].view(2, 50, 4, 64)  # misaligned
    k = torch.randn(2, 50, 2, 68, device=cuda, dtype=torch.float16)[..., :64]  # head stride 68
    v = torch.randn(2, 50, 64, 2, device=cuda, dtype=torch.float16).transpose(2, 3)  # strided last dim
    for t in (q, k, v):
        assert _ops.kernel_operand(t)[2], "expected a copy"
    out = flashcore.attention(q, k, v)
    torch.testing.assert_close(out, flashcore.attention(q.contiguous(), k.contiguous(), v.contiguous()), atol=0, rtol=0)


def test_padded_head_dim_rows_pass_through(caps, cuda):
    _need(caps, torch.float16, 64)
    q, k, v = (torch.randn(2, 33, 4, 72, device=cuda, dtype=torch.float16)[..., :64] for _ in range(3))
    assert not _ops.kernel_operand(q)[2]
    check_against_sdpa(q, k, v, False)


def test_empty_sizes(caps, cuda):
    _need(caps, torch.float16, 64)
    q, k, v = _inputs(cuda, torch.float16, 2, 0, 16, 4, 4, 64)
    assert flashcore.attention(q, k, v).shape == (2, 0, 4, 64)
    q, k, v = _inputs(cuda, torch.float16, 2, 16, 0, 4, 4, 64)
    out, lse = flashcore.attention(q, k, v, return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


# ---------------------------------------------------------------------------------------------------------------
# torch.compile, CUDA graphs, inference mode (the backward: test_backward_gpu.py).


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(caps, cuda, dynamic):
    _need(caps, torch.bfloat16, 128)
    torch._dynamo.reset()

    def fn(q, k, v):
        out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
        return out.float() * 2, lse

    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    for seqlen in (64, 100):
        q, k, v = _inputs(cuda, torch.bfloat16, 2, seqlen, seqlen, 8, 2, 128)
        for got, want in zip(compiled(q, k, v), fn(q, k, v)):
            torch.testing.assert_close(got, want)


def test_torch_compile_sdpa_fullgraph(caps, cuda):
    _need(caps, torch.float16, 64)
    torch._dynamo.reset()
    q, k, v = (t.transpose(1, 2).contiguous() for t in _inputs(cuda, torch.float16, 2, 128, 128, 4, 4, 64))
    compiled = torch.compile(lambda q, k, v: flashcore.sdpa(q, k, v, is_causal=True), fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), flashcore.sdpa(q, k, v, is_causal=True))


def test_cuda_graph_capture_and_replay(caps, cuda):
    _need(caps, torch.bfloat16, 128)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside capture
        flashcore.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    for seed in (1, 2):
        new_q, new_k, new_v = _inputs(cuda, torch.bfloat16, 2, 200, 300, 8, 4, 128, seed=seed)
        q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
        graph.replay()
        torch.cuda.synchronize()
        want_out, want_lse = flashcore.attention(new_q, new_k, new_v, causal=True, return_lse=True)
        torch.testing.assert_close(out, want_out, atol=0, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)


def test_runs_on_a_side_stream(caps, cuda):
    _need(caps, torch.float16, 64)
    q, k, v = _inputs(cuda, torch.float16, 2, 64, 64, 4, 4, 64)
    want = flashcore.attention(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = flashcore.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_inference_mode(caps, cuda):
    _need(caps, torch.float16, 64)
    q, k, v = _inputs(cuda, torch.float16, 2, 64, 64, 4, 2, 64)
    with torch.inference_mode():
        out = flashcore.attention(q, k, v, causal=True)
    check_against_sdpa(q, k, v, True, out=out)


# ---------------------------------------------------------------------------------------------------------------
# Errors on CUDA tensors.


def test_unsupported_head_dim(caps, cuda):
    head_dim = next(d for d in (72, 96, 32, 40, 80, 160) if d not in caps.head_dims)
    q, k, v = _inputs(cuda, torch.float16, 1, 8, 8, 2, 2, head_dim)
    with pytest.raises(ValueError, match="head_dim"):
        flashcore.attention(q, k, v)


def test_dtype_errors_on_cuda(cuda):
    q, k, v = _inputs(cuda, torch.float16, 1, 8, 8, 2, 2, 64)
    with pytest.raises(TypeError):
        flashcore.attention(q.float(), k.float(), v.float())
    with pytest.raises(TypeError):
        flashcore.attention(q, k.bfloat16(), v)


def test_mixed_devices(cuda):
    q, k, v = _inputs(cuda, torch.float16, 1, 8, 8, 2, 2, 64)
    with pytest.raises(ValueError, match="CUDA tensor"):
        flashcore.attention(q, k.cpu(), v)
    if torch.cuda.device_count() < 2:
        return
    other = torch.device("cuda", (cuda.index + 1) % torch.cuda.device_count())
    with pytest.raises(ValueError, match="same device"):
        flashcore.attention(q, k.to(other), v)


def test_missing_library_raises_runtime_error(cuda, use_library, tmp_path):
    q, k, v = _inputs(cuda, torch.float16, 1, 8, 8, 2, 2, 64)
    use_library(tmp_path / "libflashcore.so")
    with pytest.raises(RuntimeError, match="could not be loaded"):
        flashcore.attention(q, k, v)
    assert _lib.LIBRARY_ENV in _lib.candidates()[0][0]


@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() > 1), reason="needs two CUDA GPUs"
)
def test_second_device(caps):
    _need(caps, torch.float16, 64)
    device = torch.device("cuda", 1)
    check_against_sdpa(*_inputs(device, torch.float16, 2, 64, 64, 4, 4, 64), True)


@pytest.mark.parametrize("shape,causal", [((2, 1, 4096, 16, 4, 128), False), ((2, 300, 1000, 8, 2, 64), True)])
def test_plan_run_matches_attention_and_replays_in_a_graph(cuda, caps, shape, causal):
    """flashcore.plan_attention: decided once, run with new tensors, captured in a CUDA graph; bit-identical to
    flashcore.attention on the same tensors."""
    batch, sq, sk, hq, hkv, d = shape
    _need(caps, torch.bfloat16, d)
    q, k, v = _inputs(cuda, torch.bfloat16, batch, sq, sk, hq, hkv, d, seed=3)
    plan = flashcore.plan_attention(q, k, v, causal=causal, return_lse=True)
    assert plan.config
    want, want_lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    out, lse = plan.run(q, k, v)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    check_against_sdpa(q, k, v, causal, out=out, lse=lse)
    # New inputs of the same shapes through the same plan, inside a CUDA graph with preallocated outputs.
    q2, k2, v2 = _inputs(cuda, torch.bfloat16, batch, sq, sk, hq, hkv, d, seed=4)
    out2 = torch.full_like(out, float("nan"))
    lse2 = torch.full_like(lse, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q2, k2, v2, out=out2, lse=lse2)
    graph.replay()
    torch.cuda.synchronize()
    want2, want2_lse = flashcore.attention(q2, k2, v2, causal=causal, return_lse=True)
    assert torch.equal(out2, want2) and torch.equal(lse2, want2_lse)
    with pytest.raises(ValueError, match="make another plan"):
        plan.run(q2[:, :1] if sq > 1 else q2.repeat(1, 2, 1, 1), k2, v2)

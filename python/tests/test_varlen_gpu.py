"""flashcore.varlen_attention on the GPU: packed variable-length batches against a float64 reference computed per
sequence (ref_sequence in test_varlen_cpu.py), FlashAttention-3's conventions (shapes, and its numbers when the FA3
serving build is importable), seqused_k with NaN in the unused keys, strided inputs, torch.compile and CUDA graphs
replayed with new cu_seqlens.

Error rule, as in test_attention_gpu.py: err(flashcore) <= 2 * err(SDPA at the same dtype) + atol, both against the
float64 reference, per sequence. Needs torch, a CUDA GPU and libflashcore.so with the sm90 serving kernels."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from reference import reference  # noqa: E402
from test_attention_gpu import ATOL, caps, _need  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_varlen_cpu import cu_seqlens, ref_sequence  # noqa: E402

LSE_ATOL, LSE_RTOL = 2e-3, 1e-3


def _packed(device, dtype, lens_q, lens_k, heads_q, heads_kv, head_dim, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(sum(lens_q), heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(sum(lens_k), heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(sum(lens_k), heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    return q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)


def check_varlen(q, k, v, lens_q, lens_k, causal, out, lse=None, softmax_scale=None, used_k=None):
    """Every sequence of a packed batch against the float64 reference (and SDPA at q's dtype for the bound); out
    (total_q, Hq, v's head dim)."""
    assert out.shape == q.shape[:2] + v.shape[2:] and out.dtype == q.dtype
    sq = sk = 0
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        used = nk if used_k is None else max(0, min(nk, used_k[b]))
        qb, kb, vb = q[sq:sq + nq], k[sk:sk + used], v[sk:sk + used]
        ob = out[sq:sq + nq]
        ref_out, ref_lse = ref_sequence(qb, kb, vb, causal, softmax_scale)
        assert torch.isfinite(ob).all(), f"sequence {b} (q {nq}, k {used}): non-finite output"
        if nq and used:
            base_out, _ = reference(qb[None], kb[None], vb[None], causal, softmax_scale, upcast=False)
            base = (base_out[0].double() - ref_out).abs().max().item()
            err = (ob.double() - ref_out).abs().max().item()
            assert err <= 2 * base + ATOL[q.dtype], (
                f"sequence {b} (q {nq}, k {used}): error {err:.3g} vs SDPA {base:.3g}")
        elif nq:
            assert (ob == 0).all(), f"sequence {b} has no key: output must be 0"
        if lse is not None and nq:
            lb = lse[:, sq:sq + nq]
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lb), finite) and (lb[~finite] == -math.inf).all()
            torch.testing.assert_close(lb[finite].double(), ref_lse[finite], atol=LSE_ATOL, rtol=LSE_RTOL)
        sq, sk = sq + nq, sk + nk


SELF_LENGTHS = [17, 0, 1, 128, 255, 1000, 3, 64]  # prefill: Sq == Sk per sequence
CROSS_LENGTHS = ([1, 0, 5, 100, 64, 300, 7], [7, 3, 0, 300, 64, 100, 7])  # chunked prefill, Sq > Sk included
HEADS = [(4, 4), (8, 2), (8, 1)]


@pytest.mark.parametrize("heads", HEADS, ids=[f"hq{a}-hkv{b}" for a, b in HEADS])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("lengths", ["self", "cross"])
def test_matches_reference(caps, cuda, lengths, dtype, head_dim, causal, heads):
    _need(caps, dtype, head_dim)
    lens_q, lens_k = (SELF_LENGTHS, SELF_LENGTHS) if lengths == "self" else CROSS_LENGTHS
    q, k, v, cq, ck = _packed(cuda, dtype, lens_q, lens_k, *heads, head_dim)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal,
                                          return_lse=True)
    check_varlen(q, k, v, lens_q, lens_k, causal, out, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_and_odd_lengths(caps, cuda, causal):
    _need(caps, torch.bfloat16, 128)
    lens = [4097, 1, 333, 2049, 0, 77]
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, lens, lens, 16, 4, 128, seed=1)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, max(lens), max(lens), causal=causal, return_lse=True)
    check_varlen(q, k, v, lens, lens, causal, out, lse)


def test_softmax_scale(caps, cuda):
    _need(caps, torch.bfloat16, 64)
    lens = [5, 40, 1]
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, lens, lens, 4, 2, 64, seed=2)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 40, 40, softmax_scale=0.3, causal=True, return_lse=True)
    check_varlen(q, k, v, lens, lens, True, out, lse, softmax_scale=0.3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqused_k_and_nan_in_unused_keys(caps, cuda, causal):
    _need(caps, torch.bfloat16, 128)
    lens_q, lens_k, used = [3, 1, 50, 8], [40, 10, 200, 8], [17, 0, 200, 3]
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, lens_q, lens_k, 8, 2, 128, seed=3)
    start = 0
    for nk, u in zip(lens_k, used):  # the keys past seqused_k: poison
        k[start + u:start + nk] = float("nan")
        v[start + u:start + nk] = float("nan")
        start += nk
    seqused = torch.tensor(used, dtype=torch.int32, device=cuda)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal,
                                          seqused_k=seqused, return_lse=True)
    check_varlen(q, k, v, lens_q, lens_k, causal, out, lse, used_k=used)


def test_fa3_conventions(caps, cuda):
    """Shapes and types as FlashAttention-3's flash_attn_varlen_func (out (total_q, Hq, D); softmax_lse
    (Hq, total_q) float32 with return_attn_probs=True); with the FA3 serving build importable
    (flash_attn_interface), its numbers on the same tensors too."""
    _need(caps, torch.bfloat16, 128)
    lens_q, lens_k = [100, 1, 37, 512], [100, 9, 37, 700]
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, lens_q, lens_k, 16, 4, 128, seed=4)
    out = flashcore.varlen_attention(q, k, v, cq, ck, 512, 700, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == (sum(lens_q), 16, 128) and out.dtype == torch.bfloat16
    out2, lse = flashcore.varlen_attention(q, k, v, cq, ck, 512, 700, causal=True, return_lse=True)
    assert torch.equal(out, out2)
    assert lse.shape == (16, sum(lens_q)) and lse.dtype == torch.float32 and lse.is_contiguous()
    try:
        from flash_attn_interface import flash_attn_varlen_func
    except ImportError:
        return  # shapes only; the FA3 comparison needs the serving build on PYTHONPATH
    try:
        fa_out, fa_lse = flash_attn_varlen_func(q, k, v, cq, ck, 512, 700, causal=True, return_attn_probs=True)
    except RuntimeError as e:  # the prefill build of FA3 (shared/fa3/prefill) has no varlen kernels
        if "does not support varlen" in str(e):
            pytest.skip(f"the FA3 build on PYTHONPATH has no varlen: {e}")
        raise
    assert fa_out.shape == out.shape and fa_lse.shape == lse.shape
    torch.testing.assert_close(out, fa_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, fa_lse, atol=LSE_ATOL, rtol=LSE_RTOL)


def test_matches_dense_attention(caps, cuda):
    """Equal lengths: the packed batch and flashcore.attention on the (B, S, H, D) view agree closely."""
    _need(caps, torch.bfloat16, 128)
    batch, seqlen = 3, 300
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, [seqlen] * batch, [seqlen] * batch, 8, 2, 128, seed=5)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, seqlen, seqlen, causal=True, return_lse=True)
    dense, dense_lse = flashcore.attention(*(t.view(batch, seqlen, *t.shape[1:]) for t in (q, k, v)), causal=True,
                                           return_lse=True)
    torch.testing.assert_close(out.view_as(dense), dense, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.view(8, batch, seqlen).transpose(0, 1), dense_lse, atol=1e-4, rtol=1e-4)


def test_strided_inputs(caps, cuda):
    """q, k, v as head slices of one packed qkv tensor (no copies) and a misaligned view (copied)."""
    _need(caps, torch.float16, 64)
    lens = [31, 200, 1]
    total = sum(lens)
    gen = torch.Generator(device=cuda).manual_seed(6)
    qkv = torch.randn(total, 8 + 2 + 2, 64, device=cuda, dtype=torch.float16, generator=gen)
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    cq = cu_seqlens(lens, cuda)
    out, lse = flashcore.varlen_attention(q, k, v, cq, cq, 200, 200, causal=True, return_lse=True)
    check_varlen(q, k, v, lens, lens, True, out, lse)
    flat = torch.randn(total * 8 * 64 + 1, device=cuda, dtype=torch.float16, generator=gen)
    q_odd = flat[1:].view(total, 8, 64)  # 2-byte offset: the op copies it
    out2 = flashcore.varlen_attention(q_odd, k, v, cq, cq, 200, 200)
    # The reference gets an aligned copy: PyTorch's own SDPA kernels fault on the misaligned view.
    check_varlen(q_odd.clone(), k, v, lens, lens, False, out2)


def test_empty_and_degenerate(caps, cuda):
    _need(caps, torch.bfloat16, 64)
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, [0, 0], [5, 3], 4, 4, 64)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 0, 5, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, [3, 2], [0, 0], 4, 4, 64)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 3, 0, return_lse=True)
    assert (out == 0).all() and (lse == -math.inf).all()
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, [1], [1], 4, 4, 64)  # batch 1, one token
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, 1, 1, causal=True, return_lse=True)
    check_varlen(q, k, v, [1], [1], True, out, lse)


def test_compile_and_cuda_graph(caps, cuda):
    """torch.compile(fullgraph) equals eager; a captured graph replayed with new cu_seqlens / seqused_k contents
    (same totals) equals an eager call on them: the lengths are read on the device."""
    _need(caps, torch.bfloat16, 128)
    lens_a, lens_b = [100, 28, 900], [512, 511, 5]
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, lens_a, lens_a, 32, 8, 128, seed=7)
    used = torch.tensor(lens_a, dtype=torch.int32, device=cuda)

    def fn(q, k, v, cq, ck, used):
        return flashcore.varlen_attention(q, k, v, cq, ck, 1024, 1024, causal=True, seqused_k=used, return_lse=True)

    eager = fn(q, k, v, cq, ck, used)
    compiled = torch.compile(fn, fullgraph=True)(q, k, v, cq, ck, used)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    fn(q, k, v, cq, ck, used)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_out, captured_lse = fn(q, k, v, cq, ck, used)
    cq.copy_(cu_seqlens(lens_b, cuda))
    ck.copy_(cu_seqlens(lens_b, cuda))
    used.copy_(torch.tensor([512, 300, 5], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expected_out, expected_lse = fn(q, k, v, cq, ck, used)
    assert torch.equal(captured_out, expected_out) and torch.equal(captured_lse, expected_lse)
    check_varlen(q, k, v, lens_b, lens_b, True, captured_out, captured_lse, used_k=[512, 300, 5])


def test_errors_on_the_device(caps, cuda):
    q, k, v, cq, ck = _packed(cuda, torch.bfloat16, [4, 4], [4, 4], 4, 4, 64)
    with pytest.raises(ValueError, match="cu_seqlens_q is on cpu"):
        flashcore.varlen_attention(q, k, v, cq.cpu(), ck, 4, 4)
    with pytest.raises(ValueError, match="cu_seqlens_k must be an int32"):
        flashcore.varlen_attention(q, k, v, cq, ck.long(), 4, 4)
    with pytest.raises(TypeError, match="max_seqlen_q must be a Python int"):
        flashcore.varlen_attention(q, k, v, cq, ck, torch.tensor(4, device=cuda), 4)

"""flashcore.attention_with_kvcache with a paged KV cache (block_table) on the GPU: page sizes 16/64/256 against a
float64 reference per sequence, NaN in the spare pages, in the rows past cache_seqlens and behind the block-table
entries a sequence does not need (which also point out of range); the paged and dense results agree; appends
through the block table; num_splits; torch.compile and a CUDA graph replayed with new lengths and new block-table
contents.

Error rule, as in test_attention_gpu.py: err(flashcore) <= 2 * err(SDPA at the same dtype) + atol, both against
the float64 reference. Needs torch, a CUDA GPU and libflashcore.so with the sm90 serving kernels."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from reference import reference  # noqa: E402
from test_attention_gpu import ATOL, caps, _need  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_paged_cpu import paginate  # noqa: E402
from test_varlen_cpu import ref_sequence  # noqa: E402

LSE_ATOL, LSE_RTOL = 2e-3, 1e-3


def _cache(device, dtype, batch, capacity, heads_q, heads_kv, head_dim, seqlen_q, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, capacity, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, capacity, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    return q, k, v


def check_cache(q, k, v, lengths, causal, out, lse=None, softmax_scale=None):
    """out (B, Sq, Hq, Dv) against the dense caches k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) cut to each sequence's
    length."""
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "NaN from an unused page, row or block-table entry reached the output"
    for b, n in enumerate(lengths):
        qb, kb, vb = q[b], k[b, :n], v[b, :n]
        ref_out, ref_lse = ref_sequence(qb, kb, vb, causal, softmax_scale)
        if n:
            base_out, _ = reference(qb[None], kb[None], vb[None], causal, softmax_scale, upcast=False)
            base = (base_out[0].double() - ref_out).abs().max().item()
            err = (out[b].double() - ref_out).abs().max().item()
            assert err <= 2 * base + ATOL[q.dtype], f"sequence {b} (length {n}): error {err:.3g} vs SDPA {base:.3g}"
        else:
            assert (out[b] == 0).all()
        if lse is not None:
            finite = torch.isfinite(ref_lse)
            assert torch.equal(torch.isfinite(lse[b]), finite) and (lse[b][~finite] == -math.inf).all()
            torch.testing.assert_close(lse[b][finite].double(), ref_lse[finite], atol=LSE_ATOL, rtol=LSE_RTOL)


def _poison_dense(k, v, lengths):
    for b, n in enumerate(lengths):
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")


@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_matches_reference(caps, cuda, dtype, head_dim, causal, page_size, seqlen_q):
    _need(caps, dtype, head_dim)
    lengths = [0, 1, 17, 700, 1024, 255] if seqlen_q == 1 else [5, 2, 333, 1024]
    q, k, v = _cache(cuda, dtype, len(lengths), 1024, 16, 4, head_dim, seqlen_q)
    _poison_dense(k, v, lengths)
    kp, vp, table = paginate(k, v, lengths, page_size)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out, lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, causal=causal,
                                                block_table=table, return_softmax_lse=True)
    check_cache(q, k, v, lengths, causal, out, lse)


@pytest.mark.parametrize("heads", [(8, 8), (32, 8), (8, 1)], ids=["mha", "gqa4", "mqa"])
@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_matches_dense(caps, cuda, heads, page_size):
    _need(caps, torch.bfloat16, 128)
    lengths = [1, 4000, 63, 64, 65, 2048]
    q, k, v = _cache(cuda, torch.bfloat16, len(lengths), 4096, *heads, 128, 1, seed=1)
    _poison_dense(k, v, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    dense, dense_lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, return_softmax_lse=True)
    kp, vp, table = paginate(k, v, lengths, page_size, seed=2)
    paged, paged_lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table,
                                                        return_softmax_lse=True)
    check_cache(q, k, v, lengths, False, paged, paged_lse)
    torch.testing.assert_close(paged, dense, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(paged_lse, dense_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("num_splits", [0, 1, 3, 16])
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged64"])
def test_num_splits(caps, cuda, num_splits, paged):
    _need(caps, torch.bfloat16, 128)
    lengths = [8192, 100, 5000, 0]
    q, k, v = _cache(cuda, torch.bfloat16, len(lengths), 8192, 32, 8, 128, 1, seed=3)
    _poison_dense(k, v, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    if paged:
        kc, vc, table = paginate(k, v, lengths, 64, seed=4)
    else:
        kc, vc, table = k, v, None
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                                num_splits=num_splits, return_softmax_lse=True)
    check_cache(q, k, v, lengths, True, out, lse)


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_append_with_paging(caps, cuda, page_size):
    """k, v appended through the block table at cache_seqlens[b] (crossing page boundaries), then attended to."""
    _need(caps, torch.bfloat16, 128)
    lengths, n = [0, page_size - 2, 300, 3 * page_size - 1], 4
    capacity = 4 * page_size + 512
    q, k, v = _cache(cuda, torch.bfloat16, len(lengths), capacity, 8, 2, 128, n, seed=5)
    _poison_dense(k, v, lengths)
    kp, vp, table = paginate(k, v, lengths, page_size, garbage_entries=False)
    gen = torch.Generator(device=cuda).manual_seed(6)
    k_new = torch.randn(len(lengths), n, 2, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    v_new = torch.randn(len(lengths), n, 2, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    kp_before = kp.clone()
    out, lse = flashcore.attention_with_kvcache(q, kp, vp, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                block_table=table, causal=True, return_softmax_lse=True)
    assert seqlens.tolist() == lengths
    written = torch.zeros(kp.shape[:2], dtype=torch.bool, device=cuda)
    for b, start in enumerate(lengths):
        for i in range(n):
            page, row = int(table[b, (start + i) // page_size]), (start + i) % page_size
            assert torch.equal(kp[page, row], k_new[b, i]) and torch.equal(vp[page, row], v_new[b, i])
            written[page, row] = True
            k[b, start + i], v[b, start + i] = k_new[b, i], v_new[b, i]
    assert torch.equal(kp[~written].nan_to_num(7.0), kp_before[~written].nan_to_num(7.0))
    check_cache(q, k, v, [m + n for m in lengths], True, out, lse)


def test_strided_block_table(caps, cuda):
    """A column slice of a wider block table (row stride > its width) goes through without a copy."""
    _need(caps, torch.bfloat16, 64)
    lengths = [100, 255]
    q, k, v = _cache(cuda, torch.bfloat16, 2, 256, 4, 4, 64, 1, seed=7)
    _poison_dense(k, v, lengths)
    kp, vp, table = paginate(k, v, lengths, 64)
    wide = torch.full((2, 9), -1, dtype=torch.int32, device=cuda)
    wide[:, :4] = table
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=wide[:, :4])
    check_cache(q, k, v, lengths, False, out)


def test_compile_and_cuda_graph(caps, cuda):
    """torch.compile(fullgraph) equals eager; a captured decode step replayed with new cache_seqlens and new
    block-table contents equals an eager call on them (both are read on the device)."""
    _need(caps, torch.bfloat16, 128)
    page_size, lengths = 64, [100, 2000, 64]
    q, k, v = _cache(cuda, torch.bfloat16, 3, 2048, 32, 8, 128, 1, seed=8)
    _poison_dense(k, v, lengths)
    kp, vp, table = paginate(k, v, lengths, page_size, seed=9)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)

    def fn(q, kp, vp, seqlens, table):
        return flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=True)

    eager = fn(q, kp, vp, seqlens, table)
    check_cache(q, k, v, lengths, True, eager)
    assert torch.equal(torch.compile(fn, fullgraph=True)(q, kp, vp, seqlens, table), eager)
    fn(q, kp, vp, seqlens, table)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(q, kp, vp, seqlens, table)
    # New contents: other lengths, and the sequences' pages swapped (sequence 0 now owns sequence 1's pages).
    new_lengths = [2000, 100, 0]
    k2, v2 = k.clone(), v.clone()
    k2[0], k2[1], v2[0], v2[1] = k[1], k[0], v[1], v[0]
    _poison_dense(k2, v2, new_lengths)
    kp2, vp2, table2 = paginate(k2, v2, new_lengths, page_size, seed=10)
    kp.copy_(kp2)
    vp.copy_(vp2)
    table.copy_(table2)
    seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, fn(q, kp, vp, seqlens, table))
    check_cache(q, k2, v2, new_lengths, True, captured)


def test_compile_with_append(caps, cuda):
    _need(caps, torch.bfloat16, 128)
    lengths = [10, 70]
    q, k, v = _cache(cuda, torch.bfloat16, 2, 256, 8, 2, 128, 2, seed=11)
    kp, vp, table = paginate(k, v, lengths, 64, garbage_entries=False)
    k_new = torch.randn(2, 2, 2, 128, device=cuda, dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)

    def fn(q, kp, vp, k_new, v_new, seqlens, table):
        return flashcore.attention_with_kvcache(q, kp, vp, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                block_table=table, causal=True)

    kp2, vp2 = kp.clone(), vp.clone()
    eager = fn(q, kp, vp, k_new, v_new, seqlens, table)
    compiled = torch.compile(fn, fullgraph=True)(q, kp2, vp2, k_new, v_new, seqlens, table)
    assert torch.equal(compiled, eager)
    assert torch.equal(kp2.nan_to_num(7.0), kp.nan_to_num(7.0)) and torch.equal(vp2.nan_to_num(7.0),
                                                                                vp.nan_to_num(7.0))


def test_errors_on_the_device(caps, cuda):
    q, k, v = _cache(cuda, torch.bfloat16, 2, 64, 4, 4, 64, 1)
    kp, vp, table = paginate(k, v, [64, 64], 16)
    seqlens = torch.tensor([64, 64], dtype=torch.int32, device=cuda)
    with pytest.raises(ValueError, match="block_table is on cpu"):
        flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table.cpu())
    with pytest.raises(ValueError, match="block_table must be an int32"):
        flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table.long())
    with pytest.raises(ValueError, match="page_size must be from 1 to 65536"):
        flashcore.attention_with_kvcache(q, kp[:, :0], vp[:, :0], cache_seqlens=seqlens, block_table=table)

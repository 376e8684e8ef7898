"""flashcore.attention_with_kvcache on the GPU: per-sequence cache lengths, NaN in the unused cache rows, appends
in place, torch.compile and CUDA graphs. Same error rule as test_attention_gpu.py: err <= 2 * err(SDPA at the same
dtype) + atol against fp32 math on upcast inputs, each sequence cut to its length."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from reference import reference  # noqa: E402
from test_attention_gpu import ATOL, caps, _need  # noqa: E402,F401  (fixtures; cuda: conftest.py)


def _cache(device, dtype, batch, capacity, heads_q, heads_kv, head_dim, seqlen_q, lengths, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, capacity, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, capacity, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    for b, n in enumerate(lengths):  # the unused slots of a cache: poison
        k[b, n:] = float("nan")
        v[b, n:] = float("nan")
    return q, k, v


def _check(q, k, v, lengths, causal, out, lse):
    assert torch.isfinite(out).all(), "NaN from the unused cache rows reached the output"
    for b, n in enumerate(lengths):
        qb, kb, vb = q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n]
        if n == 0:
            assert (out[b] == 0).all() and (lse[b] == float("-inf")).all()
            continue
        ref_out, ref_lse = reference(qb, kb, vb, causal, None)
        base_out, _ = reference(qb, kb, vb, causal, None, upcast=False)
        err = (out[b:b + 1].float() - ref_out).abs().max().item()
        base = (base_out.float() - ref_out).abs().max().item()
        assert err <= 2 * base + ATOL[q.dtype], f"sequence {b} (length {n}): error {err:.3g} vs SDPA {base:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 5, 80])
def test_lengths_and_nan_padding(caps, cuda, dtype, head_dim, causal, seqlen_q):
    _need(caps, dtype, head_dim)
    lengths = [0, 1, 700, 2048] if seqlen_q == 1 else [seqlen_q, 333, 2048]
    q, k, v = _cache(cuda, dtype, len(lengths), 2048, 16, 4, head_dim, seqlen_q, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal,
                                                return_softmax_lse=True)
    _check(q, k, v, lengths, causal, out, lse)


def test_append_in_place(caps, cuda):
    _need(caps, torch.bfloat16, 128)
    lengths = [10, 0, 500]
    q, k_cache, v_cache = _cache(cuda, torch.bfloat16, 3, 1024, 8, 2, 128, 3, lengths, seed=3)
    k_new = torch.randn(3, 3, 2, 128, device=cuda, dtype=torch.bfloat16)
    v_new = torch.randn_like(k_new)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out = flashcore.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=seqlens,
                                           causal=True)
    for b, n in enumerate(lengths):
        assert torch.equal(k_cache[b, n:n + 3], k_new[b]) and torch.equal(v_cache[b, n:n + 3], v_new[b])
    assert seqlens.tolist() == lengths  # the caller's lengths are not advanced in place
    lse = torch.zeros(3, 8, 3, device=cuda)
    _check(q, k_cache, v_cache, [n + 3 for n in lengths], True, out, lse)


def test_cuda_graph_and_compile(caps, cuda):
    _need(caps, torch.bfloat16, 128)
    lengths = [100, 2000]
    q, k, v = _cache(cuda, torch.bfloat16, 2, 2048, 32, 8, 128, 1, lengths, seed=5)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    eager = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    compiled = torch.compile(lambda a, b, c, d: flashcore.attention_with_kvcache(a, b, c, cache_seqlens=d),
                             fullgraph=True)
    assert torch.equal(compiled(q, k, v, seqlens), eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    seqlens.copy_(torch.tensor([2000, 100], dtype=torch.int32))  # new lengths, same graph: read on the device
    k[0, 100:2000] = torch.randn_like(k[0, 100:2000])
    v[0, 100:2000] = torch.randn_like(v[0, 100:2000])
    k[1, 100:] = float("nan")
    v[1, 100:] = float("nan")
    graph.replay()
    torch.cuda.synchronize()
    expected = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    assert torch.equal(captured, expected)
    assert torch.isfinite(captured).all()


def _split_decode(cuda, seed):
    """A decode call that the library splits (1 x 8k cache, 32/8 heads, d128: 16 parts merged through the workspace's
    counters): q, k, v and the cache lengths."""
    q, k, v = _cache(cuda, torch.bfloat16, 1, 8192, 32, 8, 128, 1, [8192], seed=seed)
    return q, k, v, torch.tensor([8192], dtype=torch.int32, device=cuda)


def test_cuda_graph_split_decode_with_dirty_scratch(caps, cuda):
    """A decode call that splits its keys (partials and merge counters in the workspace) inside a CUDA graph: the op
    zeroes only the workspace's first 256 bytes there (flashcore.h: the rest is scratch). The capture first fills and
    frees a block larger than the workspace with 0xFF, so that the op's workspace can come from that block of the
    graph's pool. Replays must match the eager call bit for bit."""
    _need(caps, torch.bfloat16, 128)
    q, k, v, seqlens = _split_decode(cuda, seed=7)
    eager = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dirty = torch.full((8 << 20,), 255, dtype=torch.uint8, device=cuda)
        del dirty
        captured = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens)
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
    lse = torch.zeros(1, 32, 1, device=cuda)
    _check(q, k, v, seqlens.tolist(), False, captured, lse)


def test_cuda_graphs_keep_one_workspace_each_and_replay_concurrently(caps, cuda):
    """The op shares one workspace among the calls of a capture on a stream (flashcore_stream_capture_id) and gives
    each capture its own: two graphs of four split decode calls each (fused-merge counters in the workspace header),
    replayed at the same time on two streams, must each match their eager calls bit for bit."""
    _need(caps, torch.bfloat16, 128)
    qa, k, v, seqlens = _split_decode(cuda, seed=11)
    qb = torch.randn_like(qa)
    eager = [flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens) for q in (qa, qb)]
    graphs, outs = [], []
    for q in (qa, qb):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append([flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens) for _ in range(4)])
        graphs.append(graph)
    lib = flashcore._lib.load()
    if "flashcore_stream_capture_id" in lib._optional:
        ws = [o[0] for o in flashcore._ops._CAPTURE_WORKSPACES.values()]
        assert ws and all(w != 0 for w in ws), "the captures' workspaces are kept by capture id"
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(5):
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        for expected, captured in zip(eager, outs):
            for o in captured:
                assert torch.equal(o, expected)


def test_cache_seqlens_errors(caps, cuda):
    q, k, v = _cache(cuda, torch.bfloat16, 2, 64, 4, 4, 64, 1, [64, 64])
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=torch.tensor([1, 2], device=cuda))  # int64
    with pytest.raises(ValueError, match="cache_seqlens"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=torch.tensor([1], dtype=torch.int32, device=cuda))

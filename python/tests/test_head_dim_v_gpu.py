"""v with a head dim of its own on the GPU (the C ABI's head_dim_v, since 0.7): (head_dim, head_dim_v) = (192, 128),
DeepSeek-V2/V3 MLA prefill's (FlashAttention-3's hdimdiff), beside (192, 192), through flashcore.attention and sdpa
(causal or not, MHA and GQA, lengths 1, 17, 113, Sq != Sk), varlen_attention, attention_with_kvcache (dense and paged
caches, NaN past the lengths, k / v appended in place), the variants, plans, torch.compile and CUDA graphs, ring
attention (the single-GPU simulation); the backward, the library's decision (0.9's sm90 backend takes the pair;
elsewhere its error, naming head_dim_v; the gradients' accuracy: test_backward_gpu.py); and the refusals: the 8-bit
paths, a pair that is not compiled.

Error rule, as in test_attention_gpu.py: err(flashcore) <= 2 * err(SDPA at the same dtype) + atol, both against the
float64 reference (reference.reference_fp64; per sequence for packed and cached batches, test_varlen_gpu.check_varlen
and test_paged_gpu.check_cache; for the variants test_variants_gpu's baseline, as there). LSE within 2e-3 absolute /
1e-3 relative. Needs torch, a CUDA GPU and a libflashcore.so of 0.7 or newer that compiles the pair; skips otherwise,
naming the reason."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import reference, reference_fp64  # noqa: E402
from test_attention_gpu import ATOL, _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_paged_cpu import paginate  # noqa: E402
from test_paged_gpu import _poison_dense, check_cache  # noqa: E402
from test_varlen_cpu import cu_seqlens  # noqa: E402
from test_varlen_gpu import check_varlen  # noqa: E402
from test_variants_gpu import check as check_variants  # noqa: E402

LSE_ATOL, LSE_RTOL = 2e-3, 1e-3
MLA = (192, 128)
PAIRS = [MLA, (192, 192)]
PAIR_IDS = ["d192-dv128", "d192-dv192"]
DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp16", "bf16"]


def _need_pair(caps, dtype, head_dim, head_dim_v):
    """Skip unless the library compiles dtype and the (head_dim, head_dim_v) pair (a plain head dim when equal)."""
    if head_dim_v == head_dim:
        _need(caps, dtype, head_dim)
        return
    if str(dtype).replace("torch.", "") not in caps.dtypes:
        pytest.skip(f"{dtype} not compiled in ({caps.dtypes})")
    if (head_dim, head_dim_v) not in caps.head_dim_pairs:
        pytest.skip(f"(head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) not compiled in (pairs: "
                    f"{list(caps.head_dim_pairs)}; a 0.7 library or newer reports them, {flashcore.library_version()} "
                    f"is loaded)")


def _inputs(device, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=device, dtype=dtype, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device=device, dtype=dtype, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim_v, device=device, dtype=dtype, generator=gen)
    return q, k, v


def check_dense(q, k, v, causal, out, lse=None, softmax_scale=None):
    """out (B, Sq, Hq, Dv) and lse (B, Hq, Sq) against the float64 reference, with the error rule above."""
    assert out.shape == q.shape[:3] + v.shape[3:] and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "non-finite output"
    ref_out, ref_lse = reference_fp64(q, k, v, causal, softmax_scale)
    base_out, _ = reference(q, k, v, causal, softmax_scale, upcast=False)
    err = (out.double() - ref_out).abs().max().item()
    base = (base_out.double() - ref_out).abs().max().item()
    assert err <= 2 * base + ATOL[q.dtype], f"flashcore error {err:.3g} vs SDPA {q.dtype} error {base:.3g}"
    if lse is not None:
        assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite) and (lse[~finite] == -math.inf).all()
        torch.testing.assert_close(lse[finite].double(), ref_lse[finite], atol=LSE_ATOL, rtol=LSE_RTOL)


# ---------------------------------------------------------------------------------------------------------------
# Dense: flashcore.attention and sdpa.

SEQLENS = [(1, 1), (17, 17), (113, 113), (1, 113), (17, 113), (113, 17), (113, 203)]
HEADS = [(8, 8), (8, 2)]


@pytest.mark.parametrize("seqlens", SEQLENS, ids=[f"sq{a}-sk{b}" for a, b in SEQLENS])
@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa4"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dense_matches_reference(caps, cuda, dtype, pair, causal, heads, seqlens):
    _need_pair(caps, dtype, *pair)
    q, k, v = _inputs(cuda, dtype, 2, *seqlens, *heads, *pair)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    check_dense(q, k, v, causal, out, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_dense_longer_and_scaled(caps, cuda, causal):
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 1023, 1024, 16, 2, *MLA, seed=1)
    out, lse = flashcore.attention(q, k, v, causal=causal, return_lse=True)
    check_dense(q, k, v, causal, out, lse)
    out, lse = flashcore.attention(q, k, v, causal=causal, softmax_scale=0.05, return_lse=True)
    check_dense(q, k, v, causal, out, lse, softmax_scale=0.05)


def test_rows_without_keys_are_zero(caps, cuda):
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 40, 16, 4, 4, *MLA)
    out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :24] == 0) and torch.all(lse[:, :, :24] == -math.inf)
    check_dense(q, k, v, True, out, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_front_end(caps, cuda, causal):
    """As torch's scaled_dot_product_attention: value (B, H, S, Ev) gives (B, H, L, Ev)."""
    _need_pair(caps, torch.float16, *MLA)
    q, k, v = _inputs(cuda, torch.float16, 2, 113, 113, 8, 2, *MLA, seed=2)
    qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # genuine (B, H, S, D) tensors
    out = flashcore.sdpa(qb, kb, vb, is_causal=causal, enable_gqa=True)
    assert out.shape == (2, 8, 113, MLA[1])
    check_dense(q, k, v, causal, out.transpose(1, 2))


def test_strided_v_passes_through(caps, cuda):
    """k and v as slices of one (B, S, Hkv, D + Dv) tensor (MLA's decompressed kv): passed as they are, no copy."""
    _need_pair(caps, torch.bfloat16, *MLA)
    q = _inputs(cuda, torch.bfloat16, 2, 77, 77, 8, 2, *MLA, seed=3)[0]
    kv = torch.randn(2, 77, 2, sum(MLA), device=cuda, dtype=torch.bfloat16)
    k, v = kv[..., :MLA[0]], kv[..., MLA[0]:]
    assert not _ops.kernel_operand(k)[2] and not _ops.kernel_operand(v)[2]
    out = flashcore.attention(q, k, v, causal=True)
    assert torch.equal(out, flashcore.attention(q, k.contiguous(), v.contiguous(), causal=True))
    check_dense(q, k, v, True, out)


WINDOW_CASES = [dict(causal=True, window_size=(63, 0)), dict(causal=False, window_size=(40, 10), softcap=30.0),
                dict(causal=True, sinks=True)]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=["window", "window-softcap", "sinks"])
def test_variants(caps, cuda, case):
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 113, 203, 8, 2, *MLA, seed=4)
    kwargs = dict(case)
    if kwargs.pop("sinks", False):
        kwargs["sinks"] = torch.randn(8, device=cuda, generator=torch.Generator(device=cuda).manual_seed(5)) * 2
    out, lse = flashcore.attention(q, k, v, return_lse=True, **kwargs)
    check_variants(q, k, v, out, lse, **kwargs)


# ---------------------------------------------------------------------------------------------------------------
# Packed (varlen) and cached (KV cache, dense and paged) batches.

SELF_LENGTHS = [17, 0, 1, 128, 113, 300]
CROSS_LENGTHS = ([1, 0, 5, 100, 17, 113], [7, 3, 0, 300, 17, 1])


@pytest.mark.parametrize("lengths", ["self", "cross"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_varlen_matches_reference(caps, cuda, dtype, pair, causal, lengths):
    _need_pair(caps, dtype, *pair)
    lens_q, lens_k = (SELF_LENGTHS, SELF_LENGTHS) if lengths == "self" else CROSS_LENGTHS
    gen = torch.Generator(device=cuda).manual_seed(6)
    q = torch.randn(sum(lens_q), 8, pair[0], device=cuda, dtype=dtype, generator=gen)
    k = torch.randn(sum(lens_k), 2, pair[0], device=cuda, dtype=dtype, generator=gen)
    v = torch.randn(sum(lens_k), 2, pair[1], device=cuda, dtype=dtype, generator=gen)
    cq, ck = cu_seqlens(lens_q, cuda), cu_seqlens(lens_k, cuda)
    out, lse = flashcore.varlen_attention(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal, return_lse=True)
    assert out.shape == (sum(lens_q), 8, pair[1])
    check_varlen(q, k, v, lens_q, lens_k, causal, out, lse)


@pytest.mark.parametrize("seqlen_q", [1, 17])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kvcache_dense(caps, cuda, dtype, pair, causal, seqlen_q):
    _need_pair(caps, dtype, *pair)
    lengths = [0, 1, 113, 700, 1024] if seqlen_q == 1 else [17, 113, 1024]
    q, k, v = _inputs(cuda, dtype, len(lengths), seqlen_q, 1024, 16, 4, *pair, seed=7)
    _poison_dense(k, v, lengths)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal,
                                                return_softmax_lse=True)
    check_cache(q, k, v, lengths, causal, out, lse)


@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kvcache_paged(caps, cuda, dtype, pair, causal, page_size, seqlen_q):
    _need_pair(caps, dtype, *pair)
    lengths = [0, 1, 17, 700, 1024, 255] if seqlen_q == 1 else [5, 2, 333, 1024]
    q, k, v = _inputs(cuda, dtype, len(lengths), seqlen_q, 1024, 16, 4, *pair, seed=8)
    _poison_dense(k, v, lengths)
    kp, vp, table = paginate(k, v, lengths, page_size)
    assert vp.shape[1:] == (page_size, 4, pair[1])
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    out, lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, causal=causal,
                                                block_table=table, return_softmax_lse=True)
    check_cache(q, k, v, lengths, causal, out, lse)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged16"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_kvcache_append(caps, cuda, dtype, paged):
    """k (B, n, Hkv, 192) and v (B, n, Hkv, 128) written into caches of their own head dims at cache_seqlens[b]
    (across page boundaries when paged), then attended to."""
    _need_pair(caps, dtype, *MLA)
    lengths, n = [0, 14, 300, 47], 3
    q, k, v = _inputs(cuda, dtype, len(lengths), n, 512, 8, 2, *MLA, seed=9)
    _poison_dense(k, v, lengths)
    _, k_new, v_new = _inputs(cuda, dtype, len(lengths), n, n, 8, 2, *MLA, seed=10)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    if paged:
        kc, vc, table = paginate(k, v, lengths, 16, garbage_entries=False)
    else:
        kc, vc, table = k.clone(), v.clone(), None
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=seqlens, block_table=table,
                                                causal=True, return_softmax_lse=True)
    assert seqlens.tolist() == lengths  # the caller's lengths are not advanced in place
    for b, start in enumerate(lengths):
        for i in range(n):
            if paged:
                page, row = int(table[b, (start + i) // 16]), (start + i) % 16
                assert torch.equal(kc[page, row], k_new[b, i]) and torch.equal(vc[page, row], v_new[b, i])
            else:
                assert torch.equal(kc[b, start + i], k_new[b, i]) and torch.equal(vc[b, start + i], v_new[b, i])
            k[b, start + i], v[b, start + i] = k_new[b, i], v_new[b, i]
    check_cache(q, k, v, [m + n for m in lengths], True, out, lse)


# ---------------------------------------------------------------------------------------------------------------
# Plans, torch.compile, CUDA graphs, ring attention.


def test_plan_matches_attention(caps, cuda):
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 300, 1000, 8, 2, *MLA, seed=11)
    plan = flashcore.plan_attention(q, k, v, causal=True, return_lse=True)
    out, lse = plan.run(q, k, v)
    want, want_lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 300, 8, MLA[1]) and torch.equal(out, want) and torch.equal(lse, want_lse)


def test_compile_and_cuda_graph(caps, cuda):
    """torch.compile(fullgraph) equals eager, dense and paged; a captured dense call replayed with new inputs equals
    an eager call on them."""
    _need_pair(caps, torch.bfloat16, *MLA)
    torch._dynamo.reset()
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 113, 203, 8, 2, *MLA, seed=12)

    def dense(q, k, v):
        out, lse = flashcore.attention(q, k, v, causal=True, return_lse=True)
        return out.float() * 2, lse

    for got, want in zip(torch.compile(dense, fullgraph=True)(q, k, v), dense(q, k, v)):
        assert torch.equal(got, want)
    lengths = [100, 203]
    kp, vp, table = paginate(k, v, lengths, 16)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)

    def paged(q, kp, vp, seqlens, table):
        return flashcore.attention_with_kvcache(q[:, :1], kp, vp, cache_seqlens=seqlens, block_table=table)

    assert torch.equal(torch.compile(paged, fullgraph=True)(q, kp, vp, seqlens, table), paged(q, kp, vp, seqlens, table))
    flashcore.attention(q, k, v, causal=True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flashcore.attention(q, k, v, causal=True)
    new_q, new_k, new_v = _inputs(cuda, torch.bfloat16, 2, 113, 203, 8, 2, *MLA, seed=13)
    q.copy_(new_q), k.copy_(new_k), v.copy_(new_v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, flashcore.attention(new_q, new_k, new_v, causal=True))
    check_dense(new_q, new_k, new_v, True, captured)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_simulation(caps, cuda, causal):
    """flashcore.distributed's per-rank program (ring attention, the single-GPU simulation): O and the merged state of
    v's head dim."""
    from flashcore import distributed as fcd

    _need_pair(caps, torch.bfloat16, *MLA)
    if "flashcore_attention_merge" not in _lib.load()._optional:
        pytest.skip("the library predates flashcore_attention_merge")
    q, k, v = _inputs(cuda, torch.bfloat16, 2, 259, 259, 8, 2, *MLA, seed=14)
    out, lse = fcd.ring_attention_simulate(q, k, v, 3, causal=causal, return_lse=True)
    check_dense(q, k, v, causal, out, lse)


# ---------------------------------------------------------------------------------------------------------------
# Refusals.


def test_backward_is_the_librarys_decision(caps, cuda):
    """.backward() of (192, 128) (since 0.9) reaches the library's backward: where it has the kernel (the sm90 backend
    of a 0.9 library) dq, dk of q's and k's shape and dv of v's come back finite (their accuracy:
    test_backward_gpu.py); elsewhere (the portable backend, an older library) its error, naming head_dim_v, is raised
    after the forward ran, and no gradient is made up."""
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = (t.requires_grad_() for t in _inputs(cuda, torch.bfloat16, 2, 113, 113, 8, 2, *MLA, seed=15))
    out = flashcore.attention(q, k, v, causal=True)
    check_dense(q.detach(), k.detach(), v.detach(), True, out.detach())
    lib = _lib.load()
    if not lib.has_backward():
        pytest.skip(f"{lib.path} ({lib.version_string()}) has no backward (0.4 needed)")
    refusal = None
    with torch.no_grad():  # the library asked directly (the workspace query of the same call)
        o, lse = flashcore.attention(*(t.detach() for t in (q, k, v)), causal=True, return_lse=True)
        grads = [torch.empty_like(t) for t in (q, k, v)]
        params = _ops.backward_params(lib, torch.ones_like(o), q.detach(), k.detach(), v.detach(), o, lse, *grads,
                                      True, 0.0, False)
        try:
            lib.backward_workspace_size(params)
        except ValueError as exc:
            refusal = str(exc)
    if refusal is None:
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad is not None and t.grad.shape == t.shape and torch.isfinite(t.grad).all()
        return
    assert "head_dim_v = 128" in refusal, refusal
    with pytest.raises(ValueError, match="head_dim_v = 128"):
        out.sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None


def test_8bit_and_uncompiled_pairs_are_refused(caps, cuda):
    _need_pair(caps, torch.bfloat16, *MLA)
    q, k, v = _inputs(cuda, torch.bfloat16, 1, 64, 64, 4, 4, *MLA)
    (q8, qd), (k8, kd), (v8, vd) = (flashcore.quantize_fp8(t) for t in (q, k, v))
    with pytest.raises(ValueError, match="8-bit attention .* takes one head dim for q, k and v"):
        flashcore.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    with pytest.raises(ValueError, match="precision='fp8' takes one head dim"):
        flashcore.attention(q, k, v, precision="fp8")
    with pytest.raises(ValueError, match=r"\(head_dim, head_dim_v\) = \(192, 64\) is not supported"):
        flashcore.attention(q, k, v[..., :64])

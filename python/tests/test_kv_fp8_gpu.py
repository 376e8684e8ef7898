"""flashcore.attention_with_kvcache on an e4m3 KV cache on the GPU (C ABI 0.9, FLASHCORE_FLAG_KV_FP8_E4M3; sm90 only in
0.9): float8_e4m3fn k_cache / v_cache under bf16 / fp16 q, with k_descale / v_descale per (sequence, KV head) or one
factor for the whole cache (a 0-d / (1,) tensor).

Cases: decode (one query) and chunked prefill ((B, 17) queries and packed ones, cu_seqlens_q, causal) on dense caches,
cache slots (cache_batch_idx) and paged caches (pages of 16 and 64 rows, unused block-table entries pointing at a NaN
page or out of range), GQA 8 / 2, head dims 64 / 128 / 256, bf16 and fp16; cache_leftpad and num_splits (decode split
over the key range); torch.compile and a CUDA graph replayed with new cache contents, lengths and descales. Every cache
row no sequence may read holds NaN (e4m3 0x7F): rows past cache_seqlens, unused slots and spare pages.

Checks, per sequence: out and lse against the float64 attention of the dequantized cache (k_cache.float() *
k_descale[b, h], the factors of the sequence b, not of its slot) with the suite's rule (test_variants_gpu.check:
err <= 2 * err(baseline at the inputs' precision) + atol, lse within 2e-3 / 1e-3); and against
flashcore.attention_with_kvcache on the same cache dequantized into q's dtype (bf16, or fp16 for fp16 q), itself
checked with the rule against its own reference: |out - out_16bit| <= 2 * err(baseline) + atol + the difference the
16-bit rounding of the cache makes to the float64 reference, lse within 2e-3 / 1e-3.

Needs torch, a CUDA GPU and a libflashcore.so of 0.9 or newer (skips otherwise, naming the reason); the cases run on
the sm90 backend (Hopper); elsewhere only test_refused_off_hopper runs, which checks the library's refusal."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib  # noqa: E402
from reference import reference_variants  # noqa: E402
from test_attention_gpu import ATOL, _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_paged_cpu import paginate  # noqa: E402
from test_variants_gpu import LSE_ATOL, LSE_RTOL, baseline, check  # noqa: E402
from test_varlen_cpu import cu_seqlens  # noqa: E402

E4M3 = torch.float8_e4m3fn


def _library():
    try:
        lib = _lib.load()
    except RuntimeError as exc:
        pytest.skip(f"libflashcore.so not loadable: {exc}")
    if not lib.has_kv_fp8():
        pytest.skip(f"{lib.path} (version {lib.version_string()}) predates the e4m3 KV cache (0.9)")
    return lib


@pytest.fixture(scope="module")
def kv8(caps):
    _library()
    if caps.device_backend != "sm90":
        pytest.skip(f"the e4m3 KV cache runs on the sm90 backend (Hopper) only in 0.9; this device is served by "
                    f"{caps.device_backend or 'no backend'} (test_refused_off_hopper checks the refusal)")
    return caps


def _descales(kind, batch, heads_kv, device, gen):
    """(k_descale, v_descale) as passed, and as (B, Hkv) float32 factors (1 for None)."""
    if kind == "per-head":
        kd = torch.rand(batch, heads_kv, device=device, generator=gen) * 0.5 + 0.25
        vd = torch.rand(batch, heads_kv, device=device, generator=gen) * 1.5 + 0.5
    elif kind == "per-tensor":
        kd, vd = torch.tensor(0.4375, device=device), torch.tensor([1.375], device=device)
    else:
        kd = vd = None
    full = [torch.ones(batch, heads_kv, device=device) if d is None else
            d.reshape(1, 1).expand(batch, heads_kv) if d.numel() == 1 else d for d in (kd, vd)]
    return kd, vd, full[0], full[1]


def _agree(q, k, v, k16, v16, out, lse, out16, lse16, causal):
    """out / lse of the e4m3 call against those of the 16-bit call on the cache dequantized and rounded into q's
    dtype (k16, v16; k, v: exact, float32), one sequence (leading batch dimension of 1)."""
    if k.shape[1] == 0:
        assert torch.equal(out, out16) and torch.equal(lse, lse16)
        return
    ref, _ = reference_variants(q, k, v, causal=causal)
    ref16, _ = reference_variants(q, k16, v16, causal=causal)
    base = (baseline(q, k, v, causal=causal).double() - ref).abs().max().item()
    rounding = (ref - ref16).abs().max().item()
    err = (out.double() - out16.double()).abs().max().item()
    assert err <= 2 * base + ATOL[q.dtype] + rounding, (
        f"e4m3 cache vs its 16-bit dequantization: {err:.3g} (baseline {base:.3g}, rounding {rounding:.3g})")
    finite = torch.isfinite(lse16)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite].double(), lse16[finite].double(), atol=LSE_ATOL, rtol=LSE_RTOL)


def _run(cuda, *, dtype=torch.bfloat16, head_dim=128, lengths, seqlen_q=1, lens_q=None, causal=False,
         page_size=None, batch_idx=None, slots=None, leftpad=None, descale="per-head", heads=(8, 2), capacity=512,
         num_splits=0, seed=0):
    """One e4m3 call and its 16-bit twin, checked sequence by sequence (module docstring)."""
    batch = len(lengths)
    slots = batch if slots is None else slots
    heads_q, heads_kv = heads
    gen = torch.Generator(device=cuda).manual_seed(seed)
    shape_q = (sum(lens_q), heads_q, head_dim) if lens_q is not None else (batch, seqlen_q, heads_q, head_dim)
    q = torch.randn(*shape_q, device=cuda, dtype=dtype, generator=gen)
    # The caches' e4m3 values held in float32 (exact), so that rows can be set to NaN and pages laid out with torch
    # ops of every dtype; converted to e4m3 at the end (NaN becomes e4m3's NaN, 0x7F).
    kf, vf = (torch.randn(slots, capacity, heads_kv, head_dim, device=cuda, generator=gen).to(E4M3).float()
              for _ in range(2))
    slot_of = list(range(batch)) if batch_idx is None else batch_idx
    assert len(set(s for s in slot_of if 0 <= s < slots)) == len([s for s in slot_of if 0 <= s < slots])
    used = [0] * slots
    for b, s in enumerate(slot_of):
        if 0 <= s < slots:
            used[s] = lengths[b]
            if leftpad is not None:
                kf[s, :min(leftpad[b], lengths[b])] = math.nan
                vf[s, :min(leftpad[b], lengths[b])] = math.nan
    for s in range(slots):
        kf[s, used[s]:] = math.nan
        vf[s, used[s]:] = math.nan
    kd, vd, kd_full, vd_full = _descales(descale, batch, heads_kv, cuda, gen)
    # The dequantized cache: slot slot_of[b] with sequence b's factors (each slot serves one sequence here).
    kq, vq = kf.clone(), vf.clone()
    for b, s in enumerate(slot_of):
        if 0 <= s < slots:
            kq[s] *= kd_full[b][None, :, None]
            vq[s] *= vd_full[b][None, :, None]
    table = None
    if page_size is not None:  # the same pages (the same seed) for both
        kf_p, vf_p, table = paginate(kf, vf, used, page_size, seed=seed)
        kq_p, vq_p, table_q = paginate(kq, vq, used, page_size, seed=seed)
        assert torch.equal(table, table_q)
    else:
        kf_p, vf_p, kq_p, vq_p = kf, vf, kq, vq
    k8, v8 = kf_p.to(E4M3), vf_p.to(E4M3)
    k16, v16 = kq_p.to(dtype), vq_p.to(dtype)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    kwargs = dict(cache_seqlens=seqlens, causal=causal, return_softmax_lse=True, num_splits=num_splits)
    if table is not None:
        kwargs["page_table"] = table
    if batch_idx is not None:
        kwargs["cache_batch_idx"] = torch.tensor(batch_idx, dtype=torch.int32, device=cuda)
    if leftpad is not None:
        kwargs["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=cuda)
    if lens_q is not None:
        kwargs.update(cu_seqlens_q=cu_seqlens(lens_q, cuda), max_seqlen_q=max(lens_q))
    out, lse = flashcore.attention_with_kvcache(q, k8, v8, k_descale=kd, v_descale=vd, **kwargs)
    out16, lse16 = flashcore.attention_with_kvcache(q, k16, v16, **kwargs)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == q.shape and lse.shape == lse16.shape
    assert torch.isfinite(out).all(), "NaN from a cache row no sequence may read reached the output"

    start = 0
    for b in range(batch):
        n_q = lens_q[b] if lens_q is not None else seqlen_q
        rows = slice(start, start + n_q)
        start += n_q
        if n_q == 0:
            continue
        if lens_q is not None:
            q_b, o_b, l_b, o16_b, l16_b = q[rows], out[rows], lse[:, rows], out16[rows], lse16[:, rows]
        else:
            q_b, o_b, l_b, o16_b, l16_b = q[b], out[b], lse[b], out16[b], lse16[b]
        s = slot_of[b]
        if not 0 <= s < slots:
            assert (o_b == 0).all() and (l_b == -math.inf).all(), f"sequence {b}: slot {s} is out of range"
            continue
        left = 0 if leftpad is None else max(0, min(leftpad[b], lengths[b]))
        kb = kf[s, left:lengths[b]] * kd_full[b][None, :, None]  # float32, exact
        vb = vf[s, left:lengths[b]] * vd_full[b][None, :, None]
        kb16, vb16 = kq[s, left:lengths[b]].to(dtype), vq[s, left:lengths[b]].to(dtype)
        check(q_b[None], kb[None], vb[None], o_b[None], l_b[None], causal=causal)
        check(q_b[None], kb16[None], vb16[None], o16_b[None], l16_b[None], causal=causal)  # the twin is sound
        _agree(q_b[None], kb[None], vb[None], kb16[None], vb16[None], o_b[None], l_b[None], o16_b[None],
               l16_b[None], causal)


LAYOUTS = {  # (page_size, batch_idx, slots)
    "dense": (None, None, None),
    "dense-idx": (None, [4, 0, 2, 1], 5),
    "paged-16": (16, None, None),
    "paged-64-idx": (64, [2, 4, 0, 1], 5),
}


@pytest.mark.parametrize("descale", ["per-head", "per-tensor"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_decode(kv8, cuda, dtype, head_dim, layout, descale):
    """One query per sequence, GQA 8 / 2, lengths 1 to the full capacity and one empty cache."""
    _need(kv8, dtype, head_dim)
    page_size, batch_idx, slots = LAYOUTS[layout]
    _run(cuda, dtype=dtype, head_dim=head_dim, lengths=[1, 300, 0, 512], page_size=page_size, batch_idx=batch_idx,
         slots=slots, descale=descale, seed=head_dim + len(layout))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_chunked_prefill_packed(kv8, cuda, dtype, head_dim, layout):
    """Packed queries (cu_seqlens_q) of 1, 17, 0 and 40 rows, causal, against caches of 40, 200, 7 and 512 keys."""
    _need(kv8, dtype, head_dim)
    page_size, batch_idx, slots = LAYOUTS[layout]
    _run(cuda, dtype=dtype, head_dim=head_dim, lengths=[40, 200, 7, 512], lens_q=[1, 17, 0, 40], causal=True,
         page_size=page_size, batch_idx=batch_idx, slots=slots, seed=2 * head_dim + len(layout))


@pytest.mark.parametrize("descale", ["per-head", "per-tensor", "none"])
@pytest.mark.parametrize("page_size", [None, 16, 64])
def test_chunked_prefill(kv8, cuda, page_size, descale):
    """(B, 17) queries, causal, bf16, d = 128: the last query of each sequence at its last key."""
    _need(kv8, torch.bfloat16, 128)
    _run(cuda, lengths=[17, 100, 512], seqlen_q=17, causal=True, page_size=page_size, descale=descale, seed=5)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_num_splits(kv8, cuda, num_splits):
    """Decode without a split and split into up to four parts over the key range."""
    _need(kv8, torch.bfloat16, 128)
    _run(cuda, lengths=[2048, 3, 1000], capacity=2048, num_splits=num_splits, seed=6)


def test_leftpad(kv8, cuda):
    """cache_leftpad on a dense cache (the C ABI takes leftpad_k with the flag): keys [leftpad[b], cache_seqlens[b]),
    NaN before them; a padding past the end gives no key."""
    _need(kv8, torch.bfloat16, 128)
    _run(cuda, lengths=[50, 200, 9, 31], leftpad=[10, 0, 9, 40], seqlen_q=2, causal=True, seed=7)


def test_mha_and_mqa(kv8, cuda):
    _need(kv8, torch.bfloat16, 128)
    for heads in ((4, 4), (8, 1)):
        _run(cuda, lengths=[5, 128, 77], heads=heads, seed=8)


@pytest.mark.parametrize("page_size", [None, 16])
def test_append_quantizes_into_the_cache(kv8, cuda, page_size):
    """k / v (bf16, 3 new rows a sequence) appended to the e4m3 cache by the library: the cache afterwards byte for
    byte torch's e4m3 of x / descale[b, h] (nearest even, saturated to +-448; the rest untouched), and out / lse those
    of the same call on that cache without the append."""
    _need(kv8, torch.bfloat16, 128)
    gen = torch.Generator(device=cuda).manual_seed(11)
    q = torch.randn(3, 1, 8, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    kf, vf = (torch.randn(3, 256, 2, 128, device=cuda, generator=gen).to(E4M3).float() for _ in range(2))
    kn, vn = (torch.randn(3, 3, 2, 128, device=cuda, generator=gen).to(torch.bfloat16) * 40 for _ in range(2))
    kd = torch.rand(3, 2, device=cuda, generator=gen) + 0.1
    vd = torch.rand(3, 2, device=cuda, generator=gen) + 0.1
    lengths = [0, 100, 253]
    table = None
    if page_size is not None:
        kf, vf, table = paginate(kf, vf, [256] * 3, page_size, seed=3)
    k8, v8 = kf.to(E4M3), vf.to(E4M3)
    want_k, want_v = k8.clone(), v8.clone()
    for b in range(3):
        for t in range(3):
            pos = lengths[b] + t
            page, row = (b, pos) if table is None else (int(table[b, pos // page_size]), pos % page_size)
            want_k[page, row] = (kn[b, t].float() / kd[b][:, None]).clamp(-448, 448).to(E4M3)
            want_v[page, row] = (vn[b, t].float() / vd[b][:, None]).clamp(-448, 448).to(E4M3)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    extra = {} if table is None else {"page_table": table}
    out, lse = flashcore.attention_with_kvcache(q, k8, v8, k=kn, v=vn, cache_seqlens=seqlens, k_descale=kd,
                                                v_descale=vd, return_softmax_lse=True, **extra)
    torch.cuda.synchronize()
    assert torch.equal(k8.view(torch.uint8), want_k.view(torch.uint8)), "K: the append's bytes differ"
    assert torch.equal(v8.view(torch.uint8), want_v.view(torch.uint8)), "V: the append's bytes differ"
    out2, lse2 = flashcore.attention_with_kvcache(q, want_k, want_v, cache_seqlens=seqlens + 3, k_descale=kd,
                                                  v_descale=vd, return_softmax_lse=True, **extra)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("page_size", [None, 64])
@pytest.mark.parametrize("seqlen_q", [1, 17])
def test_e4m3_queries(kv8, cuda, seqlen_q, page_size):
    """A float8_e4m3fn q with q_descale per (sequence, KV head) on the e4m3 cache (FlashAttention-3's FP8 call; the
    library widens q into its workspace): out bfloat16, against the float64 attention of the dequantized q and cache
    with the project's rule (2x the error of the bf16 attention of them rounded to bf16, plus atol)."""
    _need(kv8, torch.bfloat16, 128)
    gen = torch.Generator(device=cuda).manual_seed(21 + seqlen_q)
    lengths = [17, 300, 511]
    q8 = torch.randn(3, seqlen_q, 8, 128, device=cuda, generator=gen).to(E4M3)
    qd = torch.rand(3, 2, device=cuda, generator=gen) * 0.2 + 0.05
    kf, vf = (torch.randn(3, 512, 2, 128, device=cuda, generator=gen).to(E4M3).float() for _ in range(2))
    kd = torch.rand(3, 2, device=cuda, generator=gen) + 0.25
    vd = torch.rand(3, 2, device=cuda, generator=gen) + 0.25
    for b, n in enumerate(lengths):
        kf[b, n:] = math.nan
        vf[b, n:] = math.nan
    table = None
    kc, vc = kf, vf
    if page_size is not None:
        kc, vc, table = paginate(kf, vf, lengths, page_size, seed=4)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    extra = {} if table is None else {"page_table": table}
    out, lse = flashcore.attention_with_kvcache(q8, kc.to(E4M3), vc.to(E4M3), cache_seqlens=seqlens, q_descale=qd,
                                                k_descale=kd, v_descale=vd, causal=True, return_softmax_lse=True,
                                                **extra)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    for b, n in enumerate(lengths):
        qb = q8[b:b + 1].float() * qd[b].repeat_interleave(4)[None, None, :, None]
        kb = kf[b:b + 1, :n] * kd[b][None, None, :, None]
        vb = vf[b:b + 1, :n] * vd[b][None, None, :, None]
        ref, ref_lse = reference_variants(qb, kb, vb, causal=True)
        base = (baseline(qb.bfloat16(), kb.bfloat16(), vb.bfloat16(), causal=True).double() - ref).abs().max().item()
        err = (out[b:b + 1].double() - ref).abs().max().item()
        assert err <= 2 * base + ATOL[torch.bfloat16], f"sequence {b}: error {err:.3g} vs baseline {base:.3g}"
        torch.testing.assert_close(lse[b:b + 1].double(), ref_lse, atol=LSE_ATOL, rtol=LSE_RTOL)


def _decode_inputs(cuda, seed=9):
    gen = torch.Generator(device=cuda).manual_seed(seed)
    q = torch.randn(3, 1, 8, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    k8, v8 = (torch.randn(3, 256, 2, 128, device=cuda, generator=gen).to(E4M3) for _ in range(2))
    kd = torch.rand(3, 2, device=cuda, generator=gen) + 0.5
    return q, k8, v8, kd, torch.tensor(0.75, device=cuda), torch.tensor([3, 256, 100], dtype=torch.int32,
                                                                         device=cuda)


def test_compile_fullgraph(kv8, cuda):
    _need(kv8, torch.bfloat16, 128)
    q, k8, v8, kd, vd, seqlens = _decode_inputs(cuda)

    def fn(q, k8, v8, seqlens, kd, vd):
        return flashcore.attention_with_kvcache(q, k8, v8, cache_seqlens=seqlens, k_descale=kd, v_descale=vd,
                                                return_softmax_lse=True)

    torch._dynamo.reset()
    want = fn(q, k8, v8, seqlens, kd, vd)
    got = torch.compile(fn, fullgraph=True)(q, k8, v8, seqlens, kd, vd)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_cuda_graph_replays_with_new_contents(kv8, cuda):
    """A captured decode step replayed after new cache bytes, lengths, per-head k_descale and a new per-tensor
    v_descale (expanded inside the graph) were copied into the captured tensors: the eager call's result."""
    _need(kv8, torch.bfloat16, 128)
    q, k8, v8, kd, vd, seqlens = _decode_inputs(cuda)

    def step():
        return flashcore.attention_with_kvcache(q, k8, v8, cache_seqlens=seqlens, k_descale=kd, v_descale=vd,
                                                return_softmax_lse=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    q2, k2, v2, kd2, _, _ = _decode_inputs(cuda, seed=10)
    for dst, src in ((q, q2), (k8, k2), (v8, v2), (kd, kd2)):
        dst.copy_(src)
    vd.fill_(1.25)
    seqlens.copy_(torch.tensor([256, 1, 37], dtype=torch.int32, device=cuda))
    graph.replay()
    torch.cuda.synchronize()
    want_out, want_lse = step()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_refused_off_hopper(caps, cuda):
    """Off the sm90 backend the library refuses the flag (ValueError naming it) rather than reading the cache as
    16-bit data."""
    _library()
    if caps.device_backend == "sm90":
        pytest.skip("the sm90 backend runs the e4m3 KV cache (the other tests)")
    q, k8, v8, kd, vd, seqlens = _decode_inputs(cuda)
    with pytest.raises(ValueError, match="FLASHCORE_FLAG_KV_FP8_E4M3"):
        flashcore.attention_with_kvcache(q, k8, v8, cache_seqlens=seqlens, k_descale=kd, v_descale=vd)
        torch.cuda.synchronize()

"""flashcore.attention_with_kvcache with a paged KV cache (block_table) and num_splits, without a GPU: argument
errors, the C params (through the host-only stub library), the in-place append through the block table (plain torch
index ops, run here on CPU), and the custom op / fake / torch.compile wiring with the kernel emulated on CPU. Also
holds paginate(), which test_paged_gpu.py imports."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from test_varlen_cpu import emulate_serving_on_cpu, ref_sequence  # noqa: E402


def paginate(k, v, lengths, page_size, spare_pages=3, seed=0, garbage_entries=True):
    """A paged copy of dense caches k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) (Dv: D or v's own head dim): (k_pages,
    v_pages, block_table).

    Pages are shuffled over num_pages = B * ceil(Sk / page_size) + spare_pages; the spare pages and every row past a
    sequence's length (lengths: host ints) hold NaN. With garbage_entries, the block-table entries past the pages a
    sequence's length needs point at a NaN page or out of range (never read, per the C ABI)."""
    batch, capacity, heads_kv, _ = k.shape
    per_seq = -(-capacity // page_size)
    num_pages = batch * per_seq + spare_pages
    gen = torch.Generator(device=k.device).manual_seed(seed)
    perm = torch.randperm(num_pages, device=k.device, generator=gen)
    table = perm[:batch * per_seq].reshape(batch, per_seq).to(torch.int32)
    k_pages, v_pages = (torch.full((num_pages, page_size, heads_kv, t.shape[3]), math.nan, dtype=t.dtype,
                                   device=t.device) for t in (k, v))
    padded = per_seq * page_size
    for src, dst in ((k, k_pages), (v, v_pages)):
        head_dim = src.shape[3]
        dense = torch.full((batch, padded, heads_kv, head_dim), math.nan, dtype=k.dtype, device=k.device)
        for b, n in enumerate(lengths):
            dense[b, :n] = src[b, :n]
        dst[table.flatten().long()] = dense.reshape(batch * per_seq, page_size, heads_kv, head_dim)
    if garbage_entries:
        nan_page = int(perm[-1]) if spare_pages else 0
        for b, n in enumerate(lengths):
            first_unused = -(-n // page_size)
            for j in range(first_unused, per_seq):
                table[b, j] = (nan_page, -1, num_pages + 7)[j % 3]
    return k_pages, v_pages, table


def _cache(batch=3, capacity=96, heads_q=8, heads_kv=2, head_dim=64, seqlen_q=1, dtype=torch.bfloat16, seed=0,
           head_dim_v=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, capacity, heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, capacity, heads_kv, head_dim_v or head_dim, generator=gen).to(dtype)
    return q, k, v


@pytest.fixture
def emulated(monkeypatch):
    calls = []
    emulate_serving_on_cpu(monkeypatch, calls)
    return calls


# ---------------------------------------------------------------------------------------------------------------
# paginate() itself.


def test_paginate_round_trip():
    _, k, v = _cache(capacity=80)
    lengths = [0, 33, 80]
    kp, vp, table = paginate(k, v, lengths, 16)
    assert kp.shape == (3 * 5 + 3, 16, 2, 64) and table.shape == (3, 5) and table.dtype == torch.int32
    for b, n in enumerate(lengths):
        idx = torch.arange(n)
        pages = table[b].long()[idx // 16]
        assert torch.equal(kp[pages, idx % 16], k[b, :n]) and torch.equal(vp[pages, idx % 16], v[b, :n])
    assert torch.isnan(kp[table[1, 2].long(), 1:]).all()  # rows past length 33 in its last page


# ---------------------------------------------------------------------------------------------------------------
# Argument errors raised by the Python layer.


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "block_table": a["block_table"].long()}, ValueError, "block_table must be an int32"),
        (lambda a: {**a, "block_table": a["block_table"][:2]}, ValueError, r"\(batch, max_pages_per_sequence\) = \(3, \*\)"),
        (lambda a: {**a, "block_table": a["block_table"].flatten()}, ValueError, "block_table must be an int32"),
        (lambda a: {**a, "block_table": [[0]]}, TypeError, "block_table must be a torch.Tensor"),
        (lambda a: {**a, "k_cache": a["k_cache"][:, :0], "v_cache": a["v_cache"][:, :0]}, ValueError,
         r"page_size must be from 1 to 65536, got .* \(page_size 0\)"),
        (lambda a: {**a, "k_cache": a["k_cache"][:0], "v_cache": a["v_cache"][:0]}, ValueError, "has no pages"),
        (lambda a: {**a, "k_cache": a["k_cache"][0]}, ValueError, r"k_cache must be a 4-D tensor \(num_pages, page_size"),
        (lambda a: {**a, "v_cache": a["v_cache"][:, :, :1]}, ValueError,
         "k_cache and v_cache must have the same shape but for the last dimension"),
        (lambda a: {**a, "v_cache": a["v_cache"][..., :32]}, ValueError,
         r"\(head_dim, head_dim_v\) = \(64, 32\) is not supported"),
        (lambda a: {**a, "num_splits": -1}, ValueError, "num_splits must be >= 0"),
        (lambda a: {**a, "num_splits": 2.0}, TypeError, "num_splits must be an int"),
        (lambda a: {**a, "num_splits": True}, TypeError, "num_splits must be an int"),
        (lambda a: {**a, "page_table": a["block_table"].clone()}, ValueError, "not both"),
        (lambda a: {**a, "cache_seqlens": torch.tensor([1, 2, 3])}, ValueError, "cache_seqlens must be an int32"),
        (lambda a: {**a, "k": torch.zeros(3, 1, 2, 64, dtype=torch.bfloat16)}, ValueError, "both k and v"),
        (lambda a: {**a, "k": torch.zeros(3, 1, 4, 64, dtype=torch.bfloat16),
                    "v": torch.zeros(3, 1, 4, 64, dtype=torch.bfloat16)}, ValueError,
         r"k must be \(B, Sq_new, Hkv, k_cache's head dim\) = \(3, \*, 2, 64\)"),
        (lambda a: {**a, "k": torch.zeros(3, 1, 2, 64, dtype=torch.bfloat16),
                    "v": torch.zeros(3, 1, 2, 32, dtype=torch.bfloat16)}, ValueError,
         r"v must be \(B, Sq_new, Hkv, v_cache's head dim\) = \(3, \*, 2, 64\), got \(3, 1, 2, 32\)"),
        (lambda a: {**a, "k": torch.zeros(3, 2, 2, 64, dtype=torch.bfloat16),
                    "v": torch.zeros(3, 1, 2, 64, dtype=torch.bfloat16)}, ValueError, "append as many rows"),
    ],
    ids=["table-int64", "table-batch", "table-1d", "table-list", "page-size-0", "no-pages", "cache-3d", "v-shape",
         "v-head-dim-pair", "splits-negative", "splits-float", "splits-bool", "table-and-page-table", "seqlens-int64",
         "k-without-v", "append-heads", "append-v-head-dim", "append-rows"],
)
def test_argument_errors(emulated, mutate, exc, match):
    q, k, v = _cache()
    kp, vp, table = paginate(k, v, [5, 0, 96], 16)
    args = mutate({"q": q, "k_cache": kp, "v_cache": vp, "block_table": table,
                   "cache_seqlens": torch.tensor([5, 0, 96], dtype=torch.int32)})
    before = args["k_cache"].clone() if isinstance(args["k_cache"], torch.Tensor) else None
    with pytest.raises(exc, match=match):
        flashcore.attention_with_kvcache(**args)
    assert not emulated  # nothing was launched
    if before is not None:
        assert torch.equal(args["k_cache"].nan_to_num(7.0), before.nan_to_num(7.0))  # nor appended


def test_cpu_tensors_are_rejected():
    q, k, v = _cache()
    kp, vp, table = paginate(k, v, [5, 0, 96], 16)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=torch.tensor([5, 0, 96], dtype=torch.int32),
                                         block_table=table)


# ---------------------------------------------------------------------------------------------------------------
# The C params (stub library).


def test_paged_params(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _cache(batch=2, capacity=256, seqlen_q=3)
    kp, vp, table = paginate(k, v, [200, 256], 64, spare_pages=1)
    lens = torch.tensor([200, 256], dtype=torch.int32)
    out = torch.empty_like(q)
    params = _ops.kernel_params(lib, q, kp, vp, out, None, True, 0.0, lens, block_table=table, num_splits=5)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.num_heads_q, seen.num_heads_kv, seen.head_dim) == (
        2, 3, 4 * 64, 8, 2, 64)
    assert (seen.block_table, seen.block_table_stride, seen.page_size, seen.num_pages) == (
        table.data_ptr(), 4, 64, 9)
    assert (seen.k_strides.batch, seen.k_strides.seq, seen.k_strides.head) == (64 * 2 * 64, 2 * 64, 64)
    assert (seen.v_strides.batch, seen.v, seen.seqused_k) == (64 * 2 * 64, vp.data_ptr(), lens.data_ptr())
    assert (seen.q_strides.batch, seen.o_strides.batch) == (3 * 8 * 64, 3 * 8 * 64)
    assert seen.num_splits == 5
    assert seen.cu_seqlens_q is None and seen.cu_seqlens_k is None and (seen.total_q, seen.total_k) == (0, 0)


def test_dense_params_carry_num_splits(use_library, stub_library):
    use_library(stub_library)
    q, k, v = _cache(batch=2, capacity=64)
    params = _ops.kernel_params(_lib.load(), q, k, v, torch.empty_like(q), None, False, 0.0, num_splits=1)
    assert params.num_splits == 1 and params.block_table is None and params.page_size == 0


def test_block_table_views(use_library, stub_library):
    """A column slice of a wider table passes as is (row stride = its width); a non-unit column stride is copied."""
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _cache(batch=2, capacity=64)
    kp, vp, _ = paginate(k, v, [64, 64], 16)
    wide = torch.arange(2 * 10, dtype=torch.int32).reshape(2, 10)
    sliced = wide[:, :4]
    assert _ops.block_table_operand(sliced) is sliced
    params = _ops.kernel_params(lib, q, kp, vp, torch.empty_like(q), None, False, 0.0, block_table=sliced)
    assert params.block_table_stride == 10 and params.seqlen_k == 64
    transposed = torch.arange(8, dtype=torch.int32).reshape(4, 2).t()
    copy = _ops.block_table_operand(transposed)
    assert copy is not transposed and copy.is_contiguous() and torch.equal(copy, transposed)
    with pytest.raises(ValueError, match="unit column stride"):
        _ops.kernel_params(lib, q, kp, vp, torch.empty_like(q), None, False, 0.0, block_table=transposed)
    one_row = wide[:1, :3]
    assert _ops.block_table_row_stride(one_row) == 3


# ---------------------------------------------------------------------------------------------------------------
# The op with the kernel emulated on CPU.


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [1, 4, 16, 24, 64])
def test_emulated_paged_matches_dense(emulated, causal, page_size):
    """Any page size (since 0.8 the library takes 1 .. 65536 rows; the Python layer no longer asks for multiples of
    16)."""
    lengths = [0, 1, 37, 128]
    q, k, v = _cache(batch=4, capacity=128, seqlen_q=2)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    dense, dense_lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal,
                                                        return_softmax_lse=True)
    kp, vp, table = paginate(k, v, lengths, page_size)
    paged, paged_lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=seqlens, causal=causal,
                                                        return_softmax_lse=True, block_table=table)
    assert [c["kind"] for c in emulated] == ["dense", "paged"]
    assert torch.isfinite(paged).all()
    torch.testing.assert_close(paged, dense)
    torch.testing.assert_close(paged_lse, dense_lse)


def test_page_table_alias_and_default_lengths(emulated):
    q, k, v = _cache(batch=2, capacity=64)
    kp, vp, table = paginate(k, v, [64, 64], 32, garbage_entries=False)
    a = flashcore.attention_with_kvcache(q, kp, vp, block_table=table)  # cache_seqlens None: every page
    b = flashcore.attention_with_kvcache(q, kp, vp, page_table=table, cache_seqlens=64)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, flashcore.attention_with_kvcache(q, k, v))
    assert emulated[0]["block_table"] is table


def test_num_splits_reaches_the_launch(emulated):
    q, k, v = _cache(batch=2, capacity=64)
    kp, vp, table = paginate(k, v, [64, 64], 16)
    flashcore.attention_with_kvcache(q, kp, vp, block_table=table, num_splits=3)
    flashcore.attention_with_kvcache(q, k, v, num_splits=1)
    flashcore.attention_with_kvcache(q, k, v)
    assert [c["num_splits"] for c in emulated] == [3, 1, 0]


@pytest.mark.parametrize("page_size", [16, 32])
def test_emulated_append_through_the_block_table(emulated, page_size):
    """New tokens land at positions cache_seqlens[b] .. + n of each sequence, across page boundaries, through the
    block table; nothing else in the pages changes; attention covers cache_seqlens + n keys."""
    lengths, n = [0, 14, 30, 59], 5
    q, k, v = _cache(batch=4, capacity=64, seqlen_q=n, seed=3)
    kp, vp, table = paginate(k, v, lengths, page_size, garbage_entries=False)
    k_new, v_new = torch.randn(4, n, 2, 64).bfloat16(), torch.randn(4, n, 2, 64).bfloat16()
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    kp_before, vp_before = kp.clone(), vp.clone()
    out, lse = flashcore.attention_with_kvcache(q, kp, vp, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                block_table=table, causal=True, return_softmax_lse=True)
    assert seqlens.tolist() == lengths  # not advanced in place
    written = torch.zeros(kp.shape[:2], dtype=torch.bool)
    for b, start in enumerate(lengths):
        for i in range(n):
            page, row = int(table[b, (start + i) // page_size]), (start + i) % page_size
            assert torch.equal(kp[page, row], k_new[b, i]) and torch.equal(vp[page, row], v_new[b, i])
            written[page, row] = True
    assert torch.equal(kp[~written].nan_to_num(7.0), kp_before[~written].nan_to_num(7.0))
    assert torch.equal(vp[~written].nan_to_num(7.0), vp_before[~written].nan_to_num(7.0))
    for b, start in enumerate(lengths):  # against the dense sequence: old keys then the new ones
        kb = torch.cat([k[b, :start], k_new[b]])
        vb = torch.cat([v[b, :start], v_new[b]])
        ref_out, ref_lse = ref_sequence(q[b], kb, vb, causal=True)
        torch.testing.assert_close(out[b].double(), ref_out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[b].double(), ref_lse, atol=1e-5, rtol=1e-5)


def test_custom_op_registration(emulated):
    q, k, v = _cache(batch=2, capacity=64, seqlen_q=3)
    kp, vp, table = paginate(k, v, [64, 20], 16, garbage_entries=False)
    seqlens = torch.tensor([64, 20], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.flashcore.attention_kvcache_fwd.default,
        (q, kp, vp, seqlens, True, 0.0, True, table, 2),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )
    torch.library.opcheck(  # the dense call with the schema's defaults (the 0.2 signature)
        torch.ops.flashcore.attention_kvcache_fwd.default,
        (q, k, v, seqlens, False, 0.0, False),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"),
    )


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_with_append(emulated, backend):
    torch._dynamo.reset()
    lengths = [3, 17]
    q, k, v = _cache(batch=2, capacity=64, seqlen_q=2, seed=4)
    kp, vp, table = paginate(k, v, lengths, 16, garbage_entries=False)
    k_new, v_new = torch.randn(2, 2, 2, 64).bfloat16(), torch.randn(2, 2, 2, 64).bfloat16()
    seqlens = torch.tensor(lengths, dtype=torch.int32)

    def fn(q, kp, vp, k_new, v_new, seqlens, table):
        return flashcore.attention_with_kvcache(q, kp, vp, k=k_new, v=v_new, cache_seqlens=seqlens,
                                                block_table=table, causal=True, num_splits=2)

    kp2, vp2 = kp.clone(), vp.clone()
    want = fn(q, kp, vp, k_new, v_new, seqlens, table)
    got = torch.compile(fn, fullgraph=True, backend=backend)(q, kp2, vp2, k_new, v_new, seqlens, table)
    torch.testing.assert_close(got, want)
    assert torch.equal(kp2.nan_to_num(7.0), kp.nan_to_num(7.0)) and torch.equal(vp2.nan_to_num(7.0),
                                                                                vp.nan_to_num(7.0))

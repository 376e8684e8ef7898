"""flashcore.attention_with_kvcache with FlashAttention-3's serving arguments of 0.8 on the GPU: cache_batch_idx on
dense and paged caches (pages of 16 and 64 rows; entries out of range give O = 0, LSE = -inf and append nothing),
cache_leftpad on dense caches, packed queries (cu_seqlens_q) on dense and paged caches, appends of (B, Sn) rows and of
packed rows (cu_seqlens_k_new), causal or not, GQA, a sliding window. The caches after the call are compared bit for
bit with what must have been written where (test_kvcache_v08_cpu.expected_v08, FlashAttention-3's reference of
test_flash_attn_kvcache: sequence b's cache is slot cache_batch_idx[b], its rows land at cache_seqlens[b], its keys are
[cache_leftpad[b], cache_seqlens[b] + new rows)); each sequence's output and LSE against the float64 reference of its
keys, with the project's error rule (test_variants_gpu.check: err <= 2 * err(baseline at the inputs' precision) + atol,
LSE within 2e-3 / 1e-3). Every cache row no sequence may read holds NaN (unused slots and pages, rows past the lengths,
rows before the left padding).

The rotary embedding of an append (rotary_cos / rotary_sin, GPT-J pairs and GPT-NeoX halves, rotary_dim 32 and 128,
explicit rotary_seqlens, dense and paged caches with pages of 1, 4 and 24 rows): the caches must hold the new keys
rotated by the float64 reference (rotate_fp64, FlashAttention's formula) within one bf16 ulp (the library rounds once),
the other columns and v bit for bit; the output is checked against the float64 attention of the queries rotated by the
reference (FlashAttention's positions: row i at rotary_seqlens[b] + i with causal or a window, else at
rotary_seqlens[b]) and the keys the call left in the cache. varlen_attention's seqused_q: the used rows against the
reference of those rows (causal alignment against seqused_q[b]), the others 0 with lse -inf.

Needs torch, a CUDA GPU and a libflashcore.so of 0.8 or newer (skips otherwise, naming the reason)."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib  # noqa: E402
from test_attention_gpu import _need, caps  # noqa: E402,F401  (fixtures; cuda: conftest.py)
from test_kvcache_v08_cpu import expected_v08, rotary_positions, rotate_fp64  # noqa: E402
from test_paged_cpu import paginate  # noqa: E402
from test_variants_gpu import check  # noqa: E402
from test_varlen_cpu import cu_seqlens  # noqa: E402


@pytest.fixture(scope="module")
def v08(caps):
    _need(caps, torch.bfloat16, 128)
    lib = _lib.load()
    if not lib.has_kvcache_serving():
        pytest.skip(f"{lib.path} (version {lib.version_string()}) predates the 0.8 serving fields")
    return caps


def _run(cuda, *, lengths, causal, batch_idx=None, slots=None, leftpad=None, lens_q=None, seqlen_q=1,
         new=None, packed_new=False, page_size=None, window=(-1, -1), heads=(8, 2), head_dim=128, capacity=256,
         dtype=torch.bfloat16, seed=0, rotary_dim=None, interleaved=True, rotary_seqlens=None):
    """One call with these arguments, checked: the caches bit for bit (the rotated columns of appended keys within
    one ulp), then each sequence. new: rows appended per sequence (a list; (B, Sn) rows need them all equal). lens_q:
    packed queries of these lengths (else (B, seqlen_q)). rotary_dim: rotary tables of capacity + 8 rows and
    rotary_dim / 2 columns (FlashAttention-3's test draws its angles the same way)."""
    batch = len(lengths)
    slots = batch if slots is None else slots
    heads_q, heads_kv = heads
    gen = torch.Generator(device=cuda).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=cuda, dtype=dtype, generator=gen)

    q = randn(sum(lens_q), heads_q, head_dim) if lens_q is not None else randn(batch, seqlen_q, heads_q, head_dim)
    k, v = randn(slots, capacity, heads_kv, head_dim), randn(slots, capacity, heads_kv, head_dim)
    slot_of = list(range(batch)) if batch_idx is None else batch_idx
    used = [0] * slots  # rows a slot's sequence owns: its cache, then its appended rows
    for b, s in enumerate(slot_of):
        if 0 <= s < slots:
            used[s] = lengths[b]
            if leftpad is not None:  # the rows before the padding are never read
                k[s, :min(leftpad[b], lengths[b])] = math.nan
                v[s, :min(leftpad[b], lengths[b])] = math.nan
    for s in range(slots):
        k[s, used[s]:] = math.nan
        v[s, used[s]:] = math.nan
    table = None
    if page_size is not None:  # every page allocated (appends land in them); NaN past used[s]
        k, v, table = paginate(k, v, used, page_size, seed=seed, garbage_entries=False)
    k_new = v_new = None
    if new is not None:
        if packed_new:
            k_new, v_new = randn(sum(new), heads_kv, head_dim), randn(sum(new), heads_kv, head_dim)
        else:
            assert len(set(new)) == 1
            k_new, v_new = randn(batch, new[0], heads_kv, head_dim), randn(batch, new[0], heads_kv, head_dim)
    k_before, v_before = k.to("cpu", copy=True), v.to("cpu", copy=True)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=cuda)
    kwargs = dict(cache_seqlens=seqlens, causal=causal, return_softmax_lse=True, window_size=window)
    rotary = None
    if rotary_dim is not None:
        angle = torch.rand(capacity + 8, rotary_dim // 2, device=cuda, generator=gen, dtype=torch.float64) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        kwargs.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
        if rotary_seqlens is not None:
            kwargs["rotary_seqlens"] = torch.tensor(rotary_seqlens, dtype=torch.int32, device=cuda)
        rotary = (cos.cpu(), sin.cpu(), interleaved, rotary_seqlens)
    if table is not None:
        kwargs["page_table"] = table
    if batch_idx is not None:
        kwargs["cache_batch_idx"] = torch.tensor(batch_idx, dtype=torch.int32, device=cuda)
    if leftpad is not None:
        kwargs["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=cuda)
    if lens_q is not None:
        kwargs.update(cu_seqlens_q=cu_seqlens(lens_q, cuda), max_seqlen_q=max(lens_q))
    if k_new is not None:
        kwargs.update(k=k_new, v=v_new)
        if packed_new:
            kwargs["cu_seqlens_k_new"] = cu_seqlens(new, cuda)
    out, lse = flashcore.attention_with_kvcache(q, k, v, **kwargs)
    if out.is_cuda:
        torch.cuda.synchronize()
    assert seqlens.tolist() == lengths  # not advanced in place

    # The caches: exactly the appended rows changed, at cache_seqlens[b] of slot cache_batch_idx[b].
    _, _, k_after, v_after = expected_v08(
        q.cpu(), k_before, v_before, lengths, causal=causal, block_table=None if table is None else table.cpu(),
        batch_idx=batch_idx, leftpad=leftpad, lens_q=lens_q, k_new=None if k_new is None else k_new.cpu(),
        v_new=None if v_new is None else v_new.cpu(), lens_new=new if packed_new else None, rotary=rotary)
    if rotary is None:
        assert torch.equal(k.cpu().nan_to_num(7.0), k_after.nan_to_num(7.0)), "k_cache after the append"
    else:  # rotated once in fp32 (or wider) and rounded: within one ulp of the float64 rotation rounded
        got, want = k.cpu().double(), k_after.double()
        assert torch.equal(torch.isnan(got), torch.isnan(want)), "k_cache after the append (NaN rows)"
        finite = ~torch.isnan(want)
        diff = (got[finite] - want[finite]).abs()
        bound = 2.0 ** -7 * torch.maximum(got[finite].abs(), want[finite].abs()) + 1e-5
        assert (diff <= bound).all(), f"rotated keys: max error {diff.max().item():.3g} beyond one ulp"
        assert torch.equal(got[..., rotary_dim:].nan_to_num(7.0), want[..., rotary_dim:].nan_to_num(7.0))
    assert torch.equal(v.cpu().nan_to_num(7.0), v_after.nan_to_num(7.0)), "v_cache after the append"
    if new is not None and any(0 <= s < slots for s in slot_of):
        assert not torch.equal(k.cpu().nan_to_num(7.0), k_before.nan_to_num(7.0))  # something was appended

    # Each sequence against the float64 reference of its keys (read from the caches the call left).
    assert torch.isfinite(out).all(), "NaN from a cache row no sequence may read reached the output"
    start = 0
    for b in range(batch):
        n_q = lens_q[b] if lens_q is not None else seqlen_q
        out_b = out[start:start + n_q] if lens_q is not None else out[b]
        lse_b = lse[:, start:start + n_q] if lens_q is not None else lse[b]
        q_b = q[start:start + n_q] if lens_q is not None else q[b]
        start += n_q
        if n_q == 0:
            continue
        if rotary is not None:  # the queries the library attends with: rotated (rounded to q's dtype), q itself intact
            pos_q, _ = rotary_positions(lengths, rotary_seqlens, b, n_q, 0, causal or window != (-1, -1))
            q_b = rotate_fp64(q_b.cpu(), rotary[0], rotary[1], pos_q, interleaved).to(dtype).to(cuda)
        s = slot_of[b]
        if not 0 <= s < slots:
            assert (out_b == 0).all() and (lse_b == -math.inf).all(), f"sequence {b}: slot {s} is out of range"
            continue
        end = min(lengths[b] + (0 if new is None else new[b]), capacity if table is None else
                  table.shape[1] * page_size)
        left = 0 if leftpad is None else max(0, min(leftpad[b], end))
        rows = torch.arange(left, end)
        if table is None:
            kb, vb = k[s, left:end], v[s, left:end]
        else:
            pages = table[s].long().cpu()[rows // page_size].to(cuda)
            kb, vb = k[pages, (rows % page_size).to(cuda)], v[pages, (rows % page_size).to(cuda)]
        check(q_b[None], kb[None], vb[None], out_b[None], lse_b[None], causal=causal, window_size=window)


@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q", [1, 5])
def test_batch_idx(v08, cuda, page_size, causal, seqlen_q):
    """Six sequences over six slots (two unused, all NaN), one entry past the slots and one negative: those get
    0 / -inf."""
    _run(cuda, lengths=[37, 256, 0, 100, 200, 7], batch_idx=[4, 0, 9, 2, -1, 5], slots=6, causal=causal,
         seqlen_q=seqlen_q, page_size=page_size, seed=1)


@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("packed_new", [False, True])
def test_batch_idx_with_append(v08, cuda, page_size, packed_new):
    """Appends land in slot cache_batch_idx[b] at cache_seqlens[b]; the out-of-range entry appends nothing; the last
    sequence's rows past the capacity are dropped."""
    new = [3, 1, 4, 2] if packed_new else [3, 3, 3, 3]
    _run(cuda, lengths=[0, 60, 17, 254], batch_idx=[3, 1, 7, 0], slots=5, new=new, packed_new=packed_new,
         causal=True, seqlen_q=3, page_size=page_size, seed=2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("append", [None, "dense", "packed"])
def test_leftpad(v08, cuda, causal, append):
    """Keys [cache_leftpad[b], cache_seqlens[b] + new): NaN before the padding; a padding past the end gives no key."""
    new = {None: None, "dense": [2, 2, 2, 2], "packed": [2, 0, 5, 1]}[append]
    _run(cuda, lengths=[50, 200, 9, 31], leftpad=[10, 0, 9, 40], new=new, packed_new=append == "packed",
         causal=causal, seqlen_q=2, seed=3)


def test_leftpad_with_batch_idx_and_window(v08, cuda):
    """A sliding window counted from the padded start, slots picked by cache_batch_idx, GQA 16 / 2."""
    _run(cuda, lengths=[120, 64, 200], leftpad=[30, 0, 150], batch_idx=[2, 0, 1], slots=3, causal=True,
         window=(31, 0), seqlen_q=4, heads=(16, 2), new=[2, 2, 2], seed=4)


@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_queries(v08, cuda, page_size, causal):
    """q packed (total_q, Hq, D): out (total_q, Hq, Dv), lse (Hq, total_q) (FA3's varlen convention)."""
    _run(cuda, lengths=[100, 3, 256, 40], lens_q=[1, 3, 17, 0], causal=causal, page_size=page_size, seed=5)


@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_packed_queries_with_packed_append(v08, cuda, page_size, causal):
    """FA3's varlen kvcache call: packed q and packed k, v (cu_seqlens_k_new), slots by cache_batch_idx, GQA 8 / 2."""
    _run(cuda, lengths=[0, 90, 30, 200], lens_q=[4, 1, 6, 2], new=[4, 1, 6, 0], packed_new=True,
         batch_idx=[1, 3, 0, 2], slots=4, causal=causal, page_size=page_size, seed=6)


def test_packed_queries_with_dense_append_and_window(v08, cuda):
    _need(v08, torch.bfloat16, 64)
    _run(cuda, lengths=[64, 10, 180], lens_q=[2, 2, 1], new=[2, 2, 2], causal=False, window=(20, 5), seed=7,
         head_dim=64)


def test_mha_and_gqa(v08, cuda):
    """Query heads equal to KV heads, and MQA (one KV head), with slots and a packed append."""
    for heads in ((4, 4), (8, 1)):
        _run(cuda, lengths=[5, 128], batch_idx=[1, 0], new=[3, 2], packed_new=True, causal=True, seqlen_q=3,
             heads=heads, seed=8)


# ---------------------------------------------------------------------------------------------------------------
# The rotary embedding of an append.


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 128])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_rotary(v08, cuda, interleaved, rotary_dim, causal):
    """Dense cache, (B, 3) new rows, 3 queries per sequence, d = 128; the last sequence's rows past the capacity
    dropped."""
    _run(cuda, lengths=[0, 77, 200, 254], new=[3, 3, 3, 3], seqlen_q=3, causal=causal, rotary_dim=rotary_dim,
         interleaved=interleaved, seed=20)


def test_rotary_with_window_and_seqlens(v08, cuda):
    """A window without causal (queries at incremental positions, FlashAttention's "local"), positions from an
    explicit rotary_seqlens, GQA 16 / 2."""
    _run(cuda, lengths=[40, 120, 9], new=[2, 2, 2], seqlen_q=2, causal=False, window=(20, 3), heads=(16, 2),
         rotary_dim=64, interleaved=False, rotary_seqlens=[0, 130, 9], seed=21)
    _run(cuda, lengths=[40, 120, 9], new=[2, 2, 2], seqlen_q=4, causal=False, rotary_dim=32, interleaved=True,
         rotary_seqlens=[3, 0, 250], seed=22)  # not causal, no window: every query row at rotary_seqlens[b]


@pytest.mark.parametrize("page_size", [1, 4, 24])
def test_rotary_paged_with_batch_idx_and_packed_append(v08, cuda, page_size):
    """Pages of 1, 4 and 24 rows, slots by cache_batch_idx (one out of range: no append, O = 0), packed new rows
    (cu_seqlens_k_new) and packed queries."""
    _run(cuda, lengths=[5, 100, 0, 250], lens_q=[2, 1, 3, 2], new=[2, 1, 3, 0], packed_new=True,
         batch_idx=[2, 0, 7, 1], slots=3, causal=True, page_size=page_size, rotary_dim=32,
         interleaved=page_size != 4, seed=23)


@pytest.mark.parametrize("page_size", [1, 4, 24])
def test_any_page_size(v08, cuda, page_size):
    """Pages that are not multiples of 16 (0.8), dense appends and a plain call."""
    _run(cuda, lengths=[37, 200, 3], new=[2, 2, 2], seqlen_q=2, causal=True, page_size=page_size, seed=24)
    _run(cuda, lengths=[256, 1, 70], seqlen_q=1, causal=False, page_size=page_size, seed=25, batch_idx=[1, 2, 0])


# ---------------------------------------------------------------------------------------------------------------
# varlen_attention's seqused_q.


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_seqused_q(v08, cuda, causal):
    """Sequence b's first seqused_q[b] rows against its keys (causal alignment against seqused_q[b]), every other row
    0 with lse -inf (FlashCore zero-fills what the library leaves unwritten); a count past the length is clamped."""
    lens_q, lens_k, used = [5, 3, 40, 7, 1], [9, 40, 33, 0, 64], [2, 3, 17, 4, 9]
    gen = torch.Generator(device=cuda).manual_seed(30)
    q = torch.randn(sum(lens_q), 8, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(sum(lens_k), 2, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(sum(lens_k), 2, 128, device=cuda, dtype=torch.bfloat16, generator=gen)
    out, lse = flashcore.varlen_attention(q, k, v, cu_seqlens(lens_q, cuda), cu_seqlens(lens_k, cuda), max(lens_q),
                                          max(lens_k), causal=causal, return_lse=True,
                                          seqused_q=torch.tensor(used, dtype=torch.int32, device=cuda))
    sq = sk = 0
    for b in range(len(lens_q)):
        n = min(used[b], lens_q[b])
        rows, keys = slice(sq, sq + n), slice(sk, sk + lens_k[b])
        if n:
            if lens_k[b]:
                check(q[None, rows], k[None, keys], v[None, keys], out[None, rows], lse[None, :, rows], causal=causal)
            else:
                assert (out[rows] == 0).all() and (lse[:, rows] == -math.inf).all()
        assert (out[sq + n:sq + lens_q[b]] == 0).all(), f"sequence {b}: a row past seqused_q was written"
        assert (lse[:, sq + n:sq + lens_q[b]] == -math.inf).all()
        sq, sk = sq + lens_q[b], sk + lens_k[b]

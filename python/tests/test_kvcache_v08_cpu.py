"""flashcore.attention_with_kvcache with FlashAttention-3's serving arguments of 0.8 (cache_batch_idx, cache_leftpad,
cu_seqlens_q / max_seqlen_q, cu_seqlens_k_new), without a GPU: argument errors naming the argument, the C params
(through the host-only stub library, a 0.8 one and one playing 0.7), and the two serving ops (registration, fake
tensors, torch.compile, the in-place append) with the library call emulated on CPU. Also holds emulate_kvcache_v08
and expected_v08, the float64 model of the semantics (FlashAttention-3's test_flash_attn_kvcache reference) that
test_kvcache_v08_gpu.py imports."""

import ctypes
import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from reference import reference_of  # noqa: E402
from test_paged_cpu import paginate  # noqa: E402
from test_varlen_cpu import EmulatedCaps, cu_seqlens, emulate_serving_on_cpu, ref_sequence  # noqa: E402


# ---------------------------------------------------------------------------------------------------------------
# The semantics in float64 (host lists; FlashAttention-3's flash_attn_with_kvcache).


def rotate_fp64(x, cos, sin, positions, interleaved):
    """FlashAttention's rotary embedding (flash_attn.layers.rotary.apply_rotary_emb_torch) in float64: x (S, H, D),
    cos / sin (R, rotary_dim / 2), positions: S host ints, clamped to [0, R). The first rotary_dim columns of row s
    are rotated by the angle of position positions[s]: pairs (2i, 2i + 1) when interleaved (GPT-J), else (i, i +
    rotary_dim / 2) (GPT-NeoX); x' = x cos - y sin, y' = x sin + y cos. Returns float64 (S, H, D)."""
    out = x.double().clone()
    if x.shape[0] == 0:
        return out
    rows = cos.shape[0]
    pos = torch.tensor([min(max(int(p), 0), rows - 1) for p in positions], dtype=torch.long)
    c, s = cos.double()[pos][:, None, :], sin.double()[pos][:, None, :]
    rd = 2 * cos.shape[1]
    if interleaved:
        x1, x2 = out[..., 0:rd:2].clone(), out[..., 1:rd:2].clone()
        out[..., 0:rd:2], out[..., 1:rd:2] = x1 * c - x2 * s, x1 * s + x2 * c
    else:
        x1, x2 = out[..., :rd // 2].clone(), out[..., rd // 2:rd].clone()
        out[..., :rd // 2], out[..., rd // 2:rd] = x1 * c - x2 * s, x1 * s + x2 * c
    return out


def rotary_positions(seqlens, rotary_seqlens, b, rows_q, rows_new, incremental):
    """(query positions, new-key positions) of sequence b (host ints): FlashAttention's rule. The first new row is at
    rotary_seqlens[b] (None: seqlens[b], the cache's length); query row i at that + i when incremental (causal or a
    window), else every query row at that position."""
    start = seqlens[b] if rotary_seqlens is None else rotary_seqlens[b]
    return ([start + i if incremental else start for i in range(rows_q)], [start + t for t in range(rows_new)])


def expected_v08(q, k_cache, v_cache, seqlens, *, causal=False, scale=None, block_table=None, batch_idx=None,
                 leftpad=None, lens_q=None, k_new=None, v_new=None, lens_new=None, variants=None, rotary=None):
    """(out, lse, k_after, v_after): what a call must return and leave in the caches. q (B, Sq, Hq, D), or packed
    (total_q, Hq, D) with lens_q; k_new (B, Sn, Hkv, D), or packed (total_k_new, Hkv, D) with lens_new. seqlens,
    batch_idx, leftpad: host lists. out / lse have the op's shapes ((B, Sq, Hq, Dv) / (B, Hq, Sq), or (total_q, Hq,
    Dv) / (Hq, total_q)), float64. rotary: (cos, sin, interleaved, rotary_seqlens host list or None) with k_new: the
    new keys are rotated in float64 and rounded once to the cache's dtype as they are written, the queries rotated and
    rounded to q's dtype before the attention (rotary_positions)."""
    k_after, v_after = k_cache.clone(), v_cache.clone()
    batch = len(seqlens)
    slots = block_table.shape[0] if block_table is not None else k_cache.shape[0]
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    packed_q = lens_q is not None
    starts_q = [sum(lens_q[:b]) for b in range(batch)] if packed_q else None
    starts_new = [sum(lens_new[:b]) for b in range(batch)] if lens_new is not None else None
    heads_q, dv = q.shape[-2], v_cache.shape[-1]
    rows_q = q.shape[0] if packed_q else q.shape[1]
    out = torch.full((rows_q, heads_q, dv) if packed_q else (batch, rows_q, heads_q, dv), math.nan,
                     dtype=torch.float64)
    lse = torch.full((heads_q, rows_q) if packed_q else (batch, heads_q, rows_q), math.nan, dtype=torch.float64)

    def locate(slot, pos):  # (tensor index of cache row pos of slot)
        if block_table is None:
            return slot, pos
        return int(block_table[slot, pos // k_cache.shape[1]]), pos % k_cache.shape[1]

    for b in range(batch):
        slot = b if batch_idx is None else batch_idx[b]
        if k_new is None:
            new_k = new_v = None
        elif lens_new is not None:
            new_k = k_new[starts_new[b]:starts_new[b] + lens_new[b]]
            new_v = v_new[starts_new[b]:starts_new[b] + lens_new[b]]
        else:
            new_k, new_v = k_new[b], v_new[b]
        n_new = 0 if new_k is None else new_k.shape[0]
        qb = q[starts_q[b]:starts_q[b] + lens_q[b]] if packed_q else q[b]
        if rotary is not None and new_k is not None:
            cos, sin, interleaved, rotary_seqlens = rotary
            local = variants is not None and (variants.window_size_left != -1 or variants.window_size_right != -1)
            pos_q, pos_new = rotary_positions(seqlens, rotary_seqlens, b, qb.shape[0], n_new, causal or local)
            qb = rotate_fp64(qb, cos, sin, pos_q, interleaved).to(q.dtype)
            new_k = rotate_fp64(new_k, cos, sin, pos_new, interleaved).to(k_cache.dtype)
        valid = 0 <= slot < slots
        end = min(seqlens[b] + n_new, capacity)
        if valid:
            for i in range(end - seqlens[b]):
                idx = locate(slot, seqlens[b] + i)
                k_after[idx], v_after[idx] = new_k[i], new_v[i]
            left = 0 if leftpad is None else max(0, min(leftpad[b], end))
            keys = [locate(slot, j) for j in range(left, end)]
            kb = torch.stack([k_after[i] for i in keys]) if keys else k_cache.new_zeros((0,) + k_cache.shape[2:])
            vb = torch.stack([v_after[i] for i in keys]) if keys else v_cache.new_zeros((0,) + v_cache.shape[2:])
            if variants is None:
                o, l = ref_sequence(qb, kb, vb, causal, scale)
            else:
                o, l = reference_of(qb[None], kb[None], vb[None], causal, scale, variants)
                o, l = o[0], l[0]
        else:
            o = torch.zeros(qb.shape[:2] + (dv,), dtype=torch.float64)
            l = torch.full((heads_q, qb.shape[0]), -math.inf, dtype=torch.float64)
        if packed_q:
            out[starts_q[b]:starts_q[b] + lens_q[b]], lse[:, starts_q[b]:starts_q[b] + lens_q[b]] = o, l
        else:
            out[b], lse[b] = o, l
    return out, lse, k_after, v_after


class EmulatedCapsV08(EmulatedCaps):
    @staticmethod
    def has_kvcache_serving():
        return True


def emulate_kvcache_v08(monkeypatch, calls=None):
    """Run the serving ops on CPU tensors: expected_v08 in place of the library call (its append written into the
    caches in place, as the library writes it). `calls` receives the keyword arguments of each emulated launch."""
    emulate_serving_on_cpu(monkeypatch)
    check = _ops._check_supported

    def check_supported(q, head_dim, head_dim_v=None):
        check(q, head_dim, head_dim_v)
        return EmulatedCapsV08

    def launch(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k, *, block_table=None,
               num_splits=0, variants=None, cache_batch_idx=None, cache_leftpad=None, cu_seqlens_q=None,
               max_seqlen_q=0, k_new=None, v_new=None, cu_seqlens_k_new=None, rotary=None):
        if calls is not None:
            calls.append(dict(block_table=block_table, num_splits=num_splits, variants=variants,
                              cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q,
                              max_seqlen_q=max_seqlen_q, k_new=k_new, cu_seqlens_k_new=cu_seqlens_k_new,
                              rotary=rotary))
        lens = lambda cu: [b - a for a, b in zip(cu.tolist(), cu.tolist()[1:])]  # noqa: E731
        o, l, k_after, v_after = expected_v08(
            q, k_cache, v_cache, seqused_k.tolist(), causal=causal, scale=softmax_scale or None,
            block_table=block_table, batch_idx=None if cache_batch_idx is None else cache_batch_idx.tolist(),
            leftpad=None if cache_leftpad is None else cache_leftpad.tolist(),
            lens_q=None if cu_seqlens_q is None else lens(cu_seqlens_q), k_new=k_new, v_new=v_new,
            lens_new=None if cu_seqlens_k_new is None else lens(cu_seqlens_k_new), variants=variants,
            rotary=None if rotary is None else (rotary.cos, rotary.sin, rotary.interleaved,
                                                None if rotary.seqlens is None else rotary.seqlens.tolist()))
        k_cache.copy_(k_after)
        v_cache.copy_(v_after)
        out.copy_(o.to(out.dtype))
        if lse.numel():
            lse.copy_(l.float())

    monkeypatch.setattr(_ops, "_check_supported", check_supported)
    monkeypatch.setattr(_ops, "_launch_kvcache_serving", launch)


@pytest.fixture
def emulated(monkeypatch):
    calls = []
    emulate_kvcache_v08(monkeypatch, calls)
    return calls


def _tensors(batch=3, slots=5, capacity=64, seqlen_q=2, heads_q=8, heads_kv=2, head_dim=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen).bfloat16()
    k = torch.randn(slots, capacity, heads_kv, head_dim, generator=gen).bfloat16()
    v = torch.randn(slots, capacity, heads_kv, head_dim, generator=gen).bfloat16()
    return q, k, v


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


# ---------------------------------------------------------------------------------------------------------------
# Argument errors: raised before anything is launched or appended, naming the argument.


def _base():
    q, k, v = _tensors()
    return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": _i32([3, 0, 40]), "cache_batch_idx": _i32([4, 0, 2])}


def _packed_q(a):
    return {**a, "q": a["q"].reshape(6, 8, 64), "cu_seqlens_q": _i32([0, 2, 3, 6])}


def _append(a, rows=2):
    return {**a, "k": torch.zeros(3, rows, 2, 64, dtype=torch.bfloat16),
            "v": torch.zeros(3, rows, 2, 64, dtype=torch.bfloat16)}


def _packed_append(a, total=5):
    return {**a, "k": torch.zeros(total, 2, 64, dtype=torch.bfloat16), "v": torch.zeros(total, 2, 64, dtype=torch.bfloat16),
            "cu_seqlens_k_new": _i32([0, 1, 1, total])}


def _misaligned(t):
    """t's values at an address 2 bytes past a 16-byte boundary (a copy of it would take the append)."""
    flat = torch.zeros(t.numel() + 1, dtype=t.dtype)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


def _paged(a, rows=5):
    k, v = a["k_cache"], a["v_cache"]
    kp, vp, table = paginate(k[:rows], v[:rows], [64] * rows, 16, garbage_entries=False)
    return {**a, "k_cache": kp, "v_cache": vp, "block_table": table}


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "cache_batch_idx": a["cache_batch_idx"].long()}, ValueError,
         r"cache_batch_idx must be an int32 tensor of shape \(batch,\) = \(3,\)"),
        (lambda a: {**a, "cache_batch_idx": a["cache_batch_idx"][:2]}, ValueError,
         r"cache_batch_idx must be an int32 tensor of shape \(batch,\) = \(3,\), got torch.int32 \(2,\)"),
        (lambda a: {**a, "cache_batch_idx": [4, 0, 2]}, TypeError, "cache_batch_idx must be a torch.Tensor"),
        (lambda a: {**a, "cache_batch_idx": None, "cache_leftpad": _i32([0, 0, 0])}, ValueError,
         r"k_cache/v_cache must have q's batch size \(3\)"),
        (lambda a: {**a, "k_cache": a["k_cache"][:0], "v_cache": a["v_cache"][:0]}, ValueError,
         "cache_batch_idx picks among k_cache's slots, but k_cache has none"),
        (lambda a: {**a, "cache_leftpad": _i32([0, 0])}, ValueError,
         r"cache_leftpad must be an int32 tensor of shape \(batch,\) = \(3,\)"),
        (lambda a: {**_paged(a), "cache_leftpad": _i32([0, 0, 0])}, ValueError,
         "cache_leftpad takes a dense cache only: FlashCore's paged caches .* take no left padding"),
        (lambda a: {**_paged(a, rows=5), "cache_batch_idx": None, "cache_leftpad": None,
                    "cu_seqlens_q": _i32([0, 1, 2, 2]), "q": a["q"].reshape(6, 8, 64)}, ValueError,
         r"block_table must be an int32 tensor of shape \(batch, max_pages_per_sequence\) = \(3, \*\)"),
        (lambda a: {**_paged(a), "block_table": _paged(a)["block_table"][:0]}, ValueError,
         r"block_table must be an int32 tensor of shape \(cache slots >= 1"),
        (lambda a: {**a, "cu_seqlens_q": _i32([0, 2, 3, 6])}, ValueError,
         r"with cu_seqlens_q, q must be 3-D \(total_q, num_heads, head_dim\)"),
        (lambda a: {**_packed_q(a), "cu_seqlens_q": _i32([0, 6])}, ValueError,
         r"cache_seqlens must be an int32 tensor of shape \(batch,\) = \(1,\)"),
        (lambda a: {**_packed_q(a), "cu_seqlens_q": _i32([0, 2, 3, 6]).long()}, ValueError,
         "cu_seqlens_q must be an int32 tensor of shape"),
        (lambda a: {**_packed_q(a), "max_seqlen_q": -1}, ValueError, "max_seqlen_q must be >= 0"),
        (lambda a: {**_packed_q(a), "max_seqlen_q": _i32([3])}, TypeError, "max_seqlen_q must be a Python int"),
        (lambda a: {**a, "max_seqlen_q": 3}, ValueError, "max_seqlen_q is given without cu_seqlens_q"),
        (lambda a: {**a, "q": a["q"].reshape(6, 8, 64)}, ValueError, "packed 3-D rows need cu_seqlens_q"),
        (lambda a: {**a, "cu_seqlens_k_new": _i32([0, 1, 1, 2])}, ValueError,
         "cu_seqlens_k_new describes packed k and v to append: pass k and v with it"),
        (lambda a: {**_packed_append(a), "cu_seqlens_k_new": _i32([0, 1, 5])}, ValueError,
         r"cu_seqlens_k_new must be an int32 tensor of shape \(batch \+ 1,\) = \(4,\)"),
        (lambda a: {**_packed_append(a), "cu_seqlens_k_new": None}, ValueError,
         r"k must be \(B, Sq_new, Hkv, k_cache's head dim\) = \(3, \*, 2, 64\) \(3-D packed rows need "
         r"cu_seqlens_k_new\)"),
        (lambda a: {**_append(a), "cu_seqlens_k_new": _i32([0, 1, 1, 2])}, ValueError,
         r"k must be packed \(total_k_new, Hkv, k_cache's head dim\) = \(\*, 2, 64\) with cu_seqlens_k_new"),
        (lambda a: {**_packed_append(a), "v": torch.zeros(4, 2, 64, dtype=torch.bfloat16)}, ValueError,
         "k and v must append as many rows"),
        (lambda a: {**_packed_append(a), "v": torch.zeros(5, 2, 32, dtype=torch.bfloat16)}, ValueError,
         r"v must be packed \(total_k_new, Hkv, v_cache's head dim\) = \(\*, 2, 64\)"),
        (lambda a: {**_append(a), "v": None}, ValueError, "pass both k and v"),
        (lambda a: {**_append(a), "k_cache": _misaligned(a["k_cache"])}, ValueError,
         "k_cache is appended to in place, so the kernel must take it as it is"),
    ],
    ids=["idx-int64", "idx-short", "idx-list", "leftpad-batch-mismatch", "idx-no-slots", "leftpad-short",
         "leftpad-paged", "table-rows-varlen", "table-no-rows", "cu-q-with-4d-q", "seqlens-vs-cu-q", "cu-q-int64",
         "max-q-negative", "max-q-tensor", "max-q-alone", "3d-q-alone", "cu-new-without-k", "cu-new-short",
         "packed-k-without-cu", "dense-k-with-cu", "packed-rows", "packed-v-dim", "k-without-v", "cache-misaligned"],
)
def test_argument_errors(emulated, mutate, exc, match):
    args = mutate(_base())
    before = args["k_cache"].clone()
    with pytest.raises(exc, match=match):
        flashcore.attention_with_kvcache(**args)
    assert not emulated  # nothing was launched
    assert torch.equal(args["k_cache"].nan_to_num(7.0), before.nan_to_num(7.0))  # nor appended


def test_cpu_tensors_are_rejected():
    args = _base()
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        flashcore.attention_with_kvcache(**args)


# ---------------------------------------------------------------------------------------------------------------
# The front end and the ops, the library call emulated.


def _check(got_out, got_lse, want_out, want_lse):
    torch.testing.assert_close(got_out.double(), want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_batch_idx_reaches_the_launch(emulated, paged, causal):
    """cache_batch_idx goes to the launch as is (an out-of-range entry included), the paged table with all its
    rows; the result is slot cache_batch_idx[b]'s attention, and the out-of-range sequence gets 0 / -inf."""
    q, k, v = _tensors(seed=1)
    lengths, idx = [3, 64, 40], [4, 7, 1]
    args = {"k_cache": k, "v_cache": v}
    if paged:
        kp, vp, table = paginate(k, v, [64] * 5, 16, garbage_entries=False)
        args = {"k_cache": kp, "v_cache": vp, "block_table": table}
    out, lse = flashcore.attention_with_kvcache(q, **args, cache_seqlens=_i32(lengths), cache_batch_idx=_i32(idx),
                                                causal=causal, return_softmax_lse=True)
    assert emulated[0]["cache_batch_idx"].tolist() == idx
    assert (emulated[0]["block_table"] is not None) == paged and emulated[0]["k_new"] is None
    for b in (0, 2):
        ref_out, ref_lse = ref_sequence(q[b], k[idx[b], :lengths[b]], v[idx[b], :lengths[b]], causal)
        _check(out[b], lse[b], ref_out, ref_lse)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isneginf(lse[1]).all()


def test_leftpad_is_the_first_key(emulated):
    q, k, v = _tensors(batch=3, slots=3, seed=2)
    lengths, pad = [10, 64, 5], [4, 60, 9]  # the last one past its end: no key
    out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32(lengths), cache_leftpad=_i32(pad),
                                                causal=True, return_softmax_lse=True)
    for b in range(2):
        ref_out, ref_lse = ref_sequence(q[b], k[b, pad[b]:lengths[b]], v[b, pad[b]:lengths[b]], True)
        _check(out[b], lse[b], ref_out, ref_lse)
    assert torch.equal(out[2], torch.zeros_like(out[2])) and torch.isneginf(lse[2]).all()
    assert emulated[0]["cache_leftpad"].tolist() == pad


@pytest.mark.parametrize("paged", [False, True])
def test_packed_queries(emulated, paged):
    """q packed (total_q, Hq, D): out (total_q, Hq, Dv), lse (Hq, total_q); max_seqlen_q defaults to total_q."""
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=4, seed=3)
    lens_q, lengths = [1, 4, 2], [17, 64, 30]
    qp = torch.cat([q[b, :n] for b, n in enumerate(lens_q)])
    args = {"k_cache": k, "v_cache": v}
    if paged:
        kp, vp, table = paginate(k, v, lengths, 16)
        args = {"k_cache": kp, "v_cache": vp, "block_table": table}
    out, lse = flashcore.attention_with_kvcache(qp, **args, cache_seqlens=_i32(lengths), cu_seqlens_q=cu_seqlens(lens_q),
                                                causal=True, return_softmax_lse=True)
    assert out.shape == (7, 8, 64) and lse.shape == (8, 7) and emulated[0]["max_seqlen_q"] == 7
    start = 0
    for b, n in enumerate(lens_q):
        ref_out, ref_lse = ref_sequence(q[b, :n], k[b, :lengths[b]], v[b, :lengths[b]], True)
        _check(out[start:start + n], lse[:, start:start + n], ref_out, ref_lse)
        start += n
    flashcore.attention_with_kvcache(qp, **args, cache_seqlens=_i32(lengths), cu_seqlens_q=cu_seqlens(lens_q),
                                     max_seqlen_q=4)
    assert emulated[1]["max_seqlen_q"] == 4


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("paged", [False, True])
def test_append_goes_to_the_library(emulated, packed, paged):
    """With a 0.8 argument, k and v reach the library call (not the in-place torch append): packed with
    cu_seqlens_k_new, or (B, Sn, ...); the caches hold them at cache_seqlens[b] of slot cache_batch_idx[b] after the
    call, nothing else changed, and cache_seqlens is left as given."""
    q, k, v = _tensors(batch=3, slots=4, seqlen_q=3, seed=4)
    lengths, idx = [0, 30, 61], [2, 0, 3]
    gen = torch.Generator().manual_seed(9)
    lens_new = [3, 1, 3] if packed else [3, 3, 3]
    k_new = torch.randn(sum(lens_new), 2, 64, generator=gen).bfloat16()
    v_new = torch.randn(sum(lens_new), 2, 64, generator=gen).bfloat16()
    if not packed:
        k_new, v_new = k_new.reshape(3, 3, 2, 64), v_new.reshape(3, 3, 2, 64)
    if paged:
        kc, vc, table = paginate(k, v, [64] * 4, 16, garbage_entries=False)
        args = {"k_cache": kc, "v_cache": vc, "block_table": table}
    else:
        kc, vc, table = k.clone(), v.clone(), None
        args = {"k_cache": kc, "v_cache": vc}
    want_out, want_lse, want_k, want_v = expected_v08(
        q, kc, vc, lengths, causal=True, block_table=table, batch_idx=idx, k_new=k_new, v_new=v_new,
        lens_new=lens_new if packed else None)
    seqlens = _i32(lengths)
    out, lse = flashcore.attention_with_kvcache(
        q, **args, k=k_new, v=v_new, cache_seqlens=seqlens, cache_batch_idx=_i32(idx), causal=True,
        cu_seqlens_k_new=cu_seqlens(lens_new) if packed else None, return_softmax_lse=True)
    assert seqlens.tolist() == lengths
    assert emulated[0]["k_new"] is not None and (emulated[0]["cu_seqlens_k_new"] is not None) == packed
    assert torch.equal(kc.nan_to_num(7.0), want_k.nan_to_num(7.0)) and torch.equal(vc.nan_to_num(7.0),
                                                                                    want_v.nan_to_num(7.0))
    # Row 61 + 3 > 64: the last new row of sequence 2 is dropped (the capacity), the others landed.
    slot_rows = (lambda s, j: (int(table[s, j // 16]), j % 16)) if paged else (lambda s, j: (s, j))
    assert torch.equal(kc[slot_rows(3, 62)], (k_new[2, 1] if not packed else k_new[5]))
    _check(out, lse, want_out, want_lse)


def test_without_serving_arguments_the_plain_path_runs(emulated, monkeypatch):
    """A call without the 0.8 arguments is the 0.7 call (flashcore::attention_kvcache_fwd, the torch append)."""
    launched = []
    monkeypatch.setattr(_ops, "_launch", lambda *a, **kw: launched.append(kw))
    q, k, v = _tensors(batch=3, slots=3)
    flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32([1, 2, 3]))
    assert len(launched) == 1 and not emulated


def test_serving_refused_by_an_older_library(emulated, monkeypatch):
    """A library without the 0.8 fields: RuntimeError naming the argument before anything runs or is appended;
    packed queries alone (cu_seqlens_q on a cache, which 0.7 already took) still run."""

    class Caps07(EmulatedCaps):
        version_string = staticmethod(lambda: "0.7.0")

        @staticmethod
        def has_kvcache_serving():
            return False

    monkeypatch.setattr(_ops, "_check_supported", lambda q, d, dv=None: Caps07)
    q, k, v = _tensors(batch=3, slots=3)
    before = k.clone()
    for kwargs, name in ((dict(cache_batch_idx=_i32([0, 1, 2])), "cache_batch_idx"),
                         (dict(cache_leftpad=_i32([0, 1, 2])), "cache_leftpad"),
                         (dict(k=torch.zeros(2, 2, 64).bfloat16(), v=torch.zeros(2, 2, 64).bfloat16(),
                               cu_seqlens_k_new=_i32([0, 1, 1, 2])), "cu_seqlens_k_new")):
        with pytest.raises(RuntimeError, match=f"{name} is set, but .*version 0.7.0.*a 0.8 library or newer"):
            flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32([1, 2, 3]), **kwargs)
    assert not emulated and torch.equal(k, before)
    flashcore.attention_with_kvcache(q.reshape(6, 8, 64), k, v, cache_seqlens=_i32([1, 2, 3]),
                                     cu_seqlens_q=_i32([0, 2, 4, 6]))
    assert len(emulated) == 1


def test_custom_op_registration(emulated):
    q, k, v = _tensors(batch=3, slots=4, seqlen_q=2, seed=5)
    seqlens, idx = _i32([3, 60, 20]), _i32([1, 3, 9])
    qp, cu_q = q.reshape(6, 8, 64), _i32([0, 1, 4, 6])
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    torch.library.opcheck(torch.ops.flashcore.attention_kvcache_serving_fwd.default,
                          (qp, k, v, seqlens, True, 0.0, True), dict(cache_batch_idx=idx, cu_seqlens_q=cu_q,
                                                                      max_seqlen_q=3), test_utils=utils)
    torch.library.opcheck(torch.ops.flashcore.attention_kvcache_serving_fwd.default,
                          (q, k[:3], v[:3], seqlens, False, 0.0, False), dict(cache_leftpad=_i32([1, 2, 3])),
                          test_utils=utils)
    k_new, v_new = torch.randn(5, 2, 64).bfloat16(), torch.randn(5, 2, 64).bfloat16()
    torch.library.opcheck(torch.ops.flashcore.attention_kvcache_serving_append_fwd.default,
                          (qp, k.clone(), v.clone(), seqlens, k_new, v_new, True, 0.0, True),
                          dict(cache_batch_idx=idx, cu_seqlens_q=cu_q, max_seqlen_q=3,
                               cu_seqlens_k_new=_i32([0, 2, 2, 5])), test_utils=utils)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_with_packed_append(emulated, backend):
    torch._dynamo.reset()
    q, k, v = _tensors(batch=3, slots=4, seqlen_q=2, seed=6)
    qp, cu_q, cu_new = q.reshape(6, 8, 64), _i32([0, 1, 4, 6]), _i32([0, 2, 2, 5])
    k_new, v_new = torch.randn(5, 2, 64).bfloat16(), torch.randn(5, 2, 64).bfloat16()
    seqlens, idx = _i32([3, 60, 20]), _i32([1, 3, 0])

    def fn(q, kc, vc, k_new, v_new, seqlens, idx, cu_q, cu_new):
        return flashcore.attention_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True,
                                                cache_batch_idx=idx, cu_seqlens_q=cu_q, max_seqlen_q=3,
                                                cu_seqlens_k_new=cu_new, return_softmax_lse=True)

    kc, vc = k.clone(), v.clone()
    want = fn(qp, kc, vc, k_new, v_new, seqlens, idx, cu_q, cu_new)
    kc2, vc2 = k.clone(), v.clone()
    got = torch.compile(fn, fullgraph=True, backend=backend)(qp, kc2, vc2, k_new, v_new, seqlens, idx, cu_q, cu_new)
    torch.testing.assert_close(got, want)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc) and not torch.equal(kc, k)  # the append, in place


# ---------------------------------------------------------------------------------------------------------------
# The C params (stub library).


def test_serving_params_reach_c(use_library, stub_library):
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _tensors(batch=3, slots=5, seqlen_q=2)
    qp, cu_q = q.reshape(6, 8, 64), _i32([0, 1, 4, 6])
    kp, vp, table = paginate(k, v, [64] * 5, 16, spare_pages=1, garbage_entries=False)
    lens, idx, cu_new = _i32([3, 60, 20]), _i32([4, 0, 2]), _i32([0, 2, 2, 5])
    k_new, v_new = torch.randn(5, 2, 64).bfloat16(), torch.randn(5, 2, 64).bfloat16()
    out, lse = torch.empty(6, 8, 64).bfloat16(), torch.empty(8, 6)
    params = _ops.kernel_params(lib, qp, kp, vp, out, lse, True, 0.0, lens, block_table=table, cu_seqlens_q=cu_q,
                                max_seqlen_q=3, k_new=k_new, v_new=v_new, cu_seqlens_k_new=cu_new, kv_batch_idx=idx)
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.batch, seen.seqlen_q, seen.seqlen_k, seen.total_q, seen.cu_seqlens_q) == (
        3, 3, 4 * 16, 6, cu_q.data_ptr())
    assert (seen.kv_batch_idx, seen.kv_batch_size, seen.leftpad_k) == (idx.data_ptr(), 5, None)
    assert (seen.k_new, seen.v_new, seen.seqlen_new, seen.cu_seqlens_k_new, seen.total_k_new) == (
        k_new.data_ptr(), v_new.data_ptr(), 0, cu_new.data_ptr(), 5)
    assert (seen.k_new_strides.seq, seen.k_new_strides.head, seen.k_new_strides.dim) == (2 * 64, 64, 1)
    assert (seen.block_table, seen.num_pages, seen.page_size, seen.seqused_k) == (
        table.data_ptr(), 5 * 4 + 1, 16, lens.data_ptr())
    assert seen.lse_capacity == 48
    # Dense, leftpad and (B, Sn) rows: kv_batch_size is the cache's batch.
    pad = _i32([0, 1, 2])
    dense_new = torch.randn(3, 2, 2, 64).bfloat16()
    params = _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, False, 0.0, lens,
                                k_new=dense_new, v_new=dense_new, kv_batch_idx=idx, leftpad_k=pad)
    assert (params.kv_batch_size, params.leftpad_k, params.seqlen_new, params.cu_seqlens_k_new, params.total_k_new) == (
        5, pad.data_ptr(), 2, None, 0)
    assert (params.k_new_strides.batch, params.k_new_strides.seq) == (2 * 2 * 64, 2 * 64)


def test_a_07_library_runs_without_the_new_fields(use_library, stub_builder, tmp_path_factory):
    """The stub playing 0.7: kernel_params without the 0.8 arguments (cu_seqlens_q on a cache and a dense k_new
    included) fill its 696 bytes; each 0.8 argument is RuntimeError naming it."""
    use_library(stub_builder(tmp_path_factory.mktemp("stub_v7_ops"), "libflashcore_v7.so",
                             "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V7_SIZE"))
    lib = _lib.load()
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2)
    qp, cu_q, lens = q.reshape(6, 8, 64), _i32([0, 1, 4, 6]), _i32([3, 60, 20])
    dense_new = torch.randn(3, 2, 2, 64).bfloat16()
    out = torch.empty(6, 8, 64).bfloat16()
    params = _ops.kernel_params(lib, qp, k, v, out, None, True, 0.0, lens, cu_seqlens_q=cu_q, max_seqlen_q=3,
                                k_new=dense_new, v_new=dense_new)
    lib.forward(params, 0)
    assert params.struct_size == _lib.ATTENTION_PARAMS_V7_SIZE and params.seqlen_new == 2
    for kwargs, name in ((dict(kv_batch_idx=_i32([0, 1, 2])), "cache_batch_idx"),
                         (dict(leftpad_k=_i32([0, 1, 2])), "cache_leftpad"),
                         (dict(k_new=dense_new[0], v_new=dense_new[0], cu_seqlens_k_new=_i32([0, 1, 1, 2])),
                          "cu_seqlens_k_new")):
        call = dict(cu_seqlens_q=cu_q, max_seqlen_q=3, k_new=dense_new, v_new=dense_new)
        call.update(kwargs)
        with pytest.raises(RuntimeError, match=f"{name} .* is set, but .*696-byte .*a 0.8 library or newer"):
            _ops.kernel_params(lib, qp, k, v, out, None, True, 0.0, lens, **call)


# ---------------------------------------------------------------------------------------------------------------
# The rotary embedding of an append (rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens; since 0.8).


def _fa_apply_rotary_emb_torch(x, cos, sin, interleaved):
    """flash_attn.layers.rotary.apply_rotary_emb_torch, written independently of rotate_fp64 (rotate_half form):
    x (S, H, D), cos / sin (S, rotary_dim / 2) already gathered at the rows' positions."""
    ro_dim = cos.shape[-1] * 2
    if interleaved:
        c = cos.repeat_interleave(2, dim=-1)[:, None, :]
        s = sin.repeat_interleave(2, dim=-1)[:, None, :]
        x1, x2 = x[..., :ro_dim:2], x[..., 1:ro_dim:2]
        half = torch.stack((-x2, x1), dim=-1).flatten(-2)
    else:
        c, s = torch.cat((cos, cos), dim=-1)[:, None, :], torch.cat((sin, sin), dim=-1)[:, None, :]
        x1, x2 = x[..., :ro_dim].chunk(2, dim=-1)
        half = torch.cat((-x2, x1), dim=-1)
    return torch.cat([x[..., :ro_dim] * c + half * s, x[..., ro_dim:]], dim=-1)


def _tables(rows=128, rotary_dim=32, dtype=torch.bfloat16, seed=11):
    gen = torch.Generator().manual_seed(seed)
    angle = torch.rand(rows, rotary_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 64])
def test_rotate_fp64_is_flash_attentions_rotation(interleaved, rotary_dim):
    """The reference rotation against FlashAttention's own formula (rotate_half), positions clamped to the table."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 64, generator=gen, dtype=torch.float64)
    cos, sin = _tables(rows=8, rotary_dim=rotary_dim, dtype=torch.float64)
    positions = [0, 3, 7, 9, -2]  # the last two clamped to 7 and 0
    clamped = torch.tensor([0, 3, 7, 7, 0])
    got = rotate_fp64(x, cos, sin, positions, interleaved)
    want = _fa_apply_rotary_emb_torch(x, cos[clamped], sin[clamped], interleaved)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])
    assert rotary_positions([10, 20], None, 1, 3, 2, True) == ([20, 21, 22], [20, 21])
    assert rotary_positions([10, 20], [5, 7], 1, 3, 2, False) == ([7, 7, 7], [7, 8])


def _rotary_base(head_dim=64):
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2, head_dim=head_dim)
    cos, sin = _tables(rotary_dim=32)
    return {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": _i32([3, 0, 40]),
            "k": torch.zeros(3, 2, 2, head_dim, dtype=torch.bfloat16),
            "v": torch.zeros(3, 2, 2, head_dim, dtype=torch.bfloat16), "rotary_cos": cos, "rotary_sin": sin}


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: {**a, "rotary_sin": None}, ValueError,
         r"pass both rotary_cos and rotary_sin, or neither \(rotary_sin is missing\)"),
        (lambda a: {**a, "rotary_cos": None}, ValueError, r"\(rotary_cos is missing\)"),
        (lambda a: {**a, "k": None, "v": None}, ValueError,
         "rotary_cos / rotary_sin rotate the appended keys .* pass k and v"),
        (lambda a: {**a, "rotary_cos": a["rotary_cos"][None]}, ValueError,
         r"rotary_cos must be 2-D \(rotary_seqlen, rotary_dim / 2\)"),
        (lambda a: {**a, "rotary_sin": a["rotary_sin"].half()}, TypeError,
         "rotary_sin must have q's dtype torch.bfloat16, got torch.float16"),
        (lambda a: {**a, "rotary_cos": a["rotary_cos"].float(), "rotary_sin": a["rotary_sin"].float()}, TypeError,
         "rotary_cos must have q's dtype"),
        (lambda a: {**a, "rotary_sin": a["rotary_sin"][:, :8]}, ValueError,
         "rotary_cos and rotary_sin must have the same shape"),
        (lambda a: {**a, "rotary_cos": a["rotary_cos"][:, :4], "rotary_sin": a["rotary_sin"][:, :4]}, ValueError,
         r"rotary_dim = 2 \* rotary_cos.shape\[1\] = 8 must be a positive multiple of 16 and at most q's head dim "
         r"\(64\)"),
        (lambda a: {**a, "rotary_cos": torch.zeros(8, 40, dtype=torch.bfloat16),
                    "rotary_sin": torch.zeros(8, 40, dtype=torch.bfloat16)}, ValueError,
         r"rotary_dim = 2 \* rotary_cos.shape\[1\] = 80 must be"),
        (lambda a: {**a, "rotary_cos": a["rotary_cos"][:0], "rotary_sin": a["rotary_sin"][:0]}, ValueError,
         r"rotary_cos and rotary_sin have no row \(position\)"),
        (lambda a: {**a, "rotary_seqlens": _i32([1, 2])}, ValueError,
         r"rotary_seqlens must be an int32 tensor of shape \(batch,\) = \(3,\)"),
        (lambda a: {**a, "rotary_seqlens": _i32([1, 2, 3]).long()}, ValueError, "rotary_seqlens must be an int32"),
        (lambda a: {**a, "rotary_cos": None, "rotary_sin": None, "rotary_seqlens": _i32([1, 2, 3])}, ValueError,
         "rotary_seqlens is given without rotary_cos / rotary_sin"),
        (lambda a: {**a, "rotary_interleaved": 2}, ValueError, r"rotary_interleaved must be a bool \(or 0 / 1\)"),
        (lambda a: {**a, "rotary_interleaved": "yes"}, TypeError, "rotary_interleaved must be a bool"),
        (lambda a: {**a, "k": a["k"][:, :0], "v": a["v"][:, :0]}, ValueError,
         "rotary_cos / rotary_sin with k and v of no row"),
        (lambda a: {**a, "rotary_cos": [[1.0] * 16], "rotary_sin": [[0.0] * 16]}, TypeError,
         "rotary_cos must be a torch.Tensor"),
    ],
    ids=["sin-missing", "cos-missing", "no-append", "cos-3d", "sin-fp16", "tables-fp32", "shapes-differ",
         "rotary-dim-8", "rotary-dim-80", "no-rows", "seqlens-short", "seqlens-int64", "seqlens-alone",
         "interleaved-2", "interleaved-str", "empty-append", "cos-list"],
)
def test_rotary_argument_errors(emulated, mutate, exc, match):
    args = mutate(_rotary_base())
    before = args["k_cache"].clone()
    with pytest.raises(exc, match=match):
        flashcore.attention_with_kvcache(**args)
    assert not emulated
    assert torch.equal(args["k_cache"], before)


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (8, 2))],
                         ids=["plain", "causal", "window"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["dense", "paged-4", "paged-24-packed", "dense-idx-seqlens"])
def test_rotary_append_reaches_the_launch(emulated, layout, interleaved, causal, window):
    """rotary_cos / rotary_sin reach the library call (one serving op, the tables made contiguous, the flag and
    rotary_seqlens as given); the caches then hold the rotated new keys (v as given) and out is the attention of the
    rotated queries (the emulation is expected_v08: this checks the plumbing, the GPU test the library)."""
    q, k, v = _tensors(batch=3, slots=4, seqlen_q=3, seed=12)
    lengths, idx = [5, 30, 50], None
    gen = torch.Generator().manual_seed(13)
    packed = layout.endswith("packed")
    lens_new = [2, 1, 3] if packed else [3, 3, 3]
    k_new = torch.randn(sum(lens_new), 2, 64, generator=gen).bfloat16()
    v_new = torch.randn(sum(lens_new), 2, 64, generator=gen).bfloat16()
    if not packed:
        k_new, v_new = k_new.reshape(3, 3, 2, 64), v_new.reshape(3, 3, 2, 64)
    cos, sin = _tables(rows=96, rotary_dim=32)
    cos_t = cos.t().contiguous().t()  # a non-contiguous view: made contiguous on the way
    extra = {}
    if layout.startswith("paged"):
        page = int(layout.split("-")[1])
        kc, vc, table = paginate(k[:3], v[:3], [64] * 3, page, garbage_entries=False)
        extra["page_table"] = table
    else:
        kc, vc, table = k[:3].clone(), v[:3].clone(), None
    rotary_seqlens = None
    if layout == "dense-idx-seqlens":
        kc, vc, idx = k.clone(), v.clone(), [3, 0, 2]
        extra["cache_batch_idx"] = _i32(idx)
        rotary_seqlens = [0, 17, 90]  # the last one past the table: clamped to its last row
        extra["rotary_seqlens"] = _i32(rotary_seqlens)
    variants = _ops._front_end_variants(q, 8, window, 0.0, None, 0)
    want_out, want_lse, want_k, want_v = expected_v08(
        q, kc, vc, lengths, causal=causal, block_table=table, batch_idx=idx, k_new=k_new, v_new=v_new,
        lens_new=lens_new if packed else None, variants=variants, rotary=(cos, sin, interleaved, rotary_seqlens))
    out, lse = flashcore.attention_with_kvcache(
        q, kc, vc, k=k_new, v=v_new, cache_seqlens=_i32(lengths), causal=causal, window_size=window,
        cu_seqlens_k_new=cu_seqlens(lens_new) if packed else None, return_softmax_lse=True, rotary_cos=cos_t,
        rotary_sin=sin, rotary_interleaved=interleaved, **extra)
    (call,) = emulated
    rotary = call["rotary"]
    assert isinstance(rotary, _ops.Rotary) and rotary.interleaved is interleaved
    assert rotary.cos.is_contiguous() and torch.equal(rotary.cos, cos) and rotary.sin is not None
    assert (rotary.seqlens is None) == (rotary_seqlens is None)
    assert torch.equal(kc.nan_to_num(7.0), want_k.nan_to_num(7.0)) and torch.equal(vc.nan_to_num(7.0),
                                                                                    want_v.nan_to_num(7.0))
    _check(out, lse, want_out, want_lse)
    # The keys really were rotated: the first new row of sequence 0 differs from k_new in the rotated columns only.
    page = kc.shape[1]
    row = (int(table[0, 5 // page]), 5 % page) if table is not None else ((idx[0] if idx else 0), 5)
    first = k_new[0] if packed else k_new[0, 0]
    assert torch.equal(kc[row][..., 32:], first[..., 32:]) and not torch.equal(kc[row][..., :32], first[..., :32])


def test_rotary_alone_takes_the_serving_path(emulated, monkeypatch):
    """rotary_cos without any other 0.8 argument still runs as one library call (the torch append cannot rotate)."""
    launched = []
    monkeypatch.setattr(_ops, "_launch", lambda *a, **kw: launched.append(kw))
    args = _rotary_base()
    flashcore.attention_with_kvcache(**args)
    assert not launched and len(emulated) == 1 and emulated[0]["rotary"] is not None
    assert emulated[0]["rotary"].interleaved is True  # FlashAttention-3's default


def test_rotary_refused_by_an_older_library(emulated, monkeypatch):
    class Caps07(EmulatedCaps):
        version_string = staticmethod(lambda: "0.7.0")

        @staticmethod
        def has_kvcache_serving():
            return False

    monkeypatch.setattr(_ops, "_check_supported", lambda q, d, dv=None: Caps07)
    args = _rotary_base()
    before = args["k_cache"].clone()
    with pytest.raises(RuntimeError, match="rotary_cos is set, but .*version 0.7.0.*a 0.8 library or newer"):
        flashcore.attention_with_kvcache(**args)
    assert not emulated and torch.equal(args["k_cache"], before)


def test_rotary_custom_op_and_compile(emulated):
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2, seed=14)
    seqlens = _i32([3, 60, 20])
    cos, sin = _tables(rows=64, rotary_dim=64)
    k_new, v_new = torch.randn(3, 2, 2, 64).bfloat16(), torch.randn(3, 2, 2, 64).bfloat16()
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    torch.library.opcheck(torch.ops.flashcore.attention_kvcache_serving_append_fwd.default,
                          (q, k.clone(), v.clone(), seqlens, k_new, v_new, True, 0.0, True),
                          dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False,
                               rotary_seqlens=_i32([0, 5, 9])), test_utils=utils)
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    fake = [mode.from_tensor(t) for t in (q, k, v, seqlens, k_new, v_new, cos[:, :4].contiguous(),
                                          sin[:, :4].contiguous())]
    with mode, pytest.raises(ValueError, match="rotary_dim = 2"):  # the fake checks too
        torch.ops.flashcore.attention_kvcache_serving_append_fwd(*fake[:6], True, 0.0, True, rotary_cos=fake[6],
                                                                 rotary_sin=fake[7])

    def fn(q, kc, vc, k_new, v_new, seqlens, cos, sin):
        return flashcore.attention_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=seqlens, causal=True,
                                                rotary_cos=cos, rotary_sin=sin, rotary_interleaved=True)

    torch._dynamo.reset()
    kc, vc = k.clone(), v.clone()
    want = fn(q, kc, vc, k_new, v_new, seqlens, cos, sin)
    kc2, vc2 = k.clone(), v.clone()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, kc2, vc2, k_new, v_new, seqlens, cos, sin)
    torch.testing.assert_close(got, want)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_any_page_size_reaches_the_serving_launch(emulated):
    """Pages of 1 and 24 rows (not multiples of 16) pass the Python layer since 0.8, with cache_batch_idx."""
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2, seed=15)
    lengths, idx = [1, 40, 64], [2, 0, 1]
    for page in (1, 24):
        kp, vp, table = paginate(k, v, [64] * 3, page, garbage_entries=False)
        out, lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=_i32(lengths), page_table=table,
                                                    cache_batch_idx=_i32(idx), causal=True, return_softmax_lse=True)
        assert emulated[-1]["block_table"] is table
        for b in range(3):
            ref_out, ref_lse = ref_sequence(q[b], k[idx[b], :lengths[b]], v[idx[b], :lengths[b]], True)
            _check(out[b], lse[b], ref_out, ref_lse)


def test_rotary_params_reach_c(use_library, stub_library):
    """kernel_params with a Rotary: the tables' addresses, rotary_seqlen = their rows, rotary_dim = 2 * their
    columns, rotary_interleaved 0 / 1, rotary_seqlens; and the workspace query sees them (the same params)."""
    use_library(stub_library)
    lib = _lib.load()
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2)
    lens = _i32([3, 60, 20])
    cos, sin = _tables(rows=100, rotary_dim=48)
    new = torch.randn(3, 2, 2, 64).bfloat16()
    starts = _i32([1, 2, 3])
    params = _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, True, 0.0, lens,
                                k_new=new, v_new=new, rotary=_ops.Rotary(cos, sin, True, starts))
    lib.forward(params, 0)
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    assert (seen.rotary_cos, seen.rotary_sin, seen.rotary_seqlen, seen.rotary_dim, seen.rotary_interleaved,
            seen.rotary_seqlens) == (cos.data_ptr(), sin.data_ptr(), 100, 48, 1, starts.data_ptr())
    assert seen.seqused_q is None and seen.k_new == new.data_ptr()
    params = _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, True, 0.0, lens,
                                k_new=new, v_new=new, rotary=_ops.Rotary(cos, sin, False, None))
    assert (params.rotary_interleaved, params.rotary_seqlens, params.rotary_dim) == (0, None, 48)
    assert lib.workspace_size(params) == 0  # the stub's answer; validated with the rotary fields set
    with pytest.raises(ValueError, match="rotary_cos / rotary_sin rotate an append: they need k_new"):
        _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, True, 0.0, lens,
                           rotary=_ops.Rotary(cos, sin, False, None))
    with pytest.raises(ValueError, match="contiguous 2-D rotary_cos of q's dtype"):
        _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, True, 0.0, lens, k_new=new,
                           v_new=new, rotary=_ops.Rotary(cos.t(), sin, False, None))


def test_a_07_library_refuses_rotary_and_seqused_q(use_library, stub_builder, tmp_path_factory):
    use_library(stub_builder(tmp_path_factory.mktemp("stub_v7_rotary"), "libflashcore_v7.so",
                             "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V7_SIZE"))
    lib = _lib.load()
    q, k, v = _tensors(batch=3, slots=3, seqlen_q=2)
    lens, new = _i32([3, 60, 20]), torch.randn(3, 2, 2, 64).bfloat16()
    cos, sin = _tables(rows=16, rotary_dim=32)
    with pytest.raises(RuntimeError, match=r"rotary_cos \(rotary_cos\) is set, but .*696-byte .*a 0.8 library"):
        _ops.kernel_params(lib, q, k, v, torch.empty(3, 2, 8, 64).bfloat16(), None, True, 0.0, lens, k_new=new,
                           v_new=new, rotary=_ops.Rotary(cos, sin, True, None))
    qp, cu = q.reshape(6, 8, 64), _i32([0, 2, 4, 6])
    with pytest.raises(RuntimeError, match=r"seqused_q \(seqused_q\) is set, but .*696-byte .*a 0.8 library"):
        _ops.kernel_params(lib, qp, k.reshape(-1, 2, 64)[:6], v.reshape(-1, 2, 64)[:6],
                           torch.empty(6, 8, 64).bfloat16(), None, True, 0.0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2, max_seqlen_k=2,
                           seqused_q=_i32([1, 2, 0]))


# ---------------------------------------------------------------------------------------------------------------
# varlen_attention's seqused_q (FlashAttention-3's; since 0.8).


def _varlen_v08(monkeypatch, calls):
    emulate_serving_on_cpu(monkeypatch, calls)
    check = _ops._check_supported

    def check_supported(q, head_dim, head_dim_v=None):
        check(q, head_dim, head_dim_v)
        return EmulatedCapsV08

    monkeypatch.setattr(_ops, "_check_supported", check_supported)


def _varlen_inputs(lens_q, lens_k, seed=16, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), 8, 64, generator=gen).bfloat16().requires_grad_(requires_grad)
    k = torch.randn(sum(lens_k), 2, 64, generator=gen).bfloat16().requires_grad_(requires_grad)
    v = torch.randn(sum(lens_k), 2, 64, generator=gen).bfloat16().requires_grad_(requires_grad)
    return q, k, v, cu_seqlens(lens_q), cu_seqlens(lens_k)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_seqused_q(monkeypatch, causal):
    """Sequence b's first seqused_q[b] rows against its keys (causal aligned against seqused_q[b]: the last used row
    sees every key); the other rows are 0 with lse -inf; a used count past the length is clamped to it."""
    calls = []
    _varlen_v08(monkeypatch, calls)
    lens_q, lens_k, used = [5, 3, 4], [9, 2, 6], [2, 3, 0]
    q, k, v, cu_q, cu_k = _varlen_inputs(lens_q, lens_k)
    out, lse = flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, causal=causal, return_lse=True,
                                          seqused_q=_i32(used))
    assert torch.equal(calls[0]["seqused_q"], _i32(used))
    sq = sk = 0
    for b in range(3):
        n = used[b]
        ref_out, ref_lse = ref_sequence(q[sq:sq + n], k[sk:sk + lens_k[b]], v[sk:sk + lens_k[b]], causal)
        _check(out[sq:sq + n], lse[:, sq:sq + n], ref_out, ref_lse)
        assert (out[sq + n:sq + lens_q[b]] == 0).all() and torch.isneginf(lse[:, sq + n:sq + lens_q[b]]).all()
        sq, sk = sq + lens_q[b], sk + lens_k[b]
    # The same rows as a batch whose cu_seqlens_q has the used lengths.
    plain = flashcore.varlen_attention(torch.cat([q[0:2], q[5:8]]), k, v, cu_seqlens([2, 3, 0]), cu_k, 5, 9,
                                       causal=causal)
    assert torch.equal(torch.cat([out[0:2], out[5:8]]), plain)
    out2 = flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, causal=causal, seqused_q=_i32([99, 3, 4]))
    assert torch.equal(out2, flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, causal=causal))


def test_varlen_seqused_q_unused_rows_with_no_key(monkeypatch):
    """No key anywhere (max_seqlen_k 0): used rows get the sink's lse, unused ones stay 0 / -inf."""
    _varlen_v08(monkeypatch, [])
    q, k, v, cu_q, _ = _varlen_inputs([3, 2], [0, 0])
    sinks = torch.tensor([0.5] * 8)
    out, lse = flashcore.varlen_attention(q, k, v, cu_q, cu_seqlens([0, 0]), 3, 0, return_lse=True, sinks=sinks,
                                          seqused_q=_i32([1, 2]))
    assert (out == 0).all()
    used = torch.tensor([True, False, False, True, True])
    assert (lse[:, used] == 0.5).all() and torch.isneginf(lse[:, ~used]).all()


@pytest.mark.parametrize(
    "seqused_q, exc, match",
    [
        (_i32([1, 2]), ValueError, r"seqused_q must be None or an int32 tensor of shape \(batch,\) = \(3,\)"),
        (_i32([1, 2, 3]).long(), ValueError, "seqused_q must be None or an int32 tensor"),
        ([1, 2, 3], ValueError, r"seqused_q must be None or an int32 tensor .* got list"),
    ],
    ids=["short", "int64", "list"],
)
def test_varlen_seqused_q_errors(monkeypatch, seqused_q, exc, match):
    calls = []
    _varlen_v08(monkeypatch, calls)
    q, k, v, cu_q, cu_k = _varlen_inputs([5, 3, 4], [9, 2, 6])
    with pytest.raises(exc, match=match):
        flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, seqused_q=seqused_q)
    assert not calls


def test_varlen_seqused_q_backward(monkeypatch):
    """Under autograd the forward keeps its lse, and the backward (0.9) takes seqused_q: the unused rows' dq is zero,
    and each sequence's used rows get the gradients of its first seqused_q[b] rows alone."""
    calls = []
    _varlen_v08(monkeypatch, calls)
    q, k, v, cu_q, cu_k = _varlen_inputs([5, 3, 4], [9, 2, 6], requires_grad=True)
    used = _i32([2, 3, 1])
    out = flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, causal=True, seqused_q=used)
    assert out.requires_grad
    out.float().sum().backward()
    (bwd,) = [c for c in calls if c["kind"] == "varlen_backward"]
    assert torch.equal(bwd["seqused_q"], used)
    unused = torch.ones(12, dtype=torch.bool)
    unused[[0, 1, 5, 6, 7, 8]] = False
    assert torch.count_nonzero(q.grad[unused]) == 0 and torch.count_nonzero(q.grad[~unused]) > 0


def test_varlen_seqused_q_refused_by_an_older_library(monkeypatch):
    calls = []
    emulate_serving_on_cpu(monkeypatch, calls)

    class Caps07(EmulatedCaps):
        version_string = staticmethod(lambda: "0.7.0")

        @staticmethod
        def has_kvcache_serving():
            return False

    monkeypatch.setattr(_ops, "_check_supported", lambda q, d, dv=None: Caps07)
    q, k, v, cu_q, cu_k = _varlen_inputs([5, 3, 4], [9, 2, 6])
    with pytest.raises(RuntimeError, match="seqused_q is set, but .*version 0.7.0.*a 0.8 library or newer"):
        flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, seqused_q=_i32([1, 2, 3]))
    assert not calls


def test_varlen_seqused_q_custom_op_and_compile(monkeypatch):
    _varlen_v08(monkeypatch, [])
    q, k, v, cu_q, cu_k = _varlen_inputs([5, 3, 4], [9, 2, 6])
    used = _i32([2, 3, 1])
    torch.library.opcheck(torch.ops.flashcore.varlen_attention_fwd.default,
                          (q, k, v, cu_q, cu_k, None, 5, 9, True, 0.0, True), dict(seqused_q=used),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))

    def fn(q, k, v, cu_q, cu_k, used):
        return flashcore.varlen_attention(q, k, v, cu_q, cu_k, 5, 9, causal=True, seqused_q=used, return_lse=True)

    torch._dynamo.reset()
    want = fn(q, k, v, cu_q, cu_k, used)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, cu_q, cu_k, used)
    torch.testing.assert_close(got, want)

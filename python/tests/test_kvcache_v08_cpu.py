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


def expected_v08(q, k_cache, v_cache, seqlens, *, causal=False, scale=None, block_table=None, batch_idx=None,
                 leftpad=None, lens_q=None, k_new=None, v_new=None, lens_new=None, variants=None):
    """(out, lse, k_after, v_after): what a call must return and leave in the caches. q (B, Sq, Hq, D), or packed
    (total_q, Hq, D) with lens_q; k_new (B, Sn, Hkv, D), or packed (total_k_new, Hkv, D) with lens_new. seqlens,
    batch_idx, leftpad: host lists. out / lse have the op's shapes ((B, Sq, Hq, Dv) / (B, Hq, Sq), or (total_q, Hq,
    Dv) / (Hq, total_q)), float64."""
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
               max_seqlen_q=0, k_new=None, v_new=None, cu_seqlens_k_new=None):
        if calls is not None:
            calls.append(dict(block_table=block_table, num_splits=num_splits, variants=variants,
                              cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q,
                              max_seqlen_q=max_seqlen_q, k_new=k_new, cu_seqlens_k_new=cu_seqlens_k_new))
        lens = lambda cu: [b - a for a, b in zip(cu.tolist(), cu.tolist()[1:])]  # noqa: E731
        o, l, k_after, v_after = expected_v08(
            q, k_cache, v_cache, seqused_k.tolist(), causal=causal, scale=softmax_scale or None,
            block_table=block_table, batch_idx=None if cache_batch_idx is None else cache_batch_idx.tolist(),
            leftpad=None if cache_leftpad is None else cache_leftpad.tolist(),
            lens_q=None if cu_seqlens_q is None else lens(cu_seqlens_q), k_new=k_new, v_new=v_new,
            lens_new=None if cu_seqlens_k_new is None else lens(cu_seqlens_k_new), variants=variants)
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


def test_a_07_library_runs_without_the_new_fields(use_library, c_compiler, header_text, tmp_path_factory):
    """The stub playing 0.7: kernel_params without the 0.8 arguments (cu_seqlens_q on a cache and a dense k_new
    included) fill its 696 bytes; each 0.8 argument is RuntimeError naming it."""
    from conftest import build_stub

    use_library(build_stub(c_compiler, tmp_path_factory.mktemp("stub_v7_ops"), "libflashcore_v7.so",
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

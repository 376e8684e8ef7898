"""flashcore.attention_with_kvcache on an e4m3 KV cache (C ABI 0.9, FLASHCORE_FLAG_KV_FP8_E4M3; FlashAttention-3's
float8_e4m3fn k_cache / v_cache with k_descale / v_descale under 16-bit q), without a GPU: every refusal naming its
argument before anything is launched; the descales as the op gets them ((B, Hkv), or one element expanded); the
front end, the op, its fake, opcheck and torch.compile with the library call emulated on CPU by the float64 reference
of the dequantized cache (k_cache.float() * k_descale[b, h]); the backward's NotImplementedError; and through the
host-only stub library (built to play 0.9 and 0.8): the flag, the descale pointers and the rest of the params struct
the call fills, and a 0.8 library's refusal (RuntimeError naming its version) before any call. Also holds
kv_fp8_expected, the float64 model that test_kv_fp8_gpu.py imports."""

import ctypes
import math
import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flashcore  # noqa: E402
from flashcore import _lib, _ops  # noqa: E402
from test_kvcache_v08_cpu import expected_v08  # noqa: E402
from test_paged_cpu import paginate  # noqa: E402
from test_varlen_cpu import EmulatedCaps, cu_seqlens, ref_sequence  # noqa: E402

E4M3 = torch.float8_e4m3fn


# ---------------------------------------------------------------------------------------------------------------
# The float64 model (FlashAttention-3's reference of an fp8 cache: the cache dequantized, then plain attention).


def dequantize(cache, descale, b):
    """float64 copy of a whole cache (any layout (..., Hkv, D)) with sequence b's factors: cache * descale[b, h]
    (descale None: 1)."""
    full = cache.double()
    if descale is None:
        return full
    return full * descale.double()[b].reshape(*([1] * (cache.dim() - 2)), -1, 1)


def kv_fp8_expected(q, k_cache, v_cache, seqlens, *, k_descale=None, v_descale=None, causal=False, scale=None,
                    block_table=None, batch_idx=None, leftpad=None, lens_q=None, q_descale=None):
    """(out, lse) in float64 with the op's shapes: sequence b attends to its cache (slot batch_idx[b], pages of
    block_table, rows [leftpad[b], seqlens[b])) dequantized with ITS factors k_descale[b], v_descale[b] (the factors
    are the sequence's, not the slot's, as FlashAttention-3's). q (B, Sq, Hq, D), or packed (total_q, Hq, D) with
    lens_q; seqlens, batch_idx, leftpad, lens_q: host lists. q_descale (B, Hkv): a float8_e4m3fn q's factors (query
    head i of sequence b: q * q_descale[b, i // (Hq // Hkv)])."""
    batch = len(seqlens)
    packed = lens_q is not None
    outs, lses = [], []
    start = 0
    for b in range(batch):
        qb = q[start:start + lens_q[b]] if packed else q[b:b + 1]
        start += lens_q[b] if packed else 0
        if q_descale is not None:
            group = q.shape[-2] // q_descale.shape[1]
            qb = qb.double() * q_descale.double()[b].repeat_interleave(group)[:, None]
        o, l, _, _ = expected_v08(
            qb, dequantize(k_cache, k_descale, b), dequantize(v_cache, v_descale, b), [seqlens[b]], causal=causal,
            scale=scale, block_table=block_table, batch_idx=[b if batch_idx is None else batch_idx[b]],
            leftpad=None if leftpad is None else [leftpad[b]], lens_q=None if not packed else [lens_q[b]])
        outs.append(o)
        lses.append(l)
    if packed:
        return torch.cat(outs, 0), torch.cat(lses, 1)
    return torch.cat(outs, 0), torch.cat(lses, 0)


def kv_fp8_append(k_cache, v_cache, seqused_k, k_new, v_new, k_descale=None, v_descale=None, *, block_table=None,
                  batch_idx=None, cu_new=None):
    """The library's append into an e4m3 cache (in place): new row t of sequence b (k_new (B, Sn, Hkv, D), or packed
    (total, Hkv, D) with cu_new) at position seqused_k[b] + t of its slot (batch_idx[b]; pages of block_table),
    stored as the e4m3 of x / descale[b, h] (torch's rounding: nearest even; saturated to +-448). Returns the lengths
    after it (seqused_k + rows)."""
    batch = seqused_k.shape[0]
    lens = seqused_k.tolist()
    after = []
    for b in range(batch):
        rows_k = k_new[cu_new[b]:cu_new[b + 1]] if cu_new is not None else k_new[b]
        rows_v = v_new[cu_new[b]:cu_new[b + 1]] if cu_new is not None else v_new[b]
        slot = b if batch_idx is None else int(batch_idx[b])
        for t in range(rows_k.shape[0]):
            pos = lens[b] + t
            for cache, rows, d in ((k_cache, rows_k, k_descale), (v_cache, rows_v, v_descale)):
                x = rows[t].float() / (d[b].float()[:, None] if d is not None else 1.0)
                x = x.clamp(-448.0, 448.0).to(E4M3)
                if block_table is not None:
                    page = int(block_table[slot, pos // cache.shape[1]])
                    cache[page, pos % cache.shape[1]] = x
                else:
                    cache[slot, pos] = x
        after.append(lens[b] + rows_k.shape[0])
    return torch.tensor(after, dtype=torch.int32)


class EmulatedCapsV09(EmulatedCaps):
    version_string = staticmethod(lambda: "0.9.0")

    @staticmethod
    def has_kvcache_serving():
        return True

    @staticmethod
    def has_kv_fp8():
        return True


class EmulatedCapsV08(EmulatedCapsV09):
    version_string = staticmethod(lambda: "0.8.0")

    @staticmethod
    def has_kv_fp8():
        return False


def emulate_kv_fp8(monkeypatch, calls, caps=EmulatedCapsV09):
    """Run the serving op on CPU tensors: kv_fp8_expected (16-bit caches: k_descale / v_descale None) in place of the
    library call. `calls` receives each emulated launch's keyword arguments (the descales as they reached it)."""
    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)
    monkeypatch.setattr(_ops, "_check_supported", lambda q, d, dv=None: caps)

    def launch(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k, *, block_table=None,
               num_splits=0, variants=None, cache_batch_idx=None, cache_leftpad=None, cu_seqlens_q=None,
               max_seqlen_q=0, k_new=None, v_new=None, cu_seqlens_k_new=None, rotary=None, k_descale=None,
               v_descale=None, q_descale=None):
        assert rotary is None and variants is None
        calls.append(dict(block_table=block_table, num_splits=num_splits, cache_batch_idx=cache_batch_idx,
                          cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                          k_descale=k_descale, v_descale=v_descale, cache_dtype=k_cache.dtype,
                          new_dtype=None if k_new is None else k_new.dtype, q_descale=q_descale, q_dtype=q.dtype))
        if k_new is not None:  # the append, as the library writes it: e4m3 of x / descale (kv_fp8_append)
            seqused_k = kv_fp8_append(k_cache, v_cache, seqused_k, k_new, v_new, k_descale, v_descale,
                                      block_table=block_table, batch_idx=cache_batch_idx,
                                      cu_new=cu_seqlens_k_new)
        lens = lambda cu: [b - a for a, b in zip(cu.tolist(), cu.tolist()[1:])]  # noqa: E731
        o, l = kv_fp8_expected(
            q, k_cache, v_cache, seqused_k.tolist(), k_descale=k_descale, v_descale=v_descale, causal=causal,
            scale=softmax_scale or None, block_table=block_table,
            batch_idx=None if cache_batch_idx is None else cache_batch_idx.tolist(),
            leftpad=None if cache_leftpad is None else cache_leftpad.tolist(),
            lens_q=None if cu_seqlens_q is None else lens(cu_seqlens_q), q_descale=q_descale)
        out.copy_(o.to(out.dtype))
        if lse.numel():
            lse.copy_(l.float())

    monkeypatch.setattr(_ops, "_launch_kvcache_serving", launch)


@pytest.fixture
def emulated(monkeypatch):
    calls = []
    emulate_kv_fp8(monkeypatch, calls)
    return calls


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _e4m3(*shape, gen):
    """Random e4m3 values (randn rounded), as a float8_e4m3fn tensor."""
    return torch.randn(*shape, generator=gen).to(E4M3)


def _tensors(batch=3, slots=3, capacity=64, seqlen_q=2, heads_q=8, heads_kv=2, head_dim=64, dtype=torch.bfloat16,
             seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads_q, head_dim, generator=gen).to(dtype)
    k = _e4m3(slots, capacity, heads_kv, head_dim, gen=gen)
    v = _e4m3(slots, capacity, heads_kv, head_dim, gen=gen)
    kd = torch.rand(batch, heads_kv, generator=gen) * 0.5 + 0.25
    vd = torch.rand(batch, heads_kv, generator=gen) * 2.0 + 0.5
    return q, k, v, kd, vd


def _check(got_out, got_lse, want_out, want_lse):
    torch.testing.assert_close(got_out.double(), want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got_lse.double(), want_lse, atol=1e-5, rtol=1e-5)


def _bits(t):
    """An 8-bit tensor's bytes (torch.equal has no float8 kernel on CPU)."""
    return t.view(torch.uint8)


# ---------------------------------------------------------------------------------------------------------------
# The binding's constants and Library methods.


def test_flag_constant(header_text):
    """FLAG_KV_FP8_E4M3 is bit 2; a header of 0.9 or newer defines it so (this checkout's header may predate it)."""
    assert _lib.FLAG_KV_FP8_E4M3 == 2 and _lib.KV_FP8_VERSION == (0, 9)
    assert _lib.FLAG_KV_FP8_E4M3 & _lib.FLAG_V_TRANSPOSED == 0
    minor = int(re.search(r"#define\s+FLASHCORE_VERSION_MINOR\s+(\d+)", header_text).group(1))
    found = re.search(r"#define\s+FLASHCORE_FLAG_KV_FP8_E4M3\s+(\d+)u", header_text)
    if minor >= 9 or found:
        assert found and int(found.group(1)) == _lib.FLAG_KV_FP8_E4M3


# ---------------------------------------------------------------------------------------------------------------
# Refusals: raised before anything is launched, naming the argument.


def _base(paged=False):
    q, k, v, kd, vd = _tensors()
    args = {"q": q, "k_cache": k, "v_cache": v, "cache_seqlens": _i32([3, 0, 40]), "k_descale": kd, "v_descale": vd}
    if paged:
        kp, vp, table = _paged(k, v, [64] * 3, 16)
        args.update(k_cache=kp, v_cache=vp, block_table=table)
    return args


def _paged(k, v, lengths, page_size, seed=0):
    """paginate() of e4m3 caches, done on their float32 values (exact) and converted back (NaN stays NaN)."""
    kp, vp, table = paginate(k.float(), v.float(), lengths, page_size, seed=seed, garbage_entries=False)
    return kp.to(E4M3), vp.to(E4M3), table


def _bf16(*shape):
    return torch.zeros(*shape, dtype=torch.bfloat16)


REFUSALS = {
    "append-e4m3-rows": (lambda a: {**a, "k": _bf16(3, 1, 2, 64).to(E4M3), "v": _bf16(3, 1, 2, 64).to(E4M3)},
                         TypeError, r"k / v appended to an e4m3 KV cache are given in 16 bits \(q's dtype"),
    "append-v-e4m3": (lambda a: {**a, "k": _bf16(3, 1, 2, 64), "v": _bf16(3, 1, 2, 64).to(E4M3)},
                      TypeError, "k / v appended to an e4m3 KV cache are given in 16 bits"),
    "window": (lambda a: {**a, "window_size": (8, 0), "causal": True}, ValueError,
               "window_size is set, but an e4m3 KV cache takes no window_size, softcap, sinks or attention_chunk"),
    "softcap": (lambda a: {**a, "softcap": 30.0}, ValueError, "softcap is set, but an e4m3 KV cache"),
    "sinks": (lambda a: {**a, "sinks": torch.zeros(8)}, ValueError, "sinks is set, but an e4m3 KV cache"),
    "chunk": (lambda a: {**a, "attention_chunk": 16}, ValueError, "attention_chunk is set, but an e4m3 KV cache"),
    "head-dim-v": (lambda a: {**a, "v_cache": a["v_cache"][..., :32].contiguous()}, ValueError,
                   r"an e4m3 KV cache takes one head dim for k_cache and v_cache; v_cache's \(its head_dim_v\) is 32"),
    "q-descale": (lambda a: {**a, "q_descale": torch.ones(3, 2)}, ValueError,
                  "q_descale is set, but q is torch.bfloat16: it scales a float8_e4m3fn q on an e4m3 KV cache"),
    "q8-append": (lambda a: {**a, "q": a["q"].float().to(E4M3), "k": _bf16(3, 1, 2, 64), "v": _bf16(3, 1, 2, 64)},
                  ValueError, "k is set with a float8_e4m3fn q: an e4m3 q takes no append and no rotary embedding"),
    "q8-rotary": (lambda a: {**a, "q": a["q"].float().to(E4M3), "k": _bf16(3, 1, 2, 64).to(E4M3),
                             "v": _bf16(3, 1, 2, 64).to(E4M3), "rotary_cos": _bf16(64, 16),
                             "rotary_sin": _bf16(64, 16)}, ValueError, "k is set with a float8_e4m3fn q"),
    "q8-descale-heads-q": (lambda a: {**a, "q": a["q"].float().to(E4M3), "q_descale": torch.ones(3, 8)}, ValueError,
                           r"q_descale must have shape \(batch, num_heads_kv\) = \(3, 2\)"),
    "q-descale-16bit-cache": (lambda a: {**a, "k_cache": a["k_cache"].bfloat16(), "v_cache": a["v_cache"].bfloat16(),
                                         "k_descale": None, "v_descale": None, "q_descale": torch.ones(3, 2)},
                              ValueError, "q_descale is set"),
    "k-descale-16bit-cache": (lambda a: {**a, "k_cache": a["k_cache"].bfloat16(), "v_cache": a["v_cache"].bfloat16(),
                                         "v_descale": None}, ValueError,
                              "k_descale is set, but k_cache is torch.bfloat16: the descales scale an e4m3 KV cache"),
    "v-descale-16bit-cache": (lambda a: {**a, "k_cache": a["k_cache"].bfloat16(), "v_cache": a["v_cache"].bfloat16(),
                                         "k_descale": None}, ValueError, "v_descale is set, but k_cache is"),
    "v-e5m2": (lambda a: {**a, "v_cache": a["v_cache"].float().to(torch.float8_e5m2)}, TypeError,
               r"k_cache and v_cache must have the same dtype .* got torch.float8_e4m3fn and torch.float8_e5m2"),
    "v-uint8": (lambda a: {**a, "v_cache": a["v_cache"].view(torch.uint8)}, TypeError,
                "k_cache and v_cache must have the same dtype"),
    "k-bf16-v-e4m3": (lambda a: {**a, "k_cache": a["k_cache"].bfloat16()}, TypeError,
                      r"k_cache and v_cache must have the same dtype .* got torch.bfloat16 and torch.float8_e4m3fn"),
    "both-e5m2": (lambda a: {**a, "k_cache": a["k_cache"].float().to(torch.float8_e5m2),
                             "v_cache": a["v_cache"].float().to(torch.float8_e5m2)}, TypeError,
                  "k_cache and v_cache are torch.float8_e5m2: FlashCore's 8-bit KV cache is float8_e4m3fn"),
    "both-e4m3fnuz": (lambda a: {**a, "k_cache": a["k_cache"].float().to(torch.float8_e4m3fnuz),
                                 "v_cache": a["v_cache"].float().to(torch.float8_e4m3fnuz)}, TypeError,
                      "k_cache and v_cache are torch.float8_e4m3fnuz"),
    "q-e5m2": (lambda a: {**a, "q": a["q"].float().to(torch.float8_e5m2)}, TypeError,
               r"is read under float16, bfloat16 or float8_e4m3fn q, got q of dtype torch.float8_e5m2"),
    "q-fp32": (lambda a: {**a, "q": a["q"].float()}, TypeError,
               r"an e4m3 KV cache \(float8_e4m3fn k_cache / v_cache\) is read under float16, bfloat16 or "
               r"float8_e4m3fn q, got q of dtype torch.float32"),
    "k-descale-fp16": (lambda a: {**a, "k_descale": a["k_descale"].half()}, TypeError,
                       "k_descale must be float32, got torch.float16"),
    "v-descale-heads-q": (lambda a: {**a, "v_descale": torch.ones(3, 8)}, ValueError,
                          r"v_descale must have shape \(batch, num_heads_kv\) = \(3, 2\) .* got \(3, 8\)"),
    "k-descale-per-batch": (lambda a: {**a, "k_descale": torch.ones(3)}, ValueError,
                            r"k_descale must have shape \(batch, num_heads_kv\) = \(3, 2\)"),
    "k-descale-list": (lambda a: {**a, "k_descale": [[1.0, 1.0]] * 3}, TypeError,
                       "k_descale must be a torch.Tensor or None, got list"),
    "k-descale-device": (lambda a: {**a, "k_descale": torch.ones(3, 2, device="meta")}, ValueError,
                         "k_descale is on meta, q on cpu"),
}


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals(emulated, case, paged):
    mutate, exc, match = REFUSALS[case]
    args = mutate(_base(paged))
    with pytest.raises(exc, match=match):
        flashcore.attention_with_kvcache(**args)
    assert not emulated  # nothing was launched


def test_refusals_with_serving_arguments(emulated):
    """The same refusals with the 0.8 arguments (cache_batch_idx, packed q) on the way."""
    args = _base()
    args.update(q=args["q"].reshape(6, 8, 64), cu_seqlens_q=_i32([0, 2, 3, 6]), cache_batch_idx=_i32([2, 0, 1]))
    with pytest.raises(TypeError, match="k / v appended to an e4m3 KV cache are given in 16 bits"):
        flashcore.attention_with_kvcache(**args, k=torch.zeros(4, 2, 64).to(E4M3), v=torch.zeros(4, 2, 64).to(E4M3),
                                         cu_seqlens_k_new=_i32([0, 1, 3, 4]))
    with pytest.raises(ValueError, match="softcap is set"):
        flashcore.attention_with_kvcache(**args, softcap=5.0)
    with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, num_heads_kv\) = \(3, 2\)"):
        flashcore.attention_with_kvcache(**{**args, "k_descale": torch.ones(6, 2)})
    assert not emulated


def test_a_library_older_than_09_is_refused_before_the_call(monkeypatch):
    """The library's version decides (0.9 added a flag, not a field): RuntimeError naming it and 0.9, in eager mode
    before the op, and by the op itself (torch.compile skips the front end's check)."""
    calls = []
    emulate_kv_fp8(monkeypatch, calls, caps=EmulatedCapsV08)
    args = _base()
    with pytest.raises(RuntimeError, match=r"predates it: a 0.9 library or newer is needed") as info:
        flashcore.attention_with_kvcache(**args)
    assert "version 0.8.0" in str(info.value) and "float8_e4m3fn" in str(info.value)
    with pytest.raises(RuntimeError, match=r"version 0.8.0\) predates it: a 0.9 library"):
        torch.ops.flashcore.attention_kvcache_serving_fwd(args["q"], args["k_cache"], args["v_cache"],
                                                          args["cache_seqlens"], False, 0.0, False,
                                                          k_descale=args["k_descale"], v_descale=args["v_descale"])
    assert not calls
    # A 16-bit cache still runs with that library.
    flashcore.attention_with_kvcache(args["q"], args["k_cache"].bfloat16(), args["v_cache"].bfloat16(),
                                     cache_seqlens=args["cache_seqlens"], cache_batch_idx=_i32([0, 1, 2]))
    assert len(calls) == 1 and calls[0]["cache_dtype"] == torch.bfloat16


def test_the_plain_kvcache_op_refuses_an_e4m3_cache():
    """flashcore::attention_kvcache_fwd (the 0.2 op) takes 16-bit caches only: the e4m3 cache goes through the
    serving op."""
    args = _base()
    with pytest.raises(TypeError, match="q, k and v must have the same dtype"):
        torch.ops.flashcore.attention_kvcache_fwd(args["q"], args["k_cache"], args["v_cache"], args["cache_seqlens"],
                                                  False, 0.0, False)


# ---------------------------------------------------------------------------------------------------------------
# The front end and the op, the library call emulated.


@pytest.mark.parametrize("descales", ["per-head", "per-tensor", "none", "k-only"])
@pytest.mark.parametrize("layout", ["dense", "dense-idx", "paged-16", "paged-64-idx", "packed-q", "packed-q-paged"])
@pytest.mark.parametrize("causal", [False, True])
def test_results_and_descales(emulated, layout, descales, causal):
    """out (q's dtype) and lse against the hand-dequantized reference; the descales reach the launch as contiguous
    float32 (B, Hkv): the caller's, or a one-element factor expanded; the serving arguments as given."""
    q, k, v, kd, vd = _tensors(batch=3, slots=4, capacity=64, seqlen_q=3, seed=1)
    lengths, idx, lens_q = [5, 64, 0], None, None
    extra = {}
    if descales == "per-tensor":
        kd, vd = torch.tensor(0.375), torch.tensor([1.75])
    elif descales == "none":
        kd = vd = None
    elif descales == "k-only":
        vd = None
    if "idx" in layout:
        idx = [3, 0, 2]
        extra["cache_batch_idx"] = _i32(idx)
    kc, vc, table = k[:3] if idx is None else k, v[:3] if idx is None else v, None
    if layout.startswith("paged"):
        page = int(layout.split("-")[1])
        kc, vc, table = _paged(kc, vc, [64] * kc.shape[0], page)
        extra["page_table"] = table
    qq = q
    if layout.startswith("packed-q"):
        lens_q = [1, 3, 2]
        qq = torch.cat([q[b, :n] for b, n in enumerate(lens_q)])
        extra.update(cu_seqlens_q=cu_seqlens(lens_q), max_seqlen_q=3)
        if layout == "packed-q-paged":
            kc, vc, table = _paged(kc, vc, [64] * kc.shape[0], 16)
            extra["block_table"] = table
    out, lse = flashcore.attention_with_kvcache(qq, kc, vc, cache_seqlens=_i32(lengths), causal=causal,
                                                return_softmax_lse=True, k_descale=kd, v_descale=vd, **extra)
    assert out.dtype == q.dtype and out.shape == qq.shape
    (call,) = emulated
    assert call["cache_dtype"] == E4M3 and (call["block_table"] is not None) == (table is not None)
    for name, given in (("k_descale", kd), ("v_descale", vd)):
        got = call[name]
        if given is None:
            assert got is None
            continue
        assert got.dtype == torch.float32 and got.shape == (3, 2) and got.is_contiguous()
        want = given.reshape(1, 1).expand(3, 2) if given.numel() == 1 else given
        assert torch.equal(got, want)
        if given.numel() > 1:
            assert got.data_ptr() == given.data_ptr()  # contiguous already: passed as is, no copy
    # The reference, by hand: sequence b's keys dequantized with its own (b's) factors.
    kd_full = None if kd is None else (kd.reshape(1, 1).expand(3, 2) if kd.numel() == 1 else kd)
    vd_full = None if vd is None else (vd.reshape(1, 1).expand(3, 2) if vd.numel() == 1 else vd)
    start = 0
    for b in range(3):
        slot = b if idx is None else idx[b]
        kb = k[slot, :lengths[b]].double() * (1.0 if kd_full is None else kd_full[b].double()[None, :, None])
        vb = v[slot, :lengths[b]].double() * (1.0 if vd_full is None else vd_full[b].double()[None, :, None])
        if lens_q is None:
            ref_out, ref_lse = ref_sequence(q[b], kb, vb, causal)
            _check(out[b], lse[b], ref_out, ref_lse)
        else:
            n = lens_q[b]
            ref_out, ref_lse = ref_sequence(q[b, :n], kb, vb, causal)
            _check(out[start:start + n], lse[:, start:start + n], ref_out, ref_lse)
            start += n


def test_leftpad_and_num_splits_reach_the_launch(emulated):
    q, k, v, kd, vd = _tensors(seed=2)
    lengths, pad = [40, 64, 9], [4, 0, 9]
    out, lse = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32(lengths), cache_leftpad=_i32(pad),
                                                k_descale=kd, v_descale=vd, causal=True, num_splits=3,
                                                return_softmax_lse=True)
    (call,) = emulated
    assert call["num_splits"] == 3 and call["cache_leftpad"].tolist() == pad
    for b in range(2):
        kb = k[b, pad[b]:lengths[b]].double() * kd[b].double()[None, :, None]
        vb = v[b, pad[b]:lengths[b]].double() * vd[b].double()[None, :, None]
        ref_out, ref_lse = ref_sequence(q[b], kb, vb, True)
        _check(out[b], lse[b], ref_out, ref_lse)
    assert (out[2] == 0).all() and torch.isneginf(lse[2]).all()  # no key left after the padding


def test_fp16_q_and_int_cache_seqlens(emulated):
    q, k, v, kd, vd = _tensors(dtype=torch.float16, seed=3)
    out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=17, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.float16 and emulated[0]["cache_dtype"] == E4M3
    for b in range(3):
        ref_out, _ = ref_sequence(q[b], dequantize(k, kd, b)[b, :17], dequantize(v, vd, b)[b, :17])
        torch.testing.assert_close(out[b].double(), ref_out, atol=1e-2, rtol=1e-2)


def test_nan_past_the_lengths_is_not_read(emulated):
    """The emulation reads what the library may read: rows past cache_seqlens hold NaN (e4m3 0x7F), out is finite."""
    q, k, v, kd, vd = _tensors(seed=4)
    lengths = [5, 64, 30]
    k, v = k.float(), v.float()
    for b, n in enumerate(lengths):
        k[b, n:] = math.nan
        v[b, n:] = math.nan
    k8, v8 = k.to(E4M3), v.to(E4M3)
    assert (_bits(k8[0, 5:]) & 0x7F == 0x7F).all()
    out = flashcore.attention_with_kvcache(q, k8, v8, cache_seqlens=_i32(lengths), k_descale=kd, v_descale=vd)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("layout", ["dense", "dense-idx", "paged-16", "packed-new"])
def test_appends_quantize_into_the_cache(emulated, layout):
    """k / v in q's dtype (or float32, converted to it) appended to an e4m3 cache: the launch gets the 16-bit rows
    and the descales, the caches change in place as the library writes them (kv_fp8_append), and out / lse are the
    reference's on the cache after the append."""
    q, k, v, kd, vd = _tensors(batch=3, slots=4, capacity=64, seqlen_q=1, seed=7)
    lengths, idx = [5, 60, 0], None
    gen = torch.Generator().manual_seed(8)
    kn, vn = (torch.randn(3, 2, 2, 64, generator=gen) for _ in range(2))
    extra = {}
    kc, vc, table = k[:3].clone(), v[:3].clone(), None
    if layout == "dense-idx":
        idx = [3, 0, 2]
        extra["cache_batch_idx"] = _i32(idx)
        kc, vc = k.clone(), v.clone()
    elif layout == "paged-16":
        kc, vc, table = _paged(k[:3], v[:3], [64] * 3, 16, seed=2)
        extra["block_table"] = table
    elif layout == "packed-new":  # 2, 1 and 0 rows
        kn, vn = kn.reshape(6, 2, 64)[:3], vn.reshape(6, 2, 64)[:3]
        extra["cu_seqlens_k_new"] = _i32([0, 2, 3, 3])
    want_k, want_v = kc.clone(), vc.clone()
    cu = None if layout != "packed-new" else [0, 2, 3, 3]
    after = kv_fp8_append(want_k, want_v, _i32(lengths), kn.to(torch.bfloat16), vn.to(torch.bfloat16), kd, vd,
                          block_table=table, batch_idx=idx, cu_new=cu)
    out, lse = flashcore.attention_with_kvcache(q, kc, vc, k=kn.to(torch.bfloat16) if layout != "dense" else kn,
                                                v=vn.to(torch.bfloat16), cache_seqlens=_i32(lengths), k_descale=kd,
                                                v_descale=vd, return_softmax_lse=True, **extra)
    assert emulated[-1]["new_dtype"] == torch.bfloat16 and emulated[-1]["cache_dtype"] == E4M3
    assert torch.equal(_bits(kc), _bits(want_k)) and torch.equal(_bits(vc), _bits(want_v))
    want_out, want_lse = kv_fp8_expected(q, want_k, want_v, after.tolist(), k_descale=kd, v_descale=vd,
                                         block_table=table, batch_idx=idx)
    _check(out, lse, want_out, want_lse)


@pytest.mark.parametrize("q_descale", ["per-head", "per-tensor", "none"])
@pytest.mark.parametrize("layout", ["dense", "paged-16", "packed-q"])
def test_e4m3_queries(emulated, layout, q_descale):
    """A float8_e4m3fn q on the e4m3 cache (FlashAttention-3's FP8 call): the launch gets the e4m3 q and q_descale as
    contiguous float32 (B, Hkv), out is bfloat16, and out / lse the reference's of the dequantized q and cache."""
    q, k, v, kd, vd = _tensors(batch=3, slots=3, capacity=64, seqlen_q=2, seed=12)
    gen = torch.Generator().manual_seed(13)
    q8 = (torch.randn(*q.shape, generator=gen) * 20).to(E4M3)
    qd = {"per-head": torch.rand(3, 2, generator=gen) + 0.05, "per-tensor": torch.tensor(0.0625), "none": None}[q_descale]
    lengths, table, extra, lens_q = [5, 64, 17], None, {}, None
    kc, vc = k, v
    if layout == "paged-16":
        kc, vc, table = _paged(k, v, [64] * 3, 16, seed=3)
        extra["block_table"] = table
    call_q = q8
    if layout == "packed-q":
        lens_q = [2, 1, 2]
        call_q = torch.cat([q8[0, :2], q8[1, :1], q8[2, :2]])
        extra.update(cu_seqlens_q=_i32([0, 2, 3, 5]), max_seqlen_q=2)
    out, lse = flashcore.attention_with_kvcache(call_q, kc, vc, cache_seqlens=_i32(lengths), k_descale=kd, v_descale=vd,
                                                q_descale=qd, causal=True, return_softmax_lse=True, **extra)
    seen = emulated[-1]
    assert out.dtype == torch.bfloat16 and out.shape == call_q.shape and seen["q_dtype"] == E4M3
    full_qd = None if qd is None else (qd.reshape(1, 1).expand(3, 2) if qd.numel() == 1 else qd)
    if qd is None:
        assert seen["q_descale"] is None
    else:
        assert seen["q_descale"].is_contiguous() and seen["q_descale"].dtype == torch.float32
        torch.testing.assert_close(seen["q_descale"], full_qd)
    want_out, want_lse = kv_fp8_expected(call_q.float(), kc, vc, lengths, k_descale=kd, v_descale=vd, causal=True,
                                         block_table=table, lens_q=lens_q, q_descale=full_qd)
    _check(out, lse, want_out, want_lse)


# ---------------------------------------------------------------------------------------------------------------
# The backward, the op's registration, fake tensors, torch.compile.


def test_no_backward_through_an_e4m3_cache(emulated):
    """q may require grad: the forward runs, and the backward raises NotImplementedError naming the e4m3 cache (a
    16-bit cache keeps the KV-cache message)."""
    q, k, v, kd, vd = _tensors(seed=5)
    q.requires_grad_()
    out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32([1, 2, 3]), k_descale=kd, v_descale=vd)
    assert out.requires_grad
    with pytest.raises(NotImplementedError, match=r"the backward through an e4m3 KV cache \(float8_e4m3fn"):
        out.sum().backward()
    assert q.grad is None
    out = flashcore.attention_with_kvcache(q, k.bfloat16(), v.bfloat16(), cache_seqlens=_i32([1, 2, 3]),
                                           cache_batch_idx=_i32([0, 1, 2]))
    with pytest.raises(NotImplementedError, match=r"the backward of KV-cache attention"):
        out.sum().backward()


def test_no_backward_compiled(emulated):
    q, k, v, kd, vd = _tensors(seed=6)
    q.requires_grad_()
    seqlens = _i32([1, 2, 3])

    def fn(q, k, v, seqlens, kd, vd):
        return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, k_descale=kd, v_descale=vd)

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, seqlens, kd, vd)
    with pytest.raises(NotImplementedError, match="the backward through an e4m3 KV cache"):
        out.sum().backward()


def test_custom_op_registration(emulated):
    """opcheck's fake-tensor and AOT-dispatch checks with e4m3 caches and descales. Its test_schema cannot run on
    float8 CPU tensors (its mutation check calls torch.allclose, which has no float8 CPU kernel): the schema (two
    optional tensors at the end, nothing mutated) and the caches' bytes after a call are checked here instead."""
    q, k, v, kd, vd = _tensors(batch=3, slots=4, seqlen_q=2, seed=7)
    seqlens, idx = _i32([3, 60, 20]), _i32([1, 3, 0])
    qp, cu_q = q.reshape(6, 8, 64), _i32([0, 1, 4, 6])
    utils = ("test_faketensor", "test_aot_dispatch_static")
    op = torch.ops.flashcore.attention_kvcache_serving_fwd.default
    schema = str(op._schema)
    assert schema.endswith("SymInt max_seqlen_q=0, Tensor? k_descale=None, Tensor? v_descale=None, "
                           "Tensor? q_descale=None) -> (Tensor, Tensor)")
    assert "!" not in schema  # no argument is mutated
    before = [_bits(t).clone() for t in (k, v)] + [kd.clone(), vd.clone()]
    op(q, k[:3], v[:3], seqlens, True, 0.0, True, k_descale=kd, v_descale=vd)
    assert all(torch.equal(a, b) for a, b in zip(before, [_bits(k), _bits(v), kd, vd]))
    torch.library.opcheck(op, (qp, k, v, seqlens, True, 0.0, True),
                          dict(cache_batch_idx=idx, cu_seqlens_q=cu_q, max_seqlen_q=3, k_descale=kd, v_descale=vd),
                          test_utils=utils)
    torch.library.opcheck(op, (q, k[:3], v[:3], seqlens, False, 0.125, False), dict(k_descale=kd), test_utils=utils)
    kp, vp, table = _paged(k, v, [64] * 4, 16)
    torch.library.opcheck(op, (q, kp, vp, seqlens, True, 0.0, True),
                          dict(block_table=table, cache_batch_idx=idx, v_descale=vd), test_utils=utils)


def test_fake_checks_and_shapes(emulated):
    """The fake implementation raises what the op raises and gives its shapes (out in q's dtype)."""
    q, k, v, kd, vd = _tensors(seed=8)
    seqlens = _i32([3, 60, 20])
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    fq, fk, fv, fs, fkd, fvd = (mode.from_tensor(t) for t in (q, k, v, seqlens, kd, vd))
    with mode:
        out, lse = torch.ops.flashcore.attention_kvcache_serving_fwd(fq, fk, fv, fs, True, 0.0, True, k_descale=fkd,
                                                                     v_descale=fvd)
        assert out.shape == q.shape and out.dtype == torch.bfloat16 and lse.shape == (3, 8, 2)
        with pytest.raises(ValueError, match=r"k_descale must have shape \(batch, num_heads_kv\) = \(3, 2\)"):
            torch.ops.flashcore.attention_kvcache_serving_fwd(fq, fk, fv, fs, True, 0.0, True, k_descale=fkd[:2])
        with pytest.raises(ValueError, match="window_size is set, but an e4m3 KV cache"):
            torch.ops.flashcore.attention_kvcache_serving_fwd(fq, fk, fv, fs, False, 0.0, True, window_size_left=4,
                                                              window_size_right=4)
        with pytest.raises(ValueError, match="v_descale is set, but k_cache is torch.bfloat16"):
            bf16_cache = fq.new_empty(3, 64, 2, 64)
            torch.ops.flashcore.attention_kvcache_serving_fwd(fq, bf16_cache, bf16_cache, fs, False, 0.0, True,
                                                              v_descale=fvd)
    with pytest.raises(TypeError, match="k must have q's dtype torch.bfloat16 \\(rows appended to an e4m3 cache"):
        new = torch.zeros(3, 1, 2, 64).to(E4M3)
        torch.ops.flashcore.attention_kvcache_serving_append_fwd(q, k.clone(), v.clone(), seqlens, new, new, True,
                                                                 0.0, True)
    assert not emulated


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph(emulated, backend):
    """torch.compile of a decode step on an e4m3 cache with cache slots and a per-tensor v_descale (expanded in the
    graph), against the eager call."""
    torch._dynamo.reset()
    q, k, v, kd, _ = _tensors(batch=3, slots=4, seqlen_q=1, seed=9)
    vd = torch.tensor(0.625)
    seqlens, idx = _i32([3, 60, 20]), _i32([1, 3, 0])

    def fn(q, k, v, seqlens, idx, kd, vd):
        return flashcore.attention_with_kvcache(q, k, v, cache_seqlens=seqlens, cache_batch_idx=idx, k_descale=kd,
                                                v_descale=vd, causal=True, return_softmax_lse=True)

    want = fn(q, k, v, seqlens, idx, kd, vd)
    got = torch.compile(fn, fullgraph=True, backend=backend)(q, k, v, seqlens, idx, kd, vd)
    torch.testing.assert_close(got, want)
    assert torch.equal(emulated[-1]["v_descale"], torch.full((3, 2), 0.625))


# ---------------------------------------------------------------------------------------------------------------
# The C params, through the stub library playing 0.9 and 0.8.


@pytest.fixture(scope="module")
def stub_v09(stub_builder, tmp_path_factory):
    return stub_builder(tmp_path_factory.mktemp("stub_v09"), "libflashcore_v09.so", "-DSTUB_VERSION_MINOR=9")


@pytest.fixture(scope="module")
def stub_v08(stub_builder, tmp_path_factory):
    return stub_builder(tmp_path_factory.mktemp("stub_v08"), "libflashcore_v08.so", "-DSTUB_VERSION_MINOR=8")


def _seen(lib):
    seen = _lib.AttentionParamsStruct()
    lib._cdll.stub_last_params(ctypes.byref(seen))
    return seen


def test_library_methods(use_library, stub_v09, stub_v08, stub_builder, tmp_path_factory):
    use_library(stub_v09)
    lib = _lib.load()
    assert lib.version[:2] == (0, 9) and lib.has_kv_fp8()
    params = lib.set_kv_fp8(lib.new_params(), k_descale=0x1000, v_descale=0)
    assert (params.flags, params.k_descale, params.v_descale, params.q_descale) == (2, 0x1000, None, None)
    params.flags = _lib.FLAG_V_TRANSPOSED
    assert lib.set_kv_fp8(params).flags == 3  # or-ed in
    use_library(stub_v08)
    lib = _lib.load()
    assert lib.version[:2] == (0, 8) and lib.has_kvcache_serving() and not lib.has_kv_fp8()
    with pytest.raises(RuntimeError, match=r"needs a 0.9 library or newer; .*libflashcore_v08.so is version "
                                           r"0.8.0-stub"):
        lib.set_kv_fp8(lib.new_params())
    # What the bindings keep from happening: a 0.8 library refuses the unknown flag bit itself (the stub as the
    # library does: INVALID_ARGUMENT, a ValueError).
    params = lib.new_params()
    params.flags = _lib.FLAG_KV_FP8_E4M3
    with pytest.raises(ValueError, match="flags = 2 has bits this library does not know"):
        lib.validate(params)
    # A version of 0.9 with the 0.7 layout (only a stub can be that): not the e4m3 cache's library either.
    use_library(stub_builder(tmp_path_factory.mktemp("stub_v09_l7"), "libflashcore_v09_l7.so",
                             "-DSTUB_VERSION_MINOR=9", "-DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V7_SIZE"))
    assert not _lib.load().has_kv_fp8()


def test_kernel_params_reach_c(use_library, stub_v09):
    """kernel_params of an e4m3 cache: flags = FLAG_KV_FP8_E4M3, dtype q's, the descale pointers (no q_descale), the
    cache's strides in elements (1-byte ones), with a paged cache, cache slots and packed queries."""
    use_library(stub_v09)
    lib = _lib.load()
    q, k, v, kd, vd = _tensors(batch=3, slots=5, seqlen_q=2)
    kp, vp, table = _paged(k, v, [64] * 5, 16)
    qp, cu_q, lens, idx = q.reshape(6, 8, 64), _i32([0, 1, 4, 6]), _i32([3, 60, 20]), _i32([4, 0, 2])
    out, lse = torch.empty(6, 8, 64).bfloat16(), torch.empty(8, 6)
    params = _ops.kernel_params(lib, qp, kp, vp, out, lse, True, 0.0, lens, block_table=table, cu_seqlens_q=cu_q,
                                max_seqlen_q=3, kv_batch_idx=idx, descales=(None, kd, vd))
    lib.forward(params, 0)
    seen = _seen(lib)
    assert seen.flags == _lib.FLAG_KV_FP8_E4M3 and seen.dtype == _lib.DTYPE_BF16
    assert (seen.k_descale, seen.v_descale, seen.q_descale) == (kd.data_ptr(), vd.data_ptr(), None)
    assert (seen.k, seen.v, seen.k_strides.seq, seen.k_strides.head, seen.k_strides.batch) == (
        kp.data_ptr(), vp.data_ptr(), 2 * 64, 64, 16 * 2 * 64)
    assert (seen.block_table, seen.page_size, seen.kv_batch_idx, seen.kv_batch_size, seen.cu_seqlens_q) == (
        table.data_ptr(), 16, idx.data_ptr(), 5, cu_q.data_ptr())
    assert seen.precision == 0 and seen.out_dtype == _lib.DTYPE_SAME and seen.k_new is None
    # Dense, no descales: the flag alone.
    params = _ops.kernel_params(lib, q, k[:3], v[:3], torch.empty(3, 2, 8, 64).bfloat16(), None, False, 0.0, lens)
    assert params.flags == 2 and params.k_descale is None and params.v_descale is None
    with pytest.raises(ValueError, match="q_descale is not taken with an e4m3 KV cache"):
        _ops.kernel_params(lib, q, k[:3], v[:3], torch.empty(3, 2, 8, 64).bfloat16(), None, False, 0.0, lens,
                           descales=(kd, None, None))
    # A 16-bit cache: no flag.
    params = _ops.kernel_params(lib, q, k[:3].bfloat16(), v[:3].bfloat16(), torch.empty(3, 2, 8, 64).bfloat16(), None,
                                False, 0.0, lens)
    assert params.flags == 0


def _through_the_stub(monkeypatch, seen):
    """Run the real front end and op on CPU tensors down to the stub library: no device check, and the enqueue
    without CUDA (the workspace query, then the forward on stream 0). `seen` receives the params and the descale
    values at their pointers (read while the op's tensors are alive)."""
    monkeypatch.setattr(_ops, "_check_device", lambda q, k, v: None)

    def enqueue(lib, params, device):
        assert lib.workspace_size(params) == 0
        lib.forward(params, 0)
        read = lambda ptr, n: list((ctypes.c_float * n).from_address(ptr)) if ptr else None  # noqa: E731
        n = params.batch * params.num_heads_kv
        seen.append((_seen(lib), read(params.k_descale, n), read(params.v_descale, n)))

    monkeypatch.setattr(_ops, "_enqueue", enqueue)


def test_front_end_reaches_c(use_library, stub_v09, monkeypatch):
    use_library(stub_v09)
    seen = []
    _through_the_stub(monkeypatch, seen)
    q, k, v, kd, _ = _tensors(batch=3, slots=4, seqlen_q=1, seed=10)
    kp, vp, table = _paged(k, v, [64] * 4, 64)
    lens, idx = _i32([3, 60, 20]), _i32([3, 1, 0])
    out, lse = flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=table,
                                                cache_batch_idx=idx, k_descale=kd, v_descale=torch.tensor(0.5),
                                                causal=True, return_softmax_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape and lse.shape == (3, 8, 1)
    (params, k_values, v_values), = seen
    assert params.flags == _lib.FLAG_KV_FP8_E4M3 and params.dtype == _lib.DTYPE_BF16 and params.q_descale is None
    assert params.k_descale == kd.data_ptr() and k_values == kd.flatten().tolist()
    assert v_values == [0.5] * 6  # the per-tensor factor, expanded to (B, Hkv) contiguous
    assert (params.k, params.block_table, params.kv_batch_idx, params.kv_batch_size, params.seqused_k) == (
        kp.data_ptr(), table.data_ptr(), idx.data_ptr(), 4, lens.data_ptr())
    assert (params.batch, params.seqlen_q, params.seqlen_k, params.num_heads_q, params.num_heads_kv,
            params.head_dim, params.head_dim_v) == (3, 1, 64, 8, 2, 64, 0)
    # A cache view whose strides are not multiples of 16 bytes is copied (kernel_operand), descales unchanged.
    wide = torch.zeros(3, 64, 2, 72).to(E4M3)
    flashcore.attention_with_kvcache(q, wide[..., :64], wide[..., 8:], cache_seqlens=lens, k_descale=kd)
    params = seen[-1][0]
    assert params.flags == 2 and params.k_strides.head == 64 and params.k != wide.data_ptr()


def test_front_end_refused_by_the_08_stub(use_library, stub_v08, monkeypatch):
    use_library(stub_v08)
    seen = []
    _through_the_stub(monkeypatch, seen)
    q, k, v, kd, vd = _tensors(seed=11)
    with pytest.raises(RuntimeError, match=r"libflashcore_v08.so \(version 0.8.0-stub\) predates it: a 0.9 library"):
        flashcore.attention_with_kvcache(q, k, v, cache_seqlens=_i32([1, 2, 3]), k_descale=kd, v_descale=vd)
    assert not seen
    flashcore.attention_with_kvcache(q, k.bfloat16(), v.bfloat16(), cache_seqlens=_i32([1, 2, 3]),
                                     cache_batch_idx=_i32([2, 1, 0]))  # a 16-bit cache: the 0.8 call
    assert len(seen) == 1 and seen[0][0].flags == 0

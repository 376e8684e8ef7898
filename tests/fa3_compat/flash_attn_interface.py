"""FlashAttention-3's Python interface names, on FlashCore's public API: a test shim, not a port.

FA3's own test suite (hopper/test_flash_attn.py of Dao-AILab/flash-attention, fetched unmodified into
.carry/fa3tests/, which git ignores; tools/run_fa3_tests.sh runs it) imports `flash_attn_interface`. With
tests/fa3_compat/ first on the path (and `-p fa3_plugin`, which loads this file under that name), it gets this
module: the FA3 names below, each taking FA3's arguments in FA3's order, and calling
flashcore.attention / flashcore.varlen_attention / flashcore.attention_with_kvcache. Nothing of FA3's code is here.

The rules (what makes a pass mean something):

- An argument or value FlashCore has no counterpart for skips the test, `pytest.skip("flashcore: <feature> not
  supported (...)")`, before FlashCore is called: never computed some other way, never dropped. The list is in
  `unsupported()`'s callers; each reason names the argument.
- Only exact equivalences are translated: a `window_size` given as a tensor becomes two ints; `seqused_q` /
  `seqused_k` equal to the lengths cu_seqlens already gives are left out (the same problem; a `seqused_q` or
  `seqused_k` that leaves rows unused is passed on, `seqused_q` to a 0.8 library only: an older one skips); rotary
  arguments that FA3 ignores without `rotary_cos` (`rotary_seqlens`, `rotary_interleaved`) are ignored, and with it
  all four are passed on (a 0.8 library; an older one skips); FA3's `num_splits` for the KV cache is FlashCore's
  (0: the library's choice, 1: none, n: up to n). Page sizes are passed on as they are (any size since 0.8; an
  older library skips those that are not multiples of 16).
- Execution-strategy hints (`pack_gqa`, `num_splits` of flash_attn_func / flash_attn_varlen_func, `sm_margin`,
  `scheduler_metadata` / get_scheduler_metadata) do not change the result in FA3, and FlashCore chooses its own
  strategy. FLASHCORE_FA3_HINTS=skip (the default) runs a call only when the hint asks for nothing beyond FA3's plain
  path (pack_gqa None / False, num_splits 0 / 1, sm_margin 0, no scheduler metadata) and skips otherwise;
  FLASHCORE_FA3_HINTS=ignore runs such calls with FlashCore's own strategy (the result is still FlashCore's,
  computed for the same problem; the run's summary names the mode).
- What FlashCore's library may or may not have (compiled head dims, (head_dim, head_dim_v) pairs and dtypes, the
  variants window_size / softcap / attention_chunk, an 8-bit kernel for a head dim, a backward) is asked of it:
  flashcore.capabilities(), the front ends' signatures, and for the rest one tiny call of the same kind (a probe,
  cached per key) whose error, if any, is quoted in the skip reason. The test's own calls are never wrapped in
  try/except: any error they raise fails the test.
- A v whose head dim differs from q's and k's (FA3's hdimdiff: dv = 128 with d = 192, DeepSeek MLA's) is FlashCore's
  head_dim_v: passed on as it is where the library compiles the pair (capabilities().head_dim_pairs, a 0.7 library),
  skipped otherwise, and with 8-bit inputs (FlashCore's 8-bit path takes one head dim). Its backward is asked of
  FlashCore like any other (a probe with v of that head dim, whose gradient call reaches the library's backward):
  FlashCore 0.9's sm90 backend takes (192, 128), and the test's autograd.grad then runs on FlashCore; a library or
  backend without it (0.7 / 0.8, the portable backend) refuses the probe, and the test skips when it calls
  autograd.grad, after its forward was checked, quoting the refusal. Likewise head dims 96 and 192 (0.9's sm90
  backward) and 256: never a hard-coded list.
- An e4m3 KV cache under 16-bit q (flash_attn_with_kvcache with float8_e4m3fn k_cache / v_cache and bf16 / fp16 q) is
  FlashCore's (0.9): passed on with k_descale / v_descale as they are. FA3's own fp8 cases quantize q too: e4m3 q
  skips (FlashCore's KV-cache calls keep q in 16 bits), and so does what FlashCore 0.9's e4m3 cache does not take
  (8-bit rows to append, the variants, head_dim_v, pages not a multiple of 16 rows, a library older than 0.9).
- A call whose inputs require grad but whose backward FlashCore does not have (variants, 8-bit, a head dim without a
  backward kernel, varlen with seqused_k or seqused_q, ...) returns its real forward output through a node whose
  backward skips the test, naming the reason: the forward was checked by then (fa3_plugin reports such skips as
  "after N calls").

`calls` counts the FlashCore calls that returned in the current test (fa3_plugin resets it per test).
"""

from __future__ import annotations

import inspect
import os
from typing import Optional, Tuple, Union

import pytest
import torch

import flashcore

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "get_scheduler_metadata",
    "flash_attn_combine",
]

SHIM = True  # fa3_plugin checks that `flash_attn_interface` is this module, not FA3's build
HINT_MODES = ("skip", "ignore")
calls = 0  # FlashCore calls of this shim that returned, in the current test

FP8 = torch.float8_e4m3fn
_16BIT = (torch.float16, torch.bfloat16)


def hint_mode() -> str:
    mode = os.environ.get("FLASHCORE_FA3_HINTS", "skip")
    if mode not in HINT_MODES:
        raise ValueError(f"FLASHCORE_FA3_HINTS must be one of {HINT_MODES}, got {mode!r}")
    return mode


def skip(feature: str, detail: str = "") -> None:
    """pytest.skip with the shim's reason format."""
    pytest.skip(f"flashcore: {feature} not supported" + (f" ({detail})" if detail else ""))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------------------------------------------
# What the loaded library has. Module-level functions so that the CPU tests can replace them.

_CAPABILITIES = None


def capabilities():
    global _CAPABILITIES
    if _CAPABILITIES is None:
        _CAPABILITIES = flashcore.capabilities()
    return _CAPABILITIES


def compiled_head_dims() -> Tuple[int, ...]:
    return tuple(capabilities().head_dims)


def compiled_dtypes() -> Tuple[str, ...]:
    return tuple(capabilities().dtypes)


def compiled_head_dim_pairs() -> Tuple[Tuple[int, int], ...]:
    """The (head_dim, head_dim_v) pairs with a V head dim of its own the library compiles (none before 0.7)."""
    return tuple(tuple(p) for p in getattr(capabilities(), "head_dim_pairs", ()))


def has_kv_fp8() -> bool:
    """Whether the loaded library takes an e4m3 KV cache under 16-bit q (0.9: FLASHCORE_FLAG_KV_FP8_E4M3)."""
    from flashcore import _lib

    return _lib.load().has_kv_fp8()


def has_kvcache_serving() -> bool:
    """Whether the loaded library takes FA3's serving arguments of flash_attn_with_kvcache (0.8: cache_batch_idx,
    cache_leftpad, cu_seqlens_k_new; packed queries on a cache it took before)."""
    from flashcore import _lib

    return _lib.load().has_kvcache_serving()


_PROBES: dict = {}


def probe(key, thunk) -> Optional[str]:
    """Run `thunk` (one tiny FlashCore call) once per key: None if it returned, else its error as one short line."""
    if key not in _PROBES:
        try:
            thunk()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            _PROBES[key] = None
        except Exception as exc:  # the probe's answer; the tests' own calls are never caught
            lines = str(exc).strip().splitlines() or [""]
            _PROBES[key] = f"probe: {type(exc).__name__}: {lines[0][:160]}"
    return _PROBES[key]


def _tiny(shape, dtype, device, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(0)
    t = torch.randn(shape, generator=g, dtype=torch.float32).to(device)
    t = t.to(dtype) if dtype != FP8 else t.clamp(-4, 4).to(FP8)
    return t.requires_grad_() if requires_grad else t


def _probe_call(entry: str, dtype, head_dim: int, causal: bool, device, variants: dict, *, backward=False,
                seqused_k=False, seqused_q=False, deterministic=False, head_dim_v: Optional[int] = None,
                kv_fp8=False):
    """A thunk making one tiny call of `entry` with these settings (and its backward with backward=True); v (and the
    cache's v) of head_dim_v columns when given, else head_dim. kv_fp8: the cache in e4m3 (with descales of 1)."""
    dv = head_dim if head_dim_v is None else head_dim_v

    def thunk():
        s, hq, hk = 32, 2, 1
        if entry == "attention":
            q = _tiny((1, s, hq, head_dim), dtype, device, backward)
            k = _tiny((1, s, hk, head_dim), dtype, device, backward)
            v = _tiny((1, s, hk, dv), dtype, device, backward)
            extra = {}
            if dtype == FP8:
                extra = {n: torch.ones(1, hk, device=device) for n in ("q_descale", "k_descale", "v_descale")}
            if deterministic:
                extra["deterministic"] = True
            out = flashcore.attention(q, k, v, causal=causal, **extra, **variants)
            inputs = (q, k, v)
        elif entry == "varlen_attention":
            q = _tiny((s, hq, head_dim), dtype, device, backward)
            k = _tiny((s, hk, head_dim), dtype, device, backward)
            v = _tiny((s, hk, dv), dtype, device, backward)
            cu = torch.tensor([0, s], dtype=torch.int32, device=device)
            used = torch.tensor([s - 3], dtype=torch.int32, device=device) if seqused_k else None
            used_q = {"seqused_q": torch.tensor([s - 5], dtype=torch.int32, device=device)} if seqused_q else {}
            out = flashcore.varlen_attention(q, k, v, cu, cu, s, s, causal=causal, seqused_k=used, **used_q,
                                             **variants)
            inputs = (q, k, v)
        else:  # attention_with_kvcache
            q = _tiny((1, 1, hq, head_dim), dtype, device)
            cache = FP8 if kv_fp8 else dtype
            k, v = _tiny((1, s, hk, head_dim), cache, device), _tiny((1, s, hk, dv), cache, device)
            extra = {n: torch.ones(1, hk, device=device) for n in ("k_descale", "v_descale")} if kv_fp8 else {}
            out = flashcore.attention_with_kvcache(q, k, v, cache_seqlens=s, causal=causal, **extra, **variants)
            inputs = ()
        if backward:
            torch.autograd.grad(out, inputs, torch.ones_like(out))

    return thunk


def _check_dtype(fn_name: str, q: torch.Tensor, fp8_ok: bool) -> None:
    if q.dtype == FP8:
        if not fp8_ok:
            skip(f"float8_e4m3fn inputs to {fn_name}", "FlashCore's 8-bit path is dense flashcore.attention only")
        if "float8_e4m3fn" not in compiled_dtypes():
            skip("float8_e4m3fn", f"not compiled into this library: {list(compiled_dtypes())}")
        return
    if q.dtype not in _16BIT:
        skip(f"dtype {_dtype_name(q.dtype)}", "FlashCore takes float16 / bfloat16 (and e4m3 on dense calls)")
    if _dtype_name(q.dtype) not in compiled_dtypes():
        skip(f"dtype {_dtype_name(q.dtype)}", f"not compiled into this library: {list(compiled_dtypes())}")


def _check_head_dims(q: torch.Tensor, v: torch.Tensor) -> None:
    """q's (and k's) head dim d must be compiled; a v of another head dim dv (FA3's hdimdiff) the pair (d, dv), which
    FlashCore takes as head_dim_v (16-bit inputs only)."""
    d, dv = q.shape[-1], v.shape[-1]
    if dv == d:
        if d not in compiled_head_dims():
            skip(f"head_dim={d}", f"compiled head dims: {list(compiled_head_dims())}")
        return
    if q.dtype == FP8:
        skip("head_dim_v != head_dim with float8_e4m3fn inputs",
             f"v has {dv}, q and k {d}: FlashCore's 8-bit path takes one head dim for q, k and v")
    pairs = compiled_head_dim_pairs()
    if (d, dv) not in pairs:
        skip("head_dim_v != head_dim", f"(head_dim, head_dim_v) = ({d}, {dv}) is not compiled into this library; "
                                       f"compiled pairs: {[tuple(p) for p in pairs]}")


def _window(window_size) -> Tuple[int, int]:
    """FA3's window_size (a pair, or a 2-element tensor as the tests pass it) as two ints."""
    values = window_size.tolist() if isinstance(window_size, torch.Tensor) else list(window_size)
    if len(values) != 2:
        raise ValueError(f"window_size must have 2 entries, got {window_size!r}")
    return int(values[0]), int(values[1])


def _variants(fn, entry: str, q, v, causal: bool, window_size, softcap, attention_chunk) -> dict:
    """The variant keyword arguments for FlashCore (only those set), after checking that the front end takes them and
    that the library runs them (a probe of the same entry, dtype, head dims (q's and v's) and causal). FA3's
    window_size, softcap and attention_chunk are FlashCore's arguments of the same names and meanings (attention_chunk:
    query i sees key j iff j // c == (i + Sk - Sq) // c, FA3's construct_chunk_mask), passed as ints."""
    window = _window(window_size)
    kwargs = {}
    if window != (-1, -1):
        kwargs["window_size"] = window
    if softcap is not None and float(softcap) != 0.0:
        kwargs["softcap"] = float(softcap)
    if attention_chunk:
        kwargs["attention_chunk"] = int(attention_chunk)
    if not kwargs:
        return kwargs
    if q.dtype == FP8:
        skip(f"{', '.join(kwargs)} with float8_e4m3fn inputs", "FlashCore's 8-bit path takes no variants")
    params = inspect.signature(fn).parameters
    probe_values = {"window_size": (4, 0) if causal else (4, 4), "softcap": 30.0, "attention_chunk": 16}
    for name in kwargs:
        if name not in params:
            skip(name, f"flashcore.{entry} has no {name} argument in this version")
        reason = probe((entry, name, q.dtype, q.shape[-1], v.shape[-1], causal),
                       _probe_call(entry, q.dtype, q.shape[-1], causal, q.device, {name: probe_values[name]},
                                   head_dim_v=v.shape[-1]))
        if reason is not None:
            skip(name, reason)
    return kwargs


def _check_kv_fp8(q, k_cache, v_cache, k, page_table, window_size, softcap, attention_chunk,
                  causal: bool) -> None:
    """An e4m3 k_cache / v_cache under 16-bit q, FlashCore 0.9's: what it does not take skips, before FlashCore is
    called; whether the library runs it for this dtype / head dim / causal is asked of it (a probe)."""
    what = "a float8_e4m3fn KV cache"
    if not has_kv_fp8():
        skip(what, "the loaded libflashcore.so predates FlashCore 0.9's e4m3 KV cache")
    if k is not None and (k.dtype.itemsize == 1 or q.dtype == FP8):
        skip(f"{str(k.dtype).replace('torch.', '')} k / v appended to {what} under {_dtype_name(q.dtype)} q",
             "FlashCore appends rows in q's 16-bit dtype to an e4m3 cache and quantizes them itself")
    left, right = _window(window_size)
    variants = [n for n, used in (("window_size", left != -1 or (not causal and right != -1)),
                                  ("softcap", softcap is not None and float(softcap) != 0.0),
                                  ("attention_chunk", bool(attention_chunk))) if used]
    if variants:
        skip(f"{', '.join(variants)} with {what}", "FlashCore 0.9's e4m3 KV cache takes no attention variants")
    if v_cache.shape[-1] != q.shape[-1]:
        skip(f"head_dim_v != head_dim with {what}", "FlashCore 0.9's e4m3 KV cache takes one head dim")
    if page_table is not None and k_cache.shape[1] % 16 != 0:
        skip(f"page_size={k_cache.shape[1]} with {what}", "FlashCore 0.9's e4m3 KV cache takes pages of a multiple "
                                                          "of 16 rows")
    reason = probe(("kv_fp8", q.dtype, q.shape[-1], causal),
                   _probe_call("attention_with_kvcache", q.dtype, q.shape[-1], causal, q.device, {}, kv_fp8=True))
    if reason is not None:
        skip(f"{what} with {_dtype_name(q.dtype)} q, head_dim={q.shape[-1]}{' (causal)' if causal else ''}", reason)


def _check_hints(fn_name: str, *, pack_gqa=None, num_splits=None, sm_margin=0) -> None:
    if hint_mode() == "ignore":
        return
    if pack_gqa:
        skip("pack_gqa=True", f"a forced FA3 strategy; {fn_name} on FlashCore chooses its own (FLASHCORE_FA3_HINTS=ignore)")
    if num_splits is not None and num_splits not in (0, 1):
        skip(f"num_splits={num_splits}",
             f"a forced split count; {fn_name} on FlashCore chooses its own (FLASHCORE_FA3_HINTS=ignore)")
    if sm_margin:
        skip(f"sm_margin={sm_margin}", "FlashCore takes no SM margin (FLASHCORE_FA3_HINTS=ignore)")


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


class _SkipOnBackward(torch.autograd.Function):
    """Passes a real forward result on; its backward skips the test (FlashCore has no backward for the call)."""

    @staticmethod
    def forward(ctx, reason, result, *inputs):
        ctx.reason = reason
        return result.clone()

    @staticmethod
    def backward(ctx, *grads):
        pytest.skip(ctx.reason)


def _no_backward(reason: str, result, inputs):
    """`result` (out, or (out, lse)) detached from FlashCore's graph and re-attached to `inputs` through a node whose
    backward skips with `reason`."""
    grad_inputs = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    if isinstance(result, tuple):
        return tuple(_SkipOnBackward.apply(reason, r.detach(), *grad_inputs) for r in result)
    return _SkipOnBackward.apply(reason, result.detach(), *grad_inputs)


def _backward_reason(fn_name: str, entry: str, q, v, causal: bool, variants: dict, *, seqused_k=False,
                     seqused_q=False, deterministic=False) -> Optional[str]:
    """Why FlashCore has no backward for this call (None: it has one), from a tiny backward of the same kind: q's head
    dim, v of the call's head dim (head_dim_v where it differs: the library's backward decides on the pair), the
    call's dtype, causal flag, variants and seqused."""
    d, dv = q.shape[-1], v.shape[-1]
    key = ("backward", entry, q.dtype, d, dv, causal, tuple(sorted(variants)), seqused_k, seqused_q, deterministic)
    reason = probe(key, _probe_call(entry, q.dtype, d, causal, q.device, variants, backward=True,
                                    seqused_k=seqused_k, seqused_q=seqused_q, deterministic=deterministic,
                                    head_dim_v=dv))
    if reason is None:
        return None
    what = [_dtype_name(q.dtype), f"head_dim={d}"] + ([f"head_dim_v={dv}"] if dv != d else []) + list(variants)
    what += [n for n, on in (("seqused_q", seqused_q), ("seqused_k", seqused_k)) if on]
    return f"flashcore: backward of {fn_name} ({', '.join(what)}) not supported ({reason})"


def _count(result):
    global calls
    calls += 1
    return result


# ---------------------------------------------------------------------------------------------------------------
# FA3's names.


def flash_attn_func(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FA3's flash_attn_func on flashcore.attention. Returns out, or (out, softmax_lse (B, H, Sq)) with
    return_attn_probs, as FA3 does."""
    name = "flash_attn_func"
    if qv is not None:
        skip("qv", "FA3's extra q_v . v score term (MLA decode)")
    _check_dtype(name, q, fp8_ok=True)
    _check_head_dims(q, v)
    descales = {n: t for n, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
                if t is not None}
    if descales and q.dtype != FP8:
        skip(f"{next(iter(descales))} with {_dtype_name(q.dtype)} inputs", "FlashCore takes descales for e4m3 only")
    _check_hints(name, pack_gqa=pack_gqa, num_splits=num_splits, sm_margin=sm_margin)
    causal = bool(causal)
    if q.dtype == FP8:
        reason = probe(("fp8", q.shape[-1], causal), _probe_call("attention", FP8, q.shape[-1], causal, q.device, {}))
        if reason is not None:
            skip(f"float8_e4m3fn with head_dim={q.shape[-1]}{' (causal)' if causal else ''}", reason)
    variants = _variants(flashcore.attention, "attention", q, v, causal, window_size, softcap, attention_chunk)
    no_backward = None
    if _needs_grad(q, k, v):
        no_backward = _backward_reason(name, "attention", q, v, causal, variants, deterministic=bool(deterministic))
    kwargs = dict(causal=causal, softmax_scale=softmax_scale, return_lse=bool(return_attn_probs), **descales,
                  **variants)
    if deterministic:
        kwargs["deterministic"] = True
    result = flashcore.attention(q, k, v, **kwargs)
    if no_backward is not None:
        result = _no_backward(no_backward, result, (q, k, v))
    return _count(result)


def _same_lengths(seqused: torch.Tensor, cu_seqlens: torch.Tensor) -> bool:
    """Whether seqused[b] == cu_seqlens[b + 1] - cu_seqlens[b] for every b (reads both: a host sync)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return seqused.shape == lengths.shape and bool(torch.equal(seqused.to(lengths.dtype), lengths))


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    seqused_q=None,
    seqused_k=None,
    softmax_scale=None,
    causal=False,
    qv=None,
    q_descale=None, k_descale=None, v_descale=None,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    num_splits=1,
    pack_gqa=None,
    deterministic=False,
    sm_margin=0,
    return_attn_probs=False,
):
    """FA3's flash_attn_varlen_func on flashcore.varlen_attention. Returns out (total_q, H, D), or (out, softmax_lse
    (H, total_q)) with return_attn_probs."""
    name = "flash_attn_varlen_func"
    if qv is not None:
        skip("qv", "FA3's extra q_v . v score term (MLA decode)")
    _check_dtype(name, q, fp8_ok=False)
    _check_head_dims(q, v)
    for n, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None:
            skip(f"{n} in {name}", "FlashCore's varlen path is 16-bit only")
    if seqused_q is not None:
        if _same_lengths(seqused_q, cu_seqlens_q):
            seqused_q = None  # the lengths cu_seqlens_q gives: the same problem
        elif not has_kvcache_serving():
            skip("seqused_q", "query rows past seqused_q[b] inside a sequence: the loaded libflashcore.so predates "
                              "FlashCore 0.8's seqused_q")
    if seqused_k is not None and _same_lengths(seqused_k, cu_seqlens_k):
        seqused_k = None  # likewise
    if deterministic:
        skip(f"deterministic=True in {name}", "flashcore.varlen_attention has no deterministic backward")
    _check_hints(name, pack_gqa=pack_gqa, num_splits=num_splits, sm_margin=sm_margin)
    causal = bool(causal)
    variants = _variants(flashcore.varlen_attention, "varlen_attention", q, v, causal, window_size, softcap,
                         attention_chunk)
    no_backward = None
    if _needs_grad(q, k, v):
        no_backward = _backward_reason(name, "varlen_attention", q, v, causal, variants,
                                       seqused_k=seqused_k is not None, seqused_q=seqused_q is not None)
    kwargs = dict(causal=causal, softmax_scale=softmax_scale, return_lse=bool(return_attn_probs), **variants)
    if seqused_k is not None:
        kwargs["seqused_k"] = seqused_k
    if seqused_q is not None:
        kwargs["seqused_q"] = seqused_q
    result = flashcore.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k),
                                        **kwargs)
    if no_backward is not None:
        result = _no_backward(no_backward, result, (q, k, v))
    return _count(result)


class _NoSchedulerMetadata:
    """What get_scheduler_metadata returns with FLASHCORE_FA3_HINTS=ignore: FlashCore plans each call itself."""

    def __repr__(self):
        return "<flashcore: no scheduler metadata (FlashCore plans each call itself)>"


NO_SCHEDULER_METADATA = _NoSchedulerMetadata()


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    qv=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_table: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    softcap=0.0,
    rotary_interleaved=True,
    scheduler_metadata=None,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
    return_softmax_lse=False,
):
    """FA3's flash_attn_with_kvcache on flashcore.attention_with_kvcache (dense or paged cache of any page size, k / v
    appended in place; cache_batch_idx, cache_leftpad (dense caches), packed queries (cu_seqlens_q, max_seqlen_q),
    packed new keys (cu_seqlens_k_new) and the rotary embedding (rotary_cos, rotary_sin, rotary_interleaved,
    rotary_seqlens) passed on; an e4m3 k_cache / v_cache under 16-bit q with k_descale / v_descale, a 0.9 library).
    Returns out, or (out, softmax_lse (B, H, Sq), or (H, total_q) with packed queries) with return_softmax_lse."""
    name = "flash_attn_with_kvcache"
    if qv is not None:
        skip("qv", "FA3's extra q_v . v score term (MLA decode)")
    if cache_leftpad is not None and page_table is not None:
        skip("cache_leftpad with page_table", "FlashCore's paged caches take no left padding, as FlashAttention-2's")
    rotary = rotary_cos is not None or rotary_sin is not None
    serving = [n for n, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                              ("cu_seqlens_k_new", cu_seqlens_k_new)) if t is not None]
    if rotary:
        serving.append("rotary embedding (rotary_cos / rotary_sin)")
    if serving and not has_kvcache_serving():
        skip(serving[0], "the loaded libflashcore.so predates FlashCore 0.8's serving arguments")
    kv_fp8 = FP8 in (k_cache.dtype, v_cache.dtype)
    if q.dtype == FP8 and not kv_fp8:
        skip(f"float8_e4m3fn q with a {_dtype_name(k_cache.dtype)} cache in {name}",
             "FlashCore's KV-cache calls take an e4m3 q on an e4m3 cache only")
    _check_dtype(name, q, fp8_ok=kv_fp8)
    _check_head_dims(q, v_cache)
    if q_descale is not None and q.dtype != FP8:
        skip(f"q_descale with {_dtype_name(q.dtype)} q in {name}", "FlashCore's 16-bit q takes no descale "
                                                                   "(k_descale / v_descale scale an e4m3 cache)")
    descales = {n: t for n, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
                if t is not None}
    if descales and not kv_fp8:
        skip(f"{next(iter(descales))} in {name}", f"FlashCore's descales scale an e4m3 KV cache only, this one is "
                                                  f"{_dtype_name(k_cache.dtype)}")
    if page_table is not None and k_cache.shape[1] % 16 != 0 and not has_kvcache_serving():
        skip(f"page_size={k_cache.shape[1]}", "the loaded libflashcore.so predates FlashCore 0.8, whose paged KV "
                                              "cache takes any page size (older ones: multiples of 16)")
    if scheduler_metadata is not None and scheduler_metadata is not NO_SCHEDULER_METADATA:
        skip("scheduler_metadata", "FA3's precomputed scheduling; FlashCore plans each call itself")
    _check_hints(name, pack_gqa=pack_gqa, sm_margin=sm_margin)  # num_splits is FlashCore's own argument here
    causal = bool(causal)
    if kv_fp8:
        _check_kv_fp8(q, k_cache, v_cache, k, page_table, window_size, softcap, attention_chunk, causal)
    variants = _variants(flashcore.attention_with_kvcache, "attention_with_kvcache", q, v_cache, causal, window_size,
                         softcap, attention_chunk)
    # rotary_seqlens and rotary_interleaved only matter with rotary_cos (FA3 reads them for the rotation only): passed
    # on with it, left out without it.
    kwargs = dict(k=k, v=v, cache_seqlens=cache_seqlens, softmax_scale=softmax_scale, causal=causal,
                  return_softmax_lse=bool(return_softmax_lse), num_splits=int(num_splits), **variants, **descales)
    if rotary:
        kwargs.update(rotary_cos=rotary_cos, rotary_sin=rotary_sin, rotary_interleaved=bool(rotary_interleaved))
        if rotary_seqlens is not None:
            kwargs["rotary_seqlens"] = rotary_seqlens
    if page_table is not None:
        kwargs["block_table"] = page_table
    for name, value in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                        ("cu_seqlens_q", cu_seqlens_q), ("max_seqlen_q", max_seqlen_q),
                        ("cu_seqlens_k_new", cu_seqlens_k_new)):
        if value is not None:  # (FlashCore's defaults otherwise: the call of a 0.7 front end stays as it was)
            kwargs[name] = value
    return _count(flashcore.attention_with_kvcache(q, k_cache, v_cache, **kwargs))


def get_scheduler_metadata(
    batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
    cache_seqlens: torch.Tensor,
    qkv_dtype=torch.bfloat16,
    headdim_v=None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    page_size: Optional[int] = None,
    max_seqlen_k_new=0,
    causal=False,
    window_size=(-1, -1),
    attention_chunk=0,
    has_softcap=False,
    num_splits=0,
    pack_gqa=None,
    sm_margin=0,
):
    """FA3 precomputes its kernel's schedule here; FlashCore plans each call itself. FLASHCORE_FA3_HINTS=skip (the
    default) skips; =ignore returns NO_SCHEDULER_METADATA, which flash_attn_with_kvcache accepts as "none"."""
    if hint_mode() == "ignore":
        return NO_SCHEDULER_METADATA
    skip("get_scheduler_metadata", "FA3's precomputed scheduling; FlashCore plans each call itself "
                                   "(FLASHCORE_FA3_HINTS=ignore)")


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """FA3's merge of split-KV partial results: FlashCore merges its own splits inside the library and has no public
    op for partial results."""
    skip("flash_attn_combine", "FlashCore has no public op that merges partial outputs")

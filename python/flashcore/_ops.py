"""PyTorch ops: the `flashcore::attention_fwd` custom op and the `attention` / `sdpa` front ends, and
`quantize_fp8` (per (batch, KV head) e4m3 quantization for the 8-bit path).

Importing this module imports torch and registers the custom ops; it does not load the native library.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import List, NamedTuple, Optional, Tuple, Union

import torch

from . import _lib

__all__ = ["attention", "sdpa", "attention_fwd", "attention_with_kvcache", "attention_kvcache_fwd",
           "varlen_attention", "varlen_attention_fwd", "quantize_fp8", "attention_bwd", "attention_variants_bwd",
           "varlen_attention_bwd", "varlen_attention_variants_bwd"]

# The softmax_scale range the C ABI accepts (besides 0, its "default" value): scale * log2(e) stays a normal float.
SOFTMAX_SCALE_MIN = 2.0**-100
SOFTMAX_SCALE_MAX = 2.0**100

# 16-bit inputs (every entry point); the 8-bit input dtype (flashcore.attention only, sm90 backend).
_DTYPE_CODES = {torch.float16: _lib.DTYPE_FP16, torch.bfloat16: _lib.DTYPE_BF16}
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3 value: quantize_fp8 maps each group's absolute maximum to it
# The 8-bit input dtypes flashcore.attention takes (quantize_fp8 makes the first); P is e4m3 for both.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_INPUT_DTYPE_CODES = {**_DTYPE_CODES, FP8_DTYPE: _lib.DTYPE_FP8_E4M3, torch.float8_e5m2: _lib.DTYPE_FP8_E5M2}
# out_dtype: the dtypes O can be written in.
_OUT_DTYPE_CODES = dict(_DTYPE_CODES)
# precision= of flashcore.attention -> flashcore_attention_params::precision.
PRECISIONS = {None: _lib.PRECISION_NATIVE, "native": _lib.PRECISION_NATIVE, "fp8": _lib.PRECISION_FP8,
              "int8": _lib.PRECISION_INT8}

# Dimension order of each layout, as indices of (batch, seq, head, dim) in the tensor.
_LAYOUTS = {"bshd": "(batch, seqlen, num_heads, head_dim)", "bhsd": "(batch, num_heads, seqlen, head_dim)"}


# ---------------------------------------------------------------------------------------------------------------
# Validation (tensor metadata only: no data access, no host sync; traceable by dynamo, usable on fake tensors).


def _dims(t: torch.Tensor, layout: str):
    """(batch, seqlen, heads, head_dim) of a tensor in `layout`."""
    b, x, y, d = t.shape
    return (b, x, y, d) if layout == "bshd" else (b, y, x, d)


def _check_device(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            raise ValueError(f"FlashCore: {name} must be a CUDA tensor, got a tensor on {t.device}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(
            f"FlashCore: q, k and v must be on the same device, got q on {q.device}, k on {k.device}, v on {v.device}"
        )


def _check_inputs(q, k, v, layout: str = "bshd", kv_batch: bool = True, allow_fp8: bool = False,
                  kv_fp8: bool = False) -> None:
    """Raise ValueError / TypeError for anything the kernel cannot take, before touching the library.
    kv_batch=False: k and v are a paged cache (num_pages, page_size, Hkv, D), whose first dimension is not q's
    batch. allow_fp8: float8_e4m3fn / float8_e5m2 inputs are accepted (flashcore.attention's dense calls only).
    kv_fp8: k and v are an e4m3 KV cache (float8_e4m3fn, both) under float16 / bfloat16 q (since 0.9;
    _check_kv_fp8_dtypes), the KV-cache calls' 8-bit mode.
    q and k share their head dim D; v may have a head dim of its own, head_dim_v (its last dimension, and O's: the
    C ABI's head_dim_v, since 0.7), its other dimensions k's. Whether the library compiles the pair is
    _check_supported's question."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"FlashCore: {name} must be 4-D {_LAYOUTS[layout]}, got shape {tuple(t.shape)}")
    if kv_fp8:
        _check_kv_fp8_dtypes(q, k, v)
    elif q.dtype in FP8_DTYPES and not allow_fp8:
        raise TypeError(
            "FlashCore: float8_e4m3fn / float8_e5m2 inputs are supported by flashcore.attention on dense batches only "
            f"(not by sdpa, KV-cache, paged, variable-length or ring calls); got q of dtype {q.dtype}"
        )
    elif q.dtype not in _DTYPE_CODES and q.dtype not in FP8_DTYPES:
        raise TypeError(f"FlashCore: q must be float16 or bfloat16 (or float8_e4m3fn / float8_e5m2 for "
                        f"flashcore.attention), got {q.dtype}")
    elif k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"FlashCore: q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"FlashCore: k and v must have the same shape but for the last dimension (v's head dim may "
                         f"differ from k's), got {tuple(k.shape)} and {tuple(v.shape)}")
    bq, _, hq, dq = _dims(q, layout)
    bk, _, hk, dk = _dims(k, layout)
    if kv_batch and bk != bq:
        raise ValueError(f"FlashCore: q and k/v must have the same batch size, got {bq} and {bk}")
    if dk != dq:
        raise ValueError(f"FlashCore: q and k must have the same head_dim, got {dq} and {dk} (v's last dimension, "
                         f"head_dim_v, may differ)")
    if q.dtype in FP8_DTYPES and v.shape[3] != dq:
        raise ValueError(f"FlashCore: 8-bit attention (float8 q, k, v) takes one head dim for q, k and v; v's last "
                         f"dimension (head_dim_v) is {v.shape[3]}, q's and k's {dq}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(
            f"FlashCore: the number of query heads ({hq}) must be a multiple of the number of key/value heads ({hk})"
        )
    _check_device(q, k, v)


def _check_flag(name: str, value) -> bool:
    """A bool argument (causal, return_lse, ...): True / False, or the ints 0 / 1 (numpy's too). Anything else
    raises, naming the argument, instead of going through bool(): flash_attn_func(q, k, v, 0.125) passes a softmax
    scale where FlashCore used to take causal, and bool(0.125) would have run causal attention silently."""
    if isinstance(value, bool):
        return value
    if isinstance(value, torch.SymBool):  # a comparison of symbolic sizes under torch.compile: guarded, as bool() did
        return bool(value)
    if isinstance(value, numbers.Integral) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        if value in (0, 1):
            return bool(value)
        raise ValueError(f"FlashCore: {name} must be a bool (or 0 / 1), got {value!r}")
    shown = f" {value!r}" if isinstance(value, (numbers.Number, str)) else ""
    raise TypeError(f"FlashCore: {name} must be a bool, got {type(value).__name__}{shown}")


def _check_scale(softmax_scale, name: str = "softmax_scale") -> float:
    """The scale to pass to the C ABI: 0.0 means the default 1/sqrt(head_dim). `name`: the argument's name in the
    caller's signature (sdpa calls it scale)."""
    if softmax_scale is None:
        return 0.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(f"FlashCore: {name} must be a float or None, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    # The C ABI's range (checked here in double precision: a scale like 1e-50 would become 0.0 as a C float,
    # which means "the default 1/sqrt(head_dim)", and be used silently).
    if not (math.isfinite(scale) and SOFTMAX_SCALE_MIN <= scale <= SOFTMAX_SCALE_MAX):
        raise ValueError(
            f"FlashCore: {name} must be a finite number in [2**-100, 2**100] (or None for 1/sqrt(head_dim)), "
            f"got {softmax_scale}"
        )
    return scale


def _check_supported(q: torch.Tensor, head_dim: int, head_dim_v: Optional[int] = None) -> _lib.Library:
    """Load the library (RuntimeError when missing) and check dtype / head_dim against its capabilities.
    head_dim_v: v's last dimension (None: head_dim). One other than head_dim needs a 0.7 library (RuntimeError naming
    the version otherwise) that compiles the pair (head_dim, head_dim_v) (Library.compiled_head_dim_pairs)."""
    lib = _lib.load()
    dtypes, head_dims = lib.compiled()
    dtype_name = str(q.dtype).replace("torch.", "")
    if dtype_name not in dtypes:
        raise TypeError(f"FlashCore: dtype {q.dtype} is not compiled into {lib.path} (compiled: {list(dtypes)})")
    if head_dim_v is None or head_dim_v == head_dim:
        if head_dim not in head_dims:
            raise ValueError(f"FlashCore: head_dim {head_dim} is not supported (compiled head dims: {list(head_dims)})")
        return lib
    if not lib.has_head_dim_v():
        raise RuntimeError(f"FlashCore: v's head dim ({head_dim_v}) differs from q's and k's ({head_dim}), but "
                           f"{lib.path} (version {lib.version_string()}) predates head_dim_v: a 0.7 library or newer "
                           f"is needed (older ones take one head dim for q, k and v)")
    pairs = lib.compiled_head_dim_pairs()
    if (head_dim, head_dim_v) not in pairs:
        raise ValueError(f"FlashCore: (head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) is not supported: v's head "
                         f"dim differs from q's and k's, and that pair is not compiled (compiled (head_dim, "
                         f"head_dim_v) pairs: {[tuple(p) for p in pairs]}; head dims with v of q's head dim: "
                         f"{list(head_dims)})")
    return lib


# ---------------------------------------------------------------------------------------------------------------
# The 8-bit path (flashcore.attention only): float8_e4m3fn inputs with descales, or precision="fp8".


def _check_precision(precision) -> int:
    """flashcore.attention's precision= (None, "native", "fp8", "int8") as the C ABI's FLASHCORE_PRECISION_* code."""
    if precision is not None and not isinstance(precision, str):
        raise TypeError(f"FlashCore: precision must be None, 'native', 'fp8' or 'int8', got {type(precision).__name__}")
    if precision not in PRECISIONS:
        raise ValueError(f"FlashCore: precision must be None, 'native', 'fp8' or 'int8', got {precision!r}")
    return PRECISIONS[precision]


def _check_8bit_args(q, k, q_descale, k_descale, v_descale, out_dtype, precision: int) -> torch.dtype:
    """Checks of the descales, out_dtype and precision (tensor metadata only); returns O's dtype: out_dtype, else
    bfloat16 for 8-bit inputs and the input dtype for 16-bit ones."""
    if out_dtype is not None and out_dtype not in _OUT_DTYPE_CODES:
        raise TypeError(f"FlashCore: out_dtype must be torch.float16, torch.bfloat16 or None, got {out_dtype}")
    if precision not in (_lib.PRECISION_NATIVE, _lib.PRECISION_FP8, _lib.PRECISION_INT8):
        raise ValueError(f"FlashCore: precision must be PRECISION_NATIVE ({_lib.PRECISION_NATIVE}), PRECISION_FP8 "
                         f"({_lib.PRECISION_FP8}) or PRECISION_INT8 ({_lib.PRECISION_INT8}), got {precision}")
    descales = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    if q.dtype not in FP8_DTYPES:
        given = [name for name, d in descales if d is not None]
        if given:
            raise ValueError(
                f"FlashCore: {given[0]} is for 8-bit (float8) inputs only (q is {q.dtype}); with precision='fp8' "
                "or 'int8' FlashCore computes the scales of 16-bit inputs itself"
            )
        if precision == _lib.PRECISION_INT8 and out_dtype is not None and out_dtype != q.dtype:
            raise TypeError(f"FlashCore: precision='int8' writes O in the input dtype ({q.dtype}: P V runs in it); "
                            f"got out_dtype={out_dtype}")
        return q.dtype if out_dtype is None else out_dtype
    if precision != _lib.PRECISION_NATIVE:
        name = "fp8" if precision == _lib.PRECISION_FP8 else "int8"
        raise ValueError(f"FlashCore: precision='{name}' quantizes 16-bit inputs; q, k and v are already "
                         f"{str(q.dtype).replace('torch.', '')} (leave precision at None)")
    batch, heads_kv = q.shape[0], k.shape[2]
    for name, d in descales:
        if d is None:
            continue
        if not isinstance(d, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor or None, got {type(d).__name__}")
        if d.dtype != torch.float32:
            raise TypeError(f"FlashCore: {name} must be float32, got {d.dtype}")
        if d.dim() != 2 or d.shape[0] != batch or d.shape[1] != heads_kv:
            raise ValueError(f"FlashCore: {name} must have shape (batch, num_heads_kv) = ({batch}, {heads_kv}), got "
                             f"{tuple(d.shape)}")
        if d.device != q.device:
            raise ValueError(f"FlashCore: {name} is on {d.device}, q on {q.device}")
    return torch.bfloat16 if out_dtype is None else out_dtype


# (id(lib), device index, causal, kernel dtype) -> (lib, head dims with such a kernel): fixed for a library and device.
_KERNEL_HEAD_DIMS: dict = {}


def _kernel_head_dims(lib: _lib.Library, device: torch.device, causal: bool,
                      dtype: int = _lib.DTYPE_FP8_E4M3) -> Tuple[int, ...]:
    """The compiled head dims that have a kernel config of `dtype` (DTYPE_FP8_E4M3: the 8-bit path, DTYPE_INT8:
    precision="int8") for `causal` on `device`, asked once. A library that does not know `dtype` has none."""
    key = (id(lib), device.index, bool(causal), dtype)
    hit = _KERNEL_HEAD_DIMS.get(key)
    if hit is not None and hit[0] is lib:
        return hit[1]
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        try:
            dims = tuple(d for d in lib.compiled()[1] if lib.kernel_configs(dtype, d, causal))
        except (RuntimeError, TypeError, ValueError):  # e.g. DTYPE_INT8 on a library from before precision="int8"
            dims = ()
    _KERNEL_HEAD_DIMS[key] = (lib, dims)
    return dims


def _fp8_head_dims(lib: _lib.Library, device: torch.device, causal: bool,
                   dtype: int = _lib.DTYPE_FP8_E4M3) -> Tuple[int, ...]:
    """The compiled head dims that have an 8-bit kernel config of `dtype` (e4m3 or e5m2) for `causal` on `device`."""
    return _kernel_head_dims(lib, device, causal, dtype)


def _check_extended_supported(lib: _lib.Library, q: torch.Tensor, causal: bool, out_dtype: torch.dtype,
                              precision: int) -> None:
    """What the library must offer beyond a plain 16-bit call: an output dtype other than the input's, the 8-bit
    path (float8_e4m3fn / float8_e5m2 inputs or precision="fp8") and its head dims on q's device."""
    if out_dtype != q.dtype:
        if not lib.has_params_field("out_dtype"):
            raise RuntimeError(f"FlashCore: {lib.path} (version {lib.version_string()}) predates out_dtype; a 0.2 "
                               "library or newer is needed")
        name = str(out_dtype).replace("torch.", "")
        if q.dtype not in FP8_DTYPES and name not in lib.compiled_out_dtypes():
            raise TypeError(f"FlashCore: out_dtype {out_dtype} is not compiled into {lib.path} (compiled output "
                            f"dtypes: {list(lib.compiled_out_dtypes())})")
    if q.dtype not in FP8_DTYPES and precision == _lib.PRECISION_NATIVE:
        return
    if not lib.has_params_field("precision"):
        raise RuntimeError(f"FlashCore: {lib.path} (version {lib.version_string()}) predates the 8-bit path "
                           "(descales, precision='fp8'); a 0.3 library or newer is needed")
    if precision == _lib.PRECISION_INT8:
        int8_dims = _kernel_head_dims(lib, q.device, causal, _lib.DTYPE_INT8)
        if q.shape[3] not in int8_dims:
            raise ValueError(f"FlashCore: precision='int8' has no kernel for head_dim {q.shape[3]}"
                             f"{' (causal)' if causal else ''} in {lib.path} on this device (int8 head dims here: "
                             f"{list(int8_dims)}; it needs a library built with the i8 dtype, and the sm90 backend)")
        return
    dtypes = lib.compiled()[0]
    kernel_dtype = torch.float8_e5m2 if q.dtype == torch.float8_e5m2 else FP8_DTYPE  # precision="fp8": e4m3
    kernel_name = str(kernel_dtype).replace("torch.", "")
    if kernel_name not in dtypes:
        raise TypeError(f"FlashCore: the 8-bit path ({kernel_name}) is not compiled into {lib.path} (compiled: "
                        f"{list(dtypes)})")
    head_dim = q.shape[3]
    fp8_dims = _fp8_head_dims(lib, q.device, causal, _INPUT_DTYPE_CODES[kernel_dtype])
    if head_dim not in fp8_dims:
        raise ValueError(
            f"FlashCore: head_dim {head_dim} has no 8-bit kernel{' (causal)' if causal else ''} on this device "
            f"(8-bit head dims here: {list(fp8_dims)}; the 8-bit path needs the sm90 backend)"
        )


def quantize_fp8(x: torch.Tensor, layout: str = "bshd", num_heads_kv: Optional[int] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Quantize q, k or v for flashcore.attention's 8-bit path (plain torch ops, no library call).

    x: a 4-D float tensor in `layout` ("bshd": (B, S, H, D); "bhsd": (B, H, S, D)). One scale per (batch, KV head):
    the absolute maximum of each group maps to 448, the largest e4m3 value. num_heads_kv: the KV heads, when x is a
    query tensor with more heads (GQA: query head h belongs to KV head h // (H // num_heads_kv), whose scale it
    shares, as the kernel reads it); default H. Returns (x_e4m3 (float8_e4m3fn, x's shape, contiguous), descale
    (float32 (B, num_heads_kv), contiguous)) such that x ~= x_e4m3 * descale; a group of zeros gets descale 1.
    x must be finite (an inf or NaN makes its group NaN)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"FlashCore: x must be a torch.Tensor, got {type(x).__name__}")
    if layout not in _LAYOUTS:
        raise ValueError(f"FlashCore: layout must be 'bshd' or 'bhsd', got {layout!r}")
    if x.dim() != 4:
        raise ValueError(f"FlashCore: x must be 4-D {_LAYOUTS[layout]}, got shape {tuple(x.shape)}")
    if not x.is_floating_point() or x.dtype in (FP8_DTYPE, torch.float8_e5m2):
        raise TypeError(f"FlashCore: x must be float16, bfloat16, float32 or float64, got {x.dtype}")
    batch, _, heads, _ = _dims(x, layout)
    heads_kv = heads if num_heads_kv is None else num_heads_kv
    if isinstance(heads_kv, bool) or not isinstance(heads_kv, (int, torch.SymInt)):
        raise TypeError(f"FlashCore: num_heads_kv must be an int or None, got {type(num_heads_kv).__name__}")
    if heads_kv <= 0 or heads % heads_kv != 0:
        raise ValueError(f"FlashCore: x's {heads} heads must be a multiple of num_heads_kv ({heads_kv})")
    x = x.detach()  # rounding has no gradient
    seq_axis, head_axis = (1, 2) if layout == "bshd" else (2, 1)
    if x.shape[seq_axis] == 0 or x.shape[3] == 0:  # nothing to scale: descale 1
        amax = torch.zeros(batch, heads, dtype=torch.float32, device=x.device)
    else:
        amax = x.abs().amax(dim=(seq_axis, 3)).float()  # (B, H)
    amax = amax.reshape(batch, heads_kv, heads // heads_kv).amax(dim=2)  # (B, Hkv)
    descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).contiguous()
    per_head = descale.repeat_interleave(heads // heads_kv, dim=1)  # (B, H)
    shape = [batch, 1, 1, 1]
    shape[head_axis] = heads
    scaled = x.float() / per_head.reshape(shape)
    x_e4m3 = scaled.clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).contiguous()
    return x_e4m3, descale


# ---------------------------------------------------------------------------------------------------------------
# Attention variants (C ABI 0.5, issue #72): FlashAttention's window_size, softcap and attention_chunk, and per-head
# attention sinks (gpt-oss's s_aux, FlashAttention-4's learnable_sink). 16-bit calls; differentiable since 0.6 (the
# backward takes window, softcap, sinks and attention_chunk, and writes the sinks' gradient). attention_chunk is passed
# on like the others: a library without chunked attention refuses it, naming the field (flashcore.h).

INT32_MAX = 2**31 - 1  # the C fields are int32
# softcap: 0 (none), or a cap that a C float carries as a normal number (as softmax_scale: a tiny cap must not become
# 0.0, "no softcap", on its way to the library).
SOFTCAP_MIN = 2.0**-100
SOFTCAP_MAX = 2.0**100


class Variants(NamedTuple):
    """The attention variants of one call, as the custom ops carry them (flashcore.h gives the semantics, which are
    FlashAttention's): a window (window_size_left, window_size_right) around each query's bottom-right aligned
    diagonal, -1 for an unbounded side; softcap 0.0 for none; sinks None or a float32 (num_heads_q,) tensor of logits
    that join every row's softmax denominator; attention_chunk 0 for none."""

    window_size_left: int = -1
    window_size_right: int = -1
    softcap: float = 0.0
    sinks: Optional[torch.Tensor] = None
    attention_chunk: int = 0


def _is_local(variants: Variants, causal: bool) -> bool:
    """Whether the window restricts anything: causal fixes the right bound at 0 (FlashAttention's rule, the C ABI's),
    so a causal call needs a left bound for a window; a non-causal one either bound."""
    return variants.window_size_left != -1 or (not causal and variants.window_size_right != -1)


def variant_names(variants: Optional[Variants], causal: bool) -> List[str]:
    """The variants a call sets, as its arguments would be written, e.g. ["window_size=(4, 0)", "sinks"]."""
    if variants is None:
        return []
    names = []
    if _is_local(variants, causal):
        names.append(f"window_size=({variants.window_size_left}, {variants.window_size_right})")
    if variants.softcap != 0.0:
        names.append(f"softcap={variants.softcap}")
    if variants.sinks is not None:
        names.append("sinks")
    if variants.attention_chunk != 0:
        names.append(f"attention_chunk={variants.attention_chunk}")
    return names


def _check_int_arg(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"FlashCore: {name} must be an int, got {type(value).__name__}")
    if not low <= value <= INT32_MAX:
        what = "-1 (unbounded) or an int in [0, 2**31 - 1]" if low == -1 else "0 (none) or a positive int below 2**31"
        raise ValueError(f"FlashCore: {name} must be {what}, got {value}")
    # A plain int for the custom ops' int arguments (a numpy integer is not one); a SymInt under torch.compile stays.
    return value if isinstance(value, torch.SymInt) else int(value)


def _check_window_size(window_size) -> Tuple[int, int]:
    """FlashAttention's window_size=(left, right): a pair of ints, each -1 (unbounded) or >= 0."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        shown = repr(window_size) if isinstance(window_size, (numbers.Number, str, tuple, list)) else \
            type(window_size).__name__
        raise TypeError(f"FlashCore: window_size must be a pair (left, right) of ints, -1 for an unbounded side, "
                        f"got {shown}")
    left = _check_int_arg("window_size[0] (left)", window_size[0], -1)
    right = _check_int_arg("window_size[1] (right)", window_size[1], -1)
    return left, right


def _check_softcap(softcap) -> float:
    """FlashAttention's softcap: 0.0 (or None) for none, else a finite cap > 0."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"FlashCore: softcap must be a float (0.0: no softcap), got {type(softcap).__name__}")
    value = float(softcap)
    if value != 0.0 and not (math.isfinite(value) and SOFTCAP_MIN <= value <= SOFTCAP_MAX):
        raise ValueError(f"FlashCore: softcap must be 0.0 (no softcap) or a finite number in [2**-100, 2**100], "
                         f"got {softcap}")
    return value


def _check_attention_chunk(attention_chunk) -> int:
    """FlashAttention-3's attention_chunk (Llama 4's chunked attention): 0 for none, else a chunk size c > 0 (query i
    sees only keys j with j // c == (i + Sk - Sq) // c). An int32, as the C field."""
    return _check_int_arg("attention_chunk", attention_chunk, 0)


def _check_sinks(sinks, q: torch.Tensor, heads_q: int, convert: bool) -> Optional[torch.Tensor]:
    """None, or sinks as the ops take them: float32 (num_heads_q,) on q's device. convert (the front ends): another
    floating dtype is converted (a model's sinks are often a bf16 parameter); the ops themselves want float32."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"FlashCore: sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if not sinks.is_floating_point() or sinks.dtype in FP8_DTYPES:
        raise TypeError(f"FlashCore: sinks must be a float32 tensor (float16 / bfloat16 / float64 are converted), got "
                        f"{sinks.dtype}")
    if sinks.dtype != torch.float32 and not convert:
        raise TypeError(f"FlashCore: sinks must be float32 here, got {sinks.dtype} (flashcore.attention and the other "
                        f"front ends convert it)")
    if sinks.dim() != 1 or sinks.shape[0] != heads_q:
        raise ValueError(f"FlashCore: sinks must have shape (num_heads_q,) = ({heads_q},), one logit per query head, "
                         f"got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"FlashCore: sinks is on {sinks.device}, q on {q.device}")
    return sinks if sinks.dtype == torch.float32 else sinks.to(torch.float32)


def _front_end_variants(q: torch.Tensor, heads_q: int, window_size, softcap, sinks, attention_chunk
                        ) -> Optional[Variants]:
    """The variants of a front-end call, checked (metadata only); None when it sets none (the 0.4 call then)."""
    left, right = _check_window_size(window_size)
    cap = _check_softcap(softcap)
    chunk = _check_attention_chunk(attention_chunk)
    sinks = _check_sinks(sinks, q, heads_q, convert=True)
    if (left, right) == (-1, -1) and cap == 0.0 and sinks is None and chunk == 0:
        return None
    return Variants(left, right, cap, sinks, chunk)


def _op_variants(q: torch.Tensor, heads_q: int, window_size_left: int, window_size_right: int, softcap: float,
                 sinks: Optional[torch.Tensor], attention_chunk: int) -> Optional[Variants]:
    """The variant arguments of a custom op, checked as the front ends check them (the ops can be called directly,
    torch.ops.flashcore.*); None when none is set."""
    return _front_end_variants(q, heads_q, (window_size_left, window_size_right), softcap,
                               _check_sinks(sinks, q, heads_q, convert=False), attention_chunk)


def _variant_kwargs(variants: Optional[Variants]) -> dict:
    """The keyword arguments of a custom op call for `variants` (none for None: the op's defaults)."""
    return {} if variants is None else variants._asdict()


def _fill_rows_without_keys(out: torch.Tensor, lse: torch.Tensor, variants: Optional[Variants],
                            heads_axis: int) -> None:
    """A call with no key at all: O = 0 and LSE = -inf, or LSE = sinks[h] with sinks (the sink is the only term of the
    denominator; flashcore.h). heads_axis: lse's head dimension."""
    out.zero_()
    if lse.numel() == 0:
        return
    if variants is None or variants.sinks is None:
        lse.fill_(-math.inf)
        return
    shape = [1] * lse.dim()
    shape[heads_axis] = lse.shape[heads_axis]
    lse.copy_(variants.sinks.reshape(shape).expand_as(lse))


def _launch_variants(variants: Optional[Variants]) -> dict:
    """The keyword arguments _launch / _launch_varlen take for `variants`: none for None, so that a plain call is the
    0.4 call (which any library serves); else the variants with sinks contiguous (the C ABI reads Hq floats in a
    row; a copy made here lives until the launch, and the caching allocator reuses it only in stream order)."""
    if variants is None:
        return {}
    return {"variants": variants._replace(sinks=None if variants.sinks is None else variants.sinks.contiguous())}


def _check_no_8bit_variants(variants: Optional[Variants], q: torch.Tensor, precision: int, causal: bool) -> None:
    names = variant_names(variants, causal)
    if names and (q.dtype in FP8_DTYPES or precision != _lib.PRECISION_NATIVE):
        raise ValueError(f"FlashCore: {names[0].split('=')[0]} is set, but 8-bit attention (float8 inputs, precision="
                         f"'fp8' / 'int8') takes no window_size, softcap, sinks or attention_chunk in this version "
                         f"(16-bit calls do)")


def _check_no_8bit_head_dim_v(q: torch.Tensor, head_dim_v: int, precision: int) -> None:
    """precision='fp8' / 'int8' quantize q, k and v for the 8-bit kernels, which take one head dim for all three (as
    float8 inputs do: _check_inputs): ValueError naming it for a v whose last dimension differs."""
    if precision != _lib.PRECISION_NATIVE and head_dim_v != q.shape[3]:
        name = "fp8" if precision == _lib.PRECISION_FP8 else "int8"
        raise ValueError(f"FlashCore: precision='{name}' takes one head dim for q, k and v (the 8-bit kernels); v's "
                         f"last dimension (head_dim_v) is {head_dim_v}, q's and k's {q.shape[3]}")


# ---------------------------------------------------------------------------------------------------------------
# An e4m3 KV cache under 16-bit q (C ABI 0.9, FLASHCORE_FLAG_KV_FP8_E4M3; FlashAttention-3's flash_attn_with_kvcache
# with a float8_e4m3fn k_cache / v_cache and k_descale / v_descale): the KV-cache calls only, sm90 only, forward only.

KV_FP8_DTYPE = torch.float8_e4m3fn
KV_FP8_BACKWARD_NOT_SUPPORTED = ("FlashCore: the backward through an e4m3 KV cache (float8_e4m3fn k_cache / v_cache, "
                                 "flashcore.attention_with_kvcache) is not supported: the cache is for inference, "
                                 "run it under torch.no_grad() / torch.inference_mode()")


def _is_kv_fp8(k_cache, v_cache) -> bool:
    """Whether a KV-cache call has an 8-bit floating-point cache (k_cache or v_cache of a float8 dtype): the e4m3 KV
    cache, or a cache _check_kv_fp8_dtypes refuses naming what is wrong with it."""
    return any(isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.dtype.itemsize == 1
               for t in (k_cache, v_cache))


def _check_kv_fp8_dtypes(q, k_cache, v_cache) -> None:
    """An e4m3 KV cache: k_cache and v_cache both float8_e4m3fn, q float16 / bfloat16 or float8_e4m3fn (with
    q_descale; FlashAttention-3's FP8 call) (TypeError otherwise)."""
    if q.dtype not in _DTYPE_CODES and q.dtype != KV_FP8_DTYPE:
        raise TypeError(f"FlashCore: an e4m3 KV cache (float8_e4m3fn k_cache / v_cache) is read under float16, "
                        f"bfloat16 or float8_e4m3fn q, got q of dtype {q.dtype}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"FlashCore: k_cache and v_cache must have the same dtype (an 8-bit KV cache holds both in "
                        f"float8_e4m3fn), got {k_cache.dtype} and {v_cache.dtype}")
    if k_cache.dtype != KV_FP8_DTYPE:
        raise TypeError(f"FlashCore: k_cache and v_cache are {k_cache.dtype}: FlashCore's 8-bit KV cache is "
                        f"float8_e4m3fn (FLASHCORE_FLAG_KV_FP8_E4M3); e5m2 and other 8-bit formats are not taken")


def _check_kv_fp8_descale(name: str, d, batch: int, heads_kv: int, q: torch.Tensor) -> None:
    """k_descale / v_descale of an e4m3 KV cache as the ops take them: None, or float32 (batch, num_heads_kv) on q's
    device (batch: the sequences, not the cache's slots)."""
    if d is None:
        return
    if not isinstance(d, torch.Tensor):
        raise TypeError(f"FlashCore: {name} must be a torch.Tensor or None, got {type(d).__name__}")
    if d.dtype != torch.float32:
        raise TypeError(f"FlashCore: {name} must be float32, got {d.dtype}")
    if d.dim() != 2 or d.shape[0] != batch or d.shape[1] != heads_kv:
        raise ValueError(f"FlashCore: {name} must have shape (batch, num_heads_kv) = ({batch}, {heads_kv}) (or hold "
                         f"one element, a factor for the whole cache), got {tuple(d.shape)}")
    if d.device != q.device:
        raise ValueError(f"FlashCore: {name} is on {d.device}, q on {q.device}")


def _check_kv_fp8(q, k_cache, v_cache, batch: int, k_descale, v_descale) -> None:
    """What an e4m3 KV cache does not take in this version (ValueError naming the argument), and its descales
    (metadata only; q, k_cache and v_cache passed _check_inputs(kv_fp8=True)). The variants: _check_kv_fp8_variants.
    Appends (k_new, in q's 16-bit dtype) and their rotary embedding are taken: the library quantizes the new rows
    (x / descale, rounded to nearest even, saturated to +-448)."""
    if v_cache.shape[3] != k_cache.shape[3]:
        raise ValueError(f"FlashCore: an e4m3 KV cache takes one head dim for k_cache and v_cache; v_cache's (its "
                         f"head_dim_v) is {v_cache.shape[3]}, k_cache's {k_cache.shape[3]}")
    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)):
        _check_kv_fp8_descale(name, d, batch, k_cache.shape[2], q)


def _check_kv_fp8_variants(variants: Optional[Variants], causal: bool) -> None:
    names = variant_names(variants, causal)
    if names:
        raise ValueError(f"FlashCore: {names[0].split('=')[0]} is set, but an e4m3 KV cache takes no window_size, "
                         f"softcap, sinks or attention_chunk in this version (16-bit caches do)")


def _check_kv_fp8_library(lib: _lib.Library) -> None:
    """RuntimeError naming the loaded library's version when it predates the e4m3 KV cache (0.9)."""
    if not lib.has_kv_fp8():
        raise RuntimeError(f"FlashCore: k_cache and v_cache are float8_e4m3fn (an e4m3 KV cache under 16-bit q), but "
                           f"{lib.path} (version {lib.version_string()}) predates it: a "
                           f"{'.'.join(map(str, _lib.KV_FP8_VERSION))} library or newer is needed")


def _per_sequence_descale(d, batch: int, heads_kv: int):
    """attention_with_kvcache's k_descale / v_descale as the op takes them: a one-element tensor (0-d, (1,), ...: one
    factor for the whole cache) expanded to (batch, num_heads_kv) (a view; the op copies it contiguous); anything
    else as given (the op checks it)."""
    if isinstance(d, torch.Tensor) and d.numel() == 1 and tuple(d.shape) != (batch, heads_kv):
        return d.reshape(1, 1).expand(batch, heads_kv)
    return d


# ---------------------------------------------------------------------------------------------------------------
# Strides: what the C ABI takes as is, and the copy otherwise.


def abi_strides(t: torch.Tensor, check_pointer: bool = True) -> Optional[Tuple[int, int, int, int]]:
    """Element strides of a 4-D tensor as the C ABI wants them, or None if it cannot take the tensor as is.

    The ABI needs the last stride to be 1, the others positive multiples of 16 bytes (8 elements of 16-bit data,
    16 of float8_e4m3fn) and a 16-byte aligned pointer. The stride of a size-1 dimension is never used, so it is
    replaced by one the ABI accepts. check_pointer=False: the strides only (metadata, for fake tensors and tracing)."""
    align = max(1, 16 // t.element_size())
    sizes, strides = list(t.shape), list(t.stride())
    extent = 1 + sum(st * (sz - 1) for sz, st in zip(sizes, strides) if sz > 1)
    filler = (max(extent, align) + align - 1) // align * align
    strides = [filler if sz == 1 else st for sz, st in zip(sizes, strides)]
    if sizes[3] == 1:
        strides[3] = 1
    if strides[3] != 1 or any(st <= 0 or st % align != 0 for st in strides[:3]):
        return None
    if check_pointer and t.data_ptr() % 16 != 0:
        return None
    return (strides[0], strides[1], strides[2], strides[3])


def kernel_operand(t: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int, int, int], bool]:
    """(tensor, strides, copied): `t` itself when the ABI takes it, else a contiguous copy."""
    strides = abi_strides(t)
    if strides is not None:
        return t, strides, False
    # .contiguous() would return `t` itself for a contiguous but misaligned view: clone always copies.
    copy = t.clone(memory_format=torch.contiguous_format)
    strides = abi_strides(copy)
    if strides is None:  # only when a head_dim row is not a multiple of 16 bytes, which no compiled kernel supports
        raise ValueError(f"FlashCore: cannot lay out a tensor of shape {tuple(t.shape)} for the kernel")
    return copy, strides, True


# ---------------------------------------------------------------------------------------------------------------
# The custom op.


def kernel_params(lib: _lib.Library, q, k, v, out, lse, causal: bool, softmax_scale: float, seqused_k=None, *,
                  block_table=None, num_splits: int = 0, cu_seqlens_q=None, cu_seqlens_k=None,
                  max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                  descales: Tuple[Optional[torch.Tensor], ...] = (None, None, None),
                  precision: int = _lib.PRECISION_NATIVE, variants: Optional[Variants] = None, k_new=None, v_new=None,
                  cu_seqlens_k_new=None, kv_batch_idx=None, leftpad_k=None, seqused_q=None,
                  rotary: Optional["Rotary"] = None, kv_fp8: Optional[bool] = None):
    """The C params of one forward call on tensors the ABI takes as they are (see kernel_operand), without a
    workspace. lse: None or an empty tensor for no LSE. seqused_k: optional int32 (B,) device tensor of
    per-sequence key counts (a KV cache's lengths).

    v and out may have a last dimension Dv (head_dim_v, since 0.7) other than q's and k's D: Library.set_head_dim_v
    writes it (RuntimeError for a library older than 0.7); below, v and out are written with D for short.

    Serving modes (flashcore.h), combinable as the C ABI allows:
      - dense: q, out (B, Sq, Hq, D); k, v (B, Sk, Hkv, D).
      - paged KV (block_table: int32 (B, max_pages), row stride >= max_pages, unit column stride): k, v are
        (num_pages, page_size, Hkv, D); seqlen_k = max_pages * page_size (seqused_k gives the lengths).
      - packed Q (cu_seqlens_q: int32 (B + 1,), with max_seqlen_q): q, out (total_q, Hq, D); lse (Hq, total_q).
      - packed K/V (cu_seqlens_k: int32 (B + 1,), with max_seqlen_k): k, v (total_k, Hkv, D).
    The batch strides of packed tensors are ignored by the library; the one passed is a valid filler.
    num_splits: 0 the library's choice, 1 never split, n > 1 at most n parts.

    8-bit (dense only): q, k, v float8_e4m3fn with descales (q_descale, k_descale, v_descale), each None or a
    contiguous float32 (B, Hkv) device tensor; or 16-bit q, k, v with precision=PRECISION_FP8. O's dtype is out's
    (out_dtype is set when it differs from q's). The fields since 0.2 / 0.3 are written only when used, so a 0.1 or
    0.2 library's struct is never written past its struct_size by a call it can serve.

    An e4m3 KV cache (since 0.9): float16 / bfloat16 q with float8_e4m3fn k and v; descales (None, k_descale,
    v_descale) as above (no q_descale). Library.set_kv_fp8 sets FLAG_KV_FP8_E4M3 and the descales (RuntimeError for a
    library older than 0.9); dtype stays q's, O is q's dtype. Or float8_e4m3fn q on it (kv_fp8=True: e4m3 q, k, v
    are otherwise the dense 8-bit call): q_descale too, O in out's 16-bit dtype.

    variants (since 0.5): the window, softcap, sinks (a contiguous float32 (Hq,) device tensor) and attention_chunk,
    written by Library.set_variants, which refuses them for a library older than 0.5 (RuntimeError naming the
    variant) instead of letting it run without them.

    Appends and the serving fields of 0.8 (written by Library.set_kvcache_serving, which refuses them for a library
    older than 0.8, naming FlashAttention's argument):
      - k_new, v_new: rows the library writes into k and v (the cache) before attending: (B, seqlen_new, Hkv, D), or
        packed (total_k_new, Hkv, D) with cu_seqlens_k_new int32 (B + 1,).
      - kv_batch_idx: int32 (B,), FlashAttention's cache_batch_idx: sequence b's cache is entry kv_batch_idx[b] of k's
        and v's batch (dense) or row kv_batch_idx[b] of block_table (paged); kv_batch_size is that extent.
      - leftpad_k: int32 (B,), FlashAttention's cache_leftpad (dense caches).
      - seqused_q: int32 (B,) with cu_seqlens_q, FlashAttention-3's seqused_q: the query rows used per sequence.
      - rotary: a Rotary (contiguous cos / sin (rotary_seqlen, rotary_dim / 2) in q's dtype, interleaved, optional
        int32 (B,) seqlens) with k_new: the library rotates the appended keys and, into the workspace, q."""
    varlen_q, varlen_k, paged = cu_seqlens_q is not None, cu_seqlens_k is not None, block_table is not None
    if varlen_k and paged:
        raise ValueError("FlashCore: cu_seqlens_k and block_table cannot be combined (a paged cache's lengths come "
                         "from seqused_k)")
    if seqused_q is not None and not varlen_q:
        raise ValueError("FlashCore: seqused_q counts the used rows of packed queries: it needs cu_seqlens_q")
    if rotary is not None:
        if k_new is None:
            raise ValueError("FlashCore: rotary_cos / rotary_sin rotate an append: they need k_new")
        for name, table in (("rotary_cos", rotary.cos), ("rotary_sin", rotary.sin)):
            if table.dtype != q.dtype or not table.is_contiguous() or table.dim() != 2:
                raise ValueError(f"FlashCore: kernel_params needs a contiguous 2-D {name} of q's dtype")
    q4 = q.unsqueeze(0) if varlen_q else q
    out4 = out.unsqueeze(0) if varlen_q else out
    k4, v4 = (k.unsqueeze(0), v.unsqueeze(0)) if varlen_k else (k, v)
    if kv_fp8 is None:  # an e4m3 KV cache (since 0.9) under 16-bit q
        kv_fp8 = k4.dtype == KV_FP8_DTYPE and q4.dtype in _DTYPE_CODES
    q8 = kv_fp8 and q4.dtype == KV_FP8_DTYPE  # ... or under e4m3 q
    strides = [abi_strides(t) for t in (q4, k4, v4, out4)]
    if any(st is None for st in strides):
        raise ValueError("FlashCore: kernel_params needs operands the C ABI takes as they are (kernel_operand)")
    head_dim, heads_q, heads_kv = q4.shape[3], q4.shape[2], k4.shape[2]
    if varlen_q:
        batch, seqlen_q = cu_seqlens_q.shape[0] - 1, int(max_seqlen_q)
    else:
        batch, seqlen_q = q4.shape[0], q4.shape[1]
    if varlen_k:
        seqlen_k = int(max_seqlen_k)
    elif paged:
        seqlen_k = block_table.shape[1] * k4.shape[1]
    else:
        seqlen_k = k4.shape[1]
    has_lse = lse is not None and lse.numel() > 0
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(q4.data_ptr(), k4.data_ptr(), v4.data_ptr(), out4.data_ptr(), lse.data_ptr() if has_lse else 0),
        strides=tuple(strides),
        sizes=(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim),
        dtype=_INPUT_DTYPE_CODES[q.dtype],
        causal=causal,
        softmax_scale=softmax_scale,
        lse_capacity=lse.numel() if has_lse else None,
    )
    lib.set_head_dim_v(params, v4.shape[3])
    if seqused_k is not None:
        params.seqused_k = seqused_k.data_ptr()
    if varlen_q:
        params.cu_seqlens_q = cu_seqlens_q.data_ptr()
        params.total_q = q4.shape[1]
    if varlen_k:
        params.cu_seqlens_k = cu_seqlens_k.data_ptr()
        params.total_k = k4.shape[1]
    if paged:
        if block_table.dim() != 2 or (block_table.shape[1] > 1 and block_table.stride(1) != 1):
            raise ValueError("FlashCore: kernel_params needs a block_table with unit column stride (block_table_operand)")
        params.block_table = block_table.data_ptr()
        params.block_table_stride = block_table_row_stride(block_table)
        params.page_size = k4.shape[1]
        params.num_pages = k4.shape[0]
    params.num_splits = int(num_splits)
    if out4.dtype != q4.dtype:
        params.out_dtype = _OUT_DTYPE_CODES[out4.dtype]
    for field, descale in zip(("q_descale", "k_descale", "v_descale"), descales):
        if descale is not None and (descale.dtype != torch.float32 or not descale.is_contiguous()):
            raise ValueError(f"FlashCore: kernel_params needs a contiguous float32 {field}")
    if kv_fp8:
        if descales[0] is not None and not q8:
            raise ValueError("FlashCore: q_descale is not taken with an e4m3 KV cache under 16-bit q")
        if v4.dtype != k4.dtype:
            raise ValueError("FlashCore: kernel_params needs k and v of one dtype (float8_e4m3fn) for an e4m3 KV cache")
        lib.set_kv_fp8(params, k_descale=0 if descales[1] is None else descales[1].data_ptr(),
                       v_descale=0 if descales[2] is None else descales[2].data_ptr())
        if q8 and descales[0] is not None:
            params.q_descale = descales[0].data_ptr()
    else:
        for field, descale in zip(("q_descale", "k_descale", "v_descale"), descales):
            if descale is not None:
                setattr(params, field, descale.data_ptr())
    if precision != _lib.PRECISION_NATIVE:
        params.precision = int(precision)
    if variants is not None:
        sinks = variants.sinks
        if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
            raise ValueError("FlashCore: kernel_params needs contiguous float32 sinks")
        lib.set_variants(params, causal=causal, window_size=(variants.window_size_left, variants.window_size_right),
                         softcap=variants.softcap, sinks=0 if sinks is None else sinks.data_ptr(),
                         attention_chunk=variants.attention_chunk)
    if k_new is not None:
        packed_new = cu_seqlens_k_new is not None
        kn4, vn4 = (k_new.unsqueeze(0), v_new.unsqueeze(0)) if packed_new else (k_new, v_new)
        new_strides = [abi_strides(t) for t in (kn4, vn4)]
        if any(st is None for st in new_strides):
            raise ValueError("FlashCore: kernel_params needs k_new / v_new the C ABI takes as they are (kernel_operand)")
        params.k_new, params.v_new = kn4.data_ptr(), vn4.data_ptr()
        for field, (batch_, seq, head, dim) in zip(("k_new_strides", "v_new_strides"), new_strides):
            target = getattr(params, field)
            target.batch, target.seq, target.head, target.dim = batch_, seq, head, dim
        params.seqlen_new = 0 if packed_new else kn4.shape[1]
    lib.set_kvcache_serving(
        params, kv_batch_idx=0 if kv_batch_idx is None else kv_batch_idx.data_ptr(),
        kv_batch_size=block_table.shape[0] if paged else k4.shape[0],
        leftpad_k=0 if leftpad_k is None else leftpad_k.data_ptr(),
        cu_seqlens_k_new=0 if cu_seqlens_k_new is None or k_new is None else cu_seqlens_k_new.data_ptr(),
        total_k_new=0 if k_new is None else k_new.shape[0],
        seqused_q=0 if seqused_q is None else seqused_q.data_ptr(),
        **({} if rotary is None else rotary.fields()))
    return params


def block_table_row_stride(block_table: torch.Tensor) -> int:
    """The row stride the C ABI gets for an int32 (B, max_pages) block table (one row: its width)."""
    if block_table.shape[0] <= 1:
        return max(block_table.shape[1], 1)
    return block_table.stride(0)


def block_table_operand(block_table: torch.Tensor) -> torch.Tensor:
    """The block table itself when its rows are unit-stride and do not overlap, else a contiguous copy."""
    rows, cols = block_table.shape
    if (cols <= 1 or block_table.stride(1) == 1) and (rows <= 1 or block_table.stride(0) >= cols):
        return block_table
    return block_table.contiguous()


def _launch(lib: _lib.Library, q, k, v, out, lse, causal: bool, softmax_scale: float, seqused_k=None,
            v_transposed: bool = False, **serving) -> None:
    """Enqueue the kernel on the current stream of q's device (no host sync; capturable in a CUDA graph).
    serving: kernel_params' keyword arguments (block_table, num_splits, variants). v_transposed: v is fp8_transpose_v's
    (contiguous) result; the params describe k's shape for it and carry FLAG_V_TRANSPOSED."""
    if v_transposed:
        q, k = (kernel_operand(t)[0] for t in (q, k))
        params = kernel_params(lib, q, k, k, out, lse, causal, softmax_scale, seqused_k, **serving)
        params.v = v.data_ptr()
        params.flags |= _lib.FLAG_V_TRANSPOSED
    else:
        q, k, v = (kernel_operand(t)[0] for t in (q, k, v))
        params = kernel_params(lib, q, k, v, out, lse, causal, softmax_scale, seqused_k, **serving)
    _enqueue(lib, params, q.device)


def _launch_varlen(lib: _lib.Library, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                   max_seqlen_k: int, causal: bool, softmax_scale: float, seqused_k=None,
                   variants: Optional[Variants] = None, seqused_q=None) -> None:
    """The packed variable-length call: q, out (total_q, Hq, D); k, v (total_k, Hkv, D); lse (Hq, total_q).
    seqused_q: int32 (B,) (since 0.8): the library computes only sequence b's first seqused_q[b] rows and writes no
    other."""
    q, k, v = (kernel_operand(t.unsqueeze(0))[0].squeeze(0) for t in (q, k, v))
    params = kernel_params(lib, q, k, v, out, lse, causal, softmax_scale, seqused_k, cu_seqlens_q=cu_seqlens_q,
                           cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                           variants=variants, seqused_q=seqused_q)
    _enqueue(lib, params, q.device)


def _enqueue(lib: _lib.Library, params, device: torch.device) -> None:
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device)
        workspace = lib.workspace_size(params)
        if workspace:
            buf = _workspace(lib, device, stream, workspace)
            params.workspace = buf.data_ptr()
            params.workspace_size = workspace
        lib.forward(params, stream.cuda_stream)


# Workspaces (the dynamic scheduler's tile counter, split-KV counters and partials, 8-bit copies). The library needs
# the first 256 bytes zero-filled before a call and leaves them so after it; the rest is scratch (flashcore.h). So:
# - eager calls: one zero-filled buffer per (device, stream), reused by every call on that stream;
# - inside a CUDA-graph capture: one buffer per (device, stream, capture), allocated in the graph's pool at the
#   capture's first call that needs it and shared by its later calls on that stream (they run in stream order at
#   replay). Its 256 bytes are zeroed in the graph before that first call: a kernel node, about 1.1 us per replay on
#   an H100, once per graph instead of once per call (docs/decisions.md#graph-workspace). Another capture, i.e. another
#   graph that may replay concurrently, gets its own. The entry is dropped when the stream's next capture begins, after
#   which the graph keeps the block as any tensor freed during its capture (its replays re-zero the header first).
_WORKSPACES: dict = {}
_CAPTURE_WORKSPACES: dict = {}  # (device index, stream) -> (capture id, buffer)
_WORKSPACE_HEADER = 256


def _workspace(lib: _lib.Library, device: torch.device, stream, size: int) -> torch.Tensor:
    key = (device.index, stream.cuda_stream)
    if torch.cuda.is_current_stream_capturing():
        capture = lib.stream_capture_id(stream.cuda_stream)  # 0: a library without the query: one buffer per call
        held = _CAPTURE_WORKSPACES.get(key)
        if capture and held is not None and held[0] == capture and held[1].numel() >= size:
            return held[1]
        buf = torch.empty(max(size, _WORKSPACE_HEADER), dtype=torch.uint8, device=device)
        buf[:_WORKSPACE_HEADER].zero_()
        if capture:
            _CAPTURE_WORKSPACES[key] = (capture, buf)
        return buf
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.zeros(max(size, _WORKSPACE_HEADER), dtype=torch.uint8, device=device)
        _WORKSPACES[key] = buf
    return buf


def _empty_outputs(q: torch.Tensor, return_lse: bool, out_dtype: Optional[torch.dtype] = None,
                   head_dim_v: Optional[int] = None):
    """out (B, Sq, Hq, head_dim_v) (None: q's head dim) and lse (B, Hq, Sq), or an empty (0,) lse."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    head_dim = head_dim if head_dim_v is None else head_dim_v
    out = q.new_empty((batch, seqlen_q, heads_q, head_dim), dtype=q.dtype if out_dtype is None else out_dtype)
    lse = q.new_empty((batch, heads_q, seqlen_q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def transposed_v_shape(v: torch.Tensor) -> Tuple[int, int, int, int]:
    """The shape of fp8_transpose_v(v) for an 8-bit v (B, Sk, Hkv, D): (B, Hkv, D, Sk rounded up to 128)."""
    batch, seqlen_k, heads_kv, head_dim = v.shape
    return (batch, heads_kv, head_dim, (seqlen_k + 127) // 128 * 128)


def _check_transposed_v(vt, k: torch.Tensor) -> None:
    """vt must be fp8_transpose_v of a V shaped like k (8-bit k: checked by _check_inputs)."""
    if not isinstance(vt, torch.Tensor):
        raise TypeError(f"FlashCore: v must be a torch.Tensor, got {type(vt).__name__}")
    if k.dtype not in FP8_DTYPES:
        raise TypeError(f"FlashCore: v_transposed=True is for 8-bit (float8) q, k, v only; k is {k.dtype}")
    want = transposed_v_shape(k)
    if vt.dtype != torch.uint8 or tuple(vt.shape) != want or not vt.is_contiguous():
        raise ValueError(f"FlashCore: with v_transposed=True, v must be flashcore.fp8_transpose_v(v): a contiguous "
                         f"uint8 tensor of shape {want} for k of shape {tuple(k.shape)}; got {vt.dtype} "
                         f"{tuple(vt.shape)}{'' if vt.is_contiguous() else ' (not contiguous)'}")
    if vt.device != k.device:
        raise ValueError(f"FlashCore: v is on {vt.device}, k on {k.device}")


@torch.library.custom_op("flashcore::fp8_transpose_v", mutates_args=())
def fp8_transpose_v_op(v: torch.Tensor) -> torch.Tensor:
    """flashcore.fp8_transpose_v as a custom op (torch.compile, CUDA graphs)."""
    if not isinstance(v, torch.Tensor) or v.dtype not in FP8_DTYPES or v.dim() != 4:
        raise TypeError("FlashCore: fp8_transpose_v takes an 8-bit (float8_e4m3fn / float8_e5m2) v of shape "
                        f"(B, Sk, Hkv, D); got {getattr(v, 'dtype', type(v).__name__)} "
                        f"{tuple(v.shape) if isinstance(v, torch.Tensor) else ''}")
    out = v.new_empty(transposed_v_shape(v), dtype=torch.uint8)
    if out.numel() == 0:
        return out
    lib = _check_supported(v, v.shape[3])
    operand, strides, _ = kernel_operand(v)
    params = lib.new_params()
    params.v = operand.data_ptr()
    params.v_strides = _lib.TensorStridesStruct(*strides)
    params.batch, params.seqlen_k, params.num_heads_kv, params.head_dim = v.shape
    params.dtype = _INPUT_DTYPE_CODES[v.dtype]
    with torch.cuda.device(v.device):
        lib.fp8_transpose_v(params, out.data_ptr(), torch.cuda.current_stream(v.device).cuda_stream)
    return out


@fp8_transpose_v_op.register_fake
def _fp8_transpose_v_fake(v):
    return v.new_empty(transposed_v_shape(v), dtype=torch.uint8)


def fp8_transpose_v(v: torch.Tensor) -> torch.Tensor:
    """V of an 8-bit call (float8 (B, Sk, Hkv, D)), transposed into the layout the 8-bit kernels read: a uint8
    (B, Hkv, D, Sk rounded up to 128) tensor. Pass it as v with v_transposed=True to flashcore.attention, with k
    and the descales as usual: the call then skips its own transposition (which the kernel otherwise does tile by
    tile in shared memory). For a K/V that several calls attend to (a KV cache, chunked prefill), transpose once. The layout is this library's own (keys permuted within groups of
    32); make it with the library that reads it."""
    return fp8_transpose_v_op(v)


@torch.library.custom_op("flashcore::attention_fwd", mutates_args=())
def attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float, return_lse: bool,
    q_descale: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None, out_dtype: Optional[torch.dtype] = None,
    precision: int = _lib.PRECISION_NATIVE, v_transposed: bool = False, deterministic: bool = False,
    window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashCore forward, (B, S, H, D) layout. softmax_scale 0.0 means 1/sqrt(head_dim).

    8-bit (since 0.3; the arguments after return_lse have defaults, so the 0.2 call is unchanged): q, k, v
    float8_e4m3fn with optional float32 (B, Hkv) descales (real value = stored * descale; None means 1); or 16-bit
    q, k, v with precision=PRECISION_FP8 (quantized to e4m3 by the library). out_dtype: float16 / bfloat16 / None
    (None: q's dtype; bfloat16 for 8-bit inputs). The workspace is allocated (zero-filled) by the op.

    v_transposed: v is fp8_transpose_v of the 8-bit V (uint8 (B, Hkv, D, Sk rounded up to 128)).

    deterministic (since 0.4): not used by the forward; the autograd formula passes it to the backward
    (flashcore::attention_bwd), so that a call decides it where FlashAttention's flash_attn_func does.

    Variants (since 0.5; 16-bit calls): window_size_left / window_size_right (FlashAttention's window_size, -1
    unbounded), softcap (0.0: none), sinks (None or float32 (Hq,) logits on q's device), attention_chunk (0: none; a
    library without chunked attention refuses it, naming the field). Since 0.6 the autograd formula differentiates
    them (flashcore::attention_variants_bwd, a 0.6 library, with the forward's attention_chunk): q, k, v, and sinks
    when they require grad.

    head_dim_v (since 0.7): v (B, Sk, Hkv, Dv) may have a last dimension other than q's and k's D, where the library
    compiles the pair (D, Dv) (16-bit calls: FlashAttention-3's hdimdiff, e.g. DeepSeek MLA's (192, 128)); out is
    then (B, Sq, Hq, Dv). Its backward is not supported (NotImplementedError when .backward() reaches it).

    Returns (out (B, Sq, Hq, Dv) contiguous in the output dtype, lse): lse is float32 (B, Hq, Sq) when return_lse,
    else an empty (0,) tensor (a custom op cannot return None). Differentiable in q, k, v and sinks (16-bit calls with
    Dv = D; see _backward): a call that will be differentiated should ask for lse, which the backward reads (without
    it, the backward runs the forward again to get it)."""
    _check_inputs(q, k, k if v_transposed else v, "bshd", allow_fp8=True)
    if v_transposed:
        _check_transposed_v(v, k)
    head_dim_v = k.shape[3] if v_transposed else v.shape[3]
    o_dtype = _check_8bit_args(q, k, q_descale, k_descale, v_descale, out_dtype, precision)
    _check_no_8bit_head_dim_v(q, head_dim_v, precision)
    variants = _op_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    _check_no_8bit_variants(variants, q, precision, causal)
    lib = _check_supported(q, q.shape[3], head_dim_v)
    extended = q.dtype in FP8_DTYPES or precision != _lib.PRECISION_NATIVE or o_dtype != q.dtype
    if extended:
        _check_extended_supported(lib, q, causal, o_dtype, precision)
    out, lse = _empty_outputs(q, return_lse, o_dtype, head_dim_v)
    if out.numel() == 0:
        return out, lse
    if k.shape[1] == 0:  # no keys: every row sees nothing (O = 0, LSE = -inf or the sink), as fully masked rows
        _fill_rows_without_keys(out, lse, variants, heads_axis=1)
        return out, lse
    serving = _launch_variants(variants)
    if not extended:
        _launch(lib, q, k, v, out, lse, causal, softmax_scale, **serving)
    else:
        descales = tuple(None if d is None else d.contiguous() for d in (q_descale, k_descale, v_descale))
        _launch(lib, q, k, v, out, lse, causal, softmax_scale, descales=descales, precision=precision,
                v_transposed=v_transposed, **serving)
    return out, lse


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, softmax_scale, return_lse, q_descale=None, k_descale=None, v_descale=None,
                        out_dtype=None, precision=_lib.PRECISION_NATIVE, v_transposed=False, deterministic=False,
                        window_size_left=-1, window_size_right=-1, softcap=0.0, sinks=None, attention_chunk=0):
    _check_inputs(q, k, k if v_transposed else v, "bshd", allow_fp8=True)
    if v_transposed:
        _check_transposed_v(v, k)
    head_dim_v = k.shape[3] if v_transposed else v.shape[3]
    o_dtype = _check_8bit_args(q, k, q_descale, k_descale, v_descale, out_dtype, precision)
    _check_no_8bit_head_dim_v(q, head_dim_v, precision)
    variants = _op_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    _check_no_8bit_variants(variants, q, precision, causal)
    return _empty_outputs(q, return_lse, o_dtype, head_dim_v)


def _check_cache_seqlens(cache_seqlens: torch.Tensor, q: torch.Tensor) -> None:
    if (not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1
            or cache_seqlens.shape[0] != q.shape[0]):
        got = (f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}" if isinstance(cache_seqlens, torch.Tensor)
               else type(cache_seqlens).__name__)
        raise ValueError(f"FlashCore: cache_seqlens must be an int32 tensor of shape (batch,) = ({q.shape[0]},), got {got}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"FlashCore: cache_seqlens is on {cache_seqlens.device}, q on {q.device}")


# The C ABI's page sizes (flashcore.h, since 0.8): any number of rows from 1 to 65536 (a 0.7 library takes multiples of
# 16 only, and refuses the others itself, naming page_size).
PAGE_SIZE_MAX = 65536


def _check_block_table(block_table, q: torch.Tensor, k_cache: torch.Tensor, rows: Optional[int] = -1) -> None:
    """A paged cache: block_table int32 (B, max_pages) on q's device; k_cache (num_pages, page_size, Hkv, D).
    rows: the table's rows (-1: q's batch; None: any number >= 1, the cache slots cache_batch_idx picks from)."""
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"FlashCore: block_table must be a torch.Tensor or None, got {type(block_table).__name__}")
    rows = q.shape[0] if rows == -1 else rows
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or (
            block_table.shape[0] != rows if rows is not None else block_table.shape[0] < 1):
        shape = f"(batch, max_pages_per_sequence) = ({rows}, *)" if rows is not None else \
            "(cache slots >= 1, max_pages_per_sequence) (with cache_batch_idx)"
        raise ValueError(
            f"FlashCore: block_table must be an int32 tensor of shape {shape}, got {block_table.dtype} "
            f"{tuple(block_table.shape)}"
        )
    if block_table.device != q.device:
        raise ValueError(f"FlashCore: block_table is on {block_table.device}, q on {q.device}")
    if k_cache.dim() == 4:
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        if page_size <= 0 or page_size > PAGE_SIZE_MAX:
            raise ValueError(
                f"FlashCore: with block_table, k_cache/v_cache are (num_pages, page_size, num_heads_kv, head_dim) and "
                f"page_size must be from 1 to {PAGE_SIZE_MAX}, got {tuple(k_cache.shape)} (page_size {page_size})"
            )
        if num_pages == 0:
            raise ValueError(f"FlashCore: the paged cache has no pages: k_cache {tuple(k_cache.shape)}")


def _check_num_splits(num_splits) -> int:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(f"FlashCore: num_splits must be an int, got {type(num_splits).__name__}")
    if num_splits < 0:
        raise ValueError(f"FlashCore: num_splits must be >= 0 (0: the library's choice, 1: no split), got {num_splits}")
    return num_splits


def _kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table) -> int:
    """Checks for the KV-cache op; returns the key capacity per sequence (seqlen_k of the C params)."""
    paged = block_table is not None
    _check_inputs(q, k_cache, v_cache, "bshd", kv_batch=not paged)
    _check_cache_seqlens(cache_seqlens, q)
    if not paged:
        return k_cache.shape[1]
    _check_block_table(block_table, q, k_cache)
    return block_table.shape[1] * k_cache.shape[1]


@torch.library.custom_op("flashcore::attention_kvcache_fwd", mutates_args=())
def attention_kvcache_fwd(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, causal: bool,
    softmax_scale: float, return_lse: bool, block_table: Optional[torch.Tensor] = None, num_splits: int = 0,
    window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, Sq, Hq, D) against the first cache_seqlens[b] keys of a KV cache: dense, k_cache/v_cache
    (B, Sk, Hkv, D); or paged, k_cache/v_cache (num_pages, page_size, Hkv, D) with block_table int32
    (B, max_pages): key j of sequence b is row j % page_size of page block_table[b, j // page_size]. v_cache may have
    a last dimension Dv of its own (head_dim_v, as in attention_fwd): out is (B, Sq, Hq, Dv).
    Cache rows past those lengths are never read into the output (they may hold anything, NaN included), nor are
    the pages past them. num_splits: split-KV parts (0: the library's choice, 1: no split). The variants (window,
    softcap, sinks, attention_chunk) as in attention_fwd, aligned to each sequence's last key (cache_seqlens[b])."""
    capacity = _kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table)
    variants = _op_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    lib = _check_supported(q, q.shape[3], v_cache.shape[3])
    out, lse = _empty_outputs(q, return_lse, head_dim_v=v_cache.shape[3])
    if out.numel() == 0:
        return out, lse
    if capacity == 0:
        _fill_rows_without_keys(out, lse, variants, heads_axis=1)
        return out, lse
    serving = {"num_splits": num_splits}
    if block_table is not None:
        serving["block_table"] = block_table_operand(block_table)
    serving.update(_launch_variants(variants))
    _launch(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k=cache_seqlens.contiguous(),
            **serving)
    return out, lse


@attention_kvcache_fwd.register_fake
def _attention_kvcache_fwd_fake(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse,
                                block_table=None, num_splits=0, window_size_left=-1, window_size_right=-1,
                                softcap=0.0, sinks=None, attention_chunk=0):
    _kvcache_inputs(q, k_cache, v_cache, cache_seqlens, block_table)
    _op_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    return _empty_outputs(q, return_lse, head_dim_v=v_cache.shape[3])


# ---------------------------------------------------------------------------------------------------------------
# The KV cache with FlashAttention's serving arguments (since 0.8): cache_batch_idx, cache_leftpad, packed queries
# (cu_seqlens_q) and packed appends (cu_seqlens_k_new). One library call does the append (k_new) and the attention:
# an out-of-range cache_batch_idx entry must append nothing and packed rows are clamped on the device, which the
# in-place torch indexing of the plain append cannot do without a host sync.


def _check_sequence_vector(name: str, t, length: int, q: torch.Tensor, what: str = "(batch,)") -> None:
    """An int32 device vector of `length` entries on q's device (per-sequence data the kernel reads)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"FlashCore: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != length:
        raise ValueError(f"FlashCore: {name} must be an int32 tensor of shape {what} = ({length},), got {t.dtype} "
                         f"{tuple(t.shape)}")
    if t.device != q.device:
        raise ValueError(f"FlashCore: {name} is on {t.device}, q on {q.device}")


class Rotary(NamedTuple):
    """The rotary embedding of an append (FlashAttention's rotary_cos / rotary_sin, since 0.8): cos and sin
    (rotary_seqlen, rotary_dim / 2) in q's dtype, contiguous; interleaved (GPT-J pairs) or not (GPT-NeoX halves);
    seqlens: int32 (B,) first positions, or None (cache_seqlens)."""
    cos: torch.Tensor
    sin: torch.Tensor
    interleaved: bool
    seqlens: Optional[torch.Tensor]

    def fields(self) -> dict:
        """Library.set_kvcache_serving's keyword arguments."""
        return dict(rotary_cos=self.cos.data_ptr(), rotary_sin=self.sin.data_ptr(), rotary_seqlen=self.cos.shape[0],
                    rotary_dim=2 * self.cos.shape[1], rotary_interleaved=self.interleaved,
                    rotary_seqlens=0 if self.seqlens is None else self.seqlens.data_ptr())


# The C ABI's rotary_dim (flashcore.h): a multiple of 16 columns, at most head_dim (FlashAttention's rule too).
ROTARY_DIM_MULTIPLE = 16


def _check_rotary(rotary_cos, rotary_sin, rotary_seqlens, q: torch.Tensor, batch: int, append: bool) -> None:
    """FlashAttention's rotary_cos / rotary_sin (rotary_seqlen, rotary_dim / 2) of q's dtype on q's device, rotary_dim
    a positive multiple of 16 up to q's head dim, at least one row; rotary_seqlens int32 (B,); an append (k, v)
    required (metadata only: contiguity is the front end's business, which makes them contiguous)."""
    if rotary_cos is None and rotary_sin is None:
        if rotary_seqlens is not None:
            raise ValueError("FlashCore: rotary_seqlens is given without rotary_cos / rotary_sin (it places their "
                             "rotation)")
        return
    if (rotary_cos is None) != (rotary_sin is None):
        missing = "rotary_sin" if rotary_sin is None else "rotary_cos"
        raise ValueError(f"FlashCore: pass both rotary_cos and rotary_sin, or neither ({missing} is missing)")
    if not append:
        raise ValueError("FlashCore: rotary_cos / rotary_sin rotate the appended keys (and the queries): pass k and v "
                         "to append with them, as FlashAttention requires")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"FlashCore: {name} must be 2-D (rotary_seqlen, rotary_dim / 2), got shape "
                             f"{tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"FlashCore: {name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"FlashCore: {name} is on {t.device}, q on {q.device}")
    if rotary_sin.shape != rotary_cos.shape:
        raise ValueError(f"FlashCore: rotary_cos and rotary_sin must have the same shape, got "
                         f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    rows, half = rotary_cos.shape
    head_dim = q.shape[-1]
    rotary_dim = 2 * half
    if rotary_dim <= 0 or rotary_dim % ROTARY_DIM_MULTIPLE != 0 or rotary_dim > head_dim:
        raise ValueError(f"FlashCore: rotary_dim = 2 * rotary_cos.shape[1] = {rotary_dim} must be a positive multiple "
                         f"of {ROTARY_DIM_MULTIPLE} and at most q's head dim ({head_dim})")
    if rows <= 0:
        raise ValueError(f"FlashCore: rotary_cos and rotary_sin have no row (position): shape "
                         f"{tuple(rotary_cos.shape)}")
    if rotary_seqlens is not None:
        _check_sequence_vector("rotary_seqlens", rotary_seqlens, batch, q)


def _kvcache_serving_inputs(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad,
                            cu_seqlens_q, k_new, v_new, cu_seqlens_k_new, rotary_cos=None, rotary_sin=None,
                            rotary_seqlens=None, k_descale=None, v_descale=None,
                            q_descale=None) -> Tuple[int, int]:
    """Checks (metadata only) for the KV-cache ops with the 0.8 arguments; returns (batch, key capacity per sequence).
    q (B, Sq, Hq, D), or packed (total_q, Hq, D) with cu_seqlens_q (B + 1,). Dense cache (B, Sk, Hkv, D), or
    (slots, Sk, Hkv, D) with cache_batch_idx; paged (num_pages, page_size, Hkv, D) with block_table (B, max_pages), or
    (slots, max_pages) with cache_batch_idx. k_new, v_new: (B, Sn, Hkv, D / Dv), or packed (total_k_new, Hkv, D / Dv)
    with cu_seqlens_k_new (B + 1,). An e4m3 cache (float8_e4m3fn k_cache / v_cache under 16-bit q, since 0.9): one
    head dim, new rows in q's dtype; k_descale / v_descale None or float32 (B, Hkv) on q's device (given with a 16-bit
    cache: ValueError). Under float8_e4m3fn q: q_descale as those, no append, no rotary tables."""
    paged = block_table is not None
    if cu_seqlens_q is not None:
        if not isinstance(q, torch.Tensor) or q.dim() != 3:
            raise ValueError(f"FlashCore: with cu_seqlens_q, q must be 3-D (total_q, num_heads, head_dim), got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
        batch, q4 = cu_seqlens_q.shape[0] - 1, q.unsqueeze(0)
    else:
        if not isinstance(q, torch.Tensor) or q.dim() != 4:
            raise ValueError(f"FlashCore: q must be 4-D (batch, seqlen, num_heads, head_dim) (3-D packed rows need "
                             f"cu_seqlens_q), got {tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        batch, q4 = q.shape[0], q
    kv_fp8 = _is_kv_fp8(k_cache, v_cache)
    _check_inputs(q4, k_cache, v_cache, "bshd", kv_batch=False, kv_fp8=kv_fp8)
    q8 = kv_fp8 and q.dtype == KV_FP8_DTYPE
    if q_descale is not None and not q8:
        raise ValueError(f"FlashCore: q_descale is set, but q is {q.dtype}: it scales a float8_e4m3fn q on an e4m3 KV "
                         f"cache (16-bit q takes none)")
    if q8:
        appended = [n for n, t in (("k", k_new), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                                   ("rotary_seqlens", rotary_seqlens)) if t is not None]
        if appended:
            raise ValueError(f"FlashCore: {appended[0]} is set with a float8_e4m3fn q: an e4m3 q takes no append and "
                             f"no rotary embedding (append 16-bit rows under 16-bit q, which the library quantizes; "
                             f"or write e4m3 rows into the cache and count them in cache_seqlens)")
        _check_kv_fp8_descale("q_descale", q_descale, batch, k_cache.shape[2], q)
    if kv_fp8:
        _check_kv_fp8(q, k_cache, v_cache, batch, k_descale, v_descale)
    else:
        given = [n for n, d in (("k_descale", k_descale), ("v_descale", v_descale)) if d is not None]
        if given:
            raise ValueError(f"FlashCore: {given[0]} is set, but k_cache is {k_cache.dtype}: the descales scale an "
                             f"e4m3 KV cache (float8_e4m3fn k_cache / v_cache) only")
    _check_sequence_vector("cache_seqlens", cache_seqlens, batch, q)
    if cache_batch_idx is not None:
        _check_sequence_vector("cache_batch_idx", cache_batch_idx, batch, q)
    if paged:
        _check_block_table(block_table, q4, k_cache, rows=None if cache_batch_idx is not None else batch)
    elif cache_batch_idx is None and k_cache.shape[0] != batch:
        raise ValueError(f"FlashCore: k_cache/v_cache must have q's batch size ({batch}) as their first dimension "
                         f"(or pass cache_batch_idx to pick a cache slot per sequence), got {tuple(k_cache.shape)}")
    elif cache_batch_idx is not None and k_cache.shape[0] < 1:
        raise ValueError(f"FlashCore: cache_batch_idx picks among k_cache's slots, but k_cache has none: "
                         f"{tuple(k_cache.shape)}")
    if cache_leftpad is not None:
        if paged:
            raise ValueError("FlashCore: cache_leftpad takes a dense cache only: FlashCore's paged caches (block_table /"
                             " page_table) take no left padding, as FlashAttention-2's")
        _check_sequence_vector("cache_leftpad", cache_leftpad, batch, q)
    if (k_new is None) != (v_new is None):
        raise ValueError("FlashCore: pass both k and v to append to the cache, or neither")
    if cu_seqlens_k_new is not None and k_new is None:
        raise ValueError("FlashCore: cu_seqlens_k_new describes packed k and v to append: pass k and v with it")
    if k_new is not None:
        packed = cu_seqlens_k_new is not None
        if packed:
            _check_sequence_vector("cu_seqlens_k_new", cu_seqlens_k_new, batch + 1, q, "(batch + 1,)")
        for name, new, cache in (("k", k_new, k_cache), ("v", v_new, v_cache)):
            if packed:
                ok = isinstance(new, torch.Tensor) and new.dim() == 3 and new.shape[1:] == cache.shape[2:]
                want = f"packed (total_k_new, Hkv, {name}_cache's head dim) = (*, {cache.shape[2]}, {cache.shape[3]})" \
                       " with cu_seqlens_k_new"
            else:
                ok = isinstance(new, torch.Tensor) and new.dim() == 4 and new.shape[0] == batch and \
                    new.shape[2:] == cache.shape[2:]
                want = f"(B, Sq_new, Hkv, {name}_cache's head dim) = ({batch}, *, {cache.shape[2]}, {cache.shape[3]})"
                if isinstance(new, torch.Tensor) and new.dim() == 3:
                    want += " (3-D packed rows need cu_seqlens_k_new)"
            if not ok:
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ValueError(f"FlashCore: {name} must be {want}, got {got}")
            if kv_fp8 and new.dtype != q.dtype:  # 16-bit rows, quantized into the e4m3 cache by the library
                raise TypeError(f"FlashCore: {name} must have q's dtype {q.dtype} (rows appended to an e4m3 cache are "
                                f"given in 16 bits and quantized with {name}_descale by the library), got {new.dtype}")
            if not kv_fp8 and new.dtype != cache.dtype:
                raise TypeError(f"FlashCore: {name} must have {name}_cache's dtype {cache.dtype}, got {new.dtype}")
            if new.device != q.device:
                raise ValueError(f"FlashCore: {name} is on {new.device}, q on {q.device}")
        if v_new.shape[:-1] != k_new.shape[:-1]:
            raise ValueError(f"FlashCore: k and v must append as many rows, got {tuple(k_new.shape)} and "
                             f"{tuple(v_new.shape)}")
        _check_appendable(k_cache, v_cache, check_pointer=False)
    _check_rotary(rotary_cos, rotary_sin, rotary_seqlens, q, batch, k_new is not None)
    if rotary_cos is not None and k_new.shape[0] * k_new.shape[1] == 0:
        raise ValueError("FlashCore: rotary_cos / rotary_sin with k and v of no row: the library rotates the queries "
                         "only along an append; append at least one row, or rotate q yourself")
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    return batch, capacity


def _check_appendable(k_cache, v_cache, check_pointer: bool) -> None:
    """The library appends into the caches the call passes it, so they must be passed as they are: a copy
    (kernel_operand) would take the new rows instead of the caller's cache. check_pointer: also the 16-byte alignment
    of their addresses (not on fake tensors)."""
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if abi_strides(cache, check_pointer) is None:
            raise ValueError(f"FlashCore: {name} is appended to in place, so the kernel must take it as it is: its "
                             f"last stride must be 1, the others positive multiples of 16 bytes and its address "
                             f"16-byte aligned (got strides {tuple(cache.stride())})")


def _kvcache_serving_outputs(q, v_cache, return_lse: bool, varlen_q: bool):
    """out (q's dtype; bfloat16 for a float8_e4m3fn q, as FlashAttention-3's FP8 calls) and lse."""
    if varlen_q:
        out, lse = _empty_varlen_outputs(q, return_lse, v_cache.shape[3])
        return (out.to(torch.bfloat16), lse) if q.dtype == KV_FP8_DTYPE else (out, lse)
    return _empty_outputs(q, return_lse, head_dim_v=v_cache.shape[3],
                          out_dtype=torch.bfloat16 if q.dtype == KV_FP8_DTYPE else None)


def _launch_kvcache_serving(lib: _lib.Library, q, k_cache, v_cache, out, lse, causal: bool, softmax_scale: float,
                            seqused_k, *, block_table=None, num_splits: int = 0, variants=None, cache_batch_idx=None,
                            cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q: int = 0, k_new=None, v_new=None,
                            cu_seqlens_k_new=None, rotary: Optional[Rotary] = None, k_descale=None,
                            v_descale=None, q_descale=None) -> None:
    """One library call: the append (k_new into the caches, in place) and the attention. k_cache / v_cache are passed
    as they are when appended to (_kvcache_serving_inputs checked that the ABI takes them), else as kernel_operand
    lays them out; q and the new rows likewise. An e4m3 cache (since 0.9): k_descale / v_descale contiguous float32
    (B, Hkv) or None, the flag set by kernel_params."""
    if cu_seqlens_q is not None:
        q = kernel_operand(q.unsqueeze(0))[0].squeeze(0)
    else:
        q = kernel_operand(q)[0]
    if k_new is None:
        k_cache, v_cache = (kernel_operand(t)[0] for t in (k_cache, v_cache))
    elif cu_seqlens_k_new is not None:
        k_new, v_new = (kernel_operand(t.unsqueeze(0))[0].squeeze(0) for t in (k_new, v_new))
    else:
        k_new, v_new = (kernel_operand(t)[0] for t in (k_new, v_new))
    params = kernel_params(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k,
                           block_table=block_table, num_splits=num_splits, cu_seqlens_q=cu_seqlens_q,
                           max_seqlen_q=max_seqlen_q, variants=variants, k_new=k_new, v_new=v_new,
                           cu_seqlens_k_new=cu_seqlens_k_new, kv_batch_idx=cache_batch_idx, leftpad_k=cache_leftpad,
                           rotary=rotary, descales=(q_descale, k_descale, v_descale),
                           kv_fp8=k_cache.dtype == KV_FP8_DTYPE)
    _enqueue(lib, params, q.device)  # the workspace query sees the rotary fields: the rotated q lives there


def _kvcache_serving_fwd(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse, block_table,
                         num_splits, window_size_left, window_size_right, softcap, sinks, attention_chunk,
                         cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q, k_new, v_new, cu_seqlens_k_new,
                         rotary_cos=None, rotary_sin=None, rotary_interleaved=True, rotary_seqlens=None,
                         k_descale=None, v_descale=None, q_descale=None):
    """The body of both serving ops (attention_kvcache_serving_fwd, attention_kvcache_serving_append_fwd)."""
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _, capacity = _kvcache_serving_inputs(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx,
                                          cache_leftpad, cu_seqlens_q, k_new, v_new, cu_seqlens_k_new, rotary_cos,
                                          rotary_sin, rotary_seqlens, k_descale, v_descale, q_descale)
    heads_q = q.shape[-2]
    variants = _op_variants(q, heads_q, window_size_left, window_size_right, softcap, sinks, attention_chunk)
    kv_fp8 = _is_kv_fp8(k_cache, v_cache)
    if kv_fp8:
        _check_kv_fp8_variants(variants, causal)
    lib = _check_supported(q, q.shape[-1], v_cache.shape[3])
    if kv_fp8:
        _check_kv_fp8_library(lib)
    out, lse = _kvcache_serving_outputs(q, v_cache, return_lse, varlen_q)
    if k_new is not None and k_new.shape[0] * k_new.shape[1] == 0:  # no row to append: the plain call
        k_new = v_new = cu_seqlens_k_new = None
    if k_new is not None:
        _check_appendable(k_cache, v_cache, check_pointer=True)
    max_q = min(max_seqlen_q, q.shape[0]) if varlen_q else q.shape[1]
    if out.numel() == 0 or max_q == 0:
        if k_new is not None:
            raise ValueError("FlashCore: q has no row, so no kernel runs and k, v would not be appended; append with a "
                             "call that has queries")
        return out, lse
    if capacity == 0:  # no key can be seen (appended rows past the capacity are dropped: flashcore.h)
        _fill_rows_without_keys(out, lse, variants, heads_axis=0 if varlen_q else 1)
        return out, lse
    _launch_kvcache_serving(
        lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, cache_seqlens.contiguous(),
        block_table=None if block_table is None else block_table_operand(block_table), num_splits=num_splits,
        variants=_launch_variants(variants).get("variants"),
        cache_batch_idx=None if cache_batch_idx is None else cache_batch_idx.contiguous(),
        cache_leftpad=None if cache_leftpad is None else cache_leftpad.contiguous(),
        cu_seqlens_q=None if cu_seqlens_q is None else cu_seqlens_q.contiguous(), max_seqlen_q=max_q,
        k_new=k_new, v_new=v_new,
        cu_seqlens_k_new=None if cu_seqlens_k_new is None else cu_seqlens_k_new.contiguous(),
        rotary=None if rotary_cos is None else Rotary(
            rotary_cos.contiguous(), rotary_sin.contiguous(), bool(rotary_interleaved),
            None if rotary_seqlens is None else rotary_seqlens.contiguous()),
        **({} if not kv_fp8 else dict(k_descale=None if k_descale is None else k_descale.contiguous(),
                                      v_descale=None if v_descale is None else v_descale.contiguous(),
                                      **({} if q_descale is None else dict(q_descale=q_descale.contiguous())))))
    return out, lse


@torch.library.custom_op("flashcore::attention_kvcache_serving_fwd", mutates_args=())
def attention_kvcache_serving_fwd(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, causal: bool,
    softmax_scale: float, return_lse: bool, block_table: Optional[torch.Tensor] = None, num_splits: int = 0,
    window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0, cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None, cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
    k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """attention_kvcache_fwd with FlashAttention's serving arguments (a 0.8 library; no append): cache_batch_idx
    int32 (B,) (sequence b reads cache slot cache_batch_idx[b]: k_cache's batch entry, or block_table's row; one out of
    range gives O = 0, LSE = -inf), cache_leftpad int32 (B,) (dense: the keys are rows [cache_leftpad[b],
    cache_seqlens[b]), masks counted from the first), cu_seqlens_q int32 (B + 1,) with max_seqlen_q (q packed
    (total_q, Hq, D); out (total_q, Hq, Dv), lse (Hq, total_q)).

    An e4m3 KV cache (a 0.9 library, sm90): k_cache and v_cache float8_e4m3fn under float16 / bfloat16 q, their real
    values k_cache * k_descale[b, h] and v_cache * v_descale[b, h], k_descale / v_descale float32 (B, Hkv) on q's
    device (b: the sequence, h: the KV head; None: 1), out in q's dtype. No window, softcap, sinks or
    attention_chunk, one head dim; no backward (NotImplementedError naming the e4m3 cache). q may be float8_e4m3fn
    on it (FlashAttention-3's FP8 call), with q_descale as k_descale: the library widens q into its workspace, out is
    bfloat16."""
    return _kvcache_serving_fwd(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse, block_table,
                                num_splits, window_size_left, window_size_right, softcap, sinks, attention_chunk,
                                cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q, None, None, None,
                                k_descale=k_descale, v_descale=v_descale, q_descale=q_descale)


@attention_kvcache_serving_fwd.register_fake
def _attention_kvcache_serving_fwd_fake(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse,
                                        block_table=None, num_splits=0, window_size_left=-1, window_size_right=-1,
                                        softcap=0.0, sinks=None, attention_chunk=0, cache_batch_idx=None,
                                        cache_leftpad=None, cu_seqlens_q=None, max_seqlen_q=0, k_descale=None,
                                        v_descale=None, q_descale=None):
    _kvcache_serving_inputs(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad,
                            cu_seqlens_q, None, None, None, k_descale=k_descale, v_descale=v_descale,
                            q_descale=q_descale)
    variants = _op_variants(q, q.shape[-2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    if _is_kv_fp8(k_cache, v_cache):
        _check_kv_fp8_variants(variants, causal)
    return _kvcache_serving_outputs(q, v_cache, return_lse, cu_seqlens_q is not None)


@torch.library.custom_op("flashcore::attention_kvcache_serving_append_fwd", mutates_args=("k_cache", "v_cache"))
def attention_kvcache_serving_append_fwd(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, k_new: torch.Tensor,
    v_new: torch.Tensor, causal: bool, softmax_scale: float, return_lse: bool,
    block_table: Optional[torch.Tensor] = None, num_splits: int = 0, window_size_left: int = -1,
    window_size_right: int = -1, softcap: float = 0.0, sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0,
    cache_batch_idx: Optional[torch.Tensor] = None, cache_leftpad: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None, max_seqlen_q: int = 0,
    cu_seqlens_k_new: Optional[torch.Tensor] = None, rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None, rotary_interleaved: bool = True,
    rotary_seqlens: Optional[torch.Tensor] = None, k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """attention_kvcache_serving_fwd that first appends k_new, v_new to the caches, in place, by the library (the C
    ABI's k_new): (B, Sn, Hkv, D / Dv) rows at cache_seqlens[b] .. + Sn of sequence b's cache slot, or packed
    (total_k_new, Hkv, D / Dv) with cu_seqlens_k_new int32 (B + 1,) (sequence b's rows [cu_seqlens_k_new[b],
    cu_seqlens_k_new[b + 1]) at cache_seqlens[b]); the attention then sees those rows too. Rows past the cache's
    capacity are dropped, and a sequence whose cache_batch_idx entry is out of range appends nothing (flashcore.h).
    rotary_cos / rotary_sin (rotary_seqlen, rotary_dim / 2) in q's dtype (FlashAttention's rotary embedding, since
    0.8): the library writes the new keys rotated (new row t of sequence b at position rotary_seqlens[b] + t, or
    cache_seqlens[b] + t) and attends with q rotated (row i at rotary_seqlens[b] + i with causal or a window, else at
    rotary_seqlens[b]), pairs (2i, 2i + 1) with rotary_interleaved, else (i, i + rotary_dim / 2); q is not written.
    An e4m3 cache (k_descale / v_descale as attention_kvcache_serving_fwd's): k_new / v_new in q's dtype, stored as
    the e4m3 of x / descale[b, h] (rounded to nearest even, saturated to +-448), after the rotation."""
    return _kvcache_serving_fwd(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse, block_table,
                                num_splits, window_size_left, window_size_right, softcap, sinks, attention_chunk,
                                cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q, k_new, v_new,
                                cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens,
                                k_descale=k_descale, v_descale=v_descale)


@attention_kvcache_serving_append_fwd.register_fake
def _attention_kvcache_serving_append_fwd_fake(q, k_cache, v_cache, cache_seqlens, k_new, v_new, causal,
                                               softmax_scale, return_lse, block_table=None, num_splits=0,
                                               window_size_left=-1, window_size_right=-1, softcap=0.0, sinks=None,
                                               attention_chunk=0, cache_batch_idx=None, cache_leftpad=None,
                                               cu_seqlens_q=None, max_seqlen_q=0, cu_seqlens_k_new=None,
                                               rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                                               rotary_seqlens=None, k_descale=None, v_descale=None):
    _kvcache_serving_inputs(q, k_cache, v_cache, cache_seqlens, block_table, cache_batch_idx, cache_leftpad,
                            cu_seqlens_q, k_new, v_new, cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_seqlens,
                            k_descale, v_descale)
    variants = _op_variants(q, q.shape[-2], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    if _is_kv_fp8(k_cache, v_cache):
        _check_kv_fp8_variants(variants, causal)
    return _kvcache_serving_outputs(q, v_cache, return_lse, cu_seqlens_q is not None)


# ---------------------------------------------------------------------------------------------------------------
# Packed variable-length batches (FlashAttention's flash_attn_varlen_func).


def _check_cu_seqlens(name: str, cu: torch.Tensor, q: torch.Tensor) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"FlashCore: {name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(
            f"FlashCore: {name} must be an int32 tensor of shape (batch + 1,) with batch >= 1, got {cu.dtype} "
            f"{tuple(cu.shape)}"
        )
    if cu.device != q.device:
        raise ValueError(f"FlashCore: {name} is on {cu.device}, q on {q.device}")


def _check_max_seqlen(name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        raise TypeError(f"FlashCore: {name} must be a Python int (reading it from a tensor would synchronise with "
                        f"the device), got a tensor")
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"FlashCore: {name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"FlashCore: {name} must be >= 0, got {value}")


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q=None) -> None:
    """q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv) (Dv: D, or head_dim_v), cu_seqlens int32
    (batch + 1,), seqused_k and seqused_q int32 (batch,)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(
                f"FlashCore: {name} must be 3-D (total_tokens, num_heads, head_dim) for varlen_attention, got shape "
                f"{tuple(t.shape)}"
            )
    # The 4-D checks on (1, total, H, D) views: dtypes, k/v shapes, head dims, head ratio, devices.
    _check_inputs(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), "bshd")
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q)
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(
            f"FlashCore: cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    batch = cu_seqlens_q.shape[0] - 1
    for name, used in (("seqused_k", seqused_k), ("seqused_q", seqused_q)):
        if used is None:
            continue
        if (not isinstance(used, torch.Tensor) or used.dtype != torch.int32 or used.dim() != 1
                or used.shape[0] != batch):
            got = f"{used.dtype} {tuple(used.shape)}" if isinstance(used, torch.Tensor) else type(used).__name__
            raise ValueError(f"FlashCore: {name} must be None or an int32 tensor of shape (batch,) = ({batch},), "
                             f"got {got}")
        if used.device != q.device:
            raise ValueError(f"FlashCore: {name} is on {used.device}, q on {q.device}")


def _empty_varlen_outputs(q: torch.Tensor, return_lse: bool, head_dim_v: int, unused_rows: bool = False):
    """out (total_q, Hq, head_dim_v) and lse (Hq, total_q), or an empty (0,) lse. unused_rows (seqused_q): rows the
    library will not write, so out is zero-filled and lse -inf-filled (the values of a row that sees no key), which
    makes the result deterministic (FlashAttention-3 leaves them uninitialised)."""
    total_q, heads_q, _ = q.shape
    if unused_rows:
        out = q.new_zeros((total_q, heads_q, head_dim_v))
        lse = q.new_full((heads_q, total_q) if return_lse else (0,), -math.inf, dtype=torch.float32)
        return out, lse
    out = q.new_empty((total_q, heads_q, head_dim_v))
    lse = q.new_empty((heads_q, total_q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def _rows_used(cu_seqlens_q: torch.Tensor, seqused_q: torch.Tensor, total_q: int) -> torch.Tensor:
    """bool (total_q,): whether packed row r is among its sequence's first seqused_q[b] rows (on the device, no host
    sync)."""
    rows = torch.arange(total_q, device=cu_seqlens_q.device, dtype=torch.int64)
    cu = cu_seqlens_q.long()
    seq = torch.searchsorted(cu[1:], rows, right=True).clamp_(max=cu.shape[0] - 2)
    return (rows >= cu[seq]) & (rows < cu[seq + 1]) & (rows - cu[seq] < seqused_q.long()[seq])


@torch.library.custom_op("flashcore::varlen_attention_fwd", mutates_args=())
def varlen_attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    seqused_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
    return_lse: bool, window_size_left: int = -1, window_size_right: int = -1, softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0, seqused_q: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed variable-length attention: sequence b is rows [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q (total_q, Hq,
    D) against rows [cu_seqlens_k[b], cu_seqlens_k[b+1]) of k (total_k, Hkv, D) and v (total_k, Hkv, Dv) (the first
    seqused_k[b] of them when given); Dv is D, or v's head dim of its own (head_dim_v, as in attention_fwd). Returns
    (out (total_q, Hq, Dv), lse float32 (Hq, total_q) or an empty (0,) tensor). The variants (window, softcap, sinks,
    attention_chunk) as in attention_fwd, aligned per sequence. seqused_q int32 (batch,) (since 0.8): only sequence
    b's first seqused_q[b] query rows are computed (causal alignment against seqused_q[b]); every other row of out is
    0 and of lse -inf."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    variants = _op_variants(q, q.shape[1], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    lib = _check_supported(q, q.shape[2], v.shape[2])
    out, lse = _empty_varlen_outputs(q, return_lse, v.shape[2], unused_rows=seqused_q is not None)
    if out.numel() == 0:
        return out, lse
    # No sequence is longer than its packed tensor: tighter bounds, same result (the lengths are never read here).
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, q.shape[0]), min(max_seqlen_k, k.shape[0])
    if max_seqlen_q == 0 or max_seqlen_k == 0:  # no query row, or no key anywhere: O = 0, LSE = -inf (or the sink)
        if seqused_q is None or variants is None or variants.sinks is None or lse.numel() == 0:
            _fill_rows_without_keys(out, lse, variants, heads_axis=0)
        else:  # the sink's LSE on the used rows only (the others stay -inf, as the library leaves them unwritten)
            used = _rows_used(cu_seqlens_q, seqused_q, q.shape[0])
            lse.copy_(torch.where(used[None, :], variants.sinks[:, None], lse))
        return out, lse
    _launch_varlen(lib, q, k, v, out, lse, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), max_seqlen_q,
                   max_seqlen_k, causal, softmax_scale, None if seqused_k is None else seqused_k.contiguous(),
                   **_launch_variants(variants),
                   **({} if seqused_q is None else {"seqused_q": seqused_q.contiguous()}))
    return out, lse


@varlen_attention_fwd.register_fake
def _varlen_attention_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal,
                               softmax_scale, return_lse, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               sinks=None, attention_chunk=0, seqused_q=None):
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    _op_variants(q, q.shape[1], window_size_left, window_size_right, softcap, sinks, attention_chunk)
    return _empty_varlen_outputs(q, return_lse, v.shape[2])


# ---------------------------------------------------------------------------------------------------------------
# The backward (since 0.4): the flashcore::attention_bwd custom op (flashcore_attention_backward) and the autograd
# formulas of the forward ops.

# The head dims the library's backward takes (flashcore.h): 64 and 128 on every backend (0.4); since 0.9, on the sm90
# (Hopper) backend, 96, 192 and 256 too, and v with a head dim of its own for the (head_dim, head_dim_v) pairs
# BACKWARD_HEAD_DIM_PAIRS (DeepSeek MLA's (192, 128)); the variants' backward (a window, softcap, attention_chunk) at
# head dims BACKWARD_VARIANT_HEAD_DIMS only (sinks at every one). The ops leave the decision to the library (its error
# names the field); the transformers adapter reads these to fall back to SDPA for training calls the backward cannot
# take, before running the forward.
BACKWARD_HEAD_DIMS = (64, 96, 128, 192, 256)
BACKWARD_PORTABLE_HEAD_DIMS = (64, 128)  # those of every backend (all of the portable backend's)
BACKWARD_HEAD_DIM_PAIRS = ((192, 128),)  # (head_dim, head_dim_v), head_dim_v != head_dim: the sm90 backend, 0.9
# A window, softcap or attention_chunk in the backward (96, 192 and 256: the sm90 backend, 0.9; a 0.9 library built
# before the variants at 192 and 256 were compiled by default refuses those, naming the field)
BACKWARD_VARIANT_HEAD_DIMS = (64, 96, 128, 192, 256)
BACKWARD_WIDE_VERSION = (0, 9)  # the first library whose backward takes more than head dims 64 and 128 (sm90 backend)

KVCACHE_BACKWARD_NOT_SUPPORTED = ("FlashCore: the backward of KV-cache attention (flashcore.attention_with_kvcache, "
                                  "dense or paged caches) is not supported yet; it is for inference: run it under "
                                  "torch.no_grad() / torch.inference_mode()")


def _abi_layout(t: torch.Tensor) -> bool:
    """Whether the C ABI takes a freshly allocated tensor with t's sizes and strides as it is (abi_strides without
    the pointer check: metadata only, so it gives the same answer on fake tensors)."""
    align = max(1, 16 // t.element_size())
    for size, stride in zip(t.shape[:3], t.stride()[:3]):
        if size > 1 and (stride <= 0 or stride % align != 0):
            return False
    return t.shape[3] <= 1 or t.stride(3) == 1


def _grad_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor for t's gradient: t's layout when the C ABI takes it (a (B, H, S, D) tensor that sdpa
    viewed as (B, S, H, D) gets a gradient of its own layout, so .grad needs no copy), else contiguous (B, S, H, D).
    Metadata only: the fake implementation allocates the same."""
    grad = torch.empty_like(t, memory_format=torch.preserve_format)
    return grad if _abi_layout(grad) else t.new_empty(t.shape)


def _check_backward_inputs(dout, q, k, v, out, lse) -> None:
    """The backward's arguments (metadata only): 16-bit q, k, v as the forward takes them (v may have a head dim Dv of
    its own, head_dim_v: whether the library's backward takes the pair is its own decision, at launch); dout and out
    of q's shape but for their last dimension, v's (B, Sq, Hq, Dv), and of q's dtype; lse float32 (B, Hq, Sq), the
    forward's."""
    _check_inputs(q, k, v, "bshd")
    want_shape = (*q.shape[:3], v.shape[3])
    for name, t in (("dout", dout), ("out", out)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != want_shape or t.dtype != q.dtype:
            what = ("q's shape and dtype" if v.shape[3] == q.shape[3] else
                    "q's shape with v's head dim (head_dim_v), and q's dtype,")
            raise ValueError(f"FlashCore: {name} must have {what} {want_shape} {q.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"FlashCore: {name} is on {t.device}, q on {q.device}")
    want = (q.shape[0], q.shape[2], q.shape[1])
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != want:
        got = f"{lse.dtype} {tuple(lse.shape)}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"FlashCore: lse must be the forward's float32 (batch, num_heads_q, seqlen_q) = {want} "
                         f"(attention_fwd with return_lse=True), got {got}")
    if lse.device != q.device:
        raise ValueError(f"FlashCore: lse is on {lse.device}, q on {q.device}")


def _variants_of(window_size_left: int, window_size_right: int, softcap: float, sinks: Optional[torch.Tensor],
                 attention_chunk: int, causal: bool) -> Optional[Variants]:
    """The variant arguments of an op call as Variants, or None when they change nothing (the plain call, which the
    plain backward takes: every argument at its default, or a causal call's window (-1, right), which is causal
    attention)."""
    variants = Variants(window_size_left, window_size_right, softcap, sinks, attention_chunk)
    return variants if variant_names(variants, causal) else None


def _check_variant_backward_supported(lib: _lib.Library, variants: Optional[Variants], causal: bool,
                                      dsinks: bool) -> None:
    """A backward with variants needs a 0.6 library (flashcore_attention_backward takes window, softcap and sinks, and
    writes dsinks; attention_chunk too in a library that has chunked attention, which refuses it otherwise in both
    passes): RuntimeError naming them and the version otherwise, before anything is launched. (A 0.5 library refuses
    them in its backward; a 0.4 one cannot even read them.)"""
    names = variant_names(variants, causal)
    if dsinks and "sinks" not in names:
        names.append("sinks")
    if names and not lib.has_variant_backward():
        what = ", ".join(names) + (" (and their gradient, dsinks)" if dsinks else "")
        raise RuntimeError(f"FlashCore: the backward with {what} needs a 0.6 library or newer; {lib.path} (version "
                           f"{lib.version_string()}) has {'no backward' if not lib.has_backward() else 'none for them'}"
                           f" (the variants' backward came in 0.6): rebuild libflashcore.so")


def _require_backward_function(lib: _lib.Library) -> None:
    if not lib.has_backward():
        raise RuntimeError(f"FlashCore: {lib.path} (version {lib.version_string()}) has no flashcore_attention_backward"
                           " (the backward pass needs a 0.4 library or newer): rebuild libflashcore.so")


def backward_params(lib: _lib.Library, dout, q, k, v, out, lse, dq, dk, dv, causal: bool, softmax_scale: float,
                    deterministic: bool, *, variants: Optional[Variants] = None,
                    dsinks: Optional[torch.Tensor] = None):
    """The C params of one backward call on tensors the ABI takes as they are (kernel_operand; dq, dk, dv fresh,
    _grad_like), without a workspace: the forward's fields for q, k, v, out and the contiguous float32 lse, and the
    backward's for dout, dq, dk, dv. variants (since 0.6): the forward's window, softcap, sinks (a contiguous
    float32 (Hq,) tensor) and attention_chunk, written as kernel_params writes them for the forward; dsinks: None, or
    a fresh float32 (Hq,) tensor the library writes the sinks' gradient into (Library.set_dsinks: RuntimeError for a
    library older than 0.6)."""
    params = kernel_params(lib, q, k, v, out, lse, causal, softmax_scale, variants=variants)
    strides = tuple(abi_strides(t) for t in (dout, dq, dk, dv))
    if any(st is None for st in strides):
        raise ValueError("FlashCore: backward_params needs dout, dq, dk, dv the C ABI takes as they are")
    params = _lib.fill_backward_params(params, pointers=tuple(t.data_ptr() for t in (dout, dq, dk, dv)),
                                       strides=strides, deterministic=deterministic)
    if dsinks is not None:
        if dsinks.dtype != torch.float32 or not dsinks.is_contiguous():
            raise ValueError("FlashCore: backward_params needs a contiguous float32 dsinks")
        lib.set_dsinks(params, dsinks.data_ptr())
    return params


def _run_backward(lib: _lib.Library, params, device: torch.device) -> None:
    """Allocate the backward's workspace (any contents: a torch allocation on the current stream, freed after the launch
    and reused in stream order; inside a CUDA-graph capture from the graph's pool) and enqueue the backward."""
    with torch.cuda.device(device):
        size = lib.backward_workspace_size(params)
        workspace = torch.empty(size, dtype=torch.uint8, device=device) if size else None
        if workspace is not None:
            params.workspace = workspace.data_ptr()
            params.workspace_size = size
        lib.backward(params, torch.cuda.current_stream(device).cuda_stream)


def _launch_backward(lib: _lib.Library, dout, q, k, v, out, lse, dq, dk, dv, causal: bool, softmax_scale: float,
                     deterministic: bool, variants: Optional[Variants] = None,
                     dsinks: Optional[torch.Tensor] = None) -> None:
    """Enqueue flashcore_attention_backward on the current stream of q's device: dq, dk, dv (fresh tensors the ABI
    takes as they are) are written whole, and dsinks (a fresh float32 (Hq,) tensor, or None) with the sinks' gradient.
    Inputs it cannot take as they are (a strided last dimension, misaligned) are copied, as for the forward. variants:
    the forward's (None: the plain call, any 0.4 library; else a 0.6 library)."""
    _require_backward_function(lib)
    _check_variant_backward_supported(lib, variants, causal, dsinks is not None)
    q, k, v, out, dout = (kernel_operand(t)[0] for t in (q, k, v, out, dout))
    params = backward_params(lib, dout, q, k, v, out, lse.contiguous(), dq, dk, dv, causal, softmax_scale,
                             deterministic, **_launch_variants(variants), dsinks=dsinks)
    _run_backward(lib, params, q.device)


@torch.library.custom_op("flashcore::attention_bwd", mutates_args=())
def attention_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool, softmax_scale: float, deterministic: bool = False
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashCore backward, (B, S, H, D) layout: (dq, dk, dv) of out = attention(q, k, v, causal, softmax_scale) for
    the upstream gradient dout, from the forward's out and lse (float32 (B, Hq, Sq)). softmax_scale 0.0 means
    1/sqrt(head_dim). GQA / MQA: dk and dv of a KV head are summed over its query heads. deterministic: dq
    bit-identical from run to run (dk and dv always are). 16-bit dense calls; the library says which head dims (64
    and 128 in 0.4; since 0.9 on the sm90 backend 96, 192 and 256 too). v may have a head dim Dv of its own
    (head_dim_v): dout and out are then (B, Sq, Hq, Dv) and dv has v's shape; the library says which pairs (since
    0.9 on the sm90 backend: (192, 128)), refusing the others at launch (its error, naming head_dim_v). dq, dk, dv
    have q's, k's, v's layout when the C ABI takes it, else are contiguous. The backward of a call with variants is
    attention_variants_bwd."""
    _check_backward_inputs(dout, q, k, v, out, lse)
    lib = _check_supported(q, q.shape[3], v.shape[3])
    dq, dk, dv = (_grad_like(t) for t in (q, k, v))
    if q.numel() == 0 or k.numel() == 0:  # no query row or no key: no gradient flows
        return dq.zero_(), dk.zero_(), dv.zero_()
    _launch_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, causal, softmax_scale, deterministic)
    return dq, dk, dv


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False):
    _check_backward_inputs(dout, q, k, v, out, lse)
    return tuple(_grad_like(t) for t in (q, k, v))


def _bwd_variants(q: torch.Tensor, heads_q: int, window_size_left: int, window_size_right: int, softcap: float,
                  sinks: Optional[torch.Tensor], return_dsinks: bool, attention_chunk: int) -> Optional[Variants]:
    """The variant arguments of a variants backward op, checked as the forward ops check theirs; return_dsinks needs
    sinks (dsinks is their gradient)."""
    if not isinstance(return_dsinks, bool):
        raise TypeError(f"FlashCore: return_dsinks must be a bool, got {type(return_dsinks).__name__}")
    variants = _op_variants(q, heads_q, window_size_left, window_size_right, softcap, sinks, attention_chunk)
    if return_dsinks and (variants is None or variants.sinks is None):
        raise ValueError("FlashCore: return_dsinks=True needs sinks (dsinks is the gradient of the sinks the forward "
                         "took)")
    return variants


def _empty_dsinks(q: torch.Tensor, heads_q: int, return_dsinks: bool) -> torch.Tensor:
    """dsinks as the variants backward ops return it: float32 (Hq,) when asked for, else an empty (0,) tensor."""
    return q.new_empty((heads_q,) if return_dsinks else (0,), dtype=torch.float32)


@torch.library.custom_op("flashcore::attention_variants_bwd", mutates_args=())
def attention_variants_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    causal: bool, softmax_scale: float, deterministic: bool = False, window_size_left: int = -1,
    window_size_right: int = -1, softcap: float = 0.0, sinks: Optional[torch.Tensor] = None,
    return_dsinks: bool = False, attention_chunk: int = 0
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of attention_fwd with the attention variants (since 0.6; a 0.6 library): (dq, dk, dv, dsinks) of
    out = attention(q, k, v, causal, softmax_scale, window, softcap, sinks, attention_chunk) for the upstream gradient
    dout, from the forward's out and lse (float32 (B, Hq, Sq), written by the forward with the same variants). The
    variants as attention_fwd takes them (window_size_left / window_size_right, softcap, sinks float32 (Hq,),
    attention_chunk: last, after return_dsinks, so that a call of the 0.6 op's arguments by position is unchanged).
    return_dsinks (needs sinks): dsinks is the sinks' gradient, float32 (Hq,), dL/dsinks[h] =
    -sum over the batch and rows i of head h of exp(sinks[h] - lse_i) * rowsum(dout_i * out_i); else an empty (0,)
    tensor (a custom op cannot return None). The rest (v with a head dim of its own included) as attention_bwd."""
    _check_backward_inputs(dout, q, k, v, out, lse)
    variants = _bwd_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, return_dsinks,
                             attention_chunk)
    lib = _check_supported(q, q.shape[3], v.shape[3])
    dq, dk, dv = (_grad_like(t) for t in (q, k, v))
    dsinks = _empty_dsinks(q, q.shape[2], return_dsinks)
    if q.numel() == 0 or k.numel() == 0:  # no query row, or no key (out = 0: D = 0): no gradient flows
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks.zero_()
    _launch_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, causal, softmax_scale, deterministic,
                     variants=variants, dsinks=dsinks if return_dsinks else None)
    return dq, dk, dv, dsinks


@attention_variants_bwd.register_fake
def _attention_variants_bwd_fake(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False,
                                 window_size_left=-1, window_size_right=-1, softcap=0.0, sinks=None,
                                 return_dsinks=False, attention_chunk=0):
    _check_backward_inputs(dout, q, k, v, out, lse)
    _bwd_variants(q, q.shape[2], window_size_left, window_size_right, softcap, sinks, return_dsinks, attention_chunk)
    return (*(_grad_like(t) for t in (q, k, v)), _empty_dsinks(q, q.shape[2], return_dsinks))


def _backward_unsupported(q: torch.Tensor, out: torch.Tensor, precision: int) -> Optional[str]:
    """Why a forward call has no backward yet (None: it has). Every variant has one (the window, softcap and sinks
    since 0.6, attention_chunk with the library that runs it: the same library call takes it in both passes), and so
    has v with a head dim of its own (whether the library's backward takes the pair is its decision, at backward)."""
    if q.dtype in FP8_DTYPES:
        return "FlashCore: the backward of 8-bit attention (float8 q, k, v) is not supported yet"
    if precision != _lib.PRECISION_NATIVE:
        name = "fp8" if precision == _lib.PRECISION_FP8 else "int8"
        return f"FlashCore: the backward of precision='{name}' attention is not supported yet"
    if out.dtype != q.dtype:
        return (f"FlashCore: the backward of attention with out_dtype={out.dtype} (inputs {q.dtype}) is not supported "
                "yet")
    return None


def _lse_grads(q, k, v, out, lse, grad_lse, dq, dk, causal: bool, softmax_scale: float, deterministic: bool):
    """dq, dk with the gradient that flows back through lse (the library's backward takes dO only).

    lse_i = log sum_j exp(s_ij) with s_ij = scale q_i.k_j, so d lse_i / d s_ij = P_ij, and g = grad_lse adds
    dS_ij = g_i P_ij: dq_i += scale g_i sum_j P_ij k_j, which is scale g_i times the attention of q over (k, k); and
    dk_j += scale sum_i P_ij g_i q_i, which is the dV of a backward with dO = g * q (P^T dO, summed over each KV head's
    query heads). dv does not change. Rows that see no key have P = 0 and get nothing, whatever g holds there.
    With v of a head dim of its own (head_dim_v), dO = g * q has q's head dim, not v's: that backward then takes k as
    its v and zeros as its O (its dV, P^T dO, reads neither; its dq and dk, which do, are dropped)."""
    scale = softmax_scale if softmax_scale else 1.0 / math.sqrt(q.shape[3])
    g = grad_lse.transpose(1, 2).unsqueeze(-1)  # (B, Sq, Hq, 1)
    if dq is not None:
        k_mean, _ = attention_fwd(q, k, k, causal, softmax_scale, False)
        dq = (dq.float() + (scale * g) * k_mean.float()).to(dq.dtype)
    if dk is not None:
        dout_lse = (g * q.float()).to(q.dtype)
        if v.shape[3] != q.shape[3]:
            v, out = k, torch.zeros_like(dout_lse)
        _, _, dk_lse = attention_bwd(dout_lse, q, k, v, out, lse, causal, softmax_scale, deterministic)
        dk = (dk.float() + scale * dk_lse.float()).to(dk.dtype)
    return dq, dk


def _variant_lse_grads(q, k, lse, grad_lse, dq, dk, dsinks, causal: bool, softmax_scale: float, deterministic: bool,
                       variants: Variants):
    """dq, dk and dsinks with the gradient that flows back through lse, for a call with variants.

    With the variants, lse_i = log(sum_j exp(s_ij) + exp(sink)) over the visible keys, s_ij = softcap(scale q_i.k_j).
    d lse_i / d s_ij = P_ij (the forward's probabilities, sink included in the denominator), so g = grad_lse adds
    g_i P_ij to the backward's dS_ij = P_ij (dO_i.v_j - D_i), D_i = rowsum(dO_i * O_i), before the softcap's
    derivative (which only the kernel applies). One more backward call gives exactly that term: v' = e_0 for every
    key, dO' = g e_0 (so dO'_i.v'_j = g_i) and O' = 0 (so D'_i = 0): its dq and dk are the lse's contribution (its dv
    is dropped), whatever the window and softcap. The sinks: d lse_i / d sink = exp(sink - lse_i), added here
    (dsinks[h] += sum over b, i of g exp(sinks[h] - lse)); a row that sees no key has lse = sink and gets g.
    Rows with lse = -inf (no key, no sinks) pass nothing, whatever g holds there."""
    if dq is not None or dk is not None:
        head_dim = q.shape[3]
        e0 = (torch.arange(head_dim, device=q.device) == 0).to(q.dtype)  # (D,)
        ones_v = e0.expand(k.shape).contiguous()
        finite_g = torch.where(torch.isfinite(lse), grad_lse, 0.0)
        dout_lse = finite_g.transpose(1, 2).unsqueeze(-1).to(q.dtype) * e0  # (B, Sq, Hq, D)
        dq_lse, dk_lse, _, _ = attention_variants_bwd(
            dout_lse, q, k, ones_v, torch.zeros_like(dout_lse), lse, causal, softmax_scale, deterministic,
            variants.window_size_left, variants.window_size_right, variants.softcap, variants.sinks, False,
            variants.attention_chunk)
        if dq is not None:
            dq = (dq.float() + dq_lse.float()).to(dq.dtype)
        if dk is not None:
            dk = (dk.float() + dk_lse.float()).to(dk.dtype)
    if dsinks is not None:
        sink_share = torch.exp(variants.sinks.float()[None, :, None] - lse)  # (B, Hq, Sq); lse >= sink: finite
        dsinks = dsinks + (grad_lse.float() * sink_share).sum(dim=(0, 2))
    return dq, dk, dsinks


# attention_fwd's inputs: (q, k, v, causal, softmax_scale, return_lse, q_descale, k_descale, v_descale, out_dtype,
# precision, v_transposed, deterministic, window_size_left, window_size_right, softcap, sinks, attention_chunk).
_FWD_SINKS_INPUT = 16


def _setup_context(ctx, inputs, output) -> None:
    (q, k, v, causal, softmax_scale, _return_lse, _q_descale, _k_descale, _v_descale, _out_dtype, precision,
     _v_transposed, deterministic, window_size_left, window_size_right, softcap, sinks, attention_chunk) = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # an output nobody used (lse, mostly) comes back as None, not as zeros
    variants = _variants_of(window_size_left, window_size_right, softcap, sinks, attention_chunk, causal)
    ctx.unsupported = _backward_unsupported(q, out, precision)
    ctx.num_inputs = len(inputs)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    # The variants without their tensor (saved below, with q, k, v, out and lse).
    ctx.variants = None if variants is None else variants._replace(sinks=None)
    if ctx.unsupported is not None:
        ctx.save_for_backward(q, k, v)
    else:
        ctx.save_for_backward(q, k, v, out, lse, sinks)


def _backward(ctx, grad_out, grad_lse):
    """The autograd formula of flashcore::attention_fwd: gradients for q, k, v, and for sinks (since 0.6, with a 0.6
    library; float32 (Hq,), from the library's dsinks) when they require grad; none for the flags, descales, ...
    A call with variants runs attention_variants_bwd, a plain one attention_bwd."""
    grads = [None] * ctx.num_inputs
    if ctx.unsupported is not None:
        given = [g for g in (grad_out, grad_lse) if g is not None]
        grads[:3] = backward_not_supported(given, list(ctx.saved_tensors), ctx.unsupported)
        return tuple(grads)
    q, k, v, out, lse, sinks = ctx.saved_tensors
    variants = None if ctx.variants is None else ctx.variants._replace(sinks=sinks)
    needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
    needs_sinks = sinks is not None and ctx.needs_input_grad[_FWD_SINKS_INPUT]
    if (grad_out is None and grad_lse is None) or not (needs_q or needs_k or needs_v or needs_sinks):
        return tuple(grads)
    causal, scale, deterministic = ctx.causal, ctx.softmax_scale, ctx.deterministic
    if lse.dim() != 3:  # the op ran with return_lse=False (the front ends ask for lse when grads are needed)
        grad_lse = None  # the gradient of the empty placeholder: nothing
        if grad_out is None:
            return tuple(grads)
        out, lse = attention_fwd(q, k, v, causal, scale, True, **_variant_kwargs(variants))
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dsinks = None
    if variants is None:
        dq, dk, dv = attention_bwd(grad_out, q, k, v, out, lse, causal, scale, deterministic)
        if grad_lse is not None and (needs_q or needs_k):
            dq, dk = _lse_grads(q, k, v, out, lse, grad_lse, dq if needs_q else None, dk if needs_k else None, causal,
                                scale, deterministic)
    else:
        dq, dk, dv, dsinks = attention_variants_bwd(grad_out, q, k, v, out, lse, causal, scale, deterministic,
                                                    variants.window_size_left, variants.window_size_right,
                                                    variants.softcap, variants.sinks, needs_sinks,
                                                    variants.attention_chunk)
        if grad_lse is not None and (needs_q or needs_k or needs_sinks):
            dq, dk, dsinks = _variant_lse_grads(q, k, lse, grad_lse, dq if needs_q else None,
                                                dk if needs_k else None, dsinks if needs_sinks else None, causal,
                                                scale, deterministic, variants)
    grads[:3] = (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None)
    if needs_sinks:
        grads[_FWD_SINKS_INPUT] = dsinks
    return tuple(grads)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("flashcore::backward_not_supported", mutates_args=())
def backward_not_supported(grads: List[torch.Tensor], inputs: List[torch.Tensor], message: str) -> List[torch.Tensor]:
    """The gradients of `inputs` for a call whose backward FlashCore does not have, given the gradients of its outputs
    (`grads`, read by nothing: they keep a compiled graph's partitioner from moving the op into the forward): raises
    NotImplementedError(message) when run. Its fake traces (gradients shaped like the inputs), so a compiled graph
    whose inputs require grad still builds, and the error comes when its backward runs, as in eager mode."""
    raise NotImplementedError(message)


@backward_not_supported.register_fake
def _backward_not_supported_fake(grads, inputs, message):
    return [torch.empty_like(t) for t in inputs]


def _register_unsupported_backward(op, message, count: int) -> None:
    """An autograd formula for `op` (with `count` inputs, the first three q, k, v) that raises
    NotImplementedError(message) when the backward reaches it: inputs may require grad until then, and no gradient is
    ever made up. message: a str, or a function of the call's inputs returning it."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.message = message(inputs) if callable(message) else message
        ctx.save_for_backward(*inputs[:3])

    def backward(ctx, *grads):
        given = [g for g in grads if g is not None]
        return tuple(backward_not_supported(given, list(ctx.saved_tensors), ctx.message)) + (None,) * (count - 3)

    op.register_autograd(backward, setup_context=setup_context)


def _launch_varlen_backward(lib: _lib.Library, dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q: int, max_seqlen_k: int, causal: bool, softmax_scale: float,
                            deterministic: bool, variants: Optional[Variants] = None,
                            dsinks: Optional[torch.Tensor] = None, seqused_q=None, seqused_k=None) -> None:
    """Enqueue flashcore_attention_backward for a packed batch (q, dq (total_q, Hq, D); out, dout (total_q, Hq, Dv);
    k, dk (total_k, Hkv, D); v, dv (total_k, Hkv, Dv), Dv v's head dim (D, or head_dim_v); dq, dk, dv contiguous; lse
    (Hq, total_q)) on the current stream of q's device; dsinks as in
    _launch_backward. max_seqlen_*: already bounded by the packed tensors, both > 0. seqused_q / seqused_k: int32
    (batch,) contiguous, or None (a library before 0.9 refuses them, naming the field)."""
    _require_backward_function(lib)
    _check_variant_backward_supported(lib, variants, causal, dsinks is not None)
    q, k, v, out, dout = (kernel_operand(t.unsqueeze(0))[0].squeeze(0) for t in (q, k, v, out, dout))
    params = kernel_params(lib, q, k, v, out, lse.contiguous(), causal, softmax_scale, seqused_k,
                           cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                           max_seqlen_k=max_seqlen_k, **_launch_variants(variants),
                           **({} if seqused_q is None else {"seqused_q": seqused_q}))
    strides = tuple(abi_strides(t.unsqueeze(0)) for t in (dout, dq, dk, dv))
    params = _lib.fill_backward_params(params, pointers=tuple(t.data_ptr() for t in (dout, dq, dk, dv)),
                                       strides=strides, deterministic=deterministic)
    if dsinks is not None:
        lib.set_dsinks(params, dsinks.data_ptr())
    _run_backward(lib, params, q.device)


def _varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                softmax_scale, deterministic, variants, return_dsinks, seqused_q=None, seqused_k=None):
    """The body of both varlen backward ops: (dq, dk, dv, dsinks or an empty (0,) tensor). v may have a head dim of
    its own (head_dim_v; out and dout then have it too): the library decides whether its backward takes the pair."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    lib = _check_supported(q, q.shape[2], v.shape[2])
    dq, dk, dv = (torch.zeros_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    dsinks = _empty_dsinks(q, q.shape[1], return_dsinks)
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, q.shape[0]), min(max_seqlen_k, k.shape[0])
    if q.numel() == 0 or k.numel() == 0 or max_seqlen_q == 0 or max_seqlen_k == 0:
        return dq, dk, dv, dsinks.zero_()
    _launch_varlen_backward(lib, dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q.contiguous(),
                            cu_seqlens_k.contiguous(), max_seqlen_q, max_seqlen_k, causal, softmax_scale, deterministic,
                            **({} if variants is None else {"variants": variants}),
                            **({"dsinks": dsinks} if return_dsinks else {}),
                            seqused_q=None if seqused_q is None else seqused_q.contiguous(),
                            seqused_k=None if seqused_k is None else seqused_k.contiguous())
    return dq, dk, dv, dsinks


@torch.library.custom_op("flashcore::varlen_attention_bwd", mutates_args=())
def varlen_attention_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
    softmax_scale: float, deterministic: bool = False, seqused_q: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of varlen_attention_fwd (packed q (total_q, Hq, D), out and dout (total_q, Hq, Dv); k (total_k,
    Hkv, D), v (total_k, Hkv, Dv), Dv v's head dim: D, or head_dim_v, whose pairs the library decides on (since 0.9 on
    the sm90 backend: (192, 128)); lse float32 (Hq, total_q), the forward's): (dq, dk, dv), packed like q, k, v (dv
    of v's shape). Rows not covered by cu_seqlens get
    zeros, and (since 0.9, a 0.9 library) so do rows past seqused_q / seqused_k (int32 (batch,), the forward's). The
    backward of a call with variants is varlen_attention_variants_bwd."""
    dq, dk, dv, _ = _varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                causal, softmax_scale, deterministic, None, False, seqused_q, seqused_k)
    return dq, dk, dv


@varlen_attention_bwd.register_fake
def _varlen_attention_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal, softmax_scale, deterministic=False, seqused_q=None, seqused_k=None):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


@torch.library.custom_op("flashcore::varlen_attention_variants_bwd", mutates_args=())
def varlen_attention_variants_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
    softmax_scale: float, deterministic: bool = False, window_size_left: int = -1, window_size_right: int = -1,
    softcap: float = 0.0, sinks: Optional[torch.Tensor] = None, return_dsinks: bool = False, attention_chunk: int = 0,
    seqused_q: Optional[torch.Tensor] = None, seqused_k: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of varlen_attention_fwd with the attention variants (since 0.6; a 0.6 library, sm90 backend for
    packed batches): (dq, dk, dv, dsinks), the variants (attention_chunk, as in attention_variants_bwd) and dsinks
    as in attention_variants_bwd (dsinks summed over every sequence's rows), the rest (seqused_q / seqused_k last) as
    varlen_attention_bwd."""
    variants = _bwd_variants(q, q.shape[1], window_size_left, window_size_right, softcap, sinks, return_dsinks,
                             attention_chunk)
    return _varlen_bwd(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                       softmax_scale, deterministic, variants, return_dsinks, seqused_q, seqused_k)


@varlen_attention_variants_bwd.register_fake
def _varlen_attention_variants_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                        max_seqlen_k, causal, softmax_scale, deterministic=False, window_size_left=-1,
                                        window_size_right=-1, softcap=0.0, sinks=None, return_dsinks=False,
                                        attention_chunk=0, seqused_q=None, seqused_k=None):
    _bwd_variants(q, q.shape[1], window_size_left, window_size_right, softcap, sinks, return_dsinks, attention_chunk)
    return (*(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)),
            _empty_dsinks(q, q.shape[1], return_dsinks))


# varlen_attention_fwd's inputs: (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal,
# softmax_scale, return_lse, window_size_left, window_size_right, softcap, sinks, attention_chunk, seqused_q).
_VARLEN_SINKS_INPUT = 14


def _varlen_setup_context(ctx, inputs, output) -> None:
    (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
     _return_lse, window_size_left, window_size_right, softcap, sinks, attention_chunk, seqused_q) = inputs
    out, lse = output
    ctx.set_materialize_grads(False)
    variants = _variants_of(window_size_left, window_size_right, softcap, sinks, attention_chunk, causal)
    ctx.num_inputs = len(inputs)
    ctx.max_seqlen = (max_seqlen_q, max_seqlen_k)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, False
    ctx.variants = None if variants is None else variants._replace(sinks=None)
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sinks, seqused_q, seqused_k)


def _varlen_backward(ctx, grad_out, grad_lse):
    grads = [None] * ctx.num_inputs
    q, k, v, out, lse, cu_q, cu_k, sinks, used_q, used_k = ctx.saved_tensors
    needs_q, needs_k, needs_v = ctx.needs_input_grad[:3]
    needs_sinks = sinks is not None and ctx.needs_input_grad[_VARLEN_SINKS_INPUT]
    if grad_out is None or not (needs_q or needs_k or needs_v or needs_sinks):
        return tuple(grads)
    if grad_lse is not None:
        raise NotImplementedError("FlashCore: a gradient through varlen_attention's lse is not supported yet")
    if lse.dim() != 2:
        raise RuntimeError("FlashCore: varlen_attention_fwd ran without lse where its backward is needed")
    if ctx.variants is None:
        dq, dk, dv = varlen_attention_bwd(grad_out, q, k, v, out, lse, cu_q, cu_k, ctx.max_seqlen[0],
                                          ctx.max_seqlen[1], ctx.causal, ctx.softmax_scale, ctx.deterministic,
                                          used_q, used_k)
        dsinks = None
    else:
        variants = ctx.variants
        dq, dk, dv, dsinks = varlen_attention_variants_bwd(
            grad_out, q, k, v, out, lse, cu_q, cu_k, ctx.max_seqlen[0], ctx.max_seqlen[1], ctx.causal,
            ctx.softmax_scale, ctx.deterministic, variants.window_size_left, variants.window_size_right,
            variants.softcap, sinks, needs_sinks, variants.attention_chunk, used_q, used_k)
    grads[:3] = (dq if needs_q else None, dk if needs_k else None, dv if needs_v else None)
    if needs_sinks:
        grads[_VARLEN_SINKS_INPUT] = dsinks
    return tuple(grads)


varlen_attention_fwd.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)
# (q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse, block_table, num_splits, and the five
# variant arguments)
_register_unsupported_backward(attention_kvcache_fwd, KVCACHE_BACKWARD_NOT_SUPPORTED, 14)
# (the same fourteen, then cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q, k_descale, v_descale; the message
# names an e4m3 cache). The append op mutates its caches, and torch takes no autograd formula for a mutating op: its
# backward is torch's "no autograd kernel" error.
_register_unsupported_backward(
    attention_kvcache_serving_fwd,
    lambda inputs: (KV_FP8_BACKWARD_NOT_SUPPORTED if _is_kv_fp8(inputs[1], inputs[2])
                    else KVCACHE_BACKWARD_NOT_SUPPORTED),
    20)


# ---------------------------------------------------------------------------------------------------------------
# Front ends.


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    precision: Optional[str] = None,
    v_transposed: bool = False,
    deterministic: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention in FlashAttention's layout: q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D), Hq a multiple of Hkv.

    causal: bottom-right aligned mask (query i sees key j iff j <= i + Sk - Sq), as in FlashAttention 2/3.
    softmax_scale: defaults to 1/sqrt(D). Returns out (B, Sq, Hq, D) in q's dtype (see out_dtype), and with
    return_lse=True also lse (B, Hq, Sq) float32 (natural log of the softmax denominator; -inf for rows that see no
    key).

    v (B, Sk, Hkv, Dv) may have a head dim of its own (since 0.7, a 0.7 library; FlashAttention-3's hdimdiff): out is
    then (B, Sq, Hq, Dv). The pairs (D, Dv) the library compiles: Library.compiled_head_dim_pairs, e.g. (192, 128),
    DeepSeek-V2/V3 MLA prefill. 16-bit calls, the variants included; the 8-bit paths raise ValueError.
    Differentiable (since 0.9) where the library's backward takes the pair (a 0.9 library's sm90 backend: (192, 128),
    dv of v's shape); elsewhere the library's error, naming head_dim_v, when .backward() reaches the call.

    Every argument after q, k, v is keyword-only (since 0.3): FlashAttention's flash_attn_func takes softmax_scale
    and causal as its 4th and 5th positional arguments, in the other order, so a positional call ported from it
    raises TypeError here instead of computing something else. causal and return_lse must be bools (or 0 / 1),
    softmax_scale a number or None.

    8-bit attention (sm90 backend):
      - q, k, v float8_e4m3fn: the real values are stored * descale, with q_descale, k_descale, v_descale float32
        (B, Hkv) tensors on q's device (FlashAttention-3's names and shapes; query head h uses the factor of its KV
        head h // (Hq // Hkv)); None means 1. quantize_fp8 makes such inputs. O defaults to bfloat16.
      - 16-bit q, k, v with precision="fp8": the library quantizes them to e4m3 (one scale per batch and KV head,
        absmax -> 448) in the op's workspace and runs the 8-bit kernel; no descales. O in q's dtype by default.
      - 16-bit q, k, v with precision="int8" (the high-accuracy 8-bit mode): q is quantized to int8 per token, k less
        its mean over the keys per 128-key block; Q K^T runs on the int8 tensor cores, P V in q's dtype on v as given.
        About 4x less error than "fp8" (docs/decisions.md#int8-mode); O in q's dtype.
      - v_transposed=True: v is fp8_transpose_v(v8) of the 8-bit V (transposed once, e.g. for a KV cache that several
        calls attend to): the call skips its own transpose of V. Same result, bit for bit.
    out_dtype: torch.float16 or torch.bfloat16 (None: the default above). precision: None or "native" (the input
    dtype's kernel), "fp8" or "int8".

    Attention variants (since 0.5; FlashAttention's names and semantics, 16-bit calls; differentiable since 0.6):
      - window_size=(left, right): sliding-window (local) attention: query i sees key j iff
        i + Sk - Sq - left <= j <= i + Sk - Sq + right, -1 meaning unbounded on that side. With causal=True the
        right bound is 0 (a causal window of N keys, the query's own included, is window_size=(N - 1, 0)).
      - attention_chunk=c > 0: chunked attention (Llama 4, FlashAttention-3's argument): query i sees only keys j with
        j // c == (i + Sk - Sq) // c, floor division also for a negative i + Sk - Sq (combined with causal and the
        window: a Llama 4 chunked layer is causal=True, attention_chunk=8192). A library without chunked attention
        refuses it (ValueError naming attention_chunk).
      - softcap > 0: every score s = softmax_scale * q.k becomes softcap * tanh(s / softcap) before the softmax
        (Gemma 2).
      - sinks: a (Hq,) tensor of per-head logits (float32; float16 / bfloat16 / float64 are converted) that join
        every row's softmax denominator, exp(sinks[h]), but not its output; not scaled by softmax_scale; lse includes
        them, and a row that sees no key gets out 0 and lse sinks[h] (gpt-oss's attention sinks; FlashAttention-4
        calls them learnable_sink).

    Differentiable (since 0.4) in q, k and v for 16-bit calls (the library's backward: head dims 64 and 128; since
    0.9 on the sm90 backend 96, 192, 256 and (head_dim, head_dim_v) = (192, 128) too, a window, softcap or
    attention_chunk at 64, 96 and 128 only), through out and lse. deterministic (FlashAttention's name): the
    backward's dq is bit-identical from run to run (dk and dv always are), a little slower. Since 0.6 (a 0.6
    library) with window_size, softcap and sinks too (and attention_chunk, with a library that runs it: the backward
    gets the forward's), and in sinks when they require
    grad (their gradient comes from the library's dsinks, float32, converted back to the sinks' dtype by autograd); a
    0.5 library raises RuntimeError naming the variants and the version when .backward() reaches the call. The 8-bit
    paths, precision="fp8" / "int8" and out_dtype other than the input's have no backward yet: the forward runs
    (inputs may require grad) and NotImplementedError, naming what the call set, comes when .backward() reaches it.
    """
    scale = _check_scale(softmax_scale)
    causal, return_lse = _check_flag("causal", causal), _check_flag("return_lse", return_lse)
    deterministic = _check_flag("deterministic", deterministic)
    v_transposed = _check_flag("v_transposed", v_transposed)
    _check_inputs(q, k, k if v_transposed else v, "bshd", allow_fp8=True)
    if v_transposed:
        _check_transposed_v(v, k)
    head_dim_v = k.shape[3] if v_transposed else v.shape[3]
    precision_code = _check_precision(precision)
    o_dtype = _check_8bit_args(q, k, q_descale, k_descale, v_descale, out_dtype, precision_code)
    _check_no_8bit_head_dim_v(q, head_dim_v, precision_code)
    variants = _front_end_variants(q, q.shape[2], window_size, softcap, sinks, attention_chunk)
    _check_no_8bit_variants(variants, q, precision_code, causal)
    extended = q.dtype in FP8_DTYPES or precision_code != _lib.PRECISION_NATIVE or o_dtype != q.dtype
    if not torch.compiler.is_compiling():
        # Precise errors up front in eager mode; the op checks again when run.
        lib = _check_supported(q, q.shape[3], head_dim_v)
        if extended:
            _check_extended_supported(lib, q, causal, o_dtype, precision_code)
    if not extended:  # the 0.2 call; lse also when the backward will need it
        out, lse = _differentiable_fwd(q, k, v, causal, scale, return_lse, deterministic, variants)
    else:
        default_dtype = torch.bfloat16 if q.dtype in FP8_DTYPES else q.dtype
        if v_transposed:
            out, lse = attention_fwd(q, k, v, causal, scale, return_lse, q_descale, k_descale, v_descale,
                                     None if o_dtype == default_dtype else o_dtype, precision_code, True)
        else:
            out, lse = attention_fwd(q, k, v, causal, scale, return_lse, q_descale, k_descale, v_descale,
                                     None if o_dtype == default_dtype else o_dtype, precision_code,
                                     **_variant_kwargs(variants))
    return (out, lse) if return_lse else out


def _needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will record a call on these tensors (traceable: torch.compile guards on both)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _sinks_of(variants: Optional[Variants]) -> Tuple[torch.Tensor, ...]:
    """(sinks,) when the call has sinks, else (): the tensors besides q, k, v whose gradient the backward computes."""
    return () if variants is None or variants.sinks is None else (variants.sinks,)


def _differentiable_fwd(q, k, v, causal: bool, scale: float, return_lse: bool, deterministic: bool,
                        variants: Optional[Variants] = None):
    """attention_fwd for a 16-bit call of the front ends: with lse whenever the call will be differentiated (the
    backward reads it; sinks that require grad count), deterministic and the variants passed only when set (the 0.2
    call otherwise)."""
    want_lse = return_lse or _needs_grad(q, k, v, *_sinks_of(variants))
    kwargs = _variant_kwargs(variants)
    if deterministic:
        kwargs["deterministic"] = True
    return attention_fwd(q, k, v, causal, scale, want_lse, **kwargs)


class AttentionPlan:
    """A plan of dense attention calls with fixed shapes (the C ABI's flashcore_attention_plan): the kernel config,
    its schedule, the split of its key ranges and the workspace are decided once, here, and the plan owns its
    zero-filled workspace, so run() does no planning and allocates nothing (make the plan before a CUDA-graph
    capture, then capture or call run() as often as needed). Made by plan_attention; run() takes tensors of the
    plan's shapes, dtypes and device (strides may differ) and checks them. No autograd: use attention() to train."""

    def __init__(self, q, k, v, causal: bool, softmax_scale: Optional[float], return_lse: bool):
        self.scale = _check_scale(softmax_scale)
        self.causal, self.return_lse = _check_flag("causal", causal), _check_flag("return_lse", return_lse)
        _check_inputs(q, k, v, "bshd")
        self._lib = _check_supported(q, q.shape[3], v.shape[3])
        self.shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        self.dtype, self.device = q.dtype, q.device
        out, lse = _empty_outputs(q, self.return_lse, head_dim_v=v.shape[3])
        with torch.cuda.device(q.device):
            self._plan = self._lib.plan(self._params(q, k, v, out, lse))
            self.workspace = torch.zeros(max(self._plan.workspace_size, _WORKSPACE_HEADER), dtype=torch.uint8,
                                         device=q.device)

    @property
    def config(self) -> str:
        """The kernel config the plan runs (as flashcore_attention_selected_config names it)."""
        return self._plan.config

    def _params(self, q, k, v, out, lse):
        q, k, v = (kernel_operand(t)[0] for t in (q, k, v))
        return kernel_params(self._lib, q, k, v, out, lse, self.causal, self.scale)

    def run(self, q, k, v, out: Optional[torch.Tensor] = None, lse: Optional[torch.Tensor] = None):
        """Attention for q, k, v of the plan's shapes on the current stream: out (and lse with return_lse), written
        into `out` / `lse` when given (contiguous, of the shapes attention() returns)."""
        if (tuple(q.shape), tuple(k.shape), tuple(v.shape)) != self.shapes or q.dtype != self.dtype or \
                q.device != self.device:
            raise ValueError(f"FlashCore: the plan is for q, k, v of shapes {self.shapes}, {self.dtype} on "
                             f"{self.device}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {q.dtype} on "
                             f"{q.device}: make another plan")
        _check_inputs(q, k, v, "bshd")
        new_out, new_lse = _empty_outputs(q, self.return_lse, head_dim_v=v.shape[3])
        out = new_out if out is None else out
        lse = new_lse if lse is None else lse
        for name, t, like in (("out", out, new_out), ("lse", lse, new_lse)):
            if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device or not t.is_contiguous():
                raise ValueError(f"FlashCore: {name} must be a contiguous {like.dtype} tensor of shape "
                                 f"{tuple(like.shape)} on {like.device}")
        params = self._params(q, k, v, out, lse)
        params.workspace = self.workspace.data_ptr()
        params.workspace_size = self._plan.workspace_size
        with torch.cuda.device(q.device):
            self._plan.run(params, torch.cuda.current_stream(q.device).cuda_stream)
        return (out, lse) if self.return_lse else out


def plan_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   softmax_scale: Optional[float] = None, return_lse: bool = False) -> AttentionPlan:
    """Plan attention(q, k, v, causal=, softmax_scale=, return_lse=) once for calls of these shapes (16-bit, dense);
    AttentionPlan.run(q, k, v) then launches it. For engines that call the same shapes many times, and for CUDA
    graphs: plan before the capture."""
    return AttentionPlan(q, k, v, causal, softmax_scale, return_lse)


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[torch.Tensor, int]] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    return_softmax_lse: bool = False,
    block_table: Optional[torch.Tensor] = None,
    num_splits: int = 0,
    page_table: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    cu_seqlens_k_new: Optional[torch.Tensor] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    rotary_interleaved: bool = True,
    rotary_seqlens: Optional[torch.Tensor] = None,
    q_descale: Optional[torch.Tensor] = None,
    k_descale: Optional[torch.Tensor] = None,
    v_descale: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode / chunked prefill against a dense or paged KV cache, with FlashAttention's flash_attn_with_kvcache
    names.

    q (B, Sq, Hq, D). Dense cache: k_cache, v_cache (B, Sk_max, Hkv, D). Paged cache: block_table int32
    (B, max_pages) (FlashAttention-2's name; FlashAttention-3's page_table is accepted as an alias) and k_cache,
    v_cache (num_pages, page_size, Hkv, D), page_size from 1 to 65536 (since 0.8; a 0.7 library takes multiples of
    16 only and refuses the others, naming page_size): key j of sequence b is row j % page_size
    of page block_table[b, j // page_size]; Sk_max = max_pages * page_size.
    cache_seqlens: int32 (B,) tensor (or an int for all) of the keys already in each sequence's cache (None:
    Sk_max). k, v (B, Sq_new, Hkv, D), optional: written into the caches in place at positions cache_seqlens[b] ..
    + Sq_new (through the block table when paged; device-side indices, no host sync; the caller keeps
    cache_seqlens[b] + Sq_new <= Sk_max and the pages allocated), and attended to. causal: bottom-right aligned
    per sequence against cache_seqlens[b] (+ Sq_new). Cache rows past the lengths, and the pages past them, are
    never read into the output, NaN included. num_splits: split-KV parts for decode-shaped calls (0: the library's
    choice, 1: no split, n: at most n). Returns out (B, Sq, Hq, D), and lse (B, Hq, Sq) float32 with
    return_softmax_lse. window_size, attention_chunk, softcap and sinks as in flashcore.attention (since 0.5), aligned
    to each sequence's last key (cache_seqlens[b] + Sq_new): a sliding-window decode step is window_size=(N - 1, 0)
    with causal=True (or (N - 1, -1) without).

    v_cache (and v) may have a head dim Dv of their own (since 0.7: head_dim_v, as in flashcore.attention; e.g.
    (D, Dv) = (192, 128)): out is then (B, Sq, Hq, Dv).

    Every argument after q, k_cache, v_cache is keyword-only (since 0.3): FlashAttention-3's sixth positional
    argument is qv where FlashAttention-2's is rotary_cos (and this function's was cache_seqlens), so a positional
    call ported from either raises TypeError instead of binding the wrong argument.

    FlashAttention-3's serving arguments (since 0.8; a 0.7 library refuses them, RuntimeError naming the argument):
      - cache_batch_idx: int32 (B,): sequence b's cache is slot cache_batch_idx[b], k_cache[cache_batch_idx[b]] of a
        dense cache (B_cache, Sk_max, Hkv, D), or row cache_batch_idx[b] of block_table (B_cache, max_pages) of a
        paged one; its appended rows land there. An entry outside [0, B_cache) gives its sequence no key (out 0, lse
        -inf) and appends nothing.
      - cache_leftpad: int32 (B,), dense caches only: sequence b's keys are rows [cache_leftpad[b], cache_seqlens[b]
        (+ its new rows)) of its cache; causal alignment, windows and chunks count keys from row cache_leftpad[b].
      - cu_seqlens_q: int32 (B + 1,), with max_seqlen_q (None: total_q, a bound that is always right): q is packed
        (total_q, Hq, D), sequence b its rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]); out is (total_q, Hq, Dv) and
        lse (Hq, total_q), FlashAttention-3's varlen convention.
      - cu_seqlens_k_new: int32 (B + 1,): k, v are packed (total_k_new, Hkv, D / Dv) and sequence b appends its rows
        [cu_seqlens_k_new[b], cu_seqlens_k_new[b + 1]) at cache_seqlens[b].
      - rotary_cos, rotary_sin: (rotary_seqlen, rotary_dim / 2) in q's dtype (made contiguous), rotary_dim a
        multiple of 16 up to D, with k and v (an append; FlashAttention requires it too): FlashAttention's rotary
        embedding. The first rotary_dim columns of the new keys are rotated before they are written to the cache
        (the cache holds the rotated keys; v is copied as it is), and the queries are rotated for the attention (q
        itself is not written): new row t of sequence b at position rotary_seqlens[b] + t, query row i at
        rotary_seqlens[b] + i with causal or a window, else at rotary_seqlens[b] for every row; positions clamped to
        [0, rotary_seqlen). rotary_interleaved=True (FA3's default): GPT-J pairs (2i, 2i + 1); False: GPT-NeoX halves
        (i, i + rotary_dim / 2). rotary_seqlens: int32 (B,), None: cache_seqlens. x' = x cos - y sin,
        y' = x sin + y cos, rounded once to q's dtype.
    With any of them the call runs as one library call (flashcore::attention_kvcache_serving_fwd, or
    flashcore::attention_kvcache_serving_append_fwd with k, v): the library writes the new rows into the caches
    (device-side, no host sync; rows past the capacity are dropped) and attends to them. cache_seqlens is indexed by
    b, the sequence, not by its cache slot, and stays as given.

    An e4m3 KV cache (since 0.9, a 0.9 library; sm90 (Hopper) only; FlashAttention-3's convention): k_cache and
    v_cache float8_e4m3fn (both) under float16 / bfloat16 q, dense or paged (pages of a multiple of 16 rows: the
    library refuses others), with cache_batch_idx, cache_leftpad, cu_seqlens_q and num_splits as above. Their real
    values are k_cache * k_descale[b, h] and v_cache * v_descale[b, h]: k_descale / v_descale float32 on q's device,
    (B, Hkv) (b the sequence, not its cache slot; h the KV head, query head i uses h = i // (Hq // Hkv)), or one
    element (0-d or (1,)): a factor for the whole cache, expanded to (B, Hkv); None: 1. out is in q's dtype. k / v
    (appends, also rotated with the rotary tables) are given in q's dtype: the library stores the e4m3 of
    x / descale[b, h] (nearest even, saturated to +-448). q may be float8_e4m3fn too (FlashAttention-3's FP8 call), with
    q_descale as k_descale: the library widens q into its workspace, out is bfloat16, no k / v and no rotary tables.
    Not taken with it (ValueError naming the argument, before any library call): window_size / softcap / sinks /
    attention_chunk, a v_cache head dim other than k_cache's; q_descale with a 16-bit q is a ValueError with any cache,
    and k_descale / v_descale with a 16-bit cache. k_cache and v_cache of different dtypes, e5m2 or another 8-bit format,
    e5m2 q, or 8-bit k / v under 16-bit q: TypeError. A library older than 0.9: RuntimeError naming its version.
    Forward only: .backward() through such a call raises NotImplementedError.
    """
    scale = _check_scale(softmax_scale)
    causal = _check_flag("causal", causal)
    return_softmax_lse = _check_flag("return_softmax_lse", return_softmax_lse)
    splits = _check_num_splits(num_splits)
    if page_table is not None:
        if block_table is not None and page_table is not block_table:
            raise ValueError("FlashCore: pass block_table or page_table (its FlashAttention-3 name), not both")
        block_table = page_table
    if max_seqlen_q is not None and cu_seqlens_q is None:
        raise ValueError("FlashCore: max_seqlen_q is given without cu_seqlens_q (it bounds packed queries)")
    rotary_interleaved = _check_flag("rotary_interleaved", rotary_interleaved)
    kv_fp8 = _is_kv_fp8(k_cache, v_cache)
    if q_descale is not None and not (kv_fp8 and isinstance(q, torch.Tensor) and q.dtype in FP8_DTYPES):
        raise ValueError(f"FlashCore: q_descale is set, but q is {getattr(q, 'dtype', type(q).__name__)}"
                         f"{'' if kv_fp8 else ' on a ' + str(getattr(k_cache, 'dtype', '')) + ' cache'}: it scales a "
                         f"float8_e4m3fn q on an e4m3 KV cache (k_descale / v_descale scale the cache; 16-bit q takes "
                         f"none)")
    if not kv_fp8:
        given = [n for n, d in (("k_descale", k_descale), ("v_descale", v_descale)) if d is not None]
        if given:
            raise ValueError(f"FlashCore: {given[0]} is set, but k_cache is "
                             f"{getattr(k_cache, 'dtype', type(k_cache).__name__)}: the descales scale an e4m3 KV "
                             f"cache (float8_e4m3fn k_cache / v_cache) only")
    if kv_fp8 or any(t is not None for t in (cache_batch_idx, cache_leftpad, cu_seqlens_q, cu_seqlens_k_new,
                                             rotary_cos, rotary_sin, rotary_seqlens)):
        return _attention_with_kvcache_serving(
            q, k_cache, v_cache, k, v, cache_seqlens, scale, causal, return_softmax_lse, block_table, splits,
            window_size, attention_chunk, softcap, sinks, cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q,
            cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_interleaved, rotary_seqlens, k_descale, v_descale,
            q_descale)
    paged = block_table is not None
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"FlashCore: q must be a 4-D tensor (batch, seqlen, num_heads, head_dim), got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    variants = _front_end_variants(q, q.shape[2], window_size, softcap, sinks, attention_chunk)
    batch = q.shape[0]
    layout = "(num_pages, page_size, num_heads_kv, head_dim)" if paged else "(batch, seqlen, num_heads_kv, head_dim)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"FlashCore: {name} must be a 4-D tensor {layout}, got {got}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"FlashCore: k_cache and v_cache must have the same shape but for the last dimension "
                         f"(v_cache's head dim may differ), got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if paged:
        _check_block_table(block_table, q, k_cache)
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if cache_seqlens is None:
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        lengths = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        lengths = cache_seqlens
    _check_cache_seqlens(lengths, q)
    if (k is None) != (v is None):
        raise ValueError("FlashCore: pass both k and v to append to the cache, or neither")
    if k is not None:
        for name, new, cache in (("k", k, k_cache), ("v", v, v_cache)):  # v's head dim is v_cache's
            if not isinstance(new, torch.Tensor) or new.dim() != 4 or new.shape[0] != batch or \
                    new.shape[2:] != cache.shape[2:]:
                got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
                raise ValueError(f"FlashCore: {name} must be (B, Sq_new, Hkv, {name}_cache's head dim) = ({batch}, *, "
                                 f"{cache.shape[2]}, {cache.shape[3]}), got {got}")
        if v.shape[1] != k.shape[1]:
            raise ValueError(f"FlashCore: k and v must append as many rows (Sq_new), got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
        positions = lengths.long()[:, None] + torch.arange(k.shape[1], device=q.device)[None, :]  # (B, Sq_new)
        if paged:
            page_size = k_cache.shape[1]
            pages = block_table.long().gather(1, torch.div(positions, page_size, rounding_mode="floor"))
            rows = torch.remainder(positions, page_size)
            k_cache[pages, rows] = k.to(k_cache.dtype)
            v_cache[pages, rows] = v.to(v_cache.dtype)
        else:
            batch_idx = torch.arange(batch, device=q.device)[:, None].expand_as(positions)
            k_cache[batch_idx, positions] = k.to(k_cache.dtype)
            v_cache[batch_idx, positions] = v.to(v_cache.dtype)
        lengths = (lengths + k.shape[1]).to(torch.int32)
    _kvcache_inputs(q, k_cache, v_cache, lengths, block_table)
    if not torch.compiler.is_compiling():
        _check_supported(q, q.shape[3], v_cache.shape[3])
    out, lse = attention_kvcache_fwd(q, k_cache, v_cache, lengths, causal, scale, return_softmax_lse,
                                     block_table, splits, **_variant_kwargs(variants))
    return (out, lse) if return_softmax_lse else out


def _attention_with_kvcache_serving(q, k_cache, v_cache, k, v, cache_seqlens, scale: float, causal: bool,
                                    return_softmax_lse: bool, block_table, splits: int, window_size, attention_chunk,
                                    softcap, sinks, cache_batch_idx, cache_leftpad, cu_seqlens_q, max_seqlen_q,
                                    cu_seqlens_k_new, rotary_cos=None, rotary_sin=None, rotary_interleaved=True,
                                    rotary_seqlens=None, k_descale=None, v_descale=None, q_descale=None):
    """attention_with_kvcache with FlashAttention-3's serving arguments (cache_batch_idx, cache_leftpad, cu_seqlens_q,
    cu_seqlens_k_new, the rotary embedding), or on an e4m3 cache (k_descale, v_descale): checked here, naming the
    argument, then one serving op."""
    varlen_q = cu_seqlens_q is not None
    if varlen_q:
        if not isinstance(q, torch.Tensor) or q.dim() != 3:
            raise ValueError(f"FlashCore: with cu_seqlens_q, q must be 3-D (total_q, num_heads, head_dim), got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q)
        batch = cu_seqlens_q.shape[0] - 1
        if max_seqlen_q is None:
            max_seqlen_q = q.shape[0]
        _check_max_seqlen("max_seqlen_q", max_seqlen_q)
        max_seqlen_q = int(max_seqlen_q)
    else:
        if not isinstance(q, torch.Tensor) or q.dim() != 4:
            raise ValueError(f"FlashCore: q must be a 4-D tensor (batch, seqlen, num_heads, head_dim) (packed 3-D rows "
                             f"need cu_seqlens_q), got "
                             f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
        batch, max_seqlen_q = q.shape[0], 0
    variants = _front_end_variants(q, q.shape[-2], window_size, softcap, sinks, attention_chunk)
    paged = block_table is not None
    if cache_leftpad is not None and paged:
        raise ValueError("FlashCore: cache_leftpad takes a dense cache only: FlashCore's paged caches (block_table / "
                         "page_table) take no left padding, as FlashAttention-2's")
    layout = "(num_pages, page_size, num_heads_kv, head_dim)" if paged else "(batch, seqlen, num_heads_kv, head_dim)"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"FlashCore: {name} must be a 4-D tensor {layout}, got {got}")
    if paged:
        _check_block_table(block_table, q, k_cache, rows=None if cache_batch_idx is not None else batch)
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if cache_seqlens is None:
        lengths = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        lengths = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        lengths = cache_seqlens
    kv_fp8 = _is_kv_fp8(k_cache, v_cache)
    if kv_fp8:  # what an e4m3 cache does not take, named before the checks that would misname it
        _check_kv_fp8_variants(variants, causal)
        k_descale, v_descale, q_descale = (_per_sequence_descale(d, batch, k_cache.shape[2])
                                           for d in (k_descale, v_descale, q_descale))
    if (k is None) != (v is None):
        raise ValueError("FlashCore: pass both k and v to append to the cache, or neither")
    q16 = isinstance(q, torch.Tensor) and q.dtype in _DTYPE_CODES
    if kv_fp8 and q16 and any(isinstance(t, torch.Tensor) and t.dtype.itemsize == 1 for t in (k, v)):
        raise TypeError(f"FlashCore: k / v appended to an e4m3 KV cache are given in 16 bits (q's dtype {q.dtype}) and "
                        f"quantized by the library with k_descale / v_descale; got "
                        f"{(k if isinstance(k, torch.Tensor) and k.dtype.itemsize == 1 else v).dtype}")
    if k is not None and (not kv_fp8 or q16):  # the caches' dtype, as the plain append writes them; q's for an e4m3
        # cache (the library quantizes them)
        k, v = (t.to(q.dtype if kv_fp8 else c.dtype) if isinstance(t, torch.Tensor) else t
                for t, c in ((k, k_cache), (v, v_cache)))
    if isinstance(rotary_cos, torch.Tensor) and isinstance(rotary_sin, torch.Tensor):  # FA3's maybe_contiguous
        rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
    _kvcache_serving_inputs(q, k_cache, v_cache, lengths, block_table, cache_batch_idx, cache_leftpad, cu_seqlens_q,
                            k, v, cu_seqlens_k_new, rotary_cos, rotary_sin, rotary_seqlens, k_descale, v_descale,
                            q_descale)
    if not torch.compiler.is_compiling():
        lib = _check_supported(q, q.shape[-1], v_cache.shape[3])
        if kv_fp8:
            _check_kv_fp8_library(lib)
        serving = [name for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                                        ("cu_seqlens_k_new", cu_seqlens_k_new if k is not None else None),
                                        ("rotary_cos", rotary_cos), ("rotary_seqlens", rotary_seqlens))
                   if t is not None]
        if serving and not lib.has_kvcache_serving():  # before any append (the op would refuse it at launch)
            raise RuntimeError(f"FlashCore: {serving[0]} is set, but {lib.path} (version {lib.version_string()}) "
                               f"predates it: a 0.8 library or newer is needed")
    common = dict(block_table=block_table, num_splits=splits, **_variant_kwargs(variants),
                  cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, cu_seqlens_q=cu_seqlens_q,
                  max_seqlen_q=max_seqlen_q)
    if k is None:
        descales = {n: d for n, d in (("k_descale", k_descale), ("v_descale", v_descale), ("q_descale", q_descale))
                    if d is not None}
        out, lse = attention_kvcache_serving_fwd(q, k_cache, v_cache, lengths, causal, scale, return_softmax_lse,
                                                 **common, **descales)
    else:
        rotary = {} if rotary_cos is None else dict(rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                                    rotary_interleaved=rotary_interleaved,
                                                    rotary_seqlens=rotary_seqlens)
        descales = {n: d for n, d in (("k_descale", k_descale), ("v_descale", v_descale)) if d is not None}
        out, lse = attention_kvcache_serving_append_fwd(q, k_cache, v_cache, lengths, k, v, causal, scale,
                                                        return_softmax_lse, cu_seqlens_k_new=cu_seqlens_k_new,
                                                        **rotary, **common, **descales)
    return (out, lse) if return_softmax_lse else out


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    seqused_k: Optional[torch.Tensor] = None,
    return_lse: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
    seqused_q: Optional[torch.Tensor] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Packed variable-length attention with FlashAttention's flash_attn_varlen_func names.

    q (total_q, Hq, D), k and v (total_k, Hkv, D): the sequences of a batch one after the other. cu_seqlens_q,
    cu_seqlens_k: int32 (batch + 1,) on q's device, cumulative lengths starting at 0: sequence b is rows
    [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q against rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]) of k and v.
    They are read on the device only (no host sync), so a CUDA graph replays with new contents. max_seqlen_q,
    max_seqlen_k: Python ints, at least the longest sequence's length (query rows past max_seqlen_q within a
    sequence are not computed). seqused_k: optional int32 (batch,): sequence b uses only its first seqused_k[b]
    keys. v may have a head dim Dv of its own (total_k, Hkv, Dv) (since 0.7: head_dim_v, as in flashcore.attention):
    out is then (total_q, Hq, Dv). causal: bottom-right aligned per sequence. The arguments after max_seqlen_k are
    keyword-only
    (FlashAttention-3's positions 8 and 9 are seqused_q, seqused_k: a positional call written for it fails loudly
    here instead of binding softmax_scale to seqused_q). Returns out (total_q, Hq, D) in q's dtype; with
    return_lse=True also lse float32 (Hq, total_q) (FlashAttention-3 names this flag return_attn_probs). Output
    rows not covered by cu_seqlens_q are left unwritten. window_size, attention_chunk, softcap and sinks as in
    flashcore.attention (since 0.5), aligned per sequence.

    seqused_q: optional int32 (batch,) (since 0.8, FlashAttention-3's): sequence b uses only its first seqused_q[b]
    query rows (clamped to its length); causal alignment is against seqused_q[b] rows. The other rows are not
    computed: out is 0 and lse -inf there (FlashCore zero-fills them for a deterministic result; FlashAttention-3
    leaves them uninitialised). A 0.7 library refuses it (RuntimeError naming seqused_q).

    Differentiable (since 0.4, sm90 backend; the portable backend refuses packed batches in the backward, naming them)
    in q, k and v through out (not through lse); since 0.6 (a 0.6 library) with window_size, softcap and sinks too
    (and attention_chunk, with a library that runs it), and in sinks when they require grad; since 0.9 (a 0.9
    library) with seqused_q and seqused_k: the gradients of the unused rows are zeros, and the unused rows of q, k,
    v must hold finite values (as FlashAttention-3 assumes; a NaN there can reach the used rows' gradients); since
    0.9 with v of a head dim of its own where the library's backward takes the pair (as flashcore.attention).
    """
    scale = _check_scale(softmax_scale)
    causal, return_lse = _check_flag("causal", causal), _check_flag("return_lse", return_lse)
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q)
    variants = _front_end_variants(q, q.shape[1], window_size, softcap, sinks, attention_chunk)
    if not torch.compiler.is_compiling():
        lib = _check_supported(q, q.shape[2], v.shape[2])
        if seqused_q is not None and not lib.has_kvcache_serving():
            raise RuntimeError(f"FlashCore: seqused_q is set, but {lib.path} (version {lib.version_string()}) predates "
                               f"it: a 0.8 library or newer is needed")
    # The backward reads lse.
    want_lse = return_lse or _needs_grad(q, k, v, *_sinks_of(variants))
    extra = {} if seqused_q is None else {"seqused_q": seqused_q}
    out, lse = varlen_attention_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                    causal, scale, want_lse, **_variant_kwargs(variants), **extra)
    return (out, lse) if return_lse else out


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    deterministic: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) tensors.

    The same positional order as torch's: query, key, value, attn_mask, dropout_p, is_causal; scale and
    enable_gqa keyword-only (as torch's own function takes them).

    Supported: no attn_mask, dropout_p == 0, 4-D inputs. value may have a head dim Ev of its own (as torch's (N, ..., S,
    Ev); since 0.7, the pairs the library compiles; differentiable since 0.9 where the library's backward takes the
    pair, as flashcore.attention): the result is then (B, H, L, Ev). GQA/MQA (Hq a
    multiple of Hkv) is always accepted,
    whatever enable_gqa says. is_causal is bottom-right aligned: the same as SDPA's when Sq == Sk (SDPA aligns
    top-left). The result is a (B, H, S, D) view of a (B, S, H, D)-contiguous tensor, so
    `out.transpose(1, 2).reshape(B, S, H * D)` is free.

    Differentiable in query, key and value (since 0.4; as flashcore.attention). deterministic (keyword-only, a
    FlashCore addition after torch's arguments): bit-identical gradients from run to run.

    window_size, softcap, sinks (keyword-only FlashCore additions after torch's arguments, since 0.5): as in
    flashcore.attention, FlashAttention's semantics, bottom-right aligned like is_causal here. A causal sliding
    window of N keys (the query's own included) is is_causal=True, window_size=(N - 1, 0). Differentiable since 0.6
    (a 0.6 library), sinks included, as flashcore.attention.
    """
    if attn_mask is not None:
        raise ValueError(
            "FlashCore sdpa: attn_mask is not supported (only is_causal masking); "
            "use torch.nn.functional.scaled_dot_product_attention for arbitrary masks"
        )
    if dropout_p != 0.0:
        raise ValueError(f"FlashCore sdpa: dropout is not supported (dropout_p must be 0.0, got {dropout_p})")
    scale_value = _check_scale(scale, "scale")
    is_causal = _check_flag("is_causal", is_causal)
    _check_flag("enable_gqa", enable_gqa)
    deterministic = _check_flag("deterministic", deterministic)
    _check_inputs(query, key, value, "bhsd")
    variants = _front_end_variants(query, query.shape[1], window_size, softcap, sinks, 0)
    if not torch.compiler.is_compiling():
        _check_supported(query, query.shape[3], value.shape[3])
    # (B, H, S, D) -> (B, S, H, D) views: the strides reach the C ABI unchanged, no copy.
    out, _ = _differentiable_fwd(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal,
                                 scale_value, False, deterministic, variants)
    return out.transpose(1, 2)

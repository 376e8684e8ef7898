"""PyTorch ops: the `flashcore::attention_fwd` custom op and the `attention` / `sdpa` front ends.

Importing this module imports torch and registers the custom ops; it does not load the native library.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch

from . import _lib

__all__ = ["attention", "sdpa", "attention_fwd", "attention_with_kvcache", "attention_kvcache_fwd",
           "BACKWARD_NOT_IMPLEMENTED"]

BACKWARD_NOT_IMPLEMENTED = "FlashCore: backward is not implemented yet (forward only)"

# The softmax_scale range the C ABI accepts (besides 0, its "default" value): scale * log2(e) stays a normal float.
SOFTMAX_SCALE_MIN = 2.0**-100
SOFTMAX_SCALE_MAX = 2.0**100

_DTYPE_CODES = {torch.float16: _lib.DTYPE_FP16, torch.bfloat16: _lib.DTYPE_BF16}

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


def _check_inputs(q, k, v, layout: str = "bshd") -> None:
    """Raise ValueError / TypeError for anything the kernel cannot take, before touching the library."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"FlashCore: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"FlashCore: {name} must be 4-D {_LAYOUTS[layout]}, got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPE_CODES:
        raise TypeError(f"FlashCore: q must be float16 or bfloat16, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"FlashCore: q, k and v must have the same dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"FlashCore: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    bq, _, hq, dq = _dims(q, layout)
    bk, _, hk, dk = _dims(k, layout)
    if bk != bq:
        raise ValueError(f"FlashCore: q and k/v must have the same batch size, got {bq} and {bk}")
    if dk != dq:
        raise ValueError(f"FlashCore: q and k/v must have the same head_dim, got {dq} and {dk}")
    if hk == 0 or hq % hk != 0:
        raise ValueError(
            f"FlashCore: the number of query heads ({hq}) must be a multiple of the number of key/value heads ({hk})"
        )
    _check_device(q, k, v)


def _check_scale(softmax_scale) -> float:
    """The scale to pass to the C ABI: 0.0 means the default 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"FlashCore: softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    scale = float(softmax_scale)
    # The C ABI's range (checked here in double precision: a scale like 1e-50 would become 0.0 as a C float,
    # which means "the default 1/sqrt(head_dim)", and be used silently).
    if not (math.isfinite(scale) and SOFTMAX_SCALE_MIN <= scale <= SOFTMAX_SCALE_MAX):
        raise ValueError(
            f"FlashCore: softmax_scale must be a finite number in [2**-100, 2**100] (or None for 1/sqrt(head_dim)), "
            f"got {softmax_scale}"
        )
    return scale


def _check_supported(q: torch.Tensor, head_dim: int) -> _lib.Library:
    """Load the library (RuntimeError when missing) and check dtype / head_dim against its capabilities."""
    lib = _lib.load()
    dtypes, head_dims = lib.compiled()
    dtype_name = str(q.dtype).replace("torch.", "")
    if dtype_name not in dtypes:
        raise TypeError(f"FlashCore: dtype {q.dtype} is not compiled into {lib.path} (compiled: {list(dtypes)})")
    if head_dim not in head_dims:
        raise ValueError(f"FlashCore: head_dim {head_dim} is not supported (compiled head dims: {list(head_dims)})")
    return lib


# ---------------------------------------------------------------------------------------------------------------
# Strides: what the C ABI takes as is, and the copy otherwise.


def abi_strides(t: torch.Tensor) -> Optional[Tuple[int, int, int, int]]:
    """Element strides of a 4-D tensor as the C ABI wants them, or None if it cannot take the tensor as is.

    The ABI needs the last stride to be 1, the others positive multiples of 8 elements and a 16-byte aligned
    pointer. The stride of a size-1 dimension is never used, so it is replaced by one the ABI accepts."""
    sizes, strides = list(t.shape), list(t.stride())
    extent = 1 + sum(st * (sz - 1) for sz, st in zip(sizes, strides) if sz > 1)
    filler = (max(extent, 8) + 7) // 8 * 8
    strides = [filler if sz == 1 else st for sz, st in zip(sizes, strides)]
    if sizes[3] == 1:
        strides[3] = 1
    if strides[3] != 1 or any(st <= 0 or st % 8 != 0 for st in strides[:3]):
        return None
    if t.data_ptr() % 16 != 0:
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
    if strides is None:  # only when head_dim is not a multiple of 8, which no compiled kernel supports
        raise ValueError(f"FlashCore: cannot lay out a tensor of shape {tuple(t.shape)} for the kernel")
    return copy, strides, True


# ---------------------------------------------------------------------------------------------------------------
# The custom op.


def kernel_params(lib: _lib.Library, q, k, v, out, lse, causal: bool, softmax_scale: float, seqused_k=None):
    """The C params of one forward call on tensors the ABI takes as they are (see kernel_operand), without a
    workspace. lse: None or an empty tensor for no LSE. seqused_k: optional int32 (B,) device tensor of
    per-sequence key counts (a KV cache's lengths)."""
    strides = [abi_strides(t) for t in (q, k, v)]
    if any(st is None for st in strides):
        raise ValueError("FlashCore: kernel_params needs operands the C ABI takes as they are (kernel_operand)")
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    has_lse = lse is not None and lse.numel() > 0
    params = _lib.fill_params(
        lib.new_params(),
        pointers=(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr() if has_lse else 0),
        strides=(*strides, tuple(out.stride())),
        sizes=(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim),
        dtype=_DTYPE_CODES[q.dtype],
        causal=causal,
        softmax_scale=softmax_scale,
    )
    if seqused_k is not None:
        params.seqused_k = seqused_k.data_ptr()
    return params


def _launch(lib: _lib.Library, q, k, v, out, lse, causal: bool, softmax_scale: float, seqused_k=None) -> None:
    """Enqueue the kernel on the current stream of q's device (no host sync; capturable in a CUDA graph)."""
    q, k, v = (kernel_operand(t)[0] for t in (q, k, v))
    params = kernel_params(lib, q, k, v, out, lse, causal, softmax_scale, seqused_k)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device)
        workspace = lib.workspace_size(params)
        if workspace:
            buf = _workspace(q.device, stream, workspace)
            params.workspace = buf.data_ptr()
            params.workspace_size = workspace
        lib.forward(params, stream.cuda_stream)


# Workspaces (the dynamic scheduler's tile counter, which a tuned config may use): one zero-filled buffer per
# (device, stream), reused by every call on that stream; the library leaves it zero-filled after each call.
# Inside a CUDA-graph capture a fresh buffer is allocated (and zeroed) as part of the graph.
_WORKSPACES: dict = {}


def _workspace(device: torch.device, stream, size: int) -> torch.Tensor:
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(size, dtype=torch.uint8, device=device)
    key = (device.index, stream.cuda_stream)
    buf = _WORKSPACES.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.zeros(max(size, 256), dtype=torch.uint8, device=device)
        _WORKSPACES[key] = buf
    return buf


def _empty_outputs(q: torch.Tensor, return_lse: bool):
    batch, seqlen_q, heads_q, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, heads_q, head_dim))
    lse = q.new_empty((batch, heads_q, seqlen_q) if return_lse else (0,), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("flashcore::attention_fwd", mutates_args=())
def attention_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float, return_lse: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlashCore forward, (B, S, H, D) layout. softmax_scale 0.0 means 1/sqrt(head_dim).

    Returns (out (B, Sq, Hq, D) contiguous in q's dtype, lse): lse is float32 (B, Hq, Sq) when return_lse,
    else an empty (0,) tensor (a custom op cannot return None)."""
    _check_inputs(q, k, v, "bshd")
    lib = _check_supported(q, q.shape[3])
    out, lse = _empty_outputs(q, return_lse)
    if out.numel() == 0:
        return out, lse
    if k.shape[1] == 0:  # no keys: every row sees nothing (O = 0, LSE = -inf), as for fully masked rows
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse
    _launch(lib, q, k, v, out, lse, causal, softmax_scale)
    return out, lse


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, softmax_scale, return_lse):
    _check_inputs(q, k, v, "bshd")
    return _empty_outputs(q, return_lse)


def _check_cache_seqlens(cache_seqlens: torch.Tensor, q: torch.Tensor) -> None:
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != q.shape[0]:
        raise ValueError(
            f"FlashCore: cache_seqlens must be an int32 tensor of shape (batch,) = ({q.shape[0]},), got "
            f"{cache_seqlens.dtype} {tuple(cache_seqlens.shape)}"
        )
    if cache_seqlens.device != q.device:
        raise ValueError(f"FlashCore: cache_seqlens is on {cache_seqlens.device}, q on {q.device}")


@torch.library.custom_op("flashcore::attention_kvcache_fwd", mutates_args=())
def attention_kvcache_fwd(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor, causal: bool,
    softmax_scale: float, return_lse: bool
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, Sq, Hq, D) against the first cache_seqlens[b] rows of k_cache/v_cache (B, Sk, Hkv, D).
    Cache rows past those lengths are never read into the output (they may hold anything, NaN included)."""
    _check_inputs(q, k_cache, v_cache, "bshd")
    _check_cache_seqlens(cache_seqlens, q)
    lib = _check_supported(q, q.shape[3])
    out, lse = _empty_outputs(q, return_lse)
    if out.numel() == 0:
        return out, lse
    if k_cache.shape[1] == 0:
        out.zero_()
        lse.fill_(-math.inf)
        return out, lse
    _launch(lib, q, k_cache, v_cache, out, lse, causal, softmax_scale, seqused_k=cache_seqlens.contiguous())
    return out, lse


@attention_kvcache_fwd.register_fake
def _attention_kvcache_fwd_fake(q, k_cache, v_cache, cache_seqlens, causal, softmax_scale, return_lse):
    _check_inputs(q, k_cache, v_cache, "bshd")
    return _empty_outputs(q, return_lse)


@torch.library.custom_op("flashcore::attention_bwd", mutates_args=())
def attention_bwd(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Placeholder backward: traces (so compiled training graphs build) but raises when run."""
    raise NotImplementedError(BACKWARD_NOT_IMPLEMENTED)


@attention_bwd.register_fake
def _attention_bwd_fake(grad_out, q, k, v):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v = inputs[:3]
    ctx.save_for_backward(q, k, v)


def _backward(ctx, grad_out, grad_lse):
    q, k, v = ctx.saved_tensors
    grad_q, grad_k, grad_v = attention_bwd(grad_out, q, k, v)
    return grad_q, grad_k, grad_v, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------------------------
# Front ends.


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention in FlashAttention's layout: q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D), Hq a multiple of Hkv.

    causal: bottom-right aligned mask (query i sees key j iff j <= i + Sk - Sq), as in FlashAttention 2/3.
    softmax_scale: defaults to 1/sqrt(D). Returns out (B, Sq, Hq, D) in q's dtype, and with return_lse=True
    also lse (B, Hq, Sq) float32 (natural log of the softmax denominator; -inf for rows that see no key).
    """
    scale = _check_scale(softmax_scale)
    _check_inputs(q, k, v, "bshd")
    if not torch.compiler.is_compiling():
        _check_supported(q, q.shape[3])  # precise errors up front in eager mode; the op checks again when run
    out, lse = attention_fwd(q, k, v, bool(causal), scale, bool(return_lse))
    return (out, lse) if return_lse else out


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: Optional[torch.Tensor] = None,
    v: Optional[torch.Tensor] = None,
    cache_seqlens: Optional[Union[torch.Tensor, int]] = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    return_softmax_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Decode / chunked prefill against a dense KV cache, with FlashAttention's flash_attn_with_kvcache names.

    q (B, Sq, Hq, D); k_cache, v_cache (B, Sk_max, Hkv, D); cache_seqlens: int32 (B,) tensor (or an int for all)
    of the keys already in each sequence's cache (None: Sk_max). k, v (B, Sq_new, Hkv, D), optional: appended to
    the caches in place at cache_seqlens[b] (device-side indices, no host sync; the caller keeps
    cache_seqlens[b] + Sq_new <= Sk_max), and attended to. causal: bottom-right aligned per sequence against
    cache_seqlens[b] (+ Sq_new). Cache rows past the lengths are never read into the output, NaN included.
    Returns out (B, Sq, Hq, D), and lse (B, Hq, Sq) float32 with return_softmax_lse. Paged caches
    (block_table) are not supported yet.
    """
    scale = _check_scale(softmax_scale)
    batch = q.shape[0]
    if cache_seqlens is None:
        lengths = torch.full((batch,), k_cache.shape[1], dtype=torch.int32, device=q.device)
    elif isinstance(cache_seqlens, int):
        lengths = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    else:
        lengths = cache_seqlens
    _check_cache_seqlens(lengths, q)
    if (k is None) != (v is None):
        raise ValueError("FlashCore: pass both k and v to append to the cache, or neither")
    if k is not None:
        if k.shape[0] != batch or k.shape[2:] != k_cache.shape[2:] or v.shape != k.shape:
            raise ValueError(
                f"FlashCore: k and v must be (B, Sq_new, Hkv, D) = ({batch}, *, {k_cache.shape[2]}, "
                f"{k_cache.shape[3]}), got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        rows = lengths.long()[:, None] + torch.arange(k.shape[1], device=q.device)[None, :]  # (B, Sq_new)
        batch_idx = torch.arange(batch, device=q.device)[:, None].expand_as(rows)
        k_cache[batch_idx, rows] = k.to(k_cache.dtype)
        v_cache[batch_idx, rows] = v.to(v_cache.dtype)
        lengths = (lengths + k.shape[1]).to(torch.int32)
    _check_inputs(q, k_cache, v_cache, "bshd")
    if not torch.compiler.is_compiling():
        _check_supported(q, q.shape[3])
    out, lse = attention_kvcache_fwd(q, k_cache, v_cache, lengths, bool(causal), scale, bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out


def sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention on (B, H, S, D) tensors.

    Supported: no attn_mask, dropout_p == 0, 4-D inputs. GQA/MQA (Hq a multiple of Hkv) is always accepted,
    whatever enable_gqa says. is_causal is bottom-right aligned: the same as SDPA's when Sq == Sk (SDPA aligns
    top-left). The result is a (B, H, S, D) view of a (B, S, H, D)-contiguous tensor, so
    `out.transpose(1, 2).reshape(B, S, H * D)` is free.
    """
    if attn_mask is not None:
        raise ValueError(
            "FlashCore sdpa: attn_mask is not supported (only is_causal masking); "
            "use torch.nn.functional.scaled_dot_product_attention for arbitrary masks"
        )
    if dropout_p != 0.0:
        raise ValueError(f"FlashCore sdpa: dropout is not supported (dropout_p must be 0.0, got {dropout_p})")
    scale_value = _check_scale(scale)
    _check_inputs(query, key, value, "bhsd")
    if not torch.compiler.is_compiling():
        _check_supported(query, query.shape[3])
    # (B, H, S, D) -> (B, S, H, D) views: the strides reach the C ABI unchanged, no copy.
    out, _ = attention_fwd(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), bool(is_causal), scale_value, False
    )
    return out.transpose(1, 2)

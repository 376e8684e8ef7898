"""FlashCore as a Hugging Face transformers attention implementation.

    import flashcore.integrations.transformers as fc_hf
    name = fc_hf.register()                      # "fcore"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name, dtype=torch.bfloat16)

Why not the name "flashcore": transformers (5.x) treats every attn_implementation containing "flash" as a
FlashAttention flavour and tries to load FlashAttention kernels for it at model init, which fails. The default
name is therefore "fcore"; register() refuses names containing "flash".

What runs on FlashCore: fp16/bf16 CUDA inputs with a compiled head dim, no dropout, and either no mask or a pure
causal one (prefill without padding, decoding with a dynamic cache). GQA/MQA runs natively (no repeat_kv).
Everything else (padding masks, sliding-window masks once the window is exceeded, a static cache's mask,
dropout, fp32, softcap / attention sinks / position bias) falls back to transformers' own SDPA path, unless
register(fallback=False), which raises ValueError instead. The fallback is silent apart from one log line per
reason.

Masks: register() also registers a mask builder under the same name (transformers builds no mask at all for an
attention name it has no mask builder for, which would silently drop padding). It returns None for a pure
causal mask without padding, and transformers' SDPA mask otherwise. Without a 2-D attention_mask it decides
from shapes alone, so this also holds under torch.compile; with one it must read the mask (skipped while
compiling or capturing a CUDA graph, where the SDPA fallback is taken).
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from .. import _lib, _ops

__all__ = ["DEFAULT_NAME", "register", "attention_forward", "strict_attention_forward", "mask_function"]

DEFAULT_NAME = "fcore"

logger = logging.getLogger(__name__)
_logged_reasons = set()

# Keyword arguments some models pass that change the attention math FlashCore does not implement.
_UNSUPPORTED_KWARGS = ("position_bias", "softcap", "s_aux", "sinks")


def register(name: str = DEFAULT_NAME, *, fallback: bool = True) -> str:
    """Register FlashCore with transformers' AttentionInterface (and AttentionMaskInterface) under `name`.

    Use the returned name as `attn_implementation`. fallback=False raises ValueError for unsupported calls
    instead of falling back to SDPA."""
    if "flash" in name.lower():
        raise ValueError(
            f"FlashCore: cannot register the attention implementation as {name!r}: transformers treats every name "
            "containing 'flash' as a FlashAttention variant and tries to load FlashAttention kernels for it. "
            f"Use a name without 'flash' (default {DEFAULT_NAME!r})."
        )
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward if fallback else strict_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers < 4.53 builds masks per model, from the sdpa/eager conventions
        AttentionMaskInterface = None
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(name, mask_function)
    return name


# ---------------------------------------------------------------------------------------------------------------
# Attention.


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


def _compiled_head_dims():
    return _lib.load().compiled()[1]  # RuntimeError when the library is missing: no silent fallback


def _unsupported_reason(query, key, value, attention_mask, dropout, kwargs) -> Optional[str]:
    """Why FlashCore cannot run this call (None when it can). Metadata only: traceable by torch.compile."""
    if attention_mask is not None:
        return "an attention mask that is not purely causal (e.g. padding)"
    if dropout:
        return "attention dropout"
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            return f"the {name!r} argument"
    for t in (query, key, value):
        if not _is_cuda(t):
            return f"tensors on {t.device}"
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != query.dtype:
            return f"dtype {t.dtype}"
    if key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
        return "different head dims for query, key and value"
    if query.shape[1] % key.shape[1] != 0:
        return "a query head count that is not a multiple of the key/value head count"
    if not torch.compiler.is_compiling():
        head_dims = _compiled_head_dims()
        if query.shape[-1] not in head_dims:
            return f"head_dim {query.shape[-1]} (compiled: {list(head_dims)})"
    return None


def _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, kwargs):
    reason = _unsupported_reason(query, key, value, attention_mask, dropout, kwargs)
    # As transformers' sdpa_attention_forward: a None mask means causal (for causal modules) unless decoding.
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    causal = seqlen_q > 1 and bool(causal)
    if reason is None and causal and seqlen_k != seqlen_q:
        if seqlen_k > seqlen_q:
            # transformers' convention for a None mask here is top-left causal (prefill of an empty static cache):
            # only the first seqlen_q keys are visible, exactly as sdpa_attention_forward slices them.
            key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        else:
            reason = "causal attention with fewer keys than queries"
    if reason is not None:
        if not fallback:
            raise ValueError(f"FlashCore transformers adapter: unsupported call: {reason}")
        if not torch.compiler.is_compiling() and reason not in _logged_reasons:
            _logged_reasons.add(reason)
            logger.info("FlashCore: falling back to transformers' SDPA attention for %s", reason)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # (B, H, S, D) -> (B, S, H, D) views (no copy); the output is (B, S, Hq, D) contiguous, as transformers wants.
    out = _ops.attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scaling
    )
    return out, None


def _attention_function(fallback: bool):
    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        dropout: float = 0.0,
        scaling: Optional[float] = None,
        is_causal: Optional[bool] = None,
        **kwargs,
    ):
        return _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, kwargs)

    return attention


attention_forward = _attention_function(fallback=True)
attention_forward.__name__ = attention_forward.__qualname__ = "attention_forward"
attention_forward.__doc__ = (
    "transformers attention function: (B, H, S, D) inputs -> ((B, S, H, D) output, None); SDPA fallback."
)

strict_attention_forward = _attention_function(fallback=False)
strict_attention_forward.__name__ = strict_attention_forward.__qualname__ = "strict_attention_forward"
strict_attention_forward.__doc__ = "As attention_forward, but raises ValueError where it would fall back to SDPA."


# ---------------------------------------------------------------------------------------------------------------
# Masks.


def _has_no_padding(attention_mask) -> bool:
    if attention_mask is None:
        return True
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False  # reading the mask would need a host sync / data-dependent control flow
    if attention_mask.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    return bool(attention_mask.all())


def mask_function(*args, **kwargs):
    """transformers mask builder: None for a pure causal mask without padding, else transformers' SDPA mask."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if (
        not args
        and kwargs.get("allow_is_causal_skip", True)
        and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
        and kwargs.get("local_size") is None
        and q_length is not None
        and kv_length is not None
        and (q_length == 1 or q_length == kv_length)
        and _has_no_padding(kwargs.get("attention_mask"))
    ):
        return None
    return sdpa_mask(*args, **kwargs)

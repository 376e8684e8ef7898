"""FlashCore as a Hugging Face transformers attention implementation.

    import flashcore.integrations.transformers as fc_hf
    fc_hf.register("flashcore")                  # or fc_hf.register() -> "fcore"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="flashcore", dtype=torch.bfloat16)

Two names, one implementation:

- "fcore" (DEFAULT_NAME): a plain AttentionInterface registration; transformers treats it like any custom name.
- "flashcore" (FLASH_NAME): transformers (5.x) treats every attn_implementation containing "flash" as a
  FlashAttention flavour (transformers.utils.generic.is_flash_attention_requested is `"flash" in name`).
  PreTrainedModel._check_and_adjust_attn_implementation (model init, set_attn_implementation) then calls
  modeling_flash_attention_utils.lazy_import_flash_attention(name), whose _lazy_imports treats a name that is not
  flash_attention_{2,3,4} as a hub kernel (integrations.hub_kernels.load_and_register_attn_kernel) and raises
  "Could not find the currently requested flash attention implementation". transformers has no public hook for
  a local FlashAttention-like implementation, so register("flashcore") wraps
  modeling_flash_attention_utils._lazy_imports (transformers 5.x only, checked) so that, for exactly the name
  "flashcore" while it is registered to this module's function, it loads nothing. Every other name goes to the
  original. The attention function and mask builder are the same as for "fcore" ((B, H, S, D) inputs, SDPA-style
  masks from our own mask builder, not flash_attention_mask). What else a "flash" name changes: model code that
  branches on is_flash_attention_requested (vision towers of Qwen2/2.5/3-VL, GLM-4V, ...) passes packed
  sequences with cu_seq_lens_q / cu_seq_lens_k and no mask; FlashCore runs those segment by segment (eager only,
  it reads the lengths). See docs/python.md for the rest.

What runs on FlashCore: fp16/bf16 CUDA inputs with a compiled head dim, no dropout, and either no mask or a pure
causal one (prefill without padding, decoding with a dynamic cache). GQA/MQA runs natively (no repeat_kv). A value
head dim of its own (DeepSeek-V2/V3's MLA passes query and key of 192, value of 128 to an attention that is not
FlashAttention-2's) runs too where the library compiles the pair (0.7: (192, 128)); with gradients where its backward
takes the pair (0.9, the sm90 backend: (192, 128)), else a training call falls back.
Since 0.5 (a 0.5 library) the attention variants models pass for FlashAttention run too: the sliding_window of a
causal module (the kwarg, or the module's attribute) as FlashAttention's window_size=(sliding_window - 1, 0) when
it hides keys, softcap (Gemma 2) and gpt-oss's s_aux as sinks.
Training too (since 0.4): a call whose inputs require grad (grad mode on) runs FlashCore's forward and backward
when the library has a backward for its head dim (64 and 128 in 0.4; 0.9 on the sm90 backend (a Hopper GPU): 96, 192,
256 and (192, 128) too), with the variants too when the library's backward takes them (0.6: the window, softcap, and
s_aux with its gradient; a window or softcap at head dims 64, 96 and 128 only); otherwise (a 0.5 library with a variant,
say) it falls back like the calls below (with fallback=False: ValueError), so that no backward fails after the forward
ran.
Everything else (padding masks, a static cache's mask, dropout, fp32, position bias, a sinks kwarg, the window of a
non-causal module, an uncompiled head dim) falls back to transformers' own SDPA path, or to the model's eager
attention when the call has softcap or sinks (SDPA would ignore them), unless register(fallback=False), which raises
ValueError instead. Each fallback reason is reported once per process with warnings.warn (naming the argument). No
argument the kernel cannot honour is ignored: the adapter never returns plain causal attention for a call that asked
for something else. Eager and torch.compile take the same decision for the same call (the compiled head dims are read
once, outside the graph, and cached). Sequences packed through position_ids (batch 1, positions restarting, no
mask: what FlashAttention-named implementations get) run segment by segment in eager mode; while compiling or
capturing a CUDA graph the ids cannot be read, so such a call (batch 1, no mask, prefill, position_ids given) falls
back to transformers' attention with a block-diagonal causal mask built from the ids by tensor ops (see
docs/python.md).

Masks: register() also registers a mask builder under the same name (transformers builds no mask at all for an
attention name it has no mask builder for, which would silently drop padding). It returns None for a pure
causal mask, or a causal sliding-window one, without padding (the attention function applies the window), and
transformers' SDPA mask otherwise. Without a 2-D attention_mask it decides from shapes alone, so this also holds
under torch.compile; with one it must read the mask (skipped while compiling or capturing a CUDA graph, where the
SDPA fallback is taken).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import warnings
from typing import Optional

import torch

from .. import _lib, _ops

__all__ = [
    "DEFAULT_NAME",
    "FLASH_NAME",
    "register",
    "attention_forward",
    "strict_attention_forward",
    "mask_function",
]

DEFAULT_NAME = "fcore"
FLASH_NAME = "flashcore"  # the only name containing "flash" that register() accepts (see the module docstring)

logger = logging.getLogger(__name__)
_logged_reasons = set()

# Keyword arguments some models pass that change the attention math FlashCore does not implement (position_bias:
# T5-style biases, which transformers' SDPA path adds to its mask; sinks: no transformers model passes attention sinks
# under this name (gpt-oss's are s_aux), so its convention is not assumed).
_UNSUPPORTED_KWARGS = ("position_bias", "sinks")
# FlashAttention-style packed-sequence arguments (passed by model code for names containing "flash").
_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def register(name: str = DEFAULT_NAME, *, fallback: bool = True) -> str:
    """Register FlashCore with transformers' AttentionInterface (and AttentionMaskInterface) under `name`.

    Use the returned name as `attn_implementation`. Names containing "flash" are refused, except FLASH_NAME
    ("flashcore"), which needs transformers 5.x (see the module docstring). fallback=False raises ValueError for
    unsupported calls instead of falling back to SDPA."""
    if "flash" in name.lower():
        if name != FLASH_NAME:
            raise ValueError(
                f"FlashCore: cannot register the attention implementation as {name!r}: transformers treats every "
                "name containing 'flash' as a FlashAttention variant and tries to load FlashAttention kernels for it. "
                f"Use {FLASH_NAME!r} (handled specially) or a name without 'flash' (default {DEFAULT_NAME!r})."
            )
        _allow_flash_name()
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
# The name "flashcore": keep transformers from loading FlashAttention kernels for it.


def _flash_unavailable(*args, **kwargs):
    raise NotImplementedError(
        f"FlashCore: {FLASH_NAME!r} is a transformers AttentionInterface function, not a FlashAttention kernel; "
        "transformers' FlashAttention wrappers (flash_attention_forward, paged attention, continuous batching) "
        "cannot use it."
    )


# Signature-compatible stand-ins for what _lazy_imports returns (transformers inspects the varlen function's
# parameters to decide which kwargs it supports); they are only called if something routes "flashcore" through
# transformers' own FlashAttention wrappers, which never happens for the function register() installs.
def _flash_attn_func_unavailable(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    _flash_unavailable()


def _flash_attn_varlen_func_unavailable(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, **kwargs
):
    _flash_unavailable()


def _flash_name_is_ours() -> bool:
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping.get(FLASH_NAME) in (attention_forward, strict_attention_forward)


def _allow_flash_name() -> None:
    """Wrap transformers.modeling_flash_attention_utils._lazy_imports so that it loads nothing for exactly
    FLASH_NAME while FLASH_NAME is registered to this module. Idempotent; transformers 5.x only."""
    import transformers

    version = getattr(transformers, "__version__", "0")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = 0
    why = None
    mfau = None
    if major != 5:
        why = f"transformers {version} (supported: 5.x; tested with 5.17)"
    else:
        try:
            from transformers import modeling_flash_attention_utils as mfau
        except ImportError as exc:
            why = f"transformers.modeling_flash_attention_utils is not importable ({exc})"
        else:
            original = getattr(mfau, "_lazy_imports", None)
            if getattr(original, "_flashcore_original", None) is not None:
                return  # already wrapped
            if (
                original is None
                or not hasattr(mfau, "lazy_import_flash_attention")
                or list(inspect.signature(original).parameters)[:1] != ["implementation"]
            ):
                why = "transformers.modeling_flash_attention_utils._lazy_imports(implementation, ...) is missing"
    if why is not None:
        raise RuntimeError(
            f"FlashCore: cannot register {FLASH_NAME!r} with {why}; transformers would try to load FlashAttention "
            f"kernels for a name containing 'flash'. Use register() (name {DEFAULT_NAME!r}) instead."
        )

    @functools.wraps(original)
    def _lazy_imports(implementation, *args, **kwargs):
        if implementation == FLASH_NAME and _flash_name_is_ours():
            # (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache, pad_input, unpad_input)
            return (
                _flash_attn_func_unavailable,
                _flash_attn_varlen_func_unavailable,
                None,
                getattr(mfau, "_pad_input", None),
                getattr(mfau, "_unpad_input", None),
            )
        return original(implementation, *args, **kwargs)

    _lazy_imports._flashcore_original = original
    mfau._lazy_imports = _lazy_imports
    logger.debug("FlashCore: wrapped transformers.modeling_flash_attention_utils._lazy_imports for %r", FLASH_NAME)


# ---------------------------------------------------------------------------------------------------------------
# Attention.


def _is_cuda(t: torch.Tensor) -> bool:
    return t.device.type == "cuda"


# (library object, its compiled head dims), (library object, the head dims its backward takes), (library object,
# whether it reads the attention variants), (library object, whether its backward takes them), (library object,
# its compiled (head_dim, head_dim_v) pairs) and (library object, the pairs its backward takes): read outside any
# graph, so that eager and compiled calls agree.
_head_dims_cache = (None, None)
_backward_dims_cache = (None, None)
_variants_cache = (None, None)
_variant_backward_cache = (None, None)
_head_dim_pairs_cache = (None, None)
_backward_pairs_cache = (None, None)


def _wide_backward(lib) -> bool:
    """Whether the library's backward takes more than head dims 64 and 128 on this device (96, 192, 256 and the pair
    (192, 128)): a 0.9 library on the sm90 backend (a Hopper GPU, FLASHCORE_BACKEND not forcing the portable one,
    whose backward has head dims 64 and 128 only)."""
    if tuple(getattr(lib, "version", (0, 0))[:2]) < _ops.BACKWARD_WIDE_VERSION:
        return False
    if os.environ.get("FLASHCORE_BACKEND", "").strip().lower() == "sm80":
        return False
    try:
        return lib.capabilities().device_arch // 10 == 9
    except Exception:  # no device here: the forward would fail first, with the library's own error
        return False


def _load_head_dims():
    """Load the library (RuntimeError when missing: no silent fallback) and cache its compiled head dims, those
    its backward takes (() for a library older than 0.4), whether it has the attention variants (0.5), whether its
    backward takes them (0.6), its (head_dim, head_dim_v) pairs (() for a library older than 0.7) and those its
    backward takes (() before 0.9 and off the sm90 backend)."""
    global _head_dims_cache, _backward_dims_cache, _variants_cache, _variant_backward_cache, _head_dim_pairs_cache
    global _backward_pairs_cache
    lib = _lib.load()
    if _head_dims_cache[0] is not lib:
        head_dims = tuple(lib.compiled()[1])
        pairs = tuple(tuple(p) for p in lib.compiled_head_dim_pairs())
        has_backward = bool(lib.has_backward())
        wide = _wide_backward(lib) if has_backward else False
        backward_dims = (tuple(d for d in _ops.BACKWARD_HEAD_DIMS
                               if d in head_dims and (d in _ops.BACKWARD_PORTABLE_HEAD_DIMS or wide))
                         if has_backward else ())
        backward_pairs = tuple(p for p in _ops.BACKWARD_HEAD_DIM_PAIRS if p in pairs) if wide else ()
        _head_dims_cache, _backward_dims_cache = (lib, head_dims), (lib, backward_dims)
        _variants_cache = (lib, bool(lib.has_variants()))
        _variant_backward_cache = (lib, bool(lib.has_variant_backward()))
        _head_dim_pairs_cache = (lib, pairs)
        _backward_pairs_cache = (lib, backward_pairs)
    return _head_dims_cache[1]


def _cached_answers():
    return (_head_dims_cache[1], _backward_dims_cache[1], _variants_cache[1], _variant_backward_cache[1],
            _head_dim_pairs_cache[1], _backward_pairs_cache[1])


@torch.compiler.assume_constant_result
def _head_dims_outside_graph():
    """While compiling: dynamo runs this as plain Python at trace time and bakes its result into the graph as a
    constant (the library is never called from the graph). The cached answer, else the library is loaded now, as
    an eager call would: the first flashcore call of a process may well be a compiled one. A library that cannot be
    loaded gives None: the op then raises the loader's RuntimeError when it runs, as the eager call does.
    Returns (compiled head dims, head dims the backward takes, whether the library has the variants, whether its
    backward takes them, the compiled (head_dim, head_dim_v) pairs, those the backward takes)."""
    if _head_dims_cache[1] is None:
        try:
            _load_head_dims()
        except RuntimeError:
            return None
    return _cached_answers()


def _library_head_dims():
    """(the library's compiled head dims, those its backward takes, whether it has the attention variants, whether its
    backward takes them, its (head_dim, head_dim_v) pairs, those its backward takes), the same answer in eager and
    compiled calls. Eager: loads the library (RuntimeError when missing) and caches the answer. While compiling: the cached answer, or, when nothing
    was cached yet, the library's, read at trace time outside the graph (None without a library)."""
    if torch.compiler.is_compiling():
        return _head_dims_outside_graph()
    _load_head_dims()
    return _cached_answers()


def _compiled_head_dims():
    """The library's compiled head dims (see _library_head_dims)."""
    dims = _library_head_dims()
    return None if dims is None else dims[0]


def _compiled_backward_head_dims():
    """The head dims FlashCore's backward takes with the loaded library (see _library_head_dims)."""
    dims = _library_head_dims()
    return None if dims is None else dims[1]


def _library_has_variants() -> Optional[bool]:
    """Whether the loaded library runs the attention variants (0.5 or newer; see _library_head_dims). None without a
    library: the call then goes to the op, which raises the loader's error."""
    dims = _library_head_dims()
    return None if dims is None else dims[2]


def _compiled_head_dim_pairs():
    """The library's compiled (head_dim, head_dim_v) pairs whose V head dim differs (see _library_head_dims)."""
    dims = _library_head_dims()
    return None if dims is None else dims[4]


def _compiled_backward_head_dim_pairs():
    """The (head_dim, head_dim_v) pairs (V head dim of its own) FlashCore's backward takes with the loaded library on
    this device (see _library_head_dims): (192, 128) with a 0.9 library on the sm90 backend that compiles it."""
    dims = _library_head_dims()
    return None if dims is None else dims[5]


def _library_has_variant_backward() -> Optional[bool]:
    """Whether the loaded library's backward takes the attention variants (0.6 or newer: window, softcap, sinks and
    their gradient; see _library_head_dims). None without a library."""
    dims = _library_head_dims()
    return None if dims is None else dims[3]


def _sliding_window(module, kwargs) -> Optional[int]:
    """The call's sliding window in transformers' convention (None: none): the kwarg models pass for sliding layers
    (Mistral, Qwen2, Gemma 2/3, gpt-oss, ...), else the module's attribute."""
    window = kwargs.get("sliding_window")
    return window if window is not None else getattr(module, "sliding_window", None)


def _valid_window(window) -> Optional[int]:
    """The window when it is one (a positive int), else None (the call then falls back, naming it)."""
    return window if isinstance(window, int) and not isinstance(window, bool) and window >= 1 else None


def _module_is_causal(module, is_causal) -> bool:
    """As transformers' sdpa_attention_forward: the is_causal kwarg when given, else the module's flag."""
    return bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))


def _window_left(window: int) -> int:
    """FlashAttention's left bound of transformers' sliding window of `window` tokens. transformers' mask keeps key
    kv of query q iff q - window < kv <= q (masking_utils.sliding_window_overlay and the causal mask): `window`
    tokens, the query's own included, so the left bound is window - 1, which is also what transformers passes to
    FlashAttention (modeling_flash_attention_utils._process_flash_attention_kwargs: window_size=(window - 1, ...))."""
    return window - 1


def _window_restricts(window: Optional[int], seqlen_k: int) -> bool:
    """Whether a causal window of `window` tokens hides any of seqlen_k keys from a query: with bottom-right
    alignment the earliest query, which sees the least, sees keys from Sk - Sq - (window - 1) on, so nothing is
    hidden while Sk <= window (transformers passes FlashAttention no window then either)."""
    return window is not None and seqlen_k > window


def _visible(seqlen_q: int, seqlen_k: int, causal: bool, window: Optional[int], device) -> torch.Tensor:
    """(Sq, Sk) bool: the keys each query sees with FlashCore's bottom-right alignment under causal (or a causal
    module's decoding step, which needs no causal flag) and a sliding window of `window` tokens (None: none). Tensor
    ops only: traceable, as the mask of a fallback call."""
    rows = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device)[None, :]
    sees = cols <= rows if causal else torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if window is not None:
        sees = sees & (cols >= rows - _window_left(window)) & (cols <= rows)
    return sees


def _sinks(kwargs):
    """The call's attention sinks: gpt-oss passes them as s_aux (transformers' name; FlashAttention-4's
    learnable_sink), one logit per query head."""
    return kwargs.get("s_aux")


def _softcap(kwargs) -> Optional[float]:
    """The call's softcap (Gemma 2's attn_logit_softcapping); None and 0 mean none."""
    softcap = kwargs.get("softcap")
    return softcap if softcap else None


def _cannot_read(t) -> bool:
    """True while compiling, tracing or capturing a CUDA graph: the values of `t` are not available then."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    return bool(t.is_cuda and torch.cuda.is_current_stream_capturing())


def _packed_prefill_ids(query, key, attention_mask, kwargs):
    """position_ids when the call has the packed-prefill format (batch 1, no mask, as many keys as queries, one id
    per query), else None. Such ids may restart inside the sequence (several packed sequences)."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None or attention_mask is not None or query.shape[0] != 1 or query.shape[2] <= 1:
        return None
    if query.shape[2] != key.shape[2] or position_ids.shape[-1] != query.shape[2]:
        return None
    return position_ids


def _segment_causal_mask(position_ids, seqlen):
    """(1, 1, S, S) boolean mask: causal within each run of consecutive positions (a packed sequence), nothing
    across runs. Built from tensor ops only, so it traces under torch.compile and CUDA graph capture."""
    ids = position_ids.reshape(-1)
    restart = torch.ones_like(ids, dtype=torch.bool)
    restart[1:] = ids[1:] != ids[:-1] + 1
    segment = torch.cumsum(restart.to(torch.int32), 0)
    rows = torch.arange(seqlen, device=ids.device)
    causal = rows[None, :] <= rows[:, None]
    return (causal & (segment[None, :] == segment[:, None]))[None, None]


def _packed_positions(query, key, attention_mask, kwargs):
    """cu_seq_lens (int32) when position_ids pack several sequences into batch 1 without a mask, else None.
    Reads position_ids (a host sync), so only in eager mode and outside CUDA graph capture."""
    position_ids = _packed_prefill_ids(query, key, attention_mask, kwargs)
    if position_ids is None or _cannot_read(position_ids):
        return None
    ids = position_ids.reshape(-1)
    starts = torch.nonzero(ids[1:] != ids[:-1] + 1).reshape(-1) + 1
    if starts.numel() == 0:
        return None
    bounds = [0] + starts.tolist() + [ids.numel()]
    return torch.tensor(bounds, dtype=torch.int32, device=query.device)


def _unsupported_reason(module, query, key, value, attention_mask, dropout, kwargs, module_causal: bool
                        ) -> Optional[str]:
    """Why FlashCore cannot run this call (None when it can). Metadata only: traceable by torch.compile."""
    if attention_mask is not None:
        return "an attention mask that is not purely causal (e.g. padding)"
    if dropout:
        return f"attention dropout (dropout={dropout})"
    for name in _UNSUPPORTED_KWARGS:
        if kwargs.get(name) is not None:
            return f"the {name!r} argument"
    window = _sliding_window(module, kwargs)
    if window is not None and _valid_window(window) is None:
        return f"sliding_window={window!r} (not a positive int)"
    if window is not None and not module_causal and key.shape[2] >= window:
        # A bidirectional window: transformers' models disagree on its width (|q - kv| <= window in masking_utils,
        # < window in Gemma 3), so it is not guessed here.
        return f"sliding_window={window} in a non-causal module with {key.shape[2]} keys"
    softcap = _softcap(kwargs)
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0):
        return f"softcap={softcap!r} (not a positive number)"
    sinks = _sinks(kwargs)
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.dim() != 1
                              or sinks.shape[0] != query.shape[1]):
        shown = tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__
        return f"s_aux (attention sinks) of shape {shown}, not one per query head ({query.shape[1]},)"
    for t in (query, key, value):
        if not _is_cuda(t):
            return f"tensors on {t.device}"
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != query.dtype:
            return f"dtype {t.dtype}"
    if key.shape[-1] != query.shape[-1]:
        return "different head dims for query and key"
    if query.shape[1] % key.shape[1] != 0:
        return "a query head count that is not a multiple of the key/value head count"
    head_dim, head_dim_v = query.shape[-1], value.shape[-1]
    if head_dim_v != head_dim:  # a value head dim of its own (DeepSeek-V2/V3's MLA: 192 / 128), a 0.7 library
        pairs = _compiled_head_dim_pairs()
        if pairs is not None and (head_dim, head_dim_v) not in pairs:
            return f"(head_dim, head_dim_v) = ({head_dim}, {head_dim_v}) (compiled pairs: {list(pairs)})"
    else:
        head_dims = _compiled_head_dims()
        if head_dims is not None and head_dim not in head_dims:
            return f"head_dim {head_dim} (compiled: {list(head_dims)})"
    variants = [name for name, used in (("sliding_window", module_causal and _window_restricts(window, key.shape[2])),
                                        ("softcap", softcap is not None), ("s_aux", sinks is not None)) if used]
    if variants and _library_has_variants() is False:
        return f"{', '.join(variants)} (the loaded libflashcore.so predates the attention variants: 0.5 needed)"
    if _ops._needs_grad(query, key, value, *([sinks] if sinks is not None else [])):  # training: differentiated
        if variants and _library_has_variant_backward() is False:
            # A library whose backward does not take the variants (0.5: forward only): fall back before the forward,
            # not fail in the backward.
            return (f"gradients with {', '.join(variants)} (the loaded libflashcore.so's backward predates the "
                    f"attention variants: 0.6 needed)")
        backward_dims = _compiled_backward_head_dims()
        if backward_dims is not None and not backward_dims:
            return "gradients (the loaded libflashcore.so has no backward pass: 0.4 or newer needed)"
        if head_dim_v != head_dim:
            # The pairs the backward takes (0.9, the sm90 backend: (192, 128)), not merely those the forward compiles.
            backward_pairs = _compiled_backward_head_dim_pairs()
            if backward_pairs is not None and (head_dim, head_dim_v) not in backward_pairs:
                return (f"gradients with a value head dim of its own ({head_dim_v}, query and key {head_dim}: "
                        f"FlashCore's backward takes the (head_dim, head_dim_v) pairs {list(backward_pairs)} here; "
                        f"{list(_ops.BACKWARD_HEAD_DIM_PAIRS)} on the sm90 backend of a "
                        f"{'.'.join(map(str, _ops.BACKWARD_WIDE_VERSION))} library)")
        elif backward_dims is not None and head_dim not in backward_dims:
            return f"gradients with head_dim {head_dim} (FlashCore's backward: {list(backward_dims)})"
        wide_variants = [v for v in variants if v != "s_aux"]
        if wide_variants and head_dim not in _ops.BACKWARD_VARIANT_HEAD_DIMS:
            return (f"gradients with {', '.join(wide_variants)} at head_dim {head_dim} (FlashCore's backward takes "
                    f"them at head dims {', '.join(map(str, _ops.BACKWARD_VARIANT_HEAD_DIMS[:-1]))} and "
                    f"{_ops.BACKWARD_VARIANT_HEAD_DIMS[-1]})")
    return None


def _eager_attention(module):
    """The eager attention function of the module's model (transformers' modeling files define one at module level:
    models/<name>/modeling_<name>.py eager_attention_forward), which applies softcap and sinks; None if there is
    none."""
    import sys

    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _fallback_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs, reason,
                        fallback, window=None):
    """transformers' own attention for a call FlashCore does not run (reason), or ValueError (fallback=False).

    SDPA (sdpa_attention_forward) runs it, except a call with softcap or attention sinks (s_aux, sinks), which SDPA
    would ignore: the model's eager attention runs those. window: a sliding window (transformers' tokens) that no mask
    holds yet (the mask builder returns None for a sliding-window layer without padding, leaving the window to the
    attention function): the mask is built here, as is the causal one the eager attention needs (it takes no
    is_causal)."""
    if not fallback:
        raise ValueError(f"FlashCore transformers adapter: unsupported call: {reason}")
    eager = None
    if _softcap(kwargs) is not None or _sinks(kwargs) is not None or kwargs.get("sinks") is not None:
        eager = _eager_attention(module)
        if eager is None:
            raise ValueError(f"FlashCore transformers adapter: cannot run a call with {reason}: it has softcap or "
                             f"attention sinks, which transformers' SDPA attention ignores, and "
                             f"{type(module).__module__} has no eager_attention_forward to run it")
    to = "the model's eager attention" if eager is not None else "transformers' SDPA attention"
    if not torch.compiler.is_compiling() and (reason, to) not in _logged_reasons:
        _logged_reasons.add((reason, to))
        warnings.warn(f"FlashCore: falling back to {to} for {reason}", stacklevel=4)
    module_causal = _module_is_causal(module, is_causal)
    seqlen_q = query.shape[2]
    causal = module_causal and seqlen_q > 1
    pending_window = window is not None and module_causal and _window_restricts(window, key.shape[2])
    if attention_mask is None and (pending_window or (eager is not None and causal)):
        if causal and key.shape[2] > seqlen_q:  # transformers' top-left convention for a None mask (see _forward)
            key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        attention_mask = _visible(seqlen_q, key.shape[2], causal, window if pending_window else None,
                                  query.device)[None, None]
    if eager is not None:
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            # Eager attention adds its mask to the scores: a boolean one (SDPA's, which the mask builder makes)
            # becomes 0 where a key is seen and the dtype's minimum elsewhere, as transformers' eager masks are.
            attention_mask = torch.where(attention_mask, 0.0, torch.finfo(query.dtype).min).to(query.dtype)
        return eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, kwargs):
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        return _forward_packed(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, kwargs)
    cu_seq_lens = _packed_positions(query, key, attention_mask, kwargs)
    if cu_seq_lens is not None:  # sequences packed through position_ids: attention within each one
        rest = {k: v for k, v in kwargs.items() if k != "position_ids"}
        rest.update(cu_seq_lens_q=cu_seq_lens, cu_seq_lens_k=cu_seq_lens)
        return _forward_packed(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, rest)
    window = _sliding_window(module, kwargs)
    packed_ids = _packed_prefill_ids(query, key, attention_mask, kwargs)
    if packed_ids is not None and _cannot_read(packed_ids) and getattr(module, "is_causal", True) is not False:
        # Under torch.compile / graph capture the ids cannot be inspected: they may pack several sequences, which a
        # plain causal kernel call would attend across. transformers' attention with a block-diagonal causal mask
        # (and the window, if any) is right either way.
        rest = {k: v for k, v in kwargs.items() if k != "position_ids"}
        mask = _segment_causal_mask(packed_ids, query.shape[2])
        if _valid_window(window) is not None:
            mask = mask & _visible(query.shape[2], key.shape[2], True, window, query.device)
        return _fallback_attention(module, query, key, value, mask, dropout, scaling, is_causal, rest,
                                   "position_ids while compiling or capturing (possibly packed sequences)", fallback)
    # As transformers' sdpa_attention_forward: a None mask means causal (for causal modules) unless decoding.
    module_causal = _module_is_causal(module, is_causal)
    reason = _unsupported_reason(module, query, key, value, attention_mask, dropout, kwargs, module_causal)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    causal = seqlen_q > 1 and module_causal
    if reason is None and causal and seqlen_k != seqlen_q:
        if seqlen_k > seqlen_q:
            # transformers' convention for a None mask here is top-left causal (prefill of an empty static cache):
            # only the first seqlen_q keys are visible, exactly as sdpa_attention_forward slices them.
            key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        else:
            reason = "causal attention with fewer keys than queries"
    if reason is not None:
        return _fallback_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs,
                                   reason, fallback, _valid_window(window) if attention_mask is None else None)
    # The variants of a causal module: a sliding window that hides keys (with no mask, the window is the attention
    # function's to apply; a decoding step, causal=False here, needs the window's right bound 0 too), the softcap and
    # the sinks. A window that hides nothing is not passed (as transformers does for FlashAttention).
    variants = {}
    if module_causal and _window_restricts(window, key.shape[2]):
        variants["window_size"] = (_window_left(window), 0)
    if _softcap(kwargs) is not None:
        variants["softcap"] = float(_softcap(kwargs))
    if _sinks(kwargs) is not None:
        variants["sinks"] = _sinks(kwargs)
    # (B, H, S, D) -> (B, S, H, D) views (no copy); the output is (B, S, Hq, D) contiguous, as transformers wants.
    out = _ops.attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scaling,
        **variants
    )
    return out, None


def _forward_packed(module, query, key, value, attention_mask, dropout, scaling, is_causal, fallback, kwargs):
    """Packed sequences as model code passes them to FlashAttention-named implementations: batch 1, no mask,
    cu_seq_lens_q / cu_seq_lens_k boundaries. FlashCore has no varlen kernel: one call per segment (reads the
    boundaries on the host, so eager only / a graph break under torch.compile)."""
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    problem = None
    if cu_q is None or cu_k is None:
        problem = "only one of cu_seq_lens_q / cu_seq_lens_k"
    elif attention_mask is not None:
        problem = "cu_seq_lens_q / cu_seq_lens_k together with an attention mask"
    elif query.shape[0] != 1:
        problem = f"cu_seq_lens_q / cu_seq_lens_k with batch size {query.shape[0]} (packed sequences have batch 1)"
    if problem is None:
        lens_q, lens_k = torch.diff(cu_q).tolist(), torch.diff(cu_k).tolist()
        if int(cu_q[0]) != 0 or int(cu_k[0]) != 0 or sum(lens_q) != query.shape[2] or sum(lens_k) != key.shape[2]:
            problem = "cu_seq_lens_q / cu_seq_lens_k that do not cover the sequence from 0"
        elif len(lens_q) != len(lens_k):
            problem = "different segment counts in cu_seq_lens_q and cu_seq_lens_k"
        elif lens_q != lens_k and (is_causal if is_causal is not None else getattr(module, "is_causal", True)):
            problem = "causal packed segments with different query and key lengths"
    if problem is not None:
        raise ValueError(f"FlashCore transformers adapter: unsupported packed-sequence call: {problem}")
    rest = {k: v for k, v in kwargs.items() if k not in _VARLEN_KWARGS}
    outs = [
        _forward(module, q, k, v, None, dropout, scaling, is_causal, fallback, rest)[0]
        for q, k, v in zip(query.split(lens_q, dim=2), key.split(lens_k, dim=2), value.split(lens_k, dim=2))
    ]
    return torch.cat(outs, dim=1), None


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


def _is_plain_sliding_window(kwargs) -> bool:
    """Whether the builder was called by masking_utils.create_sliding_window_causal_mask for a causal sliding window
    with nothing on top. That function passes local_size = config.sliding_window and a mask function made on the spot
    (and_masks(sliding_window_overlay, causal), which cannot be compared by identity); every overlay it can add (or /
    and mask functions, packed sequences, blocks) also turns allow_is_causal_skip off, which the caller checks.
    Chunked attention (create_chunked_causal_mask) passes local_size = config.attention_chunk_size: a config that has
    one is never taken for a sliding window, even if the two sizes differ, so that a chunked mask is never dropped."""
    config, local_size = kwargs.get("config"), kwargs.get("local_size")
    return (
        config is not None
        and local_size is not None
        and getattr(config, "sliding_window", None) == local_size
        and getattr(config, "attention_chunk_size", None) is None
        and getattr(config, "is_causal", True)
    )


def mask_function(*args, **kwargs):
    """transformers mask builder: None for a pure causal mask, or a causal sliding-window one (since 0.5: the
    attention function applies the window the model passes as sliding_window), without padding; else transformers'
    SDPA mask."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    plain_causal = (kwargs.get("mask_function", causal_mask_function) is causal_mask_function
                    and kwargs.get("local_size") is None)
    if (
        not args
        and kwargs.get("allow_is_causal_skip", True)
        and (plain_causal or _is_plain_sliding_window(kwargs))
        and q_length is not None
        and kv_length is not None
        and (q_length == 1 or q_length == kv_length)
        and _has_no_padding(kwargs.get("attention_mask"))
    ):
        return None
    return sdpa_mask(*args, **kwargs)

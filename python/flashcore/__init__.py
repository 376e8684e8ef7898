"""FlashCore: fused attention for NVIDIA Hopper (sm_90a), bound to PyTorch through the C ABI with ctypes.

Importing this package needs neither PyTorch, a GPU nor the native library. The torch ops (``attention``,
``sdpa``, ``attention_fwd``, ``quantize_fp8``, ...) are imported on first access; the library is loaded on first
call.

    import flashcore
    out = flashcore.attention(q, k, v, causal=True)          # (B, S, H, D), like flash_attn_func
    out = flashcore.attention(q, k, v, causal=True, window_size=(4095, 0), softcap=50.0, sinks=sinks)  # variants
    out = flashcore.sdpa(q, k, v, is_causal=True)            # (B, H, S, D), like F.scaled_dot_product_attention
    out = flashcore.varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k)  # packed, like flash_attn_varlen_func
    out = flashcore.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table)  # paged
    q8, qd = flashcore.quantize_fp8(q)                       # e4m3 + descale per (batch, KV head)
    out = flashcore.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)  # 8-bit, bf16 out (sm90)
    out = flashcore.attention(q, k, v, precision="fp8")      # 16-bit in, quantized by the library
    vt = flashcore.fp8_transpose_v(v8)                       # once for a K/V that many calls attend to
    out = flashcore.attention(q8, k8, vt, q_descale=qd, k_descale=kd, v_descale=vd, v_transposed=True)
"""

from __future__ import annotations

from ._lib import LIBRARY_ENV, Capabilities, __version__, is_available

_TORCH_EXPORTS = (
    "attention",
    "sdpa",
    "attention_fwd",
    "attention_with_kvcache",
    "attention_kvcache_fwd",
    "varlen_attention",
    "varlen_attention_fwd",
    "quantize_fp8",
    "fp8_transpose_v",
    "plan_attention",
    "AttentionPlan",
)

__all__ = [
    "__version__",
    "LIBRARY_ENV",
    "Capabilities",
    *_TORCH_EXPORTS,
    "capabilities",
    "is_available",
    "library_path",
    "library_version",
    "tune",
]


def capabilities() -> Capabilities:
    """Dtypes / head dims / archs compiled into the library and whether the current device is supported.

    Raises RuntimeError when the library cannot be loaded."""
    from . import _lib

    return _lib.load().capabilities()


def tune(**options) -> dict:
    """Run the autotuner (the ``flashcore tune`` program) and return the tuning table it wrote.

    Options: ``flashcore tune --help`` (python/flashcore/_tune.py maps them) and docs/tuning.md."""
    from ._tune import tune as _tune

    return _tune(**options)


def library_path() -> str:
    """Path (or soname) of the loaded native library; loads it if needed (RuntimeError when missing)."""
    from . import _lib

    return _lib.load().path


def library_version() -> str:
    """Version string reported by the loaded native library."""
    from . import _lib

    return _lib.load().version_string()


def __getattr__(name: str):
    # PEP 562: the torch-facing ops are imported (and the custom op registered) on first access only.
    if name in _TORCH_EXPORTS:
        try:
            from . import _ops
        except ModuleNotFoundError as exc:
            if exc.name != "torch":
                raise
            raise ImportError(f"flashcore.{name} needs PyTorch, which is not installed") from exc
        return getattr(_ops, name)
    raise AttributeError(f"module 'flashcore' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_TORCH_EXPORTS))

"""ctypes binding of the FlashCore C ABI (include/flashcore/flashcore.h).

This module needs neither PyTorch nor a GPU: importing it never fails. The library is located and loaded on
first use (:func:`load`); a missing library raises :class:`RuntimeError` naming every place that was tried.

The ctypes structures below mirror the C structs field for field (names, order and types); the test suite
checks them against the header and against a C compiler's ``sizeof``/``offsetof``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import os
import threading
from pathlib import Path
from typing import List, Optional, Tuple

LIBRARY_ENV = "FLASHCORE_LIBRARY"
LIBRARY_FILE = "libflashcore.so"

# The package version, and the version of the header these bindings mirror (FLASHCORE_VERSION_* of
# include/flashcore/flashcore.h, the single source: tests/test_abi.py holds this line to it). pyproject.toml and
# flashcore.__version__ read it from here. The loaded library must share the major.
__version__ = "0.9.0"
ABI_VERSION = tuple(int(part) for part in __version__.split("."))

# ---------------------------------------------------------------------------------------------------------------
# Enums (flashcore_status, flashcore_dtype). C enums are `int` on every ABI we target.

SUCCESS = 0
ERROR_NULL_POINTER = 1
ERROR_INVALID_SIZE = 2
ERROR_SIZE_OVERFLOW = 3
ERROR_INVALID_HEAD_RATIO = 4
ERROR_UNSUPPORTED_HEAD_DIM = 5
ERROR_UNSUPPORTED_DTYPE = 6
ERROR_MISALIGNED_POINTER = 7
ERROR_INVALID_STRIDE = 8
ERROR_OVERLAPPING_OUTPUT = 9
ERROR_NO_DEVICE = 10
ERROR_UNSUPPORTED_ARCH = 11
ERROR_INVALID_ARGUMENT = 12
ERROR_CUDA = 13
ERROR_INTERNAL = 14
ERROR_NCCL = 15

STATUS_NAMES = {
    SUCCESS: "FLASHCORE_SUCCESS",
    ERROR_NULL_POINTER: "FLASHCORE_ERROR_NULL_POINTER",
    ERROR_INVALID_SIZE: "FLASHCORE_ERROR_INVALID_SIZE",
    ERROR_SIZE_OVERFLOW: "FLASHCORE_ERROR_SIZE_OVERFLOW",
    ERROR_INVALID_HEAD_RATIO: "FLASHCORE_ERROR_INVALID_HEAD_RATIO",
    ERROR_UNSUPPORTED_HEAD_DIM: "FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM",
    ERROR_UNSUPPORTED_DTYPE: "FLASHCORE_ERROR_UNSUPPORTED_DTYPE",
    ERROR_MISALIGNED_POINTER: "FLASHCORE_ERROR_MISALIGNED_POINTER",
    ERROR_INVALID_STRIDE: "FLASHCORE_ERROR_INVALID_STRIDE",
    ERROR_OVERLAPPING_OUTPUT: "FLASHCORE_ERROR_OVERLAPPING_OUTPUT",
    ERROR_NO_DEVICE: "FLASHCORE_ERROR_NO_DEVICE",
    ERROR_UNSUPPORTED_ARCH: "FLASHCORE_ERROR_UNSUPPORTED_ARCH",
    ERROR_INVALID_ARGUMENT: "FLASHCORE_ERROR_INVALID_ARGUMENT",
    ERROR_CUDA: "FLASHCORE_ERROR_CUDA",
    ERROR_INTERNAL: "FLASHCORE_ERROR_INTERNAL",
    ERROR_NCCL: "FLASHCORE_ERROR_NCCL",
}

# Argument errors -> ValueError, a wrong dtype -> TypeError, everything else (device, CUDA, internal) -> RuntimeError.
_VALUE_ERROR_STATUSES = frozenset(
    {
        ERROR_NULL_POINTER,
        ERROR_INVALID_SIZE,
        ERROR_SIZE_OVERFLOW,
        ERROR_INVALID_HEAD_RATIO,
        ERROR_UNSUPPORTED_HEAD_DIM,
        ERROR_MISALIGNED_POINTER,
        ERROR_INVALID_STRIDE,
        ERROR_OVERLAPPING_OUTPUT,
        ERROR_INVALID_ARGUMENT,
    }
)
_TYPE_ERROR_STATUSES = frozenset({ERROR_UNSUPPORTED_DTYPE})

DTYPE_SAME = -1  # out_dtype only: O has the input dtype
DTYPE_FP16 = 0
DTYPE_BF16 = 1
DTYPE_FP32 = 2
DTYPE_FP8_E4M3 = 3
DTYPE_FP8_E5M2 = 4  # since 0.3: e5m2 Q, K, V (P stays e4m3)
DTYPE_INT8 = 5  # since 0.3: the key of the int8 Q K^T kernels precision=INT8 runs (not a call's dtype)

# flashcore_attention_params::precision (since 0.3): how a 16-bit call computes.
PRECISION_NATIVE = 0  # attention in the input dtype
PRECISION_FP8 = 1  # Q, K, V quantized to e4m3 in the workspace (one scale per batch and KV head), the 8-bit kernel
PRECISION_INT8 = 2  # since 0.3: Q (per token) and K (smoothed, per 128 keys) quantized to int8, Q K^T in int8, P V in 16 bits

# flashcore_attention_params::flags.
FLAG_V_TRANSPOSED = 1  # 8-bit calls: v holds V as flashcore_fp8_transpose_v wrote it (added in 0.3)
# (added in 0.9) an e4m3 KV cache under 16-bit Q: dtype is Q's and O's (FP16 / BF16), k and v hold float8_e4m3fn
# values scaled by k_descale / v_descale (float32 (batch, num_heads_kv) [NULL: 1]); q_descale stays NULL. sm90 only.
FLAG_KV_FP8_E4M3 = 2
# The first version whose library knows FLAG_KV_FP8_E4M3 (it added no params field: the version tells; a 0.8 library
# refuses the bit, "flags = 2 has bits this library does not know").
KV_FP8_VERSION = (0, 9)

# flashcore_dtype -> the name torch gives the dtype (torch.<name>).
DTYPE_NAMES = {
    DTYPE_FP16: "float16",
    DTYPE_BF16: "bfloat16",
    DTYPE_FP32: "float32",
    DTYPE_FP8_E4M3: "float8_e4m3fn",
    DTYPE_FP8_E5M2: "float8_e5m2",
    DTYPE_INT8: "int8",  # the kernels of precision=INT8 (not a call's dtype)
}

MAX_CAPS = 16  # FLASHCORE_MAX_CAPS
# The backward's functions (since 0.4): both present, or the library has no backward.
_BACKWARD_FUNCTIONS = frozenset({"flashcore_attention_backward", "flashcore_attention_backward_workspace_size"})
ATTENTION_PARAMS_V1_SIZE = 240  # FLASHCORE_ATTENTION_PARAMS_V1_SIZE: a 0.1 library's struct_size
ATTENTION_PARAMS_V2_SIZE = 448  # FLASHCORE_ATTENTION_PARAMS_V2_SIZE: a 0.2 library's struct_size
ATTENTION_PARAMS_V3_SIZE = 480  # FLASHCORE_ATTENTION_PARAMS_V3_SIZE: a 0.3 library's struct_size
ATTENTION_PARAMS_V4_SIZE = 648  # FLASHCORE_ATTENTION_PARAMS_V4_SIZE: a 0.4 library's struct_size
ATTENTION_PARAMS_V5_SIZE = 680  # FLASHCORE_ATTENTION_PARAMS_V5_SIZE: a 0.5 library's struct_size
ATTENTION_PARAMS_V6_SIZE = 688  # FLASHCORE_ATTENTION_PARAMS_V6_SIZE: a 0.6 library's struct_size
ATTENTION_PARAMS_V7_SIZE = 696  # FLASHCORE_ATTENTION_PARAMS_V7_SIZE: a 0.7 library's struct_size
CAPABILITIES_V1_SIZE = 216  # FLASHCORE_CAPABILITIES_V1_SIZE
# sizeof(flashcore_capabilities) of 0.2 to 0.6 libraries (everything up to device_backend; no header macro): what such
# a library accepts at most, since it refuses a struct_size larger than its own.
CAPABILITIES_V2_SIZE = 304

# ---------------------------------------------------------------------------------------------------------------
# Structs.


class TensorStridesStruct(ctypes.Structure):
    """flashcore_tensor_strides: element strides; `dim` must be 1."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("head", ctypes.c_int64),
        ("dim", ctypes.c_int64),
    ]


class AttentionParamsStruct(ctypes.Structure):
    """flashcore_attention_params (pointers are kept as c_void_p: plain integer device addresses)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),  # float*
        ("q_strides", TensorStridesStruct),
        ("k_strides", TensorStridesStruct),
        ("v_strides", TensorStridesStruct),
        ("o_strides", TensorStridesStruct),
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("num_heads_q", ctypes.c_int64),
        ("num_heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int),  # flashcore_dtype
        ("causal", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        # Since 0.2 (a 0.1 library is passed struct_size ATTENTION_PARAMS_V1_SIZE and never reads these).
        ("out_dtype", ctypes.c_int),  # flashcore_dtype; DTYPE_SAME
        ("reserved", ctypes.c_int32),
        ("lse_capacity", ctypes.c_int64),  # floats at lse; 0: not given
        ("workspace", ctypes.c_void_p),
        ("workspace_size", ctypes.c_uint64),
        ("kernel_config", ctypes.c_void_p),  # const char*; NULL: the library's choice
        ("seqused_k", ctypes.c_void_p),  # const int32_t* (device, batch entries); NULL: seqlen_k keys each
        # Serving: packed variable-length batches and paged KV caches (flashcore.h).
        ("cu_seqlens_q", ctypes.c_void_p),  # const int32_t* (device, batch + 1); NULL: dense Q/O
        ("cu_seqlens_k", ctypes.c_void_p),  # const int32_t* (device, batch + 1); NULL: dense K/V
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("block_table", ctypes.c_void_p),  # const int32_t* (device, batch x block_table_stride); NULL: no paging
        ("block_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("num_pages", ctypes.c_int64),
        ("num_splits", ctypes.c_int32),  # 0: the library's choice, 1: never split, n: at most n parts
        ("flags", ctypes.c_uint32),  # FLASHCORE_FLAG_* bits (flashcore.h)
        # Append new K/V rows to the cache in the same call (flashcore.h).
        ("k_new", ctypes.c_void_p),
        ("v_new", ctypes.c_void_p),
        ("k_new_strides", TensorStridesStruct),
        ("v_new_strides", TensorStridesStruct),
        ("seqlen_new", ctypes.c_int64),
        # Since 0.3 (a 0.2 library is passed struct_size ATTENTION_PARAMS_V2_SIZE and never reads these).
        # 8-bit attention: float32 device arrays (batch, num_heads_kv), contiguous; NULL means 1.
        ("q_descale", ctypes.c_void_p),  # const float*
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("precision", ctypes.c_int32),  # PRECISION_*
        ("reserved2", ctypes.c_int32),
        # Since 0.4: the backward pass (a 0.3 library is passed struct_size ATTENTION_PARAMS_V3_SIZE and never reads
        # these; the forward ignores them). dO and dQ have Q's shape, dK and dV K's; element strides, dim stride 1.
        ("dout", ctypes.c_void_p),  # const void*
        ("dq", ctypes.c_void_p),
        ("dk", ctypes.c_void_p),
        ("dv", ctypes.c_void_p),
        ("dout_strides", TensorStridesStruct),
        ("dq_strides", TensorStridesStruct),
        ("dk_strides", TensorStridesStruct),
        ("dv_strides", TensorStridesStruct),
        ("deterministic", ctypes.c_int32),  # 1: dQ's fp32 sums in a fixed order (bit-identical reruns)
        ("reserved3", ctypes.c_int32),
        # Since 0.5: the attention variants (a 0.4 library is passed struct_size ATTENTION_PARAMS_V4_SIZE and never
        # reads these; Library.set_variants refuses to set them for it). FlashAttention's semantics (flashcore.h).
        ("local", ctypes.c_int32),  # 1: sliding window [window_size_left, window_size_right] around i + Sk - Sq
        ("window_size_left", ctypes.c_int32),  # -1 (unbounded) or >= 0
        ("window_size_right", ctypes.c_int32),  # -1 (unbounded) or >= 0; not read with causal = 1
        ("softcap", ctypes.c_float),  # > 0: scores become softcap * tanh(score / softcap); 0: none
        ("sinks", ctypes.c_void_p),  # const float* (device, num_heads_q): per-head logit in the softmax denominator
        ("attention_chunk", ctypes.c_int32),  # > 0: keys of the query's own chunk only; 0: none
        ("reserved4", ctypes.c_int32),
        # Since 0.6: the variants' backward (a 0.5 library is passed struct_size ATTENTION_PARAMS_V5_SIZE and never
        # reads this; Library.set_dsinks refuses to set it for it, and Library.backward refuses a backward with a
        # variant, which a 0.5 library's backward does not take). The backward takes local, window_size_*, softcap and
        # sinks of the forward it differentiates.
        ("dsinks", ctypes.c_void_p),  # float* (device, num_heads_q): written with dL/dsinks; NULL: not computed
        # Since 0.7: V's and O's head dim where it differs from Q's and K's (a 0.6 library is passed struct_size
        # ATTENTION_PARAMS_V6_SIZE and never reads it; Library.set_head_dim_v refuses to set it for it). 0: head_dim.
        ("head_dim_v", ctypes.c_int64),
        # Since 0.8: FlashAttention's serving arguments of flash_attn_with_kvcache (a 0.7 library is passed struct_size
        # ATTENTION_PARAMS_V7_SIZE and never reads these; Library.set_kvcache_serving refuses to set them for it).
        ("kv_batch_idx", ctypes.c_void_p),  # const int32_t* (device, batch): cache_batch_idx; NULL: entry b
        ("kv_batch_size", ctypes.c_int64),  # K's / V's batch extent (dense) or block_table's rows (paged) with it
        ("leftpad_k", ctypes.c_void_p),  # const int32_t* (device, batch): cache_leftpad; NULL: 0 (dense caches only)
        ("cu_seqlens_k_new", ctypes.c_void_p),  # const int32_t* (device, batch + 1): packed k_new / v_new rows
        ("total_k_new", ctypes.c_int64),  # rows of the packed k_new / v_new; > 0 with cu_seqlens_k_new
        ("seqused_q", ctypes.c_void_p),  # const int32_t* (device, batch) with cu_seqlens_q: queries used per sequence
        # Rotary embedding on append (FlashAttention's rotary_cos / rotary_sin; flashcore.h).
        ("rotary_cos", ctypes.c_void_p),  # (rotary_seqlen, rotary_dim / 2), q's dtype, contiguous; NULL: none
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_seqlen", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int32),  # a multiple of 16, at most head_dim
        ("rotary_interleaved", ctypes.c_int32),  # 1: GPT-J pairs (2i, 2i + 1); 0: GPT-NeoX halves
        ("rotary_seqlens", ctypes.c_void_p),  # const int32_t* (device, batch): first rotated position; NULL: seqused_k
    ]


class CapabilitiesStruct(ctypes.Structure):
    """flashcore_capabilities."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_dtypes", ctypes.c_int32),
        ("dtypes", ctypes.c_int * MAX_CAPS),  # flashcore_dtype[]
        ("num_head_dims", ctypes.c_int32),
        ("head_dims", ctypes.c_int32 * MAX_CAPS),
        ("num_archs", ctypes.c_int32),
        ("archs", ctypes.c_int32 * MAX_CAPS),
        ("device_arch", ctypes.c_int32),
        ("device_supported", ctypes.c_int32),
        # Since 0.2 (a 0.1 library fills only the fields above, CAPABILITIES_V1_SIZE bytes).
        ("params_struct_size", ctypes.c_uint32),
        ("num_out_dtypes", ctypes.c_int32),
        ("out_dtypes", ctypes.c_int * MAX_CAPS),  # flashcore_dtype[]
        ("device_backend", ctypes.c_char * 16),
        # Since 0.7 (a 0.2 to 0.6 library fills only the fields above, CAPABILITIES_V2_SIZE bytes).
        ("num_head_dim_pairs", ctypes.c_int32),
        ("head_dim_pairs", (ctypes.c_int32 * 2) * MAX_CAPS),  # (head_dim, head_dim_v) pairs, head_dim_v != head_dim
    ]


class LseStridesStruct(ctypes.Structure):
    """flashcore_lse_strides: element strides of a (batch, num_heads, seqlen) float32 LSE."""

    _fields_ = [
        ("batch", ctypes.c_int64),
        ("head", ctypes.c_int64),
        ("seq", ctypes.c_int64),
    ]


class MergeParamsStruct(ctypes.Structure):
    """flashcore_merge_params (since 0.2): fold one partial (O, LSE) into a float32 state."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("batch", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("num_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("o_part", ctypes.c_void_p),
        ("o_part_strides", TensorStridesStruct),
        ("part_dtype", ctypes.c_int),  # flashcore_dtype
        ("lse_part", ctypes.c_void_p),  # const float*
        ("lse_part_strides", LseStridesStruct),
        ("o_acc", ctypes.c_void_p),  # float*
        ("o_acc_strides", TensorStridesStruct),
        ("lse_acc", ctypes.c_void_p),  # float*
        ("lse_acc_strides", LseStridesStruct),
        ("init", ctypes.c_int32),
        ("out_dtype", ctypes.c_int),  # flashcore_dtype
        ("o_out", ctypes.c_void_p),
        ("o_out_strides", TensorStridesStruct),
    ]


RING_ZIGZAG = 0  # flashcore_ring_layout (include/flashcore/ring.h)
RING_CONTIGUOUS = 1
RING_SERIALIZE = 1  # flashcore_ring_params::flags


class RingParamsStruct(ctypes.Structure):
    """flashcore_ring_params (include/flashcore/ring.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("world_size", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("layout", ctypes.c_int),  # flashcore_ring_layout
        ("seqlen_global", ctypes.c_int64),
        ("nccl_comm", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_size", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
    ]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the loaded library was compiled with, and whether the current device can run it."""

    dtypes: Tuple[str, ...]  # torch dtype names, e.g. ("float16", "bfloat16")
    head_dims: Tuple[int, ...]
    archs: Tuple[int, ...]  # compute capabilities, e.g. (90,)
    device_arch: int  # compute capability of the current device, 0 if none
    device_supported: bool
    out_dtypes: Tuple[str, ...] = ()  # dtypes O can be written in (a 0.1 library: none reported)
    device_backend: str = ""  # backend serving the current device, e.g. "sm90"; "" if none
    params_struct_size: int = 0  # the library's sizeof(flashcore_attention_params)
    # (head_dim, head_dim_v) pairs compiled in whose V (and O) head dim differs from Q's and K's, e.g. ((192, 128),);
    # () for a library older than 0.7
    head_dim_pairs: Tuple[Tuple[int, int], ...] = ()


# ---------------------------------------------------------------------------------------------------------------
# Errors.


def status_name(status: int) -> str:
    return STATUS_NAMES.get(status, f"unknown status {status}")


def exception_for_status(status: int, message: str) -> Exception:
    """The exception a failing status maps to: ValueError (arguments), TypeError (dtype), RuntimeError (else)."""
    text = f"FlashCore: {message} [{status_name(status)}]"
    if status in _TYPE_ERROR_STATUSES:
        return TypeError(text)
    if status in _VALUE_ERROR_STATUSES:
        return ValueError(text)
    return RuntimeError(text)


# ---------------------------------------------------------------------------------------------------------------
# Lookup.


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def _repo_root() -> Optional[Path]:
    """The source checkout this package lives in (python/flashcore/ -> repo), or None when installed elsewhere."""
    root = _package_dir().parents[1]
    return root if (root / "include" / "flashcore" / "flashcore.h").is_file() else None


def candidates() -> List[Tuple[str, str]]:
    """Where the library is looked for, in order, as (description, path or soname).

    1. $FLASHCORE_LIBRARY, when set: the only candidate (an explicit choice never silently falls through).
    2. A copy inside the package: flashcore/lib/libflashcore.so.
    3. <repo>/build/lib/libflashcore.so, when the package is used from a source checkout.
    4. The dynamic loader's search (ctypes.util.find_library("flashcore"), LD_LIBRARY_PATH, ld.so.cache).
    """
    env = os.environ.get(LIBRARY_ENV)
    if env:
        return [(f"${LIBRARY_ENV}", os.path.abspath(os.path.expanduser(env)))]
    found = [("package copy", str(_package_dir() / "lib" / LIBRARY_FILE))]
    root = _repo_root()
    if root is not None:
        found.append(("repository build", str(root / "build" / "lib" / LIBRARY_FILE)))
    found.append(("dynamic loader search", ctypes.util.find_library("flashcore") or LIBRARY_FILE))
    return found


def _declare(cdll: ctypes.CDLL) -> frozenset:
    """Set the signatures; returns the names of the optional (since 0.2) functions the library has."""
    params_p = ctypes.POINTER(AttentionParamsStruct)
    caps_p = ctypes.POINTER(CapabilitiesStruct)
    c_int_p = ctypes.POINTER(ctypes.c_int)
    required = {
        "flashcore_attention_params_init": (None, [params_p]),
        "flashcore_attention_params_set_contiguous": (ctypes.c_int, [params_p, ctypes.c_int]),
        "flashcore_attention_validate": (ctypes.c_int, [params_p]),
        "flashcore_attention_forward": (ctypes.c_int, [params_p, ctypes.c_void_p]),
        "flashcore_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "flashcore_last_error": (ctypes.c_char_p, []),
        "flashcore_version": (None, [c_int_p, c_int_p, c_int_p]),
        "flashcore_version_string": (ctypes.c_char_p, []),
        "flashcore_get_capabilities": (ctypes.c_int, [caps_p]),
    }
    optional = {
        "flashcore_attention_params_init_sized": (None, [params_p, ctypes.c_uint32]),
        "flashcore_capabilities_init": (None, [caps_p]),
        "flashcore_attention_workspace_size": (ctypes.c_int, [params_p, ctypes.POINTER(ctypes.c_uint64)]),
        "flashcore_list_kernel_configs": (
            ctypes.c_int,
            [ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int32,
             ctypes.POINTER(ctypes.c_int32)],
        ),
        "flashcore_attention_selected_config": (ctypes.c_int, [params_p, ctypes.c_char_p, ctypes.c_uint64]),
        "flashcore_stream_capture_id": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]),
        "flashcore_fp8_transposed_v_size": (ctypes.c_int, [params_p, ctypes.POINTER(ctypes.c_uint64)]),
        "flashcore_fp8_transpose_v": (ctypes.c_int, [params_p, ctypes.c_void_p, ctypes.c_void_p]),
        "flashcore_merge_params_init": (None, [ctypes.POINTER(MergeParamsStruct)]),
        "flashcore_attention_merge": (ctypes.c_int, [ctypes.POINTER(MergeParamsStruct), ctypes.c_void_p]),
        "flashcore_attention_plan": (ctypes.c_int, [params_p, ctypes.POINTER(ctypes.c_void_p)]),
        "flashcore_plan_workspace_size": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]),
        "flashcore_plan_config": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64]),
        "flashcore_attention_run": (ctypes.c_int, [ctypes.c_void_p, params_p, ctypes.c_void_p]),
        "flashcore_plan_destroy": (None, [ctypes.c_void_p]),
        "flashcore_ring_params_init": (None, [ctypes.POINTER(RingParamsStruct)]),
        "flashcore_ring_shard": (
            ctypes.c_int,
            [ctypes.POINTER(RingParamsStruct), ctypes.c_int32] + [ctypes.POINTER(ctypes.c_int64)] * 4,
        ),
        # Since 0.4: the backward pass.
        "flashcore_attention_backward": (ctypes.c_int, [params_p, ctypes.c_void_p]),
        "flashcore_attention_backward_workspace_size": (ctypes.c_int, [params_p, ctypes.POINTER(ctypes.c_uint64)]),
    }
    present = set()
    for name, (restype, argtypes) in {**required, **optional}.items():
        if name in optional and not hasattr(cdll, name):
            continue
        fn = getattr(cdll, name)  # AttributeError names a missing required symbol
        fn.restype = restype
        fn.argtypes = argtypes
        if name in optional:
            present.add(name)
    return frozenset(present)


class Library:
    """A loaded libflashcore.so with checked calls."""

    def __init__(self, path: str):
        self.path = path
        self._cdll = ctypes.CDLL(path)
        self._optional = _declare(self._cdll)
        self.version = self._version()
        if self.version[0] != ABI_VERSION[0]:
            raise RuntimeError(
                f"FlashCore: {path} has ABI version {self.version_string()}, these bindings were written for "
                f"{'.'.join(map(str, ABI_VERSION))} (the major versions must match)"
            )
        # The struct_size to pass: the library reports its own (capabilities.params_struct_size, since 0.2). A
        # library as new as this mirror or newer accepts the mirror's size; a 0.7 (0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
        # library takes the 0.7 (0.6, ...) layout, which is the mirror's prefix: it never reads the fields added later,
        # and the bindings never set them for it (has_params_field, set_variants, set_dsinks, set_head_dim_v,
        # set_kvcache_serving).
        mirror = ctypes.sizeof(AttentionParamsStruct)
        library_size = self._raw_capabilities().params_struct_size or ATTENTION_PARAMS_V1_SIZE
        older = (ATTENTION_PARAMS_V7_SIZE, ATTENTION_PARAMS_V6_SIZE, ATTENTION_PARAMS_V5_SIZE, ATTENTION_PARAMS_V4_SIZE,
                 ATTENTION_PARAMS_V3_SIZE, ATTENTION_PARAMS_V2_SIZE, ATTENTION_PARAMS_V1_SIZE)
        if library_size >= mirror:
            self.params_struct_size = mirror
        elif library_size in older:
            self.params_struct_size = library_size
        else:
            raise RuntimeError(
                f"FlashCore: ABI mismatch with {path}: it reports sizeof(flashcore_attention_params) = "
                f"{library_size}, neither the 0.1 ({ATTENTION_PARAMS_V1_SIZE}), the 0.2 ({ATTENTION_PARAMS_V2_SIZE}), "
                f"the 0.3 ({ATTENTION_PARAMS_V3_SIZE}), the 0.4 ({ATTENTION_PARAMS_V4_SIZE}), the 0.5 "
                f"({ATTENTION_PARAMS_V5_SIZE}), the 0.6 ({ATTENTION_PARAMS_V6_SIZE}) nor the 0.7 layout "
                f"({ATTENTION_PARAMS_V7_SIZE}) nor at least this mirror's {mirror}; rebuild the library or update the "
                f"bindings"
            )
        probe = self.new_params()
        strides = (probe.q_strides, probe.k_strides, probe.v_strides, probe.o_strides)
        if any(s.dim != 1 for s in strides):
            raise RuntimeError(
                f"FlashCore: ABI mismatch with {path}: flashcore_attention_params_init set dim strides "
                f"{[s.dim for s in strides]} (expected 1); rebuild the library or update the bindings"
            )
        self._compiled: Optional[Tuple[Tuple[str, ...], Tuple[int, ...]]] = None
        self._out_dtypes: Optional[Tuple[str, ...]] = None
        self._head_dim_pairs: Optional[Tuple[Tuple[int, int], ...]] = None

    # -- plain calls ----------------------------------------------------------------------------------------------

    def _version(self) -> Tuple[int, int, int]:
        major, minor, patch = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self._cdll.flashcore_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
        return (major.value, minor.value, patch.value)

    def version_string(self) -> str:
        return (self._cdll.flashcore_version_string() or b"").decode("utf-8", "replace")

    def status_string(self, status: int) -> str:
        return (self._cdll.flashcore_status_string(status) or b"").decode("utf-8", "replace")

    def last_error(self) -> str:
        return (self._cdll.flashcore_last_error() or b"").decode("utf-8", "replace")

    def check(self, status: int, what: str) -> None:
        """Raise the mapped exception for a failing status, with flashcore_last_error()'s message."""
        if status == SUCCESS:
            return
        detail = self.last_error() or self.status_string(status)
        raise exception_for_status(status, f"{what} failed: {detail}")

    # -- capabilities ---------------------------------------------------------------------------------------------

    def _raw_capabilities(self) -> CapabilitiesStruct:
        """The C struct, from a 0.7+ library in full. An older library refuses a struct_size larger than its own:
        a 0.2 to 0.6 library then fills the CAPABILITIES_V2_SIZE bytes it knows, a 0.1 library the 0.1 part; the
        fields past them stay zero (no head dim pairs)."""
        sizes = [ctypes.sizeof(CapabilitiesStruct), CAPABILITIES_V2_SIZE]
        if "flashcore_capabilities_init" not in self._optional:  # a 0.1 library
            sizes.append(CAPABILITIES_V1_SIZE)
        for size in sizes:
            caps = CapabilitiesStruct()
            caps.struct_size = size
            status = self._cdll.flashcore_get_capabilities(ctypes.byref(caps))
            if status != ERROR_INVALID_ARGUMENT:
                break
        self.check(status, "flashcore_get_capabilities")
        return caps

    def capabilities(self) -> Capabilities:
        caps = self._raw_capabilities()

        def first(array, count) -> list:
            return [int(array[i]) for i in range(max(0, min(int(count), MAX_CAPS)))]

        def names(array, count) -> Tuple[str, ...]:
            return tuple(DTYPE_NAMES.get(d, f"flashcore_dtype({d})") for d in first(array, count))

        return Capabilities(
            dtypes=names(caps.dtypes, caps.num_dtypes),
            head_dims=tuple(first(caps.head_dims, caps.num_head_dims)),
            archs=tuple(first(caps.archs, caps.num_archs)),
            device_arch=int(caps.device_arch),
            device_supported=bool(caps.device_supported),
            out_dtypes=names(caps.out_dtypes, caps.num_out_dtypes),
            device_backend=caps.device_backend.decode("utf-8", "replace"),
            params_struct_size=int(caps.params_struct_size),
            head_dim_pairs=tuple((int(caps.head_dim_pairs[i][0]), int(caps.head_dim_pairs[i][1]))
                                 for i in range(max(0, min(int(caps.num_head_dim_pairs), MAX_CAPS)))),
        )

    def compiled(self) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
        """(dtype names, head dims) compiled in; fixed for the library's lifetime, so queried once."""
        if self._compiled is None:
            caps = self.capabilities()
            self._compiled = (caps.dtypes, caps.head_dims)
        return self._compiled

    def compiled_head_dim_pairs(self) -> Tuple[Tuple[int, int], ...]:
        """The (head_dim, head_dim_v) pairs compiled in whose V (and O) head dim differs from Q's and K's, e.g.
        ((192, 128),) (() for a library older than 0.7); fixed for the library's lifetime, so queried once. The pairs
        with head_dim_v == head_dim are compiled() head dims."""
        if self._head_dim_pairs is None:
            self._head_dim_pairs = self.capabilities().head_dim_pairs
        return self._head_dim_pairs

    def compiled_out_dtypes(self) -> Tuple[str, ...]:
        """Dtype names O can be written in besides the input dtype (() for a 0.1 library); queried once."""
        if self._out_dtypes is None:
            self._out_dtypes = self.capabilities().out_dtypes
        return self._out_dtypes

    def has_params_field(self, name: str) -> bool:
        """Whether the loaded library reads the params field `name`: a 0.1 library knows none of the fields since
        0.2 (out_dtype lies in the 0.1 struct's tail padding, which it ignores), a 0.2 library none of those since 0.3
        (descales, precision), a 0.3 library none of those since 0.4 (the backward's), a 0.4 library none of those
        since 0.5 (the variants: local, window sizes, softcap, sinks, attention_chunk), a 0.5 library none of those
        since 0.6 (dsinks), a 0.6 library none of those since 0.7 (head_dim_v), a 0.7 library none of those since 0.8
        (kv_batch_idx, kv_batch_size, leftpad_k, cu_seqlens_k_new, total_k_new, seqused_q, rotary_cos, rotary_sin,
        rotary_seqlen, rotary_dim, rotary_interleaved, rotary_seqlens)."""
        known = {
            ATTENTION_PARAMS_V1_SIZE: AttentionParamsStruct.out_dtype.offset,
        }.get(self.params_struct_size, self.params_struct_size)
        field = getattr(AttentionParamsStruct, name)
        return field.offset + field.size <= known

    # -- attention ------------------------------------------------------------------------------------------------

    def new_params(self) -> AttentionParamsStruct:
        """An initialised params struct whose struct_size the loaded library accepts (see params_struct_size)."""
        params = AttentionParamsStruct()
        if "flashcore_attention_params_init_sized" in self._optional:
            self._cdll.flashcore_attention_params_init_sized(ctypes.byref(params), self.params_struct_size)
        else:  # a 0.1 library: its init writes the 0.1 layout, the mirror's prefix
            self._cdll.flashcore_attention_params_init(ctypes.byref(params))
            params.out_dtype = DTYPE_SAME
        return params

    def workspace_size(self, params: AttentionParamsStruct) -> int:
        """Bytes of device workspace forward needs for `params` on the current device (0 for a 0.1 library)."""
        if "flashcore_attention_workspace_size" not in self._optional:
            return 0
        size = ctypes.c_uint64(0)
        status = self._cdll.flashcore_attention_workspace_size(ctypes.byref(params), ctypes.byref(size))
        self.check(status, "flashcore_attention_workspace_size")
        return int(size.value)

    def kernel_configs(self, dtype: int, head_dim: int, causal: bool) -> Tuple[str, ...]:
        """Kernel-config names for (dtype, head_dim, causal) on the current device, default first (() for 0.1)."""
        if "flashcore_list_kernel_configs" not in self._optional:
            return ()
        fn = self._cdll.flashcore_list_kernel_configs
        count = ctypes.c_int32(0)
        self.check(fn(dtype, head_dim, int(bool(causal)), None, 0, ctypes.byref(count)), "flashcore_list_kernel_configs")
        names = (ctypes.c_char_p * max(1, count.value))()
        capacity = count.value
        self.check(fn(dtype, head_dim, int(bool(causal)), names, capacity, ctypes.byref(count)),
                   "flashcore_list_kernel_configs")
        return tuple((names[i] or b"").decode("utf-8", "replace") for i in range(min(capacity, count.value)))

    def selected_config(self, params: AttentionParamsStruct) -> Optional[str]:
        """The kernel config forward would run for `params` (the tuned choice, the default, or params'
        kernel_config); None when the library predates flashcore_attention_selected_config."""
        if "flashcore_attention_selected_config" not in self._optional:
            return None
        buf = ctypes.create_string_buffer(128)
        status = self._cdll.flashcore_attention_selected_config(ctypes.byref(params), buf, len(buf))
        self.check(status, "flashcore_attention_selected_config")
        return buf.value.decode("utf-8", "replace")

    def stream_capture_id(self, stream: int) -> int:
        """The id of the CUDA-graph capture `stream` (a cudaStream_t as an integer) is part of; 0 when it is not
        capturing, and always 0 with a library that predates flashcore_stream_capture_id."""
        if "flashcore_stream_capture_id" not in self._optional:
            return 0
        capture_id = ctypes.c_uint64(0)
        status = self._cdll.flashcore_stream_capture_id(ctypes.c_void_p(stream or None), ctypes.byref(capture_id))
        self.check(status, "flashcore_stream_capture_id")
        return int(capture_id.value)

    def fp8_transposed_v_size(self, params: AttentionParamsStruct) -> int:
        """Bytes of the transposed 8-bit V for an 8-bit call's params (flashcore_fp8_transposed_v_size)."""
        self._require("flashcore_fp8_transposed_v_size")
        size = ctypes.c_uint64(0)
        status = self._cdll.flashcore_fp8_transposed_v_size(ctypes.byref(params), ctypes.byref(size))
        self.check(status, "flashcore_fp8_transposed_v_size")
        return int(size.value)

    def fp8_transpose_v(self, params: AttentionParamsStruct, vt: int, stream: int) -> None:
        """Write params' 8-bit V, transposed, to device address vt on `stream` (flashcore_fp8_transpose_v); a call
        with params.v = vt and params.flags |= FLAG_V_TRANSPOSED then reads it without transposing."""
        self._require("flashcore_fp8_transpose_v")
        status = self._cdll.flashcore_fp8_transpose_v(ctypes.byref(params), ctypes.c_void_p(vt),
                                                      ctypes.c_void_p(stream or None))
        self.check(status, "flashcore_fp8_transpose_v")

    def validate(self, params: AttentionParamsStruct) -> None:
        self.check(self._cdll.flashcore_attention_validate(ctypes.byref(params)), "flashcore_attention_validate")

    def forward(self, params: AttentionParamsStruct, stream: int) -> None:
        """Enqueue the forward pass on `stream` (a cudaStream_t as an integer; 0 is the legacy default stream)."""
        status = self._cdll.flashcore_attention_forward(ctypes.byref(params), ctypes.c_void_p(stream or None))
        self.check(status, "flashcore_attention_forward")

    # -- a head dim of V's own (since 0.7) --------------------------------------------------------------------------

    def has_head_dim_v(self) -> bool:
        """Whether the loaded library reads head_dim_v (0.7 or newer): V and O with a last dimension of their own."""
        return self.has_params_field("head_dim_v")

    def set_head_dim_v(self, params: AttentionParamsStruct, head_dim_v: int) -> AttentionParamsStruct:
        """Set params.head_dim_v, V's and O's last dimension, for a call whose V has a head dim other than Q's and
        K's (params.head_dim, set before). A head_dim_v equal to head_dim leaves the field untouched (0 means
        head_dim, for any library). A library older than 0.7 cannot read it: RuntimeError naming the version needed,
        before any call, rather than a call that reads V and writes O with head_dim columns."""
        head_dim_v = int(head_dim_v)
        if head_dim_v == params.head_dim:
            return params
        if not self.has_head_dim_v():
            raise RuntimeError(
                f"FlashCore: v's head dim ({head_dim_v}) differs from q's and k's ({params.head_dim}), but {self.path} "
                f"(version {self.version_string()}, {self.params_struct_size}-byte flashcore_attention_params) "
                f"predates head_dim_v: a 0.7 library or newer is needed (older ones take one head dim for q, k and v)"
            )
        params.head_dim_v = head_dim_v
        return params

    # -- FlashAttention's serving arguments (since 0.8) ----------------------------------------------------------------

    def has_kvcache_serving(self) -> bool:
        """Whether the loaded library reads the 0.8 serving fields: kv_batch_idx / kv_batch_size (cache_batch_idx),
        leftpad_k (cache_leftpad), cu_seqlens_k_new / total_k_new (packed appends), seqused_q and the rotary fields
        (rotary_cos, rotary_sin, rotary_seqlen, rotary_dim, rotary_interleaved, rotary_seqlens)."""
        return self.has_params_field("rotary_seqlens")

    # The C fields of 0.8 and the FlashAttention argument each serves (what a refusal names).
    KVCACHE_SERVING_ARGUMENTS = {"kv_batch_idx": "cache_batch_idx", "leftpad_k": "cache_leftpad",
                                 "cu_seqlens_k_new": "cu_seqlens_k_new", "seqused_q": "seqused_q",
                                 "rotary_cos": "rotary_cos", "rotary_seqlens": "rotary_seqlens"}

    def set_kvcache_serving(self, params: AttentionParamsStruct, *, kv_batch_idx: int = 0, kv_batch_size: int = 0,
                            leftpad_k: int = 0, cu_seqlens_k_new: int = 0, total_k_new: int = 0,
                            seqused_q: int = 0, rotary_cos: int = 0, rotary_sin: int = 0, rotary_seqlen: int = 0,
                            rotary_dim: int = 0, rotary_interleaved: bool = False,
                            rotary_seqlens: int = 0) -> AttentionParamsStruct:
        """Set the 0.8 serving fields of `params`: kv_batch_idx (the device address of int32 (batch,) cache slots,
        FlashAttention's cache_batch_idx) with kv_batch_size (the cache's batch extent, or block_table's rows),
        leftpad_k (int32 (batch,), cache_leftpad), cu_seqlens_k_new (int32 (batch + 1,)) with total_k_new (rows of the
        packed k_new / v_new), seqused_q (int32 (batch,), with cu_seqlens_q: the query rows used per sequence), and
        the rotary embedding of an append: rotary_cos / rotary_sin (the addresses of (rotary_seqlen, rotary_dim / 2)
        tables in the call's dtype, contiguous; both or neither) with rotary_seqlen, rotary_dim, rotary_interleaved
        (True: GPT-J pairs, False: GPT-NeoX halves) and rotary_seqlens (int32 (batch,) first positions; 0: seqused_k).
        Addresses of 0 leave their fields untouched (for any library). A library older than 0.8 cannot read them:
        RuntimeError naming the argument and the version needed, before any call, rather than a call that reads
        another sequence's cache, the padding, the packed rows as (batch, seqlen_new) ones, computes query rows past
        seqused_q or attends with unrotated queries and keys."""
        if bool(rotary_cos) != bool(rotary_sin):
            raise ValueError("FlashCore: rotary_cos and rotary_sin go together: pass both or neither")
        if rotary_seqlens and not rotary_cos:
            raise ValueError("FlashCore: rotary_seqlens is set without rotary_cos / rotary_sin")
        wanted = [name for name, address in (("kv_batch_idx", kv_batch_idx), ("leftpad_k", leftpad_k),
                                             ("cu_seqlens_k_new", cu_seqlens_k_new), ("seqused_q", seqused_q),
                                             ("rotary_cos", rotary_cos), ("rotary_seqlens", rotary_seqlens))
                  if address]
        if not wanted:
            return params
        if not self.has_kvcache_serving():
            name = wanted[0]
            raise RuntimeError(
                f"FlashCore: {self.KVCACHE_SERVING_ARGUMENTS[name]} ({name}) is set, but {self.path} (version "
                f"{self.version_string()}, {self.params_struct_size}-byte flashcore_attention_params) predates it: a "
                f"0.8 library or newer is needed"
            )
        if kv_batch_idx:
            params.kv_batch_idx = kv_batch_idx
            params.kv_batch_size = int(kv_batch_size)
        if leftpad_k:
            params.leftpad_k = leftpad_k
        if cu_seqlens_k_new:
            params.cu_seqlens_k_new = cu_seqlens_k_new
            params.total_k_new = int(total_k_new)
        if seqused_q:
            params.seqused_q = seqused_q
        if rotary_cos:
            params.rotary_cos, params.rotary_sin = rotary_cos, rotary_sin
            params.rotary_seqlen = int(rotary_seqlen)
            params.rotary_dim = int(rotary_dim)
            params.rotary_interleaved = 1 if rotary_interleaved else 0
            if rotary_seqlens:
                params.rotary_seqlens = rotary_seqlens
        return params

    # -- an e4m3 KV cache under 16-bit Q (since 0.9) -----------------------------------------------------------------

    def has_kv_fp8(self) -> bool:
        """Whether the loaded library takes FLAG_KV_FP8_E4M3 (0.9 or newer): k and v (a KV cache) in float8_e4m3fn
        with float32 (batch, num_heads_kv) k_descale / v_descale under 16-bit q. The flag added no params field, so
        the library's version tells (with the 0.8 layout it needs for the cache's serving fields)."""
        return tuple(self.version[:2]) >= KV_FP8_VERSION and self.has_kvcache_serving()

    def set_kv_fp8(self, params: AttentionParamsStruct, *, k_descale: int = 0, v_descale: int = 0
                   ) -> AttentionParamsStruct:
        """Mark `params` as a call on an e4m3 KV cache (params.flags |= FLAG_KV_FP8_E4M3; params.dtype stays q's
        16-bit dtype) and set k_descale / v_descale, the device addresses of contiguous float32 (batch, num_heads_kv)
        factors (0: NULL, a factor of 1). A library older than 0.9 does not know the flag: RuntimeError naming its
        version and the one needed, before any call, rather than the library's refusal of an unknown flag bit."""
        if not self.has_kv_fp8():
            raise RuntimeError(
                f"FlashCore: an e4m3 KV cache (float8_e4m3fn k_cache / v_cache under float16 / bfloat16 q, "
                f"FLASHCORE_FLAG_KV_FP8_E4M3) needs a {'.'.join(map(str, KV_FP8_VERSION))} library or newer; "
                f"{self.path} is version {self.version_string()}"
            )
        params.flags |= FLAG_KV_FP8_E4M3
        if k_descale:
            params.k_descale = k_descale
        if v_descale:
            params.v_descale = v_descale
        return params

    # -- attention variants (since 0.5) ----------------------------------------------------------------------------

    def has_variants(self) -> bool:
        """Whether the loaded library reads the variant fields (0.5 or newer): window, softcap, sinks, chunk."""
        return self.has_params_field("reserved4")

    def set_variants(self, params: AttentionParamsStruct, *, causal: bool, window_size: Tuple[int, int] = (-1, -1),
                     softcap: float = 0.0, sinks: int = 0, attention_chunk: int = 0) -> AttentionParamsStruct:
        """Set the variant fields of `params` (FlashAttention's arguments: window_size (left, right) with -1 for an
        unbounded side, softcap 0 for none, sinks the device address of float32 (num_heads_q,) logits or 0,
        attention_chunk 0 for none). `causal` is the call's flag: with it, the window's right side is 0 and a window
        (-1, right) is plain causal attention, which needs no window field. A call that sets nothing leaves the
        fields (of any library) untouched; one that sets a variant a library older than 0.5 cannot read raises
        RuntimeError naming it, rather than running without it."""
        left, right = (int(x) for x in window_size)
        # FlashAttention's rule (and the C ABI's): causal fixes the right bound at 0, so only a left bound makes
        # a window; without causal either bound does.
        local = left != -1 or (not causal and right != -1)
        wanted = [name for name, used in (("window_size", local), ("softcap", softcap != 0.0), ("sinks", bool(sinks)),
                                          ("attention_chunk", attention_chunk != 0)) if used]
        if not wanted:
            return params
        if not self.has_variants():
            raise RuntimeError(
                f"FlashCore: {wanted[0]} is set, but {self.path} (version {self.version_string()}, "
                f"{self.params_struct_size}-byte flashcore_attention_params) predates the attention variants "
                f"(window_size, softcap, sinks, attention_chunk): a 0.5 library or newer is needed"
            )
        params.local = 1 if local else 0
        params.window_size_left = left if local else 0
        params.window_size_right = right if local else 0
        params.softcap = float(softcap)
        params.sinks = sinks or None
        params.attention_chunk = int(attention_chunk)
        return params

    # -- backward (since 0.4) ----------------------------------------------------------------------------------------

    def has_backward(self) -> bool:
        """Whether the loaded library has the backward pass (flashcore_attention_backward and its workspace query, and
        a params struct with the backward's fields)."""
        return (_BACKWARD_FUNCTIONS <= self._optional) and self.has_params_field("reserved3")

    def _require_backward(self, name: str) -> None:
        self._require(name)
        if not self.has_params_field("reserved3"):
            raise RuntimeError(f"FlashCore: {self.path} (version {self.version_string()}) exports {name} but its "
                               f"flashcore_attention_params ({self.params_struct_size} bytes) has no backward fields; "
                               "a 0.4 library or newer is needed")

    # -- the variants' backward (since 0.6) -----------------------------------------------------------------------

    def has_variant_backward(self) -> bool:
        """Whether the loaded library's backward takes the attention variants (0.6 or newer: local, window sizes,
        softcap and sinks in flashcore_attention_backward, and dsinks, the sinks' gradient)."""
        return self.has_backward() and self.has_params_field("dsinks")

    def set_dsinks(self, params: AttentionParamsStruct, dsinks: int) -> AttentionParamsStruct:
        """Set params.dsinks to the device address of a float32 (num_heads_q,) buffer the backward writes dL/dsinks
        into (0: not computed, the field left untouched, as for any library). A library older than 0.6 cannot write
        it: RuntimeError naming the version needed, rather than a backward that leaves the buffer unwritten."""
        if not dsinks:
            return params
        if not self.has_params_field("dsinks"):
            raise RuntimeError(
                f"FlashCore: dsinks (the gradient of sinks) is requested, but {self.path} (version "
                f"{self.version_string()}, {self.params_struct_size}-byte flashcore_attention_params) predates the "
                f"backward of the attention variants: a 0.6 library or newer is needed"
            )
        params.dsinks = dsinks
        return params

    def _require_variant_backward(self, params: AttentionParamsStruct) -> None:
        """RuntimeError when `params` set a variant (window, softcap, sinks, attention_chunk) that this library's
        backward does not take: a library older than 0.6 refuses them all in the backward (0.5 takes them in the
        forward only), so the call is refused here, naming the variant and the version needed. A library older than
        0.5 never had them set (set_variants)."""
        if self.has_params_field("dsinks") or not self.has_params_field("reserved4"):
            return
        wanted = [name for name, used in (
            ("window_size", bool(params.local)), ("softcap", params.softcap != 0.0), ("sinks", bool(params.sinks)),
            ("attention_chunk", params.attention_chunk != 0)) if used]
        if wanted:
            raise RuntimeError(
                f"FlashCore: the backward with {', '.join(wanted)} needs a 0.6 library or newer; {self.path} (version "
                f"{self.version_string()}, {self.params_struct_size}-byte flashcore_attention_params) takes the "
                f"attention variants in the forward only"
            )

    def backward_workspace_size(self, params: AttentionParamsStruct) -> int:
        """Bytes of device workspace the backward needs for `params` (flashcore_attention_backward_workspace_size;
        any contents). RuntimeError naming the function when the library predates the backward, and naming the
        variant when params set one its backward does not take (a 0.5 library: see _require_variant_backward)."""
        self._require_backward("flashcore_attention_backward_workspace_size")
        self._require_variant_backward(params)
        size = ctypes.c_uint64(0)
        status = self._cdll.flashcore_attention_backward_workspace_size(ctypes.byref(params), ctypes.byref(size))
        self.check(status, "flashcore_attention_backward_workspace_size")
        return int(size.value)

    def backward(self, params: AttentionParamsStruct, stream: int) -> None:
        """Enqueue the backward pass on `stream` (a cudaStream_t as an integer): dq, dk, dv from q, k, v, o, lse and
        dout (fill_backward_params), and with sinks dsinks when set (set_dsinks). RuntimeError naming the function when
        the library predates the backward, naming the variant when its backward does not take it (0.5)."""
        self._require_backward("flashcore_attention_backward")
        self._require_variant_backward(params)
        status = self._cdll.flashcore_attention_backward(ctypes.byref(params), ctypes.c_void_p(stream or None))
        self.check(status, "flashcore_attention_backward")


    def plan(self, params: AttentionParamsStruct) -> "Plan":
        """flashcore_attention_plan: the decisions of a call with params' shapes, made once (see Plan)."""
        self._require("flashcore_attention_plan")
        handle = ctypes.c_void_p()
        status = self._cdll.flashcore_attention_plan(ctypes.byref(params), ctypes.byref(handle))
        self.check(status, "flashcore_attention_plan")
        return Plan(self, handle)

    # -- merge and ring (since 0.2) --------------------------------------------------------------------------------

    def _require(self, name: str) -> None:
        if name not in self._optional:
            raise RuntimeError(f"FlashCore: {self.path} (version {self.version_string()}) has no {name}; "
                               "a newer library is needed")

    def new_merge_params(self) -> MergeParamsStruct:
        self._require("flashcore_merge_params_init")
        params = MergeParamsStruct()
        self._cdll.flashcore_merge_params_init(ctypes.byref(params))
        return params

    def merge(self, params: MergeParamsStruct, stream: int) -> None:
        """Enqueue flashcore_attention_merge on `stream` (a cudaStream_t as an integer)."""
        self._require("flashcore_attention_merge")
        status = self._cdll.flashcore_attention_merge(ctypes.byref(params), ctypes.c_void_p(stream or None))
        self.check(status, "flashcore_attention_merge")

    def ring_shard(self, seqlen_global: int, world_size: int, rank: int, layout: int) -> Tuple[Tuple[int, int], ...]:
        """flashcore_ring_shard: `rank`'s rows as ((start0, len0), (start1, len1)) (len1 = 0 for CONTIGUOUS)."""
        self._require("flashcore_ring_shard")
        ring = RingParamsStruct()
        self._cdll.flashcore_ring_params_init(ctypes.byref(ring))
        ring.world_size, ring.layout, ring.seqlen_global = world_size, layout, seqlen_global
        out = [ctypes.c_int64() for _ in range(4)]
        status = self._cdll.flashcore_ring_shard(ctypes.byref(ring), rank, *(ctypes.byref(x) for x in out))
        self.check(status, "flashcore_ring_shard")
        return ((out[0].value, out[1].value), (out[2].value, out[3].value))


class Plan:
    """A plan of the C ABI (flashcore.h, flashcore_attention_plan): the kernel config, schedule, split and workspace
    of calls with one set of shapes, decided once; run() launches it for params with new pointers. Freed with the
    object (or close())."""

    def __init__(self, library: "Library", handle: ctypes.c_void_p):
        self._lib = library
        self._handle = handle
        size = ctypes.c_uint64(0)
        library.check(library._cdll.flashcore_plan_workspace_size(handle, ctypes.byref(size)),
                      "flashcore_plan_workspace_size")
        self.workspace_size = int(size.value)
        buf = ctypes.create_string_buffer(128)
        library.check(library._cdll.flashcore_plan_config(handle, buf, len(buf)), "flashcore_plan_config")
        self.config = buf.value.decode("utf-8", "replace")

    def run(self, params: AttentionParamsStruct, stream: int) -> None:
        """Enqueue the plan for `params` (the plan's shapes; its workspace given) on `stream` (a cudaStream_t)."""
        if self._handle is None:
            raise RuntimeError("FlashCore: this plan was closed")
        status = self._lib._cdll.flashcore_attention_run(self._handle, ctypes.byref(params),
                                                         ctypes.c_void_p(stream or None))
        self._lib.check(status, "flashcore_attention_run")

    def close(self) -> None:
        if self._handle is not None:
            self._lib._cdll.flashcore_plan_destroy(self._handle)
            self._handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


def fill_params(
    params: AttentionParamsStruct,
    *,
    pointers: Tuple[int, int, int, int, int],
    strides: Tuple[Tuple[int, int, int, int], ...],
    sizes: Tuple[int, int, int, int, int, int],
    dtype: int,
    causal: bool,
    softmax_scale: float,
    lse_capacity: Optional[int] = None,
) -> AttentionParamsStruct:
    """Set every argument field of an initialised params struct.

    pointers: (q, k, v, o, lse) addresses (lse 0 for none); strides: (q, k, v, o) as (batch, seq, head, dim);
    sizes: (batch, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim). lse_capacity: floats at lse; by
    default batch * num_heads_q * seqlen_q (the contiguous LSE the caller allocates), 0 without lse.
    """
    params.q, params.k, params.v, params.o, params.lse = (p or None for p in pointers)
    for field, (batch, seq, head, dim) in zip(("q_strides", "k_strides", "v_strides", "o_strides"), strides):
        target = getattr(params, field)  # a view into params' buffer
        target.batch, target.seq, target.head, target.dim = batch, seq, head, dim
    (params.batch, params.seqlen_q, params.seqlen_k, params.num_heads_q, params.num_heads_kv, params.head_dim) = sizes
    params.dtype = dtype
    params.causal = 1 if causal else 0
    params.softmax_scale = softmax_scale
    if not pointers[4]:
        params.lse_capacity = 0
    else:
        params.lse_capacity = sizes[0] * sizes[3] * sizes[1] if lse_capacity is None else lse_capacity
    return params


def fill_backward_params(
    params: AttentionParamsStruct,
    *,
    pointers: Tuple[int, int, int, int],
    strides: Tuple[Tuple[int, int, int, int], ...],
    deterministic: bool,
) -> AttentionParamsStruct:
    """Set the backward's fields of params already filled for the forward's tensors (fill_params: q, k, v, o and the
    forward's lse, sizes, dtype, causal, scale). pointers: (dout, dq, dk, dv) addresses; strides: theirs, in that
    order, as (batch, seq, head, dim)."""
    params.dout, params.dq, params.dk, params.dv = (p or None for p in pointers)
    for field, (batch, seq, head, dim) in zip(("dout_strides", "dq_strides", "dk_strides", "dv_strides"), strides):
        target = getattr(params, field)
        target.batch, target.seq, target.head, target.dim = batch, seq, head, dim
    params.deterministic = 1 if deterministic else 0
    return params


# ---------------------------------------------------------------------------------------------------------------
# Process-wide library.

_lock = threading.Lock()
_library: Optional[Library] = None


def load() -> Library:
    """The process-wide library, loaded on first call. Raises RuntimeError naming where it looked."""
    global _library
    if _library is not None:
        return _library
    with _lock:
        if _library is None:
            _library = _load_first()
    return _library


def _load_first() -> Library:
    tried = []
    for description, location in candidates():
        is_file_path = os.sep in location
        if is_file_path and not os.path.isfile(location):
            tried.append(f"{description}: {location} (not found)")
            continue
        try:
            return Library(location)
        except OSError as exc:
            tried.append(f"{description}: {location} (could not be loaded: {exc})")
        except AttributeError as exc:
            tried.append(f"{description}: {location} (missing symbol: {exc})")
    raise RuntimeError(
        "FlashCore: the native library libflashcore.so could not be loaded. Looked in:\n  - "
        + "\n  - ".join(tried)
        + "\nBuild it with CMake (target `flashcore_shared`, output build/lib/libflashcore.so) or set "
        + f"{LIBRARY_ENV} to its path."
    )


def is_available() -> bool:
    """True when the library can be loaded (never raises)."""
    try:
        load()
    except RuntimeError:
        return False
    return True


def reset() -> None:
    """Forget the loaded library so the next load() searches again (tests; after changing $FLASHCORE_LIBRARY)."""
    global _library
    with _lock:
        _library = None

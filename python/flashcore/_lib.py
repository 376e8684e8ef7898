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

# Version of the header these bindings mirror (FLASHCORE_VERSION_*). The loaded library must share the major.
ABI_VERSION = (0, 1, 0)

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

DTYPE_FP16 = 0
DTYPE_BF16 = 1
DTYPE_FP32 = 2
DTYPE_FP8_E4M3 = 3

# flashcore_dtype -> the name torch gives the dtype (torch.<name>).
DTYPE_NAMES = {DTYPE_FP16: "float16", DTYPE_BF16: "bfloat16", DTYPE_FP32: "float32", DTYPE_FP8_E4M3: "float8_e4m3fn"}

MAX_CAPS = 16  # FLASHCORE_MAX_CAPS

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
    ]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What the loaded library was compiled with, and whether the current device can run it."""

    dtypes: Tuple[str, ...]  # torch dtype names, e.g. ("float16", "bfloat16")
    head_dims: Tuple[int, ...]
    archs: Tuple[int, ...]  # compute capabilities, e.g. (90,)
    device_arch: int  # compute capability of the current device, 0 if none
    device_supported: bool


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


def _declare(cdll: ctypes.CDLL) -> None:
    params_p = ctypes.POINTER(AttentionParamsStruct)
    c_int_p = ctypes.POINTER(ctypes.c_int)
    signatures = {
        "flashcore_attention_params_init": (None, [params_p]),
        "flashcore_attention_params_set_contiguous": (ctypes.c_int, [params_p, ctypes.c_int]),
        "flashcore_attention_validate": (ctypes.c_int, [params_p]),
        "flashcore_attention_forward": (ctypes.c_int, [params_p, ctypes.c_void_p]),
        "flashcore_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "flashcore_last_error": (ctypes.c_char_p, []),
        "flashcore_version": (None, [c_int_p, c_int_p, c_int_p]),
        "flashcore_version_string": (ctypes.c_char_p, []),
        "flashcore_get_capabilities": (ctypes.c_int, [ctypes.POINTER(CapabilitiesStruct)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(cdll, name)  # AttributeError names a missing symbol
        fn.restype = restype
        fn.argtypes = argtypes


class Library:
    """A loaded libflashcore.so with checked calls."""

    def __init__(self, path: str):
        self.path = path
        self._cdll = ctypes.CDLL(path)
        _declare(self._cdll)
        self.version = self._version()
        if self.version[0] != ABI_VERSION[0]:
            raise RuntimeError(
                f"FlashCore: {path} has ABI version {self.version_string()}, these bindings were written for "
                f"{'.'.join(map(str, ABI_VERSION))} (the major versions must match)"
            )
        # A newer library may have a larger struct than this mirror: let it write into a generously
        # sized buffer, then read the mirror's view of it.
        expected = ctypes.sizeof(AttentionParamsStruct)
        probe_buf = ctypes.create_string_buffer(4 * expected)
        self._cdll.flashcore_attention_params_init(ctypes.cast(probe_buf, ctypes.POINTER(AttentionParamsStruct)))
        probe = AttentionParamsStruct.from_buffer(probe_buf)
        strides = (probe.q_strides, probe.k_strides, probe.v_strides, probe.o_strides)
        if probe.struct_size != expected or any(s.dim != 1 for s in strides):
            raise RuntimeError(
                f"FlashCore: ABI mismatch with {path}: flashcore_attention_params_init set struct_size="
                f"{probe.struct_size} (Python mirror: {expected}) and dim strides "
                f"{[s.dim for s in strides]} (expected 1); rebuild the library or update the bindings"
            )
        self._compiled: Optional[Tuple[Tuple[str, ...], Tuple[int, ...]]] = None

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

    def capabilities(self) -> Capabilities:
        caps = CapabilitiesStruct()
        caps.struct_size = ctypes.sizeof(CapabilitiesStruct)
        self.check(self._cdll.flashcore_get_capabilities(ctypes.byref(caps)), "flashcore_get_capabilities")

        def first(array, count) -> list:
            return [int(array[i]) for i in range(max(0, min(int(count), MAX_CAPS)))]

        return Capabilities(
            dtypes=tuple(DTYPE_NAMES.get(d, f"flashcore_dtype({d})") for d in first(caps.dtypes, caps.num_dtypes)),
            head_dims=tuple(first(caps.head_dims, caps.num_head_dims)),
            archs=tuple(first(caps.archs, caps.num_archs)),
            device_arch=int(caps.device_arch),
            device_supported=bool(caps.device_supported),
        )

    def compiled(self) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
        """(dtype names, head dims) compiled in; fixed for the library's lifetime, so queried once."""
        if self._compiled is None:
            caps = self.capabilities()
            self._compiled = (caps.dtypes, caps.head_dims)
        return self._compiled

    # -- attention ------------------------------------------------------------------------------------------------

    def new_params(self) -> AttentionParamsStruct:
        params = AttentionParamsStruct()
        self._cdll.flashcore_attention_params_init(ctypes.byref(params))
        return params

    def validate(self, params: AttentionParamsStruct) -> None:
        self.check(self._cdll.flashcore_attention_validate(ctypes.byref(params)), "flashcore_attention_validate")

    def forward(self, params: AttentionParamsStruct, stream: int) -> None:
        """Enqueue the forward pass on `stream` (a cudaStream_t as an integer; 0 is the legacy default stream)."""
        status = self._cdll.flashcore_attention_forward(ctypes.byref(params), ctypes.c_void_p(stream or None))
        self.check(status, "flashcore_attention_forward")


def fill_params(
    params: AttentionParamsStruct,
    *,
    pointers: Tuple[int, int, int, int, int],
    strides: Tuple[Tuple[int, int, int, int], ...],
    sizes: Tuple[int, int, int, int, int, int],
    dtype: int,
    causal: bool,
    softmax_scale: float,
) -> AttentionParamsStruct:
    """Set every argument field of an initialised params struct.

    pointers: (q, k, v, o, lse) addresses (lse 0 for none); strides: (q, k, v, o) as (batch, seq, head, dim);
    sizes: (batch, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim).
    """
    params.q, params.k, params.v, params.o, params.lse = (p or None for p in pointers)
    for field, (batch, seq, head, dim) in zip(("q_strides", "k_strides", "v_strides", "o_strides"), strides):
        target = getattr(params, field)  # a view into params' buffer
        target.batch, target.seq, target.head, target.dim = batch, seq, head, dim
    (params.batch, params.seqlen_q, params.seqlen_k, params.num_heads_q, params.num_heads_kv, params.head_dim) = sizes
    params.dtype = dtype
    params.causal = 1 if causal else 0
    params.softmax_scale = softmax_scale
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

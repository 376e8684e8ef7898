"""FlashCore's C ABI (include/flashcore/flashcore.h) for bench/report.py, without installing the Python package.

The ctypes structs, the function signatures and the ABI checks are those of the package's binding,
python/flashcore/_lib.py (one mirror of the header, tested against it and a C compiler): this module puts
<repo>/python on sys.path and imports it. Neither that module nor the package's __init__ needs PyTorch.

    lib = FlashCoreLib("build/lib/libflashcore.so")
    params = lib.params_for(q, k, v, o, lse=None, causal=True)   # torch tensors (any strides)
    lib.forward(params, torch.cuda.current_stream().cuda_stream)
    params = lib.params_for(q8, k8, v8, o, bhsd=False, descales=(qd, kd, vd))  # e4m3 inputs, O in o's dtype
    params = lib.params_for(q, k, v, o, precision=PRECISION_FP8)  # 16-bit inputs quantized by the library

The attention variants (ABI 0.5; FlashAttention's names, refused by an older library with RuntimeError):

    params = lib.params_for(q, k, v, o, causal=True, window_size=(4095, 0), softcap=50.0, sinks=sinks,
                            attention_chunk=0)          # sinks: float32 (Hq,) CUDA tensor, kept alive by the caller

The backward (ABI 0.4, flashcore_attention_backward), on the forward's q, k, v, o and lse:

    bparams = lib.backward_params_for(q, k, v, o, lse, dout, dq, dk, dv, causal=True)  # workspace allocated here
    lib.backward(bparams, torch.cuda.current_stream().cuda_stream)
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Any, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PYTHON_DIR = os.path.join(ROOT, "python")
if _PYTHON_DIR not in sys.path:
    sys.path.insert(0, _PYTHON_DIR)

from flashcore import _lib  # noqa: E402  (needs the sys.path entry above)
from flashcore._lib import (  # noqa: E402,F401  (re-exported for users of this module)
    DTYPE_BF16,
    DTYPE_FP8_E4M3,
    DTYPE_FP8_E5M2,
    DTYPE_FP16,
    DTYPE_INT8,
    PRECISION_FP8,
    PRECISION_INT8,
    PRECISION_NATIVE,
    AttentionParamsStruct as AttentionParams,
    CapabilitiesStruct as Capabilities,
    TensorStridesStruct as TensorStrides,
)

# flashcore_attention_params with the backward's fields (since 0.4: dout, dq, dk, dv, their strides, deterministic,
# reserved3). The package's mirror (_lib.AttentionParamsStruct) is used as is once it has them; until then this module
# extends the 0.3 mirror, whose fields end exactly where the 0.4 ones begin (FLASHCORE_ATTENTION_PARAMS_V3_SIZE = 480).
BACKWARD_FIELDS = [
    ("dout", ctypes.c_void_p),
    ("dq", ctypes.c_void_p),
    ("dk", ctypes.c_void_p),
    ("dv", ctypes.c_void_p),
    ("dout_strides", TensorStrides),
    ("dq_strides", TensorStrides),
    ("dk_strides", TensorStrides),
    ("dv_strides", TensorStrides),
    ("deterministic", ctypes.c_int32),
    ("reserved3", ctypes.c_int32),
]
ATTENTION_PARAMS_V3_SIZE = 480

if hasattr(AttentionParams, "dout"):
    BackwardParams = AttentionParams
else:
    class BackwardParams(ctypes.Structure):
        """flashcore_attention_params of ABI 0.4: the package's 0.3 mirror and the backward's fields."""

        _fields_ = list(AttentionParams._fields_) + BACKWARD_FIELDS

# Short names as the CLI and the report spell them.
DTYPE_NAMES = {DTYPE_FP16: "fp16", DTYPE_BF16: "bf16", _lib.DTYPE_FP32: "fp32", _lib.DTYPE_FP8_E4M3: "fp8_e4m3",
               _lib.DTYPE_FP8_E5M2: "fp8_e5m2", _lib.DTYPE_INT8: "int8"}


def default_library_path() -> str:
    """$FLASHCORE_LIBRARY (_lib.LIBRARY_ENV), else <repo>/build/lib/libflashcore.so."""
    return os.environ.get(_lib.LIBRARY_ENV) or os.path.join(ROOT, "build", "lib", _lib.LIBRARY_FILE)


class FlashCoreLib:
    """libflashcore.so at `path`, loaded through flashcore._lib.Library (signatures declared, ABI major and
    sizeof(flashcore_attention_params) checked). Failing calls raise ValueError / TypeError / RuntimeError
    with flashcore_last_error()'s message and the status name."""

    def __init__(self, path: Optional[str] = None):
        self.path = path or default_library_path()
        self.library = _lib.Library(self.path)
        self.lib = self.library._cdll  # the raw ctypes.CDLL
        self._workspaces: list = []  # device buffers that params point at

    def version(self) -> str:
        return self.library.version_string()

    def capabilities(self) -> dict:
        caps = self.library.capabilities()
        short = {name: DTYPE_NAMES[code] for code, name in _lib.DTYPE_NAMES.items()}
        return {
            "dtypes": [short.get(d, d) for d in caps.dtypes],
            "head_dims": list(caps.head_dims),
            "archs": list(caps.archs),
            "device_arch": caps.device_arch,
            "device_supported": caps.device_supported,
        }

    @staticmethod
    def _strides(t: Any, bhsd: bool) -> Tuple[int, int, int, int]:
        """(batch, seq, head, dim) element strides of a tensor indexed (B, H, S, D) when bhsd, else (B, S, H, D)."""
        s = t.stride()
        return (s[0], s[2], s[1], s[3]) if bhsd else (s[0], s[1], s[2], s[3])

    def params_for(self, q, k, v, o, lse=None, causal: bool = False, bhsd: bool = True,
                   softmax_scale: float = 0.0, descales=(None, None, None),
                   precision: int = PRECISION_NATIVE, kernel_config: int = 0,
                   v_transposed: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                   sinks=None, attention_chunk: int = 0) -> AttentionParams:
        """Validated params for torch tensors q, k, v, o indexed (B, H, S, D) when bhsd, else (B, S, H, D).

        8-bit: q, k, v float8_e4m3fn with descales (q, k, v: each None or a contiguous float32 (B, Hkv) tensor), or
        16-bit q, k, v with precision=PRECISION_FP8. O's dtype is o's (out_dtype is set when it differs from q's).
        kernel_config: the address of a NUL-terminated config name (kept alive by the caller), or 0: the library's
        choice; the workspace is sized for that config. v_transposed (8-bit): V is transposed once, here, into a
        buffer kept alive with the workspace, and the params read it with FLAG_V_TRANSPOSED (no transpose per call).
        window_size, softcap, sinks (a contiguous float32 (Hq,) tensor, kept alive by the caller), attention_chunk:
        the attention variants (ABI 0.5, _lib.Library.set_variants: RuntimeError naming one a library cannot read)."""
        import torch  # only needed here

        dtypes = {torch.float16: DTYPE_FP16, torch.bfloat16: DTYPE_BF16, torch.float8_e4m3fn: DTYPE_FP8_E4M3,
                  torch.float8_e5m2: DTYPE_FP8_E5M2}
        if q.dtype not in dtypes:
            raise ValueError(f"unsupported dtype {q.dtype}")
        if bhsd:
            B, Hq, Sq, D = q.shape
            _, Hkv, Sk, _ = k.shape
        else:
            B, Sq, Hq, D = q.shape
            _, Sk, Hkv, _ = k.shape
        params = _lib.fill_params(
            self.library.new_params(),
            pointers=(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr() if lse is not None else 0),
            strides=tuple(self._strides(t, bhsd) for t in (q, k, v, o)),
            sizes=(B, Sq, Sk, Hq, Hkv, D),
            dtype=dtypes[q.dtype],
            causal=causal,
            softmax_scale=softmax_scale,
        )
        self.library.set_head_dim_v(params, v.shape[3])  # (a no-op where v has q's head dim)
        if o.dtype != q.dtype:
            params.out_dtype = dtypes[o.dtype]
        for field, descale in zip(("q_descale", "k_descale", "v_descale"), descales):
            if descale is not None:
                if descale.dtype != torch.float32 or not descale.is_contiguous():
                    raise ValueError(f"{field} must be a contiguous float32 tensor")
                setattr(params, field, descale.data_ptr())
        if precision != PRECISION_NATIVE:
            params.precision = precision
        if kernel_config:
            params.kernel_config = kernel_config
        if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous() or sinks.dim() != 1):
            raise ValueError("sinks must be a contiguous float32 (num_heads_q,) tensor")
        self.library.set_variants(params, causal=causal, window_size=window_size, softcap=softcap,
                                  sinks=0 if sinks is None else sinks.data_ptr(), attention_chunk=attention_chunk)
        # The workspace the call needs (a tuned config may use the dynamic scheduler; an 8-bit call may transpose V
        # into it): zero-filled, kept alive here. workspace_size validates the params like forward; validate then
        # checks them with the workspace in place.
        if v_transposed:
            vt = torch.empty(self.library.fp8_transposed_v_size(params), dtype=torch.uint8, device=q.device)
            self.library.fp8_transpose_v(params, vt.data_ptr(), torch.cuda.current_stream().cuda_stream)
            self._workspaces.append(vt)
            params.v = vt.data_ptr()
            params.flags |= _lib.FLAG_V_TRANSPOSED
        size = self.library.workspace_size(params)
        if size:
            buf = torch.zeros(size, dtype=torch.uint8, device=q.device)
            self._workspaces.append(buf)
            params.workspace = buf.data_ptr()
            params.workspace_size = size
        self.library.validate(params)
        return params

    def forward(self, params: AttentionParams, stream: int) -> None:
        self.library.forward(params, stream)

    # -- the backward (ABI 0.4) ------------------------------------------------------------------------------------

    def _raw(self, name: str, argtypes, restype=ctypes.c_int):
        """A fresh ctypes function object for symbol `name` (CDLL[name] is not the cached attribute _lib declared, so
        the argtypes set here, which take BackwardParams by address, never change the package's declarations)."""
        fn = self.lib[name]
        fn.argtypes = argtypes
        fn.restype = restype
        return fn

    def _backward_struct_size(self) -> int:
        """The struct_size to pass the backward: the library's own (a 0.4 library: 648 bytes, the backward's fields
        included, none of the 0.5 variants), capped at BackwardParams' size; 0 when it has no backward's fields."""
        size = min(self.library.params_struct_size, ctypes.sizeof(BackwardParams))
        return size if size >= BackwardParams.reserved3.offset + BackwardParams.reserved3.size else 0

    def has_backward(self) -> bool:
        """Whether the library has flashcore_attention_backward and a params struct with the backward's fields."""
        if not hasattr(self.lib, "flashcore_attention_backward"):
            return False
        return self._backward_struct_size() > 0

    def _require_backward(self) -> None:
        if not self.has_backward():
            raise RuntimeError(f"FlashCore: {self.path} (version {self.version()}) has no flashcore_attention_backward "
                               f"with the backward's params fields; a 0.4 library is needed")

    def new_backward_params(self) -> BackwardParams:
        """An initialised BackwardParams, with the library's struct_size (it reads the backward's fields)."""
        self._require_backward()
        params = BackwardParams()
        size = self._backward_struct_size()
        init = self._raw("flashcore_attention_params_init_sized", [ctypes.c_void_p, ctypes.c_uint32], None)
        init(ctypes.addressof(params), size)
        if params.struct_size != size:
            raise RuntimeError(f"FlashCore: flashcore_attention_params_init_sized refused struct_size "
                               f"{size}: {self.library.last_error()}")
        return params

    def backward_workspace_size(self, params: BackwardParams) -> int:
        """Bytes of workspace flashcore_attention_backward needs for `params` (validates them like the backward)."""
        size = ctypes.c_uint64(0)
        fn = self._raw("flashcore_attention_backward_workspace_size", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)])
        self.library.check(fn(ctypes.addressof(params), ctypes.byref(size)), "flashcore_attention_backward_workspace_size")
        return int(size.value)

    def backward_params_for(self, q, k, v, o, lse, dout, dq, dk, dv, causal: bool = False, bhsd: bool = True,
                            softmax_scale: float = 0.0, deterministic: bool = False) -> BackwardParams:
        """Validated backward params for torch tensors indexed (B, H, S, D) when bhsd, else (B, S, H, D): the forward's
        q, k, v, o and lse ((B, Hq, Sq) float32 contiguous), dout (o's shape), and the outputs dq (q's shape), dk (k's),
        dv (v's: a last dimension of its own sets head_dim_v, as for the forward). The workspace (backward_workspace_size bytes, any contents) is allocated here and kept alive with the
        others (release_workspaces)."""
        import torch  # only needed here

        dtypes = {torch.float16: DTYPE_FP16, torch.bfloat16: DTYPE_BF16}
        if q.dtype not in dtypes:
            raise ValueError(f"the backward takes float16 or bfloat16 tensors, not {q.dtype}")
        if bhsd:
            B, Hq, Sq, D = q.shape
            _, Hkv, Sk, _ = k.shape
        else:
            B, Sq, Hq, D = q.shape
            _, Sk, Hkv, _ = k.shape
        params = _lib.fill_params(
            self.new_backward_params(),
            pointers=(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr()),
            strides=tuple(self._strides(t, bhsd) for t in (q, k, v, o)),
            sizes=(B, Sq, Sk, Hq, Hkv, D),
            dtype=dtypes[q.dtype],
            causal=causal,
            softmax_scale=softmax_scale,
        )
        self.library.set_head_dim_v(params, v.shape[3])  # (a no-op where v has q's head dim)
        params.dout, params.dq, params.dk, params.dv = (t.data_ptr() for t in (dout, dq, dk, dv))
        for field, t in zip(("dout_strides", "dq_strides", "dk_strides", "dv_strides"), (dout, dq, dk, dv)):
            target = getattr(params, field)
            target.batch, target.seq, target.head, target.dim = self._strides(t, bhsd)
        params.deterministic = 1 if deterministic else 0
        size = self.backward_workspace_size(params)
        if size:
            buf = torch.empty(size, dtype=torch.uint8, device=q.device)
            self._workspaces.append(buf)
            params.workspace = buf.data_ptr()
            params.workspace_size = size
        return params

    def backward(self, params: BackwardParams, stream: int) -> None:
        """Enqueue flashcore_attention_backward on `stream` (a cudaStream_t as an integer)."""
        fn = self._backward_fn = getattr(self, "_backward_fn", None) or self._raw(
            "flashcore_attention_backward", [ctypes.c_void_p, ctypes.c_void_p])
        self.library.check(fn(ctypes.addressof(params), ctypes.c_void_p(stream or None)), "flashcore_attention_backward")

    def release_workspaces(self) -> None:
        """Drop the workspaces of earlier params_for calls (their params must not be used afterwards)."""
        self._workspaces.clear()

"""FlashCore's C ABI (include/flashcore/flashcore.h) for bench/report.py, without installing the Python package.

The ctypes structs, the function signatures and the ABI checks are those of the package's binding,
python/flashcore/_lib.py (one mirror of the header, tested against it and a C compiler): this module puts
<repo>/python on sys.path and imports it. Neither that module nor the package's __init__ needs PyTorch.

    lib = FlashCoreLib("build/lib/libflashcore.so")
    params = lib.params_for(q, k, v, o, lse=None, causal=True)   # torch tensors (any strides)
    lib.forward(params, torch.cuda.current_stream().cuda_stream)
    params = lib.params_for(q8, k8, v8, o, bhsd=False, descales=(qd, kd, vd))  # e4m3 inputs, O in o's dtype
    params = lib.params_for(q, k, v, o, precision=PRECISION_FP8)  # 16-bit inputs quantized by the library
"""
from __future__ import annotations

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
                   v_transposed: bool = False) -> AttentionParams:
        """Validated params for torch tensors q, k, v, o indexed (B, H, S, D) when bhsd, else (B, S, H, D).

        8-bit: q, k, v float8_e4m3fn with descales (q, k, v: each None or a contiguous float32 (B, Hkv) tensor), or
        16-bit q, k, v with precision=PRECISION_FP8. O's dtype is o's (out_dtype is set when it differs from q's).
        kernel_config: the address of a NUL-terminated config name (kept alive by the caller), or 0: the library's
        choice; the workspace is sized for that config. v_transposed (8-bit): V is transposed once, here, into a
        buffer kept alive with the workspace, and the params read it with FLAG_V_TRANSPOSED (no transpose per call)."""
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

    def release_workspaces(self) -> None:
        """Drop the workspaces of earlier params_for calls (their params must not be used afterwards)."""
        self._workspaces.clear()

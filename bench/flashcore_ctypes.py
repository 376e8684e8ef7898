"""ctypes binding of FlashCore's C ABI (include/flashcore/flashcore.h), without the Python package.

Mirrors `flashcore_attention_params` and `flashcore_capabilities` field by field; `check_layout()` compares
the struct sizes with what the library itself writes into struct_size. Used by bench/report.py:

    lib = FlashCoreLib("build/lib/libflashcore.so")
    params = lib.params_for(q, k, v, o, lse=None, causal=True)   # torch tensors (any strides)
    lib.forward(params, torch.cuda.current_stream().cuda_stream)
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

# flashcore_dtype
DTYPE_FP16 = 0
DTYPE_BF16 = 1
DTYPE_FP32 = 2
DTYPE_FP8_E4M3 = 3
DTYPE_NAMES = {DTYPE_FP16: "fp16", DTYPE_BF16: "bf16", DTYPE_FP32: "fp32", DTYPE_FP8_E4M3: "fp8_e4m3"}

SUCCESS = 0
MAX_CAPS = 16


class TensorStrides(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seq", ctypes.c_int64),
        ("head", ctypes.c_int64),
        ("dim", ctypes.c_int64),
    ]


class AttentionParams(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),  # float*
        ("q_strides", TensorStrides),
        ("k_strides", TensorStrides),
        ("v_strides", TensorStrides),
        ("o_strides", TensorStrides),
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("num_heads_q", ctypes.c_int64),
        ("num_heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("dtype", ctypes.c_int),  # enum flashcore_dtype
        ("causal", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
    ]


class Capabilities(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("num_dtypes", ctypes.c_int32),
        ("dtypes", ctypes.c_int * MAX_CAPS),
        ("num_head_dims", ctypes.c_int32),
        ("head_dims", ctypes.c_int32 * MAX_CAPS),
        ("num_archs", ctypes.c_int32),
        ("archs", ctypes.c_int32 * MAX_CAPS),
        ("device_arch", ctypes.c_int32),
        ("device_supported", ctypes.c_int32),
    ]


# sizeof() in C on x86-64 / aarch64 (LP64), checked against the header with a C compiler.
EXPECTED_PARAMS_SIZE = 240
EXPECTED_CAPS_SIZE = 216
assert ctypes.sizeof(AttentionParams) == EXPECTED_PARAMS_SIZE, ctypes.sizeof(AttentionParams)
assert ctypes.sizeof(Capabilities) == EXPECTED_CAPS_SIZE, ctypes.sizeof(Capabilities)


class FlashCoreError(RuntimeError):
    def __init__(self, status: int, what: str, message: str):
        super().__init__(f"{what}: status {status}: {message}")
        self.status = status


def default_library_path() -> str:
    env = os.environ.get("FLASHCORE_LIB")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "build", "lib", "libflashcore.so")


class FlashCoreLib:
    def __init__(self, path: Optional[str] = None):
        self.path = path or default_library_path()
        self.lib = ctypes.CDLL(self.path)
        L = self.lib
        P = ctypes.POINTER(AttentionParams)
        L.flashcore_attention_params_init.argtypes = [P]
        L.flashcore_attention_params_init.restype = None
        L.flashcore_attention_params_set_contiguous.argtypes = [P, ctypes.c_int]
        L.flashcore_attention_params_set_contiguous.restype = ctypes.c_int
        L.flashcore_attention_validate.argtypes = [P]
        L.flashcore_attention_validate.restype = ctypes.c_int
        L.flashcore_attention_forward.argtypes = [P, ctypes.c_void_p]
        L.flashcore_attention_forward.restype = ctypes.c_int
        L.flashcore_status_string.argtypes = [ctypes.c_int]
        L.flashcore_status_string.restype = ctypes.c_char_p
        L.flashcore_last_error.argtypes = []
        L.flashcore_last_error.restype = ctypes.c_char_p
        L.flashcore_version_string.argtypes = []
        L.flashcore_version_string.restype = ctypes.c_char_p
        L.flashcore_get_capabilities.argtypes = [ctypes.POINTER(Capabilities)]
        L.flashcore_get_capabilities.restype = ctypes.c_int
        self.check_layout()

    # -- helpers ------------------------------------------------------------------------------------
    def _raise(self, status: int, what: str) -> None:
        msg = self.lib.flashcore_last_error().decode(errors="replace")
        name = self.lib.flashcore_status_string(status).decode(errors="replace")
        raise FlashCoreError(status, what, f"{name}: {msg}")

    def check_layout(self) -> None:
        """The library's own sizeof(flashcore_attention_params) must equal ours."""
        # init writes sizeof(C struct) bytes: give it a generous buffer, then read struct_size.
        buf = (ctypes.c_ubyte * (4 * EXPECTED_PARAMS_SIZE))()
        self.lib.flashcore_attention_params_init(ctypes.cast(buf, ctypes.POINTER(AttentionParams)))
        size = ctypes.c_uint32.from_buffer(buf).value
        if size != ctypes.sizeof(AttentionParams):
            raise RuntimeError(
                f"{self.path}: sizeof(flashcore_attention_params) = {size}, this binding has "
                f"{ctypes.sizeof(AttentionParams)}: update bench/flashcore_ctypes.py")

    def version(self) -> str:
        return self.lib.flashcore_version_string().decode()

    def capabilities(self) -> dict:
        caps = Capabilities()
        caps.struct_size = ctypes.sizeof(Capabilities)
        st = self.lib.flashcore_get_capabilities(ctypes.byref(caps))
        if st != SUCCESS:
            self._raise(st, "flashcore_get_capabilities")
        return {
            "dtypes": [DTYPE_NAMES.get(caps.dtypes[i], str(caps.dtypes[i])) for i in range(caps.num_dtypes)],
            "head_dims": [caps.head_dims[i] for i in range(caps.num_head_dims)],
            "archs": [caps.archs[i] for i in range(caps.num_archs)],
            "device_arch": caps.device_arch,
            "device_supported": bool(caps.device_supported),
        }

    # -- the call -----------------------------------------------------------------------------------
    @staticmethod
    def _strides(t: Any, bhsd: bool) -> TensorStrides:
        s = t.stride()
        if bhsd:  # tensor indexed (B, H, S, D)
            return TensorStrides(batch=s[0], head=s[1], seq=s[2], dim=s[3])
        return TensorStrides(batch=s[0], seq=s[1], head=s[2], dim=s[3])  # (B, S, H, D)

    def params_for(self, q, k, v, o, lse=None, causal: bool = False, bhsd: bool = True,
                   softmax_scale: float = 0.0) -> AttentionParams:
        """Params for torch tensors q, k, v, o indexed (B, H, S, D) when bhsd, else (B, S, H, D)."""
        import torch  # only needed here

        dtypes = {torch.float16: DTYPE_FP16, torch.bfloat16: DTYPE_BF16}
        if q.dtype not in dtypes:
            raise ValueError(f"unsupported dtype {q.dtype}")
        p = AttentionParams()
        self.lib.flashcore_attention_params_init(ctypes.byref(p))
        if bhsd:
            B, Hq, Sq, D = q.shape
            _, Hkv, Sk, _ = k.shape
        else:
            B, Sq, Hq, D = q.shape
            _, Sk, Hkv, _ = k.shape
        p.q, p.k, p.v, p.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
        p.lse = lse.data_ptr() if lse is not None else None
        p.q_strides = self._strides(q, bhsd)
        p.k_strides = self._strides(k, bhsd)
        p.v_strides = self._strides(v, bhsd)
        p.o_strides = self._strides(o, bhsd)
        p.batch, p.seqlen_q, p.seqlen_k = B, Sq, Sk
        p.num_heads_q, p.num_heads_kv, p.head_dim = Hq, Hkv, D
        p.dtype = dtypes[q.dtype]
        p.causal = 1 if causal else 0
        p.softmax_scale = softmax_scale
        st = self.lib.flashcore_attention_validate(ctypes.byref(p))
        if st != SUCCESS:
            self._raise(st, "flashcore_attention_validate")
        return p

    def forward(self, params: AttentionParams, stream: int) -> None:
        st = self.lib.flashcore_attention_forward(ctypes.byref(params), ctypes.c_void_p(stream))
        if st != SUCCESS:
            self._raise(st, "flashcore_attention_forward")

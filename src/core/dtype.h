// Dtype facts shared by the API, the backends, the check harness and the tools: one place for names and sizes.
#pragma once
#include <cstdint>

#include "flashcore/flashcore.h"

namespace flashcore {

// "fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2", "same" (FLASHCORE_DTYPE_SAME) or "unknown".
constexpr const char* dtype_name(flashcore_dtype dtype) {
  switch (dtype) {
    case FLASHCORE_DTYPE_SAME: return "same";
    case FLASHCORE_DTYPE_FP16: return "fp16";
    case FLASHCORE_DTYPE_BF16: return "bf16";
    case FLASHCORE_DTYPE_FP32: return "fp32";
    case FLASHCORE_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case FLASHCORE_DTYPE_FP8_E5M2: return "fp8_e5m2";
    case FLASHCORE_DTYPE_INT8: return "int8";
  }
  return "unknown";
}

// Bytes per element; 0 for FLASHCORE_DTYPE_SAME and unknown values (rejected by validation).
constexpr int64_t dtype_size(flashcore_dtype dtype) {
  switch (dtype) {
    case FLASHCORE_DTYPE_FP16:
    case FLASHCORE_DTYPE_BF16: return 2;
    case FLASHCORE_DTYPE_FP32: return 4;
    case FLASHCORE_DTYPE_FP8_E4M3:
    case FLASHCORE_DTYPE_FP8_E5M2:
    case FLASHCORE_DTYPE_INT8: return 1;
    case FLASHCORE_DTYPE_SAME: return 0;
  }
  return 0;
}

// True for the 8-bit input dtypes.
constexpr bool is_8bit(flashcore_dtype dtype) {
  return dtype == FLASHCORE_DTYPE_FP8_E4M3 || dtype == FLASHCORE_DTYPE_FP8_E5M2;
}

// The int8 Q K^T kernels' key (precision = INT8): int8 Q and K, V and O in a 16-bit dtype.
constexpr bool is_int8_qk(flashcore_dtype dtype) { return dtype == FLASHCORE_DTYPE_INT8; }

// The dtype O is written in: out_dtype, or for FLASHCORE_DTYPE_SAME the input dtype (BF16 for 8-bit inputs).
constexpr flashcore_dtype resolved_out_dtype(flashcore_dtype dtype, flashcore_dtype out_dtype) {
  if (out_dtype != FLASHCORE_DTYPE_SAME) return out_dtype;
  return is_8bit(dtype) || is_int8_qk(dtype) ? FLASHCORE_DTYPE_BF16 : dtype;
}

// K's and V's dtype: FLASHCORE_DTYPE_FP8_E4M3 with FLASHCORE_FLAG_KV_FP8_E4M3 (an e4m3 KV cache, since 0.9), else
// FLASHCORE_DTYPE_SAME (Q's dtype). (k_new and v_new are in Q's dtype: 16-bit rows the append quantizes.)
constexpr flashcore_dtype kv_dtype_of(const flashcore_attention_params& p) {
  return (p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0 ? FLASHCORE_DTYPE_FP8_E4M3 : FLASHCORE_DTYPE_SAME;
}

// The dtype K and V are stored in.
constexpr flashcore_dtype kv_storage_dtype(const flashcore_attention_params& p) {
  return kv_dtype_of(p) == FLASHCORE_DTYPE_SAME ? p.dtype : kv_dtype_of(p);
}

// TMA needs 16-byte strides: the batch/seq/head strides must be multiples of this many elements.
constexpr int64_t stride_multiple(flashcore_dtype dtype) { return dtype_size(dtype) > 0 ? 16 / dtype_size(dtype) : 1; }

}  // namespace flashcore

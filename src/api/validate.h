// Validation of flashcore_attention_params: argument checks (no device access), then device checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::api {

// Largest stride in bytes the tensor memory accelerator accepts is 2^40 - 16.
inline constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;
inline constexpr int kAlignment = 16;       // bytes, for every tensor base pointer
inline constexpr int kStrideMultiple = 8;   // elements, for batch/seq/head strides (16 bytes at 2 bytes each)
inline constexpr int kHeadDims[] = {64, 128, 256};  // head dims a kernel may be compiled for

// Argument checks, in the documented order (first failure wins):
//   INVALID_ARGUMENT (params/struct_size), NULL_POINTER, INVALID_SIZE, SIZE_OVERFLOW, INVALID_HEAD_RATIO,
//   UNSUPPORTED_DTYPE, UNSUPPORTED_HEAD_DIM, MISALIGNED_POINTER, INVALID_STRIDE,
//   INVALID_ARGUMENT (softmax_scale, causal), OVERLAPPING_OUTPUT.
// Touches no device. On failure returns the status and writes a message naming the argument and its value.
flashcore_status validate_arguments(const flashcore_attention_params* params, std::string& message);

// Device checks: a CUDA device is visible (NO_DEVICE) and the current one is compute capability 9.0
// (UNSUPPORTED_ARCH). Call only after validate_arguments succeeded. On success `device` is the current
// device's ordinal (the launch uses it rather than asking again).
flashcore_status validate_device(int& device, std::string& message);

// softmax_scale, or 1/sqrt(head_dim) when it is 0.
float resolve_softmax_scale(const flashcore_attention_params& params);

// "fp16", "bf16", "fp32", "fp8_e4m3" or "unknown".
const char* dtype_name(flashcore_dtype dtype);
// Bytes per element (2 for unknown dtypes, which are rejected anyway).
int64_t dtype_size(flashcore_dtype dtype);
// True when some head dim is compiled for `dtype`.
bool dtype_compiled(flashcore_dtype dtype);

}  // namespace flashcore::api

// flashcore_attention_merge's checks and launch, shared with ring attention (src/dist/ring.cpp).
#pragma once
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"

namespace flashcore::api {

// Argument checks (no device access), in order: NULL_POINTER / INVALID_ARGUMENT (struct_size, init), INVALID_SIZE
// and SIZE_OVERFLOW (sizes), UNSUPPORTED_HEAD_DIM, UNSUPPORTED_DTYPE, MISALIGNED_POINTER and INVALID_STRIDE (per
// operand: o_acc, lse_acc, o_part, lse_part, o_out), OVERLAPPING_OUTPUT. On success `m` is the caller's struct.
flashcore_status validate_merge(const flashcore_merge_params* user, flashcore_merge_params& m, std::string& message);

// The head dims the merge kernel is compiled for (64, 128, 256).
bool merge_takes_head_dim(int64_t head_dim);

// Every pointer of `m` is memory of the current device (or managed).
flashcore_status validate_merge_device(const flashcore_merge_params& m, std::string& message);

// Launches the merge kernel for checked params.
flashcore_status launch_merge_checked(const flashcore_merge_params& m, cudaStream_t stream, std::string& message);

}  // namespace flashcore::api

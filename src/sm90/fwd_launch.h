// Host-side entry into the sm90 forward kernels (the only thing src/api needs from src/sm90).
#pragma once
#include <string>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"

namespace flashcore::sm90 {

// True when a kernel for (dtype, head_dim) was compiled into this library.
bool is_compiled(flashcore_dtype dtype, int head_dim);

// Enqueue the forward pass on the current device (ordinal `device`). `p` has passed validation;
// `softmax_scale` is resolved (> 0). On failure returns a status and writes a message naming the cause
// into `error`.
flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                         std::string& error);

}  // namespace flashcore::sm90

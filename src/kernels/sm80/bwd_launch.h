// The portable backward, host side: its kernel table (rows of the generated units, one per (dtype, head dim, tile)) and
// the launches of a validated call (bwd_launch.cpp), for the backend's hooks (backend.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::sm80 {

struct BwdKernelRow {
  flashcore_dtype dtype;
  int head_dim;
  int block_n, stages;    // the tile (bwd_config.h)
  int block_m;            // query rows per step (64, or 128: plain kernels only)
  const void* kernel[2][2];  // [variants: a window or softcap][causal or windowed]: flashcore_bwd_sm80_kernel<...>,
                             // nullptr where the row has none (the variants of 128-row tiles)
  int smem_bytes, threads;
  const void* prep;        // kernels::flashcore_bwd_prep<T, D, 80>
  const void* dq_convert;  // kernels::flashcore_bwd_dq_convert<T, D, 80>
  const void* dsinks;      // kernels::flashcore_bwd_dsinks<80>
};

// Whether a row is compiled for (dtype, head_dim) (on some device).
bool bwd_compiled(flashcore_dtype dtype, int head_dim, int head_dim_v, bool variants);

// The row a device of compute capability `cc` runs for (dtype, head_dim) and a plain or variants' call: the first
// compiled one (largest tile first) whose shared memory fits the device and that has the kernels, or nullptr.
const BwdKernelRow* find_bwd_row(flashcore_dtype dtype, int head_dim, int cc, bool variants);

// Bytes of workspace of a validated backward call (the layout of kernels/common/bwd_layout.h's blocks; it depends
// on neither the tile nor deterministic).
uint64_t bwd_workspace_bytes(const flashcore_attention_params& p);

// Enqueue the backward of a validated call (flashcore.h flashcore_attention_backward) on `stream`: the preparation
// kernel, the backward kernel, the dQ conversion.
flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                          std::string& error);

}  // namespace flashcore::sm80

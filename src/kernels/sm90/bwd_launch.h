// The sm90 backward, host side: its kernel table (one row per compiled (dtype, head dim), generated units) and the
// launches of a validated call (bwd_launch.cpp).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"
#include "kernels/common/bwd_layout.h"

namespace flashcore::sm90 {

struct BwdKernelRow {
  flashcore_dtype dtype;
  int head_dim, head_dim_v;  // Q and K's, V's
  const void* kernel[2][2];  // [variants: a window or softcap][causal or windowed]; nullptr: not compiled
  int smem_bytes, threads;
  int block_m[2];          // query rows per step (BwdConfig::kBlockM) [variants]: the Q and dO boxes, the steps
  int block_n;             // keys per CTA: the K and V boxes, the grid
  int chunk_cols;          // columns of a swizzled row chunk of the tiles (64: 128-byte rows, 32: 64-byte ones)
  const void* prep;        // kernels::flashcore_bwd_prep<T, D, 90, Dv>
  const void* dq_convert;  // kernels::flashcore_bwd_dq_convert<T, D>
  const void* dsinks;      // kernels::flashcore_bwd_dsinks<90>
  const void* zero_kv;     // kernels::flashcore_bwd_zero_kv<T, D, 90, Dv>: dK and dV past seqused_k
};

// The compiled row for (dtype, head_dim, head_dim_v), or nullptr.
const BwdKernelRow* find_bwd_row(flashcore_dtype dtype, int head_dim, int head_dim_v);

// The workspace of a validated backward call (kernels/common/bwd_layout.h): bytes and where each part starts.
using BwdWorkspace = kernels::BwdWorkspace;
BwdWorkspace bwd_workspace(const flashcore_attention_params& p);

// Enqueue the backward of a validated call (flashcore.h flashcore_attention_backward) on `stream`.
flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                          std::string& error);

}  // namespace flashcore::sm90

// The backward's fp32 dQ blocks (kernels/common/bwd_prep.cuh, sm90/bwd_epilogue.cuh): one block of 64 query rows x
// head_dim columns per (batch, query head, query block), in the order a warpgroup's m64n64 accumulators reach shared
// memory -- float4 groups of four registers, thread-major, so that 128 threads store 2 KB of consecutive addresses
// per group. Region c holds columns 64c..64c+63. The conversion kernel reads it back through bwd_dq_position.
#pragma once
#include <cuda_runtime.h>

namespace flashcore::kernels {

// Register `reg` (0..31) of thread `thread` (0..127) of the warpgroup whose accumulator holds region `region`.
__host__ __device__ constexpr int bwd_dq_index(int region, int reg, int thread) {
  return region * 64 * 64 + (reg / 4) * 512 + thread * 4 + reg % 4;
}

// The inverse: the (row, column) of element e of a block (the accumulator layout of fragment.cuh).
__host__ __device__ constexpr void bwd_dq_position(int e, int& row, int& col) {
  const int region = e / 4096, rest = e % 4096;
  const int group = rest / 512, thread = (rest % 512) / 4, reg = group * 4 + rest % 4;
  const int warp = thread / 32, lane = thread % 32;
  row = 16 * warp + lane / 4 + 8 * ((reg / 2) % 2);
  col = 64 * region + 8 * group + 2 * (lane % 4) + reg % 2;
}

// Rows of the workspace's per-(batch, head) arrays: seqlen_q rounded up to whole 64-row blocks.
__host__ __device__ constexpr int64_t bwd_padded_rows(int64_t seqlen_q) { return (seqlen_q + 63) / 64 * 64; }

}  // namespace flashcore::kernels

// Split-KV combine: merges the per-split partials of a forward pass (each split's O normalized by its own sum,
// and its LSE) into O and LSE. Arch-neutral: plain loads and stores, one or four warps per (batch, head, query row).
//   LSE = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - LSE) * O_s
// A split that saw no key has lse_s = -inf and weight 0; a row no split saw gets O = 0 and LSE = -inf, as without
// splits (kernels/common/softmax.cuh). Many splits (warps_per_row = 4): a CTA per row, its four warps sharing the
// splits; few: one warp per row, four rows per CTA.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common/combine_params.h"
#include "kernels/common/element.cuh"

namespace flashcore::kernels {

template <class Out, int kHeadDim>
__global__ void __launch_bounds__(128) flashcore_combine_splits(const CombineParams c) {
  static_assert(kHeadDim % 64 == 0, "each lane owns head_dim / 32 columns, in pairs");
  constexpr int kPairs = kHeadDim / 64;  // float2 per lane
  // Warps 1..3 of a row's CTA leave their share of O here for warp 0 (warps_per_row = 4).
  __shared__ float2 shared_acc[3][kPairs][32];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the forward kernel: its launch overlaps the forward's tail, and this
  // waits until the forward grid has finished and its partials are visible.
  cudaGridDependencySynchronize();
#endif
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wpr = c.warps_per_row;  // uniform over the grid: 4 means one row per CTA, every warp active
  const int part = warp % wpr;      // this warp sums splits part, part + wpr, ...
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (4 / wpr) + warp / wpr;
  if (row >= c.rows) return;  // only with one warp per row (the grid has one CTA per row otherwise)
  const int64_t q = row % c.seqlen_q;
  const int64_t bh = row / c.seqlen_q;  // batch * heads + head
  const int64_t first = bh * c.splits;  // (batch, head, split 0)

  // Every warp of the row reads the splits' LSEs, one per lane 32 at a time (their max by a butterfly; each lane
  // keeps its split's weight), so all agree on the max and the total; the O rows are then summed with the weights
  // broadcast, each warp over its share of the splits, eight loads in flight at once. (One warp reading split after
  // split paid a round trip per split: perf-notes v21.)
  const float* lse_rows = c.lse_partial + first * c.seqlen_q + q;  // split s at lse_rows[s * seqlen_q]
  float max_lse = -INFINITY;
  for (int s = lane; s < c.splits; s += 32) max_lse = fmaxf(max_lse, lse_rows[static_cast<int64_t>(s) * c.seqlen_q]);
#pragma unroll
  for (int m = 16; m > 0; m /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, m));
  float acc[kPairs][2] = {};
  float total = 0.f;
  if (max_lse != -INFINITY) {
    for (int s0 = 0; s0 < c.splits; s0 += 32) {
      const int mine = s0 + lane;
      const float w_lane = mine < c.splits ? __expf(lse_rows[static_cast<int64_t>(mine) * c.seqlen_q] - max_lse) : 0.f;
      total += w_lane;
      const int n = min(32, c.splits - s0);
      const float* o_s0 = c.o_partial + ((first + s0) * c.seqlen_q + q) * kHeadDim + 2 * lane;
#pragma unroll 8
      for (int j = part; j < n; j += wpr) {
        const float w = __shfl_sync(0xffffffffu, w_lane, j);
        const float* o_s = o_s0 + static_cast<int64_t>(j) * c.seqlen_q * kHeadDim;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) {
          const float2 v = *reinterpret_cast<const float2*>(o_s + 64 * k);
          acc[k][0] += w * v.x;
          acc[k][1] += w * v.y;
        }
      }
    }
#pragma unroll
    for (int m = 16; m > 0; m /= 2) total += __shfl_xor_sync(0xffffffffu, total, m);
  }
  if (wpr > 1) {  // warp 0 adds the other warps' shares, in warp order
    if (part > 0) {
#pragma unroll
      for (int k = 0; k < kPairs; ++k) shared_acc[part - 1][k][lane] = make_float2(acc[k][0], acc[k][1]);
    }
    __syncthreads();
    if (part > 0) return;
    for (int w = 0; w < wpr - 1; ++w) {
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        acc[k][0] += shared_acc[w][k][lane].x;
        acc[k][1] += shared_acc[w][k][lane].y;
      }
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int64_t batch = bh / c.heads, head = bh % c.heads;
  Out* o_row = static_cast<Out*>(c.o) + batch * c.o_stride_batch + q * c.o_stride_seq + head * c.o_stride_head;
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    *reinterpret_cast<uint32_t*>(o_row + 64 * k + 2 * lane) = ElemTraits<Out>::pack2(acc[k][0] * inv, acc[k][1] * inv);
  }
  if (c.lse != nullptr && lane == 0) c.lse[row] = total > 0.f ? max_lse + logf(total) : -INFINITY;
}

}  // namespace flashcore::kernels

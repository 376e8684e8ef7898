// Split-KV combine: merges the per-split partials of a forward pass (each split's O normalized by its own sum,
// and its LSE) into O and LSE. Arch-neutral: plain loads and stores.
//   LSE = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - LSE) * O_s
// A split that saw no key has lse_s = -inf and weight 0; a row no split saw gets O = 0 and LSE = -inf, as without
// splits (kernels/common/softmax.cuh). Two users of the row merge below:
//   - the sm90 split kernel itself (sm90/epilogue.cuh): the last CTA to finish a tile's splits merges the tile's
//     rows, one warp per row (a tile has at most 64 rows; decode tiles have the G query heads of one KV head);
//   - the combine kernel below, launched after the forward for calls whose tiles have no counter (many tiles, or
//     more than 255 splits): one warp per row, or at 8 splits and more a CTA per row, its four warps sharing the
//     splits.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common/combine_params.h"
#include "kernels/common/element.cuh"

namespace flashcore::kernels {

// A row's splits as the partials lay them out: split s's LSE at lse[s * seqlen_q], its O row at o + s * seqlen_q *
// head_dim (combine_params.h).
struct SplitRows {
  const float* lse;
  const float* o;
  int64_t seqlen_q;
  int splits;
};

// One warp's share of a row's merge: the splits part, part + parts, ... weighted and summed into acc (lane l owns
// columns 64 k + 2 l and 64 k + 2 l + 1). Every warp of the row reads all the splits' LSEs, one per lane 32 at a
// time (their max by a butterfly; each lane keeps its split's weight), so all agree on the max and the total; the
// O rows are summed with the weights broadcast, eight loads in flight at once (one warp reading split after split
// paid a round trip per split: docs/decisions.md#combine). Loads go through L2 (ld.global.cg): in the fused merge the
// partials were written by other CTAs during this grid. Returns the sum of the weights; max_lse is -inf for a row
// no split saw (acc stays 0).
template <int kHeadDim>
__device__ __forceinline__ float merge_split_share(const SplitRows& r, int part, int parts,
                                                   float (&acc)[kHeadDim / 64][2], float& max_lse) {
  static_assert(kHeadDim % 64 == 0, "each lane owns head_dim / 32 columns, in pairs");
  constexpr int kPairs = kHeadDim / 64;
  const int lane = threadIdx.x % 32;
  max_lse = -INFINITY;
  for (int s = lane; s < r.splits; s += 32) max_lse = fmaxf(max_lse, __ldcg(r.lse + static_cast<int64_t>(s) * r.seqlen_q));
#pragma unroll
  for (int m = 16; m > 0; m /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, m));
#pragma unroll
  for (int k = 0; k < kPairs; ++k) acc[k][0] = acc[k][1] = 0.f;
  float total = 0.f;
  if (max_lse == -INFINITY) return total;
  for (int s0 = 0; s0 < r.splits; s0 += 32) {
    const int mine = s0 + lane;
    const float w_lane = mine < r.splits ? __expf(__ldcg(r.lse + static_cast<int64_t>(mine) * r.seqlen_q) - max_lse) : 0.f;
    total += w_lane;
    const int n = min(32, r.splits - s0);
    const float* o_s0 = r.o + static_cast<int64_t>(s0) * r.seqlen_q * kHeadDim + 2 * lane;
#pragma unroll 8
    for (int j = part; j < n; j += parts) {
      const float w = __shfl_sync(0xffffffffu, w_lane, j);
      const float* o_s = o_s0 + static_cast<int64_t>(j) * r.seqlen_q * kHeadDim;
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(o_s + 64 * k));
        acc[k][0] += w * v.x;
        acc[k][1] += w * v.y;
      }
    }
  }
#pragma unroll
  for (int m = 16; m > 0; m /= 2) total += __shfl_xor_sync(0xffffffffu, total, m);
  return total;
}

// The merged row, normalized, to O (o_row: the row's first column) and its LSE (lane 0, when lse is not null).
template <class Out, int kHeadDim>
__device__ __forceinline__ void store_merged_row(Out* o_row, float* lse, const float (&acc)[kHeadDim / 64][2],
                                                 float total, float max_lse) {
  const int lane = threadIdx.x % 32;
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int k = 0; k < kHeadDim / 64; ++k) {
    *reinterpret_cast<uint32_t*>(o_row + 64 * k + 2 * lane) = ElemTraits<Out>::pack2(acc[k][0] * inv, acc[k][1] * inv);
  }
  if (lse != nullptr && lane == 0) *lse = total > 0.f ? max_lse + logf(total) : -INFINITY;
}

template <class Out, int kHeadDim>
__global__ void __launch_bounds__(128) flashcore_combine_splits(const CombineParams c) {
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
  const SplitRows rows{c.lse_partial + first * c.seqlen_q + q, c.o_partial + (first * c.seqlen_q + q) * kHeadDim,
                       c.seqlen_q, c.splits};
  float acc[kPairs][2];
  float max_lse;
  const float total = merge_split_share<kHeadDim>(rows, part, wpr, acc, max_lse);
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
  const int64_t batch = bh / c.heads, head = bh % c.heads;
  Out* o_row = static_cast<Out*>(c.o) + batch * c.o_stride_batch + q * c.o_stride_seq + head * c.o_stride_head;
  store_merged_row<Out, kHeadDim>(o_row, c.lse != nullptr ? c.lse + row : nullptr, acc, total, max_lse);
}

}  // namespace flashcore::kernels

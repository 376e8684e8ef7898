// Split tiles (Cfg::kSplit == 2, config.h): warps 2i and 2i + 1 share 32 query rows. Half h of the pair computes
// S for keys [h, h + 1) x kWarpKeys of every key block and O for head-dim columns [h, h + 1) x kWarpDim, so per
// block the pair exchanges, through its slots of the exchange area (kSmemPairOffset) and a 64-thread named barrier:
//   1. the block's row maxima (each half's, combined by max) before the exponentials;
//   2. the P fragments, so that each half multiplies all of P with its columns of V (the partner's read from shared
//      memory one k-step at a time, in P V).
// Both exchanges are lane to lane: lane l of either half holds the same rows (and, in P's A fragments, the same
// positions within its keys), so a lane writes one 16-byte slot per value group and the partner's lane l reads it
// back: 32 lanes x 16 contiguous bytes, free of bank conflicts, no swizzle.
// Ordering: a slot written in block j is read by the partner before the barrier that follows in block j (1 before
// 2, 2 before the next block's 1), so one slot per kind suffices. At the end the row sums go through the maxima's
// slot the same way.
#pragma once
#include <cstdint>

#include "kernels/common/warp.cuh"
#include "kernels/sm80/config.h"

namespace flashcore::sm80 {

template <class Cfg>
struct PairExchange {  // (declared by every main loop, used by split tiles only)
  static constexpr int kPSteps = Cfg::kWarpKeys / 16;  // k-steps of P per half
  uint8_t* area;                                       // smem + Cfg::kSmemPairOffset
  int warp, lane;

  // Named barrier 1 + pair (0 is __syncthreads) over the pair's 64 threads.
  __device__ __forceinline__ void sync() const { kernels::named_barrier_sync(1 + warp / 2, 64); }
  __device__ __forceinline__ float4* stat_slot(int w) const {
    return reinterpret_cast<float4*>(area + w * Cfg::kPairWarpBytes) + lane;
  }
  __device__ __forceinline__ uint4* p_slot(int w, int t, int kk) const {
    return reinterpret_cast<uint4*>(area + w * Cfg::kPairWarpBytes + Cfg::kPairStatBytes) + (t * kPSteps + kk) * 32 +
           lane;
  }

  // m[t][i]: this half's block maxima of row i of row tile t (quad-reduced); returns the pair's.
  __device__ __forceinline__ void combine_max(float (&m)[2][2]) const {
    static_assert(Cfg::kSplit == 2 && Cfg::kMTiles == 2, "pairs of warps with two row tiles each");
    *stat_slot(warp) = make_float4(m[0][0], m[0][1], m[1][0], m[1][1]);
    sync();
    const float4 o = *stat_slot(warp ^ 1);
    m[0][0] = fmaxf(m[0][0], o.x), m[0][1] = fmaxf(m[0][1], o.y);
    m[1][0] = fmaxf(m[1][0], o.z), m[1][1] = fmaxf(m[1][1], o.w);
  }

  // Publishes this half's P fragments (A fragments of its kWarpKeys keys) for the partner.
  __device__ __forceinline__ void publish_p(const uint32_t (&own)[2][kPSteps][4]) const {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk) {
        *p_slot(warp, t, kk) = make_uint4(own[t][kk][0], own[t][kk][1], own[t][kk][2], own[t][kk][3]);
      }
    }
    sync();
  }
  // The partner's P fragments of k-step kk (after publish_p), one k-step at a time (registers: 255 with all of them).
  __device__ __forceinline__ void partner_p(int kk, uint32_t (&a)[2][4]) const {
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const uint4 v = *p_slot(warp ^ 1, t, kk);
      a[t][0] = v.x, a[t][1] = v.y, a[t][2] = v.z, a[t][3] = v.w;
    }
  }

  // Each half's per-thread row sums cover its keys: adds the partner's (same rows, same lane), before finalize.
  __device__ __forceinline__ void combine_sums(float (&a)[2], float (&b)[2]) const {
    *stat_slot(warp) = make_float4(a[0], a[1], b[0], b[1]);
    sync();
    const float4 o = *stat_slot(warp ^ 1);
    a[0] += o.x, a[1] += o.y, b[0] += o.z, b[1] += o.w;
  }
};

}  // namespace flashcore::sm80

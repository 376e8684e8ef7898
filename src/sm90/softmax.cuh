// Online softmax in registers. Each consumer thread owns two rows of its warpgroup's 64-row slice
// (lane/4 and lane/4 + 8 of its warp's 16) and a quarter of each row's columns; row statistics are
// combined across the 4 threads of a quad with shuffles. log2(e) is folded into the scale so that
// every exponential is a single ex2.approx.
#pragma once
#include <cmath>

#include "ptx/warp.h"
#include "sm90/mask.cuh"

namespace flashcore::sm90 {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

template <int kCols>  // columns of the score tile (kBlockN)
struct OnlineSoftmax {
  static constexpr int kRegs = kCols / 2;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running maxima
  float row_sum[2] = {0.f, 0.f};              // this thread's partial sums of exp

  // Turns scores s into unnormalized probabilities in place; returns per-row factors by which the
  // running output must be rescaled.
  __device__ __forceinline__ void update(float (&s)[kRegs], float scale_log2, float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float m = row_max[i];
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
        m = fmaxf(m, fmaxf(s[acc_index(j, i, 0)], s[acc_index(j, i, 1)]));
      }
      m = quad_max(m);
      // A row that has seen only masked keys keeps max -inf; use 0 so that exp2(-inf - 0) = 0.
      const float m_safe = (m == -INFINITY) ? 0.f : m;
      rescale[i] = ptx::exp2_approx((row_max[i] - m_safe) * scale_log2);
      row_max[i] = m;
      const float offset = m_safe * scale_log2;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[acc_index(j, i, e)];
          x = ptx::exp2_approx(fmaf(x, scale_log2, -offset));
          sum += x;
        }
      }
      row_sum[i] = row_sum[i] * rescale[i] + sum;
    }
  }

  // Final per-row normalizer (0 for rows that saw no key) and natural-log LSE (-inf for such rows).
  __device__ __forceinline__ void finalize(float scale_log2, float (&inv_sum)[2], float (&lse)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float sum = quad_sum(row_sum[i]);
      const bool empty = !(sum > 0.f);
      inv_sum[i] = empty ? 0.f : 1.f / sum;
      lse[i] = empty ? -INFINITY : (row_max[i] * scale_log2 + log2f(sum)) * 0.69314718055994530942f;
    }
  }
};

}  // namespace flashcore::sm90

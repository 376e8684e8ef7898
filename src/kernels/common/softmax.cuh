// Online softmax in registers, over row-pair fragments (fragment.cuh): each thread owns two rows and a
// quarter of each row's columns; row statistics are combined across the quad with shuffles. log2(e) is folded
// into the scale so that every exponential is one ex2.approx.
//
// Non-finite scores: a NaN or +Inf score in a row's visible keys makes that row's O and LSE NaN: fmaxf leaves a
// NaN out of the row max, but its exponential is NaN, so the row sum is NaN (and Inf - Inf is NaN), and
// finalize() treats only a zero sum as "no key" (docs/decisions.md#nan-scores: a NaN-propagating max, FMNMX.NAN, cost
// 3-5% at head dim 64). Masked keys are -Inf and contribute exactly 0. A row that sees no key gets O = 0 and
// LSE = -Inf.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/common/fragment.cuh"
#include "kernels/common/warp.cuh"

namespace flashcore::kernels {

// kExactLargeOffsets (the 8-bit kernels, whose descales can make scores huge): a row whose scaled max m * scale is
// 2^15 or more computes exp2((x - m) * scale) instead of exp2(x * scale - m * scale), whose rounded offset would be off
// by up to half an ulp of 2^15 and more (|scores| ~ 1e10 made every P of a row tiny, and P's e4m3 rounding then
// pushed O past the range of V). The branch is per row and per block; ordinary rows take the one-FFMA form.
// int8 scores as floats: an s32 x with |x| < 2^22 added to the bits of 1.5 * 2^23 is the float 1.5 * 2^23 + x, exactly
// (one integer add instead of a conversion, which would share the exponential unit's 16 results per clock).
inline constexpr float kInt8Magic = 12582912.f;  // 1.5 * 2^23
__device__ __forceinline__ float int8_bits_to_float(uint32_t x) { return __uint_as_float(x + 0x4B400000u); }

// kLazyRescale (configs.txt rescale "vote"; not for e4m3 P): a row keeps its running max while a block's max exceeds
// it by at most kLazySlackLog2 in log2 units, so P stays below 2^kLazySlackLog2 = 256 (exact in bf16 / fp16 range,
// O and the sums are fp32) and the rescale factor is exactly 1; once the maxima settle, nearly every block then
// leaves every row's max alone and the main loop's warp vote skips the O rescale (FlashAttention-4's conditional
// rescaling). O and the LSE use the same kept max throughout, so the result is the softmax up to rounding, and is
// deterministic.
inline constexpr float kLazySlackLog2 = 8.f;

// kRowAfterRow (the sm90 kernels): row 1's max reduction may not start before row 0's first exponential (below).
template <int kCols, bool kExactLargeOffsets = false, bool kLazyRescale = false,  // kCols: score tile columns
          bool kRowAfterRow = false>
struct OnlineSoftmax {
  static constexpr int kRegs = kCols / 2;
  float row_max[2] = {-INFINITY, -INFINITY};  // raw (unscaled) running maxima
  float row_sum[2] = {0.f, 0.f};              // this thread's partial sums of exp

  // Turns scores s into unnormalized probabilities in place; returns per-row factors by which the running
  // output must be rescaled.
  __device__ __forceinline__ void update(float (&s)[kRegs], float scale_log2, float (&rescale)[2]) {
    float after_row0 = -INFINITY;  // -inf or a NaN, made from row 0's first exponential (kRowAfterRow)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // kRowAfterRow: row 1's max starts from a value that depends on row 0's first exponential (its bits with sign
      // and exponent set: -inf or a NaN, which fmaxf ignores), so that ptxas cannot hoist row 1's max chain above
      // row 0's exponentials; it then runs that chain between them, in the issue gaps of the exponential unit, as
      // FlashAttention-3's SASS does (docs/decisions.md#row-after-row). Otherwise ptxas reduces both rows first.
      const float m = fold_max(s, i, (kRowAfterRow && i == 1) ? fmaxf(row_max[1], after_row0) : row_max[i]);
      exponentiate_row(s, i, quad_max(m), scale_log2, rescale);
      if (kRowAfterRow && i == 0) after_row0 = __uint_as_float(__float_as_uint(s[acc_index(0, 0, 0)]) | 0xff800000u);
    }
  }

  // The same in two steps, for rows whose key block is split between threads beyond the quad (the portable split
  // tiles, sm80/pair.cuh): the block's row maxima of this thread's quad, then, once they are combined with the other
  // part's, the update with the combined maxima.
  __device__ __forceinline__ void block_max(const float (&s)[kRegs], float (&m)[2]) const {
#pragma unroll
    for (int i = 0; i < 2; ++i) m[i] = quad_max(fold_max(s, i, -INFINITY));
  }
  __device__ __forceinline__ void update_with_max(float (&s)[kRegs], float scale_log2, const float (&m)[2],
                                                  float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) exponentiate_row(s, i, fmaxf(row_max[i], m[i]), scale_log2, rescale);
  }

  // m folded with this thread's scores of row i (fmaxf: a NaN score is left out).
  __device__ __forceinline__ static float fold_max(const float (&s)[kRegs], int i, float m) {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) m = fmaxf(m, fmaxf(s[acc_index(j, i, 0)], s[acc_index(j, i, 1)]));
    return m;
  }

  // Row i with its new running max m (the block's maximum folded into the old one): the rescale factor, P in place
  // of the scores, and the row sum.
  __device__ __forceinline__ void exponentiate_row(float (&s)[kRegs], int i, float m, float scale_log2,
                                                   float (&rescale)[2]) {
    // (-inf - -inf is NaN, not above the slack: a row with no key yet stays at -inf)
    if (kLazyRescale && !((m - row_max[i]) * scale_log2 > kLazySlackLog2)) m = row_max[i];
    // A row that has seen only masked keys keeps max -inf; use 0 so that exp2(-inf - 0) = 0.
    const float m_safe = (m == -INFINITY) ? 0.f : m;
    rescale[i] = exp2_approx((row_max[i] - m_safe) * scale_log2);
    row_max[i] = m;
    const float offset = m_safe * scale_log2;
    float sum = 0.f;
    if (kExactLargeOffsets && !(fabsf(offset) < 32768.f)) {
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[acc_index(j, i, e)];
          x = exp2_approx((x - m_safe) * scale_log2);
          sum += x;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[acc_index(j, i, e)];
          x = exp2_approx(fmaf(x, scale_log2, -offset));
          sum += x;
        }
      }
    }
    row_sum[i] = row_sum[i] * rescale[i] + sum;
  }

  // int8 Q K^T (precision = INT8): s holds s32 dot products as the bit patterns of kInt8Magic + value (int8_bits_
  // to_float), sc[i] the block's score scale of row i in log2 units (Q's token scale x the block's K scale x
  // softmax scale x log2 e; it changes from block to block), so the running maxima are kept scaled here (finalize
  // then takes scale 1). The exponent (x - magic) * sc - m is one FFMA: x * sc - (magic * sc + m), whose rounded
  // offset is off by at most half an ulp of magic * sc, i.e. 0.4 integer units of the dot product (the scores are
  // integers of up to 127^2 * head_dim).
  __device__ __forceinline__ void update_int8(float (&s)[kRegs], const float (&sc)[2], float (&rescale)[2]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
        mx = fmaxf(mx, fmaxf(s[acc_index(j, i, 0)], s[acc_index(j, i, 1)]));
      }
      mx = quad_max(mx);
      float m = fmaxf(row_max[i], (mx - kInt8Magic) * sc[i]);  // -inf - magic stays -inf
      if (kLazyRescale && !(m - row_max[i] > kLazySlackLog2)) m = row_max[i];  // (scaled maxima: log2 units)
      const float m_safe = (m == -INFINITY) ? 0.f : m;
      rescale[i] = exp2_approx(row_max[i] - m_safe);
      row_max[i] = m;
      const float offset = fmaf(kInt8Magic, sc[i], m_safe);
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[acc_index(j, i, e)];
          x = exp2_approx(fmaf(x, sc[i], -offset));
          sum += x;
        }
      }
      row_sum[i] = row_sum[i] * rescale[i] + sum;
    }
  }

  // Final per-row normalizer (0 for rows that saw no key) and natural-log LSE (-inf for such rows; NaN when
  // the row's scores held NaN or +Inf, matching O). sink_log2: an attention sink's logit times log2(e) (sink_log2_of),
  // which joins the denominator (the row's sum of exp(scores) gains exp(sink)) but not O; -inf: none.
  __device__ __forceinline__ void finalize(float scale_log2, float (&inv_sum)[2], float (&lse)[2],
                                           float sink_log2 = -INFINITY) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float sum = quad_sum(row_sum[i]);
      if (sink_log2 != -INFINITY) {  // (uniform: one sink per head)
        // The sum is relative to the row's max m: total = sum * 2^(m - top) + 2^(sink - top), top the larger of the
        // two, so that neither term overflows; a row that saw no key has sum 0 and gets O = 0, LSE = sink.
        const float m = row_max[i] == -INFINITY ? -INFINITY : row_max[i] * scale_log2;
        const float top = fmaxf(m, sink_log2);
        const float w = exp2f(m - top);
        const float total = fmaf(sum, w, exp2f(sink_log2 - top));
        inv_sum[i] = w / total;
        lse[i] = (top + __log2f(total)) * 0.69314718055994530942f;
        continue;
      }
      const bool empty = sum == 0.f;
      // A row with a key has sum >= 1 (its max contributes exp2(0) = 1, or more under the lazy rescale), so the
      // exponential unit's approximate reciprocal and log2 (MUFU.RCP, MUFU.LG2: about one ulp, 2^-22 absolute) need
      // none of the IEEE division's or log2f's range handling: one instruction each instead of ~40 with two branches
      // per row (docs/decisions.md#epilogue-diet).
      inv_sum[i] = empty ? 0.f : __fdividef(1.f, sum);
      lse[i] = empty ? -INFINITY : (row_max[i] * scale_log2 + __log2f(sum)) * 0.69314718055994530942f;
    }
  }
};

// The attention sink of query head `head` (VariantParams::sinks) in log2 units, -inf without sinks.
__device__ __forceinline__ float sink_log2_of(const float* sinks, int head) {
  return sinks != nullptr ? __ldg(sinks + head) * 1.4426950408889634f : -INFINITY;
}

// Logit softcapping (VariantParams::softcap_scale): s becomes tanh(s * softcap_scale); the softmax's scale then
// carries softcap * log2(e). Before the mask, whose -inf it would turn into -1.
template <int kRegs>
__device__ __forceinline__ void apply_softcap(float (&s)[kRegs], float softcap_scale) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) s[i] = tanh_approx(s[i] * softcap_scale);
}

// O *= rescale per row: the running output's correction when a row max grew (row-pair fragments, kCols columns).
template <int kCols>
__device__ __forceinline__ void rescale_rows(float (&o)[kCols / 2], const float (&rescale)[2]) {
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      o[acc_index(j, i, 0)] *= rescale[i];
      o[acc_index(j, i, 1)] *= rescale[i];
    }
  }
}

}  // namespace flashcore::kernels

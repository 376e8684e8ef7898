// Element types as the kernels see them: size, how two fp32 values pack into one 32-bit register, and the
// wgmma/mma k-step. Adding a dtype touches this file (a traits row) and the generator's dtype table only.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/common/fragment.cuh"

namespace flashcore::kernels {

template <class T>
struct ElemTraits;

template <>
struct ElemTraits<__nv_bfloat16> {
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static uint32_t pack2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

template <>
struct ElemTraits<__half> {
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static uint32_t pack2(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// 8-bit: P packs four probabilities per 32-bit register (pack4: byte i = value i, rounded to nearest, saturated
// to the finite range).
template <>
struct ElemTraits<__nv_fp8_e4m3> {
  static constexpr int kBytes = 1;
  __device__ __forceinline__ static uint32_t pack4(float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  }
};

// e5m2 inputs (Q, K, V): P stays e4m3 (its pack4 above; config.h).
template <>
struct ElemTraits<__nv_fp8_e5m2> {
  static constexpr int kBytes = 1;
};

// int8 (precision = INT8): Q and K only, quantized before the attention (int8_prep.cuh); P and V stay 16-bit.
template <>
struct ElemTraits<int8_t> {
  static constexpr int kBytes = 1;
};

// Tensor-core k-step: one MMA consumes 32 bytes of each K-major row (16 elements of 16 bits, 32 of 8 bits).
template <class T>
inline constexpr int kMmaK = 32 / ElemTraits<T>::kBytes;

}  // namespace flashcore::kernels

namespace flashcore::kernels {

// P (rows x kCols probabilities in row-pair accumulator fragments, fragment.cuh) as 16-bit MMA A fragments: k-step
// t (columns 16t..16t+15) is the accumulators of 8-column groups 2t and 2t+1, repacked into 4 registers. The same
// for wgmma's m64k16 (per warp) and mma.sync's m16k16 A layout.
template <class Element, int kCols>
__device__ __forceinline__ void pack_p_fragments(const float (&p)[kCols / 2], uint32_t (&a)[kCols / 16][4]) {
  static_assert(ElemTraits<Element>::kBytes == 2, "8-bit P: pack_p_fragments_8bit");
  using E = ElemTraits<Element>;
  static_assert(E::kBytes == 2, "8-bit P packs four values per register (the 8-bit path)");
#pragma unroll
  for (int t = 0; t < kCols / 16; ++t) {
    a[t][0] = E::pack2(p[acc_index(2 * t, 0, 0)], p[acc_index(2 * t, 0, 1)]);
    a[t][1] = E::pack2(p[acc_index(2 * t, 1, 0)], p[acc_index(2 * t, 1, 1)]);
    a[t][2] = E::pack2(p[acc_index(2 * t + 1, 0, 0)], p[acc_index(2 * t + 1, 0, 1)]);
    a[t][3] = E::pack2(p[acc_index(2 * t + 1, 1, 0)], p[acc_index(2 * t + 1, 1, 1)]);
  }
}

}  // namespace flashcore::kernels

namespace flashcore::kernels {

// 8-bit P as wgmma A fragments (m64k32 per warpgroup, m16k32 per warp). The 8-bit A layout gives a thread four
// consecutive k of a row (k = 4q..4q+3 and 16+4q..16+4q+3 for q = lane % 4), but the accumulator layout gives it
// pairs (keys 2q, 2q+1 of every 8-column group). Instead of moving values between threads, the key order inside each
// group of 32 keys is permuted: k-slot 4q + j of the MMA holds key p8_key_of_slot(4q + j), and V (the B operand,
// stored transposed, key index innermost) is written with the same permutation (fp8_prep.cuh), so P V sums the same
// products. Slots 16..31 repeat the pattern on keys 16..31.
__host__ __device__ constexpr int p8_key_of_slot(int slot) {
  const int half = slot / 16, q = (slot % 16) / 4, j = slot % 4;
  return 16 * half + (j < 2 ? 2 * q + j : 8 + 2 * q + (j - 2));
}

// k-step t (keys 32t..32t+31) takes the accumulators of the 8-column groups 4t..4t+3: register 0 row r keys
// {2q, 2q+1, 8+2q, 8+2q+1}, register 1 the same of row r+8, registers 2 and 3 the groups 4t+2, 4t+3.
template <class Element, int kCols>
__device__ __forceinline__ void pack_p_fragments_8bit(const float (&p)[kCols / 2], uint32_t (&a)[kCols / 32][4]) {
  using E = ElemTraits<Element>;
  static_assert(E::kBytes == 1, "16-bit P: pack_p_fragments");
#pragma unroll
  for (int t = 0; t < kCols / 32; ++t) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int g = 4 * t + 2 * (r / 2), i = r % 2;  // first 8-column group of the register, row half
      a[t][r] = E::pack4(p[acc_index(g, i, 0)], p[acc_index(g, i, 1)], p[acc_index(g + 1, i, 0)],
                         p[acc_index(g + 1, i, 1)]);
    }
  }
}

}  // namespace flashcore::kernels

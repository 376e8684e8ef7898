// Element types as the kernels see them: size, how two fp32 values pack into one 32-bit register, and the
// wgmma/mma k-step. Adding a dtype touches this file (a traits row) and the generator's dtype table only.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

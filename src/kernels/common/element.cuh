// Element types as the kernels see them: size, how two fp32 values pack into one 32-bit register, and the
// wgmma/mma k-step. Adding a dtype touches this file (a traits row) and the generator's dtype table only.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

// The portable backward kernel (sm_80 and newer: mma.sync + cp.async + ldmatrix): one CTA per (key block, KV head,
// batch), grid (ceil(seqlen_k / kBlockN), num_heads_kv, batch), kBlockN / 16 warps. Each role is one file:
// bwd_config.h (the tile and shared memory), bwd_mainloop.cuh (the steps), bwd_gemm.cuh (their mma.sync GEMMs),
// bwd_epilogue.cuh (dQ additions, dK and dV stores); the launches around it (D, scaled LSE, dQ conversion):
// kernels/common/bwd_prep.cuh. Included by the generated units (sources.cmake) only; host code sees bwd_launch.h.
#pragma once
#include <cuda_runtime.h>

#include "kernels/common/bwd_prep.cuh"
#include "kernels/sm80/bwd_config.h"
#include "kernels/sm80/bwd_launch.h"
#include "kernels/sm80/bwd_mainloop.cuh"
#include "kernels/sm80/bwd_mainloop_rows.cuh"
#include "kernels/sm80/bwd_params.h"

namespace flashcore::sm80 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flashcore_bwd_sm80_kernel(const __grid_constant__ BwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint8_t smem[];
  if constexpr (Cfg::kQueryRows) {
    bwd_mainloop_rows<Cfg>(p, smem);
  } else {
    bwd_mainloop<Cfg>(p, smem);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an arch below sm_80: never return as if dK and dV had been written (the host checks the image)
#endif
}

// The kernel of a row's (T, head dim, tile, causal, variants), or nullptr where none is compiled: the 128-row tiles
// have plain kernels only (their variants' calls take the next row, bwd_launch.cpp).
template <class T, int kD, bool kCausal, int kN, int kStages, bool kVariants, int kM>
constexpr const void* bwd_kernel_of() {
  if constexpr (kVariants && kM != 64) {
    return nullptr;
  } else {
    using Cfg = BwdConfig<T, kD, kCausal, kN, kStages, kVariants, kM>;
    return reinterpret_cast<const void*>(&flashcore_bwd_sm80_kernel<Cfg>);
  }
}

}  // namespace flashcore::sm80

// One row of the backward table (bwd_launch.h): the generated unit of (T, head dim) names one per tile (BLOCK_N keys,
// STAGES Q / dO buffers, BLOCK_M query rows a step). The preparation and conversion kernels are this backend's
// instances (kBackend 80).
#define FLASHCORE_SM80_DEFINE_BWD(NAME, T, DTYPE, HEAD_DIM, BLOCK_N, STAGES, BLOCK_M)                          \
  namespace flashcore::sm80 {                                                                                 \
  extern const BwdKernelRow kBwd_##NAME = {                                                                   \
      DTYPE,                                                                                                  \
      HEAD_DIM,                                                                                               \
      BLOCK_N,                                                                                                \
      STAGES,                                                                                                 \
      BLOCK_M,                                                                                                \
      {{bwd_kernel_of<T, HEAD_DIM, false, BLOCK_N, STAGES, false, BLOCK_M>(),                                 \
        bwd_kernel_of<T, HEAD_DIM, true, BLOCK_N, STAGES, false, BLOCK_M>()},                                 \
       {bwd_kernel_of<T, HEAD_DIM, false, BLOCK_N, STAGES, true, BLOCK_M>(),                                  \
        bwd_kernel_of<T, HEAD_DIM, true, BLOCK_N, STAGES, true, BLOCK_M>()}},                                 \
      BwdConfig<T, HEAD_DIM, false, BLOCK_N, STAGES, false, BLOCK_M>::kSmemBytes,                             \
      BwdConfig<T, HEAD_DIM, false, BLOCK_N, STAGES, false, BLOCK_M>::kThreads,                               \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_prep<T, HEAD_DIM, 80>),                           \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_dq_convert<T, HEAD_DIM, 80>),                     \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_dsinks<80>)};                                     \
  }

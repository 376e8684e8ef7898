// The portable forward kernel (sm_80 and newer: mma.sync + cp.async + ldmatrix): one CTA per tile of kBlockM
// query rows, 4 or 8 warps of 16 or 32 rows each (split tiles: warp pairs of 32). Each role is one file: tile.cuh
// (which tile), loads.cuh (cp.async copies), mainloop.cuh (the key-block loop and softmax), gemm.cuh (its mma.sync
// GEMMs), pair.cuh (a split tile's exchanges between the warps of a pair), epilogue.cuh (stores), smem.cuh (the
// swizzled layout), ptx.cuh (the instructions). Included by the generated instantiation units only
// (sources.cmake); host code sees kernel_row.h.
#pragma once
#include <cuda_runtime.h>

#include "kernels/sm80/config.h"
#include "kernels/sm80/epilogue.cuh"
#include "kernels/sm80/kernel_row.h"
#include "kernels/sm80/mainloop.cuh"
#include "kernels/sm80/tile.cuh"

namespace flashcore::sm80 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flashcore_fwd_sm80_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint8_t smem[];
  const Tile tile = decode_tile<Cfg>(p, static_cast<int>(blockIdx.x));
  WarpState<Cfg> st;
  mainloop<Cfg>(p, tile, smem, st);
  epilogue<Cfg>(p, tile, smem, st);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an arch below sm_80: never return as if O had been written (the host checks the image)
#endif
}

}  // namespace flashcore::sm80

// One row of the kernel table: the generated unit defines the row struct ROW (config.h) and names it here.
#define FLASHCORE_SM80_DEFINE_ROW(ROW, NAME, DTYPE, OUT_DTYPE, IS_DEFAULT, MAX_SEQLEN_K, MIN_CTAS)            \
  namespace flashcore::sm80 {                                                                                   \
  extern const KernelRow kRow_##ROW = {                                                                         \
      NAME, DTYPE, OUT_DTYPE, ROW::kHeadDim, ROW::kCausal, IS_DEFAULT, MAX_SEQLEN_K, MIN_CTAS, ROW::kShape,     \
      KernelConfig<ROW>::kThreads, KernelConfig<ROW>::kSmemBytes,                                               \
      reinterpret_cast<const void*>(&flashcore_fwd_sm80_kernel<KernelConfig<ROW>>), ROW::kHeadDimV};           \
  }

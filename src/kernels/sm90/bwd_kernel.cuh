// The sm90 backward kernel: a producer warpgroup (TMA loads, bwd_producer.cuh; its second warp adds dQ blocks to the
// workspace, bwd_epilogue.cuh) and two consumer warpgroups (wgmma; bwd_mainloop.cuh, or bwd_mainloop_wide.cuh above
// head dim 128; stores in bwd_epilogue.cuh) per CTA, one CTA per (key block, KV head, batch): grid
// (ceil(seqlen_k / kBlockN), num_heads_kv, batch), seqlen_k the longest sequence's for packed (varlen) batches. The
// launches around it (D, scaled LSE, dQ conversion): kernels/common/bwd_prep.cuh. Included by the generated units
// (sources.cmake) only; host code sees bwd_launch.h.
#pragma once
#include <cuda_runtime.h>

#include "kernels/common/bwd_prep.cuh"
#include "kernels/sm90/bwd_config.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {
template <class T, int N>
struct WgmmaSSTransAB;
template <class T, int N>
struct WgmmaSSTransB;
#include "kernels/sm90/wgmma_bwd_ops.inc"
}  // namespace flashcore::sm90

#include "kernels/sm90/bwd_epilogue.cuh"
#include "kernels/sm90/bwd_mainloop.cuh"
#include "kernels/sm90/bwd_mainloop_wide.cuh"
#include "kernels/sm90/bwd_producer.cuh"
#include "kernels/sm90/bwd_launch.h"

namespace flashcore::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flashcore_bwd_sm90_kernel(const __grid_constant__ BwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (base & 1023u)) & 1023u);  // 128-byte swizzled tiles: 1024-byte aligned
  auto& bars = *reinterpret_cast<BwdBarriers<Cfg>*>(smem + Cfg::kSmemBarriers);
  static_assert(sizeof(BwdBarriers<Cfg>) <= Cfg::kSmemBarrierBytes, "barriers overflow their shared memory");
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (threadIdx.x == 0) bars.init();
  __syncthreads();
  const BwdWork work = bwd_work<Cfg>(p);
  if (!work.has_keys) return;  // a packed batch's grid covers its longest sequence
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x < 32) {
      if (elect_one_sync()) bwd_produce<Cfg>(p, work, smem, bars);
    } else if (threadIdx.x < 64) {
      if constexpr (!Cfg::kWide) {  // (the wide kernel's consumers add dQ themselves)
        if (elect_one_sync()) bwd_dq_write<Cfg>(p, work, smem, bars);
      }
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    if constexpr (Cfg::kWide) {
      bwd_consume_wide<Cfg>(p, work, smem, bars, warpgroup - 1);
    } else {
      bwd_consume<Cfg>(p, work, smem, bars, warpgroup - 1);
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for another arch: the host checks the image before launching
#endif
}

// The kernel of (T, head dim, causal, variants, V head dim).
template <class T, int kD, bool kCausal, bool kVariants, int kDv>
constexpr const void* bwd_kernel_of() {
  return reinterpret_cast<const void*>(&flashcore_bwd_sm90_kernel<BwdConfigOf<T, kD, kCausal, kVariants, kDv>>);
}

}  // namespace flashcore::sm90

// One row of the backward table (bwd_launch.h): the generated unit of (T, head dim, V head dim) names it here.
#define FLASHCORE_SM90_DEFINE_BWD(NAME, T, DTYPE, HEAD_DIM, HEAD_DIM_V)                                             \
  namespace flashcore::sm90 {                                                                                       \
  using BwdCfg_##NAME = BwdConfigOf<T, HEAD_DIM, false, false, HEAD_DIM_V>;                                          \
  extern const BwdKernelRow kBwd_##NAME = {                                                                         \
      DTYPE,                                                                                                        \
      HEAD_DIM,                                                                                                     \
      HEAD_DIM_V,                                                                                                   \
      {{bwd_kernel_of<T, HEAD_DIM, false, false, HEAD_DIM_V>(),                                                        \
        bwd_kernel_of<T, HEAD_DIM, true, false, HEAD_DIM_V>()},                                                        \
       {bwd_kernel_of<T, HEAD_DIM, false, true, HEAD_DIM_V>(),                                                         \
        bwd_kernel_of<T, HEAD_DIM, true, true, HEAD_DIM_V>()}},                                                        \
      BwdCfg_##NAME::kSmemBytes,                                                                                    \
      BwdCfg_##NAME::kThreads,                                                                                      \
      {BwdCfg_##NAME::kBlockM, BwdConfigOf<T, HEAD_DIM, false, true, HEAD_DIM_V>::kBlockM},                         \
      BwdCfg_##NAME::kBlockN,                                                                                       \
      BwdCfg_##NAME::kChunkCols,                                                                                    \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_prep<T, HEAD_DIM, 90, HEAD_DIM_V>),                     \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_dq_convert<T, HEAD_DIM>),                               \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_dsinks<90>),                                            \
      reinterpret_cast<const void*>(&kernels::flashcore_bwd_zero_kv<T, HEAD_DIM, 90, HEAD_DIM_V>)};                 \
  }

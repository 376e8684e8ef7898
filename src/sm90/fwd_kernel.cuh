// The sm90 forward kernel: a producer warpgroup (TMA) and two consumer warpgroups (wgmma + online
// softmax) per CTA, one CTA per (query block, head, batch). Included by the generated instantiation
// units only; host code sees src/sm90/fwd_launch_decl.h.
#pragma once
#include <cuda_runtime.h>

#include "ptx/warp.h"
#include "sm90/epilogue.cuh"
#include "sm90/fwd_launch_decl.h"
#include "sm90/mainloop.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/producer.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/tile_config.h"

namespace flashcore::sm90 {

template <class Cfg, class Element, bool kCausal>
__device__ __forceinline__ void consumer_tile(const FwdParams& p, int tile_idx, uint8_t* smem,
                                              Barriers<Cfg::kStages>& bars, int warpgroup, ConsumerPipe<Cfg>& pipe) {
  const Tile tile = schedule_tile<Cfg::kBlockM, Cfg::kBlockN, kCausal>(p, tile_idx);
  ConsumerState<Cfg> st;
  consumer_mainloop<Cfg, Element, kCausal>(p, tile, smem, bars, warpgroup, st, pipe);
  consumer_epilogue<Cfg, Element>(p, tile, smem, bars, warpgroup, st);
}

template <class Element, int kHeadDim, bool kCausal>
__global__ void __launch_bounds__(TileConfig<kHeadDim, kCausal>::kThreads, 1)
    flashcore_fwd_sm90_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = TileConfig<kHeadDim, kCausal>;
  extern __shared__ uint8_t smem_raw[];
  // 128B swizzling repeats every 1024 bytes: tiles must start 1024-byte aligned.
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (base & 1023u)) & 1023u);
  auto& bars = *reinterpret_cast<Barriers<Cfg::kStages>*>(smem + Cfg::kSmemBarrierOffset);

  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (threadIdx.x == 0) bars.init(Cfg::kConsumerThreads, Cfg::kQReleaseArrivals);
  __syncthreads();

  // Persistent: each CTA walks the tile list with stride gridDim.x; the producer runs ahead into the next
  // tile's K/V (and Q, once the epilogue has released its buffer) while the consumers finish this one.
  // Other grids have one CTA per tile (scheduler.cuh) and run the body once, as straight-line code.
  constexpr bool kPersistent = persistent_grid(kHeadDim, kCausal);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x == 0) {
      RingState<Cfg::kStages> ring;
      uint32_t tiles_done = 0;
      if constexpr (kPersistent) {
        for (int t = blockIdx.x; t < p.num_tiles; t += gridDim.x) {
          producer_tile<Cfg>(p, schedule_tile<Cfg::kBlockM, Cfg::kBlockN, kCausal>(p, t), smem, bars, ring,
                             tiles_done);
        }
      } else {
        producer_tile<Cfg>(p, schedule_tile<Cfg::kBlockM, Cfg::kBlockN, kCausal>(p, blockIdx.x), smem, bars,
                           ring, tiles_done);
      }
    }
  } else {
    ptx::setmaxnreg_inc<Cfg::kConsumerRegs>();
    ConsumerPipe<Cfg> pipe;
    if constexpr (kPersistent) {
      for (int t = blockIdx.x; t < p.num_tiles; t += gridDim.x) {
        consumer_tile<Cfg, Element, kCausal>(p, t, smem, bars, warpgroup - 1, pipe);
      }
      // The last TMA store must have read the staged O before the CTA's shared memory goes away.
      if (Cfg::kSeparateO && threadIdx.x % 128 == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    } else {
      consumer_tile<Cfg, Element, kCausal>(p, blockIdx.x, smem, bars, warpgroup - 1, pipe);
    }
  }
#endif
}

template <class Element, int kHeadDim, bool kCausal>
cudaError_t launch_fwd(const FwdParams& params, unsigned num_ctas, int device, cudaStream_t stream) {
  using Cfg = TileConfig<kHeadDim, kCausal>;
  auto kernel = flashcore_fwd_sm90_kernel<Element, kHeadDim, kCausal>;
  // The dynamic shared-memory limit is a per-device attribute of the function.
  cudaError_t err = cudaSuccess;
  static unsigned long long configured_devices = 0;  // bit d: attribute set on device d
  const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
  if (bit == 0 || !(__atomic_load_n(&configured_devices, __ATOMIC_ACQUIRE) & bit)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    __atomic_fetch_or(&configured_devices, bit, __ATOMIC_ACQ_REL);
  }
  kernel<<<num_ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace flashcore::sm90

#define FLASHCORE_SM90_INSTANTIATE(Element, HeadDim, Causal)                                        \
  template cudaError_t flashcore::sm90::launch_fwd<Element, HeadDim, (Causal) != 0>(                \
      const flashcore::sm90::FwdParams&, unsigned, int, cudaStream_t);

// The sm90 forward kernel: a producer warpgroup (TMA) and 1-3 consumer warpgroups (wgmma + online softmax) per
// CTA, walking the tiles its scheduler hands it. Each role is one file: scheduler.cuh (which tiles),
// producer.cuh (loads), transpose_v.cuh (8-bit V transposed by the producer's other warps), convert_kv.cuh (an e4m3
// KV cache widened to 16 bits by those warps), mainloop.cuh (GEMMs +
// softmax), epilogue.cuh (stores), pipeline.cuh (the hand-offs); decode_swap.cuh is the consumer of the transposed
// decode rows (block_m 8), decode_swap_kv8.cuh its main loop on an e4m3 KV cache.
// Included by the generated instantiation units only (gen_rows.cpp, run by sources.cmake); host code sees kernel_row.h.
#pragma once
#include <cuda_runtime.h>

#include "kernels/sm90/config.h"
#include "kernels/sm90/convert_kv.cuh"
#include "kernels/sm90/decode_swap.cuh"
#include "kernels/sm90/decode_swap_kv8.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/kernel_row.h"
#include "kernels/sm90/mainloop.cuh"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/producer.cuh"
#include "kernels/sm90/ptx.cuh"
#include "kernels/sm90/scheduler.cuh"
#include "kernels/sm90/transpose_v.cuh"

namespace flashcore::sm90 {

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) flashcore_fwd_sm90_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  // 128B swizzling repeats every 1024 bytes: tiles must start 1024-byte aligned.
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (base & 1023u)) & 1023u);
  auto& bars = *reinterpret_cast<SharedBarriers<Cfg>*>(smem + Cfg::kSmemBarrierOffset);
  static_assert(sizeof(SharedBarriers<Cfg>) <= Cfg::kSmemBarrierBytes, "barriers overflow their shared memory");

  // Programmatic dependent launch (the host's launch attribute, backend.cpp): this grid's CTAs may be placed while
  // the stream's previous kernel finishes, once every CTA of that kernel has triggered (below). The barriers live in
  // shared memory, so they are set up before the wait; nothing reads or writes global memory before the previous
  // kernel has completed and its writes are visible.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  // (An e4m3 KV cache's rows: the converter warps, fewer where a paged call's table warp takes warp 1.)
  const bool table_warp = kPageWarp<Cfg> && p.block_table != nullptr;
  if (threadIdx.x == 0) bars.init(convert_warps(table_warp));
  cudaGridDependencySynchronize();
  // And the next kernel's CTAs may be placed as soon as every CTA of this grid runs: on the SMs this grid leaves idle
  // or has finished with. Its own wait still holds it until this grid has completed and its writes are visible.
  cudaTriggerProgrammaticLaunchCompletion();
  // A packed (varlen) batch's grid covers its longest sequence for every sequence (tile.cuh), so many CTAs of a
  // one-tile-per-CTA launch hold a query block past their own sequence's end: nothing to load, compute or store. They
  // leave before the rest of the set-up (docs/decisions.md#varlen).
  if constexpr (Cfg::kSchedule == Schedule::kOneTilePerCta && kServingLayouts<Cfg>) {
    if (static_cast<int>(blockIdx.x) < p.num_tiles && !tile_has_rows<Cfg>(p, static_cast<int>(blockIdx.x))) return;
  }
  __syncthreads();

  TileScheduler<Cfg> sched{bars};
  if (warpgroup == 0) {
    setmaxnreg_dec<Cfg::kProducerRegs>();
    if (threadIdx.x < 32 && elect_one_sync()) {
      Producer<Cfg> producer;
      for (int t = sched.first(); t < p.num_tiles; t = sched.producer_next(p, t)) {
        producer.load_tile(p, decode_tile<Cfg>(p, t), smem, bars);
      }
      if (v_transposed_by_producer<Cfg>(p)) producer.end_v_transposes(bars);
      if constexpr (Cfg::kKV8 && !Cfg::kKV8Direct) producer.end_kv8_converters(bars);
    } else if constexpr (Cfg::kTransposesV) {
      if (p.transpose_v && threadIdx.x >= 32) {
        VTransposer<Cfg>(static_cast<int>(threadIdx.x % 32)).run(smem, bars, static_cast<int>(threadIdx.x / 32) - 1);
      }
    } else {
      const int warp = static_cast<int>(threadIdx.x / 32);
      if constexpr (kPageWarp<Cfg>) {
        if (table_warp && warp == 1) PageFetcher<Cfg>::run(p, bars);
      }
      if constexpr (Cfg::kKV8 && !Cfg::kKV8Direct) {
        const int first = table_warp ? 2 : 1;
        if (warp >= first) KVConverter<Cfg>::run(smem, bars, warp - first, convert_warps(table_warp));
      }
    }
  } else {
    setmaxnreg_inc<Cfg::kConsumerRegs>();
    ConsumerPipes<Cfg> pipes;
    if constexpr (Cfg::kSwapAB) {  // decode with the GEMMs transposed (decode_swap.cuh)
      for (int t = sched.first(); t < p.num_tiles; t = sched.consumer_next(p, t)) {
        const Tile tile = decode_tile<Cfg>(p, t);
        SwapState<Cfg> st;
        if constexpr (Cfg::kKV8Direct) {
          swap_kv8_mainloop<Cfg>(p, tile, smem, bars, st, pipes);
        } else {
          swap_mainloop<Cfg>(p, tile, smem, bars, st, pipes);
        }
        swap_epilogue<Cfg>(p, t, tile, smem, bars, st, pipes);
        pipes.q.advance();
      }
    } else {
      for (int t = sched.first(); t < p.num_tiles; t = sched.consumer_next(p, t)) {
        const Tile tile = decode_tile<Cfg>(p, t);
        ConsumerState<Cfg> st;
        consumer_mainloop<Cfg>(p, tile, smem, bars, warpgroup - 1, st, pipes);
        consumer_epilogue<Cfg>(p, t, tile, smem, bars, warpgroup - 1, st, pipes);
        pipes.q.advance();
      }
      // The last TMA store must have read the staged O before the CTA's shared memory goes away.
      if (Cfg::kSeparateO && threadIdx.x % 128 == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    }
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#error "FlashCore's sm90 kernels need the sm_90a target (-gencode=arch=compute_90a,code=sm_90a), not sm_90"
#elif defined(__CUDA_ARCH__)
  __trap();  // built for another arch: never return as if O had been written (the host checks the image first)
#endif
}

}  // namespace flashcore::sm90

// One row of the kernel table: the generated unit defines the row struct ROW (config.h) and names it here.
#define FLASHCORE_SM90_DEFINE_ROW(ROW, NAME, DTYPE, OUT_DTYPE, IS_DEFAULT, MAX_SEQLEN_K, KV_DTYPE)               \
  namespace flashcore::sm90 {                                                                                   \
  extern const KernelRow kRow_##ROW = {                                                                         \
      NAME, DTYPE, OUT_DTYPE, ROW::kHeadDim, ROW::kCausal, IS_DEFAULT, ROW::kShape,                             \
      KernelConfig<ROW>::kThreads, KernelConfig<ROW>::kSmemBytes, KernelConfig<ROW>::kSeparateO,                \
      reinterpret_cast<const void*>(&flashcore_fwd_sm90_kernel<KernelConfig<ROW>>), 1.0f, MAX_SEQLEN_K, #ROW,  \
      KernelConfig<ROW>::kTwoPSets, ROW::kHeadDimV, KV_DTYPE};                                                  \
  }

// Pipelines between the producer and the consumers: one object per operand (Q, the K ring, the V ring, the
// tile ids of the dynamic scheduler), each a ring of full/empty mbarrier pairs with the same four verbs:
//   producer: acquire (wait until the stage is empty), commit / commit_tx (mark it full; with TMA, announce
//             the transaction bytes the copy engine will deliver)
//   consumer: wait (until the stage is full), release (hand it back)
// Each side walks the ring with its own PipelineState (stage + phase parity), so both sides agree on the phase
// of every use as long as both skip or take the same uses: a tile with no key blocks takes no Q stage on
// either side (which rules out the phase aliasing of a shared Q barrier, docs/decisions.md#q-stage).
// The number of producer arrivals is a parameter: 1 for a TMA producer thread, a warp or more for copy
// engines that gather rows (cp.async, paged KV).
#pragma once
#include <cuda/ptx>

#include <cstdint>
#include <type_traits>

#include "kernels/sm90/smem_plan.h"

namespace flashcore::sm90 {

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

// The same wait, the thread suspended until the phase completes (or the hint's time limit, 10 ms, passes) instead of
// polling: a waiting thread takes no issue slots from the warps it shares a scheduler with (the backward's producer
// and dQ writer polled some 100 times per step, 13% of the kernel's instructions).
__device__ __forceinline__ void mbar_wait_sleep(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity, 0x989680u)) {
  }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar);
}

template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ PipelineState state() const { return *this; }
  // The position before this one (the producer's V of the block before: producer.cuh).
  __device__ __forceinline__ PipelineState previous() const {
    return stage == 0 ? PipelineState{kStages - 1, phase ^ 1u} : PipelineState{stage - 1, phase};
  }
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// The same position as one count of uses, stage and phase derived where used: one register instead of two, for the
// producer thread of a packed row on the dynamic schedule (TileShape::packed), whose 24 registers hold the tile-id
// ring beside a packed tile's decode. state() and advance() as PipelineState's.
template <int kStages>
struct PipelineCount {
  uint32_t uses = 0;
  __device__ __forceinline__ PipelineState<kStages> state() const {
    return {static_cast<int>(uses % kStages), (uses / kStages) & 1u};
  }
  __device__ __forceinline__ PipelineState<kStages> previous() const {
    return PipelineCount{uses - 1}.state();
  }
  __device__ __forceinline__ void advance() { ++uses; }
};

// A ring position: counted (kCount) or as stage and phase.
template <int kStages, bool kCount>
using RingPosition = std::conditional_t<kCount, PipelineCount<kStages>, PipelineState<kStages>>;

template <int kStages, bool kSleep = false>  // kSleep: mbar_wait_sleep's waits
struct Pipeline {
  uint64_t full[kStages];
  uint64_t empty[kStages];
  using State = PipelineState<kStages>;

  __device__ __forceinline__ void init(uint32_t producer_arrivals, uint32_t consumer_arrivals) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      cuda::ptx::mbarrier_init(&full[s], producer_arrivals);
      cuda::ptx::mbarrier_init(&empty[s], consumer_arrivals);
    }
  }

  // Producer side. A fresh empty barrier passes parity 1 at once, so the first lap does not wait.
  __device__ __forceinline__ void acquire(const State& st) { wait_on(&empty[st.stage], st.phase ^ 1u); }
  // Arrive on the full barrier and announce `bytes` of TMA transactions; returns the barrier the copies signal.
  __device__ __forceinline__ uint64_t* commit_tx(const State& st, uint32_t bytes) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &full[st.stage], bytes);
    return &full[st.stage];
  }
  __device__ __forceinline__ void commit(const State& st) { mbar_arrive(&full[st.stage]); }

  // Consumer side.
  __device__ __forceinline__ void wait(const State& st) { wait_on(&full[st.stage], st.phase); }
  __device__ __forceinline__ void release(const State& st) { mbar_arrive(&empty[st.stage]); }

 private:
  static __device__ __forceinline__ void wait_on(uint64_t* bar, uint32_t parity) {
    if constexpr (kSleep) {
      mbar_wait_sleep(bar, parity);
    } else {
      mbar_wait(bar, parity);
    }
  }
};

// Warps 1-3 of the producer warpgroup transpose 8-bit V tiles (transpose_v.cuh); warp 0 holds the TMA thread.
inline constexpr int kTransposeWarps = 3;
// The warps that widen an e4m3 KV cache's blocks (convert_kv.cuh): 1-3 of the producer warpgroup, or 2-3 where warp 1
// is a paged call's table warp (producer.cuh PageFetcher).
__host__ __device__ constexpr int convert_warps(bool table_warp) { return table_warp ? 2 : 3; }

// Every pipeline of the kernel, carved from shared memory at KernelConfig::kSmemBarrierOffset.
template <class Cfg>
struct SharedBarriers {
  static constexpr int kTileStages = 2;  // tile ids published ahead by the dynamic scheduler
  Pipeline<Cfg::kQStages> q;             // the Q tiles (each released after its last read, see config.h)
  Pipeline<Cfg::kStages> k;
  Pipeline<Cfg::kStages> v;
  Pipeline<kTileStages> tile;
  int tile_id[kTileStages];
  uint32_t sink;  // written only by keep_allocated's branch, which never runs (mainloop.cuh)
  // 8-bit V transposed by the producer warps (transpose_v.cuh): v_transposed[s] completes once stage s is
  // transposed (one arrival per transposer warp); v_end[s] != 0 marks the stage the producer thread ends them with.
  uint64_t v_transposed[Cfg::kTransposesV ? Cfg::kStages : 1];
  int v_end[Cfg::kStages];
  uint32_t v_lap[Cfg::kTransposesV ? kTransposeWarps : 1];  // each transposer warp's stage count (VTransposer::run)
  // A paged cache's block-table entries, fetched by the table warp a chunk at a time (producer.cuh, PageFetcher): the
  // page of each (key block, slice) of the tile, last block first; configs without a table warp keep one slot.
  static constexpr bool kPagedSlots =
      takes_paged(Cfg::kShape) && fetches_pages(Cfg::kShape) && Cfg::kElemBytes == 2;
  Pipeline<2> pages;
  int32_t page_slots[kPagedSlots ? 2 * kPageChunk : 1];
  // An e4m3 KV cache (Cfg::kKV8): k8_full[s] / v8_full[s] complete when the TMA has filled staging stage s (the
  // producer thread's arrival and the bytes); k.full / v.full then take one arrival per converter warp
  // (convert_kv.cuh), and v_end[s] != 0 ends the converters' loop, as it ends the transposers'.
  // (The transposed decode rows' consumers read the staging ring: the TMA completes k.full / v.full, as on 16-bit rows.)
  uint64_t k8_full[Cfg::kKV8 && !Cfg::kKV8Direct ? Cfg::kStages : 1];
  uint64_t v8_full[Cfg::kKV8 && !Cfg::kKV8Direct ? Cfg::kStages : 1];
  // The rows of V staging stage s the converters widen (rows at or past it, past the sequence, they write as zeros),
  // stored by the producer thread before its arrival on v8_full[s] (release), so that no other thread writes the
  // 16-bit V tile (the host clears FwdParams::zero_v_tail for these rows: mainloop.cuh zero_v_rows_past_end).
  int v_rows[Cfg::kKV8 && !Cfg::kKV8Direct ? Cfg::kStages : 1];
  // bf16 Q on an e4m3 KV cache (Cfg::kHalfCompute): each consumer warp's largest finite |q| of the Q slice, as bf16
  // bits (convert_kv.cuh q_slice_to_half).
  uint32_t q_amax[Cfg::kHalfCompute ? 4 : 1];

  // converters: the warps that arrive on k.full / v.full of an e4m3 KV cache's rows (convert_warps).
  __device__ __forceinline__ void init(int converters = 0) {
    q.init(1, Cfg::kQReleaseArrivals);
    const uint32_t kv_arrivals = Cfg::kKV8 && !Cfg::kKV8Direct ? static_cast<uint32_t>(converters) : 1u;
    k.init(kv_arrivals, Cfg::kConsumerThreads);
    v.init(kv_arrivals, Cfg::kConsumerThreads);
    tile.init(1, Cfg::kConsumerThreads);
    if constexpr (kPagedSlots) pages.init(32, 1);  // the table warp's lanes; the producer thread
    if constexpr (Cfg::kTransposesV) {
#pragma unroll
      for (int s = 0; s < Cfg::kStages; ++s) {
        cuda::ptx::mbarrier_init(&v_transposed[s], kTransposeWarps);
        v_end[s] = 0;
      }
      for (int w = 0; w < kTransposeWarps; ++w) v_lap[w] = 0;
    }
    if constexpr (Cfg::kKV8 && !Cfg::kKV8Direct) {
#pragma unroll
      for (int s = 0; s < Cfg::kStages; ++s) {
        cuda::ptx::mbarrier_init(&k8_full[s], 1);
        cuda::ptx::mbarrier_init(&v8_full[s], 1);
        v_end[s] = 0;
      }
    }
    // Make the initialized barriers visible to the async (TMA) proxy.
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }

  // The consumers' wait for V stage st: its TMA load, or, when the producer warps transpose it, their transpose.
  __device__ __forceinline__ void wait_v(const PipelineState<Cfg::kStages>& st, bool transposed_by_producer) {
    mbar_wait(transposed_by_producer ? &v_transposed[st.stage] : &v.full[st.stage], st.phase);
  }
};

}  // namespace flashcore::sm90

// The K/V ring: mbarrier-based full/empty handshakes between the TMA producer and the consumer
// warpgroups (CCCL cuda::ptx wrappers over mbarrier.* instructions).
#pragma once
#include <cuda/ptx>

#include <cstdint>

namespace flashcore::sm90 {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
  cuda::ptx::mbarrier_init(bar, arrivals);
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar);
}

// Arrive and announce the bytes the TMA unit will deliver to this barrier in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                       bytes);
}

// Position in the ring: which stage, and which phase (parity) of that stage's barriers.
template <int kStages>
struct RingState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1u;
    }
  }
};

// Barriers of the kernel, carved from shared memory. Full barriers: one producer arrival plus the
// TMA transaction bytes. Empty barriers: one arrival per consumer thread once it no longer reads
// the stage.
template <int kStages>
struct Barriers {
  uint64_t q_full;
  uint64_t q_empty;  // Q tile free again for the next tile's load (TileConfig::kQReleaseArrivals arrivals)
  uint64_t k_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_full[kStages];
  uint64_t v_empty[kStages];

  __device__ __forceinline__ void init(uint32_t consumer_threads, uint32_t q_release_arrivals) {
    mbar_init(&q_full, 1);
    mbar_init(&q_empty, q_release_arrivals);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&k_empty[s], consumer_threads);
      mbar_init(&v_empty[s], consumer_threads);
    }
    // Make the initialized barriers visible to the async (TMA) proxy.
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
};

}  // namespace flashcore::sm90

// The sm90 backward kernel's tile: a CTA owns one block of kBlockN keys of one KV head (K and V stay in shared memory)
// and walks the query blocks of kBlockM rows of every query head of the KV group; each of its two consumer warpgroups
// owns 64 of the keys. Shared-memory layout as data, host and device (bwd_launch.cpp reads the size).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/bwd_layout.h"

namespace flashcore::sm90 {

// kIsVariants: the variants' flavour (bwd_mainloop.cuh): the causal one masks by the call's window
// (kernels/common/bwd_window.h), both take the softcap; calls without a window or softcap run the plain kernels.
template <class T, int kD, bool kIsCausal, bool kIsVariants = false>
struct BwdConfig {
  using Element = T;
  static constexpr int kHeadDim = kD;
  static constexpr bool kCausal = kIsCausal;
  static constexpr bool kVariants = kIsVariants;
  static constexpr int kBlockM = 64;   // query rows per step (the N of S^T = K Q^T)
  static constexpr int kBlockN = 128;  // keys per CTA: 64 per consumer warpgroup (the M of every GEMM)
  static constexpr int kConsumerWarpgroups = kBlockN / 64;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
  static constexpr int kStages = 2;  // Q / dO / LSE / D stages
  static constexpr int kMmaK = 16;
  static constexpr int kChunkCols = 64;  // one 128-byte swizzled row chunk of 16-bit elements
  static constexpr int kChunks = kD / kChunkCols;
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");

  // dQ(kBlockM x kD) = dS(kBlockM x keys) K(keys x kD), split over the warpgroups: at head dim 128 by columns (each
  // warpgroup one 64-column chunk over all 128 keys), at 64 by keys (each its own 64 keys; the two partial sums meet
  // in shared memory). Either way a warpgroup's accumulator is 64 x 64.
  static constexpr bool kDqSplitKeys = kChunks == 1;
  static constexpr int kDqKeys = kDqSplitKeys ? 64 : kBlockN;
  static constexpr int kDqRegs = 32;  // m64n64 fp32
  // The consumer threads that fill a dQ block before the writer warp may add it to the workspace: both warpgroups at
  // head dim 128 (a region each), warpgroup 1 at 64 (it adds its sums to warpgroup 0's).
  static constexpr int kDqFullArrivals = kDqSplitKeys ? 128 : kConsumerThreads;

  // Shared memory, byte offsets from the 1024-aligned base. Each operand is chunk-major: chunk c (64 columns) of all
  // its rows, 128-byte rows, 128-byte swizzle (as TMA writes them).
  static constexpr int kKVChunkBytes = kBlockN * 128;
  static constexpr int kKVBytes = kChunks * kKVChunkBytes;
  static constexpr int kQChunkBytes = kBlockM * 128;
  static constexpr int kQBytes = kChunks * kQChunkBytes;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;  // dS^T, keys x queries (one 128-byte row per key)
  static constexpr int kDqBytes = kBlockM * kD * 4;       // the fp32 dQ of a step, as bwd_epilogue.cuh lays it out
  static constexpr int kRowStatBytes = kBlockM * 4;       // a step's scaled LSE (or D) for its kBlockM rows

  static constexpr int kSmemK = 0;
  static constexpr int kSmemV = kSmemK + kKVBytes;
  static constexpr int kSmemQ = kSmemV + kKVBytes;
  static constexpr int kSmemDo = kSmemQ + kStages * kQBytes;
  static constexpr int kSmemDs = kSmemDo + kStages * kQBytes;  // two buffers, alternating by step
  static constexpr int kSmemDq = kSmemDs + 2 * kDsBytes;     // two buffers, alternating by step
  static constexpr int kSmemLse = kSmemDq + 2 * kDqBytes;      // kStages x kRowStatBytes
  static constexpr int kSmemD = kSmemLse + kStages * kRowStatBytes;
  static constexpr int kSmemBarriers = kSmemD + kStages * kRowStatBytes;
  static constexpr int kSmemBarrierBytes = 128;
  // + 1024: the dynamic shared memory base is aligned up to 1024 bytes in the kernel.
  static constexpr int kSmemBytes = kSmemBarriers + kSmemBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static_assert(kSmemQ % 1024 == 0 && kSmemDo % 1024 == 0 && kSmemDs % 1024 == 0 && kSmemDq % 1024 == 0,
                "swizzled operands start 1024-byte aligned");

  // The bytes one step's loads bring (the full barrier's transaction count).
  static constexpr uint32_t kStepTxBytes = 2 * kQBytes + 2 * kRowStatBytes;
  static constexpr uint32_t kKVTxBytes = 2 * kKVBytes;
};

}  // namespace flashcore::sm90

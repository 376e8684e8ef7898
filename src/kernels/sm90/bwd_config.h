// The sm90 backward kernel's tile: a CTA owns one block of kBlockN keys of one KV head (K and V stay in shared memory)
// and walks the query blocks of kBlockM rows of every query head of the KV group; each of its two consumer warpgroups
// owns 64 of the keys. Shared-memory layout as data, host and device (bwd_launch.cpp reads the size).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/bwd_layout.h"

namespace flashcore::sm90 {

// What both backward tiles share (BwdConfig, BwdWideConfig): a producer warpgroup and two consumer warpgroups, the
// register split, the Q / dO / LSE / D ring, and shared memory that starts with K, V and the Q and dO stages. Each
// operand is chunk-major: chunk c (kChunkCols columns) of all its rows, kRowBytes-byte rows with the kRowBytes-byte
// swizzle, as TMA writes them (128 bytes; 64 where a warpgroup's share of the columns is not whole 128-byte chunks).
// K, Q and dQ have kD columns, V and dO kDv. Offsets are bytes from the 1024-aligned base.
template <class T, int kD, int kM, int kN, int kDv = kD, int kRowB = 128>
struct BwdTileBase {
  using Element = T;
  static constexpr int kHeadDim = kD;
  static constexpr int kHeadDimV = kDv;
  static constexpr int kBlockM = kM;  // query rows per step
  static constexpr int kBlockN = kN;  // keys per CTA
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
  static constexpr int kStages = 2;  // Q / dO / LSE / D stages
  static constexpr int kMmaK = 16;
  static constexpr int kRowBytes = kRowB;
  static constexpr int kChunkCols = kRowBytes / 2;  // one swizzled row chunk of 16-bit elements
  static constexpr int kChunks = kD / kChunkCols;
  static constexpr int kChunksV = kDv / kChunkCols;
  static_assert(kD % kChunkCols == 0 && kDv % kChunkCols == 0, "whole chunks");

  static constexpr int kKVChunkBytes = kBlockN * kRowBytes;
  static constexpr int kKBytes = kChunks * kKVChunkBytes;
  static constexpr int kVBytes = kChunksV * kKVChunkBytes;
  static constexpr int kQChunkBytes = kBlockM * kRowBytes;
  static constexpr int kQBytes = kChunks * kQChunkBytes;
  static constexpr int kDoBytes = kChunksV * kQChunkBytes;
  static constexpr int kRowStatBytes = kBlockM * 4;  // a step's scaled LSE (or D) for its kBlockM rows

  static constexpr int kSmemK = 0;
  static constexpr int kSmemV = kSmemK + kKBytes;
  static constexpr int kSmemQ = kSmemV + kVBytes;
  static constexpr int kSmemDo = kSmemQ + kStages * kQBytes;
  static constexpr int kSmemOwn = kSmemDo + kStages * kDoBytes;  // where the tile's own buffers start

  // The bytes one step's loads bring (the full barrier's transaction count), and K and V's.
  static constexpr uint32_t kStepTxBytes = kQBytes + kDoBytes + 2 * kRowStatBytes;
  static constexpr uint32_t kKVTxBytes = kKBytes + kVBytes;
};

// The end of a tile's shared memory, after its own buffers (ending at kOwnEnd): the LSE and D stages, the barriers,
// and + 1024 for the alignment of the dynamic shared-memory base (the kernel aligns it up to 1024 bytes).
template <class Base, int kOwnEnd>
struct BwdSmemTail {
  static constexpr int kLse = kOwnEnd;
  static constexpr int kD = kLse + Base::kStages * Base::kRowStatBytes;
  static constexpr int kBarriers = kD + Base::kStages * Base::kRowStatBytes;
  static constexpr int kBarrierBytes = 128;
  static constexpr int kBytes = kBarriers + kBarrierBytes + 1024;
  static_assert(kBytes <= 227 * 1024, "shared memory");
};

// kIsVariants: the variants' flavour (bwd_mainloop.cuh): the causal one masks by the call's window
// (kernels/common/bwd_window.h), both take the softcap; calls without a window or softcap run the plain kernels.
// Query rows per step (the N of S^T = K Q^T): 128 at head dim 64, where a 64-row step's GEMMs were too short to keep
// the tensor cores busy (decisions.md#bwd-design), 64 at 128, whose registers hold dK and dV of 128 columns, and in the
// variants' kernels (at 128 rows the softcap's tanh and derivative spilled). 128 keys per CTA: 64 per consumer
// warpgroup (the M of every GEMM).
// Head dim 96 (192-byte rows): Q, K, V and dO as three chunks of 64-byte rows (the forward's #head-dim-96).
template <class T, int kD, bool kIsCausal, bool kIsVariants = false>
struct BwdConfig : BwdTileBase<T, kD, kD == 64 && !kIsVariants ? 128 : 64, 128, kD, kD % 64 == 0 ? 128 : 64> {
  using Base = BwdTileBase<T, kD, kD == 64 && !kIsVariants ? 128 : 64, 128, kD, kD % 64 == 0 ? 128 : 64>;
  using Base::kBlockM, Base::kBlockN, Base::kChunks, Base::kChunkCols, Base::kConsumerWarpgroups,
      Base::kConsumerThreads;
  static constexpr bool kWide = false;
  static constexpr bool kCausal = kIsCausal;
  static constexpr bool kVariants = kIsVariants;
  static_assert(kD == 64 || kD == 96 || kD == 128, "head dims 64, 96 and 128");
  static constexpr int kSRegs = kBlockM / 2;     // a warpgroup's S^T (or dP^T): 64 keys x kBlockM queries, fp32
  static constexpr int kPFrags = kBlockM / 16;   // its 16-bit A fragments (P^T, dS^T) for the dV / dK GEMMs

  // dQ (kBlockM x kD) = dS (kBlockM x 128 keys) K (128 keys x kD), split over the two warpgroups so that each holds a
  // 64 x 64 accumulator: by queries at head dim 64 (warpgroup w: query rows 64w.., every key and column), by columns
  // at 128 (warpgroup w: column chunk w, every key and query); either way warpgroup w fills region w of the step's
  // dQ block (kernels/common/bwd_layout.h: a region is a 64-row block's 64 columns). The d64 variants' 64-row steps
  // and head dim 96 (whose halves, 48 columns, start inside a chunk) split it by keys (warpgroup w: its own 64 keys,
  // every column), and warpgroup 1 adds its partial sums to warpgroup 0's.
  static constexpr bool kDqByQueries = kBlockM == 128;
  static constexpr bool kDqSplitKeys = !kDqByQueries && (kD / 2) % kChunkCols != 0;
  static_assert(kDqSplitKeys || (kDqByQueries ? kBlockM / 64 : kChunks) == kConsumerWarpgroups,
                "one dQ region per warpgroup");
  static constexpr int kDqKeys = kDqSplitKeys ? 64 : kBlockN;  // the keys of a warpgroup's dQ GEMM
  static constexpr int kDqCols = kDqSplitKeys ? kD : 64;       // and its columns (the GEMM's N)
  static constexpr int kDqFullArrivals = kDqSplitKeys ? 128 : kConsumerThreads;  // the threads that fill a block
  static constexpr int kDqRegs = kDqCols / 2;  // m64nN fp32
  // The step's dQ block in shared memory, as the writer warp adds it to the workspace: two buffers where they fit.
  static constexpr int kDqStages = kBlockM == 128 ? 1 : 2;

  // dS^T, keys x queries, chunk-major as the other operands: chunk c holds queries 64c.. of every key.
  static constexpr int kDsChunkBytes = kBlockN * 128;
  static constexpr int kDsBytes = kBlockN * kBlockM * 2;
  static constexpr int kDqBytes = kBlockM * kD * 4;  // the fp32 dQ of a step, as bwd_epilogue.cuh lays it out

  static constexpr int kSmemDs = Base::kSmemOwn;            // two buffers, alternating by step
  static constexpr int kSmemDq = kSmemDs + 2 * kDsBytes;    // kDqStages buffers, alternating by step
  using Tail = BwdSmemTail<Base, kSmemDq + kDqStages * kDqBytes>;
  static constexpr int kSmemLse = Tail::kLse, kSmemD = Tail::kD;  // kStages x kRowStatBytes each
  static constexpr int kSmemBarriers = Tail::kBarriers, kSmemBarrierBytes = Tail::kBarrierBytes;
  static constexpr int kSmemBytes = Tail::kBytes;
  static_assert(Base::kSmemQ % 1024 == 0 && Base::kSmemDo % 1024 == 0 && kSmemDs % 1024 == 0 && kSmemDq % 1024 == 0,
                "swizzled operands start 1024-byte aligned");
};

}  // namespace flashcore::sm90

namespace flashcore::sm90 {

// The wide head dims' backward (bwd_mainloop_wide.cuh; head dims 192 and 256, and (192, 128)): dK and dV of 64 keys
// x 192 or 256 columns do not fit in one warpgroup's registers, so the two consumer warpgroups split them by columns
// (kD / 2 and kDv / 2 each) over the CTA's 64 keys. Each computes S and dP for half the keys (64 queries x 32 keys,
// query-major: M = queries), writes its halves of P and dS (16-bit, query-major) to shared memory, and after both
// halves are in, dV += P^T dO, dK += dS^T Q and dQ = dS K for its columns from shared memory; dQ goes to the
// workspace by vector atomic adds from registers (no shared-memory block: 64 x 256 fp32 would not fit beside the
// stages). A warpgroup's columns start on a chunk: 128-byte rows at 256, 64-byte ones (32-column chunks) where half
// the columns is not whole 128-byte chunks (192: 96 columns a warpgroup). kIsVariants: the variants' flavour (the
// window's mask in the causal one, the softcap in both; bwd_mainloop_wide.cuh).
template <int kD, int kDv>
inline constexpr int kBwdWideRowBytes = (kD / 2) % 64 == 0 && (kDv / 2) % 64 == 0 ? 128 : 64;

template <class T, int kD, bool kIsCausal, int kDv = kD, bool kIsVariants = false>
struct BwdWideConfig : BwdTileBase<T, kD, 64, 64, kDv, kBwdWideRowBytes<kD, kDv>> {  // 64 rows a step, 64 keys a CTA
  using Base = BwdTileBase<T, kD, 64, 64, kDv, kBwdWideRowBytes<kD, kDv>>;
  using Base::kBlockM, Base::kBlockN, Base::kConsumerWarpgroups, Base::kConsumerThreads, Base::kChunkCols;
  static constexpr bool kWide = true;
  static constexpr bool kCausal = kIsCausal;
  static constexpr bool kVariants = kIsVariants;
  static_assert(kD == 192 || kD == 256, "head dims 192 and 256");
  static constexpr int kColsPerWarpgroup = kD / kConsumerWarpgroups;    // dK and dQ columns of a warpgroup
  static constexpr int kColsVPerWarpgroup = kDv / kConsumerWarpgroups;  // dV columns of a warpgroup
  static_assert(kColsPerWarpgroup % kChunkCols == 0 && kColsVPerWarpgroup % kChunkCols == 0,
                "a warpgroup's columns are whole chunks");
  static constexpr int kKeysPerWarpgroup = kBlockN / kConsumerWarpgroups;  // S and dP columns of a warpgroup
  static constexpr int kSRegs = kBlockM * kKeysPerWarpgroup / 128;  // 16
  static constexpr int kAccRegs = kBlockN * kColsPerWarpgroup / 128;    // dK and dQ (keys or queries x columns)
  static constexpr int kAccVRegs = kBlockN * kColsVPerWarpgroup / 128;  // dV
  static constexpr int kDqStages = 1;  // (BwdBarriers' dQ ring: unused, dQ is added from registers)
  static constexpr int kDqFullArrivals = kConsumerThreads;

  static constexpr int kPBytes = kBlockM * kBlockN * 2;  // P or dS: query-major, one 128-byte row of 64 keys a query
  static constexpr int kSmemP = Base::kSmemOwn;          // two buffers, alternating by step
  static constexpr int kSmemDs = kSmemP + 2 * kPBytes;  // two buffers, alternating by step
  using Tail = BwdSmemTail<Base, kSmemDs + 2 * kPBytes>;
  static constexpr int kSmemLse = Tail::kLse, kSmemD = Tail::kD;
  static constexpr int kSmemBarriers = Tail::kBarriers, kSmemBarrierBytes = Tail::kBarrierBytes;
  static constexpr int kSmemBytes = Tail::kBytes;
  static_assert(Base::kSmemQ % 1024 == 0 && Base::kSmemDo % 1024 == 0 && kSmemP % 1024 == 0 && kSmemDs % 1024 == 0,
                "swizzled operands start 1024-byte aligned");
};

// The kernel of (T, head dim, causal, variants, V head dim): the wide one above 128.
template <class T, int kD, bool kIsCausal, bool kIsVariants, int kDv = kD>
using BwdConfigOf = std::conditional_t<(kD > 128), BwdWideConfig<T, kD, kIsCausal, kDv, kIsVariants>,
                                       BwdConfig<T, kD, kIsCausal, kIsVariants>>;

}  // namespace flashcore::sm90

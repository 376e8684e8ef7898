// The portable backward kernel's tile: a CTA owns kBlockN keys of one KV head, K and V in shared memory, and walks the
// 64-row query blocks of every query head of the KV group, kWarps = kBlockN / 16 warps. Two orders of the step
// (docs/decisions.md#sm80-backward): the plain 128-key kernels take queries as rows (bwd_mainloop_rows.cuh: warps
// 2 x 4 over S and dP, P and dS through shared memory; kQueryRows); the variants' kernels and the 64-key tiles take
// keys as rows (bwd_mainloop.cuh: warp w owns keys 16w.., one m16 row tile of S^T = K Q^T and of its dK and dV; dQ of
// a step split over the same warps, row tile w % 4, column part w / 4).
// The tiles (sources.cmake, _fc_sm80_bwd_tiles): 128 keys, Q / dO double-buffered, where shared memory allows
// (97 KB at head dim 64: every 8.x device; 161 KB at 128: sm_80/87/90); 64 keys, single Q / dO buffers at head
// dim 128 on sm_86/89 (72.5 KB of their 99 KB).
// Shared memory: every tile is rows of 16-byte units with the XOR swizzle of smem.cuh (K, V, Q, dO: rows of kHeadDim
// elements; dS^T: one 128-byte row of 64 queries per key; the query-rows kernels' P and dS: one 256-byte row of 128
// keys per query). The members kThreads, kElemBytes, kRowBytes, kRowUnits and kCopyThreadsPerRow are the ones
// loads.cuh's copies read.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"

namespace flashcore::sm80 {

// kIsVariants: the variants' flavour (bwd_mainloop.cuh): the causal one masks by the call's window
// (kernels/common/bwd_window.h), both take the softcap; calls without a window or softcap run the plain kernels.
// kM: query rows per step, 64 (the workspace's dQ block, kernels/common/bwd_layout.h), or 128 for the plain
// query-rows kernels at head dim 64 (two blocks a step, as FlashAttention-2's d64 tile; 162 KB: sm_80/87/90).
template <class T, int kD, bool kIsCausal, int kN, int kStageCount, bool kIsVariants = false, int kM = 64>
struct BwdConfig {
  using Element = T;
  static constexpr int kHeadDim = kD;
  static constexpr bool kCausal = kIsCausal;
  static constexpr bool kVariants = kIsVariants;
  static constexpr int kBlockM = kM;  // query rows per step
  static constexpr int kDqBlocks = kBlockM / 64;  // the workspace's 64-row dQ blocks a step adds to
  static constexpr int kBlockN = kN;  // keys per CTA
  static constexpr int kStages = kStageCount;  // Q / dO / LSE / D buffers
  static constexpr int kWarps = kBlockN / 16;
  static constexpr int kThreads = 32 * kWarps;

  static constexpr int kElemBytes = kernels::ElemTraits<Element>::kBytes;
  static constexpr int kRowBytes = kHeadDim * kElemBytes;
  static constexpr int kRowUnits = kRowBytes / 16;
  static constexpr int kCopyThreadsPerRow = 8;  // loads.cuh TileCopy: one or two 128-byte column groups per thread
  static constexpr int kDsRowBytes = kBlockM * kElemBytes;  // dS^T: a key's 64 queries
  // Queries per sub-step: a warp's S^T and dP^T (16 keys x kSubM, fp32) live beside its dK and dV accumulators
  // (kHeadDim each), so at head dim 128 the step's 64 queries go in two halves (the K and V fragments are read twice);
  // in one, S^T and dP^T spilled there.
  static constexpr int kSubM = kHeadDim == 128 ? (kVariants ? 16 : 32) : 64;

  // dQ(64 x kHeadDim) = dS(64 x kBlockN) K: warp w computes row tile w % 4 (16 queries) over kDqCols columns from
  // column (w / 4) * kDqCols, at most 64 columns (32 accumulators) at a time; 32 in the plain 64-key kernels, which
  // spilled 8 bytes at 64 once the dQ adds went one register at a time (bwd_epilogue.cuh).
  static constexpr int kDqColParts = kWarps / 4;
  static constexpr int kDqCols = kHeadDim / kDqColParts;
  static constexpr int kDqChunk = kDqCols < 64 ? kDqCols : (kBlockN == 64 && !kVariants ? 32 : 64);

  // The query-rows kernels (bwd_mainloop_rows.cuh; the plain 128-key tiles): S and dP with queries as rows, warps 2 x 4
  // over the step's 64 queries x 128 keys (32 x 32 each); P and dS through shared memory (64 rows of 128 keys each);
  // dV and dK by warps 4 x 2 over keys x head dim (32 keys x kHeadDim / 2 columns each); dQ by warps 2 x 4 over
  // queries x head dim (32 x kHeadDim / 4). The others: bwd_mainloop.cuh's keys-as-rows order.
  static constexpr bool kQueryRows = kBlockN == 128 && !kIsVariants;
  static constexpr int kPRowBytes = kBlockN * kElemBytes;  // a query's 128 keys
  static constexpr int kPBytes = kQueryRows ? kBlockM * kPRowBytes : 0;

  static constexpr int kKVBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  static constexpr int kDsBytes = kBlockN * kDsRowBytes;
  static constexpr int kStatBytes = 2 * kBlockM * 4;  // a step's scaled LSE, then its D, kBlockM floats each
  static constexpr int kSmemK = 0;
  static constexpr int kSmemV = kSmemK + kKVBytes;
  static constexpr int kSmemQ = kSmemV + kKVBytes;          // stage s: + s * kQBytes
  static constexpr int kSmemDo = kSmemQ + kStages * kQBytes;  // stage s: + s * kQBytes
  static constexpr int kSmemDs = kSmemDo + kStages * kQBytes;
  static constexpr int kSmemP = kSmemDs + kDsBytes;           // query-rows kernels: P (kSmemDs holds dS)
  static constexpr int kSmemStats = kSmemP + kPBytes;         // stage s: + s * kStatBytes
  static constexpr int kSmemBytes = kSmemStats + kStages * kStatBytes;

  static_assert(kElemBytes == 2, "16-bit inputs only (mma.sync m16n8k16)");
  static_assert(kHeadDim == 64 || kHeadDim == 128, "head dims 64 and 128 (dK and dV of 16 keys x 256 columns would "
                                                   "take every register of a thread)");
  static_assert(kBlockN == 64 || kBlockN == 128, "64 or 128 keys: 4 or 8 warps, 4 dQ row tiles x 1 or 2 parts");
  static_assert(kBlockM == 64 || (kBlockM == 128 && kQueryRows && kHeadDim == 64),
                "128-row steps: the plain query-rows kernels at head dim 64 only");
  static_assert(kStages == 1 || kStages == 2, "single or double Q / dO buffers");
  static_assert(kDqCols % kDqChunk == 0 && kDqChunk % 16 == 0, "whole dQ chunks of 16-column pairs");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

}  // namespace flashcore::sm80

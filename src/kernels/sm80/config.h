// A portable kernel config: one row of the tile-config table (configs.txt) turned into the compile-time
// constants the sm80 kernel is built from. Rows are generated (sources.cmake) as small structs:
//
//   struct Row {                              // e.g. bf16, head dim 128, causal, 128 x 64, 2 stages
//     using Element = __nv_bfloat16;          // Q, K, V
//     using OutElement = __nv_bfloat16;       // O
//     static constexpr int kHeadDim = 128;
//     static constexpr bool kCausal = true;
//     static constexpr TileShape kShape = {128, 64, 2, 4, 1};  // block_m, block_n, stages, warps, split
//   };
//
// Each warp owns kRowsPerWarp = block_m / warps query rows: one or two m16 row tiles (kMTiles). Two row tiles share
// every K and V fragment a warp loads from shared memory, which halves the ldmatrix traffic per MMA (the
// FlashAttention-2 layout: 4 warps x 32 rows for head dims 64 and 128).
// Split tiles (kSplit = 2, pair.cuh): two warps share 32 rows. Each computes S for its half of the key block and
// O for its half of the head dim; the pair exchanges the block's row maxima and its P fragments through shared memory
// (two 64-thread barriers per key block). Made for head dim 256, whose O accumulators leave no room for 32 rows per
// warp: per MMA a warp reads about a third fewer bytes of shared memory than with 16 rows per warp (K: half the keys
// for 32 rows, V: half the columns; Nsight Compute: 21% fewer wavefronts). That bought speed only in the 8-warp
// 128 x 64 tile (docs/decisions.md#sm80-warp-pairs).
// Shared memory holds the Q tile and a ring of kStages (K tile, V tile) pairs; every tile is rows of kHeadDim
// elements, stored with the 16-byte-unit XOR swizzle of smem.cuh (rows of a multiple of 128 bytes, or the 192-byte
// rows of head dim 96). No alignment beyond 16 bytes is needed.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/sm80/tile_shape.h"

namespace flashcore::sm80 {

template <class Row>
struct KernelConfig {
  using Element = typename Row::Element;
  using OutElement = typename Row::OutElement;
  static constexpr int kHeadDim = Row::kHeadDim;    // Q's and K's
  static constexpr int kHeadDimV = Row::kHeadDimV;  // V's and O's (MLA prefill: 192 / 128)
  static constexpr bool kCausal = Row::kCausal;
  static constexpr bool kTakesWindow = kCausal;  // a sliding window in the causal rows (kernels/common/mask.cuh)
  static constexpr TileShape kShape = Row::kShape;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kStages = kShape.stages;
  // Three stages: the main loop overlaps P V of a key block with S of the next (gemm.cuh, gemm_pv_qk).
  static constexpr bool kOverlap = kStages == 3;

  static constexpr int kElemBytes = kernels::ElemTraits<Element>::kBytes;
  static constexpr int kOutElemBytes = kernels::ElemTraits<OutElement>::kBytes;
  static constexpr int kMmaK = kernels::kMmaK<Element>;  // 16: mma.sync m16n8k16

  static constexpr int kWarps = kShape.warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kSplit = kShape.split;                 // warps per row group
  static constexpr int kRowsPerWarp = kBlockM * kSplit / kWarps;
  static constexpr int kMTiles = kRowsPerWarp / 16;           // m16 row tiles per warp
  static constexpr int kWarpKeys = kBlockN / kSplit;          // S columns per warp
  static constexpr int kWarpDim = kHeadDimV / kSplit;         // O columns per warp
  // The lazy rescale (mainloop.cuh, Softmax): measured per head dim on an H200 running this code
  // (docs/decisions.md#sm80-lazy-rescale): +2..5% at 128, -2..3% at 64 and -7..8% at 256 (there the branch keeps the
  // rescale FMULs from filling the mma issue gaps), so head dim 128 only.
  static constexpr bool kLazyRescale = kHeadDim == 128;

  // Q stays in registers (A fragments of every k-step) when that leaves room for the O accumulators (kHeadDim / 2
  // per row tile) and the scores; otherwise (d256, or two row tiles at d128) the Q fragments are read from shared
  // memory with ldmatrix at every k-step.
  static constexpr bool kQInRegs = kMTiles * kHeadDim <= 128;

  static constexpr int kRowBytes = kHeadDim * kElemBytes;  // one tile row
  static constexpr int kRowUnits = kRowBytes / 16;         // 16-byte units per row (cp.async, ldmatrix rows)
  // cp.async copies: threads per tile row (loads.cuh, TileCopy). 8 at head dims 64 and 128 (one or two 128-byte
  // column groups per thread and row); 16 at head dim 256, where 8 (four 16-byte copies per row back to back) lost
  // 1-7% on the H100 at 512-4k keys (more MIO-throttle stalls), docs/decisions.md#sm80-copies. 4 at head dim 96: its
  // 12-unit rows split only into 1, 2, 3, 4, 6 or 12 threads' units, and the copies' compile-time offsets need a
  // multiple of the swizzle's 4-unit groups (smem.cuh) and a whole number of rows per pass of the CTA: 4 (three copies
  // per thread and row, 64 contiguous bytes per 4 threads; not measured against anything).
  static constexpr int kCopyThreadsPerRow = kHeadDim == 256 ? 16 : kHeadDim == 96 ? 4 : 8;
  static constexpr int kQBytes = kBlockM * kRowBytes;
  // V's rows (and O's, staged in the Q tile's rows: epilogue.cuh) hold kHeadDimV elements.
  static constexpr int kVRowBytes = kHeadDimV * kElemBytes;
  static constexpr int kKTileBytes = kBlockN * kRowBytes;
  static constexpr int kVTileBytes = kBlockN * kVRowBytes;
  static constexpr int kSmemQOffset = 0;
  static constexpr int kSmemKOffset = kSmemQOffset + kQBytes;                    // stage s: + s * kKTileBytes
  static constexpr int kSmemVOffset = kSmemKOffset + kStages * kKTileBytes;      // stage s: + s * kVTileBytes
  // Two row tiles with head_dim + block_n >= 192 fill the 255-register budget (O and S accumulators): their row
  // statistics (max and sum of both rows of each tile, 16 bytes per thread and tile) then wait in shared memory between
  // key blocks (mainloop.cuh). Without it these configs spilled on sm_80/86/89.
  // Split tiles too: their sm_90 images spilled with the statistics in registers; and head dim 96 (96 + 64 = 160), whose
  // sm_90 images spilled 4-24 bytes with them in registers (those of sm_80/86/89 did not).
  static constexpr bool kSoftmaxInSmem =
      kMTiles == 2 && (kWarpDim + kWarpKeys >= 192 || kSplit == 2 || kHeadDim == 96);
  static constexpr int kSmemSoftmaxOffset = kSmemVOffset + kStages * kVTileBytes;
  // Split tiles' exchange area (pair.cuh): per warp, its P fragments (16 bytes per lane, row tile and k-step) and one
  // 16-byte slot per lane for row maxima and sums.
  static constexpr int kPairStatBytes = 32 * 16;
  static constexpr int kPairPBytes = kMTiles * (kWarpKeys / 16) * 32 * 16;
  static constexpr int kPairWarpBytes = kPairStatBytes + kPairPBytes;  // one warp's slots: statistics, then P
  static constexpr int kPairBytes = kSplit == 2 ? kWarps * kPairWarpBytes : 0;
  static constexpr int kSmemPairOffset = kSmemSoftmaxOffset + (kSoftmaxInSmem ? kMTiles * kThreads * 16 : 0);
  static constexpr int kSmemBytes = kSmemPairOffset + kPairBytes;


  static_assert(kElemBytes == 2 && kOutElemBytes == 2, "16-bit inputs and outputs only (mma.sync m16n8k16)");
  // Head dim 96 (192-byte rows) only with head_dim_v = 96 too: O is staged in Q's rows, and V's copies share Q's and
  // K's threads per row (kCopyThreadsPerRow, 4 there), which suit 12-unit rows only (smem.cuh, loads.cuh).
  static_assert((kHeadDim % 64 == 0 && kHeadDimV % 64 == 0) || (kHeadDim == 96 && kHeadDimV == 96),
                "head dims must be multiples of 64 (the swizzle permutes 8 units of 16 B), or 96 and 96 (12 units)");
  static_assert(kHeadDimV <= kHeadDim && kVRowBytes / 16 % kCopyThreadsPerRow == 0,
                "V's rows at most Q's (O is staged in Q's rows) and whole copy units per thread");
  static_assert(kWarps == 4 || kWarps == 8, "4 or 8 warps");
  static_assert(kSplit == 1 || (kSplit == 2 && kMTiles == 2 && !kOverlap && kWarpKeys % 16 == 0 &&
                                kWarpDim * kElemBytes % 128 == 0),
                "split 2: pairs of 32 rows, whole k-steps of keys and whole 128-byte column groups per warp (not "
                "head dim 96), and no 3-stage overlap");
  static_assert(kMTiles * 16 * kWarps == kBlockM * kSplit && (kMTiles == 1 || kMTiles == 2),
                "block_m = warps x 16 or warps x 32 rows (split 2: warps / 2 x 32)");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 16 && kBlockN <= 128, "block_n: a multiple of 16 up to 128");
  static_assert(kStages >= 1 && kStages <= 4, "1 (single K and V buffers) to 4 stages");
  static_assert(kBlockM * kRowUnits % kThreads == 0 && kBlockN * kRowUnits % kThreads == 0,
                "tiles must split evenly into 16-byte units per thread");
  static_assert(kSmemBytes <= 227 * 1024, "tile does not fit in shared memory of any supported GPU");
};

}  // namespace flashcore::sm80

// One constexpr tile configuration per head dim, shared by host dispatch and device code.
#pragma once
#include <cstdint>

namespace flashcore::sm90 {

struct TileShape {
  int block_m;    // query rows per CTA: 64 per consumer warpgroup
  int block_n;    // keys per K/V tile
  int stages;     // depth of the K/V ring
  bool pingpong;    // consumer warpgroups take turns issuing GEMMs (PingPong in mainloop.cuh)
  bool persistent;  // non-causal grids: one CTA per SM looping over tiles (fwd_kernel.cuh)
};

// Measured choices (docs/perf-notes.md). FLASHCORE_SM90_TILE_<D> overrides one for experiments.
#ifndef FLASHCORE_SM90_TILE_64
#define FLASHCORE_SM90_TILE_64 192, 128, 3, true, true
#endif
#ifndef FLASHCORE_SM90_TILE_128
#define FLASHCORE_SM90_TILE_128 128, 128, 2, true, true
#endif
#ifndef FLASHCORE_SM90_TILE_256
#define FLASHCORE_SM90_TILE_256 128, 80, 2, true, false
#endif
#ifndef FLASHCORE_SM90_TILE_64_CAUSAL
#define FLASHCORE_SM90_TILE_64_CAUSAL FLASHCORE_SM90_TILE_64
#endif
#ifndef FLASHCORE_SM90_TILE_128_CAUSAL
#define FLASHCORE_SM90_TILE_128_CAUSAL 128, 176, 2, false, false
#endif
#ifndef FLASHCORE_SM90_TILE_256_CAUSAL
#define FLASHCORE_SM90_TILE_256_CAUSAL FLASHCORE_SM90_TILE_256
#endif

// Causal tiles may differ: a smaller block_n wastes less work on the diagonal.
constexpr TileShape tile_shape_for(int head_dim, bool causal) {
  return head_dim == 64    ? (causal ? TileShape{FLASHCORE_SM90_TILE_64_CAUSAL} : TileShape{FLASHCORE_SM90_TILE_64})
         : head_dim == 128 ? (causal ? TileShape{FLASHCORE_SM90_TILE_128_CAUSAL} : TileShape{FLASHCORE_SM90_TILE_128})
                           : (causal ? TileShape{FLASHCORE_SM90_TILE_256_CAUSAL} : TileShape{FLASHCORE_SM90_TILE_256});
}

// Whether the grid is persistent: only for equal-work (non-causal) tiles, and only where it measured
// faster (docs/perf-notes.md, v4). Shared by the kernel and the host's grid size.
constexpr bool persistent_grid(int head_dim, bool causal) { return tile_shape_for(head_dim, causal).persistent && !causal; }

template <int kHeadDim_, bool kCausal_, int kElemBytes_ = 2>
struct TileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kElemBytes = kElemBytes_;
  static constexpr TileShape kShape = tile_shape_for(kHeadDim, kCausal_);
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kStages = kShape.stages;

  static constexpr bool kPingPong = kShape.pingpong;
  // Skip the O rescale when no row max of a warp changed (mainloop.cuh): only where O >> S per thread.
  static constexpr bool kSkipUnitRescale = kHeadDim >= 2 * kBlockN;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kRowsPerWarpgroup = 64;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);  // + one producer warpgroup
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumerWarpgroups == 2 ? 240 : 160;

  // Shared-memory tiles are stored as chunks of 64 columns (128 bytes per row, the 128-byte swizzle
  // width): chunk c holds columns [64c, 64c+64) of every row. Chunks are 1024-byte aligned.
  static constexpr int kChunkCols = 128 / kElemBytes;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kRowBytes = 128;
  static constexpr int kQChunkBytes = kBlockM * kRowBytes;
  static constexpr int kKVChunkBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVTileBytes = kKVChunkBytes * kChunks;

  static constexpr int kSmemQOffset = 0;
  static constexpr int kSmemKOffset = kSmemQOffset + kQBytes;
  static constexpr int kSmemVOffset = kSmemKOffset + kStages * kKVTileBytes;
  static constexpr int kSmemKVEnd = kSmemVOffset + kStages * kKVTileBytes;
  static constexpr int kNumBarriers = 2 + 4 * kStages;  // q_full, q_empty, k/v full/empty per stage
  static constexpr int kSmemSlack = kNumBarriers * 8 + 1024;  // +1024: the base is rounded up to 1024 B

  // The epilogue stages O (kQBytes, chunked like Q) in shared memory for the TMA store. A persistent grid
  // gives it a buffer of its own when that fits: the Q tile is then released as soon as the tile's last
  // S GEMM has read it, and the next tile's Q loads while this tile finishes. Otherwise O is staged in
  // the Q tile, released once the store has read it.
  static constexpr bool kSeparateO =
      persistent_grid(kHeadDim, kCausal_) && kSmemKVEnd + kQBytes + kSmemSlack <= 227 * 1024;
  static constexpr int kSmemOOffset = kSeparateO ? kSmemKVEnd : kSmemQOffset;
  static constexpr int kSmemBarrierOffset = kSmemKVEnd + (kSeparateO ? kQBytes : 0);
  static constexpr int kSmemBytes = kSmemBarrierOffset + kSmemSlack;
  // Arrivals that release the Q tile: every consumer thread after its last S GEMM, or one thread per
  // consumer warpgroup after the store has read the staged O.
  static constexpr int kQReleaseArrivals = kSeparateO ? kConsumerThreads : kConsumerWarpgroups;

  static_assert(kHeadDim % kChunkCols == 0, "head dim must be a multiple of 64 elements");
  static_assert(kBlockM % 64 == 0 && kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3,
                "one 64-row slice per consumer warpgroup, at most 3");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and the PV k-loop need kBlockN % 16 == 0");
  static_assert(kSmemBytes <= 227 * 1024, "tile does not fit in shared memory");
  static_assert(!kPingPong || kConsumerWarpgroups >= 2, "ping-pong needs two or more consumer warpgroups");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
};

}  // namespace flashcore::sm90

// A kernel config: one row of the tile-config table (configs.txt) turned into the compile-time constants the
// sm90 kernel is built from. Rows are generated (sources.cmake) as small structs with the fields below; the
// kernel takes KernelConfig<Row> as its only template parameter.
//
//   struct Row {                              // e.g. bf16, head dim 128, non-causal, 128x128, 2 stages
//     using Element = __nv_bfloat16;          // Q, K, V
//     using OutElement = __nv_bfloat16;       // O
//     static constexpr int kHeadDim = 128;
//     static constexpr bool kCausal = false;
//     static constexpr TileShape kShape = {128, 128, 2, true, Schedule::kStaticPersistent, false};
//   };
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

template <class Row>
struct KernelConfig {
  using Element = typename Row::Element;
  using OutElement = typename Row::OutElement;
  static constexpr int kHeadDim = Row::kHeadDim;
  static constexpr bool kCausal = Row::kCausal;
  static constexpr TileShape kShape = Row::kShape;
  static constexpr int kBlockM = kShape.block_m;
  static constexpr int kBlockN = kShape.block_n;
  static constexpr int kStages = kShape.stages;
  static constexpr bool kPingPong = kShape.pingpong;
  static constexpr Schedule kSchedule = kShape.schedule;
  static constexpr bool kPersistent = kSchedule != Schedule::kOneTilePerCta;

  static constexpr int kElemBytes = kernels::ElemTraits<Element>::kBytes;
  static constexpr int kOutElemBytes = kernels::ElemTraits<OutElement>::kBytes;
  static constexpr int kMmaK = kernels::kMmaK<Element>;
  static constexpr VLayout kVLayout = kElemBytes == 2 ? VLayout::kKeyMajor : VLayout::kDimMajor;

  // Skip the O rescale when no row max of a warp changed (mainloop.cuh): pays only where O >> S per thread, and
  // makes the time depend on the data, so it is a config column (configs.txt: rescale vote/always).
  static constexpr bool kSkipUnitRescale = kShape.rescale_vote;
  static constexpr int kConsumerWarpgroups = kBlockM / 64;
  static constexpr int kRowsPerWarpgroup = 64;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);  // + one producer warpgroup
  static constexpr int kConsumerThreads = 128 * kConsumerWarpgroups;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumerWarpgroups == 2 ? 240 : 160;

  // Shared-memory tiles are stored as chunks of 128-byte rows (the 128-byte swizzle width): chunk c holds
  // columns [c*kChunkCols, (c+1)*kChunkCols) of every row. Chunks are 1024-byte aligned.
  static constexpr int kRowBytes = 128;
  static constexpr int kChunkCols = kRowBytes / kElemBytes;
  static constexpr int kChunks = kHeadDim / kChunkCols;
  static constexpr int kQChunkBytes = kBlockM * kRowBytes;
  static constexpr int kKVChunkBytes = kBlockN * kRowBytes;
  static constexpr int kQBytes = kQChunkBytes * kChunks;
  static constexpr int kKVTileBytes = kKVChunkBytes * kChunks;
  // O is staged in the same chunked layout, in its own element size.
  static constexpr int kOutChunkCols = kRowBytes / kOutElemBytes;
  static constexpr int kOutChunks = kHeadDim / kOutChunkCols;
  static constexpr int kOutChunkBytes = kBlockM * kRowBytes;
  static constexpr int kOutBytes = kOutChunkBytes * kOutChunks;

  static constexpr int kSmemQOffset = 0;
  static constexpr int kSmemKOffset = kSmemQOffset + kQBytes;
  static constexpr int kSmemVOffset = kSmemKOffset + kStages * kKVTileBytes;
  static constexpr int kSmemKVEnd = kSmemVOffset + kStages * kKVTileBytes;
  static constexpr int kSmemBarrierBytes = 512;  // SharedBarriers (pipeline.cuh), checked there
  static constexpr int kSmemSlack = kSmemBarrierBytes + 1024;  // +1024: the base is rounded up to 1024 B

  // A persistent grid gives the staged O a buffer of its own when that fits: the Q tile is then released as
  // soon as the tile's last S GEMM has read it, and the next tile's Q loads while this tile finishes.
  // Otherwise O is staged in the Q tile, released once the TMA store has read it.
  static constexpr bool kSeparateO = kPersistent && kSmemKVEnd + kOutBytes + kSmemSlack <= 227 * 1024;
  static constexpr int kSmemOOffset = kSeparateO ? kSmemKVEnd : kSmemQOffset;
  static constexpr int kSmemBarrierOffset = kSmemKVEnd + (kSeparateO ? kOutBytes : 0);
  static constexpr int kSmemBytes = kSmemBarrierOffset + kSmemSlack;
  // Arrivals that release the Q tile: every consumer thread after its last S GEMM, or one thread per consumer
  // warpgroup after the store has read the staged O.
  static constexpr int kQReleaseArrivals = kSeparateO ? kConsumerThreads : kConsumerWarpgroups;

  static_assert(kElemBytes == 2 && kOutElemBytes == 2,
                "16-bit inputs and outputs only: 8-bit P packing and a K-major V come with the 8-bit path");
  static_assert(kHeadDim % kChunkCols == 0, "head dim must be a multiple of one 128-byte row");
  static_assert(kSeparateO || kOutBytes <= kQBytes, "O staged in the Q tile must fit there");
  static_assert(kBlockM % 64 == 0 && kConsumerWarpgroups >= 1 && kConsumerWarpgroups <= 3,
                "one 64-row slice per consumer warpgroup, at most 3");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and the PV k-loop need kBlockN % 16 == 0");
  static_assert(kSmemBytes <= 227 * 1024, "tile does not fit in shared memory");
  static_assert(!kPingPong || kConsumerWarpgroups >= 2, "ping-pong needs two or more consumer warpgroups");
  static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register budget");
};

}  // namespace flashcore::sm90

// Producer role: one elected thread of the producer warpgroup streams each tile's Q once and its K/V blocks
// through the ring by TMA (cp.async.bulk.tensor), each load completing on its pipeline's full barrier with a
// transaction byte count. Where a block's rows live is kv_row() alone (a paged KV cache maps it to a page).
#pragma once
#include <cuda/ptx>

#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/scheduler.cuh"

namespace flashcore::sm90 {

// Load a (kRows x head_dim) tile as boxes of (one 128-byte row chunk x kBoxRows rows), slice by slice, the chunks of
// a slice back to back; chunk c of row r lands at smem + c * kChunkBytes + r * 128 (the 128B swizzle is a function
// of the address, so slices of 8k rows compose into the same layout as one box).
template <class Cfg, int kChunkBytes, int kRows, int kBoxRows>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, uint8_t* smem, uint64_t* bar, int64_t row,
                                              int head, int batch) {
  static_assert(kRows % kBoxRows == 0 && kBoxRows % 8 == 0, "whole 8-row swizzle atoms per box");
#pragma unroll
  for (int r = 0; r < kRows; r += kBoxRows) {
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c) {
      const int32_t coords[4] = {c * Cfg::kChunkCols, static_cast<int32_t>(row + r), head, batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                      smem + c * kChunkBytes + r * Cfg::kRowBytes, map, coords, bar);
    }
  }
}

template <class Cfg>
struct Producer {
  using KVState = PipelineState<Cfg::kStages>;
  PipelineState<1> q_state{};
  KVState kv_state{};

  // First row of key block n_block in the K/V tensor's seq dimension.
  __device__ __forceinline__ static int64_t kv_row(const Tile& tile, int n_block) {
    return tile.seq.k_row0 + static_cast<int64_t>(n_block) * Cfg::kBlockN;
  }

  // One tile's loads: Q (once the consumers released the previous tile's Q/staging buffer), then K and V for
  // every visible key block, last block first. Every tile takes the Q stage, on both sides: a tile with no key
  // blocks (all rows masked) commits it without a load, and its consumers may stage their zero O there.
  __device__ __forceinline__ void load_tile(const FwdParams& p, const Tile& tile, uint8_t* smem,
                                            SharedBarriers<Cfg>& bars) {
    bars.q.acquire(q_state);
    if (tile.keys.count() == 0) {
      bars.q.commit(q_state);
      q_state.advance();
      return;
    }
    const int kv_head = tile.head / p.head_ratio;
    tma_load_tile<Cfg, Cfg::kQChunkBytes, Cfg::kBlockM, Cfg::kBlockM>(
        &p.tma_q, smem + Cfg::kSmemQOffset, bars.q.commit_tx(q_state, Cfg::kQBytes),
        tile.seq.q_row0 + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM, tile.head, tile.batch);
    q_state.advance();

    for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
      const int64_t row = kv_row(tile, n_block);
      const int stage_offset = kv_state.stage * Cfg::kKVTileBytes;
      bars.k.acquire(kv_state);
      tma_load_tile<Cfg, Cfg::kKVChunkBytes, Cfg::kBlockN, Cfg::kKVBoxRows>(
          &p.tma_k, smem + Cfg::kSmemKOffset + stage_offset, bars.k.commit_tx(kv_state, Cfg::kKVTileBytes), row,
          kv_head, tile.batch);
      bars.v.acquire(kv_state);
      tma_load_tile<Cfg, Cfg::kKVChunkBytes, Cfg::kBlockN, Cfg::kKVBoxRows>(
          &p.tma_v, smem + Cfg::kSmemVOffset + stage_offset, bars.v.commit_tx(kv_state, Cfg::kKVTileBytes), row,
          kv_head, tile.batch);
      kv_state.advance();
    }
  }
};

}  // namespace flashcore::sm90

// Producer role: one elected thread of the producer warpgroup streams Q once and the K/V ring by TMA
// (cp.async.bulk.tensor), each load completing on an mbarrier with a transaction byte count.
#pragma once
#include <cuda/ptx>

#include "sm90/kernel_params.h"
#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"

namespace flashcore::sm90 {

// Load a (rows x kHeadDim) tile as kChunks boxes of (64 columns x rows), chunk c at smem + c*chunk_bytes.
template <int kChunks, int kChunkCols, int kChunkBytes>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, uint8_t* smem, uint64_t* bar, int row,
                                              int head, int batch) {
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int32_t coords[4] = {c * kChunkCols, row, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem + c * kChunkBytes,
                                    map, coords, bar);
  }
}

// One tile's loads: Q once (after the consumers released the previous tile's Q/staging buffer), then
// K and V for every visible key block, last block first, through the ring.
template <class Cfg>
__device__ __forceinline__ void producer_tile(const FwdParams& p, const Tile& tile, uint8_t* smem,
                                              Barriers<Cfg::kStages>& bars, RingState<Cfg::kStages>& ring,
                                              uint32_t& tiles_done) {
  const int kv_head = tile.head / p.head_ratio;
  mbar_wait(&bars.q_empty, (tiles_done & 1u) ^ 1u);
  ++tiles_done;
  if (tile.n_blocks == 0) return;

  mbar_arrive_expect_tx(&bars.q_full, Cfg::kQBytes);
  tma_load_tile<Cfg::kChunks, Cfg::kChunkCols, Cfg::kQChunkBytes>(
      &p.tma_q, smem + Cfg::kSmemQOffset, &bars.q_full, tile.m_block * Cfg::kBlockM, tile.head, tile.batch);

  for (int n_block = tile.n_blocks - 1; n_block >= 0; --n_block) {
    const int row = n_block * Cfg::kBlockN;
    uint8_t* k_dst = smem + Cfg::kSmemKOffset + ring.stage * Cfg::kKVTileBytes;
    uint8_t* v_dst = smem + Cfg::kSmemVOffset + ring.stage * Cfg::kKVTileBytes;

    // Wait until every consumer has released the stage (a fresh barrier passes parity 1 at once).
    mbar_wait(&bars.k_empty[ring.stage], ring.phase ^ 1u);
    mbar_arrive_expect_tx(&bars.k_full[ring.stage], Cfg::kKVTileBytes);
    tma_load_tile<Cfg::kChunks, Cfg::kChunkCols, Cfg::kKVChunkBytes>(&p.tma_k, k_dst, &bars.k_full[ring.stage],
                                                                     row, kv_head, tile.batch);

    mbar_wait(&bars.v_empty[ring.stage], ring.phase ^ 1u);
    mbar_arrive_expect_tx(&bars.v_full[ring.stage], Cfg::kKVTileBytes);
    tma_load_tile<Cfg::kChunks, Cfg::kChunkCols, Cfg::kKVChunkBytes>(&p.tma_v, v_dst, &bars.v_full[ring.stage],
                                                                     row, kv_head, tile.batch);
    ring.advance();
  }
}

}  // namespace flashcore::sm90

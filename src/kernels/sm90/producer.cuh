// Producer role: one elected thread of the producer warpgroup streams each tile's Q once and its K/V blocks
// through the ring by TMA (cp.async.bulk.tensor), each load completing on its pipeline's full barrier with a
// transaction byte count. Where a block's rows live: kv_row() (dense and packed K/V) or the block table (a paged
// cache, tma_load_paged).
#pragma once
#include <cuda/ptx>

#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/scheduler.cuh"

namespace flashcore::sm90 {

// Load a (kRows x head_dim) tile as boxes of (one 128-byte row chunk -- 64 bytes for 8-bit head dim 64 -- x kBoxRows
// rows), slice by slice, the chunks of a slice back to back; chunk c of row r lands at smem + c * kChunkBytes + r *
// row bytes (the 128B swizzle is a function of the address, so slices of 8k rows compose into the same layout as one
// box). kV: V's chunks (Cfg::kVChunks of kVChunkCols columns, 128-byte rows), which differ from Q's and K's in an
// int8 Q K^T config (16-bit V).
// A 16-bit tile of several chunks in one box (tile_shape.h tma_chunked) is a single TMA of the host's 5-D map, whose
// box holds every chunk of the tile in that same chunk-major layout.
template <class Cfg, int kChunkBytes, int kRows, int kBoxRows, bool kV = false>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, uint8_t* smem, uint64_t* bar, int64_t row,
                                              int head, int batch) {
  static_assert(kRows % kBoxRows == 0 && kBoxRows % 8 == 0, "whole 8-row swizzle atoms per box");
  constexpr int kChunks = kV ? Cfg::kVChunks : Cfg::kChunks;
  constexpr int kChunkCols = kV ? Cfg::kVChunkCols : Cfg::kChunkCols;
  constexpr int kRowBytes = kV ? Cfg::kVRowBytes : Cfg::kQKRowBytes;
  if constexpr (tma_chunked(Cfg::kElemBytes, kChunks, kRows, kBoxRows)) {
    static_assert(kChunkBytes == kRows * kRowBytes, "chunk-major box layout");
    const int32_t coords[5] = {0, static_cast<int32_t>(row), 0, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem, map, coords, bar);
  } else {
#pragma unroll
    for (int r = 0; r < kRows; r += kBoxRows) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int32_t coords[4] = {c * kChunkCols, static_cast<int32_t>(row + r), head, batch};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        smem + c * kChunkBytes + r * kRowBytes, map, coords, bar);
      }
    }
  }
}

// 8-bit V, transposed in the workspace (kernel_params.h: tma_v): key block [key0, key0 + kBlockN) as kVTChunks boxes
// of kVTChunkKeys keys x head_dim rows; box c lands at smem + c * kVTChunkBytes, a K-major B operand for gemm_pv.
template <class Cfg>
__device__ __forceinline__ void tma_load_vt(const CUtensorMap* map, uint8_t* smem, uint64_t* bar, int64_t key0,
                                            int head, int batch) {
#pragma unroll
  for (int c = 0; c < Cfg::kVTChunks; ++c) {
    const int32_t coords[4] = {static_cast<int32_t>(key0 + c * Cfg::kVTChunkKeys), 0, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, smem + c * Cfg::kVTChunkBytes,
                                    map, coords, bar);
  }
}

// An e4m3 KV cache's key block (Cfg::kKV8) into its staging stage: kBlockN rows in boxes of kKVBoxRows rows x one
// chunk of kKV8ChunkCols columns (the 8-bit rows' layout: chunk c of row r at c * kKV8ChunkBytes + r * row bytes).
template <class Cfg>
__device__ __forceinline__ void tma_load_kv8(const CUtensorMap* map, uint8_t* smem, uint64_t* bar, int64_t row,
                                             int head, int batch) {
#pragma unroll
  for (int r = 0; r < Cfg::kBlockN; r += Cfg::kKVBoxRows) {
#pragma unroll
    for (int c = 0; c < Cfg::kKV8Chunks; ++c) {
      const int32_t coords[4] = {c * Cfg::kKV8ChunkCols, static_cast<int32_t>(row + r), head, batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                      smem + c * Cfg::kKV8ChunkBytes + r * Cfg::kKV8RowBytes, map, coords, bar);
    }
  }
}

// The rows of the key block whose first key is key0 that hold keys of the sequence, for a V staging stage
// (SharedBarriers::v_rows). The converters write the others as zeros in every layout (past a dense tensor's end TMA
// has filled zeros already), and the consumers zero none (the host clears FwdParams::zero_v_tail for these rows).
template <class Cfg>
__device__ __forceinline__ int kv8_v_rows(const Tile& tile, int64_t key0) {
  const int64_t left = tile.seq.seqlen_k - key0;
  return left >= Cfg::kBlockN ? Cfg::kBlockN : (left > 0 ? static_cast<int>(left) : 0);
}

// Arrive on an e4m3 staging stage's barrier and announce its bytes; returns the barrier the copies signal: the
// converters' (k8_full / v8_full), or on the transposed decode rows, whose consumers read the staging ring, the K / V
// ring's own full barrier.
template <class Cfg, bool kV>
__device__ __forceinline__ uint64_t* commit_kv8(SharedBarriers<Cfg>& bars, const PipelineState<Cfg::kStages>& st) {
  if constexpr (Cfg::kKV8Direct) return (kV ? bars.v : bars.k).commit_tx(st, Cfg::kK8TileBytes);
  uint64_t* bar = kV ? &bars.v8_full[st.stage] : &bars.k8_full[st.stage];
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, bar,
                                       Cfg::kK8TileBytes);
  return bar;
}

using kernels::page_entry;
using kernels::row_in_page;

// The page holding key `key` of the tile's sequence: keys past the sequence's count (whose table entries may be
// garbage) and ids outside the pool give page num_pages, past the tensor map's end, where TMA fills zeros and still
// counts the bytes.
__device__ __forceinline__ int32_t page_of(const FwdParams& p, const Tile& tile, int key) {
  if (key >= tile.seq.seqlen_k) return p.num_pages;
  const int32_t page =
      __ldg(p.block_table + static_cast<int64_t>(tile.kv_batch) * p.block_table_stride + page_entry(p, key));
  return page < 0 || page >= p.num_pages ? p.num_pages : page;
}

// Where a key block's pages come from. Rows without a table warp: the producer thread reads the first two slices'
// pages a block ahead (a page of 64 keys or more makes at most two slices of a 128-key block) and the others (pages
// of 16 or 32 keys) when it issues them.
struct BlockPages {
  int32_t first = 0, second = 0;
};

__device__ __forceinline__ BlockPages block_pages(const FwdParams& p, const Tile& tile, int key0, int block_n) {
  BlockPages pages;
  pages.first = page_of(p, tile, key0);
  if (p.kv_slice_rows < block_n) pages.second = page_of(p, tile, key0 + p.kv_slice_rows);
  return pages;
}

// Split-KV rows (smem_plan.h fetches_pages): warp 1 of the producer warpgroup, the table warp, walks the producer
// thread's tiles and writes the page of every (key block, slice) into SharedBarriers::page_slots, last block first,
// whole key blocks per chunk of kPageChunk slots in a two-chunk ring, one table load per lane. The producer thread
// reads a block's pages from shared memory and waits only for a chunk's first block. With its own loads, each waited
// for before its block's TMA, 1 x 8k paged decode trailed dense by 0.7 us (docs/decisions.md#paged-table-warp).
template <class Cfg>
struct PageFetcher {
  static_assert(Cfg::kBlockN / 8 <= kPageChunk, "a key block's slices (8 rows or more) fit in a chunk");
  static_assert(SharedBarriers<Cfg>::kPagedSlots, "the table warp's rows have the page slots (pipeline.cuh)");
  __device__ __forceinline__ static void run(const FwdParams& p, SharedBarriers<Cfg>& bars) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    TileScheduler<Cfg> sched{bars};
    PipelineCount<2> pos;
    for (int t = sched.first(); t < p.num_tiles; t = sched.producer_next(p, t)) {
      const Tile tile = decode_tile<Cfg>(p, t);
      for (int j0 = 0; j0 < tile.keys.count(); j0 += p.page_chunk_blocks) {
        const auto st = pos.state();
        bars.pages.acquire(st);
        if (lane < kPageChunk) {
          const int j = j0 + lane / p.page_block_slices, n_block = tile.keys.end - 1 - j;
          const int key = n_block * Cfg::kBlockN + (lane % p.page_block_slices) * p.kv_slice_rows;
          bars.page_slots[st.stage * kPageChunk + lane] =
              j - j0 < p.page_chunk_blocks && n_block >= tile.keys.begin ? page_of(p, tile, key) : p.num_pages;
        }
        bars.pages.commit(st);  // every lane arrives, after its own store (release)
        pos.advance();
      }
    }
  }
};

// A paged cache's key block: slices of p.kv_slice_rows rows (whole 8-row swizzle atoms, dividing the page), slice i
// from page page_at(i, its first key). A slice goes in boxes of paged_box_rows rows (tile_shape.h; the host's map has
// that box), every 128-byte chunk of a box issued back to back: a slice of a page of 128 keys or more as a dense
// split-KV block.
// k8: an e4m3 KV cache's block into its staging stage (Cfg::kKV8: the 8-bit rows' chunks and rows).
template <class Cfg, bool kV, class PageAt, bool k8 = Cfg::kKV8>
__device__ __forceinline__ void tma_load_paged(const FwdParams& p, const CUtensorMap* map, uint8_t* smem, uint64_t* bar,
                                               int n_block, int kv_head, PageAt page_at) {
  // (V's head dim may differ from K's: MLA.)
  constexpr int kChunks = k8 ? Cfg::kKV8Chunks : kV ? Cfg::kVChunks : Cfg::kChunks;
  constexpr int kChunkCols = k8 ? Cfg::kKV8ChunkCols : kV ? Cfg::kVChunkCols : Cfg::kChunkCols;
  constexpr int kChunkBytes = k8 ? Cfg::kKV8ChunkBytes : kV ? Cfg::kVChunkBytes : Cfg::kKVChunkBytes;
  constexpr int kRowBytes = k8 ? Cfg::kKV8RowBytes : kV ? Cfg::kVRowBytes : Cfg::kQKRowBytes;
  const int key0 = n_block * Cfg::kBlockN;  // < seqlen_k + kBlockN: fits in int (validation caps seqlen_k)
  const int box = paged_box_rows(Cfg::kKVBoxRows, p.kv_slice_rows);
#pragma unroll 1
  for (int r = 0, i = 0; r < Cfg::kBlockN; r += p.kv_slice_rows, ++i) {
    const int32_t page = page_at(i, key0 + r);
    const int32_t row = row_in_page(p, key0 + r);
#pragma unroll 1
    for (int b = 0; b < p.kv_slice_rows; b += box) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int32_t coords[4] = {c * kChunkCols, row + b, kv_head, page};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                        smem + c * kChunkBytes + (r + b) * kRowBytes, map, coords, bar);
      }
    }
  }
}

template <class Cfg>
struct Producer {
  RingPosition<Cfg::kQStages, Cfg::kCountedRings> q_pos{};
  RingPosition<Cfg::kStages, Cfg::kCountedRings> kv_pos{};  // config.h kCountedRings
  PipelineCount<2> page_pos{};                                // paged K/V: the table warp's chunk ring

  // First row of key block n_block in the K/V tensor's seq dimension.
  __device__ __forceinline__ static int64_t kv_row(const Tile& tile, int n_block) {
    return tile.seq.k_row0 + static_cast<int64_t>(n_block) * Cfg::kBlockN;
  }

  // A paged cache's key blocks: a loop of its own (sharing the dense loop's body cost the producer's 24 registers a
  // spill in the dynamic schedule), last block first, their pages from `pages` (the first block's, read before the Q
  // stage's wait; each later block's read before the previous block's waits) or the table warp's chunks (PageFetcher:
  // each waited for at its first block and handed back after its last).
  __device__ __forceinline__ void load_paged_blocks(const FwdParams& p, const Tile& tile, uint8_t* smem,
                                                    SharedBarriers<Cfg>& bars, int kv_head, BlockPages pages) {
    int in_chunk = 0;
    for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
      const auto load = [&](const auto& page_at) {
        const auto kv_state = kv_pos.state();
        if constexpr (Cfg::kKV8) {  // e4m3 blocks into the staging ring (convert_kv.cuh widens them)
          const int s = kv_state.stage;
          bars.k.acquire(kv_state);
          tma_load_paged<Cfg, false>(p, &p.tma_k, smem + Cfg::kSmemK8Offset + s * Cfg::kK8TileBytes,
                                     commit_kv8<Cfg, false>(bars, kv_state), n_block, kv_head, page_at);
          bars.v.acquire(kv_state);
          if constexpr (!Cfg::kKV8Direct) {  // (the converters read it)
            atomicExch(&bars.v_rows[s], kv8_v_rows<Cfg>(tile, int64_t{n_block} * Cfg::kBlockN));
          }
          tma_load_paged<Cfg, true>(p, &p.tma_v, smem + Cfg::kSmemV8Offset + s * Cfg::kK8TileBytes,
                                    commit_kv8<Cfg, true>(bars, kv_state), n_block, kv_head, page_at);
          kv_pos.advance();
          return;
        }
        bars.k.acquire(kv_state);
        tma_load_paged<Cfg, false>(p, &p.tma_k, smem + Cfg::kSmemKOffset + kv_state.stage * Cfg::kKTileBytes,
                            bars.k.commit_tx(kv_state, Cfg::kKTileBytes), n_block, kv_head, page_at);
        bars.v.acquire(kv_state);
        tma_load_paged<Cfg, true>(p, &p.tma_v, smem + Cfg::kSmemVOffset + kv_state.stage * Cfg::kVTileBytes,
                            bars.v.commit_tx(kv_state, Cfg::kVTileBytes), n_block, kv_head, page_at);
        kv_pos.advance();
      };
      if constexpr (kPageWarp<Cfg>) {
        if (in_chunk == 0) bars.pages.wait(page_pos.state());
        const int32_t* slots = bars.page_slots + page_pos.state().stage * kPageChunk + in_chunk * p.page_block_slices;
        load([slots](int i, int) { return slots[i]; });
        if (++in_chunk == p.page_chunk_blocks || n_block == tile.keys.begin) {  // its slots are read: hand it back
          bars.pages.release(page_pos.state());
          page_pos.advance();
          in_chunk = 0;
        }
      } else {
        load([&](int i, int key) { return i == 0 ? pages.first : i == 1 ? pages.second : page_of(p, tile, key); });
        if (n_block > tile.keys.begin) pages = block_pages(p, tile, (n_block - 1) * Cfg::kBlockN, Cfg::kBlockN);
      }
    }
  }

  // One tile's loads: Q (once its stage of the Q ring is free: the consumers release a stage after their last read
  // of its Q, or after the O staged there is stored), then K and V for every visible key block, last block first.
  // Every tile takes a Q stage, on both sides: a tile with no key blocks (all rows masked) commits it without a
  // load, and its consumers may stage their zero O there.
  __device__ __forceinline__ void load_tile(const FwdParams& p, const Tile& tile, uint8_t* smem,
                                            SharedBarriers<Cfg>& bars) {
    // A paged cache without a table warp: the first block's pages are read before the wait for the Q stage.
    BlockPages first_pages;
    if constexpr (kPagedLayout<Cfg> && !kPageWarp<Cfg>) {
      if (p.block_table != nullptr && tile.keys.count() > 0) {
        first_pages = block_pages(p, tile, (tile.keys.end - 1) * Cfg::kBlockN, Cfg::kBlockN);
      }
    }
    const auto q_state = q_pos.state();
    bars.q.acquire(q_state);
    if (tile.keys.count() == 0) {
      bars.q.commit(q_state);
      q_pos.advance();
      return;
    }
    const int kv_head = tile.head / p.head_ratio;
    // A packed tensor's map has one batch entry: the sequence is a row offset (SeqInfo::q_row0 / k_row0). A KV
    // cache's entry is the sequence's slot (Tile::kv_batch).
    const int q_batch = kServingLayouts<Cfg> && p.cu_seqlens_q != nullptr ? 0 : tile.batch;
    const int kv_batch = kServingLayouts<Cfg> && p.cu_seqlens_k != nullptr ? 0 : tile.kv_batch;
    tma_load_tile<Cfg, Cfg::kQChunkBytes, Cfg::kBlockM, Cfg::kBlockM>(
        &p.tma_q, smem + Cfg::kSmemQOffset + q_state.stage * Cfg::kQBytes, bars.q.commit_tx(q_state, Cfg::kQBytes),
        tile.seq.q_row0 + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM, tile.head, q_batch);
    q_pos.advance();

    if constexpr (kPagedLayout<Cfg>) {  // not on the dynamic schedule (scheduler.cuh)
      if (p.block_table != nullptr) {
        load_paged_blocks(p, tile, smem, bars, kv_head, first_pages);
        return;
      }
    }
    // The K/V row walks down from the last visible block.
    // Two-stage 16-bit rows load K of block n before V of block n + 1 (the block before it in the loop's order), the
    // order the consumers take them in (mainloop.cuh: S = Q K_n^T beside O += P V_{n+1}). With one stage pair per
    // block, the K stage that an S GEMM frees then refills half an iteration before the V stage that the P V GEMM
    // after it frees, instead of waiting behind it (docs/decisions.md#k-before-v; the dynamic rows since the elected
    // producer thread left ptxas the uniform registers that its 24 had lacked). Kept together: the transposed decode
    // rows (K and V of one block in one step), rows of three or more stages (their ring has the slack) and 8-bit rows
    // (not measured).
    constexpr bool kKAhead = !Cfg::kSwapAB && Cfg::kStages == 2 && Cfg::kElemBytes == 2 && !Cfg::kKV8;
    auto load_k = [&](const PipelineState<Cfg::kStages>& st, int64_t r) {
      bars.k.acquire(st);
      if constexpr (Cfg::kKV8) {  // e4m3 K into the staging ring (convert_kv.cuh widens it)
        tma_load_kv8<Cfg>(&p.tma_k, smem + Cfg::kSmemK8Offset + st.stage * Cfg::kK8TileBytes,
                          commit_kv8<Cfg, false>(bars, st), r, kv_head, kv_batch);
        return;
      }
      tma_load_tile<Cfg, Cfg::kKVChunkBytes, Cfg::kBlockN, Cfg::kKVBoxRows>(
          &p.tma_k, smem + Cfg::kSmemKOffset + st.stage * Cfg::kKTileBytes, bars.k.commit_tx(st, Cfg::kKTileBytes), r,
          kv_head, kv_batch);
    };
    auto load_v = [&](const PipelineState<Cfg::kStages>& st, int64_t r) {
      uint8_t* v_stage = smem + Cfg::kSmemVOffset + st.stage * Cfg::kVTileBytes;
      bars.v.acquire(st);
      if constexpr (Cfg::kKV8) {
        if constexpr (!Cfg::kKV8Direct) atomicExch(&bars.v_rows[st.stage], kv8_v_rows<Cfg>(tile, r - tile.seq.k_row0));
        tma_load_kv8<Cfg>(&p.tma_v, smem + Cfg::kSmemV8Offset + st.stage * Cfg::kK8TileBytes,
                          commit_kv8<Cfg, true>(bars, st), r, kv_head, kv_batch);
      } else if constexpr (Cfg::kVLayout == VLayout::kDimMajor) {
        if (v_transposed_by_producer<Cfg>(p)) {  // as stored, like K: the transposer warps take it from here
          tma_load_tile<Cfg, Cfg::kKVChunkBytes, Cfg::kBlockN, Cfg::kKVBoxRows>(
              &p.tma_v, v_stage, bars.v.commit_tx(st, Cfg::kVTileBytes), r, kv_head, kv_batch);
        } else {
          tma_load_vt<Cfg>(&p.tma_v, v_stage, bars.v.commit_tx(st, Cfg::kVTileBytes), r, kv_head, kv_batch);
        }
      } else {
        tma_load_tile<Cfg, Cfg::kVChunkBytes, Cfg::kBlockN, Cfg::kKVBoxRows, true>(
            &p.tma_v, v_stage, bars.v.commit_tx(st, Cfg::kVTileBytes), r, kv_head, kv_batch);
      }
    };
    int64_t row = kv_row(tile, tile.keys.end - 1);
    if constexpr (!kKAhead) {
      for (int n = tile.keys.count(); n > 0; --n, row -= Cfg::kBlockN) {
        const auto kv_state = kv_pos.state();
        load_k(kv_state, row);
        load_v(kv_state, row);
        kv_pos.advance();
      }
    } else {
      load_k(kv_pos.state(), row);
      kv_pos.advance();
      for (int n_block = tile.keys.end - 2; n_block >= tile.keys.begin; --n_block) {
        load_k(kv_pos.state(), kv_row(tile, n_block));
        load_v(kv_pos.previous(), kv_row(tile, n_block + 1));  // V of the block before: that block's K position
        kv_pos.advance();
      }
      load_v(kv_pos.previous(), kv_row(tile, tile.keys.begin));
    }
  }

  // After the last tile, an e4m3 KV cache's rows: the next K stage, once free, carries no load but its v_end flag, and
  // its staging barrier completes without bytes, which ends the converters' loop (convert_kv.cuh).
  __device__ __forceinline__ void end_kv8_converters(SharedBarriers<Cfg>& bars) {
    const auto kv_state = kv_pos.state();
    bars.k.acquire(kv_state);
    atomicExch(&bars.v_end[kv_state.stage], 1);
    mbar_arrive(&bars.k8_full[kv_state.stage]);  // (release: the flag is visible to whoever sees the phase complete)
  }

  // After the last tile: the V ring's next stage, once free, carries no load but its v_end flag, which ends the
  // transposer warps' loop (transpose_v.cuh). Waiting for the stage to be free keeps the flag from reaching a stage
  // whose previous load the transposers have not taken yet.
  __device__ __forceinline__ void end_v_transposes(SharedBarriers<Cfg>& bars) {
    const auto kv_state = kv_pos.state();
    bars.v.acquire(kv_state);
    atomicExch(&bars.v_end[kv_state.stage], 1);
    bars.v.commit(kv_state);  // (release: the flag is visible to whoever sees the phase complete)
  }
};

}  // namespace flashcore::sm90

// Tile scheduling: which tiles a CTA runs, and what each tile is (query block, head, batch, its sequence and
// the key blocks it visits). One interface over three policies (config.h, Schedule):
//   first()          the CTA's first tile (blockIdx.x for every policy)
//   producer_next(t) the tile after t, called by the producer thread as soon as it has issued t's loads; the
//                    dynamic policy fetches it from a global counter and publishes it to the consumers
//   consumer_next(t) the same tile as the producer's, for the consumer warpgroups
//   grid_size()      the number of CTAs (host, scheduler_grid.h)
// A tile index >= num_tiles ends the loop.
#pragma once
#include "kernels/common/tile.cuh"
#include "kernels/sm90/config.h"
#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/pipeline.cuh"

namespace flashcore::sm90 {

using kernels::Tile;

// Split-KV: tile index = dense tile * num_splits + split; split s visits key blocks
// [begin + s * blocks_per_split, begin + (s + 1) * blocks_per_split) of the dense tile's range (possibly none).
__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Sequence b of a packed tensor: its first row and its length, from cu_seqlens clamped to [0, total].
__device__ __forceinline__ void packed_sequence(const int32_t* cu, int64_t total, int batch, int64_t& row0,
                                                int64_t& len) {
  row0 = clamp64(cu[batch], 0, total);
  len = clamp64(cu[batch + 1], row0, total) - row0;
}

// A tile of the batch: query block, head and sequence from the index (the grid covers the longest sequence, p.seqlen_q
// rows, for every sequence); the sequence's rows and lengths from cu_seqlens (packed tensors) and seqused_k (a KV
// cache's lengths). A query block past its sequence's end visits no key and stores nothing.
// Packed (varlen) and paged layouts run on every schedule but the dynamic one: its producer keeps the tile-id ring
// state in 24 registers, and the extra sequence and page state spilled there (the host never sends it such calls).
// Nor do 8-bit kernels (the host refuses 8-bit calls with serving layouts).
template <class Cfg>
inline constexpr bool kServingLayouts = Cfg::kSchedule != Schedule::kDynamicPersistent && Cfg::kElemBytes == 2;

template <class Cfg>
__device__ __forceinline__ Tile decode_cache_tile(const FwdParams& p, int tile_idx) {
  Tile t = kernels::decode_dense_tile<Cfg>(p, tile_idx);
  const bool varlen_q = kServingLayouts<Cfg> && p.cu_seqlens_q != nullptr;
  const bool varlen_k = kServingLayouts<Cfg> && p.cu_seqlens_k != nullptr;
  if (!varlen_q && !varlen_k && p.seqused_k == nullptr) return t;
  if (varlen_q) packed_sequence(p.cu_seqlens_q, p.total_q, t.batch, t.seq.q_row0, t.seq.seqlen_q);
  if (varlen_k) packed_sequence(p.cu_seqlens_k, p.total_k, t.batch, t.seq.k_row0, t.seq.seqlen_k);
  if (p.seqused_k != nullptr) {
    const int64_t used = clamp64(p.seqused_k[t.batch], 0, t.seq.seqlen_k) + p.seqused_k_add;
    t.seq.seqlen_k = used < t.seq.seqlen_k ? used : t.seq.seqlen_k;
  }
  t.keys = kernels::key_range(t.seq, t.m_block, Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal);
  if (static_cast<int64_t>(t.m_block) * Cfg::kBlockM >= t.seq.seqlen_q) t.keys = kernels::KeyRange{};
  return t;
}

template <class Cfg>
__device__ __forceinline__ Tile decode_tile(const FwdParams& p, int tile_idx) {
  if constexpr (Cfg::kSplitKv) {
    const int split = tile_idx % p.num_splits;
    Tile t = decode_cache_tile<Cfg>(p, tile_idx / p.num_splits);
    const int begin = t.keys.begin + split * p.blocks_per_split;
    t.keys.end = min(t.keys.end, begin + p.blocks_per_split);
    t.keys.begin = begin;
    t.split = split;
    return t;
  } else {
    return decode_cache_tile<Cfg>(p, tile_idx);
  }
}

template <class Cfg>
struct TileScheduler {
  static constexpr Schedule kPolicy = Cfg::kSchedule;
  SharedBarriers<Cfg>& bars;
  PipelineState<SharedBarriers<Cfg>::kTileStages> state{};  // dynamic policy: position in the tile-id ring

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }

  __device__ __forceinline__ int producer_next(const FwdParams& p, int t) {
    if constexpr (kPolicy == Schedule::kOneTilePerCta) {
      return p.num_tiles;
    } else if constexpr (kPolicy == Schedule::kStaticPersistent || kPolicy == Schedule::kSplitKv) {
      // Split-KV parts are persistent too: the producer streams the next part's K/V while the consumers finish
      // the current one, so the ring never drains between parts (perf-notes v12).
      return t + static_cast<int>(gridDim.x);
    } else {
      // Every processed tile is followed by exactly one fetch, so a launch makes num_tiles fetches: values
      // 0 .. num_tiles-1 (those >= num_tiles - grid end their CTA's loop). The last one puts the counter back
      // to 0 for the next launch on the stream (the workspace contract: left zero-filled).
      const int fetched = atomicAdd(p.tile_counter, 1);
      if (fetched == p.num_tiles - 1) *p.tile_counter = 0;
      const int next = static_cast<int>(gridDim.x) + fetched;
      bars.tile.acquire(state);
      bars.tile_id[state.stage] = next;
      bars.tile.commit(state);
      state.advance();
      return next;
    }
  }

  __device__ __forceinline__ int consumer_next(const FwdParams& p, int t) {
    if constexpr (kPolicy == Schedule::kDynamicPersistent) {
      bars.tile.wait(state);
      const int next = bars.tile_id[state.stage];
      bars.tile.release(state);
      state.advance();
      return next;
    } else {
      return producer_next(p, t);
    }
  }
};

}  // namespace flashcore::sm90

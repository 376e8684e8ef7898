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
// Prefill split rows (Cfg::kLastRoundSplit; split_plan.h last_round_plan): tile indices below p.split_whole_tiles are whole
// tiles; past them index whole + r * num_splits + s is part s of remaining tile r (tile whole + r), key blocks
// [begin + s * blocks_per_split, ...) of its range. The grid walks the indices round-robin like a static one: whole
// rounds first, then at most one part per CTA. Tile::splits, part0 and counter say where the part's partial and
// merge count go (epilogue.cuh).
// Serving layouts (smem_plan.h, takes_packed / takes_paged): packed (varlen) Q/O and K/V on every 16-bit schedule
// but a dynamic one with two consumer warpgroups that is not a row's packed flavour, a paged K/V on every one but
// the dynamic schedule (the host never sends them such calls); a KV cache's lengths (seqused_k) everywhere. 8-bit
// kernels take neither packed nor paged layouts (the host refuses 8-bit calls with serving layouts).
template <class Cfg>
inline constexpr bool kServingLayouts = Cfg::kElemBytes == 2 && takes_packed(Cfg::kShape);
template <class Cfg>
inline constexpr bool kPagedLayout = kServingLayouts<Cfg> && takes_paged(Cfg::kShape);
template <class Cfg>
inline constexpr bool kPageWarp = kPagedLayout<Cfg> && fetches_pages(Cfg::kShape);  // producer.cuh PageFetcher

template <class Cfg>
__device__ __forceinline__ Tile decode_cache_tile(const FwdParams& p, int tile_idx) {
  // 8-bit rows take no KV cache either (the host refuses seqused_k with 8-bit inputs and precisions): dense tiles.
  if constexpr (Cfg::kElemBytes == 1) {
    return kernels::decode_dense_tile<Cfg>(p, tile_idx);
  } else {
    return kernels::decode_cache_tile<Cfg, kServingLayouts<Cfg>>(p, tile_idx);
  }
}

template <class Cfg>
__device__ __forceinline__ Tile decode_tile(const FwdParams& p, int tile_idx) {
  if constexpr (Cfg::kLastRoundSplit) {
    const kernels::LastRoundPart part = kernels::last_round_part(p.split_whole_tiles, p.num_splits, tile_idx);
    Tile t = decode_cache_tile<Cfg>(p, part.tile);
    if (part.unit < 0) return t;  // a whole tile
    const int begin = t.keys.begin + part.split * p.blocks_per_split;
    t.keys.end = min(t.keys.end, begin + p.blocks_per_split);
    t.keys.begin = begin;
    t.split = part.split;
    t.splits = p.num_splits;
    t.part0 = part.unit - part.split;  // the partials' slot of part 0 (a part's slot is its unit)
    t.counter = part.tile - p.split_whole_tiles;
    return t;
  } else if constexpr (Cfg::kSplitKv) {
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

// Whether tile t has query rows: false only for a packed batch's query blocks past their sequence's end.
template <class Cfg>
__device__ __forceinline__ bool tile_has_rows(const FwdParams& p, int t) {
  if constexpr (kServingLayouts<Cfg>) {
    if (p.cu_seqlens_q != nullptr) {
      const Tile tile = decode_tile<Cfg>(p, t);
      return static_cast<int64_t>(tile.m_block) * Cfg::kBlockM < tile.seq.seqlen_q;
    }
  }
  return true;
}

template <class Cfg>
struct TileScheduler {
  static constexpr Schedule kPolicy = Cfg::kSchedule;
  SharedBarriers<Cfg>& bars;
  RingPosition<SharedBarriers<Cfg>::kTileStages, Cfg::kCountedRings> ring{};  // dynamic policy: tile-id ring position

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }

  __device__ __forceinline__ int producer_next(const FwdParams& p, int t) {
    if constexpr (kPolicy == Schedule::kOneTilePerCta) {
      return p.num_tiles;
    } else if constexpr (kPolicy == Schedule::kStaticPersistent || kPolicy == Schedule::kSplitKv) {
      // Split-KV parts are persistent too: the producer streams the next part's K/V while the consumers finish
      // the current one, so the ring never drains between parts (docs/decisions.md#split-persistent).
      return t + static_cast<int>(gridDim.x);
    } else {
      // Every processed tile is followed by exactly one fetch, so a launch makes num_tiles fetches: values
      // 0 .. num_tiles-1 (those >= num_tiles - grid end their CTA's loop). The last one puts the counter back
      // to 0 for the next launch on the stream (the workspace contract: left zero-filled).
      // A packed batch's query blocks past their own sequence's end (about half of its tiles: the grid covers the
      // longest sequence for every sequence) are fetched and passed over here, so the consumers never see them.
      int next;
      do {
        const int fetched = atomicAdd(p.tile_counter, 1);
        if (fetched == p.num_tiles - 1) *p.tile_counter = 0;
        next = static_cast<int>(gridDim.x) + fetched;
      } while (next < p.num_tiles && !tile_has_rows<Cfg>(p, next));
      const auto st = ring.state();
      bars.tile.acquire(st);
      bars.tile_id[st.stage] = next;
      bars.tile.commit(st);
      ring.advance();
      return next;
    }
  }

  __device__ __forceinline__ int consumer_next(const FwdParams& p, int t) {
    if constexpr (kPolicy == Schedule::kDynamicPersistent) {
      const auto st = ring.state();
      bars.tile.wait(st);
      const int next = bars.tile_id[st.stage];
      bars.tile.release(st);
      ring.advance();
      return next;
    } else {
      return producer_next(p, t);
    }
  }
};

}  // namespace flashcore::sm90

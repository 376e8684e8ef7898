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
// Packed (varlen) and paged layouts run on every schedule but the dynamic one: its producer keeps the tile-id ring
// state in 24 registers, and the extra sequence and page state spilled there (the host never sends it such calls).
// Nor do 8-bit kernels (the host refuses 8-bit calls with serving layouts).
template <class Cfg>
inline constexpr bool kServingLayouts = Cfg::kSchedule != Schedule::kDynamicPersistent && Cfg::kElemBytes == 2;

template <class Cfg>
__device__ __forceinline__ Tile decode_cache_tile(const FwdParams& p, int tile_idx) {
  return kernels::decode_cache_tile<Cfg, kServingLayouts<Cfg>>(p, tile_idx);
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

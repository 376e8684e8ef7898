// What a CTA works on: one query block of one (batch, query head), the sequence it belongs to (packed, paged or a
// KV cache's length: kernels/common/tile.cuh) and the key blocks it visits. One CTA per tile (grid = num_tiles):
// the hardware block scheduler balances unequal causal tiles, given longest first.
#pragma once
#include "kernels/common/tile.cuh"
#include "kernels/sm80/kernel_params.h"

namespace flashcore::sm80 {

using kernels::Tile;

template <class Cfg>
__device__ __forceinline__ Tile decode_tile(const FwdParams& p, int tile_idx) {
  return kernels::decode_cache_tile<Cfg, /*kServing=*/true>(p, tile_idx);
}

}  // namespace flashcore::sm80

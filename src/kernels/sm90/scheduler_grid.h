// The grid size of each scheduling policy (host side of scheduler.cuh).
#pragma once
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

// The largest tile index space of a launch: the persistent schedulers compute a CTA's next index as tile + gridDim.x
// in int (scheduler.cuh), and a persistent grid has at most one CTA per SM, fewer than 4096 on any GPU; so indices
// stay below 2^31 - 4096. (The portable backend's one-CTA-per-tile grid needs no such margin: 2^31 - 1 there.)
inline constexpr long long kMaxTileIndex = 0x7fffffffLL - 4096;

inline unsigned grid_size(Schedule policy, long long tiles, int sms) {
  const bool one_each = policy == Schedule::kOneTilePerCta;  // kSplitKv: persistent, like kStaticPersistent
  return static_cast<unsigned>(one_each || tiles < sms ? tiles : sms);
}

}  // namespace flashcore::sm90

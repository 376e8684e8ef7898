// The grid size of each scheduling policy (host side of scheduler.cuh).
#pragma once
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

inline unsigned grid_size(Schedule policy, long long tiles, int sms) {
  const bool one_each = policy == Schedule::kOneTilePerCta;  // kSplitKv: persistent, like kStaticPersistent
  return static_cast<unsigned>(one_each || tiles < sms ? tiles : sms);
}

}  // namespace flashcore::sm90

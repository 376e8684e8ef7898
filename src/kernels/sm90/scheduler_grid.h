// The grid size of each scheduling policy (host side of scheduler.cuh).
#pragma once
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

inline unsigned grid_size(Schedule policy, long long tiles, int sms) {
  return static_cast<unsigned>(policy == Schedule::kOneTilePerCta || tiles < sms ? tiles : sms);
}

}  // namespace flashcore::sm90

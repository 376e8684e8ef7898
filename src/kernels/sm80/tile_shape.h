// The host-visible part of a portable tile config (config.h).
#pragma once

namespace flashcore::sm80 {

struct TileShape {
  int block_m;  // query rows per CTA: 16 per warp (4 or 8 warps)
  int block_n;  // keys per K/V tile
  int stages;   // depth of the cp.async K/V ring (>= 2)
};

}  // namespace flashcore::sm80

// The host-visible part of a portable tile config (config.h).
#pragma once

namespace flashcore::sm80 {

struct TileShape {
  int block_m;  // query rows per CTA
  int block_n;  // keys per K/V tile
  int stages;   // depth of the cp.async K/V ring (>= 2)
  int warps;    // 4 or 8; each warp owns block_m / warps query rows (16 or 32: one or two m16 row tiles)
  int split;    // 1; or 2: warp pairs share 2 x block_m / warps rows, each taking half the keys of S and half the
                // head dim of O (config.h)
};

}  // namespace flashcore::sm80

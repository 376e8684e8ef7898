// Tile scheduler: maps a CTA to (query block, query head, batch) and the range of key blocks it visits.
#pragma once
#include "sm90/kernel_params.h"

namespace flashcore::sm90 {

struct Tile {
  int m_block;
  int head;
  int batch;
  int n_blocks;  // key blocks [0, n_blocks) are visited, from the last to the first
};

// Tile order: query blocks fastest, so the CTAs running at once share one head's K/V in L2. Causal tiles
// go heaviest first within a head (the bottom query blocks see the most keys).
// Persistent grids (non-causal, where tile_config.h says so) hand CTA c the tiles c, c + gridDim.x, ...;
// causal grids launch one CTA per tile, since the hardware block scheduler balances unequal tiles better
// than a static round robin (docs/perf-notes.md).
template <int kBlockM, int kBlockN, bool kCausal>
__device__ __forceinline__ Tile schedule_tile(const FwdParams& p, int tile_idx) {
  Tile t;
  const int hb = tile_idx / p.num_m_blocks;
  const int m_idx = tile_idx - hb * p.num_m_blocks;
  t.head = hb % p.num_heads_q;
  t.batch = hb / p.num_heads_q;
  t.m_block = kCausal ? p.num_m_blocks - 1 - m_idx : m_idx;
  int n_end = p.seqlen_k;
  if (kCausal) {
    // The last row of the tile sees keys j <= row + seqlen_k - seqlen_q (bottom-right alignment).
    const long long last_visible = static_cast<long long>(t.m_block + 1) * kBlockM + p.seqlen_k - p.seqlen_q;
    n_end = last_visible < n_end ? static_cast<int>(last_visible > 0 ? last_visible : 0) : n_end;
  }
  t.n_blocks = (n_end + kBlockN - 1) / kBlockN;
  return t;
}

}  // namespace flashcore::sm90

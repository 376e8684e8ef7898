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

template <int kBlockM, int kBlockN, bool kCausal>
__device__ __forceinline__ Tile schedule_tile(const FwdParams& p, unsigned linear_block) {
  Tile t;
  const int m_idx = static_cast<int>(linear_block % static_cast<unsigned>(p.num_m_blocks));
  const unsigned hb = linear_block / static_cast<unsigned>(p.num_m_blocks);
  t.head = static_cast<int>(hb % static_cast<unsigned>(p.num_heads_q));
  t.batch = static_cast<int>(hb / static_cast<unsigned>(p.num_heads_q));
  // Causal tiles near the bottom see the most keys: launch them first so the tail of the grid is short.
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

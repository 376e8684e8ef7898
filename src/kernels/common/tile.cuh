// A tile of work as every backend's kernel sees it, and how a dense batch's tile index maps to it.
#pragma once
#include "kernels/common/tile_math.h"

namespace flashcore::kernels {

struct Tile {
  int m_block;
  int head;
  int batch;
  SeqInfo seq;    // this tile's sequence (dense batches: the tensor's lengths, offset 0)
  KeyRange keys;  // key blocks visited, from keys.end - 1 down to keys.begin
  int split = 0;  // split-KV: which part of the tile's key range (keys is that part)
};

// Tile order: query blocks fastest, so the CTAs running at once share one head's K/V in L2. Causal tiles go
// heaviest first within a head (the bottom query blocks see the most keys). Params: any backend's kernel
// parameters with num_m_blocks, num_heads_q, seqlen_q and seqlen_k.
template <class Cfg, class Params>
__device__ __forceinline__ Tile decode_dense_tile(const Params& p, int tile_idx) {
  Tile t;
  const int hb = tile_idx / p.num_m_blocks;
  const int m_idx = tile_idx - hb * p.num_m_blocks;
  t.head = hb % p.num_heads_q;
  t.batch = hb / p.num_heads_q;
  t.m_block = Cfg::kCausal ? p.num_m_blocks - 1 - m_idx : m_idx;
  t.seq.seqlen_q = p.seqlen_q;
  t.seq.seqlen_k = p.seqlen_k;
  t.keys = key_range(t.seq, t.m_block, Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal);
  return t;
}

}  // namespace flashcore::kernels

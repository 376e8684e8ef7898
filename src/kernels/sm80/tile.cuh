// What a CTA works on: one query block of one (batch, query head), the sequence it belongs to and the key blocks
// it visits. One CTA per tile (grid = num_tiles): the hardware block scheduler balances unequal causal tiles,
// which go heaviest first within a head.
#pragma once
#include "kernels/common/tile_math.h"
#include "kernels/sm80/kernel_params.h"

namespace flashcore::sm80 {

struct Tile {
  int m_block;
  int head;
  int batch;
  kernels::SeqInfo seq;    // this tile's sequence (dense batches: the tensor's lengths, offset 0)
  kernels::KeyRange keys;  // key blocks visited, from keys.end - 1 down to keys.begin
};

// Tile order: query blocks fastest, so the CTAs running at once share one head's K/V in L2.
template <class Cfg>
__device__ __forceinline__ Tile decode_tile(const FwdParams& p, int tile_idx) {
  Tile t;
  const int hb = tile_idx / p.num_m_blocks;
  const int m_idx = tile_idx - hb * p.num_m_blocks;
  t.head = hb % p.num_heads_q;
  t.batch = hb / p.num_heads_q;
  t.m_block = Cfg::kCausal ? p.num_m_blocks - 1 - m_idx : m_idx;
  t.seq.seqlen_q = p.seqlen_q;
  t.seq.seqlen_k = p.seqlen_k;
  t.keys = kernels::key_range(t.seq, t.m_block, Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal);
  return t;
}

}  // namespace flashcore::sm80

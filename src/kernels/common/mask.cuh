// Masking of a score tile held in row-pair fragments (fragment.cuh): key tails (the sequence's last block)
// and the causal diagonal (bottom-right aligned). Applied only to the key blocks that need it.
// 32-bit math on purpose: it is exact because validation caps seqlen_q and seqlen_k at INT32_MAX - 512, so every
// value below (at most seqlen + 2 * block, at least -seqlen) fits in int; the 64-bit form of the same code cost
// 2-5% at head dim 64 on short causal sequences (docs/decisions.md#mask-32bit). Tile and key-range math stays 64-bit
// (tile_math.h).
#pragma once
#include <cmath>

#include "kernels/common/fragment.cuh"
#include "kernels/common/tile_math.h"

namespace flashcore::kernels {

// True when some element of key block `n_block` is masked for some row of query block `m_block`.
template <int kBlockM, int kBlockN, bool kCausal>
__device__ __forceinline__ bool block_needs_mask(const SeqInfo& seq, int n_block, int m_block) {
  const int col_end = (n_block + 1) * kBlockN;  // one past the block's last key
  const int seqlen_k = static_cast<int>(seq.seqlen_k), seqlen_q = static_cast<int>(seq.seqlen_q);
  if (col_end > seqlen_k) return true;
  // The first row of the tile sees the fewest keys: j <= m_block * kBlockM + seqlen_k - seqlen_q.
  if (kCausal) return col_end - 1 > m_block * kBlockM + seqlen_k - seqlen_q;
  return false;
}

// row0: query index (within the sequence) of this thread's first fragment row; col0: key index of its first
// column. Sets masked scores to -inf.
template <int kBlockN, bool kCausal>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], const SeqInfo& seq, int64_t row0_, int64_t col0_) {
  const int row0 = static_cast<int>(row0_), col0 = static_cast<int>(col0_);
  const int seqlen_k = static_cast<int>(seq.seqlen_k), seqlen_q = static_cast<int>(seq.seqlen_q);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int limit = seqlen_k;  // columns < limit are visible
    if (kCausal) {
      const int causal_limit = row0 + 8 * i + 1 + seqlen_k - seqlen_q;
      limit = causal_limit < limit ? causal_limit : limit;
    }
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (col0 + 8 * j + e >= limit) s[acc_index(j, i, e)] = -INFINITY;
      }
    }
  }
}

}  // namespace flashcore::kernels

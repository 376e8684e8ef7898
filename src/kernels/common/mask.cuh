// Masking of a score tile held in row-pair fragments (fragment.cuh): key tails (the sequence's last block)
// and the causal diagonal (bottom-right aligned). Applied only to the key blocks that need it. 64-bit row and
// column math (tile_math.h), so sequences up to INT32_MAX keys never wrap.
#pragma once
#include <cmath>

#include "kernels/common/fragment.cuh"
#include "kernels/common/tile_math.h"

namespace flashcore::kernels {

// True when some element of key block `n_block` is masked for some row of query block `m_block`.
template <int kBlockM, int kBlockN, bool kCausal>
__device__ __forceinline__ bool block_needs_mask(const SeqInfo& seq, int n_block, int m_block) {
  const int64_t col_end = (static_cast<int64_t>(n_block) + 1) * kBlockN;  // one past the block's last key
  if (col_end > seq.seqlen_k) return true;
  // The first row of the tile sees the fewest keys.
  return kCausal && col_end > seq.key_limit(static_cast<int64_t>(m_block) * kBlockM, true);
}

// row0: query index (within the sequence) of this thread's first fragment row; col0: key index of its first
// column. Sets masked scores to -inf.
template <int kBlockN, bool kCausal>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], const SeqInfo& seq, int64_t row0, int64_t col0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // Columns below `limit` are visible; relative to col0 it fits in int (|limit - col0| <= block_n + ...).
    const int64_t lim64 = seq.key_limit(row0 + 8 * i, kCausal) - col0;
    const int limit = lim64 < 0 ? 0 : (lim64 > kBlockN ? kBlockN : static_cast<int>(lim64));
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * j + e >= limit) s[acc_index(j, i, e)] = -INFINITY;
      }
    }
  }
}

}  // namespace flashcore::kernels

// Masking of a score tile held in wgmma accumulator registers: key tails (seqlen_k not a multiple of
// kBlockN) and the causal diagonal (bottom-right aligned: row i sees key j iff j <= i + Sk - Sq).
// Applied only to the key blocks that need it.
#pragma once
#include <cmath>

namespace flashcore::sm90 {

// Fragment index of (8-column group j, row half i, column pair e) in an m64nN f32 accumulator:
// element (row = 16*warp + lane/4 + 8*i, col = 8*j + 2*(lane%4) + e) is d[4*j + 2*i + e].
__host__ __device__ constexpr int acc_index(int j, int i, int e) { return 4 * j + 2 * i + e; }

// True when some element of key block `n_block` is masked for some row of the tile.
template <int kBlockM, int kBlockN, bool kCausal>
__device__ __forceinline__ bool block_needs_mask(int n_block, int m_block, int seqlen_q, int seqlen_k) {
  const int col_end = (n_block + 1) * kBlockN;  // one past the block's last key
  if (col_end > seqlen_k) return true;
  if (kCausal) {
    // First row of the tile sees keys j <= m_block*kBlockM + Sk - Sq.
    const long long first_row_limit = static_cast<long long>(m_block) * kBlockM + seqlen_k - seqlen_q;
    return col_end - 1 > first_row_limit;
  }
  return false;
}

// row0: global query index of this thread's first row; col0: global key index of its first column.
template <int kBlockN, bool kCausal>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], int row0, int col0, int seqlen_q,
                                           int seqlen_k) {
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

}  // namespace flashcore::sm90

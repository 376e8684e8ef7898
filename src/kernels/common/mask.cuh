// Masking of a score tile held in row-pair fragments (fragment.cuh): key tails (the sequence's last block),
// the causal diagonal (bottom-right aligned) and, in the causal rows that take one, a sliding window and chunks
// (SeqInfo).
// Applied only to the key blocks that need it.
// 32-bit math on purpose: it is exact because validation caps seqlen_q and seqlen_k at INT32_MAX - 512, so every
// value below (at most seqlen + 2 * block, at least -seqlen) fits in int; the 64-bit form of the same code cost
// 2-5% at head dim 64 on short causal sequences (docs/decisions.md#mask-32bit). Tile and key-range math stays 64-bit
// (tile_math.h).
#pragma once
#include <cmath>

#include "kernels/common/fragment.cuh"
#include "kernels/common/tile_math.h"
#include "kernels/common/variant_params.h"

namespace flashcore::kernels {

// True when some element of key block `n_block` is masked for some row of query block `m_block`. Both bounds of a
// masked row grow with the row, so the tile's first row has the nearest right bound and its last row the farthest
// left one.
template <int kBlockM, int kBlockN, bool kCausal, bool kWindow>
__device__ __forceinline__ bool block_needs_mask(const SeqInfo& seq, const VariantParams& win, int n_block,
                                                 int m_block) {
  const int col_end = (n_block + 1) * kBlockN;  // one past the block's last key
  const int seqlen_k = static_cast<int>(seq.seqlen_k);
  if (col_end > seqlen_k) return true;
  if (!kCausal) return false;
  // The first row of the tile sees the fewest keys: j <= m_block * kBlockM + seqlen_k - seqlen_q (+ the window's
  // right bound, 0 when causal); the last row (rows past the sequence count too) the fewest on the left:
  // j >= (m_block + 1) * kBlockM - 1 + seqlen_k - seqlen_q - left.
  const int diag = m_block * kBlockM + seqlen_k - static_cast<int>(seq.seqlen_q);  // the first row's diagonal key
  if (col_end - 1 > diag + (kWindow ? win.window_right : 0)) return true;
  if (kWindow && win.window_left >= 0 && n_block * kBlockN < diag + kBlockM - 1 - win.window_left) return true;
  // Chunks: the first row's chunk ends first, the last row's starts last.
  return kWindow && win.chunk > 0 &&
         (col_end > chunk_start(diag, win.chunk) + win.chunk ||
          n_block * kBlockN < chunk_start(diag + kBlockM - 1, win.chunk));
}

// row0: query index (within the sequence) of this thread's first fragment row; col0: key index of its first
// column. Sets masked scores to -inf.
template <int kBlockN, bool kCausal, bool kWindow>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], const SeqInfo& seq, const VariantParams& win,
                                           int64_t row0_, int64_t col0_) {
  const int row0 = static_cast<int>(row0_), col0 = static_cast<int>(col0_);
  const int seqlen_k = static_cast<int>(seq.seqlen_k);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int limit = seqlen_k;  // columns < limit are visible
    if (kCausal) {
      const int causal_limit =
          row0 + 8 * i + 1 + seqlen_k - static_cast<int>(seq.seqlen_q) + (kWindow ? win.window_right : 0);
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
  if (kWindow && win.window_left >= 0) {
    // The window's left bound (the right one is in `limit` above): element (i, j, e) is row row0 + 8i, column
    // col0 + 8j + e, and masked iff column - row < d - left, compared as 8j + e - 8i against one value of the block
    // rather than a bound per row (this runs where S, O and both P sets are live: per-row bounds made rows spill).
    // 32 bits: validation keeps seqlen_q + seqlen_k of windowed calls below 2^31 - 1024.
    const int lo = seqlen_k - static_cast<int>(seq.seqlen_q) - win.window_left - (col0 - row0);  // masked iff < lo
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (8 * j + e - 8 * i < lo) s[acc_index(j, i, e)] = -INFINITY;
        }
      }
    }
  }
  if (kWindow && win.chunk > 0) {
    // Chunks (attention_chunk): row row0 + 8i sees the columns [start, start + chunk) of its chunk, a bound per row
    // computed here only (a uniform branch: calls without chunks skip it).
    const int x0 = row0 + seqlen_k - static_cast<int>(seq.seqlen_q);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int first = chunk_start(x0 + 8 * i, win.chunk) - col0;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + e;
          if (col < first || col >= first + win.chunk) s[acc_index(j, i, e)] = -INFINITY;
        }
      }
    }
  }
}

}  // namespace flashcore::kernels

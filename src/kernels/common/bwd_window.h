// The backward's blocks under a window and chunks (kernels/common/variant_params.h; causal is the window (-1, 0)),
// both backends and the preparation kernel: which query blocks a key block's CTA walks, which key block adds its dQ
// to a query block first or last (the deterministic orders' first turns), and which elements of a (key block, query
// block) step are masked. Query row i of a sequence, at diagonal position x = i + d (d = len_k - len_q), sees key j iff
// lo(x) <= j <= hi(x): lo(x) = x - left (left -1: unbounded) and hi(x) = x + right, each clipped to x's chunk
// [chunk_start(x), + chunk) when chunk > 0 (tile_math.h). Both bounds grow with x, so the rows [X0, X1] of a query
// block see keys in [lo(X0), hi(X1)] only, and every row sees every key of [lo(X1), hi(X0)].
// The three tests use that rectangle with the whole blocks (rows past len_q, keys past len_k included) so that they
// agree: key block n walks query block m iff its keys [n*BN, n*BN + BN) meet [lo(X0), hi(X1)] of the rows [m*BM,
// m*BM + BM). (With chunks a walked step may hold no visible pair, e.g. a query block across a chunk's end: its
// elements are masked.) For each m the key blocks that walk it are consecutive, as the deterministic order needs.
// 32-bit math: validation keeps seqlen_q + seqlen_k of windowed calls below 2^31 - 1024 and seqlen_q + 2 * seqlen_k
// of chunked ones (as mask.cuh).
#pragma once
#include <cuda_runtime.h>

#include <climits>

#include "kernels/common/tile_math.h"

namespace flashcore::kernels {

struct BwdWindow {
  int d;          // len_k - len_q of the sequence
  int left;       // -1: unbounded
  int right;      // >= 0 (a call's unbounded right bound is normalized to seqlen_q: core/variants.h)
  int chunk = 0;  // attention_chunk (> 0, at most seqlen_k: core/variants.h); 0: none

  // The lowest key diagonal position x sees (unclipped by the sequence: may be negative).
  __host__ __device__ __forceinline__ int lo(int x) const {
    int v = left < 0 ? INT_MIN : x - left;
    if (chunk > 0) {
      const int start = chunk_start(x, chunk);
      v = start > v ? start : v;
    }
    return v;
  }
  // The highest key diagonal position x sees.
  __host__ __device__ __forceinline__ int hi(int x) const {
    int v = x + right;
    if (chunk > 0) {
      const int last = chunk_start(x, chunk) + chunk - 1;
      v = last < v ? last : v;
    }
    return v;
  }

  // Query blocks [first, end) of key block n, m_blocks the sequence's: those whose rectangle meets the block.
  __host__ __device__ __forceinline__ void query_blocks(int n, int block_n, int block_m, int m_blocks, int& first,
                                                        int& end) const {
    const int j0 = n * block_n, j1 = j0 + block_n - 1;
    // The lowest x with hi(x) >= j0: x + right >= j0 and, with chunks, x in j0's chunk or later.
    int x_min = j0 - right;
    if (chunk > 0) {
      const int start = chunk_start(j0, chunk);
      x_min = start > x_min ? start : x_min;
    }
    const int lowest = x_min - d;  // the lowest row whose block's last row reaches the block
    first = lowest <= 0 ? 0 : lowest / block_m;
    end = m_blocks;
    if (left >= 0 || chunk > 0) {
      // The highest x with lo(x) <= j1: x - left <= j1 and, with chunks, x in j1's chunk or earlier.
      int x_max = left >= 0 ? j1 + left : INT_MAX;
      if (chunk > 0) {
        const int last = chunk_start(j1, chunk) + chunk - 1;
        x_max = last < x_max ? last : x_max;
      }
      const int highest = x_max - d;
      const int e = highest < 0 ? 0 : highest / block_m + 1;
      end = e < end ? e : end;
    }
    if (first > end) first = end;
  }

  // The first key block whose CTA walks query block m: the one holding lo of the block's first row. (Whether it
  // walks m at all also needs the right bound; when it does not, no key block does.)
  __host__ __device__ __forceinline__ int first_key_block(int m, int block_m, int block_n) const {
    if (left < 0 && chunk == 0) return 0;
    const int lowest = lo(m * block_m + d);
    return lowest <= 0 ? 0 : lowest / block_n;
  }

  // The last key block whose CTA walks query block m, len_k the sequence's keys: the one holding hi of the block's
  // last row, clipped to the sequence (0 when no key block walks it). The deterministic order adds from it down.
  __host__ __device__ __forceinline__ int last_key_block(int m, int block_m, int block_n, int len_k) const {
    const int highest = hi(m * block_m + block_m - 1 + d);
    const int last = highest < len_k - 1 ? highest : len_k - 1;
    return last <= 0 ? 0 : last / block_n;
  }

  // Whether some element of the step (key block n, query block m) is not visible: outside [lo(X1), hi(X0)].
  __host__ __device__ __forceinline__ bool step_masked(int n, int m, int block_n, int block_m) const {
    const int x0 = m * block_m + d;
    if (n * block_n + block_n - 1 > hi(x0)) return true;  // the last key vs the first row
    return (left >= 0 || chunk > 0) && n * block_n < lo(x0 + block_m - 1);  // the first key vs the last row
  }

  __host__ __device__ __forceinline__ bool visible(int key, int query) const {
    const int x = query + d;
    return key <= hi(x) && key >= lo(x);
  }
};

}  // namespace flashcore::kernels

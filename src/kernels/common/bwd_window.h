// The backward's blocks under a window (kernels/common/variant_params.h; causal is the window (-1, 0)), both backends
// and the preparation kernel: which query blocks a key block's CTA walks, which key block adds its dQ to a query block
// first (the deterministic order's first turn), and which elements of a (key block, query block) step are masked.
// Query row i of a sequence sees key j iff i + d - left <= j <= i + d + right, d = len_k - len_q, left -1 unbounded.
// The block tests use the whole blocks (rows past len_q, keys past len_k included) so that the three agree: key block n
// walks query block m iff its keys [n*BN, n*BN + BN) and the rows [m*BM, m*BM + BM) have a pair within the bounds.
// 32-bit math: validation keeps seqlen_q + seqlen_k of windowed calls below 2^31 - 1024 (as mask.cuh).
#pragma once
#include <cuda_runtime.h>

namespace flashcore::kernels {

struct BwdWindow {
  int d;      // len_k - len_q of the sequence
  int left;   // -1: unbounded
  int right;  // >= 0 (a call's unbounded right bound is normalized to seqlen_q: core/variants.h)

  // Query blocks [first, end) of key block n: the rows that see one of its keys, m_blocks the sequence's.
  __host__ __device__ __forceinline__ void query_blocks(int n, int block_n, int block_m, int m_blocks, int& first,
                                                        int& end) const {
    const int lowest = n * block_n - d - right;  // the lowest row that sees the block's first key
    first = lowest <= 0 ? 0 : lowest / block_m;
    end = m_blocks;
    if (left >= 0) {
      const int highest = n * block_n + block_n - 1 - d + left;  // the highest row that sees its last key
      const int e = highest < 0 ? 0 : highest / block_m + 1;
      end = e < end ? e : end;
    }
    if (first > end) first = end;
  }

  // The first key block whose CTA walks query block m: the lowest block holding a key the block's first row sees
  // from the left. (Whether it walks m at all also needs the right bound; when it does not, no key block does.)
  __host__ __device__ __forceinline__ int first_key_block(int m, int block_m, int block_n) const {
    if (left < 0) return 0;
    const int lowest = m * block_m + d - left;
    return lowest <= 0 ? 0 : lowest / block_n;
  }

  // Whether some element of the step (key block n, query block m) is outside the window.
  __host__ __device__ __forceinline__ bool step_masked(int n, int m, int block_n, int block_m) const {
    if (n * block_n + block_n - 1 > m * block_m + d + right) return true;  // the last key vs the first row
    return left >= 0 && n * block_n < m * block_m + block_m - 1 + d - left;  // the first key vs the last row
  }

  __host__ __device__ __forceinline__ bool visible(int key, int query) const {
    const int rel = key - query - d;
    return rel <= right && (left < 0 || rel >= -left);
  }
};

}  // namespace flashcore::kernels

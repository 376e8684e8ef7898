// Tile arithmetic shared by host and device code of every backend: sequences, key ranges, block counts.
// Positions are int64: a sequence may hold up to INT32_MAX tokens, and row + seqlen_k - seqlen_q or
// (block + 1) * block_n must not wrap (validation still caps the sizes, this keeps the math exact).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHCORE_HD __host__ __device__ __forceinline__
#else
#define FLASHCORE_HD inline
#endif

namespace flashcore::kernels {

FLASHCORE_HD constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The sequence a tile belongs to. Dense batches: every sequence has the tensor's lengths and starts at row 0
// of its batch entry. Variable-length batches set the offsets of the packed sequence (rows of the tensor).
struct SeqInfo {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t q_row0 = 0;  // first row of this sequence in the Q/O tensor's seq dimension
  int64_t k_row0 = 0;  // first row of this sequence in the K/V tensor's seq dimension

  // Bottom-right causal alignment: query row i sees key j iff j <= i + (seqlen_k - seqlen_q).
  FLASHCORE_HD int64_t causal_offset() const { return seqlen_k - seqlen_q; }
  // One past the last key row `row` may see (clamped to [0, seqlen_k]).
  FLASHCORE_HD int64_t key_limit(int64_t row, bool causal) const {
    if (!causal) return seqlen_k;
    const int64_t lim = row + 1 + causal_offset();
    return lim < 0 ? 0 : (lim < seqlen_k ? lim : seqlen_k);
  }
};

// Key blocks [begin, end) a tile visits (from end-1 down to begin). Split-KV gives each split a sub-range.
struct KeyRange {
  int begin = 0;
  int end = 0;
  FLASHCORE_HD int count() const { return end > begin ? end - begin : 0; }
};

// The key blocks query block `m_block` (rows [m_block*block_m, +block_m)) must visit.
FLASHCORE_HD KeyRange key_range(const SeqInfo& seq, int64_t m_block, int block_m, int block_n, bool causal) {
  const int64_t last_row = (m_block + 1) * block_m - 1;
  const int64_t keys = seq.key_limit(last_row, causal);
  return KeyRange{0, static_cast<int>(ceil_div(keys, block_n))};
}

}  // namespace flashcore::kernels

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

// The first position of the chunk of `chunk` (> 0) positions that holds x: floor(x / chunk) * chunk, also for x < 0
// (attention_chunk: the query at diagonal position x sees the keys [chunk_start(x), chunk_start(x) + chunk)).
template <class Int>
FLASHCORE_HD constexpr Int chunk_start(Int x, Int chunk) {
  const Int r = x % chunk;
  return x - (r < 0 ? r + chunk : r);
}

// Causal tile order (tile.cuh): (batch, head) slices are grouped into sections whose K and V fit in an L2 budget
// (kL2SectionBytes, as FlashAttention-3's scheduler; both Hopper and Ampere parts have 40-60 MB of L2), and within
// a section every slice's heaviest query block comes first, then every slice's next one, and so on (longest
// processing time first). With one query block after another per head, the last head's heaviest tiles started when
// most of the grid was done and ran alone: on the H200 the order gained 4-14% on d128/d256 causal 2k-8k. Below
// kLptMinBlocks query blocks the tiles are short, the imbalance small, and the head-major order's L2 reuse (a head's
// tiles run together) was worth more (d128 causal 512: -7% with sections): one slice per section is that order.
// Returns the slices per section (docs/decisions.md#l2-sections).
inline constexpr int64_t kL2SectionBytes = int64_t{32} << 20;
inline constexpr int64_t kLptMinBlocks = 8;
FLASHCORE_HD int64_t lpt_section_slices(int64_t seqlen_k, int64_t head_dim, int64_t elem_bytes, int64_t head_ratio,
                                        int64_t slices, int64_t num_m_blocks) {
  if (num_m_blocks < kLptMinBlocks) return 1;
  const int64_t kv_bytes = 2 * seqlen_k * head_dim * elem_bytes / (head_ratio > 0 ? head_ratio : 1);  // per Q head
  const int64_t n = kv_bytes > 0 ? kL2SectionBytes / kv_bytes : slices;
  return n < 1 ? 1 : (n < slices ? n : (slices > 0 ? slices : 1));
}

// log2(page_size) when the page size is a power of two, else -1 (page lookups then divide: tile.cuh, page_entry).
FLASHCORE_HD int page_shift_of(int64_t page_size) {
  for (int s = 0; s < 31; ++s) {
    if (page_size == (int64_t{1} << s)) return s;
  }
  return -1;
}

// The (slice, query-block index) of causal tile `tile_idx` in that order; m_idx 0 is a slice's heaviest block.
FLASHCORE_HD void lpt_tile_slot(int tile_idx, int num_m_blocks, int num_slices, int section_slices, int& slice,
                                int& m_idx) {
  if (section_slices == 1) {  // the head-major order (short tiles): one division, not two
    slice = tile_idx / num_m_blocks;
    m_idx = tile_idx - slice * num_m_blocks;
    return;
  }
  const int per_section = section_slices * num_m_blocks;
  const int section = tile_idx / per_section;
  const int first = section * section_slices;
  const int n = num_slices - first < section_slices ? num_slices - first : section_slices;  // the last may be short
  const int r = tile_idx - section * per_section;
  m_idx = r / n;
  slice = first + (r - m_idx * n);
}

// The sequence a tile belongs to. Dense batches: every sequence has the tensor's lengths and starts at row 0
// of its batch entry. Variable-length batches set the offsets of the packed sequence (rows of the tensor).
// Masked rows (the kernels' causal rows: causal, a sliding window or chunks, kernels/common/variant_params.h) see the
// keys [key_first(row), key_limit(row)); the other rows see every key. Row and key positions are within the sequence;
// d = seqlen_k - seqlen_q aligns the last query with the last key (bottom-right), as FlashAttention does.
struct SeqInfo {
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t q_row0 = 0;  // first row of this sequence in the Q/O tensor's seq dimension
  int64_t k_row0 = 0;  // first row of this sequence in the K/V tensor's seq dimension
  // The window of masked rows: key j visible to row i iff i + d - window_left <= j <= i + d + window_right, -1 being
  // unbounded (window_left -1, window_right 0: causal).
  int window_left = -1;
  int window_right = 0;
  // attention_chunk (> 0; 0: none): row i sees only the keys of its chunk, [chunk_start(i + d), + chunk).
  int chunk = 0;

  // Bottom-right causal alignment: query row i sees key j iff j <= i + (seqlen_k - seqlen_q).
  FLASHCORE_HD int64_t causal_offset() const { return seqlen_k - seqlen_q; }
  // The right bound's reach past the diagonal, a finite stand-in for "unbounded": row + d + seqlen_q covers every key.
  FLASHCORE_HD int64_t right_reach() const {
    return window_right < 0 || window_right > seqlen_q ? seqlen_q : window_right;
  }
  // The left bound's reach before the diagonal: row + d - seqlen_k is before the first key for every row.
  FLASHCORE_HD int64_t left_reach() const { return window_left < 0 || window_left > seqlen_k ? seqlen_k : window_left; }
  // One past the last key row `row` may see (clamped to [0, seqlen_k]).
  FLASHCORE_HD int64_t key_limit(int64_t row, bool causal) const {
    if (!causal) return seqlen_k;
    int64_t lim = row + 1 + causal_offset() + right_reach();
    if (chunk > 0) {
      const int64_t end = int64_t{chunk_start32(row)} + chunk;
      lim = end < lim ? end : lim;
    }
    return lim < 0 ? 0 : (lim < seqlen_k ? lim : seqlen_k);
  }
  // The first key row `row` may see (clamped to [0, seqlen_k]).
  FLASHCORE_HD int64_t key_first(int64_t row, bool causal) const {
    if (!causal) return 0;
    int64_t first = row + causal_offset() - left_reach();
    if (chunk > 0) {
      const int64_t start = chunk_start32(row);
      first = start > first ? start : first;
    }
    return first < 0 ? 0 : (first < seqlen_k ? first : seqlen_k);
  }
  // The start of the chunk of row's diagonal position, in 32 bits (a 64-bit division is a call, whose saved registers
  // spilled the portable d128 rows): validation keeps seqlen_q + 2 * seqlen_k of chunked calls below 2^31 - 1024.
  FLASHCORE_HD int chunk_start32(int64_t row) const {
    return chunk_start(static_cast<int>(row + causal_offset()), chunk);
  }
  // Whether masked rows have a left bound (a window or chunks) besides the sequence's start.
  FLASHCORE_HD bool bounded_left() const { return window_left >= 0 || chunk > 0; }
};

// Key blocks [begin, end) a tile visits (from end-1 down to begin). Split-KV gives each split a sub-range.
struct KeyRange {
  int begin = 0;
  int end = 0;
  FLASHCORE_HD int count() const { return end > begin ? end - begin : 0; }
};

// The key blocks query block `m_block` (rows [m_block*block_m, +block_m)) must visit.
// Both bounds grow with the row, so the tile's first row sees the first key of the range and its last row the last.
// A tile whose rows see no key visits none (begin == end).
FLASHCORE_HD KeyRange key_range(const SeqInfo& seq, int64_t m_block, int block_m, int block_n, bool causal) {
  const int64_t last_row = (m_block + 1) * block_m - 1;
  const int64_t keys = seq.key_limit(last_row, causal);
  const int end = static_cast<int>(ceil_div(keys, block_n));
  if (!causal || !seq.bounded_left()) return KeyRange{0, end};
  const int begin = static_cast<int>(seq.key_first(m_block * block_m, causal) / block_n);
  return KeyRange{begin < end ? begin : end, end};
}

// The prefill split rows' index space (sm90 split_plan.h last_round_plan, scheduler.cuh): indices below `whole` are
// whole tiles; index whole + r * splits + s is part s of remaining tile r, i.e. tile whole + r. In 32 bits (the host
// bounds the index space below 2^31).
struct LastRoundPart {
  int tile;   // the query tile
  int split;  // its part (0 for a whole tile)
  int unit;   // the part's index among all parts (its partials' slot); -1 for a whole tile
};
FLASHCORE_HD LastRoundPart last_round_part(int whole, int splits, int index) {
  if (index < whole) return LastRoundPart{index, 0, -1};
  const int unit = index - whole, rest = unit / splits;
  return LastRoundPart{whole + rest, unit - rest * splits, unit};
}

// Whether no row of a slice whose last query row is `last_row` sees a key of the second half of key block n_block
// (the causal diagonal, or the sequence's end): that block's S GEMM may then compute its first half only (sm90
// mainloop.cuh, the tile's first block). last_row unclipped: rows past the sequence count too, so that every row's
// scores of the second half are masked.
FLASHCORE_HD bool second_half_masked(const SeqInfo& seq, int n_block, int block_n, int64_t last_row, bool causal) {
  return seq.key_limit(last_row, causal) <= static_cast<int64_t>(n_block) * block_n + block_n / 2;
}

}  // namespace flashcore::kernels

// The tile arithmetic of src/kernels/common/tile_math.h is host-callable: check it where it used to wrap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/common/tile_math.h"

using flashcore::kernels::key_range;
using flashcore::kernels::SeqInfo;

// Before: (n_end + kBlockN - 1) in int overflowed near seqlen_k = 2^31 - 1, the block count went negative and
// the kernel waited forever for K/V that were never loaded.
TEST(TileMath, KeyRangeNearInt32MaxDoesNotWrap) {
  SeqInfo seq;
  seq.seqlen_q = 1;
  seq.seqlen_k = INT32_MAX - 512;  // the largest length validation accepts
  for (int block_n : {80, 128, 176, 256}) {
    const auto r = key_range(seq, 0, 64, block_n, /*causal=*/false);
    EXPECT_EQ(r.begin, 0);
    EXPECT_EQ(static_cast<int64_t>(r.end), (seq.seqlen_k + block_n - 1) / block_n) << block_n;
    EXPECT_GT(r.count(), 0);
    const auto c = key_range(seq, 0, 64, block_n, /*causal=*/true);  // the one query row sees every key
    EXPECT_EQ(c.end, r.end) << block_n;
  }
}

TEST(TileMath, CausalKeyLimitIsBottomRightAligned) {
  SeqInfo seq;
  seq.seqlen_q = 100, seq.seqlen_k = 40;  // the first 60 rows see no key
  EXPECT_EQ(seq.key_limit(0, true), 0);
  EXPECT_EQ(seq.key_limit(59, true), 0);
  EXPECT_EQ(seq.key_limit(60, true), 1);
  EXPECT_EQ(seq.key_limit(99, true), 40);
  EXPECT_EQ(seq.key_limit(5, false), 40);
  EXPECT_EQ(key_range(seq, 0, 64, 128, true).count(), 1);  // rows 0..63 include rows 60..63
  seq.seqlen_q = INT32_MAX - 512, seq.seqlen_k = 1;
  EXPECT_EQ(seq.key_limit(seq.seqlen_q - 1, true), 1);
  EXPECT_EQ(seq.key_limit(0, true), 0);
}

// The first S GEMM of a tile computes half a key block where no row of the warpgroup's slice sees the block's second
// half (sm90 mainloop.cuh): a wrong "true" would drop visible keys, so the boundary is checked here.
TEST(TileMath, SecondHalfMaskedOnlyWhereNoRowSeesIt) {
  SeqInfo seq;
  seq.seqlen_q = 1024, seq.seqlen_k = 1024;
  // 128-row tile 3, 128-key diagonal block 3: rows 384..447 see keys up to 447 (< 448, the second half's start)
  EXPECT_TRUE(second_half_masked(seq, 3, 128, 447, true));
  EXPECT_FALSE(second_half_masked(seq, 3, 128, 448, true));  // row 448 sees key 448
  EXPECT_FALSE(second_half_masked(seq, 3, 128, 511, true));
  EXPECT_FALSE(second_half_masked(seq, 3, 128, 447, false));  // non-causal: every key of the block is visible
  // Sk > Sq (a KV cache): bottom-right alignment moves the diagonal right by 512
  seq.seqlen_q = 512, seq.seqlen_k = 1024;
  EXPECT_TRUE(second_half_masked(seq, 4, 128, 63, true));   // row 63 sees keys < 576 = 4 * 128 + 64
  EXPECT_FALSE(second_half_masked(seq, 4, 128, 64, true));  // row 64 sees key 576
  // the sequence's end: 4097 keys leave one key in block 32, non-causal too
  seq.seqlen_q = 4097, seq.seqlen_k = 4097;
  EXPECT_TRUE(second_half_masked(seq, 32, 128, 4159, false));
  EXPECT_FALSE(second_half_masked(seq, 31, 128, 4159, false));
  // 192-key blocks: half = 96 keys
  seq.seqlen_q = seq.seqlen_k = 2048;
  EXPECT_TRUE(second_half_masked(seq, 1, 192, 192 + 95, true));
  EXPECT_FALSE(second_half_masked(seq, 1, 192, 192 + 96, true));
}

// The causal tile order (tile.cuh) must visit every (slice, query block) exactly once, keep each section's slices
// together, and give a section's heavier query blocks lower tile indices than its lighter ones; a wrong order would
// not fail a numerical test (every tile is still computed, just late), so it is checked here.
TEST(TileMath, CausalTileOrderIsAPermutationLongestFirstPerSection) {
  using flashcore::kernels::lpt_section_slices;
  using flashcore::kernels::lpt_tile_slot;
  for (int slices : {1, 3, 16, 32, 33, 256}) {
    for (int m_blocks : {1, 2, 7, 64}) {
      for (int section : {1, 2, 4, 5, 16, 1000}) {
        const int per = section < slices ? section : slices;
        std::vector<int> seen(static_cast<size_t>(slices) * m_blocks, -1);
        for (int t = 0; t < slices * m_blocks; ++t) {
          int slice = -1, m = -1;
          lpt_tile_slot(t, m_blocks, slices, per, slice, m);
          ASSERT_GE(slice, 0);
          ASSERT_LT(slice, slices);
          ASSERT_GE(m, 0);
          ASSERT_LT(m, m_blocks);
          int& at = seen[static_cast<size_t>(slice) * m_blocks + m];
          ASSERT_EQ(at, -1) << "tile " << t << " repeats slice " << slice << " block " << m;
          at = t;
          ASSERT_EQ(slice / per, t / (per * m_blocks)) << "section of tile " << t;
        }
        for (int s = 0; s < slices; ++s) {
          for (int m = 1; m < m_blocks; ++m) {
            // Within a slice, block m (lighter) comes after block m - 1, and after every heavier block of its section.
            const int first = s / per * per;
            for (int o = first; o < std::min(first + per, slices); ++o) {
              EXPECT_LT(seen[static_cast<size_t>(o) * m_blocks + m - 1], seen[static_cast<size_t>(s) * m_blocks + m]);
            }
          }
        }
      }
    }
  }
  // Section size: K and V of the section's Q heads within the 32 MB budget, at least one slice, at most all.
  EXPECT_EQ(lpt_section_slices(8192, 128, 2, 1, 32, 64), 8);    // 4 MB of K/V per head
  EXPECT_EQ(lpt_section_slices(8192, 128, 2, 4, 128, 64), 32);  // GQA 4:1: a Q head's share is 1 MB
  EXPECT_EQ(lpt_section_slices(1 << 20, 256, 2, 1, 8, 8192), 1);  // a head larger than the budget
  EXPECT_EQ(lpt_section_slices(2048, 64, 2, 1, 16, 16), 16);     // everything fits
  EXPECT_EQ(lpt_section_slices(0, 64, 2, 1, 16, 8), 16);
  // Fewer than kLptMinBlocks query blocks: one slice per section, i.e. the head-major order.
  EXPECT_EQ(lpt_section_slices(512, 128, 2, 1, 512, 4), 1);
  int slice = -1, m = -1;
  lpt_tile_slot(13, 4, 512, 1, slice, m);
  EXPECT_EQ(slice, 3);
  EXPECT_EQ(m, 1);
}

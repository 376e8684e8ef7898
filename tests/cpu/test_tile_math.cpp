// The tile arithmetic of src/kernels/common/tile_math.h is host-callable: check it where it used to wrap.
#include <gtest/gtest.h>

#include <cstdint>

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

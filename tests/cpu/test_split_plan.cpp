// Split-KV planning (src/kernels/sm90/split_plan.h): the split count and the workspace layout.
#include <gtest/gtest.h>

#include "kernels/sm90/split_plan.h"
#include "kernels/sm90/tile_shape.h"

namespace {

using flashcore::sm90::paged_box_rows;
using flashcore::sm90::split_plan;

TEST(SplitPlan, FillsTheLastWaveWithTheFewestSplits) {
  // 8 sequences x 8 KV heads (GQA-packed decode): 64 tiles on 132 SMs -> 2 splits, 128 CTAs in one wave.
  auto p = split_plan(/*tiles=*/64, /*key_blocks=*/64, /*sms=*/132, /*batch_heads=*/64, /*seqlen_q=*/4, 128);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(p.blocks_per_split, 32);
  // 1 sequence x 8 KV heads against 8k keys (64 blocks of 128): 16 splits (128 CTAs, the best wave; 15 would give
  // 120 CTAs, 91%, not within 95% of it) of 4 blocks.
  p = split_plan(8, 64, 132, 8, 4, 128);
  EXPECT_EQ(p.splits, 16);
  EXPECT_EQ(p.blocks_per_split, 4);
  // Against 63 blocks the last split is shorter but not empty.
  p = split_plan(8, 63, 132, 8, 4, 128);
  EXPECT_GT(p.blocks_per_split * p.splits, 62);
  EXPECT_LE(p.blocks_per_split * (p.splits - 1), 62);
  // 256 tiles already fill two waves at 97%: no split.
  EXPECT_EQ(split_plan(256, 32, 132, 256, 4, 128).splits, 1);
}

TEST(SplitPlan, FewKeysOrManyTilesMeanOneSplit) {
  EXPECT_EQ(split_plan(1, 1, 132, 1, 1, 64).splits, 1);            // one key block cannot be split
  EXPECT_EQ(split_plan(1, 3, 132, 1, 1, 64).splits, 1);            // at least two blocks per split
  EXPECT_EQ(split_plan(4096, 128, 132, 512, 1024, 64).splits, 1);  // the tiles alone fill the GPU
  EXPECT_EQ(split_plan(1, 100000, 132, 1, 1, 64).splits, 122);     // 122 of the 128 allowed: 95% of the best wave
}

// The tiles' last splits merge them (a counter byte per tile in the workspace's zero header, bytes 16..255) when every
// tile has a byte and a count fits one; otherwise the combine kernel does, and a single part needs neither.
TEST(SplitPlan, FusedMergeWhereTheCountersFit) {
  EXPECT_TRUE(split_plan(8, 64, 132, 8, 4, 128).fused_merge);    // 1 x 8k decode: 16 splits
  EXPECT_TRUE(split_plan(64, 64, 132, 64, 4, 128).fused_merge);  // 8 x 8k: 2 splits
  EXPECT_TRUE(split_plan(240, 9, 132, 240, 1, 128, 3).fused_merge);   // the last byte
  EXPECT_FALSE(split_plan(241, 9, 132, 241, 1, 128, 3).fused_merge);  // no byte for tile 240
  EXPECT_FALSE(split_plan(256, 32, 132, 256, 4, 128).fused_merge);    // one part: O written by the split itself
  const auto many = split_plan(1, 1000, 132, 1, 1, 128, 500);         // 500 parts of 2 blocks: a count overflows a byte
  EXPECT_GT(many.splits, 255);
  EXPECT_FALSE(many.fused_merge);
  const auto most = split_plan(1, 1000, 132, 1, 1, 128, 255);
  EXPECT_EQ(most.splits, 250);  // 1000 blocks in 250 parts of 4
  EXPECT_TRUE(most.fused_merge);
}

TEST(SplitPlan, WorkspaceLayout) {
  const auto p = split_plan(32, 512, 132, 32, 1, 128);
  const size_t rows = 32u * static_cast<size_t>(p.splits) * 1u;
  EXPECT_EQ(p.o_offset, 256u);  // past the dynamic scheduler's counter, 256-byte aligned
  EXPECT_GE(p.lse_offset, p.o_offset + rows * 128 * sizeof(float));
  EXPECT_EQ(p.lse_offset % 256, 0u);
  EXPECT_GE(p.bytes, p.lse_offset + rows * sizeof(float));
  EXPECT_EQ(p.bytes % 256, 0u);
}

// The TMA box of a paged cache's slices (tile_shape.h paged_box_rows; backend.cpp builds the K/V maps with it and
// producer.cuh issues its boxes): a slice of 128 rows or more in the row's own boxes (32 rows for split-KV rows, so a
// page of 128 or 256 keys loads as a dense split block), a smaller slice in one box. The box always divides the slice,
// so that a slice is whole boxes from one page.
TEST(SplitPlan, PagedSlicesGoInBoxesThatDivideThem) {
  EXPECT_EQ(paged_box_rows(32, 128), 32);   // split-KV row, page >= 128 (slice = gcd(page, 128) = 128)
  EXPECT_EQ(paged_box_rows(32, 64), 64);    // split-KV row, page 64: one box per slice, as before
  EXPECT_EQ(paged_box_rows(32, 16), 16);    // page 16
  EXPECT_EQ(paged_box_rows(128, 128), 128); // a whole-block row (static / one-CTA schedules)
  EXPECT_EQ(paged_box_rows(80, 16), 16);    // an 80-key block with 16-key pages
  for (int box : {32, 64, 80, 128, 176}) {
    for (int slice : {16, 32, 64, 128}) {
      const int b = paged_box_rows(box, slice);
      EXPECT_EQ(slice % b, 0) << box << " " << slice;
      EXPECT_EQ(b % 8, 0) << box << " " << slice;  // whole 8-row swizzle atoms
    }
  }
}

}  // namespace

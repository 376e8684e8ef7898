// Split-KV planning (src/kernels/sm90/split_plan.h): the split count and the workspace layout; the prefill rows'
// last-round split and its index space (kernels/common/tile_math.h last_round_part).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "kernels/sm90/split_plan.h"
#include "kernels/sm90/tile_shape.h"

namespace {

using flashcore::sm90::last_round_plan;
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

// The prefill split rows' plan: 2 x 8 heads x 2k at d64 (176 tiles of 192 rows, 16 key blocks each) on 132 SMs: 132
// whole tiles, then the other 44 in 3 parts of 6, 6 and 4 blocks, one part per CTA.
TEST(SplitPlan, LastRoundSplitOfAPrefillCall) {
  auto p = last_round_plan(/*tiles=*/176, /*key_blocks=*/16, /*sms=*/132, /*block_m=*/192, /*head_dim=*/64);
  ASSERT_TRUE(p.last_round);
  EXPECT_EQ(p.whole, 132);
  EXPECT_EQ(p.splits, 3);
  EXPECT_EQ(p.blocks_per_split, 6);
  EXPECT_EQ(p.total, 132 + 44 * 3);
  EXPECT_TRUE(p.fused_merge);
  // Workspace: a slot of 192 rows per part, fp32 O then LSE, 256-byte aligned after the zero header.
  const size_t rows = 44u * 3u * 192u;
  EXPECT_EQ(p.o_offset, 256u);
  EXPECT_GE(p.lse_offset, p.o_offset + rows * 64 * sizeof(float));
  EXPECT_EQ(p.lse_offset % 256, 0u);
  EXPECT_GE(p.bytes, p.lse_offset + rows * sizeof(float));
  // Whole rounds and nothing left, or more remaining tiles than parts: no cut, no merge.
  for (int64_t tiles : {264, 250}) {
    p = last_round_plan(tiles, 16, 132, 192, 64);
    ASSERT_TRUE(p.last_round);
    EXPECT_EQ(p.splits, 1);
    EXPECT_EQ(p.total, tiles);
    EXPECT_FALSE(p.fused_merge);
  }
  // At most one part per key block.
  EXPECT_EQ(last_round_plan(24, 4, 132, 192, 64).splits, 4);
  // A counter byte per remaining tile: not on more SMs than the header has bytes for.
  EXPECT_FALSE(last_round_plan(176, 16, 300, 192, 64).last_round);
}

// The index space (tile_math.h last_round_part, as the sm90 scheduler walks it round-robin over min(total, sms) CTAs):
// every (tile, key block) pair once, whole tiles in the first rounds, each CTA at most one part and only after its
// whole tiles, a tile's parts consecutive from slot part0.
TEST(SplitPlan, LastRoundPartsCoverEveryBlockOnce) {
  using namespace flashcore::kernels;
  const struct { int64_t tiles, blocks; int sms; } cases[] = {
      {176, 16, 132}, {1024, 16, 132}, {128, 512, 132}, {512, 128, 132}, {264, 32, 132}, {133, 48, 132},
      {7, 1000, 132}, {1, 10000, 132}, {135, 100, 132}, {5, 70, 7},     {240, 49, 132}, {2000, 8, 114},
      {1, 1, 132},    {3, 2, 132},     {140, 1, 132},   {24, 4, 132},    {44, 7, 132},   {33, 9, 132}};
  for (const auto& c : cases) {
    const auto plan = last_round_plan(c.tiles, c.blocks, c.sms, 192, 64);
    ASSERT_TRUE(plan.last_round) << c.tiles << " x " << c.blocks;
    ASSERT_LE(plan.total - plan.whole, c.sms);
    const int grid = static_cast<int>(std::min<int64_t>(plan.total, c.sms));
    std::vector<int> seen(static_cast<size_t>(c.tiles * c.blocks), 0);
    for (int cta = 0; cta < grid; ++cta) {
      int parts = 0;
      for (int t = cta; t < plan.total; t += grid) {
        const LastRoundPart part = last_round_part(static_cast<int>(plan.whole), plan.splits, t);
        ASSERT_LT(part.tile, c.tiles);
        int begin = 0, end = static_cast<int>(c.blocks);
        if (part.unit >= 0) {
          EXPECT_EQ(parts, 0) << "one part per CTA";
          ++parts;
          EXPECT_GE(part.tile, plan.whole);
          EXPECT_EQ(part.unit, t - plan.whole);
          begin = part.split * plan.blocks_per_split;
          end = std::min(end, begin + plan.blocks_per_split);
        } else {
          EXPECT_LT(part.tile, plan.whole);
          EXPECT_EQ(parts, 0) << "whole tiles first";
        }
        if (part.unit >= 0) {
          EXPECT_LT(begin, end) << "no empty part";
        }
        for (int b = begin; b < end; ++b) ++seen[static_cast<size_t>(part.tile * c.blocks + b)];
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << c.tiles << " x " << c.blocks << ": pair " << i;
  }
}

}  // namespace

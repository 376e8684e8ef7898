// Split-KV planning (src/kernels/sm90/split_plan.h): the split count and the workspace layout.
#include <gtest/gtest.h>

#include "kernels/sm90/split_plan.h"

namespace {

using flashcore::sm90::split_plan;

TEST(SplitPlan, DecodeFillsTwoWavesWithoutEmptySplits) {
  // 8 sequences x 32 heads, one query row: 256 tiles on 132 SMs already fill the GPU -> 2 splits (2 waves).
  auto p = split_plan(/*tiles=*/256, /*key_blocks=*/64, /*sms=*/132, /*batch_heads=*/256, /*seqlen_q=*/1, 128);
  EXPECT_EQ(p.splits, 2);
  EXPECT_EQ(p.blocks_per_split, 32);
  // 1 sequence x 32 heads against 64k keys (512 blocks of 128): 9 splits of 57 blocks, the last one shorter.
  p = split_plan(32, 512, 132, 32, 1, 128);
  EXPECT_EQ(p.splits, 9);
  EXPECT_EQ(p.blocks_per_split, 57);
  EXPECT_GT(p.blocks_per_split * p.splits, 511);
  EXPECT_LE(p.blocks_per_split * (p.splits - 1), 511);  // the last split has a key block
}

TEST(SplitPlan, FewKeysOrManyTilesMeanOneSplit) {
  EXPECT_EQ(split_plan(1, 1, 132, 1, 1, 64).splits, 1);        // one key block cannot be split
  EXPECT_EQ(split_plan(1, 3, 132, 1, 1, 64).splits, 1);        // at least two blocks per split
  EXPECT_EQ(split_plan(4096, 128, 132, 512, 1024, 64).splits, 1);  // the tiles alone fill the GPU
  EXPECT_EQ(split_plan(1, 100000, 132, 1, 1, 64).splits, 128);  // capped
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

}  // namespace

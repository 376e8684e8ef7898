// The sm90 plan's shape checks (kernels/sm90/launch.h check_row) without a GPU: the messages name the kernel config
// in quotes and the tile limit with its reason (scheduler_grid.h kMaxTileIndex).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/plan.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/scheduler_grid.h"

namespace {

namespace sm90 = flashcore::sm90;

// A compiled whole-tile row with 128-key blocks, or nullptr.
const sm90::KernelRow* row_with_128_key_blocks() {
  int n = 0;
  const sm90::KernelRow* const* rows = sm90::rows(n);
  for (int i = 0; i < n; ++i) {
    if (rows[i]->shape.block_n == 128 && rows[i]->shape.schedule != sm90::Schedule::kSplitKv &&
        rows[i]->shape.schedule != sm90::Schedule::kDynamicPersistent) {
      return rows[i];
    }
  }
  return nullptr;
}

flashcore_attention_params call_for(const sm90::KernelRow& r) {
  flashcore_attention_params p{};
  p.batch = 2;
  p.seqlen_q = p.seqlen_k = 1024;
  p.num_heads_q = p.num_heads_kv = 8;
  p.head_dim = r.head_dim;
  p.dtype = r.dtype;
  p.causal = r.causal ? 1 : 0;
  return p;
}

TEST(PlanChecks, PagedSliceMessageQuotesTheConfig) {
  const sm90::KernelRow* r = row_with_128_key_blocks();
  if (r == nullptr) GTEST_SKIP() << "no whole-tile sm90 row with 128-key blocks in this build";
  flashcore_attention_params p = call_for(*r);
  static const int32_t table[1] = {0};
  p.block_table = table;
  p.page_size = 24;  // gcd(24, 128) = 8: no 16-row slice (validation refuses such pages; the plan checks anyway)
  p.num_pages = 100;
  std::string error;
  EXPECT_EQ(sm90::check_row(*r, p, flashcore::core::Plan{}, error), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(error, "page_size = 24 and kernel config \"" + std::string(r->name) +
                       "\" (key block 128) share no 16-row slice");
  p.page_size = 32;
  error.clear();
  EXPECT_EQ(sm90::check_row(*r, p, flashcore::core::Plan{}, error), FLASHCORE_SUCCESS) << error;
}

TEST(PlanChecks, TileIndexSpaceLeavesRoomForTheGrid) {
  static_assert(sm90::kMaxTileIndex == 0x7fffffffLL - 4096, "a persistent grid adds at most 4096 to an index");
  const sm90::KernelRow* r = row_with_128_key_blocks();
  if (r == nullptr) GTEST_SKIP() << "no whole-tile sm90 row with 128-key blocks in this build";
  flashcore_attention_params p = call_for(*r);
  p.seqlen_q = r->shape.block_m;  // one query block per (batch, head)
  p.num_heads_q = p.num_heads_kv = 1;
  p.batch = sm90::kMaxTileIndex;
  std::string error;
  EXPECT_EQ(sm90::check_row(*r, p, flashcore::core::Plan{}, error), FLASHCORE_SUCCESS) << error;
  p.batch = sm90::kMaxTileIndex + 1;
  EXPECT_EQ(sm90::check_row(*r, p, flashcore::core::Plan{}, error), FLASHCORE_ERROR_SIZE_OVERFLOW);
  EXPECT_NE(error.find("exceeds the tile limit 2^31-4097"), std::string::npos) << error;
}

}  // namespace

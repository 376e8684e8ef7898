// Split-KV planning (host): how many parts a tile's key range is cut into, and the workspace the partials take.
// Used by the sm90 backend for Schedule::kSplitKv rows (decode: few query tiles, many keys).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/common/tile_math.h"

namespace flashcore::sm90 {

struct SplitPlan {
  int splits = 1;
  int blocks_per_split = 1;
  size_t o_offset = 0, lse_offset = 0, bytes = 0;  // workspace layout: [256-byte header][O partials][LSE partials]
  bool fused_merge = false;  // the tiles' last splits merge them (split counters in the header), no combine kernel
};

// The split counters: one byte per tile in the workspace's zero-filled header (flashcore.h: its first 256 bytes stay
// zero after every call), after the dynamic scheduler's 16 bytes. A count reaches the number of splits, so at most
// 255 of them; a plan with more tiles or splits merges with the combine kernel after the grid.
inline constexpr size_t kSplitCounterOffset = 16;
inline constexpr int64_t kSplitCounterTiles = 256 - kSplitCounterOffset;
inline constexpr int kSplitCounterMaxSplits = 255;

// tiles: query tiles without splitting (batch * heads * m_blocks); key_blocks: key blocks of the longest range.
// Each CTA holds an SM alone, so what matters is the last wave: the count s (at least two key blocks per split, at
// most 128) is the smallest whose wave efficiency tiles * s / (waves * sms) is within 95% of the best one's, and
// then trimmed so that no split is empty for the longest range. Fewer splits mean fewer pipeline fills and a
// cheaper combine, but a decode call is bound by the bandwidth of the SMs it keeps busy: at 1 x 8k (8 tiles) 16
// splits beat the 13 that an 85% rule gave by 3% dense and 10% paged (perf-notes v21, bench/decode_splits.py).
inline int64_t wave_efficiency_permille(int64_t ctas, int sms) {
  const int64_t waves = kernels::ceil_div(ctas, static_cast<int64_t>(sms));
  return waves == 0 ? 0 : 1000 * ctas / (waves * sms);
}

// requested (flashcore_attention_params::num_splits): 0 the rule above; n >= 1 at most n parts of at least one block.
inline SplitPlan split_plan(int64_t tiles, int64_t key_blocks, int sms, int64_t batch_heads, int64_t seqlen_q,
                            int head_dim, int requested = 0) {
  SplitPlan plan;
  sms = std::max(sms, 1);
  tiles = std::max<int64_t>(tiles, 1);
  int64_t splits = 1;
  if (requested > 0) {
    splits = std::max<int64_t>(1, std::min<int64_t>(requested, key_blocks));
  } else {
    const int64_t cap = std::max<int64_t>(1, std::min<int64_t>(128, key_blocks / 2));
    int64_t best = 0;
    for (int64_t s = 1; s <= cap; ++s) best = std::max(best, wave_efficiency_permille(tiles * s, sms));
    while (splits < cap && wave_efficiency_permille(tiles * splits, sms) * 100 < best * 95) ++splits;
  }
  plan.blocks_per_split = static_cast<int>(std::max<int64_t>(1, kernels::ceil_div(key_blocks, splits)));
  plan.splits = static_cast<int>(std::max<int64_t>(1, kernels::ceil_div(key_blocks, plan.blocks_per_split)));
  plan.fused_merge = plan.splits > 1 && tiles <= kSplitCounterTiles && plan.splits <= kSplitCounterMaxSplits;
  const size_t rows =
      static_cast<size_t>(batch_heads) * static_cast<size_t>(plan.splits) * static_cast<size_t>(seqlen_q);
  plan.o_offset = 256;  // the first 16 bytes are the dynamic scheduler's counter in every layout; keep 256 aligned
  plan.lse_offset = plan.o_offset + ((rows * static_cast<size_t>(head_dim) * sizeof(float) + 255) & ~size_t{255});
  plan.bytes = plan.lse_offset + ((rows * sizeof(float) + 255) & ~size_t{255});
  return plan;
}

}  // namespace flashcore::sm90

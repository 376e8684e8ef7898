// Split-KV planning (host): how many parts a tile's key range is cut into, and the workspace the partials take.
// Used by the sm90 backend for Schedule::kSplitKv rows: equal parts for the decode rows (few query tiles, many keys),
// the last-round split for the prefill rows (smem_plan.h splits_last_round).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/plan.h"
#include "kernels/common/tile_math.h"
#include "kernels/sm90/scheduler_grid.h"

namespace flashcore::sm90 {

// The split (core::SplitKv) and where its partials go: [the 256-byte zero-filled head][O partials][LSE partials]
// (core::WorkspaceLayout; the sm90 plan copies these offsets into the call's layout).
struct SplitPlan : core::SplitKv {
  size_t o_offset = 0, lse_offset = 0, bytes = 0;
};

// The split counters: one byte per tile in the workspace's zero-filled header (flashcore.h: its first 256 bytes stay
// zero after every call), after the dynamic scheduler's 16 bytes. A count reaches the number of splits, so at most
// 255 of them; a plan with more tiles or splits merges with the combine kernel after the grid.
inline constexpr size_t kSplitCounterOffset = core::WorkspaceLayout::kSplitCounters;
inline constexpr int64_t kSplitCounterTiles = core::WorkspaceLayout::kHead - kSplitCounterOffset;
inline constexpr int kSplitCounterMaxSplits = 255;

// tiles: query tiles without splitting (batch * heads * m_blocks); key_blocks: key blocks of the longest range.
// Each CTA holds an SM alone, so what matters is the last wave: the count s (at least two key blocks per split, at
// most 128) is the smallest whose wave efficiency tiles * s / (waves * sms) is within 95% of the best one's, and
// then trimmed so that no split is empty for the longest range. Fewer splits mean fewer pipeline fills and a
// cheaper combine, but a decode call is bound by the bandwidth of the SMs it keeps busy: at 1 x 8k (8 tiles) 16
// splits beat the 13 that an 85% rule gave by 3% dense and 10% paged (docs/decisions.md#split-count,
// bench/decode_splits.py).
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
  plan.o_offset = core::WorkspaceLayout::kHead;
  plan.lse_offset = plan.o_offset + core::align256(rows * static_cast<size_t>(head_dim) * sizeof(float));
  plan.bytes = plan.lse_offset + core::align256(rows * sizeof(float));
  return plan;
}

// The prefill split rows' plan: the call's whole rounds of tiles (whole = tiles - tiles % sms, round-robin as on a
// static row), then each of the `rest` remaining tiles cut into s = min(key_blocks, sms / rest) equal parts of
// consecutive key blocks, one part per CTA (rest x s <= sms CTAs: a CTA's only cut is this one part, whose Q loads
// while its whole tile finishes). Every part's partial (block_m rows of fp32 O and LSE) has a slot of its own, and
// a cut tile's merge counter is its byte in the header (rest < sms <= kSplitCounterTiles); the tile's last part
// merges the others into its registers (epilogue.cuh). A call with no rest, or with more remaining tiles than parts
// (s = 1), is not cut. last_round false where the plan does not apply (more SMs than counter bytes, or an index
// space past 2^31).
inline SplitPlan last_round_plan(int64_t tiles, int64_t key_blocks, int sms, int block_m, int head_dim) {
  SplitPlan plan;
  tiles = std::max<int64_t>(tiles, 1);
  key_blocks = std::max<int64_t>(key_blocks, 1);
  if (sms <= 0 || sms > kSplitCounterTiles || tiles > kMaxTileIndex) return plan;
  const int64_t rest = tiles % sms;
  const int64_t most = rest == 0 ? 1 : std::max<int64_t>(1, std::min<int64_t>(key_blocks, sms / rest));
  const int64_t per_part = kernels::ceil_div(key_blocks, most);
  const int64_t parts = kernels::ceil_div(key_blocks, per_part);  // no empty part
  plan.last_round = true;
  plan.whole = tiles - rest;
  plan.splits = static_cast<int>(parts);
  plan.blocks_per_split = static_cast<int>(per_part);
  plan.total = plan.whole + rest * parts;
  plan.fused_merge = parts > 1;
  const size_t rows = static_cast<size_t>(rest * parts) * static_cast<size_t>(block_m);
  plan.o_offset = core::WorkspaceLayout::kHead;
  plan.lse_offset = plan.o_offset + core::align256(rows * static_cast<size_t>(head_dim) * sizeof(float));
  plan.bytes = plan.lse_offset + core::align256(rows * sizeof(float));
  return plan;
}

}  // namespace flashcore::sm90

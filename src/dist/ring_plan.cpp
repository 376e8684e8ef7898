// Ring attention's plan (ring_plan.h).
#include "dist/ring_plan.h"

#include <algorithm>

namespace flashcore::dist {

namespace {

// Part `index` of `seqlen` rows cut into `parts` near-equal parts, the first seqlen % parts one row longer.
Chunk part(int64_t seqlen, int64_t parts, int64_t index) {
  const int64_t base = seqlen / parts, extra = seqlen % parts;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

}  // namespace

Shard shard_of(flashcore_ring_layout layout, int64_t seqlen, int world, int rank) {
  if (layout == FLASHCORE_RING_CONTIGUOUS) return {part(seqlen, world, rank), {}};
  return {part(seqlen, 2 * int64_t{world}, rank), part(seqlen, 2 * int64_t{world}, 2 * int64_t{world} - 1 - rank)};
}

int64_t min_seqlen(flashcore_ring_layout layout, int world) {
  return layout == FLASHCORE_RING_CONTIGUOUS ? world : 2 * int64_t{world};
}

int64_t max_shard_len(flashcore_ring_layout layout, int64_t seqlen, int world) {
  int64_t longest = 0;
  for (int r = 0; r < world; ++r) longest = std::max(longest, shard_of(layout, seqlen, world, r).len());
  return longest;
}

bool step_piece(flashcore_ring_layout layout, bool causal, int64_t seqlen, int world, int rank, int step,
                Piece& out) {
  const int j = kv_source(world, rank, step);
  const Shard mine = shard_of(layout, seqlen, world, rank), theirs = shard_of(layout, seqlen, world, j);
  out = {0, mine.len(), 0, theirs.len(), false};
  if (!causal) return true;
  if (j == rank) {
    out.causal = true;
    return true;
  }
  if (layout == FLASHCORE_RING_CONTIGUOUS) return j < rank;
  if (j < rank) {
    out.k_len = theirs.first.len;
  } else {
    out.q_begin = mine.first.len;
    out.q_len = mine.second.len;
  }
  return true;
}

}  // namespace flashcore::dist

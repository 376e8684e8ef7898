// Ring attention's plan, host-only and GPU-free (unit-tested in tests/cpu/test_ring_plan.cpp): which global rows
// each rank holds under a layout, and which block of attention a rank computes at each step of the ring.
//
// At step s (0 .. world - 1) rank r holds the K/V shard of rank j = (r - s) mod world. Its queries see:
//   CONTIGUOUS: all of j's keys (j < r), or causally its own (j == r), or none (j > r; causal only).
//   ZIGZAG (rank r holds chunks r and 2W-1-r): step 0 its own shard causally (the local order is the global
//     order); j < r: all queries against j's first chunk; j > r: the second chunk's queries against all of j's
//     keys. Every step after the first is then half a shard-by-shard block for every rank: balanced.
// Without the causal mask every step is the whole shard-by-shard block.
#pragma once
#include <cstdint>

#include "flashcore/ring.h"

namespace flashcore::dist {

struct Chunk {
  int64_t start = 0, len = 0;
};

struct Shard {
  Chunk first, second;  // second.len = 0 for CONTIGUOUS
  int64_t len() const { return first.len + second.len; }
};

// Rows of `rank`'s shard; every chunk non-empty when seqlen >= min_seqlen(layout, world).
Shard shard_of(flashcore_ring_layout layout, int64_t seqlen, int world, int rank);

// The shortest sequence a layout accepts (every chunk at least one row).
int64_t min_seqlen(flashcore_ring_layout layout, int world);

// The longest shard of any rank.
int64_t max_shard_len(flashcore_ring_layout layout, int64_t seqlen, int world);

// The rank whose K/V rank `rank` holds at `step`.
inline int kv_source(int world, int rank, int step) { return ((rank - step) % world + world) % world; }

// One attention block in local row numbers: queries [q_begin, q_begin + q_len) of the rank's shard against keys
// [k_begin, k_begin + k_len) of the K/V shard it holds.
struct Piece {
  int64_t q_begin = 0, q_len = 0, k_begin = 0, k_len = 0;
  bool causal = false;
};

// The block `rank` computes at `step`; false when it computes nothing (CONTIGUOUS causal, j > r).
bool step_piece(flashcore_ring_layout layout, bool causal, int64_t seqlen, int world, int rank, int step, Piece& out);

}  // namespace flashcore::dist

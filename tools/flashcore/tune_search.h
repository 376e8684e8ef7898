// The autotuner's search, without a GPU: elites of a shape bucket and the next variants to try around them.
// Everything here is a pure function of its arguments (and the seed), so a tuning run's proposals can be
// replayed and tested (tests/cpu/test_tune_search.cpp).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "kernels/sm90/variant.h"

namespace fccli::tune {

using flashcore::sm90::TileShape;
using flashcore::sm90::VariantSpec;

// One timed candidate of a bucket.
struct Measured {
  std::string config;
  double ms = 0;  // median kernel time
};

// The `k` fastest, fastest first; equal times are ordered by name so that the result never depends on the
// order of `all`.
std::vector<Measured> top_k(std::vector<Measured> all, int k);

// The next variants to build for one (dtype, head dim, causal) key, given its elites (best first; the union
// over the key's buckets). In order: the one-dimension mutations of each elite (block_m in {64, 128, 192},
// block_n +-16 and +-32, stages +-1, ping-pong flipped, the other schedules, the rescale vote flipped),
// shuffled per elite, then crossovers of two elites (each field from either parent). Only shapes that are
// feasible (sm90::feasible) and whose names are not in `seen` are returned, at most `count`, no duplicates.
// Deterministic in (base, elites, seen, count, seed, generation).
std::vector<TileShape> propose(const VariantSpec& base, const std::vector<TileShape>& elites,
                               const std::set<std::string>& seen, int count, uint64_t seed, int generation);

// Geometric mean of positive values (1 for none).
double geomean(const std::vector<double>& values);

}  // namespace fccli::tune

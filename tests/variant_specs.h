// The runtime variants the variant tests build (tests/cpu/test_variants.cpp compiles them, tests/gpu/test_variants.cpp
// runs them): not rows of configs.txt. 2 consumer warpgroups, persistent, non-causal; 3 consumer warpgroups, one tile
// per CTA, causal.
#pragma once
#include <vector>

#include "kernels/sm90/variant.h"

namespace flashcore::test {

inline sm90::VariantSpec make_spec(flashcore_dtype dt, int hd, bool causal, sm90::TileShape shape) {
  sm90::VariantSpec s;
  s.dtype = dt, s.head_dim = hd, s.causal = causal, s.shape = shape;
  return s;
}

inline std::vector<sm90::VariantSpec> variant_test_specs() {
  using sm90::Schedule;
  return {make_spec(FLASHCORE_DTYPE_BF16, 128, false, {128, 160, 2, true, Schedule::kStaticPersistent, false}),
          make_spec(FLASHCORE_DTYPE_BF16, 128, true, {192, 64, 2, true, Schedule::kOneTilePerCta, false})};
}

}  // namespace flashcore::test

// Which compute capabilities the portable (sm80) backend's compiled images run on: the rule behind
// backend.cpp has_image_for, apart so that tests/cpu/test_backend_table.cpp can hold it to other builds' archs.
#pragma once
#include <cstddef>

namespace flashcore::sm80 {

// The backend table (api/backend.cpp) offers the portable backend every compute capability from 8.0 up to this one
// where an image runs (has_image_for); Hopper (9.0) is the sm90 backend's, which the table asks first.
constexpr int kMaxServedCc = 999;

// SASS compiled for arch a runs on the later minor versions of a's major version (sm_80 on 8.6, 8.7, 8.9; sm_90 on
// 9.0); PTX of arch p (ptx_arch, 0: none) is JIT-compiled by the driver for any compute capability >= p, e.g. a
// 10.x or 12.x GPU from compute_90 PTX.
constexpr bool image_runs_on(int cc, const int* sass_archs, std::size_t count, int ptx_arch) {
  for (std::size_t i = 0; i < count; ++i) {
    if (sass_archs[i] / 10 == cc / 10 && sass_archs[i] <= cc) return true;
  }
  return ptx_arch > 0 && cc >= ptx_arch;
}

}  // namespace flashcore::sm80

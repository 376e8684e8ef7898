// The build configuration's archs (tests/CMakeLists.txt passes FLASHCORE_TEST_ARCHS, FLASHCORE_TEST_SM80_ARCHS and
// FLASHCORE_TEST_SM80_PTX_ARCH), and the backend table's documented rule (api/backend.h) written out from them,
// as the truth the library is held to -- not derived from the library itself.
#pragma once
#include <sstream>
#include <string>
#include <vector>

namespace flashcore::testing {

inline std::vector<int> parse_int_list(const std::string& list) {
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

// Every arch some backend was compiled for, ascending: 90 (sm_90a) and FLASHCORE_SM80_ARCHS.
inline std::vector<int> configured_archs() { return parse_int_list(FLASHCORE_TEST_ARCHS); }

// FLASHCORE_SM80_ARCHS; empty when the portable backend is not built.
inline std::vector<int> configured_sm80_archs() { return parse_int_list(FLASHCORE_TEST_SM80_ARCHS); }

// The arch of the portable kernels' PTX (FLASHCORE_SM80_PTX: the newest of FLASHCORE_SM80_ARCHS), 0 without.
inline int configured_sm80_ptx_arch() { return FLASHCORE_TEST_SM80_PTX_ARCH; }

// True when a portable image runs on `cc`: SASS of an arch of the same major version, at most cc, or the PTX of an
// arch at most cc (the driver JIT-compiles it: 10.x, 12.x).
inline bool sm80_image_for(int cc) {
  for (int a : configured_sm80_archs()) {
    if (a / 10 == cc / 10 && a <= cc) return true;
  }
  return configured_sm80_ptx_arch() > 0 && cc >= configured_sm80_ptx_arch();
}

// The backend serving `cc` with FLASHCORE_BACKEND unset: sm90 for 9.0, sm80 for 8.x and newer (10.x, 12.x: from the
// PTX) with an image, else "".
inline std::string expected_backend(int cc) {
  if (cc == 90) return "sm90";
  if (cc >= 80 && sm80_image_for(cc)) return "sm80";
  return "";
}

}  // namespace flashcore::testing

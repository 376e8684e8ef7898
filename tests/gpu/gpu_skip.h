// FLASHCORE_REQUIRE_GPU(): skip the current test, with the reason, unless a GPU that a backend of this build
// serves is visible (sm_90 Hopper; sm_8x Ampere/Ada through the portable backend, when built).
// Use as the first statement of a GPU test body. The reason shows in the test output ("Skipped" + reason)
// and tools/run_tests.sh lists it in its summary.
#pragma once
#include <string>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "flashcore/flashcore.h"

namespace flashcore::testing {

// True when cudaGetDeviceCount succeeds with at least one device (for tests of the GPU-less paths).
inline bool cuda_device_visible() {
  int count = 0;
  const bool visible = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return visible;
}

// "" when a backend of this build serves the current device; otherwise why GPU tests cannot run here.
inline std::string query_gpu_skip_reason() {
  // The library's own device checks (driver, device, backend table), as a caller would see them.
  int32_t count = 0;
  if (flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 0, nullptr, 0, &count) != FLASHCORE_SUCCESS) {
    return flashcore_last_error();
  }
  return "";
}

// query_gpu_skip_reason(), asked once per process.
inline const std::string& gpu_skip_reason() {
  static const std::string reason = query_gpu_skip_reason();
  return reason;
}

}  // namespace flashcore::testing

#define FLASHCORE_REQUIRE_GPU()                                                         \
  do {                                                                                  \
    const std::string& flashcore_skip_reason_ = ::flashcore::testing::gpu_skip_reason(); \
    if (!flashcore_skip_reason_.empty()) {                                              \
      GTEST_SKIP() << "GPU test skipped: " << flashcore_skip_reason_;                   \
    }                                                                                   \
  } while (0)

// FLASHCORE_REQUIRE_GPU(), and skip (with the reason) unless the backend serving the current device is `name`
// ("sm90", "sm80"): for tests of one backend's kernel configs. FLASHCORE_BACKEND counts (backend.h).
#define FLASHCORE_REQUIRE_BACKEND(name)                                                                 \
  do {                                                                                                  \
    FLASHCORE_REQUIRE_GPU();                                                                            \
    flashcore_capabilities flashcore_caps_;                                                             \
    flashcore_capabilities_init(&flashcore_caps_);                                                      \
    if (flashcore_get_capabilities(&flashcore_caps_) != FLASHCORE_SUCCESS ||                            \
        std::string(flashcore_caps_.device_backend) != (name)) {                                        \
      GTEST_SKIP() << "GPU test skipped: the device's backend is \"" << flashcore_caps_.device_backend    \
                   << "\", this test is for " << (name);                                                \
    }                                                                                                   \
  } while (0)

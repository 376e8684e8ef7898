// Internals shared by the 16-bit (check.cpp), backward (check_bwd.cpp) and 8-bit (check_fp8.cpp) correctness runners:
// the seed mixer, owners of device memory and streams, the backend requirement of sm90-only cases, the validate /
// workspace-size steps, and the variants' case helpers.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::check::detail {

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

struct OwnedStream {
  cudaStream_t stream = nullptr;
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream) cudaStreamDestroy(stream);
  }
};

// "" when the backend serving the current device is sm90; otherwise why a case needing it (`what`, e.g. "the 8-bit
// path needs") is skipped.
inline std::string sm90_skip_reason(const char* what) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return flashcore_last_error();
  if (std::string(caps.device_backend) == "sm90") return "";
  return std::string(what) + " the sm90 backend; this device is served by \"" + caps.device_backend + "\"";
}

// flashcore_attention_validate, then flashcore_attention_workspace_size into `bytes`, as the runners use them: true
// when both succeed. A case this build does not compile (unsupported head dim or dtype) is skipped (r.skipped, the
// reason in r.message); any other status fails with the call and the library's message. R: check::Result or
// check::fp8::Result.
template <class R>
bool validate_and_size(const flashcore_attention_params& p, uint64_t& bytes, R& r) {
  const flashcore_status vs = flashcore_attention_validate(&p);
  if (vs == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || vs == FLASHCORE_ERROR_UNSUPPORTED_DTYPE) {
    r.skipped = true;
    r.message = std::string(flashcore_status_string(vs)) + ": " + flashcore_last_error();
    return false;
  }
  if (vs != FLASHCORE_SUCCESS) {
    r.message = std::string("flashcore_attention_validate: ") + flashcore_status_string(vs) + ": " + flashcore_last_error();
    return false;
  }
  if (const flashcore_status ws = flashcore_attention_workspace_size(&p, &bytes); ws != FLASHCORE_SUCCESS) {
    r.message = std::string("flashcore_attention_workspace_size: ") + flashcore_status_string(ws) + ": " +
                flashcore_last_error();
    return false;
  }
  return true;
}

// Sink logits for `heads` query heads: spread over [-2, 6], so that some heads' sinks weigh little and some take most
// of a row's mass (scores of N(0, 1) inputs are O(1)).
inline std::vector<float> sink_logits(int64_t heads) {
  std::vector<float> s(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) s[static_cast<size_t>(h)] = -2.0f + 8.0f * static_cast<float>(h % 5) / 4.0f;
  return s;
}

// A case (the forward's or the backward's Case) with FlashAttention's window_size (left, right).
template <class Case>
Case& with_window(Case& c, int32_t left, int32_t right) {
  c.local = true, c.window_left = left, c.window_right = right;
  return c;
}

}  // namespace flashcore::check::detail

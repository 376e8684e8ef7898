// TEMPORARY: implements api/backend.h by forwarding to the sm90 backend, until the real backend table lands.
// Drop this file when merging with the branch that implements backend.h.
#include <cstddef>
#include <string>

#include "api/backend.h"
#include "sm90/fwd_launch.h"

namespace flashcore::backend {

bool is_compiled(flashcore_dtype dtype, int head_dim) { return sm90::is_compiled(dtype, head_dim); }

int compiled_archs(int* out, int capacity) {
  if (out != nullptr && capacity > 0) out[0] = 90;
  return 1;
}

const char* backend_for_arch(int cc) { return cc == 90 ? "sm90" : nullptr; }

int kernel_configs(int cc, flashcore_dtype dtype, int head_dim, bool /*causal*/, const char** out, int capacity) {
  if (cc != 90 || !sm90::is_compiled(dtype, head_dim)) return 0;
  if (out != nullptr && capacity > 0) out[0] = "default";
  return 1;
}

flashcore_status workspace_size(const flashcore_attention_params& /*p*/, int /*cc*/, size_t& bytes,
                                std::string& /*error*/) {
  bytes = 0;
  return FLASHCORE_SUCCESS;
}

flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                         cudaStream_t stream, std::string& error) {
  if (cc != 90) {
    error = "no backend for compute capability " + std::to_string(cc);
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  return sm90::forward(p, softmax_scale, device, stream, error);
}

}  // namespace flashcore::backend

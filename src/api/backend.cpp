// The backend table (backend.h). Each backend serves a set of compute capabilities and lists its compiled
// kernel rows; today that is sm90 (Hopper, compute capability 9.0). A portable sm80 backend adds one entry.
#include "api/backend.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "api/dtype.h"
#include "kernels/sm90/launch.h"

namespace flashcore::backend {
namespace {

struct Backend {
  const char* name;
  int cc_min, cc_max;  // compute capabilities served, inclusive
  int compiled_cc;     // the target its kernels are compiled for (90 for sm_90a)
};

constexpr Backend kBackends[] = {
    {"sm90", 90, 90, 90},
};

const Backend* find(int cc) {
  for (const Backend& b : kBackends) {
    if (cc >= b.cc_min && cc <= b.cc_max) return &b;
  }
  return nullptr;
}

}  // namespace

bool is_compiled(flashcore_dtype dtype, int head_dim) {
  int n = 0;
  const sm90::KernelRow* const* rows = sm90::rows(n);
  for (int i = 0; i < n; ++i) {
    if (rows[i]->dtype == dtype && rows[i]->head_dim == head_dim) return true;
  }
  return false;
}

int compiled_head_dims(flashcore_dtype dtype, int* out, int capacity) {
  int n = 0;
  const sm90::KernelRow* const* rows = sm90::rows(n);
  std::vector<int> dims;
  for (int i = 0; i < n; ++i) {
    if (dtype == FLASHCORE_DTYPE_SAME || rows[i]->dtype == dtype) dims.push_back(rows[i]->head_dim);
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(dims.size()); ++i) out[i] = dims[i];
  return static_cast<int>(dims.size());
}

int compiled_archs(int* out, int capacity) {
  int count = 0;
  for (const Backend& b : kBackends) {
    if (out != nullptr && count < capacity) out[count] = b.compiled_cc;
    ++count;
  }
  return count;
}

const char* backend_for_arch(int cc) {
  const Backend* b = find(cc);
  return b != nullptr ? b->name : nullptr;
}

int kernel_configs(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char** out, int capacity) {
  if (find(cc) == nullptr) return 0;
  int n = 0, count = 0;
  const sm90::KernelRow* const* rows = sm90::rows(n);
  for (int pass = 0; pass < 2; ++pass) {  // the default first
    for (int i = 0; i < n; ++i) {
      const sm90::KernelRow& r = *rows[i];
      if (r.dtype != dtype || r.out_dtype != dtype || r.head_dim != head_dim || r.causal != causal) continue;
      if (r.is_default != (pass == 0)) continue;
      if (out != nullptr && count < capacity) out[count] = r.name;
      ++count;
    }
  }
  return count;
}

namespace {
const sm90::KernelRow* select_row(const flashcore_attention_params& p, int cc, std::string& error) {
  if (find(cc) == nullptr) {
    error = "no backend serves compute capability " + std::to_string(cc);
    return nullptr;
  }
  return sm90::select(p.dtype, resolved_out_dtype(p.dtype, p.out_dtype), static_cast<int>(p.head_dim), p.causal != 0,
                      p.kernel_config, error);
}
}  // namespace

flashcore_status workspace_size(const flashcore_attention_params& p, int cc, size_t& bytes, std::string& error) {
  const sm90::KernelRow* row = select_row(p, cc, error);
  if (row == nullptr) return p.kernel_config != nullptr ? FLASHCORE_ERROR_INVALID_ARGUMENT : FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  bytes = sm90::workspace_bytes(*row);
  return FLASHCORE_SUCCESS;
}

flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                         cudaStream_t stream, std::string& error) {
  const sm90::KernelRow* row = select_row(p, cc, error);
  if (row == nullptr) return p.kernel_config != nullptr ? FLASHCORE_ERROR_INVALID_ARGUMENT : FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  return sm90::launch(*row, p, softmax_scale, device, stream, error);
}

}  // namespace flashcore::backend

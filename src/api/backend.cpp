// The backend table (backend.h): the backends this library was built with (generated api/backends.inc: sm90 and,
// when built, the portable sm80), each a core::BackendOps of its own folder. Nothing here knows one backend from
// another: a call is planned by the backend that serves the device and run from that plan.
#include "api/backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "api/tuning.h"
#include "api/validate.h"
#include "core/dtype.h"
#include "core/launch_util.h"
#include "core/variants.h"
#include "kernels/common/append_params.h"
#include "kernels/sm90/launch.h"

namespace flashcore {
#define FLASHCORE_BACKEND(NS) \
  namespace NS {              \
  extern const core::BackendOps kBackend; \
  }
#include "api/backends.inc"
#undef FLASHCORE_BACKEND
}  // namespace flashcore

namespace flashcore::backend {
namespace {

const core::BackendOps* const kBackends[] = {
#define FLASHCORE_BACKEND(NS) &NS::kBackend,
#include "api/backends.inc"
#undef FLASHCORE_BACKEND
};

const core::BackendOps* by_name(const char* name) {
  for (const core::BackendOps* b : kBackends) {
    if (std::strcmp(b->name, name) == 0) return b;
  }
  return nullptr;
}

const core::BackendOps* find(int cc) {
  if (const char* forced = forced_backend(); forced != nullptr) {
    // A forced backend serves what it has an image for (the portable one on 8.x and, with its sm_90 image, on 9.0).
    const core::BackendOps* b = by_name(forced);
    return b != nullptr && b->has_image(cc) ? b : nullptr;
  }
  for (const core::BackendOps* b : kBackends) {
    if (cc >= b->cc_min && cc <= b->cc_max && b->has_image(cc)) return b;
  }
  return nullptr;
}

// Every compiled row of every backend (runtime variants left out), for what the build holds.
std::vector<core::RowInfo> compiled_rows() {
  std::vector<core::RowInfo> rows;
  for (const core::BackendOps* b : kBackends) b->rows(0, rows);
  rows.erase(std::remove_if(rows.begin(), rows.end(), [](const core::RowInfo& r) { return r.variant; }), rows.end());
  return rows;
}

}  // namespace

const char* forced_backend() {
  const char* env = std::getenv("FLASHCORE_BACKEND");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) return nullptr;
  return env;
}

namespace {
int v_dim(const core::RowInfo& r) { return r.head_dim_v != 0 ? r.head_dim_v : r.head_dim; }
}  // namespace

bool is_compiled(flashcore_dtype dtype, int head_dim) { return is_compiled_pair(dtype, head_dim, head_dim); }

bool is_compiled_pair(flashcore_dtype dtype, int head_dim, int head_dim_v) {
  for (const core::RowInfo& r : compiled_rows()) {
    if (r.dtype == dtype && r.head_dim == head_dim && v_dim(r) == head_dim_v) return true;
  }
  return false;
}

int compiled_head_dim_pairs(flashcore_dtype dtype, int (*out)[2], int capacity) {
  std::vector<std::pair<int, int>> pairs;
  for (const core::RowInfo& r : compiled_rows()) {
    if ((dtype == FLASHCORE_DTYPE_SAME || r.dtype == dtype) && v_dim(r) != r.head_dim) {
      pairs.emplace_back(r.head_dim, v_dim(r));
    }
  }
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(pairs.size()); ++i) {
    out[i][0] = pairs[static_cast<size_t>(i)].first, out[i][1] = pairs[static_cast<size_t>(i)].second;
  }
  return static_cast<int>(pairs.size());
}

int compiled_head_dims(flashcore_dtype dtype, int* out, int capacity) {
  std::vector<int> dims;
  for (const core::RowInfo& r : compiled_rows()) {
    if ((dtype == FLASHCORE_DTYPE_SAME || r.dtype == dtype) && v_dim(r) == r.head_dim) dims.push_back(r.head_dim);
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(dims.size()); ++i) out[i] = dims[i];
  return static_cast<int>(dims.size());
}

int compiled_archs(int* out, int capacity) {
  std::vector<int> archs;
  for (const core::BackendOps* b : kBackends) b->compiled_archs(archs);
  std::sort(archs.begin(), archs.end());
  archs.erase(std::unique(archs.begin(), archs.end()), archs.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(archs.size()); ++i) out[i] = archs[i];
  return static_cast<int>(archs.size());
}

const char* backend_for_arch(int cc) {
  const core::BackendOps* b = find(cc);
  return b != nullptr ? b->name : nullptr;
}

int kernel_configs(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char** names, int capacity) {
  // The rows whose O is in the dtype's default output dtype (the input dtype; bf16 for 8-bit inputs; 8-bit configs are
  // compiled for both 16-bit outputs with the same names).
  const flashcore_dtype out = resolved_out_dtype(dtype, FLASHCORE_DTYPE_SAME);
  const core::BackendOps* b = find(cc);
  if (b == nullptr) return 0;
  std::vector<core::RowInfo> rows;
  b->rows(cc, rows);
  // The default first: the row forward() picks when no kernel_config is given.
  const char* def = b->default_config(cc, dtype, out, head_dim, causal);
  int count = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const core::RowInfo& r : rows) {
      if (r.dtype != dtype || r.out_dtype != out || r.head_dim != head_dim || v_dim(r) != head_dim ||
          r.causal != causal) {
        continue;
      }
      const bool is_def = def != nullptr && std::strcmp(r.name, def) == 0;
      if (is_def != (pass == 0)) continue;
      if (names != nullptr && count < capacity) names[count] = r.name;
      ++count;
    }
  }
  return count;
}

bool config_available(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char* name,
                      bool* needs_workspace) {
  const core::BackendOps* b = find(cc);
  if (b == nullptr || name == nullptr) return false;
  bool workspace = false;
  if (!b->config_available(cc, dtype, resolved_out_dtype(dtype, FLASHCORE_DTYPE_SAME), head_dim, causal, name,
                           &workspace)) {
    return false;
  }
  if (needs_workspace != nullptr) *needs_workspace = workspace;
  return true;
}

namespace {
// An e4m3 Q on an e4m3 KV cache (dtype FP8_E4M3 with FLASHCORE_FLAG_KV_FP8_E4M3): the kernels are the 16-bit Q ones
// of out_dtype, which read a copy of Q widened into the workspace (exactly: e4m3 values are fp16 and bf16 values);
// q_descale joins K's descale in the score scale (sm90/mainloop.cuh descaled_score_scale).
bool widens_q(const flashcore_attention_params& p) {
  return (p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0 && is_8bit(p.dtype);
}

// The call as the kernels see it: with a widened Q, dtype is the 16-bit out_dtype (q still the caller's pointer).
flashcore_attention_params kernel_view(const flashcore_attention_params& p) {
  flashcore_attention_params k = p;
  if (widens_q(p)) {
    k.dtype = resolved_out_dtype(p.dtype, p.out_dtype);
    k.out_dtype = FLASHCORE_DTYPE_SAME;
  }
  return k;
}

// The bytes of Q's copy in the workspace (rotated: flashcore.h rotary_cos; or widened: widens_q), contiguous, 256-byte
// aligned; 0 without one.
uint64_t q_copy_bytes(const flashcore_attention_params& p) {
  if (p.rotary_cos == nullptr && !widens_q(p)) return 0;
  const int64_t rows = p.cu_seqlens_q != nullptr ? p.total_q : p.batch * p.seqlen_q;
  return core::align256(static_cast<size_t>(rows * p.num_heads_q * p.head_dim) *
                        dtype_size(kernel_view(p).dtype));
}
}  // namespace

flashcore_status plan(const flashcore_attention_params& call, int device, int cc, uint64_t workspace_capacity,
                      core::Plan& out, std::string& error) {
  const flashcore_attention_params p = kernel_view(call);
  out = core::Plan{};
  out.backend = find(cc);
  if (out.backend == nullptr) {
    error = "no backend serves compute capability " + std::to_string(cc);
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  // Pages that are not a multiple of 16 rows: the sm90 kernels' TMA slices cannot load them; the portable kernels,
  // which look a page up per row, take them on Hopper too (correct, at the portable kernels' speed: the sm90 gather
  // producer is issue #73's open part).
  if (p.block_table != nullptr && p.page_size % api::kTmaPageMultiple != 0 &&
      std::strcmp(out.backend->name, "sm90") == 0) {
    const core::BackendOps* portable = forced_backend() == nullptr ? by_name("sm80") : nullptr;
    if (portable == nullptr || !portable->has_image(cc)) {
      error = "page_size = " + std::to_string(p.page_size) + " is not a multiple of 16: the sm90 kernels take " +
              "multiples of 16, and " +
              (forced_backend() != nullptr ? std::string("FLASHCORE_BACKEND=") + forced_backend() + " is set"
                                           : "this build has no portable kernels for sm_" + std::to_string(cc)) +
              " (the portable kernels take any page size)";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    out.backend = portable;
  }
  // An e4m3 KV cache runs on the sm90 kernels only in this version.
  if ((p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0 && std::strcmp(out.backend->name, "sm90") != 0) {
    error = std::string("flags has FLASHCORE_FLAG_KV_FP8_E4M3: an e4m3 KV cache runs on the sm90 kernels (Hopper) only "
                        "in this version; the ") + out.backend->name + " backend serves this call" +
            (p.block_table != nullptr && p.page_size % api::kTmaPageMultiple != 0
                 ? " (page_size = " + std::to_string(p.page_size) + " is not a multiple of 16)"
                 : std::string());
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  out.device = device;
  out.cc = cc;
  if (const cudaError_t err = core::sm_count(device, out.sms); err != cudaSuccess) {
    error = core::cuda_message("cannot query the device", err);
    return FLASHCORE_ERROR_CUDA;
  }
  // A rotation's (or a widening's) Q copy goes after the backend's workspace: the backend plans for what is left.
  const uint64_t q_copy = q_copy_bytes(call);
  const char* copier = call.rotary_cos != nullptr ? "rotary_cos rotates" : "an e4m3 Q on an e4m3 KV cache is widened";
  if (q_copy > 0 && workspace_capacity < q_copy) {
    error = std::string("workspace: ") + copier + " Q into the workspace, which needs at least " +
            std::to_string(q_copy) + " bytes (flashcore_attention_workspace_size); workspace_size = " +
            std::to_string(workspace_capacity) + (p.workspace == nullptr ? " and workspace is NULL" : "");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const uint64_t capacity =
      q_copy == 0 || workspace_capacity == UINT64_MAX ? workspace_capacity : workspace_capacity - q_copy;
  const core::PlanRequest request{capacity, tuning::choose};
  const flashcore_status st = out.backend->plan(p, request, out, error);
  if (st == FLASHCORE_SUCCESS && q_copy > 0) {
    // Past the zero-filled head (core::WorkspaceLayout::kHead), also where the backend needs no workspace: a rotated Q
    // written there would leave the head non-zero after the call, and the next call's dynamic tile counter or split
    // counters would start from it.
    out.q_copy = core::align256(std::max<size_t>(out.workspace.bytes, core::WorkspaceLayout::kHead));
    out.workspace.bytes = out.q_copy + q_copy;
    if (workspace_capacity != UINT64_MAX && out.workspace.bytes > workspace_capacity) {
      error = "workspace: this call needs " + std::to_string(out.workspace.bytes) + " bytes with " +
              (call.rotary_cos != nullptr ? "rotary_cos" : "an e4m3 Q") +
              " (flashcore_attention_workspace_size); workspace_size = " + std::to_string(workspace_capacity);
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  }
  return st;
}

flashcore_status run(const core::Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                     cudaStream_t stream, std::string& error) {
  const bool widen = widens_q(p);
  if (p.rotary_cos == nullptr && !widen) return plan.backend->run(plan, p, softmax_scale, stream, error);
  // Rotary embedding: Q rotated into the workspace first (the new keys are rotated by the append); an e4m3 Q on an
  // e4m3 cache: widened there. The backend reads that copy, contiguous.
  if (p.workspace == nullptr || p.workspace_size < plan.workspace.bytes) {
    error = "workspace: this plan needs " + std::to_string(plan.workspace.bytes) + " bytes with " +
            (widen ? "an e4m3 Q" : "rotary_cos") + " (flashcore_attention_workspace_size); workspace_size = " +
            std::to_string(p.workspace_size);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  flashcore_attention_params r = kernel_view(p);
  void* copy = static_cast<char*>(p.workspace) + plan.q_copy;
  const cudaError_t err = widen ? kernels::launch_widen_q(p, r.dtype, copy, plan.sms, stream)
                                : kernels::launch_rotary_q(p, copy, plan.sms, stream);
  if (err != cudaSuccess) {
    error = core::cuda_message(widen ? "the e4m3 Q's widening launch failed" : "rotary embedding launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  r.q = copy;
  r.q_strides = {r.cu_seqlens_q != nullptr ? 0 : r.seqlen_q * r.num_heads_q * r.head_dim, r.num_heads_q * r.head_dim,
                 r.head_dim, 1};
  return plan.backend->run(plan, r, softmax_scale, stream, error);
}

flashcore_status workspace_size(const flashcore_attention_params& p, int cc, size_t& bytes, std::string& error) {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    (void)cudaGetLastError();
    error = std::string("querying the current CUDA device failed: ") + cudaGetErrorString(err);
    return FLASHCORE_ERROR_CUDA;
  }
  core::Plan planned;
  if (const flashcore_status st = plan(p, device, cc, UINT64_MAX, planned, error); st != FLASHCORE_SUCCESS) return st;
  bytes = planned.workspace.bytes;
  return FLASHCORE_SUCCESS;
}

flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                         cudaStream_t stream, std::string& error) {
  core::Plan planned;
  const uint64_t capacity = p.workspace != nullptr ? p.workspace_size : 0;
  if (const flashcore_status st = plan(p, device, cc, capacity, planned, error); st != FLASHCORE_SUCCESS) return st;
  return run(planned, p, softmax_scale, stream, error);
}

flashcore_status selected_config(const flashcore_attention_params& p, int device, int cc, const char*& name,
                                 std::string& error) {
  core::Plan planned;
  const uint64_t capacity = p.workspace != nullptr ? p.workspace_size : 0;
  const flashcore_status st = plan(p, device, cc, capacity, planned, error);
  if (st == FLASHCORE_SUCCESS) name = planned.config;
  return st;
}

size_t fp8_transposed_v_bytes(const flashcore_attention_params& p) { return sm90::fp8_vt_bytes(p); }

bool backward_compiled(flashcore_dtype dtype, int head_dim, int head_dim_v, bool variants) {
  if (head_dim_v == 0) head_dim_v = head_dim;
  for (const core::BackendOps* b : kBackends) {
    if (b->backward_compiled != nullptr && b->backward_compiled(dtype, head_dim, head_dim_v, variants)) return true;
  }
  return false;
}

namespace {
// The backend that runs the backward on `cc`, or nullptr with the reason in `error`.
const core::BackendOps* backward_backend(int cc, std::string& error) {
  const core::BackendOps* b = find(cc);
  if (b == nullptr) {
    error = "no backend serves compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10);
  } else if (b->backward == nullptr) {
    error = std::string("the ") + b->name + " backend has no backward pass";
    b = nullptr;
  }
  return b;
}
}  // namespace

// Whether backend b compiles the backward of the call's (dtype, head dim); else the reason in `error`.
bool backend_has_backward(const core::BackendOps* b, const flashcore_attention_params& p, std::string& error) {
  const int head_dim = static_cast<int>(p.head_dim), head_dim_v = static_cast<int>(core::head_dim_v(p));
  if (b->backward_compiled == nullptr || b->backward_compiled(p.dtype, head_dim, head_dim_v, false)) return true;
  error = std::string("head_dim = ") + std::to_string(p.head_dim) +
          (head_dim_v != head_dim ? ", head_dim_v = " + std::to_string(head_dim_v) : std::string()) + ": the " +
          b->name +
          " backend that serves this device has no backward kernel for it (the sm90 backend's backward takes head "
          "dims 64, 96, 128, 192, 256 and (192, 128), the portable one's 64 and 128)";
  return false;
}

flashcore_status backward_workspace_size(const flashcore_attention_params& p, int cc, uint64_t& bytes,
                                         std::string& error) {
  const core::BackendOps* b = backward_backend(cc, error);
  if (b == nullptr) return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  if (!backend_has_backward(b, p, error)) return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  bytes = b->backward_workspace(p);
  return FLASHCORE_SUCCESS;
}

flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                          cudaStream_t stream, std::string& error) {
  const core::BackendOps* b = backward_backend(cc, error);
  if (b == nullptr) return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  if (!backend_has_backward(b, p, error)) return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  const uint64_t needed = b->backward_workspace(p);
  if (p.workspace == nullptr || p.workspace_size < needed) {
    error = "workspace: the backward needs " + std::to_string(needed) +
            " bytes (flashcore_attention_backward_workspace_size); workspace_size = " + std::to_string(p.workspace_size) +
            (p.workspace == nullptr ? " and workspace is NULL" : "");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return b->backward(p, softmax_scale, device, stream, error);
}

flashcore_status fp8_transpose_v(const flashcore_attention_params& p, void* vt, int cc, cudaStream_t stream,
                                 std::string& error) {
  // The 8-bit path is the sm90 backend's.
  const core::BackendOps* b = find(cc);
  if (b == nullptr) {
    error = "no backend serves compute capability " + std::to_string(cc);
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  if (b != &sm90::kBackend) {
    error = std::string("the 8-bit V transpose needs the sm90 backend (Hopper); this device is served by ") + b->name;
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  kernels::Fp8PrepParams prep = sm90::fp8_prep_params(p);
  prep.vt = static_cast<uint8_t*>(vt);
  if (const cudaError_t err = sm90::launch_fp8_transpose_v(prep, stream); err != cudaSuccess) {
    error = core::cuda_message("8-bit V transpose launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::backend

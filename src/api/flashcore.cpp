// The C entry points of include/flashcore/flashcore.h. None of them throws or aborts.
#include "flashcore/flashcore.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "core/dtype.h"
#include "api/error.h"
#include "api/params.h"
#include "api/validate.h"

using flashcore::api::guarded;
using flashcore::api::set_error;
using flashcore::api::upgrade_params;

namespace {

#define FLASHCORE_STR2(x) #x
#define FLASHCORE_STR(x) FLASHCORE_STR2(x)
constexpr const char kVersionString[] = FLASHCORE_STR(FLASHCORE_VERSION_MAJOR) "." FLASHCORE_STR(
    FLASHCORE_VERSION_MINOR) "." FLASHCORE_STR(FLASHCORE_VERSION_PATCH);

// Strides of a contiguous (B, S, H, D) or (B, H, S, D) tensor.
flashcore_tensor_strides contiguous(int64_t seqlen, int64_t heads, int64_t head_dim, bool bhsd) {
  flashcore_tensor_strides s{};
  s.dim = 1;
  if (bhsd) {
    s.seq = head_dim;
    s.head = seqlen * head_dim;
    s.batch = heads * seqlen * head_dim;
  } else {
    s.head = head_dim;
    s.seq = heads * head_dim;
    s.batch = seqlen * heads * head_dim;
  }
  return s;
}

// upgrade_params, then the argument checks, then (with_device) the device checks: what forward and
// workspace_size share. On success `p` is the current-layout copy; `device` and `cc` are set when with_device.
flashcore_status checked_params(const flashcore_attention_params* params, bool with_device,
                                flashcore_attention_params& p, int& device, int& cc, std::string& message) {
  flashcore_status status = upgrade_params(params, p, message);
  if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_arguments(&p, message);
  if (status == FLASHCORE_SUCCESS && with_device) status = flashcore::api::validate_device(p, device, cc, message);
  return status;
}

// The fields a plan depends on (flashcore.h, flashcore_attention_plan): a field of `run` that differs from the
// plan's call's, or "" when they agree. Pointers count by whether they are given; strides and the scale do not count.
std::string plan_mismatch(const flashcore_attention_params& plan, const std::string& plan_config,
                          const flashcore_attention_params& run) {
  const std::pair<const char*, bool> same[] = {
      {"batch", plan.batch == run.batch},
      {"seqlen_q", plan.seqlen_q == run.seqlen_q},
      {"seqlen_k", plan.seqlen_k == run.seqlen_k},
      {"num_heads_q", plan.num_heads_q == run.num_heads_q},
      {"num_heads_kv", plan.num_heads_kv == run.num_heads_kv},
      {"head_dim", plan.head_dim == run.head_dim},
      {"head_dim_v", plan.head_dim_v == run.head_dim_v},
      {"dtype", plan.dtype == run.dtype},
      {"causal", plan.causal == run.causal},
      {"out_dtype", plan.out_dtype == run.out_dtype},
      {"precision", plan.precision == run.precision},
      {"flags", plan.flags == run.flags},
      {"kernel_config", plan_config == (run.kernel_config != nullptr ? run.kernel_config : "")},
      {"lse (given or not)", (plan.lse != nullptr) == (run.lse != nullptr)},
      {"seqused_k (given or not)", (plan.seqused_k != nullptr) == (run.seqused_k != nullptr)},
      {"cu_seqlens_q (given or not)", (plan.cu_seqlens_q != nullptr) == (run.cu_seqlens_q != nullptr)},
      {"cu_seqlens_k (given or not)", (plan.cu_seqlens_k != nullptr) == (run.cu_seqlens_k != nullptr)},
      {"total_q", plan.total_q == run.total_q},
      {"total_k", plan.total_k == run.total_k},
      {"block_table (given or not)", (plan.block_table != nullptr) == (run.block_table != nullptr)},
      {"block_table_stride", plan.block_table_stride == run.block_table_stride},
      {"page_size", plan.page_size == run.page_size},
      {"num_pages", plan.num_pages == run.num_pages},
      {"num_splits", plan.num_splits == run.num_splits},
      {"k_new (given or not)", (plan.k_new != nullptr) == (run.k_new != nullptr)},
      {"seqlen_new", plan.seqlen_new == run.seqlen_new},
      {"q_descale (given or not)", (plan.q_descale != nullptr) == (run.q_descale != nullptr)},
      {"k_descale (given or not)", (plan.k_descale != nullptr) == (run.k_descale != nullptr)},
      {"v_descale (given or not)", (plan.v_descale != nullptr) == (run.v_descale != nullptr)},
      {"local", plan.local == run.local},
      {"window_size_left", plan.local == 0 || plan.window_size_left == run.window_size_left},
      {"window_size_right", plan.local == 0 || plan.window_size_right == run.window_size_right},
      {"attention_chunk", plan.attention_chunk == run.attention_chunk},
      {"softcap (given or not)", (plan.softcap != 0.f) == (run.softcap != 0.f)},
      {"sinks (given or not)", (plan.sinks != nullptr) == (run.sinks != nullptr)},
      {"kv_batch_idx (given or not)", (plan.kv_batch_idx != nullptr) == (run.kv_batch_idx != nullptr)},
      {"kv_batch_size", plan.kv_batch_size == run.kv_batch_size},
      {"leftpad_k (given or not)", (plan.leftpad_k != nullptr) == (run.leftpad_k != nullptr)},
      {"cu_seqlens_k_new (given or not)", (plan.cu_seqlens_k_new != nullptr) == (run.cu_seqlens_k_new != nullptr)},
      {"total_k_new", plan.total_k_new == run.total_k_new},
      {"seqused_q (given or not)", (plan.seqused_q != nullptr) == (run.seqused_q != nullptr)},
      {"rotary_cos (given or not)", (plan.rotary_cos != nullptr) == (run.rotary_cos != nullptr)},
      {"rotary_dim", plan.rotary_dim == run.rotary_dim},
      {"rotary_interleaved", plan.rotary_interleaved == run.rotary_interleaved},
  };
  for (const auto& [field, equal] : same) {
    if (!equal) return field;
  }
  return "";
}

// Writes the config name `selected` and its NUL to `name` (capacity bytes), or fails naming what it needs.
flashcore_status copy_config_name(const char* selected, char* name, uint64_t capacity) {
  const size_t length = std::strlen(selected);
  if (capacity <= length) {
    return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "capacity = " + std::to_string(capacity) +
                                                           " is too small for the config name \"" + selected + "\" (" +
                                                           std::to_string(length + 1) + " bytes)");
  }
  std::memcpy(name, selected, length + 1);
  return FLASHCORE_SUCCESS;
}

}  // namespace

// A plan of the C ABI: the backend's plan and the call it was made for.
struct flashcore_plan {
  flashcore::core::Plan plan;
  flashcore_attention_params call;  // as planned (pointers kept only to tell given from not given)
  std::string kernel_config;        // call.kernel_config's text ("" for none)
};

extern "C" {

void flashcore_attention_params_init_sized(flashcore_attention_params* params, uint32_t struct_size) {
  flashcore::api::clear_error();
  if (params == nullptr) {
    set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_attention_params_init: params is NULL");
    return;
  }
  if (!flashcore::api::accepted_params_size(struct_size)) {
    set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "flashcore_attention_params_init_sized: struct_size = " +
                                                    std::to_string(struct_size) + " is not an accepted size");
    return;
  }
  // Build a current struct, then hand the caller the part its layout holds (a newer caller's tail: zeros).
  flashcore_attention_params p;
  std::memset(&p, 0, sizeof(p));
  p.q_strides.dim = p.k_strides.dim = p.v_strides.dim = p.o_strides.dim = 1;
  flashcore::api::set_post_v1_defaults(p);
  const size_t copied = flashcore::api::field_bytes_of(struct_size);
  auto* out = reinterpret_cast<unsigned char*>(params);
  std::memset(out, 0, struct_size);
  std::memcpy(out, &p, copied);
  std::memcpy(out, &struct_size, sizeof(struct_size));
}

// The 0.1 entry point, called by binaries built against the 0.1 header: their struct is 0.1-sized. (Callers
// built against this header reach flashcore_attention_params_init_sized through the header's macro.)
void(flashcore_attention_params_init)(flashcore_attention_params* params) {
  flashcore_attention_params_init_sized(params, FLASHCORE_ATTENTION_PARAMS_V1_SIZE);
}

flashcore_status flashcore_attention_params_set_contiguous(flashcore_attention_params* params, int bhsd_layout) {
  return guarded("flashcore_attention_params_set_contiguous", [&]() -> flashcore_status {
    if (params == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "params is NULL");
    // Works on every accepted layout: read through a current copy, write back only the (0.1) stride fields.
    flashcore_attention_params p;
    std::string message;
    if (const flashcore_status s = upgrade_params(params, p, message); s != FLASHCORE_SUCCESS) {
      return set_error(s, message);
    }
    if (bhsd_layout != 0 && bhsd_layout != 1) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT,
                       "bhsd_layout = " + std::to_string(bhsd_layout) + " must be 0 (bshd) or 1 (bhsd)");
    }
    const std::pair<const char*, int64_t> sizes[] = {{"seqlen_q", p.seqlen_q}, {"seqlen_k", p.seqlen_k},
                                                     {"num_heads_q", p.num_heads_q},
                                                     {"num_heads_kv", p.num_heads_kv}, {"head_dim", p.head_dim}};
    for (const auto& [name, value] : sizes) {
      if (value <= 0) {
        return set_error(FLASHCORE_ERROR_INVALID_SIZE, std::string(name) + " = " + std::to_string(value) +
                                                           " must be positive");
      }
      if (value > INT32_MAX) {
        return set_error(FLASHCORE_ERROR_SIZE_OVERFLOW, std::string(name) + " = " + std::to_string(value) +
                                                            " exceeds INT32_MAX");
      }
    }
    // Each size <= INT32_MAX: products of three fit in int64 only if small enough; check.
    int64_t q_elems = 0, kv_elems = 0;
    if (__builtin_mul_overflow(p.seqlen_q * p.num_heads_q, p.head_dim, &q_elems) ||
        __builtin_mul_overflow(p.seqlen_k * p.num_heads_kv, p.head_dim, &kv_elems)) {
      return set_error(FLASHCORE_ERROR_SIZE_OVERFLOW, "seqlen * num_heads * head_dim overflows int64");
    }
    // V and O: head_dim_v columns where V has a head dim of its own (since 0.7; checked by validation).
    const int64_t dv = p.head_dim_v > 0 && p.head_dim_v <= INT32_MAX ? p.head_dim_v : p.head_dim;
    int64_t o_elems = 0, v_elems = 0;
    if (__builtin_mul_overflow(p.seqlen_q * p.num_heads_q, dv, &o_elems) ||
        __builtin_mul_overflow(p.seqlen_k * p.num_heads_kv, dv, &v_elems)) {
      return set_error(FLASHCORE_ERROR_SIZE_OVERFLOW, "seqlen * num_heads * head_dim_v overflows int64");
    }
    const bool bhsd = bhsd_layout == 1;
    p.q_strides = contiguous(p.seqlen_q, p.num_heads_q, p.head_dim, bhsd);
    p.o_strides = contiguous(p.seqlen_q, p.num_heads_q, dv, bhsd);
    p.k_strides = contiguous(p.seqlen_k, p.num_heads_kv, p.head_dim, bhsd);
    p.v_strides = contiguous(p.seqlen_k, p.num_heads_kv, dv, bhsd);
    static_assert(offsetof(flashcore_attention_params, o_strides) + sizeof(flashcore_tensor_strides) <=
                      flashcore::api::kParamsV1FieldBytes,
                  "the strides are 0.1 fields");
    params->q_strides = p.q_strides;
    params->k_strides = p.k_strides;
    params->v_strides = p.v_strides;
    params->o_strides = p.o_strides;
    // The backward's tensors (since 0.4) take Q's and K's layouts, where the caller's struct has them.
    if (params->struct_size >= sizeof(flashcore_attention_params)) {
      params->dq_strides = p.q_strides;
      params->dout_strides = p.o_strides;  // dO has O's shape, dV V's
      params->dk_strides = p.k_strides;
      params->dv_strides = p.v_strides;
    }
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_attention_validate(const flashcore_attention_params* params) {
  return guarded("flashcore_attention_validate", [&] {
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    const flashcore_status status = checked_params(params, /*with_device=*/false, p, device, cc, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

flashcore_status flashcore_attention_forward(const flashcore_attention_params* params, flashcore_stream_t stream) {
  return guarded("flashcore_attention_forward", [&] {
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_params(params, /*with_device=*/true, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    const float scale = flashcore::api::resolve_softmax_scale(p);
    status = flashcore::backend::forward(p, scale, device, cc, stream, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

namespace {
// The backward's checks: the forward's arguments, the backward's (validate.h), then the device and the backward's
// own tensors' memory.
flashcore_status checked_backward(const flashcore_attention_params* params, flashcore_attention_params& p, int& device,
                                  int& cc, std::string& message) {
  flashcore_status status = upgrade_params(params, p, message);
  if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_arguments(&p, message);
  if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_backward_arguments(p, message);
  if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_device(p, device, cc, message);
  const std::pair<const char*, const void*> tensors[] = {
      {"dout", p.dout}, {"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}, {"dsinks", p.dsinks}};
  for (const auto& [name, ptr] : tensors) {
    if (status == FLASHCORE_SUCCESS && ptr != nullptr) {
      status = flashcore::api::check_device_pointer(name, ptr, device, message);
    }
  }
  return status;
}
}  // namespace

flashcore_status flashcore_attention_backward_workspace_size(const flashcore_attention_params* params, uint64_t* bytes) {
  return guarded("flashcore_attention_backward_workspace_size", [&] {
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "bytes is NULL");
    *bytes = 0;
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_backward(params, p, device, cc, message);
    uint64_t size = 0;
    if (status == FLASHCORE_SUCCESS) status = flashcore::backend::backward_workspace_size(p, cc, size, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    *bytes = size;
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_attention_backward(const flashcore_attention_params* params, flashcore_stream_t stream) {
  return guarded("flashcore_attention_backward", [&] {
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_backward(params, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    const float scale = flashcore::api::resolve_softmax_scale(p);
    status = flashcore::backend::backward(p, scale, device, cc, stream, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

flashcore_status flashcore_attention_plan(const flashcore_attention_params* params, flashcore_plan** plan) {
  return guarded("flashcore_attention_plan", [&] {
    if (plan == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "plan is NULL");
    *plan = nullptr;
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_params(params, /*with_device=*/true, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    auto made = std::make_unique<flashcore_plan>();
    const uint64_t capacity = p.workspace != nullptr ? p.workspace_size : UINT64_MAX;
    status = flashcore::backend::plan(p, device, cc, capacity, made->plan, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    made->call = p;
    made->kernel_config = p.kernel_config != nullptr ? p.kernel_config : "";
    made->call.kernel_config = nullptr;
    *plan = made.release();
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_plan_workspace_size(const flashcore_plan* plan, uint64_t* bytes) {
  return guarded("flashcore_plan_workspace_size", [&] {
    if (plan == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "plan is NULL");
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "bytes is NULL");
    *bytes = plan->plan.workspace.bytes;
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_plan_config(const flashcore_plan* plan, char* name, uint64_t capacity) {
  return guarded("flashcore_plan_config", [&] {
    if (plan == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "plan is NULL");
    if (name == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "name is NULL");
    if (capacity > 0) name[0] = '\0';
    return copy_config_name(plan->plan.config, name, capacity);
  });
}

flashcore_status flashcore_attention_run(const flashcore_plan* plan, const flashcore_attention_params* params,
                                         flashcore_stream_t stream) {
  return guarded("flashcore_attention_run", [&] {
    if (plan == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "plan is NULL");
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_params(params, /*with_device=*/true, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    if (device != plan->plan.device) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "the current device is " + std::to_string(device) +
                                                             "; the plan was made on device " +
                                                             std::to_string(plan->plan.device));
    }
    if (const std::string field = plan_mismatch(plan->call, plan->kernel_config, p); !field.empty()) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT,
                       "params." + field + " differs from the plan's (flashcore_attention_plan): make a plan for it");
    }
    const float scale = flashcore::api::resolve_softmax_scale(p);
    status = flashcore::backend::run(plan->plan, p, scale, stream, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

void flashcore_plan_destroy(flashcore_plan* plan) { delete plan; }

flashcore_status flashcore_attention_workspace_size(const flashcore_attention_params* params, uint64_t* bytes) {
  return guarded("flashcore_attention_workspace_size", [&] {
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "bytes is NULL");
    *bytes = 0;
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_params(params, /*with_device=*/true, p, device, cc, message);
    size_t size = 0;
    if (status == FLASHCORE_SUCCESS) status = flashcore::backend::workspace_size(p, cc, size, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    *bytes = size;
    return FLASHCORE_SUCCESS;
  });
}

namespace {
// The checks flashcore_fp8_transposed_v_size and flashcore_fp8_transpose_v share: V's fields only (validate.h).
flashcore_status checked_8bit_v(const flashcore_attention_params* params, bool with_device,
                                flashcore_attention_params& p, int& device, int& cc, std::string& message) {
  flashcore_status status = upgrade_params(params, p, message);
  if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_v_transpose(p, message);
  if (status == FLASHCORE_SUCCESS && with_device) status = flashcore::api::validate_device(p, device, cc, message);
  return status;
}
}  // namespace

flashcore_status flashcore_fp8_transposed_v_size(const flashcore_attention_params* params, uint64_t* bytes) {
  return guarded("flashcore_fp8_transposed_v_size", [&] {
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "bytes is NULL");
    *bytes = 0;
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    const flashcore_status status = checked_8bit_v(params, /*with_device=*/false, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    *bytes = flashcore::backend::fp8_transposed_v_bytes(p);
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_fp8_transpose_v(const flashcore_attention_params* params, void* vt,
                                           flashcore_stream_t stream) {
  return guarded("flashcore_fp8_transpose_v", [&] {
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_8bit_v(params, /*with_device=*/true, p, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    status = flashcore::api::check_v_transpose_output(p, vt, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    status = flashcore::backend::fp8_transpose_v(p, vt, cc, static_cast<cudaStream_t>(stream), message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

flashcore_status flashcore_stream_capture_id(flashcore_stream_t stream, uint64_t* capture_id) {
  return guarded("flashcore_stream_capture_id", [&] {
    if (capture_id == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "capture_id is NULL");
    *capture_id = 0;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (const cudaError_t err = cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &id);
        err != cudaSuccess) {
      (void)cudaGetLastError();  // leave no error for the caller's next CUDA call
      return set_error(FLASHCORE_ERROR_CUDA, std::string("cudaStreamGetCaptureInfo: ") + cudaGetErrorString(err));
    }
    if (status == cudaStreamCaptureStatusActive) *capture_id = id;
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_attention_selected_config(const flashcore_attention_params* params, char* name,
                                                    uint64_t capacity) {
  return guarded("flashcore_attention_selected_config", [&] {
    if (name == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "name is NULL");
    if (capacity > 0) name[0] = '\0';
    std::string message;
    flashcore_attention_params p;
    int device = 0, cc = 0;
    flashcore_status status = checked_params(params, /*with_device=*/true, p, device, cc, message);
    const char* selected = nullptr;
    if (status == FLASHCORE_SUCCESS) status = flashcore::backend::selected_config(p, device, cc, selected, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    return copy_config_name(selected, name, capacity);
  });
}

flashcore_status flashcore_list_kernel_configs(flashcore_dtype dtype, int32_t head_dim, int32_t causal,
                                               const char** names, int32_t capacity, int32_t* count) {
  return guarded("flashcore_list_kernel_configs", [&] {
    if (count == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "count is NULL");
    *count = 0;
    if (capacity < 0) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "capacity = " + std::to_string(capacity) + " is negative");
    }
    if (names == nullptr && capacity > 0) {
      return set_error(FLASHCORE_ERROR_NULL_POINTER,
                       "names is NULL but capacity = " + std::to_string(capacity) + " (pass capacity 0 to count)");
    }
    if (causal != 0 && causal != 1) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "causal = " + std::to_string(causal) + " must be 0 or 1");
    }
    std::string message;
    int device = 0, cc = 0;
    const flashcore_attention_params no_tensors{};  // device checks only: no pointers to check
    const flashcore_status status = flashcore::api::validate_device(no_tensors, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    *count = flashcore::backend::kernel_configs(cc, dtype, head_dim, causal == 1, names, capacity);
    return FLASHCORE_SUCCESS;
  });
}

const char* flashcore_status_string(flashcore_status status) {
  switch (status) {
    case FLASHCORE_SUCCESS: return "success";
    case FLASHCORE_ERROR_NULL_POINTER: return "null pointer";
    case FLASHCORE_ERROR_INVALID_SIZE: return "invalid size";
    case FLASHCORE_ERROR_SIZE_OVERFLOW: return "size overflow";
    case FLASHCORE_ERROR_INVALID_HEAD_RATIO: return "invalid head ratio";
    case FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM: return "unsupported head dim";
    case FLASHCORE_ERROR_UNSUPPORTED_DTYPE: return "unsupported dtype";
    case FLASHCORE_ERROR_MISALIGNED_POINTER: return "misaligned pointer";
    case FLASHCORE_ERROR_INVALID_STRIDE: return "invalid stride";
    case FLASHCORE_ERROR_OVERLAPPING_OUTPUT: return "overlapping output";
    case FLASHCORE_ERROR_NO_DEVICE: return "no CUDA device";
    case FLASHCORE_ERROR_UNSUPPORTED_ARCH: return "unsupported GPU architecture";
    case FLASHCORE_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FLASHCORE_ERROR_CUDA: return "CUDA error";
    case FLASHCORE_ERROR_INTERNAL: return "internal error";
    case FLASHCORE_ERROR_NCCL: return "NCCL unavailable or failed";
  }
  return "unknown status";
}

const char* flashcore_last_error(void) { return flashcore::api::last_error(); }

void flashcore_version(int* major, int* minor, int* patch) {
  if (major != nullptr) *major = FLASHCORE_VERSION_MAJOR;
  if (minor != nullptr) *minor = FLASHCORE_VERSION_MINOR;
  if (patch != nullptr) *patch = FLASHCORE_VERSION_PATCH;
}

const char* flashcore_version_string(void) { return kVersionString; }

}  // extern "C"

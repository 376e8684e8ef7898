// The C entry points of include/flashcore/flashcore.h. None of them throws or aborts.
#include "flashcore/flashcore.h"

#include <cstring>
#include <string>

#include "api/error.h"
#include "api/validate.h"
#include "sm90/fwd_launch.h"

using flashcore::api::guarded;
using flashcore::api::set_error;

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

}  // namespace

extern "C" {

void flashcore_attention_params_init(flashcore_attention_params* params) {
  flashcore::api::clear_error();
  if (params == nullptr) {
    set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_attention_params_init: params is NULL");
    return;
  }
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(flashcore_attention_params);
  params->q_strides.dim = params->k_strides.dim = params->v_strides.dim = params->o_strides.dim = 1;
}

flashcore_status flashcore_attention_params_set_contiguous(flashcore_attention_params* params, int bhsd_layout) {
  return guarded("flashcore_attention_params_set_contiguous", [&]() -> flashcore_status {
    if (params == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "params is NULL");
    flashcore_attention_params& p = *params;
    if (p.struct_size != sizeof(flashcore_attention_params)) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT,
                       "params->struct_size = " + std::to_string(p.struct_size) +
                           " is not sizeof(flashcore_attention_params) (call flashcore_attention_params_init first)");
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
    const bool bhsd = bhsd_layout == 1;
    p.q_strides = p.o_strides = contiguous(p.seqlen_q, p.num_heads_q, p.head_dim, bhsd);
    p.k_strides = p.v_strides = contiguous(p.seqlen_k, p.num_heads_kv, p.head_dim, bhsd);
    return FLASHCORE_SUCCESS;
  });
}

flashcore_status flashcore_attention_validate(const flashcore_attention_params* params) {
  return guarded("flashcore_attention_validate", [&] {
    std::string message;
    const flashcore_status status = flashcore::api::validate_arguments(params, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
  });
}

flashcore_status flashcore_attention_forward(const flashcore_attention_params* params, flashcore_stream_t stream) {
  return guarded("flashcore_attention_forward", [&] {
    std::string message;
    int device = 0, cc = 0;
    flashcore_status status = flashcore::api::validate_arguments(params, message);
    if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_device(*params, device, cc, message);
    if (status != FLASHCORE_SUCCESS) return set_error(status, message);
    const float scale = flashcore::api::resolve_softmax_scale(*params);
    status = flashcore::sm90::forward(*params, scale, device, stream, message);
    return status == FLASHCORE_SUCCESS ? status : set_error(status, message);
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

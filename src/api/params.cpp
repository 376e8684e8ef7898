#include "api/params.h"

#include <cstring>

namespace flashcore::api {

bool accepted_params_size(uint32_t struct_size) {
  return struct_size == FLASHCORE_ATTENTION_PARAMS_V1_SIZE || struct_size == FLASHCORE_ATTENTION_PARAMS_V2_SIZE ||
         struct_size == FLASHCORE_ATTENTION_PARAMS_V3_SIZE || struct_size == FLASHCORE_ATTENTION_PARAMS_V4_SIZE ||
         struct_size == FLASHCORE_ATTENTION_PARAMS_V5_SIZE || struct_size == FLASHCORE_ATTENTION_PARAMS_V6_SIZE ||
         struct_size == FLASHCORE_ATTENTION_PARAMS_V7_SIZE ||
         (struct_size >= sizeof(flashcore_attention_params) && struct_size <= kMaxParamsStructSize);
}

void set_post_v1_defaults(flashcore_attention_params& p) {
  p.out_dtype = FLASHCORE_DTYPE_SAME;
  p.reserved = 0;
  p.lse_capacity = 0;
  p.workspace = nullptr;
  p.workspace_size = 0;
  p.kernel_config = nullptr;
  p.seqused_k = nullptr;
  p.cu_seqlens_q = nullptr;
  p.cu_seqlens_k = nullptr;
  p.total_q = 0;
  p.total_k = 0;
  p.block_table = nullptr;
  p.block_table_stride = 0;
  p.page_size = 0;
  p.num_pages = 0;
  p.num_splits = 0;
  p.flags = 0;
  p.k_new = nullptr;
  p.v_new = nullptr;
  p.k_new_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.v_new_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.seqlen_new = 0;
  set_post_v2_defaults(p);
}

void set_post_v2_defaults(flashcore_attention_params& p) {
  p.q_descale = nullptr;
  p.k_descale = nullptr;
  p.v_descale = nullptr;
  p.precision = FLASHCORE_PRECISION_NATIVE;
  p.reserved2 = 0;
  set_post_v3_defaults(p);
}

void set_post_v3_defaults(flashcore_attention_params& p) {
  p.dout = nullptr;
  p.dq = nullptr;
  p.dk = nullptr;
  p.dv = nullptr;
  p.dout_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.dq_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.dk_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.dv_strides = flashcore_tensor_strides{0, 0, 0, 1};
  p.deterministic = 0;
  p.reserved3 = 0;
  set_post_v4_defaults(p);
}

void set_post_v4_defaults(flashcore_attention_params& p) {
  p.local = 0;
  p.window_size_left = 0;
  p.window_size_right = 0;
  p.softcap = 0.f;
  p.sinks = nullptr;
  p.attention_chunk = 0;
  p.reserved4 = 0;
  set_post_v5_defaults(p);
}

void set_post_v5_defaults(flashcore_attention_params& p) {
  p.dsinks = nullptr;
  set_post_v6_defaults(p);
}

void set_post_v6_defaults(flashcore_attention_params& p) {
  p.head_dim_v = 0;
  set_post_v7_defaults(p);
}

void set_post_v7_defaults(flashcore_attention_params& p) {
  p.kv_batch_idx = nullptr;
  p.kv_batch_size = 0;
  p.leftpad_k = nullptr;
  p.cu_seqlens_k_new = nullptr;
  p.total_k_new = 0;
  p.seqused_q = nullptr;
  p.rotary_cos = nullptr;
  p.rotary_sin = nullptr;
  p.rotary_seqlen = 0;
  p.rotary_dim = 0;
  p.rotary_interleaved = 0;
  p.rotary_seqlens = nullptr;
}

size_t field_bytes_of(uint32_t struct_size) {
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V1_SIZE) return kParamsV1FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V2_SIZE) return kParamsV2FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V3_SIZE) return kParamsV3FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V4_SIZE) return kParamsV4FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V5_SIZE) return kParamsV5FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V6_SIZE) return kParamsV6FieldBytes;
  if (struct_size == FLASHCORE_ATTENTION_PARAMS_V7_SIZE) return kParamsV7FieldBytes;
  return sizeof(flashcore_attention_params);
}

flashcore_status upgrade_params(const flashcore_attention_params* user, flashcore_attention_params& out,
                                std::string& message) {
  if (user == nullptr) {
    message = "params is NULL";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  constexpr size_t kCurrent = sizeof(flashcore_attention_params);
  // Only the first field is read before the size is known to be acceptable.
  uint32_t size = 0;
  std::memcpy(&size, user, sizeof(size));
  const auto* bytes = reinterpret_cast<const unsigned char*>(user);

  std::memset(&out, 0, sizeof(out));
  if (size == FLASHCORE_ATTENTION_PARAMS_V1_SIZE) {
    std::memcpy(&out, user, kParamsV1FieldBytes);
    set_post_v1_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V2_SIZE) {
    std::memcpy(&out, user, kParamsV2FieldBytes);
    set_post_v2_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V3_SIZE) {
    std::memcpy(&out, user, kParamsV3FieldBytes);
    set_post_v3_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V4_SIZE) {
    std::memcpy(&out, user, kParamsV4FieldBytes);
    set_post_v4_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V5_SIZE) {
    std::memcpy(&out, user, kParamsV5FieldBytes);
    set_post_v5_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V6_SIZE) {
    std::memcpy(&out, user, kParamsV6FieldBytes);
    set_post_v6_defaults(out);
  } else if (size == FLASHCORE_ATTENTION_PARAMS_V7_SIZE) {
    std::memcpy(&out, user, kParamsV7FieldBytes);
    set_post_v7_defaults(out);
  } else if (size == kCurrent) {
    std::memcpy(&out, user, kCurrent);
  } else if (size > kCurrent && size <= kMaxParamsStructSize) {
    for (size_t i = kCurrent; i < size; ++i) {
      if (bytes[i] != 0) {
        message = "params->struct_size = " + std::to_string(size) + " is a newer layout than this library's (" +
                  std::to_string(kCurrent) + " bytes, FlashCore " + flashcore_version_string() + ") and byte " +
                  std::to_string(i) + " past the known fields is nonzero: it sets a field this library does not " +
                  "have (use a newer library, or leave the newer fields zero)";
        return FLASHCORE_ERROR_INVALID_ARGUMENT;
      }
    }
    std::memcpy(&out, user, kCurrent);
  } else {
    message = "params->struct_size = " + std::to_string(size) + " is not an accepted size: " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V1_SIZE) + " (the 0.1 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V2_SIZE) + " (the 0.2 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V3_SIZE) + " (the 0.3 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V4_SIZE) + " (the 0.4 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V5_SIZE) + " (the 0.5 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V6_SIZE) + " (the 0.6 layout), " +
              std::to_string(FLASHCORE_ATTENTION_PARAMS_V7_SIZE) + " (the 0.7 layout), " + std::to_string(kCurrent) +
              " (sizeof(flashcore_attention_params) of this library), or " + std::to_string(kCurrent + 1) + ".." +
              std::to_string(kMaxParamsStructSize) +
              " with zero bytes past " + std::to_string(kCurrent) + " (call flashcore_attention_params_init first)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  out.struct_size = static_cast<uint32_t>(kCurrent);
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::api

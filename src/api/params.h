// The growable params struct: every entry point that takes flashcore_attention_params first turns the caller's
// struct, of whatever released layout, into the current one (upgrade_params); the rest of the library only ever
// sees a current struct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::api {

// Bytes of the 0.1 layout that hold fields: everything before out_dtype. Bytes 236..239 of a 0.1 struct are
// tail padding (garbage) and are never read.
inline constexpr size_t kParamsV1FieldBytes = offsetof(flashcore_attention_params, out_dtype);
static_assert(kParamsV1FieldBytes == 236, "the 0.1 fields of flashcore_attention_params moved");
static_assert(FLASHCORE_ATTENTION_PARAMS_V1_SIZE == 240, "the 0.1 struct_size is frozen");
static_assert(sizeof(flashcore_attention_params) > FLASHCORE_ATTENTION_PARAMS_V1_SIZE, "0.2 added fields");
// Bytes of the 0.2 layout: everything before q_descale (no tail padding: seqlen_new ends it 8-byte aligned).
inline constexpr size_t kParamsV2FieldBytes = offsetof(flashcore_attention_params, q_descale);
static_assert(kParamsV2FieldBytes == FLASHCORE_ATTENTION_PARAMS_V2_SIZE, "the 0.2 fields of flashcore_attention_params moved");
// Bytes of the 0.3 layout: everything before dout (reserved2 ends it 8-byte aligned).
inline constexpr size_t kParamsV3FieldBytes = offsetof(flashcore_attention_params, dout);
static_assert(kParamsV3FieldBytes == FLASHCORE_ATTENTION_PARAMS_V3_SIZE, "the 0.3 fields of flashcore_attention_params moved");
inline constexpr size_t kParamsV4FieldBytes = offsetof(flashcore_attention_params, local);
static_assert(kParamsV4FieldBytes == FLASHCORE_ATTENTION_PARAMS_V4_SIZE, "the 0.4 fields of flashcore_attention_params moved");
inline constexpr size_t kParamsV5FieldBytes = offsetof(flashcore_attention_params, dsinks);
static_assert(kParamsV5FieldBytes == FLASHCORE_ATTENTION_PARAMS_V5_SIZE, "the 0.5 fields of flashcore_attention_params moved");
inline constexpr size_t kParamsV6FieldBytes = offsetof(flashcore_attention_params, head_dim_v);
static_assert(kParamsV6FieldBytes == FLASHCORE_ATTENTION_PARAMS_V6_SIZE, "the 0.6 fields of flashcore_attention_params moved");
inline constexpr size_t kParamsV7FieldBytes = offsetof(flashcore_attention_params, kv_batch_idx);
static_assert(kParamsV7FieldBytes == FLASHCORE_ATTENTION_PARAMS_V7_SIZE, "the 0.7 fields of flashcore_attention_params moved");

// A struct_size above this is taken for an uninitialised struct rather than a newer caller (whose zero tail
// would otherwise be read, up to 4 GiB of it).
inline constexpr uint32_t kMaxParamsStructSize = 4096;

// True for the struct_size values upgrade_params accepts (a newer caller's tail is checked there).
bool accepted_params_size(uint32_t struct_size);

// Sets the fields added since 0.1 to their defaults: out_dtype = FLASHCORE_DTYPE_SAME, everything else 0/NULL.
void set_post_v1_defaults(flashcore_attention_params& p);
// Sets the fields added since 0.2 to their defaults (NULL descales, FLASHCORE_PRECISION_NATIVE).
void set_post_v2_defaults(flashcore_attention_params& p);
// Sets the fields added since 0.3 to their defaults (the backward's tensors NULL, zero strides with dim 1, 0 flags).
void set_post_v3_defaults(flashcore_attention_params& p);
void set_post_v4_defaults(flashcore_attention_params& p);
void set_post_v5_defaults(flashcore_attention_params& p);
void set_post_v6_defaults(flashcore_attention_params& p);
void set_post_v7_defaults(flashcore_attention_params& p);

// Bytes of a caller's struct of an accepted older layout that hold fields (V1: 236, V2: 448, V3: 480, V4: 648, V5: 680, V6: 688, V7: 696), or sizeof for any other.
size_t field_bytes_of(uint32_t struct_size);

// Copies *user into `out` as a current struct (out.struct_size = sizeof(flashcore_attention_params)):
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V1_SIZE: the 0.1 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V2_SIZE: the 0.2 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V3_SIZE: the 0.3 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V4_SIZE: the 0.4 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V5_SIZE: the 0.5 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V6_SIZE: the 0.6 fields, the later ones get their defaults;
//   struct_size == FLASHCORE_ATTENTION_PARAMS_V7_SIZE: the 0.7 fields, the serving fields of 0.8 get their defaults;
//   struct_size == sizeof: everything;
//   sizeof < struct_size <= kMaxParamsStructSize: a newer caller; accepted when every byte past sizeof is 0
//     (it set none of the fields this library does not know), else INVALID_ARGUMENT naming the first such byte.
// Any other struct_size, and user == NULL, give INVALID_ARGUMENT with a message; `out` is then unspecified.
flashcore_status upgrade_params(const flashcore_attention_params* user, flashcore_attention_params& out,
                                std::string& message);

}  // namespace flashcore::api

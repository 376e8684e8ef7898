/* A host-only stand-in for libflashcore.so, built by the tests with the system C compiler, so the ctypes
 * binding (loading, struct layout seen from C, status -> exception mapping) can be tested without CUDA.
 *
 * flashcore_attention_forward records the params it was given (see stub_last_params) and returns SUCCESS,
 * unless params->head_dim >= 1000, in which case it fails with status head_dim - 1000.
 * Compiled with -DSTUB_BAD_STRUCT_SIZE, flashcore_get_capabilities reports a params_struct_size that is neither the
 * 0.1 layout nor the current one. Compiled with -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V2_SIZE it plays a 0.2
 * library: it reports that params_struct_size, accepts only that struct_size, reads (and records) only that many
 * bytes, and compiles no 8-bit dtype.
 * The backward (since 0.4): flashcore_attention_backward records its params and stream as the forward does (separately:
 * stub_last_backward_params) and fails the same way for head_dim >= 1000; flashcore_attention_backward_workspace_size
 * reports (4 * head_dim + 8) * batch * num_heads_q * seqlen_q bytes, the header's estimate. Compiled with
 * -DSTUB_NO_BACKWARD (a library older than 0.4, e.g. with -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V3_SIZE) it
 * exports neither. Compiled with -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V4_SIZE it plays a 0.4 library: the
 * backward and the 8-bit dtype, in a struct that ends before the attention variants (local ... reserved4), which it
 * never reads. Compiled with -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V5_SIZE it plays a 0.5 library: the
 * variants, in a struct that ends before dsinks (0.6), which it never reads (the bindings refuse a backward with a
 * variant for it before calling: a 0.5 library's backward refuses them). Compiled with
 * -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V6_SIZE it plays a 0.6 library: a struct that ends before head_dim_v
 * (0.7), which it never reads. Compiled with -DSTUB_PARAMS_SIZE=FLASHCORE_ATTENTION_PARAMS_V7_SIZE it plays a 0.7
 * library: a struct that ends before the serving fields of 0.8 (kv_batch_idx ... total_k_new, seqused_q, rotary_cos ...
 * rotary_seqlens), which it never reads, with the 0.7 capabilities (head dim pairs). Built without STUB_PARAMS_SIZE it
 * plays a 0.8 library: it records the whole 0.8 struct (784 bytes) of the header it includes.
 * Capabilities: the stub serves one layout of flashcore_capabilities, its version's (a library refuses a struct_size
 * larger than its own): the 0.7 one (with head_dim_pairs {192, 128}; unchanged in 0.8) as the current library and as
 * a 0.7 library, the 0.2 .. 0.6 one (STUB_CAPS_V2_SIZE bytes, up to device_backend) when it plays an older library.
 * Version: the header's, unless -DSTUB_VERSION_MINOR=<n> gives the minor it reports (0.9 added a flag, not a field:
 * the stub playing 0.8 is -DSTUB_VERSION_MINOR=8, playing 0.9 -DSTUB_VERSION_MINOR=9). Flags: a stub of minor 9 or
 * newer knows FLASHCORE_FLAG_V_TRANSPOSED and FLASHCORE_FLAG_KV_FP8_E4M3 (bits 1 and 2), an older one bit 1 only, and
 * refuses a call with other bits as the library does (INVALID_ARGUMENT, "flags = N has bits this library does not
 * know"). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "flashcore/flashcore.h"

static flashcore_attention_params g_last;
static void* g_last_stream;
#ifndef STUB_NO_BACKWARD
static flashcore_attention_params g_last_backward;
static void* g_last_backward_stream;
#endif
static char g_error[256];

#ifndef STUB_PARAMS_SIZE
#define STUB_PARAMS_SIZE sizeof(flashcore_attention_params)
#endif

/* sizeof(flashcore_capabilities) of 0.2 .. 0.6 libraries: everything up to device_backend. */
#define STUB_CAPS_V2_SIZE offsetof(flashcore_capabilities, num_head_dim_pairs)
#define STUB_CAPS_SIZE (STUB_PARAMS_SIZE >= FLASHCORE_ATTENTION_PARAMS_V7_SIZE ? sizeof(flashcore_capabilities) \
                                                                                  : STUB_CAPS_V2_SIZE)

#ifndef STUB_VERSION_MINOR
#define STUB_VERSION_MINOR FLASHCORE_VERSION_MINOR
#endif
/* FLASHCORE_FLAG_V_TRANSPOSED (0.3) | FLASHCORE_FLAG_KV_FP8_E4M3 (0.9). */
#define STUB_KNOWN_FLAGS (STUB_VERSION_MINOR >= 9 ? 3u : 1u)

#define STUB_STR2(x) #x
#define STUB_STR(x) STUB_STR2(x)
#define STUB_VERSION \
  STUB_STR(FLASHCORE_VERSION_MAJOR) "." STUB_STR(STUB_VERSION_MINOR) "." STUB_STR(FLASHCORE_VERSION_PATCH)

FLASHCORE_API void flashcore_attention_params_init_sized(flashcore_attention_params* params, uint32_t struct_size) {
  if (!params || struct_size != STUB_PARAMS_SIZE) return;
  memset(params, 0, STUB_PARAMS_SIZE);
  params->struct_size = (uint32_t)STUB_PARAMS_SIZE;
  params->q_strides.dim = params->k_strides.dim = params->v_strides.dim = params->o_strides.dim = 1;
  params->out_dtype = FLASHCORE_DTYPE_SAME;
  if (STUB_PARAMS_SIZE >= FLASHCORE_ATTENTION_PARAMS_V4_SIZE) { /* a layout with the backward's fields (0.4 on) */
    params->dout_strides.dim = params->dq_strides.dim = params->dk_strides.dim = params->dv_strides.dim = 1;
  }
}

/* The 0.1 entry point (the header makes flashcore_attention_params_init a macro: parenthesise the name). */
FLASHCORE_API void(flashcore_attention_params_init)(flashcore_attention_params* params) {
  if (!params) return;
  memset(params, 0, FLASHCORE_ATTENTION_PARAMS_V1_SIZE);
  params->struct_size = FLASHCORE_ATTENTION_PARAMS_V1_SIZE;
  params->q_strides.dim = params->k_strides.dim = params->v_strides.dim = params->o_strides.dim = 1;
}

/* The header makes flashcore_capabilities_init a macro over _init_sized (0.7): parenthesise the name. */
FLASHCORE_API void(flashcore_capabilities_init)(flashcore_capabilities* caps) {
  if (!caps) return;
  memset(caps, 0, STUB_CAPS_SIZE);
  caps->struct_size = (uint32_t)STUB_CAPS_SIZE;
}

FLASHCORE_API void flashcore_capabilities_init_sized(flashcore_capabilities* caps, uint32_t struct_size) {
  if (!caps || struct_size < FLASHCORE_CAPABILITIES_V1_SIZE || struct_size > STUB_CAPS_SIZE) return;
  memset(caps, 0, struct_size);
  caps->struct_size = struct_size;
}

FLASHCORE_API flashcore_status flashcore_attention_params_set_contiguous(flashcore_attention_params* params,
                                                                         int bhsd_layout) {
  (void)bhsd_layout;
  return params ? FLASHCORE_SUCCESS : FLASHCORE_ERROR_NULL_POINTER;
}

FLASHCORE_API flashcore_status flashcore_attention_validate(const flashcore_attention_params* params) {
  if (!params) return FLASHCORE_ERROR_NULL_POINTER;
  if (params->struct_size != STUB_PARAMS_SIZE) {
    snprintf(g_error, sizeof(g_error), "struct_size = %u, expected %u", params->struct_size,
             (unsigned)STUB_PARAMS_SIZE);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (STUB_PARAMS_SIZE > offsetof(flashcore_attention_params, flags) && (params->flags & ~STUB_KNOWN_FLAGS) != 0u) {
    snprintf(g_error, sizeof(g_error), "flags = %u has bits this library does not know", (unsigned)params->flags);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return FLASHCORE_SUCCESS;
}

FLASHCORE_API flashcore_status flashcore_attention_forward(const flashcore_attention_params* params,
                                                           flashcore_stream_t stream) {
  flashcore_status status = flashcore_attention_validate(params);
  if (status != FLASHCORE_SUCCESS) return status;
  if (params->head_dim >= 1000) {
    status = (flashcore_status)(params->head_dim - 1000);
    snprintf(g_error, sizeof(g_error), "stub failure with status %d", (int)status);
    return status;
  }
  memset(&g_last, 0, sizeof(g_last));
  memcpy(&g_last, params, STUB_PARAMS_SIZE); /* what a library of this layout reads */
  g_last_stream = (void*)stream;
  g_error[0] = '\0';
  return FLASHCORE_SUCCESS;
}

FLASHCORE_API const char* flashcore_status_string(flashcore_status status) {
  switch (status) {
    case FLASHCORE_SUCCESS: return "success";
    case FLASHCORE_ERROR_INVALID_STRIDE: return "invalid stride";
    default: return "stub status";
  }
}

FLASHCORE_API const char* flashcore_last_error(void) { return g_error; }

FLASHCORE_API void flashcore_version(int* major, int* minor, int* patch) {
  if (major) *major = FLASHCORE_VERSION_MAJOR;
  if (minor) *minor = STUB_VERSION_MINOR;
  if (patch) *patch = FLASHCORE_VERSION_PATCH;
}

FLASHCORE_API const char* flashcore_version_string(void) { return STUB_VERSION "-stub"; }

FLASHCORE_API flashcore_status flashcore_get_capabilities(flashcore_capabilities* caps) {
  if (!caps) return FLASHCORE_ERROR_NULL_POINTER;
  if (caps->struct_size != STUB_CAPS_SIZE) return FLASHCORE_ERROR_INVALID_ARGUMENT; /* its own layout only */
  caps->num_dtypes = 2;
  caps->dtypes[0] = FLASHCORE_DTYPE_FP16;
  caps->dtypes[1] = FLASHCORE_DTYPE_BF16;
  if (STUB_PARAMS_SIZE >= FLASHCORE_ATTENTION_PARAMS_V4_SIZE) caps->dtypes[caps->num_dtypes++] = FLASHCORE_DTYPE_FP8_E4M3;
  caps->num_head_dims = 3;
  caps->head_dims[0] = 64;
  caps->head_dims[1] = 128;
  caps->head_dims[2] = 256;
  caps->num_archs = 1;
  caps->archs[0] = 90;
  caps->device_arch = 0;
  caps->device_supported = 0;
#ifdef STUB_BAD_STRUCT_SIZE /* 4 bytes short of the current layout: no older layout has that size */
  caps->params_struct_size = (uint32_t)sizeof(flashcore_attention_params) - 4u;
#else
  caps->params_struct_size = (uint32_t)STUB_PARAMS_SIZE;
#endif
  caps->num_out_dtypes = 2;
  caps->out_dtypes[0] = FLASHCORE_DTYPE_FP16;
  caps->out_dtypes[1] = FLASHCORE_DTYPE_BF16;
  caps->device_backend[0] = '\0';
  if (STUB_CAPS_SIZE >= sizeof(flashcore_capabilities)) { /* 0.7: one head dim pair, DeepSeek MLA's */
    caps->num_head_dim_pairs = 1;
    caps->head_dim_pairs[0][0] = 192;
    caps->head_dim_pairs[0][1] = 128;
  }
  return FLASHCORE_SUCCESS;
}

/* Test hooks (not part of the ABI). */
FLASHCORE_API void stub_last_params(flashcore_attention_params* out) { *out = g_last; }
FLASHCORE_API void* stub_last_stream(void) { return g_last_stream; }

FLASHCORE_API flashcore_status flashcore_attention_workspace_size(const flashcore_attention_params* params,
                                                                  uint64_t* bytes) {
  if (!bytes) return FLASHCORE_ERROR_NULL_POINTER;
  *bytes = 0;
  return flashcore_attention_validate(params);
}

FLASHCORE_API flashcore_status flashcore_list_kernel_configs(flashcore_dtype dtype, int32_t head_dim, int32_t causal,
                                                             const char** names, int32_t capacity, int32_t* count) {
  (void)causal;
  if (!count) return FLASHCORE_ERROR_NULL_POINTER;
  /* 8-bit kernels for head dims 128 and 256 only (as the first sm90 8-bit build), none in a stub older than 0.4. */
  if (dtype == FLASHCORE_DTYPE_FP8_E4M3 &&
      (STUB_PARAMS_SIZE < FLASHCORE_ATTENTION_PARAMS_V4_SIZE || (head_dim != 128 && head_dim != 256))) {
    *count = 0;
    return FLASHCORE_SUCCESS;
  }
  *count = 1;
  if (capacity > 0 && names) names[0] = "default";
  return FLASHCORE_SUCCESS;
}

#ifndef STUB_NO_BACKWARD
FLASHCORE_API flashcore_status flashcore_attention_backward_workspace_size(const flashcore_attention_params* params,
                                                                           uint64_t* bytes) {
  if (!bytes) return FLASHCORE_ERROR_NULL_POINTER;
  *bytes = 0;
  flashcore_status status = flashcore_attention_validate(params);
  if (status != FLASHCORE_SUCCESS) return status;
  *bytes = (uint64_t)(4 * params->head_dim + 8) * (uint64_t)(params->batch * params->num_heads_q * params->seqlen_q);
  return FLASHCORE_SUCCESS;
}

FLASHCORE_API flashcore_status flashcore_attention_backward(const flashcore_attention_params* params,
                                                            flashcore_stream_t stream) {
  flashcore_status status = flashcore_attention_validate(params);
  if (status != FLASHCORE_SUCCESS) return status;
  if (params->head_dim >= 1000) {
    status = (flashcore_status)(params->head_dim - 1000);
    snprintf(g_error, sizeof(g_error), "stub failure with status %d", (int)status);
    return status;
  }
  memset(&g_last_backward, 0, sizeof(g_last_backward));
  memcpy(&g_last_backward, params, STUB_PARAMS_SIZE);
  g_last_backward_stream = (void*)stream;
  g_error[0] = '\0';
  return FLASHCORE_SUCCESS;
}

FLASHCORE_API void stub_last_backward_params(flashcore_attention_params* out) { *out = g_last_backward; }
FLASHCORE_API void* stub_last_backward_stream(void) { return g_last_backward_stream; }
#endif

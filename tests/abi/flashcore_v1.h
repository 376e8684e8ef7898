/* FROZEN copy of include/flashcore/flashcore.h as released in 0.1 (commit 49fdf7f), include guard renamed.
 * tests/abi/old_caller.c is compiled against it to prove that a 0.1 caller keeps working with the current
 * library. Never edit it. */
/*
 * FlashCore: fused attention for NVIDIA Hopper (sm_90a).
 *
 * The C ABI. No C++ and no PyTorch are needed to use it; it never throws and never aborts.
 *
 *   O = softmax(softmax_scale * Q K^T [+ causal mask]) V      (per batch, per query head)
 *
 * Tensors live in device memory. Each of Q, K, V, O is described by a base pointer and element
 * strides for batch, sequence, head and the last (head_dim) dimension. The last dimension must be
 * contiguous (stride 1); the other strides must be multiples of 8 elements (the tensor memory
 * accelerator needs 16-byte strides). Both (B, S, H, D) and (B, H, S, D) layouts, or any other
 * arrangement expressible with these strides, are accepted without copies.
 *
 * Causal convention (as in FlashAttention 2/3): the mask is aligned to the bottom-right corner.
 * Query i (0-based, 0 <= i < seqlen_q) sees key j iff j <= i + seqlen_k - seqlen_q. When
 * seqlen_q == seqlen_k this is the usual lower-triangular mask. A query row that sees no key
 * (possible when seqlen_q > seqlen_k) yields O = 0 and LSE = -inf.
 *
 * GQA / MQA: num_heads_q must be a multiple of num_heads_kv; query head h reads KV head
 * h / (num_heads_q / num_heads_kv).
 *
 * LSE (optional): float32, contiguous (batch, num_heads_q, seqlen_q), natural logarithm of the
 * softmax denominator, log(sum_j exp(scale * q.k_j)).
 */
#ifndef FLASHCORE_TESTS_ABI_FLASHCORE_V1_H_
#define FLASHCORE_TESTS_ABI_FLASHCORE_V1_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define FLASHCORE_API
#else
#define FLASHCORE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCORE_VERSION_MAJOR 0
#define FLASHCORE_VERSION_MINOR 1
#define FLASHCORE_VERSION_PATCH 0

/* Same type as cudaStream_t / CUstream; NULL is the legacy default stream. */
typedef struct CUstream_st* flashcore_stream_t;

typedef enum flashcore_status {
  FLASHCORE_SUCCESS = 0,
  FLASHCORE_ERROR_NULL_POINTER = 1,         /* a required pointer is NULL */
  FLASHCORE_ERROR_INVALID_SIZE = 2,         /* a size is zero or negative */
  FLASHCORE_ERROR_SIZE_OVERFLOW = 3,        /* a size or extent overflows 64-bit or hardware limits */
  FLASHCORE_ERROR_INVALID_HEAD_RATIO = 4,   /* num_heads_q is not a multiple of num_heads_kv */
  FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM = 5, /* head_dim not compiled in (see capabilities) */
  FLASHCORE_ERROR_UNSUPPORTED_DTYPE = 6,    /* dtype not compiled in (see capabilities) */
  FLASHCORE_ERROR_MISALIGNED_POINTER = 7,   /* a tensor pointer is not 16-byte aligned */
  FLASHCORE_ERROR_INVALID_STRIDE = 8,       /* stride not a positive multiple of 8, or last-dim stride != 1 */
  FLASHCORE_ERROR_OVERLAPPING_OUTPUT = 9,   /* O (or LSE) overlaps Q, K or V (or each other) */
  FLASHCORE_ERROR_NO_DEVICE = 10,           /* no CUDA device is visible */
  FLASHCORE_ERROR_UNSUPPORTED_ARCH = 11,    /* the current GPU has no compiled kernel */
  FLASHCORE_ERROR_INVALID_ARGUMENT = 12,    /* anything else: bad struct_size, NaN/negative scale, ... */
  FLASHCORE_ERROR_CUDA = 13,                /* a CUDA runtime/driver call failed (message has details) */
  FLASHCORE_ERROR_INTERNAL = 14             /* a bug in FlashCore: please report */
} flashcore_status;

typedef enum flashcore_dtype {
  FLASHCORE_DTYPE_FP16 = 0,
  FLASHCORE_DTYPE_BF16 = 1,
  FLASHCORE_DTYPE_FP32 = 2,     /* host reference only; no GPU kernel */
  FLASHCORE_DTYPE_FP8_E4M3 = 3  /* reserved for the FP8 path */
} flashcore_dtype;

/* Strides are in elements of the tensor's dtype. */
typedef struct flashcore_tensor_strides {
  int64_t batch;
  int64_t seq;
  int64_t head;
  int64_t dim; /* must be 1 */
} flashcore_tensor_strides;

typedef struct flashcore_attention_params {
  uint32_t struct_size; /* = sizeof(flashcore_attention_params); set by flashcore_attention_params_init */

  const void* q; /* (batch, seqlen_q, num_heads_q, head_dim) through q_strides */
  const void* k; /* (batch, seqlen_k, num_heads_kv, head_dim) through k_strides */
  const void* v; /* (batch, seqlen_k, num_heads_kv, head_dim) through v_strides */
  void* o;       /* (batch, seqlen_q, num_heads_q, head_dim) through o_strides; same dtype as q */
  float* lse;    /* optional: NULL, or float32 (batch, num_heads_q, seqlen_q) contiguous */

  flashcore_tensor_strides q_strides;
  flashcore_tensor_strides k_strides;
  flashcore_tensor_strides v_strides;
  flashcore_tensor_strides o_strides;

  int64_t batch;
  int64_t seqlen_q;
  int64_t seqlen_k;
  int64_t num_heads_q;
  int64_t num_heads_kv;
  int64_t head_dim;

  flashcore_dtype dtype;
  int32_t causal;      /* 0: no mask; 1: causal, bottom-right aligned (see above) */
  float softmax_scale; /* 0 means 1/sqrt(head_dim) */
} flashcore_attention_params;

/* Zero the struct, set struct_size and dim strides to 1. */
FLASHCORE_API void flashcore_attention_params_init(flashcore_attention_params* params);

/* Fill contiguous strides for Q, K, V and O in (B, S, H, D) layout ("bshd", FlashAttention's) or
 * (B, H, S, D) layout ("bhsd", PyTorch SDPA's) from the sizes already set in params.
 * Returns FLASHCORE_ERROR_NULL_POINTER (params NULL), _INVALID_ARGUMENT (struct_size, bhsd_layout not 0/1),
 * _INVALID_SIZE (a size <= 0) or _SIZE_OVERFLOW (a size > INT32_MAX). batch is not needed. */
FLASHCORE_API flashcore_status flashcore_attention_params_set_contiguous(flashcore_attention_params* params,
                                                                         int bhsd_layout);

/* Validate params (no device work). Returns the status forward would return for argument errors;
 * FLASHCORE_SUCCESS means the arguments are acceptable (device checks are done by forward). */
FLASHCORE_API flashcore_status flashcore_attention_validate(const flashcore_attention_params* params);

/* Run the forward pass, enqueued on `stream`. Asynchronous: returns once the kernel is launched.
 * On any error nothing is written to O or LSE and the reason is in flashcore_last_error(). */
FLASHCORE_API flashcore_status flashcore_attention_forward(const flashcore_attention_params* params,
                                                           flashcore_stream_t stream);

/* Static description of a status code, e.g. "invalid stride". Never NULL. */
FLASHCORE_API const char* flashcore_status_string(flashcore_status status);

/* Thread-local message of the last failing call on this thread, naming the offending argument and
 * its value, e.g. "q_strides.seq = 12 is not a multiple of 8 elements". "" when none. Never NULL. */
FLASHCORE_API const char* flashcore_last_error(void);

/* Version of the library that is loaded (may differ from the header's macros). */
FLASHCORE_API void flashcore_version(int* major, int* minor, int* patch);
FLASHCORE_API const char* flashcore_version_string(void);

#define FLASHCORE_MAX_CAPS 16

typedef struct flashcore_capabilities {
  uint32_t struct_size;                  /* set by caller to sizeof(flashcore_capabilities) */
  int32_t num_dtypes;
  flashcore_dtype dtypes[FLASHCORE_MAX_CAPS];  /* GPU dtypes compiled in */
  int32_t num_head_dims;
  int32_t head_dims[FLASHCORE_MAX_CAPS];       /* head dims compiled in */
  int32_t num_archs;
  int32_t archs[FLASHCORE_MAX_CAPS];           /* compute capabilities compiled in, e.g. 90 for sm_90a */
  int32_t device_arch;                   /* compute capability of the current device, 0 if none */
  int32_t device_supported;              /* 1 if the current device can run a compiled kernel */
} flashcore_capabilities;

/* Fill caps (struct_size must be set). Never fails for lack of a GPU: device_arch is then 0. */
FLASHCORE_API flashcore_status flashcore_get_capabilities(flashcore_capabilities* caps);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHCORE_TESTS_ABI_FLASHCORE_V1_H_ */

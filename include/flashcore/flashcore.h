/*
 * FlashCore: fused attention for NVIDIA Hopper (sm_90a), and for Ampere and Ada (compute capability 8.x)
 * through the portable backend. The environment variable FLASHCORE_BACKEND (sm80, sm90, auto) overrides which
 * backend serves the current device; FLASHCORE_BACKEND=sm80 runs the portable kernels on Hopper.
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
#ifndef FLASHCORE_FLASHCORE_H_
#define FLASHCORE_FLASHCORE_H_

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
#define FLASHCORE_VERSION_MINOR 9
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
  FLASHCORE_ERROR_INTERNAL = 14,            /* a bug in FlashCore: please report */
  FLASHCORE_ERROR_NCCL = 15                 /* since 0.2: NCCL could not be loaded, or an NCCL call failed */
} flashcore_status;

typedef enum flashcore_dtype {
  FLASHCORE_DTYPE_SAME = -1,    /* out_dtype only: O has the input dtype */
  FLASHCORE_DTYPE_FP16 = 0,
  FLASHCORE_DTYPE_BF16 = 1,
  FLASHCORE_DTYPE_FP32 = 2,     /* host reference only; no GPU kernel */
  FLASHCORE_DTYPE_FP8_E4M3 = 3, /* since 0.3: 8-bit Q, K, V (sm90 backend), O in FP16 or BF16 [SAME: BF16] */
  FLASHCORE_DTYPE_FP8_E5M2 = 4, /* since 0.3: 8-bit Q, K, V in e5m2, as FP8_E4M3 (P stays e4m3: the P V GEMM is e4m3 x
                                   e5m2) */
  FLASHCORE_DTYPE_INT8 = 5      /* since 0.3: the key of the int8 Q K^T kernels that FLASHCORE_PRECISION_INT8 runs
                                   (flashcore_list_kernel_configs); not a call's dtype yet */
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
  const void* v; /* (batch, seqlen_k, num_heads_kv, head_dim) through v_strides (head_dim_v columns where set) */
  void* o;       /* (batch, seqlen_q, num_heads_q, head_dim) through o_strides (head_dim_v columns where set); same
                    dtype as q */
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

  /* ---- Since 0.2. A caller compiled against 0.1 passes the smaller struct_size of its struct; the library
   * then uses the default in [brackets] for every field below (and for every field added later). ---- */
  flashcore_dtype out_dtype; /* dtype of O [FLASHCORE_DTYPE_SAME: the input dtype] */
  int32_t reserved;          /* must be 0 [0] */
  int64_t lse_capacity;      /* floats the lse buffer holds; checked against what is written [0: not given] */
  void* workspace;           /* device memory of at least flashcore_attention_workspace_size() bytes [NULL] */
  uint64_t workspace_size;   /* bytes at workspace [0] */
  const char* kernel_config; /* a name from flashcore_list_kernel_configs, for tuning and tests [NULL: the
                                library's choice] */
  const int32_t* seqused_k;  /* device memory, int32 (batch,): sequence b's keys are the first seqused_k[b] rows
                                of K/V (a KV cache's lengths, FlashAttention's cache_seqlens / seqused_k), read on
                                the device and clamped to [0, seqlen_k]; causal alignment is bottom-right against
                                that length. The rows past it are never read into O or LSE, even if they hold NaN.
                                A sequence with no key gets O = 0 and LSE = -inf. Both backends; 4-byte
                                aligned [NULL: seqlen_k keys for every sequence] */

  /* Serving: packed variable-length batches and paged KV caches (both backends since 0.3; split-KV decode is sm90
   * only: the portable backend runs one CTA per query block). Device int32 arrays must be 4-byte aligned; their contents are read by the
   * kernel only (no host synchronisation, so a CUDA graph replays with new contents), and clamped to the
   * tensors' extents: out-of-range entries cannot make the kernel read or write outside Q, K, V, O or LSE. */
  const int32_t* cu_seqlens_q; /* device (batch + 1,), cu_seqlens_q[0] = 0, nondecreasing: sequence b's queries are
                                  rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of Q and O, which are packed
                                  (total_q, num_heads_q, head_dim) (their batch strides are ignored). seqlen_q is
                                  then the longest sequence's length: rows past it are not computed. LSE is
                                  (num_heads_q, total_q). Causal alignment is bottom-right per sequence; an output
                                  tile never writes past its own sequence [NULL: dense Q and O] */
  const int32_t* cu_seqlens_k; /* device (batch + 1,): the same for K and V (total_k rows; batch strides ignored);
                                  seqlen_k is the longest sequence's key count; with seqused_k, sequence b uses the
                                  first min(seqused_k[b], its length) keys. Not with block_table [NULL] */
  int64_t total_q;             /* rows of the packed Q and O; required (> 0) with cu_seqlens_q [0] */
  int64_t total_k;             /* rows of the packed K and V; required (> 0) with cu_seqlens_k [0] */
  const int32_t* block_table;  /* device (batch, block_table_stride): a paged KV cache. K and V are then
                                  (num_pages, page_size, num_heads_kv, head_dim) through k_strides / v_strides
                                  (their batch stride is the page stride), and key j of sequence b lies in row
                                  j % page_size of page block_table[b * block_table_stride + j / page_size].
                                  seqlen_k is the longest sequence's key count (its entries per row:
                                  ceil(seqlen_k / page_size)); seqused_k gives each sequence's count. Entries for
                                  keys past a sequence's count are never read, nor are their pages; a page id
                                  outside [0, num_pages) reads as zeros [NULL: dense K and V] */
  int64_t block_table_stride;  /* elements between the rows of block_table, >= ceil(seqlen_k / page_size)
                                  [0: exactly that] */
  int64_t page_size;           /* rows per page, 1 to 65536 (since 0.8; before, a multiple of 16: the sm90
                                  kernels take those, other sizes run on the portable kernels); required with
                                  block_table [0] */
  int64_t num_pages;           /* pages in K and V; required (> 0) with block_table [0] */
  int32_t num_splits;          /* split-KV parts for decode-shaped calls (at most 64 query rows per KV head after
                                  GQA packing, a workspace given): 0 the library's choice (split_plan: full waves),
                                  1 never split, n > 1 at most n parts (fewer when there are fewer key blocks).
                                  Since 0.3, dense non-causal 16-bit calls with fewer query tiles than half the SMs
                                  and long key ranges (a workspace given) may also run with their key ranges cut
                                  over the idle SMs: 0 lets the library do so, 1 never. Not with cu_seqlens_q [0] */
  uint32_t flags;              /* FLASHCORE_FLAG_* bits [0] */
  /* Append to a KV cache in the same call: the seqlen_new new rows of K and V (per sequence, all KV heads) are
   * written into the cache (K and V, dense or paged, are then written to!) at key positions
   * [seqused_k[b], seqused_k[b] + seqlen_new) of sequence b, by a copy kernel on the same stream before the
   * attention, which then sees seqused_k[b] + seqlen_new keys (clamped to seqlen_k; rows that would land past
   * seqlen_k are dropped). seqused_k itself is not updated. Requires seqused_k; not with cu_seqlens_k. */
  const void* k_new;                     /* (batch, seqlen_new, num_heads_kv, head_dim), dtype, or packed
                                            (total_k_new, ...) with cu_seqlens_k_new [NULL: no append] */
  const void* v_new;                     /* same shape [NULL] */
  flashcore_tensor_strides k_new_strides; /* elements, dim stride 1 [zero] */
  flashcore_tensor_strides v_new_strides;
  int64_t seqlen_new;                    /* new rows per sequence, > 0 with k_new; 0 with packed new rows
                                            (cu_seqlens_k_new, since 0.8) [0] */

  /* ---- Since 0.3. A caller compiled against 0.2 passes FLASHCORE_ATTENTION_PARAMS_V2_SIZE; these take their
   * defaults then. ---- */
  /* 8-bit attention (dtype FLASHCORE_DTYPE_FP8_E4M3 or _E5M2, sm90 backend): Q, K, V hold 8-bit values x such that the real
   * value is x * descale, with one float32 factor per (batch, KV head) -- query head h uses the factor of its KV
   * head h / (num_heads_q / num_heads_kv) -- as FlashAttention-3's q_descale / k_descale / v_descale. Device
   * arrays (batch, num_heads_kv), contiguous, 4-byte aligned, read by the kernel only [NULL: 1 for every entry].
   * O is written in out_dtype (FP16 or BF16; FLASHCORE_DTYPE_SAME means BF16). The 8-bit tensor cores read V with
   * the key index innermost: the kernel transposes each V tile in shared memory as it loads it (a kernel
   * config whose tile cannot, named in kernel_config, has the call transpose V into the workspace first). An 8-bit
   * call needs a workspace (flashcore_attention_workspace_size; 256 bytes unless V goes through the workspace).
   * V given transposed (FLASHCORE_FLAG_V_TRANSPOSED, flashcore_fp8_transpose_v) skips the transposition altogether.
   * Not with the serving layouts (seqused_k, cu_seqlens_*, block_table, k_new) yet. */
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int32_t precision;  /* FLASHCORE_PRECISION_*: how a 16-bit (FP16 / BF16) call computes [FLASHCORE_PRECISION_NATIVE] */
  int32_t reserved2;  /* must be 0 [0] */

  /* ---- Since 0.4: the backward pass (flashcore_attention_backward; the forward ignores these fields). A caller
   * compiled against 0.3 passes FLASHCORE_ATTENTION_PARAMS_V3_SIZE; they take their defaults then.
   * The backward reads q, k, v, o (the forward's output, an input here) and lse (required: the forward's LSE for the
   * same q, k, v, causal and softmax_scale), and dout; it writes dq, dk and dv (for GQA / MQA, dk and dv of a KV head
   * are summed over the query heads that read it). Strides follow the forward's rules. ---- */
  const void* dout;                      /* dO: (batch, seqlen_q, num_heads_q, head_dim) through dout_strides, dtype */
  void* dq;                              /* (batch, seqlen_q, num_heads_q, head_dim) through dq_strides, dtype */
  void* dk;                              /* (batch, seqlen_k, num_heads_kv, head_dim) through dk_strides, dtype */
  void* dv;                              /* (batch, seqlen_k, num_heads_kv, head_dim) through dv_strides, dtype */
  flashcore_tensor_strides dout_strides; /* elements, dim stride 1 [zero] */
  flashcore_tensor_strides dq_strides;
  flashcore_tensor_strides dk_strides;
  flashcore_tensor_strides dv_strides;
  int32_t deterministic; /* 1: dq is bit-identical from run to run (its fp32 sums are added in a fixed order); 0: the
                            faster atomic order. dk and dv are always bit-identical [0] */
  int32_t reserved3;     /* must be 0 [0] */

  /* ---- Since 0.5: the attention variants of today's models. A caller compiled against 0.4 passes
   * FLASHCORE_ATTENTION_PARAMS_V4_SIZE; they take their defaults then. 16-bit calls, forward and (since 0.6)
   * backward, both backends; an 8-bit call (dtype or precision) refuses a window, softcap or sinks with
   * FLASHCORE_ERROR_INVALID_ARGUMENT naming the field. ---- */
  int32_t local;             /* 1: sliding-window (local) attention with FlashAttention's window_size: query i of a
                                sequence sees key j iff i + d - window_size_left <= j <= i + d + window_size_right,
                                d = seqlen_k - seqlen_q of that sequence (bottom-right aligned, as causal), a bound of
                                -1 being unbounded. causal = 1 with local = 1 is the window with right bound 0. Key
                                blocks outside every row's window are never read [0: no window] */
  int32_t window_size_left;  /* -1 or >= 0; read only when local = 1 [0] */
  int32_t window_size_right; /* -1 or >= 0; read only when local = 1 (and not with causal = 1) [0] */
  float softcap;             /* > 0: every score s = softmax_scale * q.k becomes softcap * tanh(s / softcap) before the
                                softmax (Gemma 2, Grok; FlashAttention's softcap); 0: none [0] */
  const float* sinks;        /* device float32 (num_heads_q,), 4-byte aligned: per query head h, a logit sinks[h] that
                                joins every row's softmax denominator (exp(sinks[h]) is added to the sum of
                                exp(score)) but not its output: O = sum_j exp(s_j - m) v_j / (sum_j exp(s_j - m) +
                                exp(sinks[h] - m)), LSE = log(sum_j exp(s_j) + exp(sinks[h])). Not scaled by
                                softmax_scale (gpt-oss's attention sinks, FlashAttention-4's learnable_sink). A row
                                that sees no key gets O = 0 and LSE = sinks[h] [NULL: none] */
  int32_t attention_chunk;   /* > 0: chunked local attention (Llama 4; FlashAttention-3's attention_chunk): query i
                                of a sequence sees key j only if floor(j / attention_chunk) == floor((i + d) /
                                attention_chunk), d as above (floor also for i + d < 0), on top of causal and the
                                window. Key blocks outside every row's chunk are never read. 16-bit forward (any
                                layout but the 8-bit paths) and backward since 0.6.1; 0.6.0 refused it [0: none] */
  int32_t reserved4;         /* must be 0 [0] */

  /* ---- Since 0.6: the variants' backward. A caller compiled against 0.5 passes
   * FLASHCORE_ATTENTION_PARAMS_V5_SIZE; it takes its default then. flashcore_attention_backward takes the window,
   * softcap and sinks of the forward it differentiates (the same local, window_size_*, softcap and sinks; the LSE the
   * forward wrote with them). ---- */
  float* dsinks; /* backward with sinks: device float32 (num_heads_q,), 4-byte aligned, written (not accumulated) with
                    dL/dsinks[h] = -sum over the batch's rows i of head h of exp(sinks[h] - LSE_i) * D_i, D_i =
                    rowsum(dO_i * O_i); always summed in one fixed order (bit-identical from run to run). Must not
                    overlap the other outputs [NULL: not computed] */

  /* ---- Since 0.7: a head dim of V's own. A caller compiled against 0.6 passes FLASHCORE_ATTENTION_PARAMS_V6_SIZE;
   * it takes its default then. ---- */
  int64_t head_dim_v; /* V's last dimension, and O's (v, o, v_new: (..., head_dim_v)), where it differs from Q's and
                         K's head_dim: (head_dim, head_dim_v) = (192, 128) is DeepSeek-V2/V3 MLA prefill's (FlashAttention-3's
                         hdimdiff). The pairs compiled: flashcore_capabilities_t::head_dim_pairs. 16-bit forward, dense,
                         packed, KV-cache and paged calls; the backward, the 8-bit paths and split-KV decode refuse a
                         head_dim_v of its own (FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM naming it) [0: head_dim] */

  /* ---- Since 0.8: more of what serving engines pass (FlashAttention's flash_attn_with_kvcache). A caller compiled
   * against 0.7 passes FLASHCORE_ATTENTION_PARAMS_V7_SIZE; these take their defaults then. Both backends; 16-bit
   * calls (the 8-bit paths refuse the serving layouts). Device int32 arrays, 4-byte aligned, read by the kernels
   * only (a CUDA graph replays with new contents). ---- */
  const int32_t* kv_batch_idx; /* (batch,): FlashAttention's cache_batch_idx, a cache slot per sequence. Sequence b's
                                  K and V are entry kv_batch_idx[b] of their batch dimension (a dense cache) or its
                                  pages are row kv_batch_idx[b] of block_table (a paged one); an append (k_new)
                                  writes there. seqused_k and leftpad_k stay indexed by b. An entry outside
                                  [0, kv_batch_size) gives its sequence no key (O = 0, LSE = -inf) and no append.
                                  Requires seqused_k; not with cu_seqlens_k [NULL: entry b] */
  int64_t kv_batch_size;       /* K's and V's batch extent (a dense cache) or block_table's rows (a paged one): > 0
                                  with kv_batch_idx, else 0 [0] */
  const int32_t* leftpad_k;    /* (batch,): FlashAttention's cache_leftpad. Sequence b's keys are rows
                                  [leftpad_k[b], seqused_k[b] + its appended rows) of its cache, leftpad_k[b]
                                  clamped to [0, that end]; causal alignment, windows and chunks count keys from row
                                  leftpad_k[b] (the rows before it are never read). Requires seqused_k; dense caches
                                  only (not with block_table nor cu_seqlens_k) [NULL: 0] */
  const int32_t* cu_seqlens_k_new; /* (batch + 1,): FlashAttention-3's cu_seqlens_k_new. k_new and v_new are then
                                  packed (total_k_new, num_heads_kv, head_dim / head_dim_v) (their batch strides are
                                  ignored) and sequence b appends its rows [cu_seqlens_k_new[b],
                                  cu_seqlens_k_new[b + 1]) (clamped to [0, total_k_new]) at seqused_k[b]; seqlen_new
                                  must be 0 [NULL: k_new is (batch, seqlen_new, ...)] */
  int64_t total_k_new;         /* rows of the packed k_new and v_new; > 0 with cu_seqlens_k_new, else 0 [0] */
  const int32_t* seqused_q;    /* (batch,) with cu_seqlens_q: FlashAttention-3's seqused_q. Sequence b's queries are
                                  the first seqused_q[b] rows of its packed rows (clamped to [0, its length]): the
                                  others are not computed, and their O and LSE rows are not written; causal alignment
                                  is against seqused_q[b] queries. The backward takes it since 0.9 [NULL: every row] */
  /* Rotary embedding on append (FlashAttention's rotary_cos / rotary_sin): with k_new, the appended keys and the
   * queries are rotated before the attention (the cache receives the rotated keys; v_new is copied as it is). The
   * first rotary_dim columns of each head are rotated by the angle of the row's position: pairs (2i, 2i + 1) with
   * rotary_interleaved = 1 (GPT-J), (i, i + rotary_dim / 2) with 0 (GPT-NeoX); x' = x cos - y sin, y' = x sin + y cos.
   * Positions: new row t of sequence b is at rotary_seqlens[b] + t (NULL: seqused_k[b] + t); query row i at
   * rotary_seqlens[b] + i with causal or a window, else at rotary_seqlens[b] for every row (FlashAttention's rule);
   * clamped to [0, rotary_seqlen). The rotated Q goes to the workspace (flashcore_attention_workspace_size counts it),
   * Q itself is not written. */
  const void* rotary_cos;        /* (rotary_seqlen, rotary_dim / 2), dtype, contiguous [NULL: no rotation] */
  const void* rotary_sin;        /* the same shape and dtype [NULL] */
  int64_t rotary_seqlen;         /* rows of rotary_cos and rotary_sin: > 0 with them [0] */
  int32_t rotary_dim;            /* rotated columns: a multiple of 16, at most head_dim, > 0 with rotary_cos [0] */
  int32_t rotary_interleaved;    /* 1: GPT-J pairs (2i, 2i + 1); 0: GPT-NeoX halves (i, i + rotary_dim / 2) [0] */
  const int32_t* rotary_seqlens; /* (batch,): position of sequence b's first new row [NULL: seqused_k] */
} flashcore_attention_params;

/* flashcore_attention_params::precision (since 0.3). */
#define FLASHCORE_PRECISION_NATIVE 0 /* attention in the input dtype */
#define FLASHCORE_PRECISION_FP8 1    /* 16-bit Q, K, V are quantized to e4m3 in the workspace (one scale per batch and
                                        KV head, the tensor's absolute maximum mapped to 448, by a fused kernel on the
                                        same stream) and the 8-bit kernel runs on them; O in the input dtype unless
                                        out_dtype says otherwise. q_descale, k_descale, v_descale must be NULL.
                                        Needs a workspace. Dense batches only. */
#define FLASHCORE_PRECISION_INT8 2   /* since 0.3, the high-accuracy 8-bit mode (sm90 backend): 16-bit Q and K are
                                        quantized to int8 in the workspace, Q with one scale per token and K, less its
                                        mean over the keys of its (batch, KV head) (which leaves the softmax and, once
                                        added back, the LSE unchanged), with one scale per block of 128 keys; Q K^T
                                        runs on the int8 tensor cores (s32), P V in the input dtype on V as given. About
                                        4x less error than FLASHCORE_PRECISION_FP8. O in the input dtype (out_dtype
                                        SAME or the input dtype). q_descale, k_descale, v_descale must be NULL. Needs a
                                        workspace. Dense batches only. */

/* flashcore_attention_params::flags: FLASHCORE_FLAG_* bits (FLASHCORE_FLAGS_ALL is the mask of the bits this header
 * knows; a library refuses bits it does not know with FLASHCORE_ERROR_INVALID_ARGUMENT, so a caller can tell an
 * older library by that status). */
#define FLASHCORE_FLAG_V_TRANSPOSED 1u /* (added in 0.3) 8-bit calls: `v` holds V already transposed, as
                                          flashcore_fp8_transpose_v wrote it for the same batch, seqlen_k,
                                          num_heads_kv and head_dim (v_strides are not read). The call skips its own
                                          transposition, and its workspace needs only the first 256 bytes. For a K/V
                                          that several calls attend to (a KV cache, chunked prefill): transpose once,
                                          then every call reads it as is. */
#define FLASHCORE_FLAG_KV_FP8_E4M3 2u /* (added in 0.9) an e4m3 KV cache: dtype is FP16 or BF16 (Q and O), k and
                                          v hold float8_e4m3fn values x whose real value is x * k_descale /
                                          x * v_descale, one float32 factor per (batch, KV head), as the 8-bit fields
                                          describe [NULL: 1]; q_descale stays NULL. Or dtype FP8_E4M3 (FA3's FP8
                                          call): Q in e4m3 with q_descale, O in out_dtype (FP16 or BF16; SAME: BF16),
                                          Q widened into the workspace first (flashcore_attention_workspace_size
                                          counts it), no k_new and no rotary. The sm90 kernels
                                          read K and V in 8 bits (half a 16-bit cache's bytes) and widen them in shared
                                          memory, exactly (to fp16: a BF16 call converts its Q tile to fp16 times a
                                          power of two and stores O in BF16). Dense, KV-cache (seqused_k,
                                          kv_batch_idx, block_table with pages of a multiple of 16 rows) and packed
                                          calls; strides of K and V in multiples of 16 elements. Appends: k_new /
                                          v_new in dtype (16-bit, rotated with rotary_cos when given), stored as the
                                          e4m3 of x / descale of the sequence's (batch, KV head), rounded to nearest
                                          even and saturated to +-448. Not yet: the portable backend, the attention
                                          variants, head_dim_v, kernel_config, the backward. */
#define FLASHCORE_FLAGS_ALL 3u

/* struct_size of the 0.1 layout: the smallest struct_size flashcore_attention_* accept.
 * Accepted struct_size values: FLASHCORE_ATTENTION_PARAMS_V1_SIZE (a 0.1 caller: the fields since 0.2 take their
 * defaults), FLASHCORE_ATTENTION_PARAMS_V2_SIZE (a 0.2 caller: the fields since 0.3 take theirs), _V3_SIZE and
 * _V4_SIZE, _V5_SIZE, _V6_SIZE and _V7_SIZE (0.3 to 0.7 callers), sizeof(flashcore_attention_params) of the loaded library, and larger sizes up to 4096 (a caller
 * built against a newer header) provided every byte past the library's sizeof is zero, i.e. the caller left
 * the fields this library does not know at their defaults. Anything else is FLASHCORE_ERROR_INVALID_ARGUMENT. */
#define FLASHCORE_ATTENTION_PARAMS_V1_SIZE 240
/* struct_size of the 0.2 layout (everything up to seqlen_new): also accepted, the fields since 0.3 take their
 * defaults. */
#define FLASHCORE_ATTENTION_PARAMS_V2_SIZE 448
/* struct_size of the 0.3 layout (everything up to reserved2): also accepted, the backward fields take their
 * defaults. */
#define FLASHCORE_ATTENTION_PARAMS_V3_SIZE 480
/* struct_size of the 0.4 layout (everything up to reserved3): also accepted, the variant fields take their
 * defaults. */
#define FLASHCORE_ATTENTION_PARAMS_V4_SIZE 648
/* struct_size of the 0.5 layout (everything up to reserved4): also accepted, dsinks takes its default. */
#define FLASHCORE_ATTENTION_PARAMS_V5_SIZE 680
/* struct_size of the 0.6 layout (everything up to dsinks): also accepted, head_dim_v takes its default. */
#define FLASHCORE_ATTENTION_PARAMS_V6_SIZE 688
/* struct_size of the 0.7 layout (everything up to head_dim_v): also accepted, the serving fields since 0.8 take their
 * defaults. */
#define FLASHCORE_ATTENTION_PARAMS_V7_SIZE 696

/* Zero the first struct_size bytes of params, set struct_size, the dim strides to 1 and the fields since 0.2 that
 * fit to their defaults (out_dtype = FLASHCORE_DTYPE_SAME). struct_size must be one flashcore_attention_* accept
 * (see FLASHCORE_ATTENTION_PARAMS_V1_SIZE); otherwise nothing is written and flashcore_last_error() says why.
 * Writes nothing past struct_size bytes. */
FLASHCORE_API void flashcore_attention_params_init_sized(flashcore_attention_params* params, uint32_t struct_size);

/* Zero the struct, set struct_size and dim strides to 1 and out_dtype to FLASHCORE_DTYPE_SAME.
 * A macro over flashcore_attention_params_init_sized with the caller's sizeof, so that the library never writes
 * more than the caller's struct holds. The exported function of this name is the 0.1 one: it initialises a 0.1
 * struct (FLASHCORE_ATTENTION_PARAMS_V1_SIZE bytes), which is what a caller built against 0.1 passes it. */
FLASHCORE_API void flashcore_attention_params_init(flashcore_attention_params* params);
#define flashcore_attention_params_init(params) \
  flashcore_attention_params_init_sized((params), (uint32_t)sizeof(flashcore_attention_params))

/* Fill contiguous strides for Q, K, V and O in (B, S, H, D) layout ("bshd", FlashAttention's) or
 * (B, H, S, D) layout ("bhsd", PyTorch SDPA's) from the sizes already set in params (V and O with head_dim_v columns
 * where a 0.7 struct sets it; the backward's dO and dV as O and V, dQ and dK as Q and K).
 * Returns FLASHCORE_ERROR_NULL_POINTER (params NULL), _INVALID_ARGUMENT (struct_size, bhsd_layout not 0/1),
 * _INVALID_SIZE (a size <= 0) or _SIZE_OVERFLOW (a size > INT32_MAX). batch is not needed. Writes only the
 * four stride fields, so a 0.1 struct (struct_size FLASHCORE_ATTENTION_PARAMS_V1_SIZE) is fine too. */
FLASHCORE_API flashcore_status flashcore_attention_params_set_contiguous(flashcore_attention_params* params,
                                                                         int bhsd_layout);

/* Validate params (no device work). Returns the status forward would return for argument errors;
 * FLASHCORE_SUCCESS means the arguments are acceptable (device checks are done by forward). */
FLASHCORE_API flashcore_status flashcore_attention_validate(const flashcore_attention_params* params);

/* Run the forward pass, enqueued on `stream`. Asynchronous: returns once the kernel is launched.
 * On any error nothing is written to O or LSE and the reason is in flashcore_last_error().
 * On Hopper the forward takes part in programmatic dependent launch: it may start while the stream's previous kernel
 * finishes (it waits for that kernel before touching memory), and a next kernel launched with the PDL attribute may
 * start while it runs, so that kernel must call cudaGridDependencySynchronize before reading O or LSE (as CUDA
 * requires of every PDL launch; kernels launched without the attribute are ordered as usual). */
FLASHCORE_API flashcore_status flashcore_attention_forward(const flashcore_attention_params* params,
                                                           flashcore_stream_t stream);

/* Bytes of device workspace flashcore_attention_forward needs for these params on the current device (0 for
 * most calls: the dynamic scheduler's counter, split-KV partials for decode-shaped calls). Validates params like
 * forward. The workspace must be zero-filled before its first use; FlashCore leaves its first 256 bytes zero-filled
 * after every call (the rest is scratch), so one buffer serves every later call on its stream. */
FLASHCORE_API flashcore_status flashcore_attention_workspace_size(const flashcore_attention_params* params,
                                                                  uint64_t* bytes);

/* Added in 0.3: 8-bit V in the layout the 8-bit kernels read (FLASHCORE_FLAG_V_TRANSPOSED): (batch, num_heads_kv,
 * head_dim, seqlen_k rounded up to 128) bytes, keys innermost, zeros past seqlen_k, the keys of each group of 32 in
 * the order of the kernel's P fragments. The layout is this library's own: make it with the library that reads it.
 * params: only V's fields are read -- dtype (FLASHCORE_DTYPE_FP8_E4M3 or _E5M2), batch, seqlen_k, num_heads_kv,
 * head_dim, v and v_strides (checked as flashcore_attention_forward checks them; flags without
 * FLASHCORE_FLAG_V_TRANSPOSED) -- so a KV cache can be transposed before any query exists.
 * flashcore_fp8_transposed_v_size: the layout's bytes. flashcore_fp8_transpose_v: writes V there, enqueued on `stream`
 * (sm90 devices); vt: device memory of at least that size, 16-byte aligned, not overlapping V. */
FLASHCORE_API flashcore_status flashcore_fp8_transposed_v_size(const flashcore_attention_params* params,
                                                               uint64_t* bytes);
FLASHCORE_API flashcore_status flashcore_fp8_transpose_v(const flashcore_attention_params* params, void* vt,
                                                         flashcore_stream_t stream);

/* Since 0.3: the id of the CUDA-graph capture `stream` is part of (cudaStreamGetCaptureInfo), 0 when it is not
 * capturing. Ids are unique within the process. For callers that keep one workspace per stream: inside a capture,
 * every call of that capture on that stream may share one workspace (the calls run in stream order at replay and
 * each leaves the first 256 bytes zero), made and zero-filled once per capture rather than once per call; another
 * capture (another graph, which may replay concurrently) needs its own. Returns FLASHCORE_ERROR_NULL_POINTER
 * (capture_id NULL) or FLASHCORE_ERROR_CUDA (the query failed, e.g. no device; *capture_id is then 0). */
FLASHCORE_API flashcore_status flashcore_stream_capture_id(flashcore_stream_t stream, uint64_t* capture_id);

/* Name of the kernel config flashcore_attention_forward would run for these params on the current device, e.g.
 * "128x128x2-pp-static": the one kernel_config names; for a call that names none on a Hopper (sm90) device, the
 * tuning table's choice for the call's sequence-length bucket, else the library's default. Tuning tables are
 * made by `flashcore tune` and read at first use: $FLASHCORE_TUNING_TABLE, else tuning-<gpu>-<SMs>sm.json in
 * $FLASHCORE_CACHE_DIR, $XDG_CACHE_HOME/flashcore or ~/.cache/flashcore, else the table built into the library
 * for this GPU; FLASHCORE_TUNING=off ignores them all. As in forward, a workspace counts as given when workspace
 * is not NULL and workspace_size > 0 (a config that needs one is chosen only then). Validates params like
 * forward. Writes the name, NUL-terminated, to `name`. Returns _NULL_POINTER (name NULL), _INVALID_ARGUMENT
 * (capacity too small for the name and its NUL), or what forward returns for the same params before launching;
 * on failure `name` holds "" (when capacity > 0). */
FLASHCORE_API flashcore_status flashcore_attention_selected_config(const flashcore_attention_params* params, char* name,
                                                                   uint64_t capacity);

/* ---- Plan once, run many times (since 0.3) ----
 * A plan holds every decision a call needs before it launches: the kernel config, its schedule and the split of its
 * key ranges, the workspace size and layout, and the launches around the kernel (KV append, 8-bit preparation,
 * split-KV combine). flashcore_attention_forward makes one per call; an engine that calls the same shapes many
 * times (a decode step, a CUDA graph it captures) makes it once, before capture, and runs it:
 *   flashcore_plan* plan; flashcore_attention_plan(&params, &plan);
 *   flashcore_plan_workspace_size(plan, &bytes);      allocate and zero-fill `bytes` once
 *   for each step: set the pointers in params, then flashcore_attention_run(plan, &params, stream);
 *   flashcore_plan_destroy(plan);
 * The plan is made on the current device for the params' shapes, dtypes, flags and optional tensors (which of
 * lse, seqused_k, cu_seqlens_*, block_table, k_new, the descales, sinks are given, whether softcap is), its window
 * and chunk (local, window_size_*, attention_chunk), and for a workspace of workspace_size bytes when
 * params->workspace is set, else for the workspace the plan reports (what a caller who allocates
 * flashcore_plan_workspace_size bytes runs). Pointers, strides, softmax_scale and softcap are read at each run.
 * flashcore_attention_plan validates params like forward and returns what forward returns before launching; on
 * failure *plan is NULL. */
typedef struct flashcore_plan flashcore_plan;
FLASHCORE_API flashcore_status flashcore_attention_plan(const flashcore_attention_params* params, flashcore_plan** plan);
/* Bytes of zero-filled device workspace the plan's runs need (0: none). */
FLASHCORE_API flashcore_status flashcore_plan_workspace_size(const flashcore_plan* plan, uint64_t* bytes);
/* The plan's kernel config name (as flashcore_attention_selected_config writes it). */
FLASHCORE_API flashcore_status flashcore_plan_config(const flashcore_plan* plan, char* name, uint64_t capacity);
/* Run the plan for `params`: validated like forward, on the plan's device, with the plan's shapes (else
 * _INVALID_ARGUMENT naming the first field that differs from the plan's) and at least the plan's workspace. */
FLASHCORE_API flashcore_status flashcore_attention_run(const flashcore_plan* plan, const flashcore_attention_params* params,
                                                       flashcore_stream_t stream);
/* Free a plan (NULL: nothing). */
FLASHCORE_API void flashcore_plan_destroy(flashcore_plan* plan);

/* ---- The backward pass (since 0.4) ----
 * dQ, dK, dV of O = softmax(softmax_scale * Q K^T [+ causal mask]) V for the upstream gradient dO (params->dout),
 * from Q, K, V, O and the forward's LSE (params->lse, (batch, num_heads_q, seqlen_q) float32 contiguous, natural
 * log, as flashcore_attention_forward writes it). Shapes, dtypes, strides, GQA, causal alignment and softmax_scale
 * as in the forward; dq has Q's shape, dk and dv K's. A query row that sees no key (LSE = -inf) contributes nothing.
 * The fields of this version: FP16 / BF16, head_dim 64 or 128, dense batches or (sm90 backend) packed ones with
 * cu_seqlens_q and cu_seqlens_k together (Q, O, dO, dq (total_q, heads, head_dim), LSE (num_heads_q, total_q), K, V,
 * dk, dv (total_k, ...), as the forward takes them) and, since 0.9, with seqused_q / seqused_k (each sequence's first
 * seqused rows attend as in the forward; dq, dk and dv rows of the unused ones are zeros; the unused rows of q, k,
 * v and dout must hold finite values, as FlashAttention-3 assumes: a NaN there can reach the used rows' gradients
 * through a masked product); no block_table, k_new; precision NATIVE, out_dtype SAME, flags 0, no kernel_config; on
 * either backend (sm90, and the portable sm80 backend: Ampere, Ada, and Hopper with FLASHCORE_BACKEND=sm80).
 * Anything else returns an error naming the field, before any device work.
 * Needs a workspace of flashcore_attention_backward_workspace_size bytes (any contents: the call initializes what it
 * uses; the fp32 dQ accumulator, rowsum(dO * O) and the scaled LSE, about (4 * head_dim + 8) * batch * num_heads_q *
 * seqlen_q bytes). Asynchronous, on `stream`; dq, dk, dv are written whole (nothing accumulates into them). */
FLASHCORE_API flashcore_status flashcore_attention_backward_workspace_size(const flashcore_attention_params* params,
                                                                           uint64_t* bytes);
FLASHCORE_API flashcore_status flashcore_attention_backward(const flashcore_attention_params* params,
                                                            flashcore_stream_t stream);

/* Names of the kernel configs compiled for (dtype, head_dim, causal) on the current device, the default first.
 * Writes at most `capacity` pointers (static strings) to `names` and the total count to `count` (0 when nothing
 * is compiled for that combination; names may be NULL when capacity is 0). Returns _NULL_POINTER (count NULL,
 * or names NULL with capacity > 0), _INVALID_ARGUMENT (capacity < 0, causal not 0/1), _NO_DEVICE,
 * _UNSUPPORTED_ARCH or _CUDA (the device checks of forward). */
FLASHCORE_API flashcore_status flashcore_list_kernel_configs(flashcore_dtype dtype, int32_t head_dim, int32_t causal,
                                                             const char** names, int32_t capacity, int32_t* count);

/* Static description of a status code, e.g. "invalid stride". Never NULL. */
FLASHCORE_API const char* flashcore_status_string(flashcore_status status);

/* Thread-local message of the last failing call on this thread, naming the offending argument and
 * its value, e.g. "q_strides.seq = 12 is not a multiple of 8 elements". "" when none. Never NULL. */
FLASHCORE_API const char* flashcore_last_error(void);

/* Version of the library that is loaded (may differ from the header's macros). */
FLASHCORE_API void flashcore_version(int* major, int* minor, int* patch);
FLASHCORE_API const char* flashcore_version_string(void);

/* ---- Merging partial attention results (since 0.2) ----
 * Attention over a key set split into parts (ring attention's steps, cascade / shared-prefix decoding) is the
 * LSE-weighted average of the parts' outputs:  LSE = log(exp(LSE_a) + exp(LSE_b)),
 * O = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b. flashcore_attention_merge folds one part (O_part, LSE_part,
 * as flashcore_attention_forward writes them) into a float32 running state (O_acc, LSE_acc), in place, and can
 * also write the merged O in a 16-bit dtype. A row with LSE = -inf in both has O = 0, LSE = -inf. */

/* Element strides of a (batch, num_heads, seqlen) float32 LSE tensor. */
typedef struct flashcore_lse_strides {
  int64_t batch;
  int64_t head;
  int64_t seq;
} flashcore_lse_strides;

typedef struct flashcore_merge_params {
  uint32_t struct_size; /* = sizeof(flashcore_merge_params); set by flashcore_merge_params_init */
  int64_t batch;
  int64_t seqlen;       /* query rows */
  int64_t num_heads;
  int64_t head_dim;     /* 64, 128 or 256 */

  /* The part to fold in: O_part (batch, seqlen, num_heads, head_dim) in part_dtype (FP16, BF16 or FP32), and its
   * LSE. NULL o_part (with NULL lse_part) folds nothing: the call then only writes o_out from the state. */
  const void* o_part;
  flashcore_tensor_strides o_part_strides;
  flashcore_dtype part_dtype;
  const float* lse_part;
  flashcore_lse_strides lse_part_strides;

  /* The running state, float32, read and written in place. With init = 1 it is not read: the part becomes the
   * state (o_part is then required). */
  float* o_acc;
  flashcore_tensor_strides o_acc_strides;
  float* lse_acc;
  flashcore_lse_strides lse_acc_strides;
  int32_t init;

  /* Optional: the merged O, also written to o_out (FP16 or BF16), e.g. at the last part [NULL: not written]. */
  flashcore_dtype out_dtype;
  void* o_out;
  flashcore_tensor_strides o_out_strides;
} flashcore_merge_params;

/* Zero params, set struct_size and the dim strides to 1. */
FLASHCORE_API void flashcore_merge_params_init(flashcore_merge_params* params);

/* Enqueue the merge on `stream`. Checks like forward (sizes, dtypes, strides: dim stride 1, 16-byte aligned rows,
 * no overlap between outputs and inputs other than the in-place state); returns before any device work on error. */
FLASHCORE_API flashcore_status flashcore_attention_merge(const flashcore_merge_params* params,
                                                         flashcore_stream_t stream);

#define FLASHCORE_MAX_CAPS 16

typedef struct flashcore_capabilities {
  uint32_t struct_size;                  /* set by caller to sizeof(flashcore_capabilities) */
  int32_t num_dtypes;
  flashcore_dtype dtypes[FLASHCORE_MAX_CAPS];  /* GPU dtypes compiled in */
  int32_t num_head_dims;
  int32_t head_dims[FLASHCORE_MAX_CAPS];       /* head dims compiled in */
  int32_t num_archs;
  int32_t archs[FLASHCORE_MAX_CAPS];           /* compute capabilities compiled in, e.g. 90 for sm_90a, 80 86 89 */
  int32_t device_arch;                   /* compute capability of the current device, 0 if none */
  int32_t device_supported;              /* 1 if the current device can run a compiled kernel */
  /* ---- Since 0.2 (absent from a 0.1 caller's smaller struct, and then not written) ---- */
  uint32_t params_struct_size;           /* sizeof(flashcore_attention_params) of the loaded library */
  int32_t num_out_dtypes;
  flashcore_dtype out_dtypes[FLASHCORE_MAX_CAPS]; /* output dtypes compiled in (besides FLASHCORE_DTYPE_SAME) */
  char device_backend[16];               /* backend serving the current device ("sm90", "sm80"), "" if none */
  /* ---- Since 0.7 ---- */
  int32_t num_head_dim_pairs;
  int32_t head_dim_pairs[FLASHCORE_MAX_CAPS][2]; /* (head_dim, head_dim_v) pairs compiled in whose head_dim_v differs
                                                    from head_dim, e.g. {192, 128} */
} flashcore_capabilities;

/* struct_size of the 0.1 layout of flashcore_capabilities. */
#define FLASHCORE_CAPABILITIES_V1_SIZE 216
/* struct_size of the 0.2 layout (unchanged through 0.6; 0.7 appends the head-dim pairs). */
#define FLASHCORE_CAPABILITIES_V2_SIZE 304

/* Since 0.7: zero the first struct_size bytes of caps and set struct_size (FLASHCORE_CAPABILITIES_V1_SIZE up to
 * sizeof(flashcore_capabilities) of the loaded library; otherwise nothing is written and flashcore_last_error() says
 * why). Writes nothing past struct_size bytes. */
FLASHCORE_API void flashcore_capabilities_init_sized(flashcore_capabilities* caps, uint32_t struct_size);

/* Zero caps and set struct_size (call before flashcore_get_capabilities). A macro over
 * flashcore_capabilities_init_sized with the caller's sizeof; the exported function of this name is the 0.2 one: it
 * initialises a 0.2 struct (FLASHCORE_CAPABILITIES_V2_SIZE bytes), which is what callers built against 0.2-0.6 pass. */
FLASHCORE_API void flashcore_capabilities_init(flashcore_capabilities* caps);
#define flashcore_capabilities_init(caps) \
  flashcore_capabilities_init_sized((caps), (uint32_t)sizeof(flashcore_capabilities))

/* Fill caps (struct_size must be set, to sizeof of any released layout; flashcore_capabilities_init does it).
 * struct_size may be anything from FLASHCORE_CAPABILITIES_V1_SIZE to sizeof(flashcore_capabilities): the
 * first struct_size bytes are zeroed and every field that fits in them entirely is filled; nothing past them is
 * written, and struct_size is left as given. Never fails for lack of a GPU: device_arch is then 0. */
FLASHCORE_API flashcore_status flashcore_get_capabilities(flashcore_capabilities* caps);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASHCORE_FLASHCORE_H_ */

// Parameters of the KV-cache append kernel (kernels/common/append_kv.cuh), visible to host code.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"

namespace flashcore::kernels {

// Rotary embedding on append (flashcore.h rotary_cos): tables (seqlen, dim / 2) of the call's 16-bit dtype; position of
// new row t (or query row t) of sequence b: (seqlens ? seqlens[b] : seqused_k[b]) + t, clamped to [0, seqlen).
struct RotaryParams {
  const void* cos;  // nullptr: no rotation
  const void* sin;
  const int32_t* seqlens;
  const int32_t* seqused_k;
  int64_t seqlen;
  int dim;          // rotated columns (a multiple of 16)
  int interleaved;  // 1: pairs (2i, 2i + 1); 0: (i, i + dim / 2)
  int bf16;         // the element type: 1 bf16, 0 fp16
};

// Row t of sequence b's new keys/values (all heads) goes to key position seqused_k[b] + t of the cache: row `pos` of
// batch entry e (dense), or row pos % page_size of page block_table[e * stride + pos / page_size] (paged), e being b or
// the sequence's slot kv_batch_idx[b] (skipped outside [0, kv_batch_size)). The new rows are (batch, seqlen_new, heads)
// or packed (total_k_new, heads): sequence b's are rows [cu_seqlens_k_new[b], cu_seqlens_k_new[b + 1]). Strides are
// in bytes; a thread takes unit u of a row for every row of K and V that has it: K's rows are units[0] 16-byte units
// (head_dim * element size / 16), V's units[1] (head_dim_v), row_units the larger.
struct AppendParams {
  const char* src[2];          // k_new, v_new
  int64_t src_stride[2][3];    // [tensor][batch, seq, head]
  char* dst[2];                // K, V (the cache)
  int64_t dst_stride[2][3];    // [tensor][batch (page when paged), seq, head]
  const int32_t* seqused_k;    // the cache's lengths before the append (device)
  const int32_t* block_table;  // nullptr: a dense cache
  int64_t block_table_stride;
  int64_t page_size;
  int64_t num_pages;
  int64_t capacity;            // seqlen_k: positions at or past it are dropped
  const int32_t* kv_batch_idx; // nullptr: entry b
  int64_t kv_batch_size;
  const int32_t* cu_seqlens_k_new;  // nullptr: (batch, seqlen_new) new rows
  int64_t total_k_new;
  int batch;
  int64_t rows;                // batch * seqlen_new * heads, or total_k_new * heads
  int seqlen_new;
  int heads;
  int row_units;
  int units[2];  // K's and V's (of the new rows: 16-byte units of 8 elements)
  RotaryParams rotary;  // the new keys' rotation (cos nullptr: copied as they are)
  // An e4m3 cache (FLASHCORE_FLAG_KV_FP8_E4M3): the new 16-bit rows (after the rotation) are stored as the e4m3 of
  // x / descale, rounded to nearest even and saturated to +-448 (NaN stays NaN), 8 bytes per unit; descale is
  // sequence b's factor of its KV head (descale[tensor][b * heads + head]; nullptr: 1), the attention's.
  int kv8;
  int bf16;  // the new rows' element type (kv8): 1 bf16, 0 fp16
  const float* descale[2];
};

// Host (append.cu): append p.k_new / p.v_new to the cache of call p (flashcore.h, k_new) on `stream`, before its
// attention; block_table_stride as the attention kernel reads the table. The launch's own status.
cudaError_t launch_append(const flashcore_attention_params& p, int64_t block_table_stride, int sms,
                          cudaStream_t stream);

// The rotation of a call (flashcore.h rotary_cos; cos nullptr without one).
RotaryParams rotary_params(const flashcore_attention_params& p);

// Host (rotary.cu): Q of call p, rotated (flashcore.h rotary_cos), into `out`: contiguous (rows, num_heads_q, head_dim),
// rows = total_q (packed) or batch * seqlen_q, on `stream`. The launch's own status.
cudaError_t launch_rotary_q(const flashcore_attention_params& p, void* out, int sms, cudaStream_t stream);

// Host (rotary.cu): an e4m3 Q of call p (an e4m3 KV cache under 8-bit Q) widened, exactly, into `out` in `to` (FP16 or
// BF16): contiguous (rows, num_heads_q, head_dim) as launch_rotary_q's. The launch's own status.
cudaError_t launch_widen_q(const flashcore_attention_params& p, flashcore_dtype to, void* out, int sms,
                           cudaStream_t stream);

}  // namespace flashcore::kernels

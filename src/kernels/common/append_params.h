// Parameters of the KV-cache append kernel (kernels/common/append_kv.cuh), visible to host code.
#pragma once
#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"

namespace flashcore::kernels {

// Row t of sequence b's new keys/values (all heads) goes to key position seqused_k[b] + t of the cache: row `pos` of
// batch entry b (dense), or row pos % page_size of page block_table[b * stride + pos / page_size] (paged). Strides are
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
  int64_t rows;                // batch * seqlen_new * heads
  int seqlen_new;
  int heads;
  int row_units;
  int units[2];  // K's and V's
};

// Host (append.cu): append p.k_new / p.v_new to the cache of call p (flashcore.h, k_new) on `stream`, before its
// attention; block_table_stride as the attention kernel reads the table. The launch's own status.
cudaError_t launch_append(const flashcore_attention_params& p, int64_t block_table_stride, int sms,
                          cudaStream_t stream);

}  // namespace flashcore::kernels

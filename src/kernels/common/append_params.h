// Parameters of the KV-cache append kernel (kernels/common/append_kv.cuh), visible to host code.
#pragma once
#include <cstdint>

namespace flashcore::kernels {

// Row t of sequence b's new keys/values (all heads) goes to key position seqused_k[b] + t of the cache: row `pos` of
// batch entry b (dense), or row pos % page_size of page block_table[b * stride + pos / page_size] (paged). Strides are
// in bytes; a row is row_units 16-byte units (head_dim * element size / 16).
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
};

}  // namespace flashcore::kernels

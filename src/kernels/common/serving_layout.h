// The serving layouts of a call (flashcore.h: a KV cache's lengths, packed variable-length Q/O and K/V, a paged K/V)
// as every backend's kernel reads them: a base of each backend's FwdParams, filled on the host by
// core::set_serving_layout (launch_util.h) and read by kernels/common/tile.cuh (decode_cache_tile, page_entry).
#pragma once
#include <cstdint>

namespace flashcore::kernels {

struct ServingLayout {
  // KV cache lengths: keys of batch b are rows [0, seqused_k[b]) of its seqlen_k, clamped to [0, seqlen_k]; nullptr:
  // seqlen_k for every b.
  const int32_t* seqused_k;
  int seqused_k_add;  // k_new's rows appended by this call before the attention: seqused_k[b] + seqused_k_add keys
  // Packed appends (flashcore.h cu_seqlens_k_new): sequence b appended cu[b+1] - cu[b] rows (clamped to
  // [0, total_k_new]) instead of seqused_k_add; set with it by the append. nullptr: seqused_k_add.
  const int32_t* cu_seqlens_k_new;
  int64_t total_k_new;
  // A cache slot per sequence (flashcore.h kv_batch_idx): K/V entry (or block-table row) kv_batch_idx[b]; outside
  // [0, kv_batch_size) the sequence has no key. nullptr: entry b.
  const int32_t* kv_batch_idx;
  int64_t kv_batch_size;
  // Left padding of a dense cache (flashcore.h leftpad_k): sequence b's keys start at row leftpad_k[b]. nullptr: 0.
  const int32_t* leftpad_k;
  // Packed batches: sequence b's rows are [cu[b], cu[b+1]) of the packed tensor (one batch entry of total rows);
  // entries are clamped to [0, total]. nullptr: dense.
  const int32_t* cu_seqlens_q;
  const int32_t* seqused_q;  // with cu_seqlens_q: sequence b's first seqused_q[b] rows only (clamped); nullptr: all
  const int32_t* cu_seqlens_k;
  int64_t total_q, total_k;
  // Paged K/V: key j of sequence b is row j % page_size of page block_table[b * stride + j / page_size]; K and V's
  // batch entries are the pages. nullptr: dense or packed K/V.
  const int32_t* block_table;
  int64_t block_table_stride;
  int page_size;
  int page_shift;  // log2(page_size) when it is a power of two (every engine's case), else -1: key / page_size
  int num_pages;
  // LSE[batch * lse_stride_batch + head * lse_stride_head + q_row0 + row]: (B, Hq, Sq), or (Hq, total_q) when packed.
  int64_t lse_stride_batch, lse_stride_head;
};

}  // namespace flashcore::kernels

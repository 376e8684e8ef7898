// The split-KV combine kernel's parameters (kernels/common/combine.cuh), visible to host code.
#pragma once
#include <cstdint>

namespace flashcore::kernels {

struct CombineParams {
  const float* o_partial;    // [batch][heads][splits][seqlen_q][head_dim]
  const float* lse_partial;  // [batch][heads][splits][seqlen_q]
  void* o;                   // the output tensor (element type Out), strides in elements, dim stride 1
  int64_t o_stride_batch, o_stride_seq, o_stride_head;
  float* lse;                // optional, (batch, heads, seqlen_q) contiguous
  int64_t rows;              // batch * heads * seqlen_q
  int64_t seqlen_q;
  int heads;
  int splits;
  int warps_per_row;  // 1 (four rows per CTA of 128 threads) or 4 (one row per CTA, its splits dealt over the warps)
};

}  // namespace flashcore::kernels

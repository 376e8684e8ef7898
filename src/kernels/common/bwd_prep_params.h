// Parameters of the launches around a backward kernel (bwd_prep.cuh), for host code.
#pragma once
#include <cstdint>

#include "kernels/common/bwd_layout.h"

namespace flashcore::kernels {

struct BwdPrepParams {
  const void* o;
  int64_t o_stride_batch, o_stride_seq, o_stride_head;  // elements (batch: dense only)
  const void* dout;
  int64_t do_stride_batch, do_stride_seq, do_stride_head;
  const float* lse;     // natural log: (batch, num_heads_q, seqlen_q), or (num_heads_q, total_q) packed
  float* lse_log2;      // rows.rows() floats, bwd_layout.h
  float* dpsum;         // the same
  float* dq_accum;      // rows.rows() x head_dim
  int* dq_semaphore;    // (batch, num_heads_q, m_blocks), or nullptr
  BwdRows rows;
  int m_blocks;         // of seqlen_q (the longest sequence's)
};

struct BwdDqParams {
  const float* dq_accum;  // as BwdPrepParams
  void* dq;
  int64_t stride_batch, stride_seq, stride_head;  // elements (batch: dense only)
  BwdRows rows;
  float softmax_scale;
};

}  // namespace flashcore::kernels

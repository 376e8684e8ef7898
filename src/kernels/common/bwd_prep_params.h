// Parameters of the launches around a backward kernel (bwd_prep.cuh), for host code.
#pragma once
#include <cstdint>

namespace flashcore::kernels {

struct BwdPrepParams {
  const void* o;
  int64_t o_stride_batch, o_stride_seq, o_stride_head;  // elements
  const void* dout;
  int64_t do_stride_batch, do_stride_seq, do_stride_head;
  const float* lse;     // (batch, num_heads_q, seqlen_q), natural log
  float* lse_log2;      // (batch, num_heads_q, seqlen_q_pad)
  float* dpsum;         // (batch, num_heads_q, seqlen_q_pad)
  float* dq_accum;      // (batch, num_heads_q, m_blocks, 64 * head_dim)
  int* dq_semaphore;    // (batch, num_heads_q, m_blocks), or nullptr
  int seqlen_q, seqlen_q_pad, num_heads_q, m_blocks;
};

struct BwdDqParams {
  const float* dq_accum;  // as BwdPrepParams
  void* dq;
  int64_t stride_batch, stride_seq, stride_head;  // elements
  int seqlen_q, num_heads_q, m_blocks;
  float softmax_scale;
};

}  // namespace flashcore::kernels

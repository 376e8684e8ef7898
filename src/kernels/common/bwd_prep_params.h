// Parameters of the launches around a backward kernel (bwd_prep.cuh), for host code.
#pragma once
#include <cstdint>

#include "flashcore/flashcore.h"
#include "kernels/common/bwd_layout.h"
#include "kernels/common/variant_params.h"

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
  int* dq_semaphore;    // (batch, num_heads_q, m_blocks), or nullptr: set to the key block that adds first
  BwdRows rows;
  int m_blocks;         // of seqlen_q (the longest sequence's)
  // The window and chunks (bwd_window.h; causal or none: left -1, chunk 0), for the first key block of each query
  // block.
  int window_left, window_right, chunk;
  int block_n;          // the kernel's keys per CTA
  int block_m;          // the kernel's query rows per step (64 or 128): the blocks of a step's rows are prepared
  bool descending;      // deterministic order: key blocks add from the last down (sm90) or from the first up (sm80)
  // Sinks: each block's share of dL/dsinks, (batch, num_heads_q, m_blocks) floats (bwd_dsinks sums them).
  const float* sinks;   // nullptr: no sinks
  float* dsink_part;
};

// The sum of the blocks' dL/dsinks shares of each query head (bwd_prep.cuh flashcore_bwd_dsinks).
struct BwdDsinksParams {
  const float* dsink_part;  // as BwdPrepParams
  float* dsinks;            // (num_heads_q,)
  BwdRows rows;
  int batch, m_blocks;
};

// dK and dV rows past seqused_k (bwd_prep.cuh flashcore_bwd_zero_kv; packed batches).
struct BwdZeroKvParams {
  void* dk;
  void* dv;
  int64_t dk_stride_batch, dk_stride_seq, dk_stride_head;  // elements (batch: unread, the calls are packed)
  int64_t dv_stride_batch, dv_stride_seq, dv_stride_head;
  BwdRows rows;
};

// dK and dV of a call, written the same way into every backward parameter block that has these fields (the kernels'
// BwdParams of both backends, BwdZeroKvParams): the pointers and their element strides.
template <class Params>
void set_dkdv_outputs(Params& out, const flashcore_attention_params& p) {
  out.dk = p.dk;
  out.dv = p.dv;
  out.dk_stride_batch = p.dk_strides.batch;
  out.dk_stride_seq = p.dk_strides.seq;
  out.dk_stride_head = p.dk_strides.head;
  out.dv_stride_batch = p.dv_strides.batch;
  out.dv_stride_seq = p.dv_strides.seq;
  out.dv_stride_head = p.dv_strides.head;
}

struct BwdDqParams {
  const float* dq_accum;  // as BwdPrepParams
  void* dq;
  int64_t stride_batch, stride_seq, stride_head;  // elements (batch: dense only)
  BwdRows rows;
  float softmax_scale;
};

// The launches' parameters of a validated call, both backends (host): `base` is the workspace, `ws` its layout,
// `rows` the rows the kernels address, `var` the call's normalized variants (core::set_variants), `variants` whether
// the call runs a variants' kernel (whose window the deterministic order of a query block's key blocks follows),
// `masked` whether a plain call is causal, `block_n` the kernel's keys per CTA, `block_m` its query rows per step and
// `descending` its deterministic order.
inline BwdPrepParams bwd_prep_params_of(const flashcore_attention_params& p, const BwdWorkspace& ws, char* base,
                                        const BwdRows& rows, int m_blocks, const VariantParams& var, bool variants,
                                        bool masked, int block_n, int block_m, bool descending) {
  BwdPrepParams prep{};
  prep.o = p.o;
  prep.o_stride_batch = p.o_strides.batch;
  prep.o_stride_seq = p.o_strides.seq;
  prep.o_stride_head = p.o_strides.head;
  prep.dout = p.dout;
  prep.do_stride_batch = p.dout_strides.batch;
  prep.do_stride_seq = p.dout_strides.seq;
  prep.do_stride_head = p.dout_strides.head;
  prep.lse = p.lse;
  prep.lse_log2 = reinterpret_cast<float*>(base + ws.lse);
  prep.dpsum = reinterpret_cast<float*>(base + ws.dpsum);
  prep.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  prep.dq_semaphore = p.deterministic != 0 ? reinterpret_cast<int*>(base + ws.semaphore) : nullptr;
  prep.rows = rows;
  prep.m_blocks = m_blocks;
  // (The plain kernels: causal's window, or every key: a right bound of seqlen_q reaches the last key from any row.)
  prep.window_left = variants ? var.window_left : -1;
  prep.window_right = variants ? var.window_right : (masked ? 0 : static_cast<int>(p.seqlen_q));
  prep.chunk = variants ? var.chunk : 0;
  prep.block_n = block_n;
  prep.block_m = block_m;
  prep.descending = descending;
  prep.sinks = p.sinks != nullptr && p.dsinks != nullptr ? p.sinks : nullptr;
  prep.dsink_part = reinterpret_cast<float*>(base + ws.dsink_part);
  return prep;
}

inline BwdDqParams bwd_dq_params_of(const flashcore_attention_params& p, const BwdWorkspace& ws, char* base,
                                    const BwdRows& rows, float softmax_scale) {
  BwdDqParams conv{};
  conv.dq_accum = reinterpret_cast<const float*>(base + ws.dq_accum);
  conv.dq = p.dq;
  conv.stride_batch = p.dq_strides.batch;
  conv.stride_seq = p.dq_strides.seq;
  conv.stride_head = p.dq_strides.head;
  conv.rows = rows;
  conv.softmax_scale = softmax_scale;
  return conv;
}

inline BwdZeroKvParams bwd_zero_kv_params_of(const flashcore_attention_params& p, const BwdRows& rows) {
  BwdZeroKvParams z{};
  set_dkdv_outputs(z, p);
  z.rows = rows;
  return z;
}

}  // namespace flashcore::kernels

// Parameters of the sm90 backward kernel (bwd_kernel.cuh), built on the host (bwd_launch.cpp) and passed by value as
// a __grid_constant__ argument so the tensor maps live in parameter space, where TMA reads them.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/variant_params.h"

namespace flashcore::sm90 {

struct BwdParams {
  // Packed (varlen) batches: one batch entry of total_q (total_k) rows.
  CUtensorMap tma_q;   // (D, Sq, Hq, B), box (64 columns, kBlockM rows) per chunk (5-D chunked map at head dim 128)
  CUtensorMap tma_do;  // dO, as Q
  CUtensorMap tma_k;   // (D, Sk, Hkv, B), box (64 columns, kBlockN rows) per chunk
  CUtensorMap tma_v;
  // The workspace (kernels/common/bwd_prep.cuh writes it before the kernel), in rows.base()'s rows: the scaled LSE
  // (LSE * log2(e); +inf for a row that sees no key and for the padding, so its P is 0), D = rowsum(dO * O) (0 in the
  // padding), the fp32 dQ accumulator (a block of kBlockM x D floats per 64 rows, in bwd_dq_index's order); and, for
  // deterministic calls, a counter per (batch, query head, query block): how many key blocks have added theirs.
  const float* lse_log2;
  const float* dpsum;
  float* dq_accum;
  int* dq_semaphore;  // nullptr unless deterministic
  // dK and dV (16-bit, the call's dtype), element strides (batch: dense only); rows past a sequence's keys are not
  // written.
  void* dk;
  void* dv;
  int64_t dk_stride_batch, dk_stride_seq, dk_stride_head;
  int64_t dv_stride_batch, dv_stride_seq, dv_stride_head;
  kernels::BwdRows rows;        // the sequences (dense, or packed through cu_seqlens) and the workspace's rows
  int num_heads_q, head_ratio;  // query heads per KV head
  int num_m_blocks;             // the workspace's 64-row blocks of the longest sequence (whole steps): counters' stride
  float scale_log2;             // softmax_scale * log2(e)
  float softmax_scale;          // dK's factor (dQ's: the conversion kernel)
  int never_step;               // -1: a step no CTA has (bwd_mainloop.cuh bwd_keep_allocated)
  // The window and softcap (core::set_variants; read by the variants' kernels only: BwdConfig::kVariants; with a
  // softcap, scale_log2 is softcap * log2(e)). Sinks need nothing here: the LSE includes them.
  kernels::VariantParams var;
};

}  // namespace flashcore::sm90

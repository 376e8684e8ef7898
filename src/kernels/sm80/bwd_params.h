// Parameters of the portable backward kernel (bwd_kernel.cuh), built on the host (bwd_launch.cpp) and passed by value.
// Pointers and strides are the C ABI's (strides in elements, the head_dim stride 1); addresses are formed in 64-bit
// arithmetic.
#pragma once
#include <cstdint>

#include "kernels/common/tensor_ref.h"
#include "kernels/common/variant_params.h"

namespace flashcore::sm80 {

struct BwdParams {
  kernels::TensorRef q, k, v, dout;
  // The workspace (kernels/common/bwd_prep.cuh writes it before the kernel): per (batch, query head), seqlen_q_pad
  // rows of the scaled LSE (LSE * log2(e); +inf for a row that sees no key and for the padding, so its P is 0) and of
  // D = rowsum(dO * O) (0 in the padding); the fp32 dQ accumulator, one block of 64 x head_dim floats per (batch,
  // query head, query block) in bwd_dq_index's order; and, for deterministic calls, one counter per such block: how
  // many key blocks have added theirs.
  const float* lse_log2;
  const float* dpsum;
  float* dq_accum;
  int* dq_semaphore;  // nullptr unless deterministic
  // dK and dV (16-bit, the call's dtype), element strides; rows past seqlen_k are not written.
  void* dk;
  void* dv;
  int64_t dk_stride_batch, dk_stride_seq, dk_stride_head;
  int64_t dv_stride_batch, dv_stride_seq, dv_stride_head;
  int seqlen_q, seqlen_k, seqlen_q_pad;
  int num_heads_q, head_ratio;  // query heads per KV head
  int num_m_blocks;             // ceil(seqlen_q / 64)
  float scale_log2;             // softmax_scale * log2(e)
  float softmax_scale;          // dK's factor (dQ's: the conversion kernel)
  // The window and softcap (core::set_variants; read by the variants' kernels only: BwdConfig::kVariants; with a
  // softcap, scale_log2 is softcap * log2(e)). Sinks need nothing here: the LSE includes them.
  kernels::VariantParams var;
  // The same window as key - query bounds: key j is visible to query i iff rel_lo <= j - i <= rel_hi (causal: rel_hi
  // = seqlen_k - seqlen_q, rel_lo INT_MIN; read from the parameters by the element masks, bwd_mainloop.cuh).
  int rel_lo, rel_hi;
};

}  // namespace flashcore::sm80

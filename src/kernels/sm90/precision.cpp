// precision = FP8 / INT8 on the sm90 backend (precision.h).
#include "kernels/sm90/precision.h"

#include "core/dtype.h"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {

using core::align256;

core::WorkspaceLayout quantized_layout(const flashcore_attention_params& p) {
  core::WorkspaceLayout l;
  const size_t bhq = static_cast<size_t>(p.batch * p.num_heads_q), bhk = static_cast<size_t>(p.batch * p.num_heads_kv);
  const size_t d = static_cast<size_t>(p.head_dim), f = sizeof(float);
  const size_t sq = static_cast<size_t>(p.seqlen_q), sk = static_cast<size_t>(p.seqlen_k);
  if (p.precision == FLASHCORE_PRECISION_FP8) {
    l.fp8_scales = core::WorkspaceLayout::kHead;
    l.q8 = l.fp8_scales + align256(6 * bhk * f);
    l.k8 = l.q8 + align256(bhq * sq * d);
    l.vt = l.k8 + align256(bhk * sk * d);
    l.bytes = l.vt + fp8_vt_bytes(p);
  } else if (p.precision == FLASHCORE_PRECISION_INT8) {
    l.q_scale = core::WorkspaceLayout::kHead;
    l.k_scale = l.q_scale + align256(bhq * sq * f);
    l.k_partial = l.k_scale + align256(bhk * static_cast<size_t>(kernels::int8_key_blocks(p.seqlen_k)) * f);
    l.k_mean = l.k_partial + align256(bhk * static_cast<size_t>(kernels::int8_sum_chunks(p.seqlen_k)) * d * f);
    l.lse_shift = l.k_mean + align256(bhk * d * f);
    l.q8 = l.lse_shift + align256(bhq * sq * f);
    l.k8 = l.q8 + align256(bhq * sq * d);
    l.bytes = l.k8 + align256(bhk * sk * d);
  }
  return l;
}

flashcore_attention_params quantized_key(const flashcore_attention_params& p) {
  flashcore_attention_params q = p;
  if (p.precision == FLASHCORE_PRECISION_FP8) {
    q.dtype = FLASHCORE_DTYPE_FP8_E4M3;
    q.out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  } else if (p.precision == FLASHCORE_PRECISION_INT8) {
    q.dtype = FLASHCORE_DTYPE_INT8;
    q.out_dtype = p.dtype;
  }
  q.precision = FLASHCORE_PRECISION_NATIVE;
  return q;
}

flashcore_attention_params quantized_call(const flashcore_attention_params& p, const core::WorkspaceLayout& l) {
  flashcore_attention_params q = quantized_key(p);
  char* ws = static_cast<char*>(p.workspace);
  q.q = ws + l.q8;
  q.k = ws + l.k8;
  q.q_strides = {p.seqlen_q * p.num_heads_q * p.head_dim, p.num_heads_q * p.head_dim, p.head_dim, 1};
  q.k_strides = {p.seqlen_k * p.num_heads_kv * p.head_dim, p.num_heads_kv * p.head_dim, p.head_dim, 1};
  if (p.precision == FLASHCORE_PRECISION_FP8) {
    // V is read only by the quantization, which writes it transposed at l.vt.
    const int64_t bh = p.batch * p.num_heads_kv;
    const float* descale = reinterpret_cast<const float*>(ws + l.fp8_scales) + 3 * bh;
    q.q_descale = descale;
    q.k_descale = descale + bh;
    q.v_descale = descale + 2 * bh;
  } else {
    q.q_descale = reinterpret_cast<const float*>(ws + l.q_scale);  // per token (the int8 rows' meaning, mainloop.cuh)
    q.k_descale = reinterpret_cast<const float*>(ws + l.k_scale);  // per 128-key block
  }
  // q.workspace, q.workspace_size: the caller's whole workspace, whose head the row's scheduler uses
  return q;
}

kernels::Fp8PrepParams fp8_quantize_params(const flashcore_attention_params& p, const core::WorkspaceLayout& l) {
  char* ws = static_cast<char*>(p.workspace);
  kernels::Fp8PrepParams prep = fp8_prep_params(p);
  prep.amax = reinterpret_cast<float*>(ws + l.fp8_scales);
  prep.descale = prep.amax + 3 * p.batch * p.num_heads_kv;
  prep.q8 = reinterpret_cast<uint8_t*>(ws + l.q8);
  prep.k8 = reinterpret_cast<uint8_t*>(ws + l.k8);
  prep.vt = reinterpret_cast<uint8_t*>(ws + l.vt);
  return prep;
}

kernels::Int8PrepParams int8_prep_params(const flashcore_attention_params& p, const core::WorkspaceLayout& l,
                                         float softmax_scale) {
  kernels::Int8PrepParams prep = prep_shape<kernels::Int8PrepParams>(p);
  char* ws = static_cast<char*>(p.workspace);
  prep.q8 = reinterpret_cast<int8_t*>(ws + l.q8);
  prep.k8 = reinterpret_cast<int8_t*>(ws + l.k8);
  prep.q_scale = reinterpret_cast<float*>(ws + l.q_scale);
  prep.k_scale = reinterpret_cast<float*>(ws + l.k_scale);
  prep.k_partial = reinterpret_cast<float*>(ws + l.k_partial);
  prep.k_mean = reinterpret_cast<float*>(ws + l.k_mean);
  prep.lse_shift = p.lse != nullptr ? reinterpret_cast<float*>(ws + l.lse_shift) : nullptr;
  prep.lse = p.lse;
  prep.softmax_scale = softmax_scale;
  return prep;
}

}  // namespace flashcore::sm90

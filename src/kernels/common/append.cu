// The KV-cache append kernel (append_kv.cuh): its parameters from the call and its host launch, compiled for every
// backend's archs (src/CMakeLists.txt, FLASHCORE_COMMON_KERNEL_SOURCES).
#include "core/dtype.h"
#include "core/variants.h"
#include "kernels/common/append_kv.cuh"

namespace flashcore::kernels {

RotaryParams rotary_params(const flashcore_attention_params& p) {
  RotaryParams r{};
  if (p.rotary_cos == nullptr) return r;
  r.cos = p.rotary_cos;
  r.sin = p.rotary_sin;
  r.seqlens = p.rotary_seqlens;
  r.seqused_k = p.seqused_k;
  r.seqlen = p.rotary_seqlen;
  r.dim = p.rotary_dim;
  r.interleaved = p.rotary_interleaved;
  r.bf16 = p.dtype == FLASHCORE_DTYPE_BF16 ? 1 : 0;
  return r;
}

cudaError_t launch_append(const flashcore_attention_params& p, int64_t block_table_stride, int sms,
                          cudaStream_t stream) {
  const int64_t elem = dtype_size(p.dtype);  // the new rows'
  const bool kv8 = (p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0;
  const int64_t cache_elem = kv8 ? 1 : elem;
  AppendParams a{};
  const flashcore_tensor_strides* src[2] = {&p.k_new_strides, &p.v_new_strides};
  const flashcore_tensor_strides* dst[2] = {&p.k_strides, &p.v_strides};
  a.src[0] = static_cast<const char*>(p.k_new);
  a.src[1] = static_cast<const char*>(p.v_new);
  a.dst[0] = static_cast<char*>(const_cast<void*>(p.k));
  a.dst[1] = static_cast<char*>(const_cast<void*>(p.v));
  for (int t = 0; t < 2; ++t) {
    const int64_t s3[3] = {src[t]->batch, src[t]->seq, src[t]->head}, d3[3] = {dst[t]->batch, dst[t]->seq, dst[t]->head};
    for (int d = 0; d < 3; ++d) {
      a.src_stride[t][d] = s3[d] * elem;
      a.dst_stride[t][d] = d3[d] * cache_elem;
    }
  }
  a.seqused_k = p.seqused_k;
  a.block_table = p.block_table;
  a.block_table_stride = block_table_stride;
  a.page_size = p.page_size;
  a.num_pages = p.num_pages;
  a.capacity = p.seqlen_k;
  a.kv_batch_idx = p.kv_batch_idx;
  a.kv_batch_size = p.kv_batch_size;
  a.cu_seqlens_k_new = p.cu_seqlens_k_new;
  a.total_k_new = p.total_k_new;
  a.batch = static_cast<int>(p.batch);
  a.rows = (p.cu_seqlens_k_new != nullptr ? p.total_k_new : p.batch * p.seqlen_new) * p.num_heads_kv;
  a.seqlen_new = static_cast<int>(p.seqlen_new > 0 ? p.seqlen_new : 1);  // (unused with packed rows)
  a.heads = static_cast<int>(p.num_heads_kv);
  a.units[0] = static_cast<int>(p.head_dim * elem / 16);
  a.units[1] = static_cast<int>(core::head_dim_v(p) * elem / 16);
  a.row_units = a.units[0] > a.units[1] ? a.units[0] : a.units[1];
  a.rotary = rotary_params(p);
  a.kv8 = kv8 ? 1 : 0;
  a.bf16 = p.dtype == FLASHCORE_DTYPE_BF16 ? 1 : 0;
  a.descale[0] = p.k_descale;
  a.descale[1] = p.v_descale;

  const int64_t blocks = (a.rows * a.row_units + 255) / 256;
  const int64_t cap = int64_t{sms > 0 ? sms : 1} * 8;  // grid-stride beyond a few waves
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks < cap ? blocks : cap));
  config.blockDim = dim3(256);
  config.stream = stream;
  void* args[] = {&a};
  // The launch's own status, never an earlier error of the caller's.
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&flashcore_append_kv), args);
}

}  // namespace flashcore::kernels

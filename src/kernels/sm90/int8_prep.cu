// Host launches of the int8 preparation kernels (kernels/common/int8_prep.cuh) of precision = INT8.
#include "kernels/common/int8_prep.cuh"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {
namespace {

// The three passes of one (element type, head dim): K sums, K quantization, Q quantization.
template <class T, int kHeadDim>
cudaError_t quantize(const kernels::Int8PrepParams& p, int sms, cudaStream_t stream) {
  const unsigned bh = static_cast<unsigned>(p.batch * p.heads_kv);
  cudaError_t err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_k_sum_kernel<T, kHeadDim>),
                                dim3(bh, static_cast<unsigned>(kernels::int8_sum_chunks(p.seqlen_k))), stream, p);
  const int64_t k_ctas = (kernels::int8_key_blocks(p.seqlen_k) + kernels::kInt8KBlocksPerCta - 1) /
                         kernels::kInt8KBlocksPerCta;
  if (err == cudaSuccess) {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_quantize_k_kernel<T, kHeadDim>),
                      dim3(bh, static_cast<unsigned>(k_ctas)), stream, p);
  }
  const int64_t rows = int64_t{p.batch} * p.seqlen_q * p.heads_q;
  const int64_t rows_per_block = 256 / (kHeadDim / 8);
  // At most one wave of CTAs (8 of 256 threads per SM), each with several rows in flight.
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block, cap = int64_t{sms > 0 ? sms : 1} * 8;
  if (err == cudaSuccess) {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_quantize_q_kernel<T, kHeadDim>),
                      dim3(static_cast<unsigned>(blocks < cap ? blocks : cap)), stream, p);
  }
  return err;
}

template <class T>
cudaError_t quantize_dim(const kernels::Int8PrepParams& p, int sms, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return quantize<T, 64>(p, sms, stream);
    case 128: return quantize<T, 128>(p, sms, stream);
    case 256: return quantize<T, 256>(p, sms, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_int8_quantize(const kernels::Int8PrepParams& params, flashcore_dtype dtype, int sms,
                                 cudaStream_t stream) {
  kernels::Int8PrepParams p = params;
  p.div_heads_q = kernels::FastDiv(static_cast<uint32_t>(p.heads_q));
  p.div_seqlen_q = kernels::FastDiv(static_cast<uint32_t>(p.seqlen_q));
  if (dtype == FLASHCORE_DTYPE_BF16) return quantize_dim<__nv_bfloat16>(p, sms, stream);
  if (dtype == FLASHCORE_DTYPE_FP16) return quantize_dim<__half>(p, sms, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_int8_lse_shift(const kernels::Int8PrepParams& p, int sms, cudaStream_t stream) {
  const int64_t n = int64_t{p.batch} * p.heads_q * p.seqlen_q;
  const int64_t blocks = (n + 255) / 256, cap = int64_t{sms > 0 ? sms : 1} * 8;
  return launch_prep(reinterpret_cast<const void*>(&kernels::int8_lse_shift_kernel),
                     dim3(static_cast<unsigned>(blocks < cap ? blocks : cap)), stream, p);
}

}  // namespace flashcore::sm90

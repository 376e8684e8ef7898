// Host launches of the int8 preparation kernels (kernels/common/int8_prep.cuh) of precision = INT8.
#include "kernels/common/int8_prep.cuh"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {
namespace {

// The three passes of one (element type, head dim): K sums, K quantization, Q quantization; without an LSE (no
// q . k_mean needed), the K sums and Q share a launch (int8_k_sum_and_q_kernel) before the K quantization.
template <class T, int kHeadDim>
cudaError_t quantize(const kernels::Int8PrepParams& p, cudaStream_t stream) {
  const unsigned bh = static_cast<unsigned>(p.batch * p.heads_kv);
  const int64_t chunks = kernels::int8_sum_chunks(p.seqlen_k);
  const int64_t rows = int64_t{p.batch} * p.seqlen_q * p.heads_q;
  const int64_t q_blocks = (rows + kernels::int8_q_rows_per_chunk<kHeadDim>() - 1) /
                           kernels::int8_q_rows_per_chunk<kHeadDim>();
  const bool fused = p.lse_shift == nullptr;
  cudaError_t err = cudaSuccess;
  if (fused) {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_k_sum_and_q_kernel<T, kHeadDim>),
                      dim3(static_cast<unsigned>(int64_t{bh} * chunks + q_blocks)), stream, p);
  } else {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_k_sum_kernel<T, kHeadDim>),
                      dim3(bh, static_cast<unsigned>(chunks)), stream, p);
  }
  const int64_t k_ctas = (kernels::int8_key_blocks(p.seqlen_k) + kernels::kInt8KBlocksPerCta - 1) /
                         kernels::kInt8KBlocksPerCta;
  if (err == cudaSuccess) {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_quantize_k_kernel<T, kHeadDim>),
                      dim3(bh, static_cast<unsigned>(k_ctas)), stream, p);
  }
  if (err == cudaSuccess && !fused) {
    err = launch_prep(reinterpret_cast<const void*>(&kernels::int8_quantize_q_kernel<T, kHeadDim>),
                      dim3(static_cast<unsigned>(q_blocks)), stream, p);
  }
  return err;
}

template <class T>
cudaError_t quantize_dim(const kernels::Int8PrepParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 64: return quantize<T, 64>(p, stream);
    case 128: return quantize<T, 128>(p, stream);
    case 256: return quantize<T, 256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_int8_quantize(const kernels::Int8PrepParams& params, flashcore_dtype dtype, cudaStream_t stream) {
  kernels::Int8PrepParams p = params;
  p.div_heads_q = kernels::FastDiv(static_cast<uint32_t>(p.heads_q));
  p.div_seqlen_q = kernels::FastDiv(static_cast<uint32_t>(p.seqlen_q));
  if (dtype == FLASHCORE_DTYPE_BF16) return quantize_dim<__nv_bfloat16>(p, stream);
  if (dtype == FLASHCORE_DTYPE_FP16) return quantize_dim<__half>(p, stream);
  return cudaErrorInvalidValue;
}

cudaError_t launch_int8_lse_shift(const kernels::Int8PrepParams& p, int sms, cudaStream_t stream) {
  const int64_t n = int64_t{p.batch} * p.heads_q * p.seqlen_q;
  const int64_t blocks = (n + 255) / 256, cap = int64_t{sms > 0 ? sms : 1} * 8;
  return launch_prep(reinterpret_cast<const void*>(&kernels::int8_lse_shift_kernel),
                     dim3(static_cast<unsigned>(blocks < cap ? blocks : cap)), stream, p);
}

}  // namespace flashcore::sm90

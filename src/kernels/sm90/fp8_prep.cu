// Host launches of the 8-bit preparation kernels (kernels/common/fp8_prep.cuh) for the sm90 backend.
#include "kernels/common/fp8_prep.cuh"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {
namespace {

// V's pass for one head dim: 8-bit V (T = uint8_t) is transposed alone; 16-bit V (precision = FP8) is quantized and
// transposed in the launch that also quantizes Q and K.
template <class T, int kHeadDim>
const void* v_pass_kernel() {
  if constexpr (sizeof(T) == 1) {
    return reinterpret_cast<const void*>(&kernels::fp8_transpose_v_kernel<T, kHeadDim>);
  } else {
    return reinterpret_cast<const void*>(&kernels::fp8_quantize_and_transpose_kernel<T, kHeadDim>);
  }
}

template <class T>
const void* v_pass_kernel(int head_dim) {
  switch (head_dim) {
    case 64: return v_pass_kernel<T, 64>();
    case 128: return v_pass_kernel<T, 128>();
    case 256: return v_pass_kernel<T, 256>();
    default: return nullptr;
  }
}

dim3 transpose_grid(const kernels::Fp8PrepParams& p) {
  return dim3(static_cast<unsigned>(kernels::fp8_vt_padded_keys(p.seqlen_k) / 128), static_cast<unsigned>(p.heads_kv),
              static_cast<unsigned>(p.batch));
}

}  // namespace

cudaError_t launch_fp8_transpose_v(const kernels::Fp8PrepParams& p, cudaStream_t stream) {
  const void* kernel = v_pass_kernel<uint8_t>(p.head_dim);
  return kernel == nullptr ? cudaErrorInvalidValue : launch_prep(kernel, transpose_grid(p), stream, p);
}

cudaError_t launch_fp8_quantize(const kernels::Fp8PrepParams& params, flashcore_dtype dtype, cudaStream_t stream) {
  kernels::Fp8PrepParams p = params;
  p.div_heads_q = kernels::FastDiv(static_cast<uint32_t>(p.heads_q));
  p.div_heads_kv = kernels::FastDiv(static_cast<uint32_t>(p.heads_kv));
  p.div_seqlen_q = kernels::FastDiv(static_cast<uint32_t>(p.seqlen_q));
  p.div_seqlen_k = kernels::FastDiv(static_cast<uint32_t>(p.seqlen_k));
  p.div_group = kernels::FastDiv(static_cast<uint32_t>(p.heads_q / p.heads_kv));
  const bool bf16 = dtype == FLASHCORE_DTYPE_BF16;
  if (!bf16 && dtype != FLASHCORE_DTYPE_FP16) return cudaErrorInvalidValue;
  const int bh = p.batch * p.heads_kv;
  cudaError_t err = cudaMemsetAsync(p.amax, 0, sizeof(float) * 3 * bh, stream);
  const int max_seq = p.seqlen_q > p.seqlen_k ? p.seqlen_q : p.seqlen_k;
  const int amax_blocks = (max_seq + kernels::kFp8AmaxRows - 1) / kernels::kFp8AmaxRows;
  const dim3 amax_grid(static_cast<unsigned>(bh), static_cast<unsigned>(amax_blocks), 3);
  if (err == cudaSuccess) {
    err = launch_prep(bf16 ? reinterpret_cast<const void*>(&kernels::fp8_amax_kernel<__nv_bfloat16>)
                      : reinterpret_cast<const void*>(&kernels::fp8_amax_kernel<__half>),
                      amax_grid, stream, p);
  }
  const int64_t units = (int64_t{p.batch} * p.seqlen_q * p.heads_q + int64_t{p.batch} * p.seqlen_k * p.heads_kv) *
                        (p.head_dim / 8);
  const int64_t qk_blocks = (units + kernels::kFp8QkChunk - 1) / kernels::kFp8QkChunk;
  const dim3 v_tiles = transpose_grid(p);  // V's blocks come first in the fused launch, one per tile
  const int64_t v_blocks = int64_t{v_tiles.x} * v_tiles.y * v_tiles.z;
  if (err == cudaSuccess) {
    const void* kernel = bf16 ? v_pass_kernel<__nv_bfloat16>(p.head_dim) : v_pass_kernel<__half>(p.head_dim);
    err = kernel == nullptr ? cudaErrorInvalidValue
                            : launch_prep(kernel, dim3(static_cast<unsigned>(v_blocks + qk_blocks)), stream, p);
  }
  return err;
}

}  // namespace flashcore::sm90

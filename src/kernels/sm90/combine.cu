// The split-KV combine kernel's instantiations and host launch (kernels/common/combine.cuh), for the sm90 backend.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/launch_util.h"
#include "kernels/common/combine.cuh"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {

namespace {
template <class Out>
const void* combine_kernel(int head_dim) {
  switch (head_dim) {
    case 64: return reinterpret_cast<const void*>(&kernels::flashcore_combine_splits<Out, 64>);
    case 128: return reinterpret_cast<const void*>(&kernels::flashcore_combine_splits<Out, 128>);
    case 256: return reinterpret_cast<const void*>(&kernels::flashcore_combine_splits<Out, 256>);
    default: return nullptr;
  }
}
}  // namespace

cudaError_t launch_combine(const kernels::CombineParams& c, flashcore_dtype out_dtype, int head_dim,
                           cudaStream_t stream) {
  const void* kernel = out_dtype == FLASHCORE_DTYPE_BF16 ? combine_kernel<__nv_bfloat16>(head_dim)
                       : out_dtype == FLASHCORE_DTYPE_FP16 ? combine_kernel<__half>(head_dim)
                                                          : nullptr;
  if (kernel == nullptr) return cudaErrorInvalidValue;
  kernels::CombineParams params = c;
  // Eight splits or more: a CTA per row, four warps sharing its splits (at 1 x 8k, 32 rows of 16 splits, the
  // combine took 7.9 us on 8 CTAs of one warp per row; docs/decisions.md#combine). Fewer: a warp per row.
  params.warps_per_row = c.splits >= 8 ? 4 : 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>((c.rows * params.warps_per_row + 3) / 4));
  config.blockDim = dim3(128);
  config.stream = stream;
  // Programmatic dependent launch: the combine is set up while the forward kernel's last CTAs finish (each one
  // signals after storing its partials, epilogue.cuh); the kernel itself waits for the whole forward grid.
  cudaLaunchAttribute attribute;
  core::allow_dependent_launch(config, attribute);
  void* args[] = {&params};
  return cudaLaunchKernelExC(&config, kernel, args);
}

}  // namespace flashcore::sm90

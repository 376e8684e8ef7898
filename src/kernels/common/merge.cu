// Instantiations and host launches of the merge and row copy kernels (merge.cuh).
#include "kernels/common/merge.cuh"
#include "kernels/common/merge_launch.h"

namespace flashcore::kernels {

namespace {

template <class Part, class Out>
const void* merge_kernel(int head_dim) {
  switch (head_dim) {
    case 64: return reinterpret_cast<const void*>(&flashcore_merge<Part, Out, 64>);
    case 128: return reinterpret_cast<const void*>(&flashcore_merge<Part, Out, 128>);
    case 256: return reinterpret_cast<const void*>(&flashcore_merge<Part, Out, 256>);
    default: return nullptr;
  }
}

template <class Part>
const void* merge_kernel(flashcore_dtype out_dtype, int head_dim) {
  switch (out_dtype) {
    case FLASHCORE_DTYPE_FP16: return merge_kernel<Part, __half>(head_dim);
    case FLASHCORE_DTYPE_BF16: return merge_kernel<Part, __nv_bfloat16>(head_dim);
    default: return nullptr;
  }
}

}  // namespace

cudaError_t launch_merge(const MergeParams& m, flashcore_dtype part_dtype, flashcore_dtype out_dtype, int head_dim,
                         cudaStream_t stream) {
  // The unused side of the instantiation is irrelevant: any compiled type stands in for it.
  if (m.o_part == nullptr) part_dtype = FLASHCORE_DTYPE_FP32;
  if (m.o_out == nullptr) out_dtype = FLASHCORE_DTYPE_BF16;
  const void* kernel = nullptr;
  switch (part_dtype) {
    case FLASHCORE_DTYPE_FP16: kernel = merge_kernel<__half>(out_dtype, head_dim); break;
    case FLASHCORE_DTYPE_BF16: kernel = merge_kernel<__nv_bfloat16>(out_dtype, head_dim); break;
    case FLASHCORE_DTYPE_FP32: kernel = merge_kernel<float>(out_dtype, head_dim); break;
    default: break;
  }
  if (kernel == nullptr) return cudaErrorInvalidValue;
  if (m.rows == 0) return cudaSuccess;
  MergeParams params = m;
  void* args[] = {&params};
  return cudaLaunchKernel(kernel, dim3(static_cast<unsigned>((m.rows + 3) / 4)), dim3(128), args, 0, stream);
}

cudaError_t launch_copy_rows(const CopyRowsParams& c, cudaStream_t stream) {
  const int64_t units = c.rows * c.row_units;
  if (units == 0) return cudaSuccess;
  const int64_t blocks = (units + 255) / 256;
  CopyRowsParams params = c;
  void* args[] = {&params};
  return cudaLaunchKernel(reinterpret_cast<const void*>(&flashcore_copy_rows),
                          dim3(static_cast<unsigned>(blocks < 65536 ? blocks : 65536)), dim3(256), args, 0, stream);
}

}  // namespace flashcore::kernels

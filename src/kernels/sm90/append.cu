// The KV-cache append kernel (kernels/common/append_kv.cuh) and its host launch, for the sm90 backend.
#include "kernels/common/append_kv.cuh"
#include "kernels/sm90/launch.h"

namespace flashcore::sm90 {

cudaError_t launch_append(const kernels::AppendParams& a, int sms, cudaStream_t stream) {
  const int64_t blocks = (a.rows * a.row_units + 255) / 256;
  const int64_t cap = int64_t{sms > 0 ? sms : 1} * 8;  // grid-stride beyond a few waves
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks < cap ? blocks : cap));
  config.blockDim = dim3(256);
  config.stream = stream;
  kernels::AppendParams params = a;
  void* args[] = {&params};
  // The launch's own status, never an earlier error of the caller's.
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&kernels::flashcore_append_kv), args);
}

}  // namespace flashcore::sm90

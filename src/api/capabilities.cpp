// flashcore_get_capabilities: what this build compiled, and what the current device is.
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "api/error.h"
#include "api/validate.h"
#include "flashcore/flashcore.h"
#include "api/backend.h"

extern "C" flashcore_status flashcore_get_capabilities(flashcore_capabilities* caps) {
  using flashcore::api::set_error;
  return flashcore::api::guarded("flashcore_get_capabilities", [&]() -> flashcore_status {
    if (caps == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "caps is NULL");
    if (caps->struct_size != sizeof(flashcore_capabilities)) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT, "caps->struct_size = " + std::to_string(caps->struct_size) +
                                                             " but sizeof(flashcore_capabilities) = " +
                                                             std::to_string(sizeof(flashcore_capabilities)));
    }
    std::memset(caps, 0, sizeof(*caps));
    caps->struct_size = sizeof(flashcore_capabilities);

    bool head_dim_seen[sizeof(flashcore::api::kHeadDims) / sizeof(int)] = {};
    for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
      if (flashcore::api::dtype_compiled(dt)) caps->dtypes[caps->num_dtypes++] = dt;
      for (size_t i = 0; i < sizeof(head_dim_seen); ++i) {
        head_dim_seen[i] = head_dim_seen[i] || flashcore::backend::is_compiled(dt, flashcore::api::kHeadDims[i]);
      }
    }
    for (size_t i = 0; i < sizeof(head_dim_seen); ++i) {
      if (head_dim_seen[i]) caps->head_dims[caps->num_head_dims++] = flashcore::api::kHeadDims[i];
    }
    caps->archs[caps->num_archs++] = 90;

    int count = 0, device = 0, major = 0, minor = 0;
    if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess) {
      caps->device_arch = major * 10 + minor;
    }
    (void)cudaGetLastError();  // a failed query (no device) must not leak into the caller's next CUDA call
    for (int i = 0; i < caps->num_archs; ++i) {
      if (caps->archs[i] == caps->device_arch && caps->num_dtypes > 0) caps->device_supported = 1;
    }
    return FLASHCORE_SUCCESS;
  });
}

// TEMPORARY (main only, until the ABI branch lands): flashcore_attention_workspace_size and
// flashcore_list_kernel_configs.
#include <string>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "api/error.h"
#include "api/validate.h"

using flashcore::api::set_error;

extern "C" flashcore_status flashcore_attention_workspace_size(const flashcore_attention_params* params,
                                                              uint64_t* bytes) {
  return flashcore::api::guarded("flashcore_attention_workspace_size", [&]() -> flashcore_status {
    if (bytes == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "bytes is NULL");
    std::string message;
    int device = 0;
    flashcore_status st = flashcore::api::validate_arguments(params, message);
    if (st == FLASHCORE_SUCCESS) st = flashcore::api::validate_device(device, message);
    if (st != FLASHCORE_SUCCESS) return set_error(st, message);
    size_t n = 0;
    st = flashcore::backend::workspace_size(*params, 90, n, message);
    if (st != FLASHCORE_SUCCESS) return set_error(st, message);
    *bytes = n;
    return FLASHCORE_SUCCESS;
  });
}

extern "C" flashcore_status flashcore_list_kernel_configs(flashcore_dtype dtype, int32_t head_dim, int32_t causal,
                                                          const char** names, int32_t capacity, int32_t* count) {
  return flashcore::api::guarded("flashcore_list_kernel_configs", [&]() -> flashcore_status {
    if (count == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "count is NULL");
    *count = flashcore::backend::kernel_configs(90, dtype, head_dim, causal != 0, names, capacity);
    return FLASHCORE_SUCCESS;
  });
}

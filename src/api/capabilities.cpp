// flashcore_capabilities_init / flashcore_get_capabilities: what this build compiled, and what the current
// device is. Every released layout of flashcore_capabilities is served; a caller's struct gets only the fields
// that fit in its struct_size.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "core/dtype.h"
#include "api/error.h"
#include "api/validate.h"
#include "flashcore/flashcore.h"

namespace {

static_assert(offsetof(flashcore_capabilities, params_struct_size) == FLASHCORE_CAPABILITIES_V1_SIZE,
              "the 0.1 fields of flashcore_capabilities moved");
static_assert(offsetof(flashcore_capabilities, num_head_dim_pairs) == FLASHCORE_CAPABILITIES_V2_SIZE,
              "the 0.2 fields of flashcore_capabilities moved");

// End offsets of the fields, in order: a caller's struct of struct_size bytes gets every field ending at or
// before struct_size (the 0.1 fields as one block).
constexpr size_t kFieldEnds[] = {
    FLASHCORE_CAPABILITIES_V1_SIZE,
    offsetof(flashcore_capabilities, num_out_dtypes),
    offsetof(flashcore_capabilities, out_dtypes),
    offsetof(flashcore_capabilities, device_backend),
    offsetof(flashcore_capabilities, device_backend) + sizeof(flashcore_capabilities::device_backend),
    offsetof(flashcore_capabilities, head_dim_pairs),
    offsetof(flashcore_capabilities, head_dim_pairs) + sizeof(flashcore_capabilities::head_dim_pairs),
};
static_assert(kFieldEnds[6] <= sizeof(flashcore_capabilities), "");

// Compute capability of the current device, 0 when there is none (or it cannot be asked).
int current_device_arch() {
  int count = 0, device = 0, major = 0, minor = 0, arch = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess) {
    arch = major * 10 + minor;
  }
  (void)cudaGetLastError();  // a failed query (no device) must not leak into the caller's next CUDA call
  return arch;
}

// Every field of the current layout.
flashcore_capabilities full_capabilities() {
  flashcore_capabilities caps;
  std::memset(&caps, 0, sizeof(caps));
  caps.struct_size = sizeof(caps);
  for (flashcore_dtype dt :
       {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
    if (flashcore::backend::compiled_head_dims(dt, nullptr, 0) > 0) caps.dtypes[caps.num_dtypes++] = dt;
  }
  caps.num_head_dims = std::min(flashcore::backend::compiled_head_dims(FLASHCORE_DTYPE_SAME, caps.head_dims,
                                                                       FLASHCORE_MAX_CAPS),
                                FLASHCORE_MAX_CAPS);
  caps.num_head_dim_pairs = std::min(flashcore::backend::compiled_head_dim_pairs(FLASHCORE_DTYPE_SAME, caps.head_dim_pairs,
                                                                                 FLASHCORE_MAX_CAPS),
                                     FLASHCORE_MAX_CAPS);
  caps.num_archs = std::min(flashcore::backend::compiled_archs(caps.archs, FLASHCORE_MAX_CAPS), FLASHCORE_MAX_CAPS);
  caps.device_arch = current_device_arch();
  const char* backend = caps.device_arch > 0 ? flashcore::backend::backend_for_arch(caps.device_arch) : nullptr;
  // backend_for_arch names a backend only where one of its compiled images runs (an sm_80 image also serves
  // 8.6/8.7/8.9), so the device's own arch need not be in `archs`.
  caps.device_supported = caps.device_arch > 0 && backend != nullptr && caps.num_dtypes > 0;

  caps.params_struct_size = sizeof(flashcore_attention_params);
  // O is written in a 16-bit dtype: the input dtype of 16-bit kernels, fp16 or bf16 for 8-bit ones.
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    bool any = false;
    for (int i = 0; i < caps.num_dtypes; ++i) any = any || caps.dtypes[i] == dt || flashcore::is_8bit(caps.dtypes[i]);
    if (any) caps.out_dtypes[caps.num_out_dtypes++] = dt;
  }
  for (size_t i = 0; backend != nullptr && backend[i] != '\0' && i + 1 < sizeof(caps.device_backend); ++i) {
    caps.device_backend[i] = backend[i];  // truncated if need be; the zeroed tail keeps it NUL-terminated
  }
  return caps;
}

}  // namespace

extern "C" void flashcore_capabilities_init_sized(flashcore_capabilities* caps, uint32_t struct_size) {
  flashcore::api::clear_error();
  if (caps == nullptr) {
    flashcore::api::set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_capabilities_init_sized: caps is NULL");
    return;
  }
  if (struct_size < FLASHCORE_CAPABILITIES_V1_SIZE || struct_size > sizeof(flashcore_capabilities)) {
    flashcore::api::set_error(FLASHCORE_ERROR_INVALID_ARGUMENT,
                              "flashcore_capabilities_init_sized: struct_size = " + std::to_string(struct_size) +
                                  " is not between " + std::to_string(FLASHCORE_CAPABILITIES_V1_SIZE) + " and " +
                                  std::to_string(sizeof(flashcore_capabilities)));
    return;
  }
  std::memset(caps, 0, struct_size);
  caps->struct_size = struct_size;
}

// The exported function of the macro's name (parenthesized: not the macro): the 0.2 layout, which every caller built
// against 0.2-0.6 has.
extern "C" void(flashcore_capabilities_init)(flashcore_capabilities* caps) {
  flashcore_capabilities_init_sized(caps, FLASHCORE_CAPABILITIES_V2_SIZE);
}

extern "C" flashcore_status flashcore_get_capabilities(flashcore_capabilities* caps) {
  using flashcore::api::set_error;
  return flashcore::api::guarded("flashcore_get_capabilities", [&]() -> flashcore_status {
    if (caps == nullptr) return set_error(FLASHCORE_ERROR_NULL_POINTER, "caps is NULL");
    const uint32_t size = caps->struct_size;
    if (size < FLASHCORE_CAPABILITIES_V1_SIZE || size > sizeof(flashcore_capabilities)) {
      return set_error(FLASHCORE_ERROR_INVALID_ARGUMENT,
                       "caps->struct_size = " + std::to_string(size) + " is not between " +
                           std::to_string(FLASHCORE_CAPABILITIES_V1_SIZE) + " (the 0.1 layout) and " +
                           std::to_string(sizeof(flashcore_capabilities)) +
                           " (sizeof(flashcore_capabilities) of this library); call flashcore_capabilities_init");
    }
    const flashcore_capabilities full = full_capabilities();
    size_t fits = 0;
    for (size_t end : kFieldEnds) {
      if (end <= size) fits = end;
    }
    std::memset(caps, 0, size);
    std::memcpy(caps, &full, fits);
    caps->struct_size = size;  // the caller's layout
    return FLASHCORE_SUCCESS;
  });
}

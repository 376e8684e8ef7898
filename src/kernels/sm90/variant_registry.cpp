// Runtime kernel variants (variant.h), the loading half: cubins become KernelRows in a registry that select()
// (backend.cpp) searches by name after the compiled rows.
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/launch_util.h"
#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/variant.h"

namespace flashcore::sm90 {
namespace {

struct Variant {
  std::string name, path;
  cudaLibrary_t library;
  KernelRow row;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// Never freed: a row select() returned may be in use until the process ends.
std::vector<const Variant*>& registry() {
  static auto* variants = new std::vector<const Variant*>;
  return *variants;
}

flashcore_status fail(std::string& error, std::string message, flashcore_status status) {
  error = std::move(message);
  return status;
}

bool same_key(const KernelRow& r, const VariantSpec& spec, const std::string& name) {
  return r.dtype == spec.dtype && r.out_dtype == spec.dtype && r.head_dim == spec.head_dim &&
         r.causal == spec.causal && name == r.name;
}

// The loaded image must be the spec's kernel (by its mangled name and its parameter block), built for sm_90a
// without local memory. cudaFuncGetAttributes and friends take a cudaKernel_t as the function.
flashcore_status check_image(const void* kernel, const VariantSpec& spec, int threads, std::string& error) {
  cudaFuncAttributes a{};
  const char* mangled = nullptr;
  size_t offset = 0, param_bytes = 0;
  cudaError_t err = cudaFuncGetAttributes(&a, kernel);
  if (err == cudaSuccess) err = cudaFuncGetName(&mangled, kernel);
  if (err == cudaSuccess) err = cudaFuncGetParamInfo(kernel, 0, &offset, &param_bytes);
  if (err != cudaSuccess) {
    return fail(error, core::cuda_message("cannot inspect the variant's kernel", err), FLASHCORE_ERROR_CUDA);
  }
  if (a.binaryVersion != 90) {
    return fail(error, "the variant's image is for sm_" + std::to_string(a.binaryVersion) + ", not sm_90a",
                FLASHCORE_ERROR_UNSUPPORTED_ARCH);
  }
  const std::string symbol = variant_symbol(spec);
  if (mangled == nullptr || std::strstr(mangled, symbol.c_str()) == nullptr || param_bytes != sizeof(FwdParams)) {
    return fail(error, "the cubin's kernel " + std::string(mangled != nullptr ? mangled : "?") + " (" +
                           std::to_string(param_bytes) + " parameter bytes) is not the build of " + symbol +
                           " from these sources",
                FLASHCORE_ERROR_INVALID_ARGUMENT);
  }
  if (a.localSizeBytes != 0 || a.maxThreadsPerBlock < threads) {
    return fail(error, "the variant's kernel uses " + std::to_string(a.localSizeBytes) +
                           " bytes of local memory and allows " + std::to_string(a.maxThreadsPerBlock) +
                           " threads per block (needs 0 and " + std::to_string(threads) + ")",
                FLASHCORE_ERROR_INVALID_ARGUMENT);
  }
  return FLASHCORE_SUCCESS;
}

// Loads `path` as the row (spec, name) with softmax-scale factor `scale`. The whole registration holds the lock:
// it is rare (tuning), and select() takes the lock only for names that are not compiled in.
flashcore_status register_row(const VariantSpec& spec, const std::string& cubin_path, const std::string& name,
                              float scale, const KernelRow** out, std::string& error) {
  if (std::string why; !feasible(spec, why)) {
    return fail(error, "infeasible variant: " + why, FLASHCORE_ERROR_INVALID_ARGUMENT);
  }
  if (name.empty()) return fail(error, "a variant needs a name", FLASHCORE_ERROR_INVALID_ARGUMENT);
  int n = 0;
  const KernelRow* const* compiled = rows(n);
  for (int i = 0; i < n; ++i) {
    if (same_key(*compiled[i], spec, name)) {
      return fail(error, "kernel config \"" + name + "\" is compiled into the library for this key",
                  FLASHCORE_ERROR_INVALID_ARGUMENT);
    }
  }
  std::error_code ec;
  const std::string path = std::filesystem::absolute(cubin_path, ec).lexically_normal().string();

  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const Variant* v : registry()) {
    if (!same_key(v->row, spec, name)) continue;
    if (v->path == path && v->row.test_scale_factor == scale) {
      *out = &v->row;  // the same registration again
      return FLASHCORE_SUCCESS;
    }
    return fail(error, "kernel config \"" + name + "\" is already registered for this key, from " + v->path,
                FLASHCORE_ERROR_INVALID_ARGUMENT);
  }
  auto v = std::make_unique<Variant>();
  cudaError_t err = cudaLibraryLoadFromFile(&v->library, path.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    const bool no_device = err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver;
    return fail(error, core::cuda_message(("cannot load " + path).c_str(), err),
                no_device ? FLASHCORE_ERROR_NO_DEVICE : FLASHCORE_ERROR_CUDA);
  }
  const Footprint fp = footprint(spec);
  unsigned count = 0;
  cudaKernel_t kernel = nullptr;
  err = cudaLibraryGetKernelCount(&count, v->library);
  if (err == cudaSuccess && count == 1) err = cudaLibraryEnumerateKernels(&kernel, 1, v->library);
  flashcore_status st = FLASHCORE_SUCCESS;
  if (err != cudaSuccess) {
    st = fail(error, core::cuda_message("cannot list the variant's kernels", err), FLASHCORE_ERROR_CUDA);
  } else if (count != 1) {
    st = fail(error, path + " holds " + std::to_string(count) + " kernels, not one", FLASHCORE_ERROR_INVALID_ARGUMENT);
  } else {
    st = check_image(reinterpret_cast<const void*>(kernel), spec, fp.threads, error);
  }
  if (st != FLASHCORE_SUCCESS) {
    (void)cudaLibraryUnload(v->library);
    return st;
  }
  v->name = name;
  v->path = path;
  v->row = KernelRow{v->name.c_str(), spec.dtype, spec.dtype, spec.head_dim, spec.causal, false, spec.shape,
                     fp.threads, fp.smem_bytes, fp.separate_o, reinterpret_cast<const void*>(kernel), scale};
  registry().push_back(v.get());
  *out = &v.release()->row;
  return FLASHCORE_SUCCESS;
}

}  // namespace

flashcore_status register_variant(const VariantSpec& spec, const std::string& cubin_path, const KernelRow** row,
                                  std::string& error) {
  const KernelRow* r = nullptr;
  const flashcore_status st = register_row(spec, cubin_path, config_name(spec.shape), 1.0f, &r, error);
  if (row != nullptr) *row = r;
  return st;
}

flashcore_status register_faulty_variant_for_testing(const VariantSpec& spec, const std::string& cubin_path,
                                                     const std::string& name, std::string& error) {
  const KernelRow* r = nullptr;
  return register_row(spec, cubin_path, name, 1.05f, &r, error);
}

std::vector<const KernelRow*> registered_rows() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<const KernelRow*> out;
  for (const Variant* v : registry()) out.push_back(&v->row);
  return out;
}

}  // namespace flashcore::sm90

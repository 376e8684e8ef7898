// Implementation of launch_util.h.
#include "core/launch_util.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "kernels/common/append_params.h"
#include "kernels/common/tile_math.h"

namespace flashcore::core {
namespace {

// Identity of the current CUDA context (changes after cudaDeviceReset), through the driver's cuCtxGetId.
unsigned long long current_context_id() {
  static PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  static PFN_cuCtxGetId_v12000 get_id = nullptr;
  static const bool loaded = [] {
    cudaDriverEntryPointQueryResult q1{}, q2{};
    void* f1 = nullptr;
    void* f2 = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &f1, 4000, cudaEnableDefault, &q1) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuCtxGetId", &f2, 12000, cudaEnableDefault, &q2) != cudaSuccess ||
        q1 != cudaDriverEntryPointSuccess || q2 != cudaDriverEntryPointSuccess) {
      return false;
    }
    get_current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(f1);
    get_id = reinterpret_cast<PFN_cuCtxGetId_v12000>(f2);
    return true;
  }();
  CUcontext ctx = nullptr;
  unsigned long long id = 0;
  if (!loaded || get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr || get_id(ctx, &id) != CUDA_SUCCESS) return 0;
  return id;
}

struct Prepared {
  std::atomic<const void*> kernel{nullptr};
  std::atomic<unsigned long long> context{0};
};
Prepared g_prepared[64][32];  // [device][kernel slot]: direct-mapped; a miss only means preparing again

Prepared* slot_for(const void* kernel, int device) {
  return device >= 0 && device < 64 ? &g_prepared[device][(reinterpret_cast<uintptr_t>(kernel) >> 4) % 32] : nullptr;
}

}  // namespace

std::string cuda_message(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

namespace {

// A device attribute derived by `query` (a positive value once known), cached for devices 0..63.
template <class T, class Query>
cudaError_t cached_per_device(std::atomic<T> (&cache)[64], int device, T& value, Query query) {
  const bool cached = device >= 0 && device < 64;
  if (cached && (value = cache[device].load(std::memory_order_acquire)) > 0) return cudaSuccess;
  const cudaError_t err = query(value);
  if (err == cudaSuccess && cached && value > 0) cache[device].store(value, std::memory_order_release);
  return err;
}

}  // namespace

cudaError_t sm_count(int device, int& sms) {
  static std::atomic<int> cache[64];
  return cached_per_device(cache, device, sms, [device](int& out) {
    return cudaDeviceGetAttribute(&out, cudaDevAttrMultiProcessorCount, device);
  });
}

cudaError_t dram_peak_gbps(int device, double& gbps) {
  static std::atomic<double> cache[64];
  return cached_per_device(cache, device, gbps, [device](double& out) {
    int clock_khz = 0, bus_bits = 0;
    cudaError_t err = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
    out = err == cudaSuccess ? dram_peak_gbps_of(clock_khz, bus_bits) : 0.0;
    return err;
  });
}

namespace {

bool is_prepared(const void* kernel, int device) {
  const unsigned long long ctx = current_context_id();
  const Prepared* slot = slot_for(kernel, device);
  return ctx != 0 && slot != nullptr && slot->kernel.load(std::memory_order_acquire) == kernel &&
         slot->context.load(std::memory_order_acquire) == ctx;
}

void mark_prepared(const void* kernel, int device) {
  const unsigned long long ctx = current_context_id();
  Prepared* slot = slot_for(kernel, device);
  if (ctx == 0 || slot == nullptr) return;
  slot->context.store(0, std::memory_order_release);
  slot->kernel.store(kernel, std::memory_order_release);
  slot->context.store(ctx, std::memory_order_release);
}

}  // namespace

flashcore_status prepare_kernel(const void* kernel, int device, int smem_bytes, const char* what,
                                const std::function<std::string(const cudaFuncAttributes&)>& image_error,
                                std::string& error) {
  if (is_prepared(kernel, device)) return FLASHCORE_SUCCESS;
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) {
    error = cuda_message((std::string("cannot load the ") + what).c_str(), err);
    return FLASHCORE_ERROR_CUDA;
  }
  if (std::string why = image_error(attr); !why.empty()) {
    error = std::move(why);
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) {
    error = cuda_message("cannot raise the kernel's shared-memory limit", err);
    return FLASHCORE_ERROR_CUDA;
  }
  mark_prepared(kernel, device);
  return FLASHCORE_SUCCESS;
}

void tile_order(const flashcore_attention_params& p, int64_t m_blocks, int& num_slices, int& section_slices) {
  num_slices = static_cast<int>(p.num_heads_q * p.batch);
  section_slices = static_cast<int>(kernels::lpt_section_slices(p.seqlen_k, p.head_dim, dtype_size(p.dtype),
                                                                p.num_heads_q / p.num_heads_kv, num_slices, m_blocks));
}

void set_serving_layout(kernels::ServingLayout& s, const flashcore_attention_params& p) {
  const bool varlen_q = p.cu_seqlens_q != nullptr;
  s.seqused_k = p.seqused_k;
  s.seqused_k_add = 0;
  s.cu_seqlens_k_new = nullptr;  // (set with seqused_k_add by the append)
  s.total_k_new = 0;
  s.kv_batch_idx = p.kv_batch_idx;
  s.kv_batch_size = p.kv_batch_size;
  s.leftpad_k = p.leftpad_k;
  s.cu_seqlens_q = p.cu_seqlens_q;
  s.seqused_q = p.seqused_q;
  s.cu_seqlens_k = p.cu_seqlens_k;
  s.total_q = p.total_q;
  s.total_k = p.total_k;
  s.block_table = p.block_table;
  s.block_table_stride = p.block_table_stride > 0 ? p.block_table_stride
                                                  : kernels::ceil_div(p.seqlen_k, p.page_size > 0 ? p.page_size : 1);
  s.page_size = static_cast<int>(p.page_size);
  s.page_shift = kernels::page_shift_of(p.page_size);
  s.num_pages = static_cast<int>(p.num_pages);
  s.lse_stride_head = varlen_q ? p.total_q : p.seqlen_q;  // LSE: (batch, Hq, seqlen_q), or (Hq, total_q) when packed
  s.lse_stride_batch = varlen_q ? 0 : p.num_heads_q * p.seqlen_q;
}

flashcore_status append_new_kv(const flashcore_attention_params& p, int device, cudaStream_t stream,
                               kernels::ServingLayout& s, std::string& error) {
  if (p.k_new == nullptr) return FLASHCORE_SUCCESS;
  int sms = 0;
  cudaError_t err = sm_count(device, sms);
  if (err == cudaSuccess) err = kernels::launch_append(p, s.block_table_stride, sms, stream);
  if (err != cudaSuccess) {
    error = cuda_message("KV-cache append launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  s.seqused_k_add = static_cast<int>(p.seqlen_new);  // (0 with packed rows: cu_seqlens_k_new counts them)
  s.cu_seqlens_k_new = p.cu_seqlens_k_new;
  s.total_k_new = p.total_k_new;
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::core

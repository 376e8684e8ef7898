// Random inputs for timing: a device pool of normal values per dtype, copied from random offsets into the
// buffers under test (fast for multi-GB rotations; the data is random normal, never zeros). Used by `bench`
// and `tune`. e4m3: N(0, 1) * 64 rounded to e4m3 (saturated; the range quantized tensors use, |x| mostly < 256).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "common.h"
#include "check/check_fp8.h"            // the e4m3 encoder
#include "reference/reference.h"  // the fp16/bf16 conversions

namespace fccli {
namespace fp8 = flashcore::check::fp8;

class RandomPool {
 public:
  static constexpr size_t kElems = (size_t{1} << 22) + 4099;  // not a power of two: no aligned repeats
  explicit RandomPool(uint64_t seed) : seed_(seed) {}
  ~RandomPool() {
    for (void*& p : pools_)
      if (p) cudaFree(p);
  }
  const void* get(flashcore_dtype dt) {
    void*& p = pools_[slot(dt)];
    if (!p) {
      std::mt19937_64 gen(seed_ + static_cast<uint64_t>(dt));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      if (flashcore::is_8bit(dt)) {
        std::vector<uint8_t> host(kElems);
        for (size_t i = 0; i < kElems; ++i) host[i] = fp8::float_to_fp8(64.0f * normal(gen), dt);
        FC_CUDA(cudaMalloc(&p, kElems));
        FC_CUDA(cudaMemcpy(p, host.data(), kElems, cudaMemcpyHostToDevice));
        return p;
      }
      std::vector<uint16_t> host(kElems);
      for (size_t i = 0; i < kElems; ++i) {
        float x = normal(gen);
        host[i] = dt == FLASHCORE_DTYPE_FP16 ? flashcore::reference::float_to_half(x)
                                             : flashcore::reference::float_to_bf16(x);
      }
      FC_CUDA(cudaMalloc(&p, kElems * 2));
      FC_CUDA(cudaMemcpy(p, host.data(), kElems * 2, cudaMemcpyHostToDevice));
    }
    return p;
  }
  // Fill `bytes` (even for the 16-bit dtypes) at dst from random offsets of the pool.
  void fill(void* dst, size_t bytes, flashcore_dtype dt, std::mt19937_64& rng, cudaStream_t stream) {
    const char* src = static_cast<const char*>(get(dt));
    const size_t esize = flashcore::is_8bit(dt) ? 1 : 2;
    char* out = static_cast<char*>(dst);
    size_t done = 0;
    while (done < bytes) {
      size_t off = (rng() % (kElems / 2)) * esize;
      size_t n = std::min(bytes - done, kElems * esize - off);
      FC_CUDA(cudaMemcpyAsync(out + done, src + off, n, cudaMemcpyDeviceToDevice, stream));
      done += n;
    }
  }

 private:
  static int slot(flashcore_dtype dt) {
    return dt == FLASHCORE_DTYPE_FP16 ? 0 : dt == FLASHCORE_DTYPE_FP8_E4M3 ? 2 : dt == FLASHCORE_DTYPE_FP8_E5M2 ? 3 : 1;
  }
  uint64_t seed_;
  void* pools_[4] = {nullptr, nullptr, nullptr, nullptr};
};

}  // namespace fccli

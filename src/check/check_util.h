// Internals shared by the 16-bit (check.cpp) and 8-bit (check_fp8.cpp) correctness runners: the seed mixer and
// owners of device memory and streams.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashcore::check::detail {

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

struct OwnedStream {
  cudaStream_t stream = nullptr;
  OwnedStream() = default;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() {
    if (stream) cudaStreamDestroy(stream);
  }
};

}  // namespace flashcore::check::detail

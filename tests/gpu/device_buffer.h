// A cudaMalloc'ed buffer freed on scope exit, for GPU tests that build their own problems.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>

#include <cuda_runtime_api.h>

namespace flashcore::test {

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

}  // namespace flashcore::test

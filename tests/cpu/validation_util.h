// Shared by the validation tests (test_validation.cpp, test_serving_validation.cpp): host memory standing in for
// device memory, and a (dtype, head_dim) this build compiled.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "api/backend.h"
#include "flashcore/flashcore.h"

namespace flashcore::test {

// A 64-byte aligned host buffer filled with a pattern, standing in for device memory.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes)
      : bytes_(bytes + 64), data_(static_cast<unsigned char*>(std::aligned_alloc(64, bytes_ + 64 - bytes_ % 64))) {
    std::memset(data_, 0xA5, bytes_);
  }
  ~HostBuffer() { std::free(data_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  unsigned char* data() const { return data_; }
  bool untouched() const {
    for (size_t i = 0; i < bytes_; ++i) {
      if (data_[i] != 0xA5) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  unsigned char* data_;
};

// A compiled (dtype, head_dim), so that the valid problems pass the "compiled in" checks in any build.
struct Compiled {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 0;
};
inline Compiled first_compiled() {
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int hd : {64, 128, 256}) {
      if (flashcore::backend::is_compiled(dt, hd)) return {dt, hd};
    }
  }
  return {};
}

}  // namespace flashcore::test

// A tensor as the C ABI gives it: base pointer and element strides (the head_dim stride is 1). The portable backend
// loads through it; the sm90 kernels, which load through TMA descriptors, keep it for the rare path of
// masked_v.cuh (reading Q, K and V from global memory).
#pragma once
#include <cstdint>

namespace flashcore::kernels {

struct TensorRef {
  const void* ptr;
  int64_t batch_stride;
  int64_t seq_stride;
  int64_t head_stride;
};

}  // namespace flashcore::kernels

// Merging partial attention results (flashcore_attention_merge): one warp per (batch, query row, head); each lane
// owns head_dim / 32 columns, as pairs at 64k + 2 * lane so that every load instruction of the warp reads 64
// adjacent elements. Arch-neutral.
//   LSE = log(exp(LSE_acc) + exp(LSE_part)),  O = exp(LSE_acc - LSE) O_acc + exp(LSE_part - LSE) O_part
#pragma once
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/element.cuh"
#include "kernels/common/merge_params.h"

namespace flashcore::kernels {

// Two adjacent elements as float2, and back.
__device__ __forceinline__ float2 load_pair(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load_pair(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
template <class T>
__device__ __forceinline__ void store_pair(T* p, float2 v) {
  *reinterpret_cast<uint32_t*>(p) = ElemTraits<T>::pack2(v.x, v.y);
}
__device__ __forceinline__ void store_pair(float* p, float2 v) { *reinterpret_cast<float2*>(p) = v; }

template <class Part, class Out, int kHeadDim>
__global__ void __launch_bounds__(128) flashcore_merge(const __grid_constant__ MergeParams m) {
  static_assert(kHeadDim % 64 == 0, "each lane owns head_dim / 32 columns, in pairs");
  constexpr int kPairs = kHeadDim / 64;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 4 + threadIdx.x / 32;
  if (row >= m.rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t head = row % m.heads;
  const int64_t s = (row / m.heads) % m.seqlen;
  const int64_t b = row / (m.heads * m.seqlen);
  auto at = [&](const int64_t(&stride)[3]) { return b * stride[0] + s * stride[1] + head * stride[2]; };
  auto lse_at = [&](const int64_t(&stride)[3]) { return b * stride[0] + head * stride[1] + s * stride[2]; };

  float* acc = m.o_acc + at(m.acc_stride);
  float* lse_acc = m.lse_acc + lse_at(m.lse_acc_stride);
  const float l_acc = m.init ? -INFINITY : *lse_acc;
  float2 o[kPairs];
  float l_new = l_acc;
  if (m.o_part == nullptr) {
#pragma unroll
    for (int k = 0; k < kPairs; ++k) o[k] = load_pair(acc + 64 * k + 2 * lane);
  } else {
    const Part* part = static_cast<const Part*>(m.o_part) + at(m.part_stride);
    const float l_part = m.lse_part[lse_at(m.lse_part_stride)];
    const float l_max = fmaxf(l_acc, l_part);
    float w_acc = 0.f, w_part = 0.f;
    if (l_max != -INFINITY) {  // a row neither part saw keeps O = 0, LSE = -inf
      w_acc = expf(l_acc - l_max);
      w_part = expf(l_part - l_max);
      const float total = w_acc + w_part;
      l_new = l_max + logf(total);
      w_acc /= total;
      w_part /= total;
    }
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const float2 p = load_pair(part + 64 * k + 2 * lane);
      const float2 a = w_acc != 0.f ? load_pair(acc + 64 * k + 2 * lane) : make_float2(0.f, 0.f);
      o[k] = make_float2(w_acc * a.x + w_part * p.x, w_acc * a.y + w_part * p.y);
      store_pair(acc + 64 * k + 2 * lane, o[k]);
    }
    if (lane == 0) *lse_acc = l_max == -INFINITY ? -INFINITY : l_new;
  }
  if (m.o_out != nullptr) {
    Out* out = static_cast<Out*>(m.o_out) + at(m.out_stride);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) store_pair(out + 64 * k + 2 * lane, o[k]);
  }
}

// Strided (batch, seq, head) rows into another layout, 16 bytes per thread, grid-stride (ring attention packs the
// local K/V shard into its transfer buffer with it).
__global__ void __launch_bounds__(256) flashcore_copy_rows(const __grid_constant__ CopyRowsParams c) {
  const int64_t units = c.rows * c.row_units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / c.row_units;
    const int64_t unit = i - row * c.row_units;
    const int64_t head = row % c.heads, s = (row / c.heads) % c.seqlen, b = row / (c.heads * c.seqlen);
    const uint4 v = *reinterpret_cast<const uint4*>(c.src + b * c.src_stride[0] + s * c.src_stride[1] +
                                                    head * c.src_stride[2] + unit * 16);
    *reinterpret_cast<uint4*>(c.dst + b * c.dst_stride[0] + s * c.dst_stride[1] + head * c.dst_stride[2] + unit * 16) =
        v;
  }
}

}  // namespace flashcore::kernels

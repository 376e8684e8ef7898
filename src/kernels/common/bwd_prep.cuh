// The launches around a backward kernel, arch-neutral: before it, per 64-row query block, D = rowsum(dO * O), the LSE
// scaled to base 2 (+inf where a row sees no key, so its P is 0), a zeroed fp32 dQ block and its ordering counter;
// after it, dQ = softmax_scale * the accumulated block, in the call's dtype and strides. Memory-bound: a CTA per block.
// kBackend: one instance per backend (90, 80). Each backend's units compile these kernels for their own archs; two
// backends' instances of one template would share a host symbol, and the launch could pick the other backend's image.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/bwd_prep_params.h"
#include "kernels/common/element.cuh"

namespace flashcore::kernels {

template <class T, int kD, int kBackend = 90>
__global__ void __launch_bounds__(256) flashcore_bwd_prep(const BwdPrepParams p) {
  constexpr int kPerLane = kD / 32;  // 2 or 4 elements: one 4- or 8-byte load per lane and row
  using Vec = std::conditional_t<kPerLane == 2, uint32_t, uint2>;
  const int m = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t slice = static_cast<int64_t>(b) * p.num_heads_q + h;
  const auto* o = static_cast<const T*>(p.o) + b * p.o_stride_batch + h * p.o_stride_head + lane * kPerLane;
  const auto* dout = static_cast<const T*>(p.dout) + b * p.do_stride_batch + h * p.do_stride_head + lane * kPerLane;
#pragma unroll 2
  for (int i = 0; i < 8; ++i) {
    const int row = m * 64 + warp * 8 + i;
    float sum = 0.f;
    if (row < p.seqlen_q) {
      Vec ov = *reinterpret_cast<const Vec*>(o + row * p.o_stride_seq);
      Vec dv = *reinterpret_cast<const Vec*>(dout + row * p.do_stride_seq);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) sum += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      const int64_t at = slice * p.seqlen_q_pad + row;
      float lse = INFINITY;  // the padding, and rows that see no key: P = exp2(s - inf) = 0
      if (row < p.seqlen_q) {
        const float l = p.lse[slice * p.seqlen_q + row];
        if (l != -INFINITY) lse = l * static_cast<float>(M_LOG2E);
      }
      p.lse_log2[at] = lse;
      p.dpsum[at] = sum;
    }
  }
  float4* block = reinterpret_cast<float4*>(p.dq_accum + (slice * p.m_blocks + m) * 64 * kD);
  for (int i = static_cast<int>(threadIdx.x); i < 64 * kD / 4; i += 256) block[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p.dq_semaphore != nullptr && threadIdx.x == 0) p.dq_semaphore[slice * p.m_blocks + m] = 0;
}

template <class T, int kD, int kBackend = 90>
__global__ void __launch_bounds__(256) flashcore_bwd_dq_convert(const BwdDqParams p) {
  __shared__ float tile[64][kD + 2];
  const int m = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const int64_t slice = static_cast<int64_t>(b) * p.num_heads_q + h;
  const float4* block = reinterpret_cast<const float4*>(p.dq_accum + (slice * p.m_blocks + m) * 64 * kD);
  for (int i = static_cast<int>(threadIdx.x); i < 64 * kD / 4; i += 256) {
    const float4 v = block[i];
    const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = 0, col = 0;
      bwd_dq_position(4 * i + e, row, col);
      tile[row][col] = vals[e];
    }
  }
  __syncthreads();
  using E = ElemTraits<T>;
  auto* dq = static_cast<T*>(p.dq) + b * p.stride_batch + h * p.stride_head;
  for (int i = static_cast<int>(threadIdx.x); i < 64 * kD / 2; i += 256) {
    const int row = i / (kD / 2), col = 2 * (i % (kD / 2));
    const int q = m * 64 + row;
    if (q < p.seqlen_q) {
      *reinterpret_cast<uint32_t*>(dq + q * p.stride_seq + col) =
          E::pack2(p.softmax_scale * tile[row][col], p.softmax_scale * tile[row][col + 1]);
    }
  }
}

}  // namespace flashcore::kernels

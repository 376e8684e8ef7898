// The launches around a backward kernel, arch-neutral: before it, per 64-row query block, D = rowsum(dO * O), the LSE
// scaled to base 2 (+inf where a row sees no key, so its P is 0), a zeroed fp32 dQ block, its ordering counter and,
// with sinks, its share of dL/dsinks; after it, dQ = softmax_scale * the accumulated block, in the call's dtype and
// strides, and dL/dsinks. Memory-bound: a CTA per block (dL/dsinks: per query head).
// kBackend: one instance per backend (90, 80). Each backend's units compile these kernels for their own archs; two
// backends' instances of one template would share a host symbol, and the launch could pick the other backend's image.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/bwd_prep_params.h"
#include "kernels/common/bwd_window.h"
#include "kernels/common/element.cuh"

namespace flashcore::kernels {

// The sum over a row of O and dO (kDv columns each) of their products, each lane's share: one 4-, 8- or 16-byte load
// per lane where kDv is 64, 128 or 256, else (96, 192's (192, 128) aside) pairs of columns 64 apart.
template <class T, int kDv>
__device__ __forceinline__ float bwd_row_dot(const T* o, const T* dout, int lane) {
  constexpr int kPerLane = kDv / 32;
  float sum = 0.f;
  if constexpr (kPerLane == 2 || kPerLane == 4 || kPerLane == 8) {
    using Vec = std::conditional_t<kPerLane == 2, uint32_t, std::conditional_t<kPerLane == 4, uint2, uint4>>;
    Vec ov = *reinterpret_cast<const Vec*>(o + lane * kPerLane);
    Vec dv = *reinterpret_cast<const Vec*>(dout + lane * kPerLane);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) sum += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
  } else {
    static_assert(kDv % 64 == 32 || kDv % 64 == 0, "whole column pairs a lane");
#pragma unroll
    for (int c = 0; c < kDv; c += 64) {
      const int col = c + 2 * lane;
      if (col < kDv) {
        const uint32_t ov = *reinterpret_cast<const uint32_t*>(o + col);
        const uint32_t dv = *reinterpret_cast<const uint32_t*>(dout + col);
        const T* oe = reinterpret_cast<const T*>(&ov);
        const T* de = reinterpret_cast<const T*>(&dv);
        sum += static_cast<float>(oe[0]) * static_cast<float>(de[0]) + static_cast<float>(oe[1]) * static_cast<float>(de[1]);
      }
    }
  }
  return sum;
}

// kD: Q's (and dQ's) head dim, kDv: V's (and O's, dO's).
template <class T, int kD, int kBackend = 90, int kDv = kD>
__global__ void __launch_bounds__(256) flashcore_bwd_prep(const BwdPrepParams p) {
  const int m = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const BwdSeq seq = p.rows.seq(b);
  // A block past this sequence's rows: no kernel reads it, unless its kernel step (block_m rows) holds rows of the
  // sequence (then its LSE rows are +inf, its D rows 0 and its dQ rows take the step's zeros).
  if (m * 64 / p.block_m * p.block_m >= seq.len_q) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const bool varlen = p.rows.cu_seqlens_q != nullptr;
  const int64_t base = p.rows.base(b, h, seq);
  const int64_t lse0 = varlen ? h * p.rows.total_q + seq.q_start : (static_cast<int64_t>(b) * p.rows.heads + h) * seq.len_q;
  const auto* o = static_cast<const T*>(p.o) + (varlen ? 0 : b * p.o_stride_batch) + seq.q_start * p.o_stride_seq +
                  h * p.o_stride_head;
  const auto* dout = static_cast<const T*>(p.dout) + (varlen ? 0 : b * p.do_stride_batch) +
                     seq.q_start * p.do_stride_seq + h * p.do_stride_head;
  const float sink = p.sinks != nullptr ? p.sinks[h] : 0.f;
  float dsink = 0.f;  // lane 0: the warp's rows' share of dL/dsinks, -sum exp(sink - LSE) * D
#pragma unroll 2
  for (int i = 0; i < 8; ++i) {
    const int row = m * 64 + warp * 8 + i;
    float sum = 0.f;
    if (row < seq.len_q) sum = bwd_row_dot<T, kDv>(o + row * p.o_stride_seq, dout + row * p.do_stride_seq, lane);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      float lse = INFINITY;  // the padding, and rows that see no key: P = exp2(s - inf) = 0
      if (row < seq.len_q) {
        const float l = p.lse[lse0 + row];
        if (l != -INFINITY) lse = l * static_cast<float>(M_LOG2E);
        if (p.sinks != nullptr) dsink -= expf(sink - l) * sum;  // (LSE >= sink: it includes the sink)
      }
      p.lse_log2[base + row] = lse;
      p.dpsum[base + row] = sum;
    }
  }
  float4* block = reinterpret_cast<float4*>(p.dq_accum + (base + 64 * m) * kD);
  for (int i = static_cast<int>(threadIdx.x); i < 64 * kD / 4; i += 256) block[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t index = (static_cast<int64_t>(b) * p.rows.heads + h) * p.m_blocks + m;
  if (p.dq_semaphore != nullptr && threadIdx.x == 0) {
    // The first turn (bwd_window.h). sm90: the last key block that walks the rows, the key blocks adding theirs from
    // it down (and launched in that order), so that a CTA's first query block (on its diagonal) finds its turn at
    // once; in ascending order causal CTA n waited for n steps of CTA n - 1's. The portable kernels: the first key
    // block, adding up. A step of 128 rows waits on its first block's counter only.
    const BwdWindow window{seq.len_k - seq.len_q, p.window_left, p.window_right, p.chunk};
    const int step_block = m * 64 / p.block_m;
    p.dq_semaphore[index] = p.descending ? window.last_key_block(step_block, p.block_m, p.block_n, seq.len_k)
                                         : window.first_key_block(step_block, p.block_m, p.block_n);
  }
  if (p.sinks != nullptr) {  // the block's share: the warps' in a fixed order
    __shared__ float shares[8];
    if (lane == 0) shares[warp] = dsink;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
      for (int w = 0; w < 8; ++w) total += shares[w];
      p.dsink_part[index] = total;
    }
  }
}

// dL/dsinks[h]: the sum of the (batch, query block) shares of head h, in a fixed order (bit-identical from run to run).
// A CTA of 256 threads per query head.
template <int kBackend = 90>
__global__ void __launch_bounds__(256) flashcore_bwd_dsinks(const BwdDsinksParams p) {
  const int h = static_cast<int>(blockIdx.x);
  float sum = 0.f;
  const int64_t blocks = static_cast<int64_t>(p.batch) * p.m_blocks;
  for (int64_t i = threadIdx.x; i < blocks; i += 256) {
    const int b = static_cast<int>(i / p.m_blocks), m = static_cast<int>(i % p.m_blocks);
    if (m * 64 < p.rows.seq(b).len_q) sum += p.dsink_part[(static_cast<int64_t>(b) * p.rows.heads + h) * p.m_blocks + m];
  }
  __shared__ float partial[256];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = 128; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[h] = partial[0];
}

template <class T, int kD, int kBackend = 90>
__global__ void __launch_bounds__(256) flashcore_bwd_dq_convert(const BwdDqParams p) {
  // A block's columns in groups of at most 128 (two regions), so that the staging tile stays under 48 KB at 256 (at
  // 192: 128, then 64).
  constexpr int kCols = kD < 128 ? kD : 128;
  __shared__ float tile[64][kCols + 2];
  const int m = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const BwdSeq seq = p.rows.seq(b);
  if (m * 64 >= seq.rows_q) return;
  const bool varlen = p.rows.cu_seqlens_q != nullptr;
  using E = ElemTraits<T>;
  auto* dq = static_cast<T*>(p.dq) + (varlen ? 0 : b * p.stride_batch) + seq.q_start * p.stride_seq + h * p.stride_head;
  if (m * 64 >= seq.len_q) {  // rows past seqused_q only (no block was prepared for them): zeros
    for (int i = static_cast<int>(threadIdx.x); i < 64 * kD / 2; i += 256) {
      const int q = m * 64 + i / (kD / 2), col = 2 * (i % (kD / 2));
      if (q < seq.rows_q) *reinterpret_cast<uint32_t*>(dq + q * p.stride_seq + col) = 0u;
    }
    return;
  }
#pragma unroll 1
  for (int c0 = 0; c0 < kD; c0 += kCols) {
    // Regions c0 / 64 .. of the block (bwd_layout.h: a region is 64 x 64 floats, region-major).
    const float4* block =
        reinterpret_cast<const float4*>(p.dq_accum + (p.rows.base(b, h, seq) + 64 * m) * kD + 64 * c0);
    const int cols = kD % kCols == 0 || kD - c0 >= kCols ? kCols : kD - c0;
    for (int i = static_cast<int>(threadIdx.x); i < 64 * cols / 4; i += 256) {
      const float4 v = block[i];
      const float vals[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row = 0, col = 0;
        bwd_dq_position<kBackend == 80>(4 * i + e, row, col);  // (bwd_layout.h: the portable backend's order)
        tile[row][col] = vals[e];
      }
    }
    __syncthreads();
    for (int i = static_cast<int>(threadIdx.x); i < 64 * cols / 2; i += 256) {
      const int row = i / (cols / 2), col = 2 * (i % (cols / 2));
      const int q = m * 64 + row;
      if (q < seq.len_q) {
        *reinterpret_cast<uint32_t*>(dq + q * p.stride_seq + c0 + col) =
            E::pack2(p.softmax_scale * tile[row][col], p.softmax_scale * tile[row][col + 1]);
      } else if (q < seq.rows_q) {  // past seqused_q
        *reinterpret_cast<uint32_t*>(dq + q * p.stride_seq + c0 + col) = 0u;
      }
    }
    __syncthreads();  // the tile is read before the next columns overwrite it
  }
}

// Packed batches with seqused_k: dK and dV of each sequence's keys past its used ones (the kernels write the used
// keys' only) are zeros. A CTA per 64 rows of the longest sequence, KV head and sequence.
template <class T, int kD, int kBackend = 90, int kDv = kD>
__global__ void __launch_bounds__(256) flashcore_bwd_zero_kv(const BwdZeroKvParams p) {
  const int n = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), b = static_cast<int>(blockIdx.z);
  const BwdSeq seq = p.rows.seq(b);
  const int first = max(n * 64, seq.len_k), end = min(n * 64 + 64, seq.rows_k);
  if (first >= end) return;
  auto* dk = static_cast<T*>(p.dk) + seq.k_start * p.dk_stride_seq + h * p.dk_stride_head;
  auto* dv = static_cast<T*>(p.dv) + seq.k_start * p.dv_stride_seq + h * p.dv_stride_head;
  for (int i = static_cast<int>(threadIdx.x); i < (end - first) * kD / 2; i += 256) {
    const int key = first + i / (kD / 2), col = 2 * (i % (kD / 2));
    *reinterpret_cast<uint32_t*>(dk + key * p.dk_stride_seq + col) = 0u;
    if (kDv == kD) *reinterpret_cast<uint32_t*>(dv + key * p.dv_stride_seq + col) = 0u;
  }
  if constexpr (kDv != kD) {
    for (int i = static_cast<int>(threadIdx.x); i < (end - first) * kDv / 2; i += 256) {
      const int key = first + i / (kDv / 2), col = 2 * (i % (kDv / 2));
      *reinterpret_cast<uint32_t*>(dv + key * p.dv_stride_seq + col) = 0u;
    }
  }
}

}  // namespace flashcore::kernels

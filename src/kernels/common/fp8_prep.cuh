// The 8-bit preparation kernels (fp8_prep_params.h). Plain CUDA (no Hopper-only instruction); memory-bound passes
// over Q, K, V launched before the attention on the same stream.
//   fp8_amax_kernel      : |x| maxima per (batch, KV head) of 16-bit Q, K, V (precision = FP8)
//   fp8_transpose_v_kernel: V -> the transposed, key-permuted e4m3 layout the attention kernel reads (from 8-bit V
//                          as is, or from 16-bit V scaled by 448 / amax)
//   fp8_quantize_and_transpose_kernel: e4m3 copies of Q and K scaled by 448 / amax, the descales, and the transposed
//                          V from 16-bit V, in one launch (precision = FP8)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fp8_prep_params.h"

namespace flashcore::kernels {

inline constexpr float kE4m3Max = 448.f;

// Scale for quantizing with absolute maximum `amax` (0 -> 1: an all-zero tensor stays zero).
__device__ __forceinline__ float quant_scale(float amax) { return amax > 0.f ? kE4m3Max / amax : 1.f; }

__device__ __forceinline__ uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// grid (batch * heads_kv, ceil(seqlen / kFp8AmaxRows), 3 tensors), 256 threads: rows [kFp8AmaxRows y, +kFp8AmaxRows)
// of the KV head's heads (all query heads of the group for Q), kInFlight 16-byte loads per thread issued together
// (one load per thread and 32-row blocks ran at 2-2.7 TB/s, docs/decisions.md#prep-passes). NaN does not raise the
// maximum (fmaxf): it stays NaN when quantized.
inline constexpr int kFp8AmaxRows = 128;

template <class T>
__global__ void __launch_bounds__(256) fp8_amax_kernel(const Fp8PrepParams p) {
  constexpr int kInFlight = 4;
  const int tensor = blockIdx.z;
  const Fp8Tensor& t = tensor == 0 ? p.q : (tensor == 1 ? p.k : p.v);
  const int seqlen = tensor == 0 ? p.seqlen_q : p.seqlen_k;
  const int group = tensor == 0 ? p.heads_q / p.heads_kv : 1;
  const int b = blockIdx.x / p.heads_kv, hkv = blockIdx.x % p.heads_kv;
  const int row0 = blockIdx.y * kFp8AmaxRows;
  float m = 0.f;
  if (row0 < seqlen) {
    const int rows = min(kFp8AmaxRows, seqlen - row0);
    const int units_per_row = p.head_dim / 8;  // 8 elements (16 bytes) per unit: 8, 16 or 32
    const int unit_bits = 31 - __clz(units_per_row);
    const int units = rows * group * units_per_row;
    const T* base = static_cast<const T*>(t.data) + b * t.stride_batch;
    for (int u0 = threadIdx.x; u0 < units; u0 += kInFlight * blockDim.x) {
      uint4 raw[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const int u = u0 + j * blockDim.x;
        const int hr = u >> unit_bits;  // (row, head of the group)
        const int r = tensor == 0 ? static_cast<int>(p.div_group.div(static_cast<uint64_t>(hr))) : hr;
        const int h = hkv * group + (hr - r * group), c = (u & (units_per_row - 1)) * 8;
        raw[j] = u < units ? *reinterpret_cast<const uint4*>(base + (row0 + r) * t.stride_seq + h * t.stride_head + c)
                           : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int j = 0; j < kInFlight; ++j) {
        const T* x = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(static_cast<float>(x[i])));
      }
    }
  }
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  __shared__ float warp_max[8];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) m = fmaxf(m, warp_max[w]);
    // Non-negative floats order like their bit patterns as ints.
    atomicMax(reinterpret_cast<int*>(p.amax + tensor * p.batch * p.heads_kv + blockIdx.x), __float_as_int(m));
  }
}

// 8-element units of Q, then K, kFp8QkChunk of them per call (chunk `chunk`; a fixed amount of work per CTA, so that
// the hardware balances the CTAs of the launch it shares with V's tiles); chunk 0 also writes the descales.
inline constexpr int64_t kFp8QkChunk = 4096;  // 256 threads x 4 units in flight x 4 passes

template <class T>
__device__ __forceinline__ void quantize_qk_chunk(const Fp8PrepParams& p, int64_t chunk) {
  const int bh = p.batch * p.heads_kv;
  if (chunk == 0) {
    for (int i = threadIdx.x; i < 3 * bh; i += blockDim.x) {
      const float a = p.amax[i];
      p.descale[i] = a > 0.f ? a / kE4m3Max : 1.f;
    }
  }
  const int units_per_row = p.head_dim / 8;  // 8, 16 or 32
  const int unit_bits = 31 - __clz(units_per_row);
  const int64_t q_units = int64_t{p.batch} * p.seqlen_q * p.heads_q * units_per_row;
  const int64_t k_units = int64_t{p.batch} * p.seqlen_k * p.heads_kv * units_per_row;
  // kInFlight units per thread and pass, their loads issued together (one per thread ran at 2.3 TB/s,
  // docs/decisions.md#prep-passes).
  constexpr int kInFlight = 4;
  const int64_t step = blockDim.x;
  const int64_t end = q_units + k_units < (chunk + 1) * kFp8QkChunk ? q_units + k_units : (chunk + 1) * kFp8QkChunk;
  for (int64_t u0 = chunk * kFp8QkChunk + threadIdx.x; u0 < end; u0 += kInFlight * step) {
    uint4 raw[kInFlight];
    int b[kInFlight], h[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int64_t u = u0 + j * step;
      raw[j] = make_uint4(0u, 0u, 0u, 0u);
      b[j] = h[j] = 0;
      if (u < end) {
        const bool is_q = u < q_units;
        const uint64_t v = static_cast<uint64_t>(is_q ? u : u - q_units);
        const FastDiv& heads = is_q ? p.div_heads_q : p.div_heads_kv;
        const FastDiv& seqlen = is_q ? p.div_seqlen_q : p.div_seqlen_k;
        const int c = static_cast<int>(v & (units_per_row - 1)) * 8;
        const uint64_t row = v >> unit_bits;  // (b, s, h) flattened
        const uint64_t bs = heads.div(row), bb = seqlen.div(bs);
        b[j] = static_cast<int>(bb);
        h[j] = static_cast<int>(heads.mod(row, bs));
        const int s = static_cast<int>(seqlen.mod(bs, bb));
        const Fp8Tensor& t = is_q ? p.q : p.k;
        raw[j] = *reinterpret_cast<const uint4*>(static_cast<const T*>(t.data) + b[j] * t.stride_batch +
                                                 s * t.stride_seq + h[j] * t.stride_head + c);
      }
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int64_t u = u0 + j * step;
      if (u >= end) break;
      const bool is_q = u < q_units;
      const int64_t v = is_q ? u : u - q_units;
      const T* x = reinterpret_cast<const T*>(&raw[j]);
      const int hkv = is_q ? static_cast<int>(p.div_group.div(static_cast<uint64_t>(h[j]))) : h[j];
      const float scale = quant_scale(p.amax[(is_q ? 0 : 1) * p.batch * p.heads_kv + b[j] * p.heads_kv + hkv]);
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) lo |= uint32_t{to_e4m3(static_cast<float>(x[i]) * scale)} << (8 * i);
#pragma unroll
      for (int i = 0; i < 4; ++i) hi |= uint32_t{to_e4m3(static_cast<float>(x[4 + i]) * scale)} << (8 * i);
      uint8_t* dst = (is_q ? p.q8 : p.k8) + v * 8;
      *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
    }
  }
}

// grid (padded_keys / 128, heads_kv, batch), 256 threads: one 128-key tile of one (batch, KV head). The tile is
// staged in shared memory as e4m3 bytes [key][head_dim] (from 8-bit V as is; from 16-bit V scaled by 448 / amax),
// then written out as head_dim rows of 128 bytes, slot c of a row holding key p8_key_of_slot(c) of its group of 32.
// Write-out: a thread takes 4 head-dim rows x 4 slots (one 32-bit word per row): it loads the 4 keys' words of those
// rows (keys 2q, 2q+1, 8+2q, 9+2q of the slot quad, element.cuh) and transposes the 4 x 4 bytes with byte permutes.
template <class T, int kHeadDim>
__device__ __forceinline__ void transpose_v_tile(const Fp8PrepParams& p, int key_tile, int h, int b) {
  // Bytes per staged key row: one word more than the row, so that row r + 1 starts one bank further.
  constexpr int kPitch = kHeadDim + 4;
  __shared__ __align__(16) uint8_t tile[128 * kPitch];
  const int key0 = key_tile * 128;
  const T* src = static_cast<const T*>(p.v.data) + b * p.v.stride_batch + h * p.v.stride_head;
  float scale = 1.f;
  if constexpr (sizeof(T) == 2) scale = quant_scale(p.amax[2 * p.batch * p.heads_kv + b * p.heads_kv + h]);
  constexpr int kUnitElems = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int kUnitsPerRow = kHeadDim / kUnitElems;
  // The thread's loads are issued in batches of up to 8 before any is used: one load in flight per thread, as a
  // rolled loop had it, ran the pass at 2.7-3.1 TB/s on the H200 (docs/decisions.md#prep-passes).
  constexpr int kThreads = 256;  // the launch's block (fp8_prep.cu launch_prep)
  constexpr int kLoads = 128 * kUnitsPerRow / kThreads;
  constexpr int kBatch = kLoads < 8 ? kLoads : 8;
  static_assert(kLoads * kThreads == 128 * kUnitsPerRow && kLoads % kBatch == 0, "whole batches of loads per thread");
#pragma unroll
  for (int j0 = 0; j0 < kLoads; j0 += kBatch) {
    uint4 raws[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int u = static_cast<int>(threadIdx.x) + (j0 + j) * kThreads;
      const int r = u / kUnitsPerRow, c = (u % kUnitsPerRow) * kUnitElems;
      raws[j] = key0 + r < p.seqlen_k ? *reinterpret_cast<const uint4*>(src + (key0 + r) * p.v.stride_seq + c)
                                      : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int u = static_cast<int>(threadIdx.x) + (j0 + j) * kThreads;
      const int r = u / kUnitsPerRow, c = (u % kUnitsPerRow) * kUnitElems;
      const uint4 raw = raws[j];
      uint32_t* row = reinterpret_cast<uint32_t*>(tile + r * kPitch + c);
      if constexpr (sizeof(T) == 1) {
        row[0] = raw.x, row[1] = raw.y, row[2] = raw.z, row[3] = raw.w;
      } else {
        const T* x = reinterpret_cast<const T*>(&raw);
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) lo |= uint32_t{to_e4m3(static_cast<float>(x[i]) * scale)} << (8 * i);
#pragma unroll
        for (int i = 0; i < 4; ++i) hi |= uint32_t{to_e4m3(static_cast<float>(x[4 + i]) * scale)} << (8 * i);
        row[0] = lo, row[1] = hi;
      }
    }
  }
  __syncthreads();
  const int64_t padded = fp8_vt_padded_keys(p.seqlen_k);
  uint8_t* dst = p.vt + ((int64_t{b} * p.heads_kv + h) * kHeadDim) * padded + key0;
  constexpr int kWriteSteps = (kHeadDim / 4) * 32 / kThreads;
  static_assert(kWriteSteps * kThreads == (kHeadDim / 4) * 32, "whole write-out steps per thread");
#pragma unroll
  for (int i = 0; i < kWriteSteps; ++i) {
    const int u = static_cast<int>(threadIdx.x) + i * kThreads;
    // A warp: the 8 slot quads of one group of 32 keys x 4 groups of 4 rows, so that its 32 loads hit 32 banks: the
    // pitch is 1 mod 32 words, the quads' first keys are 0, 2, 4, 6, 16, 18, 20, 22 (+ 32 per group), and the row
    // groups are b, b + 1, b + 8, b + 9 (in words), which fills the gaps.
    const int lane = u % 32, warp_item = u / 32;
    const int quad = (warp_item % 4) * 8 + lane % 8;  // slots 4 quad .. 4 quad + 3
    const int set = warp_item / 4, base = (set / 4) * 16 + (set % 4) * 2;
    const int d0 = 4 * (base + (lane / 8) % 2 + 8 * (lane / 16));  // rows d0 .. d0 + 3
    const int k0 = (4 * quad & ~31) + p8_key_of_slot(4 * quad & 31);  // keys k0, k0 + 1, k0 + 8, k0 + 9
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(tile + k0 * kPitch + d0);
    const uint32_t w1 = *reinterpret_cast<const uint32_t*>(tile + (k0 + 1) * kPitch + d0);
    const uint32_t w2 = *reinterpret_cast<const uint32_t*>(tile + (k0 + 8) * kPitch + d0);
    const uint32_t w3 = *reinterpret_cast<const uint32_t*>(tile + (k0 + 9) * kPitch + d0);
    const uint32_t t0 = __byte_perm(w0, w1, 0x5140), t1 = __byte_perm(w0, w1, 0x7362);  // rows d0, d0+1 | d0+2, d0+3
    const uint32_t t2 = __byte_perm(w2, w3, 0x5140), t3 = __byte_perm(w2, w3, 0x7362);
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + int64_t{d0} * padded + 4 * quad);
    out[0] = __byte_perm(t0, t2, 0x5410);
    out[padded / 4] = __byte_perm(t0, t2, 0x7632);
    out[2 * (padded / 4)] = __byte_perm(t1, t3, 0x5410);
    out[3 * (padded / 4)] = __byte_perm(t1, t3, 0x7632);
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) fp8_transpose_v_kernel(const Fp8PrepParams p) {
  // The attention kernel after it is a programmatic dependent launch (sm90/backend.cpp): its CTAs may be placed once
  // every block of this grid runs; they wait for this grid's completion before they touch memory (sm90/kernel.cuh).
  cudaTriggerProgrammaticLaunchCompletion();
  transpose_v_tile<T, kHeadDim>(p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y),
                                static_cast<int>(blockIdx.z));
}

// precision = FP8's second pass in one launch (after fp8_amax_kernel): blocks [0, tiles) transpose and quantize V's
// 128-key tiles (tiles = padded_keys / 128 x heads_kv x batch, tile-major), the rest quantize Q and K; the two
// memory-bound passes share the machine instead of running one after the other (docs/decisions.md#prep-passes).
template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) fp8_quantize_and_transpose_kernel(const Fp8PrepParams p) {
  cudaTriggerProgrammaticLaunchCompletion();  // as fp8_transpose_v_kernel's
  const int key_tiles = static_cast<int>(fp8_vt_padded_keys(p.seqlen_k) / 128);
  const int v_blocks = key_tiles * p.heads_kv * p.batch;
  const int block = static_cast<int>(blockIdx.x);
  if (block < v_blocks) {
    const int bh = block / key_tiles;
    transpose_v_tile<T, kHeadDim>(p, block % key_tiles, bh % p.heads_kv, bh / p.heads_kv);
  } else {
    quantize_qk_chunk<T>(p, block - v_blocks);
  }
}

}  // namespace flashcore::kernels

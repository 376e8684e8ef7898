// The int8 preparation kernels of precision = INT8 (int8_prep_params.h): memory-bound passes over 16-bit Q and K,
// launched before the attention on the same stream, and the LSE shift after it. Deterministic: every sum runs in a
// fixed order (no atomics), so that reruns are bit-exact.
//   int8_k_sum_kernel   : K's per-channel sums over chunks of kInt8SumChunk keys, per (batch, KV head)
//   int8_quantize_k_kernel: K's mean (from the sums), then per 128-key block: K - mean, its amax, int8 values, scale
//   int8_quantize_q_kernel: per query token (head_dim / 8 lanes per row): amax, int8 values, scale, q . k_mean
//   int8_k_sum_and_q_kernel: the first and the third in one launch (calls without an LSE)
//   int8_lse_shift_kernel: LSE += softmax_scale * q . k_mean (the smoothing's shift, added back)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/common/int8_prep_params.h"
#include "kernels/common/warp.cuh"

namespace flashcore::kernels {

// The quantization step of a row or block: amax / 127; 1 for all zeros; NaN if any value was NaN or infinite.
__device__ __forceinline__ float int8_step(float amax) {
  return amax == INFINITY ? __int_as_float(0x7fffffff) : (amax > 0.f ? amax / 127.f : 1.f);
}

// The amax of a row or block with a NaN or an infinity counted as +inf (fmaxf would drop a NaN), so that int8_step()
// can tell them apart from finite data: the integer maximum of the magnitudes' bit patterns orders finite values as
// floats do and puts every NaN above +inf (2 instructions per value; an isfinite test and a select took 3).
__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
__device__ __forceinline__ float amax_from_bits(uint32_t bits) {
  return bits >= 0x7f800000u ? INFINITY : __uint_as_float(bits);
}

// Eight values x[i] * inv rounded to int8, bytes i = value i. Every |x[i] * inv| is at most 127 (the step is the
// row's or block's amax / 127), so no clamp is needed: x * inv + 1.5 * 2^23 rounds the exact product to the nearest
// integer (ties to even) in the float's low mantissa bits, whose low byte is the int8 in two's complement, and byte
// permutes gather the four bytes of a word (one FFMA per value and 3 PRMT per 4 values, against a conversion, two
// clamps, a mask and a shift per value). A NaN step gives meaningless bytes under a NaN scale, which is what the
// attention reads for that row or block.
__device__ __forceinline__ uint2 int8_pack8(const float (&x)[8], float inv) {
  constexpr float kMagic = 12582912.f;  // 1.5 * 2^23
  uint32_t b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = __float_as_uint(fmaf(x[i], inv, kMagic));
  const uint32_t lo = __byte_perm(__byte_perm(b[0], b[1], 0x0040), __byte_perm(b[2], b[3], 0x0040), 0x5410);
  const uint32_t hi = __byte_perm(__byte_perm(b[4], b[5], 0x0040), __byte_perm(b[6], b[7], 0x0040), 0x5410);
  return make_uint2(lo, hi);
}

template <class T>
__device__ __forceinline__ uint4 load_raw(const T* src) { return *reinterpret_cast<const uint4*>(src); }

template <class T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&x)[8]) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = static_cast<float>(v[i]);
}

// grid (batch * heads_kv, sum chunks), 256 threads: thread (unit u, row r) adds rows r, r + R, ... of the chunk, 8
// channels; the R rows' sums are then added in row order in shared memory.
template <class T, int kHeadDim>
__device__ __forceinline__ void k_sum_block(const Int8PrepParams& p, int bh, int chunk) {
  constexpr int kUnits = kHeadDim / 8, kRowsPar = 256 / kUnits;
  __shared__ float part[kRowsPar][kHeadDim];
  const int b = bh / p.heads_kv, h = bh % p.heads_kv;
  const int u = threadIdx.x % kUnits, r = threadIdx.x / kUnits;
  const int key0 = chunk * kInt8SumChunk, key1 = min(key0 + kInt8SumChunk, p.seqlen_k);
  const T* base = static_cast<const T*>(p.k.data) + b * p.k.stride_batch + h * p.k.stride_head + u * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  // kInFlight rows' loads are issued before their adds (a memory-bound pass needs many loads in flight per SM; one
  // per thread reached 1.6-3.2 TB/s, docs/decisions.md#prep-passes); the adds keep the row order, so the sums stay
  // bit-exact.
  constexpr int kInFlight = 4;
  for (int key = key0 + r; key < key1; key += kRowsPar * kInFlight) {
    uint4 raw[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int kj = key + j * kRowsPar;
      raw[j] = kj < key1 ? load_raw(base + kj * p.k.stride_seq) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      float x[8];
      unpack8<T>(raw[j], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += x[i];
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) part[r][u * 8 + i] = acc[i];
  __syncthreads();
  for (int c = threadIdx.x; c < kHeadDim; c += 256) {
    float s = 0.f;
    for (int i = 0; i < kRowsPar; ++i) s += part[i][c];
    p.k_partial[(static_cast<int64_t>(bh) * int8_sum_chunks(p.seqlen_k) + chunk) * kHeadDim + c] = s;
  }
}

template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) int8_k_sum_kernel(const Int8PrepParams p) {
  k_sum_block<T, kHeadDim>(p, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y));
}

// grid (batch * heads_kv, ceil(key blocks / kInt8KBlocksPerCta)), 256 threads: K's mean from the chunk sums, then
// kInt8KBlocksPerCta blocks of 128 keys in turn (the chunk sums are read once per CTA rather than once per block: at
// 256-key chunks, 8k keys and d64 they were a third of the bytes the pass read).
inline constexpr int kInt8KBlocksPerCta = 4;

template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) int8_quantize_k_kernel(const Int8PrepParams p) {
  constexpr int kUnits = kHeadDim / 8, kRowsPar = 256 / kUnits;
  __shared__ float mean[kHeadDim];
  __shared__ float warp_max[8];
  const int bh = blockIdx.x, b = bh / p.heads_kv, h = bh % p.heads_kv;
  const int chunks = static_cast<int>(int8_sum_chunks(p.seqlen_k));
  for (int c = threadIdx.x; c < kHeadDim; c += 256) {
    float s = 0.f;
    for (int i = 0; i < chunks; ++i) s += p.k_partial[(static_cast<int64_t>(bh) * chunks + i) * kHeadDim + c];
    mean[c] = s / static_cast<float>(p.seqlen_k);
    if (blockIdx.y == 0) p.k_mean[static_cast<int64_t>(bh) * kHeadDim + c] = mean[c];
  }
  __syncthreads();
  const int u = threadIdx.x % kUnits, r = threadIdx.x / kUnits;
  const T* base = static_cast<const T*>(p.k.data) + b * p.k.stride_batch + h * p.k.stride_head + u * 8;
  const int blocks = static_cast<int>(int8_key_blocks(p.seqlen_k));
  const int kb1 = min(blocks, static_cast<int>(blockIdx.y + 1) * kInt8KBlocksPerCta);
  for (int kb = blockIdx.y * kInt8KBlocksPerCta; kb < kb1; ++kb) {
    const int key0 = kb * kInt8KeyBlock, key1 = min(key0 + kInt8KeyBlock, p.seqlen_k);
    // The thread's rows of the block, loaded once (all in flight together) and kept for the quantization below.
    constexpr int kRows = kInt8KeyBlock / kRowsPar;
    uint4 raw[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int key = key0 + r + j * kRowsPar;
      raw[j] = key < key1 ? load_raw(base + key * p.k.stride_seq) : make_uint4(0u, 0u, 0u, 0u);
    }
    uint32_t amax_bits = 0;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      if (key0 + r + j * kRowsPar >= key1) continue;
      float x[8];
      unpack8<T>(raw[j], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax_bits = max(amax_bits, magnitude_bits(x[i] - mean[u * 8 + i]));
    }
    float amax = lanes_max<32>(amax_from_bits(amax_bits));
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
    __syncthreads();
    for (int w = 0; w < 8; ++w) amax = fmaxf(amax, warp_max[w]);
    const float step = int8_step(amax);
    const float inv = 1.f / step;
    if (threadIdx.x == 0) p.k_scale[static_cast<int64_t>(bh) * blocks + kb] = step;
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int key = key0 + r + j * kRowsPar;
      if (key >= key1) continue;
      float x[8];
      unpack8<T>(raw[j], x);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] -= mean[u * 8 + i];
      int8_t* dst = p.k8 + ((static_cast<int64_t>(b) * p.seqlen_k + key) * p.heads_kv + h) * kHeadDim + u * 8;
      *reinterpret_cast<uint2*>(dst) = int8_pack8(x, inv);
    }
    __syncthreads();  // every warp has read warp_max before the next block writes it
  }
}

// A query row's (batch, seq, head) from its index in (batch, seqlen_q, heads_q) order.
struct QRow {
  int b, s, h;
};
__device__ __forceinline__ QRow split_q_row(const Int8PrepParams& p, int64_t row) {
  const uint64_t bs = p.div_heads_q.div(static_cast<uint64_t>(row)), b = p.div_seqlen_q.div(bs);
  return {static_cast<int>(b), static_cast<int>(p.div_seqlen_q.mod(bs, b)),
          static_cast<int>(p.div_heads_q.mod(static_cast<uint64_t>(row), bs))};
}

// kLanes = head_dim / 8 lanes per query row (b, s, h), each with one 16-byte load of 8 elements (a warp takes 32 /
// kLanes rows at once, kInt8QInFlight times: all loads are issued before the first row's statistics). Row statistics
// are reduced over the row's lanes. One call takes the int8_q_rows_per_chunk() rows of chunk `chunk`: a fixed amount of
// work per CTA, so that the hardware balances the CTAs of a launch that also runs other passes' blocks (a grid-stride
// loop over more CTAs than fit at once would leave the last ones for a second, mostly empty round).
inline constexpr int kInt8QInFlight = 4;
template <int kHeadDim>
constexpr int64_t int8_q_rows_per_chunk() { return (256 / (kHeadDim / 8)) * kInt8QInFlight; }

template <class T, int kHeadDim>
__device__ __forceinline__ void quantize_q_chunk(const Int8PrepParams& p, int64_t chunk) {
  constexpr int kLanes = kHeadDim / 8;  // 8, 16 or 32
  constexpr int kInFlight = kInt8QInFlight;
  constexpr int64_t kRowsPerBlock = 256 / kLanes;
  const int sub = threadIdx.x % kLanes;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.seqlen_q * p.heads_q;
  const int group = p.heads_q / p.heads_kv;
  // Rows past the end are computed on row 0 and not stored (the shuffles below need all 32 lanes of a warp).
  const int64_t first = chunk * int8_q_rows_per_chunk<kHeadDim>() + threadIdx.x / kLanes;
  uint4 raw[kInFlight];
  QRow q[kInFlight];
#pragma unroll
  for (int j = 0; j < kInFlight; ++j) {
    const int64_t row = first + j * kRowsPerBlock;  // a lane's rows, kRowsPerBlock apart
    q[j] = split_q_row(p, row < rows ? row : 0);
    raw[j] = load_raw(static_cast<const T*>(p.q.data) + q[j].b * p.q.stride_batch + q[j].s * p.q.stride_seq +
                      q[j].h * p.q.stride_head + sub * 8);
  }
#pragma unroll
  for (int j = 0; j < kInFlight; ++j) {
    const int64_t row = first + j * kRowsPerBlock;
    const bool live = row < rows;
    const int64_t r = live ? row : 0;
    const auto [b, s, h] = q[j];
    float x[8];
    unpack8<T>(raw[j], x);
    uint32_t amax_bits = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax_bits = max(amax_bits, magnitude_bits(x[i]));
    const float step = int8_step(lanes_max<kLanes>(amax_from_bits(amax_bits)));
    const int64_t stat = (static_cast<int64_t>(b) * p.heads_q + h) * p.seqlen_q + s;
    if (p.lse_shift != nullptr) {
      const float* km = p.k_mean + (static_cast<int64_t>(b) * p.heads_kv + h / group) * kHeadDim + sub * 8;
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) dot = fmaf(x[i], km[i], dot);
      dot = lanes_sum<kLanes>(dot);
      if (live && sub == 0) p.lse_shift[stat] = dot;
    }
    if (!live) continue;
    if (sub == 0) p.q_scale[stat] = step;
    *reinterpret_cast<uint2*>(p.q8 + r * kHeadDim + sub * 8) = int8_pack8(x, 1.f / step);
  }
}

// grid (ceil(rows / int8_q_rows_per_chunk)), 256 threads.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) int8_quantize_q_kernel(const Int8PrepParams p) {
  quantize_q_chunk<T, kHeadDim>(p, blockIdx.x);
}

// The K sums and the query rows in one launch, for calls without an LSE (whose rows need K's mean for q . k_mean):
// blocks [0, batch * heads_kv * chunks) sum K, the rest quantize Q; the two memory-bound passes share the machine
// instead of running one after the other.
template <class T, int kHeadDim>
__global__ void __launch_bounds__(256) int8_k_sum_and_q_kernel(const Int8PrepParams p) {
  const int chunks = static_cast<int>(int8_sum_chunks(p.seqlen_k));
  const int sum_blocks = p.batch * p.heads_kv * chunks;
  const int block = static_cast<int>(blockIdx.x);
  if (block < sum_blocks) {
    k_sum_block<T, kHeadDim>(p, block / chunks, block % chunks);
  } else {
    quantize_q_chunk<T, kHeadDim>(p, block - sum_blocks);
  }
}

// Grid-stride over the LSE entries (batch, heads_q, seqlen_q): -inf (a row with no key) and NaN stay as they are.
__global__ void __launch_bounds__(256) int8_lse_shift_kernel(const Int8PrepParams p) {
  const int64_t n = static_cast<int64_t>(p.batch) * p.heads_q * p.seqlen_q;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * 256) {
    p.lse[i] = fmaf(p.softmax_scale, p.lse_shift[i], p.lse[i]);
  }
}

}  // namespace flashcore::kernels

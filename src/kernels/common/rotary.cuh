// Packed rows' sequences, and the rotary embedding of 16-byte units (8 elements of a 16-bit dtype) of a head's row: the append kernel rotates the new
// keys with it (append_kv.cuh), the Q kernel the queries (rotary.cu). Pairs are (2i, 2i + 1) within a unit when
// interleaved, else columns i and i + dim / 2, which lie in units u and u + dim / 16 (dim a multiple of 16): the
// thread of the first unit rotates both. x' = x cos - y sin, y' = x sin + y cos in fp32 (products rounded before the
// fused add, so that a host reference reproduces them bit for bit), rounded to the dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/common/append_params.h"

namespace flashcore::kernels {

// The sequence of packed row `token` (a packed append's new row, or a packed query row): the last b whose cu[b],
// clamped to [0, total], is at most token. Garbage offsets give some b in [0, batch); the caller checks the row
// against that sequence's extent.
__device__ __forceinline__ int64_t packed_owner(const int32_t* cu, int batch, int64_t total, int64_t token) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    const int64_t start = cu[mid];
    if ((start < 0 ? 0 : (start > total ? total : start)) <= token) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ float elem_of(uint16_t bits, int bf16) {
  return bf16 ? __uint_as_float(uint32_t{bits} << 16) : __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ uint16_t bits_of(float v, int bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

// The table row of a position (t rows past sequence b's first rotated position), clamped to the table.
__device__ __forceinline__ int64_t rotary_row(const RotaryParams& r, int64_t b, int64_t t) {
  const int64_t base = r.seqlens != nullptr ? r.seqlens[b] : r.seqused_k[b];
  const int64_t pos = (base < 0 ? 0 : base) + t;
  return pos < 0 ? 0 : (pos >= r.seqlen ? r.seqlen - 1 : pos);
}

__device__ __forceinline__ void rotate_pair(const RotaryParams& r, int64_t row, int i, uint16_t& x, uint16_t& y) {
  const int64_t at = row * (r.dim / 2) + i;
  const float c = elem_of(static_cast<const uint16_t*>(r.cos)[at], r.bf16);
  const float s = elem_of(static_cast<const uint16_t*>(r.sin)[at], r.bf16);
  const float xf = elem_of(x, r.bf16), yf = elem_of(y, r.bf16);
  x = bits_of(__fmaf_rn(xf, c, -__fmul_rn(yf, s)), r.bf16);
  y = bits_of(__fmaf_rn(xf, s, __fmul_rn(yf, c)), r.bf16);
}

// Rotates unit `unit` of a head's row read at `src` (16-byte units), at table row `row`, and hands the rotated units
// to store(u, value) (u: the unit's index in the row, value: its 8 elements). True when the unit is done: rotated
// here, or a second-half unit of a non-interleaved rotation, which its first-half partner's thread stores. False for
// the units past the rotated columns, which the caller copies.
template <class Store>
__device__ __forceinline__ bool rotate_unit(const RotaryParams& r, int64_t row, int unit, const char* src, Store&& store) {
  if (unit * 8 >= r.dim) return false;
  if (r.interleaved) {
    uint4 v = *reinterpret_cast<const uint4*>(src + unit * 16);
    uint16_t* e = reinterpret_cast<uint16_t*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) rotate_pair(r, row, unit * 4 + j, e[2 * j], e[2 * j + 1]);
    store(unit, v);
    return true;
  }
  const int half_units = r.dim / 16;
  if (unit >= half_units) return true;  // written with its partner unit
  uint4 vx = *reinterpret_cast<const uint4*>(src + unit * 16);
  uint4 vy = *reinterpret_cast<const uint4*>(src + (unit + half_units) * 16);
  uint16_t* ex = reinterpret_cast<uint16_t*>(&vx);
  uint16_t* ey = reinterpret_cast<uint16_t*>(&vy);
#pragma unroll
  for (int j = 0; j < 8; ++j) rotate_pair(r, row, unit * 8 + j, ex[j], ey[j]);
  store(unit, vx);
  store(unit + half_units, vy);
  return true;
}

}  // namespace flashcore::kernels

// Global -> shared loads with cp.async.cg (16 bytes per instruction, L1 bypassed). Every thread of the CTA
// copies kUnits 16-byte units of a tile; rows past the end of the sequence are zero-filled (source size 0)
// rather than skipped, so a V tail row can never carry NaN into P V (0 * NaN) and a Q tail row computes on
// zeros. The caller groups the copies (cp_async_commit) and waits for them (cp_async_wait + __syncthreads).
#pragma once
#include <cstdint>

#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"

namespace flashcore::sm80 {

// Byte address of row 0 of (batch, head) of `t` (64-bit arithmetic; strides are in elements).
template <class Cfg>
__device__ __forceinline__ const uint8_t* slice_base(const TensorRef& t, int batch, int head) {
  return static_cast<const uint8_t*>(t.ptr) +
         (static_cast<int64_t>(batch) * t.batch_stride + static_cast<int64_t>(head) * t.head_stride) *
             Cfg::kElemBytes;
}

// Copy rows [row0, row0 + kRows) of a slice (row stride `seq_stride` elements, `seqlen` rows) into the tile at
// shared address `dst`, swizzled (smem.cuh). Rows at or past `seqlen` are zero-filled.
template <class Cfg, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint8_t* slice, int64_t seq_stride, int64_t row0,
                                          int64_t seqlen) {
  constexpr int kUnits = kRows * Cfg::kRowUnits / Cfg::kThreads;
  static_assert(kUnits * Cfg::kThreads == kRows * Cfg::kRowUnits, "the tile must split evenly over the threads");
  const int64_t row_bytes = seq_stride * Cfg::kElemBytes;
#pragma unroll
  for (int i = 0; i < kUnits; ++i) {
    const int c = static_cast<int>(threadIdx.x) + i * Cfg::kThreads;
    const int r = c / Cfg::kRowUnits;
    const int unit = c % Cfg::kRowUnits;
    const int64_t row = row0 + r;
    const bool valid = row < seqlen;
    // An out-of-range row reads nothing, but its source address must still be a valid one: row 0.
    const uint8_t* src = slice + (valid ? row : int64_t{0}) * row_bytes + unit * 16;
    cp_async_16(dst + swizzled_offset<Cfg::kRowBytes>(r, unit), src, valid);
  }
}

}  // namespace flashcore::sm80

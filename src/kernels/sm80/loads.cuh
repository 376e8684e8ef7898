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
  constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kRowUnits;  // rows one pass of the CTA's threads copies
  static_assert(kUnits * Cfg::kThreads == kRows * Cfg::kRowUnits && kRowsPerPass * Cfg::kRowUnits == Cfg::kThreads,
                "the tile must split evenly over the threads, whole rows per pass");
  const int64_t row_bytes = seq_stride * Cfg::kElemBytes;
  const int r0 = static_cast<int>(threadIdx.x) / Cfg::kRowUnits;  // this thread's row in each pass; its unit is fixed
  const int unit = static_cast<int>(threadIdx.x) % Cfg::kRowUnits;
  slice += unit * 16;
  // Not unrolled: unrolled, the compiler keeps every pass's 64-bit source offset in registers across the main loop
  // (32 of them for a 4-warp head-dim-128 K/V pair), which made the 32-rows-per-warp configs spill.
#pragma unroll 1
  for (int i = 0; i < kUnits; ++i) {
    const int64_t row = row0 + r0 + i * kRowsPerPass;
    const bool valid = row < seqlen;
    // An out-of-range row reads nothing, but its source address must still be a valid one: row 0.
    const uint8_t* src = slice + (valid ? row : int64_t{0}) * row_bytes;
    cp_async_16(dst + swizzled_offset<Cfg::kRowBytes>(r0 + i * kRowsPerPass, unit), src, valid);
  }
}

}  // namespace flashcore::sm80

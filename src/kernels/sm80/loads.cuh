// Global -> shared loads with cp.async.cg (16 bytes per instruction, L1 bypassed). Every thread of the CTA
// copies kUnits 16-byte units of a tile; rows past the end of the sequence are zero-filled (source size 0)
// rather than skipped, so a V tail row can never carry NaN into P V (0 * NaN) and a Q tail row computes on
// zeros. The caller groups the copies (cp_async_commit) and waits for them (cp_async_wait + __syncthreads).
#pragma once
#include <cstdint>

#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"
#include "kernels/sm80/tile.cuh"

namespace flashcore::sm80 {

// Byte address of row 0 of (batch, head) of `t` (64-bit arithmetic; strides are in elements).
template <class Cfg>
__device__ __forceinline__ const uint8_t* slice_base(const TensorRef& t, int batch, int head) {
  return static_cast<const uint8_t*>(t.ptr) +
         (static_cast<int64_t>(batch) * t.batch_stride + static_cast<int64_t>(head) * t.head_stride) *
             Cfg::kElemBytes;
}

// A paged cache's rows (flashcore.h, block_table): key j of the tile's sequence is row j % page_size of page
// table[j / page_size]; the slice passed with it is the KV head's row 0 of page 0.
struct PagedRows {
  const int32_t* table;  // the sequence's row of the block table
  int64_t page_bytes;    // K or V's batch (page) stride in bytes
  const FwdParams* p;    // page_size / page_shift / num_pages
};
// (Passed as a flag and a reference, never as a maybe-null pointer: that put the struct in local memory.)

// Where this thread's copies of a tile start: its row within a pass and its fixed 16-byte unit of every row.
template <class Cfg>
__device__ __forceinline__ int thread_pass_row() {
  return static_cast<int>(threadIdx.x) / Cfg::kRowUnits;
}
template <class Cfg>
__device__ __forceinline__ int thread_unit() {
  return static_cast<int>(threadIdx.x) % Cfg::kRowUnits;
}
// How kRows rows split over the CTA: every thread copies one fixed 16-byte unit of kRowsPerPass-apart rows, kUnits of
// them.
template <class Cfg, int kRows>
struct TileCopy {
  static constexpr int kUnits = kRows * Cfg::kRowUnits / Cfg::kThreads;
  static constexpr int kRowsPerPass = Cfg::kThreads / Cfg::kRowUnits;  // rows one pass of the CTA's threads copies
  static_assert(kUnits * Cfg::kThreads == kRows * Cfg::kRowUnits && kRowsPerPass * Cfg::kRowUnits == Cfg::kThreads,
                "the tile must split evenly over the threads, whole rows per pass");
};

// This thread's first source unit of the tile whose row 0 is row `row0` of `slice` (rows of `row_bytes`).
template <class Cfg>
__device__ __forceinline__ const uint8_t* thread_source(const uint8_t* slice, int64_t row0, int64_t row_bytes) {
  return slice + thread_unit<Cfg>() * 16 + (row0 + thread_pass_row<Cfg>()) * row_bytes;
}

// The checked path of load_tile (also the main loop's K/V tail and paged tiles).
template <class Cfg, int kRows>
__device__ __forceinline__ void load_checked(uint32_t dst, const uint8_t* slice, int64_t row_bytes, int64_t row0,
                                             int64_t seqlen, bool is_paged, const PagedRows& paged) {
  constexpr int kUnits = TileCopy<Cfg, kRows>::kUnits;
  constexpr int kRowsPerPass = TileCopy<Cfg, kRows>::kRowsPerPass;
  const int r0 = thread_pass_row<Cfg>();
  const int unit = thread_unit<Cfg>();
  slice += unit * 16;
  // Not unrolled: unrolled, the compiler keeps every pass's 64-bit source offset in registers across the main loop
  // (32 of them for a 4-warp head-dim-128 K/V pair), which made the 32-rows-per-warp configs spill.
#pragma unroll 1
  for (int i = 0; i < kUnits; ++i) {
    const int64_t row = row0 + r0 + i * kRowsPerPass;
    bool valid = row < seqlen;
    int64_t offset = row * row_bytes;
    if (is_paged) {  // keys past the sequence's count may have garbage table entries: not read
      const int key = static_cast<int>(row);
      const int32_t page = valid ? __ldg(paged.table + kernels::page_entry(*paged.p, key)) : -1;
      valid = page >= 0 && page < paged.p->num_pages;
      offset = page * paged.page_bytes + kernels::row_in_page(*paged.p, key) * row_bytes;
    }
    // An out-of-range row reads nothing, but its source address must still be a valid one: row 0.
    cp_async_16(dst + swizzled_offset<Cfg::kRowBytes>(r0 + i * kRowsPerPass, unit), slice + (valid ? offset : 0),
                valid);
  }
}

// The dense path: kRows rows wholly inside the sequence, from `src` (thread_source of the tile's row 0), one
// pointer walked by a fixed row step; when a pass covers whole groups of 8 rows, the shared side is a fixed step too
// (the swizzle of a thread's rows repeats every 8): a 64-bit add per copy. The main loop keeps `src` of the next K
// and V tile in a register pair stepped by one tile per load (mainloop.cuh, k_next and v_next): recomputing it from
// the tile's row cost ~25 integer instructions per K or V tile, a tenth of a head-dim-64 key block's instructions.
template <class Cfg, int kRows>
__device__ __forceinline__ void load_rows(uint32_t dst, const uint8_t* src, int64_t row_bytes) {
  constexpr int kUnits = TileCopy<Cfg, kRows>::kUnits;
  constexpr int kRowsPerPass = TileCopy<Cfg, kRows>::kRowsPerPass;
  const int r0 = thread_pass_row<Cfg>();
  const int unit = thread_unit<Cfg>();
  const int64_t step = kRowsPerPass * row_bytes;
  // The swizzle of a row depends on row % 8. Passes of 8 rows or more: every pass has the thread's first swizzle.
  // Fewer (4 rows per pass: 4 warps at head dim 256), with r0 < kRowsPerPass: pass i's row is
  // r0 + kRowsPerPass * (i % kCycle) + 8 * (i / kCycle), so kCycle shared offsets, each stepped by 8 rows.
  constexpr int kCycle = kRowsPerPass % 8 == 0 ? 1 : 8 / kRowsPerPass;
  static_assert(kRowsPerPass % 8 == 0 || 8 % kRowsPerPass == 0, "rows per pass must divide 8 or be a multiple");
  uint32_t dst0[kCycle];
#pragma unroll
  for (int j = 0; j < kCycle; ++j) dst0[j] = dst + swizzled_offset<Cfg::kRowBytes>(r0 + j * kRowsPerPass, unit);
#pragma unroll
  for (int i = 0; i < kUnits; ++i, src += step) {
    const int rows_ahead = kCycle == 1 ? i * kRowsPerPass : 8 * (i / kCycle);
    cp_async_16(dst0[i % kCycle] + rows_ahead * Cfg::kRowBytes, src, true);
  }
}

// Copy rows [row0, row0 + kRows) of a slice (row stride `seq_stride` elements, `seqlen` rows) into the tile at
// shared address `dst`, swizzled (smem.cuh). Rows at or past `seqlen` are zero-filled, and so are (paged) rows whose
// page id lies outside [0, num_pages): the sm90 producer's TMA reads such rows as zeros too.
// A dense tile wholly inside the sequence takes load_rows. A tail tile, and every tile of a paged cache, checks (and
// looks up) row by row; one loop for both kept the dense kernels' registers (a paged loop of its own in the main loop
// cost 2-3% on dense calls). The bounds-checked loop for every tile cost ~22 integer instructions per 16-byte copy,
// about a third of a d256 block's instructions (perf-notes v22).
template <class Cfg, int kRows>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint8_t* slice, int64_t seq_stride, int64_t row0,
                                          int64_t seqlen, bool is_paged = false, const PagedRows& paged = {}) {
  const int64_t row_bytes = seq_stride * Cfg::kElemBytes;
  if (!is_paged && row0 + kRows <= seqlen) {
    load_rows<Cfg, kRows>(dst, thread_source<Cfg>(slice, row0, row_bytes), row_bytes);
    return;
  }
  load_checked<Cfg, kRows>(dst, slice, row_bytes, row0, seqlen, is_paged, paged);
}

}  // namespace flashcore::sm80

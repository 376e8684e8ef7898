// Global -> shared loads with cp.async.cg (16 bytes per instruction, L1 bypassed). Every thread of the CTA copies
// its share of a tile in 16-byte units (TileCopy); rows past the end of the sequence are zero-filled (source size 0)
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

// How a tile's rows split over the CTA: T = Cfg::kCopyThreadsPerRow threads per row, thread c of a row copying its
// logical units c, c + T, c + 2T, ... (kColUnits of them, 16 T bytes apart); a pass of the CTA's threads covers
// kRowsPerPass = threads / T rows, a multiple of 8, kPasses passes a tile. Because a pass is whole groups of 8 rows
// (a row's swizzle key repeats every 8 rows) and the swizzle (smem.cuh) only permutes a unit within its aligned group
// of kSwizzleUnits (8; 4 in the 12-unit rows of head dim 96), of which T is a multiple, every copy of a thread lands
// at one shared base plus a compile-time offset, and its source at one row pointer per pass plus a compile-time
// column offset. (One unit per thread and row, 32 threads a row at head dim 256, took a 64-bit address per copy, ~3
// integer instructions each: docs/decisions.md#sm80-copies.)
// kRowBytes: the tile's row (Q and K: Cfg::kRowBytes; V: Cfg::kVRowBytes, which differs with a V head dim of its own).
template <class Cfg, int kRows, int kRowBytes = Cfg::kRowBytes>
struct TileCopy {
  static constexpr int kThreadsPerRow = Cfg::kCopyThreadsPerRow;
  static constexpr int kColUnits = kRowBytes / 16 / kThreadsPerRow;
  static constexpr int kRowsPerPass = Cfg::kThreads / kThreadsPerRow;
  static constexpr int kPasses = kRows / kRowsPerPass;
  static_assert(kRowBytes / 16 % kThreadsPerRow == 0 && kThreadsPerRow % kSwizzleUnits<kRowBytes> == 0 &&
                    kRowsPerPass % 8 == 0 && kPasses * kRowsPerPass == kRows,
                "the tile must split into whole passes of whole 8-row groups, each thread's units of a row whole "
                "swizzle groups apart");
};

// This thread's row within a pass and its first logical unit of a row.
template <class Cfg>
__device__ __forceinline__ int thread_pass_row() {
  return static_cast<int>(threadIdx.x) / Cfg::kCopyThreadsPerRow;
}
template <class Cfg>
__device__ __forceinline__ int thread_unit() {
  return static_cast<int>(threadIdx.x) % Cfg::kCopyThreadsPerRow;
}

// This thread's first source unit of the tile whose row 0 is row `row0` of `slice` (rows of `row_bytes`).
template <class Cfg>
__device__ __forceinline__ const uint8_t* thread_source(const uint8_t* slice, int64_t row0, int64_t row_bytes) {
  return slice + thread_unit<Cfg>() * 16 + (row0 + thread_pass_row<Cfg>()) * row_bytes;
}

// The shared address of this thread's first copy of the tile at `dst`; copy (pass i, column group g) is at
// + i * kRowsPerPass * kRowBytes + g * 16 * kCopyThreadsPerRow.
template <class Cfg, int kRowBytes = Cfg::kRowBytes>
__device__ __forceinline__ uint32_t thread_dest(uint32_t dst) {
  return dst + swizzled_offset<kRowBytes>(thread_pass_row<Cfg>(), thread_unit<Cfg>());
}

// The checked path of load_tile (also the main loop's K/V tail and paged tiles).
template <class Cfg, int kRows, int kRowBytes = Cfg::kRowBytes>
__device__ __forceinline__ void load_checked(uint32_t dst, const uint8_t* slice, int64_t row_bytes, int64_t row0,
                                             int64_t seqlen, bool is_paged, const PagedRows& paged) {
  using Copy = TileCopy<Cfg, kRows, kRowBytes>;
  constexpr int kColBytes = 16 * Copy::kThreadsPerRow;
  const int r0 = thread_pass_row<Cfg>();
  slice += thread_unit<Cfg>() * 16;
  dst = thread_dest<Cfg, kRowBytes>(dst);
  // Not unrolled: unrolled, the compiler keeps every pass's 64-bit source offset in registers across the main loop,
  // which made the 32-rows-per-warp configs spill.
#pragma unroll 1
  for (int i = 0; i < Copy::kPasses; ++i) {
    const int64_t row = row0 + r0 + i * Copy::kRowsPerPass;
    bool valid = row < seqlen;
    int64_t offset = row * row_bytes;
    if (is_paged) {  // keys past the sequence's count may have garbage table entries: not read
      const int key = static_cast<int>(row);
      const int32_t page = valid ? __ldg(paged.table + kernels::page_entry(*paged.p, key)) : -1;
      valid = page >= 0 && page < paged.p->num_pages;
      offset = page * paged.page_bytes + kernels::row_in_page(*paged.p, key) * row_bytes;
    }
    // An out-of-range row reads nothing, but its source address must still be a valid one: row 0.
    const uint8_t* src = slice + (valid ? offset : 0);
    const uint32_t d = dst + i * Copy::kRowsPerPass * kRowBytes;
#pragma unroll
    for (int g = 0; g < Copy::kColUnits; ++g) {
      cp_async_16(d + kColBytes * g, src + kColBytes * g, valid);
    }
  }
}

// The dense path: kRows rows wholly inside the sequence, from `src` (thread_source of the tile's row 0), in passes
// of whole 8-row groups: pass i reads one row pointer, src + i x (a pass's rows), and every shared and column offset
// is a compile-time constant. The main loop keeps `src` of the next K and V tile in a register pair stepped by one
// tile per load (mainloop.cuh, k_next and v_next).
template <class Cfg, int kRows, int kRowBytes = Cfg::kRowBytes>
__device__ __forceinline__ void load_rows(uint32_t dst, const uint8_t* src, int64_t row_bytes) {
  using Copy = TileCopy<Cfg, kRows, kRowBytes>;
  constexpr int kColBytes = 16 * Copy::kThreadsPerRow;
  dst = thread_dest<Cfg, kRowBytes>(dst);
#pragma unroll
  for (int i = 0; i < Copy::kPasses; ++i) {
    const uint32_t d = dst + i * Copy::kRowsPerPass * kRowBytes;
    const uint8_t* row = src + i * Copy::kRowsPerPass * row_bytes;
#pragma unroll
    for (int g = 0; g < Copy::kColUnits; ++g) cp_async_16(d + kColBytes * g, row + kColBytes * g, true);
  }
}

// Copy rows [row0, row0 + kRows) of a slice (row stride `seq_stride` elements, `seqlen` rows) into the tile at
// shared address `dst`, swizzled (smem.cuh). Rows at or past `seqlen` are zero-filled, and so are (paged) rows whose
// page id lies outside [0, num_pages): the sm90 producer's TMA reads such rows as zeros too.
// A dense tile wholly inside the sequence takes load_rows. A tail tile, and every tile of a paged cache, checks (and
// looks up) row by row; one loop for both kept the dense kernels' registers (a paged loop of its own in the main loop
// cost 2-3% on dense calls). The bounds-checked loop for every tile cost ~22 integer instructions per 16-byte copy,
// about a third of a d256 block's instructions (docs/decisions.md#sm80-copies).
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

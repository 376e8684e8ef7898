// Shared-memory tile layout: a tile is rows of kRowBytes bytes (kHeadDim 16-bit elements), each row a sequence
// of 16-byte units; unit u of row r is stored at unit position u ^ (r % 8). ldmatrix reads 8 consecutive rows
// (r % 8 = 0..7) at one logical unit per 8x8 matrix, and cp.async / the epilogue write 8 units of one row per
// 8 lanes: either way the 8 accesses of 16 bytes land in 8 distinct 16-byte bank groups (rows are a multiple
// of 128 bytes long), i.e. all 32 banks once, without conflicts.
#pragma once
#include <cstdint>

namespace flashcore::sm80 {

// Byte offset of logical 16-byte unit `unit` of row `row` (row relative to the tile's first row).
template <int kRowBytes>
__device__ __forceinline__ uint32_t swizzled_offset(int row, int unit) {
  static_assert(kRowBytes % 128 == 0, "rows must hold a multiple of 8 units of 16 bytes");
  return static_cast<uint32_t>(row * kRowBytes + ((unit ^ (row & 7)) << 4));
}

}  // namespace flashcore::sm80

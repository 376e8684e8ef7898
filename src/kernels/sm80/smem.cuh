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
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int row, int unit) {
  static_assert(kRowBytes % 128 == 0, "rows must hold a multiple of 8 units of 16 bytes");
  return static_cast<uint32_t>(row * kRowBytes + ((unit ^ (row & 7)) << 4));
}

// The same offset in the form the ldmatrix loops use. Every ldmatrix lane reads a row with row % 8 == lane % 8 and
// unit u2 + c, where u2 is even and known at compile time (2 x k-step) and c (0 or 1) is a bit of the lane id. Then
// (u2 + c) ^ r == u2 ^ (r ^ c), so with the lane's constant key = ((row % 8) ^ c) << 4 the offset is
//   row * kRowBytes + (u2 & ~7) * 16 + (key ^ (u2 & 7) * 16):
// the lane-dependent part is computed once per GEMM, the rest is compile-time constants. (Register use measured the
// same as with swizzled_offset; speed was not compared on its own: docs/decisions.md#sm80-registers.)
__host__ __device__ __forceinline__ uint32_t lane_swizzle_key(int row, int c) {
  return static_cast<uint32_t>(((row & 7) ^ c) << 4);
}

template <int kRowBytes>
__host__ __device__ __forceinline__ uint32_t swizzled_offset_even(uint32_t row_bytes, uint32_t key, int u2) {
  return row_bytes + static_cast<uint32_t>((u2 & ~7) << 4) + (key ^ static_cast<uint32_t>((u2 & 7) << 4));
}

}  // namespace flashcore::sm80

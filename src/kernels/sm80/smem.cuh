// Shared-memory tile layout: a tile is rows of kRowBytes bytes (kHeadDim 16-bit elements), each row a sequence
// of 16-byte units, stored permuted within the row: unit u of row r is at unit position u ^ key(r). Shared memory
// has 32 banks of 4 bytes, so a 16-byte access covers the 4 banks of one bank group, (byte address / 16) % 8, and 8
// accesses of 16 bytes (one phase of a warp's 16-byte accesses, as this layout models them: ldmatrix reads each 8x8
// matrix's 8 row addresses in one; LDS/STS.128 and cp.async a quarter warp, 8 consecutive lanes, at a time) are free
// of conflicts when their 8 bank groups are distinct. The accesses are of two shapes: ldmatrix (and the epilogue's 4-byte staging
// stores) read 8 consecutive rows r0..r0+7 (r0 % 8 == 0) at one logical unit; the cp.async copies and the epilogue's
// copy out of the staged rows touch 8 units of consecutive rows at once.
//
// Rows of a multiple of 128 bytes (head dims 64, 128, 192, 256; 8 units or more): key(r) = r % 8, an XOR of the
// unit's low 3 bits. A row starts on a bank-group boundary, so unit position p of any row is in bank group p % 8:
// 8 rows at one unit land in 8 distinct groups, and 8 consecutive units of one row (an aligned group of 8, as the
// copies take them) are a permutation of those 8 positions.
//
// Rows of 192 bytes (head dim 96: 12 units, kRowBytes == 192): key(r) = (r / 2) % 4, an XOR of the unit's low 2
// bits, so a unit stays in its aligned group of 4 (rows hold 3 such groups). Row r starts at byte 192 r, i.e. half
// a bank row (4 groups) further on for every odd row: unit position p of row r is in bank group (p + 4 (r % 2)) % 8.
// With u = 4 a + b (b < 4) the position is 4 a + (b ^ key(r)) and the group 4 ((a + r) % 2) + (b ^ key(r)):
//   - 8 rows r0..r0+7 at one unit u: (r % 2, key(r)) runs over all 8 pairs (0,0) (1,0) (0,1) (1,1) .. (1,3), so
//     b ^ key takes its 4 values, each in both halves: 8 distinct groups (ldmatrix, staging stores);
//   - the copies (loads.cuh: 4 threads per row, thread c copying units c, c + 4, c + 8): a quarter warp is rows 2j
//     and 2j + 1, which share their key, at units 4 g + c, c = 0..3: b ^ key runs over 0..3 in each row and the two
//     rows sit in opposite halves: 8 distinct groups;
//   - the epilogue's copy out (32 consecutive units of the warp's rows in row-major order, a quarter warp taking
//     8 of them from a multiple of 8): two aligned groups of 4 units (12 is a multiple of 4, so none straddles a
//     row), which the XOR maps onto themselves, i.e. 8 consecutive 16-byte units of the tile: 8 distinct groups.
// (These rows need no more than the old layout: tiles start at multiples of 128 bytes, and key(r) repeats every 8
// rows, which the copies' passes of whole 8-row groups rely on. tests/cpu/test_sm80_swizzle96.cpp enumerates all
// of the above.)
#pragma once
#include <cstdint>

namespace flashcore::sm80 {

// Units a row's key permutes among: a unit stays in its aligned group of kSwizzleUnits (8, or 4 in 192-byte rows).
template <int kRowBytes>
inline constexpr int kSwizzleUnits = kRowBytes % 128 == 0 ? 8 : 4;

// key(row) of the layout above (row relative to the tile's first row).
template <int kRowBytes>
__host__ __device__ __forceinline__ int swizzle_key(int row) {
  static_assert(kRowBytes % 128 == 0 || kRowBytes == 192,
                "rows must hold a multiple of 8 units of 16 bytes, or 12 (head dim 96)");
  if constexpr (kRowBytes % 128 == 0) {
    return row & 7;
  } else {
    return (row >> 1) & 3;
  }
}

// Byte offset of logical 16-byte unit `unit` of row `row` (row relative to the tile's first row).
template <int kRowBytes>
__host__ __device__ __forceinline__ uint32_t swizzled_offset(int row, int unit) {
  return static_cast<uint32_t>(row * kRowBytes + ((unit ^ swizzle_key<kRowBytes>(row)) << 4));
}

// The same offset in the form the ldmatrix loops use. Every ldmatrix lane reads a row whose key depends on the lane
// only (its row % 8 is fixed by the lane) and unit u2 + c, where u2 is even and known at compile time (2 x k-step)
// and c (0 or 1) is a bit of the lane id. u2 + c == u2 ^ c, so (u2 + c) ^ key(row) == u2 ^ (key(row) ^ c); with the
// lane's constant key = (key(row) ^ c) << 4, below 16 x kSwizzleUnits, and W = kSwizzleUnits the offset is
//   row * kRowBytes + (u2 & ~(W - 1)) * 16 + (key ^ (u2 & (W - 1)) * 16):
// the lane-dependent part is computed once per GEMM, the rest is compile-time constants. (Register use measured the
// same as with swizzled_offset; speed was not compared on its own: docs/decisions.md#sm80-registers.)
template <int kRowBytes>
__host__ __device__ __forceinline__ uint32_t lane_swizzle_key(int row, int c) {
  return static_cast<uint32_t>((swizzle_key<kRowBytes>(row) ^ c) << 4);
}

// The key of rows of a multiple of 128 bytes (the backward's tiles, bwd_gemm.cuh, which only has such rows).
__host__ __device__ __forceinline__ uint32_t lane_swizzle_key(int row, int c) { return lane_swizzle_key<128>(row, c); }

template <int kRowBytes>
__host__ __device__ __forceinline__ uint32_t swizzled_offset_even(uint32_t row_bytes, uint32_t key, int u2) {
  constexpr int kLow = kSwizzleUnits<kRowBytes> - 1;
  return row_bytes + static_cast<uint32_t>((u2 & ~kLow) << 4) + (key ^ static_cast<uint32_t>((u2 & kLow) << 4));
}

}  // namespace flashcore::sm80

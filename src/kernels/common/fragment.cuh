// The row-pair accumulator fragment shared by Hopper's wgmma (m64nN, per warp: 16 rows) and Ampere's
// mma.sync m16n8: a thread holds rows lane/4 and lane/4 + 8 of its warp's 16, and two adjacent columns of
// each group of 8. Softmax and masking are written against this layout only.
#pragma once

namespace flashcore::kernels {

// Register index of (8-column group j, row half i, column pair e):
// element (row = lane/4 + 8*i, col = 8*j + 2*(lane%4) + e) is d[4*j + 2*i + e].
__host__ __device__ constexpr int acc_index(int j, int i, int e) { return 4 * j + 2 * i + e; }

// Column of register group j, element e, for this lane (relative to the tile's first column).
__device__ __forceinline__ int acc_col(int j, int e, int lane) { return 8 * j + 2 * (lane % 4) + e; }

}  // namespace flashcore::kernels

// The backward's GEMMs on mma.sync m16n8k16, a warp's 16 keys at a time (bwd_config.h). Every operand comes from a
// row-major shared tile (smem.cuh's swizzle), read by ldmatrix in one of three ways:
//   A, rows of the tile (K, V: the warp's keys x head dim)                       ldmatrix       (as the forward's Q)
//   B, n = rows of the tile, k = its columns (Q, dO in S^T = K Q^T, dP^T = V dO^T) ldmatrix     (the forward's K)
//   B, k = rows of the tile, n = its columns (dO, Q, K in dV, dK, dQ)            ldmatrix.trans (the forward's V)
// and dQ's A operand, dS (queries x keys), from the dS^T tile (rows = keys) by ldmatrix.trans.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"

namespace flashcore::sm80 {

using kernels::acc_index;

// acc (16 rows x kCols) = A (rows row0..row0+15 of a_tile) * B (kCols rows of b_tile)^T over the head dim: S^T
// (keys x queries) = K Q^T, and dP^T = V dO^T. ldmatrix x4 matrix m = lane / 8: A rows 8 (m % 2) + 0..7, unit
// 2 kk + m / 2 (mma.sync's a[0..3]); B rows 16 np + 8 (m / 2) + 0..7, unit 2 kk + m % 2 (b[0], b[1] of n-tiles 2 np and
// 2 np + 1). b_tile's first row is a multiple of 8 rows into its tile (the swizzle is that of the rows below it).
template <class Cfg, int kCols>
__device__ __forceinline__ void bwd_gemm_rows(float (&acc)[kCols / 2], uint32_t a_tile, uint32_t b_tile, int row0,
                                              int lane) {
  using Mma = Mma16816<typename Cfg::Element>;
#pragma unroll
  for (int i = 0; i < kCols / 2; ++i) acc[i] = 0.f;
  // The lanes' rows and swizzle keys (smem.cuh, swizzled_offset_even): the k-steps differ by constants only.
  const int a_row = row0 + (lane % 8) + 8 * ((lane / 8) % 2), b_row = 8 * (lane / 16) + (lane % 8);
  const uint32_t a_key = lane_swizzle_key(a_row, lane / 16), b_key = lane_swizzle_key(b_row, (lane / 8) % 2);
  a_tile += a_row * Cfg::kRowBytes;
  b_tile += b_row * Cfg::kRowBytes;
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, a_tile + swizzled_offset_even<Cfg::kRowBytes>(0, a_key, 2 * kk));
#pragma unroll
    for (int np = 0; np < kCols / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + swizzled_offset_even<Cfg::kRowBytes>(16 * np * Cfg::kRowBytes, b_key, 2 * kk));
      Mma::mma(&acc[acc_index(2 * np, 0, 0)], a, b[0], b[1]);
      Mma::mma(&acc[acc_index(2 * np + 1, 0, 0)], a, b[2], b[3]);
    }
  }
}

// acc (16 rows x kCols) += A (16 rows x 16 kSteps, A fragments in registers) * B (rows k0.. of b_tile x columns
// col0..col0+kCols-1), B by ldmatrix.trans: matrix m covers rows 8 (m % 2) + 0..7 of the k-step and unit
// 2 dp + m / 2 (b[0], b[1] of n-tiles 2 dp and 2 dp + 1). dV += P^T dO and dK += dS^T Q (kSteps: the queries of a
// sub-step, bwd_config.h kSubM; b_tile rows are queries).
template <int kRowBytes, int kCols, int kSteps, class Element>
__device__ __forceinline__ void bwd_gemm_acc(float (&acc)[kCols / 2], const uint32_t (&a)[kSteps][4], uint32_t b_tile,
                                             int col0, int lane) {
  using Mma = Mma16816<Element>;
  // col0: a multiple of kCols, at most 64 apart from the next multiple of 64 (whole chunks of dQ's columns), so its
  // units within their group of 8 fold into the lane's swizzle key without a carry.
  const int b_row = 8 * ((lane / 8) % 2) + (lane % 8);
  const uint32_t b_key = lane_swizzle_key(b_row, lane / 16) ^ static_cast<uint32_t>(((col0 / 8) & 7) << 4);
  b_tile += b_row * kRowBytes + (col0 / 64) * 128;
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + swizzled_offset_even<kRowBytes>(16 * t * kRowBytes, b_key, 2 * dp));
      Mma::mma(&acc[acc_index(2 * dp, 0, 0)], a[t], b[0], b[1]);
      Mma::mma(&acc[acc_index(2 * dp + 1, 0, 0)], a[t], b[2], b[3]);
    }
  }
}

// dQ's A fragments for row tile rt (queries 16 rt..) and k-step kk (keys 16 kk..), from dS^T (rows = keys) by
// ldmatrix.trans: matrix m covers keys 8 (m / 2) + 0..7 and the query unit 2 rt + m % 2, whose transposes are a[0]
// (queries 0..7, keys 0..7), a[1] (queries 8..15), a[2] (keys 8..15), a[3].
template <class Cfg>
__device__ __forceinline__ void bwd_ds_frag(uint32_t (&a)[4], uint32_t ds_tile, int rt, int kk, int lane) {
  const int row = 16 * kk + (lane % 8) + 8 * (lane / 16), unit = 2 * rt + (lane / 8) % 2;
  ldmatrix_x4_trans(a, ds_tile + swizzled_offset<Cfg::kDsRowBytes>(row, unit));
}

// dQ (16 queries of row tile rt x kDqChunk columns from col0) = dS (those queries x the kBlockN keys) K (keys x
// columns), K as B by ldmatrix.trans.
template <class Cfg>
__device__ __forceinline__ void bwd_gemm_dq(float (&acc)[Cfg::kDqChunk / 2], uint32_t ds_tile, uint32_t k_tile, int rt,
                                            int col0, int lane) {
#pragma unroll
  for (int i = 0; i < Cfg::kDqChunk / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    uint32_t a[1][4];
    bwd_ds_frag<Cfg>(a[0], ds_tile, rt, kk, lane);
    bwd_gemm_acc<Cfg::kRowBytes, Cfg::kDqChunk, 1, typename Cfg::Element>(
        acc, a, k_tile + 16 * kk * Cfg::kRowBytes, col0, lane);
  }
}

// The query-rows kernels' GEMMs (bwd_mainloop_rows.cuh: queries as the rows of S and dP, P and dS through shared
// memory, FlashAttention-2's order). Each warp computes kMTiles row tiles at once, so that every B fragment read
// from shared memory feeds kMTiles mma.sync instead of one.

// acc[mt] (rows a_row0 + 16 mt.. of a_tile x kCols rows from b_row0 of b_tile) = A B^T over the head dim: S = Q K^T
// and dP = dO V^T (queries x keys). Fragments as in bwd_gemm_rows; a_row0 and b_row0 are multiples of 8.
template <class Cfg, int kMTiles, int kCols>
__device__ __forceinline__ void bwd_gemm_abt(float (&acc)[kMTiles][kCols / 2], uint32_t a_tile, int a_row0,
                                             uint32_t b_tile, int b_row0, int lane) {
  using Mma = Mma16816<typename Cfg::Element>;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) acc[mt][i] = 0.f;
  }
  const int a_row = a_row0 + (lane % 8) + 8 * ((lane / 8) % 2), b_row = b_row0 + 8 * (lane / 16) + (lane % 8);
  const uint32_t a_key = lane_swizzle_key(a_row, lane / 16), b_key = lane_swizzle_key(b_row, (lane / 8) % 2);
  a_tile += a_row * Cfg::kRowBytes;
  b_tile += b_row * Cfg::kRowBytes;
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      ldmatrix_x4(a[mt], a_tile + swizzled_offset_even<Cfg::kRowBytes>(16 * mt * Cfg::kRowBytes, a_key, 2 * kk));
    }
#pragma unroll
    for (int np = 0; np < kCols / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, b_tile + swizzled_offset_even<Cfg::kRowBytes>(16 * np * Cfg::kRowBytes, b_key, 2 * kk));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        Mma::mma(&acc[mt][acc_index(2 * np, 0, 0)], a[mt], b[0], b[1]);
        Mma::mma(&acc[mt][acc_index(2 * np + 1, 0, 0)], a[mt], b[2], b[3]);
      }
    }
  }
}

// acc[mt] (kMTiles x 16 rows from a0 x kCols columns from col0) += A B over kSteps k-steps of 16, both operands from
// shared memory: A from a_tile (rows of kARowBytes), either transposed (kATrans: A's rows are the tile's columns a0..,
// its k the tile's rows: P^T and dS^T from the P and dS tiles, queries x keys) or not (dS as dQ's A: rows a0.., k the
// columns); B from b_tile, k = its rows, n = its columns, by ldmatrix.trans as in bwd_gemm_acc (dO, Q, K). a0 is a
// multiple of 16.
template <class Element, int kARowBytes, bool kATrans, int kBRowBytes, int kMTiles, int kCols, int kSteps>
__device__ __forceinline__ void bwd_gemm_smem(float (&acc)[kMTiles][kCols / 2], uint32_t a_tile, int a0,
                                              uint32_t b_tile, int col0, int lane) {
  using Mma = Mma16816<Element>;
  // A: ldmatrix matrix m = lane / 8. Transposed: tile rows (k) 8 (m / 2) + 0..7 at unit a0 / 8 + 2 mt + m % 2, whose
  // transposes are a[0] (A rows 0..7, k 0..7), a[1] (rows 8..15), a[2] (k 8..15), a[3]. Not: as bwd_gemm_rows's A.
  const int a_row = kATrans ? (lane % 8) + 8 * (lane / 16) : a0 + (lane % 8) + 8 * ((lane / 8) % 2);
  const uint32_t a_key = lane_swizzle_key(a_row, kATrans ? (lane / 8) % 2 : lane / 16);
  a_tile += a_row * kARowBytes;
  const int b_row = 8 * ((lane / 8) % 2) + (lane % 8);
  const uint32_t b_key = lane_swizzle_key(b_row, lane / 16) ^ static_cast<uint32_t>(((col0 / 8) & 7) << 4);
  b_tile += b_row * kBRowBytes + (col0 / 64) * 128;
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    uint32_t a[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      if constexpr (kATrans) {
        ldmatrix_x4_trans(a[mt], a_tile + swizzled_offset_even<kARowBytes>(16 * t * kARowBytes, a_key, a0 / 8 + 2 * mt));
      } else {
        ldmatrix_x4(a[mt], a_tile + swizzled_offset_even<kARowBytes>(16 * mt * kARowBytes, a_key, 2 * t));
      }
    }
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, b_tile + swizzled_offset_even<kBRowBytes>(16 * t * kBRowBytes, b_key, 2 * dp));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        Mma::mma(&acc[mt][acc_index(2 * dp, 0, 0)], a[mt], b[0], b[1]);
        Mma::mma(&acc[mt][acc_index(2 * dp + 1, 0, 0)], a[mt], b[2], b[3]);
      }
    }
  }
}

}  // namespace flashcore::sm80

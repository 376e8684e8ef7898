// The main loop's two GEMMs on mma.sync m16n8k16 (a warp's kMTiles row tiles of 16 share every K and V fragment it
// loads): S = Q K^T with Q from registers or shared memory and K by ldmatrix, P converted in registers to A
// fragments, O += P V with V by ldmatrix.trans; whole, one k-step at a time, or the two interleaved (gemm_pv_qk, the
// 3-stage rows). Addresses follow the swizzle of smem.cuh.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/sm80/config.h"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"

namespace flashcore::sm80 {

using kernels::acc_index;

// First row (within the CTA's tile) of the warp's row tile t (split tiles: both warps of a pair own the same rows).
template <class Cfg>
__device__ __forceinline__ int tile_row0(int warp, int t) {
  return warp / Cfg::kSplit * Cfg::kRowsPerWarp + 16 * t;
}

// Which half of its pair the warp is (split tiles: its keys of S and columns of O); 0 without split.
template <class Cfg>
__device__ __forceinline__ int warp_half(int warp) {
  return Cfg::kSplit == 2 ? warp & 1 : 0;
}

// ldmatrix x4 of the A fragment (16 rows x 16 columns, k-step kk) of 16 Q rows from `row_base`: matrix m = lane / 8
// covers rows 8 * (m % 2) .. +7 and the 16-byte unit 2 * kk + m / 2, which is a[0..3] of mma.sync's A layout.
template <class Cfg>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], uint32_t q_tile, int row_base, int lane, int kk) {
  const int m = lane / 8;
  const int row = row_base + (lane % 8) + 8 * (m % 2);
  const uint32_t key = lane_swizzle_key<Cfg::kRowBytes>(row, m / 2);
  ldmatrix_x4(a, q_tile + swizzled_offset_even<Cfg::kRowBytes>(row * Cfg::kRowBytes, key, 2 * kk));
}

// The warp's Q operand: every (row tile, k-step) A fragment in registers (kQInRegs), or read from the Q tile when
// used.
template <class Cfg, bool kInRegs = Cfg::kQInRegs>
struct QOperand;

template <class Cfg>
struct QOperand<Cfg, true> {
  uint32_t a[Cfg::kMTiles][Cfg::kHeadDim / 16][4];
  __device__ __forceinline__ void load(uint32_t q_tile, int warp, int lane) {
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
      for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
        load_q_frag<Cfg>(a[t][kk], q_tile, tile_row0<Cfg>(warp, t), lane, kk);
      }
    }
  }
  __device__ __forceinline__ void frag(uint32_t (&out)[4], int t, int kk) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = a[t][kk][i];
  }
};

template <class Cfg>
struct QOperand<Cfg, false> {
  uint32_t q_tile;
  int warp, lane;
  __device__ __forceinline__ void load(uint32_t tile, int w, int l) { q_tile = tile, warp = w, lane = l; }
  __device__ __forceinline__ void frag(uint32_t (&out)[4], int t, int kk) const {
    load_q_frag<Cfg>(out, q_tile, tile_row0<Cfg>(warp, t), lane, kk);
  }
};

// S_t(16 x kWarpKeys) = Q_t(16 x D) K_tile(kWarpKeys x D)^T for every row tile t, sharing each K fragment (k_tile:
// the warp's first key row; split tiles: its half of the block). K rows are the
// n dimension: one ldmatrix x4 (not transposed) gives the B fragments of two n8 tiles for one k-step: matrix m covers
// keys 16 * np + 8 * (m / 2) .. +7 and unit 2 * kk + m % 2, i.e. b[0], b[1] of tile 2 np and b[0], b[1] of tile
// 2 np + 1.
//
// The lane's K row (+ 16 np) and swizzle key in gemm_qk's ldmatrix (kRowBytes: K's rows; 16 np rows further the key
// is the same: it repeats every 8 rows).
template <int kRowBytes>
struct KLane {
  int row;
  uint32_t key;
  __device__ __forceinline__ explicit KLane(int lane)
      : row(8 * (lane / 16) + (lane % 8)), key(lane_swizzle_key<kRowBytes>(row, (lane / 8) % 2)) {}
};

// One k-step (head-dim columns 16 kk ..) of S.
template <class Cfg>
__device__ __forceinline__ void gemm_qk_step(float (&s)[Cfg::kMTiles][Cfg::kWarpKeys / 2], const QOperand<Cfg>& q,
                                             uint32_t k_tile, const KLane<Cfg::kRowBytes>& kl, int kk) {
  using Mma = Mma16816<typename Cfg::Element>;
  const int row = kl.row;
  const uint32_t key = kl.key;
  uint32_t a[Cfg::kMTiles][4];
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) q.frag(a[t], t, kk);
#pragma unroll
  for (int np = 0; np < Cfg::kWarpKeys / 16; ++np) {
    uint32_t b[4];
    ldmatrix_x4(b, k_tile + swizzled_offset_even<Cfg::kRowBytes>((16 * np + row) * Cfg::kRowBytes, key, 2 * kk));
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) {
      Mma::mma(&s[t][acc_index(2 * np, 0, 0)], a[t], b[0], b[1]);
      Mma::mma(&s[t][acc_index(2 * np + 1, 0, 0)], a[t], b[2], b[3]);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void zero_scores(float (&s)[Cfg::kMTiles][Cfg::kWarpKeys / 2]) {
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
    for (int i = 0; i < Cfg::kWarpKeys / 2; ++i) s[t][i] = 0.f;
  }
}

template <class Cfg>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kMTiles][Cfg::kWarpKeys / 2], const QOperand<Cfg>& q,
                                        uint32_t k_tile, int lane) {
  zero_scores<Cfg>(s);
  const KLane<Cfg::kRowBytes> kl(lane);
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) gemm_qk_step<Cfg>(s, q, k_tile, kl, kk);
}

// P(16 x kWarpKeys) as A fragments: the m16n8 C layout of two adjacent tiles is the m16k16 A layout
// (kernels::pack_p_fragments).
template <class Cfg>
__device__ __forceinline__ void convert_p(const float (&p)[Cfg::kWarpKeys / 2], uint32_t (&a)[Cfg::kWarpKeys / 16][4]) {
  kernels::pack_p_fragments<typename Cfg::Element, Cfg::kWarpKeys>(p, a);
}

// O_t(16 x kWarpDim) += P_t(16 x kWarpKeys) V(kWarpKeys x kWarpDim) for every row tile t (v_tile: the first key row
// and column of the V part; split tiles call it for each half's P). V rows are keys (the k dimension) and
// its columns the n dimension, so B comes from ldmatrix.trans: matrix m covers keys 16 * kk + 8 * (m % 2) .. +7 and
// unit 2 * dp + m / 2, i.e. b[0], b[1] of dim tile 2 dp and b[0], b[1] of dim tile 2 dp + 1.
//
// The lane's V row (+ 16 kk) and swizzle key in gemm_pv's ldmatrix.trans (kRowBytes: V's rows).
template <int kRowBytes>
struct VLane {
  int row;
  uint32_t key;
  __device__ __forceinline__ explicit VLane(int lane)
      : row(8 * ((lane / 8) % 2) + (lane % 8)), key(lane_swizzle_key<kRowBytes>(row, lane / 16)) {}
};

template <class Cfg>
__device__ __forceinline__ void gemm_pv_step(float (&o)[Cfg::kMTiles][Cfg::kWarpDim / 2],
                                             const uint32_t (&a)[Cfg::kMTiles][4], uint32_t v_tile,
                                             const VLane<Cfg::kVRowBytes>& vl, int kk) {
  using Mma = Mma16816<typename Cfg::Element>;
  const int row = vl.row;
  const uint32_t key = vl.key;
#pragma unroll
  for (int dp = 0; dp < Cfg::kWarpDim / 16; ++dp) {
    uint32_t b[4];
    const uint32_t offset = swizzled_offset_even<Cfg::kVRowBytes>((16 * kk + row) * Cfg::kVRowBytes, key, 2 * dp);
    ldmatrix_x4_trans(b, v_tile + offset);
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) {
      Mma::mma(&o[t][acc_index(2 * dp, 0, 0)], a[t], b[0], b[1]);
      Mma::mma(&o[t][acc_index(2 * dp + 1, 0, 0)], a[t], b[2], b[3]);
    }
  }
}

// The A fragments of k-step kk of every row tile, from P in registers.
template <class Cfg>
__device__ __forceinline__ void p_step(uint32_t (&a)[Cfg::kMTiles][4],
                                       const uint32_t (&pa)[Cfg::kMTiles][Cfg::kWarpKeys / 16][4], int kk) {
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) a[t][i] = pa[t][kk][i];
  }
}

// O += P V over kWarpKeys keys; p_frags(kk, a) gives k-step kk's A fragments (from registers, or for a split tile's
// partner half from shared memory, one k-step at a time).
template <class Cfg, class PFrags>
__device__ __forceinline__ void gemm_pv_frags(float (&o)[Cfg::kMTiles][Cfg::kWarpDim / 2], const PFrags& p_frags,
                                              uint32_t v_tile, int lane) {
  const VLane<Cfg::kVRowBytes> vl(lane);
#pragma unroll
  for (int kk = 0; kk < Cfg::kWarpKeys / 16; ++kk) {
    uint32_t a[Cfg::kMTiles][4];
    p_frags(kk, a);
    gemm_pv_step<Cfg>(o, a, v_tile, vl, kk);
  }
}

template <class Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kMTiles][Cfg::kWarpDim / 2],
                                        const uint32_t (&pa)[Cfg::kMTiles][Cfg::kWarpKeys / 16][4], uint32_t v_tile,
                                        int lane) {
  gemm_pv_frags<Cfg>(o, [&](int kk, uint32_t(&a)[Cfg::kMTiles][4]) { p_step<Cfg>(a, pa, kk); }, v_tile, lane);
}

// O += P_j V_j and S_{j-1} = Q K_{j-1}^T, k-steps alternating: an accumulator's next mma.sync comes twice as many
// instructions after its last as in either GEMM alone (16 -> 32 at head dim 64), which the GEMMs one after the other
// spent waiting on the mma latency (Nsight Compute: "wait" stalls at HMMA; docs/decisions.md#sm80-overlap).
template <class Cfg>
__device__ __forceinline__ void gemm_pv_qk(float (&o)[Cfg::kMTiles][Cfg::kWarpDim / 2],
                                           const uint32_t (&pa)[Cfg::kMTiles][Cfg::kWarpKeys / 16][4], uint32_t v_tile,
                                           float (&s)[Cfg::kMTiles][Cfg::kWarpKeys / 2], const QOperand<Cfg>& q,
                                           uint32_t k_tile, int lane) {
  constexpr int kPvSteps = Cfg::kBlockN / 16, kQkSteps = Cfg::kHeadDim / 16;
  zero_scores<Cfg>(s);
  const KLane<Cfg::kRowBytes> kl(lane);
  const VLane<Cfg::kVRowBytes> vl(lane);
#pragma unroll
  for (int i = 0; i < (kPvSteps > kQkSteps ? kPvSteps : kQkSteps); ++i) {
    if (i < kPvSteps) {
      uint32_t a[Cfg::kMTiles][4];
      p_step<Cfg>(a, pa, i);
      gemm_pv_step<Cfg>(o, a, v_tile, vl, i);
    }
    if (i < kQkSteps) gemm_qk_step<Cfg>(s, q, k_tile, kl, i);
  }
}

}  // namespace flashcore::sm80

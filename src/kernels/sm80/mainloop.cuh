// The main loop (FlashAttention-2 structure): each warp owns 16 query rows of the CTA's Q tile. Per key block,
// last to first: S = Q K^T with mma.sync m16n8k16 (Q from registers or shared memory, K by ldmatrix), masking
// where the block needs it, the online softmax of kernels/common in registers, then O += P V with P converted
// in registers to A fragments and V by ldmatrix.trans. K/V tiles arrive through a kStages-deep cp.async ring.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/mask.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/sm80/config.h"
#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/loads.cuh"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"
#include "kernels/sm80/tile.cuh"

namespace flashcore::sm80 {

using kernels::acc_index;

// What a warp carries from the main loop into the epilogue.
template <class Cfg>
struct WarpState {
  float o[Cfg::kHeadDim / 2];  // 16 x head_dim fp32 accumulator: kHeadDim / 8 tiles of m16n8 (fragment.cuh)
  kernels::OnlineSoftmax<Cfg::kBlockN> softmax;
};

// ldmatrix x4 of the A fragment (16 rows x 16 columns, k-step kk) of the warp's 16 Q rows: matrix m = lane / 8
// covers rows 8 * (m % 2) .. +7 and the 16-byte unit 2 * kk + m / 2, which is a[0..3] of mma.sync's A layout.
template <class Cfg>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], uint32_t q_tile, int warp, int lane, int kk) {
  const int m = lane / 8;
  const int row = warp * 16 + (lane % 8) + 8 * (m % 2);
  ldmatrix_x4(a, q_tile + swizzled_offset<Cfg::kRowBytes>(row, 2 * kk + m / 2));
}

// The warp's Q operand: every k-step's A fragment in registers (kQInRegs), or read from the Q tile when used.
template <class Cfg, bool kInRegs = Cfg::kQInRegs>
struct QOperand;

template <class Cfg>
struct QOperand<Cfg, true> {
  uint32_t a[Cfg::kHeadDim / 16][4];
  __device__ __forceinline__ void load(uint32_t q_tile, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) load_q_frag<Cfg>(a[kk], q_tile, warp, lane, kk);
  }
  __device__ __forceinline__ void frag(uint32_t (&out)[4], int kk) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = a[kk][i];
  }
};

template <class Cfg>
struct QOperand<Cfg, false> {
  uint32_t q_tile;
  int warp, lane;
  __device__ __forceinline__ void load(uint32_t tile, int w, int l) { q_tile = tile, warp = w, lane = l; }
  __device__ __forceinline__ void frag(uint32_t (&out)[4], int kk) const {
    load_q_frag<Cfg>(out, q_tile, warp, lane, kk);
  }
};

// S(16 x kBlockN) = Q_warp(16 x D) K_tile(kBlockN x D)^T. K rows are the n dimension: one ldmatrix x4 (not
// transposed) gives the B fragments of two n8 tiles for one k-step: matrix m covers keys 16 * np + 8 * (m / 2)
// .. +7 and unit 2 * kk + m % 2, i.e. b[0], b[1] of tile 2 np and b[0], b[1] of tile 2 np + 1.
template <class Cfg>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kBlockN / 2], const QOperand<Cfg>& q, uint32_t k_tile,
                                        int lane) {
  using Mma = Mma16816<typename Cfg::Element>;
#pragma unroll
  for (int i = 0; i < Cfg::kBlockN / 2; ++i) s[i] = 0.f;
  const int m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
    uint32_t a[4];
    q.frag(a, kk);
#pragma unroll
    for (int np = 0; np < Cfg::kBlockN / 16; ++np) {
      uint32_t b[4];
      const int row = 16 * np + 8 * (m / 2) + (lane % 8);
      ldmatrix_x4(b, k_tile + swizzled_offset<Cfg::kRowBytes>(row, 2 * kk + m % 2));
      Mma::mma(&s[acc_index(2 * np, 0, 0)], a, b[0], b[1]);
      Mma::mma(&s[acc_index(2 * np + 1, 0, 0)], a, b[2], b[3]);
    }
  }
}

// P(16 x kBlockN) as A fragments: the m16n8 C layout of two adjacent tiles is the m16k16 A layout
// (kernels::pack_p_fragments).
template <class Cfg>
__device__ __forceinline__ void convert_p(const float (&p)[Cfg::kBlockN / 2], uint32_t (&a)[Cfg::kBlockN / 16][4]) {
  kernels::pack_p_fragments<typename Cfg::Element, Cfg::kBlockN>(p, a);
}

// O(16 x D) += P(16 x kBlockN) V_tile(kBlockN x D). V rows are keys (the k dimension) and its columns the n
// dimension, so B comes from ldmatrix.trans: matrix m covers keys 16 * kk + 8 * (m % 2) .. +7 and unit
// 2 * dp + m / 2, i.e. b[0], b[1] of dim tile 2 dp and b[0], b[1] of dim tile 2 dp + 1.
template <class Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kHeadDim / 2], const uint32_t (&pa)[Cfg::kBlockN / 16][4],
                                        uint32_t v_tile, int lane) {
  using Mma = Mma16816<typename Cfg::Element>;
  const int m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < Cfg::kBlockN / 16; ++kk) {
    const int row = 16 * kk + 8 * (m % 2) + (lane % 8);
#pragma unroll
    for (int dp = 0; dp < Cfg::kHeadDim / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + swizzled_offset<Cfg::kRowBytes>(row, 2 * dp + m / 2));
      Mma::mma(&o[acc_index(2 * dp, 0, 0)], pa[kk], b[0], b[1]);
      Mma::mma(&o[acc_index(2 * dp + 1, 0, 0)], pa[kk], b[2], b[3]);
    }
  }
}

// The tile's main loop. Pipeline (per thread, cp.async groups in commit order):
//   group "Q", then one group per key block, the first kStages - 1 of them issued before the loop;
//   iteration i (key block keys.end - 1 - i, ring stage i % kStages): wait until its group has landed
//   (cp.async.wait_group kStages - 2), __syncthreads (every thread's copies visible; every warp is done with
//   iteration i - 1, whose stage is refilled next), issue the loads of the block kStages - 1 ahead into that
//   stage and commit (an empty group when there is none, so the counting stays uniform), then compute.
// Returns with no copy in flight; a tile without key blocks (rows that see no key) loads nothing.
template <class Cfg>
__device__ __forceinline__ void mainloop(const FwdParams& p, const Tile& tile, uint8_t* smem, WarpState<Cfg>& st) {
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) st.o[i] = 0.f;
  if (tile.keys.count() == 0) return;

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int kv_head = tile.head / p.head_ratio;
  const uint32_t smem_base = smem_addr(smem);
  const uint32_t q_tile = smem_base + Cfg::kSmemQOffset;
  auto k_tile = [&](int stage) { return smem_base + Cfg::kSmemKOffset + stage * Cfg::kKVTileBytes; };
  auto v_tile = [&](int stage) { return smem_base + Cfg::kSmemVOffset + stage * Cfg::kKVTileBytes; };

  const uint8_t* q_slice = slice_base<Cfg>(p.q, tile.batch, tile.head);
  const uint8_t* k_slice = slice_base<Cfg>(p.k, tile.batch, kv_head);
  const uint8_t* v_slice = slice_base<Cfg>(p.v, tile.batch, kv_head);
  const int64_t q_row0 = tile.seq.q_row0 + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM;
  const int64_t q_end = tile.seq.q_row0 + tile.seq.seqlen_q;
  const int64_t k_end = tile.seq.k_row0 + tile.seq.seqlen_k;
  auto load_kv = [&](int n_block, int stage) {
    const int64_t row0 = tile.seq.k_row0 + static_cast<int64_t>(n_block) * Cfg::kBlockN;
    load_tile<Cfg, Cfg::kBlockN>(k_tile(stage), k_slice, p.k.seq_stride, row0, k_end);
    load_tile<Cfg, Cfg::kBlockN>(v_tile(stage), v_slice, p.v.seq_stride, row0, k_end);
  };

  load_tile<Cfg, Cfg::kBlockM>(q_tile, q_slice, p.q.seq_stride, q_row0, q_end);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (tile.keys.end - 1 - s >= tile.keys.begin) load_kv(tile.keys.end - 1 - s, s);
    cp_async_commit();
  }

  // Q first: its group is the oldest, so waiting for all but the kStages - 1 newest leaves the K/V in flight.
  QOperand<Cfg> q;
  cp_async_wait<Cfg::kStages - 1>();
  __syncthreads();
  q.load(q_tile, warp, lane);

  // This thread's first row (its second is row0 + 8) and first column offset within a key block.
  const int64_t row0 = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + warp * 16 + lane / 4;
  float s[Cfg::kBlockN / 2];
  uint32_t pa[Cfg::kBlockN / 16][4];
  float rescale[2];
  int stage = 0;
  for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
    cp_async_wait<Cfg::kStages - 2>();
    __syncthreads();
    const int ahead = n_block - (Cfg::kStages - 1);
    if (ahead >= tile.keys.begin) load_kv(ahead, stage == 0 ? Cfg::kStages - 1 : stage - 1);
    cp_async_commit();

    gemm_qk<Cfg>(s, q, k_tile(stage), lane);
    if (kernels::block_needs_mask<Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal>(tile.seq, n_block, tile.m_block)) {
      kernels::apply_mask<Cfg::kBlockN, Cfg::kCausal>(
          s, tile.seq, row0, static_cast<int64_t>(n_block) * Cfg::kBlockN + 2 * (lane % 4));
    }
    st.softmax.update(s, p.scale_log2, rescale);
    kernels::rescale_rows<Cfg::kHeadDim>(st.o, rescale);
    convert_p<Cfg>(s, pa);
    gemm_pv<Cfg>(st.o, pa, v_tile(stage), lane);
    stage = stage == Cfg::kStages - 1 ? 0 : stage + 1;
  }
}

}  // namespace flashcore::sm80

// The query-rows main loop of the plain 128-key kernels (bwd_config.h kQueryRows; FlashAttention-2's order). Per step
// (kBlockM = 64 or 128 query rows of one query head of the KV group), with K and V resident in shared memory:
//   S  = Q K^T     P  = exp2(S * scale_log2 - lse_log2)   [masked: 0]        warps 2 x 4: kBlockM / 2 queries x 32 keys
//   dP = dO V^T    dS = P (dP - D)                       P and dS to shared memory (16-bit, a query's keys per row)
//   dV += P^T dO   dK += dS^T Q                          warps 4 x 2: 32 keys x kHeadDim / 2 columns each
//   dQ  = dS K                                           warps kBlockM / 32 x rest: 32 queries each, to the workspace
// Every warp holds two or more row tiles of each GEMM, so that each fragment read from shared memory feeds as many
// mma.sync: in
// bwd_mainloop.cuh's order (16 keys per warp and every GEMM) ldmatrix bounded the kernel (docs/decisions.md
// #sm80-backward). Q, dO, LSE and D come by cp.async, double-buffered: step s + 1's copies are issued at the top of
// step s, after the barrier that ends step s - 1's reads of that buffer and of P and dS.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/sm80/bwd_config.h"
#include "kernels/sm80/bwd_epilogue.cuh"
#include "kernels/sm80/bwd_gemm.cuh"
#include "kernels/sm80/bwd_mainloop.cuh"
#include "kernels/sm80/bwd_params.h"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"

namespace flashcore::sm80 {

// Row tiles of a warp's S and dP: kBlockM / 2 queries.
template <class Cfg>
inline constexpr int kSTiles = Cfg::kBlockM / 32;

// P (or dS) of the warp's kBlockM / 2 x 32 block into its kBlockM x 128 tile at rows kBlockM / 2 * wm.., keys 32 wn..:
// 4 bytes (a column pair) per store, rows of kPRowBytes swizzled (smem.cuh; 8 rows at one unit hit 8 bank groups).
template <class Cfg>
__device__ __forceinline__ void bwd_store_rows(uint8_t* tile, const float (&x)[kSTiles<Cfg>][16], int wm, int wn,
                                               int lane) {
  using E = kernels::ElemTraits<typename Cfg::Element>;
  using kernels::acc_index;
#pragma unroll
  for (int mt = 0; mt < kSTiles<Cfg>; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = Cfg::kBlockM / 2 * wm + 16 * mt + lane / 4 + 8 * i;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        *reinterpret_cast<uint32_t*>(tile + swizzled_offset<Cfg::kPRowBytes>(row, 4 * wn + j) + 4 * (lane % 4)) =
            E::pack2(x[mt][acc_index(j, i, 0)], x[mt][acc_index(j, i, 1)]);
      }
    }
  }
}

// dK and dV of the warp's 32 keys (key0 + 32 wk..) x kHeadDim / 2 columns (from col0).
template <class Cfg>
__device__ __forceinline__ void bwd_store_dkdv_rows(const BwdParams& p, int batch, int kv_head, int key0, int col0,
                                                    int lane, const float (&dk)[2][Cfg::kHeadDim / 4],
                                                    const float (&dv)[2][Cfg::kHeadDim / 4]) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  using kernels::acc_index;
  auto* dk_base = static_cast<Element*>(p.dk) + batch * p.dk_stride_batch + kv_head * p.dk_stride_head + col0;
  auto* dv_base = static_cast<Element*>(p.dv) + batch * p.dv_stride_batch + kv_head * p.dv_stride_head + col0;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int key = key0 + 16 * mt + lane / 4 + 8 * i;
      if (key >= p.seqlen_k) continue;
      Element* dk_row = dk_base + key * p.dk_stride_seq + 2 * (lane % 4);
      Element* dv_row = dv_base + key * p.dv_stride_seq + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < Cfg::kHeadDim / 16; ++j) {
        *reinterpret_cast<uint32_t*>(dk_row + 8 * j) = E::pack2(dk[mt][acc_index(j, i, 0)] * p.softmax_scale,
                                                               dk[mt][acc_index(j, i, 1)] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_row + 8 * j) = E::pack2(dv[mt][acc_index(j, i, 0)], dv[mt][acc_index(j, i, 1)]);
      }
    }
  }
}

// dQ: warps kDqRowGroups x (8 / kDqRowGroups), each 32 queries x kDqCols columns.
template <class Cfg>
inline constexpr int kDqRowGroups = Cfg::kBlockM / 32;
template <class Cfg>
inline constexpr int kDqCols = Cfg::kHeadDim * kDqRowGroups<Cfg> / 8;

// The warp's dQ (queries 32 wq.. x columns col0..col0 + kDqCols) added to the step's workspace blocks (`blocks`: the
// first), in the portable order (bwd_layout.h bwd_dq_index_by_reg): row tile mt is the m64 accumulator's warp
// 2 (wq % 2) + mt of block wq / 2.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_add_rows(float* blocks, const float (&dq)[2][kDqCols<Cfg> / 2], int wq,
                                                int col0, int lane) {
  float* block = blocks + (wq / 2) * (64 * Cfg::kHeadDim);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    float* at = block + kernels::bwd_dq_index_by_reg(0, 0, 32 * (2 * (wq % 2) + mt) + lane);
#pragma unroll
    for (int j = 0; j < kDqCols<Cfg> / 8; ++j) {
      const int g = col0 / 8 + j;  // 8-column group of the block
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        red_add_f32(at + kernels::bwd_dq_index_by_reg(g / 8, 4 * (g % 8) + r, 0), dq[mt][4 * j + r]);
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void bwd_mainloop_rows(const BwdParams& p, uint8_t* smem) {
  static_assert(Cfg::kQueryRows && Cfg::kWarps == 8 && Cfg::kBlockN == 128, "the kBlockM x 128 tile");
  constexpr int kMT = kSTiles<Cfg>;
  using Element = typename Cfg::Element;
  using kernels::acc_index;
  constexpr int kD = Cfg::kHeadDim;
  const BwdWork<Cfg> w(p);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const uint32_t base = smem_addr(smem);
  const int key0 = w.n_block * Cfg::kBlockN;
  // The warp's blocks: S / dP rows kBlockM / 2 * wm, keys 32 wn; dK / dV keys 32 wk, columns kD / 2 * wc; dQ rows
  // 32 wq, columns kDqCols * wqc.
  const int wm = warp % 2, wn = warp / 2, wk = warp % 4, wc = warp / 4;
  const int wq = warp % kDqRowGroups<Cfg>, wqc = warp / kDqRowGroups<Cfg>;

  load_tile<Cfg, Cfg::kBlockN>(base + Cfg::kSmemK, slice_base<Cfg>(p.k, w.batch, w.kv_head), p.k.seq_stride, key0,
                               p.seqlen_k);
  load_tile<Cfg, Cfg::kBlockN>(base + Cfg::kSmemV, slice_base<Cfg>(p.v, w.batch, w.kv_head), p.v.seq_stride, key0,
                               p.seqlen_k);
  if (w.steps > 0) bwd_load_step<Cfg>(p, w, base, 0, BwdStepPos::of(w, p, 0));
  cp_async_commit();

  float dk[2][kD / 4], dv[2][kD / 4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int i = 0; i < kD / 4; ++i) dk[mt][i] = dv[mt][i] = 0.f;
  }
  const bool keys_past_end = key0 + Cfg::kBlockN > p.seqlen_k;

  for (int step = 0; step < w.steps; ++step) {
    cp_async_wait<0>();
    __syncthreads();  // the step's copies have landed; every warp is done with the previous step (its buffer, P, dS)
    if (step + 1 < w.steps) bwd_load_step<Cfg>(p, w, base, step + 1, BwdStepPos::of(w, p, step + 1));
    cp_async_commit();
    const BwdStepPos pos = BwdStepPos::of(w, p, step);
    const int stage = step % Cfg::kStages, m = pos.m;
    const uint32_t q_tile = base + Cfg::kSmemQ + stage * Cfg::kQBytes;
    const uint32_t do_tile = base + Cfg::kSmemDo + stage * Cfg::kQBytes;
    const float* lse = reinterpret_cast<const float*>(smem + Cfg::kSmemStats + stage * Cfg::kStatBytes);
    const float* dsum = lse + Cfg::kBlockM;
    const int rel_max = key0 + Cfg::kBlockN - 1 - m * Cfg::kBlockM;
    const bool masked = keys_past_end || (Cfg::kCausal && rel_max > p.rel_hi);

    // P = exp2(S * scale_log2 - lse_log2) (ex2.approx, as the forward), 0 at masked (query, key) pairs and at keys past
    // the sequence.
    float s[kMT][16];
    bwd_gemm_abt<Cfg, kMT, 32>(s, q_tile, Cfg::kBlockM / 2 * wm, base + Cfg::kSmemK, 32 * wn, lane);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = Cfg::kBlockM / 2 * wm + 16 * mt + lane / 4 + 8 * i;
        const float l = lse[row];
        // Masked: the thread's key 8 j + e of the row (from the warp's first + 2 (lane % 4)) is visible up to `last`.
        int last = 31;
        if (masked) {
          const int first_key = key0 + 32 * wn + 2 * (lane % 4);
          last = p.seqlen_k - 1 - first_key;
          if constexpr (Cfg::kCausal) last = min(last, m * Cfg::kBlockM + row + p.rel_hi - first_key);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = acc_index(j, i, e);
            const float x = kernels::exp2_approx(fmaf(s[mt][r], p.scale_log2, -l));
            s[mt][r] = masked && 8 * j + e > last ? 0.f : x;
          }
        }
      }
    }
    bwd_store_rows<Cfg>(smem + Cfg::kSmemP, s, wm, wn, lane);
    // dS = P (dP - D).
    float dp[kMT][16];
    bwd_gemm_abt<Cfg, kMT, 32>(dp, do_tile, Cfg::kBlockM / 2 * wm, base + Cfg::kSmemV, 32 * wn, lane);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float d = dsum[Cfg::kBlockM / 2 * wm + 16 * mt + lane / 4 + 8 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = acc_index(j, i, e);
            dp[mt][r] = s[mt][r] * (dp[mt][r] - d);
          }
        }
      }
    }
    bwd_store_rows<Cfg>(smem + Cfg::kSmemDs, dp, wm, wn, lane);
    __syncthreads();  // P and dS whole

    // dV += P^T dO, dK += dS^T Q: the warp's 32 keys x kD / 2 columns, k = the step's 64 queries.
    bwd_gemm_smem<Element, Cfg::kPRowBytes, true, Cfg::kRowBytes, 2, kD / 2, Cfg::kBlockM / 16>(
        dv, base + Cfg::kSmemP, 32 * wk, do_tile, kD / 2 * wc, lane);
    bwd_gemm_smem<Element, Cfg::kPRowBytes, true, Cfg::kRowBytes, 2, kD / 2, Cfg::kBlockM / 16>(
        dk, base + Cfg::kSmemDs, 32 * wk, q_tile, kD / 2 * wc, lane);

    // dQ of the step: computed, then (deterministic: in key-block order) added to the workspace's block.
    float dq[2][kDqCols<Cfg> / 2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int i = 0; i < kDqCols<Cfg> / 2; ++i) dq[mt][i] = 0.f;
    }
    bwd_gemm_smem<Element, Cfg::kPRowBytes, false, Cfg::kRowBytes, 2, kDqCols<Cfg>, Cfg::kBlockN / 16>(
        dq, base + Cfg::kSmemDs, 32 * wq, base + Cfg::kSmemK, kDqCols<Cfg> * wqc, lane);
    // The step's first 64-row block (a 128-row step adds to two, ordered by the first one's counter, as the
    // preparation kernel sets both).
    const int64_t index =
        (static_cast<int64_t>(w.batch) * p.num_heads_q + pos.head) * p.num_m_blocks + m * Cfg::kDqBlocks;
    float* blocks = p.dq_accum + index * (64 * kD);
    if (p.dq_semaphore != nullptr) bwd_dq_acquire(p.dq_semaphore + index, w.n_block);
    bwd_dq_add_rows<Cfg>(blocks, dq, wq, kDqCols<Cfg> * wqc, lane);
    if (p.dq_semaphore != nullptr) bwd_dq_release(p.dq_semaphore + index, w.n_block);
  }
  cp_async_wait<0>();
  bwd_store_dkdv_rows<Cfg>(p, w.batch, w.kv_head, key0 + 32 * wk, kD / 2 * wc, lane, dk, dv);
}

}  // namespace flashcore::sm80

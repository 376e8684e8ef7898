// The wide head dims' backward consumers (bwd_config.h BwdWideConfig; head dims 192 and 256, and (192, 128); plain
// and variants flavours).
// Warpgroup w owns the w-th half of the columns of the CTA's dK and dV (all 64 keys; kD / 2 and kDv / 2 columns) and
// keys [32w, 32w + 32) of its S and dP. Per step (a query block of one query head):
//   S   = Q K_w^T     (SS, K-major both; 64 queries x 32 keys)      P  = exp2(S * scale_log2 - lse_log2) [masked: 0]
//   dP  = dO V_w^T    (SS)                                          dS = P (dP - D)
//   P, dS -> shared memory (query-major, stmatrix); both warpgroups' halves in (named barrier)
//   dV_w += P^T dO_w  (SS: A M-major, B N-major; 64 keys x kDv / 2 columns)
//   dK_w += dS^T Q_w  (SS, the same; kD / 2 columns)
//   dQ_w  = dS K_w    (SS: A K-major, B N-major; 64 queries x kD / 2 columns) -> the workspace by atomic adds
// dK (times softmax_scale) and dV are stored once, at the end.
#pragma once
#include <cuda/atomic>
#include <cuda/ptx>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/bwd_config.h"
#include "kernels/sm90/bwd_epilogue.cuh"
#include "kernels/sm90/bwd_gemm.cuh"
#include "kernels/sm90/bwd_producer.cuh"
#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {

using kernels::acc_index;

// Named barriers of the wide consumers (0 is __syncthreads; 1 is bwd_mainloop.cuh's): both halves of P and dS
// written; the deterministic turn taken and given back.
inline constexpr uint32_t kBwdWidePdsBarrier = 1;
inline constexpr uint32_t kBwdWideTurnBarrier = 2;

// The warpgroup's dQ (64 queries x kD / 2 columns of the step's 64-row block: column groups of 8 from 8-column group
// w * kD / 16 on, in regions of 64 columns, bwd_layout.h) added to the workspace: one vector reduction per four
// registers (one 8-column group).
template <class Cfg>
__device__ __forceinline__ void bwd_wide_dq_add(float* block, int wg, int thread, const float (&dq)[Cfg::kAccRegs]) {
#pragma unroll
  for (int g = 0; g < Cfg::kAccRegs / 4; ++g) {
    float* at = block + kernels::bwd_dq_group_index(wg * (Cfg::kColsPerWarpgroup / 8) + g, thread);
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(at), "f"(dq[4 * g]), "f"(dq[4 * g + 1]),
                 "f"(dq[4 * g + 2]), "f"(dq[4 * g + 3])
                 : "memory");
  }
}

// dK and dV of the warpgroup's columns: key row lane/4 (+8) of each warp's 16, two columns of each group of 8.
template <class Cfg>
__device__ __forceinline__ void bwd_wide_store_dkdv(const BwdParams& p, const BwdWork& w, int wg, int warp, int lane,
                                                    const float (&dk)[Cfg::kAccRegs],
                                                    const float (&dv)[Cfg::kAccVRegs]) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  const bool dense = p.rows.cu_seqlens_q == nullptr;
  const int col0 = wg * Cfg::kColsPerWarpgroup + 2 * (lane % 4), colv0 = wg * Cfg::kColsVPerWarpgroup + 2 * (lane % 4);
  auto* dk_base = static_cast<Element*>(p.dk) + (dense ? w.batch * p.dk_stride_batch : 0) +
                  w.seq.k_start * p.dk_stride_seq + w.kv_head * p.dk_stride_head + col0;
  auto* dv_base = static_cast<Element*>(p.dv) + (dense ? w.batch * p.dv_stride_batch : 0) +
                  w.seq.k_start * p.dv_stride_seq + w.kv_head * p.dv_stride_head + colv0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = w.n_block * Cfg::kBlockN + 16 * warp + lane / 4 + 8 * i;
    if (key >= w.seq.len_k) continue;
    Element* dk_row = dk_base + key * p.dk_stride_seq;
    Element* dv_row = dv_base + key * p.dv_stride_seq;
#pragma unroll
    for (int j = 0; j < Cfg::kColsPerWarpgroup / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * j) = E::pack2(dk[acc_index(j, i, 0)] * p.softmax_scale,
                                                              dk[acc_index(j, i, 1)] * p.softmax_scale);
      if (Cfg::kColsVPerWarpgroup == Cfg::kColsPerWarpgroup) {  // (one loop where the head dims agree)
        *reinterpret_cast<uint32_t*>(dv_row + 8 * j) = E::pack2(dv[acc_index(j, i, 0)], dv[acc_index(j, i, 1)]);
      }
    }
    if constexpr (Cfg::kColsVPerWarpgroup != Cfg::kColsPerWarpgroup) {
#pragma unroll
      for (int j = 0; j < Cfg::kColsVPerWarpgroup / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dv_row + 8 * j) = E::pack2(dv[acc_index(j, i, 0)], dv[acc_index(j, i, 1)]);
      }
    }
  }
}

// A warpgroup's P and dS (64 queries x its 32 keys, query-major accumulators: row q_row0 + 8i, key key0 + 8j + e)
// packed by pairs: P = exp2(S * scale_log2 - lse_log2), 0 at keys past len_k and, in masked steps of the causal
// kernels (window: its bounds, kernels/common/bwd_window.h), at pairs it hides; dS = P (dP - D). kSoftcap: S =
// tanh(S * softcap_scale) first and dS times 1 - tanh^2 (scale_log2 is then softcap * log2(e): core/variants.h).
template <class Cfg, bool kSoftcap>
__device__ __forceinline__ void bwd_wide_probabilities(const float (&s)[Cfg::kSRegs], const float (&dp)[Cfg::kSRegs],
                                                       const float (&l)[2], const float (&d)[2],
                                                       uint32_t (&pp)[Cfg::kKeysPerWarpgroup / 8][2],
                                                       uint32_t (&dsp)[Cfg::kKeysPerWarpgroup / 8][2],
                                                       float scale_log2, float softcap_scale, bool masked, int key0,
                                                       int q_row0, int len_k, const kernels::BwdWindow& window) {
  using E = kernels::ElemTraits<typename Cfg::Element>;
#pragma unroll
  for (int j = 0; j < Cfg::kKeysPerWarpgroup / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float x[2], y[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float v = s[acc_index(j, i, e)], g = 1.f;
        if constexpr (kSoftcap) {
          v = kernels::tanh_approx(v * softcap_scale);
          g = fmaf(-v, v, 1.f);
        }
        x[e] = kernels::exp2_approx(fmaf(v, scale_log2, -l[i]));
        if (masked) {
          const int key = key0 + 8 * j + e, query = q_row0 + 8 * i;
          if (key >= len_k || (Cfg::kCausal && !window.visible(key, query))) x[e] = 0.f;
        }
        y[e] = (kSoftcap ? x[e] * g : x[e]) * (dp[acc_index(j, i, e)] - d[i]);
      }
      pp[j][i] = E::pack2(x[0], x[1]);
      dsp[j][i] = E::pack2(y[0], y[1]);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void bwd_consume_wide(const BwdParams& p, const BwdWork& w, uint8_t* smem,
                                                 BwdBarriers<Cfg>& bars, int wg) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  constexpr int kKeys = Cfg::kKeysPerWarpgroup;
  const int thread = static_cast<int>(threadIdx.x % 128), warp = thread / 32, lane = thread % 32;
  float dk[Cfg::kAccRegs], dv[Cfg::kAccVRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) dk[i] = 0.f;
#pragma unroll
  for (int i = 0; i < Cfg::kAccVRegs; ++i) dv[i] = 0.f;

  // Descriptors. S and dP: the step's Q / dO (A, K-major) and the warpgroup's 32 rows of K / V (B, K-major). dV and
  // dK: P / dS (A, M-major: query-major rows of 64 keys) and the warpgroup's column chunks of dO / Q (B, N-major:
  // chunks kQChunkBytes apart). dQ: dS (A, K-major) and K's column chunks (B, N-major). Q, K, V and dO rows are
  // kRowBytes wide (bwd_config.h); P and dS rows 128.
  constexpr int kRowB = Cfg::kRowBytes;
  const SmemDesc q_kmajor(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemQ));
  const SmemDesc do_kmajor(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemDo));
  const SmemDesc k_rows(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemK + wg * kKeys * kRowB));
  const SmemDesc v_rows(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemV + wg * kKeys * kRowB));
  const SmemDesc p_mmajor(make_smem_desc_sw128(smem + Cfg::kSmemP, Cfg::kPBytes, 1024));
  const SmemDesc ds_mmajor(make_smem_desc_sw128(smem + Cfg::kSmemDs, Cfg::kPBytes, 1024));
  const SmemDesc ds_kmajor(make_smem_desc_kmajor<128>(smem + Cfg::kSmemDs));
  constexpr int kWgChunks = Cfg::kColsPerWarpgroup / Cfg::kChunkCols, kWgChunksV = Cfg::kColsVPerWarpgroup / Cfg::kChunkCols;
  const SmemDesc do_cols(make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemDo + wg * kWgChunksV * Cfg::kQChunkBytes,
                                                        Cfg::kQChunkBytes));
  const SmemDesc q_cols(
      make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemQ + wg * kWgChunks * Cfg::kQChunkBytes, Cfg::kQChunkBytes));
  const SmemDesc k_cols(
      make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemK + wg * kWgChunks * Cfg::kKVChunkBytes, Cfg::kKVChunkBytes));
  // P and dS by stmatrix: lane l gives row l % 8 of matrix l / 8 (rows of the warp's 16, units of the key pair).
  const int st_row = 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
  const uint32_t p_st = static_cast<uint32_t>(__cvta_generic_to_shared(smem + Cfg::kSmemP)) + st_row * 128;

  const int key0 = w.n_block * Cfg::kBlockN + wg * kKeys + 2 * (lane % 4);  // + 8j + e: the thread's keys
  const int row0 = 16 * warp + lane / 4;                                     // + 8i: the thread's query rows
  const kernels::BwdWindow window = bwd_window<Cfg>(p, w.seq);
  const bool keys_past_end = (w.n_block + 1) * Cfg::kBlockN > w.seq.len_k;
  // (The non-causal variants' kernel runs softcapped calls only: a windowed call runs the causal one.)
  const bool softcap = Cfg::kVariants && (!Cfg::kCausal || p.var.softcap_scale != 0.f);
  mbar_wait_sleep(&bars.kv, 0u);

  PipelineState<Cfg::kStages> st;
  int step = 0;
  for (int g = 0; g < p.head_ratio; ++g) {  // the query heads of the KV group: the producer's order
    const int head = w.kv_head * p.head_ratio + g;
    float* dq_head = p.dq_accum + p.rows.base(w.batch, head, w.seq) * Cfg::kHeadDim;
    int* counter = p.dq_semaphore == nullptr
                       ? nullptr
                       : p.dq_semaphore + (static_cast<int64_t>(w.batch) * p.num_heads_q + head) * p.num_m_blocks;
    for (int m = w.m_first; m < w.m_end; ++m, ++step) {
      bars.step.wait(st);
      const uint32_t q_off = st.stage * Cfg::kQBytes, do_off = st.stage * Cfg::kDoBytes, buf = (step & 1) * Cfg::kPBytes;
      float s[Cfg::kSRegs], dp[Cfg::kSRegs];
      // S (or dP) = the step's Q (dO) tile * the warpgroup's 32 rows of K (V)^T, over the head dim (both K-major).
      using GemmS = WgmmaSS<Element, kKeys>;
      bwd_gemm_head_dim<GemmS, Cfg::kHeadDim, kRowB>(s, q_kmajor + q_off, Cfg::kQChunkBytes, k_rows,
                                                     Cfg::kKVChunkBytes);
      bwd_gemm_head_dim<GemmS, Cfg::kHeadDimV, kRowB>(dp, do_kmajor + do_off, Cfg::kQChunkBytes, v_rows,
                                                      Cfg::kKVChunkBytes);
      const float* lse = reinterpret_cast<const float*>(smem + Cfg::kSmemLse + st.stage * Cfg::kRowStatBytes);
      const float* dsum = reinterpret_cast<const float*>(smem + Cfg::kSmemD + st.stage * Cfg::kRowStatBytes);
      const float l[2] = {lse[row0], lse[row0 + 8]}, d[2] = {dsum[row0], dsum[row0 + 8]};
      wgmma_wait_group<0>();
      fence_regs(s);
      fence_regs(dp);
      // P = exp2(S * scale_log2 - lse_log2), 0 at masked pairs and keys past the sequence; dS = P (dP - D); both
      // packed in the accumulators' pairs (row, two keys). The variants' kernels: the window's mask (causal flavour)
      // and, with a softcap, S = tanh(S * softcap_scale) first and dS times its derivative (a copy of the loop).
      const bool masked =
          keys_past_end || (Cfg::kCausal && window.step_masked(w.n_block, m, Cfg::kBlockN, Cfg::kBlockM));
      uint32_t pp[kKeys / 8][2], dsp[kKeys / 8][2];
      const int q_row0 = m * Cfg::kBlockM + row0;
      if (softcap) {
        bwd_wide_probabilities<Cfg, true>(s, dp, l, d, pp, dsp, p.scale_log2, p.var.softcap_scale, masked, key0,
                                          q_row0, w.seq.len_k, window);
      } else {
        bwd_wide_probabilities<Cfg, false>(s, dp, l, d, pp, dsp, p.scale_log2, 0.f, masked, key0, q_row0,
                                           w.seq.len_k, window);
      }
      // Into shared memory: one stmatrix.x4 per pair of 8-key units (the warpgroup's units 4w + j, 4w + j + 1).
#pragma unroll
      for (int j = 0; j < kKeys / 8; j += 2) {
        const int unit = 4 * wg + j + lane / 16;
        const uint32_t at = p_st + buf + swizzled_unit<128>(st_row, unit) * 16;
        const uint32_t rp[4] = {pp[j][0], pp[j][1], pp[j + 1][0], pp[j + 1][1]};
        const uint32_t rd[4] = {dsp[j][0], dsp[j][1], dsp[j + 1][0], dsp[j + 1][1]};
        stmatrix_x4(at, rp);
        stmatrix_x4(at + (Cfg::kSmemDs - Cfg::kSmemP), rd);
      }
      // Both warpgroups' halves in place before the GEMMs read them through the async proxy.
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      kernels::named_barrier_sync(kBwdWidePdsBarrier, Cfg::kConsumerThreads);
      using TransAB = WgmmaSSTransAB<Element, Cfg::kColsPerWarpgroup>;
      using TransABV = WgmmaSSTransAB<Element, Cfg::kColsVPerWarpgroup>;
      using TransB = WgmmaSSTransB<Element, Cfg::kColsPerWarpgroup>;
      constexpr int kQSteps = Cfg::kBlockM / 16, kKeySteps = Cfg::kBlockN / 16;
      bwd_gemm_steps<TransABV, kQSteps>(dv, p_mmajor + buf, do_cols + do_off, 16 * 128, 16 * kRowB, true);
      bwd_gemm_steps<TransAB, kQSteps>(dk, ds_mmajor + buf, q_cols + q_off, 16 * 128, 16 * kRowB, true);
      float dq[Cfg::kAccRegs];
      bwd_gemm_steps<TransB, kKeySteps>(dq, ds_kmajor + buf, k_cols, 32, 16 * kRowB, false);
      wgmma_wait_group<0>();
      fence_regs(dq);
      fence_regs(dk);
      fence_regs(dv);
      bars.step.release(st);  // Q, dO, LSE and D of the stage are read
      float* block = dq_head + static_cast<int64_t>(m) * Cfg::kBlockM * Cfg::kHeadDim;
      if (counter != nullptr) {
        // Deterministic: the key blocks add in descending order (bwd_prep.cuh); both warpgroups add theirs in
        // this CTA's turn.
        if (threadIdx.x == 128) bwd_turn_wait(counter + m, w.n_block);
        kernels::named_barrier_sync(kBwdWideTurnBarrier, Cfg::kConsumerThreads);
        bwd_wide_dq_add<Cfg>(block, wg, thread, dq);
        __threadfence();
        kernels::named_barrier_sync(kBwdWideTurnBarrier, Cfg::kConsumerThreads);
        if (threadIdx.x == 128) bwd_turn_pass(counter + m, w.n_block);
      } else {
        bwd_wide_dq_add<Cfg>(block, wg, thread, dq);
      }
      st.advance();
    }
  }
  bwd_wide_store_dkdv<Cfg>(p, w, wg, warp, lane, dk, dv);
}

}  // namespace flashcore::sm90

// The backward's consumer warpgroups. Warpgroup w owns keys 64w..64w+63 of the CTA's block and, per step (a query
// block of one query head), recomputes the probabilities transposed and accumulates dV and dK in registers:
//   S^T  = K_w Q^T          (SS: both K-major)          P^T  = exp2(S^T * scale_log2 - lse_log2)   [masked: 0]
//   dP^T = V_w dO^T         (SS)                        dS^T = P^T * (dP^T - D)
//   (the variants' kernels: the window's mask; a softcap's tanh on S^T and its derivative on dS^T)
//   dV  += P^T dO           (RS: P^T from registers, dO as stored: N-major)
//   dK  += dS^T Q           (RS)
//   dQ   = dS K             (SS, both operands transposed: dS^T as this step wrote it to shared memory, K as stored)
// dQ goes to the workspace through shared memory and a bulk reduction (bwd_epilogue.cuh); dK (times softmax_scale)
// and dV are stored once, at the end. The dK GEMM is issued in two halves around the dQ GEMM: the first runs while the
// warpgroups wait for each other's dS^T, the second while this step's dQ goes to shared memory.
#pragma once
#include <cuda/ptx>

#include <climits>
#include <type_traits>

#include "kernels/common/bwd_variants.cuh"
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

// Named barriers of the consumers (0 is __syncthreads): both halves of dS^T written.
inline constexpr uint32_t kBwdDsBarrier = 1;

// acc (64 keys x D) += A (64 keys x queries [16 kT0, 16 kT1), registers) * B (those rows of the step's Q or dO tile,
// N-major).
template <class Cfg, int kT0 = 0, int kT1 = Cfg::kPFrags>
__device__ __forceinline__ void bwd_gemm_acc(float (&acc)[Cfg::kHeadDim / 2], const uint32_t (&a)[Cfg::kPFrags][4],
                                             SmemDesc b) {
  wgmma_fence();
#pragma unroll
  for (int t = kT0; t < kT1; ++t) {
    WgmmaRS<typename Cfg::Element, Cfg::kHeadDim>::mma(acc, a[t], (b + t * 16 * Cfg::kRowBytes).u64(), 1);
  }
  wgmma_commit_group();
}

// The RS GEMMs read their A registers (P^T, dS^T) until they complete, which the compiler does not know: a branch
// that never runs (p.never_step is -1) reads them after the wait, so ptxas cannot give their registers to other values
// before it (as the forward's keep_allocated, mainloop.cuh).
template <int kFrags>
__device__ __forceinline__ void bwd_keep_allocated(const BwdParams& p, int step, const uint32_t (&a)[kFrags][4],
                                                   uint32_t* sink) {
  if (step == p.never_step) {
    uint32_t x = 0;
#pragma unroll
    for (int t = 0; t < kFrags; ++t) x ^= a[t][0] ^ a[t][1] ^ a[t][2] ^ a[t][3];
    *reinterpret_cast<volatile uint32_t*>(sink) = x;
  }
}

// The consumer warpgroup `wg` of a CTA: every step of its work, then dK and dV.
template <class Cfg>
__device__ __forceinline__ void bwd_consume(const BwdParams& p, const BwdWork& w, uint8_t* smem,
                                            BwdBarriers<Cfg>& bars, int wg) {
  using Element = typename Cfg::Element;
  constexpr int kM = Cfg::kBlockM;
  const int thread = static_cast<int>(threadIdx.x % 128), warp = thread / 32, lane = thread % 32;
  float dk[Cfg::kHeadDim / 2], dv[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  // Operand descriptors: the warpgroup's K and V rows (K-major A), the stage-0 Q and dO tiles as K-major B (S, dP)
  // and as N-major B (dK, dV: chunks kQChunkBytes apart), dS^T and K for dQ. Q, K, V and dO rows are kRowBytes wide
  // (bwd_config.h: 64 at head dim 96), dS^T's 128.
  constexpr int kRowB = Cfg::kRowBytes;
  const SmemDesc k_rows(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemK + wg * 64 * kRowB));
  const SmemDesc v_rows(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemV + wg * 64 * kRowB));
  const SmemDesc q_kmajor(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemQ));
  const SmemDesc do_kmajor(make_smem_desc_kmajor<kRowB>(smem + Cfg::kSmemDo));
  const SmemDesc q_nmajor(make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemQ, Cfg::kQChunkBytes));
  const SmemDesc do_nmajor(make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemDo, Cfg::kQChunkBytes));
  // dQ's share (bwd_config.h kDqByQueries, kDqSplitKeys): dS^T's query chunk wg and K's only chunk; dS^T's only
  // query chunk and K's column chunk wg; or the warpgroup's own 64 keys of both.
  const int ds_chunk = Cfg::kDqByQueries ? wg : 0, k_chunk = Cfg::kDqByQueries || Cfg::kDqSplitKeys ? 0 : wg;
  const int dq_key0 = Cfg::kDqSplitKeys ? wg * 64 : 0;
  const SmemDesc ds0(make_smem_desc_sw128(smem + Cfg::kSmemDs + ds_chunk * Cfg::kDsChunkBytes + dq_key0 * 128,
                                          Cfg::kDsChunkBytes, 1024));
  const SmemDesc k_dq(make_smem_desc_mn_major<kRowB>(smem + Cfg::kSmemK + k_chunk * Cfg::kKVChunkBytes + dq_key0 * kRowB,
                                                    Cfg::kKVChunkBytes));

  const int key_row = w.n_block * Cfg::kBlockN + wg * 64 + 16 * warp + lane / 4;  // + 8i: the thread's keys
  const kernels::BwdWindow window = bwd_window<Cfg>(p, w.seq);
  const bool keys_past_end = (w.n_block + 1) * Cfg::kBlockN > w.seq.len_k;
  // (The non-causal variants' kernel runs softcapped calls only: a windowed call runs the causal one.)
  const bool softcap = Cfg::kVariants && (!Cfg::kCausal || p.var.softcap_scale != 0.f);
  mbar_wait_sleep(&bars.kv, 0u);

  PipelineState<Cfg::kStages> st;
  PipelineState<Cfg::kDqStages> dq_st;
  int step = 0;
  for (int g = 0; g < p.head_ratio; ++g) {  // the query heads of the KV group: the producer's order
    for (int m = w.m_first; m < w.m_end; ++m, ++step) {
      bars.step.wait(st);
      const uint32_t q_off = st.stage * Cfg::kQBytes;
      float s[Cfg::kSRegs], dp[Cfg::kSRegs];
      // S^T (64 keys x kBlockM queries) = K_w Q^T and dP^T = V_w dO^T, over the head dim (both K-major).
      using GemmRows = WgmmaSS<Element, kM>;
      bwd_gemm_head_dim<GemmRows, Cfg::kHeadDim, kRowB>(s, k_rows, Cfg::kKVChunkBytes, q_kmajor + q_off,
                                                        Cfg::kQChunkBytes);
      bwd_gemm_head_dim<GemmRows, Cfg::kHeadDim, kRowB>(dp, v_rows, Cfg::kKVChunkBytes, do_kmajor + q_off,
                                                        Cfg::kQChunkBytes);
      // The scaled LSE and D of the thread's query columns 8j + 2 (lane % 4) + e: float2 4j of these.
      const float2* lse =
          reinterpret_cast<const float2*>(smem + Cfg::kSmemLse + st.stage * Cfg::kRowStatBytes) + lane % 4;
      const float2* dsum =
          reinterpret_cast<const float2*>(smem + Cfg::kSmemD + st.stage * Cfg::kRowStatBytes) + lane % 4;
      // At head dim 128 the dV GEMM runs while dS^T is computed; at 64 (128 queries per step) S^T, dP^T and P^T in
      // registers at once would leave too few for the GEMMs in flight, so it waits for both and issues dV after.
      constexpr bool kEarlyDv = kM == 64;
      wgmma_wait_group<kEarlyDv ? 1 : 0>();
      fence_regs(s);
      if constexpr (!kEarlyDv) fence_regs(dp);
      // P^T = exp2(S^T * scale_log2 - lse_log2), 0 at masked (key, query) pairs and at keys past the sequence.
      const int q0 = m * kM + 2 * (lane % 4);
      const bool masked = keys_past_end || (Cfg::kCausal && window.step_masked(w.n_block, m, Cfg::kBlockN, kM));
      uint32_t pa[Cfg::kPFrags][4], dsa[Cfg::kPFrags][4];
      if constexpr (Cfg::kVariants) {
        // The variants' P^T (kernels/common/bwd_variants.cuh; 64-row steps: kEarlyDv), the window's bounds relative
        // to the diagonal. exp2f: with ex2.approx the head dim 128 causal variants' kernel spilled 16 bytes.
        static_assert(kEarlyDv, "the variants' kernels take 64-row steps");
        const kernels::BwdStatColumns lse_cols{lse};
        const int rel0 = key_row - q0 - window.d, lo = window.left < 0 ? INT_MIN : -window.left;
        if (softcap) {
          kernels::bwd_variant_probabilities<Element, kM, true, Cfg::kCausal>(
              s, pa, lse_cols, p.var.softcap_scale, p.scale_log2, masked, key_row, w.seq.len_k, rel0, lo,
              window.right, window.chunk, 0);
        } else {
          kernels::bwd_variant_probabilities<Element, kM, false, Cfg::kCausal>(
              s, pa, lse_cols, p.var.softcap_scale, p.scale_log2, masked, key_row, w.seq.len_k, rel0, lo,
              window.right, window.chunk, 0);
        }
      } else {
        // Packed into the A fragments as computed (pack_p_fragments' order); without the early dV GEMM, dS^T too, so
        // that P^T's and dP^T's fp32 values die column group by column group.
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) {
          const float2 l = lse[4 * j];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              x[e] = kernels::exp2_approx(fmaf(s[acc_index(j, i, e)], p.scale_log2, -(e ? l.y : l.x)));
              if (masked) {
                const int key = key_row + 8 * i, query = q0 + 8 * j + e;
                if (key >= w.seq.len_k || (Cfg::kCausal && !window.visible(key, query))) x[e] = 0.f;
              }
              if constexpr (kEarlyDv) s[acc_index(j, i, e)] = x[e];  // (dS^T below reads it)
            }
            pa[j / 2][(j % 2) * 2 + i] = kernels::ElemTraits<Element>::pack2(x[0], x[1]);
            if constexpr (!kEarlyDv) {
              const float2 d = dsum[4 * j];
              dsa[j / 2][(j % 2) * 2 + i] = kernels::ElemTraits<Element>::pack2(
                  x[0] * (dp[acc_index(j, i, 0)] - d.x), x[1] * (dp[acc_index(j, i, 1)] - d.y));
            }
          }
        }
      }
      if constexpr (kEarlyDv) {
        // dS^T = P^T (dP^T - D), into registers (dK's A operand) and shared memory (dQ's), once dP^T is in; D's
        // columns read while it runs.
        bwd_gemm_acc<Cfg>(dv, pa, do_nmajor + q_off);
        float2 dcol[kM / 8];
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) dcol[j] = dsum[4 * j];
        wgmma_wait_group<1>();
        fence_regs(dp);
#pragma unroll
        for (int j = 0; j < kM / 8; ++j) {
          const float2 d = dcol[j];
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = acc_index(j, i, e);
              dp[r] = s[r] * (dp[r] - (e ? d.y : d.x));
            }
          }
        }
        kernels::pack_p_fragments<Element, kM>(dp, dsa);
      }
      if constexpr (!kEarlyDv) bwd_gemm_acc<Cfg>(dv, pa, do_nmajor + q_off);
      // dS^T to shared memory: 128-byte swizzled rows of 64 queries, chunk-major. One stmatrix.x4 per A fragment t
      // (column units 2t, 2t + 1 of the warp's 16 rows, as the forward's epilogue): lane l gives the address of row
      // l % 8 of matrix l / 8.
      {
        const int row = wg * 64 + 16 * warp + 8 * ((lane / 8) % 2) + lane % 8;
        const uint32_t ds_row = static_cast<uint32_t>(__cvta_generic_to_shared(smem + Cfg::kSmemDs)) +
                                (step & 1) * Cfg::kDsBytes + row * 128;
#pragma unroll
        for (int t = 0; t < Cfg::kPFrags; ++t) {
          const int chunk = (2 * t) / 8, unit = (2 * t) % 8 + lane / 16;
          stmatrix_x4(ds_row + chunk * Cfg::kDsChunkBytes + swizzled_unit<128>(row, unit) * 16, dsa[t]);
        }
      }
      constexpr int kHalf = Cfg::kPFrags / 2;
      bwd_gemm_acc<Cfg, 0, kHalf>(dk, dsa, q_nmajor + q_off);
      // dS^T of both warpgroups in place before the dQ GEMM reads it through the async proxy.
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      kernels::named_barrier_sync(kBwdDsBarrier, Cfg::kConsumerThreads);
      float dq[Cfg::kDqRegs];
      // dQ (64 queries x kDqCols columns) = dS (M-major: dS^T's rows are keys) K (N-major: K's rows are keys), over
      // kDqKeys keys.
      bwd_gemm_steps<WgmmaSSTransAB<Element, Cfg::kDqCols>, Cfg::kDqKeys / 16>(dq, ds0 + (step & 1) * Cfg::kDsBytes,
                                                                               k_dq, 16 * 128, 16 * kRowB, false);
      bwd_gemm_acc<Cfg, kHalf, Cfg::kPFrags>(dk, dsa, q_nmajor + q_off);
      wgmma_wait_group<1>();  // dV, the first half of dK and dQ: the second half of dK runs on
      bwd_keep_allocated(p, step, pa, &bars.sink);
      fence_regs(dq);
      bwd_dq_store<Cfg>(smem, bars, dq_st, wg, thread, dq);
      dq_st.advance();
      wgmma_wait_group<0>();
      bwd_keep_allocated(p, step, dsa, &bars.sink);
      fence_regs(dk);
      fence_regs(dv);
      bars.step.release(st);  // Q, dO, LSE and D of the stage are read
      st.advance();
    }
  }
  bwd_store_dkdv<Cfg>(p, w, wg, warp, lane, dk, dv);
}

}  // namespace flashcore::sm90

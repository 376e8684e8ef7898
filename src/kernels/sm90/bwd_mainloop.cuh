// The backward's consumer warpgroups. Warpgroup w owns keys 64w..64w+63 of the CTA's block and, per step (a query
// block of one query head), recomputes the probabilities transposed and accumulates dV and dK in registers:
//   S^T  = K_w Q^T          (SS: both K-major)          P^T  = exp2(S^T * scale_log2 - lse_log2)   [masked: 0]
//   dP^T = V_w dO^T         (SS)                        dS^T = P^T * (dP^T - D)
//   (the variants' kernels: the window's mask; a softcap's tanh on S^T and its derivative on dS^T)
//   dV  += P^T dO           (RS: P^T from registers, dO as stored: N-major)
//   dK  += dS^T Q           (RS)
//   dQ   = dS K             (SS, both operands transposed: dS^T as this step wrote it to shared memory, K as stored)
// dQ goes to the workspace through shared memory and a bulk reduction (bwd_epilogue.cuh); dK (times softmax_scale)
// and dV are stored once, at the end.
#pragma once
#include <cuda/ptx>

#include <climits>

#include "kernels/common/bwd_variants.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/bwd_config.h"
#include "kernels/sm90/bwd_epilogue.cuh"
#include "kernels/sm90/bwd_producer.cuh"
#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {

using kernels::acc_index;

// Named barriers of the consumers (0 is __syncthreads): both halves of dS^T written (and bwd_epilogue.cuh's).
inline constexpr uint32_t kBwdDsBarrier = 1;

// S^T (64 keys x 64 queries) = A (the warpgroup's 64 rows of K or V) * B^T (the step's Q or dO tile), both K-major.
template <class Cfg>
__device__ __forceinline__ void bwd_gemm_rows(float (&s)[32], SmemDesc a, SmemDesc b) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < Cfg::kHeadDim / Cfg::kMmaK; ++k) {
    const int chunk = k / 4, kk = k % 4;  // four 16-column steps per 128-byte chunk
    WgmmaSS<typename Cfg::Element, 64>::mma(s, (a + (chunk * Cfg::kKVChunkBytes + kk * 32)).u64(),
                                            (b + (chunk * Cfg::kQChunkBytes + kk * 32)).u64(), k > 0 ? 1 : 0);
  }
  wgmma_commit_group();
}

// acc (64 keys x D) += A (64 keys x 64 queries, registers) * B (the step's Q or dO tile, 64 queries x D, N-major).
template <class Cfg>
__device__ __forceinline__ void bwd_gemm_acc(float (&acc)[Cfg::kHeadDim / 2], const uint32_t (&a)[4][4], SmemDesc b) {
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < 4; ++t) WgmmaRS<typename Cfg::Element, Cfg::kHeadDim>::mma(acc, a[t], (b + t * 16 * 128).u64(), 1);
  wgmma_commit_group();
}

// dQ (64 queries x 64 columns) = dS (queries x kDqKeys keys; M-major: dS^T's rows are keys) * K (keys x 64 columns,
// N-major: K's rows are keys).
template <class Cfg>
__device__ __forceinline__ void bwd_gemm_dq(float (&dq)[Cfg::kDqRegs], SmemDesc ds, SmemDesc k) {
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < Cfg::kDqKeys / 16; ++t) {
    WgmmaSSTransAB<typename Cfg::Element, 64>::mma(dq, (ds + t * 16 * 128).u64(), (k + t * 16 * 128).u64(),
                                                   t > 0 ? 1 : 0);
  }
  wgmma_commit_group();
}

// The RS GEMMs read their A registers (P^T, dS^T) until they complete, which the compiler does not know: a branch
// that never runs (p.never_step is -1) reads them after the wait, so ptxas cannot give their registers to other values
// before it (as the forward's keep_allocated, mainloop.cuh).
__device__ __forceinline__ void bwd_keep_allocated(const BwdParams& p, int step, const uint32_t (&a)[4][4],
                                                   const uint32_t (&b)[4][4], uint32_t* sink) {
  if (step == p.never_step) {
    uint32_t x = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) x ^= a[t][0] ^ a[t][1] ^ a[t][2] ^ a[t][3] ^ b[t][0] ^ b[t][1] ^ b[t][2] ^ b[t][3];
    *reinterpret_cast<volatile uint32_t*>(sink) = x;
  }
}

// A row statistic (scaled LSE or D) for each of the thread's query columns: column 8j + 2(lane%4) + e.
__device__ __forceinline__ void bwd_load_columns(const uint8_t* stats, int lane, float2 (&out)[8]) {
  const float2* s = reinterpret_cast<const float2*>(stats) + lane % 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = s[4 * j];
}

// The consumer warpgroup `wg` of a CTA: every step of its work, then dK and dV.
template <class Cfg>
__device__ __forceinline__ void bwd_consume(const BwdParams& p, const BwdWork& w, uint8_t* smem,
                                            BwdBarriers<Cfg>& bars, int wg) {
  using Element = typename Cfg::Element;
  const int thread = static_cast<int>(threadIdx.x % 128), warp = thread / 32, lane = thread % 32;
  float dk[Cfg::kHeadDim / 2], dv[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  // Operand descriptors: the warpgroup's K and V rows (K-major A), the stage-0 Q and dO tiles as K-major B (S, dP)
  // and as N-major B (dK, dV: chunks kQChunkBytes apart, 8-row groups 1024 bytes apart), dS^T and K for dQ.
  const SmemDesc k_rows(make_smem_desc_kmajor<128>(smem + Cfg::kSmemK + wg * 64 * 128));
  const SmemDesc v_rows(make_smem_desc_kmajor<128>(smem + Cfg::kSmemV + wg * 64 * 128));
  const SmemDesc q_kmajor(make_smem_desc_kmajor<128>(smem + Cfg::kSmemQ));
  const SmemDesc do_kmajor(make_smem_desc_kmajor<128>(smem + Cfg::kSmemDo));
  const SmemDesc q_nmajor(make_smem_desc_sw128(smem + Cfg::kSmemQ, Cfg::kQChunkBytes, 1024));
  const SmemDesc do_nmajor(make_smem_desc_sw128(smem + Cfg::kSmemDo, Cfg::kQChunkBytes, 1024));
  // dQ's share of the keys and columns (bwd_config.h kDqSplitKeys).
  const int dq_key0 = Cfg::kDqSplitKeys ? wg * 64 : 0;
  const int dq_chunk = Cfg::kDqSplitKeys ? 0 : wg;
  const SmemDesc ds0(make_smem_desc_sw128(smem + Cfg::kSmemDs + dq_key0 * 128, Cfg::kDsBytes, 1024));
  const SmemDesc k_dq(make_smem_desc_sw128(smem + Cfg::kSmemK + dq_chunk * Cfg::kKVChunkBytes + dq_key0 * 128,
                                           Cfg::kKVChunkBytes, 1024));

  const int key_row = w.n_block * Cfg::kBlockN + wg * 64 + 16 * warp + lane / 4;  // + 8i: the thread's keys
  const kernels::BwdWindow window = bwd_window<Cfg>(p, w.seq);
  const bool keys_past_end = (w.n_block + 1) * Cfg::kBlockN > w.seq.len_k;
  // (The non-causal variants' kernel runs softcapped calls only: a windowed call runs the causal one.)
  const bool softcap = Cfg::kVariants && (!Cfg::kCausal || p.var.softcap_scale != 0.f);
  mbar_wait(&bars.kv, 0u);

  PipelineState<Cfg::kStages> st;
  PipelineState<2> dq_st;
  int step = 0;
  for (int g = 0; g < p.head_ratio; ++g) {  // the query heads of the KV group: the producer's order
    for (int m = w.m_first; m < w.m_end; ++m, ++step) {
      bars.step.wait(st);
      const uint32_t q_off = st.stage * Cfg::kQBytes;
      float s[32], dp[32];
      bwd_gemm_rows<Cfg>(s, k_rows, q_kmajor + q_off);
      bwd_gemm_rows<Cfg>(dp, v_rows, do_kmajor + q_off);
      float2 stat[8];
      bwd_load_columns(smem + Cfg::kSmemLse + st.stage * Cfg::kRowStatBytes, lane, stat);
      wgmma_wait_group<1>();
      fence_regs(s);
      // P^T = exp2(S^T * scale_log2 - lse_log2), 0 at masked (key, query) pairs and at keys past the sequence.
      const int q0 = m * Cfg::kBlockM + 2 * (lane % 4);
      const bool masked =
          keys_past_end || (Cfg::kCausal && window.step_masked(w.n_block, m, Cfg::kBlockN, Cfg::kBlockM));
      uint32_t pa[4][4];
      if constexpr (Cfg::kVariants) {
        // The variants' P^T (kernels/common/bwd_variants.cuh), the window's bounds relative to the diagonal.
        const int rel0 = key_row - q0 - window.d, lo = window.left < 0 ? INT_MIN : -window.left;
        if (softcap) {
          kernels::bwd_variant_probabilities<Element, 64, true, Cfg::kCausal>(
              s, pa, stat, p.var.softcap_scale, p.scale_log2, masked, key_row, w.seq.len_k, rel0, lo, window.right,
              window.chunk, 0);
        } else {
          kernels::bwd_variant_probabilities<Element, 64, false, Cfg::kCausal>(
              s, pa, stat, p.var.softcap_scale, p.scale_log2, masked, key_row, w.seq.len_k, rel0, lo, window.right,
              window.chunk, 0);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int r = acc_index(j, i, e);
              float x = exp2f(fmaf(s[r], p.scale_log2, -(e ? stat[j].y : stat[j].x)));
              if (masked) {
                const int key = key_row + 8 * i, query = q0 + 8 * j + e;
                if (key >= w.seq.len_k || (Cfg::kCausal && !window.visible(key, query))) x = 0.f;
              }
              s[r] = x;
            }
          }
        }
        kernels::pack_p_fragments<Element, 64>(s, pa);
      }
      bwd_gemm_acc<Cfg>(dv, pa, do_nmajor + q_off);
      bwd_load_columns(smem + Cfg::kSmemD + st.stage * Cfg::kRowStatBytes, lane, stat);
      wgmma_wait_group<1>();
      fence_regs(dp);
      // dS^T = P^T (dP^T - D), into registers (dK's A operand) and shared memory (dQ's), 128-byte swizzled rows.
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int r = acc_index(j, i, e);
            dp[r] = s[r] * (dp[r] - (e ? stat[j].y : stat[j].x));
          }
        }
      }
      uint32_t dsa[4][4];
      kernels::pack_p_fragments<Element, 64>(dp, dsa);
      uint8_t* ds = smem + Cfg::kSmemDs + (step & 1) * Cfg::kDsBytes;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = wg * 64 + 16 * warp + lane / 4 + 8 * i;
          *reinterpret_cast<uint32_t*>(ds + row * 128 + ((j ^ (row & 7)) << 4) + 4 * (lane % 4)) =
              dsa[j / 2][(j % 2) * 2 + i];
        }
      }
      bwd_gemm_acc<Cfg>(dk, dsa, q_nmajor + q_off);
      // dS^T of both warpgroups in place before the dQ GEMM reads it through the async proxy.
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      kernels::named_barrier_sync(kBwdDsBarrier, Cfg::kConsumerThreads);
      float dq[Cfg::kDqRegs];
      bwd_gemm_dq<Cfg>(dq, ds0 + (step & 1) * Cfg::kDsBytes, k_dq);
      wgmma_wait_group<0>();
      bwd_keep_allocated(p, step, pa, dsa, &bars.sink);
      fence_regs(dq);
      fence_regs(dk);
      fence_regs(dv);
      bars.step.release(st);  // Q, dO, LSE and D of the stage are read
      bwd_dq_store<Cfg>(smem, bars, dq_st, wg, thread, dq);
      dq_st.advance();
      st.advance();
    }
  }
  bwd_store_dkdv<Cfg>(p, w, wg, warp, lane, dk, dv);
}

}  // namespace flashcore::sm90

// The backward's main loop (FlashAttention-2's structure). The CTA's K and V stay in shared memory; per step (a query
// block of one query head of the KV group) each warp recomputes the probabilities of its 16 keys, transposed, and
// accumulates dV and dK in registers (bwd_gemm.cuh):
//   S^T  = K_w Q^T         P^T  = exp2(S^T * scale_log2 - lse_log2)   [masked: 0]
//   dP^T = V_w dO^T        dS^T = P^T * (dP^T - D)
//   (the variants' kernels: the window's mask; a softcap's tanh on S^T and its derivative on dS^T)
//   dV  += P^T dO          dK  += dS^T Q          (P^T, dS^T as A fragments from registers)
//   dQ   = dS K            (dS^T of every warp through shared memory; added to the workspace, bwd_epilogue.cuh)
// Q, dO and the step's LSE and D rows come by cp.async into kStages buffers (a group per step); the step's dS^T goes
// to shared memory, and one __syncthreads in the middle of the step (every warp's dS^T written, every warp done with
// the step's Q and dO) lets the dQ GEMM read dS^T and the next loads reuse the buffer.
#pragma once
#include <cstdint>

#include "kernels/common/bwd_variants.cuh"
#include "kernels/common/bwd_window.h"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/sm80/bwd_config.h"
#include "kernels/sm80/bwd_epilogue.cuh"
#include "kernels/sm80/bwd_gemm.cuh"
#include "kernels/sm80/bwd_params.h"
#include "kernels/sm80/loads.cuh"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"

namespace flashcore::sm80 {

// The window of the call (kernels/common/bwd_window.h): causal's (-1, 0), or the call's window and chunks in the
// variants' kernels.
template <class Cfg>
__device__ __forceinline__ kernels::BwdWindow bwd_window(const BwdParams& p) {
  if constexpr (Cfg::kVariants) {
    return {p.seqlen_k - p.seqlen_q, p.var.window_left, p.var.window_right, p.var.chunk};
  }
  return {p.seqlen_k - p.seqlen_q, -1, 0};
}

// The CTA's work: key block n_block of KV head kv_head in batch `batch`, and the query blocks [m_first, m_end)
// of every query head of the group, head-major: step s is query block m_first + s % per_head of head
// kv_head * head_ratio + s / per_head. Causal (and windowed): only the query blocks whose rows see one of the keys
// (causal: at least one block is left, the block's first key is seen by a query < seqlen_q; a window may leave none).
template <class Cfg>
struct BwdWork {
  int n_block, kv_head, batch, m_first, per_head, steps;
  __device__ __forceinline__ explicit BwdWork(const BwdParams& p)
      : n_block(static_cast<int>(blockIdx.x)), kv_head(static_cast<int>(blockIdx.y)),
        batch(static_cast<int>(blockIdx.z)), m_first(0) {
    int m_end = p.num_m_blocks / Cfg::kDqBlocks;  // (the host pads num_m_blocks to whole steps)
    if constexpr (Cfg::kCausal && Cfg::kVariants) {
      bwd_window<Cfg>(p).query_blocks(n_block, Cfg::kBlockN, Cfg::kBlockM, p.num_m_blocks, m_first, m_end);
    } else if constexpr (Cfg::kCausal) {  // (BwdWindow::query_blocks of causal's window, in fewer instructions)
      const int first_q = n_block * Cfg::kBlockN - (p.seqlen_k - p.seqlen_q);  // sees the block's first key
      m_first = first_q <= 0 ? 0 : first_q / Cfg::kBlockM;
    }
    per_head = m_end - m_first;
    steps = per_head * p.head_ratio;
  }
};

// A step's (query head, query block). The variants' kernels keep it and move it along step by step; the plain ones
// divide it out of the step's index where they need it. (Register allocation at head dim 128 is at its limit, 255:
// the division's constants made the variants' kernels spill, counters kept across the loop the plain ones.)
struct BwdStepPos {
  int head, m;
  template <class Cfg>
  __device__ __forceinline__ static BwdStepPos of(const BwdWork<Cfg>& w, const BwdParams& p, int step) {
    return {w.kv_head * p.head_ratio + step / w.per_head, w.m_first + step % w.per_head};
  }
  // The next step's (variants' kernels) or step `step`'s (plain).
  template <class Cfg>
  __device__ __forceinline__ void next(const BwdWork<Cfg>& w, const BwdParams& p, int step) {
    if constexpr (Cfg::kVariants) {
      if (++m == w.m_first + w.per_head) m = w.m_first, ++head;
    } else {
      *this = of(w, p, step);
    }
  }
};

// Issue the copies of step `step` into its buffer: the Q and dO tiles (rows past seqlen_q zero-filled) and the
// step's kBlockM scaled LSE and D values (the workspace's rows are padded to whole steps), 16 bytes per thread of the
// first kBlockM / 32 warps.
template <class Cfg>
__device__ __forceinline__ void bwd_load_step(const BwdParams& p, const BwdWork<Cfg>& w, uint32_t smem, int step,
                                              const BwdStepPos& pos) {
  const int stage = step % Cfg::kStages, head = pos.head, m = pos.m;
  load_tile<Cfg, Cfg::kBlockM>(smem + Cfg::kSmemQ + stage * Cfg::kQBytes, slice_base<Cfg>(p.q, w.batch, head),
                               p.q.seq_stride, static_cast<int64_t>(m) * Cfg::kBlockM, p.seqlen_q);
  load_tile<Cfg, Cfg::kBlockM>(smem + Cfg::kSmemDo + stage * Cfg::kQBytes, slice_base<Cfg>(p.dout, w.batch, head),
                               p.dout.seq_stride, static_cast<int64_t>(m) * Cfg::kBlockM, p.seqlen_q);
  constexpr int kUnits = Cfg::kBlockM / 4;  // 16-byte units of a step's LSE (and of its D)
  if (threadIdx.x < 2 * kUnits) {
    const int unit = static_cast<int>(threadIdx.x);  // units 0..kUnits-1: LSE, then D
    const int64_t row = (static_cast<int64_t>(w.batch) * p.num_heads_q + head) * p.seqlen_q_pad +
                        static_cast<int64_t>(m) * Cfg::kBlockM + 4 * (unit % kUnits);
    const float* src = (unit < kUnits ? p.lse_log2 : p.dpsum) + row;
    cp_async_16(smem + Cfg::kSmemStats + stage * Cfg::kStatBytes + 16 * unit, src, true);
  }
}

// A row statistic (scaled LSE or D) for each of the thread's query columns: column 8j + 2(lane%4) + e.
template <int kGroups>
__device__ __forceinline__ void bwd_load_columns(const uint8_t* stats, int lane, float2 (&out)[kGroups]) {
  const float2* s = reinterpret_cast<const float2*>(stats) + lane % 4;
#pragma unroll
  for (int j = 0; j < kGroups; ++j) out[j] = s[4 * j];
}

// Sub-step h of a step (queries h * kSubM .. of the block, bwd_config.h): the warp's P^T and dS^T, dS^T into shared
// memory, dV and dK updated.
template <class Cfg>
__device__ __forceinline__ void bwd_substep(const BwdParams& p, uint8_t* smem, uint32_t base, uint32_t q_tile,
                                            uint32_t do_tile, const uint8_t* stats, int h, int m, bool masked,
                                            int key_row, int warp, int lane, float (&dk)[Cfg::kHeadDim / 2],
                                            float (&dv)[Cfg::kHeadDim / 2]) {
  using Element = typename Cfg::Element;
  constexpr int kN = Cfg::kSubM, kGroups = kN / 8;
  const uint32_t rows = h * kN * Cfg::kRowBytes;  // the sub-step's first Q / dO row
  // P^T = exp2(S^T * scale_log2 - lse_log2), 0 at masked (key, query) pairs and at keys past the sequence.
  float s[kN / 2];
  bwd_gemm_rows<Cfg, kN>(s, base + Cfg::kSmemK, q_tile + rows, 16 * warp, lane);
  float2 stat[kGroups];
  bwd_load_columns<kGroups>(stats + h * kN * 4, lane, stat);
  const int q0 = m * Cfg::kBlockM + h * kN + 2 * (lane % 4);
  uint32_t pa[kN / 16][4], dsa[kN / 16][4];
  if constexpr (Cfg::kVariants) {
    // (The non-causal variants' kernel runs softcapped calls only: a windowed call runs the causal one.)
    // (kernels/common/bwd_variants.cuh; the window's bounds read from the parameters: registers are scarce here.)
    if (!Cfg::kCausal || p.var.softcap_scale != 0.f) {
      kernels::bwd_variant_probabilities<Element, kN, true, Cfg::kCausal>(
          s, pa, stat, p.var.softcap_scale, p.scale_log2, masked, key_row, p.seqlen_k, key_row - q0, p.rel_lo, p.rel_hi,
          p.var.chunk, p.seqlen_k - p.seqlen_q);
    } else {
      kernels::bwd_variant_probabilities<Element, kN, false, Cfg::kCausal>(
          s, pa, stat, p.var.softcap_scale, p.scale_log2, masked, key_row, p.seqlen_k, key_row - q0, p.rel_lo, p.rel_hi,
          p.var.chunk, p.seqlen_k - p.seqlen_q);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int r = acc_index(j, i, e);
          float x = exp2f(fmaf(s[r], p.scale_log2, -(e ? stat[j].y : stat[j].x)));
          if (masked) {
            const int key = key_row + 8 * i, query = q0 + 8 * j + e;
            if (key >= p.seqlen_k || (Cfg::kCausal && key - query > p.rel_hi)) x = 0.f;
          }
          s[r] = x;
        }
      }
    }
  }
  // dS^T = P^T (dP^T - D).
  float dp[kN / 2];
  bwd_gemm_rows<Cfg, kN>(dp, base + Cfg::kSmemV, do_tile + rows, 16 * warp, lane);
  bwd_load_columns<kGroups>(stats + (Cfg::kBlockM + h * kN) * 4, lane, stat);
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = acc_index(j, i, e);
        dp[r] = s[r] * (dp[r] - (e ? stat[j].y : stat[j].x));
      }
    }
  }
  if constexpr (!Cfg::kVariants) kernels::pack_p_fragments<Element, kN>(s, pa);
  kernels::pack_p_fragments<Element, kN>(dp, dsa);
  // dS^T into shared memory for dQ: row = key, 8-column group j of the sub-step's queries is unit h * kGroups + j.
#pragma unroll
  for (int j = 0; j < kGroups; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = 16 * warp + lane / 4 + 8 * i;
      *reinterpret_cast<uint32_t*>(smem + Cfg::kSmemDs + swizzled_offset<Cfg::kDsRowBytes>(row, h * kGroups + j) +
                                   4 * (lane % 4)) = dsa[j / 2][(j % 2) * 2 + i];
    }
  }
  bwd_gemm_acc<Cfg::kRowBytes, Cfg::kHeadDim, kN / 16, Element>(dv, pa, do_tile + rows, 0, lane);
  bwd_gemm_acc<Cfg::kRowBytes, Cfg::kHeadDim, kN / 16, Element>(dk, dsa, q_tile + rows, 0, lane);
}

template <class Cfg>
__device__ __forceinline__ void bwd_mainloop(const BwdParams& p, uint8_t* smem) {
  const BwdWork<Cfg> w(p);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const uint32_t base0 = smem_addr(smem);

  // Groups (per thread, in commit order): [K, V, step 0], [step 1] (two stages), then one per step, issued in its
  // middle for step + kStages (an empty group when there is none, so that the counting stays uniform).
  const int key0 = w.n_block * Cfg::kBlockN;
  load_tile<Cfg, Cfg::kBlockN>(base0 + Cfg::kSmemK, slice_base<Cfg>(p.k, w.batch, w.kv_head), p.k.seq_stride, key0,
                               p.seqlen_k);
  load_tile<Cfg, Cfg::kBlockN>(base0 + Cfg::kSmemV, slice_base<Cfg>(p.v, w.batch, w.kv_head), p.v.seq_stride, key0,
                               p.seqlen_k);
  BwdStepPos pos{w.kv_head * p.head_ratio, w.m_first}, load_pos = pos;  // the step's, and the next load's
#pragma unroll
  for (int s = 0; s < Cfg::kStages; ++s) {
    if (s < w.steps) bwd_load_step<Cfg>(p, w, base0, s, BwdStepPos::of(w, p, s));
    cp_async_commit();
  }
  if constexpr (Cfg::kVariants) {
    if (w.steps > 0) load_pos = BwdStepPos::of(w, p, Cfg::kStages);
  }

  float dk[Cfg::kHeadDim / 2], dv[Cfg::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  const int key_row = key0 + 16 * warp + lane / 4;  // + 8i: the thread's keys
  const bool keys_past_end = key0 + Cfg::kBlockN > p.seqlen_k;
  const int rt = warp % 4, dq_col0 = (warp / 4) * Cfg::kDqCols;  // the warp's dQ rows and columns

  for (int step = 0; step < w.steps; ++step) {
    cp_async_wait<Cfg::kStages - 1>();
    __syncthreads();  // the step's copies have landed; every warp is done with the previous step's dS^T
    // The variants' kernels: the shared-memory addresses recomputed per step rather than kept from before the loop
    // (at head dim 128 the kernels are at 255 registers, and with the window's and softcap's those spilled).
    const uint32_t base = Cfg::kVariants ? opaque_u32(base0) : base0;
    const uint32_t k_tile = base + Cfg::kSmemK, ds_tile = base + Cfg::kSmemDs;
    if constexpr (!Cfg::kVariants) pos.next(w, p, step);
    const int stage = step % Cfg::kStages, m = pos.m;
    const uint32_t q_tile = base + Cfg::kSmemQ + stage * Cfg::kQBytes;
    const uint32_t do_tile = base + Cfg::kSmemDo + stage * Cfg::kQBytes;
    const uint8_t* stats = smem + Cfg::kSmemStats + stage * Cfg::kStatBytes;
    // (BwdWindow::step_masked with the bounds read from the parameters: registers are scarce at head dim 128.)
    const int rel_max = key0 + Cfg::kBlockN - 1 - m * Cfg::kBlockM, rel_min = key0 - (m * Cfg::kBlockM + Cfg::kBlockM - 1);
    const bool masked =
        keys_past_end ||
        (Cfg::kCausal &&
         (rel_max > p.rel_hi ||
          (Cfg::kVariants && (rel_min < p.rel_lo ||
                              (p.var.chunk > 0 && bwd_window<Cfg>(p).step_masked(w.n_block, m, Cfg::kBlockN, Cfg::kBlockM))))));
#pragma unroll
    for (int h = 0; h < Cfg::kBlockM / Cfg::kSubM; ++h) {
      bwd_substep<Cfg>(p, smem, base, q_tile, do_tile, stats, h, m, masked, key_row, warp, lane, dk, dv);
    }
    __syncthreads();  // dS^T whole; the step's Q, dO, LSE and D are read
    if constexpr (!Cfg::kVariants) load_pos.next(w, p, step + Cfg::kStages);
    if (step + Cfg::kStages < w.steps) bwd_load_step<Cfg>(p, w, base, step + Cfg::kStages, load_pos);
    if constexpr (Cfg::kVariants) load_pos.next(w, p, 0);
    cp_async_commit();

    // dQ of the step: computed, then (deterministic: in key-block order) added to the workspace's block.
    const int head = pos.head;
    const int64_t index = (static_cast<int64_t>(w.batch) * p.num_heads_q + head) * p.num_m_blocks + m;
    float* block = p.dq_accum + index * (Cfg::kBlockM * Cfg::kHeadDim);
#pragma unroll
    for (int c = 0; c < Cfg::kDqCols / Cfg::kDqChunk; ++c) {
      const int col0 = dq_col0 + c * Cfg::kDqChunk;
      float dq[Cfg::kDqChunk / 2];
      bwd_gemm_dq<Cfg>(dq, ds_tile, k_tile, rt, col0, lane);
      if (c == 0 && p.dq_semaphore != nullptr) bwd_dq_acquire(p.dq_semaphore + index, w.n_block);
      bwd_dq_add<Cfg>(block, dq, rt, col0, lane);
    }
    if (p.dq_semaphore != nullptr) bwd_dq_release(p.dq_semaphore + index, w.n_block);
    if constexpr (Cfg::kVariants) pos.next(w, p, 0);
  }
  cp_async_wait<0>();  // (the last groups are empty)
  bwd_store_dkdv<Cfg>(p, w.n_block, w.kv_head, w.batch, warp, lane, dk, dv);
}

}  // namespace flashcore::sm80

// Consumer role: one warpgroup owns 64 query rows. Per key block: S = Q K^T by wgmma (both operands
// in shared memory), mask where needed, online softmax in registers, then O += P V by wgmma with P
// taken straight from registers (no round trip through shared memory).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ptx/warp.h"
#include "ptx/wgmma.h"
#include "sm90/kernel_params.h"
#include "sm90/mask.cuh"
#include "sm90/pipeline.cuh"
#include "sm90/scheduler.cuh"
#include "sm90/softmax.cuh"

namespace flashcore::sm90 {

template <class Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Everything a consumer warpgroup carries from the main loop into the epilogue.
template <class Cfg>
struct ConsumerState {
  float o[Cfg::kHeadDim / 2];  // m64 x head_dim fp32 accumulator fragment
  OnlineSoftmax<Cfg::kBlockN> softmax;
};

// S(64 x kBlockN) = Q_slice(64 x D) * K_tile(kBlockN x D)^T. Both K-major, 128B-swizzled chunks of
// 64 columns; a k-step of 16 elements is a 32-byte move of the start address inside a chunk.
template <class Cfg, class Element>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kBlockN / 2], const uint8_t* q_slice, const uint8_t* k_tile) {
  constexpr int kStepsPerChunk = Cfg::kChunkCols / 16;
  ptx::wgmma_fence();
#pragma unroll
  for (int k = 0; k < Cfg::kHeadDim / 16; ++k) {
    const int chunk = k / kStepsPerChunk, kk = k % kStepsPerChunk;
    const uint64_t da = ptx::make_smem_desc_sw128(q_slice + chunk * Cfg::kQChunkBytes + kk * 32, 16, 1024);
    const uint64_t db = ptx::make_smem_desc_sw128(k_tile + chunk * Cfg::kKVChunkBytes + kk * 32, 16, 1024);
    ptx::WgmmaSS<Element, Cfg::kBlockN>::mma(s, da, db, k > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}

// P(64 x kBlockN) as wgmma A fragments (m64k16, 16-bit): for k-step t, this thread's accumulator
// columns 16t..16t+15 repacked into 4 registers. Done for all k-steps before the first P*V wgmma so
// that no register is written between the wgmma.fence and the MMAs.
template <class Cfg, class Element>
__device__ __forceinline__ void convert_p(const float (&p)[Cfg::kBlockN / 2], uint32_t (&a)[Cfg::kBlockN / 16][4]) {
#pragma unroll
  for (int t = 0; t < Cfg::kBlockN / 16; ++t) {
    a[t][0] = pack2<Element>(p[acc_index(2 * t, 0, 0)], p[acc_index(2 * t, 0, 1)]);
    a[t][1] = pack2<Element>(p[acc_index(2 * t, 1, 0)], p[acc_index(2 * t, 1, 1)]);
    a[t][2] = pack2<Element>(p[acc_index(2 * t + 1, 0, 0)], p[acc_index(2 * t + 1, 0, 1)]);
    a[t][3] = pack2<Element>(p[acc_index(2 * t + 1, 1, 0)], p[acc_index(2 * t + 1, 1, 1)]);
  }
}

// O(64 x D) += P(64 x kBlockN, registers) * V_tile(kBlockN x D). V is N-major for this product (its
// rows are keys = the k dimension): leading byte offset = distance between 64-column chunks, stride
// byte offset = distance between groups of 8 key rows.
template <class Cfg, class Element>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kHeadDim / 2], const uint32_t (&a)[Cfg::kBlockN / 16][4],
                                        const uint8_t* v_tile) {
  ptx::wgmma_fence();
#pragma unroll
  for (int t = 0; t < Cfg::kBlockN / 16; ++t) {
    const uint64_t db = ptx::make_smem_desc_sw128(v_tile + t * 16 * Cfg::kRowBytes, Cfg::kKVChunkBytes, 1024);
    ptx::WgmmaRS<Element, Cfg::kHeadDim>::mma(o, a[t], db, 1);
  }
  ptx::wgmma_commit_group();
}

// Round-robin turns between the consumer warpgroups (named barrier kBarrierBase + wg, 256 threads:
// the waiting warpgroup and its predecessor): a warpgroup waits for its turn before issuing its GEMMs
// and hands the turn on right after, so the tensor cores run one warpgroup's GEMMs while the others
// do their softmax.
template <class Cfg>
struct PingPong {
  static constexpr uint32_t kBarrierBase = 1 + Cfg::kConsumerWarpgroups;  // below: epilogue barriers
  static constexpr int kLast = Cfg::kConsumerWarpgroups - 1;
  int warpgroup;
  __device__ __forceinline__ void wait_turn() const {
    if (Cfg::kPingPong) ptx::named_barrier_sync(kBarrierBase + warpgroup, 2 * 128);
  }
  __device__ __forceinline__ void pass_turn() const {
    if (Cfg::kPingPong) {
      ptx::named_barrier_arrive(kBarrierBase + (warpgroup == kLast ? 0 : warpgroup + 1), 2 * 128);
    }
  }
};

// Ring positions and the count of Q tiles received persist across the tiles of a persistent CTA.
template <class Cfg>
struct ConsumerPipe {
  RingState<Cfg::kStages> k_ring, v_ring;
  uint32_t q_loads = 0;
};

// The main loop, software-pipelined inside the warpgroup. Key blocks run from the last to the first, so
// the previous block of block j is j+1: while P_{j+1} V_{j+1} runs on the tensor cores, the softmax of
// S_j runs on the ALUs.
//   prologue : S_last = Q K_last^T; softmax -> P
//   each step: issue S_j = Q K_j^T; issue O += P V_{j+1}; wait S_j; softmax(S_j); wait PV; rescale O
//   tail     : O += P V_0
template <class Cfg, class Element, bool kCausal>
__device__ __forceinline__ void consumer_mainloop(const FwdParams& p, const Tile& tile, const uint8_t* smem,
                                                  Barriers<Cfg::kStages>& bars, int warpgroup,
                                                  ConsumerState<Cfg>& st, ConsumerPipe<Cfg>& pipe) {
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDim / 2; ++i) st.o[i] = 0.f;
  if (tile.n_blocks == 0) {  // every row of the tile is fully masked; Q was not loaded
    if (Cfg::kSeparateO) mbar_arrive(&bars.q_empty);
    return;
  }

  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
  const int row0 = tile.m_block * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup + warp_in_wg * 16 + lane / 4;
  const uint8_t* q_slice = smem + Cfg::kSmemQOffset + warpgroup * Cfg::kRowsPerWarpgroup * Cfg::kRowBytes;
  auto k_tile = [&](int stage) { return smem + Cfg::kSmemKOffset + stage * Cfg::kKVTileBytes; };
  auto v_tile = [&](int stage) { return smem + Cfg::kSmemVOffset + stage * Cfg::kKVTileBytes; };
  auto softmax_step = [&](float (&s)[Cfg::kBlockN / 2], int n_block, float (&rescale)[2]) {
    if (block_needs_mask<Cfg::kBlockM, Cfg::kBlockN, kCausal>(n_block, tile.m_block, p.seqlen_q, p.seqlen_k)) {
      apply_mask<Cfg::kBlockN, kCausal>(s, row0, n_block * Cfg::kBlockN + 2 * (lane % 4), p.seqlen_q, p.seqlen_k);
    }
    st.softmax.update(s, p.scale_log2, rescale);
  };

  const PingPong<Cfg> turn{warpgroup};
  // The last warpgroup lets the first one go first; its last hand-over is skipped so that every
  // barrier sees as many arrivals as waits.
  constexpr int kLast = PingPong<Cfg>::kLast;
  if (warpgroup == kLast) turn.pass_turn();

  RingState<Cfg::kStages>& k_ring = pipe.k_ring;
  RingState<Cfg::kStages>& v_ring = pipe.v_ring;
  float s[Cfg::kBlockN / 2];
  uint32_t p_frag[Cfg::kBlockN / 16][4];
  float rescale[2];

  mbar_wait(&bars.q_full, pipe.q_loads & 1u);
  ++pipe.q_loads;
  int n_block = tile.n_blocks - 1;
  mbar_wait(&bars.k_full[k_ring.stage], k_ring.phase);
  turn.wait_turn();
  gemm_qk<Cfg, Element>(s, q_slice, k_tile(k_ring.stage));
  if (warpgroup != kLast || n_block > 0) turn.pass_turn();
  ptx::wgmma_wait_group<0>();
  ptx::fence_regs(s);
  mbar_arrive(&bars.k_empty[k_ring.stage]);
  if (Cfg::kSeparateO && n_block == 0) mbar_arrive(&bars.q_empty);  // last S GEMM of the tile
  k_ring.advance();
  softmax_step(s, n_block, rescale);
  convert_p<Cfg, Element>(s, p_frag);

  for (--n_block; n_block >= 0; --n_block) {
    mbar_wait(&bars.k_full[k_ring.stage], k_ring.phase);
    mbar_wait(&bars.v_full[v_ring.stage], v_ring.phase);
    turn.wait_turn();
    gemm_qk<Cfg, Element>(s, q_slice, k_tile(k_ring.stage));
    ptx::fence_regs(st.o);
    gemm_pv<Cfg, Element>(st.o, p_frag, v_tile(v_ring.stage));
    if (warpgroup != kLast || n_block > 0) turn.pass_turn();

    ptx::wgmma_wait_group<1>();  // S_j is done; P V may still run
    ptx::fence_regs(s);
    mbar_arrive(&bars.k_empty[k_ring.stage]);
    if (Cfg::kSeparateO && n_block == 0) mbar_arrive(&bars.q_empty);  // last S GEMM of the tile
    k_ring.advance();
    softmax_step(s, n_block, rescale);

    ptx::wgmma_wait_group<0>();
    ptx::fence_regs(st.o);
    mbar_arrive(&bars.v_empty[v_ring.stage]);
    v_ring.advance();
    // Once the running maxima settle, most blocks change no row max of a warp, and the rescale is a
    // multiply by exactly 1. Skipping it pays where the O fragment dwarfs the S fragment (d256: 128
    // FMUL against 40 scores per thread; +3..+10% measured); at d64/d128 the vote costs more than it
    // saves (docs/perf-notes.md, v8). The result is bit-identical either way.
    if (!Cfg::kSkipUnitRescale || __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          st.o[acc_index(j, i, 0)] *= rescale[i];
          st.o[acc_index(j, i, 1)] *= rescale[i];
        }
      }
    }
    convert_p<Cfg, Element>(s, p_frag);
  }

  mbar_wait(&bars.v_full[v_ring.stage], v_ring.phase);
  ptx::fence_regs(st.o);
  gemm_pv<Cfg, Element>(st.o, p_frag, v_tile(v_ring.stage));
  ptx::wgmma_wait_group<0>();
  ptx::fence_regs(st.o);
  mbar_arrive(&bars.v_empty[v_ring.stage]);
  v_ring.advance();
}

}  // namespace flashcore::sm90

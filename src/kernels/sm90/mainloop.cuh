// Consumer main loop: one warpgroup owns 64 query rows. Per key block: S = Q K^T by wgmma (both operands in
// shared memory), mask where needed, online softmax in registers (kernels/common), then O += P V by wgmma
// with P taken straight from registers.
#pragma once
#include <cuda/ptx>

#include <type_traits>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/mask.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/convert_kv.cuh"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/ptx.cuh"
#include "kernels/sm90/scheduler.cuh"

namespace flashcore::sm90 {

using kernels::acc_index;

// Everything a consumer warpgroup carries from the main loop into the epilogue.
template <class Cfg>
struct ConsumerState {
  float o[Cfg::kHeadDimV / 2];  // m64 x head_dim_v fp32 accumulator fragment
  kernels::OnlineSoftmax<Cfg::kBlockN, Cfg::kFp8, Cfg::kLazyRescale, Cfg::kRowAfterRow> softmax;
  float scale_log2;  // of this tile: p.scale_log2, times the tile's Q and K descales for 8-bit inputs, and for a Q
                     // slice converted to fp16 (Cfg::kHalfCompute) 2^-e, e the power of two it took
  float o_scale;     // 8-bit inputs and e4m3 KV caches: the tile's V descale (O = o_scale * P V / sum)
  float q_scale[2];  // int8 Q K^T: the token scales of the thread's two rows, times p.scale_log2
};

// The descales' entry of a tile: its (batch, KV head).
__device__ __forceinline__ int64_t descale_index(const FwdParams& p, const Tile& tile) {
  return static_cast<int64_t>(tile.batch) * p.num_heads_kv + tile.head / p.head_ratio;
}

// The score scale of a tile of descaled rows (Cfg::kDescaled): p.scale_log2 times its Q and K descales.
__device__ __forceinline__ float descaled_score_scale(const FwdParams& p, int64_t idx) {
  float scale = p.scale_log2;
  if (p.q_descale != nullptr) scale *= __ldg(p.q_descale + idx);
  if (p.k_descale != nullptr) scale *= __ldg(p.k_descale + idx);
  return scale;
}

// A tile's score scale and O factor, for 8-bit inputs and e4m3 KV caches (Cfg::kDescaled): the call's scale times the
// descales of the tile's (batch, KV head) (NULL: 1). 16-bit inputs read p.scale_log2 where they use it
// (score_scale), as before the 8-bit path.
template <class Cfg>
__device__ __forceinline__ void tile_scales(const FwdParams& p, const Tile& tile, ConsumerState<Cfg>& st) {
  if constexpr (Cfg::kDescaled) {
    st.o_scale = 1.f;
    const int64_t idx = descale_index(p, tile);
    st.scale_log2 = descaled_score_scale(p, idx);
    if (p.v_descale != nullptr) st.o_scale = __ldg(p.v_descale + idx);
  }
}

template <class Cfg>
__device__ __forceinline__ float score_scale(const FwdParams& p, const ConsumerState<Cfg>& st) {
  if constexpr (Cfg::kDescaled) {
    return st.scale_log2;
  } else if constexpr (Cfg::kInt8QK) {
    return 1.f;  // the running maxima are scaled already (OnlineSoftmax::update_int8)
  } else {
    return p.scale_log2;
  }
}

// int8 Q K^T (precision = INT8): the scales of FwdParams::q_descale (per query token, (B, Hq, Sq)) and k_descale (per
// 128-key block of a KV head, (B, Hkv, ceil(Sk / 128))). A thread's rows past seqlen_q take 1.
template <class Cfg>
__device__ __forceinline__ void int8_row_scales(const FwdParams& p, const Tile& tile, int64_t row0,
                                                ConsumerState<Cfg>& st) {
  const int64_t base = (static_cast<int64_t>(tile.batch) * p.num_heads_q + tile.head) * p.seqlen_q;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t row = row0 + 8 * i;
    st.q_scale[i] = (row < p.seqlen_q ? __ldg(p.q_descale + base + row) : 1.f) * p.scale_log2;
  }
}

// The tile's KV head's K scales (one per 128 keys), found once per tile; block n_block reads entry n_block * kBlockN / 128.
__device__ __forceinline__ const float* int8_key_scales(const FwdParams& p, const Tile& tile) {
  const int64_t kv = static_cast<int64_t>(tile.batch) * p.num_heads_kv + tile.head / p.head_ratio;
  return p.k_descale + kv * ((p.seqlen_k + 127) / 128);
}

// P as MMA A fragments: one group of 4 registers per k-step of the P V GEMM.
template <class Cfg>
inline constexpr int kPSteps = Cfg::kPSteps;

// The consumers' positions in the Q, K and V pipelines; they persist across the tiles of a persistent CTA.
template <class Cfg>
struct ConsumerPipes {
  PipelineState<Cfg::kQStages> q;
  PipelineState<Cfg::kStages> k, v;
};

// S(64 x kBlockN) = Q_slice(64 x D) * K_tile(kBlockN x D)^T. Both K-major, 128B-swizzled chunks of one
// 128-byte row; one MMA k-step is a 32-byte move of the start address inside a chunk. q and k: descriptors of the
// Q slice and of the K tile (OperandDescs).
// kCols: the key block's first kCols keys only (its first half: kHalfFirstBlock below); S's other registers are
// left alone.
template <class Cfg, int kCols = Cfg::kBlockN>
__device__ __forceinline__ void gemm_qk(float (&s)[Cfg::kBlockN / 2], SmemDesc q, SmemDesc k_tile) {
  constexpr int kStepsPerChunk = Cfg::kChunkCols / Cfg::kMmaK;
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < Cfg::kHeadDim / Cfg::kMmaK; ++k) {
    const int chunk = k / kStepsPerChunk, kk = k % kStepsPerChunk;
    const uint64_t da = (q + (chunk * Cfg::kQChunkBytes + kk * 32)).u64();
    const uint64_t db = (k_tile + (chunk * Cfg::kKVChunkBytes + kk * 32)).u64();
    if constexpr (Cfg::kInt8QK) {  // s32 dot products in the same registers (int8 scores: mainloop)
      WgmmaSS<int8_t, Cfg::kBlockN>::mma(reinterpret_cast<uint32_t(&)[Cfg::kBlockN / 2]>(s), da, db, k > 0 ? 1 : 0);
    } else {
      WgmmaSS<typename Cfg::MmaElement, kCols>::mma(reinterpret_cast<float(&)[kCols / 2]>(s), da, db, k > 0 ? 1 : 0);
    }
  }
  wgmma_commit_group();
}

// The tile's first key block (its last, where the causal diagonal and the sequence's end lie) when no row of the
// warpgroup's slice sees its second half: the warpgroup's 64 rows of the diagonal block of a 128-row tile (or a
// sequence that ends in the block's first half). Its S GEMM then computes the first half of the keys (an N = kBlockN / 2
// wgmma) and the second half's scores are -inf, so P is 0 there and the P V GEMM is unchanged
// (docs/decisions.md#half-block). Causal 16-bit rows whose half block has a wgmma shape (kBlockN 128 or 192): in the
// non-causal rows, where only odd lengths take it, the branch alone cost the d64 rows 3-7% at every length
// (docs/decisions.md#half-block).
template <class Cfg>
inline constexpr bool kHalfFirstBlock = Cfg::kCausal && Cfg::kElemBytes == 2 && !Cfg::kInt8QK && !Cfg::kSwapAB &&
                                        (Cfg::kBlockN == 128 || Cfg::kBlockN == 192);

// The 16-bit variants rows (TileShape::variants) take the softcap and the sinks (kernels/common/variant_params.h); the
// host sends no other row a call with one. The window is the causal variants rows' mask (Cfg::kTakesWindow, mask.cuh).
template <class Cfg>
inline constexpr bool kTakesVariants = Cfg::kShape.variants && Cfg::kElemBytes == 2 && !Cfg::kInt8QK;

// P as wgmma A fragments (kernels::pack_p_fragments, or its 8-bit form with the key permutation of element.cuh),
// for all k-steps before the first P*V wgmma so that no register is written between the wgmma.fence and the MMAs.
template <class Cfg>
__device__ __forceinline__ void convert_p(const float (&p)[Cfg::kBlockN / 2], uint32_t (&a)[kPSteps<Cfg>][4]) {
  if constexpr (Cfg::kFp8) {
    kernels::pack_p_fragments_8bit<__nv_fp8_e4m3, Cfg::kBlockN>(p, a);  // e4m3 P for e4m3 and e5m2 inputs
  } else {
    kernels::pack_p_fragments<typename Cfg::PVElement, Cfg::kBlockN>(p, a);
  }
}

// O(64 x D) += P(64 x kBlockN, registers) * V_tile(kBlockN x D). V is key-major here (VLayout::kKeyMajor: its
// rows are the k dimension, an N-major B operand): leading byte offset = distance between row chunks, stride
// byte offset = distance between groups of 8 key rows.
// 8-bit (VLayout::kDimMajor): V is stored transposed, rows = head-dim columns with kVTChunkKeys keys per row chunk
// (128 or 64 bytes, swizzled to that width), a K-major B operand like K in gemm_qk: k-step t is a 32-byte move inside
// chunk t / (kVTChunkKeys / 32).
// v_tile: the V tile's descriptor (OperandDescs).
template <class Cfg>
__device__ __forceinline__ void gemm_pv(float (&o)[Cfg::kHeadDimV / 2], const uint32_t (&a)[kPSteps<Cfg>][4],
                                        SmemDesc v_tile) {
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < kPSteps<Cfg>; ++t) {
    uint32_t offset;
    if constexpr (Cfg::kVLayout == VLayout::kKeyMajor) {
      offset = t * 16 * Cfg::kVRowBytes;
    } else {
      constexpr int kStepsPerChunk = Cfg::kVTChunkKeys / Cfg::kMmaK;
      offset = (t / kStepsPerChunk) * Cfg::kVTChunkBytes + (t % kStepsPerChunk) * 32;
    }
    WgmmaRS<typename Cfg::PVElement, Cfg::kHeadDimV>::mma(o, a[t], (v_tile + offset).u64(), 1);
  }
  wgmma_commit_group();
}

// The shared-memory descriptors of the consumer's GEMM operands, built once per tile: a warpgroup's Q slice in the
// tile's Q stage, and the K and V tiles of stage 0, which a stage moves by whole tiles.
template <class Cfg>
struct OperandDescs {
  SmemDesc q, k0, v0;
  __device__ __forceinline__ OperandDescs(const uint8_t* smem, int warpgroup, int q_stage)
      : q(make_smem_desc_kmajor<Cfg::kQKRowBytes>(smem + Cfg::kSmemQOffset + q_stage * Cfg::kQBytes +
                                                  warpgroup * Cfg::kRowsPerWarpgroup * Cfg::kQKRowBytes)),
        k0(make_smem_desc_kmajor<Cfg::kQKRowBytes>(smem + Cfg::kSmemKOffset)),
        v0(Cfg::kVLayout == VLayout::kKeyMajor
               ? make_smem_desc_mn_major<Cfg::kVRowBytes>(smem + Cfg::kSmemVOffset, Cfg::kVChunkBytes)
               : make_smem_desc_kmajor<Cfg::kVTChunkKeys>(smem + Cfg::kSmemVOffset)) {}
  __device__ __forceinline__ SmemDesc k(int stage) const { return k0 + stage * Cfg::kKTileBytes; }
  __device__ __forceinline__ SmemDesc v(int stage) const { return v0 + stage * Cfg::kVTileBytes; }
};

// A sequence's rows past its keys can lie inside the tensor (a KV cache's unused rows, the next sequence of a packed
// batch, the rest of a page: FwdParams::zero_v_tail), so TMA loads whatever they hold: the mask makes P = 0 there,
// but 0 * NaN is NaN in P V. Before the P V of a tile's last key block, the consumer threads zero that block's V rows
// at or past seqlen_k (whole 128-byte rows, so the swizzle does not matter) and meet at a named barrier. In a dense
// batch those rows are past the tensor's end: TMA fills zeros.
// Named barrier ids (0 is __syncthreads): 1..W the epilogue's (one per consumer warpgroup), W+1..2W the ping-pong
// turns, 2W+1 the V zeroing below and the fp16 conversion of Q (convert_kv.cuh q_slice_to_half), which never overlap
// (W = consumer warpgroups, at most 3: ids stay below 16).
template <class Cfg>
inline constexpr uint32_t kZeroVBarrier = 1 + 2 * Cfg::kConsumerWarpgroups;

template <class Cfg>
__device__ __forceinline__ void zero_v_rows_past_end(const FwdParams& p, const Tile& tile, int v_block,
                                                     const uint8_t* v_tile) {
  if (Cfg::kElemBytes == 1 || !p.zero_v_tail) return;  // (8-bit calls have no serving layouts)
  const int64_t left = tile.seq.seqlen_k - static_cast<int64_t>(v_block) * Cfg::kBlockN;  // same in the whole CTA
  if (left >= Cfg::kBlockN) return;
  const int valid = left > 0 ? static_cast<int>(left) : 0;
  const int units_per_chunk = (Cfg::kBlockN - valid) * (Cfg::kVRowBytes / 16);
  uint8_t* base = const_cast<uint8_t*>(v_tile) + valid * Cfg::kVRowBytes;
  for (int u = static_cast<int>(threadIdx.x) - 128; u < units_per_chunk * Cfg::kVChunks; u += Cfg::kConsumerThreads) {
    const int chunk = u / units_per_chunk, rest = u % units_per_chunk;
    *reinterpret_cast<uint4*>(base + chunk * Cfg::kVChunkBytes + rest * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // generic writes before wgmma's (async proxy) reads
  kernels::named_barrier_sync(kZeroVBarrier<Cfg>, Cfg::kConsumerThreads);
}

// The softmax of block j must run while the P V GEMM of block j + 1 does; ptxas undid that twice
// (docs/decisions.md#pv-overlap):
// - it counts a wgmma's register A operand as read when the wgmma issues, not when it completes, so it gave the
//   registers of the running GEMM's P to the next block's P and then waited for the GEMM before packing into them;
// - within one basic block it moves the wait for the P V GEMM up to the first instruction it can, before the softmax.
// A branch between the softmax and that wait that reads the running P fixes both: it keeps the two P register sets
// apart and ends the basic block. It tests FwdParams::never_block (-1, a block no tile has), so the fold never runs,
// but ptxas cannot tell.
template <class Cfg>
__device__ __forceinline__ void keep_allocated(const FwdParams& p, int n_block, const uint32_t (&a)[kPSteps<Cfg>][4],
                                               uint32_t* sink) {
  if (n_block == p.never_block) {
    uint32_t x = 0;
#pragma unroll
    for (int t = 0; t < kPSteps<Cfg>; ++t) x ^= a[t][0] ^ a[t][1] ^ a[t][2] ^ a[t][3];
    *reinterpret_cast<volatile uint32_t*>(sink) = x;
  }
}

// Round-robin turns between the consumer warpgroups (named barrier kBarrierBase + wg, 256 threads: the waiting
// warpgroup and its predecessor): a warpgroup waits for its turn before issuing its GEMMs and hands the turn
// on right after, so the tensor cores run one warpgroup's GEMMs while the others do their softmax.
template <class Cfg>
struct PingPong {
  static constexpr uint32_t kBarrierBase = 1 + Cfg::kConsumerWarpgroups;  // below: epilogue barriers
  static constexpr int kLast = Cfg::kConsumerWarpgroups - 1;
  int warpgroup;
  __device__ __forceinline__ void wait_turn() const {
    if (Cfg::kPingPong) kernels::named_barrier_sync(kBarrierBase + warpgroup, 2 * 128);
  }
  __device__ __forceinline__ void pass_turn() const {
    if (Cfg::kPingPong) kernels::named_barrier_arrive(kBarrierBase + (warpgroup == kLast ? 0 : warpgroup + 1), 2 * 128);
  }
};

// The main loop, software-pipelined inside the warpgroup. Key blocks run from the last to the first, so the
// previous block of block j is j+1: while P_{j+1} V_{j+1} runs on the tensor cores, the softmax of S_j runs on
// the ALUs.
//   prologue : S_last = Q K_last^T; softmax -> P
//   each step: issue S_j = Q K_j^T; issue O += P V_{j+1}; wait S_j; softmax(S_j); wait PV; rescale O
//   tail     : O += P V_first
template <class Cfg>
__device__ __forceinline__ void consumer_mainloop(const FwdParams& p, const Tile& tile, const uint8_t* smem,
                                                  SharedBarriers<Cfg>& bars, int warpgroup, ConsumerState<Cfg>& st,
                                                  ConsumerPipes<Cfg>& pipes) {
  // bf16 Q on an e4m3 cache: Q to fp16 first, before O is zeroed (later, ptxas spilled 4-8 bytes of the d128 and d256
  // consumers). One consumer warpgroup: no ping-pong turn to take before the Q wait.
  float q_unscale = 1.f;
  if constexpr (Cfg::kHalfCompute) {
    if (tile.keys.count() != 0) {
      bars.q.wait(pipes.q);
      q_unscale = q_slice_to_half<Cfg>(const_cast<uint8_t*>(smem) + Cfg::kSmemQOffset + pipes.q.stage * Cfg::kQBytes,
                                       bars.q_amax, kZeroVBarrier<Cfg>);
    }
  }
#pragma unroll
  for (int i = 0; i < Cfg::kHeadDimV / 2; ++i) st.o[i] = 0.f;
  tile_scales<Cfg>(p, tile, st);
  if constexpr (Cfg::kHalfCompute) st.scale_log2 *= q_unscale;
  // Q: taken for every tile (producer.cuh); a tile with no key block has nothing to compute.
  // (The wait comes after the first ping-pong hand-over below: waiting first cost 2-3% on short non-causal
  // sequences, docs/decisions.md#q-wait.)
  if (tile.keys.count() == 0) {
    bars.q.wait(pipes.q);
    if (Cfg::kSeparateO) bars.q.release(pipes.q);
    return;
  }

  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
  const int64_t row0 = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup +
                       warp_in_wg * 16 + lane / 4;
  const OperandDescs<Cfg> desc(smem, warpgroup, pipes.q.stage);
  // 8-bit V transposed by the producer warps: wait for their transpose rather than for the load (pipeline.cuh).
  const bool v_by_producer = v_transposed_by_producer<Cfg>(p);
  auto v_tile = [&](int stage) { return smem + Cfg::kSmemVOffset + stage * Cfg::kVTileBytes; };
  if constexpr (Cfg::kInt8QK) int8_row_scales<Cfg>(p, tile, row0, st);
  // k_scale: int8 Q K^T only, the block's K scale (read before its S GEMM is waited for).
  auto softmax_step = [&](float (&s)[Cfg::kBlockN / 2], int n_block, float (&rescale)[2], float k_scale) {
    if constexpr (Cfg::kInt8QK) {
#pragma unroll
      for (int i = 0; i < Cfg::kBlockN / 2; ++i) s[i] = kernels::int8_bits_to_float(__float_as_uint(s[i]));
    }
    if constexpr (kTakesVariants<Cfg>) {
      if (p.softcap_scale != 0.f) kernels::apply_softcap(s, p.softcap_scale);
    }
    if (kernels::block_needs_mask<Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal, Cfg::kTakesWindow>(tile.seq, p, n_block,
                                                                                      tile.m_block)) {
      kernels::apply_mask<Cfg::kBlockN, Cfg::kCausal, Cfg::kTakesWindow>(
          s, tile.seq, p, row0, static_cast<int64_t>(n_block) * Cfg::kBlockN + 2 * (lane % 4));
    }
    if constexpr (Cfg::kInt8QK) {
      const float sc[2] = {st.q_scale[0] * k_scale, st.q_scale[1] * k_scale};
      st.softmax.update_int8(s, sc, rescale);
    } else {
      st.softmax.update(s, score_scale<Cfg>(p, st), rescale);
    }
  };
  const float* k_scales = Cfg::kInt8QK ? int8_key_scales(p, tile) : nullptr;
  auto key_scale = [&](int n_block) { return Cfg::kInt8QK ? __ldg(k_scales + n_block * Cfg::kBlockN / 128) : 1.f; };
  // The Q tile may go as soon as the tile's last S GEMM has read it, when O has its own staging buffer.
  auto after_s_gemm = [&](int n_block) {
    bars.k.release(pipes.k);
    pipes.k.advance();
    if (Cfg::kSeparateO && n_block == tile.keys.begin) bars.q.release(pipes.q);
  };

  const PingPong<Cfg> turn{warpgroup};
  // The last warpgroup lets the first one go first; its last hand-over is skipped so that every barrier sees as
  // many arrivals as waits.
  constexpr int kLast = PingPong<Cfg>::kLast;
  if (warpgroup == kLast) turn.pass_turn();
  bars.q.wait(pipes.q);

  // A warpgroup whose 64 rows all lie past the sequence's end (the last tile of a 192-row config when seqlen_q is
  // not a multiple of 192: at 512 and 1024 rows, a ninth of the slices) computes nothing, so that the tile's other
  // warpgroups get the tensor cores to themselves. 192-row configs only (three consumer warpgroups): the 128-row
  // ones pad 64 rows or more only at odd lengths, and compile as before. It keeps step with the others on every
  // shared barrier, in the order of the loop below (K and V stages, the ping-pong turns, the Q release), and leaves
  // O = 0 and an empty softmax: the epilogue stores none of its rows (docs/decisions.md#empty-warpgroup). Dense batches
  // only (no V rows to zero, zero_v_rows_past_end): the V zeroing's named barrier met from this second code path made
  // compute-sanitizer's synccheck report divergent threads, so the serving layouts keep computing those rows.
  if (Cfg::kConsumerWarpgroups == 3 && !p.zero_v_tail &&
      static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup >= tile.seq.seqlen_q) {
    for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
      const bool first = n_block == tile.keys.end - 1;  // the prologue's block: no P V before it
      bars.k.wait(pipes.k);
      if (!first) bars.wait_v(pipes.v, v_by_producer);
      turn.wait_turn();
      if (warpgroup != kLast || n_block > tile.keys.begin) turn.pass_turn();
      after_s_gemm(n_block);
      if (!first) {
        bars.v.release(pipes.v);
        pipes.v.advance();
      }
    }
    bars.wait_v(pipes.v, v_by_producer);
    bars.v.release(pipes.v);
    pipes.v.advance();
    return;
  }

  float s[Cfg::kBlockN / 2];
  // P in two register sets that take turns (p_a, p_b): the softmax of block j packs its P into the set the P V GEMM of
  // block j + 1 is not reading (keep_allocated).
  uint32_t p_a[kPSteps<Cfg>][4], p_b[Cfg::kTwoPSets ? kPSteps<Cfg> : 1][4];
  float rescale[2];

  int n_block = tile.keys.end - 1;
  float k_scale = key_scale(n_block);
  // Same for the warpgroup's four warps (its slice's last row): a uniform branch around the first S GEMM.
  const bool half = kHalfFirstBlock<Cfg> &&
                    kernels::second_half_masked(
                        kernels::windowed<Cfg>(tile.seq, p), n_block, Cfg::kBlockN,
                        static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + (warpgroup + 1) * Cfg::kRowsPerWarpgroup - 1,
                        Cfg::kCausal);
  bars.k.wait(pipes.k);
  turn.wait_turn();
  // The block up to its P, in each branch as a whole (a wgmma pipeline across the branches' join made ptxas serialize
  // every wgmma of the kernel, C7511).
  auto first_block = [&](auto cols) {
    constexpr int kCols = decltype(cols)::value;
    gemm_qk<Cfg, kCols>(s, desc.q, desc.k(pipes.k.stage));
    if (warpgroup != kLast || n_block > tile.keys.begin) turn.pass_turn();
    wgmma_wait_group<0>();
    fence_regs(s);
#pragma unroll
    for (int i = kCols / 2; i < Cfg::kBlockN / 2; ++i) s[i] = -INFINITY;  // defined values where the wgmma wrote none
    after_s_gemm(n_block);
    softmax_step(s, n_block, rescale, k_scale);
    convert_p<Cfg>(s, p_a);
  };
  if constexpr (kHalfFirstBlock<Cfg>) {
    if (half) {
      first_block(std::integral_constant<int, Cfg::kBlockN / 2>{});
    } else {
      first_block(std::integral_constant<int, Cfg::kBlockN>{});
    }
  } else {
    first_block(std::integral_constant<int, Cfg::kBlockN>{});
  }

  // One key block n_block: S = Q K^T and O += P_in V of the block before, the softmax of S while P V runs, P into p_out.
  auto step = [&](const uint32_t(&p_in)[kPSteps<Cfg>][4], uint32_t(&p_out)[kPSteps<Cfg>][4]) {
    k_scale = key_scale(n_block);
    bars.k.wait(pipes.k);
    bars.wait_v(pipes.v, v_by_producer);
    zero_v_rows_past_end<Cfg>(p, tile, n_block + 1, v_tile(pipes.v.stage));
    turn.wait_turn();
    gemm_qk<Cfg>(s, desc.q, desc.k(pipes.k.stage));
    fence_regs(st.o);
    gemm_pv<Cfg>(st.o, p_in, desc.v(pipes.v.stage));
    if (warpgroup != kLast || n_block > tile.keys.begin) turn.pass_turn();

    wgmma_wait_group<1>();  // S_j is done; P V may still run
    fence_regs(s);
    after_s_gemm(n_block);
    softmax_step(s, n_block, rescale, k_scale);
    if constexpr (Cfg::kTwoPSets) {
      convert_p<Cfg>(s, p_out);
      keep_allocated<Cfg>(p, n_block, p_in, &bars.sink);
    }

    wgmma_wait_group<0>();
    fence_regs(st.o);
    bars.v.release(pipes.v);
    pipes.v.advance();
    // Rescale "vote" rows: once the running maxima settle, most blocks change no row max of a warp (kept within a
    // slack of 2^8 in 16-bit and int8 P: OnlineSoftmax, kLazyRescale), and the rescale is a multiply by exactly 1
    // that the warp skips (docs/decisions.md#lazy-rescale).
    if (!Cfg::kSkipUnitRescale || __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
      kernels::rescale_rows<Cfg::kHeadDimV>(st.o, rescale);
    }
    if constexpr (!Cfg::kTwoPSets) convert_p<Cfg>(s, p_out);  // (p_out is p_in: only after the wait)
  };
  // The first key block's P V.
  auto last_pv = [&](const uint32_t(&p_in)[kPSteps<Cfg>][4]) {
    bars.wait_v(pipes.v, v_by_producer);
    zero_v_rows_past_end<Cfg>(p, tile, tile.keys.begin, v_tile(pipes.v.stage));
    fence_regs(st.o);
    gemm_pv<Cfg>(st.o, p_in, desc.v(pipes.v.stage));
    wgmma_wait_group<0>();
    fence_regs(st.o);
    bars.v.release(pipes.v);
    pipes.v.advance();
  };

  if constexpr (Cfg::kTwoPSets) {
    for (--n_block;; --n_block) {  // unrolled by two, so that p_a and p_b swap roles at compile time
      if (n_block < tile.keys.begin) {
        last_pv(p_a);
        break;
      }
      step(p_a, p_b);
      if (--n_block < tile.keys.begin) {
        last_pv(p_b);
        break;
      }
      step(p_b, p_a);
    }
  } else {
    for (--n_block; n_block >= tile.keys.begin; --n_block) step(p_a, p_a);
    last_pv(p_a);
  }
}

}  // namespace flashcore::sm90

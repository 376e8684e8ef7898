// The main loop (FlashAttention-2 structure): each warp owns kRowsPerWarp query rows of the CTA's Q tile, as
// kMTiles row tiles of 16 (config.h) that share every K and V fragment the warp loads. Per key block,
// last to first: S = Q K^T with mma.sync m16n8k16 (Q from registers or shared memory, K by ldmatrix), masking
// where the block needs it, the online softmax of kernels/common in registers, then O += P V with P converted
// in registers to A fragments and V by ldmatrix.trans (gemm.cuh). K/V tiles arrive through a kStages-deep cp.async
// ring; with three stages, P V of a key block runs interleaved with S of the next (gemm_pv_qk). Split tiles (config.h,
// kSplit 2) compute S for their half of each block's keys and O for their half of the head dim, with the row maxima
// and P exchanged between the two warps of a pair (pair.cuh).
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/mask.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/sm80/config.h"
#include "kernels/sm80/gemm.cuh"
#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/loads.cuh"
#include "kernels/sm80/pair.cuh"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/smem.cuh"
#include "kernels/sm80/tile.cuh"

namespace flashcore::sm80 {

using kernels::acc_index;

// The online softmax; with Cfg::kLazyRescale (softmax.cuh: row maxima kept within 2^8), most key blocks leave every
// row max of a warp alone and the warp skips the O rescale, at kBlockN 64 as many FMULs per block as the block has
// exponentials at head dim 128 (docs/decisions.md#sm80-lazy-rescale).
template <class Cfg>
using Softmax = kernels::OnlineSoftmax<Cfg::kWarpKeys, false, Cfg::kLazyRescale>;

// What a warp carries from the main loop into the epilogue, per row tile t (rows warp * kRowsPerWarp + 16 t ..).
template <class Cfg>
struct WarpState {
  float o[Cfg::kMTiles][Cfg::kWarpDim / 2];  // 16 x kWarpDim fp32 accumulators: kWarpDim / 8 tiles of m16n8
  Softmax<Cfg> softmax[Cfg::kMTiles];
};

// Cfg::kSoftmaxInSmem: where a thread's row statistics (OnlineSoftmax's maxima and sums) wait between key blocks, one
// 16-byte slot per (row tile, thread), so that they hold no register across the GEMMs. Loaded before each softmax step
// and stored after it (the __syncthreads of every block keeps the compiler from carrying them in registers instead).
template <class Cfg>
struct SoftmaxStats {
  uint8_t* base;
  __device__ __forceinline__ float4* slot(int t) const {
    return reinterpret_cast<float4*>(base) + t * Cfg::kThreads + threadIdx.x;
  }
  __device__ __forceinline__ void load(Softmax<Cfg>& sm, int t) const {
    const float4 v = *slot(t);
    sm.row_max[0] = v.x, sm.row_max[1] = v.y, sm.row_sum[0] = v.z, sm.row_sum[1] = v.w;
  }
  __device__ __forceinline__ void store(const Softmax<Cfg>& sm, int t) const {
    *slot(t) = make_float4(sm.row_max[0], sm.row_max[1], sm.row_sum[0], sm.row_sum[1]);
  }
};

// The tile's main loop. kStages == 1: single K and V buffers in FlashAttention-2's order (below). Otherwise a ring;
// pipeline (per thread, cp.async groups in commit order):
//   group "Q and the first K", group "the first V", then one group per key block, the first kStages - 2 of them
//   issued before the loop;
//   iteration i (key block keys.end - 1 - i, ring stage i % kStages): wait until its group has landed
//   (cp.async.wait_group kStages - 2), __syncthreads (every thread's copies visible; every warp is done with
//   iteration i - 1, whose stage is refilled next), issue the loads of the block kStages - 1 ahead into that
//   stage and commit (an empty group when there is none, so the counting stays uniform), then compute. The first
//   iteration waits for its V only before P V (docs/decisions.md#sm80-overlap).
// Returns with no copy in flight; a tile without key blocks (rows that see no key) loads nothing.
// A paged cache's K/V come through the block table (loads.cuh, PagedRows), in the same loop: a loop of its own per
// kernel cost 17 MB of library (four images of every portable kernel) for 1-2% on dense calls
// (docs/decisions.md#sm80-copies).
template <class Cfg>
__device__ __forceinline__ void mainloop(const FwdParams& p, const Tile& tile, uint8_t* smem, WarpState<Cfg>& st) {
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
    for (int i = 0; i < Cfg::kWarpDim / 2; ++i) st.o[t][i] = 0.f;
  }
  if (tile.keys.count() == 0) return;

  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int kv_head = tile.head / p.head_ratio;
  const uint32_t smem_base = smem_addr(smem);
  const uint32_t q_tile = smem_base + Cfg::kSmemQOffset;
  auto k_tile = [&](int stage) { return smem_base + Cfg::kSmemKOffset + stage * Cfg::kKTileBytes; };
  auto v_tile = [&](int stage) { return smem_base + Cfg::kSmemVOffset + stage * Cfg::kVTileBytes; };

  // Packed (varlen) tensors are one batch entry of total rows (the sequence's rows start at q_row0 / k_row0); a paged
  // K/V's batch entries are its pages (loads.cuh, PagedRows).
  const uint8_t* q_slice = slice_base<Cfg>(p.q, p.cu_seqlens_q != nullptr ? 0 : tile.batch, tile.head);
  const int kv_entry = p.cu_seqlens_k != nullptr || p.block_table != nullptr ? 0 : tile.kv_batch;  // its cache slot
  const uint8_t* k_slice = slice_base<Cfg>(p.k, kv_entry, kv_head);
  const uint8_t* v_slice = slice_base<Cfg>(p.v, kv_entry, kv_head);
  const int64_t q_row0 = tile.seq.q_row0 + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM;
  const int64_t q_end = tile.seq.q_row0 + tile.seq.seqlen_q;
  const int64_t k_end = tile.seq.k_row0 + tile.seq.seqlen_k;
  // A paged K/V: rows through the block table (the sequence's keys start at row 0; loads.cuh, PagedRows).
  const int32_t* table =  // (no arithmetic on a null table)
      p.block_table != nullptr ? p.block_table + static_cast<int64_t>(tile.kv_batch) * p.block_table_stride : nullptr;
  const PagedRows k_pages{table, p.k.batch_stride * Cfg::kElemBytes, &p};
  const PagedRows v_pages{table, p.v.batch_stride * Cfg::kElemBytes, &p};
  // K and V tiles load in strictly decreasing key-block order, each block once: a cursor per tensor holds this
  // thread's first source unit of the next block to load and steps back one block per load (loads.cuh, load_rows).
  const int64_t k_row_bytes = p.k.seq_stride * Cfg::kElemBytes;
  const int64_t v_row_bytes = p.v.seq_stride * Cfg::kElemBytes;
  const int64_t last_row0 = tile.seq.k_row0 + static_cast<int64_t>(tile.keys.end - 1) * Cfg::kBlockN;
  const uint8_t* k_next = thread_source<Cfg>(k_slice, last_row0, k_row_bytes);
  const uint8_t* v_next = thread_source<Cfg>(v_slice, last_row0, v_row_bytes);
  // (The tile's shared-memory rows: K's, or V's, which are shorter with a V head dim of its own.)
  auto load_kv_tile = [&](auto tile_row_bytes, uint32_t dst, const uint8_t*& next, const uint8_t* slice,
                          int64_t row_bytes, const PagedRows& pages, int n_block) {
    constexpr int kTileRowBytes = decltype(tile_row_bytes)::value;
    const int64_t row0 = tile.seq.k_row0 + static_cast<int64_t>(n_block) * Cfg::kBlockN;
    if (p.block_table == nullptr && row0 + Cfg::kBlockN <= k_end) {
      load_rows<Cfg, Cfg::kBlockN, kTileRowBytes>(dst, next, row_bytes);
    } else {
      load_checked<Cfg, Cfg::kBlockN, kTileRowBytes>(dst, slice, row_bytes, row0, k_end, p.block_table != nullptr,
                                                     pages);
    }
    next -= Cfg::kBlockN * row_bytes;
  };
  auto load_k = [&](int n_block, int stage) {
    load_kv_tile(std::integral_constant<int, Cfg::kRowBytes>{}, k_tile(stage), k_next, k_slice, k_row_bytes, k_pages,
                 n_block);
  };
  auto load_v = [&](int n_block, int stage) {
    load_kv_tile(std::integral_constant<int, Cfg::kVRowBytes>{}, v_tile(stage), v_next, v_slice, v_row_bytes, v_pages,
                 n_block);
  };
  auto load_kv = [&](int n_block, int stage) { load_k(n_block, stage), load_v(n_block, stage); };

  load_tile<Cfg, Cfg::kBlockM>(q_tile, q_slice, p.q.seq_stride, q_row0, q_end);
  if constexpr (Cfg::kStages == 1) {
    // Single buffers: both start empty, so the first block's V goes out with Q and K, in a group of its own (the
    // loop's first S waits for Q and K only).
    cp_async_commit();
    load_k(tile.keys.end - 1, 0);
    cp_async_commit();
    load_v(tile.keys.end - 1, 0);
    cp_async_commit();
  } else {
    // Ring: Q and the first K in one group, the first V in the next, so that the first S = Q K^T need not wait for
    // V (the loop's first iteration waits for it before P V); then the blocks kStages - 2 ahead.
    load_k(tile.keys.end - 1, 0);
    cp_async_commit();
    load_v(tile.keys.end - 1, 0);
    cp_async_commit();
#pragma unroll
    for (int s = 1; s < Cfg::kStages - 1; ++s) {
      if (tile.keys.end - 1 - s >= tile.keys.begin) load_kv(tile.keys.end - 1 - s, s);
      cp_async_commit();
    }
  }

  // Q first: its group is the oldest, so waiting for all but the newest ones leaves the K/V in flight (ring: Q's
  // group holds the first K too). Single buffers with Q read from shared memory at every k-step (head dim 256) skip
  // this wait: the loop's first one, for K, covers Q too.
  QOperand<Cfg> q;
  if constexpr (Cfg::kStages > 1 || Cfg::kQInRegs) {
    cp_async_wait<Cfg::kStages == 1 ? 2 : Cfg::kStages - 1>();
    __syncthreads();
  }
  q.load(q_tile, warp, lane);

  // This thread's first row of row tile 0 (its second is row0 + 8; tile t adds 16 t) within the sequence.
  const int64_t row0 = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + tile_row0<Cfg>(warp, 0) + lane / 4;
  float s[Cfg::kMTiles][Cfg::kWarpKeys / 2];
  uint32_t pa[Cfg::kMTiles][Cfg::kWarpKeys / 16][4];
  float rescale[2];
  // Split tiles (pair.cuh): this warp's keys of each block and columns of O.
  const int half = warp_half<Cfg>(warp);
  const uint32_t k_part = half * Cfg::kWarpKeys * Cfg::kRowBytes;
  const uint32_t v_part = half * Cfg::kWarpKeys * Cfg::kVRowBytes;
  const uint32_t v_cols = half * Cfg::kWarpDim * Cfg::kElemBytes;
  [[maybe_unused]] const PairExchange<Cfg> pair{smem + Cfg::kSmemPairOffset, warp, lane};
  auto qk = [&](int stage) { gemm_qk<Cfg>(s, q, k_tile(stage) + k_part, lane); };
  // O += P V: split tiles take their own keys' P first, then the partner's.
  auto pv = [&](int stage) {
    if constexpr (Cfg::kSplit == 2) {
      gemm_pv<Cfg>(st.o, pa, v_tile(stage) + v_part + v_cols, lane);
      gemm_pv_frags<Cfg>(st.o, [&](int kk, uint32_t(&a)[Cfg::kMTiles][4]) { pair.partner_p(kk, a); },
                         v_tile(stage) + (Cfg::kWarpKeys * Cfg::kVRowBytes - v_part) + v_cols, lane);
    } else {
      gemm_pv<Cfg>(st.o, pa, v_tile(stage), lane);
    }
  };
  const SoftmaxStats<Cfg> stats{smem + Cfg::kSmemSoftmaxOffset};
  if constexpr (Cfg::kSoftmaxInSmem) {
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) stats.store(st.softmax[t], t);
  }
  // The scores S of key block n_block, masked, through the online softmax (O rescaled), as P fragments.
  auto softmax_to_p = [&](int n_block) {
    const bool masked =
        kernels::block_needs_mask<Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal, Cfg::kTakesWindow>(tile.seq, p, n_block, tile.m_block);
    // This thread's first key of the block (split tiles: in the warp's half).
    const int64_t col0 = static_cast<int64_t>(n_block) * Cfg::kBlockN + half * Cfg::kWarpKeys + 2 * (lane % 4);
    if (p.softcap_scale != 0.f) {  // (before the mask: kernels::apply_softcap)
#pragma unroll
      for (int t = 0; t < Cfg::kMTiles; ++t) kernels::apply_softcap(s[t], p.softcap_scale);
    }
    if constexpr (Cfg::kSplit == 2) {
      float m[Cfg::kMTiles][2];
#pragma unroll
      for (int t = 0; t < Cfg::kMTiles; ++t) {
        if (masked) kernels::apply_mask<Cfg::kWarpKeys, Cfg::kCausal, Cfg::kTakesWindow>(s[t], tile.seq, p, row0 + 16 * t, col0);
        st.softmax[t].block_max(s[t], m[t]);
      }
      pair.combine_max(m);
#pragma unroll
      for (int t = 0; t < Cfg::kMTiles; ++t) {
        if constexpr (Cfg::kSoftmaxInSmem) stats.load(st.softmax[t], t);
        st.softmax[t].update_with_max(s[t], p.scale_log2, m[t], rescale);
        if constexpr (Cfg::kSoftmaxInSmem) stats.store(st.softmax[t], t);
        kernels::rescale_rows<Cfg::kWarpDim>(st.o[t], rescale);
        convert_p<Cfg>(s[t], pa[t]);
      }
      pair.publish_p(pa);
    } else {
#pragma unroll
      for (int t = 0; t < Cfg::kMTiles; ++t) {
        if (masked) kernels::apply_mask<Cfg::kWarpKeys, Cfg::kCausal, Cfg::kTakesWindow>(s[t], tile.seq, p, row0 + 16 * t, col0);
        if constexpr (Cfg::kSoftmaxInSmem) stats.load(st.softmax[t], t);
        st.softmax[t].update(s[t], p.scale_log2, rescale);
        if constexpr (Cfg::kSoftmaxInSmem) stats.store(st.softmax[t], t);
        if (!Cfg::kLazyRescale || __any_sync(0xffffffffu, rescale[0] != 1.f || rescale[1] != 1.f)) {
          kernels::rescale_rows<Cfg::kWarpDim>(st.o[t], rescale);
        }
        convert_p<Cfg>(s[t], pa[t]);
      }
    }
  };

  if constexpr (Cfg::kStages == 1) {
    // Single K and V buffers, FlashAttention-2's order: at the top of block j only K_j is in flight (the first
    // block: Q, K and V). V_j loads while S_j = Q K_j^T runs; once every warp is done with K_j, K_{j-1} loads while
    // the softmax and P V_j run.
    for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
      if (n_block == tile.keys.end - 1) {
        cp_async_wait<1>();
        __syncthreads();  // Q and K_j have landed (V_j may be in flight)
      } else {
        cp_async_wait<0>();
        __syncthreads();  // K_j has landed; every warp is done with V_{j+1}
        load_v(n_block, 0);
        cp_async_commit();
      }
      qk(0);
      cp_async_wait<0>();
      __syncthreads();  // V_j has landed; every warp is done with K_j
      if (n_block > tile.keys.begin) load_k(n_block - 1, 0);
      cp_async_commit();
      softmax_to_p(n_block);
      pv(0);
    }
    cp_async_wait<0>();  // (the last commit is an empty group)
  } else if constexpr (Cfg::kOverlap) {
    // Three stages, P V of block j with S of block j - 1 (gemm_pv_qk). Groups: [Q, K_0], [V_0], [block 1], then one
    // per block. At the top of the step of block j (its S is done, its P waits): block j - 1 has landed (wait for
    // every group: it was issued one step earlier), __syncthreads (every warp is done with the previous step, which
    // read the stage refilled next), issue block j - 2 into the stage block j + 1 used.
    gemm_qk<Cfg>(s, q, k_tile(0), lane);
    softmax_to_p(tile.keys.end - 1);
    int stage = 0;  // block n_block's
    for (int n_block = tile.keys.end - 1; n_block > tile.keys.begin; --n_block) {
      const int next = stage == 2 ? 0 : stage + 1;  // block n_block - 1's
      cp_async_wait<0>();
      __syncthreads();
      if (n_block - 2 >= tile.keys.begin) load_kv(n_block - 2, next == 2 ? 0 : next + 1);
      cp_async_commit();
      gemm_pv_qk<Cfg>(st.o, pa, v_tile(stage), s, q, k_tile(next), lane);
      softmax_to_p(n_block - 1);
      stage = next;
    }
    if (tile.keys.count() == 1) {  // the first V has not been waited for
      cp_async_wait<0>();
      __syncthreads();
    }
    gemm_pv<Cfg>(st.o, pa, v_tile(stage), lane);
  } else {
    // The first iteration: Q and its K have been waited for above, and the stage its loads go to (kStages - 1) has
    // never been read, so it skips the wait at the top; its V is waited for before P V instead.
    int stage = 0;
    for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
      const bool first = n_block == tile.keys.end - 1;
      if (!first) {
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();
      }
      const int ahead = n_block - (Cfg::kStages - 1);
      if (ahead >= tile.keys.begin) load_kv(ahead, stage == 0 ? Cfg::kStages - 1 : stage - 1);
      cp_async_commit();
      qk(stage);
      softmax_to_p(n_block);
      if (first) {
        cp_async_wait<Cfg::kStages - 1>();  // the first V (the groups of the blocks ahead may still be in flight)
        __syncthreads();
      }
      pv(stage);
      stage = stage == Cfg::kStages - 1 ? 0 : stage + 1;
    }
  }
  if constexpr (Cfg::kSoftmaxInSmem) {
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) stats.load(st.softmax[t], t);
  }
}

}  // namespace flashcore::sm80

// Epilogue: normalize O, convert it to the output element type, stage it in shared memory in the swizzled layout of
// the O tensor map (128-byte rows, 64-byte at head dim 96) and write it with TMA stores; LSE (natural log, fp32) goes
// straight from registers when requested. Rows past the end of the tensor are clipped by the TMA unit, which for
// dense batches is the end of the sequence; in a packed (varlen) batch the next sequence follows, so a slice that ends
// past its sequence is copied out of the staging buffer by the warpgroup's threads, row by row, up to the sequence's end
// (store_clipped).
#pragma once
#include <cuda/ptx>

#include "kernels/common/combine.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/masked_v.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/mainloop.cuh"

namespace flashcore::sm90 {

// Causal 16-bit rows: O elements that a non-finite V value at a key their row does not see reached through the P V
// GEMM of a diagonal block (0 * NaN) are recomputed without it (kernels/common/masked_v.cuh): one FFMA per accumulator
// of a row pair's first row and a warp vote per tile; the rare path, for both rows, only when the vote fires. Rows
// past the sequence are stored by no one; rows whose LSE is NaN (a NaN or +Inf score) are NaN whatever V holds. 8-bit
// rows: not yet (their V is transposed). An e4m3 KV cache's rows read K and V in e4m3 there (K's descale in the score
// scale, V's with the normalizer after it).
template <class Cfg>
inline constexpr bool kRepairsMaskedV = Cfg::kCausal && Cfg::kElemBytes == 2;

// The rare path of one row (row: within the tile; cols: kernels::repair_masked_v_row's). It decodes its tile again from
// the index: reading the caller's Tile kept the tile's fields live through the main loop, which moved loop values out
// of uniform registers (docs/decisions.md#masked-v). Inlined: out of line, the call made ptxas serialize the wgmmas of
// a 192 x 64 d128 variant (C7514). Returns the row's new normalizer, or -1 when the row needed no repair.
template <class Cfg, class Cols>
__device__ __forceinline__ float repair_row_of_tile(const FwdParams& p, int tile_idx, int row, float scale_log2,
                                                    Cols cols) {
  const Tile tile = decode_tile<Cfg>(p, tile_idx);
  const int64_t seq_row = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + row;
  if (seq_row >= tile.seq.seqlen_q) return -1.f;  // stored by no one
  float inv_sum = -1.f;
  const bool repaired =
      kernels::repair_masked_v_row<typename Cfg::Element, Cfg::kHeadDim, Cols, typename Cfg::KVElement>(
          p, p, p.q_ref, p.k_ref, p.v_ref, tile, tile.head / p.head_ratio, seq_row, scale_log2, Cfg::kBlockN, inv_sum,
          cols);
  return repaired ? inv_sum : -1.f;
}

// scale_of(): the scale of scores computed from the caller's Q (score_scale, without the power of two of a Q slice
// converted to fp16, Cfg::kHalfCompute), asked for only when a row needs the repair.
template <class Cfg, class ScaleOf>
__device__ __forceinline__ void repair_masked_v(const FwdParams& p, int tile_idx, int warpgroup, ConsumerState<Cfg>& st,
                                                float (&inv_sum)[2], const float (&lse)[2], ScaleOf scale_of) {
  if constexpr (kRepairsMaskedV<Cfg>) {
    // The first row of the pair (its partner holds the same columns: kernels::any_nonfinite).
    const bool fired =
        kernels::any_nonfinite<Cfg::kHeadDimV / 4>([&](int e) { return st.o[acc_index(e / 2, 0, e % 2)]; });
    if (!__any_sync(0xffffffffu, fired)) return;
    const int lane = threadIdx.x % 32;
    const int row = warpgroup * Cfg::kRowsPerWarpgroup + ((threadIdx.x / 32) % 4) * 16 + lane / 4;
    const float scale_log2 = scale_of();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (lse[i] != lse[i]) continue;
      const float inv = repair_row_of_tile<Cfg>(p, tile_idx, row + 8 * i, scale_log2, [&](auto&& f) {
#pragma unroll
        for (int j = 0; j < Cfg::kHeadDimV / 8; ++j) {
          f(kernels::acc_col(j, 0, lane), st.o[acc_index(j, i, 0)]);
          f(kernels::acc_col(j, 1, lane), st.o[acc_index(j, i, 1)]);
        }
      });
      if (inv >= 0.f) inv_sum[i] = inv;
    }
  }
}

// Split-KV: this split's O (normalized by its own sum, fp32) and LSE go to the workspace, rows [0, seqlen_q) of
// (batch, head, split); the tile's last split (merge_if_last_split) or the combine kernel (combine.cuh) weighs the
// splits by their LSE.
template <class Cfg>
__device__ __forceinline__ void store_split_partial(const FwdParams& p, const Tile& tile, int warpgroup,
                                                    const ConsumerState<Cfg>& st, const float (&inv_sum)[2],
                                                    const float (&lse)[2]) {
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
  const int64_t seqlen_q = tile.seq.seqlen_q;
  // Decode rows: part (batch, head, split) holds the sequence's rows. Prefill split rows: slot part0 + split (the
  // part's index among the call's parts) holds the tile's kBlockM rows.
  const int64_t part = Cfg::kLastRoundSplit
                           ? tile.part0 + tile.split
                           : (static_cast<int64_t>(tile.batch) * p.num_heads_q + tile.head) * p.num_splits + tile.split;
  const int64_t part_rows = Cfg::kLastRoundSplit ? Cfg::kBlockM : seqlen_q;
  const int64_t row0 = Cfg::kLastRoundSplit ? static_cast<int64_t>(tile.m_block) * Cfg::kBlockM : 0;
  float* o_rows = p.o_partial + part * part_rows * Cfg::kHeadDimV;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t seq_row = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup +
                            warp_in_wg * 16 + lane / 4 + 8 * i;
    if (seq_row >= seqlen_q) continue;
    const int64_t row = seq_row - row0;
    float* o_row = o_rows + row * Cfg::kHeadDimV + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDimV / 8; ++j) {
      *reinterpret_cast<float2*>(o_row + 8 * j) =
          make_float2(st.o[kernels::acc_index(j, i, 0)] * inv_sum[i], st.o[kernels::acc_index(j, i, 1)] * inv_sum[i]);
    }
    if (lane % 4 == 0) p.lse_partial[part * part_rows + row] = lse[i];
  }
}

// A part of a split tile counts itself in the tile's byte `counter` of the workspace header (p.split_counters) once all
// `threads` threads of its barrier have stored their partials; returns true (to every thread) for the part that
// completes the count of `parts`, which puts the byte back to 0 for the next call. Every thread fences its partial
// stores before the count; the last part's counting thread fences after it, so that its reads of the other parts'
// partials (through L2) see them. Counts stay below 256: no carry into the next tile's byte.
__device__ __forceinline__ bool count_part_is_last(const FwdParams& p, int64_t counter, int parts, uint32_t barrier,
                                                   int threads, bool counting_thread) {
  __threadfence();
  kernels::named_barrier_sync(barrier, threads);
  bool last = false;
  if (counting_thread) {
    uint32_t* word = p.split_counters + counter / 4;
    const int shift = 8 * static_cast<int>(counter % 4);
    const uint32_t before = atomicAdd(word, 1u << shift);
    last = ((before >> shift) & 0xffu) == static_cast<uint32_t>(parts - 1);
    if (last) {
      atomicSub(word, static_cast<uint32_t>(parts) << shift);
      __threadfence();
    }
  }
  return kernels::named_barrier_or(barrier, threads, last);
}

// The merge fused into the split kernel (p.split_counters; split_plan.h): after storing its partials, a split counts
// itself in its tile's byte of the workspace header, and the split that completes the count merges the tile's rows
// into O and LSE (combine.cuh, one warp per row) and puts the byte back to 0 for the next call. Saves the combine
// kernel's launch and its wait for the whole grid (docs/decisions.md#fused-merge). The count: count_part_is_last. The
// result does not depend on which split comes last: the merge reads the splits in order.
template <class Cfg>
__device__ __forceinline__ void merge_if_last_split(const FwdParams& p, const Tile& tile, int warpgroup) {
  static_assert(Cfg::kConsumerWarpgroups == 1, "one count per split: the split rows have one consumer warpgroup");
  constexpr int kDimV = Cfg::kHeadDimV;  // O's head dim
  using Out = typename Cfg::OutElement;
  const int wg_thread = threadIdx.x % 128;
  const int64_t dense = (static_cast<int64_t>(tile.batch) * p.num_heads_q + tile.head) * p.num_m_blocks + tile.m_block;
  if (!count_part_is_last(p, dense, p.num_splits, 1 + warpgroup, 128, wg_thread == 0)) return;
  const int64_t seqlen_q = tile.seq.seqlen_q;
  const int64_t first = (static_cast<int64_t>(tile.batch) * p.num_heads_q + tile.head) * p.num_splits;
  const int64_t row0 = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM;
  const int64_t row_end = row0 + Cfg::kBlockM < seqlen_q ? row0 + Cfg::kBlockM : seqlen_q;
  char* o_rows = static_cast<char*>(p.o) + tile.batch * p.o_stride_batch_bytes + tile.head * p.o_stride_head_bytes;
  for (int64_t row = row0 + wg_thread / 32; row < row_end; row += 4) {
    const kernels::SplitRows splits{p.lse_partial + first * seqlen_q + row,
                                    p.o_partial + (first * seqlen_q + row) * kDimV, seqlen_q, p.num_splits};
    float acc[kDimV / 64][2], max_lse;
    const float total = kernels::merge_split_share<kDimV>(splits, 0, 1, acc, max_lse);
    Out* o_row = reinterpret_cast<Out*>(o_rows + (tile.seq.q_row0 + row) * p.o_stride_seq_bytes);
    float* lse = p.lse == nullptr ? nullptr
                                  : p.lse + tile.batch * p.lse_stride_batch + tile.head * p.lse_stride_head +
                                        tile.seq.q_row0 + row;
    kernels::store_merged_row<Out, kDimV>(o_row, lse, acc, total, max_lse);
  }
}

// The prefill split rows' merge (Cfg::kLastRoundSplit), in the registers of the tile's last part: every part stores its
// partial (store_split_partial) and counts itself in its tile's byte of the workspace header (tile.counter) once its
// consumer warpgroups have met at a barrier; the CTA whose count completes the tile reads the other parts' O and LSE at
// its own threads' positions (two rows of head_dim / 4 columns per thread, every load independent of the others)
// and folds them into its O registers, inv_sum and LSE, and the tile is then stored like a whole one. Returns false
// for the other parts. The result does not depend on which part comes last: the parts are combined in part order,
// the last one's own values taken from its registers exactly as it stored them.
template <class Cfg>
__device__ __forceinline__ bool merge_parts_in_registers(const FwdParams& p, const Tile& tile, int warpgroup,
                                                         ConsumerState<Cfg>& st, float (&inv_sum)[2],
                                                         float (&lse)[2]) {
  constexpr int kDimV = Cfg::kHeadDimV;  // O's head dim
  constexpr uint32_t kMergeBarrier = 2 + 2 * Cfg::kConsumerWarpgroups;  // after the epilogue, turn and zero-V ones
  static_assert(kMergeBarrier < 16, "named barriers 0-15");
  const bool counting = threadIdx.x == 128;  // the first consumer thread (consumers follow the producer warpgroup)
  if (!count_part_is_last(p, tile.counter, tile.splits, kMergeBarrier, Cfg::kConsumerThreads, counting)) return false;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = warpgroup * Cfg::kRowsPerWarpgroup + warp_in_wg * 16 + lane / 4 + 8 * i;  // within the tile
    if (static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + row >= tile.seq.seqlen_q) continue;  // stored by no part
    float m = lse[i];
    for (int s = 0; s < tile.splits; ++s) {
      if (s != tile.split) m = fmaxf(m, __ldcg(p.lse_partial + (tile.part0 + s) * Cfg::kBlockM + row));
    }
    if (m == -INFINITY) continue;  // no part saw a key of this row: O = 0, LSE = -inf
    // This part's O as it stored it, then every part in part order (the result does not depend on which is last).
    float own[kDimV / 4];
#pragma unroll
    for (int j = 0; j < kDimV / 8; ++j) {
      own[2 * j] = st.o[kernels::acc_index(j, i, 0)] * inv_sum[i];
      own[2 * j + 1] = st.o[kernels::acc_index(j, i, 1)] * inv_sum[i];
      st.o[kernels::acc_index(j, i, 0)] = st.o[kernels::acc_index(j, i, 1)] = 0.f;
    }
    float total = 0.f;
    for (int s = 0; s < tile.splits; ++s) {
      if (s == tile.split) {
        const float w = __expf(lse[i] - m);
        total += w;
#pragma unroll
        for (int j = 0; j < kDimV / 8; ++j) {
          st.o[kernels::acc_index(j, i, 0)] = fmaf(w, own[2 * j], st.o[kernels::acc_index(j, i, 0)]);
          st.o[kernels::acc_index(j, i, 1)] = fmaf(w, own[2 * j + 1], st.o[kernels::acc_index(j, i, 1)]);
        }
        continue;
      }
      const int64_t slot = tile.part0 + s;
      const float w = __expf(__ldcg(p.lse_partial + slot * Cfg::kBlockM + row) - m);
      total += w;
      const float* o_row = p.o_partial + (slot * Cfg::kBlockM + row) * kDimV + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kDimV / 8; ++j) {
        const float2 v = __ldcg(reinterpret_cast<const float2*>(o_row + 8 * j));
        st.o[kernels::acc_index(j, i, 0)] = fmaf(w, v.x, st.o[kernels::acc_index(j, i, 0)]);
        st.o[kernels::acc_index(j, i, 1)] = fmaf(w, v.y, st.o[kernels::acc_index(j, i, 1)]);
      }
    }
    inv_sum[i] = __fdividef(1.f, total);  // total >= 1: the max's part contributes exp(0)
    lse[i] = m + __logf(total);
  }
  return true;
}

// The staged slice's first `rows` rows (16-byte units, un-swizzled) to O at sequence row `row`.
template <class Cfg>
__device__ __forceinline__ void store_clipped(const FwdParams& p, const Tile& tile, const uint8_t* stage, int64_t row,
                                              int rows) {
  constexpr int kChunkUnits = Cfg::kOutRowBytes / 16;  // 16-byte units of a chunk row
  constexpr int kUnitsPerRow = Cfg::kOutChunks * kChunkUnits;
  char* o_rows = static_cast<char*>(p.o) + (tile.seq.q_row0 + row) * p.o_stride_seq_bytes +
                 static_cast<int64_t>(tile.head) * p.o_stride_head_bytes;
  for (int u = static_cast<int>(threadIdx.x % 128); u < rows * kUnitsPerRow; u += 128) {
    const int r = u / kUnitsPerRow, chunk = (u % kUnitsPerRow) / kChunkUnits, unit = u % kChunkUnits;
    const uint4 val = *reinterpret_cast<const uint4*>(stage + chunk * Cfg::kOutChunkBytes + r * Cfg::kOutRowBytes +
                                                      swizzled_unit<Cfg::kOutRowBytes>(r, unit) * 16);
    *reinterpret_cast<uint4*>(o_rows + r * p.o_stride_seq_bytes + (u % kUnitsPerRow) * 16) = val;
  }
}

template <class Cfg>
__device__ __forceinline__ void consumer_epilogue(const FwdParams& p, int tile_idx, const Tile& tile, uint8_t* smem,
                                                  SharedBarriers<Cfg>& bars, int warpgroup, ConsumerState<Cfg>& st,
                                                  const ConsumerPipes<Cfg>& pipes) {
  using Out = kernels::ElemTraits<typename Cfg::OutElement>;
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
  const int wg_thread = threadIdx.x % 128;

  float inv_sum[2], lse[2];
  // (The variants rows, which take sinks, are never split: the split merges add no sink.)
  static_assert(!kTakesVariants<Cfg> || !Cfg::kSplitKv, "a split variants row would count its sink in every part");
  st.softmax.finalize(score_scale<Cfg>(p, st), inv_sum, lse,
                      kTakesVariants<Cfg> ? kernels::sink_log2_of(p.sinks, tile.head) : -INFINITY);
  repair_masked_v<Cfg>(p, tile_idx, warpgroup, st, inv_sum, lse, [&] {
    // (Recomputed without the Q slice's power of two: the consumers' q_amax slots may hold the next tile's already.)
    if constexpr (Cfg::kHalfCompute) return descaled_score_scale(p, descale_index(p, tile));
    return score_scale<Cfg>(p, st);
  });
  if constexpr (Cfg::kDescaled) {
    inv_sum[0] *= st.o_scale;
    inv_sum[1] *= st.o_scale;
  }
  if constexpr (Cfg::kSplitKv) {
    if (Cfg::kLastRoundSplit ? tile.splits > 1 : p.num_splits > 1) {
      store_split_partial<Cfg>(p, tile, warpgroup, st, inv_sum, lse);
      // The CTA's next part (split CTAs are persistent) takes the Q stage: hand it back once every thread of the
      // warpgroup is past its last GEMM (with a separate O buffer the main loop did).
      if (!Cfg::kSeparateO) {
        kernels::named_barrier_sync(1 + warpgroup, 128);
        if (wg_thread == 0) bars.q.release(pipes.q);
      }
      // O is written by the tile's last split, or by the combine kernel after the grid.
      if constexpr (Cfg::kLastRoundSplit) {
        // The tile's last part stores the merged O below, like a whole tile.
        if (!merge_parts_in_registers<Cfg>(p, tile, warpgroup, st, inv_sum, lse)) return;
      } else {
        if (p.split_counters != nullptr) merge_if_last_split<Cfg>(p, tile, warpgroup);
        return;
      }
    }
    // One part (the plan's choice when the tiles alone fill the GPU, or a prefill split row's whole tile): O is final
    // here, and the dense store below writes it; the host launches no combine (docs/decisions.md#split-one-part).
  }

  // Staging: this warpgroup's 64 rows of the O buffer, or of the Q tile (no longer read: its last wgmma has
  // completed). A separate O buffer may still be read by the previous tile's store: wait for it.
  uint8_t* stage = smem + Cfg::kSmemOOffset + warpgroup * Cfg::kRowsPerWarpgroup * Cfg::kOutRowBytes;
  if (Cfg::kSeparateO) {
    if (wg_thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    kernels::named_barrier_sync(1 + warpgroup, 128);
  }
  // One stmatrix.x4 per two column units j, j + 1 of the warp's 16 rows: its matrices are (rows 0-7, unit j), (rows
  // 8-15, unit j), (rows 0-7, unit j + 1), (rows 8-15, unit j + 1), whose fragments are the accumulators' pairs, and
  // lane l gives the address of row l % 8 of matrix l / 8 (a 16-byte unit of the swizzled row). A quarter of the
  // stores of one 32-bit store per pair (docs/decisions.md#epilogue-stmatrix).
  static_assert(Cfg::kHeadDimV % 16 == 0, "whole stmatrix.x4 column pairs");
  const int st_row = warp_in_wg * 16 + 8 * ((lane / 8) % 2) + lane % 8;  // this lane's row within the slice
  const uint32_t st_base = static_cast<uint32_t>(__cvta_generic_to_shared(stage)) + st_row * Cfg::kOutRowBytes;
  constexpr int kChunkUnits = Cfg::kOutRowBytes / 16;  // 8, or 4 in 64-byte rows
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDimV / 8; j += 2) {
    // j even: units j % kChunkUnits and the next of one chunk
    const int chunk = j / kChunkUnits, unit = j % kChunkUnits + lane / 16;
    const uint32_t r[4] = {
        Out::pack2(st.o[acc_index(j, 0, 0)] * inv_sum[0], st.o[acc_index(j, 0, 1)] * inv_sum[0]),
        Out::pack2(st.o[acc_index(j, 1, 0)] * inv_sum[1], st.o[acc_index(j, 1, 1)] * inv_sum[1]),
        Out::pack2(st.o[acc_index(j + 1, 0, 0)] * inv_sum[0], st.o[acc_index(j + 1, 0, 1)] * inv_sum[0]),
        Out::pack2(st.o[acc_index(j + 1, 1, 0)] * inv_sum[1], st.o[acc_index(j + 1, 1, 1)] * inv_sum[1])};
    stmatrix_x4(st_base + chunk * Cfg::kOutChunkBytes + swizzled_unit<Cfg::kOutRowBytes>(st_row, unit) * 16, r);
  }
  // Generic-proxy writes must be visible to the TMA (async proxy) before the store is issued.
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  kernels::named_barrier_sync(1 + warpgroup, 128);

  const int64_t slice_row = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup;
  const bool clipped = kServingLayouts<Cfg> && p.cu_seqlens_q != nullptr && slice_row + Cfg::kRowsPerWarpgroup > tile.seq.seqlen_q;
  if (clipped) {
    const int64_t rows = tile.seq.seqlen_q - slice_row;
    store_clipped<Cfg>(p, tile, stage, slice_row, rows > 0 ? static_cast<int>(rows) : 0);
    kernels::named_barrier_sync(1 + warpgroup, 128);  // every thread has read the staging buffer
  } else if (wg_thread == 0) {
#pragma unroll
    for (int c = 0; c < Cfg::kOutChunks; ++c) {
      const int32_t coords[4] = {c * Cfg::kOutChunkCols, static_cast<int32_t>(tile.seq.q_row0 + slice_row), tile.head,
                                 kServingLayouts<Cfg> && p.cu_seqlens_q != nullptr ? 0 : tile.batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &p.tma_o, coords,
                                      stage + c * Cfg::kOutChunkBytes);
    }
    cuda::ptx::cp_async_bulk_commit_group();
  }

  if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t row = slice_row + warp_in_wg * 16 + lane / 4 + 8 * i;
      if (row < tile.seq.seqlen_q) {
        p.lse[tile.batch * p.lse_stride_batch + tile.head * p.lse_stride_head + tile.seq.q_row0 + row] = lse[i];
      }
    }
  }

  // Staged in the Q tile: hand it back to the producer once the bulk store has read it.
  if (!Cfg::kSeparateO && wg_thread == 0) {
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    bars.q.release(pipes.q);
  }
}

}  // namespace flashcore::sm90

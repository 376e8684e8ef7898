// Parameters of the sm90 forward kernel, built on the host (backend.cpp) and passed by value as a
// __grid_constant__ argument so the tensor maps live in parameter space, where TMA can read them.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/common/serving_layout.h"
#include "kernels/common/tensor_ref.h"
#include "kernels/common/variant_params.h"

namespace flashcore::sm90 {

// The serving layouts (seqused_k, packed, paged; LSE strides): kernels/common/serving_layout.h; the window, chunk,
// softcap and sinks: kernels/common/variant_params.h.
struct FwdParams : kernels::ServingLayout, kernels::VariantParams {
  CUtensorMap tma_q;  // (D, Sq, Hq, B), box (one 128-byte row chunk, kBlockM)
  CUtensorMap tma_k;  // (D, Sk, Hkv, B), box (chunk, kBlockN)
  CUtensorMap tma_v;  // (D, Sk, Hkv, B), box (chunk, kBlockN)
  CUtensorMap tma_o;  // (D, Sq, Hq, B), box (chunk, 64): one store per consumer warpgroup and chunk
  float* lse;         // optional, (B, Hq, Sq) contiguous
  int* tile_counter;  // dynamic scheduler only: a zeroed int in the workspace, left zeroed
  // Read by the scheduler only (scheduler.cuh turns them into each tile's SeqInfo and KeyRange).
  int64_t seqlen_q;
  int64_t seqlen_k;
  int num_heads_q;
  int head_ratio;     // num_heads_q / num_heads_kv
  int num_m_blocks;   // ceil(seqlen_q / kBlockM)
  int num_tiles;      // num_m_blocks * num_heads_q * batch (x num_splits for kSplitKv)
  int num_slices;      // batch * num_heads_q
  int section_slices;  // causal tile order: slices per L2 section (tile_math.h, lpt_section_slices)
  float scale_log2;   // softmax_scale * log2(e)
  // Split-KV only (Schedule::kSplitKv): per (batch, head, split) the partial O (fp32, [Sq][D], normalized by the
  // split's own sum) and LSE ([Sq], -inf for a split that sees no key), in the workspace; combine.cuh merges them.
  float* o_partial;
  float* lse_partial;
  int num_splits;        // >= 1
  int blocks_per_split;  // key blocks per split
  // Prefill split rows (Cfg::kLastRoundSplit; split_plan.h last_round_plan): tile indices below split_whole_tiles are whole
  // tiles; the rest's tiles are cut into num_splits equal parts, one index each (num_tiles = whole + rest x parts).
  int split_whole_tiles;
  // One byte per (dense) tile in the workspace's zero-filled header (split_plan.h): how many of the tile's splits
  // have stored their partials; the split that brings it to num_splits merges the tile (epilogue.cuh) and puts it
  // back to 0. nullptr: the combine kernel merges after the grid (more tiles than bytes, or more than 255 splits).
  uint32_t* split_counters;
  // Paged KV cache (ServingLayout::block_table): tma_k / tma_v map (D, page_size, Hkv, num_pages) with boxes of
  // kv_slice_rows rows (a divisor of both page_size and kBlockN). Packed batches: the TMA maps have one batch entry.
  int kv_slice_rows;
  // Paged: slices per key block (block_n / kv_slice_rows) and whole key blocks per chunk of the table warp's page slots
  // (kPageChunk / slices; producer.cuh PageFetcher).
  int page_block_slices, page_chunk_blocks;
  bool zero_v_tail;  // V rows past a sequence's keys lie inside the tensor (seqused_k, packed or paged K/V)
  // Where O goes for the stores TMA cannot clip (a packed tile that ends past its sequence) and for the split merge:
  // O's base and byte strides (LSE's: ServingLayout).
  void* o;
  int64_t o_stride_batch_bytes, o_stride_seq_bytes, o_stride_head_bytes;
  // 8-bit inputs: per (batch, KV head) factors, (batch, num_heads_kv) contiguous, NULL = 1 (flashcore.h). Unless
  // transpose_v, tma_v maps a transposed V (the workspace, or V given transposed): (keys, head_dim, Hkv, B), keys
  // innermost, permuted within groups of 32 (kernels::p8_key_of_slot), box (vt_chunk_keys keys, head_dim rows).
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int num_heads_kv;
  // 8-bit V as stored (rows = keys): tma_v then maps V like K, and the producer warps transpose each tile in shared
  // memory (transpose_v.cuh). Only for configs with KernelConfig::kTransposesV.
  bool transpose_v;
  // Q, K and V as the C ABI gives them (what the TMA maps above map, for 16-bit inputs): read only by the causal
  // 16-bit rows' rare path for non-finite V at masked keys (kernels/common/masked_v.cuh).
  kernels::TensorRef q_ref, k_ref, v_ref;
  // -1, a key block no tile has: the branch that keeps the P V GEMM's P registers allocated until the GEMM is waited
  // for (mainloop.cuh, keep_allocated) compares with it, so it never runs but ptxas cannot drop it.
  int never_block;
};

// Whether the producer warps transpose this call's V (a config that can, on the kernel's route): the TMA thread loads V
// as stored, the transposer warps run, and the consumers wait for them.
template <class Cfg>
constexpr bool v_transposed_by_producer(const FwdParams& p) {
  return Cfg::kTransposesV && p.transpose_v;
}

}  // namespace flashcore::sm90

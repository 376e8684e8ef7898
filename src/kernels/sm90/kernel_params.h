// Parameters of the sm90 forward kernel, built on the host (backend.cpp) and passed by value as a
// __grid_constant__ argument so the tensor maps live in parameter space, where TMA can read them.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace flashcore::sm90 {

struct FwdParams {
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
  float scale_log2;   // softmax_scale * log2(e)
  // Split-KV only (Schedule::kSplitKv): per (batch, head, split) the partial O (fp32, [Sq][D], normalized by the
  // split's own sum) and LSE ([Sq], -inf for a split that sees no key), in the workspace; combine.cuh merges them.
  float* o_partial;
  float* lse_partial;
  // KV cache lengths (flashcore_attention_params::seqused_k): keys of batch b are rows [0, seqused_k[b]) of its
  // seqlen_k, clamped to [0, seqlen_k]; nullptr: seqlen_k for every b.
  const int32_t* seqused_k;
  int num_splits;        // >= 1
  int blocks_per_split;  // key blocks per split
};

}  // namespace flashcore::sm90

// Parameters of the sm90 forward kernel, built on the host (dispatch.cu) and passed by value as a
// __grid_constant__ argument so the tensor maps live in parameter space, where TMA can read them.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace flashcore::sm90 {

struct FwdParams {
  CUtensorMap tma_q;  // (D, Sq, Hq, B), box (64, kBlockM)
  CUtensorMap tma_k;  // (D, Sk, Hkv, B), box (64, kBlockN)
  CUtensorMap tma_v;  // (D, Sk, Hkv, B), box (64, kBlockN)
  CUtensorMap tma_o;  // (D, Sq, Hq, B), box (64, 64): one store per consumer warpgroup and chunk
  float* lse;         // optional, (B, Hq, Sq) contiguous
  int seqlen_q;
  int seqlen_k;
  int num_heads_q;
  int head_ratio;     // num_heads_q / num_heads_kv
  int num_m_blocks;   // ceil(seqlen_q / kBlockM)
  int num_tiles;      // num_m_blocks * num_heads_q * batch; CTAs loop over them (scheduler.cuh)
  float scale_log2;   // softmax_scale * log2(e)
};

}  // namespace flashcore::sm90

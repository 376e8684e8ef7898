// GQA packing for decode: a call with one query row per sequence (seqlen_q == 1) and G = num_heads_q / num_heads_kv
// > 1 query heads per KV head is rewritten as G query rows of num_heads_kv heads, so that one tile holds all the
// query heads that share a KV head and the kernel reads each KV head once (instead of once per query head).
//   Q, O:  (batch, 1, kv_head * G + g, d)  ->  (batch, g, kv_head, d): the seq stride becomes the head stride, the
//          head stride G times it;
//   LSE:   (batch, num_heads_q, 1) and (batch, num_heads_kv, G) are the same contiguous memory;
//   causal: with one query row, bottom-right alignment lets it see every key, so the packed call is non-causal
//          (G rows at one position, not G positions).
// Pure host arithmetic on validated params (tests/cpu/test_gqa_pack.cpp).
#pragma once
#include "flashcore/flashcore.h"

namespace flashcore::core {

// True when `p` is a decode call that packing helps.
inline bool gqa_packable(const flashcore_attention_params& p) {
  // Packed (varlen) queries are rows of one tensor, not a seq dimension of their own: not rewritten.
  return p.seqlen_q == 1 && p.num_heads_kv > 0 && p.num_heads_q > p.num_heads_kv && p.cu_seqlens_q == nullptr;
}

// The packed equivalent of `p` (gqa_packable(p) must hold); every other field is copied.
inline flashcore_attention_params gqa_packed(const flashcore_attention_params& p) {
  flashcore_attention_params q = p;
  const int64_t g = p.num_heads_q / p.num_heads_kv;
  q.seqlen_q = g;
  q.num_heads_q = p.num_heads_kv;
  q.causal = 0;
  q.q_strides.seq = p.q_strides.head;
  q.q_strides.head = p.q_strides.head * g;
  q.o_strides.seq = p.o_strides.head;
  q.o_strides.head = p.o_strides.head * g;
  return q;
}

}  // namespace flashcore::core

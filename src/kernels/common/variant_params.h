// The attention variants of a call (flashcore.h: local / window_size_*, attention_chunk, softcap, sinks) as every
// backend's kernel reads them: a base of each backend's FwdParams, filled on the host by core::set_variants
// (core/variants.h). The window and the chunks apply to the causal kernel rows only (those with Cfg::kTakesWindow):
// the host sends every windowed or chunked call to them (core::masked_call), normalized so that the kernels need no
// clamps.
#pragma once

namespace flashcore::kernels {

struct VariantParams {
  int window_left;   // key j visible to row i iff j >= i + d - window_left; -1: unbounded (also any bound >= seqlen_k)
  int window_right;  // ... and j <= i + d + window_right; 0: causal; seqlen_q (the call's longest) for "unbounded"
  // attention_chunk c > 0: ... and j in the chunk of i + d, [chunk_start(i + d), + c) (tile_math.h); 0: none. Set to
  // at most seqlen_k (the same keys for every row: a chunk that long holds a whole sequence's keys) and taken by the
  // window's rows only.
  int chunk;
  // softcap > 0: scores become softcap * tanh(softmax_scale * q.k / softcap). The kernels compute
  // tanh(q.k * softcap_scale) (softcap_scale = softmax_scale / softcap) and take softcap * log2(e) as the softmax's
  // scale (scale_log2). 0: no softcap.
  float softcap_scale;
  const float* sinks;  // per query head: a logit added to every row's softmax denominator; nullptr: none
};

}  // namespace flashcore::kernels

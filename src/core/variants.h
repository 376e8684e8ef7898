// The attention variants of a call (flashcore.h: local / window_size_*, attention_chunk, softcap, sinks) on the host:
// which kernel rows serve it and what their kernel parameters say (kernels/common/variant_params.h). Any backend.
#pragma once
#include <cstdint>

#include "flashcore/flashcore.h"
#include "kernels/common/variant_params.h"

namespace flashcore::core {

// The effective window of a call: FlashAttention's (left, right) with -1 unbounded; causal is (-1, 0).
struct Window {
  int left = -1;
  int right = -1;
};
inline Window window_of(const flashcore_attention_params& p) {
  Window w;
  if (p.local == 1) {
    w.left = p.window_size_left;
    w.right = p.causal != 0 ? 0 : p.window_size_right;
  } else if (p.causal != 0) {
    w.right = 0;
  }
  return w;
}

// V's (and O's) head dim: head_dim_v, or head_dim when it is 0 (flashcore.h, since 0.7).
inline int64_t head_dim_v(const flashcore_attention_params& p) { return p.head_dim_v != 0 ? p.head_dim_v : p.head_dim; }
// Whether V has a head dim of its own (a (head_dim, head_dim_v) pair such as MLA's (192, 128)).
inline bool split_head_dims(const flashcore_attention_params& p) { return head_dim_v(p) != p.head_dim; }

// Whether the call masks keys by position (causal, a bounded window or chunks): it runs on the causal kernel rows,
// whose masks take the window at run time. A window of (-1, -1) without causal or chunks masks nothing.
inline bool masked_call(const flashcore_attention_params& p) {
  const Window w = window_of(p);
  return w.left >= 0 || w.right >= 0 || p.attention_chunk > 0;
}

// Whether the call needs a row that takes a window (kernels' Cfg::kTakesWindow): a bounded window other than causal,
// or chunks.
inline bool windowed_call(const flashcore_attention_params& p) {
  const Window w = window_of(p);
  return w.left >= 0 || w.right > 0 || p.attention_chunk > 0;
}

// What a named kernel_config's "not compiled" message adds for a windowed call that is not causal (it looked for a
// causal config).
inline const char* window_note(const flashcore_attention_params& p) {
  return p.local == 1 && p.causal == 0 && masked_call(p) ? " (local = 1: a sliding window runs on the causal configs)"
                                                         : "";
}

// Whether the call uses any variant (each one refused where a path has none).
inline bool has_variant(const flashcore_attention_params& p) {
  return p.local != 0 || p.attention_chunk != 0 || p.softcap != 0.f || p.sinks != nullptr;
}

// The kernels' VariantParams of the call, and the softmax's scale in log2 units (softmax_scale * log2(e), or
// softcap * log2(e) with a softcap, whose tanh takes the softmax scale: variant_params.h).
inline float set_variants(kernels::VariantParams& v, const flashcore_attention_params& p, float softmax_scale) {
  // Normalized for the kernels' 32-bit masks (kernels/common/mask.cuh): a left bound of seqlen_k or more is none, an
  // unbounded right one is seqlen_q, which reaches past the last key from every row.
  const Window w = window_of(p);
  v.window_left = w.left >= 0 && w.left < p.seqlen_k ? w.left : -1;
  v.window_right = w.right >= 0 && w.right < p.seqlen_q ? w.right : static_cast<int>(p.seqlen_q);
  // A chunk of seqlen_k keys or more holds every key of every sequence: seqlen_k gives the same masks in 32 bits.
  v.chunk = p.attention_chunk <= 0 ? 0
            : p.attention_chunk < p.seqlen_k ? p.attention_chunk
                                             : static_cast<int>(p.seqlen_k > 0 ? p.seqlen_k : 1);
  v.sinks = p.sinks;
  constexpr float kLog2e = 1.4426950408889634f;
  if (p.softcap > 0.f) {
    v.softcap_scale = softmax_scale / p.softcap;
    return p.softcap * kLog2e;
  }
  v.softcap_scale = 0.f;
  return softmax_scale * kLog2e;
}

}  // namespace flashcore::core

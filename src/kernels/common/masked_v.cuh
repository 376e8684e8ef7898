// Causal masking and non-finite V. A key block on the causal diagonal holds keys that some rows of the tile see and
// others do not; the mask makes P = 0 at the masked ones, but the P V product is a tensor-core GEMM over the whole
// block, and 0 * NaN (or 0 * Inf) is NaN: a NaN or Inf in V at a key a row does not see would turn that row's O
// column into NaN. Masked positions must never contribute (docs/reliability.md), and zeroing V in shared memory is
// not possible (other rows of the tile see the same key), while scanning every diagonal V tile cost 7-20% on causal
// cells (docs/decisions.md#masked-v).
//
// So the kernels detect instead, once per tile: in the epilogue, a thread folds the O accumulators of one row of its
// row pair into sum(o * 0), which is 0 when they are all finite and NaN otherwise (any_nonfinite: one FFMA per element,
// one warp vote). Only when that fires (never for finite inputs) does the rare path below run, per thread and row of
// the pair: it looks for a non-finite V value in the thread's columns at the keys the tile loaded that the row does
// not see, and if there is one it recomputes the row's O over its visible keys from global memory (float32 scores, an
// online softmax, the same key range as the tile or split part), so that the row's output is what it would be without
// the masked values. A non-finite value at a key the row sees stays in O (a NaN in V is the caller's data).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common/serving_layout.h"
#include "kernels/common/tensor_ref.h"
#include "kernels/common/tile.cuh"
#include "kernels/common/variant_params.h"

namespace flashcore::kernels {

template <class T>
__device__ __forceinline__ float elem_float(const T* row, int col);
template <>
__device__ __forceinline__ float elem_float<__nv_bfloat16>(const __nv_bfloat16* row, int col) {
  return __bfloat162float(row[col]);
}
template <>
__device__ __forceinline__ float elem_float<__half>(const __half* row, int col) {
  return __half2float(row[col]);
}
template <>
__device__ __forceinline__ float elem_float<__nv_fp8_e4m3>(const __nv_fp8_e4m3* row, int col) {
  return static_cast<float>(row[col]);
}

// The probe: true when one of get(0), ..., get(kCount - 1) is NaN or +-Inf, from sum(o * 0) (0 when all are finite,
// NaN otherwise): one FFMA per value in up to 8 independent chains, then a tree of adds. The epilogue waits on it, and
// one chain over a row's head_dim / 4 values took 4 cycles per value (docs/decisions.md#masked-v).
//
// One row per thread's row pair is enough: a non-finite V value at a loaded key reaches its O column in every row of
// the tile (0 * NaN, p * NaN, 0 * Inf are NaN; p * Inf is Inf), and the row pair's two rows hold the same columns, so
// the rows whose probe is not taken are checked by the rare path whenever their partner's fires.
template <int kCount, class Get>
__device__ __forceinline__ bool any_nonfinite(Get get) {
  constexpr int kChains = kCount < 8 ? kCount : 8;
  float acc[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) acc[c] = get(c) * 0.f;
#pragma unroll
  for (int e = kChains; e < kCount; ++e) acc[e % kChains] = fmaf(get(e), 0.f, acc[e % kChains]);
#pragma unroll
  for (int w = 1; w < kChains; w *= 2) {
#pragma unroll
    for (int c = 0; c + w < kChains; c += 2 * w) acc[c] += acc[c + w];
  }
  return acc[0] != acc[0];
}

// Key `key` of the tile's sequence in K or V at KV head `head`: a dense batch entry (the sequence's cache slot, its
// keys from row k_row0: left padding), the packed tensor's row, or the block table's page; nullptr for a page id
// outside [0, num_pages), which the kernels' loads read as zeros.
template <class T>
__device__ __forceinline__ const T* kv_row(const ServingLayout& sl, const TensorRef& t, const Tile& tile, int64_t key,
                                           int head) {
  int64_t entry = tile.kv_batch, row = tile.seq.k_row0 + key;
  if (sl.block_table != nullptr) {
    entry = __ldg(sl.block_table + static_cast<int64_t>(tile.kv_batch) * sl.block_table_stride +
                  page_entry(sl, static_cast<int>(key)));
    if (entry < 0 || entry >= sl.num_pages) return nullptr;
    row = row_in_page(sl, static_cast<int>(key));
  } else if (sl.cu_seqlens_k != nullptr) {
    entry = 0;
  }
  return static_cast<const T*>(t.ptr) + entry * t.batch_stride + row * t.seq_stride + head * t.head_stride;
}

// The rare path for one query row (`row`, within its sequence) of a causal tile whose key blocks [keys.begin,
// keys.end) of `block_n` keys were multiplied into O. cols(f) calls f(column, accumulator) for each of this thread's
// columns of the row. If a masked key of those blocks holds a non-finite V value in one of them, the row's
// accumulators are replaced by its unnormalized O over the visible keys and inv_sum by that O's normalizer (0 for a
// row that sees no key of the range: O = 0) and it returns true; otherwise nothing changes (false). scale_log2: the
// kernel's (softmax_scale * log2(e), or softcap * log2(e) with a softcap; times K's descale for an e4m3 cache); the
// window, softcap and sink of `var` apply as in the kernel. TKV: K's and V's element (e4m3 in an e4m3 KV cache, whose
// V descale the caller applies with inv_sum).
template <class T, int kHeadDim, class Cols, class TKV = T>
__device__ __forceinline__ bool repair_masked_v_row(const ServingLayout& sl, const VariantParams& var,
                                                    const TensorRef& q, const TensorRef& k, const TensorRef& v,
                                                    const Tile& tile, int head_kv, int64_t row, float scale_log2,
                                                    int block_n, float& inv_sum, Cols cols) {
  SeqInfo seq = tile.seq;  // with the call's window (tile.cuh, windowed)
  seq.window_left = var.window_left;
  seq.window_right = var.window_right;
  seq.chunk = var.chunk;
  const int64_t first = seq.key_first(row, /*causal=*/true);  // keys in [first, limit) are visible
  const int64_t limit = seq.key_limit(row, /*causal=*/true);
  const int64_t begin = static_cast<int64_t>(tile.keys.begin) * block_n;
  const int64_t loaded = static_cast<int64_t>(tile.keys.end) * block_n;
  const int64_t end = loaded < tile.seq.seqlen_k ? loaded : tile.seq.seqlen_k;  // past it: zeros (TMA, zero_v)
  bool leaked = false;
  auto scan = [&](int64_t from, int64_t to) {
    for (int64_t key = from; key < to && !leaked; ++key) {
      const TKV* vr = kv_row<TKV>(sl, v, tile, key, head_kv);
      if (vr != nullptr) cols([&](int c, float&) { leaked = leaked || !isfinite(elem_float(vr, c)); });
    }
  };
  scan(begin, first < end ? first : end);        // left of the window
  scan(limit > begin ? limit : begin, end);      // right of the diagonal (or the window)
  if (!leaked) return false;

  const int64_t q_entry = sl.cu_seqlens_q != nullptr ? 0 : tile.batch;
  const T* qr = static_cast<const T*>(q.ptr) + q_entry * q.batch_stride + (tile.seq.q_row0 + row) * q.seq_stride +
                static_cast<int64_t>(tile.head) * q.head_stride;
  cols([](int, float& o) { o = 0.f; });
  float m = -INFINITY, l = 0.f;
  const int64_t visible_begin = first > begin ? first : begin;
  const int64_t visible_end = limit < end ? limit : end;
  for (int64_t key = visible_begin; key < visible_end; ++key) {
    const TKV* kr = kv_row<TKV>(sl, k, tile, key, head_kv);
    const TKV* vr = kv_row<TKV>(sl, v, tile, key, head_kv);
    float s = 0.f;
    if (kr != nullptr) {
#pragma unroll 8
      for (int d = 0; d < kHeadDim; ++d) s = fmaf(elem_float(qr, d), elem_float(kr, d), s);
    }
    if (var.softcap_scale != 0.f) s = tanhf(s * var.softcap_scale);
    s *= scale_log2;
    const float m_new = fmaxf(m, s);
    const float correction = exp2f(m - m_new), w = exp2f(s - m_new);
    l = l * correction + w;
    m = m_new;
    cols([&](int c, float& o) { o = o * correction + (vr != nullptr ? w * elem_float(vr, c) : 0.f); });
  }
  // A sink joins the denominator (softmax.cuh, finalize): O is relative to m, the total to top = max(m, sink).
  const float sink = var.sinks != nullptr ? __ldg(var.sinks + tile.head) * 1.4426950408889634f : -INFINITY;
  if (l > 0.f && sink != -INFINITY) {
    const float top = fmaxf(m, sink), w = exp2f(m - top);
    inv_sum = w / (l * w + exp2f(sink - top));
  } else {
    inv_sum = l > 0.f ? 1.f / l : 0.f;
  }
  return true;
}

}  // namespace flashcore::kernels

// A tile of work as every backend's kernel sees it, and how a dense batch's tile index maps to it.
#pragma once
#include "kernels/common/tile_math.h"
#include "kernels/common/variant_params.h"

namespace flashcore::kernels {

struct Tile {
  int m_block;
  int head;
  int batch;
  SeqInfo seq;    // this tile's sequence (dense batches: the tensor's lengths, offset 0)
  KeyRange keys;  // key blocks visited, from keys.end - 1 down to keys.begin
  // Split-KV: which part of the tile's key range (keys is that part). Prefill split rows (sm90 scheduler.cuh) also
  // give the tile's number of parts, the partials' slot of its part 0 (part s's is part0 + s) and the index of its
  // merge counter.
  int split = 0;
  int splits = 1;
  int64_t part0 = 0;
  int64_t counter = 0;
  // K's and V's batch entry (a dense cache) or block-table row (a paged one): batch, or the call's kv_batch_idx[batch]
  // (ServingLayout::kv_batch_idx). (Last: placed after `batch`, the field tipped a portable d64 row into spilling.)
  int kv_batch = 0;
};

// The tile's sequence with the call's window (the causal rows' masks; VariantParams), in the rows that take one
// (Cfg::kTakesWindow). Tile::seq keeps the defaults (causal) so that the main loop reads the window from the kernel
// parameters, in constant memory, instead of holding it in registers (mask.cuh).
template <class Cfg>
__device__ __forceinline__ SeqInfo windowed(const SeqInfo& seq, const VariantParams& v) {
  SeqInfo w = seq;
  if constexpr (Cfg::kTakesWindow) {
    w.window_left = v.window_left;
    w.window_right = v.window_right;
    w.chunk = v.chunk;
  }
  return w;
}

// Tile order. Non-causal (equal tiles): query blocks fastest, so the CTAs running at once share one head's K/V in
// L2. Causal: longest first within L2-sized sections of (batch, head) slices (tile_math.h, lpt_section_slices):
// section-major, then query block (heaviest, i.e. the bottom one, first), then slice. Params: any backend's kernel
// parameters with num_m_blocks, num_heads_q, num_slices (batch x num_heads_q), section_slices, seqlen_q, seqlen_k
// and the VariantParams base (variant_params.h).
template <class Cfg, class Params>
__device__ __forceinline__ Tile decode_dense_tile(const Params& p, int tile_idx) {
  Tile t;
  int hb, m_idx;
  if constexpr (Cfg::kCausal) {
    lpt_tile_slot(tile_idx, p.num_m_blocks, p.num_slices, p.section_slices, hb, m_idx);
  } else {
    hb = tile_idx / p.num_m_blocks;
    m_idx = tile_idx - hb * p.num_m_blocks;
  }
  t.head = hb % p.num_heads_q;
  t.batch = hb / p.num_heads_q;
  t.kv_batch = t.batch;
  t.m_block = Cfg::kCausal ? p.num_m_blocks - 1 - m_idx : m_idx;
  t.seq.seqlen_q = p.seqlen_q;
  t.seq.seqlen_k = p.seqlen_k;
  t.keys = key_range(windowed<Cfg>(t.seq, p), t.m_block, Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal);
  return t;
}

__device__ __forceinline__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Sequence b of a packed tensor: its first row and its length, from cu_seqlens clamped to [0, total].
__device__ __forceinline__ void packed_sequence(const int32_t* cu, int64_t total, int batch, int64_t& row0,
                                                int64_t& len) {
  row0 = clamp64(cu[batch], 0, total);
  len = clamp64(cu[batch + 1], row0, total) - row0;
}

// A KV cache's keys for sequence t.batch (seqused_k given): its count, seqused_k[b] plus the rows this call appended
// (clamped to seqlen_k); its cache slot (kv_batch_idx: an entry outside [0, kv_batch_size) leaves no key); its left
// padding (leftpad_k: the keys start at row leftpad_k[b] of the cache, and the masks count from there).
template <class Params>
__device__ __forceinline__ void cache_keys(const Params& p, Tile& t) {
  int64_t added = p.seqused_k_add;
  if (p.cu_seqlens_k_new != nullptr) {
    int64_t first;
    packed_sequence(p.cu_seqlens_k_new, p.total_k_new, t.batch, first, added);
  }
  int64_t used = clamp64(p.seqused_k[t.batch], 0, t.seq.seqlen_k) + added;
  used = used < t.seq.seqlen_k ? used : t.seq.seqlen_k;
  if (p.kv_batch_idx != nullptr) {
    const int entry = p.kv_batch_idx[t.batch];
    const bool valid = entry >= 0 && entry < p.kv_batch_size;
    t.kv_batch = valid ? entry : 0;
    if (!valid) used = 0;
  }
  if (p.leftpad_k != nullptr) {
    const int64_t pad = clamp64(p.leftpad_k[t.batch], 0, used);
    t.seq.k_row0 += pad;
    used -= pad;
  }
  t.seq.seqlen_k = used;
}

// A tile of a batch in any layout: query block, head and sequence from the index (the grid covers the longest
// sequence, p.seqlen_q rows, for every sequence); the sequence's rows and lengths from cu_seqlens (packed tensors)
// and seqused_k (a KV cache's lengths, slots and left padding: cache_keys). A query block past its sequence's end
// visits no key and stores nothing. kServing false: dense batches only (kernels without the packed paths). Params: a
// backend's kernel parameters with the serving fields of flashcore.h (ServingLayout).
template <class Cfg, bool kServing, class Params>
__device__ __forceinline__ Tile decode_cache_tile(const Params& p, int tile_idx) {
  Tile t = decode_dense_tile<Cfg>(p, tile_idx);
  const bool varlen_q = kServing && p.cu_seqlens_q != nullptr;
  const bool varlen_k = kServing && p.cu_seqlens_k != nullptr;
  if (!varlen_q && !varlen_k && p.seqused_k == nullptr) return t;
  if (varlen_q) {
    packed_sequence(p.cu_seqlens_q, p.total_q, t.batch, t.seq.q_row0, t.seq.seqlen_q);
    if (p.seqused_q != nullptr) t.seq.seqlen_q = clamp64(p.seqused_q[t.batch], 0, t.seq.seqlen_q);
  }
  if (varlen_k) packed_sequence(p.cu_seqlens_k, p.total_k, t.batch, t.seq.k_row0, t.seq.seqlen_k);
  if (p.seqused_k != nullptr) cache_keys(p, t);
  t.keys = key_range(windowed<Cfg>(t.seq, p), t.m_block, Cfg::kBlockM, Cfg::kBlockN, Cfg::kCausal);
  if (static_cast<int64_t>(t.m_block) * Cfg::kBlockM >= t.seq.seqlen_q) t.keys = KeyRange{};
  return t;
}

// A paged cache's key -> (block-table entry, row in the page), by shift and mask for a power-of-two page (every
// engine's case: integer division made the sm90 producer thread slower than the key blocks it feeds at head dim 64,
// docs/decisions.md#paged-pow2). Params: page_shift (tile_math.h, page_shift_of) and page_size.
template <class Params>
__device__ __forceinline__ int page_entry(const Params& p, int key) {
  return p.page_shift >= 0 ? key >> p.page_shift : key / p.page_size;
}
template <class Params>
__device__ __forceinline__ int row_in_page(const Params& p, int key) {
  return p.page_shift >= 0 ? key & (p.page_size - 1) : key % p.page_size;
}

}  // namespace flashcore::kernels

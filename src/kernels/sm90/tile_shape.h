// The host-visible part of a tile config (config.h): shape, schedule and V layout.
#pragma once

namespace flashcore::sm90 {

// How CTAs get tiles (scheduler.cuh).
enum class Schedule : int {
  kOneTilePerCta = 0,     // grid = tiles; the hardware block scheduler balances unequal (causal) tiles
  kStaticPersistent = 1,  // grid = min(tiles, SMs); CTA c takes c, c + grid, ...
  kDynamicPersistent = 2,  // grid = min(tiles, SMs); the next tile comes from a global counter (workspace)
  kSplitKv = 3             // grid = tiles x splits, one CTA each: every split of a tile's key range writes a partial
                           // (O, LSE) to the workspace, and a combine kernel merges them (decode: few tiles, long Sk)
};

// How V sits in shared memory for O += P V. 16-bit wgmma reads V as stored (rows = keys, an N-major B
// operand); 8-bit wgmma needs a K-major B, i.e. V transposed (by the producer, or given transposed).
enum class VLayout : int { kKeyMajor = 0, kDimMajor = 1 };

struct TileShape {
  int block_m;        // query rows per CTA: 64 per consumer warpgroup
  int block_n;        // keys per K/V tile
  int stages;         // depth of the K/V ring
  bool pingpong;      // consumer warpgroups take turns issuing GEMMs (mainloop.cuh)
  Schedule schedule;  // scheduler.cuh
  bool rescale_vote;  // skip the O rescale when a warp vote finds every factor is 1 (data-dependent branch)
  // The packed flavour of a row (name suffix "-packed"): its producer keeps its ring positions as counts
  // (pipeline.cuh PipelineCount), which leaves room in a 24-register dynamic producer for a packed (varlen) tile's
  // decode (smem_plan.h takes_packed). A row of its own, so that the dense rows keep their code
  // (docs/decisions.md#varlen).
  bool packed = false;
  // The variants flavour (name suffix "-var"): the row's kernel takes a sliding window, softcap and sinks
  // (kernels/common/variant_params.h) at run time; the other rows compile without them, because their checks in the
  // main loop cost the default calls up to 9.5% (d64 non-causal; docs/decisions.md#variant-rows).
  bool variants = false;
};

// A 16-bit tile of several 128-byte column chunks, loaded in one box of all its rows: one TMA of a 5-D map (the head
// dim as 64 elements x chunks, tma_desc.h chunked) instead of one per chunk. The host encodes that map (backend.cpp)
// and the producer issues that load (producer.cuh tma_load_tile) exactly when this holds
// (docs/decisions.md#tma-one-box).
constexpr bool tma_chunked(int elem_bytes, int chunks, int rows, int box_rows) {
  return elem_bytes == 2 && chunks > 1 && rows == box_rows;
}

// Rows per K/V TMA box. A whole key block, except for split-KV decode rows (block_m 64 or less): they load it in
// 32-row slices with every 128-byte chunk of a slice issued back to back, so that the halves of a 256-byte K/V row
// are requested together (decode streams K/V from HBM and nothing else).
constexpr int kv_box_rows(const TileShape& s) {
  return s.schedule == Schedule::kSplitKv && s.block_m <= 64 && s.block_n > 32 ? 32 : s.block_n;
}

// Rows per K/V TMA box of a paged cache whose key blocks go in slices of slice_rows rows (a divisor of the page and
// of the key block): a slice of 128 rows or more (pages of 128 keys and up) in the row's own boxes, so that a split-KV
// row loads it as it loads a dense block (+0.5..1.6% paged decode at pages 128 and 256, docs/decisions.md#paged-boxes);
// a smaller slice in one box (32-row boxes in 64-key pages gained nothing at 8 x 8k and cost 1 x 8k 4%).
// box_rows: the row's kv_box_rows (a box that does not divide the slice is not used).
constexpr int paged_box_rows(int box_rows, int slice_rows) {
  return slice_rows >= 128 && box_rows < slice_rows && slice_rows % box_rows == 0 ? box_rows : slice_rows;
}

// 8-bit V, transposed (VLayout::kDimMajor): keys per row of a shared-memory chunk, i.e. per TMA box row. 128 (one
// 128-byte swizzled row) when the key block is whole 128-key rows, else 64 (64-byte swizzled rows), so that a key
// block of 192 keys is three chunks, or 32 (32-byte swizzled rows) for a block that is not whole 64-key rows (160
// keys: five chunks). Head dim 64: 64 where it can, the width of V's own 64-byte rows, so that the producer can
// transpose V in place (transposes_v_in_place).
constexpr int vt_chunk_keys(const TileShape& s, int head_dim) {
  return s.block_n % 128 == 0 && head_dim >= 128 ? 128 : (s.block_n % 64 == 0 ? 64 : 32);
}

// Whether the producer warps can transpose an 8-bit V tile in place (transpose_v.cuh): the tile as loaded (key rows of
// min(head_dim, 128) bytes, in 128-column chunks) and as transposed (vt_chunk_keys) must be the same squares of R x R
// bytes at the same offsets, R = that row width. True for one chunk of columns (head dim <= 128) or one square row of
// keys (block_n = R); the 128 x 192 rows' 64-key chunks are not squares of 128-byte rows.
constexpr bool transposes_v_in_place(const TileShape& s, int head_dim) {
  const int r = head_dim < 128 ? head_dim : 128;
  return vt_chunk_keys(s, head_dim) == r && s.block_n % r == 0 && (head_dim <= 128 || s.block_n == r);
}

}  // namespace flashcore::sm90

// The launch shape and shared-memory layout of a tile config as plain arithmetic: KernelConfig (config.h) takes
// its constants from smem_plan(), and the host (variant.cpp) costs a tile config with the same function before
// it builds one.
#pragma once
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

inline constexpr int kSmemLimitBytes = 227 * 1024;  // dynamic shared memory a CTA may opt in to on sm_90
inline constexpr int kSmemRowBytes = 128;           // tiles are stored in rows of the 128-byte swizzle width, where
                                                    // their rows are whole 128 bytes (swizzle_row_bytes)
inline constexpr int kSmemBarrierBytes = 512;       // SharedBarriers (pipeline.cuh), checked there
inline constexpr int kSmemSlackBytes = kSmemBarrierBytes + 1024;  // +1024: the base is rounded up to 1024 B
inline constexpr int kRowsPerWarpgroup = 64;        // query rows per consumer warpgroup
inline constexpr int kProducerRegs = 24;            // setmaxnreg budget of the producer warpgroup
inline constexpr int kPageChunk = 16;               // paged K/V: (block, slice) pages per table-warp chunk (producer.cuh)
inline constexpr int kSwapRows = 8;                 // query rows of a transposed decode tile (decode_swap.cuh)

// The row width of a tile's shared-memory chunks for rows of row_bytes bytes: the widest TMA / wgmma swizzle (128, 64
// or 32 bytes) whose width divides the row, so that the row is whole chunks. 128 for every 16-bit head dim that is a
// multiple of 64; 64 for 16-bit head dim 96 (three 64-byte chunks of 32 columns: docs/decisions.md#head-dim-96) and
// 8-bit head dim 64 (one chunk). The host's tensor maps use the same width (tma_desc.cpp).
constexpr int swizzle_row_bytes(int row_bytes) {
  return row_bytes % 128 == 0 ? 128 : row_bytes % 64 == 0 ? 64 : 32;
}

// A split-KV row with block_m = kSwapRows runs its GEMMs transposed (S^T = K Q^T, O^T = V^T P^T: decode_swap.cuh),
// so that wgmma's N = 8 spans the query rows and M = 64 the keys / head dims.
constexpr bool swaps_gemms(const TileShape& s) {
  return s.schedule == Schedule::kSplitKv && s.block_m == kSwapRows;
}

// The shape rules every sm90 tile config obeys, in one place: KernelConfig (config.h) asserts them at compile time
// and variant.cpp's feasible() checks them, with the numbers, before nvcc builds a runtime variant. chunk_cols: the
// head-dim columns of one 128-byte row (64 for 16-bit inputs); mma_k: the P V GEMM's k-step (16 for 16-bit P);
// smem_bytes: smem_plan()'s total.
enum class ShapeFault : int { kNone, kHeadDim, kBlockM, kBlockN, kStages, kSchedule, kPingPong, kPacked, kSmem };
constexpr ShapeFault shape_fault(const TileShape& s, int head_dim, int chunk_cols, int mma_k, int smem_bytes) {
  const int sched = static_cast<int>(s.schedule);
  if (head_dim % chunk_cols != 0 || head_dim < chunk_cols || head_dim > 256) return ShapeFault::kHeadDim;
  // 64 query rows per consumer warpgroup, one to three of them; or the transposed decode tile of kSwapRows rows
  // (swaps_gemms), whose keys are whole 64-row m-tiles of one warpgroup.
  if (swaps_gemms(s) ? (s.block_n % 64 != 0 || s.pingpong)
                     : (s.block_m % kRowsPerWarpgroup != 0 || s.block_m < 64 || s.block_m > 192)) {
    return ShapeFault::kBlockM;
  }
  if (s.block_n % mma_k != 0 || s.block_n < mma_k || s.block_n > 256) return ShapeFault::kBlockN;  // wgmma N <= 256
  if (s.stages < 1 || s.stages > 8) return ShapeFault::kStages;
  if (sched < 0 || sched > static_cast<int>(Schedule::kSplitKv)) return ShapeFault::kSchedule;
  if (s.pingpong && s.block_m < 2 * kRowsPerWarpgroup) return ShapeFault::kPingPong;  // needs two warpgroups
  // A packed flavour counts its ring positions in the producer (TileShape::packed): a dynamic row's.
  if (s.packed && s.schedule != Schedule::kDynamicPersistent) return ShapeFault::kPacked;
  if (smem_bytes > kSmemLimitBytes) return ShapeFault::kSmem;
  return ShapeFault::kNone;
}

// A split-KV row with more than one consumer warpgroup is a prefill row: its grid runs the call's whole tiles
// round-robin and then cuts the last round's tiles into equal parts of their key ranges (split_plan.h
// last_round_plan), where the decode rows cut every tile. No paged K/V, no table warp; persistent like a static row.
constexpr bool splits_last_round(const TileShape& s) {
  return s.schedule == Schedule::kSplitKv && s.block_m > kRowsPerWarpgroup;
}

// setmaxnreg budget per consumer thread: what is left of the 64K registers beside the producer warpgroup, 240 for one
// or two consumer warpgroups, 160 for three.
constexpr int consumer_regs(int consumer_warpgroups) { return consumer_warpgroups <= 2 ? 240 : 160; }

// The producer's budget: kProducerRegs, or 32 on a dynamic schedule with three consumer warpgroups (three of 160
// leave 32 of the 64K registers; two of 240 leave 24 of a 168-register launch). The dynamic producer keeps its
// tile-id ring state beside the tile decode, and a packed batch's decode spilled in 24.
// Split-KV decode rows run one consumer warpgroup and give the producer warpgroup 56: its table warp (fetches_pages)
// spilled in 24.
constexpr int producer_regs(const TileShape& s) {
  if (s.schedule == Schedule::kSplitKv && !splits_last_round(s)) return 56;
  return s.schedule == Schedule::kDynamicPersistent && s.block_m / kRowsPerWarpgroup == 3 ? 32 : kProducerRegs;
}

// The serving layouts (flashcore.h) a 16-bit config's kernel takes (scheduler.cuh). Packed (varlen) Q/O and K/V:
// every schedule but a dynamic one whose producer has 24 registers, unless it is the packed flavour of the row
// (TileShape::packed). A paged K/V: every schedule but the dynamic one (its page state spilled there too). The prefill
// split rows take dense calls only.
constexpr bool takes_packed(const TileShape& s) {
  if (splits_last_round(s)) return false;
  return s.schedule != Schedule::kDynamicPersistent || producer_regs(s) >= 32 || s.packed;
}
constexpr bool takes_paged(const TileShape& s) {
  return s.schedule != Schedule::kDynamicPersistent && !splits_last_round(s);
}
// Paged split-KV rows (decode) take a block's pages from a table warp (producer.cuh PageFetcher); the others read
// them in the producer thread, a block ahead.
constexpr bool fetches_pages(const TileShape& s) { return s.schedule == Schedule::kSplitKv && !splits_last_round(s); }

struct SmemPlan {
  int consumer_warpgroups;  // one per 64 query rows
  int threads;              // + one producer warpgroup
  int consumer_threads;
  int consumer_regs;
  bool persistent;  // the schedule walks several tiles per CTA
  // Tiles are stored as chunks of 128-byte rows: chunk c holds columns [c*chunk_cols, (c+1)*chunk_cols) of
  // every row. Chunks are 1024-byte aligned. O is staged in the same layout, in its own element size. Rows that are
  // not whole 128 bytes (8-bit head dim 64, 16-bit head dim 96) are chunks of 64-byte rows, 64-byte swizzled
  // (swizzle_row_bytes): qk_row_bytes for Q and K, v_row_bytes for a 16-bit V, out_row_bytes for the staged O.
  int qk_row_bytes, v_row_bytes, out_row_bytes;
  int chunk_cols, chunks;
  int out_chunk_cols, out_chunks;
  int q_chunk_bytes, kv_chunk_bytes, out_chunk_bytes;
  // V in its own element size (v_elem_bytes: 2 for an int8 Q K^T config, else the Q/K size; 8-bit V is stored
  // transposed, the same bytes per tile).
  int v_chunk_cols, v_chunks, v_chunk_bytes;
  int q_bytes, k_tile_bytes, v_tile_bytes, out_bytes;
  // Q tiles in the Q ring (q_stages of q_bytes from q_offset): 2 on the transposed split-KV decode rows (16-bit, 8
  // rows: 1-2 KB each), else 1. With one Q stage the producer, done with a part's loads, waited for the consumers to
  // release that part's Q before it loaded the next part's Q and K/V, so the K/V ring drained at every part boundary
  // (docs/decisions.md#decode-q-ring: cutting tiles into more parts cost 2-4 us each). Their epilogue stages nothing in
  // the Q tile. The prefill rows keep one: two there measured level.
  int q_stages;
  // Byte offsets from the 1024-byte aligned base.
  int q_offset, k_offset, v_offset, kv_end;
  // A transposed decode row (swaps_gemms): P^T (8 rows x block_n, 128B-swizzled 64-key chunks) and the softmax's
  // cross-warp exchange, after the V ring.
  int swap_p_offset, swap_red_offset;
  // A persistent grid gives the staged O a buffer of its own when that fits: the Q tile is then released as
  // soon as the tile's last S GEMM has read it, and the next tile's Q loads while this tile finishes.
  // Otherwise O is staged in the Q tile, released once the TMA store has read it.
  bool separate_o;
  // An e4m3 KV cache under 16-bit Q (kv8): the 8-bit staging ring of K and V blocks, one stage per K/V stage, after
  // the K/V ring (rows of kv8_row_bytes = min(head_dim, 128) bytes, 128- or 64-byte swizzled), or in its place on the
  // transposed decode rows, whose consumers widen it into registers. 0 otherwise.
  int kv8_row_bytes, k8_tile_bytes, k8_offset, v8_offset;
  int o_offset, barrier_offset;
  int smem_bytes;  // the dynamic shared memory to launch with
};

// head_dim_v: V's and O's head dim (0: head_dim). kv8: K and V arrive in e4m3 through a staging ring (config.h kKV8).
constexpr SmemPlan smem_plan(const TileShape& shape, int head_dim, int elem_bytes, int out_elem_bytes,
                             int v_elem_bytes = 0, int head_dim_v = 0, bool kv8 = false) {
  if (v_elem_bytes == 0) v_elem_bytes = elem_bytes;
  if (head_dim_v == 0) head_dim_v = head_dim;
  SmemPlan p{};
  p.consumer_warpgroups = swaps_gemms(shape) ? 1 : shape.block_m / kRowsPerWarpgroup;
  p.threads = 128 * (p.consumer_warpgroups + 1);
  p.consumer_threads = 128 * p.consumer_warpgroups;
  p.consumer_regs = consumer_regs(p.consumer_warpgroups);
  p.persistent = shape.schedule == Schedule::kStaticPersistent || shape.schedule == Schedule::kDynamicPersistent ||
                 splits_last_round(shape);

  p.qk_row_bytes = swizzle_row_bytes(head_dim * elem_bytes);
  p.chunk_cols = p.qk_row_bytes / elem_bytes;
  p.chunks = head_dim / p.chunk_cols;
  p.out_row_bytes = swizzle_row_bytes(head_dim_v * out_elem_bytes);
  p.out_chunk_cols = p.out_row_bytes / out_elem_bytes;
  p.out_chunks = head_dim_v / p.out_chunk_cols;
  p.q_chunk_bytes = shape.block_m * p.qk_row_bytes;
  p.kv_chunk_bytes = shape.block_n * p.qk_row_bytes;
  p.out_chunk_bytes = shape.block_m * p.out_row_bytes;
  // V: the Q/K chunks where V has their element size and their row width (every head dim pair compiled has), else
  // rows of its own (an int8 Q K^T config's 16-bit V).
  p.v_row_bytes = swizzle_row_bytes(head_dim_v * v_elem_bytes);
  const bool v_like_k = v_elem_bytes == elem_bytes && p.v_row_bytes == p.qk_row_bytes;
  p.v_chunk_cols = v_like_k ? p.chunk_cols : p.v_row_bytes / v_elem_bytes;
  p.v_chunks = head_dim_v / p.v_chunk_cols;
  p.v_chunk_bytes = v_like_k ? p.kv_chunk_bytes : shape.block_n * p.v_row_bytes;
  p.q_bytes = p.q_chunk_bytes * p.chunks;
  p.k_tile_bytes = p.kv_chunk_bytes * p.chunks;
  p.v_tile_bytes = p.v_chunk_bytes * p.v_chunks;
  p.out_bytes = p.out_chunk_bytes * p.out_chunks;

  // A transposed decode row's scratch after the V ring: P^T, then the softmax's exchange (2 x 4 warps x 8 floats,
  // and the sums, in 1024 bytes).
  const bool swap = swaps_gemms(shape);
  const int swap_p_bytes = swap ? kSwapRows * shape.block_n * elem_bytes : 0;
  const int swap_bytes = swap ? swap_p_bytes + 1024 : 0;
  // An e4m3 KV cache's transposed decode rows read the staging ring themselves (decode_swap_kv8.cuh): no 16-bit ring.
  const int kv16_stages = kv8 && swap ? 0 : shape.stages;
  const int kv8_bytes = kv8 ? 2 * shape.stages * shape.block_n * head_dim : 0;
  const int kv_bytes = kv16_stages * (p.k_tile_bytes + p.v_tile_bytes) + kv8_bytes;
  p.q_stages = swap && elem_bytes == 2 &&
                       2 * p.q_bytes + kv_bytes + swap_bytes + p.out_bytes + kSmemSlackBytes <= kSmemLimitBytes
                   ? 2
                   : 1;
  p.q_offset = 0;
  p.k_offset = p.q_offset + p.q_stages * p.q_bytes;
  p.v_offset = p.k_offset + kv16_stages * p.k_tile_bytes;
  p.kv_end = p.v_offset + kv16_stages * p.v_tile_bytes;
  if (swap) {
    p.swap_p_offset = p.kv_end;  // 1024-byte aligned
    p.swap_red_offset = p.swap_p_offset + swap_p_bytes;
    p.kv_end += swap_bytes;
  }
  if (kv8) {  // (1024-byte aligned: the 16-bit tiles are)
    p.kv8_row_bytes = head_dim < kSmemRowBytes ? head_dim : kSmemRowBytes;
    p.k8_tile_bytes = shape.block_n * head_dim;
    p.k8_offset = p.kv_end;
    p.v8_offset = p.k8_offset + shape.stages * p.k8_tile_bytes;
    p.kv_end = p.v8_offset + shape.stages * p.k8_tile_bytes;
  }
  // (8-bit inputs: O, in 16 bits, does not fit in the Q tile and always gets its own buffer.)
  p.separate_o = (p.persistent || p.out_bytes > p.q_bytes) && p.kv_end + p.out_bytes + kSmemSlackBytes <= kSmemLimitBytes;
  p.o_offset = p.separate_o ? p.kv_end : p.q_offset;
  p.barrier_offset = p.kv_end + (p.separate_o ? p.out_bytes : 0);
  p.smem_bytes = p.barrier_offset + kSmemSlackBytes;
  return p;
}

}  // namespace flashcore::sm90

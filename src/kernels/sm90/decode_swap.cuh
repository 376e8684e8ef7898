// Split-KV decode with the GEMMs transposed: the consumer role of a row with block_m = 8 (smem_plan.h swaps_gemms).
// A decode tile holds few query rows (one new token times the query heads of a GQA group, packed by api/gqa_pack.h),
// so in the plain main loop's m64 tiles 4 of 64 rows carry data. Here wgmma's M runs over keys and head dims, and
// N = 8 over the query rows:
//   S^T (keys x 8) = K_tile (keys x D: the A operand as loaded, K-major) * Q^T (B: the 8-row Q tile, K-major)
//   O^T (D x 8)   += V^T (D x keys: the V tile read M-major)            * P^T (B: shared memory, K-major)
// The softmax runs down the columns of S^T: a query row is spread over the warpgroup's 128 threads, so its max is a
// shuffle over the 8 lanes of a column and an exchange between the 4 warps in shared memory; the sums stay per thread
// until the epilogue. One consumer warpgroup, the key blocks in the producer's order (last first), each block's S GEMM,
// softmax and P V in turn (the row streams K and V from memory; its tensor work is an eighth of the plain loop's).
// An m64n8 accumulator: thread t of the warpgroup (warp w, lane l) holds rows 16w + l/4 (+ 8 in registers 2, 3) and
// columns 2 (l % 4) (+ 1 in registers 1, 3).
#pragma once
#include <cuda/ptx>

#include "kernels/common/element.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/epilogue.cuh"
#include "kernels/sm90/mainloop.cuh"

namespace flashcore::sm90 {

// Named barrier of the softmax's exchange and of P^T's hand-over to the wgmma (ids: mainloop.cuh; 1 and 3 are taken).
inline constexpr uint32_t kSwapBarrier = 4;
// Its tiles' rows: 128-byte swizzled (head dims 64 and 128; config.h keeps 64-byte rows off these rows).
inline constexpr int kSwapRowBytes = 128;

template <class Cfg>
struct SwapState {
  static_assert(Cfg::kQKRowBytes == kSwapRowBytes && Cfg::kVRowBytes == kSwapRowBytes, "128-byte rows");
  static constexpr int kDTiles = Cfg::kHeadDimV / 64;  // m64 tiles of O^T
  static constexpr int kKTiles = Cfg::kBlockN / 64;   // m64 tiles of S^T
  float o[kDTiles][4];
  float m[2];  // the thread's two query columns: running max of the raw scores
  float l[2];  // and this thread's share of the sum
  float scale_log2;  // an e4m3 KV cache's rows: the scores' scale (with the descales and Q's power of two)
  float o_scale;     // and O's factor (V's descale)
};

// The head dim of register r of O^T's m64 tile i: its row, or on an e4m3 KV cache's rows the head dim that
// decode_swap_kv8.cuh's widening of V gives it (the thread's 2 kDTiles head dims are consecutive).
template <class Cfg>
__device__ __forceinline__ int swap_dim(int i, int r) {
  const int t = threadIdx.x % 128;
  if constexpr (Cfg::kKV8Direct) return 2 * SwapState<Cfg>::kDTiles * (t / 4) + 2 * i + (r >> 1);
  return 64 * i + 16 * (t / 32) + (t % 32) / 4 + 8 * (r >> 1);
}

// This thread's row of an m64n8 accumulator register r (within its 64-row tile) and its column.
__device__ __forceinline__ int swap_row(int r) {
  const int t = threadIdx.x % 128;
  return 16 * (t / 32) + (t % 32) / 4 + 8 * (r >> 1);
}
__device__ __forceinline__ int swap_col(int r) { return 2 * (threadIdx.x % 4) + (r & 1); }

// `op` (max or sum) over the warpgroup of each of this thread's two columns: the column's 8 lanes, then the 4 warps
// through `slot` (4 x 8 floats; the main loop's maxima alternate between two, so that a fast warp's next block cannot
// overwrite a slow warp's read).
template <class Op>
__device__ __forceinline__ void swap_column_reduce(float (&x)[2], float* slot, Op op) {
  const int t = threadIdx.x % 128, lane = t % 32;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int off = 4; off < 32; off *= 2) x[c] = op(x[c], __shfl_xor_sync(0xffffffffu, x[c], off));
  }
  if (lane < 4) {
    slot[(t / 32) * 8 + 2 * lane] = x[0];
    slot[(t / 32) * 8 + 2 * lane + 1] = x[1];
  }
  kernels::named_barrier_sync(kSwapBarrier, 128);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = 2 * (lane % 4) + c;
    x[c] = op(op(op(slot[col], slot[8 + col]), slot[16 + col]), slot[24 + col]);
  }
}
struct SwapMax {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SwapSum {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// The 16 bits of x in the 16-bit type T (P^T and O are stored one element at a time).
template <class T>
__device__ __forceinline__ uint16_t swap_bits16(float x) {
  return static_cast<uint16_t>(kernels::ElemTraits<T>::pack2(x, 0.f) & 0xffffu);
}

// One key block's softmax, from S^T in registers (scale: the scores' scale): the mask (keys past the sequence, and causal), the columns' block
// maxima (red: this block's exchange slots), the online update, P^T into shared memory (pt) and O^T's rescale. Ends
// with the named barrier after which the P V GEMM may read P^T.
template <class Cfg>
__device__ __forceinline__ void swap_softmax(const Tile& tile, int n_block, int64_t diag, float scale,
                                             float (&s)[SwapState<Cfg>::kKTiles][4], SwapState<Cfg>& st, uint8_t* pt,
                                             float* red) {
  constexpr int kKTiles = SwapState<Cfg>::kKTiles, kDTiles = SwapState<Cfg>::kDTiles;
  // Mask (keys past the sequence, and causal), then the columns' block maxima.
  const int64_t key0 = static_cast<int64_t>(n_block) * Cfg::kBlockN;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kKTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t key = key0 + 64 * i + swap_row(r);
      const bool visible = key < tile.seq.seqlen_k && (!Cfg::kCausal || key <= diag + swap_col(r));
      if (!visible) s[i][r] = -INFINITY;
      mx[r & 1] = fmaxf(mx[r & 1], s[i][r]);
    }
  }
  swap_column_reduce(mx, red, SwapMax{});
  // Online softmax per column (a column that has seen only masked keys keeps max -inf and takes 0: P = 0).
  float alpha[2], neg[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float m_new = fmaxf(st.m[c], mx[c]);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[c] = kernels::exp2_approx((st.m[c] - m_use) * scale);
    neg[c] = -m_use * scale;
    st.m[c] = m_new;
    st.l[c] *= alpha[c];
  }
  // P^T into shared memory, K-major like Q: 64-key chunks of 8 rows x 128 bytes, 128B-swizzled (16-byte unit
  // u of row n at u ^ n). The previous block's P V has completed (waited below), so the buffer is free.
#pragma unroll
  for (int i = 0; i < kKTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float x = kernels::exp2_approx(fmaf(s[i][r], scale, neg[r & 1]));
      st.l[r & 1] += x;
      const int key = swap_row(r), n = swap_col(r);
      uint8_t* dst = pt + i * 8 * kSwapRowBytes + n * kSwapRowBytes + (((key / 8) ^ n) * 16) + (key % 8) * 2;
      *reinterpret_cast<uint16_t*>(dst) = swap_bits16<typename Cfg::MmaElement>(x);
    }
  }
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) st.o[i][r] *= alpha[r & 1];
  }
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // P^T's generic writes before wgmma's reads
  kernels::named_barrier_sync(kSwapBarrier, 128);
}

// A tile's start: O^T, the maxima and the sums cleared, the scales at 16-bit values. Returns false for a tile with no
// key blocks, whose Q stage it takes and hands back.
template <class Cfg>
__device__ __forceinline__ bool swap_start(const FwdParams& p, const Tile& tile, SharedBarriers<Cfg>& bars,
                                           SwapState<Cfg>& st, ConsumerPipes<Cfg>& pipes) {
#pragma unroll
  for (int i = 0; i < SwapState<Cfg>::kDTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) st.o[i][r] = 0.f;
  }
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
  st.scale_log2 = p.scale_log2;
  st.o_scale = 1.f;
  if (tile.keys.count() == 0) {
    bars.q.wait(pipes.q);
    if (Cfg::kSeparateO) bars.q.release(pipes.q);
    return false;
  }
  return true;
}

template <class Cfg>
__device__ __forceinline__ void swap_mainloop(const FwdParams& p, const Tile& tile, const uint8_t* smem,
                                              SharedBarriers<Cfg>& bars, SwapState<Cfg>& st,
                                              ConsumerPipes<Cfg>& pipes) {
  constexpr int kKTiles = SwapState<Cfg>::kKTiles, kDTiles = SwapState<Cfg>::kDTiles;
  if (!swap_start<Cfg>(p, tile, bars, st, pipes)) return;
  uint8_t* pt = const_cast<uint8_t*>(smem) + Cfg::kSmemSwapPOffset;
  float* red = reinterpret_cast<float*>(const_cast<uint8_t*>(smem) + Cfg::kSmemSwapRedOffset);
  const SmemDesc q_desc(make_smem_desc_sw128(smem + Cfg::kSmemQOffset + pipes.q.stage * Cfg::kQBytes, 16, 1024));
  const SmemDesc pt_desc(make_smem_desc_sw128(pt, 16, 1024));
  const SmemDesc k0(make_smem_desc_sw128(smem + Cfg::kSmemKOffset, 16, 1024));
  // V as loaded (key rows in 64-column chunks) is V^T M-major: the chunk is the m64 tile, 8 key rows the stride.
  const SmemDesc v0(make_smem_desc_sw128(smem + Cfg::kSmemVOffset, Cfg::kVChunkBytes, 1024));
  const float scale = p.scale_log2;
  // Causal (bottom-right): query row q of the sequence sees keys up to q + seqlen_k - seqlen_q.
  const int64_t diag = tile.seq.seqlen_k - tile.seq.seqlen_q + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM;
  bars.q.wait(pipes.q);
  int parity = 0;
  for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
    // S^T = K Q^T: per m64 tile of keys, D / 16 k-steps along the head dim (32 bytes inside a 128-byte chunk).
    float s[kKTiles][4];
    bars.k.wait(pipes.k);
    const SmemDesc k_tile = k0 + pipes.k.stage * Cfg::kKTileBytes;
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < kKTiles; ++i) {
#pragma unroll
      for (int k = 0; k < Cfg::kHeadDim / 16; ++k) {
        const uint64_t da = (k_tile + (i * 64 * kSwapRowBytes + (k / 4) * Cfg::kKVChunkBytes + (k % 4) * 32)).u64();
        const uint64_t db = (q_desc + ((k / 4) * Cfg::kQChunkBytes + (k % 4) * 32)).u64();
        WgmmaSS<typename Cfg::Element, 8>::mma(s[i], da, db, k > 0 ? 1 : 0);
      }
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < kKTiles; ++i) fence_regs(s[i]);
    bars.k.release(pipes.k);
    pipes.k.advance();
    if (Cfg::kSeparateO && n_block == tile.keys.begin) bars.q.release(pipes.q);

    swap_softmax<Cfg>(tile, n_block, diag, scale, s, st, pt, red + 32 * parity);
    parity ^= 1;

    // O^T += V^T P^T: per m64 tile of head dims (a V chunk), block_n / 16 k-steps of 16 key rows.
    bars.wait_v(pipes.v, false);
    zero_v_rows_past_end<Cfg>(p, tile, n_block, smem + Cfg::kSmemVOffset + pipes.v.stage * Cfg::kVTileBytes);
    const SmemDesc v_tile = v0 + pipes.v.stage * Cfg::kVTileBytes;
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) fence_regs(st.o[i]);
    wgmma_fence();
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
      for (int t = 0; t < Cfg::kBlockN / 16; ++t) {
        const uint64_t da = (v_tile + (i * Cfg::kVChunkBytes + t * 16 * kSwapRowBytes)).u64();
        const uint64_t db = (pt_desc + ((t / 4) * 8 * kSwapRowBytes + (t % 4) * 32)).u64();
        WgmmaSSTransA<typename Cfg::Element, 8>::mma(st.o[i], da, db, 1);
      }
    }
    wgmma_commit_group();
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) fence_regs(st.o[i]);
    bars.v.release(pipes.v);
    pipes.v.advance();
  }
}

// O (or the split's partial) and LSE of the tile's rows from O^T: the columns' sums reduced like their maxima.
template <class Cfg>
__device__ __forceinline__ void swap_epilogue(const FwdParams& p, int tile_idx, const Tile& tile, uint8_t* smem,
                                              SharedBarriers<Cfg>& bars, SwapState<Cfg>& st,
                                              const ConsumerPipes<Cfg>& pipes) {
  constexpr int kDTiles = SwapState<Cfg>::kDTiles;
  const int t = threadIdx.x % 128, lane = t % 32;
  float total[2] = {st.l[0], st.l[1]};
  swap_column_reduce(total, reinterpret_cast<float*>(smem + Cfg::kSmemSwapRedOffset) + 64, SwapSum{});
  float inv[2], lse[2];
  int64_t row[2];
  const float scale_log2 = Cfg::kKV8Direct ? st.scale_log2 : p.scale_log2;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int col = 2 * (lane % 4) + c;
    const float sum = total[c];
    inv[c] = sum == 0.f ? 0.f : __fdividef(1.f, sum);
    lse[c] = sum == 0.f ? -INFINITY : (st.m[c] * scale_log2 + __log2f(sum)) * 0.69314718055994530942f;
    row[c] = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + col;
  }
  const int64_t seqlen_q = tile.seq.seqlen_q;
  // Causal rows: non-finite V at a query's masked keys (kernels/common/masked_v.cuh; epilogue.cuh repair_masked_v).
  if constexpr (kRepairsMaskedV<Cfg>) {
    // Query column 0 of the thread's two (column 1 holds the same head-dim rows: kernels::any_nonfinite).
    const bool fired = kernels::any_nonfinite<2 * kDTiles>([&](int e) { return st.o[e / 2][2 * (e % 2)]; });
    if (__any_sync(0xffffffffu, fired)) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (lse[c] != lse[c]) continue;
        // (row: column c)
        // (An e4m3 KV cache's: the descaled scale without Q's power of two, as the repair computes from the caller's Q.)
        float repair_scale = p.scale_log2;
        if constexpr (Cfg::kKV8Direct) repair_scale = descaled_score_scale(p, descale_index(p, tile));
        const float new_inv = repair_row_of_tile<Cfg>(p, tile_idx, swap_col(c), repair_scale, [&](auto&& f) {
#pragma unroll
          for (int i = 0; i < kDTiles; ++i) {
            f(swap_dim<Cfg>(i, c), st.o[i][c]);
            f(swap_dim<Cfg>(i, c + 2), st.o[i][c + 2]);
          }
        });
        if (new_inv >= 0.f) inv[c] = new_inv;
      }
    }
  }
  if constexpr (Cfg::kKV8Direct) {  // V's descale
    inv[0] *= st.o_scale;
    inv[1] *= st.o_scale;
  }
  const bool partial = Cfg::kSplitKv && p.num_splits > 1;
  if (partial) {
    const int64_t part = (static_cast<int64_t>(tile.batch) * p.num_heads_q + tile.head) * p.num_splits + tile.split;
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (row[r & 1] >= seqlen_q) continue;
        p.o_partial[(part * seqlen_q + row[r & 1]) * Cfg::kHeadDimV + swap_dim<Cfg>(i, r)] = st.o[i][r] * inv[r & 1];
      }
    }
    if (t < 4) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (row[c] < seqlen_q) p.lse_partial[part * seqlen_q + row[c]] = lse[c];
      }
    }
  } else {
    char* o_rows = static_cast<char*>(p.o) + tile.batch * p.o_stride_batch_bytes + tile.head * p.o_stride_head_bytes;
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (row[r & 1] >= seqlen_q) continue;
        auto* o_row = reinterpret_cast<uint16_t*>(o_rows + (tile.seq.q_row0 + row[r & 1]) * p.o_stride_seq_bytes);
        o_row[swap_dim<Cfg>(i, r)] = swap_bits16<typename Cfg::OutElement>(st.o[i][r] * inv[r & 1]);
      }
    }
    if (p.lse != nullptr && t < 4) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        if (row[c] < seqlen_q) {
          p.lse[tile.batch * p.lse_stride_batch + tile.head * p.lse_stride_head + tile.seq.q_row0 + row[c]] = lse[c];
        }
      }
    }
  }
  // The Q tile goes back once every thread is past its last GEMM (with a separate O buffer the main loop did).
  if (!Cfg::kSeparateO) {
    kernels::named_barrier_sync(1, 128);
    if (t == 0) bars.q.release(pipes.q);
  }
  if (partial && p.split_counters != nullptr) merge_if_last_split<Cfg>(p, tile, 0);
}

}  // namespace flashcore::sm90

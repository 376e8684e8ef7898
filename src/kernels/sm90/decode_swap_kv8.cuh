// The transposed decode rows (decode_swap.cuh) on an e4m3 KV cache (Cfg::kKV8Direct, head dim 128): the consumer
// warpgroup widens K and V from the TMA's staging ring straight into the register A operands of its GEMMs, so a
// block goes through shared memory once, in 8 bits, and no converter warps or 16-bit tiles stand between the copy
// engine and the tensor cores (the 64-row kv8 rows: convert_kv.cuh).
//   S^T (keys x 8) = K (A: registers, fp16) * Q^T (B: the Q tile, K-major)
//   O^T (D x 8)   += V^T (A: registers, fp16) * P^T (B: shared memory, K-major)
// wgmma's A fragment (m64 x k16, warp w of the warpgroup, lane l = 4 g + c) holds rows 16 w + g (+ 8) and columns
// 2 c, 2 c + 1 (+ 8): two consecutive k of one row per register. Two orders make the widening cheap:
// - K: the contraction runs over the head dim in an order of our choosing as long as Q's follows it. Thread c takes
//   bytes 32 c .. 32 c + 31 of its key rows (two 16-byte loads, no bank conflicts through the 128-byte swizzle), and
//   k-step k reads their word k: its low pair is columns 2 c, 2 c + 1 and its high pair 2 c + 8, 2 c + 9. So GEMM
//   column 16 k + 2 c + j holds head dim 32 c + 4 k + j, and 16 k + 2 c + 8 + j holds 32 c + 4 k + 2 + j (j < 2):
//   the consumers rewrite the Q tile in that order once per tile (swap_kv8_prepare_q).
// - V: the GEMM's rows (head dims) can be any order the epilogue knows. The thread's four rows (two per m64 tile)
//   take head dims 4 (8 w + g) .. + 3, one 32-bit word of a key row; bytes of two key rows interleave with one
//   byte permute, and each pair widens in one instruction (decode_swap.cuh swap_dim gives the epilogue the order).
// The keys keep their order, so the softmax and P^T are the 16-bit rows' (swap_softmax). K's descale joins the score
// scale and V's the normalizer, as on the 64-row kv8 rows; bf16 Q computes in fp16 (config.h kHalfCompute).
#pragma once
#include <cuda/ptx>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/sm90/convert_kv.cuh"
#include "kernels/sm90/decode_swap.cuh"

namespace flashcore::sm90 {

template <class Cfg>
struct SwapKV8 {
  static_assert(Cfg::kKV8Direct && Cfg::kHeadDim == 128 && Cfg::kKV8RowBytes == 128 && Cfg::kQKRowBytes == 128,
                "head dim 128: one 128-byte e4m3 row per key, two 64-column chunks of 16-bit Q");
  static constexpr int kKTiles = SwapState<Cfg>::kKTiles, kDTiles = SwapState<Cfg>::kDTiles;
  static constexpr int kDSteps = Cfg::kHeadDim / 16;  // S GEMM k-steps
  static constexpr int kPSteps = Cfg::kBlockN / 16;   // P V GEMM k-steps

  // The fp16 pairs of the low and high two e4m3 bytes of a word (one F2FP each, the high half selected in place).
  __device__ __forceinline__ static void widen4(uint32_t w, uint32_t& lo, uint32_t& hi) {
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
  }

  // Every fragment of a GEMM is widened before its first wgmma issues, in registers of its own: with one fragment at a
  // time, ptxas reused its registers and waited for each wgmma before widening the next.
  template <int N>
  __device__ __forceinline__ static void pin(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      asm volatile("" : "+r"(a[k][0]), "+r"(a[k][1]), "+r"(a[k][2]), "+r"(a[k][3])::"memory");
    }
  }

  // GEMM column of the Q tile (K-major, 16-bit) that holds head dim d (the K order above).
  __device__ __forceinline__ static int q_column(int d) {
    const int c = d / 32, k = (d % 32) / 4, j = d % 4;
    return 16 * k + 2 * c + (j < 2 ? j : 6 + j);
  }

  // The Q tile rewritten in the K order, in place, once per tile; bf16 Q converted to fp16 times 2^e as the 64-row
  // rows' Q slice is (convert_kv.cuh q_slice_to_half: the largest finite |q| in [2^14, 2^15)). 8 rows x 2 chunks x
  // 8 units: thread t reads the unit at physical position t and writes its eight columns as four 32-bit pairs.
  // Returns 2^-e (1 for fp16 Q). Two named barriers: the warps' maxima (SharedBarriers::q_amax) and every read before
  // any write, then the rewritten tile before any wgmma reads it.
  __device__ __forceinline__ static float prepare_q(uint8_t* q_stage, SharedBarriers<Cfg>& bars) {
    static_assert(Cfg::kBlockM * Cfg::kChunks * 8 == 128, "one 16-byte unit per consumer thread");
    const int t = static_cast<int>(threadIdx.x % 128);
    const int chunk = t / 64, row = (t / 8) % 8, unit = (t % 8) ^ row;  // (128-byte swizzle: logical unit)
    const uint4 w = *reinterpret_cast<const uint4*>(q_stage + t * 16);
    uint32_t x[4] = {w.x, w.y, w.z, w.w};
    float up = 1.f, down = 1.f;
    if constexpr (Cfg::kHalfCompute) {
      uint32_t m2 = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) m2 = bf16x2_amax(m2, x[j]);
      bf16_amax_to_slot(m2, bars.q_amax, t);
    }
    kernels::named_barrier_sync(kSwapBarrier, 128);
    if constexpr (Cfg::kHalfCompute) {
      const int e = q_half_exponent(bars.q_amax);
      up = __int_as_float((127 + e) << 23);
      down = __int_as_float((127 - e) << 23);
#pragma unroll
      for (int j = 0; j < 4; ++j) x[j] = bf16x2_to_half2(x[j], up);
    }
    const int d0 = chunk * 64 + unit * 8;  // the unit's first head dim; pair j holds d0 + 2 j, d0 + 2 j + 1
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = q_column(d0 + 2 * j), col_chunk = col / 64, e = col % 64;
      uint8_t* dst = q_stage + col_chunk * Cfg::kQChunkBytes + row * 128 + (((e / 8) ^ row) * 16) + (e % 8) * 2;
      *reinterpret_cast<uint32_t*>(dst) = x[j];
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // generic writes before wgmma's (async proxy) reads
    kernels::named_barrier_sync(kSwapBarrier, 128);
    return down;
  }

  // S^T of one key block: K's m64 tiles from staging stage k8 (128-byte rows, 128-byte swizzle: unit u of row r at
  // u ^ (r % 8)).
  __device__ __forceinline__ static void gemm_s(float (&s)[kKTiles][4], const uint8_t* k8, SmemDesc q_desc) {
    const int t = static_cast<int>(threadIdx.x % 128), g = (t % 32) / 4, c = t % 4;
    const uint8_t* rows = k8 + (16 * (t / 32) + g) * 128;
#pragma unroll
    for (int i = 0; i < kKTiles; ++i) {
      uint4 raw[2][2];  // [row: g, g + 8][unit 2 c, 2 c + 1]
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          raw[h][u] = *reinterpret_cast<const uint4*>(rows + (64 * i + 8 * h) * 128 + (((2 * c + u) ^ g) * 16));
        }
      }
      uint32_t a[kDSteps][4];
#pragma unroll
      for (int k = 0; k < kDSteps; ++k) {
        const uint32_t w0 = (&raw[0][k / 4].x)[k % 4], w1 = (&raw[1][k / 4].x)[k % 4];
        widen4(w0, a[k][0], a[k][2]);
        widen4(w1, a[k][1], a[k][3]);
      }
      pin(a);
      wgmma_fence();  // (the fragments' writes before the wgmmas that read them)
#pragma unroll
      for (int k = 0; k < kDSteps; ++k) {
        const uint64_t db = (q_desc + ((k / 4) * Cfg::kQChunkBytes + (k % 4) * 32)).u64();
        WgmmaRSKMajorB<__half, 8>::mma(s[i], a[k], db, k > 0 ? 1 : 0);
      }
    }
    wgmma_commit_group();
  }

  // O^T += V^T P^T of one key block from staging stage v8: per k-step, the thread's words of key rows 2 c, 2 c + 1,
  // 2 c + 8 and 2 c + 9, interleaved by pairs of rows and widened into both m64 tiles' fragments.
  __device__ __forceinline__ static void gemm_pv(float (&o)[kDTiles][4], const uint8_t* v8, SmemDesc pt_desc) {
    static_assert(kDTiles == 2, "a 32-bit word of four head dims per key row");
    const int t = static_cast<int>(threadIdx.x % 128), g = (t % 32) / 4, c = t % 4;
    const int unit = (2 * (t / 32) + g / 4), byte = 4 * (g % 4);  // head dims 4 (8 w + g) .. + 3
    const uint8_t* row0 = v8 + 2 * c * 128 + ((unit ^ (2 * c)) * 16) + byte;
    const uint8_t* row1 = v8 + (2 * c + 1) * 128 + ((unit ^ (2 * c + 1)) * 16) + byte;
    uint32_t a[2 * kPSteps][4];  // [2 k + i]: m64 tile i of k-step k
#pragma unroll
    for (int k = 0; k < kPSteps; ++k) {
      const int step = k * 16 * 128;
      const uint32_t a0 = *reinterpret_cast<const uint32_t*>(row0 + step);
      const uint32_t a1 = *reinterpret_cast<const uint32_t*>(row1 + step);
      const uint32_t b0 = *reinterpret_cast<const uint32_t*>(row0 + step + 8 * 128);
      const uint32_t b1 = *reinterpret_cast<const uint32_t*>(row1 + step + 8 * 128);
      // Bytes (a0.0, a1.0, a0.1, a1.1): head dims d, d + 1 of keys 2 c, 2 c + 1; then d + 2, d + 3.
      widen4(__byte_perm(a0, a1, 0x5140), a[2 * k][0], a[2 * k][1]);
      widen4(__byte_perm(a0, a1, 0x7362), a[2 * k + 1][0], a[2 * k + 1][1]);
      widen4(__byte_perm(b0, b1, 0x5140), a[2 * k][2], a[2 * k][3]);
      widen4(__byte_perm(b0, b1, 0x7362), a[2 * k + 1][2], a[2 * k + 1][3]);
    }
    pin(a);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kPSteps; ++k) {
      const uint64_t db = (pt_desc + ((k / 4) * 8 * kSwapRowBytes + (k % 4) * 32)).u64();
      WgmmaRSKMajorB<__half, 8>::mma(o[0], a[2 * k], db, 1);
      WgmmaRSKMajorB<__half, 8>::mma(o[1], a[2 * k + 1], db, 1);
    }
    wgmma_commit_group();
  }

  // V rows of a block at or past the sequence's end hold whatever the cache holds there (NaN included): zeros in the
  // staging stage before the P V GEMM reads it (P is 0 there, but 0 * NaN is not). Whole rows: the swizzle does not
  // matter. A block with every row inside the sequence returns at once; the others meet the named barrier.
  __device__ __forceinline__ static void zero_rows_past_end(const Tile& tile, int n_block, uint8_t* v8) {
    const int64_t left = tile.seq.seqlen_k - static_cast<int64_t>(n_block) * Cfg::kBlockN;  // same in the whole CTA
    if (left >= Cfg::kBlockN) return;
    const int valid = left > 0 ? static_cast<int>(left) : 0;
    for (int u = static_cast<int>(threadIdx.x % 128); u < (Cfg::kBlockN - valid) * 8; u += 128) {
      *reinterpret_cast<uint4*>(v8 + valid * 128 + u * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
    kernels::named_barrier_sync(kSwapBarrier, 128);
  }
};

template <class Cfg>
__device__ __forceinline__ void swap_kv8_mainloop(const FwdParams& p, const Tile& tile, const uint8_t* smem,
                                                  SharedBarriers<Cfg>& bars, SwapState<Cfg>& st,
                                                  ConsumerPipes<Cfg>& pipes) {
  using Ops = SwapKV8<Cfg>;
  if (!swap_start<Cfg>(p, tile, bars, st, pipes)) return;
  uint8_t* pt = const_cast<uint8_t*>(smem) + Cfg::kSmemSwapPOffset;
  float* red = reinterpret_cast<float*>(const_cast<uint8_t*>(smem) + Cfg::kSmemSwapRedOffset);
  uint8_t* q_stage = const_cast<uint8_t*>(smem) + Cfg::kSmemQOffset + pipes.q.stage * Cfg::kQBytes;
  const SmemDesc q_desc(make_smem_desc_sw128(q_stage, 16, 1024));
  const SmemDesc pt_desc(make_smem_desc_sw128(pt, 16, 1024));
  const int64_t idx = descale_index(p, tile);
  if (p.v_descale != nullptr) st.o_scale = __ldg(p.v_descale + idx);
  const int64_t diag = tile.seq.seqlen_k - tile.seq.seqlen_q + static_cast<int64_t>(tile.m_block) * Cfg::kBlockM;
  bars.q.wait(pipes.q);
  st.scale_log2 = descaled_score_scale(p, idx) * Ops::prepare_q(q_stage, bars);
  int parity = 0;
  for (int n_block = tile.keys.end - 1; n_block >= tile.keys.begin; --n_block) {
    float s[SwapState<Cfg>::kKTiles][4];
    bars.k.wait(pipes.k);
    Ops::gemm_s(s, smem + Cfg::kSmemK8Offset + pipes.k.stage * Cfg::kK8TileBytes, q_desc);
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < SwapState<Cfg>::kKTiles; ++i) fence_regs(s[i]);
    bars.k.release(pipes.k);
    pipes.k.advance();
    if (Cfg::kSeparateO && n_block == tile.keys.begin) bars.q.release(pipes.q);

    swap_softmax<Cfg>(tile, n_block, diag, st.scale_log2, s, st, pt, red + 32 * parity);
    parity ^= 1;

    bars.v.wait(pipes.v);
    uint8_t* v8 = const_cast<uint8_t*>(smem) + Cfg::kSmemV8Offset + pipes.v.stage * Cfg::kK8TileBytes;
    Ops::zero_rows_past_end(tile, n_block, v8);
#pragma unroll
    for (int i = 0; i < SwapState<Cfg>::kDTiles; ++i) fence_regs(st.o[i]);
    Ops::gemm_pv(st.o, v8, pt_desc);
    wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < SwapState<Cfg>::kDTiles; ++i) fence_regs(st.o[i]);
    bars.v.release(pipes.v);
    pipes.v.advance();
  }
}

}  // namespace flashcore::sm90

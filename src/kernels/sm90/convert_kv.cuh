// KV converter role (e4m3 KV cache under 16-bit Q, Cfg::kKV8): TMA brings each K and V block in 8 bits into a
// staging ring, and two or three warps of the producer warpgroup widen it into the 16-bit tile the consumers' GEMMs
// read, exactly (every e4m3 value is an fp16 and a bf16 value); the descales stay out of the tile (mainloop.cuh
// tile_scales: K's in the score scale, V's in O's factor).
//   TMA thread: k8_full[s] (transaction bytes)  ->  converter warps: k.full[s]  ->  consumers: k.empty[s]
// and V likewise. A 16-bit stage and its staging stage are used together: the producer thread acquires the 16-bit
// stage before it loads the staging one, and the consumers release the 16-bit stage only after the converters have
// read the staging one.
#pragma once
#include <cuda/ptx>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/warp.cuh"
#include "kernels/sm90/pipeline.cuh"

namespace flashcore::sm90 {

template <class Cfg>
struct KVConverter {
  using Element = typename Cfg::MmaElement;  // fp16 under bf16 Q too (Cfg::kHalfCompute)
  static constexpr int kRowUnits = Cfg::kHeadDim / 16;         // 16-byte e4m3 units per key row
  static constexpr int kChunkUnits = Cfg::kKV8RowBytes / 16;   // of them per staging chunk row (8, or 4 at head dim 64)
  static_assert(Cfg::kKV8 && Cfg::kQKRowBytes == 128 && Cfg::kVRowBytes == 128 && Cfg::kChunkCols == 64,
                "16-bit tiles of 64-column chunks");
  static_assert(Cfg::kKV8RowBytes == 128 || Cfg::kKV8RowBytes == 64, "128- or 64-byte swizzled staging rows");

  // Two e4m3 values (the low byte first) as two 16-bit values of Element, in a 32-bit register.
  __device__ __forceinline__ static uint32_t widen2(uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    if constexpr (std::is_same_v<Element, __half>) {
      return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    } else {
      const float2 f = __half22float2(__half2(h));
      const __nv_bfloat162 b = __float22bfloat162_rn(f);
      return *reinterpret_cast<const uint32_t*>(&b);
    }
  }

  // Widens one block: staging tile `src` (8-bit layout: chunk c of row r at c * kKV8ChunkBytes + r * row bytes,
  // units swizzled by the row's phase) into the 16-bit tile `dst` (64-column chunks of 128-byte rows, 128-byte
  // swizzle), by converter thread `thread` of kThreadCount. Unit i of the block, row i / kRowUnits, goes to thread
  // i % kThreadCount; consecutive lanes take consecutive units of a row, so that a warp's loads and stores fall in
  // distinct banks. kThreadCount is a multiple of kRowUnits, so a thread keeps one column unit and steps over the rows
  // by kRowsPerPass: its addresses are two base pointers, the pass's offset and the row's swizzle phase. Passes go in
  // batches of kBatch, each batch's loads before its conversions, so that several loads are in flight at once.
  // kChecked: rows at or past `rows` are written as zeros (a V block's rows past its sequence: SharedBarriers::v_rows),
  // whatever the staging tile holds there.
  template <int kThreadCount, bool kChecked>
  __device__ __forceinline__ static void widen_block(const uint8_t* src, uint8_t* dst, int thread, int rows) {
    static_assert(kThreadCount % kRowUnits == 0, "each thread keeps one column unit");
    constexpr int kRowsPerPass = kThreadCount / kRowUnits;
    constexpr int kFull = Cfg::kBlockN / kRowsPerPass;  // passes whose rows are all inside the block
    constexpr int kBatch = 4;
    const int u = thread % kRowUnits, r0 = thread / kRowUnits;
    const int u8 = u % kChunkUnits;
    // Columns 16 u .. 16 u + 15: 16-bit units 2 u' and 2 u' + 1 (u' = u % 4) of chunk (16 u) / 64.
    const int u16 = 2 * (u % 4);
    const uint8_t* src_row = src + (u / kChunkUnits) * Cfg::kKV8ChunkBytes + r0 * Cfg::kKV8RowBytes;
    uint8_t* dst_row = dst + (u / 4) * Cfg::kKVChunkBytes + r0 * Cfg::kQKRowBytes;
    auto load = [&](int k) {
      const int r = r0 + k * kRowsPerPass;
      const int phase8 = Cfg::kKV8RowBytes == 128 ? (r & 7) : ((r >> 1) & 3);
      const uint4 in =
          *reinterpret_cast<const uint4*>(src_row + k * kRowsPerPass * Cfg::kKV8RowBytes + ((u8 ^ phase8) << 4));
      return !kChecked || r < rows ? in : make_uint4(0u, 0u, 0u, 0u);  // (e4m3 zeros widen to zeros)
    };
    auto store = [&](int k, const uint4& in) {
      const int r = r0 + k * kRowsPerPass;
      uint4 lo, hi;
      lo.x = widen2(in.x), lo.y = widen2(in.x >> 16), lo.z = widen2(in.y), lo.w = widen2(in.y >> 16);
      hi.x = widen2(in.z), hi.y = widen2(in.z >> 16), hi.z = widen2(in.w), hi.w = widen2(in.w >> 16);
      // (u16 is even: unit u16 + 1's swizzled offset is unit u16's with bit 4 flipped.)
      const int lo_offset = (u16 ^ (r & 7)) << 4;
      uint8_t* row = dst_row + k * kRowsPerPass * Cfg::kQKRowBytes;
      *reinterpret_cast<uint4*>(row + lo_offset) = lo;
      *reinterpret_cast<uint4*>(row + (lo_offset ^ 16)) = hi;
    };
    auto batch = [&](int k, auto count) {
      uint4 in[decltype(count)::value];
#pragma unroll
      for (int j = 0; j < decltype(count)::value; ++j) in[j] = load(k + j);
#pragma unroll
      for (int j = 0; j < decltype(count)::value; ++j) store(k + j, in[j]);
    };
#pragma unroll 1
    for (int k = 0; k < kFull / kBatch * kBatch; k += kBatch) batch(k, std::integral_constant<int, kBatch>{});
    if constexpr (kFull % kBatch != 0) {
      batch(kFull / kBatch * kBatch, std::integral_constant<int, kFull % kBatch>{});
    }
    if constexpr (kFull * kRowsPerPass < Cfg::kBlockN) {  // the last pass, partly inside the block
      if (r0 + kFull * kRowsPerPass < Cfg::kBlockN) store(kFull, load(kFull));
    }
  }

  // The role's loop, for converter warp `warp` of `warps`: per ring position, K's block then V's, each waited for,
  // widened, made visible to wgmma (async proxy) and marked full (one arrival per warp). The producer thread ends it
  // with a K staging stage that carries no bytes and its v_end flag set (Producer::end_kv8_converters).
  __device__ __forceinline__ static void run(uint8_t* smem, SharedBarriers<Cfg>& bars, int warp, int warps) {
    // (Both counts of convert_warps, each with its passes unrolled.)
    if (warps == 3) {
      run_warps<3>(smem, bars, warp);
    } else {
      run_warps<2>(smem, bars, warp);
    }
  }

  template <int kWarps>
  __device__ __forceinline__ static void run_warps(uint8_t* smem, SharedBarriers<Cfg>& bars, int warp) {
    constexpr int kThreadCount = kWarps * 32;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int thread = warp * 32 + lane;
    PipelineState<Cfg::kStages> pos;
    for (;;) {
      const int s = pos.stage;
      mbar_wait(&bars.k8_full[s], pos.phase);
      if (__shfl_sync(0xffffffffu, lane == 0 ? atomicOr(&bars.v_end[s], 0) : 0, 0) != 0) return;
      widen_block<kThreadCount, false>(smem + Cfg::kSmemK8Offset + s * Cfg::kK8TileBytes,
                                       smem + Cfg::kSmemKOffset + s * Cfg::kKTileBytes, thread, Cfg::kBlockN);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bars.k.full[s]);
      mbar_wait(&bars.v8_full[s], pos.phase);
      // (Read and written as atomics, as v_end: the slot is rewritten for the stage's next block once the consumers
      // have freed the stage, an order through three barriers that compute-sanitizer's racecheck does not follow.)
      const int rows = __shfl_sync(0xffffffffu, lane == 0 ? atomicOr(&bars.v_rows[s], 0) : 0, 0);
      const uint8_t* v8 = smem + Cfg::kSmemV8Offset + s * Cfg::kK8TileBytes;
      uint8_t* v16 = smem + Cfg::kSmemVOffset + s * Cfg::kVTileBytes;
      if (rows >= Cfg::kBlockN) {  // (a whole block: no row to check)
        widen_block<kThreadCount, false>(v8, v16, thread, rows);
      } else {
        widen_block<kThreadCount, true>(v8, v16, thread, rows);
      }
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bars.v.full[s]);
      pos.advance();
    }
  }
};

// bf16 Q's fp16 conversion (q_slice_to_half, decode_swap_kv8.cuh prepare_q) in three steps: the largest finite
// magnitude of two bf16 (a 32-bit word) folded into m2 (bf16 bits, an unsigned order of magnitudes; Inf and NaN count
// as 0); a warp's largest into its slot (SharedBarriers::q_amax); and two bf16 times 2^e as an fp16 pair.
__device__ __forceinline__ uint32_t bf16x2_amax(uint32_t m2, uint32_t x) {
  const uint32_t a = x & 0x7fff7fffu;
  return __vmaxu2(m2, a & __vcmpltu2(a, 0x7f807f80u));
}
__device__ __forceinline__ void bf16_amax_to_slot(uint32_t m2, uint32_t (&slots)[4], int t) {
  const uint32_t m_warp = __reduce_max_sync(0xffffffffu, (m2 >> 16) > (m2 & 0xffffu) ? m2 >> 16 : m2 & 0xffffu);
  if (t % 32 == 0) slots[t / 32] = m_warp;
}
__device__ __forceinline__ uint32_t bf16x2_to_half2(uint32_t x, float up) {
  const __half2 h = __floats2half2_rn(__uint_as_float(x << 16) * up, __uint_as_float(x & 0xffff0000u) * up);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The power of two e of q_slice_to_half from the warps' largest |q| (bf16 bits): 14 - floor(log2(max)), from the
// exponent field; at most 126, so that 2^e and 2^-e are normal floats.
__device__ __forceinline__ int q_half_exponent(const uint32_t (&slots)[4]) {
  const uint32_t m = max(max(slots[0], slots[1]), max(slots[2], slots[3]));
  return m == 0 ? 0 : min(141 - static_cast<int>(m >> 7), 126);
}

// bf16 Q on an e4m3 KV cache computes in fp16 (Cfg::kHalfCompute): the consumer warpgroup converts its Q slice in the
// tile's Q stage in place, once per tile, times 2^e with e chosen so that the slice's largest finite |q| lands in
// [2^14, 2^15): no fp16 overflow, and bf16's 8 significant bits kept exactly down to 2^-24 of that largest value (the
// normal fp16 range). Inf and NaN convert as they are. Returns 2^-e, the factor the scores take back in the softmax
// (mainloop.cuh: ConsumerState::scale_log2). An element-wise map, so the swizzle does not matter: a thread takes the
// 16-byte units t, t + 128, ... of each 64-column chunk's 64 rows. slots: one per warp (SharedBarriers::q_amax);
// barrier: a named barrier of the warpgroup's 128 threads, met twice (the slots, then the converted slice before any
// wgmma reads it).
template <class Cfg>
__device__ __forceinline__ float q_slice_to_half(uint8_t* q_stage, uint32_t (&slots)[4], uint32_t barrier) {
  static_assert(Cfg::kHalfCompute && Cfg::kConsumerWarpgroups == 1 && Cfg::kQKRowBytes == 128, "one warpgroup's Q");
  constexpr int kUnits = Cfg::kRowsPerWarpgroup * Cfg::kQKRowBytes / 16;  // per chunk
  const int t = static_cast<int>(threadIdx.x % 128);
  auto unit = [&](int i) {  // the thread's i-th unit
    const int u = t + 128 * i;
    return reinterpret_cast<uint4*>(q_stage + (u / kUnits) * Cfg::kQChunkBytes) + u % kUnits;
  };
  constexpr int kPerThread = Cfg::kChunks * kUnits / 128;
  uint32_t m2 = 0;
#pragma unroll 1
  for (int i = 0; i < kPerThread; ++i) {
    const uint4 w = *unit(i);
    const uint32_t x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) m2 = bf16x2_amax(m2, x[j]);
  }
  bf16_amax_to_slot(m2, slots, t);
  kernels::named_barrier_sync(barrier, 128);
  const int e = q_half_exponent(slots);
  const float up = __int_as_float((127 + e) << 23);
#pragma unroll 1
  for (int i = 0; i < kPerThread; ++i) {
    const uint4 w = *unit(i);
    uint32_t x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] = bf16x2_to_half2(x[j], up);
    *unit(i) = make_uint4(x[0], x[1], x[2], x[3]);
  }
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // generic writes before wgmma's (async proxy) reads
  kernels::named_barrier_sync(barrier, 128);
  return __int_as_float((127 - e) << 23);
}

}  // namespace flashcore::sm90

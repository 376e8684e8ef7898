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

#include "kernels/sm90/pipeline.cuh"

namespace flashcore::sm90 {

template <class Cfg>
struct KVConverter {
  using Element = typename Cfg::Element;
  static constexpr int kRowUnits = Cfg::kHeadDim / 16;         // 16-byte e4m3 units per key row
  static constexpr int kChunkUnits = Cfg::kKV8RowBytes / 16;   // of them per staging chunk row (8, or 4 at head dim 64)
  static constexpr int kUnits = Cfg::kBlockN * kRowUnits;      // per block
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
  // swizzle). Unit i of the block, row i / kRowUnits, goes to thread i % threads; consecutive lanes take consecutive
  // units of a row, so that a warp's loads and stores fall in distinct banks. Rows at or past `rows` are written as
  // zeros (a V block's rows past its sequence: SharedBarriers::v_rows), whatever the staging tile holds there.
  __device__ __forceinline__ static void widen_block(const uint8_t* src, uint8_t* dst, int thread, int threads,
                                                     int rows = Cfg::kBlockN) {
#pragma unroll 2
    for (int i = thread; i < kUnits; i += threads) {
      const int r = i / kRowUnits, u = i % kRowUnits;
      const int c8 = u / kChunkUnits, u8 = u % kChunkUnits;
      const int phase8 = Cfg::kKV8RowBytes == 128 ? (r & 7) : ((r >> 1) & 3);
      const uint4 in = r < rows ? *reinterpret_cast<const uint4*>(src + c8 * Cfg::kKV8ChunkBytes +
                                                                   r * Cfg::kKV8RowBytes + ((u8 ^ phase8) << 4))
                                : make_uint4(0u, 0u, 0u, 0u);  // (e4m3 zeros widen to zeros)
      // Columns 16 u .. 16 u + 15: 16-bit units 2 u' and 2 u' + 1 of chunk (16 u) / 64, u' = u % 4.
      const int c16 = u / 4, u16 = 2 * (u % 4);
      uint8_t* row = dst + c16 * Cfg::kKVChunkBytes + r * Cfg::kQKRowBytes;
      uint4 lo, hi;
      lo.x = widen2(in.x), lo.y = widen2(in.x >> 16), lo.z = widen2(in.y), lo.w = widen2(in.y >> 16);
      hi.x = widen2(in.z), hi.y = widen2(in.z >> 16), hi.z = widen2(in.w), hi.w = widen2(in.w >> 16);
      *reinterpret_cast<uint4*>(row + ((u16 ^ (r & 7)) << 4)) = lo;
      *reinterpret_cast<uint4*>(row + (((u16 + 1) ^ (r & 7)) << 4)) = hi;
    }
  }

  // The role's loop, for converter warp `warp` of `warps`: per ring position, K's block then V's, each waited for,
  // widened, made visible to wgmma (async proxy) and marked full (one arrival per warp). The producer thread ends it
  // with a K staging stage that carries no bytes and its v_end flag set (Producer::end_kv8_converters).
  __device__ __forceinline__ static void run(uint8_t* smem, SharedBarriers<Cfg>& bars, int warp, int warps) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int thread = warp * 32 + lane, threads = warps * 32;
    PipelineState<Cfg::kStages> pos;
    for (;;) {
      const int s = pos.stage;
      mbar_wait(&bars.k8_full[s], pos.phase);
      if (__shfl_sync(0xffffffffu, lane == 0 ? atomicOr(&bars.v_end[s], 0) : 0, 0) != 0) return;
      widen_block(smem + Cfg::kSmemK8Offset + s * Cfg::kK8TileBytes, smem + Cfg::kSmemKOffset + s * Cfg::kKTileBytes,
                  thread, threads);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bars.k.full[s]);
      mbar_wait(&bars.v8_full[s], pos.phase);
      // (Read and written as atomics, as v_end: the slot is rewritten for the stage's next block once the consumers
      // have freed the stage, an order through three barriers that compute-sanitizer's racecheck does not follow.)
      const int rows = __shfl_sync(0xffffffffu, lane == 0 ? atomicOr(&bars.v_rows[s], 0) : 0, 0);
      widen_block(smem + Cfg::kSmemV8Offset + s * Cfg::kK8TileBytes, smem + Cfg::kSmemVOffset + s * Cfg::kVTileBytes,
                  thread, threads, rows);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bars.v.full[s]);
      pos.advance();
    }
  }
};

}  // namespace flashcore::sm90

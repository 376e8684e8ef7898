// V transposer role (8-bit configs, FwdParams::transpose_v): 8-bit wgmma reads its B operand K-major only, so V
// must sit in shared memory transposed (head-dim rows, keys innermost, permuted within each group of 16 keys as
// kernels::p8_key_of_slot). TMA loads V as stored (key rows, exactly like K), and warps 1-3 of the producer
// warpgroup transpose each tile in place before the consumers read it:
//   TMA thread: v.full[s] (transaction bytes)  ->  transposer warps: v_transposed[s]  ->  consumers: v.empty[s]
// The tile is squares of R x R bytes (R = the swizzled row width, 128 or 64 at head dim 64; tile_shape.h
// transposes_v_in_place), each a grid of N x N blocks of 16 x 16 bytes. One step of a warp swaps the blocks (a, b)
// and (b, a) of a square -- or rewrites two diagonal blocks -- with one ldmatrix.x4.trans, four byte permutes and
// one stmatrix.x4, so no block is written before its warp has read it and no other warp touches it.
#pragma once
#include <cuda/ptx>

#include <cstdint>

#include "kernels/common/warp.cuh"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {

// The steps of an N x N square of blocks: step o = (r, c), r = o / (N/2), c = o % (N/2), swaps the blocks
// (r, r + c + 1 mod N) and their mirror for c < N/2 - 1; for c = N/2 - 1, the pair (r, r + N/2) when r < N/2, else it
// rewrites the diagonal blocks r - N/2 and r. So every unordered pair of blocks is swapped once and every diagonal
// block rewritten once. Entry o packs the two blocks (p: block row of 16 key rows, q: 16-byte column unit) as
// pa | qa << 4 | pb << 8 | qb << 12, a in lanes 0-15, b in lanes 16-31. In constant memory, read with the step index,
// which is the same across the warp (one broadcast).
template <int kN>
struct TransposeSteps {
  uint16_t packed[kN * kN / 2];
};

template <int kN>
constexpr TransposeSteps<kN> transpose_steps() {
  TransposeSteps<kN> t{};
  for (int o = 0; o < kN * kN / 2; ++o) {
    const int r = o / (kN / 2), c = o % (kN / 2);
    int pa = 0, qa = 0, pb = 0, qb = 0;
    if (c < kN / 2 - 1 || r < kN / 2) {
      pa = r, qa = c < kN / 2 - 1 ? (r + c + 1) % kN : r + kN / 2;
      pb = qa, qb = pa;
    } else {
      pa = qa = r - kN / 2;
      pb = qb = r;
    }
    t.packed[o] = static_cast<uint16_t>(pa | qa << 4 | pb << 8 | qb << 12);
  }
  return t;
}

template <int kN>
__constant__ TransposeSteps<kN> kTransposeSteps = transpose_steps<kN>();

template <class Cfg>
struct VTransposer {
  static constexpr int kR = Cfg::kQKRowBytes;  // bytes per key row as loaded = keys per transposed row chunk
  static constexpr int kN = kR / 16;           // blocks per side of a square
  static constexpr int kStepsPerSquare = kN * kN / 2;
  static constexpr int kSquares = Cfg::kBlockN * Cfg::kHeadDim / (kR * kR);
  static_assert(Cfg::kTransposesV && Cfg::kVTChunkKeys == kR, "in-place squares (tile_shape.h)");
  static_assert((kStepsPerSquare & (kStepsPerSquare - 1)) == 0, "a power of two: i / kStepsPerSquare is a shift");

  uint32_t shift;  // 8 for lanes 16-31, which address a step's second block (ldmatrix / stmatrix matrices 2 and 3)
  uint32_t sel0;   // byte-permute selector of this lane's stmatrix registers 0 and 2 (1 and 3: sel0 ^ 0x1111)
  // This lane's ldmatrix and stmatrix rows in a 16-row block: byte offset plus swizzle phase << 4. A 16-row block is
  // whole swizzle atoms, so the phase depends on the row within it only, and a block's 16-byte unit u then sits at
  // (row offset + phase << 4) ^ (u << 4): the unit and phase bits lie below the row's.
  uint32_t load_lane, store_lane;

  __device__ __forceinline__ static uint32_t lane_offset(int row) {
    const int phase = kR == 128 ? (row & 7) : ((row >> 1) & 3);
    return static_cast<uint32_t>(row * kR + (phase << 4));
  }

  __device__ __forceinline__ explicit VTransposer(int lane) : shift(lane >= 16 ? 8u : 0u) {
    // ldmatrix.trans gives lane t the bytes of head-dim columns 2j, 2j+1 (j = t / 4) for keys 2q, 2q+1 (matrix 0:
    // block keys 0-7) and 8+2q, 9+2q (matrix 1: keys 8-15), q = t % 4: exactly the four keys of transposed slot quad
    // q (p8_key_of_slot). Permute 0x6420 collects column 2j's four bytes, 0x7531 column 2j+1's.
    // stmatrix matrix 0 takes rows 2j (j < 4) and 2j+1 (j >= 4), matrix 1 the others, so that each matrix's 8 rows
    // fall in 8 different swizzle phases (no bank conflicts); lane t / 4 = j supplies the matching register.
    sel0 = lane >= 16 ? 0x7531u : 0x6420u;
    load_lane = lane_offset(lane & 15);
    const int j = lane & 7;
    store_lane = lane_offset(2 * j + (((j >= 4) ? 1 : 0) ^ ((lane >> 3) & 1)));
  }

  // Step o (kTransposeSteps) of the square at shared address `square`: one ldmatrix.x4.trans of this lane's block
  // (p, q), four byte permutes, one stmatrix.x4 into block (q, p), i.e. rows 16q.. of head-dim columns, key unit p.
  __device__ __forceinline__ void step(uint32_t square, int o) const {
    const uint32_t blocks = kTransposeSteps<kN>.packed[o] >> shift;
    const uint32_t p = blocks & 15u, q = (blocks >> 4) & 15u;
    uint32_t v[4];
    kernels::ldmatrix_x4_trans(v, square + p * (16 * kR) + (load_lane ^ (q << 4)));
    const uint32_t sel1 = sel0 ^ 0x1111u;
    const uint32_t out[4] = {__byte_perm(v[0], v[1], sel0), __byte_perm(v[0], v[1], sel1),
                             __byte_perm(v[2], v[3], sel0), __byte_perm(v[2], v[3], sel1)};
    stmatrix_x4(square + q * (16 * kR) + (store_lane ^ (p << 4)), out);
  }

  // Warp `warp`'s steps of a tile: o = warp, warp + 3, ... of each square, the squares one after the other. A rolled
  // loop: unrolled, ptxas selected every step's blocks up front and spilled in the producer's 24 registers.
  __device__ __forceinline__ void steps(uint32_t tile, int warp) const {
#pragma unroll 1
    for (int i = warp; i < kSquares * kStepsPerSquare; i += kTransposeWarps) {
      step(tile + static_cast<uint32_t>((i / kStepsPerSquare) * kR * kR), i % kStepsPerSquare);
    }
  }

  // The role's loop: wait for each V stage's load, transpose it, make the generic-proxy writes visible to wgmma
  // (async proxy) and mark the stage transposed (one arrival per warp). The producer thread ends it with a stage
  // that carries no load and its v_end flag set (Producer::end_v_transposes); the flag is read and written with
  // atomics: its writer and the reads of earlier laps are ordered only through the consumers' barriers.
  __device__ __forceinline__ void run(uint8_t* smem, SharedBarriers<Cfg>& bars, int warp) const {
    const uint32_t v0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + Cfg::kSmemVOffset));
    PipelineState<Cfg::kStages> st;
    for (;;) {
      mbar_wait(&bars.v.full[st.stage], st.phase);
      const int lane = static_cast<int>(threadIdx.x % 32);
      int end = 0;
      if (lane == 0) end = atomicOr(&bars.v_end[st.stage], 0);
      if (__shfl_sync(0xffffffffu, end, 0) != 0) return;
      steps(v0 + static_cast<uint32_t>(st.stage * Cfg::kVTileBytes), warp);
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      if (lane == 0) mbar_arrive(&bars.v_transposed[st.stage]);
      st.advance();
    }
  }
};

}  // namespace flashcore::sm90

// V transposer role (8-bit configs, FwdParams::transpose_v): 8-bit wgmma reads its B operand K-major only, so V
// must sit in shared memory transposed (head-dim rows, keys innermost, permuted within each group of 16 keys as
// kernels::p8_key_of_slot). TMA loads V as stored (key rows, exactly like K), and warps 1-3 of the producer
// warpgroup transpose each tile in place before the consumers read it:
//   TMA thread: v.full[s] (transaction bytes)  ->  transposer warps: v_transposed[s]  ->  consumers: v.empty[s]
// The tile is squares of R x R bytes (R = the swizzled row width, 128 or 64 at head dim 64; tile_shape.h
// transposes_v_in_place), each a grid of N x N blocks of 16 x 16 bytes; block (p, q) is key rows 16p.. as loaded,
// 16-byte unit q, and its transpose goes to block (q, p). One ldmatrix.x4.trans reads two blocks (lanes 0-15 one,
// 16-31 the other), four byte permutes transpose them, one stmatrix.x4 writes them. A step moves four blocks: it
// reads all four before it writes any, and no other warp touches them.
#pragma once
#include <cuda/ptx>

#include <cstdint>
#include <utility>

#include "kernels/common/warp.cuh"
#include "kernels/sm90/pipeline.cuh"
#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {

// The steps of an N x N square of blocks (N even), each four blocks, so that an ldmatrix or stmatrix covers two
// blocks side by side ("across": (p, q) and (p, q + 1), q even) or one above the other ("down": (q, p) and (q + 1, p)):
//   - off the diagonal, for q even > p: read (p, q), (p, q + 1) across and their mirrors (q, p), (q + 1, p) down, write
//     each pair to the other's place;
//   - on it, for k < N / 2: read rows 2k and 2k + 1 of the 2 x 2 blocks at (2k, 2k) across, write them down.
// Every block is read and written once. Step s of the square: the off-diagonal steps (p ascending, then q), then
// the diagonal ones.
struct TransposeStep {
  int p, q;
  bool diagonal;
};

template <int kN>
constexpr TransposeStep transpose_step(int s) {
  for (int p = 0; p < kN; ++p) {
    for (int q = (p / 2 + 1) * 2; q < kN; q += 2) {
      if (s-- == 0) return {p, q, false};
    }
  }
  return {2 * s, 2 * s, true};
}

// Whether the kN * kN / 4 steps move every block of the square to its mirror once (checked at compile time).
template <int kN>
constexpr bool transpose_steps_cover_square() {
  int written[kN][kN] = {};
  for (int s = 0; s < kN * kN / 4; ++s) {
    const TransposeStep t = transpose_step<kN>(s);
    if (t.q % 2 != 0 || t.q >= kN || (t.diagonal ? t.p != t.q : t.q <= t.p)) return false;
    for (int i = 0; i < 2; ++i) {
      if (t.diagonal) {
        for (int r = 0; r < 2; ++r) ++written[t.q + i][t.p + r];  // row p + r's block q + i goes to (q + i, p + r)
      } else {
        ++written[t.q + i][t.p];  // (p, q + i) -> (q + i, p)
        ++written[t.p][t.q + i];  // (q + i, p) -> (p, q + i)
      }
    }
  }
  for (int r = 0; r < kN; ++r) {
    for (int c = 0; c < kN; ++c) {
      if (written[r][c] != 1) return false;
    }
  }
  return true;
}

template <class Cfg>
struct VTransposer {
  static constexpr int kR = Cfg::kQKRowBytes;  // bytes per key row as loaded = keys per transposed row chunk
  static constexpr int kN = kR / 16;           // blocks per side of a square
  static constexpr int kBlockRows = 16 * kR;   // bytes of one block row of the square
  static constexpr int kStepsPerSquare = kN * kN / 4;
  static constexpr int kSteps = Cfg::kBlockN * Cfg::kHeadDim / (kR * kR) * kStepsPerSquare;
  static_assert(Cfg::kTransposesV && Cfg::kVTChunkKeys == kR, "in-place squares (tile_shape.h)");
  static_assert(transpose_steps_cover_square<kN>(), "every block read and written by exactly one step");

  // This lane's ldmatrix (load) and stmatrix (store) rows in a 16-row block, relative to the V region: byte offset
  // plus swizzle phase << 4. A 16-row block is whole swizzle atoms, so the phase of a row depends on the row within the
  // block only, and unit u of the row sits at (row offset + phase << 4) ^ (u << 4): the unit and phase bits lie below
  // the row's, and the V tiles are 1024-byte aligned. Lanes 16-31 address the second block of a pair: across, unit
  // u ^ 1 (u even: one more XOR with `second`); down, 16 rows further (+ second * kR).
  uint32_t load, store;
  uint32_t second;  // 16 in lanes 16-31, else 0
  uint32_t sel0;    // byte-permute selector of this lane's stmatrix registers 0 and 2 (1 and 3: sel0 ^ 0x1111)

  __device__ __forceinline__ static uint32_t lane_offset(int row) {
    const int phase = kR == 128 ? (row & 7) : ((row >> 1) & 3);
    return static_cast<uint32_t>(row * kR + (phase << 4));
  }

  __device__ __forceinline__ explicit VTransposer(int lane) {
    // ldmatrix.trans gives lane t the bytes of head-dim columns 2j, 2j+1 (j = t / 4) for keys 2q, 2q+1 (matrix 0:
    // block keys 0-7) and 8+2q, 9+2q (matrix 1: keys 8-15), q = t % 4: exactly the four keys of transposed slot quad
    // q (p8_key_of_slot). Permute 0x6420 collects column 2j's four bytes, 0x7531 column 2j+1's.
    // stmatrix matrix 0 takes rows 2j (j < 4) and 2j+1 (j >= 4), matrix 1 the others, so that each matrix's 8 rows
    // fall in 8 different swizzle phases (no bank conflicts); lane t / 4 = j supplies the matching register.
    second = lane >= 16 ? 16u : 0u;
    sel0 = lane >= 16 ? 0x7531u : 0x6420u;
    load = lane_offset(lane & 15);
    const int j = lane & 7;
    store = lane_offset(2 * j + (((j >= 4) ? 1 : 0) ^ ((lane >> 3) & 1)));
  }

  // The address of two blocks at unit u of the block row at constant offset `row`, side by side (u even) or one above
  // the other, for this lane's row `lane_row` (`load` or `store` moved to the current tile).
  template <uint32_t u, uint32_t row>
  __device__ __forceinline__ uint32_t across(uint32_t lane_row) const {
    static_assert(u % 2 == 0, "a pair across starts at an even unit");
    return (lane_row ^ second ^ (u << 4)) + row;
  }
  template <uint32_t u, uint32_t row>
  __device__ __forceinline__ uint32_t down(uint32_t lane_row) const {
    return (lane_row ^ (u << 4)) + second * kR + row;
  }

  // The transposes of the two blocks an ldmatrix.x4.trans read, in stmatrix.x4 order.
  __device__ __forceinline__ void permute(const uint32_t (&v)[4], uint32_t (&out)[4]) const {
    const uint32_t sel1 = sel0 ^ 0x1111u;
    out[0] = __byte_perm(v[0], v[1], sel0), out[1] = __byte_perm(v[0], v[1], sel1);
    out[2] = __byte_perm(v[2], v[3], sel0), out[3] = __byte_perm(v[2], v[3], sel1);
  }

  // Step S of the tile that load_row and store_row point into (square S / kStepsPerSquare). Block row p and unit q
  // are constants, so that an address is two or three instructions. All four blocks are read before any is written.
  template <int S>
  __device__ __forceinline__ void step(uint32_t load_row, uint32_t store_row) const {
    constexpr TransposeStep t = transpose_step<kN>(S % kStepsPerSquare);
    constexpr uint32_t p = t.p, q = t.q;
    // The square's own bases (the square is added before the XOR): offsets after it let ptxas share one square's
    // addresses with the next square's steps, and it spilled them.
    constexpr uint32_t square = static_cast<uint32_t>(S / kStepsPerSquare * kR * kR);
    load_row += square, store_row += square;
    uint32_t a[4], b[4], out[4];
    kernels::ldmatrix_x4_trans(a, across<q, p * kBlockRows>(load_row));
    if constexpr (t.diagonal) {  // rows p and p + 1 of the 2 x 2 blocks at (p, p), written down columns p and p + 1
      permute(a, out);
      kernels::ldmatrix_x4_trans(b, across<q, (p + 1) * kBlockRows>(load_row));
      stmatrix_x4(down<p, q * kBlockRows>(store_row), out);
      permute(b, out);
      stmatrix_x4(down<p + 1, q * kBlockRows>(store_row), out);
    } else {  // (p, q), (p, q + 1) across <-> (q, p), (q + 1, p) down
      permute(a, out);
      kernels::ldmatrix_x4_trans(b, down<p, q * kBlockRows>(load_row));
      stmatrix_x4(down<p, q * kBlockRows>(store_row), out);
      permute(b, out);
      stmatrix_x4(across<q, p * kBlockRows>(store_row), out);
    }
  }

  // Warp W's steps of a tile: W, W + 3, ..., unrolled, so that every block choice is a constant (a table read in a
  // rolled loop cost about 31 instructions per two blocks; docs/decisions.md#v-transpose).
  template <int W>
  static constexpr int kWarpSteps = (kSteps - W + kTransposeWarps - 1) / kTransposeWarps;
  template <int W, int... I>
  __device__ __forceinline__ void steps(uint32_t load_row, uint32_t store_row, std::integer_sequence<int, I...>) const {
    (step<W + kTransposeWarps * I>(load_row, store_row), ...);
  }

  // The role's loop: wait for each V stage's load, transpose it, make the generic-proxy writes visible to wgmma
  // (async proxy) and mark the stage transposed (one arrival per warp). The producer thread ends it with a stage
  // that carries no load and its v_end flag set (Producer::end_v_transposes); the flag is read and written with
  // atomics: its writer and the reads of earlier laps are ordered only through the consumers' barriers.
  template <int W>
  __device__ __forceinline__ void run(uint8_t* smem, SharedBarriers<Cfg>& bars) const {
    // The lane's rows point into the current stage's tile (+ a tile keeps the XOR valid: its low 10 bits are 0) and
    // move with it: the loop keeps two address registers (the producer warps have 24).
    const uint32_t v0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem + Cfg::kSmemVOffset));
    uint32_t load_row = v0 + load, store_row = v0 + store;
    // The warp's count of stages lives in shared memory, read and written by lane 0 and broadcast, and is read again
    // after the steps: held in a register across them, with the stage and barrier addresses ptxas derives from it, it
    // was spilled in the producer's 24 registers.
    uint32_t* const lap_slot = &bars.v_lap[W];
    const bool leader = threadIdx.x % 32 == 0;
    for (;;) {
      uint32_t lap = __shfl_sync(0xffffffffu, leader ? *lap_slot : 0u, 0);
      mbar_wait(&bars.v.full[lap % Cfg::kStages], (lap / Cfg::kStages) & 1u);
      int end = 0;
      if (leader) end = atomicOr(&bars.v_end[lap % Cfg::kStages], 0);
      if (__shfl_sync(0xffffffffu, end, 0) != 0) return;
      steps<W>(load_row, store_row, std::make_integer_sequence<int, kWarpSteps<W>>{});
      cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
      __syncwarp();
      lap = __shfl_sync(0xffffffffu, leader ? *lap_slot : 0u, 0);
      const uint32_t stage = lap % Cfg::kStages;
      if (leader) {
        mbar_arrive(&bars.v_transposed[stage]);
        *lap_slot = lap + 1;
      }
      const uint32_t next = stage == Cfg::kStages - 1 ? 0u - (Cfg::kStages - 1) * Cfg::kVTileBytes : Cfg::kVTileBytes;
      load_row += next, store_row += next;
    }
  }

  // Transposer warp `warp` (0-2): its steps compiled as constants.
  __device__ __forceinline__ void run(uint8_t* smem, SharedBarriers<Cfg>& bars, int warp) const {
    static_assert(kTransposeWarps == 3, "one case per transposer warp");
    if (warp == 0) {
      run<0>(smem, bars);
    } else if (warp == 1) {
      run<1>(smem, bars);
    } else {
      run<2>(smem, bars);
    }
  }
};

}  // namespace flashcore::sm90

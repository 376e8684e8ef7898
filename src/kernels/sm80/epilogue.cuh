// Epilogue: normalize O, convert it to the output element type, stage it in the warp's own kRowsPerWarp rows of the Q
// tile (no other warp reads them, and this warp's last read of Q is behind it; split tiles: its own columns of the
// pair's rows, whose Q the partner last read before the final P exchange), then write whole 16-byte units to global
// memory, predicated on row < seqlen_q. LSE (natural log, fp32) goes straight from registers.
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/masked_v.cuh"
#include "kernels/sm80/config.h"
#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/mainloop.cuh"
#include "kernels/sm80/pair.cuh"
#include "kernels/sm80/smem.cuh"
#include "kernels/sm80/tile.cuh"

namespace flashcore::sm80 {

// Causal rows: O elements that a non-finite V value at a key their row does not see reached through the P V product
// of a diagonal block (0 * NaN) are recomputed without it (kernels/common/masked_v.cuh): the epilogue probes each row
// tile's accumulators before staging them (one FFMA per element of the first row of each pair; bits 2t and 2t + 1:
// row tile t fired), and only when a warp's probe fired does the rare path below recompute those rows into the
// staged O, with every accumulator already dead (repairing them in registers, beside the other row tile's, made
// ptxas spill).
template <class Cfg>
__device__ __forceinline__ uint32_t probe_row_tile(const WarpState<Cfg>& st, int t) {
  // The first row of the pair (its partner holds the same columns: kernels::any_nonfinite); both rows' bits.
  const bool fired =
      kernels::any_nonfinite<Cfg::kWarpDim / 4>([&](int e) { return st.o[t][acc_index(e / 2, 0, e % 2)]; });
  return fired ? 3u << (2 * t) : 0u;
}

// The rows of `todo` (probe_row_tile's bits, less the rows whose LSE is NaN: NaN whatever V holds), recomputed into
// the staging buffer (the warp's own rows and columns, as staged). Out of line, its tile decoded again: inlined,
// reading the caller's Tile, it kept more live through the main loop and changed the loop's code
// (docs/decisions.md#masked-v).
template <class Cfg>
__device__ __noinline__ void repair_staged_rows(const FwdParams& p, uint8_t* stage, int warp, int lane, int col0,
                                                uint32_t todo) {
  using Out = kernels::ElemTraits<typename Cfg::OutElement>;
  const Tile tile = decode_tile<Cfg>(p, static_cast<int>(blockIdx.x));
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = tile_row0<Cfg>(warp, t) + lane / 4 + 8 * i;
      const int64_t row = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + r;
      if ((todo >> (2 * t + i) & 1u) == 0 || row >= tile.seq.seqlen_q) continue;
      float acc[Cfg::kWarpDim / 4];
      float inv_sum = 0.f;
      const bool repaired = kernels::repair_masked_v_row<typename Cfg::Element, Cfg::kHeadDim>(
          p, p, p.q, p.k, p.v, tile, tile.head / p.head_ratio, row, p.scale_log2, Cfg::kBlockN, inv_sum,
          [&](auto&& f) {
#pragma unroll
            for (int j = 0; j < Cfg::kWarpDim / 8; ++j) {
              f(col0 * 8 + kernels::acc_col(j, 0, lane), acc[2 * j]);
              f(col0 * 8 + kernels::acc_col(j, 1, lane), acc[2 * j + 1]);
            }
          });
      if (!repaired) continue;
#pragma unroll
      for (int j = 0; j < Cfg::kWarpDim / 8; ++j) {
        const uint32_t packed = Out::pack2(acc[2 * j] * inv_sum, acc[2 * j + 1] * inv_sum);
        *reinterpret_cast<uint32_t*>(stage + swizzled_offset<Cfg::kRowBytes>(r, col0 + j) + 4 * (lane % 4)) = packed;
      }
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void epilogue(const FwdParams& p, const Tile& tile, uint8_t* smem, WarpState<Cfg>& st) {
  using Out = kernels::ElemTraits<typename Cfg::OutElement>;
  static_assert(Cfg::kOutElemBytes == Cfg::kElemBytes, "O is staged in Q-sized rows");
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);

  float inv_sum[Cfg::kMTiles][2], lse[Cfg::kMTiles][2];
  uint8_t* stage = smem + Cfg::kSmemQOffset;
  // Split tiles: the row sums of both halves' keys; the warp's columns start at unit col0 of a row.
  const int half = warp_half<Cfg>(warp);
  constexpr int kWarpUnits = Cfg::kWarpDim * Cfg::kOutElemBytes / 16;
  const int col0 = half * kWarpUnits;
  if constexpr (Cfg::kSplit == 2) {
    const PairExchange<Cfg> pair{smem + Cfg::kSmemPairOffset, warp, lane};
    pair.combine_sums(st.softmax[0].row_sum, st.softmax[1].row_sum);
  }
  uint32_t fired = 0;  // causal rows' probes (probe_row_tile)
#pragma unroll
  for (int t = 0; t < Cfg::kMTiles; ++t) {
    st.softmax[t].finalize(p.scale_log2, inv_sum[t], lse[t], kernels::sink_log2_of(p.sinks, tile.head));
    if constexpr (Cfg::kCausal) fired |= probe_row_tile<Cfg>(st, t);
#pragma unroll
    for (int j = 0; j < Cfg::kWarpDim / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = tile_row0<Cfg>(warp, t) + lane / 4 + 8 * i;
        const uint32_t packed = Out::pack2(st.o[t][acc_index(j, i, 0)] * inv_sum[t][i],
                                           st.o[t][acc_index(j, i, 1)] * inv_sum[t][i]);
        *reinterpret_cast<uint32_t*>(stage + swizzled_offset<Cfg::kRowBytes>(r, col0 + j) + 4 * (lane % 4)) = packed;
      }
    }
  }
  if constexpr (Cfg::kCausal) {
    if (__any_sync(0xffffffffu, fired != 0)) {
#pragma unroll
      for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (lse[t][i] != lse[t][i]) fired &= ~(1u << (2 * t + i));
        }
      }
      __syncwarp();
      repair_staged_rows<Cfg>(p, stage, warp, lane, col0, fired);
    }
  }
  __syncwarp();

  // The warp's kRowsPerWarp rows (its kWarpUnits columns) in passes of kRowsPerPass rows: lane l copies unit
  // col0 + l % kWarpUnits of row l / kWarpUnits + kRowsPerPass * u (lane-consecutive units of a row go to consecutive
  // addresses). One global pointer per lane walks down by kRowsPerPass rows; each pass is a shared load, a compare
  // and a predicated store (the per-unit row / unit arithmetic and branch cost ~20 instructions per 16-byte store,
  // docs/decisions.md#epilogue-diet).
  uint8_t* o_slice = const_cast<uint8_t*>(slice_base<Cfg>(p.o, p.cu_seqlens_q != nullptr ? 0 : tile.batch, tile.head));
  const int64_t o_row_bytes = p.o.seq_stride * Cfg::kOutElemBytes;
  const int64_t warp_row0 = static_cast<int64_t>(tile.m_block) * Cfg::kBlockM + tile_row0<Cfg>(warp, 0);
  if constexpr (32 % kWarpUnits == 0) {
    constexpr int kRowsPerPass = 32 / kWarpUnits;
    static_assert(Cfg::kRowsPerWarp % kRowsPerPass == 0, "whole passes of 32 lanes");
    const int lane_row = lane / kWarpUnits;
    const int unit = col0 + lane % kWarpUnits;
    uint8_t* dst = o_slice + (tile.seq.q_row0 + warp_row0 + lane_row) * o_row_bytes + unit * 16;
    const int64_t left = tile.seq.seqlen_q - warp_row0 - lane_row;  // this lane's rows still inside the sequence
    const int rows_left = left < Cfg::kRowsPerWarp ? static_cast<int>(left) : Cfg::kRowsPerWarp;
    const uint8_t* src = stage + (tile_row0<Cfg>(warp, 0) + lane_row) * Cfg::kRowBytes;
#pragma unroll
    for (int u = 0; u < Cfg::kRowsPerWarp / kRowsPerPass; ++u) {
      // Row lane_row + r of the warp's rows; tile_row0 is a multiple of 16, so its swizzle key is that of
      // lane_row + r (smem.cuh: keys repeat every 8 rows).
      const int r = kRowsPerPass * u;
      const uint4 v = *reinterpret_cast<const uint4*>(src + r * Cfg::kRowBytes +
                                                      ((unit ^ swizzle_key<Cfg::kRowBytes>(lane_row + r)) << 4));
      if (r < rows_left) *reinterpret_cast<uint4*>(dst) = v;
      dst += kRowsPerPass * o_row_bytes;
    }
  } else {
    // Rows of a width that does not divide the warp (head dim 192: 24 units; 96: 12): the warp's units in row-major
    // order, 32 consecutive ones per pass (a pass spans a row boundary; stores of one row still go to consecutive
    // addresses; shared-memory reads free of bank conflicts, smem.cuh).
    constexpr int kUnits = Cfg::kRowsPerWarp * kWarpUnits;
    static_assert(kUnits % 32 == 0, "whole passes of 32 lanes");
    const int64_t left = tile.seq.seqlen_q - warp_row0;  // the warp's rows still inside the sequence
#pragma unroll
    for (int i = lane; i < kUnits; i += 32) {
      const int r = i / kWarpUnits, unit = col0 + i % kWarpUnits;
      const uint4 v = *reinterpret_cast<const uint4*>(stage + swizzled_offset<Cfg::kRowBytes>(tile_row0<Cfg>(warp, 0) + r, unit));
      if (r < left) {
        *reinterpret_cast<uint4*>(o_slice + (tile.seq.q_row0 + warp_row0 + r) * o_row_bytes + unit * 16) = v;
      }
    }
  }

  if (p.lse != nullptr && lane % 4 == 0 && half == 0) {
#pragma unroll
    for (int t = 0; t < Cfg::kMTiles; ++t) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t row = warp_row0 + 16 * t + lane / 4 + 8 * i;
        if (row < tile.seq.seqlen_q) {
          p.lse[tile.batch * p.lse_stride_batch + tile.head * p.lse_stride_head + tile.seq.q_row0 + row] = lse[t][i];
        }
      }
    }
  }
}

}  // namespace flashcore::sm80

// Epilogue: normalize O, convert to the output dtype, stage it in shared memory in the 128B-swizzled
// layout of the O tensor map and write it with TMA stores (rows past seqlen_q are clipped by the
// hardware); LSE (natural log, fp32) goes straight from registers when requested.
#pragma once
#include <cuda/ptx>

#include "ptx/warp.h"
#include "sm90/mainloop.cuh"

namespace flashcore::sm90 {

template <class Cfg, class Element>
__device__ __forceinline__ void consumer_epilogue(const FwdParams& p, const Tile& tile, uint8_t* smem,
                                                  Barriers<Cfg::kStages>& bars, int warpgroup,
                                                  ConsumerState<Cfg>& st) {
  const int lane = threadIdx.x % 32;
  const int warp_in_wg = (threadIdx.x / 32) % 4;
  const int wg_thread = threadIdx.x % 128;

  float inv_sum[2], lse[2];
  st.softmax.finalize(p.scale_log2, inv_sum, lse);

  // Staging: this warpgroup's 64 rows of the O buffer, or of the Q tile (no longer read: its last wgmma
  // has completed). A separate O buffer may still be read by the previous tile's store: wait for it.
  uint8_t* stage = smem + Cfg::kSmemOOffset + warpgroup * Cfg::kRowsPerWarpgroup * Cfg::kRowBytes;
  if (Cfg::kSeparateO) {
    if (wg_thread == 0) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    ptx::named_barrier_sync(1 + warpgroup, 128);
  }
#pragma unroll
  for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
    const int chunk = j / 8, unit = j % 8;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp_in_wg * 16 + lane / 4 + 8 * i;  // row within the slice; r % 8 == lane / 4
      const uint32_t packed = pack2<Element>(st.o[acc_index(j, i, 0)] * inv_sum[i], st.o[acc_index(j, i, 1)] * inv_sum[i]);
      uint8_t* dst = stage + chunk * Cfg::kQChunkBytes + r * Cfg::kRowBytes + ((unit ^ (r % 8)) * 16) + 4 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dst) = packed;
    }
  }
  // Generic-proxy writes must be visible to the TMA (async proxy) before the store is issued.
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
  ptx::named_barrier_sync(1 + warpgroup, 128);

  const int slice_row = tile.m_block * Cfg::kBlockM + warpgroup * Cfg::kRowsPerWarpgroup;
  if (wg_thread == 0) {
#pragma unroll
    for (int c = 0; c < Cfg::kChunks; ++c) {
      const int32_t coords[4] = {c * Cfg::kChunkCols, slice_row, tile.head, tile.batch};
      cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &p.tma_o, coords,
                                      stage + c * Cfg::kQChunkBytes);
    }
    cuda::ptx::cp_async_bulk_commit_group();
  }

  if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = slice_row + warp_in_wg * 16 + lane / 4 + 8 * i;
      if (row < p.seqlen_q) {
        const long long idx = (static_cast<long long>(tile.batch) * p.num_heads_q + tile.head) * p.seqlen_q + row;
        p.lse[idx] = lse[i];
      }
    }
  }

  // Staged in the Q tile: hand it back to the producer once the bulk store has read it.
  if (!Cfg::kSeparateO && wg_thread == 0) {
    cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
    mbar_arrive(&bars.q_empty);
  }
}

}  // namespace flashcore::sm90

// The backward's stores. Per step, a warp's dQ (16 queries x kDqChunk columns at a time) is added to the workspace's
// fp32 block with atomic adds (RED), in the portable backend's order of the block (kernels/common/bwd_layout.h
// bwd_dq_index_by_reg): a warp's adds of one register reach 128 consecutive bytes. Deterministic
// calls add in key-block order: a counter per query block, which the CTA waits to read as its key block's index and
// moves on once its additions are visible. At the end, dK (times softmax_scale) and dV from registers, in the call's
// dtype.
#pragma once
#include <cuda/atomic>

#include <cstdint>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/sm80/bwd_params.h"
#include "kernels/sm80/ptx.cuh"

namespace flashcore::sm80 {

// Deterministic calls: wait (thread 0, then the whole CTA) until the key blocks before ours have added their dQ to the
// block with counter `turn`.
__device__ __forceinline__ void bwd_dq_acquire(int* turn, int n_block) {
  if (threadIdx.x == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> t(*turn);
    while (t.load(cuda::memory_order_acquire) != n_block) __nanosleep(32);
  }
  __syncthreads();
}

// ... and hand the block to the next key block once every thread's additions are visible device-wide.
__device__ __forceinline__ void bwd_dq_release(int* turn, int n_block) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> t(*turn);
    t.store(n_block + 1, cuda::memory_order_release);
  }
}

// Adds a warp's dQ chunk (row tile rt, columns col0..col0+kDqChunk-1) to the workspace block.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_add(float* block, const float (&acc)[Cfg::kDqChunk / 2], int rt, int col0,
                                           int lane) {
  const int thread = 32 * rt + lane;  // the thread of a warpgroup's m64 accumulator that holds the same elements
#pragma unroll
  for (int jj = 0; jj < Cfg::kDqChunk / 8; ++jj) {
    const int j = col0 / 8 + jj;  // 8-column group of the block
    float* at = block + kernels::bwd_dq_index_by_reg(j / 8, 4 * (j % 8), thread);
#pragma unroll
    for (int r = 0; r < 4; ++r) red_add_f32(at + 128 * r, acc[4 * jj + r]);
  }
}

// dK and dV of the warp's 16 keys: row lane/4 (+8) of its tile, two columns of each group of 8.
template <class Cfg>
__device__ __forceinline__ void bwd_store_dkdv(const BwdParams& p, int n_block, int kv_head, int batch, int warp,
                                               int lane, const float (&dk)[Cfg::kHeadDim / 2],
                                               const float (&dv)[Cfg::kHeadDim / 2]) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  using kernels::acc_index;
  auto* dk_base = static_cast<Element*>(p.dk) + batch * p.dk_stride_batch + kv_head * p.dk_stride_head;
  auto* dv_base = static_cast<Element*>(p.dv) + batch * p.dv_stride_batch + kv_head * p.dv_stride_head;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = n_block * Cfg::kBlockN + 16 * warp + lane / 4 + 8 * i;
    if (key >= p.seqlen_k) continue;
    Element* dk_row = dk_base + key * p.dk_stride_seq + 2 * (lane % 4);
    Element* dv_row = dv_base + key * p.dv_stride_seq + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Cfg::kHeadDim / 8; ++j) {
      *reinterpret_cast<uint32_t*>(dk_row + 8 * j) =
          E::pack2(dk[acc_index(j, i, 0)] * p.softmax_scale, dk[acc_index(j, i, 1)] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_row + 8 * j) = E::pack2(dv[acc_index(j, i, 0)], dv[acc_index(j, i, 1)]);
    }
  }
}

}  // namespace flashcore::sm80

// The backward's stores. Per step, the warpgroups' dQ (64 queries x 64 columns each) goes to a shared-memory block
// in the workspace's order (kernels/common/bwd_layout.h) and one thread adds the block to the workspace's fp32 dQ
// accumulator with a bulk reduction (cp.reduce.async.bulk .add.f32): the key blocks of a query block add theirs in
// any order, or, for deterministic calls, in key-block order (a counter per query block: a CTA waits until it reads
// its key block's index, adds, and moves the counter on once its addition is complete). At the end, dK (times
// softmax_scale) and dV from registers, in the call's dtype.
#pragma once
#include <cuda/atomic>
#include <cuda/ptx>

#include "kernels/common/bwd_layout.h"
#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/warp.cuh"
#include "kernels/sm90/bwd_config.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/bwd_producer.cuh"

namespace flashcore::sm90 {

inline constexpr uint32_t kBwdDqBarrier = 2;     // warpgroup 0's share of the dQ block written (256 threads)
inline constexpr uint32_t kBwdDqSumBarrier = 3;  // head dim 64: warpgroup 1's sums written (its 128 threads)
// The thread that issues the bulk reductions: the first of consumer warpgroup 1.
inline constexpr unsigned kBwdDqIssuer = 256;

// Before a step's threads write the dQ block: the previous step's reduction has read it (the issuer waits, then
// meets the others at the dS barrier of bwd_mainloop.cuh).
template <class Cfg>
__device__ __forceinline__ void bwd_dq_wait_block_free() {
  if (threadIdx.x == kBwdDqIssuer) cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

template <class Cfg>
__device__ __forceinline__ void bwd_dq_reduce(const BwdParams& p, const BwdWork& w, int head, int m, uint8_t* smem,
                                              int wg, int thread, const float (&dq)[Cfg::kDqRegs]) {
  float* block = reinterpret_cast<float*>(smem + Cfg::kSmemDq);
  if (Cfg::kDqSplitKeys && wg == 1) {
    // Head dim 64: both warpgroups hold partial sums of the same 64 x 64 block; add ours to warpgroup 0's.
    kernels::named_barrier_sync(kBwdDqBarrier, Cfg::kConsumerThreads);
#pragma unroll
    for (int g = 0; g < Cfg::kDqRegs / 4; ++g) {
      float4* at = reinterpret_cast<float4*>(block + kernels::bwd_dq_index(0, 4 * g, thread));
      float4 v = *at;
      v.x += dq[4 * g];
      v.y += dq[4 * g + 1];
      v.z += dq[4 * g + 2];
      v.w += dq[4 * g + 3];
      *at = v;
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // generic writes before the bulk reduction reads them
    kernels::named_barrier_sync(kBwdDqSumBarrier, 128);
  } else {
    const int region = Cfg::kDqSplitKeys ? 0 : wg;
#pragma unroll
    for (int g = 0; g < Cfg::kDqRegs / 4; ++g) {
      *reinterpret_cast<float4*>(block + kernels::bwd_dq_index(region, 4 * g, thread)) =
          make_float4(dq[4 * g], dq[4 * g + 1], dq[4 * g + 2], dq[4 * g + 3]);
    }
    cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
    if (wg == 0) {
      kernels::named_barrier_arrive(kBwdDqBarrier, Cfg::kConsumerThreads);
    } else {
      kernels::named_barrier_sync(kBwdDqBarrier, Cfg::kConsumerThreads);
    }
  }
  if (threadIdx.x != kBwdDqIssuer) return;
  const int64_t index = (static_cast<int64_t>(w.batch) * p.num_heads_q + head) * p.num_m_blocks + m;
  float* dst = p.dq_accum + index * (64 * Cfg::kHeadDim);
  if (p.dq_semaphore != nullptr) {
    cuda::atomic_ref<int, cuda::thread_scope_device> turn(p.dq_semaphore[index]);
    while (turn.load(cuda::memory_order_acquire) != w.n_block) __nanosleep(32);
    cuda::ptx::fence_proxy_async(cuda::ptx::space_global);  // the earlier blocks' additions before ours
    cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst, block,
                                    static_cast<uint32_t>(Cfg::kDqBytes));
    cuda::ptx::cp_async_bulk_commit_group();
    cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});  // complete, not only read
    cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
    turn.store(w.n_block + 1, cuda::memory_order_release);
  } else {
    cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst, block,
                                    static_cast<uint32_t>(Cfg::kDqBytes));
    cuda::ptx::cp_async_bulk_commit_group();
  }
}

// The last reduction complete before the CTA (and its shared memory) goes away.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_finish() {
  if (threadIdx.x == kBwdDqIssuer) cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

// dK and dV of the warpgroup's 64 keys: row lane/4 (+8) of each warp's 16, two columns of each group of 8.
template <class Cfg>
__device__ __forceinline__ void bwd_store_dkdv(const BwdParams& p, const BwdWork& w, int wg, int warp, int lane,
                                               const float (&dk)[Cfg::kHeadDim / 2],
                                               const float (&dv)[Cfg::kHeadDim / 2]) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  using kernels::acc_index;
  auto* dk_base = static_cast<Element*>(p.dk) + w.batch * p.dk_stride_batch + w.kv_head * p.dk_stride_head;
  auto* dv_base = static_cast<Element*>(p.dv) + w.batch * p.dv_stride_batch + w.kv_head * p.dv_stride_head;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = w.n_block * Cfg::kBlockN + wg * 64 + 16 * warp + lane / 4 + 8 * i;
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

}  // namespace flashcore::sm90

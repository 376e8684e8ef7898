// The backward's stores. Per step, the warpgroups' dQ (64 queries x 64 columns each) goes to a shared-memory block
// in the workspace's order (kernels/common/bwd_layout.h), kDqStages blocks in turn, and a writer thread adds each
// block to the workspace's fp32 dQ accumulator (bwd_dq_write). At the end, dK (times softmax_scale) and dV from
// registers, in the call's dtype.
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

inline constexpr uint32_t kBwdDqBarrier = 2;  // split keys: warpgroup 0's partial sums written (256 threads)

// The consumers' half of a step's dQ: warpgroup wg's accumulator into region wg of dQ buffer st.stage (once the
// writer has read what it held kDqStages steps ago), then the full barrier for the writer warp. With kDqSplitKeys
// both warpgroups hold partial sums of the whole block (every column): warpgroup 1 adds its own to warpgroup 0's and
// fills the block.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_store(uint8_t* smem, BwdBarriers<Cfg>& bars,
                                             const PipelineState<Cfg::kDqStages>& st, int wg, int thread,
                                             const float (&dq)[Cfg::kDqRegs]) {
  float* block = reinterpret_cast<float*>(smem + Cfg::kSmemDq + st.stage * Cfg::kDqBytes);
  bars.dq.acquire(st);
  if (Cfg::kDqSplitKeys && wg == 1) {
    kernels::named_barrier_sync(kBwdDqBarrier, Cfg::kConsumerThreads);
#pragma unroll
    for (int g = 0; g < Cfg::kDqRegs / 4; ++g) {
      float4* at = reinterpret_cast<float4*>(block + kernels::bwd_dq_group_index(g, thread));
      float4 v = *at;
      v.x += dq[4 * g];
      v.y += dq[4 * g + 1];
      v.z += dq[4 * g + 2];
      v.w += dq[4 * g + 3];
      *at = v;
    }
  } else {
    const int region = Cfg::kDqSplitKeys ? 0 : wg;  // (8 groups of 8 columns a region)
#pragma unroll
    for (int g = 0; g < Cfg::kDqRegs / 4; ++g) {
      *reinterpret_cast<float4*>(block + kernels::bwd_dq_group_index(8 * region + g, thread)) =
          make_float4(dq[4 * g], dq[4 * g + 1], dq[4 * g + 2], dq[4 * g + 3]);
    }
    if (Cfg::kDqSplitKeys) {  // warpgroup 1 adds to it and fills the block
      kernels::named_barrier_arrive(kBwdDqBarrier, Cfg::kConsumerThreads);
      return;
    }
  }
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // generic writes before the bulk reduction reads them
  bars.dq.commit(st);
}

// The deterministic order's turn of key block n_block at a query block's counter (bwd_prep.cuh): wait until the counter
// reads n_block (acquire), and, once this key block's dQ is added, hand it to key block n_block - 1 (release).
__device__ __forceinline__ void bwd_turn_wait(int* counter, int n_block) {
  cuda::atomic_ref<int, cuda::thread_scope_device> turn(*counter);
  while (turn.load(cuda::memory_order_acquire) != n_block) __nanosleep(20);
}
__device__ __forceinline__ void bwd_turn_pass(int* counter, int n_block) {
  cuda::atomic_ref<int, cuda::thread_scope_device> turn(*counter);
  turn.store(n_block - 1, cuda::memory_order_release);
}

// The writer: one thread of the producer warpgroup's second warp. Per step, in the consumers' order, it waits for the
// dQ block, adds it to the workspace's fp32 accumulator with one bulk reduction (cp.reduce.async.bulk .add.f32) and
// hands the buffer back once the reduction has read it. The key blocks of a query block add theirs in any order,
// or, for deterministic calls, in descending key-block order: a counter per query block, which the writer waits to
// read as its key block's index and moves on once its addition is complete. Waiting here keeps the consumers' steps
// going.
template <class Cfg>
__device__ __forceinline__ void bwd_dq_write(const BwdParams& p, const BwdWork& w, uint8_t* smem,
                                             BwdBarriers<Cfg>& bars) {
  // (Pointers advanced per block rather than recomputed: the producer warpgroup has 24 registers, and the 64-bit
  // row arithmetic of each block spilled at head dim 64.)
  // A step's block is kBlockM / 64 of the workspace's 64-row blocks, consecutive; its counter is the first one's.
  constexpr int kBlocks = Cfg::kBlockM / 64;
  PipelineState<Cfg::kDqStages> st;
  for (int g = 0; g < p.head_ratio; ++g) {
    const int head = w.kv_head * p.head_ratio + g;
    float* dst = p.dq_accum + (p.rows.base(w.batch, head, w.seq) + Cfg::kBlockM * w.m_first) * Cfg::kHeadDim;
    int* counter = p.dq_semaphore == nullptr
                       ? nullptr
                       : p.dq_semaphore + (static_cast<int64_t>(w.batch) * p.num_heads_q + head) * p.num_m_blocks +
                             kBlocks * w.m_first;
    for (int m = w.m_first; m < w.m_end;
         ++m, dst += Cfg::kBlockM * Cfg::kHeadDim, counter += counter != nullptr ? kBlocks : 0) {
      const float* block = reinterpret_cast<const float*>(smem + Cfg::kSmemDq + st.stage * Cfg::kDqBytes);
      bars.dq.wait(st);
      if (counter != nullptr) {
        bwd_turn_wait(counter, w.n_block);
        cuda::ptx::fence_proxy_async(cuda::ptx::space_global);  // the earlier key blocks' additions before ours
        cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst,
                                        block, static_cast<uint32_t>(Cfg::kDqBytes));
        cuda::ptx::cp_async_bulk_commit_group();
        cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});  // complete, not only read
        cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
        bwd_turn_pass(counter, w.n_block);
      } else {
        cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst,
                                        block, static_cast<uint32_t>(Cfg::kDqBytes));
        cuda::ptx::cp_async_bulk_commit_group();
        cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
      }
      bars.dq.release(st);
      st.advance();
    }
  }
  // The last reductions complete before the CTA (and its shared memory) goes away.
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

// dK and dV of the warpgroup's 64 keys: row lane/4 (+8) of each warp's 16, two columns of each group of 8.
template <class Cfg>
__device__ __forceinline__ void bwd_store_dkdv(const BwdParams& p, const BwdWork& w, int wg, int warp, int lane,
                                               const float (&dk)[Cfg::kHeadDim / 2],
                                               const float (&dv)[Cfg::kHeadDim / 2]) {
  using Element = typename Cfg::Element;
  using E = kernels::ElemTraits<Element>;
  using kernels::acc_index;
  const bool dense = p.rows.cu_seqlens_q == nullptr;
  auto* dk_base = static_cast<Element*>(p.dk) + (dense ? w.batch * p.dk_stride_batch : 0) +
                  w.seq.k_start * p.dk_stride_seq + w.kv_head * p.dk_stride_head;
  auto* dv_base = static_cast<Element*>(p.dv) + (dense ? w.batch * p.dv_stride_batch : 0) +
                  w.seq.k_start * p.dv_stride_seq + w.kv_head * p.dv_stride_head;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = w.n_block * Cfg::kBlockN + wg * 64 + 16 * warp + lane / 4 + 8 * i;
    if (key >= w.seq.len_k) continue;
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

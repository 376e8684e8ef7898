// The backward's producer thread: K and V of the CTA's key block once, then per step (query head of the KV group x
// query block) the Q and dO tiles by TMA and the block's scaled LSE and D rows by bulk copy, into a ring of kStages.
// The order of the steps is bwd_steps's, which the consumers walk too.
#pragma once
#include <cuda/ptx>

#include "kernels/common/bwd_window.h"
#include "kernels/sm90/bwd_config.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/pipeline.cuh"

namespace flashcore::sm90 {

// The barriers of the backward kernel, in shared memory at kSmemBarriers.
template <class Cfg>
struct BwdBarriers {
  // (Every wait of the backward suspends the thread: mbar_wait_sleep.)
  Pipeline<Cfg::kStages, true> step;  // a step's Q, dO, LSE and D
  Pipeline<Cfg::kDqStages, true> dq;  // a step's dQ block: the consumers fill it, the writer adds it to the workspace
  uint64_t kv;                  // K and V, loaded once
  uint32_t sink;                // written only by bwd_keep_allocated's branch, which never runs

  __device__ __forceinline__ void init() {
    step.init(1, Cfg::kConsumerThreads);
    dq.init(Cfg::kDqFullArrivals, 1);
    cuda::ptx::mbarrier_init(&kv, 1);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
};

// The window of a sequence (kernels/common/bwd_window.h): causal's (-1, 0), or the call's window and chunks in the
// variants' kernels.
template <class Cfg>
__device__ __forceinline__ kernels::BwdWindow bwd_window(const BwdParams& p, const kernels::BwdSeq& seq) {
  if constexpr (Cfg::kVariants) return {seq.len_k - seq.len_q, p.var.window_left, p.var.window_right, p.var.chunk};
  return {seq.len_k - seq.len_q, -1, 0};
}

// The CTA's work: key block n_block of KV head kv_head in sequence `batch`, and the query blocks [m_first, m_end)
// of every query head of the group. Causal (and windowed): only the query blocks whose rows see one of the keys.
// The grid covers the longest sequence: a key block past this sequence's keys has no work (has_keys false).
struct BwdWork {
  int n_block, kv_head, batch, m_first, m_end;
  kernels::BwdSeq seq;
  bool has_keys;
  int tma_batch;  // the TMA maps' batch coordinate: 0 for packed tensors
};

template <class Cfg>
__device__ __forceinline__ BwdWork bwd_work(const BwdParams& p) {
  BwdWork w{};
  // Deterministic calls launch the key blocks last first: they add dQ from the last down (bwd_prep.cuh), so a CTA
  // waits only on CTAs launched before it.
  w.n_block = static_cast<int>(p.dq_semaphore != nullptr ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
  w.kv_head = static_cast<int>(blockIdx.y);
  w.batch = static_cast<int>(blockIdx.z);
  w.seq = p.rows.seq(w.batch);
  w.has_keys = w.n_block * Cfg::kBlockN < w.seq.len_k;
  w.tma_batch = p.rows.cu_seqlens_q != nullptr ? 0 : w.batch;
  w.m_end = (w.seq.len_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  if constexpr (Cfg::kCausal && Cfg::kVariants) {
    bwd_window<Cfg>(p, w.seq).query_blocks(w.n_block, Cfg::kBlockN, Cfg::kBlockM, w.m_end, w.m_first, w.m_end);
  } else if constexpr (Cfg::kCausal) {
    // (BwdWindow::query_blocks of causal's window, in fewer registers: the producer warpgroup has 24.) Query i sees
    // key j iff j <= i + len_k - len_q: the block's first key is seen from query first_q on.
    const int first_q = w.n_block * Cfg::kBlockN - (w.seq.len_k - w.seq.len_q);
    w.m_first = first_q <= 0 ? 0 : first_q / Cfg::kBlockM;
  }
  return w;
}

// A tile of rows from `map` into shared memory: one TMA of all its kOperandChunks chunks (the 5-D chunked map) where
// it has several, else of its only one.
template <int kOperandChunks>
__device__ __forceinline__ void bwd_load_tile(const CUtensorMap* map, uint8_t* dst, int row, int head, int batch,
                                              uint64_t* bar) {
  if constexpr (kOperandChunks > 1) {
    const int32_t coords[5] = {0, row, 0, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords, bar);
  } else {
    const int32_t coords[4] = {0, row, head, batch};
    cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map, coords, bar);
  }
}

template <class Cfg>
__device__ __forceinline__ void bwd_produce(const BwdParams& p, const BwdWork& w, uint8_t* smem,
                                            BwdBarriers<Cfg>& bars) {
  const uint32_t kv_bytes = Cfg::kKVTxBytes, stat_bytes = Cfg::kRowStatBytes;  // (the wrappers take references)
  cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared, &bars.kv,
                                       kv_bytes);
  // Packed batches: rows past the sequence belong to the next one (or read as zeros past the tensor). Its keys are
  // masked (bwd_mainloop.cuh), its queries have P = 0 (their scaled LSE rows are +inf), so they add nothing.
  const int key0 = static_cast<int>(w.seq.k_start) + w.n_block * Cfg::kBlockN;
  bwd_load_tile<Cfg::kChunks>(&p.tma_k, smem + Cfg::kSmemK, key0, w.kv_head, w.tma_batch, &bars.kv);
  bwd_load_tile<Cfg::kChunksV>(&p.tma_v, smem + Cfg::kSmemV, key0, w.kv_head, w.tma_batch, &bars.kv);
  PipelineState<Cfg::kStages> st;
  for (int g = 0; g < p.head_ratio; ++g) {
    const int head = w.kv_head * p.head_ratio + g;
    const int64_t rows = p.rows.base(w.batch, head, w.seq);
    for (int m = w.m_first; m < w.m_end; ++m) {
      bars.step.acquire(st);
      uint64_t* bar = bars.step.commit_tx(st, Cfg::kStepTxBytes);
      const int row = m * Cfg::kBlockM, q_row = static_cast<int>(w.seq.q_start) + row;
      bwd_load_tile<Cfg::kChunks>(&p.tma_q, smem + Cfg::kSmemQ + st.stage * Cfg::kQBytes, q_row, head, w.tma_batch,
                                       bar);
      bwd_load_tile<Cfg::kChunksV>(&p.tma_do, smem + Cfg::kSmemDo + st.stage * Cfg::kDoBytes, q_row, head,
                                       w.tma_batch, bar);
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                               smem + Cfg::kSmemLse + st.stage * Cfg::kRowStatBytes, p.lse_log2 + rows + row,
                               stat_bytes, bar);
      cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                               smem + Cfg::kSmemD + st.stage * Cfg::kRowStatBytes, p.dpsum + rows + row,
                               stat_bytes, bar);
      st.advance();
    }
  }
}

}  // namespace flashcore::sm90

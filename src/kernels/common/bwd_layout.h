// The backward's fp32 dQ blocks (kernels/common/bwd_prep.cuh, sm90/bwd_epilogue.cuh): one block of 64 query rows x
// head_dim columns per (batch, query head, query block), in the order a warpgroup's m64n64 accumulators reach shared
// memory -- float4 groups of four registers, thread-major, so that 128 threads store 2 KB of consecutive addresses
// per group. Region c holds columns 64c..64c+63. The conversion kernel reads it back through bwd_dq_position.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "flashcore/flashcore.h"

namespace flashcore::kernels {

// Register `reg` (0..31) of thread `thread` (0..127) of the warpgroup whose accumulator holds region `region`.
__host__ __device__ constexpr int bwd_dq_index(int region, int reg, int thread) {
  return region * 64 * 64 + (reg / 4) * 512 + thread * 4 + reg % 4;
}

// The first of the four registers of 8-column group `group` (0 .. head_dim / 8) of a block: bwd_dq_index(group / 8,
// 4 * (group % 8), thread), linear in the group.
__host__ __device__ constexpr int bwd_dq_group_index(int group, int thread) { return group * 512 + thread * 4; }
static_assert(bwd_dq_group_index(13, 5) == bwd_dq_index(1, 20, 5), "a group is four registers of a region");

// The portable backend's order (sm80/bwd_epilogue.cuh), which adds one register at a time: within each group of four
// registers, register-major, so that a warp's 32 adds of one register reach 128 consecutive bytes (4 sectors; the
// thread-major order spread them over 16).
__host__ __device__ constexpr int bwd_dq_index_by_reg(int region, int reg, int thread) {
  return region * 64 * 64 + (reg / 4) * 512 + (reg % 4) * 128 + thread;
}

// The inverse of either order (kByReg: bwd_dq_index_by_reg's): the (row, column) of element e of a block (the
// accumulator layout of fragment.cuh).
template <bool kByReg = false>
__host__ __device__ constexpr void bwd_dq_position(int e, int& row, int& col) {
  const int region = e / 4096, rest = e % 4096;
  const int group = rest / 512;
  const int thread = kByReg ? rest % 128 : (rest % 512) / 4;
  const int reg = group * 4 + (kByReg ? (rest % 512) / 128 : rest % 4);
  const int warp = thread / 32, lane = thread % 32;
  row = 16 * warp + lane / 4 + 8 * ((reg / 2) % 2);
  col = 64 * region + 8 * group + 2 * (lane % 4) + reg % 2;
}

// The most query rows a backward kernel's step covers (sm90 at head dim 64: 128): the workspace pads each sequence's
// rows to whole steps, so that a step reads and adds only its own sequence's rows.
inline constexpr int kBwdMaxStepRows = 128;

// Rows of the workspace's per-(batch, head) arrays: seqlen_q rounded up to whole steps of kBwdMaxStepRows rows.
__host__ __device__ constexpr int64_t bwd_padded_rows(int64_t seqlen_q) {
  return (seqlen_q + kBwdMaxStepRows - 1) / kBwdMaxStepRows * kBwdMaxStepRows;
}

// One sequence of a call: its query and key rows in Q / K (packed batches: from cu_seqlens, clamped to the tensors
// as the forward clamps them), the rows it holds there and the rows it uses (seqused_q / seqused_k: its first
// len_q <= rows_q queries and len_k <= rows_k keys; without them all). The kernels attend over the used rows; the
// gradients of the others are zeros (bwd_prep.cuh).
struct BwdSeq {
  int64_t q_start, k_start;
  int len_q, len_k;
  int rows_q, rows_k;
};

// Where the backward's per-row workspace arrays (the scaled LSE, D, the fp32 dQ rows) of a call live. Dense batches:
// (batch, head) slices of padded_rows(seqlen_q) rows. Packed (varlen) batches: per head, total_q (rounded up to 4) +
// 256 * batch + 128 rows, sequence b's starting at 256 * b + its first row rounded up to 4 (16-byte aligned for the
// bulk copies, and each sequence's rows padded to whole 128-row steps without reaching the next one's).
struct BwdRows {
  const int* cu_seqlens_q;  // nullptr: dense
  const int* cu_seqlens_k;
  const int* seqused_q;     // packed only; nullptr: every row of a sequence used
  const int* seqused_k;
  int64_t seqlen_q, seqlen_k;  // dense lengths, or the longest sequence's
  int64_t total_q, total_k;    // packed rows (varlen)
  int64_t head_rows;           // rows per (batch, head) slice (dense) or per head (varlen)
  int heads;

  // (Packed: total_q rounded up to 4, so that every head's rows start 16-byte aligned for the bulk copies.)
  __host__ __device__ static int64_t head_rows_of(bool varlen, int64_t seqlen_q, int64_t total_q, int64_t batch) {
    return varlen ? (total_q + 3) / 4 * 4 + 2 * kBwdMaxStepRows * batch + kBwdMaxStepRows : bwd_padded_rows(seqlen_q);
  }
  __host__ __device__ int64_t rows(int64_t batch) const { return head_rows * heads * (cu_seqlens_q ? 1 : batch); }
#if defined(__CUDACC__)
  __device__ BwdSeq seq(int b) const {
    if (cu_seqlens_q == nullptr) {
      const int sq = static_cast<int>(seqlen_q), sk = static_cast<int>(seqlen_k);
      return {0, 0, sq, sk, sq, sk};
    }
    auto clamp = [](int64_t x, int64_t hi) { return x < 0 ? int64_t{0} : (x > hi ? hi : x); };
    const int64_t q0 = clamp(__ldg(cu_seqlens_q + b), total_q), q1 = clamp(__ldg(cu_seqlens_q + b + 1), total_q);
    const int64_t k0 = clamp(__ldg(cu_seqlens_k + b), total_k), k1 = clamp(__ldg(cu_seqlens_k + b + 1), total_k);
    const int64_t rows_q = clamp(q1 - q0, seqlen_q), rows_k = clamp(k1 - k0, seqlen_k);
    const int64_t len_q = seqused_q != nullptr ? clamp(__ldg(seqused_q + b), rows_q) : rows_q;
    const int64_t len_k = seqused_k != nullptr ? clamp(__ldg(seqused_k + b), rows_k) : rows_k;
    return {q0, k0, static_cast<int>(len_q), static_cast<int>(len_k), static_cast<int>(rows_q),
            static_cast<int>(rows_k)};
  }
  // The first row of (sequence b, head h)'s block of rows.
  __device__ int64_t base(int b, int h, const BwdSeq& s) const {
    if (cu_seqlens_q == nullptr) return (static_cast<int64_t>(b) * heads + h) * head_rows;
    return h * head_rows + 2 * kBwdMaxStepRows * static_cast<int64_t>(b) + (s.q_start + 3) / 4 * 4;
  }
#endif
};

// The call's rows (host), from its params.
inline BwdRows bwd_rows_of(const flashcore_attention_params& p) {
  BwdRows r{};
  r.cu_seqlens_q = p.cu_seqlens_q;
  r.cu_seqlens_k = p.cu_seqlens_k;
  r.seqused_q = p.cu_seqlens_q != nullptr ? p.seqused_q : nullptr;
  r.seqused_k = p.cu_seqlens_q != nullptr ? p.seqused_k : nullptr;
  r.seqlen_q = p.seqlen_q;
  r.seqlen_k = p.seqlen_k;
  r.total_q = p.total_q;
  r.total_k = p.total_k;
  r.head_rows = BwdRows::head_rows_of(p.cu_seqlens_q != nullptr, p.seqlen_q, p.total_q, p.batch);
  r.heads = static_cast<int>(p.num_heads_q);
  return r;
}

// The workspace of a backward call, both backends: the scaled LSE and D (a float per row), the fp32 dQ rows, a
// counter per (batch, query head, query block) for deterministic calls -- counted in either mode, so that one size
// serves both -- and, with sinks, a float per such block (its share of dL/dsinks). Byte offsets, 256-aligned.
struct BwdWorkspace {
  uint64_t lse = 0, dpsum = 0, dq_accum = 0, semaphore = 0, dsink_part = 0, bytes = 0;
};
inline BwdWorkspace bwd_workspace_of(const flashcore_attention_params& p) {
  auto align = [](uint64_t x) { return (x + 255) / 256 * 256; };
  const uint64_t rows = static_cast<uint64_t>(bwd_rows_of(p).rows(p.batch));
  const uint64_t blocks = static_cast<uint64_t>(p.batch) * static_cast<uint64_t>(p.num_heads_q) *
                          static_cast<uint64_t>(bwd_padded_rows(p.seqlen_q) / 64);
  BwdWorkspace w;
  w.dpsum = align(w.lse + rows * 4);
  w.dq_accum = align(w.dpsum + rows * 4);
  w.semaphore = align(w.dq_accum + rows * static_cast<uint64_t>(p.head_dim) * 4);
  w.dsink_part = align(w.semaphore + blocks * 4);
  w.bytes = align(w.dsink_part + (p.sinks != nullptr ? blocks * 4 : 0));
  return w;
}

}  // namespace flashcore::kernels

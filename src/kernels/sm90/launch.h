// Host entry into the sm90 backend: the compiled rows, their selection and launch (backend.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/plan.h"
#include "flashcore/flashcore.h"
#include "kernels/common/append_params.h"
#include "kernels/common/combine_params.h"
#include "kernels/common/fp8_prep_params.h"
#include "kernels/common/int8_prep_params.h"
#include "kernels/sm90/kernel_row.h"

namespace flashcore::sm90 {

// The call's shape and its 16-bit Q and K, as the preparation kernels of precision = FP8 / INT8 take them (the fields
// Fp8PrepParams and Int8PrepParams share); the rest of Prep is zero.
template <class Prep>
Prep prep_shape(const flashcore_attention_params& p) {
  Prep prep{};
  prep.batch = static_cast<int>(p.batch);
  prep.seqlen_q = static_cast<int>(p.seqlen_q);
  prep.seqlen_k = static_cast<int>(p.seqlen_k);
  prep.heads_q = static_cast<int>(p.num_heads_q);
  prep.heads_kv = static_cast<int>(p.num_heads_kv);
  prep.head_dim = static_cast<int>(p.head_dim);
  prep.q = kernels::Fp8Tensor{p.q, p.q_strides.batch, p.q_strides.seq, p.q_strides.head};
  prep.k = kernels::Fp8Tensor{p.k, p.k_strides.batch, p.k_strides.seq, p.k_strides.head};
  return prep;
}

// One launch of a 256-thread preparation kernel that takes its parameter struct by value (fp8_prep.cu, int8_prep.cu);
// returns the launch's own status.
template <class Params>
cudaError_t launch_prep(const void* kernel, dim3 grid, cudaStream_t stream, const Params& p) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(256);
  config.stream = stream;
  Params params = p;
  void* args[] = {&params};
  return cudaLaunchKernelExC(&config, kernel, args);
}

// Every kernel compiled into this library (generated rows.inc), in configs.txt order.
const KernelRow* const* rows(int& count);

// The runtime variants registered so far (variant.h), in registration order: rows select() finds by name after
// the compiled ones, never a default, and not in rows(). They live until the process ends.
std::vector<const KernelRow*> registered_rows();

// The row for (dtype, out dtype, head dim, causal): the one named `config` when it is not NULL (a compiled row,
// else a registered variant), else the default for a call with `seqlen_k` keys (the first default row, in configs.txt
// order, whose max_seqlen_k condition the call meets; INT64_MAX: the default of long calls, which listings name).
// nullptr (with a message in `error`) when none matches. head_dim_v: V's head dim (0: head_dim).
const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, int64_t seqlen_k, std::string& error, int head_dim_v = 0);

// The split-KV row for a decode-shaped call (at most 64 query rows, after GQA packing, and at least 8 key blocks
// of 128) whose partials fit in `workspace_capacity` bytes, or nullptr (another shape, too small a
// workspace, or no split row compiled for the key).
const KernelRow* decode_row(const flashcore_attention_params& p, int device, uint64_t workspace_capacity);

// Packed (varlen) queries: the first (dtype, head dim, causal) row configs.txt marks "packed" that takes the call (a
// dynamic one only when `workspace_given`), else the row with one CTA per tile (the default when it is one), whose
// grid the hardware balances over sequences of different lengths; nullptr for dense queries or when none is compiled.
const KernelRow* varlen_row(const flashcore_attention_params& p, bool workspace_given);

// Wave quantization (non-causal dense 16-bit calls on a whole-tile row): a call whose tiles leave the last round of
// the SMs mostly idle (2 x 8 heads x 2k at d64: 176 tiles of 192 rows on 132 SMs, two rounds) runs a compiled row of
// the same key with fewer rows per tile when rounds x rows, with kSmallTileCost on the smaller tile's rows, is lower
// (256 tiles of 128 rows: also two rounds, of two thirds the rows). `chosen` otherwise. kSmallTileCost: the 128-row
// d64 row's time per row over the 192-row rows' on full grids (1.2 on the H200: docs/decisions.md#wave-row).
// Or, with a workspace for its partials (workspace_capacity bytes), the key's prefill split row (smem_plan.h
// splits_last_round) for a call of fewer tiles than half the SMs against at least kSplitMinKeyBlocks key blocks: each
// tile's key range cut into parts over the idle SMs, merged by its last part (1 x 4 heads x 2k at d64: 20.1 us
// against 23.1 for 128-row tiles; with a round of whole tiles first, 2 x 8 heads x 2k, 48.7 against 44.2: not cut
// there; 1 x 8 heads x 512 lost; docs/decisions.md#prefill-split).
inline constexpr double kSmallTileCost = 1.2;
inline constexpr int64_t kSplitMinKeyBlocks = 16;
const KernelRow* wave_row(const flashcore_attention_params& p, int device, const KernelRow* chosen,
                          uint64_t workspace_capacity);

// Whether the row needs a workspace at all (the dynamic scheduler's counter, split-KV partials).
bool needs_workspace(const KernelRow& row);

// The checks the row's launch shape puts on a call (shape only: no pointer is read): a paged cache's slices, the
// serving layouts the row has a path for, the tile index space (scheduler_grid.h kMaxTileIndex) and, for a split
// row, the plan's split (plan.split, plan.sms). SUCCESS, or the status and a message naming the config.
flashcore_status check_row(const KernelRow& row, const flashcore_attention_params& p, const core::Plan& plan,
                           std::string& error);

// The sm90 backend's plan and run (core/plan.h), for the backend table.
extern const core::BackendOps kBackend;

// The split-KV combine kernel (kernels/common/combine.cuh) for O of `out_dtype` and `head_dim`.
cudaError_t launch_combine(const kernels::CombineParams& c, flashcore_dtype out_dtype, int head_dim,
                           cudaStream_t stream);


// 8-bit preparation (kernels/common/fp8_prep.cuh): the transposed V of an 8-bit call; for a precision = FP8 call, the
// whole quantization of 16-bit (`dtype`) Q, K, V (amax, e4m3 Q and K, descales, transposed V).
cudaError_t launch_fp8_transpose_v(const kernels::Fp8PrepParams& p, cudaStream_t stream);
cudaError_t launch_fp8_quantize(const kernels::Fp8PrepParams& p, flashcore_dtype dtype, cudaStream_t stream);
// precision = INT8 (kernels/common/int8_prep.cuh): the int8 Q and K and their scales before the attention; the LSE
// shift after it (when the call wants an LSE).
cudaError_t launch_int8_quantize(const kernels::Int8PrepParams& p, flashcore_dtype dtype, cudaStream_t stream);
cudaError_t launch_int8_lse_shift(const kernels::Int8PrepParams& p, int sms, cudaStream_t stream);

// The sizes and the Q, K, V tensors of `p` as the preparation kernels take them (the output pointers left NULL).
kernels::Fp8PrepParams fp8_prep_params(const flashcore_attention_params& p);

// Bytes an 8-bit call's workspace holds past its first 256 (zero-filled) bytes: the transposed V.
size_t fp8_vt_bytes(const flashcore_attention_params& p);

// Launch the plan's row for `p` (the call the row runs: GQA-packed, or the quantized call of precision = FP8 / INT8):
// its tensor maps and parameters, the launches the plan puts before it (KV append, the V transpose into the workspace)
// and after it (combine). `vt`: an 8-bit row's transposed V (the workspace's, or V given transposed), unless the
// kernel transposes V itself (plan.v_in_kernel). launch.cpp.
flashcore_status launch_row(const core::Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                            const uint8_t* vt, cudaStream_t stream, std::string& error);

}  // namespace flashcore::sm90

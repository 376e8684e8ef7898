// The sm90 backward's launches (bwd_launch.h): D and the scaled LSE (kernels/common/bwd_prep.cuh), the kernel
// (bwd_kernel.cuh), the dQ conversion and, with sinks and dsinks, dL/dsinks, on one stream.
#include "kernels/sm90/bwd_launch.h"

#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/launch_util.h"
#include "core/variants.h"
#include "kernels/common/bwd_layout.h"
#include "kernels/common/bwd_prep_params.h"
#include "kernels/sm90/bwd_params.h"
#include "kernels/sm90/tma_desc.h"

// The generated units' rows: FLASHCORE_SM90_BWD(NAME) per compiled (dtype, head dim).
#define FLASHCORE_SM90_BWD(NAME) extern const BwdKernelRow kBwd_##NAME;
namespace flashcore::sm90 {
#include "kernels/sm90/bwd_rows.inc"
}  // namespace flashcore::sm90
#undef FLASHCORE_SM90_BWD

namespace flashcore::sm90 {
namespace {

#define FLASHCORE_SM90_BWD(NAME) &kBwd_##NAME,
const BwdKernelRow* const kBwdRows[] = {
#include "kernels/sm90/bwd_rows.inc"
    nullptr};
#undef FLASHCORE_SM90_BWD


flashcore_status prepare(const void* kernel, int device, int smem_bytes, std::string& error) {
  return core::prepare_kernel(kernel, device, smem_bytes, "sm90 backward kernel image", [](const cudaFuncAttributes& a) {
    if (a.binaryVersion == 90 && (a.ptxVersion == 0 || a.ptxVersion >= 90)) return std::string();
    return "the loaded sm90 backward kernel image is for sm_" + std::to_string(a.binaryVersion) +
           ", not the sm_90a build: rebuild FlashCore with FLASHCORE_CUDA_ARCHS=90a";
  }, error);
}

flashcore_status launch(const void* kernel, dim3 grid, int threads, int smem, void* args, cudaStream_t stream,
                        const char* what, std::string& error) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  void* argv[] = {args};
  if (const cudaError_t err = cudaLaunchKernelExC(&config, kernel, argv); err != cudaSuccess) {
    error = core::cuda_message(what, err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace

const BwdKernelRow* find_bwd_row(flashcore_dtype dtype, int head_dim, int head_dim_v) {
  for (const BwdKernelRow* row : kBwdRows) {
    if (row != nullptr && row->dtype == dtype && row->head_dim == head_dim && row->head_dim_v == head_dim_v) return row;
  }
  return nullptr;
}

BwdWorkspace bwd_workspace(const flashcore_attention_params& p) { return kernels::bwd_workspace_of(p); }

flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                          std::string& error) {
  const int head_dim_v = static_cast<int>(core::head_dim_v(p));
  const BwdKernelRow* row = find_bwd_row(p.dtype, static_cast<int>(p.head_dim), head_dim_v);
  if (row == nullptr) {
    error = std::string("no sm90 backward kernel compiled for dtype ") + dtype_name(p.dtype) + " and head_dim " +
            std::to_string(p.head_dim) +
            (head_dim_v != p.head_dim ? ", head_dim_v " + std::to_string(head_dim_v) : std::string());
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  // Calls with a window or softcap run the variants' kernels; a windowed call runs the causal one (core/variants.h).
  const bool variants = core::windowed_call(p) || p.softcap != 0.f;
  const void* kernel = row->kernel[variants ? 1 : 0][core::masked_call(p) ? 1 : 0];
  if (kernel == nullptr) {
    error = "head_dim = " + std::to_string(p.head_dim) +
            ": this build has no sm90 backward kernel with window_size, attention_chunk or softcap at this head dim";
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if (const flashcore_status st = prepare(kernel, device, row->smem_bytes, error); st != FLASHCORE_SUCCESS) return st;
  const BwdWorkspace ws = bwd_workspace(p);
  char* base = static_cast<char*>(p.workspace);
  const int block_m = row->block_m[variants ? 1 : 0], block_n = row->block_n;
  // The workspace's 64-row blocks, whole kernel steps of block_m rows: the preparation's and dQ conversion's grids
  // and the stride of the deterministic counters.
  const int m_blocks = static_cast<int>((p.seqlen_q + block_m - 1) / block_m * (block_m / 64));
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Packed tensors are one batch entry of total rows (their batch strides are not read).
  const int64_t q_rows = varlen ? p.total_q : p.seqlen_q, k_rows = varlen ? p.total_k : p.seqlen_k;
  const int64_t entries = varlen ? 1 : p.batch;

  BwdParams bp{};
  const TensorMapArgs maps[4] = {
      {"q", p.q, p.dtype, p.head_dim, q_rows, p.num_heads_q, entries, p.q_strides, block_m},
      {"dout", p.dout, p.dtype, head_dim_v, q_rows, p.num_heads_q, entries, p.dout_strides, block_m},
      {"k", p.k, p.dtype, p.head_dim, k_rows, p.num_heads_kv, entries, p.k_strides, block_n},
      {"v", p.v, p.dtype, head_dim_v, k_rows, p.num_heads_kv, entries, p.v_strides, block_n},
  };
  CUtensorMap* targets[4] = {&bp.tma_q, &bp.tma_do, &bp.tma_k, &bp.tma_v};
  for (int i = 0; i < 4; ++i) {
    TensorMapArgs args = maps[i];
    if (varlen) args.strides.batch = 0;
    // One TMA per tile: every chunk (the row's swizzle width, bwd_config.h) of its rows (bwd_producer.cuh).
    args.row_elems = row->chunk_cols;
    args.chunked = args.head_dim > row->chunk_cols;
    if (const flashcore_status st = encode_tensor_map(targets[i], args, error); st != FLASHCORE_SUCCESS) return st;
  }
  bp.lse_log2 = reinterpret_cast<const float*>(base + ws.lse);
  bp.dpsum = reinterpret_cast<const float*>(base + ws.dpsum);
  bp.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  bp.dq_semaphore = p.deterministic != 0 ? reinterpret_cast<int*>(base + ws.semaphore) : nullptr;
  kernels::set_dkdv_outputs(bp, p);
  bp.rows = kernels::bwd_rows_of(p);
  bp.num_heads_q = static_cast<int>(p.num_heads_q);
  bp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  bp.num_m_blocks = m_blocks;
  bp.scale_log2 = core::set_variants(bp.var, p, softmax_scale);
  bp.softmax_scale = softmax_scale;
  bp.never_step = -1;

  kernels::BwdPrepParams prep =
      kernels::bwd_prep_params_of(p, ws, base, bp.rows, m_blocks, bp.var, variants, core::masked_call(p), block_n,
                                  block_m, /*descending=*/true);
  kernels::BwdDqParams conv = kernels::bwd_dq_params_of(p, ws, base, bp.rows, softmax_scale);
  const bool dsinks = prep.sinks != nullptr;

  const dim3 q_grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_heads_q),
                    static_cast<unsigned>(p.batch));
  const dim3 kv_grid(static_cast<unsigned>((p.seqlen_k + block_n - 1) / block_n), static_cast<unsigned>(p.num_heads_kv),
                     static_cast<unsigned>(p.batch));
  if (flashcore_status st = launch(row->prep, q_grid, 256, 0, &prep, stream, "backward preparation launch failed", error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (flashcore_status st = launch(kernel, kv_grid, row->threads, row->smem_bytes, &bp, stream,
                                   "backward kernel launch failed", error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (flashcore_status st = launch(row->dq_convert, q_grid, 256, 0, &conv, stream, "backward dQ conversion launch failed",
                                   error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (bp.rows.seqused_k != nullptr) {  // dK and dV of the keys past seqused_k: zeros (the kernel writes the used ones)
    kernels::BwdZeroKvParams zero = kernels::bwd_zero_kv_params_of(p, bp.rows);
    const dim3 kv_rows_grid(static_cast<unsigned>((p.seqlen_k + 63) / 64), static_cast<unsigned>(p.num_heads_kv),
                            static_cast<unsigned>(p.batch));
    if (flashcore_status st = launch(row->zero_kv, kv_rows_grid, 256, 0, &zero, stream,
                                     "backward launch (dK and dV past seqused_k) failed", error);
        st != FLASHCORE_SUCCESS) {
      return st;
    }
  }
  if (!dsinks) return FLASHCORE_SUCCESS;
  kernels::BwdDsinksParams ds{prep.dsink_part, p.dsinks, bp.rows, static_cast<int>(p.batch), m_blocks};
  return launch(row->dsinks, dim3(static_cast<unsigned>(p.num_heads_q)), 256, 0, &ds, stream,
                "backward dsinks launch failed", error);
}

}  // namespace flashcore::sm90

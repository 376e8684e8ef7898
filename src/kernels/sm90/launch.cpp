// The sm90 kernel launch of a plan (launch.h launch_row): the tensor maps and kernel parameters of the call, the
// launches the plan puts before the kernel (KV append, V transpose), the kernel, and the combine after it.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <numeric>
#include <string>

#include "core/dtype.h"
#include "core/launch_util.h"
#include "core/variants.h"
#include "kernels/common/tile_math.h"
#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/scheduler_grid.h"
#include "kernels/sm90/smem_plan.h"
#include "kernels/sm90/split_plan.h"
#include "kernels/sm90/tma_desc.h"

namespace flashcore::sm90 {
namespace {

// Once per (kernel, context): check that the loaded image is the real sm_90a kernel (not a body compiled for
// another arch, which would trap) and raise its dynamic shared-memory limit. Both are per-context state, so a
// cudaDeviceReset (a new context) re-runs them. Returns SUCCESS or a message.
flashcore_status prepare(const KernelRow& row, int device, std::string& error) {
  return core::prepare_kernel(row.kernel, device, row.smem_bytes, "sm90 kernel image", [](const cudaFuncAttributes& a) {
    if (a.binaryVersion == 90 && (a.ptxVersion == 0 || a.ptxVersion >= 90)) return std::string();
    return "the loaded sm90 kernel image is for sm_" + std::to_string(a.binaryVersion) + " (from PTX " +
           std::to_string(a.ptxVersion) + "), not the sm_90a build: rebuild FlashCore with FLASHCORE_CUDA_ARCHS=90a";
  }, error);
}

// The four tensor maps of the call (Q, K, V, O). `vt`: an 8-bit row's V transposed (the workspace, or V itself when
// given transposed), which it reads unless its producer warps transpose V tiles in shared memory.
flashcore_status encode_maps(const core::Plan& plan, const KernelRow& row, const flashcore_attention_params& p,
                             const uint8_t* vt, int slice_rows, FwdParams& fp, std::string& error) {
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  // Packed tensors are one batch entry of total rows; a paged K/V is num_pages entries of page_size rows, loaded in
  // slices that divide both the page and the key block.
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  const bool paged = p.block_table != nullptr;
  const int64_t q_rows = varlen_q ? p.total_q : p.seqlen_q, q_entries = varlen_q ? 1 : p.batch;
  const int64_t kv_rows = varlen_k ? p.total_k : (paged ? p.page_size : p.seqlen_k);
  const int64_t kv_entries =  // (a dense cache with a slot per sequence: its kv_batch_size entries)
      varlen_k ? 1 : (paged ? p.num_pages : (p.kv_batch_idx != nullptr ? p.kv_batch_size : p.batch));
  // A paged slice's TMA box (tile_shape.h paged_box_rows, the box producer.cuh issues).
  const int kv_box = paged ? paged_box_rows(kv_box_rows(row.shape), slice_rows) : kv_box_rows(row.shape);
  const bool eight_bit = is_8bit(row.dtype);
  // K's and V's dtype: an e4m3 KV cache's rows read them in 8 bits (configs_kv8.txt), the others in the row's dtype.
  const flashcore_dtype kv_dtype = row.kv_dtype != FLASHCORE_DTYPE_SAME ? row.kv_dtype : p.dtype;
  const int64_t dv = core::head_dim_v(p);  // V's and O's head dim
  const int64_t vt_keys = kernels::fp8_vt_padded_keys(p.seqlen_k);
  const flashcore_tensor_strides vt_strides{p.num_heads_kv * p.head_dim * vt_keys, vt_keys, p.head_dim * vt_keys, 1};
  const TensorMapArgs v_map =
      eight_bit && !plan.v_in_kernel
          ? TensorMapArgs{"v (transposed)", vt, row.dtype, vt_keys, p.head_dim, p.num_heads_kv, p.batch, vt_strides,
                          static_cast<int>(p.head_dim), vt_chunk_keys(row.shape, row.head_dim)}
          : TensorMapArgs{"v", p.v, is_int8_qk(row.dtype) ? out_dtype : kv_dtype, dv, kv_rows, p.num_heads_kv,
                          kv_entries, p.v_strides, kv_box};  // (int8 Q K^T: V in O's 16-bit dtype)
  const TensorMapArgs maps[4] = {
      {"q", p.q, p.dtype, p.head_dim, q_rows, p.num_heads_q, q_entries, p.q_strides, row.shape.block_m},
      {"k", p.k, kv_dtype, p.head_dim, kv_rows, p.num_heads_kv, kv_entries, p.k_strides, kv_box},
      v_map,
      {"o", p.o, out_dtype, dv, q_rows, p.num_heads_q, q_entries, p.o_strides, 64},
  };
  CUtensorMap* targets[4] = {&fp.tma_q, &fp.tma_k, &fp.tma_v, &fp.tma_o};
  // One TMA per Q, K or V tile where its box is the whole tile (tile_shape.h tma_chunked, the producer's rule): Q
  // always, a dense K/V unless split-KV boxes it in 32-row slices; a paged cache's slices and O's stores keep 4-D maps.
  const int elem_bytes = static_cast<int>(dtype_size(row.dtype));
  const int kv_elem_bytes = static_cast<int>(dtype_size(kv_dtype));
  const auto chunks_of = [](int64_t row_bytes) {  // the kernel's chunks of a row (smem_plan.h swizzle_row_bytes)
    return static_cast<int>(row_bytes / swizzle_row_bytes(static_cast<int>(row_bytes)));
  };
  const int chunks = chunks_of(p.head_dim * elem_bytes);
  const int kv_chunks = chunks_of(p.head_dim * kv_elem_bytes);
  const int v_chunks = chunks_of(dv * kv_elem_bytes);
  const bool kv_chunked = !paged && tma_chunked(kv_elem_bytes, kv_chunks, row.shape.block_n, kv_box);
  const bool v_chunked = !paged && !eight_bit && tma_chunked(kv_elem_bytes, v_chunks, row.shape.block_n, kv_box);
  const bool chunked[4] = {tma_chunked(elem_bytes, chunks, row.shape.block_m, row.shape.block_m), kv_chunked,
                           v_chunked, false};
  for (int i = 0; i < 4; ++i) {
    TensorMapArgs args = maps[i];
    args.chunked = chunked[i];
    if (const flashcore_status st = encode_tensor_map(targets[i], args, error); st != FLASHCORE_SUCCESS) return st;
  }
  return FLASHCORE_SUCCESS;
}

// The kernel parameters of the call (but the tensor maps).
void fill_params(const core::Plan& plan, const KernelRow& row, const flashcore_attention_params& p, float softmax_scale,
                 int slice_rows, FwdParams& fp) {
  const bool paged = p.block_table != nullptr;
  fp.never_block = -1;
  fp.lse = p.lse;
  core::set_serving_layout(fp, p);
  fp.kv_slice_rows = slice_rows;
  fp.page_block_slices = paged ? row.shape.block_n / slice_rows : 0;
  fp.page_chunk_blocks = paged ? kPageChunk / fp.page_block_slices : 0;
  // (An e4m3 KV cache's converter warps write those rows as zeros themselves, convert_kv.cuh: its consumers must not
  // write the tile too. Skipping their zeroing at compile time instead made ptxas spill in the d128 / d256 rows.)
  fp.zero_v_tail =
      (p.seqused_k != nullptr || p.cu_seqlens_k != nullptr || paged) && row.kv_dtype == FLASHCORE_DTYPE_SAME;
  fp.q_ref = {p.q, p.q_strides.batch, p.q_strides.seq, p.q_strides.head};
  fp.k_ref = {p.k, p.k_strides.batch, p.k_strides.seq, p.k_strides.head};
  fp.v_ref = {p.v, p.v_strides.batch, p.v_strides.seq, p.v_strides.head};
  fp.o = p.o;
  const int64_t out_bytes = dtype_size(resolved_out_dtype(p.dtype, p.out_dtype));
  fp.o_stride_batch_bytes = p.o_strides.batch * out_bytes;
  fp.o_stride_seq_bytes = p.o_strides.seq * out_bytes;
  fp.o_stride_head_bytes = p.o_strides.head * out_bytes;
  char* ws = static_cast<char*>(p.workspace);
  fp.tile_counter = reinterpret_cast<int*>(ws + core::WorkspaceLayout::kTileCounter);
  fp.seqlen_q = p.seqlen_q;
  fp.seqlen_k = p.seqlen_k;
  fp.num_heads_q = static_cast<int>(p.num_heads_q);
  fp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  const int64_t m_blocks = kernels::ceil_div(p.seqlen_q, row.shape.block_m);
  fp.num_m_blocks = static_cast<int>(m_blocks);
  fp.num_tiles = static_cast<int>(m_blocks * p.num_heads_q * p.batch);
  core::tile_order(p, m_blocks, fp.num_slices, fp.section_slices);
  fp.scale_log2 = core::set_variants(fp, p, softmax_scale) * row.test_scale_factor;
  fp.q_descale = p.q_descale;
  fp.k_descale = p.k_descale;
  fp.v_descale = p.v_descale;
  fp.num_heads_kv = static_cast<int>(p.num_heads_kv);
  fp.transpose_v = plan.v_in_kernel;
  if (row.shape.schedule == Schedule::kSplitKv) {
    const core::SplitKv& s = plan.split;
    fp.o_partial = reinterpret_cast<float*>(ws + plan.workspace.o_partial);
    fp.lse_partial = reinterpret_cast<float*>(ws + plan.workspace.lse_partial);
    fp.num_splits = s.splits;
    fp.blocks_per_split = s.blocks_per_split;
    fp.split_whole_tiles = static_cast<int>(s.whole);  // 0 for the decode rows' equal parts
    fp.num_tiles = static_cast<int>(s.last_round ? s.total : static_cast<int64_t>(fp.num_tiles) * s.splits);
    if (s.fused_merge) fp.split_counters = reinterpret_cast<uint32_t*>(ws + core::WorkspaceLayout::kSplitCounters);
  }
}

}  // namespace

flashcore_status launch_row(const core::Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                            const uint8_t* vt, cudaStream_t stream, std::string& error) {
  const KernelRow& row = *static_cast<const KernelRow*>(plan.row);
  if (plan.workspace.bytes > 0 && (p.workspace == nullptr || p.workspace_size < plan.workspace.bytes)) {
    error = std::string("kernel config \"") + row.name + "\" needs " + std::to_string(plan.workspace.bytes) +
            " bytes of zero-filled workspace (flashcore_attention_workspace_size); workspace_size = " +
            std::to_string(p.workspace_size);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const bool paged = p.block_table != nullptr;
  const int slice_rows = paged ? static_cast<int>(std::gcd<int64_t>(p.page_size, row.shape.block_n)) : 0;
  FwdParams fp{};
  if (const flashcore_status st = encode_maps(plan, row, p, vt, slice_rows, fp, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
  fill_params(plan, row, p, softmax_scale, slice_rows, fp);
  if (const flashcore_status st = prepare(row, plan.device, error); st != FLASHCORE_SUCCESS) return st;

  // New K/V rows go into the cache first, on the same stream.
  if (const flashcore_status st = core::append_new_kv(p, plan.device, stream, fp, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (plan.v_pass) {  // V transposed into the workspace first, same stream
    kernels::Fp8PrepParams prep = fp8_prep_params(p);
    prep.vt = const_cast<uint8_t*>(vt);
    if (const cudaError_t err = launch_fp8_transpose_v(prep, stream); err != cudaSuccess) {
      error = core::cuda_message("8-bit V transpose launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid_size(row.shape.schedule, fp.num_tiles, plan.sms));  // x splits for kSplitKv
  config.blockDim = dim3(static_cast<unsigned>(row.threads));
  config.dynamicSmemBytes = static_cast<size_t>(row.smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attribute;
  core::allow_dependent_launch(config, attribute);  // the kernel waits for the previous one (kernel.cuh)
  void* args[] = {&fp};
  // The launch's own status: unlike cudaGetLastError, it neither reports nor clears an earlier, unrelated error.
  if (const cudaError_t err = cudaLaunchKernelExC(&config, row.kernel, args); err != cudaSuccess) {
    error = core::cuda_message("kernel launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  // Merge the splits into O (and LSE) on the same stream, unless the tiles' last splits did (or one part wrote O).
  if (plan.combine) {
    kernels::CombineParams c{};
    c.o_partial = fp.o_partial;
    c.lse_partial = fp.lse_partial;
    c.o = p.o;
    c.o_stride_batch = p.o_strides.batch;
    c.o_stride_seq = p.o_strides.seq;
    c.o_stride_head = p.o_strides.head;
    c.lse = p.lse;
    c.rows = p.batch * p.num_heads_q * p.seqlen_q;
    c.seqlen_q = p.seqlen_q;
    c.heads = static_cast<int>(p.num_heads_q);
    c.splits = plan.split.splits;
    const cudaError_t err =
        launch_combine(c, resolved_out_dtype(p.dtype, p.out_dtype), static_cast<int>(core::head_dim_v(p)), stream);
    if (err != cudaSuccess) {
      error = core::cuda_message("split-KV combine launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::sm90

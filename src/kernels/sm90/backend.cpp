// Host side of the sm90 backend: the generated kernel rows, their selection, the kernel parameters (tensor
// maps, tile counts) and the launch.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cmath>
#include <cstdlib>
#include <numeric>
#include <cstring>
#include <string>

#include "api/dtype.h"
#include "api/launch_util.h"
#include "kernels/common/tile_math.h"
#include "kernels/sm90/kernel_params.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/scheduler_grid.h"
#include "kernels/sm90/smem_plan.h"
#include "kernels/sm90/split_plan.h"
#include "kernels/sm90/tma_desc.h"
#include "kernels/sm90/v_route.h"

namespace flashcore::sm90 {

#define FLASHCORE_SM90_ROW(SYM) extern const KernelRow kRow_##SYM;
#include "kernels/sm90/rows.inc"
#undef FLASHCORE_SM90_ROW

namespace {

const KernelRow* const kRows[] = {
#define FLASHCORE_SM90_ROW(SYM) &kRow_##SYM,
#include "kernels/sm90/rows.inc"
#undef FLASHCORE_SM90_ROW
};

// The rows packed (varlen) batches run (configs.txt, default column "packed"), before the default one-CTA rows.
const KernelRow* const kPackedRows[] = {
#define FLASHCORE_SM90_PACKED_ROW(SYM) &kRow_##SYM,
#include "kernels/sm90/packed_rows.inc"
#undef FLASHCORE_SM90_PACKED_ROW
    nullptr};

// Once per (kernel, context): check that the loaded image is the real sm_90a kernel (not a body compiled for
// another arch, which would trap) and raise its dynamic shared-memory limit. Both are per-context state, so a
// cudaDeviceReset (a new context) re-runs them. Returns SUCCESS or a message.
flashcore_status prepare(const KernelRow& row, int device, std::string& error) {
  return api::prepare_kernel(row.kernel, device, row.smem_bytes, "sm90 kernel image", [](const cudaFuncAttributes& a) {
    if (a.binaryVersion == 90 && (a.ptxVersion == 0 || a.ptxVersion >= 90)) return std::string();
    return "the loaded sm90 kernel image is for sm_" + std::to_string(a.binaryVersion) + " (from PTX " +
           std::to_string(a.ptxVersion) + "), not the sm_90a build: rebuild FlashCore with FLASHCORE_CUDA_ARCHS=90a";
  }, error);
}

}  // namespace

const KernelRow* const* rows(int& count) {
  count = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));
  return kRows;
}

const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, int64_t seqlen_k, std::string& error) {
  auto same_key = [&](const KernelRow* r) {
    return r->dtype == dtype && r->out_dtype == out_dtype && r->head_dim == head_dim && r->causal == causal;
  };
  std::string names;
  for (const KernelRow* r : kRows) {
    if (!same_key(r)) continue;
    if (config == nullptr ? is_default_for(*r, seqlen_k) : std::strcmp(config, r->name) == 0) return r;
    names += (names.empty() ? "" : ", ") + std::string(r->name);
  }
  if (config != nullptr) {
    // Then the runtime variants (variant.h): the default path never takes the registry's lock.
    std::string variants;
    for (const KernelRow* r : registered_rows()) {
      if (!same_key(r)) continue;
      if (std::strcmp(config, r->name) == 0) return r;
      variants += (variants.empty() ? "" : ", ") + std::string(r->name);
    }
    error = std::string("kernel_config = \"") + config + "\" is not compiled for " + dtype_name(dtype) +
            " head_dim = " + std::to_string(head_dim) + (causal ? " causal" : " non-causal") +
            "; compiled: " + (names.empty() ? "none" : names) + (variants.empty() ? "" : "; registered: " + variants);
  } else {
    error = std::string("no sm90 kernel is compiled for ") + dtype_name(dtype) + " -> " + dtype_name(out_dtype) +
            " head_dim = " + std::to_string(head_dim);
  }
  return nullptr;
}

namespace {
// Whether row r is compiled for the call's (dtype, out dtype, head dim, mask).
bool same_key(const KernelRow& r, const flashcore_attention_params& p) {
  return r.dtype == p.dtype && r.out_dtype == resolved_out_dtype(p.dtype, p.out_dtype) && r.head_dim == p.head_dim &&
         r.causal == (p.causal != 0);
}

// Query tiles of the call on the row: (batch, head, block of block_m query rows).
int64_t query_tiles(const KernelRow& row, const flashcore_attention_params& p) {
  return kernels::ceil_div(p.seqlen_q, row.shape.block_m) * p.num_heads_q * p.batch;
}

// The split of a kSplitKv row's launch for these params (split_plan.h): equal parts for the decode rows, the
// last-round split for the prefill rows.
SplitPlan plan_for(const KernelRow& row, const flashcore_attention_params& p, int sms) {
  if (splits_last_round(row.shape)) {
    return last_round_plan(query_tiles(row, p), kernels::ceil_div(p.seqlen_k, row.shape.block_n), sms,
                           row.shape.block_m, static_cast<int>(p.head_dim));
  }
  return split_plan(query_tiles(row, p), kernels::ceil_div(p.seqlen_k, row.shape.block_n), sms, p.batch * p.num_heads_q,
                    p.seqlen_q, static_cast<int>(p.head_dim), p.num_splits);
}
}  // namespace

const KernelRow* decode_row(const flashcore_attention_params& p, int device, uint64_t workspace_capacity) {
  int sms = 0;
  if (api::sm_count(device, sms) != cudaSuccess) return nullptr;
  // One query block of 64 rows per (batch, head) against at least 8 key blocks of 128: the 64-row split tile wastes
  // no rows and split_plan() cuts the keys only as far as the GPU is not yet full (one part when it is).
  // num_splits = 1 asks for no split; packed (varlen) queries have no split form yet.
  if (p.seqlen_q > 64 || kernels::ceil_div(p.seqlen_k, 128) < 8) return nullptr;
  if (p.num_splits == 1 || p.cu_seqlens_q != nullptr) return nullptr;
  // At most 8 query rows (one new token of a GQA group of up to 8 heads, packed): the row with the GEMMs transposed
  // (decode_swap.cuh), whose wgmma tile has 8 rows instead of 64; else the 64-row one.
  const bool swap = p.seqlen_q <= kSwapRows;
  for (const KernelRow* r : kRows) {
    if (r->shape.schedule == Schedule::kSplitKv && !splits_last_round(r->shape) && same_key(*r, p) &&
        swaps_gemms(r->shape) == swap) {
      // (Leaving one-part plans to the whole-tile kernel was faster at 32 x 4k only, slower on the three other
      // large rows: docs/decisions.md#split-one-part.)
      return plan_for(*r, p, sms).bytes <= workspace_capacity ? r : nullptr;
    }
  }
  return nullptr;
}

const KernelRow* varlen_row(const flashcore_attention_params& p, bool workspace_given) {
  if (p.cu_seqlens_q == nullptr) return nullptr;
  // The first listed packed row of the key that takes this call (smem_plan.h: takes_packed, takes_paged); a dynamic
  // one only with the workspace for its counter.
  for (const KernelRow* r : kPackedRows) {
    if (r == nullptr || !same_key(*r, p) || !takes_packed(r->shape)) continue;
    if (p.block_table != nullptr && !takes_paged(r->shape)) continue;
    if (r->shape.schedule == Schedule::kDynamicPersistent && !workspace_given) continue;
    return r;
  }
  // Else the default row where it takes one CTA per tile, or the first such row.
  const KernelRow* first = nullptr;
  for (const KernelRow* r : kRows) {
    if (r->shape.schedule != Schedule::kOneTilePerCta || !same_key(*r, p)) continue;
    if (is_default_for(*r, p.seqlen_k)) return r;
    if (first == nullptr) first = r;
  }
  return first;
}

const KernelRow* wave_row(const flashcore_attention_params& p, int device, const KernelRow* chosen,
                          uint64_t workspace_capacity) {
  // Only whole-tile non-causal rows of dense 16-bit calls: causal tiles differ in length (the dynamic schedule balances
  // them), packed and split calls have rows of their own.
  if (chosen == nullptr || chosen->causal || is_8bit(chosen->dtype) || p.cu_seqlens_q != nullptr ||
      p.cu_seqlens_k != nullptr || chosen->shape.schedule == Schedule::kSplitKv) {
    return chosen;
  }
  int sms = 0;
  if (api::sm_count(device, sms) != cudaSuccess || sms <= 0) return chosen;
  // Time ~ rounds of tiles an SM runs x the rows of a tile; a smaller tile's rows cost up to kSmallTileCost times more.
  const auto cost = [&](const KernelRow& r, double row_cost) {
    const int64_t rounds = kernels::ceil_div(query_tiles(r, p), static_cast<int64_t>(sms));
    return static_cast<double>(rounds) * r.shape.block_m * row_cost;
  };
  const KernelRow* best = chosen;
  double best_cost = cost(*chosen, 1.0);
  for (const KernelRow* r : kRows) {
    if (!same_key(*r, p) || r->shape.block_m >= chosen->shape.block_m || r->shape.packed ||
        (r->shape.schedule != Schedule::kStaticPersistent && r->shape.schedule != Schedule::kOneTilePerCta) ||
        (p.block_table != nullptr && !takes_paged(r->shape))) {
      continue;
    }
    const double c = cost(*r, kSmallTileCost);
    if (c < best_cost) best = r, best_cost = c;
  }
  // The prefill split row of the chosen row's tile, for a call whose tiles leave more than half of the SMs idle and
  // whose key ranges are long (a call with seqused_k, k_new or a paged cache keeps whole tiles: the split row takes
  // dense calls only; num_splits = 1 asks for no split).
  if (p.seqused_k != nullptr || p.k_new != nullptr || p.block_table != nullptr || p.num_splits == 1) return best;
  for (const KernelRow* r : kRows) {
    if (!same_key(*r, p) || !splits_last_round(r->shape) || r->shape.block_m != chosen->shape.block_m ||
        r->shape.block_n != chosen->shape.block_n) {
      continue;
    }
    const SplitPlan plan = plan_for(*r, p, sms);
    if (plan.last_round && plan.whole == 0 && plan.splits > 1 &&
        kernels::ceil_div(p.seqlen_k, r->shape.block_n) >= kSplitMinKeyBlocks && plan.bytes <= workspace_capacity) {
      return r;
    }
  }
  return best;
}

bool needs_workspace(const KernelRow& row) {
  return row.shape.schedule == Schedule::kDynamicPersistent || row.shape.schedule == Schedule::kSplitKv ||
         is_8bit(row.dtype);
}

kernels::Fp8PrepParams fp8_prep_params(const flashcore_attention_params& p) {
  kernels::Fp8PrepParams prep = prep_shape<kernels::Fp8PrepParams>(p);
  prep.v = kernels::Fp8Tensor{p.v, p.v_strides.batch, p.v_strides.seq, p.v_strides.head};
  return prep;
}

size_t fp8_vt_bytes(const flashcore_attention_params& p) {
  return static_cast<size_t>(p.batch * p.num_heads_kv * p.head_dim * kernels::fp8_vt_padded_keys(p.seqlen_k));
}

namespace {
// An 8-bit call's workspace: 256 bytes kept zero (flashcore.h), then the transposed V.
constexpr size_t kFp8VtOffset = 256;

// The V route of an 8-bit call (v_route.h): FLASHCORE_FP8_V_TRANSPOSE=kernel or =pass forces one (measurements); a
// config whose tile cannot transpose in place (tile_shape.h) always takes the pass.
bool transposes_v_in_kernel(const KernelRow& row, const flashcore_attention_params& p, int device) {
  if (!is_8bit(row.dtype) || (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0) return false;
  if (!transposes_v_in_place(row.shape, static_cast<int>(row.head_dim))) return false;
  if (const char* force = std::getenv("FLASHCORE_FP8_V_TRANSPOSE"); force != nullptr) {
    if (std::strcmp(force, "kernel") == 0) return true;
    if (std::strcmp(force, "pass") == 0) return false;
  }
  double dram_gbps = 0;  // unknown: the reference device's limit
  if (api::dram_peak_gbps(device, dram_gbps) != cudaSuccess) dram_gbps = 0;
  const int64_t tiles = kernels::ceil_div(p.seqlen_q, row.shape.block_m) * (p.num_heads_q / p.num_heads_kv);
  return v_transposed_in_kernel(static_cast<int>(row.head_dim), row.causal, tiles, dram_gbps);
}
}  // namespace

namespace {
// The workspace of a call whose V route (transposes_v_in_kernel) is already decided: launch() decides it once.
size_t workspace_bytes(const KernelRow& row, const flashcore_attention_params& p, int sms, bool v_in_kernel) {
  if (row.shape.schedule == Schedule::kSplitKv) return plan_for(row, p, sms).bytes;
  if (is_8bit(row.dtype)) {  // (V given transposed, or transposed in the kernel: only the zero-filled head, the
                             // dynamic schedule's counter)
    const bool vt_in_workspace = (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) == 0 && !v_in_kernel;
    return kFp8VtOffset + (vt_in_workspace ? fp8_vt_bytes(p) : 0);
  }
  return row.shape.schedule == Schedule::kDynamicPersistent ? 16 : 0;  // one int counter, padded
}
}  // namespace

size_t workspace_bytes(const KernelRow& row, const flashcore_attention_params& p, int device, int sms) {
  return workspace_bytes(row, p, sms, transposes_v_in_kernel(row, p, device));
}

flashcore_status launch(const KernelRow& row, const flashcore_attention_params& p, float softmax_scale, int device,
                        cudaStream_t stream, std::string& error, const uint8_t* prepared_vt) {
  int sms = 0;
  cudaError_t err = api::sm_count(device, sms);
  if (err != cudaSuccess) {
    error = api::cuda_message("cannot query the device", err);
    return FLASHCORE_ERROR_CUDA;
  }
  const bool split = row.shape.schedule == Schedule::kSplitKv;
  const SplitPlan plan = split ? plan_for(row, p, sms) : SplitPlan{};
  const bool v_in_kernel = transposes_v_in_kernel(row, p, device);
  const size_t ws = split ? plan.bytes : workspace_bytes(row, p, sms, v_in_kernel);
  if (ws > 0 && (p.workspace == nullptr || p.workspace_size < ws)) {
    error = std::string("kernel config \"") + row.name + "\" needs " + std::to_string(ws) +
            " bytes of zero-filled workspace (flashcore_attention_workspace_size); workspace_size = " +
            std::to_string(p.workspace_size);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  FwdParams fp{};
  fp.never_block = -1;
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  // Packed tensors are one batch entry of total rows; a paged K/V is num_pages entries of page_size rows, loaded in
  // slices that divide both the page and the key block.
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  const bool paged = p.block_table != nullptr;
  const int64_t q_rows = varlen_q ? p.total_q : p.seqlen_q, q_entries = varlen_q ? 1 : p.batch;
  const int64_t kv_rows = varlen_k ? p.total_k : (paged ? p.page_size : p.seqlen_k);
  const int64_t kv_entries = varlen_k ? 1 : (paged ? p.num_pages : p.batch);
  const int slice_rows = paged ? static_cast<int>(std::gcd<int64_t>(p.page_size, row.shape.block_n)) : 0;
  if (paged && slice_rows % 16 != 0) {
    error = "page_size = " + std::to_string(p.page_size) + " and kernel config "" + row.name + "" (key block " +
            std::to_string(row.shape.block_n) + ") share no 16-row slice";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if ((paged && !takes_paged(row.shape)) || ((varlen_q || varlen_k) && !takes_packed(row.shape))) {
    error = std::string("kernel config \"") + row.name + "\" (" +
            (splits_last_round(row.shape) ? "prefill split-KV" : "dynamic schedule") + ") has no " +
            (paged ? "paged" : "packed (varlen)") + " path; name another config or none";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  // A paged slice's TMA box (tile_shape.h paged_box_rows, the box producer.cuh issues).
  const int kv_box = paged ? paged_box_rows(kv_box_rows(row.shape), slice_rows) : kv_box_rows(row.shape);
  // 8-bit: the kernel reads V transposed (kernel_params.h): as stored and transposed by its producer warps
  // (transpose_v), or from the workspace, written by the transpose kernel below or already by the quantization of a
  // precision = FP8 call (prepared_vt), or given transposed (FLASHCORE_FLAG_V_TRANSPOSED).
  const bool eight_bit = is_8bit(row.dtype);
  const bool transpose_v = prepared_vt == nullptr && v_in_kernel;
  const int64_t vt_keys = kernels::fp8_vt_padded_keys(p.seqlen_k);
  uint8_t* vt = eight_bit ? static_cast<uint8_t*>(p.workspace) + kFp8VtOffset : nullptr;
  if (eight_bit && (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0) prepared_vt = static_cast<const uint8_t*>(p.v);
  if (prepared_vt != nullptr) vt = const_cast<uint8_t*>(prepared_vt);
  const flashcore_tensor_strides vt_strides{p.num_heads_kv * p.head_dim * vt_keys, vt_keys, p.head_dim * vt_keys, 1};
  const TensorMapArgs v_map =
      eight_bit && !transpose_v
          ? TensorMapArgs{"v (transposed)", vt, row.dtype, vt_keys, p.head_dim, p.num_heads_kv, p.batch, vt_strides,
                          static_cast<int>(p.head_dim), vt_chunk_keys(row.shape, row.head_dim)}
          : TensorMapArgs{"v", p.v, is_int8_qk(row.dtype) ? out_dtype : p.dtype, p.head_dim, kv_rows, p.num_heads_kv,
                          kv_entries, p.v_strides, kv_box};  // (int8 Q K^T: V in O's 16-bit dtype)
  const TensorMapArgs maps[4] = {
      {"q", p.q, p.dtype, p.head_dim, q_rows, p.num_heads_q, q_entries, p.q_strides, row.shape.block_m},
      {"k", p.k, p.dtype, p.head_dim, kv_rows, p.num_heads_kv, kv_entries, p.k_strides, kv_box},
      v_map,
      {"o", p.o, out_dtype, p.head_dim, q_rows, p.num_heads_q, q_entries, p.o_strides, 64},
  };
  CUtensorMap* targets[4] = {&fp.tma_q, &fp.tma_k, &fp.tma_v, &fp.tma_o};
  // One TMA per Q, K or V tile where its box is the whole tile (tile_shape.h tma_chunked, the producer's rule): Q
  // always, a dense K/V unless split-KV boxes it in 32-row slices; a paged cache's slices and O's stores keep 4-D maps.
  const int elem_bytes = static_cast<int>(dtype_size(row.dtype));
  const int chunks = static_cast<int>(p.head_dim * elem_bytes / 128);
  const bool kv_chunked = !paged && tma_chunked(elem_bytes, chunks, row.shape.block_n, kv_box);
  const bool chunked[4] = {tma_chunked(elem_bytes, chunks, row.shape.block_m, row.shape.block_m), kv_chunked,
                           kv_chunked && !eight_bit, false};
  for (int i = 0; i < 4; ++i) {
    TensorMapArgs args = maps[i];
    args.chunked = chunked[i];
    const flashcore_status st = encode_tensor_map(targets[i], args, error);
    if (st != FLASHCORE_SUCCESS) return st;
  }

  const long long m_blocks = kernels::ceil_div(p.seqlen_q, row.shape.block_m);
  const long long tiles = m_blocks * p.num_heads_q * p.batch;
  if (tiles > 0x7fffffffLL - 4096) {
    error = "batch * num_heads_q * ceil(seqlen_q / " + std::to_string(row.shape.block_m) + ") = " +
            std::to_string(tiles) + " exceeds the tile limit 2^31-4097";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  fp.lse = p.lse;
  api::set_serving_layout(fp, p);
  fp.kv_slice_rows = slice_rows;
  fp.page_block_slices = paged ? row.shape.block_n / slice_rows : 0;
  fp.page_chunk_blocks = paged ? kPageChunk / fp.page_block_slices : 0;
  fp.zero_v_tail = p.seqused_k != nullptr || varlen_k || paged;
  fp.q_ref = {p.q, p.q_strides.batch, p.q_strides.seq, p.q_strides.head};
  fp.k_ref = {p.k, p.k_strides.batch, p.k_strides.seq, p.k_strides.head};
  fp.v_ref = {p.v, p.v_strides.batch, p.v_strides.seq, p.v_strides.head};
  fp.o = p.o;
  const int64_t out_bytes = dtype_size(out_dtype);
  fp.o_stride_batch_bytes = p.o_strides.batch * out_bytes;
  fp.o_stride_seq_bytes = p.o_strides.seq * out_bytes;
  fp.o_stride_head_bytes = p.o_strides.head * out_bytes;
  fp.tile_counter = static_cast<int*>(p.workspace);
  fp.seqlen_q = p.seqlen_q;
  fp.seqlen_k = p.seqlen_k;
  fp.num_heads_q = static_cast<int>(p.num_heads_q);
  fp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  fp.num_m_blocks = static_cast<int>(m_blocks);
  fp.num_tiles = static_cast<int>(tiles);
  api::tile_order(p, m_blocks, fp.num_slices, fp.section_slices);
  fp.scale_log2 = softmax_scale * row.test_scale_factor * static_cast<float>(M_LOG2E);
  fp.q_descale = p.q_descale;
  fp.k_descale = p.k_descale;
  fp.v_descale = p.v_descale;
  fp.num_heads_kv = static_cast<int>(p.num_heads_kv);

  if (split) {
    if (splits_last_round(row.shape) && !plan.last_round) {
      error = std::string("kernel config \"") + row.name + "\" (prefill split-KV) runs on at most " +
              std::to_string(kSplitCounterTiles) + " SMs; this device has " + std::to_string(sms);
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (!plan.last_round && tiles * plan.splits > 0x7fffffffLL - 4096) {  // (last_round_plan bounds its own)
      error = "the split-KV grid (" + std::to_string(tiles) + " tiles x " + std::to_string(plan.splits) +
              " splits) exceeds the tile limit 2^31-4097";
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
    char* base = static_cast<char*>(p.workspace);
    fp.o_partial = reinterpret_cast<float*>(base + plan.o_offset);
    fp.lse_partial = reinterpret_cast<float*>(base + plan.lse_offset);
    fp.num_splits = plan.splits;
    fp.blocks_per_split = plan.blocks_per_split;
    fp.split_whole_tiles = static_cast<int>(plan.whole);  // 0 for the decode rows' equal parts
    fp.num_tiles = static_cast<int>(plan.last_round ? plan.total : tiles * plan.splits);
    if (plan.fused_merge) fp.split_counters = reinterpret_cast<uint32_t*>(base + kSplitCounterOffset);
  }
  if (const flashcore_status st = prepare(row, device, error); st != FLASHCORE_SUCCESS) return st;

  // New K/V rows go into the cache first, on the same stream.
  if (const flashcore_status st = api::append_new_kv(p, device, stream, fp, error); st != FLASHCORE_SUCCESS) return st;

  fp.transpose_v = transpose_v;
  if (eight_bit && prepared_vt == nullptr && !transpose_v) {  // V transposed into the workspace first, same stream
    kernels::Fp8PrepParams prep = fp8_prep_params(p);
    prep.vt = vt;
    err = launch_fp8_transpose_v(prep, stream);
    if (err != cudaSuccess) {
      error = api::cuda_message("8-bit V transpose launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid_size(row.shape.schedule, fp.num_tiles, sms));  // x splits for kSplitKv
  config.blockDim = dim3(static_cast<unsigned>(row.threads));
  config.dynamicSmemBytes = static_cast<size_t>(row.smem_bytes);
  config.stream = stream;
  // Programmatic dependent launch: the grid is set up and its CTAs placed while the previous kernel on the stream
  // finishes; the kernel waits for it before touching memory (kernel.cuh).
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  void* args[] = {&fp};
  // The launch's own status: unlike cudaGetLastError, it neither reports nor clears an earlier, unrelated error.
  err = cudaLaunchKernelExC(&config, row.kernel, args);
  if (err != cudaSuccess) {
    error = api::cuda_message("kernel launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  // Merge the splits into O (and LSE) on the same stream, unless the tiles' last splits did (or one part wrote O).
  if (split && plan.splits > 1 && !plan.fused_merge) {
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
    c.splits = plan.splits;
    err = launch_combine(c, out_dtype, static_cast<int>(p.head_dim), stream);
    if (err != cudaSuccess) {
      error = api::cuda_message("split-KV combine launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::sm90

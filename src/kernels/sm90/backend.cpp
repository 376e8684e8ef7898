// Host side of the sm90 backend: the generated kernel rows, the rules that pick one for a call (decode, varlen,
// tuning tables, wave quantization), and the backend's plan and run (core/plan.h). The launch itself: launch.cpp;
// precision = FP8 / INT8: precision.cpp.
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/gqa_pack.h"
#include "core/launch_util.h"
#include "core/plan.h"
#include "core/variants.h"
#include "kernels/common/tile_math.h"
#include "kernels/sm90/bwd_launch.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/precision.h"
#include "kernels/sm90/scheduler_grid.h"
#include "kernels/sm90/smem_plan.h"
#include "kernels/sm90/split_plan.h"
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

}  // namespace

const KernelRow* const* rows(int& count) {
  count = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));
  return kRows;
}

const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, int64_t seqlen_k, std::string& error, int head_dim_v) {
  if (head_dim_v == 0) head_dim_v = head_dim;
  // (The e4m3 KV-cache rows have a dispatch of their own: kv8_row.)
  auto same_key = [&](const KernelRow* r) {
    return r->dtype == dtype && r->out_dtype == out_dtype && r->head_dim == head_dim && v_head_dim(*r) == head_dim_v &&
           r->causal == causal && r->kv_dtype == FLASHCORE_DTYPE_SAME;
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
            " head_dim = " + std::to_string(head_dim) +
            (head_dim_v != head_dim ? " head_dim_v = " + std::to_string(head_dim_v) : std::string()) +
            (causal ? " causal" : " non-causal") +
            "; compiled: " + (names.empty() ? "none" : names) + (variants.empty() ? "" : "; registered: " + variants);
  } else {
    error = std::string("no sm90 kernel is compiled for ") + dtype_name(dtype) + " -> " + dtype_name(out_dtype) +
            " head_dim = " + std::to_string(head_dim) +
            (head_dim_v != head_dim ? " head_dim_v = " + std::to_string(head_dim_v) : std::string());
  }
  return nullptr;
}

namespace {
// Whether row r is compiled for the call's (dtype, out dtype, head dim, mask).
bool same_key(const KernelRow& r, const flashcore_attention_params& p) {
  // (A window or chunk runs on the causal rows: core/variants.h.)
  return r.dtype == p.dtype && r.out_dtype == resolved_out_dtype(p.dtype, p.out_dtype) && r.head_dim == p.head_dim &&
         v_head_dim(r) == core::head_dim_v(p) && r.causal == core::masked_call(p) && r.kv_dtype == kv_dtype_of(p);
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
                           row.shape.block_m, static_cast<int>(core::head_dim_v(p)));
  }
  return split_plan(query_tiles(row, p), kernels::ceil_div(p.seqlen_k, row.shape.block_n), sms, p.batch * p.num_heads_q,
                    p.seqlen_q, static_cast<int>(core::head_dim_v(p)), p.num_splits);
}
}  // namespace

const KernelRow* decode_row(const flashcore_attention_params& p, int device, uint64_t workspace_capacity) {
  int sms = 0;
  if (core::sm_count(device, sms) != cudaSuccess) return nullptr;
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

namespace {
// Whether row r's kernel takes the call's variants: a variants row (TileShape::variants), and for a sliding window one
// with KernelConfig::kTakesWindow (causal, at most two consumer warpgroups).
bool takes_variants(const KernelRow& r, const flashcore_attention_params& p) {
  if (!r.shape.variants) return false;
  return !core::windowed_call(p) ||
         (r.causal && smem_plan(r.shape, static_cast<int>(r.head_dim), 2, 2, 2).consumer_warpgroups < 3);
}

core::WorkspaceLayout row_workspace(const KernelRow& row, const flashcore_attention_params& p, int sms,
                                   bool v_in_kernel);

// A call with a variant (a window, chunks, softcap or sinks) runs on its key's variants row (configs.txt "variants"), or on
// the kernel_config it names if that row takes them; nullptr and the reason otherwise. A dynamic variants row serves
// the calls whose workspace holds its counter and whose layout it takes (no paged K/V; packed batches only with 192
// rows: smem_plan.h), a one-CTA or static one the others (docs/decisions.md#variant-rows).
const KernelRow* variant_row(const flashcore_attention_params& p, uint64_t capacity, int sms, std::string& error) {
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  if (p.kernel_config != nullptr) {
    const KernelRow* named =
        select(p.dtype, out_dtype, static_cast<int>(p.head_dim), core::masked_call(p), p.kernel_config, p.seqlen_k,
               error, static_cast<int>(core::head_dim_v(p)));
    if (named == nullptr) {
      error += core::window_note(p);
      return nullptr;
    }
    if (takes_variants(*named, p)) return named;
    error = std::string("kernel config \"") + named->name + "\" takes no window, attention_chunk, softcap or sinks (the \"-var\" " +
            "configs do); name one of those or none";
    return nullptr;
  }
  const bool packed = p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr;
  const KernelRow* fallback = nullptr;
  for (const KernelRow* r : kRows) {
    if (!same_key(*r, p) || !takes_variants(*r, p)) continue;
    if (r->shape.schedule != Schedule::kDynamicPersistent) {
      if (fallback == nullptr) fallback = r;
      continue;
    }
    if ((p.block_table == nullptr || takes_paged(r->shape)) && (!packed || takes_packed(r->shape)) &&
        row_workspace(*r, p, sms, false).bytes <= capacity) {
      return r;
    }
  }
  if (fallback != nullptr) return fallback;
  error = std::string("no sm90 kernel with the attention variants (window, attention_chunk, softcap, sinks) is compiled for ") +
          dtype_name(p.dtype) + " head_dim = " + std::to_string(p.head_dim) +
          (core::masked_call(p) ? " causal" : " non-causal");
  return nullptr;
}
}  // namespace

const KernelRow* wave_row(const flashcore_attention_params& p, int device, const KernelRow* chosen,
                          uint64_t workspace_capacity) {
  // Only whole-tile non-causal rows of dense 16-bit calls: causal tiles differ in length (the dynamic schedule balances
  // them), packed and split calls have rows of their own.
  if (chosen == nullptr || chosen->causal || is_8bit(chosen->dtype) || p.cu_seqlens_q != nullptr ||
      p.cu_seqlens_k != nullptr || chosen->shape.schedule == Schedule::kSplitKv) {
    return chosen;
  }
  int sms = 0;
  if (core::sm_count(device, sms) != cudaSuccess || sms <= 0) return chosen;
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
  if (core::dram_peak_gbps(device, dram_gbps) != cudaSuccess) dram_gbps = 0;
  const int64_t tiles = kernels::ceil_div(p.seqlen_q, row.shape.block_m) * (p.num_heads_q / p.num_heads_kv);
  return v_transposed_in_kernel(static_cast<int>(row.head_dim), row.causal, tiles, dram_gbps);
}

// The workspace of a native call on `row` (core::WorkspaceLayout), its V route decided (`v_in_kernel`): split-KV
// partials (split_plan.h), an 8-bit call's head and, unless V comes transposed or the kernel transposes it, the
// transposed V; a dynamic row's tile counter in the head.
core::WorkspaceLayout split_workspace(const SplitPlan& s) {
  core::WorkspaceLayout l;
  l.o_partial = s.o_offset;
  l.lse_partial = s.lse_offset;
  l.bytes = s.bytes;
  return l;
}

core::WorkspaceLayout row_workspace(const KernelRow& row, const flashcore_attention_params& p, int sms,
                                   bool v_in_kernel) {
  core::WorkspaceLayout l;
  if (row.shape.schedule == Schedule::kSplitKv) {
    l = split_workspace(plan_for(row, p, sms));
  } else if (is_8bit(row.dtype)) {
    const bool vt_in_workspace = (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) == 0 && !v_in_kernel;
    l.vt = vt_in_workspace ? core::WorkspaceLayout::kHead : 0;
    l.bytes = core::WorkspaceLayout::kHead + (vt_in_workspace ? fp8_vt_bytes(p) : 0);
  } else if (row.shape.schedule == Schedule::kDynamicPersistent) {
    l.bytes = 16;  // one int counter, padded
  }
  return l;
}

flashcore_status no_row_status(const flashcore_attention_params& p) {
  return p.kernel_config != nullptr ? FLASHCORE_ERROR_INVALID_ARGUMENT : FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
}

// An e4m3 KV cache's row (configs_kv8.txt): the split row of the call's key, nullptr and the reason if none is
// compiled. A call of at most 8 dense query rows (after GQA packing) takes the transposed decode row where its head dim
// has one (decode_swap_kv8.cuh), the others the 64-row one.
const KernelRow* kv8_row(const flashcore_attention_params& p, std::string& error) {
  const bool swap = p.seqlen_q <= kSwapRows && p.cu_seqlens_q == nullptr;
  const KernelRow* tiles64 = nullptr;
  for (const KernelRow* r : kRows) {
    if (!same_key(*r, p)) continue;
    if (swaps_gemms(r->shape) == swap) return r;
    if (!swaps_gemms(r->shape) && tiles64 == nullptr) tiles64 = r;
  }
  if (tiles64 != nullptr) return tiles64;
  error = std::string("no sm90 kernel for an e4m3 KV cache (FLASHCORE_FLAG_KV_FP8_E4M3) is compiled for ") +
          dtype_name(p.dtype) + " head_dim = " + std::to_string(p.head_dim) +
          (core::masked_call(p) ? " causal" : " non-causal") + " (configs_kv8.txt: head dims 64, 128, 256)";
  return nullptr;
}

// An e4m3 KV cache's split: the decode rows' parts for a decode-shaped call (one block of at most 64 query rows, at
// least 8 key blocks of 128, dense queries) whose workspace holds the partials, else one part per tile, which writes
// O itself and needs no workspace.
SplitPlan kv8_split(const KernelRow& row, const flashcore_attention_params& p, int sms, uint64_t capacity) {
  if (p.seqlen_q <= 64 && kernels::ceil_div(p.seqlen_k, 128) >= 8 && p.num_splits != 1 && p.cu_seqlens_q == nullptr) {
    const SplitPlan parts = plan_for(row, p, sms);
    if (parts.bytes <= capacity) return parts;
  }
  SplitPlan one;
  one.splits = 1;
  one.blocks_per_split = static_cast<int>(std::max<int64_t>(1, kernels::ceil_div(p.seqlen_k, row.shape.block_n)));
  return one;
}

// The row a (native or quantized-key) call runs for a workspace of `capacity` bytes: the kernel_config it names;
// else the split-KV decode row (decode-shaped calls with a workspace), the packed rows (varlen), the tuning tables'
// choice, the default; then wave_row's smaller-tile or prefill split row.
const KernelRow* choose_row(const flashcore_attention_params& p, const core::Plan& plan, uint64_t capacity,
                            const core::TunedChoice tuned, std::string& error) {
  const bool workspace_given = capacity >= 16;  // the dynamic scheduler's counter
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  const int hd = static_cast<int>(p.head_dim), hd_v = static_cast<int>(core::head_dim_v(p));
  const bool causal = core::masked_call(p);
  // The attention variants run on the variants rows only (no split, packed or tuned row takes them).
  if (core::has_variant(p)) return variant_row(p, capacity, plan.sms, error);
  const KernelRow* row = nullptr;
  // Decode (one block of at most 64 query rows, a long key range): the split-KV row, when the call gives a
  // workspace for its partials. Tuning tables time whole-tile configs and come after it.
  if (p.kernel_config == nullptr && workspace_given) row = decode_row(p, plan.device, capacity);
  // Packed (varlen) queries: the packed rows of configs.txt (a dynamic persistent row where a workspace is given,
  // else one CTA per tile, balanced by the hardware across sequence lengths).
  if (p.kernel_config == nullptr && row == nullptr) row = varlen_row(p, workspace_given);
  // The tables' choice, when it is compiled or registered; should one be gone, the default runs. An 8-bit call's
  // entry (the key is the input dtype) serves both O dtypes; a 16-bit call writing O in another dtype has no table.
  // (A call whose V has a head dim of its own has no table: they are keyed by one head dim.)
  if (row == nullptr && p.kernel_config == nullptr && tuned != nullptr && (out_dtype == p.dtype || is_8bit(p.dtype)) &&
      hd_v == hd) {
    const char* name = tuned(plan.device, plan.cc, p.dtype, hd, causal, p.seqlen_q, p.seqlen_k, workspace_given);
    if (name != nullptr) row = select(p.dtype, out_dtype, hd, causal, name, p.seqlen_k, error);
    // Dynamic rows take no paged K/V, and those with two consumer warpgroups no packed one (smem_plan.h): such calls
    // take the default.
    const bool packed = p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr;
    if (row != nullptr && ((p.block_table != nullptr && !takes_paged(row->shape)) ||
                           (packed && !takes_packed(row->shape)))) {
      row = nullptr;
    }
    // A tuned prefill split row only with the workspace its partials need, a tuned 8-bit row only with the workspace
    // its V route needs (a caller may have sized it for the default row): else the default runs.
    if (row != nullptr && (splits_last_round(row->shape) || is_8bit(p.dtype)) &&
        row_workspace(*row, p, plan.sms, transposes_v_in_kernel(*row, p, plan.device)).bytes > capacity) {
      row = nullptr;
    }
  }
  if (row == nullptr) row = select(p.dtype, out_dtype, hd, causal, p.kernel_config, p.seqlen_k, error, hd_v);
  if (p.kernel_config == nullptr) row = wave_row(p, plan.device, row, capacity);
  return row;
}

// The sm90 plan (core::BackendOps::plan).
flashcore_status plan_call(const flashcore_attention_params& call, const core::PlanRequest& request, core::Plan& plan,
                           std::string& error) {
  flashcore_attention_params p = call;
  // A decode call with shared KV heads is packed (core/gqa_pack.h), unless it names a causal kernel config (the
  // packed call is non-causal, another key).
  // Not with a window or chunk (the packed call is non-causal) nor sinks (one per query head; a packed tile mixes
  // heads).
  plan.gqa_packed = core::gqa_packable(p) && (p.kernel_config == nullptr || p.causal == 0) && !is_8bit(p.dtype) &&
                    p.precision == FLASHCORE_PRECISION_NATIVE && p.local == 0 && p.attention_chunk == 0 &&
                    p.sinks == nullptr;
  if (plan.gqa_packed) p = core::gqa_packed(p);
  plan.precision = p.precision;
  // precision = FP8 / INT8: the quantized copies fill the workspace (precision.h), which the 8-bit row reads.
  core::WorkspaceLayout quantized;
  if (p.precision != FLASHCORE_PRECISION_NATIVE) {
    quantized = quantized_layout(p);
    p = quantized_key(p);
  }
  const bool kv8 = kv_dtype_of(p) != FLASHCORE_DTYPE_SAME;
  const KernelRow* row =
      kv8 ? kv8_row(p, error) : choose_row(p, plan, request.workspace_capacity, request.tuned, error);
  if (row == nullptr) return no_row_status(call);
  plan.row = row;
  plan.config = row->name;
  const bool split = row->shape.schedule == Schedule::kSplitKv;
  const SplitPlan parts = kv8     ? kv8_split(*row, p, plan.sms, request.workspace_capacity)
                          : split ? plan_for(*row, p, plan.sms)
                                  : SplitPlan{};
  plan.split = parts;
  if (const flashcore_status st = check_row(*row, p, plan, error); st != FLASHCORE_SUCCESS) return st;
  plan.append_kv = p.k_new != nullptr;
  plan.combine = split && plan.split.splits > 1 && !plan.split.fused_merge;
  if (call.precision == FLASHCORE_PRECISION_NATIVE) {
    plan.v_in_kernel = transposes_v_in_kernel(*row, p, plan.device);
    plan.workspace = split ? split_workspace(parts) : row_workspace(*row, p, plan.sms, plan.v_in_kernel);
    plan.v_pass = plan.workspace.vt != 0;
  } else {
    plan.workspace = quantized;  // FP8: the quantization writes the transposed V; INT8: V is read as given
    plan.lse_shift = call.precision == FLASHCORE_PRECISION_INT8 && call.lse != nullptr;
  }
  return FLASHCORE_SUCCESS;
}

// The sm90 run (core::BackendOps::run): what the plan says, in stream order.
flashcore_status run_call(const core::Plan& plan, const flashcore_attention_params& call, float softmax_scale,
                          cudaStream_t stream, std::string& error) {
  const flashcore_attention_params p = plan.gqa_packed ? core::gqa_packed(call) : call;
  char* ws = static_cast<char*>(p.workspace);
  if (plan.precision == FLASHCORE_PRECISION_NATIVE) {
    // 8-bit V: given transposed, or transposed into the workspace by the plan's pass.
    const uint8_t* vt = nullptr;
    if ((p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0) {
      vt = static_cast<const uint8_t*>(p.v);
    } else if (plan.v_pass) {
      vt = reinterpret_cast<uint8_t*>(ws + plan.workspace.vt);
    }
    return launch_row(plan, p, softmax_scale, vt, stream, error);
  }
  const char* what = plan.precision == FLASHCORE_PRECISION_INT8 ? "precision = INT8" : "precision = FP8";
  if (p.workspace == nullptr || p.workspace_size < plan.workspace.bytes) {
    const char* holds =
        plan.precision == FLASHCORE_PRECISION_INT8 ? "the int8 copies of Q and K" : "the e4m3 copies of Q, K and V";
    error = std::string(what) + " needs " + std::to_string(plan.workspace.bytes) + " bytes of workspace for " + holds +
            " (flashcore_attention_workspace_size); workspace_size = " + std::to_string(p.workspace_size);
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const flashcore_attention_params q = quantized_call(p, plan.workspace);
  if (plan.precision == FLASHCORE_PRECISION_FP8) {
    const kernels::Fp8PrepParams prep = fp8_quantize_params(p, plan.workspace);
    if (const cudaError_t err = launch_fp8_quantize(prep, p.dtype, stream); err != cudaSuccess) {
      error = core::cuda_message("FP8 quantization launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
    return launch_row(plan, q, softmax_scale, prep.vt, stream, error);
  }
  const kernels::Int8PrepParams prep = int8_prep_params(p, plan.workspace, softmax_scale);
  if (const cudaError_t err = launch_int8_quantize(prep, p.dtype, stream); err != cudaSuccess) {
    error = core::cuda_message("INT8 quantization launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  if (const flashcore_status st = launch_row(plan, q, softmax_scale, nullptr, stream, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (plan.lse_shift) {
    if (const cudaError_t err = launch_int8_lse_shift(prep, plan.sms, stream); err != cudaSuccess) {
      error = core::cuda_message("INT8 LSE shift launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }
  return FLASHCORE_SUCCESS;
}

bool has_image(int cc) { return cc == 90; }
void archs(std::vector<int>& out) { out.push_back(90); }  // sm_90a

void listed_rows(int /*cc*/, std::vector<core::RowInfo>& out) {
  auto add = [&](const KernelRow& r, bool variant) {
    out.push_back({r.name, r.dtype, r.out_dtype, r.head_dim, r.causal, r.is_default, r.smem_bytes, variant,
                   v_head_dim(r)});
  };
  for (const KernelRow* r : kRows) {  // (the e4m3 KV-cache rows are no config a call names: kv8_row)
    if (r->kv_dtype == FLASHCORE_DTYPE_SAME) add(*r, false);
  }
  for (const KernelRow* r : registered_rows()) add(*r, true);  // then the runtime variants registered (variant.h)
}

const char* default_config(int /*cc*/, flashcore_dtype dtype, flashcore_dtype out, int head_dim, bool causal) {
  std::string ignored;
  const KernelRow* r = select(dtype, out, head_dim, causal, nullptr, INT64_MAX, ignored);
  return r != nullptr ? r->name : nullptr;
}

bool config_available(int /*cc*/, flashcore_dtype dtype, flashcore_dtype out, int head_dim, bool causal,
                      const char* name, bool* needs_ws) {
  std::string ignored;
  const KernelRow* row = select(dtype, out, head_dim, causal, name, INT64_MAX, ignored);
  if (row != nullptr && needs_ws != nullptr) *needs_ws = needs_workspace(*row);
  return row != nullptr;
}

}  // namespace

flashcore_status check_row(const KernelRow& row, const flashcore_attention_params& p, const core::Plan& plan,
                           std::string& error) {
  const bool paged = p.block_table != nullptr;
  if (paged && std::gcd<int64_t>(p.page_size, row.shape.block_n) % 16 != 0) {
    error = "page_size = " + std::to_string(p.page_size) + " and kernel config \"" + row.name + "\" (key block " +
            std::to_string(row.shape.block_n) + ") share no 16-row slice";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if ((paged && !takes_paged(row.shape)) ||
      ((p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr) && !takes_packed(row.shape))) {
    error = std::string("kernel config \"") + row.name + "\" (" +
            (splits_last_round(row.shape) ? "prefill split-KV" : "dynamic schedule") + ") has no " +
            (paged ? "paged" : "packed (varlen)") + " path; name another config or none";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const int64_t tiles = query_tiles(row, p);
  if (tiles > kMaxTileIndex) {
    error = "batch * num_heads_q * ceil(seqlen_q / " + std::to_string(row.shape.block_m) + ") = " +
            std::to_string(tiles) + " exceeds the tile limit 2^31-4097";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  if (row.shape.schedule == Schedule::kSplitKv) {
    if (splits_last_round(row.shape) && !plan.split.last_round) {
      error = std::string("kernel config \"") + row.name + "\" (prefill split-KV) runs on at most " +
              std::to_string(kSplitCounterTiles) + " SMs; this device has " + std::to_string(plan.sms);
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (!plan.split.last_round && tiles * plan.split.splits > kMaxTileIndex) {  // (last_round_plan bounds its own)
      error = "the split-KV grid (" + std::to_string(tiles) + " tiles x " + std::to_string(plan.split.splits) +
              " splits) exceeds the tile limit 2^31-4097";
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  return FLASHCORE_SUCCESS;
}

bool backward_compiled(flashcore_dtype dtype, int head_dim, int head_dim_v, bool variants) {
  const BwdKernelRow* row = find_bwd_row(dtype, head_dim, head_dim_v);
  return row != nullptr && (!variants || row->kernel[1][0] != nullptr);
}
uint64_t backward_workspace(const flashcore_attention_params& p) { return bwd_workspace(p).bytes; }

const core::BackendOps kBackend = {"sm90",           90,       90, has_image, archs, listed_rows, default_config,
                                   config_available, plan_call, run_call, backward_compiled, backward_workspace,
                                   backward};

}  // namespace flashcore::sm90

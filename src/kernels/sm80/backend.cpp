// Host side of the portable (sm80) backend: the generated kernel rows, their selection for a device (by its
// shared-memory limit), the kernel parameters and the launch.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/launch_util.h"
#include "core/plan.h"
#include "core/variants.h"
#include "kernels/common/tile_math.h"
#include "kernels/sm80/bwd_launch.h"
#include "kernels/sm80/image_rule.h"
#include "kernels/sm80/kernel_params.h"
#include "kernels/sm80/launch.h"

#ifndef FLASHCORE_SM80_ARCH_LIST
#error "FLASHCORE_SM80_ARCH_LIST (e.g. 80,86,89,90) must be defined by the build (src/kernels/sm80/sources.cmake)"
#endif
#ifndef FLASHCORE_SM80_PTX_ARCH
#error "FLASHCORE_SM80_PTX_ARCH (e.g. 90, or 0 without PTX) must be defined by the build (src/kernels/sm80/sources.cmake)"
#endif

namespace flashcore::sm80 {

#define FLASHCORE_SM80_ROW(SYM) extern const KernelRow kRow_##SYM;
#include "kernels/sm80/rows.inc"
#undef FLASHCORE_SM80_ROW

namespace {

const KernelRow* const kRows[] = {
#define FLASHCORE_SM80_ROW(SYM) &kRow_##SYM,
#include "kernels/sm80/rows.inc"
#undef FLASHCORE_SM80_ROW
};

constexpr int kArchs[] = {FLASHCORE_SM80_ARCH_LIST};
// The arch of the PTX embedded beside the SASS (FLASHCORE_SM80_PTX: the newest of kArchs), 0 when there is none.
constexpr int kPtxArch = FLASHCORE_SM80_PTX_ARCH;

// Once per (kernel, context): check that the loaded image was compiled for this device's major version (a
// body built for another arch would trap) and raise the kernel's dynamic shared-memory limit (> 48 KB needs
// the opt-in). Both are per-context state, so a cudaDeviceReset (a new context) re-runs them.
flashcore_status prepare(const KernelRow& row, int device, int cc, std::string& error) {
  return core::prepare_kernel(row.kernel, device, row.smem_bytes, "portable (sm80) kernel image",
                             [cc](const cudaFuncAttributes& a) {
    if (a.binaryVersion / 10 == cc / 10 && a.binaryVersion <= cc) return std::string();
    // A kernel the driver JIT-compiled from the PTX reports the device's own arch.
    return "the loaded portable kernel image is for sm_" + std::to_string(a.binaryVersion) +
           ", which cannot serve compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
           ": rebuild FlashCore with the device's arch in FLASHCORE_SM80_ARCHS";
  }, error);
}

TensorRef tensor_ref(const void* ptr, const flashcore_tensor_strides& s) {
  return {ptr, s.batch, s.seq, s.head};
}

}  // namespace

const KernelRow* const* rows(int& count) {
  count = static_cast<int>(sizeof(kRows) / sizeof(kRows[0]));
  return kRows;
}

const int* compiled_archs(int& count) {
  count = static_cast<int>(sizeof(kArchs) / sizeof(kArchs[0]));
  return kArchs;
}

bool has_image_for(int cc) { return image_runs_on(cc, kArchs, sizeof(kArchs) / sizeof(kArchs[0]), kPtxArch); }

int ptx_arch() { return kPtxArch; }

int smem_limit(int cc) {
  switch (cc) {
    case 80:
    case 87: return 163 * 1024;
    case 90: return 227 * 1024;
    default: return 99 * 1024;  // 8.6, 8.9
  }
}

bool fits(const KernelRow& row, int cc) { return row.smem_bytes <= smem_limit(cc); }

int ctas_per_sm(const KernelRow& row, int cc) {
  // Shared memory per SM (the per-block limit plus the 1 KB the hardware reserves per block), less 1 KB per block;
  // registers: 64 K per SM, at most 255 (allocated as 256) per thread, which every portable kernel approaches.
  const int smem_per_sm = smem_limit(cc) + 1024;
  const int by_smem = smem_per_sm / (row.smem_bytes + 1024);
  const int by_regs = 65536 / (row.threads * 256);
  return std::min(by_smem, by_regs);
}

const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, int cc, int64_t seqlen_k, std::string& error, int head_dim_v) {
  if (head_dim_v == 0) head_dim_v = head_dim;
  std::string names;
  const KernelRow* best = nullptr;
  for (const KernelRow* r : kRows) {
    if (r->dtype != dtype || r->out_dtype != out_dtype || r->head_dim != head_dim || r->head_dim_v != head_dim_v ||
        r->causal != causal) {
      continue;
    }
    if (config != nullptr && std::strcmp(config, r->name) == 0) {
      if (fits(*r, cc)) return r;
      error = std::string("kernel_config = \"") + config + "\" needs " + std::to_string(r->smem_bytes) +
              " bytes of shared memory per block; compute capability " + std::to_string(cc / 10) + "." +
              std::to_string(cc % 10) + " allows " + std::to_string(smem_limit(cc));
      return nullptr;
    }
    if (!fits(*r, cc)) continue;
    // The first default candidate that fits and whose conditions the call and the device meet.
    if (config == nullptr && r->is_default && best == nullptr &&
        (r->max_seqlen_k == 0 || seqlen_k <= r->max_seqlen_k) && ctas_per_sm(*r, cc) >= r->min_ctas_per_sm) {
      best = r;
    }
    names += (names.empty() ? "" : ", ") + std::string(r->name);
  }
  if (best != nullptr) return best;
  if (config != nullptr) {
    error = std::string("kernel_config = \"") + config + "\" is not compiled for " + dtype_name(dtype) +
            " head_dim = " + std::to_string(head_dim) +
            (head_dim_v != head_dim ? " head_dim_v = " + std::to_string(head_dim_v) : std::string()) +
            (causal ? " causal" : " non-causal") + " (portable backend); compiled: " + (names.empty() ? "none" : names);
  } else {
    error = std::string("no portable (sm80) kernel is compiled for ") + dtype_name(dtype) + " -> " +
            dtype_name(out_dtype) + " head_dim = " + std::to_string(head_dim) + " that fits compute capability " +
            std::to_string(cc / 10) + "." + std::to_string(cc % 10);
  }
  return nullptr;
}

flashcore_status launch(const KernelRow& row, const flashcore_attention_params& p, float softmax_scale, int device,
                        int cc, cudaStream_t stream, std::string& error) {
  const long long m_blocks = kernels::ceil_div(p.seqlen_q, row.shape.block_m);
  const long long tiles = m_blocks * p.num_heads_q * p.batch;  // at most 2^31-1 (the plan's check)
  FwdParams fp{};
  fp.q = tensor_ref(p.q, p.q_strides);
  fp.k = tensor_ref(p.k, p.k_strides);
  fp.v = tensor_ref(p.v, p.v_strides);
  fp.o = tensor_ref(p.o, p.o_strides);
  fp.lse = p.lse;
  fp.seqlen_q = p.seqlen_q;
  fp.seqlen_k = p.seqlen_k;
  fp.num_heads_q = static_cast<int>(p.num_heads_q);
  fp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  fp.num_m_blocks = static_cast<int>(m_blocks);
  fp.num_tiles = static_cast<int>(tiles);
  core::tile_order(p, m_blocks, fp.num_slices, fp.section_slices);
  fp.scale_log2 = core::set_variants(fp, p, softmax_scale);

  core::set_serving_layout(fp, p);  // seqused_k, packed, paged (one batch entry of total rows, or the pages)

  if (const flashcore_status st = prepare(row, device, cc, error); st != FLASHCORE_SUCCESS) return st;

  // New K/V rows go into the cache first, on the same stream.
  if (const flashcore_status st = core::append_new_kv(p, device, stream, fp, error); st != FLASHCORE_SUCCESS) return st;

  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(tiles));
  config.blockDim = dim3(static_cast<unsigned>(row.threads));
  config.dynamicSmemBytes = static_cast<size_t>(row.smem_bytes);
  config.stream = stream;
  void* args[] = {&fp};
  // The launch's own status: unlike cudaGetLastError, it neither reports nor clears an earlier, unrelated error.
  const cudaError_t err = cudaLaunchKernelExC(&config, row.kernel, args);
  if (err != cudaSuccess) {
    error = core::cuda_message("kernel launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

namespace {

// The portable plan (core::BackendOps::plan): the row select() picks for the device; no workspace.
flashcore_status plan_call(const flashcore_attention_params& p, const core::PlanRequest& /*request*/, core::Plan& plan,
                           std::string& error) {
  if (p.precision != FLASHCORE_PRECISION_NATIVE) {
    error = std::string(p.precision == FLASHCORE_PRECISION_INT8 ? "precision = INT8" : "precision = FP8") +
            " needs the sm90 backend (Hopper); this device is served by sm80";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const KernelRow* row = select(p.dtype, resolved_out_dtype(p.dtype, p.out_dtype), static_cast<int>(p.head_dim),
                                core::masked_call(p), p.kernel_config, plan.cc, p.seqlen_k, error,
                                static_cast<int>(core::head_dim_v(p)));
  if (row == nullptr) {
    if (p.kernel_config != nullptr) error += core::window_note(p);
    return p.kernel_config != nullptr ? FLASHCORE_ERROR_INVALID_ARGUMENT : FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  // One CTA per query tile: the grid's x dimension holds at most 2^31-1 of them.
  const long long tiles = kernels::ceil_div(p.seqlen_q, row->shape.block_m) * p.num_heads_q * p.batch;
  if (tiles > 0x7fffffffLL) {
    error = "batch * num_heads_q * ceil(seqlen_q / " + std::to_string(row->shape.block_m) + ") = " +
            std::to_string(tiles) + " exceeds the grid limit 2^31-1";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  plan.row = row;
  plan.config = row->name;
  plan.append_kv = p.k_new != nullptr;
  return FLASHCORE_SUCCESS;
}

flashcore_status run_call(const core::Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                          cudaStream_t stream, std::string& error) {
  return launch(*static_cast<const KernelRow*>(plan.row), p, softmax_scale, plan.device, plan.cc, stream, error);
}

void archs(std::vector<int>& out) { out.insert(out.end(), std::begin(kArchs), std::end(kArchs)); }

void listed_rows(int cc, std::vector<core::RowInfo>& out) {
  for (const KernelRow* r : kRows) {
    if (cc != 0 && !fits(*r, cc)) continue;  // cannot launch there
    out.push_back({r->name, r->dtype, r->out_dtype, r->head_dim, r->causal, r->is_default, r->smem_bytes, false,
                   r->head_dim_v});
  }
}

const char* default_config(int cc, flashcore_dtype dtype, flashcore_dtype out, int head_dim, bool causal) {
  std::string ignored;
  const KernelRow* r = select(dtype, out, head_dim, causal, nullptr, cc, INT64_MAX, ignored);
  return r != nullptr ? r->name : nullptr;
}

bool config_available(int cc, flashcore_dtype dtype, flashcore_dtype out, int head_dim, bool causal, const char* name,
                      bool* needs_workspace) {
  std::string ignored;
  if (select(dtype, out, head_dim, causal, name, cc, INT64_MAX, ignored) == nullptr) return false;
  if (needs_workspace != nullptr) *needs_workspace = false;
  return true;
}

}  // namespace

// Served by default: 8.x and every newer capability that is not Hopper's (the table asks sm90 first; 10.x and 12.x
// run the PTX where it is compiled in, has_image_for). The backward's hooks (bwd_launch.h): the device's row is
// chosen at launch, by its shared memory; one workspace layout serves every row.
const core::BackendOps kBackend = {"sm80", 80, kMaxServedCc, has_image_for, archs, listed_rows, default_config,
                                   config_available, plan_call, run_call, bwd_compiled, bwd_workspace_bytes,
                                   backward};

}  // namespace flashcore::sm80

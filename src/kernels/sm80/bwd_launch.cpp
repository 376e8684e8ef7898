// The portable backward's launches (bwd_launch.h): D and the scaled LSE (kernels/common/bwd_prep.cuh), the kernel
// (bwd_kernel.cuh), the dQ conversion and, with sinks and dsinks, dL/dsinks, on one stream. The workspace is laid out as the sm90 backward's (the same
// preparation and conversion kernels read it): the scaled LSE and D rows, the fp32 dQ blocks, the ordering counters.
#include "kernels/sm80/bwd_launch.h"

#include <climits>
#include <cmath>
#include <string>

#include "core/dtype.h"
#include "core/launch_util.h"
#include "core/variants.h"
#include "kernels/common/bwd_layout.h"
#include "kernels/common/bwd_prep_params.h"
#include "kernels/sm80/bwd_params.h"
#include "kernels/sm80/launch.h"

// The generated units' rows: FLASHCORE_SM80_BWD(NAME) per compiled (dtype, head dim, tile), largest tile first.
#define FLASHCORE_SM80_BWD(NAME) extern const BwdKernelRow kBwd_##NAME;
namespace flashcore::sm80 {
#include "kernels/sm80/bwd_rows.inc"
}  // namespace flashcore::sm80
#undef FLASHCORE_SM80_BWD

namespace flashcore::sm80 {
namespace {

#define FLASHCORE_SM80_BWD(NAME) &kBwd_##NAME,
const BwdKernelRow* const kBwdRows[] = {
#include "kernels/sm80/bwd_rows.inc"
    nullptr};
#undef FLASHCORE_SM80_BWD

constexpr int kBlockM = 64;  // the workspace's dQ blocks (a kernel's step: one or two)

using kernels::BwdWorkspace;
BwdWorkspace bwd_workspace(const flashcore_attention_params& p) { return kernels::bwd_workspace_of(p); }

// Once per (kernel, context): the loaded image must be one of this device's major version (as the forward's).
flashcore_status prepare(const void* kernel, int device, int cc, int smem_bytes, std::string& error) {
  return core::prepare_kernel(kernel, device, smem_bytes, "portable (sm80) backward kernel image",
                              [cc](const cudaFuncAttributes& a) {
    if (a.binaryVersion / 10 == cc / 10 && a.binaryVersion <= cc) return std::string();
    return "the loaded portable backward kernel image is for sm_" + std::to_string(a.binaryVersion) +
           ", which cannot serve compute capability " + std::to_string(cc / 10) + "." + std::to_string(cc % 10) +
           ": rebuild FlashCore with the device's arch in FLASHCORE_SM80_ARCHS";
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

kernels::TensorRef tensor_ref(const void* ptr, const flashcore_tensor_strides& s) {
  return {ptr, s.batch, s.seq, s.head};
}

}  // namespace

bool bwd_compiled(flashcore_dtype dtype, int head_dim, int head_dim_v, bool /*variants: every row's 64-row tile*/) {
  if (head_dim_v != head_dim) return false;  // (one head dim for Q, K and V)
  for (const BwdKernelRow* row : kBwdRows) {
    if (row != nullptr && row->dtype == dtype && row->head_dim == head_dim) return true;
  }
  return false;
}

const BwdKernelRow* find_bwd_row(flashcore_dtype dtype, int head_dim, int cc, bool variants) {
  for (const BwdKernelRow* row : kBwdRows) {
    if (row != nullptr && row->dtype == dtype && row->head_dim == head_dim && row->smem_bytes <= smem_limit(cc) &&
        row->kernel[variants ? 1 : 0][0] != nullptr) {
      return row;
    }
  }
  return nullptr;
}

uint64_t bwd_workspace_bytes(const flashcore_attention_params& p) { return bwd_workspace(p).bytes; }

flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                          std::string& error) {
  int major = 0, minor = 0;
  if (cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      err != cudaSuccess || (err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
                                cudaSuccess) {
    error = core::cuda_message("cannot query the device's compute capability", err);
    return FLASHCORE_ERROR_CUDA;
  }
  const int cc = 10 * major + minor;
  if (p.cu_seqlens_q != nullptr) {
    error = "cu_seqlens_q is set: the portable (sm80) backend's backward takes dense batches only in this version (the "
            "sm90 backend's takes packed ones)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  // Calls with a window or softcap run the variants' kernels; a windowed call runs the causal one (core/variants.h).
  const bool variants = core::windowed_call(p) || p.softcap != 0.f;
  const BwdKernelRow* row = find_bwd_row(p.dtype, static_cast<int>(p.head_dim), cc, variants);
  if (row == nullptr) {
    error = std::string("no portable (sm80) backward kernel compiled for dtype ") + dtype_name(p.dtype) +
            " and head_dim " + std::to_string(p.head_dim) + " that fits compute capability " +
            std::to_string(major) + "." + std::to_string(minor);
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  const int64_t n_blocks = (p.seqlen_k + row->block_n - 1) / row->block_n;
  // The workspace's 64-row blocks, whole kernel steps of block_m rows (the workspace's size, bwd_padded_rows, covers
  // steps of 128).
  const int64_t m_blocks = (p.seqlen_q + row->block_m - 1) / row->block_m * (row->block_m / kBlockM);
  // Grid y and z: KV heads and batch entries (the query grid: query heads and batch entries).
  if (p.num_heads_q > 65535 || p.batch > 65535 || n_blocks > 0x7fffffffLL || m_blocks > 0x7fffffffLL) {
    error = "the backward's grids take at most 65535 heads and batch entries (num_heads_q = " +
            std::to_string(p.num_heads_q) + ", batch = " + std::to_string(p.batch) + ")";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  const void* kernel = row->kernel[variants ? 1 : 0][core::masked_call(p) ? 1 : 0];
  for (const void* k : {row->prep, kernel, row->dq_convert, row->dsinks}) {
    const int smem = k == kernel ? row->smem_bytes : 0;
    if (const flashcore_status st = prepare(k, device, cc, smem, error); st != FLASHCORE_SUCCESS) return st;
  }
  const BwdWorkspace ws = bwd_workspace(p);
  char* base = static_cast<char*>(p.workspace);

  BwdParams bp{};
  bp.q = tensor_ref(p.q, p.q_strides);
  bp.k = tensor_ref(p.k, p.k_strides);
  bp.v = tensor_ref(p.v, p.v_strides);
  bp.dout = tensor_ref(p.dout, p.dout_strides);
  bp.lse_log2 = reinterpret_cast<const float*>(base + ws.lse);
  bp.dpsum = reinterpret_cast<const float*>(base + ws.dpsum);
  bp.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  bp.dq_semaphore = p.deterministic != 0 ? reinterpret_cast<int*>(base + ws.semaphore) : nullptr;
  kernels::set_dkdv_outputs(bp, p);
  bp.seqlen_q = static_cast<int>(p.seqlen_q);
  bp.seqlen_k = static_cast<int>(p.seqlen_k);
  // Rows per (batch, head) of the workspace's arrays: whole 64-row steps, as the kernel's dQ blocks (index *
  // kBlockM rows) assume; the workspace's size (bwd_padded_rows: whole 128-row steps) covers them.
  bp.seqlen_q_pad = static_cast<int>(m_blocks * kBlockM);
  bp.num_heads_q = static_cast<int>(p.num_heads_q);
  bp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  bp.num_m_blocks = static_cast<int>(m_blocks);
  bp.scale_log2 = core::set_variants(bp.var, p, softmax_scale);
  bp.softmax_scale = softmax_scale;
  const int diagonal = bp.seqlen_k - bp.seqlen_q;
  bp.rel_hi = diagonal + (variants ? bp.var.window_right : 0);  // (32 bits: validation bounds windowed lengths)
  bp.rel_lo = variants && bp.var.window_left >= 0 ? diagonal - bp.var.window_left : INT_MIN;

  // Dense batches: the sm90 layout of the workspace's rows (kernels/common/bwd_layout.h), which the kernel reads.
  kernels::BwdRows rows{};
  rows.seqlen_q = p.seqlen_q;
  rows.seqlen_k = p.seqlen_k;
  rows.head_rows = bp.seqlen_q_pad;
  rows.heads = bp.num_heads_q;
  kernels::BwdPrepParams prep =
      kernels::bwd_prep_params_of(p, ws, base, rows, bp.num_m_blocks, bp.var, variants, core::masked_call(p),
                                  row->block_n, row->block_m, /*descending=*/false);
  kernels::BwdDqParams conv = kernels::bwd_dq_params_of(p, ws, base, rows, softmax_scale);
  const bool dsinks = prep.sinks != nullptr;

  const dim3 q_grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_heads_q),
                    static_cast<unsigned>(p.batch));
  const dim3 kv_grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(p.num_heads_kv),
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
      st != FLASHCORE_SUCCESS || !dsinks) {
    return st;
  }
  kernels::BwdDsinksParams ds{prep.dsink_part, p.dsinks, rows, static_cast<int>(p.batch), bp.num_m_blocks};
  return launch(row->dsinks, dim3(static_cast<unsigned>(p.num_heads_q)), 256, 0, &ds, stream,
                "backward dsinks launch failed", error);
}

}  // namespace flashcore::sm80

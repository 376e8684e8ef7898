// The backend table (backend.h). Each backend serves a set of compute capabilities and lists its compiled
// kernel rows: sm90 (Hopper, compute capability 9.0: wgmma + TMA) and, when built (FLASHCORE_BUILD_SM80), the
// portable sm80 backend (mma.sync + cp.async + ldmatrix) for compute capability 8.x -- and for 9.0 when
// FLASHCORE_BACKEND=sm80 forces it (backend.h).
#include "api/backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "api/dtype.h"
#include "api/gqa_pack.h"
#include "api/launch_util.h"
#include "api/tuning.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/smem_plan.h"
#ifdef FLASHCORE_HAVE_SM80
#include "kernels/sm80/launch.h"
#endif

namespace flashcore::backend {
namespace {

enum class Id { kSm90, kSm80 };

struct Backend {
  const char* name;
  Id id;
  int cc_min, cc_max;  // compute capabilities served by default, inclusive
};

constexpr Backend kBackends[] = {
    {"sm90", Id::kSm90, 90, 90},
#ifdef FLASHCORE_HAVE_SM80
    {"sm80", Id::kSm80, 80, 89},  // and 90 when forced (FLASHCORE_BACKEND=sm80)
#endif
};

// A backend's view of one compiled kernel, for the listings that do not depend on the backend.
struct RowKey {
  const char* name;
  flashcore_dtype dtype, out_dtype;
  int head_dim;
  bool causal, is_default;
  int smem_bytes;
};

std::vector<RowKey> rows_of(Id id) {
  std::vector<RowKey> out;
  int n = 0;
  if (id == Id::kSm90) {
    const sm90::KernelRow* const* rows = sm90::rows(n);
    for (int i = 0; i < n; ++i) {
      const sm90::KernelRow& r = *rows[i];
      out.push_back({r.name, r.dtype, r.out_dtype, r.head_dim, r.causal, r.is_default, r.smem_bytes});
    }
  }
#ifdef FLASHCORE_HAVE_SM80
  if (id == Id::kSm80) {
    const sm80::KernelRow* const* rows = sm80::rows(n);
    for (int i = 0; i < n; ++i) {
      const sm80::KernelRow& r = *rows[i];
      out.push_back({r.name, r.dtype, r.out_dtype, r.head_dim, r.causal, r.is_default, r.smem_bytes});
    }
  }
#endif
  return out;
}

// True when backend `b` has a kernel image that runs on compute capability `cc`.
bool has_image(const Backend& b, int cc) {
#ifdef FLASHCORE_HAVE_SM80
  if (b.id == Id::kSm80) return sm80::has_image_for(cc);
#endif
  return b.id == Id::kSm90 && cc == 90;
}

const Backend* by_name(const char* name) {
  for (const Backend& b : kBackends) {
    if (std::strcmp(b.name, name) == 0) return &b;
  }
  return nullptr;
}

const Backend* find(int cc) {
  const char* forced = forced_backend();
  if (forced != nullptr) {
    // A forced backend serves what it has an image for: sm80 on 8.x and (with its sm_90 image) on 9.0.
    const Backend* b = by_name(forced);
    return b != nullptr && has_image(*b, cc) ? b : nullptr;
  }
  for (const Backend& b : kBackends) {
    if (cc >= b.cc_min && cc <= b.cc_max && has_image(b, cc)) return &b;
  }
  return nullptr;
}

}  // namespace

const char* forced_backend() {
  const char* env = std::getenv("FLASHCORE_BACKEND");
  if (env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0) return nullptr;
  return env;
}

bool is_compiled(flashcore_dtype dtype, int head_dim) {
  for (const Backend& b : kBackends) {
    for (const RowKey& r : rows_of(b.id)) {
      if (r.dtype == dtype && r.head_dim == head_dim) return true;
    }
  }
  return false;
}

int compiled_head_dims(flashcore_dtype dtype, int* out, int capacity) {
  std::vector<int> dims;
  for (const Backend& b : kBackends) {
    for (const RowKey& r : rows_of(b.id)) {
      if (dtype == FLASHCORE_DTYPE_SAME || r.dtype == dtype) dims.push_back(r.head_dim);
    }
  }
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(dims.size()); ++i) out[i] = dims[i];
  return static_cast<int>(dims.size());
}

int compiled_archs(int* out, int capacity) {
  std::vector<int> archs;
  for (const Backend& b : kBackends) {
    if (b.id == Id::kSm90) archs.push_back(90);  // sm_90a
#ifdef FLASHCORE_HAVE_SM80
    if (b.id == Id::kSm80) {
      int n = 0;
      const int* a = sm80::compiled_archs(n);
      archs.insert(archs.end(), a, a + n);
    }
#endif
  }
  std::sort(archs.begin(), archs.end());
  archs.erase(std::unique(archs.begin(), archs.end()), archs.end());
  for (int i = 0; out != nullptr && i < capacity && i < static_cast<int>(archs.size()); ++i) out[i] = archs[i];
  return static_cast<int>(archs.size());
}

const char* backend_for_arch(int cc) {
  const Backend* b = find(cc);
  return b != nullptr ? b->name : nullptr;
}

int kernel_configs(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char** names, int capacity) {
  // The rows whose O is in the dtype's default output dtype (the input dtype; bf16 for 8-bit inputs; 8-bit configs are
  // compiled for both 16-bit outputs with the same names).
  const flashcore_dtype out = resolved_out_dtype(dtype, FLASHCORE_DTYPE_SAME);
  const Backend* b = find(cc);
  if (b == nullptr) return 0;
  std::vector<RowKey> rows = rows_of(b->id);
  if (b->id == Id::kSm90) {  // then the runtime variants registered so far (kernels/sm90/variant.h)
    for (const sm90::KernelRow* r : sm90::registered_rows()) {
      rows.push_back({r->name, r->dtype, r->out_dtype, r->head_dim, r->causal, r->is_default, r->smem_bytes});
    }
  }
  // The default first: the row forward() picks when no kernel_config is given.
  const char* def = nullptr;
  std::string ignored;
  if (b->id == Id::kSm90) {
    const sm90::KernelRow* r = sm90::select(dtype, out, head_dim, causal, nullptr, INT64_MAX, ignored);
    def = r != nullptr ? r->name : nullptr;
  }
#ifdef FLASHCORE_HAVE_SM80
  if (b->id == Id::kSm80) {
    const sm80::KernelRow* r = sm80::select(dtype, out, head_dim, causal, nullptr, cc, INT64_MAX, ignored);
    def = r != nullptr ? r->name : nullptr;
  }
#endif
  int count = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (const RowKey& r : rows) {
      if (r.dtype != dtype || r.out_dtype != out || r.head_dim != head_dim || r.causal != causal) continue;
      const bool is_def = def != nullptr && std::strcmp(r.name, def) == 0;
      if (is_def != (pass == 0)) continue;
#ifdef FLASHCORE_HAVE_SM80
      if (b->id == Id::kSm80 && r.smem_bytes > sm80::smem_limit(cc)) continue;  // cannot launch here
#endif
      if (names != nullptr && count < capacity) names[count] = r.name;
      ++count;
    }
  }
  return count;
}

namespace {
flashcore_status no_row_status(const flashcore_attention_params& p) {
  return p.kernel_config != nullptr ? FLASHCORE_ERROR_INVALID_ARGUMENT : FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
}

const Backend* backend_or_error(int cc, std::string& error) {
  const Backend* b = find(cc);
  if (b == nullptr) error = "no backend serves compute capability " + std::to_string(cc);
  return b;
}

// The row a call runs (backend.h: the config a call runs): one of sm90 / sm80 is set.
struct Selected {
  const char* name = nullptr;
  const sm90::KernelRow* sm90 = nullptr;
#ifdef FLASHCORE_HAVE_SM80
  const sm80::KernelRow* sm80 = nullptr;
#endif
};

// `workspace_capacity`: bytes of workspace the call passes (forward), or UINT64_MAX when asking what a caller who
// allocates the reported size gets (workspace_size).
// The call the sm90 kernels run: a decode call with shared KV heads is packed (api/gqa_pack.h), unless it names a
// causal kernel config (the packed call is non-causal, another key); the portable backend runs calls as given.
flashcore_attention_params as_run(const flashcore_attention_params& p, int cc) {
  const Backend* b = find(cc);
  const bool pack = b != nullptr && b->id == Id::kSm90 && api::gqa_packable(p) &&
                    (p.kernel_config == nullptr || p.causal == 0) && !is_8bit(p.dtype) &&
                    p.precision == FLASHCORE_PRECISION_NATIVE;
  return pack ? api::gqa_packed(p) : p;
}

flashcore_status select_row(const flashcore_attention_params& p, int device, int cc, uint64_t workspace_capacity,
                            Selected& out, std::string& error) {
  const bool workspace_given = workspace_capacity >= 16;  // the dynamic scheduler's counter
  const Backend* b = backend_or_error(cc, error);
  if (b == nullptr) return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  const int hd = static_cast<int>(p.head_dim);
  const bool causal = p.causal != 0;
#ifdef FLASHCORE_HAVE_SM80
  if (b->id == Id::kSm80) {
    out.sm80 = sm80::select(p.dtype, out_dtype, hd, causal, p.kernel_config, cc, p.seqlen_k, error);
    if (out.sm80 == nullptr) return no_row_status(p);
    out.name = out.sm80->name;
    return FLASHCORE_SUCCESS;
  }
#endif
  // Decode (one block of at most 64 query rows, a long key range): the split-KV row, when the call gives a
  // workspace for its partials. Tuning tables time whole-tile configs and come after it.
  if (p.kernel_config == nullptr && workspace_given) out.sm90 = sm90::decode_row(p, device, workspace_capacity);
  // Packed (varlen) queries: the packed rows of configs.txt (a dynamic persistent row where a workspace is given,
  // else one CTA per tile, balanced by the hardware across sequence lengths).
  if (p.kernel_config == nullptr && out.sm90 == nullptr) out.sm90 = sm90::varlen_row(p, workspace_given);
  // choose() only returns configs it found available; should one be gone, the default runs. An 8-bit call's entry
  // (the key is the input dtype) serves both O dtypes; a 16-bit call writing O in another dtype has no table.
  if (out.sm90 == nullptr && p.kernel_config == nullptr && (out_dtype == p.dtype || is_8bit(p.dtype))) {
    const char* tuned = tuning::choose(device, cc, p.dtype, hd, causal, p.seqlen_q, p.seqlen_k, workspace_given);
    if (tuned != nullptr) out.sm90 = sm90::select(p.dtype, out_dtype, hd, causal, tuned, p.seqlen_k, error);
    // Dynamic rows take no paged K/V, and those with two consumer warpgroups no packed one (sm90/smem_plan.h):
    // such calls take the default.
    const bool packed = p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr;
    if (out.sm90 != nullptr && ((p.block_table != nullptr && !sm90::takes_paged(out.sm90->shape)) ||
                                (packed && !sm90::takes_packed(out.sm90->shape)))) {
      out.sm90 = nullptr;
    }
    // A tuned prefill split row only with the workspace its partials need, a tuned 8-bit row only with the
    // workspace its V route needs (a caller may have sized it for the default row): else the default runs.
    int sms = 0;
    if (out.sm90 != nullptr && (sm90::splits_last_round(out.sm90->shape) || is_8bit(p.dtype)) &&
        (api::sm_count(device, sms) != cudaSuccess ||
         sm90::workspace_bytes(*out.sm90, p, device, sms) > workspace_capacity)) {
      out.sm90 = nullptr;
    }
  }
  if (out.sm90 == nullptr) {
    out.sm90 = sm90::select(p.dtype, out_dtype, hd, causal, p.kernel_config, p.seqlen_k, error);
  }
  if (p.kernel_config == nullptr) out.sm90 = sm90::wave_row(p, device, out.sm90, workspace_capacity);
  if (out.sm90 == nullptr) return no_row_status(p);
  out.name = out.sm90->name;
  return FLASHCORE_SUCCESS;
}
}  // namespace

bool config_available(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char* name,
                      bool* needs_workspace) {
  const flashcore_dtype out = resolved_out_dtype(dtype, FLASHCORE_DTYPE_SAME);
  const Backend* b = find(cc);
  if (b == nullptr || name == nullptr) return false;
  std::string ignored;
  bool workspace = false;
#ifdef FLASHCORE_HAVE_SM80
  if (b->id == Id::kSm80) {
    if (sm80::select(dtype, out, head_dim, causal, name, cc, INT64_MAX, ignored) == nullptr) return false;
  }
#endif
  if (b->id == Id::kSm90) {
    const sm90::KernelRow* row = sm90::select(dtype, out, head_dim, causal, name, INT64_MAX, ignored);
    if (row == nullptr) return false;
    workspace = sm90::needs_workspace(*row);
  }
  if (needs_workspace != nullptr) *needs_workspace = workspace;
  return true;
}

namespace {
// precision = FP8 (flashcore.h): the 16-bit call runs as an 8-bit one on e4m3 copies in the workspace, laid out as
//   [0, 256) zero | amax[3][B*Hkv], descale[3][B*Hkv] | Q8 (B, Sq, Hq, D) | K8 (B, Sk, Hkv, D) | the transposed V
// every part 256-byte aligned. The 8-bit call gets the whole workspace: its dynamic scheduler's counter is in the
// first 256 bytes, which stay zero between calls whatever their shapes (a counter inside the shape-dependent part
// would start from the scratch bytes of an earlier call), and it reads the transposed V where the quantization put it.
struct Fp8Layout {
  size_t scales = 0, q8 = 0, k8 = 0, vt = 0, total = 0;
};
size_t align256(size_t x) { return (x + 255) / 256 * 256; }
Fp8Layout fp8_layout(const flashcore_attention_params& p) {
  Fp8Layout l;
  const size_t bh = static_cast<size_t>(p.batch * p.num_heads_kv);
  l.scales = 256;
  l.q8 = l.scales + align256(6 * bh * sizeof(float));
  l.k8 = l.q8 + align256(static_cast<size_t>(p.batch * p.seqlen_q * p.num_heads_q * p.head_dim));
  l.vt = l.k8 + align256(static_cast<size_t>(p.batch * p.seqlen_k * p.num_heads_kv * p.head_dim));
  l.total = l.vt + sm90::fp8_vt_bytes(p);
  return l;
}

// The key of the 8-bit row a precision = FP8 call runs: e4m3 inputs, O in the input dtype unless out_dtype says
// otherwise (workspace_size and selected_config need no more than this).
flashcore_attention_params as_8bit(const flashcore_attention_params& p) {
  flashcore_attention_params q = p;
  q.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  q.out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  q.precision = FLASHCORE_PRECISION_NATIVE;
  return q;
}

// The whole 8-bit call: e4m3 Q and K (contiguous, in the workspace) and the computed descales. V is read only by the
// quantization (the transposed V).
flashcore_attention_params fp8_call(const flashcore_attention_params& p, const Fp8Layout& l) {
  flashcore_attention_params q = as_8bit(p);
  char* ws = static_cast<char*>(p.workspace);
  const int64_t bh = p.batch * p.num_heads_kv;
  q.q = ws + l.q8;
  q.k = ws + l.k8;
  q.q_strides = {p.seqlen_q * p.num_heads_q * p.head_dim, p.num_heads_q * p.head_dim, p.head_dim, 1};
  q.k_strides = {p.seqlen_k * p.num_heads_kv * p.head_dim, p.num_heads_kv * p.head_dim, p.head_dim, 1};
  const float* descale = reinterpret_cast<const float*>(ws + l.scales) + 3 * bh;
  q.q_descale = descale;
  q.k_descale = descale + bh;
  q.v_descale = descale + 2 * bh;
  // q.workspace, q.workspace_size: the caller's whole workspace (Fp8Layout)
  return q;
}
// precision = INT8 (flashcore.h): int8 copies of Q and K and their statistics in the workspace (int8_prep_params.h):
//   [0, 256) zero | q_scale | k_scale | k_partial | k_mean | lse_shift | Q8 (B, Sq, Hq, D) | K8 (B, Sk, Hkv, D)
// every part 256-byte aligned; the int8 call gets the whole workspace (its dynamic scheduler's counter is in the first
// 256 bytes, as for precision = FP8) and reads V as the caller gave it.
struct Int8Layout {
  size_t q_scale = 0, k_scale = 0, k_partial = 0, k_mean = 0, lse_shift = 0, q8 = 0, k8 = 0, total = 0;
};
Int8Layout int8_layout(const flashcore_attention_params& p) {
  Int8Layout l;
  const size_t bhq = static_cast<size_t>(p.batch * p.num_heads_q), bhk = static_cast<size_t>(p.batch * p.num_heads_kv);
  const size_t d = static_cast<size_t>(p.head_dim), f = sizeof(float);
  l.q_scale = 256;
  l.k_scale = l.q_scale + align256(bhq * static_cast<size_t>(p.seqlen_q) * f);
  l.k_partial = l.k_scale + align256(bhk * static_cast<size_t>(kernels::int8_key_blocks(p.seqlen_k)) * f);
  l.k_mean = l.k_partial + align256(bhk * static_cast<size_t>(kernels::int8_sum_chunks(p.seqlen_k)) * d * f);
  l.lse_shift = l.k_mean + align256(bhk * d * f);
  l.q8 = l.lse_shift + align256(bhq * static_cast<size_t>(p.seqlen_q) * f);
  l.k8 = l.q8 + align256(bhq * static_cast<size_t>(p.seqlen_q) * d);
  l.total = l.k8 + align256(bhk * static_cast<size_t>(p.seqlen_k) * d);
  return l;
}

// The key of the int8 row a precision = INT8 call runs: int8 Q and K, V and O in the input dtype.
flashcore_attention_params as_int8(const flashcore_attention_params& p) {
  flashcore_attention_params q = p;
  q.dtype = FLASHCORE_DTYPE_INT8;
  q.out_dtype = p.dtype;
  q.precision = FLASHCORE_PRECISION_NATIVE;
  return q;
}

flashcore_attention_params int8_call(const flashcore_attention_params& p, const Int8Layout& l) {
  flashcore_attention_params q = as_int8(p);
  char* ws = static_cast<char*>(p.workspace);
  q.q = ws + l.q8;
  q.k = ws + l.k8;
  q.q_strides = {p.seqlen_q * p.num_heads_q * p.head_dim, p.num_heads_q * p.head_dim, p.head_dim, 1};
  q.k_strides = {p.seqlen_k * p.num_heads_kv * p.head_dim, p.num_heads_kv * p.head_dim, p.head_dim, 1};
  q.q_descale = reinterpret_cast<const float*>(ws + l.q_scale);  // per token (the int8 rows' meaning, mainloop.cuh)
  q.k_descale = reinterpret_cast<const float*>(ws + l.k_scale);  // per 128-key block
  return q;
}

kernels::Int8PrepParams int8_prep_params(const flashcore_attention_params& p, const Int8Layout& l, float softmax_scale) {
  kernels::Int8PrepParams prep = sm90::prep_shape<kernels::Int8PrepParams>(p);
  char* ws = static_cast<char*>(p.workspace);
  prep.q8 = reinterpret_cast<int8_t*>(ws + l.q8);
  prep.k8 = reinterpret_cast<int8_t*>(ws + l.k8);
  prep.q_scale = reinterpret_cast<float*>(ws + l.q_scale);
  prep.k_scale = reinterpret_cast<float*>(ws + l.k_scale);
  prep.k_partial = reinterpret_cast<float*>(ws + l.k_partial);
  prep.k_mean = reinterpret_cast<float*>(ws + l.k_mean);
  prep.lse_shift = p.lse != nullptr ? reinterpret_cast<float*>(ws + l.lse_shift) : nullptr;
  prep.lse = p.lse;
  prep.softmax_scale = softmax_scale;
  return prep;
}

// The common steps of a precision = FP8 / INT8 call: the caller's workspace must hold the quantized copies
// (`holds`, `needed` bytes) ...
flashcore_status check_quantized_workspace(const char* what, const char* holds, size_t needed,
                                           const flashcore_attention_params& p, std::string& error) {
  if (p.workspace != nullptr && p.workspace_size >= needed) return FLASHCORE_SUCCESS;
  error = std::string(what) + " needs " + std::to_string(needed) + " bytes of workspace for " + holds +
          " (flashcore_attention_workspace_size); workspace_size = " + std::to_string(p.workspace_size);
  return FLASHCORE_ERROR_INVALID_ARGUMENT;
}

// ... and the quantized call `q` needs its kernel row and the SM count (for the preparation kernels' grids).
flashcore_status select_quantized_row(const flashcore_attention_params& q, int device, int cc, Selected& row,
                                      int& sms, std::string& error) {
  if (const flashcore_status st = select_row(q, device, cc, q.workspace_size, row, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (const cudaError_t err = api::sm_count(device, sms); err != cudaSuccess) {
    error = api::cuda_message("cannot query the device", err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

// The whole precision = INT8 call on the sm90 backend: quantize, attend, shift the LSE back.
flashcore_status int8_forward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                              cudaStream_t stream, std::string& error) {
  const Int8Layout l = int8_layout(p);
  if (const flashcore_status st =
          check_quantized_workspace("precision = INT8", "the int8 copies of Q and K", l.total, p, error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  const flashcore_attention_params p8 = int8_call(p, l);
  Selected row;
  int sms = 0;
  if (const flashcore_status st = select_quantized_row(p8, device, cc, row, sms, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
  const kernels::Int8PrepParams prep = int8_prep_params(p, l, softmax_scale);
  if (const cudaError_t err = sm90::launch_int8_quantize(prep, p.dtype, stream); err != cudaSuccess) {
    error = api::cuda_message("INT8 quantization launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  if (const flashcore_status st = sm90::launch(*row.sm90, p8, softmax_scale, device, stream, error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  if (p.lse != nullptr) {
    if (const cudaError_t err = sm90::launch_int8_lse_shift(prep, sms, stream); err != cudaSuccess) {
      error = api::cuda_message("INT8 LSE shift launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
  }
  return FLASHCORE_SUCCESS;
}

// The key of the row a precision = FP8 / INT8 call runs (the call itself for NATIVE).
flashcore_attention_params as_quantized(const flashcore_attention_params& p) {
  if (p.precision == FLASHCORE_PRECISION_FP8) return as_8bit(p);
  if (p.precision == FLASHCORE_PRECISION_INT8) return as_int8(p);
  return p;
}

// A precision other than NATIVE needs the sm90 backend.
flashcore_status require_sm90(const char* what, int cc, std::string& error) {
  const Backend* b = backend_or_error(cc, error);
  if (b == nullptr) return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  if (b->id != Id::kSm90) {
    error = std::string(what) + " needs the sm90 backend (Hopper); this device is served by " + b->name;
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return FLASHCORE_SUCCESS;
}
}  // namespace

flashcore_status workspace_size(const flashcore_attention_params& params, int cc, size_t& bytes,
                                std::string& error) {
  const flashcore_attention_params p = as_run(params, cc);
  if (p.precision != FLASHCORE_PRECISION_NATIVE) {  // (only the row's existence matters here)
    int device = 0;
    (void)cudaGetDevice(&device);
    Selected row;
    if (const flashcore_status st = select_row(as_quantized(p), device, cc, UINT64_MAX, row, error);
        st != FLASHCORE_SUCCESS) {
      return st;
    }
    bytes = p.precision == FLASHCORE_PRECISION_INT8 ? int8_layout(p).total : fp8_layout(p).total;
    return FLASHCORE_SUCCESS;
  }
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    (void)cudaGetLastError();
    error = std::string("querying the current CUDA device failed: ") + cudaGetErrorString(err);
    return FLASHCORE_ERROR_CUDA;
  }
  Selected row;
  if (const flashcore_status st = select_row(p, device, cc, UINT64_MAX, row, error);
      st != FLASHCORE_SUCCESS) {
    return st;
  }
  int sms = 0;
  if (const cudaError_t err = api::sm_count(device, sms); err != cudaSuccess) {
    error = api::cuda_message("cannot query the device", err);
    return FLASHCORE_ERROR_CUDA;
  }
  bytes = row.sm90 != nullptr ? sm90::workspace_bytes(*row.sm90, p, device, sms) : 0;  // the portable kernel needs none
  return FLASHCORE_SUCCESS;
}

flashcore_status forward(const flashcore_attention_params& params, float softmax_scale, int device, int cc,
                         cudaStream_t stream, std::string& error) {
  const flashcore_attention_params p = as_run(params, cc);
  if (p.precision == FLASHCORE_PRECISION_INT8) {
    if (const flashcore_status st = require_sm90("precision = INT8", cc, error); st != FLASHCORE_SUCCESS) return st;
    return int8_forward(p, softmax_scale, device, cc, stream, error);
  }
  if (p.precision == FLASHCORE_PRECISION_FP8) {
    if (const flashcore_status st = require_sm90("precision = FP8", cc, error); st != FLASHCORE_SUCCESS) return st;
    const Fp8Layout l = fp8_layout(p);
    if (const flashcore_status st =
            check_quantized_workspace("precision = FP8", "the e4m3 copies of Q, K and V", l.total, p, error);
        st != FLASHCORE_SUCCESS) {
      return st;
    }
    const flashcore_attention_params p8 = fp8_call(p, l);
    Selected row;
    int sms = 0;
    if (const flashcore_status st = select_quantized_row(p8, device, cc, row, sms, error); st != FLASHCORE_SUCCESS) {
      return st;
    }
    char* ws = static_cast<char*>(p.workspace);
    kernels::Fp8PrepParams prep = sm90::fp8_prep_params(p);
    prep.amax = reinterpret_cast<float*>(ws + l.scales);
    prep.descale = prep.amax + 3 * p.batch * p.num_heads_kv;
    prep.q8 = reinterpret_cast<uint8_t*>(ws + l.q8);
    prep.k8 = reinterpret_cast<uint8_t*>(ws + l.k8);
    prep.vt = reinterpret_cast<uint8_t*>(ws + l.vt);
    if (const cudaError_t err = sm90::launch_fp8_quantize(prep, p.dtype, stream); err != cudaSuccess) {
      error = api::cuda_message("FP8 quantization launch failed", err);
      return FLASHCORE_ERROR_CUDA;
    }
    return sm90::launch(*row.sm90, p8, softmax_scale, device, stream, error, prep.vt);
  }
  Selected row;
  const uint64_t capacity = p.workspace != nullptr ? p.workspace_size : 0;
  if (const flashcore_status st = select_row(p, device, cc, capacity, row, error); st != FLASHCORE_SUCCESS) {
    return st;
  }
#ifdef FLASHCORE_HAVE_SM80
  if (row.sm80 != nullptr) return sm80::launch(*row.sm80, p, softmax_scale, device, cc, stream, error);
#endif
  return sm90::launch(*row.sm90, p, softmax_scale, device, stream, error);
}

size_t fp8_transposed_v_bytes(const flashcore_attention_params& p) { return sm90::fp8_vt_bytes(p); }

flashcore_status fp8_transpose_v(const flashcore_attention_params& p, void* vt, int cc, cudaStream_t stream,
                                 std::string& error) {
  if (const flashcore_status st = require_sm90("the 8-bit V transpose", cc, error); st != FLASHCORE_SUCCESS) return st;
  kernels::Fp8PrepParams prep = sm90::fp8_prep_params(p);
  prep.vt = static_cast<uint8_t*>(vt);
  if (const cudaError_t err = sm90::launch_fp8_transpose_v(prep, stream); err != cudaSuccess) {
    error = api::cuda_message("8-bit V transpose launch failed", err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status selected_config(const flashcore_attention_params& params, int device, int cc, const char*& name,
                                 std::string& error) {
  const flashcore_attention_params run = as_run(params, cc);
  // A precision = FP8 call runs an 8-bit row, a precision = INT8 call an int8 one.
  const flashcore_attention_params p = as_quantized(run);
  Selected row;
  const uint64_t capacity = p.workspace != nullptr ? p.workspace_size : 0;
  const flashcore_status st = select_row(p, device, cc, capacity, row, error);
  if (st == FLASHCORE_SUCCESS) name = row.name;
  return st;
}

}  // namespace flashcore::backend

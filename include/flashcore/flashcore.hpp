// FlashCore C++ layer: header-only, over the C ABI of flashcore.h. Errors become flashcore::Error.
//
//   auto q = flashcore::TensorView::bshd(q_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_q, heads_q, head_dim);
//   auto k = flashcore::TensorView::bshd(k_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_k, heads_kv, head_dim);
//   auto v = flashcore::TensorView::bshd(v_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_k, heads_kv, head_dim);
//   auto o = flashcore::TensorView::bshd(o_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_q, heads_q, head_dim);
//   flashcore::attention_forward(q, k, v, o, {/*causal=*/true}, stream);  // throws flashcore::Error
//
// 8-bit (e4m3) inputs: Q, K, V views of dtype FLASHCORE_DTYPE_FP8_E4M3 (strides in bytes), O a bf16 or fp16 view, the
// descales in the options, and a zero-filled workspace of workspace_size() bytes (the kernel transposes V in shared
// memory; the workspace holds its tile counter, and V's transposed copy for a named config whose tile cannot):
//   flashcore::ForwardOptions opt;
//   opt.q_descale = qd, opt.k_descale = kd, opt.v_descale = vd;  // device float (batch, heads_kv); nullptr: 1
//   opt.workspace_size = flashcore::workspace_size(q8, k8, v8, o, opt);
//   opt.workspace = ws;  // cudaMalloc'ed and cudaMemset to 0 once
//   flashcore::attention_forward(q8, k8, v8, o, opt, stream);
// 16-bit inputs computed in 8 bits: opt.precision = FLASHCORE_PRECISION_FP8 (no descales; a workspace too).
// An e4m3 KV cache under 16-bit Q (0.9): k and v views of FLASHCORE_DTYPE_FP8_E4M3, q and o fp16 / bf16,
// opt.k_descale / opt.v_descale (nullptr: 1); make_params sets FLASHCORE_FLAG_KV_FP8_E4M3 (sm90 only).
// A K/V that several 8-bit calls attend to: transpose V once (fp8_transpose_v(v8, vt), into fp8_transposed_v_size(v8)
// bytes), then call with v's view pointed at vt (a copy of the view, data = vt; its strides are not read) and
// opt.v_transposed = true: the calls skip their own transposition.
#ifndef FLASHCORE_FLASHCORE_HPP_
#define FLASHCORE_FLASHCORE_HPP_

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore {

// A failed FlashCore call: the status and flashcore_last_error()'s message.
class Error : public std::runtime_error {
 public:
  Error(flashcore_status status, const std::string& message)
      : std::runtime_error(std::string(flashcore_status_string(status)) + ": " + message), status_(status) {}
  flashcore_status status() const noexcept { return status_; }

 private:
  flashcore_status status_;
};

// Throws Error(status, flashcore_last_error()) unless status is FLASHCORE_SUCCESS.
inline void check(flashcore_status status) {
  if (status != FLASHCORE_SUCCESS) throw Error(status, flashcore_last_error());
}

// A 4-D device tensor (batch, seq, heads, head_dim) with element strides; does not own memory.
struct TensorView {
  const void* data = nullptr;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  flashcore_tensor_strides strides{0, 0, 0, 1};

  // Contiguous (B, S, H, D): FlashAttention's layout.
  static TensorView bshd(const void* data, flashcore_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                         int64_t head_dim) {
    return {data, dtype, batch, seq, heads, head_dim, {seq * heads * head_dim, heads * head_dim, head_dim, 1}};
  }
  // Contiguous (B, H, S, D): PyTorch SDPA's layout.
  static TensorView bhsd(const void* data, flashcore_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                         int64_t head_dim) {
    return {data, dtype, batch, seq, heads, head_dim, {heads * seq * head_dim, head_dim, seq * head_dim, 1}};
  }
  // Any layout, strides in elements.
  static TensorView strided(const void* data, flashcore_dtype dtype, int64_t batch, int64_t seq, int64_t heads,
                            int64_t head_dim, flashcore_tensor_strides strides) {
    return {data, dtype, batch, seq, heads, head_dim, strides};
  }

  int64_t numel() const { return batch * seq * heads * head_dim; }
  // Element offset of (b, s, h, d).
  int64_t offset(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return b * strides.batch + s * strides.seq + h * strides.head + d * strides.dim;
  }
  void* mutable_data() const { return const_cast<void*>(data); }
};

struct ForwardOptions {
  bool causal = false;         // bottom-right aligned (see flashcore.h)
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  float* lse = nullptr;        // optional float32 (batch, heads_q, seqlen_q) output
  int64_t lse_capacity = 0;    // floats at lse (0: not given; make_params fills batch * heads_q * seqlen_q)
  void* workspace = nullptr;   // see workspace_size()
  uint64_t workspace_size = 0;
  const char* kernel_config = nullptr;  // a name from kernel_configs(); nullptr: the library's choice
  const int32_t* seqused_k = nullptr;   // device int32 (batch,): a KV cache's lengths (flashcore.h)
  int32_t num_splits = 0;               // split-KV parts: 0 the library's choice, 1 never, n at most n
  // Since 0.3. 8-bit (FLASHCORE_DTYPE_FP8_E4M3) inputs: the real values are stored * descale, one float32 per (batch,
  // KV head): device arrays (batch, heads_kv), contiguous, 4-byte aligned; nullptr means 1. 16-bit inputs: nullptr.
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  // FLASHCORE_PRECISION_NATIVE, or FLASHCORE_PRECISION_FP8: 16-bit Q, K, V quantized to e4m3 by the library (per
  // batch and KV head, into the workspace) and run by the 8-bit kernels; O stays in o's dtype.
  int32_t precision = FLASHCORE_PRECISION_NATIVE;
  // 8-bit calls: v's data is V as fp8_transpose_v wrote it (FLASHCORE_FLAG_V_TRANSPOSED; v's strides are not read).
  bool v_transposed = false;
  // Since 0.5, the attention variants (flashcore.h), 16-bit calls, forward and (since 0.6) backward: FlashAttention's
  // window_size (query i sees key j iff i + d - left <= j <= i + d + right, -1 unbounded; {-1, -1}: no window; with
  // causal the right bound is 0), the softcap (0: none) and per-query-head sinks (device float32, nullptr: none).
  int32_t window_size_left = -1;
  int32_t window_size_right = -1;
  float softcap = 0.0f;
  const float* sinks = nullptr;
  // Since 0.6.1: chunked local attention (Llama 4; FlashAttention-3's attention_chunk; 0: none).
  int32_t attention_chunk = 0;
  // Packed (varlen) batches, paged caches and appends: set the C fields of make_params()'s result directly
  // (cu_seqlens_q/k, total_q/k, block_table, page_size, num_pages, k_new, v_new, seqlen_new; since 0.8 kv_batch_idx,
  // kv_batch_size, leftpad_k, cu_seqlens_k_new, total_k_new, seqused_q and the rotary_* fields; see flashcore.h).
};

// The C parameter struct for (q, k, v, o); throws Error(INVALID_ARGUMENT) when the views disagree.
inline flashcore_attention_params make_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                              const TensorView& o, const ForwardOptions& options = {}) {
  auto mismatch = [](const std::string& what, int64_t a, int64_t b) {
    throw Error(FLASHCORE_ERROR_INVALID_ARGUMENT, what + " differ: " + std::to_string(a) + " vs " + std::to_string(b));
  };
  if (k.batch != q.batch || v.batch != q.batch || o.batch != q.batch) mismatch("batch sizes of q/k/v/o", q.batch, k.batch);
  if (k.head_dim != q.head_dim || v.head_dim != q.head_dim || o.head_dim != q.head_dim)
    mismatch("head dims of q/k/v/o", q.head_dim, k.head_dim);
  if (v.seq != k.seq) mismatch("seqlens of k and v", k.seq, v.seq);
  if (v.heads != k.heads) mismatch("head counts of k and v", k.heads, v.heads);
  if (o.seq != q.seq) mismatch("seqlens of q and o", q.seq, o.seq);
  if (o.heads != q.heads) mismatch("head counts of q and o", q.heads, o.heads);
  // An e4m3 KV cache under 16-bit Q (since 0.9): k and v views of FLASHCORE_DTYPE_FP8_E4M3, q fp16 / bf16; the
  // options' k_descale / v_descale scale the cache.
  const bool kv8 = k.dtype == FLASHCORE_DTYPE_FP8_E4M3 && v.dtype == FLASHCORE_DTYPE_FP8_E4M3 &&
                   (q.dtype == FLASHCORE_DTYPE_FP16 || q.dtype == FLASHCORE_DTYPE_BF16);
  if (!kv8 && (k.dtype != q.dtype || v.dtype != q.dtype)) {
    mismatch("dtypes of q/k/v", q.dtype, k.dtype != q.dtype ? k.dtype : v.dtype);
  }

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.mutable_data();
  p.lse = options.lse;
  p.q_strides = q.strides;
  p.k_strides = k.strides;
  p.v_strides = v.strides;
  p.o_strides = o.strides;
  p.batch = q.batch;
  p.seqlen_q = q.seq;
  p.seqlen_k = k.seq;
  p.num_heads_q = q.heads;
  p.num_heads_kv = k.heads;
  p.head_dim = q.head_dim;
  p.dtype = q.dtype;
  p.causal = options.causal ? 1 : 0;
  p.softmax_scale = options.softmax_scale;
  // O in another dtype than the inputs is out_dtype (the library says which ones it supports; 8-bit inputs write
  // O in bf16 or fp16, so their o view names it).
  p.out_dtype = o.dtype == q.dtype ? FLASHCORE_DTYPE_SAME : o.dtype;
  p.lse_capacity = options.lse == nullptr ? 0
                   : options.lse_capacity != 0 ? options.lse_capacity
                                               : q.batch * q.heads * q.seq;
  p.workspace = options.workspace;
  p.workspace_size = options.workspace_size;
  p.kernel_config = options.kernel_config;
  p.seqused_k = options.seqused_k;
  p.num_splits = options.num_splits;
  p.q_descale = options.q_descale;
  p.k_descale = options.k_descale;
  p.v_descale = options.v_descale;
  p.precision = options.precision;
  p.flags = (options.v_transposed ? FLASHCORE_FLAG_V_TRANSPOSED : 0u) | (kv8 ? FLASHCORE_FLAG_KV_FP8_E4M3 : 0u);
  p.local = options.window_size_left >= 0 || options.window_size_right >= 0 ? 1 : 0;
  p.window_size_left = p.local != 0 ? options.window_size_left : 0;
  p.window_size_right = p.local != 0 ? options.window_size_right : 0;
  p.softcap = options.softcap;
  p.sinks = options.sinks;
  p.attention_chunk = options.attention_chunk;
  return p;
}

// Argument checks only (no device work); throws Error on failure.
inline void validate(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                     const ForwardOptions& options = {}) {
  const flashcore_attention_params p = make_params(q, k, v, o, options);
  check(flashcore_attention_validate(&p));
}

// O = softmax(scale * Q K^T [+ causal mask]) V, enqueued on `stream`; throws Error on failure.
inline void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                              const ForwardOptions& options = {}, flashcore_stream_t stream = nullptr) {
  const flashcore_attention_params p = make_params(q, k, v, o, options);
  check(flashcore_attention_forward(&p, stream));
}

// Bytes of device workspace attention_forward needs for these views on the current device (0 for most 16-bit
// calls; every 8-bit or precision = FP8 call needs one). Zero-fill it before its first use.
inline uint64_t workspace_size(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const ForwardOptions& options = {}) {
  const flashcore_attention_params p = make_params(q, k, v, o, options);
  uint64_t bytes = 0;
  check(flashcore_attention_workspace_size(&p, &bytes));
  return bytes;
}

// The backward pass (since 0.4, flashcore.h flashcore_attention_backward): dQ, dK, dV for the upstream gradient dO of
// O = attention_forward(q, k, v), from q, k, v, o and the forward's LSE (options.lse: required). dq has q's shape,
// dk and dv k's; for GQA / MQA dk and dv are summed over the query heads of each KV head. options.workspace must hold
// backward_workspace_size() bytes (any contents). deterministic: dq bit-identical from run to run.
struct BackwardOptions {
  ForwardOptions forward;  // causal, softmax_scale, lse and the variants as in the forward call; workspace for the
                           // backward
  bool deterministic = false;
  float* dsinks = nullptr;  // since 0.6, with forward.sinks: dL/dsinks, device float32 (heads_q,); nullptr: not wanted
};

inline flashcore_attention_params make_backward_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                                       const TensorView& o, const TensorView& dout,
                                                       const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                                       const BackwardOptions& options) {
  flashcore_attention_params p = make_params(q, k, v, o, options.forward);
  auto same_shape = [](const char* name, const TensorView& a, const TensorView& like) {
    if (a.batch != like.batch || a.seq != like.seq || a.heads != like.heads || a.head_dim != like.head_dim ||
        a.dtype != like.dtype) {
      throw Error(FLASHCORE_ERROR_INVALID_ARGUMENT, std::string(name) + "'s shape or dtype differs from the tensor it is the gradient of");
    }
  };
  same_shape("dout", dout, o);
  same_shape("dq", dq, q);
  same_shape("dk", dk, k);
  same_shape("dv", dv, v);
  p.dout = dout.data;
  p.dout_strides = dout.strides;
  p.dq = dq.mutable_data();
  p.dq_strides = dq.strides;
  p.dk = dk.mutable_data();
  p.dk_strides = dk.strides;
  p.dv = dv.mutable_data();
  p.dv_strides = dv.strides;
  p.deterministic = options.deterministic ? 1 : 0;
  p.dsinks = options.dsinks;
  return p;
}

inline uint64_t backward_workspace_size(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& o, const TensorView& dout, const TensorView& dq,
                                        const TensorView& dk, const TensorView& dv, const BackwardOptions& options) {
  const flashcore_attention_params p = make_backward_params(q, k, v, o, dout, dq, dk, dv, options);
  uint64_t bytes = 0;
  check(flashcore_attention_backward_workspace_size(&p, &bytes));
  return bytes;
}

// Enqueued on `stream`; throws Error on failure.
inline void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                               const TensorView& dout, const TensorView& dq, const TensorView& dk,
                               const TensorView& dv, const BackwardOptions& options,
                               flashcore_stream_t stream = nullptr) {
  const flashcore_attention_params p = make_backward_params(q, k, v, o, dout, dq, dk, dv, options);
  check(flashcore_attention_backward(&p, stream));
}

// 8-bit V transposed once for many calls (flashcore.h: flashcore_fp8_transpose_v): the bytes it takes, and the
// transpose of v (an e4m3 / e5m2 view) into vt (device memory of that size), enqueued on `stream`.
inline flashcore_attention_params v_transpose_params(const TensorView& v) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.v = v.data;
  p.v_strides = v.strides;
  p.batch = v.batch;
  p.seqlen_k = v.seq;
  p.num_heads_kv = v.heads;
  p.head_dim = v.head_dim;
  p.dtype = v.dtype;
  return p;
}
inline uint64_t fp8_transposed_v_size(const TensorView& v) {
  const flashcore_attention_params p = v_transpose_params(v);
  uint64_t bytes = 0;
  check(flashcore_fp8_transposed_v_size(&p, &bytes));
  return bytes;
}
inline void fp8_transpose_v(const TensorView& v, void* vt, flashcore_stream_t stream = nullptr) {
  const flashcore_attention_params p = v_transpose_params(v);
  check(flashcore_fp8_transpose_v(&p, vt, stream));
}

// Kernel-config names compiled for (dtype, head_dim, causal) on the current device, the default first.
inline std::vector<std::string> kernel_configs(flashcore_dtype dtype, int head_dim, bool causal) {
  int32_t count = 0;
  check(flashcore_list_kernel_configs(dtype, head_dim, causal ? 1 : 0, nullptr, 0, &count));
  std::vector<const char*> names(static_cast<size_t>(count));
  check(flashcore_list_kernel_configs(dtype, head_dim, causal ? 1 : 0, names.data(), count, &count));
  return std::vector<std::string>(names.begin(), names.begin() + std::min<size_t>(names.size(), count));
}

// Compiled dtypes / head dims / archs and the current device (device_arch = 0 without a GPU).
struct Capabilities {
  std::vector<flashcore_dtype> dtypes;
  std::vector<flashcore_dtype> out_dtypes;
  std::vector<int> head_dims;
  std::vector<int> archs;
  int device_arch = 0;
  bool device_supported = false;
  std::string device_backend;  // "" when no backend serves the current device
  uint32_t params_struct_size = 0;
};

inline Capabilities capabilities() {
  flashcore_capabilities raw;
  flashcore_capabilities_init(&raw);
  check(flashcore_get_capabilities(&raw));
  auto first = [](int count) { return static_cast<size_t>(count < 0 ? 0 : count > FLASHCORE_MAX_CAPS ? FLASHCORE_MAX_CAPS : count); };
  Capabilities caps;
  caps.dtypes.assign(raw.dtypes, raw.dtypes + first(raw.num_dtypes));
  caps.out_dtypes.assign(raw.out_dtypes, raw.out_dtypes + first(raw.num_out_dtypes));
  caps.head_dims.assign(raw.head_dims, raw.head_dims + first(raw.num_head_dims));
  caps.archs.assign(raw.archs, raw.archs + first(raw.num_archs));
  caps.device_arch = raw.device_arch;
  caps.device_supported = raw.device_supported != 0;
  const char* backend = raw.device_backend;
  const char* backend_end = std::find(backend, backend + sizeof(raw.device_backend), '\0');
  caps.device_backend.assign(backend, backend_end);
  caps.params_struct_size = raw.params_struct_size;
  return caps;
}

inline std::string version() { return flashcore_version_string(); }

}  // namespace flashcore

#endif  // FLASHCORE_FLASHCORE_HPP_

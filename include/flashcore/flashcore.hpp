// FlashCore C++ layer: header-only, over the C ABI of flashcore.h. Errors become flashcore::Error.
//
//   auto q = flashcore::TensorView::bshd(q_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_q, heads_q, head_dim);
//   auto k = flashcore::TensorView::bshd(k_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_k, heads_kv, head_dim);
//   auto v = flashcore::TensorView::bshd(v_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_k, heads_kv, head_dim);
//   auto o = flashcore::TensorView::bshd(o_ptr, FLASHCORE_DTYPE_BF16, batch, seqlen_q, heads_q, head_dim);
//   flashcore::attention_forward(q, k, v, o, {/*causal=*/true}, stream);  // throws flashcore::Error
#ifndef FLASHCORE_FLASHCORE_HPP_
#define FLASHCORE_FLASHCORE_HPP_

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
  if (k.dtype != q.dtype || v.dtype != q.dtype || o.dtype != q.dtype)
    mismatch("dtypes of q/k/v/o", q.dtype, k.dtype != q.dtype ? k.dtype : v.dtype != q.dtype ? v.dtype : o.dtype);

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

// Compiled dtypes / head dims / archs and the current device (device_arch = 0 without a GPU).
struct Capabilities {
  std::vector<flashcore_dtype> dtypes;
  std::vector<int> head_dims;
  std::vector<int> archs;
  int device_arch = 0;
  bool device_supported = false;
};

inline Capabilities capabilities() {
  flashcore_capabilities raw{};
  raw.struct_size = sizeof(raw);
  check(flashcore_get_capabilities(&raw));
  Capabilities caps;
  caps.dtypes.assign(raw.dtypes, raw.dtypes + raw.num_dtypes);
  caps.head_dims.assign(raw.head_dims, raw.head_dims + raw.num_head_dims);
  caps.archs.assign(raw.archs, raw.archs + raw.num_archs);
  caps.device_arch = raw.device_arch;
  caps.device_supported = raw.device_supported != 0;
  return caps;
}

inline std::string version() { return flashcore_version_string(); }

}  // namespace flashcore

#endif  // FLASHCORE_FLASHCORE_HPP_

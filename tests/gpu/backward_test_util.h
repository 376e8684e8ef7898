// Helpers shared by the backward GPU tests (test_backward.cpp, test_backward_variants.cpp, test_backward_varlen.cpp):
//   - case seeds (FLASHCORE_SEED, or a fresh base seed per file, printed), 16-bit <-> float conversions;
//   - the tensor layouts (BSHD, BHSD, padded) and a strided 16-bit Tensor: its host copy and device buffer;
//   - DenseProblem: a dense problem's eight tensors, LSE, workspace and backward call, with the steps of setting it up
//     (tensors, the call's pointers and shape, the forward with LSE, the workspace), of poisoning the outputs before a
//     backward call and of downloading them, and the check that the call left its inputs alone;
//   - the check of one gradient tensor against the float64 reference with the tolerance of the low-precision one
//     (test_backward.cpp's comment gives the rule), and of dq, dk, dv together.
// Each test file keeps its own cases, describe(), seeds' basis and whatever its variant adds (sinks, backends, packing).
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "reference/reference.h"

namespace flashcore::test_bwd {

namespace ref = flashcore::reference;
using flashcore::test::DeviceBuffer;

inline constexpr uint16_t kPoison = 0xffff;  // NaN in fp16 and in bf16

// ------------------------------------------------------------------------------------------------
// Seeds, names, conversions
// ------------------------------------------------------------------------------------------------

// A test file's base seed: FLASHCORE_SEED when set, else a fresh one, printed as "<what>: base seed N (...)". Each
// file draws its own once (a static in its case_seed()).
inline uint64_t draw_base_seed(const char* what) {
  if (const char* env = std::getenv("FLASHCORE_SEED"); env && *env) return std::strtoull(env, nullptr, 0);
  std::random_device rd;
  const uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  std::printf("%s: base seed %llu (set FLASHCORE_SEED to reproduce)\n", what, static_cast<unsigned long long>(s));
  return s;
}

// A case's seed: FNV-1a of its name from base ^ basis (each file keeps its own basis).
inline uint64_t hash_seed(uint64_t base, uint64_t basis, const std::string& name) {
  uint64_t h = base ^ basis;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// `s` with every character but letters and digits made '_' (a GoogleTest parameter name).
inline std::string identifier(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out;
}

inline uint16_t to_bits(float x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
}
inline float to_float(uint16_t x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// ------------------------------------------------------------------------------------------------
// Layouts and tensors
// ------------------------------------------------------------------------------------------------
enum class Layout {
  BSHD,    // (batch, seq, heads, head_dim), contiguous
  BHSD,    // (batch, heads, seq, head_dim), contiguous
  Padded,  // (batch, seq, heads, head_dim) with 16 elements between heads and 64 between batch entries
};

inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::BSHD: return "bshd";
    case Layout::BHSD: return "bhsd";
    case Layout::Padded: return "padded";
  }
  return "?";
}

inline flashcore_tensor_strides strides_of(Layout l, int64_t S, int64_t H, int64_t D) {
  switch (l) {
    case Layout::BSHD: return {S * H * D, H * D, D, 1};
    case Layout::BHSD: return {H * S * D, D, S * D, 1};
    case Layout::Padded: return {S * H * (D + 16) + 64, H * (D + 16), D + 16, 1};
  }
  return {};
}

// A strided 16-bit tensor (batch, seq, heads, head_dim): a host copy of its whole extent (padding included) and a
// device buffer of that extent.
struct Tensor {
  int64_t B = 0, S = 0, H = 0, D = 0;
  flashcore_tensor_strides st{};
  std::vector<uint16_t> host;
  std::unique_ptr<DeviceBuffer> dev;

  void make(int64_t b, int64_t s, int64_t h, int64_t d, Layout layout) {
    B = b, S = s, H = h, D = d;
    st = strides_of(layout, s, h, d);
    host.assign(static_cast<size_t>(extent()), kPoison);
    dev = std::make_unique<DeviceBuffer>(bytes());
  }
  int64_t extent() const { return (B - 1) * st.batch + (S - 1) * st.seq + (H - 1) * st.head + D; }
  size_t bytes() const { return static_cast<size_t>(extent()) * 2; }
  int64_t at(int64_t b, int64_t s, int64_t h, int64_t d) const { return b * st.batch + s * st.seq + h * st.head + d; }
  // Logical element i of the dense (B, S, H, D) order.
  int64_t at_dense(int64_t i) const {
    const int64_t d = i % D, h = (i / D) % H, s = (i / (D * H)) % S, b = i / (D * H * S);
    return at(b, s, h, d);
  }
  int64_t elements() const { return B * S * H * D; }
  // The logical elements N(0, 1) * scale, rounded to dt (the padding keeps its NaN).
  void fill_normal(std::mt19937_64& rng, flashcore_dtype dt, float scale = 1.0f) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t i = 0; i < elements(); ++i) host[static_cast<size_t>(at_dense(i))] = to_bits(n(rng) * scale, dt);
  }
  void* ptr() const { return dev->ptr; }
  void upload() const { ASSERT_EQ(cudaMemcpy(dev->ptr, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess); }
  void download(std::vector<uint16_t>& out) const {
    out.resize(host.size());
    ASSERT_EQ(cudaMemcpy(out.data(), dev->ptr, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void poison() const { ASSERT_EQ(cudaMemset(dev->ptr, 0xff, bytes()), cudaSuccess); }
};

// The outputs of one backward call, downloaded whole.
struct Grads {
  std::vector<uint16_t> dq, dk, dv;  // whole extents, as downloaded
  std::vector<float> dsinks;         // the variants' tests: as downloaded (empty without dsinks)
};

// ------------------------------------------------------------------------------------------------
// A dense problem on the device
// ------------------------------------------------------------------------------------------------

// One dense problem's device side: Q, K, V, O, dO, dQ, dK, dV, LSE, the backward's workspace, what the forward wrote and
// the backward's call (device pointers, its workspace). Q, K, dQ and dK have head_dim columns; V, O, dO and dV have
// head_dim_v (MLA's (192, 128)), head_dim unless make_tensors is given one. Each test file's Problem adds its case.
struct DenseProblem {
  uint64_t seed = 0;
  std::string skip;  // non-empty: why the case cannot run here
  Tensor q, k, v, o, dout, dq, dk, dv;
  std::unique_ptr<DeviceBuffer> lse, workspace;
  uint64_t workspace_bytes = 0;
  std::vector<uint16_t> o_after_forward;
  std::vector<float> lse_after_forward;
  flashcore_attention_params p{};  // the backward's call (device pointers, its workspace)

  int64_t lse_count() const { return q.B * q.H * q.S; }

  // The tensors (host copies NaN, padding included) and LSE: Q, K, V, O in `layout`, dO, dQ, dK, dV in `grad_layout`;
  // V, O, dO and dV of head_dim_v columns (0: head_dim).
  void make_tensors(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                    int64_t head_dim, Layout layout, Layout grad_layout, int64_t head_dim_v = 0) {
    const int64_t dv_cols = head_dim_v != 0 ? head_dim_v : head_dim;
    q.make(batch, seqlen_q, heads_q, head_dim, layout);
    o.make(batch, seqlen_q, heads_q, dv_cols, layout);
    k.make(batch, seqlen_k, heads_kv, head_dim, layout);
    v.make(batch, seqlen_k, heads_kv, dv_cols, layout);
    dout.make(batch, seqlen_q, heads_q, dv_cols, grad_layout);
    dq.make(batch, seqlen_q, heads_q, head_dim, grad_layout);
    dk.make(batch, seqlen_k, heads_kv, head_dim, grad_layout);
    dv.make(batch, seqlen_k, heads_kv, dv_cols, grad_layout);
    lse = std::make_unique<DeviceBuffer>(static_cast<size_t>(lse_count()) * sizeof(float));
  }

  // Fresh inputs from rng: Q, K, V, dO N(0, 1) (Q and K times qk_scale), rounded to dt, uploaded.
  void fill_inputs(std::mt19937_64& rng, flashcore_dtype dt, float qk_scale = 1.0f) {
    for (Tensor* t : {&q, &k, &v, &dout}) {
      t->fill_normal(rng, dt, t == &q || t == &k ? qk_scale : 1.0f);
      t->upload();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }

  // p: flashcore_attention_params_init, then the tensors' device pointers and strides, LSE and the shape, head_dim_v
  // set where V's head dim differs from Q's (the caller sets the rest: dtype, mask, variant).
  void init_call() {
    flashcore_attention_params_init(&p);
    p.q = q.ptr(), p.k = k.ptr(), p.v = v.ptr(), p.o = o.ptr();
    p.lse = static_cast<float*>(lse->ptr);
    p.dout = dout.ptr(), p.dq = dq.ptr(), p.dk = dk.ptr(), p.dv = dv.ptr();
    p.q_strides = q.st, p.k_strides = k.st, p.v_strides = v.st, p.o_strides = o.st;
    p.dout_strides = dout.st, p.dq_strides = dq.st, p.dk_strides = dk.st, p.dv_strides = dv.st;
    p.batch = q.B, p.seqlen_q = q.S, p.seqlen_k = k.S;
    p.num_heads_q = q.H, p.num_heads_kv = k.H, p.head_dim = q.D;
    if (v.D != q.D) p.head_dim_v = v.D;
  }

  // The call with the host copies of Q, K and V, for the reference.
  flashcore_attention_params host_call() const {
    flashcore_attention_params h = p;
    h.q = q.host.data(), h.k = k.host.data(), h.v = v.host.data();
    return h;
  }
};

// pr.p as the forward takes it: sets pr.skip when this build lacks the case's head dim or dtype.
inline void validate_forward(DenseProblem& pr) {
  const flashcore_status vs = flashcore_attention_validate(&pr.p);
  if (vs == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || vs == FLASHCORE_ERROR_UNSUPPORTED_DTYPE) {
    pr.skip = std::string("forward: ") + flashcore_status_string(vs) + ": " + flashcore_last_error();
    return;
  }
  ASSERT_EQ(vs, FLASHCORE_SUCCESS) << flashcore_last_error();
}

// The forward of pr.p with LSE (O and LSE poisoned before it), without a workspace: the backward's (any contents) is not
// the zero-filled one the forward reads. Keeps what it wrote (o_after_forward, lse_after_forward). `wait`, when given,
// waits for the call before the synchronization (the variants' tests: a deadline); `what` names the case in messages.
inline void run_forward(DenseProblem& pr, const std::string& what, const std::function<void()>& wait = {}) {
  flashcore_attention_params fwd = pr.p;
  fwd.workspace = nullptr, fwd.workspace_size = 0;
  pr.o.poison();
  ASSERT_EQ(cudaMemset(pr.lse->ptr, 0xff, static_cast<size_t>(pr.lse_count()) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(flashcore_attention_forward(&fwd, nullptr), FLASHCORE_SUCCESS) << what << ": " << flashcore_last_error();
  if (wait) {
    wait();
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pr.o.download(pr.o_after_forward);
  pr.lse_after_forward.resize(static_cast<size_t>(pr.lse_count()));
  ASSERT_EQ(cudaMemcpy(pr.lse_after_forward.data(), pr.lse->ptr, pr.lse_after_forward.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
}

// The backward's workspace for pr.p, allocated and set in pr.p; sets pr.skip when this build or device lacks the
// backward of the case (head dim, dtype, arch).
inline void make_workspace(DenseProblem& pr, const std::string& what) {
  uint64_t bytes = 0;
  const flashcore_status ws = flashcore_attention_backward_workspace_size(&pr.p, &bytes);
  if (ws == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || ws == FLASHCORE_ERROR_UNSUPPORTED_DTYPE ||
      ws == FLASHCORE_ERROR_UNSUPPORTED_ARCH) {
    pr.skip = std::string("backward: ") + flashcore_status_string(ws) + ": " + flashcore_last_error();
    return;
  }
  ASSERT_EQ(ws, FLASHCORE_SUCCESS) << what << ": " << flashcore_last_error();
  pr.workspace_bytes = bytes;
  if (bytes > 0) pr.workspace = std::make_unique<DeviceBuffer>(bytes);
  pr.p.workspace = pr.workspace ? pr.workspace->ptr : nullptr;
  pr.p.workspace_size = bytes;
}

// dq, dk and dv filled with the NaN poison.
inline void poison_grads(const DenseProblem& pr) {
  for (const Tensor* t : {&pr.dq, &pr.dk, &pr.dv}) t->poison();
}

// Before a backward call: dq, dk, dv poisoned and the workspace filled with 0xff bytes (it may hold anything).
inline void poison_for_backward(const DenseProblem& pr) {
  poison_grads(pr);
  if (::testing::Test::HasFatalFailure()) return;
  if (pr.workspace) {
    ASSERT_EQ(cudaMemset(pr.workspace->ptr, 0xff, pr.workspace_bytes), cudaSuccess);
  }
}

// dq, dk and dv downloaded whole into `out`.
inline void download_grads(const DenseProblem& pr, Grads& out) {
  pr.dq.download(out.dq);
  pr.dk.download(out.dk);
  pr.dv.download(out.dv);
}

// dq, dk and dv still hold their poison (a call that was refused wrote nothing).
inline void expect_grads_poisoned(const DenseProblem& pr) {
  for (const Tensor* t : {&pr.dq, &pr.dk, &pr.dv}) {
    std::vector<uint16_t> got;
    t->download(got);
    for (uint16_t x : got) ASSERT_EQ(x, kPoison) << "a rejected call wrote a gradient";
  }
}

// A rerun's outputs against the first run's: dk, dv and dsinks (where downloaded) bit-identical whatever
// `deterministic` says (flashcore.h), dq too with deterministic = 1. `what` names the case in messages.
inline void expect_same_as_first_run(const std::string& what, bool deterministic, const Grads& first,
                                     const Grads& again) {
  EXPECT_TRUE(again.dk == first.dk) << what << ": dk differs between runs";
  EXPECT_TRUE(again.dv == first.dv) << what << ": dv differs between runs";
  EXPECT_TRUE(same_bits(again.dsinks, first.dsinks)) << what << ": dsinks differs between runs";
  if (deterministic) {
    EXPECT_TRUE(again.dq == first.dq) << what << ": dq differs between runs (deterministic = 1)";
  }
}

// The backward's inputs O, LSE and dO are as they were.
inline void expect_inputs_unchanged(const DenseProblem& pr) {
  std::vector<uint16_t> o, dout;
  pr.o.download(o);
  pr.dout.download(dout);
  std::vector<float> lse(pr.lse_after_forward.size());
  ASSERT_EQ(cudaMemcpy(lse.data(), pr.lse->ptr, lse.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(o == pr.o_after_forward) << "the backward wrote to O";
  EXPECT_TRUE(dout == pr.dout.host) << "the backward wrote to dO";
  EXPECT_TRUE(same_bits(lse, pr.lse_after_forward)) << "the backward wrote to LSE";
}

// ------------------------------------------------------------------------------------------------
// Checks against the reference
// ------------------------------------------------------------------------------------------------

// atol of the gradients' tolerance: about one output ulp.
inline double atol_of(flashcore_dtype dt) { return dt == FLASHCORE_DTYPE_FP16 ? 1e-3 : 4e-3; }

// The gradients' tolerance: 2 * lowp_err (the low-precision reference's error: a kernel's other, equally valid,
// rounding order) + atol * scale.
inline double grad_tolerance(double lowp_err, double scale, flashcore_dtype dt) {
  return 2 * lowp_err + atol_of(dt) * scale;
}

// One gradient tensor of pr against its references: every element written and finite, nothing between a padded
// tensor's rows written, max |err| within grad_tolerance() with scale = max |exact|, at least floor_scale. `what` names
// the case in messages; returns a line for the log.
inline std::string check_tensor(const DenseProblem& pr, const std::string& what, const char* name, const Tensor& t,
                                const std::vector<uint16_t>& got, const std::vector<double>& exact,
                                const std::vector<double>& lowp, double floor_scale) {
  const flashcore_dtype dt = pr.p.dtype;
  std::vector<char> inside(got.size(), 0);
  double err = 0, lowp_err = 0, scale = 0;
  int64_t nonfinite = 0, worst = -1;
  for (int64_t i = 0; i < t.elements(); ++i) {
    const size_t at = static_cast<size_t>(t.at_dense(i));
    inside[at] = 1;
    const double x = to_float(got[at], dt), want = exact[static_cast<size_t>(i)];
    if (!std::isfinite(x)) {
      ++nonfinite;
      continue;
    }
    if (std::fabs(x - want) > err) err = std::fabs(x - want), worst = i;
    lowp_err = std::max(lowp_err, std::fabs(lowp[static_cast<size_t>(i)] - want));
    scale = std::max(scale, std::fabs(want));
  }
  int64_t written_outside = 0;
  for (size_t i = 0; i < got.size(); ++i) written_outside += !inside[i] && got[i] != kPoison;
  scale = std::max(scale, floor_scale);
  const double tol = grad_tolerance(lowp_err, scale, dt);
  char line[320];
  std::snprintf(line, sizeof line, "%s err %.3g (tol %.3g, lowp %.3g, max|ref| %.3g)", name, err, tol, lowp_err, scale);
  EXPECT_EQ(nonfinite, 0) << what << " [seed " << pr.seed << "]: " << nonfinite << " elements of " << name
                          << " are NaN/Inf (unwritten: the poison is NaN)";
  EXPECT_EQ(written_outside, 0) << what << ": " << written_outside << " elements between the rows of " << name
                                << " were written";
  if (err > tol) {
    const int64_t d = worst % t.D, h = (worst / t.D) % t.H, s = (worst / (t.D * t.H)) % t.S, b = worst / (t.D * t.H * t.S);
    ADD_FAILURE() << what << " [seed " << pr.seed << "]: " << line << "; worst at (b=" << b << ", s=" << s
                  << ", h=" << h << ", d=" << d << "): got " << to_float(got[static_cast<size_t>(t.at_dense(worst))], dt)
                  << ", want " << exact[static_cast<size_t>(worst)] << ", lowp " << lowp[static_cast<size_t>(worst)];
  }
  return line;
}

// dq, dk and dv of `g` against the references (check_tensor), scale_t at least 1e-2 of the largest reference gradient
// of the three (for the degenerate tensors, 0 in exact arithmetic); returns a line for the log.
inline std::string check_dq_dk_dv(const DenseProblem& pr, const std::string& what, const Grads& g,
                                  const ref::Gradients& exact, const ref::Gradients& lowp) {
  const double floor_scale = 1e-2 * std::max({max_abs(exact.dq), max_abs(exact.dk), max_abs(exact.dv)});
  return check_tensor(pr, what, "dq", pr.dq, g.dq, exact.dq, lowp.dq, floor_scale) + ", " +
         check_tensor(pr, what, "dk", pr.dk, g.dk, exact.dk, lowp.dk, floor_scale) + ", " +
         check_tensor(pr, what, "dv", pr.dv, g.dv, exact.dv, lowp.dv, floor_scale);
}

}  // namespace flashcore::test_bwd

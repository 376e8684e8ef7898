// GPU tests of the backward pass: flashcore_attention_forward (with LSE), then flashcore_attention_backward on device
// buffers, dq / dk / dv against the float64 reference (reference::attention_backward). Every test SKIPs, with the
// reason, without a GPU the build serves, or when the backward lacks the case's head dim, dtype or the device's arch.
//
// Tolerance (per tensor t of dq, dk, dv):  max |t - t_ref| <= 2 * lowp + atol * scale_t, where lowp =
// max |t_lowp - t_ref| is the error of reference::attention_backward_lowp() (what a kernel computing in the input
// dtype with float32 accumulation gets: the forward's rounded O, P and dS rounded to the dtype before their products,
// outputs rounded), atol = 4e-3 (bf16) / 1e-3 (fp16) (about one output ulp), and scale_t = max |t_ref|, at least
// 1e-2 of the largest reference gradient of the three (for the degenerate tensors, e.g. dq and dk of one key, which are
// 0 in exact arithmetic). The factor 2 allows a kernel's other, equally valid, rounding order, as the forward's
// check does (src/check/check.cpp).
// Besides: every element of dq, dk and dv is written and finite, nothing between a padded tensor's rows is written,
// dq of a query row that sees no key is exactly 0, the inputs (O, LSE, dO) are left as they were, and the workspace
// may hold anything (it is filled with 0xff bytes before every call).
//
// Seeds: FLASHCORE_SEED=<n> fixes the base seed; otherwise a fresh one is drawn per run (printed). Failure messages
// name the case's seed.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

namespace ref = flashcore::reference;
using flashcore::test::DeviceBuffer;

constexpr uint16_t kPoison = 0xffff;  // NaN in fp16 and in bf16

uint64_t base_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("FLASHCORE_SEED"); env && *env) return std::strtoull(env, nullptr, 0);
    std::random_device rd;
    const uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::printf("FlashCore backward GPU tests: base seed %llu (set FLASHCORE_SEED to reproduce)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

uint64_t case_seed(const std::string& name) {
  uint64_t h = base_seed() ^ 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
enum class Layout {
  BSHD,    // (batch, seq, heads, head_dim), contiguous
  BHSD,    // (batch, heads, seq, head_dim), contiguous
  Padded,  // (batch, seq, heads, head_dim) with 16 elements between heads and 64 between batch entries
};

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::BSHD: return "bshd";
    case Layout::BHSD: return "bhsd";
    case Layout::Padded: return "padded";
  }
  return "?";
}

flashcore_tensor_strides strides_of(Layout l, int64_t S, int64_t H, int64_t D) {
  switch (l) {
    case Layout::BSHD: return {S * H * D, H * D, D, 1};
    case Layout::BHSD: return {H * S * D, D, S * D, 1};
    case Layout::Padded: return {S * H * (D + 16) + 64, H * (D + 16), D + 16, 1};
  }
  return {};
}

struct Case {
  std::string name;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t head_dim = 128;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1;
  bool causal = false;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  Layout layout = Layout::BSHD;       // Q, K, V, O
  Layout grad_layout = Layout::BSHD;  // dO, dQ, dK, dV
  int32_t deterministic = 0;
};

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld%s%s %s/%s%s",
                c.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16", static_cast<long long>(c.batch),
                static_cast<long long>(c.seqlen_q), static_cast<long long>(c.seqlen_k),
                static_cast<long long>(c.heads_q), static_cast<long long>(c.heads_kv),
                static_cast<long long>(c.head_dim), c.causal ? " causal" : "",
                c.softmax_scale != 0.0f ? (" scale=" + std::to_string(c.softmax_scale)).c_str() : "",
                layout_name(c.layout), layout_name(c.grad_layout), c.deterministic ? " deterministic" : "");
  return buf;
}

// GoogleTest prints parameters with this instead of a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

std::string param_name(const testing::TestParamInfo<Case>& info) {
  std::string out;
  for (char ch : info.param.name) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out.empty() ? std::to_string(info.index) : out;
}

Case make_case(flashcore_dtype dt, int64_t d, bool causal, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv,
               const std::string& suffix = "") {
  Case c;
  c.dtype = dt, c.head_dim = d, c.causal = causal;
  c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = hq, c.heads_kv = hkv;
  c.name = std::string(dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(d) +
           (causal ? "_causal" : "_full") + "_b" + std::to_string(b) + "_sq" + std::to_string(sq) + "_sk" +
           std::to_string(sk) + "_hq" + std::to_string(hq) + "_hkv" + std::to_string(hkv) + suffix;
  return c;
}

// Both dtypes, head dims 64 and 128, causal and not, over the shapes (batch, seqlen_q, seqlen_k, heads_q, heads_kv):
// MHA, one row and one key, odd lengths with GQA 2:1 and 4:2, seqlen_q < seqlen_k and > seqlen_k (causal: rows that
// see no key), MQA 8:1; one long sequence per dtype; then layouts and a non-default softmax scale.
std::vector<Case> backward_cases() {
  const int64_t shapes[][5] = {{2, 128, 128, 4, 4}, {1, 1, 1, 2, 2},     {1, 17, 17, 2, 1},    {2, 113, 113, 4, 2},
                               {1, 257, 511, 2, 2}, {1, 511, 257, 2, 2}, {1, 1024, 1024, 8, 1}};
  std::vector<Case> list;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (const auto& s : shapes) list.push_back(make_case(dt, d, causal, s[0], s[1], s[2], s[3], s[4]));
  list.push_back(make_case(FLASHCORE_DTYPE_BF16, 128, true, 1, 4097, 4097, 1, 1));
  list.push_back(make_case(FLASHCORE_DTYPE_FP16, 64, false, 1, 4097, 4097, 1, 1));
  // Layouts: both (B, H, S, D); padded heads and batch entries; inputs (B, S, H, D) with gradients (B, H, S, D).
  const std::pair<Layout, Layout> layouts[] = {
      {Layout::BHSD, Layout::BHSD}, {Layout::Padded, Layout::Padded}, {Layout::BSHD, Layout::BHSD}};
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (const auto& [in, grad] : layouts) {
      Case c = make_case(dt, dt == FLASHCORE_DTYPE_BF16 ? 128 : 64, true, 2, 113, 200, 4, 2,
                         std::string("_") + layout_name(in) + "_" + layout_name(grad));
      c.layout = in, c.grad_layout = grad;
      list.push_back(c);
    }
  // softmax_scale = 0.3: the LSE the forward wrote for that scale, and the backward's dS * scale.
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (bool causal : {false, true}) {
      Case c = make_case(dt, 128, causal, 2, 128, 300, 4, 2, "_scale0_3");
      c.softmax_scale = 0.3f;
      list.push_back(c);
    }
  return list;
}

// ------------------------------------------------------------------------------------------------
// Device problems
// ------------------------------------------------------------------------------------------------
uint16_t to_bits(float x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
}
float to_float(uint16_t x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x);
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
  void fill_normal(std::mt19937_64& rng, flashcore_dtype dt) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t i = 0; i < elements(); ++i) host[static_cast<size_t>(at_dense(i))] = to_bits(n(rng), dt);
  }
  void* ptr() const { return dev->ptr; }
  void upload() const { ASSERT_EQ(cudaMemcpy(dev->ptr, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess); }
  void download(std::vector<uint16_t>& out) const {
    out.resize(host.size());
    ASSERT_EQ(cudaMemcpy(out.data(), dev->ptr, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void poison() const { ASSERT_EQ(cudaMemset(dev->ptr, 0xff, bytes()), cudaSuccess); }
};

struct Grads {
  std::vector<uint16_t> dq, dk, dv;  // whole extents, as downloaded
};

struct Problem {
  Case c;
  uint64_t seed = 0;
  std::string skip;  // non-empty: why the case cannot run here
  Tensor q, k, v, o, dout, dq, dk, dv;
  std::unique_ptr<DeviceBuffer> lse, workspace;
  uint64_t workspace_bytes = 0;
  std::vector<uint16_t> o_after_forward;
  std::vector<float> lse_after_forward;
  flashcore_attention_params p{};  // the backward's call (device pointers, its workspace)

  int64_t lse_count() const { return c.batch * c.heads_q * c.seqlen_q; }
};

// Sets `pr` up for pr.c (fresh N(0, 1) inputs from pr.seed, NaN between a padded tensor's rows) and runs the forward
// with LSE. Sets pr.skip when this build or device lacks the case.
void prepare(Problem& pr) {
  const Case& c = pr.c;
  pr.q.make(c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.layout);
  pr.o.make(c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.layout);
  pr.k.make(c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.layout);
  pr.v.make(c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.layout);
  pr.dout.make(c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.grad_layout);
  pr.dq.make(c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.grad_layout);
  pr.dk.make(c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.grad_layout);
  pr.dv.make(c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.grad_layout);
  pr.lse = std::make_unique<DeviceBuffer>(static_cast<size_t>(pr.lse_count()) * sizeof(float));
  std::mt19937_64 rng(pr.seed);
  for (Tensor* t : {&pr.q, &pr.k, &pr.v, &pr.dout}) {
    t->fill_normal(rng, c.dtype);
    t->upload();
    if (::testing::Test::HasFatalFailure()) return;
  }

  flashcore_attention_params& p = pr.p;
  flashcore_attention_params_init(&p);
  p.q = pr.q.ptr(), p.k = pr.k.ptr(), p.v = pr.v.ptr(), p.o = pr.o.ptr();
  p.lse = static_cast<float*>(pr.lse->ptr);
  p.dout = pr.dout.ptr(), p.dq = pr.dq.ptr(), p.dk = pr.dk.ptr(), p.dv = pr.dv.ptr();
  p.q_strides = pr.q.st, p.k_strides = pr.k.st, p.v_strides = pr.v.st, p.o_strides = pr.o.st;
  p.dout_strides = pr.dout.st, p.dq_strides = pr.dq.st, p.dk_strides = pr.dk.st, p.dv_strides = pr.dv.st;
  p.batch = c.batch, p.seqlen_q = c.seqlen_q, p.seqlen_k = c.seqlen_k;
  p.num_heads_q = c.heads_q, p.num_heads_kv = c.heads_kv, p.head_dim = c.head_dim;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
  p.deterministic = c.deterministic;

  const flashcore_status vs = flashcore_attention_validate(&p);
  if (vs == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || vs == FLASHCORE_ERROR_UNSUPPORTED_DTYPE) {
    pr.skip = std::string("forward: ") + flashcore_status_string(vs) + ": " + flashcore_last_error();
    return;
  }
  ASSERT_EQ(vs, FLASHCORE_SUCCESS) << flashcore_last_error();

  // The forward, without a workspace: the backward's (any contents) is not the zero-filled one the forward reads.
  flashcore_attention_params fwd = p;
  fwd.workspace = nullptr, fwd.workspace_size = 0;
  pr.o.poison();
  ASSERT_EQ(cudaMemset(pr.lse->ptr, 0xff, static_cast<size_t>(pr.lse_count()) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(flashcore_attention_forward(&fwd, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pr.o.download(pr.o_after_forward);
  pr.lse_after_forward.resize(static_cast<size_t>(pr.lse_count()));
  ASSERT_EQ(cudaMemcpy(pr.lse_after_forward.data(), pr.lse->ptr, pr.lse_after_forward.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);

  uint64_t bytes = 0;
  const flashcore_status ws = flashcore_attention_backward_workspace_size(&p, &bytes);
  if (ws == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || ws == FLASHCORE_ERROR_UNSUPPORTED_DTYPE ||
      ws == FLASHCORE_ERROR_UNSUPPORTED_ARCH) {
    pr.skip = std::string("backward: ") + flashcore_status_string(ws) + ": " + flashcore_last_error();
    return;
  }
  ASSERT_EQ(ws, FLASHCORE_SUCCESS) << flashcore_last_error();
  pr.workspace_bytes = bytes;
  if (bytes > 0) pr.workspace = std::make_unique<DeviceBuffer>(bytes);
  p.workspace = pr.workspace ? pr.workspace->ptr : nullptr;
  p.workspace_size = bytes;
}

// One backward call on `stream` (nullptr: the legacy default stream), with dq, dk, dv poisoned and the workspace filled
// with 0xff bytes before it; the outputs downloaded whole.
void run_backward(Problem& pr, Grads& out, cudaStream_t stream = nullptr) {
  for (const Tensor* t : {&pr.dq, &pr.dk, &pr.dv}) t->poison();
  if (::testing::Test::HasFatalFailure()) return;
  if (pr.workspace) {
    ASSERT_EQ(cudaMemset(pr.workspace->ptr, 0xff, pr.workspace_bytes), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(flashcore_attention_backward(&pr.p, reinterpret_cast<flashcore_stream_t>(stream)), FLASHCORE_SUCCESS)
      << describe(pr.c) << ": " << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << describe(pr.c);
  pr.dq.download(out.dq);
  pr.dk.download(out.dk);
  pr.dv.download(out.dv);
}

// The backward's inputs O, LSE and dO are as they were.
void expect_inputs_unchanged(const Problem& pr) {
  std::vector<uint16_t> o, dout;
  pr.o.download(o);
  pr.dout.download(dout);
  std::vector<float> lse(pr.lse_after_forward.size());
  ASSERT_EQ(cudaMemcpy(lse.data(), pr.lse->ptr, lse.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(o == pr.o_after_forward) << "the backward wrote to O";
  EXPECT_TRUE(dout == pr.dout.host) << "the backward wrote to dO";
  EXPECT_EQ(std::memcmp(lse.data(), pr.lse_after_forward.data(), lse.size() * sizeof(float)), 0)
      << "the backward wrote to LSE";
}

struct References {
  ref::Gradients exact, lowp;
};

References reference(const Problem& pr) {
  flashcore_attention_params host = pr.p;
  host.q = pr.q.host.data(), host.k = pr.k.host.data(), host.v = pr.v.host.data();
  References r;
  r.exact = ref::attention_backward(host, pr.dout.host.data());
  r.lowp = ref::attention_backward_lowp(host, pr.dout.host.data());
  return r;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// One gradient tensor against its references (see the file's comment); returns a line for the log.
std::string check_tensor(const Problem& pr, const char* name, const Tensor& t, const std::vector<uint16_t>& got,
                         const std::vector<double>& exact, const std::vector<double>& lowp, double floor_scale) {
  const flashcore_dtype dt = pr.c.dtype;
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
  const double atol = dt == FLASHCORE_DTYPE_FP16 ? 1e-3 : 4e-3;
  const double tol = 2 * lowp_err + atol * scale;
  char line[320];
  std::snprintf(line, sizeof line, "%s err %.3g (tol %.3g, lowp %.3g, max|ref| %.3g)", name, err, tol, lowp_err, scale);
  EXPECT_EQ(nonfinite, 0) << describe(pr.c) << " [seed " << pr.seed << "]: " << nonfinite << " elements of " << name
                          << " are NaN/Inf (unwritten: the poison is NaN)";
  EXPECT_EQ(written_outside, 0) << describe(pr.c) << ": " << written_outside << " elements between the rows of "
                                << name << " were written";
  if (err > tol) {
    const int64_t d = worst % t.D, h = (worst / t.D) % t.H, s = (worst / (t.D * t.H)) % t.S, b = worst / (t.D * t.H * t.S);
    ADD_FAILURE() << describe(pr.c) << " [seed " << pr.seed << "]: " << line << "; worst at (b=" << b << ", s=" << s
                  << ", h=" << h << ", d=" << d << "): got " << to_float(got[static_cast<size_t>(t.at_dense(worst))], dt)
                  << ", want " << exact[static_cast<size_t>(worst)] << ", lowp " << lowp[static_cast<size_t>(worst)];
  }
  return line;
}

// dq, dk, dv of `g` against the references; dq of a query row that sees no key must be exactly 0.
std::string check_grads(const Problem& pr, const Grads& g, const References& r) {
  const double floor_scale = 1e-2 * std::max({max_abs(r.exact.dq), max_abs(r.exact.dk), max_abs(r.exact.dv)});
  std::string log = check_tensor(pr, "dq", pr.dq, g.dq, r.exact.dq, r.lowp.dq, floor_scale) + ", " +
                    check_tensor(pr, "dk", pr.dk, g.dk, r.exact.dk, r.lowp.dk, floor_scale) + ", " +
                    check_tensor(pr, "dv", pr.dv, g.dv, r.exact.dv, r.lowp.dv, floor_scale);
  const Case& c = pr.c;
  if (c.causal && c.seqlen_q > c.seqlen_k) {
    int64_t nonzero = 0;
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.seqlen_q - c.seqlen_k; ++i)  // rows that see no key
        for (int64_t h = 0; h < c.heads_q; ++h)
          for (int64_t d = 0; d < c.head_dim; ++d)
            nonzero += to_float(g.dq[static_cast<size_t>(pr.dq.at(b, i, h, d))], c.dtype) != 0.0f;
    EXPECT_EQ(nonzero, 0) << describe(c) << ": dq of the rows that see no key must be 0";
  }
  return log;
}

// ------------------------------------------------------------------------------------------------
// The case list against the reference
// ------------------------------------------------------------------------------------------------
class BackwardCase : public testing::TestWithParam<Case> {};

TEST_P(BackwardCase, MatchesReference) {
  FLASHCORE_REQUIRE_GPU();
  Problem pr;
  pr.c = GetParam();
  pr.seed = case_seed(pr.c.name);
  prepare(pr);
  if (HasFatalFailure()) return;
  if (!pr.skip.empty()) GTEST_SKIP() << describe(pr.c) << ": " << pr.skip;
  Grads g;
  run_backward(pr, g);
  if (HasFatalFailure()) return;
  expect_inputs_unchanged(pr);
  const References r = reference(pr);
  std::printf("  %s [seed %llu]: %s\n", describe(pr.c).c_str(), static_cast<unsigned long long>(pr.seed),
              check_grads(pr, g, r).c_str());
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardCase, testing::ValuesIn(backward_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// Determinism: deterministic = 1 gives bit-identical dq, dk, dv; deterministic = 0 bit-identical dk and dv (dq's
// atomic order may vary), every run within the tolerance.
// ------------------------------------------------------------------------------------------------
std::vector<Case> determinism_cases() {
  std::vector<Case> list;
  for (int32_t det : {1, 0}) {
    const std::string suffix = det ? "_det" : "_nondet";
    Case a = make_case(FLASHCORE_DTYPE_BF16, 128, true, 2, 700, 700, 4, 2, suffix);
    Case b = make_case(FLASHCORE_DTYPE_FP16, 64, false, 2, 700, 700, 4, 2, suffix);
    Case m = make_case(FLASHCORE_DTYPE_BF16, 64, false, 1, 700, 700, 8, 1, suffix);  // MQA: 8 heads into one dK
    for (Case* c : {&a, &b, &m}) {
      c->deterministic = det;
      list.push_back(*c);
    }
  }
  return list;
}

class BackwardDeterminism : public testing::TestWithParam<Case> {};

TEST_P(BackwardDeterminism, RepeatedRuns) {
  FLASHCORE_REQUIRE_GPU();
  constexpr int kRuns = 4;
  Problem pr;
  pr.c = GetParam();
  pr.seed = case_seed(pr.c.name);
  prepare(pr);
  if (HasFatalFailure()) return;
  if (!pr.skip.empty()) GTEST_SKIP() << describe(pr.c) << ": " << pr.skip;
  const References r = reference(pr);
  Grads first;
  run_backward(pr, first);
  if (HasFatalFailure()) return;
  std::printf("  %s [seed %llu]: %s\n", describe(pr.c).c_str(), static_cast<unsigned long long>(pr.seed),
              check_grads(pr, first, r).c_str());
  for (int run = 1; run < kRuns; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    Grads again;
    run_backward(pr, again);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(again.dk == first.dk) << describe(pr.c) << ": dk differs between runs";
    EXPECT_TRUE(again.dv == first.dv) << describe(pr.c) << ": dv differs between runs";
    if (pr.c.deterministic) {
      EXPECT_TRUE(again.dq == first.dq) << describe(pr.c) << ": dq differs between runs (deterministic = 1)";
    } else {
      check_grads(pr, again, r);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Repeat, BackwardDeterminism, testing::ValuesIn(determinism_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// Streams: on a non-blocking stream the result is the default stream's, bit for bit (deterministic = 1).
// ------------------------------------------------------------------------------------------------
TEST(BackwardStream, NonBlockingStreamGivesTheSameResult) {
  FLASHCORE_REQUIRE_GPU();
  Problem pr;
  pr.c = make_case(FLASHCORE_DTYPE_BF16, 128, true, 2, 200, 333, 4, 2, "_stream");
  pr.c.deterministic = 1;
  pr.seed = case_seed(pr.c.name);
  prepare(pr);
  if (HasFatalFailure()) return;
  if (!pr.skip.empty()) GTEST_SKIP() << describe(pr.c) << ": " << pr.skip;
  Grads on_default, on_stream;
  run_backward(pr, on_default);
  if (HasFatalFailure()) return;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  run_backward(pr, on_stream, s);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  if (HasFatalFailure()) return;
  EXPECT_TRUE(on_stream.dq == on_default.dq);
  EXPECT_TRUE(on_stream.dk == on_default.dk);
  EXPECT_TRUE(on_stream.dv == on_default.dv);
  check_grads(pr, on_stream, reference(pr));
}

// ------------------------------------------------------------------------------------------------
// Bad arguments on a device: the workspace rules, and host memory for a gradient; nothing written.
// ------------------------------------------------------------------------------------------------
class BackwardBadArgs : public testing::Test {
 protected:
  void SetUp() override {
    FLASHCORE_REQUIRE_GPU();
    flashcore_capabilities caps;
    flashcore_capabilities_init(&caps);
    ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
    // A compiled (dtype, head_dim) the backward takes.
    for (int i = 0; i < caps.num_dtypes && pr.c.name.empty(); ++i) {
      const flashcore_dtype dt = caps.dtypes[i];
      if (dt != FLASHCORE_DTYPE_BF16 && dt != FLASHCORE_DTYPE_FP16) continue;
      for (int j = 0; j < caps.num_head_dims && pr.c.name.empty(); ++j) {
        if (caps.head_dims[j] == 64 || caps.head_dims[j] == 128) {
          pr.c = make_case(dt, caps.head_dims[j], true, 1, 128, 128, 2, 2, "_badargs");
        }
      }
    }
    if (pr.c.name.empty()) GTEST_SKIP() << "no fp16 / bf16 kernel of head_dim 64 or 128 in this build";
    pr.seed = case_seed(pr.c.name);
    prepare(pr);
    if (HasFatalFailure()) return;
    if (!pr.skip.empty()) GTEST_SKIP() << describe(pr.c) << ": " << pr.skip;
    ASSERT_GT(pr.workspace_bytes, 0u) << "the backward needs a workspace (flashcore.h: the fp32 dQ accumulator)";
  }

  // The backward refuses `p` with `want` and a message holding `needle`; dq, dk and dv keep their poison.
  void expect_rejected(const flashcore_attention_params& p, flashcore_status want, const std::string& needle) {
    for (const Tensor* t : {&pr.dq, &pr.dk, &pr.dv}) t->poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const flashcore_status st = flashcore_attention_backward(&p, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_EQ(st, want) << flashcore_status_string(st) << ": " << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const Tensor* t : {&pr.dq, &pr.dk, &pr.dv}) {
      std::vector<uint16_t> got;
      t->download(got);
      for (uint16_t x : got) ASSERT_EQ(x, kPoison) << "a rejected call wrote a gradient";
    }
  }

  Problem pr;
};

TEST_F(BackwardBadArgs, WorkspaceMissingOrTooSmall) {
  flashcore_attention_params p = pr.p;
  p.workspace = nullptr;
  p.workspace_size = 0;
  expect_rejected(p, FLASHCORE_ERROR_INVALID_ARGUMENT, "workspace");
  p = pr.p;
  p.workspace_size = pr.workspace_bytes - 1;
  expect_rejected(p, FLASHCORE_ERROR_INVALID_ARGUMENT, "workspace");
  // The query itself: bytes NULL.
  EXPECT_EQ(flashcore_attention_backward_workspace_size(&pr.p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  // At least the fp32 dQ accumulator (flashcore.h).
  const Case& c = pr.c;
  EXPECT_GE(pr.workspace_bytes, uint64_t(c.batch * c.heads_q * c.seqlen_q * c.head_dim * 4));
  // Exactly the size works.
  Grads g;
  run_backward(pr, g);
}

TEST_F(BackwardBadArgs, HostMemoryGradient) {
  // A kernel cannot write host memory: the device checks refuse it, naming the tensor.
  std::vector<uint16_t> host(pr.dq.host.size());
  flashcore_attention_params p = pr.p;
  p.dq = host.data();
  expect_rejected(p, FLASHCORE_ERROR_INVALID_ARGUMENT, "dq");
}

TEST_F(BackwardBadArgs, GoodCallAfterErrors) {
  flashcore_attention_params bad = pr.p;
  bad.dout = nullptr;
  ASSERT_EQ(flashcore_attention_backward(&bad, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  Grads g;
  run_backward(pr, g);
  if (HasFatalFailure()) return;
  EXPECT_STREQ(flashcore_last_error(), "") << "a successful call must clear the last error";
  check_grads(pr, g, reference(pr));
}

}  // namespace

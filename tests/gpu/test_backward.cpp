// GPU tests of the backward pass: flashcore_attention_forward (with LSE), then flashcore_attention_backward on device
// buffers, dq / dk / dv against the float64 reference (reference::attention_backward). Every test SKIPs, with the
// reason, without a GPU the build serves, or when the forward or the backward lacks the case's head dims (head_dim,
// or the pair (head_dim, head_dim_v)), dtype or the device's arch (the C API's status says so: validate_forward and
// make_workspace).
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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/backward_test_util.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

using namespace flashcore::test_bwd;

uint64_t case_seed(const std::string& name) {
  static const uint64_t base = draw_base_seed("FlashCore backward GPU tests");
  return hash_seed(base, 0xcbf29ce484222325ull, name);
}

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------
struct Case {
  std::string name;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t head_dim = 128;
  int64_t head_dim_v = 0;  // V's, O's, dO's and dV's head dim (MLA's 128 with head_dim 192); 0: head_dim
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1;
  bool causal = false;
  float softmax_scale = 0.0f;  // 0: 1/sqrt(head_dim)
  Layout layout = Layout::BSHD;       // Q, K, V, O
  Layout grad_layout = Layout::BSHD;  // dO, dQ, dK, dV
  int32_t deterministic = 0;
};

std::string describe(const Case& c) {
  char buf[256];
  const std::string dv = c.head_dim_v != 0 ? " Dv=" + std::to_string(c.head_dim_v) : "";
  std::snprintf(buf, sizeof buf, "%s B=%lld Sq=%lld Sk=%lld Hq=%lld Hkv=%lld D=%lld%s%s%s %s/%s%s",
                c.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16", static_cast<long long>(c.batch),
                static_cast<long long>(c.seqlen_q), static_cast<long long>(c.seqlen_k),
                static_cast<long long>(c.heads_q), static_cast<long long>(c.heads_kv),
                static_cast<long long>(c.head_dim), dv.c_str(), c.causal ? " causal" : "",
                c.softmax_scale != 0.0f ? (" scale=" + std::to_string(c.softmax_scale)).c_str() : "",
                layout_name(c.layout), layout_name(c.grad_layout), c.deterministic ? " deterministic" : "");
  return buf;
}

// GoogleTest prints parameters with this instead of a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }

std::string param_name(const testing::TestParamInfo<Case>& info) {
  const std::string out = identifier(info.param.name);
  return out.empty() ? std::to_string(info.index) : out;
}

// The case's name shows its head dims: "_d128", or "_d192v128" with a head_dim_v (dv) of its own.
Case make_case(flashcore_dtype dt, int64_t d, bool causal, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv,
               const std::string& suffix = "", int64_t dv = 0) {
  Case c;
  c.dtype = dt, c.head_dim = d, c.head_dim_v = dv, c.causal = causal;
  c.batch = b, c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = hq, c.heads_kv = hkv;
  c.name = std::string(dt == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(d) +
           (dv != 0 ? "v" + std::to_string(dv) : "") + (causal ? "_causal" : "_full") + "_b" + std::to_string(b) +
           "_sq" + std::to_string(sq) + "_sk" + std::to_string(sk) + "_hq" + std::to_string(hq) + "_hkv" +
           std::to_string(hkv) + suffix;
  return c;
}

// Both dtypes, head dims 64, 128 and 256 (sm90; the portable backend skips 256), causal and not, over the shapes
// (batch, seqlen_q, seqlen_k, heads_q, heads_kv): MHA, one row and one key, odd lengths with GQA 2:1 and 4:2,
// seqlen_q < seqlen_k and > seqlen_k (causal: rows that see no key), MQA 8:1; head dims 96 and 192 and the pair
// (head_dim, head_dim_v) = (192, 128) (sm90; skipped where the build has no backward for them) over a subset of the
// shapes; one long sequence per dtype (and one at head dim 256); then layouts (also at (192, 128)) and a non-default
// softmax scale.
std::vector<Case> backward_cases() {
  const int64_t shapes[][5] = {{2, 128, 128, 4, 4}, {1, 1, 1, 2, 2},     {1, 17, 17, 2, 1},    {2, 113, 113, 4, 2},
                               {1, 257, 511, 2, 2}, {1, 511, 257, 2, 2}, {1, 1024, 1024, 8, 1}};
  std::vector<Case> list;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int64_t d : {64, 128, 256})
      for (bool causal : {false, true})
        for (const auto& s : shapes) list.push_back(make_case(dt, d, causal, s[0], s[1], s[2], s[3], s[4]));
  // (head_dim, head_dim_v; 0: head_dim) over MHA, odd lengths with GQA 2:1 and 4:2, seqlen_q < and > seqlen_k.
  const int64_t head_dim_pairs[][2] = {{96, 0}, {192, 0}, {192, 128}};
  const int64_t odd_shapes[][5] = {
      {2, 128, 128, 4, 4}, {1, 17, 17, 2, 1}, {2, 113, 113, 4, 2}, {1, 257, 511, 2, 2}, {1, 511, 257, 2, 2}};
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (const auto& hd : head_dim_pairs)
      for (bool causal : {false, true})
        for (const auto& s : odd_shapes)
          list.push_back(make_case(dt, hd[0], causal, s[0], s[1], s[2], s[3], s[4], "", hd[1]));
  list.push_back(make_case(FLASHCORE_DTYPE_BF16, 128, true, 1, 4097, 4097, 1, 1));
  list.push_back(make_case(FLASHCORE_DTYPE_FP16, 64, false, 1, 4097, 4097, 1, 1));
  list.push_back(make_case(FLASHCORE_DTYPE_BF16, 256, true, 1, 4097, 4097, 1, 1));
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
  // (192, 128) with padded heads and with (B, H, S, D) gradients: V, O, dO and dV of strides of their own.
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (const auto& [in, grad] : {layouts[1], layouts[2]}) {
      Case c = make_case(dt, 192, true, 2, 113, 200, 4, 2,
                         std::string("_") + layout_name(in) + "_" + layout_name(grad), 128);
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
struct Problem : DenseProblem {
  Case c;
};

// Sets `pr` up for pr.c (fresh N(0, 1) inputs from pr.seed, NaN between a padded tensor's rows) and runs the forward
// with LSE. Sets pr.skip when this build or device lacks the case.
void prepare(Problem& pr) {
  const Case& c = pr.c;
  pr.make_tensors(c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim, c.layout, c.grad_layout,
                  c.head_dim_v);
  std::mt19937_64 rng(pr.seed);
  pr.fill_inputs(rng, c.dtype);
  if (::testing::Test::HasFatalFailure()) return;

  pr.init_call();
  flashcore_attention_params& p = pr.p;
  p.dtype = c.dtype, p.causal = c.causal ? 1 : 0, p.softmax_scale = c.softmax_scale;
  p.deterministic = c.deterministic;

  validate_forward(pr);
  if (::testing::Test::HasFatalFailure() || !pr.skip.empty()) return;
  run_forward(pr, describe(c));
  if (::testing::Test::HasFatalFailure()) return;
  make_workspace(pr, describe(c));
}

// One backward call on `stream` (nullptr: the legacy default stream), with dq, dk, dv poisoned and the workspace filled
// with 0xff bytes before it; the outputs downloaded whole.
void run_backward(Problem& pr, Grads& out, cudaStream_t stream = nullptr) {
  poison_for_backward(pr);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(flashcore_attention_backward(&pr.p, reinterpret_cast<flashcore_stream_t>(stream)), FLASHCORE_SUCCESS)
      << describe(pr.c) << ": " << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << describe(pr.c);
  download_grads(pr, out);
}

struct References {
  ref::Gradients exact, lowp;
};

References reference(const Problem& pr) {
  const flashcore_attention_params host = pr.host_call();
  References r;
  r.exact = ref::attention_backward(host, pr.dout.host.data());
  r.lowp = ref::attention_backward_lowp(host, pr.dout.host.data());
  return r;
}

// dq, dk, dv of `g` against the references; dq of a query row that sees no key must be exactly 0.
std::string check_grads(const Problem& pr, const Grads& g, const References& r) {
  std::string log = check_dq_dk_dv(pr, describe(pr.c), g, r.exact, r.lowp);
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
    Case w = make_case(FLASHCORE_DTYPE_BF16, 256, true, 2, 700, 700, 4, 2, suffix);  // the wide kernel's atomics
    Case v = make_case(FLASHCORE_DTYPE_BF16, 192, true, 2, 700, 700, 4, 2, suffix, 128);  // MLA's (192, 128)
    for (Case* c : {&a, &b, &m, &w, &v}) {
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
    expect_same_as_first_run(describe(pr.c), pr.c.deterministic != 0, first, again);
    if (!pr.c.deterministic) check_grads(pr, again, r);
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
    poison_grads(pr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const flashcore_status st = flashcore_attention_backward(&p, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_EQ(st, want) << flashcore_status_string(st) << ": " << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    expect_grads_poisoned(pr);
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

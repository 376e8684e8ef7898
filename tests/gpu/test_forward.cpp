// GPU correctness suite: every case of check::cases(false) (and the quick list) against the float64
// reference, bit-exact determinism, and the C ABI's argument handling on a device.
// Without an sm_90 device every test is SKIPPED with the reason.
//
// Seeds: FLASHCORE_SEED=<n> in the environment fixes the base seed; otherwise a fresh one is drawn per
// run. Every failure message names the seed of its case, and check::run_case(case, seed) reproduces it.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "check/check.h"

#if __has_include("gpu_skip.h")
#include "gpu_skip.h"
#endif
#ifndef FLASHCORE_REQUIRE_GPU
#define FLASHCORE_REQUIRE_GPU()                                                     \
  do {                                                                              \
    if (const std::string why_ = flashcore::check::device_skip_reason(); !why_.empty()) \
      GTEST_SKIP() << why_;                                                         \
  } while (0)
#endif

namespace check = flashcore::check;

// GoogleTest prints parameters with this instead of a byte dump.
namespace flashcore::check {
void PrintTo(const Case& c, std::ostream* os) { *os << describe(c); }
}  // namespace flashcore::check

namespace {

uint64_t base_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* env = std::getenv("FLASHCORE_SEED"); env && *env) return std::strtoull(env, nullptr, 0);
    std::random_device rd;
    const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    std::printf("FlashCore GPU tests: base seed %llu (set FLASHCORE_SEED to reproduce)\n",
                static_cast<unsigned long long>(seed));
    return seed;
  }();
  return seed;
}

// A per-case seed: fresh each run (unless FLASHCORE_SEED is set), different for every case name.
uint64_t case_seed(const std::string& name) {
  uint64_t h = base_seed() ^ 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::string sanitize(const std::string& s) {
  std::string out;
  for (char ch : s) out += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return out.empty() ? std::string("case") : out;
}

std::string param_name(const testing::TestParamInfo<check::Case>& info) {
  return sanitize(info.param.name.empty() ? std::to_string(info.index) : info.param.name);
}

std::string report(const check::Case& c, const check::Result& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s [seed %llu]: O err %.3g (tol %.3g, lowp %.3g), LSE err %.3g (tol %.3g, lowp %.3g), rows/head %lld",
                check::describe(c).c_str(), static_cast<unsigned long long>(r.seed), r.o_err, r.o_tol, r.lowp_o_err,
                r.lse_err, r.lse_tol, r.lowp_lse_err, static_cast<long long>(r.rows_checked));
  return buf;
}

void expect_case_passes(const check::Case& c, int repeats) {
  FLASHCORE_REQUIRE_GPU();
  const uint64_t seed = case_seed(c.name);
  const check::Result r = check::run_case(c, seed, repeats);
  if (r.skipped) GTEST_SKIP() << check::describe(c) << ": " << r.message;
  std::printf("  %s\n", report(c, r).c_str());
  EXPECT_TRUE(r.passed) << report(c, r) << "\n  " << r.message;
  EXPECT_FALSE(r.unwritten);
  EXPECT_FALSE(r.nonfinite);
  EXPECT_TRUE(r.deterministic);
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// The case list
// ------------------------------------------------------------------------------------------------
class ForwardCase : public testing::TestWithParam<check::Case> {};

TEST_P(ForwardCase, MatchesReference) { expect_case_passes(GetParam(), 1); }

INSTANTIATE_TEST_SUITE_P(Full, ForwardCase, testing::ValuesIn(check::cases(false)), param_name);
INSTANTIATE_TEST_SUITE_P(Quick, ForwardCase, testing::ValuesIn(check::cases(true)), param_name);

// ------------------------------------------------------------------------------------------------
// Determinism: 20 runs bit-identical, every head dim, causal and not.
// ------------------------------------------------------------------------------------------------
std::vector<check::Case> determinism_cases() {
  std::vector<check::Case> list;
  int n = 0;
  for (int64_t D : {64, 128, 256})
    for (bool causal : {false, true}) {
      check::Case c;
      c.dtype = n % 2 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
      c.head_dim = D, c.causal = causal, c.batch = 2, c.heads_q = 4, c.heads_kv = 2;
      c.seqlen_q = causal ? 1000 : 257, c.seqlen_k = 1000;
      c.layout = n % 3 == 1 ? check::Layout::BHSD : check::Layout::BSHD;
      c.name = "det_" + std::string(c.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(D) +
               (causal ? "_causal" : "_full");
      list.push_back(c);
      ++n;
    }
  return list;
}

class ForwardDeterminism : public testing::TestWithParam<check::Case> {};

TEST_P(ForwardDeterminism, TwentyRunsBitIdentical) { expect_case_passes(GetParam(), 20); }

INSTANTIATE_TEST_SUITE_P(Repeat20, ForwardDeterminism, testing::ValuesIn(determinism_cases()), param_name);

// ------------------------------------------------------------------------------------------------
// Streams
// ------------------------------------------------------------------------------------------------
namespace {

check::Case stream_case() {
  check::Case c;
  c.dtype = FLASHCORE_DTYPE_BF16, c.head_dim = 128, c.batch = 2, c.heads_q = 4, c.heads_kv = 2;
  c.seqlen_q = 200, c.seqlen_k = 333, c.causal = true, c.name = "stream_case";
  return c;
}

void expect_passes_on(flashcore_stream_t stream) {
  const check::Case c = stream_case();
  const uint64_t seed = case_seed(c.name);
  const check::Result r = check::run_case_on_stream(c, seed, 2, stream);
  if (r.skipped) GTEST_SKIP() << r.message;
  EXPECT_TRUE(r.passed) << report(c, r) << "\n  " << r.message;
}

}  // namespace

TEST(ForwardStream, NullStreamWorks) {
  FLASHCORE_REQUIRE_GPU();
  expect_passes_on(nullptr);
}

TEST(ForwardStream, NonDefaultStreamsWork) {
  FLASHCORE_REQUIRE_GPU();
  for (unsigned flags : {cudaStreamDefault, cudaStreamNonBlocking}) {
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
    expect_passes_on(reinterpret_cast<flashcore_stream_t>(s));
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
}

// ------------------------------------------------------------------------------------------------
// Bad arguments on a device: an error status, a message, and O / LSE left untouched.
// ------------------------------------------------------------------------------------------------
class ForwardBadArgs : public testing::Test {
 protected:
  static constexpr int64_t B = 1, S = 128, H = 2;
  int64_t D = 0;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float* lse = nullptr;
  size_t bytes = 0;
  flashcore_attention_params good{};

  void SetUp() override {
    FLASHCORE_REQUIRE_GPU();
    if (const std::string why = check::device_skip_reason(); !why.empty()) GTEST_SKIP() << why;
    flashcore_capabilities caps;
    flashcore_capabilities_init(&caps);
    ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
    if (caps.num_dtypes == 0 || caps.num_head_dims == 0) GTEST_SKIP() << "no kernel compiled in";
    dtype = caps.dtypes[0], D = caps.head_dims[0];
    bytes = static_cast<size_t>(B * S * H * D) * 2;
    for (void** p : {&q, &k, &v, &o}) ASSERT_EQ(cudaMalloc(p, bytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&lse), static_cast<size_t>(B * H * S) * sizeof(float)), cudaSuccess);
    for (void* p : {q, k, v}) ASSERT_EQ(cudaMemset(p, 0, bytes), cudaSuccess);
    flashcore_attention_params_init(&good);
    good.q = q, good.k = k, good.v = v, good.o = o, good.lse = lse;
    good.batch = B, good.seqlen_q = good.seqlen_k = S, good.num_heads_q = good.num_heads_kv = H, good.head_dim = D;
    good.dtype = dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&good, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(flashcore_attention_validate(&good), FLASHCORE_SUCCESS) << flashcore_last_error();
  }
  void TearDown() override {
    for (void* p : {q, k, v, o, static_cast<void*>(lse)})
      if (p) cudaFree(p);
  }

  void poison() {
    ASSERT_EQ(cudaMemset(o, 0xff, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(lse, 0xff, static_cast<size_t>(B * H * S) * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void expect_untouched(const std::string& what) {
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
    std::vector<unsigned char> ho(bytes), hl(static_cast<size_t>(B * H * S) * sizeof(float));
    ASSERT_EQ(cudaMemcpy(ho.data(), o, ho.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(hl.data(), lse, hl.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    size_t touched = 0;
    for (unsigned char b : ho) touched += b != 0xff;
    for (unsigned char b : hl) touched += b != 0xff;
    EXPECT_EQ(touched, 0u) << what << ": O/LSE bytes were written by a failing call";
  }
  // `expected` = SUCCESS means "any error status".
  void expect_rejected(const char* what, const flashcore_attention_params& p, flashcore_status expected) {
    SCOPED_TRACE(what);
    poison();
    const flashcore_status st = flashcore_attention_forward(&p, nullptr);
    EXPECT_NE(st, FLASHCORE_SUCCESS) << what;
    if (expected != FLASHCORE_SUCCESS) {
      EXPECT_EQ(st, expected) << what << ": got " << flashcore_status_string(st) << " (" << flashcore_last_error() << ")";
    }
    EXPECT_STRNE(flashcore_last_error(), "") << what << ": no error message";
    EXPECT_EQ(flashcore_attention_validate(&p), st) << what << ": validate and forward disagree";
    expect_untouched(what);
  }
};

TEST_F(ForwardBadArgs, RejectedCallsLeaveOutputsUntouched) {
  auto with = [&](auto&& mutate) {
    flashcore_attention_params p = good;
    mutate(p);
    return p;
  };
  using P = flashcore_attention_params;
  expect_rejected("q = NULL", with([](P& p) { p.q = nullptr; }), FLASHCORE_ERROR_NULL_POINTER);
  expect_rejected("k = NULL", with([](P& p) { p.k = nullptr; }), FLASHCORE_ERROR_NULL_POINTER);
  expect_rejected("o = NULL", with([](P& p) { p.o = nullptr; }), FLASHCORE_ERROR_NULL_POINTER);
  expect_rejected("seqlen_q = 0", with([](P& p) { p.seqlen_q = 0; }), FLASHCORE_ERROR_INVALID_SIZE);
  expect_rejected("seqlen_k = -1", with([](P& p) { p.seqlen_k = -1; }), FLASHCORE_ERROR_INVALID_SIZE);
  expect_rejected("batch = 0", with([](P& p) { p.batch = 0; }), FLASHCORE_ERROR_INVALID_SIZE);
  expect_rejected("batch = 2^62 (extent overflow)", with([](P& p) { p.batch = int64_t{1} << 62; }),
                  FLASHCORE_ERROR_SIZE_OVERFLOW);
  expect_rejected("Hq=2, Hkv=3", with([](P& p) { p.num_heads_kv = 3; }), FLASHCORE_ERROR_INVALID_HEAD_RATIO);
  expect_rejected("head_dim = 80", with([](P& p) { p.head_dim = 80; }), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
  expect_rejected("dtype = fp32", with([](P& p) { p.dtype = FLASHCORE_DTYPE_FP32; }), FLASHCORE_ERROR_UNSUPPORTED_DTYPE);
  expect_rejected("dtype = 99", with([](P& p) { p.dtype = static_cast<flashcore_dtype>(99); }), FLASHCORE_SUCCESS);
  expect_rejected("q misaligned by one element",
                  with([](P& p) { p.q = static_cast<const char*>(p.q) + 2; }), FLASHCORE_ERROR_MISALIGNED_POINTER);
  expect_rejected("q_strides.seq = 12", with([](P& p) { p.q_strides.seq = 12; }), FLASHCORE_ERROR_INVALID_STRIDE);
  expect_rejected("o_strides.dim = 2", with([](P& p) { p.o_strides.dim = 2; }), FLASHCORE_ERROR_INVALID_STRIDE);
  expect_rejected("k_strides.head = -8", with([](P& p) { p.k_strides.head = -8; }), FLASHCORE_ERROR_INVALID_STRIDE);
  expect_rejected("o aliases q", with([&](P& p) { p.o = q; }), FLASHCORE_ERROR_OVERLAPPING_OUTPUT);
  expect_rejected("lse inside o", with([&](P& p) { p.lse = static_cast<float*>(o); }), FLASHCORE_ERROR_OVERLAPPING_OUTPUT);
  expect_rejected("softmax_scale = -1", with([](P& p) { p.softmax_scale = -1.0f; }), FLASHCORE_ERROR_INVALID_ARGUMENT);
  expect_rejected("softmax_scale = NaN", with([](P& p) { p.softmax_scale = NAN; }), FLASHCORE_ERROR_INVALID_ARGUMENT);
  expect_rejected("struct_size = 0", with([](P& p) { p.struct_size = 0; }), FLASHCORE_ERROR_INVALID_ARGUMENT);
  expect_rejected("causal = 2", with([](P& p) { p.causal = 2; }), FLASHCORE_SUCCESS);
}

TEST_F(ForwardBadArgs, NullParams) {
  poison();
  // The library reports a NULL params struct as an invalid argument (tests/cpu/test_validation.cpp agrees).
  EXPECT_EQ(flashcore_attention_forward(nullptr, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flashcore_attention_validate(nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  expect_untouched("params = NULL");
}

TEST_F(ForwardBadArgs, GoodCallAfterErrorsWritesOutputs) {
  flashcore_attention_params bad = good;
  bad.q = nullptr;
  ASSERT_NE(flashcore_attention_forward(&bad, nullptr), FLASHCORE_SUCCESS);
  poison();
  ASSERT_EQ(flashcore_attention_forward(&good, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_STREQ(flashcore_last_error(), "") << "a successful call must clear the last error";
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> ho(bytes / 2);
  ASSERT_EQ(cudaMemcpy(ho.data(), o, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  size_t poisoned = 0;
  for (uint16_t x : ho) poisoned += x == 0xffff;
  EXPECT_EQ(poisoned, 0u);  // inputs are zero: O = mean of V = 0
  for (uint16_t x : ho) ASSERT_EQ(x & 0x7fff, 0) << "O of zero inputs must be 0";
}

// The growable struct on a device: a 0.1-sized struct and a newer caller's zero-tailed one run; a nonzero tail
// is refused before anything is written.
TEST_F(ForwardBadArgs, StructSizesOfOtherLayouts) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 32, 0);
  std::memcpy(buf.data(), &good, sizeof(good));
  auto* p = reinterpret_cast<flashcore_attention_params*>(buf.data());
  p->struct_size = FLASHCORE_ATTENTION_PARAMS_V1_SIZE;
  std::memset(buf.data() + 236, 0xEE, buf.size() - 236);  // a 0.1 caller's padding and beyond: never read
  poison();
  ASSERT_EQ(flashcore_attention_forward(p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::memcpy(buf.data(), &good, sizeof(good));
  std::memset(buf.data() + sizeof(good), 0, buf.size() - sizeof(good));
  p->struct_size = static_cast<uint32_t>(buf.size());
  ASSERT_EQ(flashcore_attention_forward(p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  buf[sizeof(good) + 5] = 1;
  poison();
  EXPECT_EQ(flashcore_attention_forward(p, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("byte " + std::to_string(sizeof(good) + 5)), std::string::npos)
      << flashcore_last_error();
  expect_untouched("nonzero tail past sizeof(flashcore_attention_params)");
}

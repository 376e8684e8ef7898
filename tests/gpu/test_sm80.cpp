// The portable backend (mma.sync + cp.async, src/kernels/sm80) on the GPU at hand, forced with
// FLASHCORE_BACKEND=sm80 (set before the calls, unset after): on Hopper this runs the portable kernels from
// their plain sm_90 image; on Ampere/Ada it is the backend the device gets anyway. The full check-harness case
// list, determinism, every portable kernel config, and what capabilities / backend_for_arch report.
// Skips visibly without a GPU that the portable backend has an image for.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"

namespace {

// FLASHCORE_BACKEND=sm80 for the scope; the previous value (or its absence) is put back after.
class ForcePortable {
 public:
  ForcePortable() {
    if (const char* old = std::getenv("FLASHCORE_BACKEND"); old != nullptr) had_ = true, old_ = old;
    setenv("FLASHCORE_BACKEND", "sm80", 1);
  }
  ~ForcePortable() {
    if (had_) {
      setenv("FLASHCORE_BACKEND", old_.c_str(), 1);
    } else {
      unsetenv("FLASHCORE_BACKEND");
    }
  }
  ForcePortable(const ForcePortable&) = delete;
  ForcePortable& operator=(const ForcePortable&) = delete;

 private:
  bool had_ = false;
  std::string old_;
};

int device_cc() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

// "" when the portable backend can run on the current device (checked with FLASHCORE_BACKEND=sm80 set).
std::string portable_skip_reason() {
  if (!flashcore::testing::cuda_device_visible()) return "no CUDA device visible";
  const int cc = device_cc();
  ForcePortable force;
  const char* b = flashcore::backend::backend_for_arch(cc);
  if (b == nullptr || std::string(b) != "sm80") {
    return "the portable (sm80) backend of this build has no image for compute capability " + std::to_string(cc) +
           " (FLASHCORE_BUILD_SM80 / FLASHCORE_SM80_ARCHS)";
  }
  return "";
}

#define REQUIRE_PORTABLE_GPU()                                                              \
  do {                                                                                      \
    FLASHCORE_REQUIRE_GPU();                                                                \
    const std::string why_ = portable_skip_reason();                                        \
    if (!why_.empty()) GTEST_SKIP() << "GPU test skipped: " << why_;                        \
  } while (0)

TEST(PortableBackend, CapabilitiesReportSm80WhenForced) {
  REQUIRE_PORTABLE_GPU();
  const int cc = device_cc();
  ForcePortable force;
  EXPECT_STREQ(flashcore::backend::backend_for_arch(cc), "sm80");
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(caps.device_arch, cc);
  EXPECT_EQ(caps.device_supported, 1);
  EXPECT_STREQ(caps.device_backend, "sm80");
}

TEST(PortableBackend, EnvironmentIsReadPerCall) {
  REQUIRE_PORTABLE_GPU();
  const int cc = device_cc();
  { ForcePortable force; EXPECT_STREQ(flashcore::backend::backend_for_arch(cc), "sm80"); }
  if (std::getenv("FLASHCORE_BACKEND") == nullptr) {
    EXPECT_STREQ(flashcore::backend::backend_for_arch(cc), cc == 90 ? "sm90" : "sm80");
  }
}

TEST(PortableBackend, FullCaseList) {
  REQUIRE_PORTABLE_GPU();
  ForcePortable force;
  const std::vector<flashcore::check::Case> cases = flashcore::check::cases(false);
  int run = 0, skipped = 0, serving = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const flashcore::check::Case& c = cases[i];
    // Serving layouts (seqused_k, packed varlen, paged, k_new appends) included: the portable kernel runs them too.
    if (flashcore::check::is_serving(c) || !c.seqused_k.empty()) ++serving;
    const flashcore::check::Result r = flashcore::check::run_case(c, 8000 + i);
    if (r.skipped) {
      ++skipped;  // a (dtype, head dim) not compiled in
      continue;
    }
    ++run;
    EXPECT_TRUE(r.passed) << flashcore::check::describe(c) << ": " << r.message << " (o_err " << r.o_err << " / "
                          << r.o_tol << ", lse_err " << r.lse_err << " / " << r.lse_tol << ", seed " << r.seed << ")";
  }
  std::printf("portable backend: %d case(s) run (%d of them serving layouts), %d skipped (not compiled in)\n", run,
              serving, skipped);
  EXPECT_GT(run, 0);
  EXPECT_GT(serving, 0);
}

TEST(PortableBackend, Deterministic) {
  REQUIRE_PORTABLE_GPU();
  ForcePortable force;
  struct Shape { flashcore_dtype dt; int64_t d, b, hq, hkv, sq, sk; bool causal; };
  const Shape shapes[] = {
      {FLASHCORE_DTYPE_BF16, 128, 2, 8, 2, 1000, 1000, true},  {FLASHCORE_DTYPE_FP16, 64, 1, 4, 4, 4097, 4097, false},
      {FLASHCORE_DTYPE_BF16, 256, 1, 2, 1, 300, 2048, true},   {FLASHCORE_DTYPE_FP16, 256, 3, 2, 2, 129, 63, false},
      {FLASHCORE_DTYPE_BF16, 64, 2, 6, 3, 113, 4097, false},
  };
  int run = 0;
  for (const Shape& s : shapes) {
    flashcore::check::Case c;
    c.dtype = s.dt, c.head_dim = s.d, c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv;
    c.seqlen_q = s.sq, c.seqlen_k = s.sk, c.causal = s.causal;
    const flashcore::check::Result r = flashcore::check::run_case(c, 4242 + run, /*repeats=*/5);
    if (r.skipped) continue;
    ++run;
    EXPECT_TRUE(r.passed && r.deterministic) << flashcore::check::describe(c) << ": " << r.message;
  }
  if (run == 0) GTEST_SKIP() << "none of the determinism shapes is compiled in";
}

// Default rows with conditions (src/kernels/sm80/configs.txt): at head dim 256, 64x64x1 where two of its CTAs fit on
// an SM (sm_90 forced) for up to 4k keys non-causal and 8k causal, else 128x64x1 (sm_80/87/90), split into warp pairs
// (128x64x1-s2) when non-causal.
TEST(PortableBackend, Head256DefaultFollowsTheSequenceLengthAndTheDevice) {
  REQUIRE_PORTABLE_GPU();
  const int cc = device_cc();
  if (cc != 80 && cc != 87 && cc != 90) GTEST_SKIP() << "the 128x64x1 rows need sm_80/87/90 shared memory";
  if (!flashcore::backend::is_compiled(FLASHCORE_DTYPE_BF16, 256)) GTEST_SKIP() << "bf16 head dim 256 not compiled";
  ForcePortable force;
  // Four disjoint tensors of the largest shape below (validation checks that O overlaps no input).
  const size_t bytes = size_t{16384} * 8 * 256 * 2;
  std::vector<void*> bufs(4, nullptr);
  for (void*& b : bufs) ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  const bool two_ctas = cc == 90;  // 2 x 97 KB of 228 KB per SM; sm_80/87 have 164 KB
  const struct { int causal; int64_t seqlen; const char* expected; } cases[] = {
      {0, 512, two_ctas ? "64x64x1" : "128x64x1-s2"},  {0, 4096, two_ctas ? "64x64x1" : "128x64x1-s2"},
      {0, 4097, "128x64x1-s2"},                         {0, 16384, "128x64x1-s2"},
      {1, 8192, two_ctas ? "64x64x1" : "128x64x1"}, {1, 8193, "128x64x1"},
  };
  for (const auto& c : cases) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = bufs[0], p.k = bufs[1], p.v = bufs[2], p.o = bufs[3];
    p.batch = 1, p.seqlen_q = c.seqlen, p.seqlen_k = c.seqlen, p.num_heads_q = 8, p.num_heads_kv = 8;
    p.head_dim = 256, p.causal = c.causal, p.dtype = FLASHCORE_DTYPE_BF16;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    char name[128] = "";
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_STREQ(name, c.expected) << "causal " << c.causal << ", seqlen " << c.seqlen;
  }
  for (void* b : bufs) cudaFree(b);
}

// Head dim 64 takes the 3-stage ring (S of the next key block computed with P V) where two of its CTAs fit on an SM.
TEST(PortableBackend, Head64DefaultIsTheOverlappedRingWhereTwoCtasFit) {
  REQUIRE_PORTABLE_GPU();
  if (!flashcore::backend::is_compiled(FLASHCORE_DTYPE_BF16, 64)) GTEST_SKIP() << "bf16 head dim 64 not compiled";
  ForcePortable force;
  const int cc = device_cc();
  const bool two_ctas = cc == 80 || cc == 87 || cc == 90;  // 164 or 228 KB per SM; sm_86/89 have 100 KB
  const size_t bytes = size_t{1024} * 8 * 64 * 2;
  std::vector<void*> bufs(4, nullptr);
  for (void*& b : bufs) ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  for (int causal : {0, 1}) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = bufs[0], p.k = bufs[1], p.v = bufs[2], p.o = bufs[3];
    p.batch = 1, p.seqlen_q = 1024, p.seqlen_k = 1024, p.num_heads_q = 8, p.num_heads_kv = 8;
    p.head_dim = 64, p.causal = causal, p.dtype = FLASHCORE_DTYPE_BF16;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    char name[128] = "";
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_STREQ(name, two_ctas ? "128x64x3-w4" : "128x64x2-w4") << "causal " << causal;
  }
  for (void* b : bufs) cudaFree(b);
}

// Every portable config the device can run (on Hopper, forced: all of them), not only the defaults.
TEST(PortableBackend, EveryConfigPassesTheSuiteRules) {
  REQUIRE_PORTABLE_GPU();
  ForcePortable force;
  const struct { int64_t b, hq, hkv, sq, sk; flashcore::check::Layout layout; } shapes[] = {
      {1, 1, 1, 1, 1, flashcore::check::Layout::BSHD},      {2, 4, 2, 17, 113, flashcore::check::Layout::BSHD},
      {1, 2, 1, 113, 17, flashcore::check::Layout::BHSD},   {3, 8, 1, 1000, 1000, flashcore::check::Layout::BSHD},
      {1, 4, 4, 4097, 4097, flashcore::check::Layout::BHSD}, {2, 6, 2, 300, 2048, flashcore::check::Layout::BSHD},
  };
  int runs = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    for (int hd : {64, 128, 256}) {
      for (int causal : {0, 1}) {
        const char* names[16];
        int32_t count = 0;
        if (flashcore_list_kernel_configs(dt, hd, causal, names, 16, &count) != FLASHCORE_SUCCESS) continue;
        for (int i = 0; i < count && i < 16; ++i) {
          for (const auto& s : shapes) {
            flashcore::check::Case c;
            c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv, c.seqlen_q = s.sq, c.seqlen_k = s.sk;
            c.head_dim = hd, c.dtype = dt, c.causal = causal != 0, c.layout = s.layout;
            c.kernel_config = names[i];
            const flashcore::check::Result r = flashcore::check::run_case(c, 777 + runs, /*repeats=*/2);
            EXPECT_TRUE(r.passed && r.deterministic)
                << names[i] << ": " << flashcore::check::describe(c) << ": " << r.message;
            ++runs;
          }
        }
      }
    }
  }
  std::printf("portable backend: %d config case(s) run\n", runs);
  EXPECT_GT(runs, 0);
}

}  // namespace

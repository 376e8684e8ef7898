// Runtime kernel variants on the GPU (src/kernels/sm90/variant.h): a tile config that is not compiled into the
// library, built by nvcc into a cubin, loaded and run through the public API by name, must pass the suite's
// correctness and determinism rules; a deliberately faulty variant (softmax scale x1.05) must fail them.
// The GPU machine may have no nvcc: FLASHCORE_VARIANT_CUBINS=<dir> then provides the cubins, built elsewhere by
// tests/cpu/test_variants.cpp with the same variable (FLASHCORE_KERNEL_SOURCES: where the sources are, when the
// source tree is not where this test was built).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "api/backend.h"
#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "kernels/sm90/variant.h"
#include "variant_specs.h"

namespace {

namespace fs = std::filesystem;
using flashcore::check::Layout;
using flashcore::sm90::KernelRow;
using flashcore::sm90::VariantSpec;

const auto specs = flashcore::test::variant_test_specs;

std::string env_dir() {
  const char* env = std::getenv("FLASHCORE_VARIANT_CUBINS");
  return env != nullptr ? env : "";
}

// The newest "<stem>_*.cubin" in `dir`: a cubin built from sources whose hash this machine cannot recompute.
std::string prebuilt(const std::string& dir, const VariantSpec& spec) {
  const std::string prefix = flashcore::sm90::cubin_stem(spec) + "_";
  std::error_code ec;
  fs::path best;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".cubin") continue;
    if (best.empty() || fs::last_write_time(e.path(), ec) > fs::last_write_time(best, ec)) best = e.path();
  }
  return best.string();
}

// The cubin of `spec`: built (or found by its exact name) in $FLASHCORE_VARIANT_CUBINS or a temp dir; else, without
// nvcc or sources, the newest prebuilt one for the spec. "" with the reason in `why` when there is none.
std::string cubin_for(const VariantSpec& spec, std::string& why) {
  const std::string dir =
      env_dir().empty() ? (fs::temp_directory_path() / "flashcore_variants_gpu").string() : env_dir();
  std::string cubin, error;
  const flashcore_status st = flashcore::sm90::build_variant(spec, dir, cubin, error);
  if (st == FLASHCORE_SUCCESS) return cubin;
  if (st == FLASHCORE_ERROR_UNSUPPORTED_ARCH && !env_dir().empty()) {
    cubin = prebuilt(env_dir(), spec);
    if (!cubin.empty()) {
      std::printf("variants: %s taken as it is (%s)\n", cubin.c_str(), error.c_str());
      return cubin;
    }
  }
  why = "no cubin for " + flashcore::sm90::cubin_stem(spec) + ": " + error +
        (env_dir().empty() ? " (FLASHCORE_VARIANT_CUBINS is not set)" : " (nor one in $FLASHCORE_VARIANT_CUBINS)");
  if (st != FLASHCORE_ERROR_UNSUPPORTED_ARCH) ADD_FAILURE() << why;  // nvcc ran and failed: not a reason to skip
  return "";
}

std::vector<std::string> listed_configs(const VariantSpec& s) {
  const char* names[32];
  int32_t count = 0;
  EXPECT_EQ(flashcore_list_kernel_configs(s.dtype, s.head_dim, s.causal ? 1 : 0, names, 32, &count),
            FLASHCORE_SUCCESS)
      << flashcore_last_error();
  return std::vector<std::string>(names, names + std::min(count, 32));
}

flashcore::check::Case case_of(const VariantSpec& s, const char* config, int64_t b, int64_t hq, int64_t hkv,
                               int64_t sq, int64_t sk, Layout layout) {
  flashcore::check::Case c;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.seqlen_k = sk;
  c.head_dim = s.head_dim, c.dtype = s.dtype, c.causal = s.causal, c.layout = layout;
  c.kernel_config = config;
  return c;
}

TEST(Variants, RegisteredVariantPassesTheSuiteRulesThroughTheApi) {
  FLASHCORE_REQUIRE_BACKEND("sm90");
  int ran = 0;
  for (const VariantSpec& spec : specs()) {
    if (!flashcore::backend::is_compiled(spec.dtype, spec.head_dim)) continue;  // the API refuses the head dim
    std::string why;
    const std::string cubin = cubin_for(spec, why);
    if (cubin.empty()) GTEST_SKIP() << why;
    const std::string name = flashcore::sm90::config_name(spec.shape);
    const KernelRow* row = nullptr;
    std::string error;
    ASSERT_EQ(flashcore::sm90::register_variant(spec, cubin, &row, error), FLASHCORE_SUCCESS) << error;
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(std::string(row->name), name);
    EXPECT_EQ(row->threads, flashcore::sm90::footprint(spec).threads);
    EXPECT_EQ(row->smem_bytes, flashcore::sm90::footprint(spec).smem_bytes);
    EXPECT_FALSE(row->is_default);
    const KernelRow* again = nullptr;
    EXPECT_EQ(flashcore::sm90::register_variant(spec, cubin, &again, error), FLASHCORE_SUCCESS) << error;
    EXPECT_EQ(again, row);  // the same registration, not a second row

    // Listed after the compiled configs of its key; the default stays first.
    const std::vector<std::string> names = listed_configs(spec);
    ASSERT_GE(names.size(), 2u);
    EXPECT_NE(names.front(), name);
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;

    // Odd lengths, Sq != Sk both ways (rows with no visible key under causal), GQA, both layouts, batch > 1,
    // more tiles than SMs; two runs each, bit-identical.
    const struct { int64_t b, hq, hkv, sq, sk; Layout layout; } shapes[] = {
        {1, 1, 1, 1, 1, Layout::BSHD},        {2, 4, 2, 17, 113, Layout::BSHD},   {1, 2, 1, 113, 17, Layout::BHSD},
        {3, 8, 1, 1000, 1000, Layout::BSHD},  {2, 6, 2, 300, 2048, Layout::BSHD}, {1, 4, 4, 4097, 4097, Layout::BHSD},
        {4, 16, 16, 2048, 2048, Layout::BSHD},
    };
    for (const auto& s : shapes) {
      const flashcore::check::Case c = case_of(spec, name.c_str(), s.b, s.hq, s.hkv, s.sq, s.sk, s.layout);
      const flashcore::check::Result r = flashcore::check::run_case(c, 4321 + ran, /*repeats=*/2);
      EXPECT_TRUE(r.passed && r.deterministic && !r.skipped)
          << name << ": " << flashcore::check::describe(c) << ": " << r.message;
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "bf16 head dim 128 is not compiled in: no variant to run";
  std::printf("variants: %d case(s) run\n", ran);
}

TEST(Variants, FaultyVariantFailsTheCorrectnessCheck) {
  FLASHCORE_REQUIRE_BACKEND("sm90");
  const VariantSpec spec = specs()[0];
  if (!flashcore::backend::is_compiled(spec.dtype, spec.head_dim)) GTEST_SKIP() << "bf16 d128 is not compiled in";
  std::string why, error;
  const std::string cubin = cubin_for(spec, why);
  if (cubin.empty()) GTEST_SKIP() << why;
  const std::string good = flashcore::sm90::config_name(spec.shape);
  const std::string faulty = good + "-faulty";
  ASSERT_EQ(flashcore::sm90::register_variant(spec, cubin, nullptr, error), FLASHCORE_SUCCESS) << error;
  ASSERT_EQ(flashcore::sm90::register_faulty_variant_for_testing(spec, cubin, faulty, error), FLASHCORE_SUCCESS)
      << error;
  // The same name from another cubin, or a compiled name, is refused.
  EXPECT_EQ(flashcore::sm90::register_faulty_variant_for_testing(spec, cubin + ".other", faulty, error),
            FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("already registered"), std::string::npos) << error;

  // The same kernel and problem: right with its own scale, wrong with the scale x1.05.
  for (const std::string& config : {good, faulty}) {
    const flashcore::check::Case c = case_of(spec, config.c_str(), 2, 4, 2, 256, 256, Layout::BSHD);
    const flashcore::check::Result r = flashcore::check::run_case(c, 99, /*repeats=*/2);
    ASSERT_FALSE(r.skipped) << r.message;
    EXPECT_EQ(r.passed, config == good) << config << ": o_err " << r.o_err << " (tol " << r.o_tol << "), lse_err "
                                        << r.lse_err << " (tol " << r.lse_tol << "): " << r.message;
  }
}

}  // namespace

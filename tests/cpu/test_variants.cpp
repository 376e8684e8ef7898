// Runtime kernel variants (src/kernels/sm90/variant.h) without a GPU: config names, the host mirror of KernelConfig
// against the compiled rows, the feasibility rules, file hashes, and -- where nvcc is found -- the build of a tile
// config the library was not compiled with into a cubin, and its reuse.
// FLASHCORE_VARIANT_CUBINS=<dir> builds into <dir> and keeps the cubins (for tests/gpu/test_variants.cpp on a
// machine without nvcc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/sm90/launch.h"
#include "kernels/sm90/smem_plan.h"
#include "kernels/sm90/variant.h"
#include "variant_specs.h"

namespace {

namespace fs = std::filesystem;
using flashcore::sm90::KernelRow;
using flashcore::sm90::Schedule;
using flashcore::sm90::TileShape;
using flashcore::sm90::VariantSpec;

std::vector<const KernelRow*> compiled_rows() {
  int n = 0;
  const KernelRow* const* rows = flashcore::sm90::rows(n);
  return std::vector<const KernelRow*>(rows, rows + n);
}

VariantSpec spec_of(const KernelRow& r) {
  VariantSpec s;
  s.dtype = r.dtype, s.head_dim = r.head_dim, s.causal = r.causal, s.shape = r.shape;
  return s;
}

using flashcore::test::make_spec;
const auto gpu_test_specs = flashcore::test::variant_test_specs;

std::string run_output(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  pclose(p);
  return out;
}

int count_of(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) ++n;
  return n;
}

// A directory for the test's cubins: $FLASHCORE_VARIANT_CUBINS (kept), else a fresh one under /tmp (removed).
class CubinDir {
 public:
  CubinDir() {
    if (const char* env = std::getenv("FLASHCORE_VARIANT_CUBINS"); env != nullptr && env[0] != '\0') {
      path_ = env;
    } else {
      path_ = fs::temp_directory_path() / ("flashcore_variants_" + std::to_string(getpid()));
      owned_ = true;
    }
  }
  ~CubinDir() {
    std::error_code ec;
    if (owned_) fs::remove_all(path_, ec);
  }
  CubinDir(const CubinDir&) = delete;
  CubinDir& operator=(const CubinDir&) = delete;
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
  bool owned_ = false;
};

TEST(Variants, ConfigNamesRoundTrip) {
  for (const KernelRow* r : compiled_rows()) {
    EXPECT_EQ(flashcore::sm90::config_name(r->shape), r->name);  // the build's naming (config_grammar.h)
    TileShape t{};
    ASSERT_TRUE(flashcore::sm90::parse_config_name(r->name, t)) << r->name;
    EXPECT_EQ(flashcore::sm90::config_name(t), r->name);
  }
  for (const char* name : {"64x16x1-onecta", "128x160x2-pp-static", "192x128x3-pp-dynamic-vote",
                           "128x256x4-static-vote", "64x128x3-split", "128x128x2-pp-dynamic-vote-packed",
                           "128x64x2-dynamic-packed"}) {
    TileShape t{};
    ASSERT_TRUE(flashcore::sm90::parse_config_name(name, t)) << name;
    EXPECT_EQ(flashcore::sm90::config_name(t), name);
  }
  TileShape t{};
  ASSERT_TRUE(flashcore::sm90::parse_config_name("192x112x3-pp-dynamic-vote", t));
  EXPECT_EQ(t.block_m, 192);
  EXPECT_EQ(t.block_n, 112);
  EXPECT_EQ(t.stages, 3);
  EXPECT_TRUE(t.pingpong);
  EXPECT_EQ(t.schedule, Schedule::kDynamicPersistent);
  EXPECT_TRUE(t.rescale_vote);
  for (const char* bad : {"", "128x128x2", "128x128x2-", "128x128x2-pp", "128x128x2-persistent", "128x128-static",
                          "128x128x2-static-pp", "128x128x2-vote-static", "128x128x2-static-vote-vote",
                          "0128x128x2-static", "+128x128x2-static", "128X128x2-static", "1280x128x2-static",
                          "99999999999x1x1-static", "128x128x2-static ", "128x128x2--static",
                          "128x128x2-pp-dynamic-packed-vote", "128x128x2-dynamic-packed-packed", "128x128x2-packed"}) {
    EXPECT_FALSE(flashcore::sm90::parse_config_name(bad, t)) << '"' << bad << '"';
  }
}

TEST(Variants, FootprintEqualsKernelConfigForTheCompiledRows) {
  const std::vector<const KernelRow*> rows = compiled_rows();
  ASSERT_FALSE(rows.empty());
  for (const KernelRow* r : rows) {
    // Runtime variants (and their footprint) are 16-bit with one head dim for Q, K and V, and 16-bit K / V (the e4m3
    // KV-cache rows add a staging ring).
    if (r->dtype == FLASHCORE_DTYPE_FP8_E4M3 || r->dtype == FLASHCORE_DTYPE_FP8_E5M2 || r->dtype == FLASHCORE_DTYPE_INT8 ||
        flashcore::sm90::v_head_dim(*r) != r->head_dim || r->kv_dtype != FLASHCORE_DTYPE_SAME)
      continue;
    const flashcore::sm90::Footprint f = flashcore::sm90::footprint(spec_of(*r));
    EXPECT_EQ(f.threads, r->threads) << r->name;
    EXPECT_EQ(f.smem_bytes, r->smem_bytes) << r->name;
    EXPECT_EQ(f.separate_o, r->separate_o) << r->name;
    EXPECT_EQ(f.consumer_regs, r->threads <= 384 ? 240 : 160) << r->name;  // one or two consumer warpgroups: 240
    std::string why;
    EXPECT_TRUE(flashcore::sm90::feasible(spec_of(*r), why)) << r->name << ": " << why;
    EXPECT_EQ(r->test_scale_factor, 1.0f) << r->name;
  }
}

// The transposed decode rows (block_m 8, smem_plan.h swaps_gemms; decode_swap.cuh): one consumer warpgroup, two Q
// stages, P^T and the softmax's exchange after the V ring (P^T 1024-byte aligned for its 128B swizzle), and block_n in whole 64-key tiles.
TEST(Variants, TransposedDecodeRowsHaveTheirScratchAndRules) {
  namespace sm90 = flashcore::sm90;
  const TileShape swap = {8, 128, 3, false, Schedule::kSplitKv, false};
  EXPECT_TRUE(sm90::swaps_gemms(swap));
  EXPECT_FALSE(sm90::swaps_gemms({64, 128, 3, false, Schedule::kSplitKv, false}));
  EXPECT_FALSE(sm90::swaps_gemms({8, 128, 3, false, Schedule::kOneTilePerCta, false}));
  const sm90::SmemPlan plan = sm90::smem_plan(swap, 128, 2, 2);
  EXPECT_EQ(plan.consumer_warpgroups, 1);
  EXPECT_EQ(plan.threads, 256);
  EXPECT_EQ(plan.q_bytes, 8 * 256);  // 8 rows of 128 bf16 columns
  // Two Q stages (the next part's Q loads while this part runs, docs/decisions.md#decode-q-ring), 1024-byte aligned for
  // the swizzle; the prefill rows keep one.
  EXPECT_EQ(plan.q_stages, 2);
  EXPECT_EQ(plan.k_offset, 2 * plan.q_bytes);
  EXPECT_EQ(plan.k_offset % 1024, 0);
  EXPECT_EQ(sm90::smem_plan({128, 128, 2, true, Schedule::kStaticPersistent, true}, 128, 2, 2).q_stages, 1);
  EXPECT_EQ(sm90::smem_plan({64, 128, 3, false, Schedule::kSplitKv, false}, 128, 2, 2).q_stages, 1);
  EXPECT_EQ(plan.swap_p_offset, plan.v_offset + 3 * plan.v_tile_bytes);
  EXPECT_EQ(plan.swap_p_offset % 1024, 0);
  EXPECT_EQ(plan.swap_red_offset, plan.swap_p_offset + 8 * 128 * 2);
  EXPECT_GE(plan.barrier_offset, plan.swap_red_offset + 96 * 4);  // two exchange slots of 4 x 8 floats, the sums
  EXPECT_LE(plan.smem_bytes, sm90::kSmemLimitBytes);
  std::string why;
  EXPECT_TRUE(sm90::feasible(make_spec(FLASHCORE_DTYPE_BF16, 128, false, swap), why)) << why;
  EXPECT_FALSE(sm90::feasible(make_spec(FLASHCORE_DTYPE_BF16, 128, false, {8, 96, 3, false, Schedule::kSplitKv, false}),
                              why));
  EXPECT_NE(why.find("block_m = 8"), std::string::npos) << why;
  EXPECT_FALSE(sm90::feasible(make_spec(FLASHCORE_DTYPE_BF16, 128, false, {8, 128, 3, false, Schedule::kStaticPersistent,
                                                                           false}),
                              why));
}

TEST(Variants, FeasibilityRulesSayWhichRuleFailed) {
  const TileShape ok = {128, 160, 2, true, Schedule::kStaticPersistent, false};
  std::string why = "stale";
  EXPECT_TRUE(flashcore::sm90::feasible(make_spec(FLASHCORE_DTYPE_BF16, 128, false, ok), why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_TRUE(flashcore::sm90::feasible(make_spec(FLASHCORE_DTYPE_FP16, 64, true, ok), why)) << why;
  EXPECT_TRUE(flashcore::sm90::feasible(
      make_spec(FLASHCORE_DTYPE_BF16, 128, true, {64, 64, 4, false, Schedule::kOneTilePerCta, true}), why))
      << why;
  const flashcore::sm90::Footprint f = flashcore::sm90::footprint(make_spec(FLASHCORE_DTYPE_BF16, 128, false, ok));
  EXPECT_EQ(f.threads, 384);
  EXPECT_EQ(f.smem_bytes, 32768 + 4 * 40960 + 32768 + 1536);  // Q, 2 stages of K and V, a separate O, slack
  EXPECT_TRUE(f.separate_o);
  EXPECT_EQ(f.estimated_regs, 64 + 80 + 40 + 32);

  struct Reject {
    VariantSpec spec;
    const char* reason;
  };
  auto with = [&](auto change) {
    VariantSpec s = make_spec(FLASHCORE_DTYPE_BF16, 128, false, ok);
    change(s);
    return s;
  };
  const Reject rejects[] = {
      {with([](VariantSpec& s) { s.dtype = FLASHCORE_DTYPE_FP8_E4M3; }), "dtype"},
      {with([](VariantSpec& s) { s.head_dim = 80; }), "head_dim = 80"},
      {with([](VariantSpec& s) { s.head_dim = 320; }), "head_dim = 320"},
      {with([](VariantSpec& s) { s.shape.block_m = 96; }), "block_m = 96"},
      {with([](VariantSpec& s) { s.shape.block_m = 256; }), "block_m = 256"},
      {with([](VariantSpec& s) { s.shape.block_n = 8; }), "block_n = 8"},
      {with([](VariantSpec& s) { s.shape.block_n = 24; }), "block_n = 24"},
      {with([](VariantSpec& s) { s.shape.block_n = 272; }), "block_n = 272"},
      {with([](VariantSpec& s) { s.shape.stages = 0; }), "stages = 0"},
      {with([](VariantSpec& s) { s.shape.stages = 9; }), "stages = 9"},
      {with([](VariantSpec& s) { s.shape.schedule = static_cast<Schedule>(4); }), "schedule"},
      {with([](VariantSpec& s) { s.shape.block_m = 64; }), "ping-pong"},
      {with([](VariantSpec& s) { s.shape.packed = true; }), "packed flavour"},  // a static row
      {with([](VariantSpec& s) { s.shape.stages = 3; }), "shared memory"},  // 32 KB Q + 3 x 80 KB K/V
      {with([](VariantSpec& s) { s.shape.block_n = 256, s.shape.stages = 1; }), "registers"},  // 64 + 128 + 64
      {with([](VariantSpec& s) { s.shape.block_m = 192, s.shape.block_n = 96, s.shape.stages = 1; }), "registers"},
  };
  for (const Reject& r : rejects) {
    why.clear();
    EXPECT_FALSE(flashcore::sm90::feasible(r.spec, why)) << r.reason;
    EXPECT_NE(why.find(r.reason), std::string::npos) << "expected \"" << r.reason << "\" in: " << why;
  }
}

TEST(Variants, FileHashIsFnv1a64) {
  const fs::path dir = fs::temp_directory_path() / ("flashcore_hash_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const auto write = [&](const char* name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return (dir / name).string();
  };
  EXPECT_EQ(flashcore::sm90::file_hash(write("empty", "")), "cbf29ce484222325");
  EXPECT_EQ(flashcore::sm90::file_hash(write("a", "a")), "af63dc4c8601ec8c");
  EXPECT_EQ(flashcore::sm90::file_hash(write("foobar", "foobar")), "85944171f73967e8");
  EXPECT_EQ(flashcore::sm90::file_hash(write("nul", std::string("a\0b", 3))).size(), 16u);
  EXPECT_EQ(flashcore::sm90::file_hash((dir / "missing").string()), "");
  fs::remove_all(dir);
}

TEST(Variants, KernelSourcesOfTheBuildTree) {
  const std::string dir = flashcore::sm90::kernel_source_dir();
  ASSERT_FALSE(dir.empty()) << "the source tree this test was built from has the kernel sources";
  EXPECT_TRUE(fs::is_regular_file(fs::path(dir) / "kernels/sm90/kernel.cuh"));
  EXPECT_TRUE(fs::is_regular_file(fs::path(dir) / ".." / "include/flashcore/flashcore.h"));
  setenv("FLASHCORE_KERNEL_SOURCES", "/nonexistent/flashcore/src", 1);
  EXPECT_EQ(flashcore::sm90::kernel_source_dir(), "");  // an unusable override is not silently replaced
  setenv("FLASHCORE_KERNEL_SOURCES", dir.c_str(), 1);
  EXPECT_EQ(flashcore::sm90::kernel_source_dir(), dir);
  unsetenv("FLASHCORE_KERNEL_SOURCES");
}

TEST(Variants, RegistrationRefusesCompiledNamesAndInfeasibleSpecs) {
  const std::vector<const KernelRow*> rows = compiled_rows();
  ASSERT_FALSE(rows.empty());
  std::string error;
  const KernelRow* row = nullptr;
  // Checked before anything is loaded: no GPU needed.
  EXPECT_EQ(flashcore::sm90::register_variant(spec_of(*rows[0]), "/nonexistent.cubin", &row, error),
            FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("compiled into the library"), std::string::npos) << error;
  EXPECT_EQ(row, nullptr);
  VariantSpec bad = spec_of(*rows[0]);
  bad.shape.block_n = 24;
  EXPECT_EQ(flashcore::sm90::register_variant(bad, "/nonexistent.cubin", &row, error),
            FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("block_n = 24"), std::string::npos) << error;
  EXPECT_EQ(flashcore::sm90::register_faulty_variant_for_testing(spec_of(*rows[0]), "/nonexistent.cubin",
                                                                 rows[0]->name, error),
            FLASHCORE_ERROR_INVALID_ARGUMENT);
  // A cubin that cannot be loaded (here: none, or no GPU) is an error, and nothing is registered.
  EXPECT_NE(flashcore::sm90::register_variant(gpu_test_specs()[0], "/nonexistent.cubin", &row, error),
            FLASHCORE_SUCCESS);
  EXPECT_FALSE(error.empty());
  EXPECT_TRUE(flashcore::sm90::registered_rows().empty());
  std::string select_error;
  const VariantSpec s = gpu_test_specs()[0];
  const std::string name = flashcore::sm90::config_name(s.shape);
  EXPECT_EQ(flashcore::sm90::select(s.dtype, s.dtype, s.head_dim, s.causal, name.c_str(), INT64_MAX, select_error),
            nullptr);
  EXPECT_NE(select_error.find("is not compiled for"), std::string::npos) << select_error;
}

TEST(Variants, BuildRejectsInfeasibleSpecsBeforeRunningNvcc) {
  VariantSpec s = gpu_test_specs()[0];
  s.shape.stages = 9;
  std::string cubin = "stale", error;
  EXPECT_EQ(flashcore::sm90::build_variant(s, "/nonexistent/dir", cubin, error), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("stages = 9"), std::string::npos) << error;
}

TEST(Variants, BuildsAConfigNotCompiledInAndReusesTheCubin) {
  const std::string nvcc = flashcore::sm90::find_nvcc();
  if (nvcc.empty()) GTEST_SKIP() << "nvcc not found ($FLASHCORE_NVCC, $CUDACXX, $CUDA_HOME/bin, PATH): no build";
  const CubinDir dir;
  for (const VariantSpec& spec : gpu_test_specs()) {
    const std::string name = flashcore::sm90::config_name(spec.shape);
    for (const KernelRow* r : compiled_rows()) {
      ASSERT_FALSE(r->dtype == spec.dtype && r->head_dim == spec.head_dim && r->causal == spec.causal &&
                   name == r->name)
          << name << " is in configs.txt: pick another variant";
    }
    std::string cubin, error;
    ASSERT_EQ(flashcore::sm90::build_variant(spec, dir.path(), cubin, error), FLASHCORE_SUCCESS) << error;
    ASSERT_TRUE(fs::is_regular_file(cubin)) << cubin;
    const std::string file = fs::path(cubin).filename().string();
    const std::string stem = flashcore::sm90::cubin_stem(spec);
    EXPECT_EQ(file.rfind(stem + "_", 0), 0u) << file;
    EXPECT_EQ(file.size(), stem.size() + 1 + 16 + 6) << file;  // _<16 hex digits>.cubin

    // The generated unit instantiates the kernel and defines no KernelRow.
    std::ifstream unit(fs::path(cubin).replace_extension(".cu"));
    std::stringstream text;
    text << unit.rdbuf();
    EXPECT_NE(text.str().find("template __global__ void flashcore_fwd_sm90_kernel<KernelConfig<" +
                              flashcore::sm90::variant_symbol(spec) + ">>"),
              std::string::npos)
        << text.str();
    EXPECT_EQ(text.str().find("KernelRow"), std::string::npos) << text.str();

    // Built again: the same file, not rewritten.
    const auto written = fs::last_write_time(cubin);
    std::string again;
    ASSERT_EQ(flashcore::sm90::build_variant(spec, dir.path(), again, error), FLASHCORE_SUCCESS) << error;
    EXPECT_EQ(again, cubin);
    EXPECT_EQ(fs::last_write_time(again), written);
    EXPECT_EQ(flashcore::sm90::file_hash(again).size(), 16u);

    // The SASS is the sm_90a kernel: wgmma (HGMMA) and TMA loads (UTMALDG), no local memory.
    std::string cuobjdump = (fs::path(nvcc).parent_path() / "cuobjdump").string();
    if (!fs::exists(cuobjdump)) cuobjdump = "cuobjdump";
    const std::string sass = run_output("'" + cuobjdump + "' -sass '" + cubin + "'");
    if (sass.find("Function : ") == std::string::npos) {
      std::printf("cuobjdump not usable (%s): SASS of %s not checked\n", sass.substr(0, 200).c_str(), file.c_str());
      continue;
    }
    EXPECT_GT(count_of(sass, "HGMMA"), 0) << file;
    EXPECT_GT(count_of(sass, "UTMALDG"), 0) << file;
    EXPECT_GT(count_of(sass, "UTMASTG"), 0) << file;
    EXPECT_EQ(count_of(sass, " LDL") + count_of(sass, " STL"), 0) << file;
    EXPECT_NE(sass.find(flashcore::sm90::variant_symbol(spec)), std::string::npos) << file;
  }
}

}  // namespace

// The backend table without a GPU: which backend serves each compute capability (the portable sm80 backend for
// 8.x and, through its PTX, for 10.x and 12.x; sm90 for 9.0; nothing below 8.0), FLASHCORE_BACKEND forcing a
// backend, the compiled archs, and the per-device kernel-config lists (the portable rows that fit the device's
// shared memory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "api/backend.h"
#include "cpu/configured_archs.h"
#include "flashcore/flashcore.h"
#include "kernels/sm80/image_rule.h"
#include "kernels/sm90/launch.h"
#include "kernels/sm90/v_route.h"
#include "core/launch_util.h"

namespace {

using flashcore::backend::backend_for_arch;
using flashcore::testing::configured_archs;
using flashcore::testing::configured_sm80_archs;
using flashcore::testing::configured_sm80_ptx_arch;

// Sets (or unsets, for nullptr) FLASHCORE_BACKEND for the scope, and puts back what was there.
class ScopedBackendEnv {
 public:
  explicit ScopedBackendEnv(const char* value) {
    if (const char* old = std::getenv("FLASHCORE_BACKEND"); old != nullptr) had_ = true, old_ = old;
    set(value);
  }
  ~ScopedBackendEnv() { set(had_ ? old_.c_str() : nullptr); }
  ScopedBackendEnv(const ScopedBackendEnv&) = delete;
  ScopedBackendEnv& operator=(const ScopedBackendEnv&) = delete;

 private:
  static void set(const char* value) {
    if (value == nullptr) {
      unsetenv("FLASHCORE_BACKEND");
    } else {
      setenv("FLASHCORE_BACKEND", value, 1);
    }
  }
  bool had_ = false;
  std::string old_;
};

std::string name_or_empty(const char* s) { return s != nullptr ? s : ""; }

bool sm80_built() { return !configured_sm80_archs().empty(); }
bool sm80_has(int arch) {
  const std::vector<int> a = configured_sm80_archs();
  return std::find(a.begin(), a.end(), arch) != a.end();
}

// A (dtype, head dim) this build compiled, for the config-list tests: the first of bf16/fp16 with `hd`.
bool compiled(flashcore_dtype& dt, int hd) {
  for (flashcore_dtype d : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    if (flashcore::backend::is_compiled(d, hd)) return dt = d, true;
  }
  return false;
}

// A listing as this build has it: without FLASHCORE_ALL_CONFIGS the tuning options ("-" rows of configs.txt) are not
// compiled (build tiers, src/kernels/sm80/sources.cmake).
std::vector<std::string> tiered(std::vector<std::string> all, const std::vector<std::string>& options) {
  if (FLASHCORE_TEST_ALL_CONFIGS) return all;
  all.erase(std::remove_if(all.begin(), all.end(),
                           [&](const std::string& n) {
                             return std::find(options.begin(), options.end(), n) != options.end();
                           }),
            all.end());
  return all;
}

std::vector<std::string> configs(int cc, flashcore_dtype dt, int hd, bool causal) {
  const char* names[32];
  const int n = flashcore::backend::kernel_configs(cc, dt, hd, causal, names, 32);
  return std::vector<std::string>(names, names + std::min(n, 32));
}

TEST(BackendTable, DefaultChoicePerComputeCapability) {
  ScopedBackendEnv env(nullptr);
  EXPECT_EQ(name_or_empty(backend_for_arch(90)), "sm90");
  for (int cc : {80, 86, 87, 89}) {
    EXPECT_EQ(name_or_empty(backend_for_arch(cc)), flashcore::testing::expected_backend(cc)) << cc;
  }
  if (sm80_has(80) && sm80_has(86) && sm80_has(89)) {  // the default FLASHCORE_SM80_ARCHS
    EXPECT_EQ(name_or_empty(backend_for_arch(80)), "sm80");
    EXPECT_EQ(name_or_empty(backend_for_arch(86)), "sm80");
    EXPECT_EQ(name_or_empty(backend_for_arch(87)), "sm80");  // runs the sm_86 (or sm_80) image
    EXPECT_EQ(name_or_empty(backend_for_arch(89)), "sm80");
  }
  // Newer GPUs run the portable kernels from their PTX (FLASHCORE_SM80_PTX, on by default); nothing below 8.0.
  for (int cc : {100, 103, 110, 120, 121}) {
    EXPECT_EQ(name_or_empty(backend_for_arch(cc)), configured_sm80_ptx_arch() > 0 ? "sm80" : "") << cc;
    EXPECT_EQ(name_or_empty(backend_for_arch(cc)), flashcore::testing::expected_backend(cc)) << cc;
  }
  for (int cc : {0, 70, 75}) EXPECT_EQ(backend_for_arch(cc), nullptr) << cc;
  EXPECT_EQ(flashcore::backend::forced_backend(), nullptr);
  ScopedBackendEnv autoenv("auto");
  EXPECT_EQ(flashcore::backend::forced_backend(), nullptr);
  EXPECT_EQ(name_or_empty(backend_for_arch(90)), "sm90");
}

TEST(BackendTable, ForcedPortableBackend) {
  if (!sm80_built()) GTEST_SKIP() << "the portable backend is not built (FLASHCORE_BUILD_SM80=OFF)";
  ScopedBackendEnv env("sm80");
  ASSERT_NE(flashcore::backend::forced_backend(), nullptr);
  EXPECT_EQ(std::string(flashcore::backend::forced_backend()), "sm80");
  // Hopper runs the portable kernels from their plain sm_90 image.
  EXPECT_EQ(name_or_empty(backend_for_arch(90)), flashcore::testing::sm80_image_for(90) ? "sm80" : "");
  for (int cc : {80, 86, 89, 100, 120}) {
    EXPECT_EQ(name_or_empty(backend_for_arch(cc)), flashcore::testing::sm80_image_for(cc) ? "sm80" : "") << cc;
  }
  EXPECT_EQ(backend_for_arch(75), nullptr);
}

TEST(BackendTable, ForcedSm90AndUnknownNames) {
  {
    ScopedBackendEnv env("sm90");
    EXPECT_EQ(name_or_empty(backend_for_arch(90)), "sm90");
    EXPECT_EQ(backend_for_arch(86), nullptr);  // sm90 has no image for 8.6
  }
  {
    ScopedBackendEnv env("sm70");  // not a backend: serves nothing, rather than silently ignored
    EXPECT_EQ(backend_for_arch(90), nullptr);
    EXPECT_EQ(backend_for_arch(86), nullptr);
  }
  ScopedBackendEnv env(nullptr);
  EXPECT_EQ(name_or_empty(backend_for_arch(90)), "sm90");
}

TEST(BackendTable, CompiledArchsIncludeThePortableTargets) {
  int archs[16] = {};
  const int n = flashcore::backend::compiled_archs(archs, 16);
  ASSERT_LE(n, 16);
  EXPECT_EQ(std::vector<int>(archs, archs + n), configured_archs());
  EXPECT_TRUE(std::is_sorted(archs, archs + n));
  EXPECT_NE(std::find(archs, archs + n, 90), archs + n);
  if (sm80_has(80) && sm80_has(86) && sm80_has(89)) {
    for (int cc : {80, 86, 89}) EXPECT_NE(std::find(archs, archs + n, cc), archs + n) << cc;
  }
}

// The portable rows offered on a device are those that fit its shared memory; the default (listed first) is the
// first default candidate, in src/kernels/sm80/configs.txt order, that fits (and, for a row with conditions, meets
// them for the longest sequences: tests/gpu/test_sm80.cpp checks the sequence-length choice on a GPU).
TEST(BackendTable, PortableConfigsFollowTheDeviceSharedMemory) {
  if (!sm80_has(80) || !sm80_has(86)) GTEST_SKIP() << "needs sm_80 and sm_86 in FLASHCORE_SM80_ARCHS";
  ScopedBackendEnv env(nullptr);
  flashcore_dtype dt{};
  if (compiled(dt, 256)) {
    for (bool causal : {false, true}) {
      // 64x64x1 (96 KB) fits everywhere, but is a default only where two of its CTAs fit on an SM (sm_90), and only
      // for shorter sequences: the listed default is the long-sequence one.
      EXPECT_EQ(configs(86, dt, 256, causal), std::vector<std::string>({"64x32x2", "64x64x1"}));  // 99 KB
      EXPECT_EQ(configs(89, dt, 256, causal), std::vector<std::string>({"64x32x2", "64x64x1"}));
      // Non-causal: the warp-pair split 128x64x1-s2 (156 KB) first; causal lists it as a tuning option.
      EXPECT_EQ(configs(80, dt, 256, causal),
                causal ? tiered({"128x64x1", "64x64x1", "128x64x1-s2", "128x32x2", "64x32x2"}, {"128x64x1-s2", "128x32x2"})
                       : tiered({"128x64x1-s2", "64x64x1", "128x64x1", "128x32x2", "64x32x2"}, {"128x32x2"}));
    }
  }
  if (compiled(dt, 128)) {
    // The 4-warp 128 x 64 (100 KB) where it fits, else the 8-warp 128 x 64 (the first default row that fits).
    for (bool causal : {false, true}) {
      EXPECT_EQ(configs(86, dt, 128, causal), tiered({"128x64x2", "128x32x2-w4"}, {"128x32x2-w4"}));
      EXPECT_EQ(configs(89, dt, 128, causal), tiered({"128x64x2", "128x32x2-w4"}, {"128x32x2-w4"}));
      EXPECT_EQ(configs(80, dt, 128, causal),
                tiered({"128x64x2-w4", "128x128x2", "128x64x2", "128x32x2-w4"}, {"128x128x2", "128x32x2-w4"}));
    }
  }
  if (compiled(dt, 64)) {
    // The 3-stage ring (64 KB) is the default where two of its CTAs fit on an SM (sm_80/87/90), else the 2-stage one.
    EXPECT_EQ(configs(89, dt, 64, false), tiered({"128x64x2-w4", "128x64x3-w4", "128x64x2"}, {"128x64x2"}));
    EXPECT_EQ(configs(80, dt, 64, false), tiered({"128x64x3-w4", "128x64x2-w4", "128x64x2"}, {"128x64x2"}));
  }
  if (compiled(dt, 96)) {
    // Head dim 96 (192-byte rows): the 3-stage ring (100 KB) where two of its CTAs fit on an SM, else the 2-stage one
    // (76 KB), the only one on the 99 KB devices.
    for (bool causal : {false, true}) {
      EXPECT_EQ(configs(86, dt, 96, causal), std::vector<std::string>({"128x64x2-w4"}));
      EXPECT_EQ(configs(89, dt, 96, causal), std::vector<std::string>({"128x64x2-w4"}));
      EXPECT_EQ(configs(80, dt, 96, causal), std::vector<std::string>({"128x64x2-w4", "128x64x3-w4"}));
    }
  }
  // Hopper lists its own (sm90) rows unless the portable backend is forced.
  if (compiled(dt, 128)) {
    const std::vector<std::string> hopper = configs(90, dt, 128, true);
    ASSERT_FALSE(hopper.empty());
    EXPECT_EQ(std::find(hopper.begin(), hopper.end(), "128x64x2"), hopper.end());
    if (sm80_has(90)) {
      ScopedBackendEnv forced("sm80");
      EXPECT_EQ(configs(90, dt, 128, true),
                tiered({"128x64x2-w4", "128x128x2", "128x64x2", "128x32x2-w4"}, {"128x128x2", "128x32x2-w4"}));
    }
  }
}

// A GPU newer than Hopper (10.x, 12.x: JIT-compiled from the PTX) gets the portable rows of the smallest shared
// memory, 8.6's; without the PTX, none.
TEST(BackendTable, NewerGpusRunThePortableRowsFromPtx) {
  if (!sm80_built()) GTEST_SKIP() << "the portable backend is not built (FLASHCORE_BUILD_SM80=OFF)";
  if (!flashcore::testing::sm80_image_for(86)) GTEST_SKIP() << "no portable image runs on 8.6 in this build";
  ScopedBackendEnv env(nullptr);
  flashcore_dtype dt{};
  int checked = 0;
  for (int cc : {100, 120}) {
    for (int hd : {64, 128, 256}) {
      if (!compiled(dt, hd)) continue;
      if (configured_sm80_ptx_arch() > 0) {
        EXPECT_EQ(configs(cc, dt, hd, false), configs(86, dt, hd, false)) << cc << " d" << hd;
      } else {
        EXPECT_TRUE(configs(cc, dt, hd, false).empty()) << cc << " d" << hd;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// The portable image rule itself (kernels/sm80/image_rule.h), on other builds' archs than this one's: SASS serves
// later minors of its major, PTX any capability from its arch up, so a 10.x or 12.x GPU is served exactly when the
// PTX is compiled in.
TEST(BackendTable, PortableImageRule) {
  using flashcore::sm80::image_runs_on;
  const int defaults[] = {80, 86, 89, 90};
  for (int ptx : {0, 90}) {
    for (int cc : {80, 86, 87, 89, 90}) EXPECT_TRUE(image_runs_on(cc, defaults, 4, ptx)) << cc << " ptx " << ptx;
    for (int cc : {70, 75}) EXPECT_FALSE(image_runs_on(cc, defaults, 4, ptx)) << cc << " ptx " << ptx;
    for (int cc : {100, 103, 110, 120, 121}) EXPECT_EQ(image_runs_on(cc, defaults, 4, ptx), ptx > 0) << cc;
  }
  const int only86[] = {86};
  EXPECT_FALSE(image_runs_on(80, only86, 1, 86));  // neither sm_86 SASS nor compute_86 PTX runs on 8.0
  EXPECT_TRUE(image_runs_on(89, only86, 1, 0));    // sm_86 SASS on 8.9
  EXPECT_FALSE(image_runs_on(90, only86, 1, 0));   // another major version, no PTX
  EXPECT_TRUE(image_runs_on(90, only86, 1, 86));   // compute_86 PTX on 9.0
  EXPECT_TRUE(image_runs_on(120, only86, 1, 86));
  EXPECT_FALSE(image_runs_on(120, nullptr, 0, 0));
  EXPECT_GE(flashcore::sm80::kMaxServedCc, 121);
}

// sm90 default rows with a sequence-length condition (configs.txt "default(seqlen_k<=N)", kernel_row.h): every key
// with a default has exactly one unconditional default, which long calls and listings get; a conditional default is
// the choice up to its N keys (unless an earlier conditional row already is) and never past it.
TEST(BackendTable, Sm90DefaultsFollowTheKeyCount) {
  namespace sm90 = flashcore::sm90;
  int n = 0;
  const sm90::KernelRow* const* rows = sm90::rows(n);
  int conditional = 0;
  for (int i = 0; i < n; ++i) {
    const sm90::KernelRow& r = *rows[i];
    if (!r.is_default) continue;
    SCOPED_TRACE(std::string(r.name) + " d" + std::to_string(r.head_dim) + (r.causal ? " causal" : ""));
    int unconditional = 0;
    for (int j = 0; j < n; ++j) {
      const sm90::KernelRow& o = *rows[j];
      unconditional += sm90::is_default_for(o, INT64_MAX) && o.dtype == r.dtype && o.out_dtype == r.out_dtype &&
                       o.head_dim == r.head_dim && sm90::v_head_dim(o) == sm90::v_head_dim(r) && o.causal == r.causal;
    }
    EXPECT_EQ(unconditional, 1);
    std::string error;
    const int dv = sm90::v_head_dim(r);
    const sm90::KernelRow* longest =
        sm90::select(r.dtype, r.out_dtype, r.head_dim, r.causal, nullptr, INT64_MAX, error, dv);
    ASSERT_NE(longest, nullptr) << error;
    EXPECT_EQ(longest->max_seqlen_k, 0);
    if (r.max_seqlen_k == 0) continue;
    ++conditional;
    const sm90::KernelRow* at =
        sm90::select(r.dtype, r.out_dtype, r.head_dim, r.causal, nullptr, r.max_seqlen_k, error, dv);
    const sm90::KernelRow* past =
        sm90::select(r.dtype, r.out_dtype, r.head_dim, r.causal, nullptr, r.max_seqlen_k + 1, error, dv);
    ASSERT_NE(at, nullptr);
    ASSERT_NE(past, nullptr);
    EXPECT_TRUE(at == &r || at->max_seqlen_k != 0) << "at " << r.max_seqlen_k << " keys: " << at->name;
    EXPECT_NE(past, &r) << "past " << r.max_seqlen_k << " keys";
  }
  // The 8-bit d128 rows (configs_fp8.txt): 128-key blocks up to 1024 keys (2048 causal), 192-key blocks beyond.
  std::string error;
  const sm90::KernelRow* e4m3 = sm90::select(FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_BF16, 128, false, nullptr,
                                             INT64_MAX, error);
  if (e4m3 == nullptr) GTEST_SKIP() << "e4m3 head dim 128 is not compiled (FLASHCORE_DTYPES / FLASHCORE_HEAD_DIMS)";
  EXPECT_GT(conditional, 0);
  auto name = [&](bool causal, int64_t keys) {
    const sm90::KernelRow* r =
        sm90::select(FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_BF16, 128, causal, nullptr, keys, error);
    return r != nullptr ? std::string(r->name) : error;
  };
  EXPECT_EQ(name(false, 1024), "128x128x3-pp-static");
  EXPECT_EQ(name(false, 1025), "128x192x2-pp-static");
  EXPECT_EQ(name(true, 2048), "128x128x3-pp-dynamic");
  EXPECT_EQ(name(true, 2049), "128x192x2-pp-dynamic");
}

// The 8-bit V route (sm90/v_route.h): the in-kernel limit is the H100's 16 tiles per KV head, scaled down on faster
// DRAM; head dim 64 always transposes in the kernel; a causal tile counts half.
TEST(BackendTable, Sm90VRouteScalesWithDramBandwidth) {
  namespace sm90 = flashcore::sm90;
  const double h100 = flashcore::core::dram_peak_gbps_of(2619000, 5120);  // H100 SXM 80GB HBM3
  const double h200 = flashcore::core::dram_peak_gbps_of(3201000, 6144);  // H200
  EXPECT_NEAR(h100, 3352, 1);
  EXPECT_NEAR(h200, 4917, 1);
  EXPECT_EQ(flashcore::core::dram_peak_gbps_of(0, 5120), 0.0);
  EXPECT_NEAR(sm90::in_kernel_v_tile_limit(h100), 16.0, 0.01);
  EXPECT_NEAR(sm90::in_kernel_v_tile_limit(h200), 10.9, 0.05);
  EXPECT_EQ(sm90::in_kernel_v_tile_limit(0), 16.0);  // unknown DRAM: the reference
  // H100: 16 tiles in the kernel, 17 through the pass; causal 32 tiles count 16.
  EXPECT_TRUE(sm90::v_transposed_in_kernel(256, false, 16, h100));
  EXPECT_FALSE(sm90::v_transposed_in_kernel(256, false, 17, h100));
  EXPECT_TRUE(sm90::v_transposed_in_kernel(128, true, 32, h100));
  // H200 (v44: d256 2k non-causal and 4k causal, 16 tiles, faster through the pass; 8 tiles faster in the kernel).
  EXPECT_FALSE(sm90::v_transposed_in_kernel(256, false, 16, h200));
  EXPECT_FALSE(sm90::v_transposed_in_kernel(256, true, 32, h200));
  EXPECT_TRUE(sm90::v_transposed_in_kernel(256, true, 16, h200));
  EXPECT_TRUE(sm90::v_transposed_in_kernel(128, false, 8, h200));
  EXPECT_TRUE(sm90::v_transposed_in_kernel(64, false, 1 << 20, h200));  // head dim 64: always the kernel
}

}  // namespace

// Every compiled kernel config, not only the defaults: the tuning options of configs.txt (e.g. the dynamic
// persistent scheduler) must pass the same correctness and determinism rules before a tuner may pick them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

struct ConfigCase {
  flashcore_dtype dtype;
  int head_dim;
  bool causal;
  std::string config;
};

std::vector<ConfigCase> non_default_configs() {
  std::vector<ConfigCase> out;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    for (int hd : {64, 128, 256}) {
      for (int causal : {0, 1}) {
        const char* names[16];
        int32_t count = 0;
        if (flashcore_list_kernel_configs(dt, hd, causal, names, 16, &count) != FLASHCORE_SUCCESS) continue;
        for (int i = 1; i < count && i < 16; ++i) out.push_back({dt, hd, causal != 0, names[i]});
      }
    }
  }
  return out;
}

// Whether `config` is compiled for (dtype, head dim, non-causal) on this device.
bool compiled(flashcore_dtype dt, int head_dim, const std::string& config) {
  std::vector<std::string> configs;
  if (flashcore::test::kernel_configs(dt, head_dim, /*causal=*/false, configs) != FLASHCORE_SUCCESS) return false;
  return std::find(configs.begin(), configs.end(), config) != configs.end();
}

TEST(KernelConfigs, ListHasTheDefaultFirstForEveryCompiledHeadDim) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // the list is per device; these are sm90 config names
  const char* names[16];
  int32_t count = 0;
  ASSERT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 1, names, 16, &count), FLASHCORE_SUCCESS);
  flashcore_capabilities caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS);
  bool d128 = false;
  for (int i = 0; i < caps.num_head_dims; ++i) d128 = d128 || caps.head_dims[i] == 128;
  if (!d128) GTEST_SKIP() << "head dim 128 not compiled in";
  ASSERT_GE(count, 2) << "configs.txt lists a dynamic-scheduler option for d128 causal";
  EXPECT_STREQ(names[0], "128x176x2-onecta");  // configs.txt: the d128 causal default
}

TEST(KernelConfigs, EveryNonDefaultConfigPassesTheSuiteRules) {
  FLASHCORE_REQUIRE_GPU();
  const std::vector<ConfigCase> configs = non_default_configs();
  if (configs.empty()) GTEST_SKIP() << "no non-default kernel config compiled in";
  // Odd lengths, Sq != Sk both ways (rows with no visible key under causal), GQA, both layouts, batch > 1.
  const struct { int64_t b, hq, hkv, sq, sk; flashcore::check::Layout layout; } shapes[] = {
      {1, 1, 1, 1, 1, flashcore::check::Layout::BSHD},     {2, 4, 2, 17, 113, flashcore::check::Layout::BSHD},
      {1, 2, 1, 113, 17, flashcore::check::Layout::BHSD},  {3, 8, 1, 1000, 1000, flashcore::check::Layout::BSHD},
      {1, 4, 4, 4097, 4097, flashcore::check::Layout::BHSD}, {2, 6, 2, 300, 2048, flashcore::check::Layout::BSHD},
  };
  int runs = 0;
  for (const ConfigCase& cc : configs) {
    for (const auto& s : shapes) {
      flashcore::check::Case c;
      c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv, c.seqlen_q = s.sq, c.seqlen_k = s.sk;
      c.head_dim = cc.head_dim, c.dtype = cc.dtype, c.causal = cc.causal, c.layout = s.layout;
      c.kernel_config = cc.config.c_str();
      const flashcore::check::Result r = flashcore::check::run_case(c, 1234 + runs, /*repeats=*/3);
      EXPECT_TRUE(r.passed && r.deterministic)
          << cc.config << ": " << flashcore::check::describe(c) << ": " << r.message;
      ++runs;
    }
  }
  std::printf("kernel configs: %zu non-default config(s), %d case(s) run\n", configs.size(), runs);
}

// A small bf16 d128 causal problem on device buffers (the pointer checks reject host memory).
struct DeviceProblem {
  void* buf[4] = {};
  flashcore_attention_params p;
  DeviceProblem() {
    for (void*& b : buf) EXPECT_EQ(cudaMalloc(&b, 128 * 128 * 2), cudaSuccess);
    flashcore_attention_params_init(&p);
    p.q = buf[0], p.k = buf[1], p.v = buf[2], p.o = buf[3];
    p.batch = 1, p.seqlen_q = 128, p.seqlen_k = 128, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = 128;
    p.dtype = FLASHCORE_DTYPE_BF16, p.causal = 1;
    EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  }
  ~DeviceProblem() {
    for (void* b : buf) cudaFree(b);
  }
};

TEST(KernelConfigs, WorkspaceSizeIsZeroForTheDefaultAndACounterForTheDynamicScheduler) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  DeviceProblem d;
  uint64_t bytes = 1;
  EXPECT_EQ(flashcore_attention_workspace_size(&d.p, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(bytes, 0u);
  // A compiled dynamic-schedule row of the key (which ones a build holds: configs.txt and its build tiers).
  std::vector<std::string> configs;
  ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, 128, /*causal=*/true, configs), FLASHCORE_SUCCESS);
  const auto dynamic = std::find_if(configs.begin(), configs.end(), [](const std::string& c) {
    return c.find("-dynamic") != std::string::npos && c.find("-packed") == std::string::npos;
  });
  ASSERT_NE(dynamic, configs.end()) << "no dynamic-schedule row compiled for bf16 d128 causal";
  d.p.kernel_config = dynamic->c_str();
  EXPECT_EQ(flashcore_attention_workspace_size(&d.p, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(bytes, 16u);
  // Without the workspace the call is refused, naming what it needs.
  EXPECT_EQ(flashcore_attention_forward(&d.p, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("workspace"), std::string::npos) << flashcore_last_error();
  // With it, the counter is back to zero after the call (the workspace contract).
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, bytes), cudaSuccess);
  d.p.workspace = ws, d.p.workspace_size = bytes;
  EXPECT_EQ(flashcore_attention_forward(&d.p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  int counter = -1;
  ASSERT_EQ(cudaMemcpy(&counter, ws, sizeof(counter), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(counter, 0);
  cudaFree(ws);
}

// sm90::wave_row: a d64 non-causal call whose 192-row tiles leave the last round of SMs mostly idle runs 128-row tiles
// (2 x 8 heads x 2k: 176 tiles of 192 rows on 132 SMs take two rounds, as 256 tiles of 128 rows do), a large call keeps
// its row; and the call it runs is correct.
TEST(KernelConfigs, DispatchTakesSmallerTilesWhenTheLastRoundIsMostlyIdle) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  if (!compiled(FLASHCORE_DTYPE_FP16, 64, "128x128x3-pp-static")) {
    GTEST_SKIP() << "fp16 d64 128x128x3-pp-static not compiled in";
  }
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const auto rounds = [sms](int64_t tiles) { return (tiles + sms - 1) / sms; };
  void* buf[4] = {};
  const size_t bytes = size_t{16} * 32 * 2048 * 64 * 2;
  for (void*& b : buf) ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  for (const int64_t batch_heads : {16, 512}) {  // 2 x 8 and 16 x 32 heads at 2k
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = buf[0], p.k = buf[1], p.v = buf[2], p.o = buf[3];
    p.batch = batch_heads == 16 ? 2 : 16, p.num_heads_q = p.num_heads_kv = batch_heads == 16 ? 8 : 32;
    p.seqlen_q = p.seqlen_k = 2048, p.head_dim = 64, p.dtype = FLASHCORE_DTYPE_FP16, p.causal = 0;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    char name[128] = "";
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    const bool smaller = static_cast<double>(rounds(11 * batch_heads)) * 192 > 1.2 * rounds(16 * batch_heads) * 128;
    EXPECT_EQ(std::string(name) == "128x128x3-pp-static", smaller) << batch_heads << " heads: " << name;
  }
  for (void* b : buf) cudaFree(b);
  flashcore::check::Case c;
  c.batch = 2, c.heads_q = c.heads_kv = 8, c.seqlen_q = c.seqlen_k = 2048, c.head_dim = 64;
  c.dtype = FLASHCORE_DTYPE_FP16, c.causal = false, c.layout = flashcore::check::Layout::BSHD;
  const flashcore::check::Result r = flashcore::check::run_case(c, 77, /*repeats=*/2);
  EXPECT_TRUE(r.passed && r.deterministic) << flashcore::check::describe(c) << ": " << r.message;
}

// sm90::wave_row with a workspace: a call of fewer tiles than half the SMs against 16 key blocks or more (1 x 4 heads x
// 2k at d64: 44 tiles of 192 rows) runs the prefill split row, whose workspace the library reports; a smaller
// workspace, num_splits = 1, a short key range (1 x 8 heads x 512) or a round of whole tiles (2 x 8 heads x 2k) keeps
// whole tiles. Cut calls of every kind (whole rounds then parts, odd lengths, Sq != Sk, one query row, GQA, LSE, both
// layouts), the config named, match the float64 reference, bit-exactly on reruns (the merge does not depend on which
// part ends last).
TEST(KernelConfigs, DispatchCutsKeyRangesOfCallsThatLeaveMostSmsIdle) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  if (!compiled(FLASHCORE_DTYPE_FP16, 64, "192x128x3-pp-split")) {
    GTEST_SKIP() << "fp16 d64 192x128x3-pp-split not compiled in";
  }
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  if (sms < 90 || sms > 240) GTEST_SKIP() << "the selections below assume 90 to 240 SMs; this GPU has " << sms;
  void* buf[4] = {};
  const size_t bytes = size_t{2} * 8 * 2048 * 64 * 2;
  for (void*& b : buf) ASSERT_EQ(cudaMalloc(&b, bytes), cudaSuccess);
  const struct { int64_t b, h, s; bool split; } calls[] = {{1, 4, 2048, true}, {2, 8, 2048, false}, {1, 8, 512, false}};
  for (const auto& call : calls) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = buf[0], p.k = buf[1], p.v = buf[2], p.o = buf[3];
    p.batch = call.b, p.num_heads_q = p.num_heads_kv = call.h;
    p.seqlen_q = p.seqlen_k = call.s, p.head_dim = 64, p.dtype = FLASHCORE_DTYPE_FP16, p.causal = 0;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    uint64_t ws_bytes = 0;
    ASSERT_EQ(flashcore_attention_workspace_size(&p, &ws_bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
    void* ws = nullptr;
    ASSERT_EQ(cudaMalloc(&ws, ws_bytes > 0 ? ws_bytes : 1), cudaSuccess);
    p.workspace = ws, p.workspace_size = ws_bytes;
    char name[128] = "";
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(std::string(name) == "192x128x3-pp-split", call.split) << call.b << " x " << call.h << " x " << call.s
                                                                     << ": " << name;
    if (call.split) {
      EXPECT_GT(ws_bytes, 44u * 2 * 192 * 64 * 4);  // a 192-row fp32 partial per part: 44 tiles x 2 or more
      p.workspace_size = ws_bytes - 256;
      ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS)
          << flashcore_last_error();
      EXPECT_STRNE(name, "192x128x3-pp-split") << "a workspace smaller than the partials keeps whole tiles";
      p.workspace_size = ws_bytes, p.num_splits = 1;
      ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS)
          << flashcore_last_error();
      EXPECT_STRNE(name, "192x128x3-pp-split") << "num_splits = 1: no split";
    }
    cudaFree(ws);
  }
  for (void* b : buf) cudaFree(b);
  const struct { int64_t b, hq, hkv, sq, sk; bool lse; } shapes[] = {
      {2, 8, 8, 2048, 2048, false}, {2, 8, 2, 2048, 2048, true}, {2, 8, 8, 1999, 1999, true},
      {2, 8, 4, 2048, 1000, false}, {2, 9, 3, 2000, 3001, true}, {1, 8, 8, 4097, 4097, false},
      {1, 8, 8, 1, 4096, true}};
  int runs = 0;
  const struct { int head_dim; const char* config; } rows[] = {{64, "192x128x3-pp-split"}, {128, "128x128x2-pp-split"}};
  for (const auto& row : rows) {
    for (const auto& s : shapes) {
      flashcore::check::Case c;
      c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv, c.seqlen_q = s.sq, c.seqlen_k = s.sk;
      c.head_dim = row.head_dim, c.dtype = runs % 2 == 0 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
      c.causal = false, c.with_lse = s.lse;
      c.layout = runs % 3 == 2 ? flashcore::check::Layout::BHSD : flashcore::check::Layout::BSHD;
      c.kernel_config = row.config;
      if (!compiled(c.dtype, c.head_dim, row.config)) continue;
      const flashcore::check::Result r = flashcore::check::run_case(c, 4242 + runs, /*repeats=*/3);
      EXPECT_TRUE(r.passed && r.deterministic) << c.kernel_config << ": " << flashcore::check::describe(c) << ": "
                                               << r.message;
      ++runs;
    }
  }
  EXPECT_GE(runs, 7) << "the d64 split row's cases at least";
}

TEST(KernelConfigs, UnknownConfigNameIsAClearError) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  DeviceProblem d;
  d.p.kernel_config = "no-such-config";
  uint64_t bytes = 0;
  EXPECT_EQ(flashcore_attention_workspace_size(&d.p, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("no-such-config"), std::string::npos) << flashcore_last_error();
  EXPECT_EQ(flashcore_attention_forward(&d.p, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("128x176x2-onecta"), std::string::npos) << flashcore_last_error();
}

}  // namespace

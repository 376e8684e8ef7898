// Split-KV (Schedule::kSplitKv rows and the decode dispatch): decode shapes against the float64 reference through the
// normal API, many splits, empty splits (causal), one key, GQA, and the config dispatch picks for a decode call.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"

namespace {

// The split rows compiled for (dtype, head dim, causal): names ending in "-split".
std::vector<std::string> split_configs(flashcore_dtype dt, int hd, bool causal) {
  const char* names[32];
  int32_t count = 0;
  std::vector<std::string> out;
  if (flashcore_list_kernel_configs(dt, hd, causal ? 1 : 0, names, 32, &count) != FLASHCORE_SUCCESS) return out;
  for (int i = 0; i < count && i < 32; ++i) {
    const std::string n = names[i];
    if (n.size() > 6 && n.compare(n.size() - 6, 6, "-split") == 0) out.push_back(n);
  }
  return out;
}

// A bf16 d128 decode call (one new token, 32 query heads over 8 KV heads) on contiguous q, k, v, o = bufs[0..3].
void decode_params(flashcore_attention_params& p, void* const* bufs, int64_t batch, int64_t seqlen_k) {
  flashcore_attention_params_init(&p);
  p.q = bufs[0], p.k = bufs[1], p.v = bufs[2], p.o = bufs[3];
  p.batch = batch, p.seqlen_q = 1, p.seqlen_k = seqlen_k, p.num_heads_q = 32, p.num_heads_kv = 8, p.head_dim = 128;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
}

// The call's workspace, zero-filled as flashcore.h asks, attached to p (the caller frees it).
void attach_workspace(flashcore_attention_params& p, void*& workspace) {
  uint64_t ws = 0;
  ASSERT_EQ(flashcore_attention_workspace_size(&p, &ws), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaMalloc(&workspace, ws), cudaSuccess);
  ASSERT_EQ(cudaMemset(workspace, 0, ws), cudaSuccess);
  p.workspace = workspace, p.workspace_size = ws;
}

TEST(SplitKv, DecodeShapesPassTheSuiteRules) {
  FLASHCORE_REQUIRE_GPU();
  // (batch, heads q, heads kv, Sq, Sk, num_splits): one and a few query rows, long and odd key ranges, GQA 4:1 and
  // 8:1, a single key, Sq > Sk (causal rows with no key), one part, and both merges (split_plan.h): the tiles' last
  // splits at 240 tiles (the last counter byte), the combine kernel at 248 tiles (no counter for them).
  const struct { int64_t b, hq, hkv, sq, sk; int splits; } shapes[] = {
      {1, 32, 8, 1, 65537, 0}, {4, 16, 2, 1, 8191, 0}, {2, 8, 8, 3, 20000, 0}, {1, 4, 1, 1, 1, 0},
      {3, 8, 2, 5, 129, 0},    {1, 8, 8, 70, 33, 0},  {2, 4, 4, 64, 4096, 0}, {48, 8, 8, 1, 1030, 0},
      {30, 8, 8, 1, 1030, 3},  {31, 8, 8, 1, 1030, 3},
  };
  int runs = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int hd : {64, 128, 256}) {
      for (bool causal : {false, true}) {
        for (const std::string& config : split_configs(dt, hd, causal)) {
          for (const auto& s : shapes) {
            flashcore::check::Case c;
            c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv, c.seqlen_q = s.sq, c.seqlen_k = s.sk;
            c.head_dim = hd, c.dtype = dt, c.causal = causal;
            c.kernel_config = config.c_str();
            c.num_splits = s.splits;
            const flashcore::check::Result r = flashcore::check::run_case(c, 777 + runs, /*repeats=*/2);
            EXPECT_TRUE(r.passed && r.deterministic) << config << ": " << flashcore::check::describe(c) << ": "
                                                     << r.message;
            ++runs;
          }
        }
      }
    }
  }
  if (runs == 0) GTEST_SKIP() << "no split-KV row is compiled in";
  std::printf("split-KV: %d case(s) run\n", runs);
}

TEST(SplitKv, DispatchPicksTheSplitRowForDecodeWhenAWorkspaceIsGiven) {
  FLASHCORE_REQUIRE_GPU();
  if (split_configs(FLASHCORE_DTYPE_BF16, 128, false).empty()) GTEST_SKIP() << "no bf16 d128 split row";
  setenv("FLASHCORE_TUNING", "off", 1);  // the rule under test, not a tuning table's choice
  std::vector<void*> bufs(4, nullptr);
  const size_t q_bytes = 8 * 32 * 128 * 2, kv_bytes = size_t{8} * 8192 * 8 * 128 * 2;
  ASSERT_EQ(cudaMalloc(&bufs[0], q_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bufs[1], kv_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bufs[2], kv_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&bufs[3], q_bytes), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaMemset(bufs[i], 0, i == 0 ? q_bytes : kv_bytes), cudaSuccess);  // O = 0
  flashcore_attention_params p;
  ASSERT_NO_FATAL_FAILURE(decode_params(p, bufs.data(), 8, 8192));
  char name[128] = "";
  // Without a workspace: the dense kernel (the split needs one for its partials).
  ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
  const std::string without = name;
  EXPECT_EQ(without.find("-split"), std::string::npos) << without;
  void* workspace = nullptr;
  ASSERT_NO_FATAL_FAILURE(attach_workspace(p, workspace));
  ASSERT_GT(p.workspace_size, 256u);
  ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_NE(std::string(name).find("-split"), std::string::npos) << name;
  // Twice on one workspace: the tiles' last splits merge (64 tiles, split counters in the header), and the counters
  // are back to zero after each call (flashcore.h: the first 256 bytes stay zero), so the second call merges too.
  for (int call = 0; call < 2; ++call) {
    ASSERT_EQ(cudaMemset(bufs[3], 0xff, q_bytes), cudaSuccess);
    EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    unsigned char header[256];
    ASSERT_EQ(cudaMemcpy(header, workspace, sizeof header, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(header[i], 0) << "call " << call << ": workspace byte " << i << " not zero";
    std::vector<uint16_t> o(q_bytes / 2);
    ASSERT_EQ(cudaMemcpy(o.data(), bufs[3], q_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    int unwritten = 0;
    for (uint16_t x : o) unwritten += x == 0xffff ? 1 : 0;
    EXPECT_EQ(unwritten, 0) << "call " << call << ": O elements still poisoned";
  }
  cudaFree(workspace);
  for (void* b : bufs) cudaFree(b);
  unsetenv("FLASHCORE_TUNING");
}

// Programmatic dependent launch (sm90/backend.cpp): a forward grid may start while the stream's previous kernel
// finishes, and a split kernel lets the next grid launch once its CTAs have stored their partials. Two calls back to
// back on one stream and one workspace, the second taking the first's O as its Q, with no synchronisation between:
// the second must see the first's whole output (O is poisoned with NaN before), so its result equals the same call
// run alone afterwards, bit for bit.
TEST(SplitKv, ChainedCallsOnOneStreamSeeTheWholePreviousOutput) {
  FLASHCORE_REQUIRE_GPU();
  if (split_configs(FLASHCORE_DTYPE_BF16, 128, false).empty()) GTEST_SKIP() << "no bf16 d128 split row";
  const size_t q_elems = size_t{4} * 32 * 128, kv_elems = size_t{4} * 4096 * 8 * 128;
  std::vector<uint16_t> host(kv_elems);
  uint32_t state = 12345u;
  auto next_bf16 = [&state]() {  // small random bf16 values: sign, exponent 2^-3..2^0, 7 mantissa bits
    state = state * 1664525u + 1013904223u;
    return static_cast<uint16_t>(((state >> 31) << 15) | ((124u + ((state >> 20) & 3u)) << 7) | ((state >> 8) & 127u));
  };
  void* bufs[5] = {};
  for (int i = 0; i < 5; ++i) ASSERT_EQ(cudaMalloc(&bufs[i], (i == 1 || i == 2 ? kv_elems : q_elems) * 2), cudaSuccess);
  for (int i = 0; i < 3; ++i) {  // Q, K, V
    const size_t n = i == 0 ? q_elems : kv_elems;
    for (size_t j = 0; j < n; ++j) host[j] = next_bf16();
    ASSERT_EQ(cudaMemcpy(bufs[i], host.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  flashcore_attention_params p;
  ASSERT_NO_FATAL_FAILURE(decode_params(p, bufs, 4, 4096));
  void* workspace = nullptr;
  ASSERT_NO_FATAL_FAILURE(attach_workspace(p, workspace));
  char name[128] = "";
  ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_NE(std::string(name).find("-split"), std::string::npos) << name;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto call = [&](void* q, void* o) {
    p.q = q, p.o = o;
    return flashcore_attention_forward(&p, stream);
  };
  std::vector<uint16_t> chained(q_elems), alone(q_elems);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(cudaMemsetAsync(bufs[3], 0xff, q_elems * 2, stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(bufs[4], 0xff, q_elems * 2, stream), cudaSuccess);
    ASSERT_EQ(call(bufs[0], bufs[3]), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(call(bufs[3], bufs[4]), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(chained.data(), bufs[4], q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemset(bufs[4], 0xff, q_elems * 2), cudaSuccess);
    ASSERT_EQ(call(bufs[3], bufs[4]), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(alone.data(), bufs[4], q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int nan = 0, differ = 0;
    for (size_t j = 0; j < q_elems; ++j) {
      nan += (alone[j] & 0x7fff) > 0x7f80 ? 1 : 0;
      differ += chained[j] != alone[j] ? 1 : 0;
    }
    EXPECT_EQ(nan, 0) << "round " << round << ": NaN in the second call's output run alone";
    EXPECT_EQ(differ, 0) << "round " << round << ": the chained second call differs from the same call run alone";
  }
  cudaStreamDestroy(stream);
  cudaFree(workspace);
  for (void* b : bufs) cudaFree(b);
}

}  // namespace

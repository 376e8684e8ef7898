// KV-cache lengths (flashcore_attention_params::seqused_k): per-sequence key counts read on the device, causal
// bottom-right against them, and NaN in the cache's unused rows (past each length) never reaching O or LSE
// (FlashAttention-3 issue #1745). Decode (split-KV rows, GQA packing), chunked prefill and whole-tile rows, every
// config compiled for d128, lengths 0 and 1 included, against the float64 reference.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

using flashcore::check::Case;

Case cache_case(flashcore_dtype dt, int hd, bool causal, int64_t hq, int64_t hkv, int64_t sq, int64_t sk,
                std::vector<int32_t> used) {
  Case c;
  c.batch = static_cast<int64_t>(used.size()), c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.seqlen_k = sk;
  c.head_dim = hd, c.dtype = dt, c.causal = causal;
  c.seqused_k = std::move(used);
  return c;
}

void expect_passes(const Case& c, uint64_t seed) {
  const flashcore::check::Result r = flashcore::check::run_case(c, seed, /*repeats=*/2);
  if (r.skipped) GTEST_SKIP() << r.message;
  EXPECT_TRUE(r.passed && r.deterministic) << flashcore::check::describe(c) << ": " << r.message;
}

TEST(KvCache, LengthsAndNaNPaddingAcrossShapes) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  int runs = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int hd : {64, 128, 256}) {
      for (bool causal : {false, true}) {
        // Decode with GQA 4:1 (packed, split-KV): empty, one key, a partial block, a whole cache.
        expect_passes(cache_case(dt, hd, causal, 32, 8, 1, 4096, {0, 1, 1000, 4096}), 100 + runs++);
        // Chunked prefill: 17 new rows against caches of 17, 300 and 600 keys (causal: bottom-right per sequence).
        expect_passes(cache_case(dt, hd, causal, 8, 2, 17, 600, {17, 300, 600}), 100 + runs++);
        // Whole-tile rows (more than 64 query rows, ping-pong warpgroups): lengths off the block grid, one shorter
        // than the queries (its first causal rows see nothing).
        expect_passes(cache_case(dt, hd, causal, 4, 2, 200, 1000, {250, 999, 150}), 100 + runs++);
      }
    }
  }
  std::printf("kv cache: %d case(s) run\n", runs);
}

TEST(KvCache, EveryD128ConfigKeepsNaNOut) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  int runs = 0;
  for (bool causal : {false, true}) {
    std::vector<std::string> configs;
    ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, 128, causal, configs), FLASHCORE_SUCCESS);
    for (const std::string& config : configs) {
      Case c = cache_case(FLASHCORE_DTYPE_BF16, 128, causal, 8, 4, 70, 700, {333, 700, 0, 129});
      c.kernel_config = config.c_str();
      const flashcore::check::Result r = flashcore::check::run_case(c, 900 + runs++, /*repeats=*/1);
      if (r.skipped) continue;
      EXPECT_TRUE(r.passed) << config << ": " << flashcore::check::describe(c) << ": " << r.message;
    }
  }
  std::printf("kv cache configs: %d case(s) run\n", runs);
}

TEST(KvCache, SequsedMustBeAlignedDeviceMemory) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  std::vector<void*> bufs(4, nullptr);
  for (void*& b : bufs) ASSERT_EQ(cudaMalloc(&b, 4 * 64 * 64 * 2), cudaSuccess);
  int32_t* used = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&used), 64), cudaSuccess);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = bufs[0], p.k = bufs[1], p.v = bufs[2], p.o = bufs[3];
  p.batch = 4, p.seqlen_q = 1, p.seqlen_k = 64, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = 64;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  p.seqused_k = reinterpret_cast<const int32_t*>(reinterpret_cast<const char*>(used) + 2);
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_MISALIGNED_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("seqused_k"), std::string::npos) << flashcore_last_error();
  const int32_t host_lengths[4] = {1, 2, 3, 4};
  p.seqused_k = host_lengths;  // pageable host memory: not readable by the kernel
  EXPECT_NE(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS);
  EXPECT_NE(std::string(flashcore_last_error()).find("seqused_k"), std::string::npos) << flashcore_last_error();
  p.seqused_k = used;
  ASSERT_EQ(cudaMemset(used, 0, 64), cudaSuccess);
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(used);
  for (void* b : bufs) cudaFree(b);
}

}  // namespace

// The C ABI's plan/run pair (flashcore.h, flashcore_attention_plan): a plan run gives the bytes forward gives, for
// the dispatch paths that plan the most (dense, split-KV decode with GQA packing, precision = FP8); a plan is reused
// with new pointers; a call of other shapes, or too small a workspace, is refused with a message.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"

namespace {

using flashcore::test::DeviceBuffer;

struct Shape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int causal;
  int32_t precision = FLASHCORE_PRECISION_NATIVE;
};

// bf16 Q, K, V of random values in [-2, 2], an O and LSE pair for forward and one for run.
struct Problem {
  Shape s;
  size_t q_elems, kv_elems;
  DeviceBuffer q, k, v, o_fwd, o_run, o_run2, lse_fwd, lse_run;
  explicit Problem(const Shape& shape)
      : s(shape),
        q_elems(static_cast<size_t>(s.batch * s.seqlen_q * s.heads_q * s.head_dim)),
        kv_elems(static_cast<size_t>(s.batch * s.seqlen_k * s.heads_kv * s.head_dim)),
        q(q_elems * 2), k(kv_elems * 2), v(kv_elems * 2), o_fwd(q_elems * 2), o_run(q_elems * 2), o_run2(q_elems * 2),
        lse_fwd(lse_floats() * 4), lse_run(lse_floats() * 4) {
    std::mt19937 rng(static_cast<uint32_t>(s.seqlen_k * 131 + s.head_dim));
    std::uniform_real_distribution<float> uni(-2.f, 2.f);
    auto fill = [&](void* dst, size_t n) {
      std::vector<uint16_t> h(n);
      for (auto& x : h) {
        const float f = uni(rng);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        x = static_cast<uint16_t>(u >> 16);  // bf16 by truncation
      }
      ASSERT_EQ(cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
    };
    fill(q.ptr, q_elems);
    fill(k.ptr, kv_elems);
    fill(v.ptr, kv_elems);
  }
  size_t lse_floats() const { return static_cast<size_t>(s.batch * s.heads_q * s.seqlen_q); }
  flashcore_attention_params params(void* o, void* lse) const {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = q.ptr;
    p.k = k.ptr;
    p.v = v.ptr;
    p.o = o;
    p.lse = static_cast<float*>(lse);
    p.lse_capacity = static_cast<int64_t>(lse_floats());
    p.batch = s.batch;
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = s.seqlen_k;
    p.num_heads_q = s.heads_q;
    p.num_heads_kv = s.heads_kv;
    p.head_dim = s.head_dim;
    p.dtype = FLASHCORE_DTYPE_BF16;
    p.causal = s.causal;
    p.precision = s.precision;
    EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    return p;
  }
};

std::vector<uint8_t> download(const void* src, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  EXPECT_EQ(cudaMemcpy(h.data(), src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

bool compiled(int head_dim) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return false;
  for (int i = 0; i < caps.num_head_dims; ++i) {
    if (caps.head_dims[i] == head_dim) return true;
  }
  return false;
}

// Plan, check the plan's workspace and config against the one-call queries, run it twice (new O pointers) and
// compare O and LSE with forward's, byte for byte.
void expect_run_matches_forward(const Shape& s) {
  Problem pr(s);
  flashcore_attention_params p = pr.params(pr.o_run.ptr, pr.lse_run.ptr);
  flashcore_plan* plan = nullptr;
  ASSERT_EQ(flashcore_attention_plan(&p, &plan), FLASHCORE_SUCCESS) << flashcore_last_error();
  uint64_t plan_bytes = 0, call_bytes = 0;
  ASSERT_EQ(flashcore_plan_workspace_size(plan, &plan_bytes), FLASHCORE_SUCCESS);
  ASSERT_EQ(flashcore_attention_workspace_size(&p, &call_bytes), FLASHCORE_SUCCESS);
  EXPECT_EQ(plan_bytes, call_bytes);
  DeviceBuffer ws(plan_bytes > 0 ? plan_bytes : 16);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, plan_bytes > 0 ? plan_bytes : 16), cudaSuccess);
  p.workspace = plan_bytes > 0 ? ws.ptr : nullptr;
  p.workspace_size = plan_bytes;
  char plan_config[128], call_config[128];
  ASSERT_EQ(flashcore_plan_config(plan, plan_config, sizeof(plan_config)), FLASHCORE_SUCCESS);
  ASSERT_EQ(flashcore_attention_selected_config(&p, call_config, sizeof(call_config)), FLASHCORE_SUCCESS);
  EXPECT_STREQ(plan_config, call_config);

  flashcore_attention_params f = pr.params(pr.o_fwd.ptr, pr.lse_fwd.ptr);
  f.workspace = p.workspace;
  f.workspace_size = p.workspace_size;
  ASSERT_EQ(cudaMemset(pr.o_fwd.ptr, 0xff, pr.q_elems * 2), cudaSuccess);  // poisoned: NaN bf16
  ASSERT_EQ(cudaMemset(pr.o_run.ptr, 0xff, pr.q_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(pr.o_run2.ptr, 0xff, pr.q_elems * 2), cudaSuccess);
  ASSERT_EQ(flashcore_attention_forward(&f, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(flashcore_attention_run(plan, &p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params p2 = p;  // the same plan, new output pointers
  p2.o = pr.o_run2.ptr;
  ASSERT_EQ(flashcore_attention_run(plan, &p2, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint8_t> o_fwd = download(pr.o_fwd.ptr, pr.q_elems * 2);
  EXPECT_EQ(o_fwd, download(pr.o_run.ptr, pr.q_elems * 2)) << plan_config;
  EXPECT_EQ(o_fwd, download(pr.o_run2.ptr, pr.q_elems * 2)) << plan_config;
  EXPECT_EQ(download(pr.lse_fwd.ptr, pr.lse_floats() * 4), download(pr.lse_run.ptr, pr.lse_floats() * 4));
  bool finite = true;
  for (size_t i = 0; i + 1 < o_fwd.size(); i += 2) finite = finite && (o_fwd[i + 1] & 0x7f) != 0x7f;
  EXPECT_TRUE(finite) << "O holds the poison (or a NaN/Inf) after forward";
  flashcore_plan_destroy(plan);
}

TEST(Plan, DenseRunMatchesForward) {
  FLASHCORE_REQUIRE_GPU();
  for (int hd : {64, 128, 256}) {
    if (!compiled(hd)) continue;
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    expect_run_matches_forward({2, 300, 1000, 8, 2, hd, 1});
    expect_run_matches_forward({1, 1000, 1000, 4, 4, hd, 0});
  }
}

TEST(Plan, SplitKvDecodeWithGqaPackingMatchesForward) {
  FLASHCORE_REQUIRE_GPU();
  if (!compiled(128)) GTEST_SKIP() << "head dim 128 is not compiled";
  expect_run_matches_forward({2, 1, 8192, 32, 4, 128, 0});
  expect_run_matches_forward({4, 1, 4096, 8, 8, 128, 1});
}

TEST(Plan, Fp8PrecisionMatchesForward) {
  FLASHCORE_REQUIRE_BACKEND("sm90");
  if (!compiled(128)) GTEST_SKIP() << "head dim 128 is not compiled";
  Shape s{2, 512, 512, 8, 8, 128, 1, FLASHCORE_PRECISION_FP8};
  expect_run_matches_forward(s);
  s.precision = FLASHCORE_PRECISION_INT8;
  expect_run_matches_forward(s);
}

TEST(Plan, OtherShapesAndSmallWorkspacesAreRefused) {
  FLASHCORE_REQUIRE_GPU();
  if (!compiled(128)) GTEST_SKIP() << "head dim 128 is not compiled";
  Problem pr({2, 1, 8192, 32, 4, 128, 0});
  flashcore_attention_params p = pr.params(pr.o_run.ptr, pr.lse_run.ptr);
  flashcore_plan* plan = nullptr;
  ASSERT_EQ(flashcore_attention_plan(&p, &plan), FLASHCORE_SUCCESS) << flashcore_last_error();
  uint64_t bytes = 0;
  ASSERT_EQ(flashcore_plan_workspace_size(plan, &bytes), FLASHCORE_SUCCESS);
  ASSERT_GT(bytes, 0u) << "a split-KV decode plan needs a workspace for its partials";
  DeviceBuffer ws(bytes);
  ASSERT_EQ(cudaMemset(ws.ptr, 0, bytes), cudaSuccess);
  flashcore_attention_params other = p;
  other.workspace = ws.ptr;
  other.workspace_size = bytes;
  other.seqlen_k = 4096;
  EXPECT_EQ(flashcore_attention_run(plan, &other, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("params.seqlen_k differs from the plan's"), std::string::npos)
      << flashcore_last_error();
  other = p;
  other.workspace = ws.ptr;
  other.workspace_size = bytes;
  other.lse = nullptr;
  other.lse_capacity = 0;
  EXPECT_EQ(flashcore_attention_run(plan, &other, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("params.lse (given or not)"), std::string::npos)
      << flashcore_last_error();
  other = p;
  other.workspace = ws.ptr;
  other.workspace_size = bytes - 256;
  EXPECT_EQ(flashcore_attention_run(plan, &other, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("bytes of zero-filled workspace"), std::string::npos)
      << flashcore_last_error();
  flashcore_plan_destroy(plan);
}

}  // namespace

// Reliability on the GPU (issue "every input a correct answer or a clear error"): NaN semantics, the caller's
// CUDA error state, a context reset, host pointers. Each failed before the fix it names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

// A small bf16 problem (B=1, H=1, S=64, D=128, bshd) with device buffers; inputs N(0,1).
struct Small {
  static constexpr int S = 64, D = 128;
  std::vector<uint16_t> q, k, v;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float* dlse = nullptr;
  flashcore_attention_params p;

  Small() : q(S * D), k(S * D), v(S * D) {
    std::mt19937 gen(7);
    std::normal_distribution<float> n;
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = flashcore::reference::float_to_bf16(n(gen));
  }
  bool upload() {
    const size_t bytes = S * D * 2;
    for (void** d : {&dq, &dk, &dv, &dout})
      if (cudaMalloc(d, bytes) != cudaSuccess) return false;
    if (cudaMalloc(reinterpret_cast<void**>(&dlse), S * sizeof(float)) != cudaSuccess) return false;
    if (cudaMemcpy(dq, q.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dk, k.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(dv, v.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
      return false;
    flashcore_attention_params_init(&p);
    p.q = dq, p.k = dk, p.v = dv, p.o = dout, p.lse = dlse;
    p.batch = 1, p.seqlen_q = S, p.seqlen_k = S, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_BF16;
    return flashcore_attention_params_set_contiguous(&p, 0) == FLASHCORE_SUCCESS;
  }
  ~Small() {
    for (void* d : {dq, dk, dv, dout, static_cast<void*>(dlse)}) cudaFree(d);
  }
  void download(std::vector<float>& o, std::vector<float>& lse) const {
    std::vector<uint16_t> raw(S * D);
    ASSERT_EQ(cudaMemcpy(raw.data(), dout, raw.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    o.resize(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) o[i] = flashcore::reference::bf16_to_float(raw[i]);
    lse.resize(S);
    ASSERT_EQ(cudaMemcpy(lse.data(), dlse, S * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

// Before: fmaxf dropped the NaN from the row max, so a NaN score gave O = NaN but LSE = -inf.
TEST(Reliability, NanInARowMakesThatRowsOutputAndLseNan) {
  FLASHCORE_REQUIRE_GPU();
  Small s;
  const int row = 9;
  s.q[row * Small::D + 5] = 0x7fc0;  // bf16 quiet NaN in Q row 9: every score of that row is NaN
  ASSERT_TRUE(s.upload());
  for (int causal : {0, 1}) {
    s.p.causal = causal;
    ASSERT_EQ(flashcore_attention_forward(&s.p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> o, lse;
    s.download(o, lse);
    for (int r = 0; r < Small::S; ++r) {
      bool any_nan = false;
      for (int d = 0; d < Small::D; ++d) any_nan = any_nan || std::isnan(o[r * Small::D + d]);
      if (r == row) {
        EXPECT_TRUE(any_nan) << "causal " << causal;
        EXPECT_TRUE(std::isnan(lse[r])) << "causal " << causal << ": LSE " << lse[r] << " disagrees with O (NaN)";
      } else {
        EXPECT_FALSE(any_nan) << "row " << r << " causal " << causal;
        EXPECT_TRUE(std::isfinite(lse[r])) << "row " << r << " causal " << causal;
      }
    }
  }
}

// Before: `return cudaGetLastError()` after the launch reported an earlier, unrelated error as a launch failure
// and cleared it from under the caller.
TEST(Reliability, ACallersPendingErrorIsNeitherReportedNorCleared) {
  FLASHCORE_REQUIRE_GPU();
  Small s;
  ASSERT_TRUE(s.upload());
  void* huge = nullptr;
  ASSERT_NE(cudaMalloc(&huge, size_t{1} << 62), cudaSuccess);  // leaves cudaErrorMemoryAllocation pending
  EXPECT_EQ(flashcore_attention_forward(&s.p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation) << "the caller's own error was cleared";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Before: the per-device "shared-memory attribute set" cache survived cudaDeviceReset, so every later launch
// failed until the process exited.
TEST(Reliability, WorksAgainAfterCudaDeviceReset) {
  FLASHCORE_REQUIRE_GPU();
  flashcore::check::Case c;
  c.seqlen_q = c.seqlen_k = 300, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 128;
  const flashcore::check::Result before = flashcore::check::run_case(c, 11);
  ASSERT_TRUE(before.passed) << before.message;
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  const flashcore::check::Result after = flashcore::check::run_case(c, 12);
  EXPECT_TRUE(after.passed) << after.message;
}

// Before: a host pointer passed validation and the kernel faulted, killing the context for the process.
TEST(Reliability, HostMemoryIsRejectedAndTheContextSurvives) {
  FLASHCORE_REQUIRE_GPU();
  Small s;
  ASSERT_TRUE(s.upload());
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, Small::S * Small::D * 2), cudaSuccess);
  std::vector<uint16_t> pageable(Small::S * Small::D);
  for (void* host : {pinned, static_cast<void*>(pageable.data())}) {
    flashcore_attention_params bad = s.p;
    bad.v = host;
    EXPECT_EQ(flashcore_attention_forward(&bad, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error()).find("v = 0x"), std::string::npos) << flashcore_last_error();
  }
  cudaFreeHost(pinned);
  EXPECT_EQ(flashcore_attention_forward(&s.p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(Reliability, MemoryOfAnotherGpuIsRejected) {
  FLASHCORE_REQUIRE_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two CUDA GPUs (" << count << " visible)";
  Small s;
  ASSERT_TRUE(s.upload());
  void* other = nullptr;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&other, Small::S * Small::D * 2), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  flashcore_attention_params bad = s.p;
  bad.k = other;
  EXPECT_EQ(flashcore_attention_forward(&bad, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_last_error();
  cudaFree(other);
}

}  // namespace

// flashcore_stream_capture_id: 0 outside a capture and on a stream that is not capturing, a new nonzero id for each
// capture (the Python op keeps one workspace per capture with it).
TEST(StreamCaptureId, IdsOfRealCaptures) {
  FLASHCORE_REQUIRE_GPU();
  cudaStream_t a = nullptr, b = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
  uint64_t outside = 9, other = 9, ended = 9;
  EXPECT_EQ(flashcore_stream_capture_id(a, &outside), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(outside, 0u);
  uint64_t ids[2] = {0, 0};
  for (uint64_t& id : ids) {
    ASSERT_EQ(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    EXPECT_EQ(flashcore_stream_capture_id(a, &id), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(flashcore_stream_capture_id(b, &other), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(other, 0u) << "stream b is not capturing";
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(a, &graph), cudaSuccess);
    cudaGraphDestroy(graph);
    EXPECT_EQ(flashcore_stream_capture_id(a, &ended), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(ended, 0u);
  }
  EXPECT_NE(ids[0], 0u);
  EXPECT_NE(ids[1], 0u);
  EXPECT_NE(ids[0], ids[1]) << "each capture has its own id";
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

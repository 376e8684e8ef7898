// GPU tests of the backward of packed (variable-length) batches: cu_seqlens_q / cu_seqlens_k with total_q / total_k,
// Q, K, V, O, dO, dQ, dK, dV packed (total, heads, head_dim), LSE (heads, total_q), as the forward takes them. Each
// sequence's dq, dk, dv against the float64 reference of that sequence alone (reference::attention_backward on a
// one-sequence problem pointing into the packed host arrays). Tolerance: max |err| <= 0.02 (bf16) / 0.004 (fp16) x
// the sequence's largest reference gradient + 1e-3: a correct kernel's error is a few 1e-3 of it (the dense tests,
// test_backward.cpp, hold the tighter rule; this file is about which rows go where). Deterministic calls twice:
// bit-identical.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/backward_test_util.h"
#include "gpu/gpu_skip.h"
#include "reference/reference.h"

namespace {

using namespace flashcore::test_bwd;

struct VarlenCase {
  flashcore_dtype dtype;
  int64_t head_dim;
  bool causal;
  std::vector<int> len_q, len_k;
  int64_t heads_q = 4, heads_kv = 2;
  std::vector<int> used_q = {}, used_k = {};  // seqused_q / seqused_k (empty: not given)
};

std::string name_of(const VarlenCase& c) {
  return std::string(c.dtype == FLASHCORE_DTYPE_FP16 ? "fp16" : "bf16") + "_d" + std::to_string(c.head_dim) +
         (c.causal ? "_causal" : "_full") + "_seqs" + std::to_string(c.len_q.size()) +
         (c.used_q.empty() ? "" : "_usedq") + (c.used_k.empty() ? "" : "_usedk");
}

std::vector<VarlenCase> varlen_cases() {
  std::vector<VarlenCase> out;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int64_t d : {64, 128}) {
      for (bool causal : {false, true}) {
        // Lengths that cross and end inside blocks, a one-row sequence, one longer than a key block, Sq != Sk.
        out.push_back({dt, d, causal, {17, 64, 1, 200, 130}, {33, 64, 5, 200, 257}});
        // seqused_q / seqused_k (FlashAttention-3's): rows past them in each sequence's slot are unused (their
        // gradients zeros); a sequence with no used query or key; used counts equal to the slot's.
        out.push_back({dt, d, causal, {17, 64, 3, 200, 130}, {33, 64, 5, 200, 257}, 4, 2, {9, 64, 0, 131, 100},
                       {20, 0, 5, 77, 256}});
        out.push_back({dt, d, causal, {100, 40}, {100, 300}, 4, 2, {}, {60, 129}});
      }
    }
  }
  return out;
}

class BackwardVarlen : public testing::TestWithParam<VarlenCase> {};

TEST_P(BackwardVarlen, EachSequenceMatchesItsReference) {
  FLASHCORE_REQUIRE_GPU();
  const VarlenCase& c = GetParam();
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS);
  if (std::string(caps.device_backend) != "sm90") {
    GTEST_SKIP() << "the " << caps.device_backend << " backend's backward takes dense batches only (packed: sm90)";
  }
  const int64_t B = static_cast<int64_t>(c.len_q.size()), D = c.head_dim, Hq = c.heads_q, Hkv = c.heads_kv;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + c.len_q[b]);
    cu_k.push_back(cu_k.back() + c.len_k[b]);
  }
  const int64_t total_q = cu_q.back(), total_k = cu_k.back();
  const int64_t max_q = *std::max_element(c.len_q.begin(), c.len_q.end());
  const int64_t max_k = *std::max_element(c.len_k.begin(), c.len_k.end());
  std::mt19937_64 rng(1234 + D + (c.causal ? 7 : 0) + c.dtype);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](int64_t n) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = to_bits(normal(rng), c.dtype);
    return v;
  };
  const std::vector<uint16_t> q = random(total_q * Hq * D), k = random(total_k * Hkv * D), v = random(total_k * Hkv * D),
                              dout = random(total_q * Hq * D);
  const size_t qb = q.size() * 2, kb = k.size() * 2;
  DeviceBuffer dq_(qb), dk_(kb), dv_(kb), o_(qb), dout_(qb), dgq(qb), dgk(kb), dgv(kb), lse_(total_q * Hq * 4),
      cuq_(cu_q.size() * 4), cuk_(cu_k.size() * 4);
  ASSERT_EQ(cudaMemcpy(dq_.ptr, q.data(), qb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dk_.ptr, k.data(), kb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dv_.ptr, v.data(), kb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dout_.ptr, dout.data(), qb, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cuq_.ptr, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cuk_.ptr, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = B;
  p.seqlen_q = max_q;
  p.seqlen_k = max_k;
  p.num_heads_q = Hq;
  p.num_heads_kv = Hkv;
  p.head_dim = D;
  p.dtype = c.dtype;
  p.causal = c.causal ? 1 : 0;
  p.cu_seqlens_q = static_cast<const int32_t*>(cuq_.ptr);
  p.cu_seqlens_k = static_cast<const int32_t*>(cuk_.ptr);
  p.total_q = total_q;
  p.total_k = total_k;
  DeviceBuffer usedq_(std::max<size_t>(4, c.used_q.size() * 4)), usedk_(std::max<size_t>(4, c.used_k.size() * 4));
  if (!c.used_q.empty()) {
    ASSERT_EQ(cudaMemcpy(usedq_.ptr, c.used_q.data(), c.used_q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    p.seqused_q = static_cast<const int32_t*>(usedq_.ptr);
  }
  if (!c.used_k.empty()) {
    ASSERT_EQ(cudaMemcpy(usedk_.ptr, c.used_k.data(), c.used_k.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    p.seqused_k = static_cast<const int32_t*>(usedk_.ptr);
  }
  // The rows each sequence uses (the reference's lengths).
  auto used = [](const std::vector<int>& u, const std::vector<int>& len, int64_t b) {
    return u.empty() ? len[b] : std::min(u[b], len[b]);
  };
  const flashcore_tensor_strides qs{0, Hq * D, D, 1}, ks{0, Hkv * D, D, 1};
  p.q = dq_.ptr;
  p.k = dk_.ptr;
  p.v = dv_.ptr;
  p.o = o_.ptr;
  p.lse = static_cast<float*>(lse_.ptr);
  p.q_strides = p.o_strides = p.dout_strides = p.dq_strides = qs;
  p.k_strides = p.v_strides = p.dk_strides = p.dv_strides = ks;
  int32_t configs = 0;
  if (flashcore_list_kernel_configs(c.dtype, static_cast<int32_t>(D), p.causal, nullptr, 0, &configs) !=
          FLASHCORE_SUCCESS || configs == 0) {
    GTEST_SKIP() << "no forward kernel for " << name_of(c);
  }
  ASSERT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.dout = dout_.ptr;
  p.dq = dgq.ptr;
  p.dk = dgk.ptr;
  p.dv = dgv.ptr;
  uint64_t ws_bytes = 0;
  const flashcore_status size_status = flashcore_attention_backward_workspace_size(&p, &ws_bytes);
  if (size_status == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || size_status == FLASHCORE_ERROR_UNSUPPORTED_ARCH) {
    GTEST_SKIP() << name_of(c) << ": " << flashcore_last_error();
  }
  ASSERT_EQ(size_status, FLASHCORE_SUCCESS) << flashcore_last_error();
  DeviceBuffer ws(ws_bytes);
  p.workspace = ws.ptr;
  p.workspace_size = ws_bytes;

  std::vector<uint16_t> got[2][3];
  for (int run = 0; run < 2; ++run) {
    p.deterministic = run;  // the second run deterministic, run again below
    for (void* t : {dgq.ptr, dgk.ptr, dgv.ptr}) ASSERT_EQ(cudaMemset(t, 0xff, t == dgq.ptr ? qb : kb), cudaSuccess);
    ASSERT_EQ(cudaMemset(ws.ptr, 0xff, ws_bytes), cudaSuccess);
    ASSERT_EQ(flashcore_attention_backward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    int i = 0;
    for (void* t : {dgq.ptr, dgk.ptr, dgv.ptr}) {
      got[run][i].resize((t == dgq.ptr ? qb : kb) / 2);
      ASSERT_EQ(cudaMemcpy(got[run][i].data(), t, got[run][i].size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      ++i;
    }
  }
  // Deterministic twice: bit-identical.
  {
    for (void* t : {dgq.ptr, dgk.ptr, dgv.ptr}) ASSERT_EQ(cudaMemset(t, 0, t == dgq.ptr ? qb : kb), cudaSuccess);
    ASSERT_EQ(flashcore_attention_backward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    int i = 0;
    for (void* t : {dgq.ptr, dgk.ptr, dgv.ptr}) {
      std::vector<uint16_t> again(got[1][i].size());
      ASSERT_EQ(cudaMemcpy(again.data(), t, again.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(again == got[1][i]) << "deterministic rerun differs in tensor " << i;
      ++i;
    }
  }

  // Each sequence against its own reference.
  const double tol = c.dtype == FLASHCORE_DTYPE_FP16 ? 0.004 : 0.02;
  for (int run = 0; run < 2; ++run) {
    for (int64_t b = 0; b < B; ++b) {
      SCOPED_TRACE("run " + std::to_string(run) + " sequence " + std::to_string(b));
      flashcore_attention_params h;
      flashcore_attention_params_init(&h);
      h.batch = 1;
      h.seqlen_q = used(c.used_q, c.len_q, b);
      h.seqlen_k = used(c.used_k, c.len_k, b);
      h.num_heads_q = Hq;
      h.num_heads_kv = Hkv;
      h.head_dim = D;
      h.dtype = c.dtype;
      h.causal = p.causal;
      h.q = q.data() + cu_q[b] * Hq * D;
      h.k = k.data() + cu_k[b] * Hkv * D;
      h.v = v.data() + cu_k[b] * Hkv * D;
      h.q_strides = h.dout_strides = flashcore_tensor_strides{total_q * Hq * D, Hq * D, D, 1};
      h.k_strides = h.v_strides = flashcore_tensor_strides{total_k * Hkv * D, Hkv * D, D, 1};
      // The unused rows' gradients: zeros.
      {
        const int64_t rows[3] = {c.len_q[b] - h.seqlen_q, c.len_k[b] - h.seqlen_k, c.len_k[b] - h.seqlen_k};
        const int64_t first[3] = {(cu_q[b] + h.seqlen_q) * Hq * D, (cu_k[b] + h.seqlen_k) * Hkv * D,
                                  (cu_k[b] + h.seqlen_k) * Hkv * D};
        const int64_t width[3] = {Hq * D, Hkv * D, Hkv * D};
        for (int t = 0; t < 3; ++t) {
          int64_t nonzero = 0;
          for (int64_t e = 0; e < rows[t] * width[t]; ++e) nonzero += got[run][t][first[t] + e] != 0;
          EXPECT_EQ(nonzero, 0) << "tensor " << t << ": unused rows not zero";
        }
      }
      if (h.seqlen_q == 0 || h.seqlen_k == 0) {  // nothing attends: every gradient of the used rows is zero
        const int64_t count[3] = {h.seqlen_q * Hq * D, h.seqlen_k * Hkv * D, h.seqlen_k * Hkv * D};
        const int64_t first[3] = {cu_q[b] * Hq * D, cu_k[b] * Hkv * D, cu_k[b] * Hkv * D};
        for (int t = 0; t < 3; ++t) {
          int64_t nonzero = 0;
          for (int64_t e = 0; e < count[t]; ++e) nonzero += got[run][t][first[t] + e] != 0;
          EXPECT_EQ(nonzero, 0) << "tensor " << t << ": a sequence with no used query or key";
        }
        continue;
      }
      const ref::Gradients r = ref::attention_backward(h, dout.data() + cu_q[b] * Hq * D);
      const std::vector<double>* want[3] = {&r.dq, &r.dk, &r.dv};
      const int64_t start[3] = {cu_q[b] * Hq * D, cu_k[b] * Hkv * D, cu_k[b] * Hkv * D};
      double scale = 0;
      for (const auto* w : want) {
        for (double x : *w) scale = std::max(scale, std::fabs(x));
      }
      for (int t = 0; t < 3; ++t) {
        double err = 0;
        for (size_t e = 0; e < want[t]->size(); ++e) {
          const float g = to_float(got[run][t][start[t] + e], c.dtype);
          err = std::isfinite(g) ? std::max(err, std::fabs(g - (*want[t])[e])) : INFINITY;
        }
        const char* names[3] = {"dq", "dk", "dv"};
        EXPECT_LE(err, tol * scale + 1e-3) << name_of(c) << " " << names[t];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Packed, BackwardVarlen, testing::ValuesIn(varlen_cases()),
                         [](const testing::TestParamInfo<VarlenCase>& info) { return name_of(info.param); });

}  // namespace

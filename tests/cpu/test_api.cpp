// The header-only C++ layer (include/flashcore/flashcore.hpp), without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.hpp"
#include "gpu/gpu_skip.h"

namespace {

// Runs `call`, which must throw flashcore::Error with `status` and a message containing `needle`.
template <typename Call>
void expect_error(Call&& call, flashcore_status status, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no flashcore::Error thrown (expected '" << needle << "')";
  } catch (const flashcore::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Views over host vectors (stand-ins for device memory) for a compiled (dtype, head dim).
struct Problem {
  flashcore_dtype dtype;
  int64_t b = 2, sq = 16, sk = 32, hq = 4, hkv = 2, d = 0;
  std::vector<uint16_t> q, k, v, o;
  flashcore::TensorView qv, kv, vv, ov;

  explicit Problem(bool bhsd = false) {
    const flashcore::Capabilities caps = flashcore::capabilities();
    dtype = caps.dtypes.at(0);
    d = caps.head_dims.at(0);
    q.assign(b * sq * hq * d, 0x1234);
    k.assign(b * sk * hkv * d, 0);
    v.assign(b * sk * hkv * d, 0);
    o.assign(b * sq * hq * d, 0x5555);
    auto make = bhsd ? &flashcore::TensorView::bhsd : &flashcore::TensorView::bshd;
    qv = make(q.data(), dtype, b, sq, hq, d);
    kv = make(k.data(), dtype, b, sk, hkv, d);
    vv = make(v.data(), dtype, b, sk, hkv, d);
    ov = make(o.data(), dtype, b, sq, hq, d);
  }
  bool o_untouched() const {
    for (uint16_t x : o) {
      if (x != 0x5555) return false;
    }
    return true;
  }
};

void expect_strides(const flashcore::TensorView& t, int64_t batch, int64_t seq, int64_t head) {
  const flashcore_tensor_strides want{batch, seq, head, 1};
  EXPECT_EQ(std::vector<int64_t>({t.strides.batch, t.strides.seq, t.strides.head, t.strides.dim}),
            std::vector<int64_t>({want.batch, want.seq, want.head, want.dim}));
  EXPECT_EQ(t.numel(), t.batch * t.seq * t.heads * t.head_dim);
  EXPECT_EQ(t.offset(t.batch - 1, t.seq - 1, t.heads - 1, t.head_dim - 1), t.numel() - 1);  // dense
}

TEST(TensorView, BshdStrides) {
  const auto t = flashcore::TensorView::bshd(nullptr, FLASHCORE_DTYPE_FP16, 2, 5, 3, 64);
  expect_strides(t, 5 * 3 * 64, 3 * 64, 64);
  EXPECT_EQ(t.offset(1, 2, 1, 7), 1 * 960 + 2 * 192 + 64 + 7);
}

TEST(TensorView, BhsdStrides) {
  const auto t = flashcore::TensorView::bhsd(nullptr, FLASHCORE_DTYPE_BF16, 2, 5, 3, 128);
  expect_strides(t, 3 * 5 * 128, 128, 5 * 128);
  EXPECT_EQ(t.offset(1, 2, 1, 7), 1 * 1920 + 2 * 128 + 640 + 7);
}

TEST(TensorView, MatchesSetContiguous) {
  for (int bhsd = 0; bhsd < 2; ++bhsd) {
    Problem pr(bhsd == 1);
    const flashcore_attention_params from_views = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov);
    flashcore_attention_params from_c = from_views;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&from_c, bhsd), FLASHCORE_SUCCESS);
    for (auto member : {&flashcore_attention_params::q_strides, &flashcore_attention_params::k_strides,
                        &flashcore_attention_params::v_strides, &flashcore_attention_params::o_strides}) {
      EXPECT_EQ((from_views.*member).batch, (from_c.*member).batch);
      EXPECT_EQ((from_views.*member).seq, (from_c.*member).seq);
      EXPECT_EQ((from_views.*member).head, (from_c.*member).head);
      EXPECT_EQ((from_views.*member).dim, (from_c.*member).dim);
    }
  }
}

TEST(MakeParams, FillsEveryField) {
  Problem pr;
  float lse[1];
  const auto p = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov, {/*causal=*/true, /*softmax_scale=*/0.25f, lse});
  EXPECT_EQ(p.struct_size, sizeof(flashcore_attention_params));
  EXPECT_EQ(p.q, pr.q.data());
  EXPECT_EQ(p.k, pr.k.data());
  EXPECT_EQ(p.v, pr.v.data());
  EXPECT_EQ(p.o, pr.o.data());
  EXPECT_EQ(p.lse, lse);
  EXPECT_EQ(p.batch, pr.b);
  EXPECT_EQ(p.seqlen_q, pr.sq);
  EXPECT_EQ(p.seqlen_k, pr.sk);
  EXPECT_EQ(p.num_heads_q, pr.hq);
  EXPECT_EQ(p.num_heads_kv, pr.hkv);
  EXPECT_EQ(p.head_dim, pr.d);
  EXPECT_EQ(p.dtype, pr.dtype);
  EXPECT_EQ(p.causal, 1);
  EXPECT_EQ(p.softmax_scale, 0.25f);
}

TEST(MakeParams, MismatchedViewsThrow) {
  Problem pr;
  auto expect_invalid = [&](const flashcore::TensorView& q, const flashcore::TensorView& k,
                            const flashcore::TensorView& v, const flashcore::TensorView& o, const char* needle) {
    expect_error([&] { flashcore::make_params(q, k, v, o); }, FLASHCORE_ERROR_INVALID_ARGUMENT, needle);
  };
  auto k2 = pr.kv;
  k2.batch = 3;
  expect_invalid(pr.qv, k2, pr.vv, pr.ov, "batch sizes");
  auto v2 = pr.vv;
  v2.seq = 31;
  expect_invalid(pr.qv, pr.kv, v2, pr.ov, "seqlens of k and v");
  auto o2 = pr.ov;
  o2.heads = 2;
  expect_invalid(pr.qv, pr.kv, pr.vv, o2, "head counts of q and o");
  auto q2 = pr.qv;
  q2.dtype = pr.dtype == FLASHCORE_DTYPE_FP16 ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
  expect_invalid(q2, pr.kv, pr.vv, pr.ov, "dtypes");
  auto k3 = pr.kv;
  k3.head_dim = 32;
  expect_invalid(pr.qv, k3, pr.vv, pr.ov, "head dims");
}

TEST(Error, CarriesStatusAndMessage) {
  const flashcore::Error e(FLASHCORE_ERROR_INVALID_STRIDE, "q_strides.seq = 12");
  EXPECT_EQ(e.status(), FLASHCORE_ERROR_INVALID_STRIDE);
  EXPECT_STREQ(e.what(), "invalid stride: q_strides.seq = 12");
  EXPECT_NO_THROW(flashcore::check(FLASHCORE_SUCCESS));
  EXPECT_THROW(flashcore::check(FLASHCORE_ERROR_INTERNAL), flashcore::Error);
}

TEST(Validate, ThrowsWithTheCMessage) {
  Problem pr;
  EXPECT_NO_THROW(flashcore::validate(pr.qv, pr.kv, pr.vv, pr.ov));
  pr.qv.strides.seq = 12;
  expect_error([&] { flashcore::validate(pr.qv, pr.kv, pr.vv, pr.ov); }, FLASHCORE_ERROR_INVALID_STRIDE,
               "q_strides.seq = 12 is not a multiple of 8");
}

TEST(AttentionForward, ArgumentErrorsThrowBeforeDeviceAccess) {
  Problem pr;
  pr.kv.heads = pr.vv.heads = 3;  // 4 % 3 != 0
  expect_error([&] { flashcore::attention_forward(pr.qv, pr.kv, pr.vv, pr.ov, {true}); },
               FLASHCORE_ERROR_INVALID_HEAD_RATIO, "num_heads_q = 4");
  EXPECT_TRUE(pr.o_untouched());
}

TEST(AttentionForward, NoDeviceThrowsNoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  Problem pr;
  expect_error([&] { flashcore::attention_forward(pr.qv, pr.kv, pr.vv, pr.ov); }, FLASHCORE_ERROR_NO_DEVICE,
               "no CUDA device visible");
  EXPECT_TRUE(pr.o_untouched());
}

TEST(Capabilities, CppMatchesC) {
  const flashcore::Capabilities caps = flashcore::capabilities();
  flashcore_capabilities raw{};
  raw.struct_size = sizeof(raw);
  ASSERT_EQ(flashcore_get_capabilities(&raw), FLASHCORE_SUCCESS);
  EXPECT_EQ(caps.dtypes, std::vector<flashcore_dtype>(raw.dtypes, raw.dtypes + raw.num_dtypes));
  EXPECT_EQ(caps.head_dims, std::vector<int>(raw.head_dims, raw.head_dims + raw.num_head_dims));
  EXPECT_EQ(caps.archs, std::vector<int>({90}));
  EXPECT_EQ(caps.device_arch, raw.device_arch);
  EXPECT_EQ(caps.device_supported, raw.device_supported != 0);
  EXPECT_EQ(flashcore::version(), std::string(flashcore_version_string()));
}

}  // namespace

// FLASHCORE_FLAG_KV_FP8_E4M3 (0.9: an e4m3 KV cache under 16-bit Q) through the public C API, without a GPU: the flag's
// value, a valid call (K and V sized and strided in bytes, k_descale / v_descale taken), and every refusal with its
// status and a message naming the argument. Host buffers stand in for device memory: the argument checks touch no
// device.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"
#include "flashcore/flashcore.hpp"

namespace {

using flashcore::test::HostBuffer;

TEST(Kv8Abi, TheFlag) {
  EXPECT_EQ(FLASHCORE_FLAG_KV_FP8_E4M3, 2u);
  EXPECT_EQ(FLASHCORE_FLAGS_ALL, FLASHCORE_FLAG_V_TRANSPOSED | FLASHCORE_FLAG_KV_FP8_E4M3);
  EXPECT_GE(FLASHCORE_VERSION_MINOR, 9);
}

// A decode call on a dense e4m3 cache: 2 sequences of 1 query, 64 cached rows (seqused_k), GQA 4 / 2.
class Kv8Validation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 1, SK = 64, HQ = 4, HKV = 2;

  void SetUp() override {
    const flashcore::test::Compiled c = flashcore::test::first_compiled();
    if (c.head_dim == 0) GTEST_SKIP() << "no 16-bit head dim compiled in this build";
    d_ = c.head_dim;
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * d_ * 2);
    k_ = std::make_unique<HostBuffer>(B * SK * HKV * d_);  // 1 byte per element
    v_ = std::make_unique<HostBuffer>(B * SK * HKV * d_);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * d_ * 2);
    kn_ = std::make_unique<HostBuffer>(B * HKV * d_ * 2);  // one new 16-bit row per sequence
    floats_ = std::make_unique<HostBuffer>(256);
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = d_;
    p.dtype = c.dtype;
    p.flags = FLASHCORE_FLAG_KV_FP8_E4M3;
    p.q_strides = {SQ * HQ * d_, HQ * d_, d_, 1};
    p.o_strides = p.q_strides;
    p.k_strides = {SK * HKV * d_, HKV * d_, d_, 1};
    p.v_strides = p.k_strides;
    p.seqused_k = reinterpret_cast<const int32_t*>(floats_->data());
    p.k_descale = reinterpret_cast<const float*>(floats_->data() + 64);
    p.v_descale = reinterpret_cast<const float*>(floats_->data() + 128);
  }

  void expect_error(const flashcore_attention_params& params, flashcore_status want,
                    const std::vector<std::string>& needles) {
    const flashcore_status got = flashcore_attention_validate(&params);
    EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
    const std::string message = flashcore_last_error();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
  }

  int64_t d_ = 0;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, kn_, floats_;
};

TEST_F(Kv8Validation, ACallOnAnE4m3CacheValidates) {
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params no_descales = p;  // NULL: 1 for every entry
  no_descales.k_descale = no_descales.v_descale = nullptr;
  EXPECT_EQ(flashcore_attention_validate(&no_descales), FLASHCORE_SUCCESS) << flashcore_last_error();
  // The same descales without the flag: 16-bit K and V take none.
  flashcore_attention_params no_flag = p;
  no_flag.flags = 0;
  expect_error(no_flag, FLASHCORE_ERROR_INVALID_ARGUMENT, {"k_descale", "8-bit"});
}

// An e4m3 Q (FA3's FP8 KV-cache call): Q in e4m3 with q_descale, O in out_dtype (bf16 for SAME, or fp16); the
// library widens Q into the workspace. What it does not take with it is refused, naming the field.
TEST_F(Kv8Validation, AnE4m3QueryValidates) {
  flashcore_attention_params q8 = p;
  q8.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  q8.q_strides = {SQ * HQ * d_, HQ * d_, d_, 1};  // (elements: one byte each)
  q8.q_descale = reinterpret_cast<const float*>(floats_->data() + 192);
  EXPECT_EQ(flashcore_attention_validate(&q8), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params fp16_out = q8;
  fp16_out.out_dtype = FLASHCORE_DTYPE_FP16;
  EXPECT_EQ(flashcore_attention_validate(&fp16_out), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params e4m3_out = q8;
  e4m3_out.out_dtype = FLASHCORE_DTYPE_FP8_E4M3;
  expect_error(e4m3_out, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype", "fp16 or bf16"});
  flashcore_attention_params append = q8;
  append.k_new = kn_->data(), append.v_new = kn_->data(), append.seqlen_new = 1;
  append.k_new_strides = {HKV * d_, HKV * d_, d_, 1};
  append.v_new_strides = append.k_new_strides;
  expect_error(append, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "k_new", "dtype = e4m3"});
  flashcore_attention_params transposed = q8;
  transposed.flags |= FLASHCORE_FLAG_V_TRANSPOSED;
  expect_error(transposed, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "V_TRANSPOSED"});
}

// Appends (k_new / v_new in Q's 16-bit dtype, quantized into the cache with k_descale / v_descale): taken, and the
// cache they write is sized in bytes when checked against them.
TEST_F(Kv8Validation, AppendsOfSixteenBitRowsValidate) {
  flashcore_attention_params append = p;
  append.k_new = kn_->data(), append.v_new = kn_->data(), append.seqlen_new = 1;
  append.k_new_strides = {HKV * d_, HKV * d_, d_, 1};
  append.v_new_strides = append.k_new_strides;
  EXPECT_EQ(flashcore_attention_validate(&append), FLASHCORE_SUCCESS) << flashcore_last_error();
  // New rows right after the e4m3 K: no overlap (a 16-bit reading of K would claim one).
  std::unique_ptr<HostBuffer> big = std::make_unique<HostBuffer>(B * SK * HKV * d_ + B * HKV * d_ * 2);
  flashcore_attention_params after = append;
  after.k = big->data();
  after.k_new = after.v_new = big->data() + B * SK * HKV * d_;
  EXPECT_EQ(flashcore_attention_validate(&after), FLASHCORE_SUCCESS) << flashcore_last_error();
  // New rows starting 16 bytes before K ends: the append writes K while it reads them.
  after.k_new = after.v_new = big->data() + B * SK * HKV * d_ - 16;
  expect_error(after, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"k_new", "overlaps"});
}

TEST_F(Kv8Validation, KAndVAreSizedAndStridedInBytes) {
  // One byte per element: a K of B * SK * HKV * d bytes is whole; a 16-bit reading would run past it, so a K buffer
  // that ends where the e4m3 cache ends must validate, and O placed right after it must not overlap it.
  flashcore_attention_params after = p;
  std::unique_ptr<HostBuffer> big = std::make_unique<HostBuffer>(B * SK * HKV * d_ + B * SQ * HQ * d_ * 2);
  after.k = big->data();
  after.o = big->data() + B * SK * HKV * d_;
  EXPECT_EQ(flashcore_attention_validate(&after), FLASHCORE_SUCCESS) << flashcore_last_error();
  // TMA needs 16-byte strides: 16 e4m3 elements, where 8 would do for a 16-bit K.
  flashcore_attention_params odd = p;
  odd.k_strides.seq = HKV * d_ + 8;
  odd.k_strides.batch = SK * odd.k_strides.seq;
  expect_error(odd, FLASHCORE_ERROR_INVALID_STRIDE, {"k_strides.seq", "multiple of 16 elements"});
}

TEST_F(Kv8Validation, WhatAnE4m3CacheDoesNotTakeYet) {
  flashcore_attention_params e5m2_q = p;
  e5m2_q.dtype = FLASHCORE_DTYPE_FP8_E5M2;
  const flashcore_status got = flashcore_attention_validate(&e5m2_q);
  EXPECT_NE(got, FLASHCORE_SUCCESS);
  flashcore_attention_params q_descale = p;
  q_descale.q_descale = p.k_descale;
  expect_error(q_descale, FLASHCORE_ERROR_INVALID_ARGUMENT, {"q_descale"});
  flashcore_attention_params softcap = p;
  softcap.softcap = 30.f;
  expect_error(softcap, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "softcap"});
  flashcore_attention_params window = p;
  window.local = 1, window.window_size_left = 16, window.window_size_right = 0;
  expect_error(window, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "local"});
  flashcore_attention_params precision = p;
  precision.precision = FLASHCORE_PRECISION_FP8;
  precision.k_descale = precision.v_descale = nullptr;
  expect_error(precision, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "precision"});
  flashcore_attention_params named = p;
  named.kernel_config = "64x128x2-split";
  expect_error(named, FLASHCORE_ERROR_INVALID_ARGUMENT, {"FLASHCORE_FLAG_KV_FP8_E4M3", "kernel_config"});
  flashcore_attention_params unknown = p;
  unknown.flags = 4u;
  expect_error(unknown, FLASHCORE_ERROR_INVALID_ARGUMENT, {"flags = 4"});
}

}  // namespace

namespace {

// The C++ layer: e4m3 k and v views under a 16-bit q set the flag; an e5m2 cache is a dtype mismatch.
TEST(Kv8CppLayer, MakeParamsSetsTheFlag) {
  std::vector<unsigned char> buf(1 << 16);
  void* d = buf.data();
  const auto q = flashcore::TensorView::bshd(d, FLASHCORE_DTYPE_BF16, 2, 1, 4, 128);
  const auto o = flashcore::TensorView::bshd(d, FLASHCORE_DTYPE_BF16, 2, 1, 4, 128);
  const auto k8 = flashcore::TensorView::bshd(d, FLASHCORE_DTYPE_FP8_E4M3, 2, 64, 2, 128);
  flashcore::ForwardOptions opt;
  const flashcore_attention_params p = flashcore::make_params(q, k8, k8, o, opt);
  EXPECT_EQ(p.flags & FLASHCORE_FLAG_KV_FP8_E4M3, FLASHCORE_FLAG_KV_FP8_E4M3);
  EXPECT_EQ(p.dtype, FLASHCORE_DTYPE_BF16);
  const auto q16 = flashcore::TensorView::bshd(d, FLASHCORE_DTYPE_BF16, 2, 1, 4, 128);
  const flashcore_attention_params plain = flashcore::make_params(q16, q16, q16, o, opt);
  EXPECT_EQ(plain.flags & FLASHCORE_FLAG_KV_FP8_E4M3, 0u);
  const auto k5 = flashcore::TensorView::bshd(d, FLASHCORE_DTYPE_FP8_E5M2, 2, 64, 2, 128);
  EXPECT_THROW(flashcore::make_params(q, k5, k5, o, opt), flashcore::Error);
}

}  // namespace

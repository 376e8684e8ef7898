// Argument validation of the 8-bit path (ABI 0.3: q_descale / k_descale / v_descale, precision, reserved2, dtype
// FLASHCORE_DTYPE_FP8_E4M3 with out_dtype), without a GPU: every rule's status and a message naming the field, O and
// LSE untouched by a failing call, the valid combinations accepted, and the 0.2 struct layout
// (FLASHCORE_ATTENTION_PARAMS_V2_SIZE) accepted by params_init_sized / set_contiguous / validate.
// Host buffers stand in for device memory: validation does no device work, and every failing call fails before any.
//
// The tests that need e4m3 kernels in the build (the checks that come after the "dtype compiled" check: descale
// alignment, 8-bit strides, out_dtype of an 8-bit call) skip with the reason in a build without them.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/backend.h"
#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"
#include "flashcore/flashcore.hpp"
#include "gpu/gpu_skip.h"

namespace {

using flashcore::test::Compiled;
using flashcore::test::first_compiled;
using flashcore::test::HostBuffer;

constexpr int kHeadDims[] = {64, 128, 256};

// A head dim with e4m3 kernels in this build (0: none).
int e4m3_head_dim() {
  for (int hd : kHeadDims) {
    if (flashcore::backend::is_compiled(FLASHCORE_DTYPE_FP8_E4M3, hd)) return hd;
  }
  return 0;
}

// ---- the layout of the 0.3 fields ----
TEST(Fp8Abi, LayoutOfTheFieldsSince03) {
  EXPECT_EQ(offsetof(flashcore_attention_params, q_descale), size_t{FLASHCORE_ATTENTION_PARAMS_V2_SIZE});
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V2_SIZE}, 448u);
  EXPECT_EQ(offsetof(flashcore_attention_params, k_descale), 456u);
  EXPECT_EQ(offsetof(flashcore_attention_params, v_descale), 464u);
  EXPECT_EQ(offsetof(flashcore_attention_params, precision), 472u);
  EXPECT_EQ(offsetof(flashcore_attention_params, reserved2), 476u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dout), 480u);  // the 0.3 layout ends here (0.4 appends the backward's)
  EXPECT_EQ(FLASHCORE_PRECISION_NATIVE, 0);
  EXPECT_EQ(FLASHCORE_PRECISION_FP8, 1);
  EXPECT_EQ(static_cast<int>(FLASHCORE_DTYPE_FP8_E4M3), 3);
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_GE(minor, 3) << "the library predates the 0.3 fields";
}

TEST(Fp8Abi, InitSetsTheDefaultsOfTheFieldsSince03) {
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(p));
  EXPECT_EQ(p.q_descale, nullptr);
  EXPECT_EQ(p.k_descale, nullptr);
  EXPECT_EQ(p.v_descale, nullptr);
  EXPECT_EQ(p.precision, FLASHCORE_PRECISION_NATIVE);
  EXPECT_EQ(p.reserved2, 0);
  EXPECT_EQ(p.out_dtype, FLASHCORE_DTYPE_SAME);
}

// ---- the fixture: a valid 16-bit problem on host buffers sized for 2-byte inputs (which hold 8-bit ones too) ----
class Fp8Validation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 16, SK = 32, HQ = 4, HKV = 2;

  void SetUp() override {
    const Compiled c = first_compiled();
    ASSERT_GT(c.head_dim, 0) << "this build compiled no 16-bit kernel at all";
    dtype16 = c.dtype;
    D = c.head_dim;
    const int e4m3_d = e4m3_head_dim();
    // Rows of up to dmax + 32 elements (the padded layouts below) of up to 2 bytes.
    const int64_t dmax = std::max<int64_t>(D, e4m3_d) + 32;
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * dmax * 2);
    k_ = std::make_unique<HostBuffer>(B * SK * HKV * dmax * 2);
    v_ = std::make_unique<HostBuffer>(B * SK * HKV * dmax * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * dmax * 2);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    scales_ = std::make_unique<HostBuffer>(3 * 64 * sizeof(float));  // three (B, HKV) descale arrays, 64 bytes apart
    ints_ = std::make_unique<HostBuffer>(1024);                        // seqused_k, cu_seqlens, block_table
    make(dtype16, static_cast<int>(D));
    ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  // p = a valid dense problem of `dtype` and `head_dim` (BSHD, with LSE), no 0.3 field set.
  void make(flashcore_dtype dtype, int head_dim) {
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.lse = reinterpret_cast<float*>(lse_->data());
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = head_dim;
    p.dtype = dtype;
    // (8-bit inputs: O is 16-bit, out_dtype SAME = bf16; strides in elements are the same numbers for both.)
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  const float* descale(int which, int misalign_bytes = 0) const {
    return reinterpret_cast<const float*>(scales_->data() + which * 256 + misalign_bytes);
  }

  // validate() and forward() both return `want` with a message holding every needle; O and LSE untouched.
  void expect_error(flashcore_status want, const std::vector<std::string>& needles) { expect_error(&p, want, needles); }
  void expect_error(const flashcore_attention_params* params, flashcore_status want,
                    const std::vector<std::string>& needles) {
    for (int forward = 0; forward < 2; ++forward) {
      SCOPED_TRACE(forward ? "flashcore_attention_forward" : "flashcore_attention_validate");
      const flashcore_status got =
          forward ? flashcore_attention_forward(params, nullptr) : flashcore_attention_validate(params);
      EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
      const std::string message = flashcore_last_error();
      for (const std::string& needle : needles) {
        EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
      }
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
    EXPECT_TRUE(lse_->untouched()) << "LSE was written by a failing call";
  }
  void expect_accepted(const flashcore_attention_params& params) {
    EXPECT_EQ(flashcore_attention_validate(&params), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  flashcore_dtype dtype16 = FLASHCORE_DTYPE_BF16;
  int64_t D = 0;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_, scales_, ints_;
};

// ---- precision ----
TEST_F(Fp8Validation, PrecisionMustBeNativeFp8OrInt8) {
  for (int32_t bad : {3, -1, 255, INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE(bad);
    p.precision = bad;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"precision = " + std::to_string(bad)});
  }
  p.precision = FLASHCORE_PRECISION_NATIVE;
  expect_accepted(p);
}

// precision = FP8 on a 16-bit call: arguments fine (the workspace it needs is a device-time check of forward).
TEST_F(Fp8Validation, PrecisionFp8IsAcceptedForA16BitCall) {
  p.precision = FLASHCORE_PRECISION_FP8;
  expect_accepted(p);
  p.causal = 1;
  expect_accepted(p);
  p.lse = nullptr;
  expect_accepted(p);
  // GQA and MQA.
  p.num_heads_kv = 1;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 1), FLASHCORE_SUCCESS);
  expect_accepted(p);
}

// flashcore.h: "O in the input dtype unless out_dtype says otherwise" -- the other 16-bit dtype for O of a
// precision = FP8 call (the 8-bit kernels write either).
TEST_F(Fp8Validation, PrecisionFp8OutDtypeMayBeTheOther16BitDtype) {
  p.precision = FLASHCORE_PRECISION_FP8;
  p.out_dtype = dtype16;
  expect_accepted(p);
  p.out_dtype = dtype16 == FLASHCORE_DTYPE_BF16 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
  expect_accepted(p);
}

TEST_F(Fp8Validation, PrecisionFp8IsFor16BitInputsOnly) {
  for (int32_t precision : {FLASHCORE_PRECISION_FP8, FLASHCORE_PRECISION_INT8})
    for (flashcore_dtype eight : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
      SCOPED_TRACE(std::to_string(eight) + " precision " + std::to_string(precision));
      flashcore_attention_params bad = p;
      bad.dtype = eight;
      bad.precision = precision;
      expect_error(&bad, FLASHCORE_ERROR_INVALID_ARGUMENT, {"precision"});
    }
}

// precision = INT8 (the high-accuracy 8-bit mode): a 16-bit call's arguments, O in the input dtype only (P V runs in
// it), no descales; dtype INT8 is the kernels' key, not a call's dtype.
TEST_F(Fp8Validation, PrecisionInt8) {
  EXPECT_EQ(FLASHCORE_PRECISION_INT8, 2);
  EXPECT_EQ(FLASHCORE_DTYPE_INT8, 5);
  p.precision = FLASHCORE_PRECISION_INT8;
  expect_accepted(p);
  p.causal = 1, p.lse = nullptr;
  expect_accepted(p);
  p.out_dtype = dtype16;
  expect_accepted(p);
  flashcore_attention_params other = p;
  other.out_dtype = dtype16 == FLASHCORE_DTYPE_BF16 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
  expect_error(&other, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype"});
  flashcore_attention_params descaled = p;
  descaled.k_descale = descale(1);
  expect_error(&descaled, FLASHCORE_ERROR_INVALID_ARGUMENT, {"k_descale", "precision = INT8"});
  flashcore_attention_params int8 = p;
  int8.dtype = FLASHCORE_DTYPE_INT8, int8.precision = FLASHCORE_PRECISION_NATIVE;
  expect_error(&int8, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"int8", "FLASHCORE_PRECISION_INT8"});
}

TEST_F(Fp8Validation, Reserved2MustBeZero) {
  for (int32_t bad : {1, -1, 0x100, INT32_MIN}) {
    SCOPED_TRACE(bad);
    p.reserved2 = bad;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved2 = " + std::to_string(bad)});
    p.precision = FLASHCORE_PRECISION_FP8;  // whatever the precision
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved2"});
    p.precision = FLASHCORE_PRECISION_NATIVE;
  }
}

// ---- descales ----
TEST_F(Fp8Validation, DescalesNeedAn8BitDtype) {
  const char* names[] = {"q_descale", "k_descale", "v_descale"};
  for (int32_t precision : {FLASHCORE_PRECISION_NATIVE, FLASHCORE_PRECISION_FP8}) {
    for (int which = 0; which < 3; ++which) {
      SCOPED_TRACE(std::string(names[which]) + (precision ? " precision=FP8" : " precision=NATIVE"));
      flashcore_attention_params bad = p;
      bad.precision = precision;
      const float** slot = which == 0 ? &bad.q_descale : which == 1 ? &bad.k_descale : &bad.v_descale;
      *slot = descale(which);
      expect_error(&bad, FLASHCORE_ERROR_INVALID_ARGUMENT, {names[which]});
    }
    flashcore_attention_params all = p;
    all.precision = precision;
    all.q_descale = descale(0), all.k_descale = descale(1), all.v_descale = descale(2);
    expect_error(&all, FLASHCORE_ERROR_INVALID_ARGUMENT, {"_descale"});
  }
}

// ---- serving layouts: dense batches only for 8-bit inputs and precision = FP8 ----
TEST_F(Fp8Validation, ServingLayoutsAreRejected) {
  const int32_t* ints = reinterpret_cast<const int32_t*>(ints_->data());
  struct Layout {
    const char* name;
    void (*set)(flashcore_attention_params&, const int32_t*);
  };
  const Layout layouts[] = {
      {"seqused_k", [](flashcore_attention_params& q, const int32_t* a) { q.seqused_k = a; }},
      {"cu_seqlens_q",
       [](flashcore_attention_params& q, const int32_t* a) {
         q.cu_seqlens_q = a + 16;
         q.total_q = q.seqlen_q;
       }},
      {"cu_seqlens_k",
       [](flashcore_attention_params& q, const int32_t* a) {
         q.cu_seqlens_k = a + 32;
         q.total_k = q.seqlen_k;
       }},
      {"block_table",
       [](flashcore_attention_params& q, const int32_t* a) {
         q.block_table = a + 64;
         q.page_size = 16;
         q.num_pages = 2;
       }},
  };
  for (int mode = 0; mode < 3; ++mode) {  // precision = FP8 / INT8 on the 16-bit problem; an e4m3 problem
    for (const Layout& l : layouts) {
      SCOPED_TRACE(std::string(l.name) + (mode == 1 ? " e4m3" : mode == 2 ? " precision=INT8" : " precision=FP8"));
      flashcore_attention_params q = p;
      if (mode != 1) {
        q.precision = mode == 2 ? FLASHCORE_PRECISION_INT8 : FLASHCORE_PRECISION_FP8;
      } else {
        q.dtype = FLASHCORE_DTYPE_FP8_E4M3;
      }
      // The 16-bit problem takes the layout (the rule is the 8-bit one, not a malformed layout).
      flashcore_attention_params native = p;
      l.set(native, ints);
      EXPECT_EQ(flashcore_attention_validate(&native), FLASHCORE_SUCCESS) << flashcore_last_error();
      l.set(q, ints);
      expect_error(&q, FLASHCORE_ERROR_INVALID_ARGUMENT, {l.name});
    }
  }
  // An append (k_new needs seqused_k): rejected naming one of the two.
  flashcore_attention_params q = p;
  q.precision = FLASHCORE_PRECISION_FP8;
  q.seqused_k = ints;
  q.k_new = q_->data();
  q.v_new = k_->data();
  q.seqlen_new = 1;
  q.k_new_strides = q.v_new_strides = p.k_strides;
  for (int i = 0; i < 2; ++i) {
    const flashcore_status st = flashcore_attention_validate(&q);
    EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_last_error();
    const std::string m = flashcore_last_error();
    EXPECT_TRUE(m.find("seqused_k") != std::string::npos || m.find("k_new") != std::string::npos) << m;
  }
}

// ---- out_dtype: never an 8-bit dtype ----
// (The status is UNSUPPORTED_DTYPE, as for every out_dtype the library cannot write: test_validation.cpp OutDtype.)
TEST_F(Fp8Validation, OutDtypeFp8IsRejectedFor16BitInputs) {
  for (int32_t precision : {FLASHCORE_PRECISION_NATIVE, FLASHCORE_PRECISION_FP8}) {
    for (flashcore_dtype bad : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
      SCOPED_TRACE(std::to_string(bad) + (precision ? " precision=FP8" : ""));
      flashcore_attention_params q = p;
      q.precision = precision;
      q.out_dtype = bad;
      expect_error(&q, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype = " + std::to_string(bad)});
    }
  }
}

// ---- 0.2 callers: FLASHCORE_ATTENTION_PARAMS_V2_SIZE ----
TEST_F(Fp8Validation, V2SizedStructIsAcceptedAndItsTailIgnored) {
  // A 0.2 caller's struct ends at 448 bytes; whatever follows in its memory (here: junk that would be invalid as
  // descales / precision / reserved2) is never read.
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xEE);
  std::memcpy(buf.data(), &p, FLASHCORE_ATTENTION_PARAMS_V2_SIZE);
  auto* v2 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v2->struct_size = FLASHCORE_ATTENTION_PARAMS_V2_SIZE;
  EXPECT_EQ(flashcore_attention_validate(v2), FLASHCORE_SUCCESS) << flashcore_last_error();
  // A 0.2-era error in it is still found.
  v2->q_strides.seq = 12;
  EXPECT_EQ(flashcore_attention_validate(v2), FLASHCORE_ERROR_INVALID_STRIDE);
  EXPECT_NE(std::string(flashcore_last_error()).find("q_strides.seq = 12"), std::string::npos) << flashcore_last_error();
  v2->q_strides = p.q_strides;
  v2->reserved = 3;
  EXPECT_EQ(flashcore_attention_validate(v2), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("reserved = 3"), std::string::npos) << flashcore_last_error();
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V2_SIZE; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE) << i;
}

TEST_F(Fp8Validation, ParamsInitSizedWithTheV2Size) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC3);
  auto* v2 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v2, FLASHCORE_ATTENTION_PARAMS_V2_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v2->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V2_SIZE});
  EXPECT_EQ(v2->q_strides.dim, 1);
  EXPECT_EQ(v2->o_strides.dim, 1);
  EXPECT_EQ(v2->out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(v2->workspace, nullptr);
  EXPECT_EQ(v2->seqlen_new, 0);
  EXPECT_EQ(v2->k_new_strides.dim, 1);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V2_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC3) << "byte " << i << " written past a 0.2 struct by params_init_sized";
  }
  // Filled in by a 0.2 caller: set_contiguous writes only the strides, validate accepts it.
  v2->q = p.q, v2->k = p.k, v2->v = p.v, v2->o = p.o, v2->lse = p.lse;
  v2->batch = B, v2->seqlen_q = SQ, v2->seqlen_k = SK, v2->num_heads_q = HQ, v2->num_heads_kv = HKV, v2->head_dim = D;
  v2->dtype = dtype16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(v2, 1), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(v2->q_strides.head, SQ * D);
  EXPECT_EQ(flashcore_attention_validate(v2), FLASHCORE_SUCCESS) << flashcore_last_error();
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V2_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC3) << "byte " << i << " written past a 0.2 struct";
  }
  // Without a GPU, the workspace query of a 0.2 caller says why (not a crash, nothing written past its struct).
  if (!flashcore::testing::cuda_device_visible()) {
    uint64_t bytes = 12345;
    const flashcore_status st = flashcore_attention_workspace_size(v2, &bytes);
    EXPECT_TRUE(st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_CUDA) << flashcore_status_string(st);
    for (size_t i = FLASHCORE_ATTENTION_PARAMS_V2_SIZE; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xC3) << i;
  }
}

// Sizes next to the 0.2 one are not layouts: rejected, naming the accepted ones (448 among them).
TEST_F(Fp8Validation, SizesAroundV2AreRejected) {
  for (uint32_t size : {uint32_t{444}, uint32_t{447}, uint32_t{449}, uint32_t{452}, uint32_t{456}, uint32_t{472},
                        uint32_t{476}, uint32_t{479}}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0);
    std::memcpy(buf.data(), &p, sizeof(p));
    std::memcpy(buf.data(), &size, sizeof(size));
    EXPECT_EQ(flashcore_attention_validate(reinterpret_cast<flashcore_attention_params*>(buf.data())),
              FLASHCORE_ERROR_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("struct_size = " + std::to_string(size)), std::string::npos) << message;
    EXPECT_NE(message.find("448"), std::string::npos) << message;
  }
}

// ---- the checks after "dtype compiled": need e4m3 kernels in the build ----
class Fp8CompiledValidation : public Fp8Validation {
 protected:
  void SetUp() override {
    Fp8Validation::SetUp();
    if (HasFatalFailure()) return;
    d8 = e4m3_head_dim();
    if (d8 == 0) GTEST_SKIP() << "this build has no e4m3 kernels (FLASHCORE_DTYPES without e4m3)";
    make(FLASHCORE_DTYPE_FP8_E4M3, d8);
    ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }
  int d8 = 0;
};

TEST_F(Fp8CompiledValidation, DescalesAreAccepted) {
  p.q_descale = descale(0);
  expect_accepted(p);
  p.k_descale = descale(1), p.v_descale = descale(2);
  expect_accepted(p);
  // One array for all three (read only) is fine too.
  p.k_descale = p.v_descale = p.q_descale;
  expect_accepted(p);
  p.causal = 1;
  p.num_heads_kv = 1;  // MQA
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  expect_accepted(p);
}

TEST_F(Fp8CompiledValidation, MisalignedDescalesAreRejected) {
  const char* names[] = {"q_descale", "k_descale", "v_descale"};
  for (int which = 0; which < 3; ++which) {
    for (int bytes : {1, 2, 3}) {
      SCOPED_TRACE(std::string(names[which]) + " + " + std::to_string(bytes));
      flashcore_attention_params bad = p;
      bad.q_descale = descale(0), bad.k_descale = descale(1), bad.v_descale = descale(2);
      const float** slot = which == 0 ? &bad.q_descale : which == 1 ? &bad.k_descale : &bad.v_descale;
      *slot = descale(which, bytes);
      expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {std::string(names[which]) + " = 0x", "4-byte aligned"});
    }
  }
  // 4-byte alignment is enough (not 16).
  p.q_descale = descale(0, 4), p.k_descale = descale(1, 8), p.v_descale = descale(2, 12);
  expect_accepted(p);
}

TEST_F(Fp8CompiledValidation, OutDtype) {
  for (flashcore_dtype good : {FLASHCORE_DTYPE_SAME, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    SCOPED_TRACE(good);
    p.out_dtype = good;
    expect_accepted(p);
  }
  for (flashcore_dtype bad : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2, FLASHCORE_DTYPE_FP32,
                              static_cast<flashcore_dtype>(77)}) {
    SCOPED_TRACE(bad);
    p.out_dtype = bad;
    expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype = " + std::to_string(bad)});
  }
}

// 8-bit strides are in 1-byte elements: multiples of 16 (TMA's 16-byte strides); O's are in its 16-bit elements.
TEST_F(Fp8CompiledValidation, StridesInBytes) {
  flashcore_attention_params bad = p;
  bad.q_strides.seq += 8;  // 8 bytes: fine for 16-bit inputs, not for 8-bit ones
  bad.q_strides.batch = bad.q_strides.seq * SQ;
  expect_error(&bad, FLASHCORE_ERROR_INVALID_STRIDE, {"q_strides.seq", "multiple of 16"});
  bad = p;
  bad.k_strides.head = d8 + 8;
  expect_error(&bad, FLASHCORE_ERROR_INVALID_STRIDE, {"k_strides.head", "multiple of 16"});
  // A padded head stride of 16 bytes more is fine (O keeps its own contiguous strides).
  flashcore_attention_params padded = p;
  padded.q_strides = {SQ * HQ * (d8 + 16), HQ * (d8 + 16), d8 + 16, 1};
  expect_accepted(padded);
  // O's strides are 16-bit elements: a multiple of 8 that is not one of 16 is fine there.
  padded = p;
  padded.o_strides = {SQ * HQ * (d8 + 8), HQ * (d8 + 8), d8 + 8, 1};
  expect_accepted(padded);
}

// O in 16-bit elements: an O buffer that overlaps Q or K/V is found with O's 2-byte extent.
TEST_F(Fp8CompiledValidation, OutputOverlapUsesTheElementSizes) {
  // One buffer holding Q (B * SQ * HQ * d8 bytes) and then O (twice that): O right after Q's 8-bit extent is fine,
  // 16 bytes earlier overlaps; O ending where Q starts is fine, 16 bytes later (O's 2-byte extent) overlaps.
  const size_t q_bytes = static_cast<size_t>(B * SQ * HQ * d8);
  HostBuffer both(4 * q_bytes);
  flashcore_attention_params q = p;
  q.q = both.data() + 2 * q_bytes;
  q.o = both.data() + 3 * q_bytes;
  expect_accepted(q);
  q.o = both.data() + 3 * q_bytes - 16;
  expect_error(&q, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"overlaps"});
  q.o = both.data();  // [0, 2 * q_bytes): ends where Q starts
  expect_accepted(q);
  q.o = both.data() + 16;
  expect_error(&q, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"overlaps"});
}

TEST_F(Fp8CompiledValidation, V2SizedStructCanBe8Bit) {
  // A 0.2 caller has no descale fields (NULL: 1) and no precision (native); dtype 3 with its size runs as e4m3.
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 16, 0xEE);
  std::memcpy(buf.data(), &p, FLASHCORE_ATTENTION_PARAMS_V2_SIZE);
  auto* v2 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v2->struct_size = FLASHCORE_ATTENTION_PARAMS_V2_SIZE;
  EXPECT_EQ(flashcore_attention_validate(v2), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- the C++ layer (flashcore.hpp) carries the 0.3 fields ----
// ---- V given transposed (FLASHCORE_FLAG_V_TRANSPOSED): the size query and the transpose read only V's fields ----
TEST_F(Fp8CompiledValidation, TransposedVSizeReadsOnlyVsFields) {
  flashcore_attention_params only_v;
  flashcore_attention_params_init(&only_v);
  only_v.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  only_v.v = p.v, only_v.v_strides = p.v_strides;
  only_v.batch = p.batch, only_v.seqlen_k = p.seqlen_k, only_v.num_heads_kv = p.num_heads_kv, only_v.head_dim = d8;
  uint64_t bytes = 0;
  ASSERT_EQ(flashcore_fp8_transposed_v_size(&only_v, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(bytes, static_cast<uint64_t>(p.batch * p.num_heads_kv * d8 * ((p.seqlen_k + 127) / 128 * 128)));
  // The C++ layer's view-only form agrees.
  const auto v8 = flashcore::TensorView::bshd(p.v, FLASHCORE_DTYPE_FP8_E4M3, p.batch, p.seqlen_k, p.num_heads_kv, d8);
  EXPECT_EQ(flashcore::fp8_transposed_v_size(v8), bytes);

  struct Bad { const char* what; flashcore_status want; const char* needle; void (*edit)(flashcore_attention_params&); };
  const Bad bad[] = {
      {"16-bit dtype", FLASHCORE_ERROR_UNSUPPORTED_DTYPE, "8-bit",
       [](flashcore_attention_params& x) { x.dtype = FLASHCORE_DTYPE_BF16; }},
      {"already transposed", FLASHCORE_ERROR_INVALID_ARGUMENT, "FLASHCORE_FLAG_V_TRANSPOSED",
       [](flashcore_attention_params& x) { x.flags = FLASHCORE_FLAG_V_TRANSPOSED; }},
      {"v NULL", FLASHCORE_ERROR_NULL_POINTER, "v is NULL", [](flashcore_attention_params& x) { x.v = nullptr; }},
      {"seqlen_k 0", FLASHCORE_ERROR_INVALID_SIZE, "seqlen_k", [](flashcore_attention_params& x) { x.seqlen_k = 0; }},
      {"head_dim 96", FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, "head_dim = 96",
       [](flashcore_attention_params& x) { x.head_dim = 96; }},
      {"misaligned v", FLASHCORE_ERROR_MISALIGNED_POINTER, "v = ",
       [](flashcore_attention_params& x) { x.v = static_cast<const char*>(x.v) + 8; }},
      {"v_strides.seq", FLASHCORE_ERROR_INVALID_STRIDE, "v_strides.seq",
       [](flashcore_attention_params& x) { x.v_strides.seq = 8; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    flashcore_attention_params x = only_v;
    b.edit(x);
    bytes = 77;
    EXPECT_EQ(flashcore_fp8_transposed_v_size(&x, &bytes), b.want) << flashcore_last_error();
    EXPECT_EQ(bytes, 0u);
    EXPECT_NE(std::string(flashcore_last_error()).find(b.needle), std::string::npos) << flashcore_last_error();
    // The transpose refuses the same arguments before it touches a device (or finds none).
    EXPECT_EQ(flashcore_fp8_transpose_v(&x, q_->data(), nullptr), b.want) << flashcore_last_error();
  }
  EXPECT_EQ(flashcore_fp8_transposed_v_size(&only_v, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(flashcore_fp8_transposed_v_size(nullptr, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT);
}

TEST_F(Fp8Validation, CppMakeParamsCarriesTheFieldsSince03) {
  const float* qd = descale(0);
  const float* kd = descale(1);
  const float* vd = descale(2);
  const auto e4m3 = FLASHCORE_DTYPE_FP8_E4M3;
  const auto q = flashcore::TensorView::bshd(q_->data(), e4m3, B, SQ, HQ, 128);
  const auto k = flashcore::TensorView::bhsd(k_->data(), e4m3, B, SK, HKV, 128);
  const auto v = flashcore::TensorView::bshd(v_->data(), e4m3, B, SK, HKV, 128);
  const auto o = flashcore::TensorView::bshd(o_->data(), FLASHCORE_DTYPE_FP16, B, SQ, HQ, 128);
  flashcore::ForwardOptions opt;
  opt.q_descale = qd, opt.k_descale = kd, opt.v_descale = vd;
  opt.causal = true;
  const flashcore_attention_params made = flashcore::make_params(q, k, v, o, opt);
  EXPECT_EQ(made.dtype, e4m3);
  EXPECT_EQ(made.out_dtype, FLASHCORE_DTYPE_FP16);
  EXPECT_EQ(made.q_descale, qd);
  EXPECT_EQ(made.k_descale, kd);
  EXPECT_EQ(made.v_descale, vd);
  EXPECT_EQ(made.precision, FLASHCORE_PRECISION_NATIVE);
  EXPECT_EQ(made.reserved2, 0);
  EXPECT_EQ(made.k_strides.head, SK * 128);
  // A bf16 O of 8-bit inputs is out_dtype bf16 (the same as SAME for 8-bit inputs).
  const auto o16 = flashcore::TensorView::bshd(o_->data(), FLASHCORE_DTYPE_BF16, B, SQ, HQ, 128);
  EXPECT_EQ(flashcore::make_params(q, k, v, o16, opt).out_dtype, FLASHCORE_DTYPE_BF16);

  // precision = FP8 of 16-bit views: O in their dtype (SAME), no descales.
  const auto q16 = flashcore::TensorView::bshd(q_->data(), dtype16, B, SQ, HQ, D);
  const auto k16 = flashcore::TensorView::bshd(k_->data(), dtype16, B, SK, HKV, D);
  const auto v16 = flashcore::TensorView::bshd(v_->data(), dtype16, B, SK, HKV, D);
  const auto o16b = flashcore::TensorView::bshd(o_->data(), dtype16, B, SQ, HQ, D);
  flashcore::ForwardOptions fp8;
  fp8.precision = FLASHCORE_PRECISION_FP8;
  const flashcore_attention_params p8 = flashcore::make_params(q16, k16, v16, o16b, fp8);
  EXPECT_EQ(p8.precision, FLASHCORE_PRECISION_FP8);
  EXPECT_EQ(p8.out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(p8.q_descale, nullptr);
  EXPECT_NO_THROW(flashcore::validate(q16, k16, v16, o16b, fp8));

  // The library's rules come back as flashcore::Error with the status and the message naming the field.
  fp8.precision = 3;
  try {
    flashcore::validate(q16, k16, v16, o16b, fp8);
    ADD_FAILURE() << "precision = 3 was accepted";
  } catch (const flashcore::Error& e) {
    EXPECT_EQ(e.status(), FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("precision = 3"), std::string::npos) << e.what();
  }
  fp8.precision = FLASHCORE_PRECISION_NATIVE;
  fp8.k_descale = kd;  // a descale with 16-bit inputs
  try {
    flashcore::validate(q16, k16, v16, o16b, fp8);
    ADD_FAILURE() << "k_descale with 16-bit inputs was accepted";
  } catch (const flashcore::Error& e) {
    EXPECT_EQ(e.status(), FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("k_descale"), std::string::npos) << e.what();
  }
}

}  // namespace

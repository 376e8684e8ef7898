// Argument validation of the attention variants (ABI 0.5: local, window_size_left / _right, softcap, sinks,
// attention_chunk, reserved4; ABI 0.6: dsinks, the variants' backward) through the public C API, without a GPU: each
// rule's status and a message naming the field and its value, nothing written by a failing call; the valid settings
// pass; 8-bit calls (dtype or precision) refuse the variants, the backward takes them (since 0.6; attention_chunk
// since 0.6.1); the 0.4 and 0.5 struct layouts (FLASHCORE_ATTENTION_PARAMS_V4_SIZE, _V5_SIZE) are still accepted,
// the fields past them taking their defaults, and params_init / params_init_sized set and respect them. (dsinks'
// own rules: tests/cpu/test_backward_validation.cpp.)
// Host buffers stand in for device memory: the argument checks touch no device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"

namespace {

using flashcore::test::Compiled;
using flashcore::test::first_compiled;
using flashcore::test::HostBuffer;

// ---- the layout of the 0.5 fields ----
TEST(VariantAbi, LayoutOfTheFieldsSince05) {
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V4_SIZE}, 648u);
  EXPECT_EQ(offsetof(flashcore_attention_params, local), size_t{FLASHCORE_ATTENTION_PARAMS_V4_SIZE});
  EXPECT_EQ(offsetof(flashcore_attention_params, window_size_left), 652u);
  EXPECT_EQ(offsetof(flashcore_attention_params, window_size_right), 656u);
  EXPECT_EQ(offsetof(flashcore_attention_params, softcap), 660u);
  EXPECT_EQ(offsetof(flashcore_attention_params, sinks), 664u);
  EXPECT_EQ(offsetof(flashcore_attention_params, attention_chunk), 672u);
  EXPECT_EQ(offsetof(flashcore_attention_params, reserved4), 676u);
  // The 0.5 layout ends after reserved4 (0.6 appends dsinks: below).
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V5_SIZE}, 680u);
  EXPECT_EQ(offsetof(flashcore_attention_params, reserved4) + sizeof(int32_t), size_t{FLASHCORE_ATTENTION_PARAMS_V5_SIZE});
  EXPECT_GE(sizeof(flashcore_attention_params), 680u);
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_GE(minor, 5) << "the library predates the variants";
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(caps.params_struct_size, sizeof(flashcore_attention_params));
}

// ---- the layout of the 0.6 field: dsinks ----
TEST(VariantAbi, LayoutOfTheFieldsSince06) {
  EXPECT_EQ(offsetof(flashcore_attention_params, dsinks), size_t{FLASHCORE_ATTENTION_PARAMS_V5_SIZE});
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V6_SIZE}, 688u);  // the 0.6 layout ends after dsinks (0.7: head_dim_v)
  EXPECT_GE(sizeof(flashcore_attention_params), 688u);
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_GE(minor, 6) << "the library predates the variants' backward";
  EXPECT_GE(FLASHCORE_VERSION_MINOR, 6);
}

TEST(VariantAbi, InitSetsTheDefaultsOfTheFieldsSince05) {
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(p));
  EXPECT_EQ(p.local, 0);
  EXPECT_EQ(p.window_size_left, 0);
  EXPECT_EQ(p.window_size_right, 0);
  EXPECT_EQ(p.softcap, 0.0f);
  EXPECT_EQ(p.sinks, nullptr);
  EXPECT_EQ(p.attention_chunk, 0);
  EXPECT_EQ(p.reserved4, 0);
  EXPECT_EQ(p.dsinks, nullptr);
}

TEST(VariantAbi, InitSizedWithTheV4SizeWritesNothingPastIt) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC4);
  auto* v4 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v4, FLASHCORE_ATTENTION_PARAMS_V4_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v4->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V4_SIZE});
  EXPECT_EQ(v4->q_strides.dim, 1);
  EXPECT_EQ(v4->out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(v4->dout, nullptr);
  EXPECT_EQ(v4->dq_strides.dim, 1);
  EXPECT_EQ(v4->reserved3, 0);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V4_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC4) << "byte " << i << " written past a 0.4 struct by params_init_sized";
  }
}

TEST(VariantAbi, InitSizedWithTheV5SizeWritesNothingPastIt) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC5);
  auto* v5 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v5, FLASHCORE_ATTENTION_PARAMS_V5_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v5->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V5_SIZE});
  EXPECT_EQ(v5->q_strides.dim, 1);
  EXPECT_EQ(v5->out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(v5->dq_strides.dim, 1);
  EXPECT_EQ(v5->local, 0);
  EXPECT_EQ(v5->softcap, 0.0f);
  EXPECT_EQ(v5->sinks, nullptr);
  EXPECT_EQ(v5->reserved4, 0);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V5_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC5) << "byte " << i << " written past a 0.5 struct by params_init_sized";
  }
}

// ---- the fixture: a valid forward problem on host buffers ----
class VariantValidation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 16, SK = 24, HQ = 4, HKV = 2;

  void SetUp() override {
    const Compiled c = first_compiled();
    ASSERT_GT(c.head_dim, 0) << "this build compiled no kernel at all";
    D = c.head_dim;
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    k_ = std::make_unique<HostBuffer>(B * SK * HKV * D * 2);
    v_ = std::make_unique<HostBuffer>(B * SK * HKV * D * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    sinks_ = std::make_unique<HostBuffer>(HQ * 4 + 16);
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.lse = reinterpret_cast<float*>(lse_->data());
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
    p.dtype = c.dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  const float* sinks() const { return reinterpret_cast<const float*>(sinks_->data()); }

  // validate(), forward() and workspace_size() all return `want` with a message holding every needle; O and LSE
  // untouched.
  void expect_error(const flashcore_attention_params& params, flashcore_status want,
                    const std::vector<std::string>& needles) {
    for (int call = 0; call < 3; ++call) {
      SCOPED_TRACE(call == 0 ? "flashcore_attention_validate"
                   : call == 1 ? "flashcore_attention_forward"
                               : "flashcore_attention_workspace_size");
      uint64_t bytes = 0;
      const flashcore_status got = call == 0   ? flashcore_attention_validate(&params)
                                   : call == 1 ? flashcore_attention_forward(&params, nullptr)
                                               : flashcore_attention_workspace_size(&params, &bytes);
      EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
      const std::string message = flashcore_last_error();
      for (const std::string& needle : needles) {
        EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
      }
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
    EXPECT_TRUE(lse_->untouched()) << "LSE was written by a failing call";
  }
  void expect_valid(const flashcore_attention_params& params) {
    EXPECT_EQ(flashcore_attention_validate(&params), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  int64_t D = 0;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_, sinks_;
};

// ---- valid settings ----
TEST_F(VariantValidation, ValidVariantsPass) {
  const int32_t bounds[] = {-1, 0, 1, 16, 100, INT32_MAX};
  for (int causal : {0, 1}) {
    p.causal = causal;
    p.local = 1;
    for (int32_t left : bounds)
      for (int32_t right : bounds) {
        SCOPED_TRACE("causal " + std::to_string(causal) + " window (" + std::to_string(left) + ", " +
                     std::to_string(right) + ")");
        p.window_size_left = left, p.window_size_right = right;
        expect_valid(p);
      }
    p.local = 0;
    for (float cap : {0.0f, 1e-3f, 5.0f, 30.0f, 1e30f}) {
      SCOPED_TRACE("softcap " + std::to_string(cap));
      p.softcap = cap;
      expect_valid(p);
    }
    p.sinks = sinks();
    expect_valid(p);
    p.sinks = nullptr;
    for (int32_t chunk : {1, 7, 64, 8192, INT32_MAX}) {
      SCOPED_TRACE("attention_chunk " + std::to_string(chunk));
      p.attention_chunk = chunk;
      expect_valid(p);
    }
    // All of them at once.
    p.local = 1, p.window_size_left = 16, p.window_size_right = 3, p.softcap = 30.0f, p.sinks = sinks();
    p.attention_chunk = 100;
    expect_valid(p);
    p.local = 0, p.softcap = 0.0f, p.attention_chunk = 0, p.sinks = nullptr;
  }
}

TEST_F(VariantValidation, WindowBoundsAreReadOnlyWhenTheyApply) {
  // local = 0: the window sizes are not read, whatever they hold.
  p.window_size_left = -7, p.window_size_right = INT32_MIN;
  expect_valid(p);
  // causal = 1: the right bound is 0 whatever window_size_right says, so it is not checked either.
  p.local = 1, p.causal = 1, p.window_size_left = 4;
  expect_valid(p);
}

// ---- INVALID_ARGUMENT ----
TEST_F(VariantValidation, LocalMustBeZeroOrOne) {
  for (int32_t local : {2, -1, INT32_MIN}) {
    SCOPED_TRACE(local);
    p.local = local;
    expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"local = " + std::to_string(local), "must be 0 or 1"});
  }
}

TEST_F(VariantValidation, WindowSizesBelowMinusOne) {
  p.local = 1;
  p.window_size_left = -2;
  expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"window_size_left = -2", "-1 (unbounded) or >= 0"});
  p.window_size_left = 3;
  p.window_size_right = -2;
  expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"window_size_right = -2", "-1 (unbounded) or >= 0"});
  p.window_size_right = INT32_MIN;
  expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"window_size_right = " + std::to_string(INT32_MIN)});
}

TEST_F(VariantValidation, SoftcapMustBeZeroOrAFinitePositiveCap) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (float cap : {-1.0f, -1e-30f, nan, inf, -inf}) {
    SCOPED_TRACE(cap);
    p.softcap = cap;
    expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"softcap = ", "must be 0 (none) or a finite positive cap"});
  }
}

// attention_chunk (since 0.6.1): 0 or a positive chunk length; a negative one is refused, naming the field.
TEST_F(VariantValidation, AttentionChunkMustBeZeroOrPositive) {
  for (int32_t chunk : {-1, -64, INT32_MIN}) {
    SCOPED_TRACE(chunk);
    p.attention_chunk = chunk;
    expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT,
                 {"attention_chunk = " + std::to_string(chunk), "must be 0 (none) or a positive chunk length"});
  }
}

TEST_F(VariantValidation, Reserved4MustBeZero) {
  p.reserved4 = 1;
  expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved4 = 1", "must be 0"});
}

TEST_F(VariantValidation, MisalignedSinks) {
  for (int offset : {1, 2, 3}) {
    SCOPED_TRACE(offset);
    p.sinks = reinterpret_cast<const float*>(sinks_->data() + offset);
    expect_error(p, FLASHCORE_ERROR_MISALIGNED_POINTER, {"sinks = 0x", "4-byte aligned"});
  }
  p.sinks = reinterpret_cast<const float*>(sinks_->data() + 4);  // 4-byte alignment is enough
  expect_valid(p);
}

TEST_F(VariantValidation, EightBitCallsRefuseTheVariants) {
  // Each variant with an 8-bit dtype (whether or not this build compiled it: the variant rule comes first) and with
  // each 8-bit precision of a 16-bit call: INVALID_ARGUMENT naming the variant and the 8-bit side.
  using P = flashcore_attention_params;
  const std::pair<const char*, std::function<void(P&)>> variants[] = {
      {"local",
       [](P& x) {
         x.local = 1;
         x.window_size_left = 8;
       }},
      {"softcap", [](P& x) { x.softcap = 30.0f; }},
      {"sinks", [this](P& x) { x.sinks = sinks(); }},
      {"attention_chunk", [](P& x) { x.attention_chunk = 64; }},
  };
  for (const auto& [name, set] : variants) {
    for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
      SCOPED_TRACE(std::string(name) + " with 8-bit dtype " + std::to_string(dt));
      flashcore_attention_params with = p;
      with.dtype = dt;
      set(with);
      expect_error(with, FLASHCORE_ERROR_INVALID_ARGUMENT, {std::string(name) + " is set", "8-bit inputs"});
    }
    for (int32_t precision : {FLASHCORE_PRECISION_FP8, FLASHCORE_PRECISION_INT8}) {
      SCOPED_TRACE(std::string(name) + " with precision " + std::to_string(precision));
      flashcore_attention_params with = p;
      with.precision = precision;
      set(with);
      expect_error(with, FLASHCORE_ERROR_INVALID_ARGUMENT, {std::string(name) + " is set", "an 8-bit precision"});
    }
  }
}

TEST_F(VariantValidation, WindowedCallsBoundTheSummedLengths) {
  // The masks compare i + seqlen_k - seqlen_q in 32 bits: with a window, seqlen_q + seqlen_k must stay within
  // 2^31 - 1024. One past the bound is INVALID_SIZE naming the sum; softcap and sinks alone do not care.
  const int64_t limit = (int64_t{1} << 31) - 1024;
  auto fails_on_summed_lengths = [](const flashcore_attention_params& params) {
    return flashcore_attention_validate(&params) != FLASHCORE_SUCCESS &&
           std::string(flashcore_last_error()).find("seqlen_q + seqlen_k") != std::string::npos;
  };
  p.seqlen_k = limit - SQ + 1;
  {
    flashcore_attention_params with = p;
    with.local = 1, with.window_size_left = 128;
    expect_error(with, FLASHCORE_ERROR_INVALID_SIZE, {"seqlen_q + seqlen_k = " + std::to_string(limit + 1), "local"});
    with.seqlen_k = limit - SQ;  // the bound itself passes this rule (the host buffers then fail a later one)
    EXPECT_FALSE(fails_on_summed_lengths(with)) << flashcore_last_error();
  }
  p.softcap = 5.0f;
  p.sinks = sinks();
  EXPECT_FALSE(fails_on_summed_lengths(p)) << flashcore_last_error();
}

TEST_F(VariantValidation, ChunkedCallsBoundTheLengths) {
  // A chunk's end (its start plus attention_chunk, which the kernels cap at seqlen_k) reaches 2 * seqlen_k in the 32-bit
  // masks: with attention_chunk, seqlen_q + 2 * seqlen_k must stay within 2^31 - 1024. One past is INVALID_SIZE naming it.
  const int64_t limit = (int64_t{1} << 31) - 1024;
  auto fails_on_lengths = [](const flashcore_attention_params& params) {
    return flashcore_attention_validate(&params) != FLASHCORE_SUCCESS &&
           std::string(flashcore_last_error()).find("seqlen_q + 2 * seqlen_k") != std::string::npos;
  };
  flashcore_attention_params with = p;
  with.attention_chunk = 8192;
  with.seqlen_k = (limit - SQ) / 2 + 1;
  expect_error(with, FLASHCORE_ERROR_INVALID_SIZE,
               {"seqlen_q + 2 * seqlen_k = " + std::to_string(SQ + 2 * with.seqlen_k), "attention_chunk"});
  with.seqlen_k = (limit - SQ) / 2;  // within the bound: this rule passes (the host buffers then fail a later one)
  EXPECT_FALSE(fails_on_lengths(with)) << flashcore_last_error();
  with.attention_chunk = 0;
  with.seqlen_k = (limit - SQ) / 2 + 1;
  EXPECT_FALSE(fails_on_lengths(with)) << flashcore_last_error();
}

// ---- the backward takes the variants (since 0.6) ----

// The status of a backward call that passed every argument check on these host buffers: the device checks' verdict
// (no device, or the host memory the buffers are).
bool passed_argument_checks(flashcore_status st, const std::string& message) {
  if (st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH || st == FLASHCORE_ERROR_CUDA) {
    return true;
  }
  return st == FLASHCORE_ERROR_INVALID_ARGUMENT && message.find("host memory") != std::string::npos;
}

// A (dtype, head_dim) with a backward kernel in this build (fp16 / bf16, head_dim 64 or 128); head_dim 0 if none.
Compiled backward_compiled() {
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int hd : {128, 64}) {
      if (flashcore::backend::is_compiled(dt, hd) && flashcore::backend::backward_compiled(dt, hd)) return {dt, hd};
    }
  }
  return {};
}

TEST_F(VariantValidation, BackwardTakesTheVariants) {
  // A backward problem on host buffers (the gradient tensors set) for a (dtype, head_dim) the backward has: with every
  // variant, alone and together, causal and not, it passes the argument checks (and the workspace query's), and no
  // message says the variant is not taken.
  const Compiled c = backward_compiled();
  if (c.head_dim == 0) GTEST_SKIP() << "this build compiled no fp16 / bf16 backward of head_dim 64 or 128";
  p.dtype = c.dtype;
  p.head_dim = D = c.head_dim;
  HostBuffer q(B * SQ * HQ * D * 2), k(B * SK * HKV * D * 2), v(B * SK * HKV * D * 2), o(B * SQ * HQ * D * 2);
  HostBuffer dout(B * SQ * HQ * D * 2), dq(B * SQ * HQ * D * 2), dk(B * SK * HKV * D * 2), dv(B * SK * HKV * D * 2);
  HostBuffer workspace(1 << 20), dsinks(HQ * 4);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
  p.dout = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.workspace = workspace.data(), p.workspace_size = 1 << 20;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  {
    const flashcore_status st = flashcore_attention_backward(&p, nullptr);
    ASSERT_TRUE(passed_argument_checks(st, flashcore_last_error()))
        << "the plain backward problem: " << flashcore_status_string(st) << ": " << flashcore_last_error();
  }

  using P = flashcore_attention_params;
  const std::pair<const char*, std::function<void(P&)>> variants[] = {
      {"local (0, 0)", [](P& x) { x.local = 1; }},
      {"local (16, -1)",
       [](P& x) {
         x.local = 1;
         x.window_size_left = 16, x.window_size_right = -1;
       }},
      {"local (-1, 7)",
       [](P& x) {
         x.local = 1;
         x.window_size_left = -1, x.window_size_right = 7;
       }},
      {"local (32, any) causal",
       [](P& x) {
         x.local = 1, x.causal = 1;
         x.window_size_left = 32, x.window_size_right = -5;  // not read with causal = 1
       }},
      {"softcap 30", [](P& x) { x.softcap = 30.0f; }},
      {"softcap 30 causal", [](P& x) { x.softcap = 30.0f, x.causal = 1; }},
      {"sinks", [this](P& x) { x.sinks = sinks(); }},
      {"sinks and dsinks",
       [&](P& x) {
         x.sinks = sinks();
         x.dsinks = reinterpret_cast<float*>(dsinks.data());
       }},
      {"attention_chunk 64", [](P& x) { x.attention_chunk = 64; }},
      {"attention_chunk 64 causal", [](P& x) { x.attention_chunk = 64, x.causal = 1; }},
      {"all of them",
       [this](P& x) {
         x.local = 1, x.window_size_left = 100, x.window_size_right = 7, x.softcap = 20.0f, x.sinks = sinks();
         x.attention_chunk = 48;
       }},
  };
  for (const auto& [name, set] : variants) {
    SCOPED_TRACE(name);
    flashcore_attention_params with = p;
    set(with);
    ASSERT_EQ(flashcore_attention_validate(&with), FLASHCORE_SUCCESS) << "the forward takes it: " << flashcore_last_error();
    const flashcore_status st = flashcore_attention_backward(&with, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_TRUE(passed_argument_checks(st, message)) << flashcore_status_string(st) << ": " << message;
    for (const char* field : {"local", "softcap", "sinks", "window", "attention_chunk"}) {
      EXPECT_EQ(message.find(std::string(field) + " is set"), std::string::npos) << message;
    }
    uint64_t bytes = 0;
    const flashcore_status size_status = flashcore_attention_backward_workspace_size(&with, &bytes);
    const std::string size_message = flashcore_last_error();
    EXPECT_TRUE(size_status == FLASHCORE_SUCCESS || passed_argument_checks(size_status, size_message))
        << flashcore_status_string(size_status) << ": " << size_message;
    EXPECT_TRUE(dq.untouched() && dk.untouched() && dv.untouched()) << "a gradient was written by a failing call";
    EXPECT_TRUE(dsinks.untouched()) << "dsinks was written by a failing call";
    EXPECT_TRUE(o.untouched() && lse_->untouched()) << "O or LSE was written by the backward";
  }
}

// ---- struct sizes: the 0.4 layout and the sizes around it ----
TEST_F(VariantValidation, V4SizedStructIsAcceptedAndItsVariantFieldsAreDefaults) {
  // A 0.4 caller's struct ends at 648 bytes; what follows in its memory (junk that would be local = 0xEEEEEEEE, a
  // NaN softcap and a misaligned sinks pointer) is never read: the call sees the defaults.
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xEE);
  std::memcpy(buf.data(), &p, FLASHCORE_ATTENTION_PARAMS_V4_SIZE);
  auto* v4 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v4->struct_size = FLASHCORE_ATTENTION_PARAMS_V4_SIZE;
  EXPECT_EQ(flashcore_attention_validate(v4), FLASHCORE_SUCCESS) << flashcore_last_error();
  // The same bytes read as a current struct are refused (so the test would see a library that reads past 648).
  v4->struct_size = sizeof(flashcore_attention_params);
  EXPECT_EQ(flashcore_attention_validate(v4), FLASHCORE_ERROR_INVALID_ARGUMENT);
  {  // (named: a 0.5 field, or one of 0.8's serving fields, which are checked first)
    const std::string refused = flashcore_last_error();
    EXPECT_TRUE(refused.find("reserved4") != std::string::npos || refused.find("kv_batch_idx") != std::string::npos)
        << refused;
  }
  v4->struct_size = FLASHCORE_ATTENTION_PARAMS_V4_SIZE;
  // A 0.4-era error in it is still found.
  v4->q_strides.seq = 12;
  EXPECT_EQ(flashcore_attention_validate(v4), FLASHCORE_ERROR_INVALID_STRIDE) << flashcore_last_error();
  v4->q_strides = p.q_strides;
  // set_contiguous and the forward read and write nothing past it either.
  ASSERT_EQ(flashcore_attention_params_set_contiguous(v4, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  const flashcore_status st = flashcore_attention_forward(v4, nullptr);
  EXPECT_NE(st, FLASHCORE_SUCCESS) << "host buffers cannot run";
  EXPECT_EQ(std::string(flashcore_last_error()).find("local"), std::string::npos) << flashcore_last_error();
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V4_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xEE) << "byte " << i << " written past a 0.4 struct";
  }
}

// A 0.5 caller's struct ends at 680 bytes (after reserved4): its backward with sinks is accepted and dsinks takes its
// default, NULL, whatever its memory holds past 680 (here junk that would be a misaligned dsinks, or one set without
// sinks). The same bytes read as a current struct are refused, naming dsinks (so the test would see a library that
// reads past 680).
TEST_F(VariantValidation, V5SizedStructIsAcceptedAndItsDsinksIsNull) {
  const Compiled c = backward_compiled();
  if (c.head_dim == 0) GTEST_SKIP() << "this build compiled no fp16 / bf16 backward of head_dim 64 or 128";
  p.dtype = c.dtype;
  p.head_dim = D = c.head_dim;
  HostBuffer q(B * SQ * HQ * D * 2), k(B * SK * HKV * D * 2), v(B * SK * HKV * D * 2), o(B * SQ * HQ * D * 2);
  HostBuffer dout(B * SQ * HQ * D * 2), dq(B * SQ * HQ * D * 2), dk(B * SK * HKV * D * 2), dv(B * SK * HKV * D * 2);
  HostBuffer workspace(1 << 20);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
  p.dout = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  p.workspace = workspace.data(), p.workspace_size = 1 << 20;
  p.local = 1, p.window_size_left = 8, p.window_size_right = 0, p.softcap = 30.0f;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();

  for (bool with_sinks : {true, false}) {
    SCOPED_TRACE(with_sinks ? "with sinks" : "without sinks");
    flashcore_attention_params base = p;
    base.sinks = with_sinks ? sinks() : nullptr;
    std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xEE);
    std::memcpy(buf.data(), &base, FLASHCORE_ATTENTION_PARAMS_V5_SIZE);
    auto* v5 = reinterpret_cast<flashcore_attention_params*>(buf.data());
    v5->struct_size = FLASHCORE_ATTENTION_PARAMS_V5_SIZE;
    EXPECT_EQ(flashcore_attention_validate(v5), FLASHCORE_SUCCESS) << flashcore_last_error();
    flashcore_status st = flashcore_attention_backward(v5, nullptr);
    EXPECT_TRUE(passed_argument_checks(st, flashcore_last_error()))
        << flashcore_status_string(st) << ": " << flashcore_last_error();
    EXPECT_EQ(std::string(flashcore_last_error()).find("dsinks"), std::string::npos) << flashcore_last_error();
    uint64_t bytes = 0;
    st = flashcore_attention_backward_workspace_size(v5, &bytes);
    EXPECT_TRUE(st == FLASHCORE_SUCCESS || passed_argument_checks(st, flashcore_last_error()))
        << flashcore_status_string(st) << ": " << flashcore_last_error();

    // Read as a 0.6 struct, the junk is a dsinks pointer: refused, naming it (0xEE... is not 4-byte aligned; without
    // sinks, dsinks is set without them).
    v5->struct_size = FLASHCORE_ATTENTION_PARAMS_V6_SIZE;
    st = flashcore_attention_backward(v5, nullptr);
    EXPECT_EQ(st, with_sinks ? FLASHCORE_ERROR_MISALIGNED_POINTER : FLASHCORE_ERROR_INVALID_ARGUMENT)
        << flashcore_status_string(st) << ": " << flashcore_last_error();
    EXPECT_NE(std::string(flashcore_last_error()).find("dsinks"), std::string::npos) << flashcore_last_error();
    v5->struct_size = FLASHCORE_ATTENTION_PARAMS_V5_SIZE;

    // A 0.5-era error in it is still found.
    v5->softcap = -1.0f;
    EXPECT_EQ(flashcore_attention_backward(v5, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error()).find("softcap"), std::string::npos) << flashcore_last_error();
    v5->softcap = p.softcap;
    // set_contiguous, validate and the backward read and write nothing past 680 bytes.
    ASSERT_EQ(flashcore_attention_params_set_contiguous(v5, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    for (size_t i = FLASHCORE_ATTENTION_PARAMS_V5_SIZE; i < buf.size(); ++i) {
      ASSERT_EQ(buf[i], 0xEE) << "byte " << i << " written past a 0.5 struct";
    }
    EXPECT_TRUE(dq.untouched() && dk.untouched() && dv.untouched()) << "a gradient was written by a failing call";
  }
}

TEST_F(VariantValidation, NewerCallersZeroTailIsAcceptedWithVariants) {
  p.local = 1, p.window_size_left = 8, p.softcap = 20.0f, p.sinks = sinks();
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 16, 0);
  std::memcpy(buf.data(), &p, sizeof(p));
  auto* newer = reinterpret_cast<flashcore_attention_params*>(buf.data());
  newer->struct_size = static_cast<uint32_t>(buf.size());
  EXPECT_EQ(flashcore_attention_validate(newer), FLASHCORE_SUCCESS) << flashcore_last_error();
  // Its variant fields are read: an invalid one is found.
  newer->softcap = -1.0f;
  EXPECT_EQ(flashcore_attention_validate(newer), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("softcap"), std::string::npos) << flashcore_last_error();
}

// Sizes between the 0.4, 0.5, 0.6, 0.7 and current layouts are not layouts: rejected, naming the accepted ones.
TEST_F(VariantValidation, SizesBetweenV4AndCurrentAreRejected) {
  EXPECT_EQ(sizeof(flashcore_attention_params), 784u) << "the sizes below assume the 0.8 layout";
  for (uint32_t size : {uint32_t{649}, uint32_t{652}, uint32_t{656}, uint32_t{664}, uint32_t{672}, uint32_t{676},
                        uint32_t{679}, uint32_t{681}, uint32_t{684}, uint32_t{687}, uint32_t{689}, uint32_t{692},
                        uint32_t{695}, uint32_t{697}, uint32_t{704}, uint32_t{712}, uint32_t{720}, uint32_t{728},
                        uint32_t{735}, uint32_t{736}, uint32_t{744}, uint32_t{760}, uint32_t{776}, uint32_t{783}}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0);
    std::memcpy(buf.data(), &p, sizeof(p));
    std::memcpy(buf.data(), &size, sizeof(size));
    const auto* sized = reinterpret_cast<const flashcore_attention_params*>(buf.data());
    EXPECT_EQ(flashcore_attention_validate(sized), FLASHCORE_ERROR_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("struct_size = " + std::to_string(size)), std::string::npos) << message;
    EXPECT_NE(message.find("648 (the 0.4 layout)"), std::string::npos) << message;
    EXPECT_NE(message.find("680 (the 0.5 layout)"), std::string::npos) << message;
    EXPECT_NE(message.find("688 (the 0.6 layout)"), std::string::npos) << message;
    EXPECT_NE(message.find("696 (the 0.7 layout)"), std::string::npos) << message;
  }
}

// The 0.5 size itself is accepted (the forward's validation too).
TEST_F(VariantValidation, V5SizeIsAccepted) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0);
  std::memcpy(buf.data(), &p, sizeof(p));
  auto* v5 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v5->struct_size = FLASHCORE_ATTENTION_PARAMS_V5_SIZE;
  EXPECT_EQ(flashcore_attention_validate(v5), FLASHCORE_SUCCESS) << flashcore_last_error();
}

}  // namespace

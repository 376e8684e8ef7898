// Argument validation of the attention variants (ABI 0.5: local, window_size_left / _right, softcap, sinks,
// attention_chunk, reserved4) through the public C API, without a GPU: each rule's status and a message naming the
// field and its value, nothing written by a failing call; the valid settings pass; 8-bit calls (dtype or precision)
// and the backward refuse the variants; the 0.4 struct layout (FLASHCORE_ATTENTION_PARAMS_V4_SIZE) is still
// accepted, its variant fields taking their defaults, and params_init / params_init_sized set and respect them.
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
  EXPECT_EQ(sizeof(flashcore_attention_params), 680u);
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_GE(minor, 5) << "the library predates the variants";
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(caps.params_struct_size, sizeof(flashcore_attention_params));
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
    // All of them at once.
    p.local = 1, p.window_size_left = 16, p.window_size_right = 3, p.softcap = 30.0f;
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

// attention_chunk is reserved in ABI 0.5: any value but 0 is refused, naming the field.
TEST_F(VariantValidation, AttentionChunkIsRefusedInThisVersion) {
  for (int32_t chunk : {-1, 1, 64, 8192, INT32_MIN, INT32_MAX}) {
    SCOPED_TRACE(chunk);
    p.attention_chunk = chunk;
    expect_error(p, FLASHCORE_ERROR_INVALID_ARGUMENT,
                 {"attention_chunk = " + std::to_string(chunk), "not in this version"});
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

// ---- the backward refuses every variant ----
TEST_F(VariantValidation, BackwardRefusesTheVariants) {
  // A problem the backward would otherwise get further with: its gradient tensors set (host memory too). The
  // message names the variant; the same call without it does not mention any variant.
  HostBuffer dout(B * SQ * HQ * D * 2), dq(B * SQ * HQ * D * 2), dk(B * SK * HKV * D * 2), dv(B * SK * HKV * D * 2);
  p.dout = dout.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  const flashcore_status plain = flashcore_attention_backward(&p, nullptr);
  const std::string plain_message = flashcore_last_error();
  for (const char* field : {"local", "softcap", "sinks", "attention_chunk"}) {
    EXPECT_EQ(plain_message.find(std::string(field) + " is set"), std::string::npos) << plain_message;
  }
  (void)plain;

  using P = flashcore_attention_params;
  const std::pair<const char*, std::function<void(P&)>> variants[] = {
      {"local", [](P& x) { x.local = 1; }},  // (a window of (0, 0): any local = 1 is refused)
      {"softcap", [](P& x) { x.softcap = 30.0f; }},
      {"sinks", [this](P& x) { x.sinks = sinks(); }},
  };
  for (const auto& [name, set] : variants) {
    SCOPED_TRACE(name);
    flashcore_attention_params with = p;
    set(with);
    ASSERT_EQ(flashcore_attention_validate(&with), FLASHCORE_SUCCESS) << "the forward takes it: " << flashcore_last_error();
    EXPECT_EQ(flashcore_attention_backward(&with, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_last_error();
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find(std::string(name) + " is set: the backward"), std::string::npos) << message;
    uint64_t bytes = 0;
    EXPECT_EQ(flashcore_attention_backward_workspace_size(&with, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT)
        << flashcore_last_error();
    EXPECT_TRUE(dq.untouched() && dk.untouched() && dv.untouched()) << "a gradient was written by a failing call";
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
  EXPECT_NE(std::string(flashcore_last_error()).find("reserved4"), std::string::npos) << flashcore_last_error();
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

TEST_F(VariantValidation, SizesBetweenV4AndCurrentAreRejected) {
  for (uint32_t size : {uint32_t{649}, uint32_t{652}, uint32_t{656}, uint32_t{664}, uint32_t{672}, uint32_t{676},
                        uint32_t{679}}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0);
    std::memcpy(buf.data(), &p, sizeof(p));
    std::memcpy(buf.data(), &size, sizeof(size));
    const auto* sized = reinterpret_cast<const flashcore_attention_params*>(buf.data());
    EXPECT_EQ(flashcore_attention_validate(sized), FLASHCORE_ERROR_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("struct_size = " + std::to_string(size)), std::string::npos) << message;
    EXPECT_NE(message.find("648 (the 0.4 layout)"), std::string::npos) << message;
  }
}

}  // namespace

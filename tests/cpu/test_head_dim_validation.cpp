// ABI 0.7's head_dim_v (V's and O's head dim of its own, e.g. MLA prefill's (192, 128)) through the public C API,
// without a GPU: the field's place and the 0.6 layout (FLASHCORE_ATTENTION_PARAMS_V6_SIZE) still accepted with
// head_dim_v taking its default whatever its memory holds; set_contiguous's V and O strides; the capabilities' pairs;
// and the rules, each with its status and a message naming the field: a negative value, a pair not compiled, 8-bit
// inputs, the 8-bit precisions, the backward, O checked against head_dim_v. Host buffers
// stand in for device memory: the argument checks touch no device.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "api/backend.h"
#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"

namespace {

using flashcore::test::HostBuffer;

TEST(HeadDimVAbi, LayoutOfTheFieldSince07) {
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V6_SIZE}, 688u);
  EXPECT_EQ(offsetof(flashcore_attention_params, head_dim_v), size_t{FLASHCORE_ATTENTION_PARAMS_V6_SIZE});
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V7_SIZE}, 696u);  // the 0.7 layout ends with it
  EXPECT_GE(FLASHCORE_VERSION_MINOR, 7);
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.head_dim_v, 0);
}

TEST(HeadDimVAbi, InitSizedWithTheV6SizeWritesNothingPastIt) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC6);
  auto* v6 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v6, FLASHCORE_ATTENTION_PARAMS_V6_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v6->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V6_SIZE});
  EXPECT_EQ(v6->dsinks, nullptr);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V6_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC6) << "byte " << i << " written past a 0.6 struct by params_init_sized";
  }
}

// Whether this build compiled (192, 128) for some 16-bit dtype; the dtype, or FLASHCORE_DTYPE_SAME.
flashcore_dtype mla_dtype() {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return FLASHCORE_DTYPE_SAME;
  for (int i = 0; i < caps.num_head_dim_pairs; ++i) {
    if (caps.head_dim_pairs[i][0] == 192 && caps.head_dim_pairs[i][1] == 128) {
      for (int j = 0; j < caps.num_dtypes; ++j) {
        if (caps.dtypes[j] == FLASHCORE_DTYPE_BF16 || caps.dtypes[j] == FLASHCORE_DTYPE_FP16) return caps.dtypes[j];
      }
    }
  }
  return FLASHCORE_DTYPE_SAME;
}

TEST(HeadDimVAbi, CapabilitiesListPairsOnlyWhereVDiffers) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_LE(caps.num_head_dim_pairs, FLASHCORE_MAX_CAPS);
  for (int i = 0; i < caps.num_head_dim_pairs; ++i) {
    EXPECT_NE(caps.head_dim_pairs[i][0], caps.head_dim_pairs[i][1]);
    EXPECT_GT(caps.head_dim_pairs[i][1], 0);
  }
  // A 0.6 caller's smaller struct gets no pairs and nothing past its end.
  std::vector<unsigned char> buf(sizeof(flashcore_capabilities) + 16, 0xAB);
  auto* old = reinterpret_cast<flashcore_capabilities*>(buf.data());
  old->struct_size = static_cast<uint32_t>(offsetof(flashcore_capabilities, num_head_dim_pairs));
  ASSERT_EQ(flashcore_get_capabilities(old), FLASHCORE_SUCCESS) << flashcore_last_error();
  for (size_t i = old->struct_size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xAB) << "byte " << i << " written";
}

class HeadDimVValidation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 16, SK = 24, HQ = 4, HKV = 2, D = 192, DV = 128;

  void SetUp() override {
    dtype = mla_dtype();
    if (dtype == FLASHCORE_DTYPE_SAME) GTEST_SKIP() << "(192, 128) is not compiled in this build";
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    k_ = std::make_unique<HostBuffer>(B * SK * HKV * D * 2);
    v_ = std::make_unique<HostBuffer>(B * SK * HKV * DV * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * DV * 2);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.lse = reinterpret_cast<float*>(lse_->data());
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
    p.head_dim_v = DV, p.dtype = dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
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

  flashcore_dtype dtype = FLASHCORE_DTYPE_SAME;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_;
};

TEST_F(HeadDimVValidation, SetContiguousGivesVAndOTheirOwnRows) {
  EXPECT_EQ(p.q_strides.seq, HQ * D);
  EXPECT_EQ(p.k_strides.seq, HKV * D);
  EXPECT_EQ(p.v_strides.seq, HKV * DV);
  EXPECT_EQ(p.v_strides.batch, SK * HKV * DV);
  EXPECT_EQ(p.o_strides.seq, HQ * DV);
  EXPECT_EQ(p.dout_strides.seq, HQ * DV) << "dO has O's shape";
  EXPECT_EQ(p.dv_strides.seq, HKV * DV) << "dV has V's shape";
  EXPECT_EQ(p.dq_strides.seq, HQ * D);
  flashcore_attention_params bhsd = p;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&bhsd, 1), FLASHCORE_SUCCESS);
  EXPECT_EQ(bhsd.v_strides.head, SK * DV);
  EXPECT_EQ(bhsd.o_strides.head, SQ * DV);
  EXPECT_EQ(flashcore_attention_validate(&bhsd), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(HeadDimVValidation, ThePairValidatesAndHeadDimVEqualIsThePlainCall) {
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  // head_dim_v = head_dim is the plain call: O of head_dim columns, whose rows of 128-column strides would overlap.
  flashcore_attention_params same = p;
  same.head_dim_v = D;
  expect_error(same, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"o_strides"});
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&same, 0), FLASHCORE_SUCCESS);
  EXPECT_EQ(same.v_strides.seq, HKV * D);
  EXPECT_EQ(same.o_strides.seq, HQ * D);
}

TEST_F(HeadDimVValidation, BadValuesNameTheField) {
  flashcore_attention_params neg = p;
  neg.head_dim_v = -128;
  expect_error(neg, FLASHCORE_ERROR_INVALID_SIZE, {"head_dim_v = -128"});
  flashcore_attention_params other = p;
  other.head_dim_v = 64;
  other.v_strides = other.o_strides = {};
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&other, 0), FLASHCORE_SUCCESS);
  expect_error(other, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"(head_dim, head_dim_v) = (192, 64)", "(192, 128)"});
}

TEST_F(HeadDimVValidation, EightBitAndTransposedVRefuseIt) {
  flashcore_attention_params fp8 = p;
  fp8.precision = FLASHCORE_PRECISION_FP8;
  expect_error(fp8, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim_v = 128", "precision"});
  flashcore_attention_params int8 = p;
  int8.precision = FLASHCORE_PRECISION_INT8;
  expect_error(int8, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim_v = 128"});
  flashcore_attention_params e4m3 = p;
  e4m3.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  const flashcore_status got = flashcore_attention_validate(&e4m3);
  EXPECT_NE(got, FLASHCORE_SUCCESS);
  EXPECT_NE(std::string(flashcore_last_error()).find("head_dim"), std::string::npos) << flashcore_last_error();
}

TEST_F(HeadDimVValidation, OIsCheckedAgainstHeadDimV) {
  // O's heads 64 columns apart: its rows of head_dim_v = 128 columns would share memory.
  flashcore_attention_params short_o = p;
  short_o.o_strides.head = 64;
  expect_error(short_o, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"o_strides"});
}

// The backward takes (192, 128) where the build has its kernel (the sm90 backend): on host memory the call then
// fails only at the device checks, writing nothing; a build without it refuses the pair naming head_dim_v.
TEST_F(HeadDimVValidation, TheBackwardTakesItWhereCompiled) {
  HostBuffer dout(B * SQ * HQ * DV * 2), dq(B * SQ * HQ * D * 2), dk(B * SK * HKV * D * 2), dv(B * SK * HKV * DV * 2),
      ws(1 << 20);
  flashcore_attention_params b = p;
  b.dout = dout.data(), b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
  b.workspace = ws.data(), b.workspace_size = 1 << 20;
  uint64_t bytes = 0;
  if (flashcore::backend::backward_compiled(dtype, static_cast<int>(D), static_cast<int>(DV))) {
    const flashcore_status st = flashcore_attention_backward(&b, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_TRUE(st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH ||
                st == FLASHCORE_ERROR_CUDA ||
                (st == FLASHCORE_ERROR_INVALID_ARGUMENT && message.find("host memory") != std::string::npos))
        << flashcore_status_string(st) << ": " << message;
  } else {
    EXPECT_EQ(flashcore_attention_backward_workspace_size(&b, &bytes), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
    EXPECT_NE(std::string(flashcore_last_error()).find("head_dim_v = 128"), std::string::npos)
        << flashcore_last_error();
    EXPECT_EQ(flashcore_attention_backward(&b, nullptr), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
  }
  EXPECT_TRUE(dq.untouched() && dk.untouched() && dv.untouched());
}

// A 0.6 caller (struct_size FLASHCORE_ATTENTION_PARAMS_V6_SIZE) never has head_dim_v read: whatever its memory holds
// past 688 bytes, the call is the plain one (V and O of head_dim columns).
TEST_F(HeadDimVValidation, A06StructIgnoresItsMemoryPastTheLayout) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 16, 0);
  flashcore_attention_params plain = p;
  plain.head_dim = 128, plain.head_dim_v = 0;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&plain, 0), FLASHCORE_SUCCESS);
  std::memcpy(buf.data(), &plain, sizeof(plain));
  auto* v6 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v6->struct_size = FLASHCORE_ATTENTION_PARAMS_V6_SIZE;
  const int64_t junk = 96;
  std::memcpy(buf.data() + FLASHCORE_ATTENTION_PARAMS_V6_SIZE, &junk, sizeof(junk));
  EXPECT_EQ(flashcore_attention_validate(v6), FLASHCORE_SUCCESS) << flashcore_last_error();
}

}  // namespace

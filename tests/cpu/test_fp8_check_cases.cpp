// The 8-bit cases of `flashcore check` (src/check/check_fp8.h) without a device: the case lists cover the 8-bit
// requirements and stay affordable for the reference, names are unique and safe, the e4m3 codec is exact, the row
// sampling and tolerances are the documented ones, and without a GPU a case is skipped with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "check/check_fp8.h"
#include "gpu/gpu_skip.h"

namespace fp8 = flashcore::check::fp8;

namespace {

template <typename Pred>
bool any(const std::vector<fp8::Case>& list, Pred pred) {
  return std::any_of(list.begin(), list.end(), pred);
}

bool e4m3(const fp8::Case& c) { return c.dtype == FLASHCORE_DTYPE_FP8_E4M3; }
bool e5m2(const fp8::Case& c) { return c.dtype == FLASHCORE_DTYPE_FP8_E5M2; }
bool int8(const fp8::Case& c) { return c.precision == FLASHCORE_PRECISION_INT8; }

}  // namespace

TEST(Fp8CheckCases, FullListCoversThe8BitRequirements) {
  const auto list = fp8::cases(false);
  for (int64_t D : {64, 128, 256})
    for (bool causal : {false, true})
      for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
        EXPECT_TRUE(any(list, [&](const fp8::Case& c) {
          return e4m3(c) && c.head_dim == D && c.causal == causal && fp8::resolved_out_dtype(c) == out;
        })) << "D=" << D << " causal=" << causal << " out=" << out;
  for (int64_t S : {1, 17, 113, 4097})
    for (int64_t D : {128, 256})
      EXPECT_TRUE(any(
          list, [&](const fp8::Case& c) { return e4m3(c) && c.seqlen_q == S && c.seqlen_k == S && c.head_dim == D; }))
          << "S=" << S << " D=" << D;
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && c.heads_q == 8 && c.heads_kv == 2; })) << "GQA";
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && c.heads_kv == 1 && c.heads_q > 1; })) << "MQA";
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const fp8::Case& c) { return e4m3(c) && c.causal == causal && c.seqlen_q < c.seqlen_k; }));
    EXPECT_TRUE(any(list, [&](const fp8::Case& c) { return e4m3(c) && c.causal == causal && c.seqlen_q > c.seqlen_k; }));
  }
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && c.bhsd; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && c.batch >= 5; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && !c.with_lse; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e4m3(c) && c.out_dtype == FLASHCORE_DTYPE_SAME; }));
  for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (bool causal : {false, true})
      EXPECT_TRUE(any(list, [&](const fp8::Case& c) {
        return c.dtype == in && c.causal == causal && c.precision == FLASHCORE_PRECISION_FP8;
      })) << "precision = FP8 from " << in;
  // precision = INT8 as precision = FP8: every head dim x causal from both 16-bit dtypes, GQA, 4097 keys, BHSD.
  for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int64_t D : {64, 128, 256})
      for (bool causal : {false, true})
        EXPECT_TRUE(any(list, [&](const fp8::Case& c) {
          return int8(c) && c.dtype == in && c.head_dim == D && c.causal == causal;
        })) << "precision = INT8 from " << in << " D=" << D << " causal=" << causal;
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return int8(c) && c.heads_q > c.heads_kv; })) << "INT8 GQA";
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return int8(c) && c.causal && c.seqlen_k == 4097; })) << "INT8 4097";
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return int8(c) && c.bhsd; })) << "INT8 BHSD";
  // e5m2 inputs: every head dim x causal, GQA, MQA, Sq != Sk both ways, both O dtypes.
  for (int64_t D : {64, 128, 256})
    for (bool causal : {false, true})
      EXPECT_TRUE(any(list, [&](const fp8::Case& c) { return e5m2(c) && c.head_dim == D && c.causal == causal; }))
          << "e5m2 D=" << D << " causal=" << causal;
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e5m2(c) && c.heads_q == 8 && c.heads_kv == 2; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e5m2(c) && c.heads_kv == 1 && c.heads_q > 1; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e5m2(c) && c.causal && c.seqlen_q > c.seqlen_k; }));
  EXPECT_TRUE(any(list, [](const fp8::Case& c) { return e5m2(c) && c.seqlen_q < c.seqlen_k; }));
  for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    EXPECT_TRUE(any(list, [&](const fp8::Case& c) { return e5m2(c) && fp8::resolved_out_dtype(c) == out; }));
  for (const fp8::Case& c : list) {
    // 8-bit dtype <=> native precision; 16-bit dtype <=> precision FP8 or INT8 (16-bit native cases are
    // flashcore::check's).
    EXPECT_EQ(e4m3(c) || e5m2(c), c.precision == FLASHCORE_PRECISION_NATIVE) << c.name;
    // precision = INT8 writes O in the input dtype only (the C ABI refuses another out_dtype).
    if (int8(c)) {
      EXPECT_EQ(fp8::resolved_out_dtype(c), c.dtype) << c.name;
    }
    EXPECT_EQ(c.heads_q % c.heads_kv, 0) << c.name;
  }
}

TEST(Fp8CheckCases, QuickListIsSmallAndCoversHeadDimCausal) {
  const auto quick = fp8::cases(true);
  EXPECT_GE(quick.size(), 8u);
  EXPECT_LE(quick.size(), 16u);
  for (int64_t D : {64, 128, 256})
    for (bool causal : {false, true})
      EXPECT_TRUE(any(quick, [&](const fp8::Case& c) { return e4m3(c) && c.head_dim == D && c.causal == causal; }))
          << "D=" << D << " causal=" << causal;
  for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    EXPECT_TRUE(any(quick, [&](const fp8::Case& c) { return e4m3(c) && fp8::resolved_out_dtype(c) == out; }));
  EXPECT_TRUE(any(quick, [](const fp8::Case& c) { return c.causal && c.seqlen_q > c.seqlen_k; })) << "rows without keys";
  for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    EXPECT_TRUE(any(quick, [&](const fp8::Case& c) { return c.dtype == in && fp8::is_precision_fp8(c); }));
    EXPECT_TRUE(any(quick, [&](const fp8::Case& c) { return c.dtype == in && fp8::is_precision_int8(c); }))
        << "precision = INT8 from " << in;
  }
  EXPECT_TRUE(any(quick, [](const fp8::Case& c) { return e5m2(c); })) << "e5m2 inputs";
  for (const auto& c : quick) EXPECT_LE(c.batch * c.heads_q * c.seqlen_q * c.seqlen_k, 64 * 1024) << c.name;
}

TEST(Fp8CheckCases, NamesAreUniqueAndSafe) {
  for (bool quick : {false, true}) {
    std::set<std::string> names;
    for (const auto& c : fp8::cases(quick)) {
      EXPECT_FALSE(c.name.empty());
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate name " << c.name;
      for (char ch : c.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
      // The --filter words of the help: e4m3 cases say "e4m3", e5m2 ones "e5m2", precision = FP8 ones "fp8",
      // precision = INT8 ones "int8".
      EXPECT_NE(c.name.find(e4m3(c) ? "e4m3" : e5m2(c) ? "e5m2" : int8(c) ? "int8" : "fp8"), std::string::npos)
          << c.name;
    }
  }
}

TEST(Fp8CheckCases, FullListIsAffordable) {
  double macs = 0, elements = 0;
  for (const auto& c : fp8::cases(false)) {
    const auto rows = fp8::checked_rows(c, 1);
    const double nrows = rows.empty() ? static_cast<double>(c.seqlen_q) : static_cast<double>(rows.size());
    macs += 2.0 * static_cast<double>(c.batch * c.heads_q) * nrows * static_cast<double>(c.seqlen_k * c.head_dim);
    elements += static_cast<double>(c.batch * c.head_dim) *
                static_cast<double>(c.seqlen_q * c.heads_q * 2 + c.seqlen_k * c.heads_kv * 2);
  }
  std::printf("8-bit list: %zu cases, %.3g reference multiply-adds, %.3g tensor elements\n", fp8::cases(false).size(),
              macs, elements);
  EXPECT_LT(macs, 1e10);
  EXPECT_LT(elements, 3e8);
}

TEST(Fp8CheckCases, DescribeAndName) {
  fp8::Case c;
  c.batch = 2, c.heads_q = 8, c.heads_kv = 2, c.seqlen_q = 113, c.seqlen_k = 4097, c.head_dim = 128, c.causal = true;
  EXPECT_EQ(fp8::describe(c), "e4m3->bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 causal bshd");
  EXPECT_EQ(fp8::case_name(c), "e4m3_d128_b2_h8x2_q113_k4097_causal_bshd_obf16");
  c.out_dtype = FLASHCORE_DTYPE_FP16, c.bhsd = true, c.causal = false, c.with_lse = false;
  EXPECT_EQ(fp8::describe(c), "e4m3->fp16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 bhsd no-lse");
  c.dtype = FLASHCORE_DTYPE_BF16, c.precision = FLASHCORE_PRECISION_FP8, c.out_dtype = FLASHCORE_DTYPE_SAME;
  EXPECT_EQ(fp8::describe(c), "bf16 precision=fp8->bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 bhsd no-lse");
  EXPECT_EQ(fp8::case_name(c), "bf16_fp8_d128_b2_h8x2_q113_k4097_full_bhsd_obf16_nolse");
  EXPECT_STREQ(fp8::precision_name(c), "fp8");
  EXPECT_TRUE(fp8::is_precision_fp8(c));
  EXPECT_FALSE(fp8::is_precision_int8(c));
  c.dtype = FLASHCORE_DTYPE_FP16, c.precision = FLASHCORE_PRECISION_INT8;
  EXPECT_EQ(fp8::describe(c), "fp16 precision=int8->fp16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 bhsd no-lse");
  EXPECT_EQ(fp8::case_name(c), "fp16_int8_d128_b2_h8x2_q113_k4097_full_bhsd_ofp16_nolse");
  EXPECT_STREQ(fp8::precision_name(c), "int8");
  EXPECT_TRUE(fp8::is_precision_int8(c));
  EXPECT_FALSE(fp8::is_precision_fp8(c));
  c.dtype = FLASHCORE_DTYPE_FP8_E4M3, c.precision = FLASHCORE_PRECISION_NATIVE;
  EXPECT_STREQ(fp8::precision_name(c), "native");
}

TEST(Fp8CheckCases, TolerancesAreThe8BitRule) {
  fp8::Case c;
  const fp8::Tolerance t = fp8::tolerance(c);
  EXPECT_EQ(t.rel_rmse, 0.035);
  EXPECT_EQ(t.max_rel, 0.08);
  EXPECT_EQ(t.max_abs, 1e-2);
  EXPECT_EQ(t.lse_abs, 2e-2);
  EXPECT_EQ(t.lse_rel, 2e-3);
  c.dtype = FLASHCORE_DTYPE_FP16, c.precision = FLASHCORE_PRECISION_FP8;
  EXPECT_EQ(fp8::tolerance(c).rel_rmse, 0.07);
  // precision = INT8: tests/gpu/test_fp8.cpp's kTolPrecisionInt8 (P V in 16 bits: tighter than precision = FP8).
  for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    c.dtype = in, c.precision = FLASHCORE_PRECISION_INT8;
    const fp8::Tolerance i8 = fp8::tolerance(c);
    EXPECT_EQ(i8.rel_rmse, 0.025);
    EXPECT_EQ(i8.max_rel, 0.08);
    EXPECT_EQ(i8.max_abs, 1e-2);
    EXPECT_EQ(i8.lse_abs, 0.1);
    EXPECT_EQ(i8.lse_rel, 0.0);
  }
}

TEST(Fp8CheckCases, CheckedRowsSampleLargeProblems) {
  fp8::Case small;
  small.seqlen_q = small.seqlen_k = 255;
  EXPECT_TRUE(fp8::checked_rows(small, 1).empty());
  fp8::Case big;
  big.seqlen_q = big.seqlen_k = 4097;
  const auto rows = fp8::checked_rows(big, 7);
  EXPECT_EQ(rows.size(), 64u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  for (int64_t r : {0, 63, 64, 127, 128, 4096}) EXPECT_TRUE(std::count(rows.begin(), rows.end(), r)) << "row " << r;
  EXPECT_EQ(rows, fp8::checked_rows(big, 7));
  fp8::Case masked = big;
  masked.seqlen_k = 113, masked.causal = true;
  const auto mrows = fp8::checked_rows(masked, 1);
  for (int64_t r : {4097 - 113 - 1, 4097 - 113}) EXPECT_TRUE(std::count(mrows.begin(), mrows.end(), r)) << "row " << r;
}

TEST(Fp8CheckCases, E4m3CodecIsExact) {
  for (int b = 0; b < 256; ++b) {
    const float v = fp8::e4m3_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    EXPECT_EQ(fp8::float_to_e4m3(v), b) << "code " << b << " = " << v;
  }
  EXPECT_EQ(fp8::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(fp8::e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(fp8::e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(fp8::e4m3_to_float(0x08), 0x1p-6f);
  EXPECT_EQ(fp8::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8::float_to_e4m3(1.0625f), 0x38) << "a tie rounds to even (1.0)";
  EXPECT_EQ(fp8::float_to_e4m3(1.1875f), 0x3A) << "a tie rounds to even (1.25)";
  EXPECT_EQ(fp8::float_to_e4m3(1.0626f), 0x39);
  EXPECT_EQ(fp8::float_to_e4m3(0x1p-10f), 0x00) << "half the smallest subnormal: a tie, to even (0)";
  EXPECT_EQ(fp8::float_to_e4m3(0x1.8p-9f), 0x02) << "1.5 subnormal steps: a tie, to even (2)";
  EXPECT_EQ(fp8::float_to_e4m3(0x1.fp-7f), 0x08) << "just below the smallest normal rounds up to it";
  EXPECT_EQ(fp8::float_to_e4m3(1e6f), 0x7E) << "saturates";
  EXPECT_EQ(fp8::float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xFE) << "saturates";
  EXPECT_EQ(fp8::float_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(fp8::float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(fp8::float_to_e4m3(-0.0f), 0x80);
}

TEST(Fp8CheckCases, E5m2CodecIsExact) {
  for (int b = 0; b < 256; ++b) {
    const float v = fp8::e5m2_to_float(static_cast<uint8_t>(b));
    if ((b & 0x7F) > 0x7C) {
      EXPECT_TRUE(std::isnan(v)) << b;
      continue;
    }
    if ((b & 0x7F) == 0x7C) {
      EXPECT_TRUE(std::isinf(v)) << b;
      continue;
    }
    EXPECT_EQ(fp8::float_to_e5m2(v), b) << "code " << b << " = " << v;
    EXPECT_EQ(fp8::fp8_to_float(static_cast<uint8_t>(b), FLASHCORE_DTYPE_FP8_E5M2), v);
  }
  EXPECT_EQ(fp8::e5m2_to_float(0x7B), 57344.0f);
  EXPECT_EQ(fp8::e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(fp8::e5m2_to_float(0x04), 0x1p-14f);
  EXPECT_EQ(fp8::e5m2_to_float(0x3C), 1.0f);
  EXPECT_EQ(fp8::float_to_e5m2(1.125f), 0x3C) << "a tie rounds to even (1.0)";
  EXPECT_EQ(fp8::float_to_e5m2(1.375f), 0x3E) << "a tie rounds to even (1.5)";
  EXPECT_EQ(fp8::float_to_e5m2(0x1p-17f), 0x00) << "half the smallest subnormal: a tie, to even (0)";
  EXPECT_EQ(fp8::float_to_e5m2(61440.0f), 0x7B) << "past the largest finite: saturates";
  EXPECT_EQ(fp8::float_to_e5m2(1e9f), 0x7B);
  EXPECT_EQ(fp8::float_to_e5m2(-std::numeric_limits<float>::infinity()), 0xFB);
  EXPECT_EQ(fp8::float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(fp8::float_to_fp8(1.0f, FLASHCORE_DTYPE_FP8_E4M3), 0x38);
  EXPECT_EQ(fp8::float_to_fp8(1.0f, FLASHCORE_DTYPE_FP8_E5M2), 0x3C);
}

TEST(Fp8CheckCases, WithoutADeviceACaseIsSkippedWithTheReason) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible";
  for (const fp8::Case& c : fp8::cases(true)) {
    const fp8::Result r = fp8::run_case(c, 1, 1);
    EXPECT_TRUE(r.skipped) << c.name;
    EXPECT_FALSE(r.passed) << c.name;
    EXPECT_FALSE(r.message.empty()) << c.name;
  }
  EXPECT_FALSE(fp8::skip_reason(128, false).empty());
  EXPECT_FALSE(fp8::skip_reason(128, false, FLASHCORE_DTYPE_INT8).empty());
}

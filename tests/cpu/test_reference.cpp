// Tests of the CPU reference attention (src/reference): hand-computed cases, properties, layouts,
// masking, GQA and the fp16/bf16 conversions it relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "reference/reference.h"

namespace ref = flashcore::reference;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A host problem whose Q, K, V are stored in `dtype` with (B,S,H,D) or (B,H,S,D) strides.
struct Problem {
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 2;
  bool causal = false;
  float scale = 0.0f;
  flashcore_dtype dtype = FLASHCORE_DTYPE_FP32;
  bool bhsd = false;
  // Logical values, dense (B, S, H, D) order.
  std::vector<float> q, k, v;

  void resize() {
    q.assign(static_cast<size_t>(B * Sq * Hq * D), 0.0f);
    k.assign(static_cast<size_t>(B * Sk * Hkv * D), 0.0f);
    v.assign(static_cast<size_t>(B * Sk * Hkv * D), 0.0f);
  }
  void randomize(uint64_t seed, float amplitude = 1.0f) {
    resize();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, amplitude);
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = n(rng);
  }
  float& Q(int64_t b, int64_t s, int64_t h, int64_t d) { return q[static_cast<size_t>(((b * Sq + s) * Hq + h) * D + d)]; }
  float& K(int64_t b, int64_t s, int64_t h, int64_t d) { return k[static_cast<size_t>(((b * Sk + s) * Hkv + h) * D + d)]; }
  float& V(int64_t b, int64_t s, int64_t h, int64_t d) { return v[static_cast<size_t>(((b * Sk + s) * Hkv + h) * D + d)]; }

  // Storage in dtype and layout; kept alive by the Problem while params point into it.
  std::vector<uint16_t> q16, k16, v16;
  std::vector<float> q32, k32, v32;

  static flashcore_tensor_strides strides(bool bhsd, int64_t S, int64_t H, int64_t D) {
    if (bhsd) return {H * S * D, D, S * D, 1};
    return {S * H * D, H * D, D, 1};
  }
  template <typename T, typename Conv>
  void store(const std::vector<float>& src, std::vector<T>& dst, int64_t S, int64_t H, Conv conv) {
    dst.assign(src.size(), T{});
    const auto st = strides(bhsd, S, H, D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d)
            dst[static_cast<size_t>(b * st.batch + s * st.seq + h * st.head + d)] =
                conv(src[static_cast<size_t>(((b * S + s) * H + h) * D + d)]);
  }
  flashcore_attention_params params() {
    flashcore_attention_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.dtype = dtype, p.causal = causal ? 1 : 0, p.softmax_scale = scale;
    p.q_strides = p.o_strides = strides(bhsd, Sq, Hq, D);
    p.k_strides = p.v_strides = strides(bhsd, Sk, Hkv, D);
    if (dtype == FLASHCORE_DTYPE_FP32) {
      auto id = [](float x) { return x; };
      store(q, q32, Sq, Hq, id), store(k, k32, Sk, Hkv, id), store(v, v32, Sk, Hkv, id);
      p.q = q32.data(), p.k = k32.data(), p.v = v32.data();
    } else {
      auto conv = [this](float x) {
        return dtype == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
      };
      store(q, q16, Sq, Hq, conv), store(k, k16, Sk, Hkv, conv), store(v, v16, Sk, Hkv, conv);
      p.q = q16.data(), p.k = k16.data(), p.v = v16.data();
    }
    return p;
  }
  ref::Output run(const std::vector<int64_t>& rows = {}, int threads = 0) { return ref::attention(params(), rows, threads); }

  double o(const ref::Output& out, int64_t b, int64_t s, int64_t h, int64_t d) const {
    return out.o[static_cast<size_t>(((b * Sq + s) * Hq + h) * D + d)];
  }
  double lse(const ref::Output& out, int64_t b, int64_t h, int64_t s) const {
    return out.lse[static_cast<size_t>((b * Hq + h) * Sq + s)];
  }
};

// Independent brute force on the logical fp32 values: full score matrix with an explicit mask.
ref::Output brute_force(Problem& pr) {
  ref::Output out;
  out.o.assign(static_cast<size_t>(pr.B * pr.Sq * pr.Hq * pr.D), 0.0);
  out.lse.assign(static_cast<size_t>(pr.B * pr.Hq * pr.Sq), 0.0);
  const long double scale = pr.scale != 0 ? pr.scale : 1.0L / std::sqrt(static_cast<long double>(pr.D));
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h) {
      const int64_t hk = h / (pr.Hq / pr.Hkv);
      for (int64_t i = 0; i < pr.Sq; ++i) {
        std::vector<long double> s(static_cast<size_t>(pr.Sk));
        std::vector<bool> visible(static_cast<size_t>(pr.Sk));
        long double m = -INFINITY;
        for (int64_t j = 0; j < pr.Sk; ++j) {
          visible[j] = !pr.causal || j - i <= pr.Sk - pr.Sq;
          long double dot = 0;
          for (int64_t d = 0; d < pr.D; ++d) dot += static_cast<long double>(pr.Q(b, i, h, d)) * pr.K(b, j, hk, d);
          s[j] = dot * scale;
          if (visible[j]) m = std::max(m, s[j]);
        }
        long double l = 0;
        std::vector<long double> acc(static_cast<size_t>(pr.D), 0);
        for (int64_t j = 0; j < pr.Sk; ++j) {
          if (!visible[j]) continue;
          const long double e = std::exp(s[j] - m);
          l += e;
          for (int64_t d = 0; d < pr.D; ++d) acc[d] += e * pr.V(b, j, hk, d);
        }
        for (int64_t d = 0; d < pr.D; ++d)
          out.o[static_cast<size_t>(((b * pr.Sq + i) * pr.Hq + h) * pr.D + d)] = l > 0 ? static_cast<double>(acc[d] / l) : 0.0;
        out.lse[static_cast<size_t>((b * pr.Hq + h) * pr.Sq + i)] = l > 0 ? static_cast<double>(m + std::log(l)) : -kInf;
      }
    }
  return out;
}

void expect_near_all(const ref::Output& a, const ref::Output& b, double tol) {
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(a.lse.size(), b.lse.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], tol) << "o index " << i;
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      ASSERT_EQ(a.lse[i], b.lse[i]) << "lse index " << i;
    } else {
      ASSERT_NEAR(a.lse[i], b.lse[i], tol * std::max(1.0, std::fabs(b.lse[i]))) << "lse index " << i;
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Hand-computed cases
// ------------------------------------------------------------------------------------------------

TEST(ReferenceHand, OneQueryTwoKeys) {
  // q = (1, 0), k0 = (0, 0), k1 = (2, 0), scale 1  =>  scores (0, 2)
  // p = (1, e^2) / (1 + e^2); v0 = (1, 0), v1 = (0, 1)  =>  O = p, LSE = log(1 + e^2)
  Problem pr;
  pr.Sk = 2, pr.scale = 1.0f;
  pr.resize();
  pr.Q(0, 0, 0, 0) = 1;
  pr.K(0, 1, 0, 0) = 2;
  pr.V(0, 0, 0, 0) = 1, pr.V(0, 1, 0, 1) = 1;
  const auto out = pr.run();
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(pr.o(out, 0, 0, 0, 0), 1.0 / (1.0 + e2), 1e-15);
  EXPECT_NEAR(pr.o(out, 0, 0, 0, 1), e2 / (1.0 + e2), 1e-15);
  EXPECT_NEAR(pr.lse(out, 0, 0, 0), std::log(1.0 + e2), 1e-15);
}

TEST(ReferenceHand, DefaultScaleIsInverseSqrtHeadDim) {
  // D = 4 => scale 1/2. q = (1,1,1,1), k1 = (1,1,1,1), k0 = 0 => scores (0, 2).
  Problem pr;
  pr.Sk = 2, pr.D = 4;
  pr.resize();
  for (int d = 0; d < 4; ++d) pr.Q(0, 0, 0, d) = 1, pr.K(0, 1, 0, d) = 1;
  pr.V(0, 0, 0, 0) = 3, pr.V(0, 1, 0, 0) = -1;
  const auto out = pr.run();
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(pr.o(out, 0, 0, 0, 0), (3.0 - e2) / (1.0 + e2), 1e-14);
  EXPECT_NEAR(pr.lse(out, 0, 0, 0), std::log(1.0 + e2), 1e-15);
}

TEST(ReferenceHand, UniformScoresGiveMeanOfV) {
  // q = 0 => every score is 0 => O = mean of V rows, LSE = log(Sk).
  Problem pr;
  pr.Sk = 5, pr.D = 3;
  pr.resize();
  std::vector<double> mean(3, 0.0);
  for (int j = 0; j < 5; ++j)
    for (int d = 0; d < 3; ++d) {
      pr.V(0, j, 0, d) = static_cast<float>(j * 3 + d) * 0.25f - 1.0f;
      pr.K(0, j, 0, d) = static_cast<float>(j - d);
      mean[d] += pr.V(0, j, 0, d) / 5.0;
    }
  const auto out = pr.run();
  for (int d = 0; d < 3; ++d) EXPECT_NEAR(pr.o(out, 0, 0, 0, d), mean[d], 1e-15);
  EXPECT_NEAR(pr.lse(out, 0, 0, 0), std::log(5.0), 1e-15);
}

TEST(ReferenceHand, CausalSquareFirstRowSeesOnlyFirstKey) {
  Problem pr;
  pr.Sq = pr.Sk = 3, pr.D = 1, pr.causal = true;
  pr.resize();
  for (int j = 0; j < 3; ++j) pr.V(0, j, 0, 0) = static_cast<float>(10 * (j + 1));
  const auto out = pr.run();  // q = 0: uniform over the visible keys
  EXPECT_DOUBLE_EQ(pr.o(out, 0, 0, 0, 0), 10.0);
  EXPECT_NEAR(pr.o(out, 0, 1, 0, 0), 15.0, 1e-13);
  EXPECT_NEAR(pr.o(out, 0, 2, 0, 0), 20.0, 1e-13);
  EXPECT_NEAR(pr.lse(out, 0, 0, 2), std::log(3.0), 1e-15);
}

// ------------------------------------------------------------------------------------------------
// Properties
// ------------------------------------------------------------------------------------------------

TEST(ReferenceProperty, ProbabilitiesSumToOne) {
  // V = one-hot columns (V[j][d] = [j == d], D >= Sk) => O[d] = p_d, so each row of O sums to 1.
  for (bool causal : {false, true}) {
    Problem pr;
    pr.B = 2, pr.Sq = 9, pr.Sk = 13, pr.Hq = 2, pr.D = 16, pr.causal = causal;
    pr.randomize(1, 2.0f);
    std::fill(pr.v.begin(), pr.v.end(), 0.0f);
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t j = 0; j < pr.Sk; ++j) pr.V(b, j, 0, j) = 1.0f;
    const auto out = pr.run();
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t h = 0; h < pr.Hq; ++h)
        for (int64_t i = 0; i < pr.Sq; ++i) {
          double sum = 0;
          for (int64_t d = 0; d < pr.D; ++d) {
            const double pd = pr.o(out, b, i, h, d);
            EXPECT_GE(pd, 0.0);
            if (causal && d > i + pr.Sk - pr.Sq) {
              EXPECT_EQ(pd, 0.0) << "masked key has probability";
            }
            sum += pd;
          }
          EXPECT_NEAR(sum, 1.0, 1e-13) << "b=" << b << " h=" << h << " i=" << i;
        }
  }
}

TEST(ReferenceProperty, ConstantScoreShiftChangesNothing) {
  // K' = K + c (the same vector for every key) adds scale * q_i . c to every score of row i:
  // O is unchanged and LSE moves by exactly that amount.
  Problem pr;
  pr.B = 2, pr.Sq = 7, pr.Sk = 11, pr.Hq = 4, pr.Hkv = 2, pr.D = 8, pr.causal = true, pr.scale = 0.7f;
  pr.randomize(2);
  for (auto& x : pr.k) x = std::round(x * 1024.0f) / 1024.0f;  // so that K + c is exact in float
  const auto base = pr.run();
  std::vector<float> c(static_cast<size_t>(pr.D));
  for (int64_t d = 0; d < pr.D; ++d) c[d] = 0.5f * static_cast<float>(d) - 1.5f;
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t j = 0; j < pr.Sk; ++j)
      for (int64_t h = 0; h < pr.Hkv; ++h)
        for (int64_t d = 0; d < pr.D; ++d) pr.K(b, j, h, d) += c[d];
  const auto shifted = pr.run();
  for (size_t i = 0; i < base.o.size(); ++i) EXPECT_NEAR(shifted.o[i], base.o[i], 1e-12);
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h)
      for (int64_t i = 0; i < pr.Sq; ++i) {
        double qc = 0;
        for (int64_t d = 0; d < pr.D; ++d) qc += static_cast<double>(pr.Q(b, i, h, d)) * c[d];
        EXPECT_NEAR(pr.lse(shifted, b, h, i), pr.lse(base, b, h, i) + static_cast<double>(0.7f) * qc, 1e-12);
      }
}

TEST(ReferenceProperty, GqaEqualsRepeatedKvHeads) {
  for (int64_t hkv : {1, 2, 4}) {
    Problem gqa;
    gqa.B = 2, gqa.Sq = 5, gqa.Sk = 9, gqa.Hq = 8, gqa.Hkv = hkv, gqa.D = 8, gqa.causal = hkv == 2;
    gqa.randomize(3);
    Problem mha = gqa;
    mha.Hkv = 8;
    mha.k.assign(static_cast<size_t>(mha.B * mha.Sk * 8 * mha.D), 0.0f);
    mha.v = mha.k;
    for (int64_t b = 0; b < mha.B; ++b)
      for (int64_t j = 0; j < mha.Sk; ++j)
        for (int64_t h = 0; h < 8; ++h)
          for (int64_t d = 0; d < mha.D; ++d) {
            mha.K(b, j, h, d) = gqa.K(b, j, h / (8 / hkv), d);
            mha.V(b, j, h, d) = gqa.V(b, j, h / (8 / hkv), d);
          }
    const auto a = gqa.run(), b = mha.run();
    EXPECT_EQ(a.o, b.o) << "Hkv=" << hkv;
    EXPECT_EQ(a.lse, b.lse) << "Hkv=" << hkv;
  }
}

TEST(ReferenceProperty, MatchesBruteForceCausalAndNot) {
  const int64_t shapes[][2] = {{1, 1}, {1, 7}, {7, 1}, {6, 13}, {13, 6}, {16, 16}, {17, 3}};
  for (auto& s : shapes)
    for (bool causal : {false, true}) {
      Problem pr;
      pr.B = 2, pr.Sq = s[0], pr.Sk = s[1], pr.Hq = 3, pr.D = 5, pr.causal = causal;
      pr.randomize(static_cast<uint64_t>(s[0] * 100 + s[1]), 1.5f);
      SCOPED_TRACE("Sq=" + std::to_string(s[0]) + " Sk=" + std::to_string(s[1]) + " causal=" + std::to_string(causal));
      expect_near_all(pr.run(), brute_force(pr), 1e-12);
    }
}

TEST(ReferenceProperty, FullyMaskedRowsGiveZeroAndMinusInf) {
  // Sq = 5 > Sk = 2, causal: query i sees key j iff j <= i - 3, so rows 0..2 see nothing.
  Problem pr;
  pr.Sq = 5, pr.Sk = 2, pr.Hq = 2, pr.D = 4, pr.causal = true;
  pr.randomize(4);
  const auto out = pr.run();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i) {
      const bool masked = i < 3;
      EXPECT_EQ(std::isinf(pr.lse(out, 0, h, i)) && pr.lse(out, 0, h, i) < 0, masked) << "i=" << i;
      for (int64_t d = 0; d < 4 && masked; ++d) EXPECT_EQ(pr.o(out, 0, i, h, d), 0.0);
    }
  // Row 3 sees exactly key 0: O = v0, LSE = score.
  for (int64_t d = 0; d < 4; ++d) EXPECT_NEAR(pr.o(out, 0, 3, 0, d), pr.V(0, 0, 0, d), 1e-15);
  const auto lowp = ref::attention_lowp(pr.params());
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(lowp.lse[i], -kInf);
}

TEST(ReferenceProperty, LayoutsGiveIdenticalResults) {
  for (auto dt : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    Problem pr;
    pr.B = 3, pr.Sq = 10, pr.Sk = 7, pr.Hq = 4, pr.Hkv = 2, pr.D = 8, pr.causal = true, pr.dtype = dt;
    pr.randomize(5);
    const auto bshd = pr.run();
    pr.bhsd = true;
    const auto bhsd = pr.run();
    EXPECT_EQ(bshd.o, bhsd.o);
    EXPECT_EQ(bshd.lse, bhsd.lse);
    EXPECT_EQ(ref::attention_lowp(pr.params()).o, (pr.bhsd = false, ref::attention_lowp(pr.params()).o));
  }
}

TEST(ReferenceProperty, PaddedStridesAreHonored) {
  // Q/K/V inside larger buffers (seq stride padded, heads interleaved with garbage).
  Problem pr;
  pr.B = 2, pr.Sq = 6, pr.Sk = 5, pr.Hq = 2, pr.D = 4;
  pr.randomize(6);
  const auto dense = pr.run();
  auto p = pr.params();
  const int64_t pad = 3;
  std::vector<float> q(static_cast<size_t>(pr.B * pr.Sq * (pr.Hq * pr.D + pad)), NAN);
  std::vector<float> k(static_cast<size_t>(pr.B * pr.Sk * (pr.Hkv * pr.D + pad)), NAN), v = k;
  p.q_strides = {pr.Sq * (pr.Hq * pr.D + pad), pr.Hq * pr.D + pad, pr.D, 1};
  p.k_strides = p.v_strides = {pr.Sk * (pr.Hkv * pr.D + pad), pr.Hkv * pr.D + pad, pr.D, 1};
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t d = 0; d < pr.D; ++d) {
      for (int64_t s = 0; s < pr.Sq; ++s)
        for (int64_t h = 0; h < pr.Hq; ++h)
          q[b * p.q_strides.batch + s * p.q_strides.seq + h * pr.D + d] = pr.Q(b, s, h, d);
      for (int64_t s = 0; s < pr.Sk; ++s) {
        k[b * p.k_strides.batch + s * p.k_strides.seq + d] = pr.K(b, s, 0, d);
        v[b * p.v_strides.batch + s * p.v_strides.seq + d] = pr.V(b, s, 0, d);
      }
    }
  p.q = q.data(), p.k = k.data(), p.v = v.data();
  const auto strided = ref::attention(p);
  EXPECT_EQ(strided.o, dense.o);
  EXPECT_EQ(strided.lse, dense.lse);
}

TEST(ReferenceProperty, RowSubsetMatchesFullAndThreadCountDoesNotMatter) {
  Problem pr;
  pr.B = 2, pr.Sq = 33, pr.Sk = 40, pr.Hq = 4, pr.Hkv = 1, pr.D = 16, pr.causal = true;
  pr.randomize(7);
  const auto full = pr.run({}, 1);
  const auto full4 = pr.run({}, 4);
  EXPECT_EQ(full.o, full4.o);
  EXPECT_EQ(full.lse, full4.lse);
  const std::vector<int64_t> rows = {0, 5, 32};
  const auto sub = pr.run(rows, 3);
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h)
      for (int64_t i = 0; i < pr.Sq; ++i) {
        const bool selected = i == 0 || i == 5 || i == 32;
        EXPECT_EQ(pr.lse(sub, b, h, i), selected ? pr.lse(full, b, h, i) : 0.0);
        for (int64_t d = 0; d < pr.D; ++d) EXPECT_EQ(pr.o(sub, b, i, h, d), selected ? pr.o(full, b, i, h, d) : 0.0);
      }
  EXPECT_THROW(pr.run({33}), std::invalid_argument);
}

TEST(ReferenceProperty, LowPrecisionIsCloseToFloat64) {
  struct { flashcore_dtype dt; double tol; } cases[] = {
      {FLASHCORE_DTYPE_FP32, 1e-5}, {FLASHCORE_DTYPE_FP16, 4e-3}, {FLASHCORE_DTYPE_BF16, 3e-2}};
  for (auto c : cases) {
    Problem pr;
    pr.B = 1, pr.Sq = 20, pr.Sk = 50, pr.Hq = 2, pr.D = 32, pr.causal = true, pr.dtype = c.dt;
    pr.randomize(8);
    const auto p = pr.params();
    const auto exact = ref::attention(p), lowp = ref::attention_lowp(p);
    double err = 0;
    for (size_t i = 0; i < exact.o.size(); ++i) err = std::max(err, std::fabs(exact.o[i] - lowp.o[i]));
    EXPECT_LT(err, c.tol) << "dtype " << c.dt;
    if (c.dt != FLASHCORE_DTYPE_FP32) {
      EXPECT_GT(err, 0.0) << "rounding had no effect";
    }
    // Outputs of the low-precision path are representable in the dtype.
    for (double x : lowp.o) EXPECT_EQ(static_cast<float>(x), ref::round_to_dtype(static_cast<float>(x), c.dt));
  }
}

TEST(ReferenceProperty, LargeMagnitudeScoresStayFinite) {
  Problem pr;
  pr.Sq = 8, pr.Sk = 8, pr.D = 64, pr.dtype = FLASHCORE_DTYPE_FP16;
  pr.randomize(9, 30.0f);
  const auto p = pr.params();
  for (const auto& out : {ref::attention(p), ref::attention_lowp(p)}) {
    for (double x : out.o) EXPECT_TRUE(std::isfinite(x));
    for (double x : out.lse) EXPECT_TRUE(std::isfinite(x));
  }
}

TEST(ReferenceProperty, RejectsInvalidProblems) {
  Problem pr;
  pr.Hq = 3, pr.Hkv = 2;
  pr.resize();
  EXPECT_THROW(pr.run(), std::invalid_argument);
  pr.Hkv = 1, pr.Sk = 0;
  pr.resize();
  EXPECT_THROW(pr.run(), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Conversions
// ------------------------------------------------------------------------------------------------

TEST(ReferenceConversion, HalfRoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = ref::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0);
      EXPECT_TRUE(std::isnan(ref::half_to_float(ref::float_to_half(f))));
      continue;
    }
    ASSERT_EQ(ref::float_to_half(f), h) << std::hex << h;
  }
  EXPECT_EQ(ref::half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(ref::half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(ref::half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(ref::half_to_float(0xfc00), -INFINITY);
}

TEST(ReferenceConversion, BF16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = ref::bf16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(ref::bf16_to_float(ref::float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(ref::float_to_bf16(f), b) << std::hex << b;
  }
}

TEST(ReferenceConversion, HalfRoundsToNearestEven) {
  auto h = [](double x) { return ref::float_to_half(static_cast<float>(x)); };
  EXPECT_EQ(h(1.0 + std::ldexp(1.0, -11)), 0x3c00);               // tie -> even (down)
  EXPECT_EQ(h(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);           // tie -> even (up)
  EXPECT_EQ(h(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -20)), 0x3c01);  // above tie -> up
  EXPECT_EQ(h(65504.0), 0x7bff);
  EXPECT_EQ(h(65519.0), 0x7bff);                                  // below the overflow tie
  EXPECT_EQ(h(65520.0), 0x7c00);                                  // tie rounds to even = inf
  EXPECT_EQ(h(1e10), 0x7c00);
  EXPECT_EQ(h(-1e10), 0xfc00);
  EXPECT_EQ(h(std::ldexp(1.0, -25)), 0x0000);                     // tie between 0 and min subnormal
  EXPECT_EQ(h(3 * std::ldexp(1.0, -25)), 0x0002);                 // tie -> even (up)
  EXPECT_EQ(h(std::ldexp(1.0, -25) * 1.0001), 0x0001);
  EXPECT_EQ(h(std::ldexp(1.0, -14) - std::ldexp(1.0, -25)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(h(-0.0), 0x8000);
  EXPECT_EQ(h(NAN) & 0x7e00, 0x7e00);
}

TEST(ReferenceConversion, BF16RoundsToNearestEven) {
  auto b = [](double x) { return ref::float_to_bf16(static_cast<float>(x)); };
  EXPECT_EQ(b(1.0 + std::ldexp(1.0, -8)), 0x3f80);       // tie -> even (down)
  EXPECT_EQ(b(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);   // tie -> even (up)
  EXPECT_EQ(b(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -20)), 0x3f81);
  EXPECT_EQ(b(3.4e38), 0x7f80);                          // rounds to inf
  EXPECT_EQ(b(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(ref::bf16_to_float(b(NAN))));
}

TEST(ReferenceConversion, RandomFloatsMatchCompilerConversion) {
  std::mt19937 rng(10);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    // Bias towards the fp16 range (exponents 100..150) half of the time.
    if (i & 1) u = (u & 0x807fffffu) | ((100u + (u >> 8) % 51u) << 23);
    float f;
    std::memcpy(&f, &u, sizeof f);
    if (std::isnan(f)) continue;
    // bf16 by definition: RNE of the top 16 bits, checked with double arithmetic.
    const float bf = ref::bf16_to_float(ref::float_to_bf16(f));
    const float lo = ref::bf16_to_float(static_cast<uint16_t>(u >> 16));
    if (std::isfinite(lo) && std::isfinite(bf) && bf != lo) {
      EXPECT_GE(std::fabs(static_cast<double>(f) - lo), std::fabs(static_cast<double>(f) - bf));
    }
#if defined(__FLT16_MAX__)
    const _Float16 c = static_cast<_Float16>(f);
    uint16_t cb;
    std::memcpy(&cb, &c, sizeof cb);
    ASSERT_EQ(ref::float_to_half(f), cb) << f;
#endif
  }
}

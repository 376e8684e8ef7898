// Tests of the float64 backward reference (reference::attention_backward): its gradients against central finite
// differences of the forward reference (reference::attention) for the loss L = sum(O * G), whose gradients are the
// backward's with dO = G; hand-computed cases; invariants (sum_j dK_j = 0, sum_j dV_j = sum_i dO_i); masking, GQA,
// seqused_k, layouts, thread counts; head_dim_v != head_dim (V, O, dO and dV of their own head dim, as MLA's
// (192, 128)); and the low-precision model (attention_backward_lowp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/finite_difference.h"
#include "reference/reference.h"

namespace ref = flashcore::reference;

namespace {

// A host problem: logical Q, K (D columns), V and G (= dO) (DV columns) in dense (B, S, H, columns) order, stored in
// `dtype` with (B,S,H,D) or (B,H,S,D) strides (dO may be stored with a padded head stride instead).
struct Problem {
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 4;
  int64_t DV = 0;  // head_dim_v: the head dim of V, O, dO and dV (0: D)
  bool causal = false;
  float scale = 0.0f;
  flashcore_dtype dtype = FLASHCORE_DTYPE_FP32;
  bool bhsd = false;
  bool padded_dout = false;  // dO with head stride DV + 8 and seq stride Hq * (DV + 8) (+ garbage between)
  std::vector<int32_t> seqused_k;  // empty: not given
  std::vector<float> sinks;        // Hq sink logits, or empty: none
  std::vector<float> q, k, v, g;

  int64_t dv_cols() const { return DV != 0 ? DV : D; }
  void resize() {
    q.assign(static_cast<size_t>(B * Sq * Hq * D), 0.0f);
    g.assign(static_cast<size_t>(B * Sq * Hq * dv_cols()), 0.0f);
    k.assign(static_cast<size_t>(B * Sk * Hkv * D), 0.0f);
    v.assign(static_cast<size_t>(B * Sk * Hkv * dv_cols()), 0.0f);
  }
  // N(0, amplitude) values on a grid of 2^-10, so that x +- h and x +- 2h (h = 2^-6) are exact in float.
  void randomize(uint64_t seed, float amplitude = 1.0f) {
    resize();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, amplitude);
    for (auto* t : {&q, &k, &v, &g})
      for (auto& x : *t) x = std::round(n(rng) * 1024.0f) / 1024.0f;
  }
  size_t qi(int64_t b, int64_t s, int64_t h, int64_t d) const { return static_cast<size_t>(((b * Sq + s) * Hq + h) * D + d); }
  size_t ki(int64_t b, int64_t s, int64_t h, int64_t d) const { return static_cast<size_t>(((b * Sk + s) * Hkv + h) * D + d); }
  // Indices into g (and O, dq's DV-column counterpart) and v (and dv): DV columns.
  size_t gi(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * Sq + s) * Hq + h) * dv_cols() + d);
  }
  size_t vi(int64_t b, int64_t s, int64_t h, int64_t d) const {
    return static_cast<size_t>(((b * Sk + s) * Hkv + h) * dv_cols() + d);
  }

  // Storage, kept alive by the Problem while the params point into it.
  std::vector<uint16_t> q16, k16, v16, g16;
  std::vector<float> q32, k32, v32, g32;

  static flashcore_tensor_strides strides(bool bhsd, int64_t S, int64_t H, int64_t D) {
    if (bhsd) return {H * S * D, D, S * D, 1};
    return {S * H * D, H * D, D, 1};
  }
  flashcore_tensor_strides dout_strides() const {
    const int64_t C = dv_cols();
    if (!padded_dout) return strides(bhsd, Sq, Hq, C);
    return {Sq * Hq * (C + 8) + 8, Hq * (C + 8), C + 8, 1};
  }
  // src: dense (B, S, H, C); dst: at strides st, `fill` elsewhere.
  template <typename T, typename Conv>
  void store(const std::vector<float>& src, std::vector<T>& dst, const flashcore_tensor_strides& st, int64_t S,
             int64_t H, int64_t C, Conv conv, T fill) {
    dst.assign(static_cast<size_t>((B - 1) * st.batch + (S - 1) * st.seq + (H - 1) * st.head + C), fill);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < C; ++d)
            dst[static_cast<size_t>(b * st.batch + s * st.seq + h * st.head + d)] =
                conv(src[static_cast<size_t>(((b * S + s) * H + h) * C + d)]);
  }
  flashcore_attention_params params() {
    flashcore_attention_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.head_dim_v = DV;
    p.dtype = dtype, p.causal = causal ? 1 : 0, p.softmax_scale = scale;
    const int64_t C = dv_cols();
    p.q_strides = p.dq_strides = strides(bhsd, Sq, Hq, D);
    p.o_strides = strides(bhsd, Sq, Hq, C);
    p.k_strides = p.dk_strides = strides(bhsd, Sk, Hkv, D);
    p.v_strides = p.dv_strides = strides(bhsd, Sk, Hkv, C);
    p.dout_strides = dout_strides();
    p.seqused_k = seqused_k.empty() ? nullptr : seqused_k.data();
    p.sinks = sinks.empty() ? nullptr : sinks.data();
    if (dtype == FLASHCORE_DTYPE_FP32) {
      auto id = [](float x) { return x; };
      store(q, q32, p.q_strides, Sq, Hq, D, id, NAN), store(k, k32, p.k_strides, Sk, Hkv, D, id, NAN);
      store(v, v32, p.v_strides, Sk, Hkv, C, id, NAN), store(g, g32, p.dout_strides, Sq, Hq, C, id, NAN);
      p.q = q32.data(), p.k = k32.data(), p.v = v32.data(), p.dout = g32.data();
    } else {
      auto conv = [this](float x) {
        return dtype == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
      };
      const uint16_t nan_bits = dtype == FLASHCORE_DTYPE_FP16 ? 0x7e00 : 0x7fc0;
      store(q, q16, p.q_strides, Sq, Hq, D, conv, nan_bits), store(k, k16, p.k_strides, Sk, Hkv, D, conv, nan_bits);
      store(v, v16, p.v_strides, Sk, Hkv, C, conv, nan_bits), store(g, g16, p.dout_strides, Sq, Hq, C, conv, nan_bits);
      p.q = q16.data(), p.k = k16.data(), p.v = v16.data(), p.dout = g16.data();
    }
    return p;
  }
  ref::Gradients grads(int threads = 0) {
    const flashcore_attention_params p = params();
    return ref::attention_backward(p, p.dout, threads);
  }
  ref::Gradients grads_lowp(int threads = 0) {
    const flashcore_attention_params p = params();
    return ref::attention_backward_lowp(p, p.dout, threads);
  }
  // L = sum(O * G) through the forward reference (one thread: it runs thousands of times per test).
  double loss() {
    const ref::Output out = ref::attention(params(), {}, 1);
    double l = 0;
    for (size_t i = 0; i < out.o.size(); ++i) l += out.o[i] * static_cast<double>(g[i]);
    return l;
  }
  // Key count query row i of sequence b sees (the forward's rule, spelled out again here).
  int64_t visible(int64_t b, int64_t i) const {
    const int64_t keys = seqused_k.empty() ? Sk : std::clamp<int64_t>(seqused_k[static_cast<size_t>(b)], 0, Sk);
    return causal ? std::clamp<int64_t>(i + keys - Sq + 1, 0, keys) : keys;
  }
};

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// The five-point central difference of L in x, one float of the problem (finite_difference.h).
double finite_difference(Problem& pr, float& x) {
  return ::finite_difference(x, [&] { return pr.loss(); });
}

// Every gradient of the problem (and dL/dsinks with sinks) against its finite difference.
void expect_matches_finite_differences(Problem& pr, double tol = 2e-6) {
  const ref::Gradients an = pr.grads();
  ASSERT_EQ(an.dq.size(), pr.q.size());
  ASSERT_EQ(an.dk.size(), pr.k.size());
  ASSERT_EQ(an.dv.size(), pr.v.size());
  const double scale = std::max({1.0, max_abs(an.dq), max_abs(an.dk), max_abs(an.dv)});
  struct Tensor {
    const char* name;
    std::vector<float>* x;
    const std::vector<double>* grad;
  } tensors[] = {{"dq", &pr.q, &an.dq}, {"dk", &pr.k, &an.dk}, {"dv", &pr.v, &an.dv}};
  for (const Tensor& t : tensors)
    for (size_t i = 0; i < t.x->size(); ++i)
      ASSERT_NEAR((*t.grad)[i], finite_difference(pr, (*t.x)[i]), tol * scale) << t.name << " index " << i;
  if (!pr.sinks.empty()) {
    const flashcore_attention_params p = pr.params();
    const std::vector<double> dsinks = ref::attention_backward_sinks(p, p.dout);
    ASSERT_EQ(dsinks.size(), pr.sinks.size());
    for (size_t h = 0; h < dsinks.size(); ++h)
      EXPECT_NEAR(dsinks[h], finite_difference(pr, pr.sinks[h]), tol * std::max(1.0, std::fabs(dsinks[h])))
          << "dsinks[" << h << "]";
  }
}

struct FdCase {
  const char* name;
  int64_t B, Sq, Sk, Hq, Hkv, D;
  bool causal;
  float scale;
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Finite differences
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, MatchesFiniteDifferences) {
  const FdCase cases[] = {
      {"mha", 2, 5, 7, 2, 2, 4, false, 0.0f},
      {"mha causal", 2, 5, 7, 2, 2, 4, true, 0.0f},
      {"square causal", 1, 6, 6, 2, 2, 5, true, 0.0f},
      {"gqa 4:2 causal", 1, 6, 6, 4, 2, 4, true, 0.0f},
      {"gqa 4:2", 2, 3, 5, 4, 2, 4, false, 0.0f},
      {"mqa 4:1", 1, 4, 9, 4, 1, 3, false, 0.0f},
      {"mqa 4:1 causal", 1, 9, 4, 4, 1, 3, true, 0.0f},
      {"sq > sk causal (rows without keys)", 1, 7, 3, 2, 1, 4, true, 0.0f},
      {"sq > sk", 1, 7, 3, 2, 1, 4, false, 0.0f},
      {"sq < sk causal", 2, 3, 8, 2, 2, 4, true, 0.0f},
      {"seqlen 1", 1, 1, 1, 2, 2, 4, false, 0.0f},
      {"seqlen 1 causal", 1, 1, 1, 2, 1, 4, true, 0.0f},
      {"one query, five keys, causal", 2, 1, 5, 2, 2, 4, true, 0.0f},
      {"five queries, one key, causal", 1, 5, 1, 2, 2, 4, true, 0.0f},
      {"scale 0.3 gqa causal", 1, 6, 8, 4, 2, 8, true, 0.3f},
      {"scale 1.7", 1, 4, 5, 2, 2, 3, false, 1.7f},
  };
  uint64_t seed = 100;
  for (const FdCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr;
    pr.B = c.B, pr.Sq = c.Sq, pr.Sk = c.Sk, pr.Hq = c.Hq, pr.Hkv = c.Hkv, pr.D = c.D, pr.causal = c.causal;
    pr.scale = c.scale;
    pr.randomize(seed++);
    expect_matches_finite_differences(pr);
  }
}

TEST(ReferenceBackward, SequsedKMatchesFiniteDifferences) {
  // Sequence 0 uses 4 of its 6 keys, sequence 1 none (its rows see nothing: every gradient of it is 0).
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Problem pr;
    pr.B = 2, pr.Sq = 3, pr.Sk = 6, pr.Hq = 2, pr.Hkv = 1, pr.D = 4, pr.causal = causal;
    pr.seqused_k = {4, 0};
    pr.randomize(7);
    expect_matches_finite_differences(pr);
    const ref::Gradients gr = pr.grads();
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t j = 0; j < pr.Sk; ++j)
        for (int64_t d = 0; d < pr.D; ++d) {
          if (b == 0 && j < 4) continue;
          EXPECT_EQ(gr.dk[pr.ki(b, j, 0, d)], 0.0) << "b=" << b << " j=" << j;
          EXPECT_EQ(gr.dv[pr.ki(b, j, 0, d)], 0.0) << "b=" << b << " j=" << j;
        }
    for (int64_t i = 0; i < pr.Sq; ++i)
      for (int64_t h = 0; h < pr.Hq; ++h)
        for (int64_t d = 0; d < pr.D; ++d) EXPECT_EQ(gr.dq[pr.qi(1, i, h, d)], 0.0);
  }
}

// ------------------------------------------------------------------------------------------------
// Hand-computed cases
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, OneKeyGivesDvEqualsDoutSummedOverTheGroup) {
  // One key: P = 1 whatever Q and K, so O = v, dQ = dK = 0 and dV = sum over the group's heads of dO.
  Problem pr;
  pr.Hq = 2, pr.Hkv = 1, pr.D = 3;
  pr.randomize(1);
  const ref::Gradients gr = pr.grads();
  for (int64_t d = 0; d < pr.D; ++d) {
    EXPECT_EQ(gr.dq[pr.qi(0, 0, 0, d)], 0.0);
    EXPECT_EQ(gr.dq[pr.qi(0, 0, 1, d)], 0.0);
    EXPECT_EQ(gr.dk[pr.ki(0, 0, 0, d)], 0.0);
    EXPECT_DOUBLE_EQ(gr.dv[pr.ki(0, 0, 0, d)],
                     static_cast<double>(pr.g[pr.qi(0, 0, 0, d)]) + static_cast<double>(pr.g[pr.qi(0, 0, 1, d)]));
  }
}

TEST(ReferenceBackward, OneQueryTwoKeys) {
  // q = (1, 0), k0 = (0, 0), k1 = (2, 0), scale 1 => scores (0, 2), p0 = 1 / (1 + e^2), p1 = 1 - p0.
  // v0 = (1, 0), v1 = (0, 1), dO = (1, 0) => dP = (1, 0), D = p0, dS = (p0 p1, -p0 p1):
  // dV_j = p_j dO, dQ = dS_0 k0 + dS_1 k1 = (-2 p0 p1, 0), dK_j = dS_j q.
  Problem pr;
  pr.Sk = 2, pr.D = 2, pr.scale = 1.0f;
  pr.resize();
  pr.q[pr.qi(0, 0, 0, 0)] = 1;
  pr.k[pr.ki(0, 1, 0, 0)] = 2;
  pr.v[pr.ki(0, 0, 0, 0)] = 1, pr.v[pr.ki(0, 1, 0, 1)] = 1;
  pr.g[pr.qi(0, 0, 0, 0)] = 1;
  const ref::Gradients gr = pr.grads();
  const double p0 = 1.0 / (1.0 + std::exp(2.0)), p1 = 1.0 - p0;
  EXPECT_NEAR(gr.dv[pr.ki(0, 0, 0, 0)], p0, 1e-15);
  EXPECT_NEAR(gr.dv[pr.ki(0, 1, 0, 0)], p1, 1e-15);
  EXPECT_EQ(gr.dv[pr.ki(0, 0, 0, 1)], 0.0);
  EXPECT_EQ(gr.dv[pr.ki(0, 1, 0, 1)], 0.0);
  EXPECT_NEAR(gr.dq[pr.qi(0, 0, 0, 0)], -2.0 * p0 * p1, 1e-15);
  EXPECT_EQ(gr.dq[pr.qi(0, 0, 0, 1)], 0.0);
  EXPECT_NEAR(gr.dk[pr.ki(0, 0, 0, 0)], p0 * p1, 1e-15);
  EXPECT_NEAR(gr.dk[pr.ki(0, 1, 0, 0)], -p0 * p1, 1e-15);
  EXPECT_EQ(gr.dk[pr.ki(0, 0, 0, 1)], 0.0);
}

TEST(ReferenceBackward, DefaultScaleIsInverseSqrtHeadDim) {
  // The same problem with scale 0 and with 1/sqrt(D) given explicitly: identical gradients.
  Problem pr;
  pr.B = 1, pr.Sq = 5, pr.Sk = 6, pr.Hq = 2, pr.Hkv = 2, pr.D = 16, pr.causal = true;
  pr.randomize(2);
  const ref::Gradients by_default = pr.grads();
  pr.scale = 0.25f;
  const ref::Gradients given = pr.grads();
  EXPECT_EQ(by_default.dq, given.dq);
  EXPECT_EQ(by_default.dk, given.dk);
  EXPECT_EQ(by_default.dv, given.dv);
}

// ------------------------------------------------------------------------------------------------
// Invariants and masking
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, KeySumsOfDkVanishAndOfDvEqualTheSeenDout) {
  // sum_j dS_ij = sum_j P_ij dP_ij - D_i = 0 for every row, so sum_j dK_j = 0 for every (batch, KV head); and
  // sum_j dV_j = sum over the group's rows that see some key of dO_i (each such row's P sums to 1).
  for (bool causal : {false, true}) {
    Problem pr;
    pr.B = 2, pr.Sq = 11, pr.Sk = 7, pr.Hq = 6, pr.Hkv = 2, pr.D = 8, pr.causal = causal;
    pr.randomize(3, 1.5f);
    const ref::Gradients gr = pr.grads();
    const double scale = std::max(max_abs(gr.dk), max_abs(gr.dv));
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t hk = 0; hk < pr.Hkv; ++hk)
        for (int64_t d = 0; d < pr.D; ++d) {
          double dk_sum = 0, dv_sum = 0, dout_sum = 0;
          for (int64_t j = 0; j < pr.Sk; ++j) dk_sum += gr.dk[pr.ki(b, j, hk, d)], dv_sum += gr.dv[pr.ki(b, j, hk, d)];
          for (int64_t h = hk * 3; h < hk * 3 + 3; ++h)
            for (int64_t i = 0; i < pr.Sq; ++i)
              if (pr.visible(b, i) > 0) dout_sum += pr.g[pr.qi(b, i, h, d)];
          EXPECT_NEAR(dk_sum, 0.0, 1e-12 * std::max(1.0, scale)) << "b=" << b << " hkv=" << hk << " d=" << d;
          EXPECT_NEAR(dv_sum, dout_sum, 1e-12 * std::max(1.0, scale)) << "b=" << b << " hkv=" << hk << " d=" << d;
        }
  }
}

TEST(ReferenceBackward, RowsWithoutKeysContributeNothing) {
  // Sq = 6 > Sk = 2, causal: query i sees key j iff j <= i - 4, so rows 0..3 see nothing. Their dq is 0, and any dO
  // given for them changes nothing (their P is 0): dK and dV depend on the dO of rows 4 and 5 only.
  Problem pr;
  pr.Sq = 6, pr.Sk = 2, pr.Hq = 2, pr.D = 4, pr.causal = true;
  pr.randomize(4);
  const ref::Gradients base = pr.grads();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(base.dq[pr.qi(0, i, h, d)], 0.0) << "i=" << i;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t d = 0; d < 4; ++d) pr.g[pr.qi(0, i, h, d)] = 1e3f * static_cast<float>(d + 1);
  const ref::Gradients changed = pr.grads();
  EXPECT_EQ(changed.dq, base.dq);
  EXPECT_EQ(changed.dk, base.dk);
  EXPECT_EQ(changed.dv, base.dv);
  // Row 4 sees key 0 alone (P = 1): its dq is 0 too; key 1 is seen by row 5 only.
  for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(base.dq[pr.qi(0, 4, 0, d)], 0.0);
  for (int64_t d = 0; d < 4; ++d) EXPECT_NE(base.dq[pr.qi(0, 5, 0, d)], 0.0);
  // The low-precision model agrees on the zeros.
  const ref::Gradients lowp = pr.grads_lowp();
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t d = 0; d < 4; ++d) EXPECT_EQ(lowp.dq[pr.qi(0, i, 0, d)], 0.0) << "i=" << i;
}

TEST(ReferenceBackward, CausalMaskedKeysGetNoGradientFromRowsThatDoNotSeeThem) {
  // Square causal: only row Sq-1 sees key Sk-1, so dV of the last key is P[Sq-1][Sk-1] * dO of the last row.
  Problem pr;
  pr.Sq = pr.Sk = 5, pr.D = 4, pr.causal = true;
  pr.randomize(5);
  const ref::Gradients gr = pr.grads();
  // P[4][4] = softmax over the last row's five scores, at its last key.
  const double scale = 0.5;
  double s[5], m = -INFINITY, l = 0;
  for (int j = 0; j < 5; ++j) {
    s[j] = 0;
    for (int d = 0; d < 4; ++d) s[j] += static_cast<double>(pr.q[pr.qi(0, 4, 0, d)]) * pr.k[pr.ki(0, j, 0, d)];
    s[j] *= scale;
    m = std::max(m, s[j]);
  }
  for (int j = 0; j < 5; ++j) l += std::exp(s[j] - m);
  const double p44 = std::exp(s[4] - m) / l;
  for (int64_t d = 0; d < 4; ++d) EXPECT_NEAR(gr.dv[pr.ki(0, 4, 0, d)], p44 * pr.g[pr.qi(0, 4, 0, d)], 1e-14);
}

// ------------------------------------------------------------------------------------------------
// GQA, layouts, threads
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, GqaEqualsRepeatedKvHeadsSummed) {
  // With each KV head repeated for its query heads (MHA), dQ is the same and dK, dV of a KV head are the sums of its
  // copies' gradients.
  for (int64_t hkv : {1, 2, 4}) {
    SCOPED_TRACE("Hkv=" + std::to_string(hkv));
    Problem gqa;
    gqa.B = 2, gqa.Sq = 5, gqa.Sk = 9, gqa.Hq = 8, gqa.Hkv = hkv, gqa.D = 8, gqa.causal = hkv != 4;
    gqa.randomize(6);
    Problem mha = gqa;
    mha.Hkv = 8;
    mha.k.assign(static_cast<size_t>(mha.B * mha.Sk * 8 * mha.D), 0.0f);
    mha.v = mha.k;
    const int64_t group = 8 / hkv;
    for (int64_t b = 0; b < mha.B; ++b)
      for (int64_t j = 0; j < mha.Sk; ++j)
        for (int64_t h = 0; h < 8; ++h)
          for (int64_t d = 0; d < mha.D; ++d) {
            mha.k[mha.ki(b, j, h, d)] = gqa.k[gqa.ki(b, j, h / group, d)];
            mha.v[mha.ki(b, j, h, d)] = gqa.v[gqa.ki(b, j, h / group, d)];
          }
    const ref::Gradients a = gqa.grads(), m = mha.grads();
    EXPECT_EQ(a.dq, m.dq);
    const double scale = std::max(max_abs(a.dk), max_abs(a.dv));
    for (int64_t b = 0; b < gqa.B; ++b)
      for (int64_t j = 0; j < gqa.Sk; ++j)
        for (int64_t g = 0; g < hkv; ++g)
          for (int64_t d = 0; d < gqa.D; ++d) {
            double dk = 0, dv = 0;
            for (int64_t h = g * group; h < (g + 1) * group; ++h) dk += m.dk[mha.ki(b, j, h, d)], dv += m.dv[mha.ki(b, j, h, d)];
            ASSERT_NEAR(a.dk[gqa.ki(b, j, g, d)], dk, 1e-13 * scale);
            ASSERT_NEAR(a.dv[gqa.ki(b, j, g, d)], dv, 1e-13 * scale);
          }
  }
}

TEST(ReferenceBackward, LayoutsAndThreadCountsGiveIdenticalResults) {
  for (auto dt : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    SCOPED_TRACE(dt);
    Problem pr;
    pr.B = 3, pr.Sq = 10, pr.Sk = 7, pr.Hq = 4, pr.Hkv = 2, pr.D = 8, pr.causal = true, pr.dtype = dt;
    pr.randomize(8);
    const ref::Gradients bshd = pr.grads(1);
    const ref::Gradients lowp = pr.grads_lowp(1);
    pr.bhsd = true;
    const ref::Gradients bhsd = pr.grads(3);
    pr.bhsd = false, pr.padded_dout = true;  // dO inside a larger buffer, NaN between its rows
    const ref::Gradients padded = pr.grads(7);
    for (const ref::Gradients* other : {&bhsd, &padded}) {
      EXPECT_EQ(other->dq, bshd.dq);
      EXPECT_EQ(other->dk, bshd.dk);
      EXPECT_EQ(other->dv, bshd.dv);
    }
    const ref::Gradients lowp_padded = pr.grads_lowp(5);
    EXPECT_EQ(lowp_padded.dq, lowp.dq);
    EXPECT_EQ(lowp_padded.dk, lowp.dk);
    EXPECT_EQ(lowp_padded.dv, lowp.dv);
  }
}

TEST(ReferenceBackward, ManyRowsAndKeysAcrossTasks) {
  // Enough rows and keys that every pass splits its work over several tasks per thread; against one thread.
  Problem pr;
  pr.B = 1, pr.Sq = 150, pr.Sk = 130, pr.Hq = 3, pr.Hkv = 1, pr.D = 16, pr.causal = true;
  pr.randomize(9);
  const ref::Gradients one = pr.grads(1), many = pr.grads(8);
  EXPECT_EQ(one.dq, many.dq);
  EXPECT_EQ(one.dk, many.dk);
  EXPECT_EQ(one.dv, many.dv);
}

// ------------------------------------------------------------------------------------------------
// head_dim_v != head_dim
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, HeadDimVMatchesFiniteDifferences) {
  // Q and K of D columns, V, O, dO and dV of DV: S = Q K^T over D, dP = dO V^T and D_i = rowsum(dO * O) over DV.
  // dv must have DV columns (the size check in expect_matches_finite_differences), and any mix-up of D and DV in the
  // reference's dot products or indexing changes some gradient by far more than the tolerance.
  struct DvCase {
    const char* name;
    int64_t B, Sq, Sk, Hq, Hkv, D, DV;
    bool causal;
    std::vector<float> sinks;
  };
  const DvCase cases[] = {
      {"d24 v16", 1, 5, 7, 2, 1, 24, 16, false, {}},
      {"d24 v16 causal, sq > sk (rows without keys)", 1, 7, 4, 2, 1, 24, 16, true, {}},
      {"d24 v16 gqa 4:2 causal", 2, 4, 6, 4, 2, 24, 16, true, {}},
      {"d3 v5 (V wider than Q)", 1, 4, 6, 2, 2, 3, 5, false, {}},
      {"d24 v16 sinks causal", 1, 5, 6, 2, 1, 24, 16, true, {0.5f, -1.0f}},
  };
  uint64_t seed = 200;
  for (const DvCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr;
    pr.B = c.B, pr.Sq = c.Sq, pr.Sk = c.Sk, pr.Hq = c.Hq, pr.Hkv = c.Hkv, pr.D = c.D, pr.DV = c.DV;
    pr.causal = c.causal, pr.sinks = c.sinks;
    pr.randomize(seed++);
    ASSERT_EQ(pr.v.size(), static_cast<size_t>(c.B * c.Sk * c.Hkv * c.DV));
    expect_matches_finite_differences(pr);
  }
}

TEST(ReferenceBackward, HeadDimVEqualsVPaddedToHeadDim) {
  // A problem with DV < D against the same problem with V and dO widened to D columns: V's extra columns random, dO's
  // zero. Those columns add exact zeros to dO . v_j and to D_i = dO . O, so dQ, dK, dL/dsinks and dV's first DV columns
  // are bit-identical, in the float64 reference and in the low-precision model, and dV's extra columns are 0.
  for (auto dt : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    SCOPED_TRACE(dt);
    Problem narrow;
    narrow.B = 2, narrow.Sq = 9, narrow.Sk = 6, narrow.Hq = 4, narrow.Hkv = 2, narrow.D = 24, narrow.DV = 16;
    narrow.causal = true, narrow.dtype = dt;
    narrow.sinks = {0.25f, -0.5f, 1.0f, 0.0f};
    narrow.randomize(13);
    Problem wide = narrow;
    wide.DV = 0;
    wide.resize();
    wide.q = narrow.q, wide.k = narrow.k;
    std::mt19937_64 rng(14);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (int64_t b = 0; b < wide.B; ++b)
      for (int64_t d = 0; d < wide.D; ++d) {
        for (int64_t j = 0; j < wide.Sk; ++j)
          for (int64_t h = 0; h < wide.Hkv; ++h) {
            const float extra = std::round(n(rng) * 64.0f) / 64.0f;
            wide.v[wide.vi(b, j, h, d)] = d < 16 ? narrow.v[narrow.vi(b, j, h, d)] : extra;
          }
        for (int64_t i = 0; i < wide.Sq; ++i)
          for (int64_t h = 0; h < wide.Hq; ++h)
            wide.g[wide.gi(b, i, h, d)] = d < 16 ? narrow.g[narrow.gi(b, i, h, d)] : 0.0f;
      }
    for (bool lowp : {false, true}) {
      SCOPED_TRACE(lowp ? "lowp" : "float64");
      narrow.bhsd = false, narrow.padded_dout = false;
      const ref::Gradients a = lowp ? narrow.grads_lowp(1) : narrow.grads(1);
      const ref::Gradients w = lowp ? wide.grads_lowp(3) : wide.grads(3);
      ASSERT_EQ(a.dq.size(), w.dq.size());
      ASSERT_EQ(a.dk.size(), w.dk.size());
      ASSERT_EQ(a.dv.size(), narrow.v.size());
      ASSERT_EQ(w.dv.size(), wide.v.size());
      EXPECT_EQ(a.dq, w.dq);
      EXPECT_EQ(a.dk, w.dk);
      EXPECT_GT(max_abs(a.dq), 0.0);
      EXPECT_GT(max_abs(a.dk), 0.0);
      for (int64_t b = 0; b < wide.B; ++b)
        for (int64_t j = 0; j < wide.Sk; ++j)
          for (int64_t h = 0; h < wide.Hkv; ++h)
            for (int64_t d = 0; d < wide.D; ++d) {
              const double want = d < 16 ? a.dv[narrow.vi(b, j, h, d)] : 0.0;
              ASSERT_EQ(w.dv[wide.vi(b, j, h, d)], want) << "b=" << b << " j=" << j << " h=" << h << " d=" << d;
            }
      // The other layouts and thread counts give the narrow problem's gradients too.
      for (int layout = 0; layout < 2; ++layout) {
        narrow.bhsd = layout == 0, narrow.padded_dout = layout == 1;
        const ref::Gradients other = lowp ? narrow.grads_lowp(5) : narrow.grads(5);
        EXPECT_EQ(other.dq, a.dq) << "layout " << layout;
        EXPECT_EQ(other.dk, a.dk) << "layout " << layout;
        EXPECT_EQ(other.dv, a.dv) << "layout " << layout;
      }
    }
    narrow.bhsd = false, narrow.padded_dout = false;
    const flashcore_attention_params pn = narrow.params(), pw = wide.params();
    const std::vector<double> ds_narrow = ref::attention_backward_sinks(pn, pn.dout);
    EXPECT_EQ(ds_narrow, ref::attention_backward_sinks(pw, pw.dout));
    EXPECT_GT(max_abs(ds_narrow), 0.0);
    // head_dim_v given as head_dim is head_dim_v = 0.
    Problem explicit_dv = wide;
    explicit_dv.DV = explicit_dv.D;
    const ref::Gradients e = explicit_dv.grads(), z = wide.grads();
    EXPECT_EQ(e.dq, z.dq);
    EXPECT_EQ(e.dk, z.dk);
    EXPECT_EQ(e.dv, z.dv);
  }
}

// ------------------------------------------------------------------------------------------------
// The low-precision model
// ------------------------------------------------------------------------------------------------

TEST(ReferenceBackward, LowPrecisionIsCloseToFloat64) {
  // Relative to the largest gradient: fp32 is float32 arithmetic only; fp16 and bf16 round O, P and dS.
  struct {
    flashcore_dtype dt;
    double tol;
  } cases[] = {{FLASHCORE_DTYPE_FP32, 1e-5}, {FLASHCORE_DTYPE_FP16, 1e-2}, {FLASHCORE_DTYPE_BF16, 5e-2}};
  for (auto c : cases) {
    SCOPED_TRACE(c.dt);
    Problem pr;
    pr.B = 1, pr.Sq = 20, pr.Sk = 50, pr.Hq = 2, pr.Hkv = 1, pr.D = 32, pr.causal = true, pr.dtype = c.dt;
    pr.randomize(10);
    const ref::Gradients exact = pr.grads(), lowp = pr.grads_lowp();
    const std::pair<const std::vector<double>*, const std::vector<double>*> pairs[] = {
        {&exact.dq, &lowp.dq}, {&exact.dk, &lowp.dk}, {&exact.dv, &lowp.dv}};
    for (const auto& [e, l] : pairs) {
      double err = 0;
      for (size_t i = 0; i < e->size(); ++i) err = std::max(err, std::fabs((*e)[i] - (*l)[i]));
      const double scale = max_abs(*e);
      ASSERT_GT(scale, 0.0);
      EXPECT_LT(err, c.tol * scale);
      if (c.dt != FLASHCORE_DTYPE_FP32) {
        EXPECT_GT(err, 0.0) << "rounding had no effect";
      }
      // Outputs of the low-precision model are representable in the dtype.
      for (double x : *l) ASSERT_EQ(static_cast<float>(x), ref::round_to_dtype(static_cast<float>(x), c.dt));
    }
  }
}

TEST(ReferenceBackward, LargeMagnitudeScoresStayFinite) {
  // bf16: inputs of 30 make gradients of about 1e6, past fp16's range (the model rounds them to the dtype).
  Problem pr;
  pr.Sq = 8, pr.Sk = 8, pr.D = 64, pr.dtype = FLASHCORE_DTYPE_BF16;
  pr.randomize(11, 30.0f);
  for (const ref::Gradients& gr : {pr.grads(), pr.grads_lowp()})
    for (const auto* t : {&gr.dq, &gr.dk, &gr.dv})
      for (double x : *t) ASSERT_TRUE(std::isfinite(x));
}

TEST(ReferenceBackward, RejectsInvalidProblems) {
  Problem pr;
  pr.randomize(12);
  flashcore_attention_params p = pr.params();
  EXPECT_THROW(ref::attention_backward(p, nullptr), std::invalid_argument);
  EXPECT_THROW(ref::attention_backward_lowp(p, nullptr), std::invalid_argument);
  p.num_heads_q = 3, p.num_heads_kv = 2;
  EXPECT_THROW(ref::attention_backward(p, p.dout), std::invalid_argument);
  p = pr.params();
  p.seqlen_k = 0;
  EXPECT_THROW(ref::attention_backward(p, p.dout), std::invalid_argument);
  p = pr.params();
  p.head_dim_v = -1;
  EXPECT_THROW(ref::attention_backward(p, p.dout), std::invalid_argument);
  EXPECT_THROW(ref::attention_backward_sinks(p, p.dout), std::invalid_argument);
}

// Tests of the CPU reference (src/reference) for the attention variants of ABI 0.5: the sliding window (local,
// window_size_left / _right), attention_chunk, softcap and sinks. Hand-computed tiny cases; the whole forward against
// an independent brute force that spells the mask out from flashcore.h's words; the sinks' log1p identity; rows
// without keys; the low-precision model; the backward against finite differences of the forward (window, chunk,
// softcap, sinks) and the sinks' own gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/finite_difference.h"
#include "reference/reference.h"

namespace ref = flashcore::reference;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The variant fields of a problem, as the C ABI spells them.
struct Variant {
  bool causal = false;
  bool local = false;
  int32_t left = 0, right = 0;
  int32_t chunk = 0;
  float softcap = 0.0f;
  std::vector<float> sinks;  // num_heads_q entries, or empty
};

// An fp32 host problem in dense (B, S, H, D) order.
struct Problem {
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hkv = 1, D = 4;
  float scale = 0.0f;
  Variant var;
  std::vector<int32_t> seqused_k;  // empty: not given
  std::vector<float> q, k, v, g;   // g: the upstream gradient dO of the backward tests

  void resize() {
    q.assign(static_cast<size_t>(B * Sq * Hq * D), 0.0f);
    g.assign(q.size(), 0.0f);
    k.assign(static_cast<size_t>(B * Sk * Hkv * D), 0.0f);
    v.assign(k.size(), 0.0f);
  }
  // N(0, amplitude) values on a grid of 2^-10, so that x +- h and x +- 2h (h = 2^-6) are exact in float.
  void randomize(uint64_t seed, float amplitude = 1.0f) {
    resize();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, amplitude);
    for (auto* t : {&q, &k, &v, &g})
      for (auto& x : *t) x = std::round(n(rng) * 1024.0f) / 1024.0f;
  }
  float& Q(int64_t b, int64_t s, int64_t h, int64_t d) { return q[static_cast<size_t>(((b * Sq + s) * Hq + h) * D + d)]; }
  float& K(int64_t b, int64_t s, int64_t h, int64_t d) { return k[static_cast<size_t>(((b * Sk + s) * Hkv + h) * D + d)]; }
  float& V(int64_t b, int64_t s, int64_t h, int64_t d) { return v[static_cast<size_t>(((b * Sk + s) * Hkv + h) * D + d)]; }

  static flashcore_tensor_strides strides(int64_t S, int64_t H, int64_t D) { return {S * H * D, H * D, D, 1}; }
  flashcore_attention_params params() const {
    flashcore_attention_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
    p.dtype = FLASHCORE_DTYPE_FP32, p.softmax_scale = scale;
    p.q_strides = p.o_strides = p.dout_strides = p.dq_strides = strides(Sq, Hq, D);
    p.k_strides = p.v_strides = p.dk_strides = p.dv_strides = strides(Sk, Hkv, D);
    p.q = q.data(), p.k = k.data(), p.v = v.data(), p.dout = g.data();
    p.seqused_k = seqused_k.empty() ? nullptr : seqused_k.data();
    p.causal = var.causal ? 1 : 0;
    p.local = var.local ? 1 : 0;
    p.window_size_left = var.left, p.window_size_right = var.right;
    p.attention_chunk = var.chunk;
    p.softcap = var.softcap;
    p.sinks = var.sinks.empty() ? nullptr : var.sinks.data();
    return p;
  }
  ref::Output run(const std::vector<int64_t>& rows = {}, int threads = 0) const {
    return ref::attention(params(), rows, threads);
  }
  double o(const ref::Output& out, int64_t b, int64_t s, int64_t h, int64_t d) const {
    return out.o[static_cast<size_t>(((b * Sq + s) * Hq + h) * D + d)];
  }
  double lse(const ref::Output& out, int64_t b, int64_t h, int64_t s) const {
    return out.lse[static_cast<size_t>((b * Hq + h) * Sq + s)];
  }
  int64_t keys_of(int64_t b) const {
    return seqused_k.empty() ? Sk : std::clamp<int64_t>(seqused_k[static_cast<size_t>(b)], 0, Sk);
  }
};

// flashcore.h's visibility rule, written out key by key (no interval arithmetic, no shared code with the reference).
bool sees(const Variant& var, int64_t i, int64_t j, int64_t Sq, int64_t keys) {
  const int64_t d = keys - Sq;
  if (j < 0 || j >= keys) return false;
  if (var.causal && j > i + d) return false;
  if (var.local) {
    if (var.left != -1 && j < i + d - var.left) return false;
    if (!var.causal && var.right != -1 && j > i + d + var.right) return false;
  }
  if (var.chunk > 0) {
    const auto floor_div = [](int64_t a, int64_t c) {
      return static_cast<int64_t>(std::floor(static_cast<long double>(a) / c));
    };
    if (floor_div(j, var.chunk) != floor_div(i + d, var.chunk)) return false;
  }
  return true;
}

// The forward by brute force in long double: the full score matrix, the mask per key, softcap and sinks by their
// formulas in flashcore.h (O = sum_j e^s_j v_j / (sum_j e^s_j + e^sink), LSE = log of that denominator).
ref::Output brute_force(Problem& pr) {
  ref::Output out;
  out.o.assign(static_cast<size_t>(pr.B * pr.Sq * pr.Hq * pr.D), 0.0);
  out.lse.assign(static_cast<size_t>(pr.B * pr.Hq * pr.Sq), 0.0);
  const long double scale = pr.scale != 0 ? pr.scale : 1.0L / std::sqrt(static_cast<long double>(pr.D));
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h) {
      const int64_t hk = h / (pr.Hq / pr.Hkv);
      const bool has_sink = !pr.var.sinks.empty();
      const long double sink = has_sink ? pr.var.sinks[static_cast<size_t>(h)] : 0.0L;
      for (int64_t i = 0; i < pr.Sq; ++i) {
        long double denom = has_sink ? std::exp(sink) : 0.0L;
        std::vector<long double> acc(static_cast<size_t>(pr.D), 0);
        bool any = false;
        for (int64_t j = 0; j < pr.Sk; ++j) {
          if (!sees(pr.var, i, j, pr.Sq, pr.keys_of(b))) continue;
          any = true;
          long double s = 0;
          for (int64_t d = 0; d < pr.D; ++d) s += static_cast<long double>(pr.Q(b, i, h, d)) * pr.K(b, j, hk, d);
          s *= scale;
          if (pr.var.softcap > 0) s = pr.var.softcap * std::tanh(s / pr.var.softcap);
          const long double e = std::exp(s);  // (the test inputs keep |s| small: no overflow without a max)
          denom += e;
          for (int64_t d = 0; d < pr.D; ++d) acc[static_cast<size_t>(d)] += e * pr.V(b, j, hk, d);
        }
        for (int64_t d = 0; d < pr.D; ++d)
          out.o[static_cast<size_t>(((b * pr.Sq + i) * pr.Hq + h) * pr.D + d)] =
              any ? static_cast<double>(acc[static_cast<size_t>(d)] / denom) : 0.0;
        out.lse[static_cast<size_t>((b * pr.Hq + h) * pr.Sq + i)] =
            any || has_sink ? static_cast<double>(std::log(denom)) : -kInf;
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

void expect_identical(const ref::Output& a, const ref::Output& b) {
  ASSERT_EQ(a.o.size(), b.o.size());
  ASSERT_EQ(a.lse.size(), b.lse.size());
  EXPECT_EQ(std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(double)), 0);
}

Variant window(bool causal, int32_t left, int32_t right) {
  Variant v;
  v.causal = causal, v.local = true, v.left = left, v.right = right;
  return v;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// visible_key_range: the rule on a few rows
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariantMask, KeyRangesOfHandPickedRows) {
  flashcore_attention_params p;
  std::memset(&p, 0, sizeof p);
  auto range = [&](int64_t sq, int64_t keys, int64_t i) {
    const ref::KeyRange r = ref::visible_key_range(p, sq, keys, i);
    return r.empty() ? std::vector<int64_t>{} : std::vector<int64_t>{r.begin, r.end};
  };
  using R = std::vector<int64_t>;
  EXPECT_EQ(range(4, 6, 1), (R{0, 6})) << "no mask: every key";
  p.causal = 1;
  EXPECT_EQ(range(4, 6, 1), (R{0, 4})) << "causal, d = 2: keys 0..3";
  EXPECT_EQ(range(6, 4, 1), R{}) << "causal, d = -2: row 1 sees nothing";
  p.local = 1, p.window_size_left = 1, p.window_size_right = 7;
  EXPECT_EQ(range(4, 6, 1), (R{2, 4})) << "causal window (1, 7): right bound 0, keys 2..3";
  p.causal = 0;
  EXPECT_EQ(range(4, 6, 1), (R{2, 6})) << "window (1, 7): keys 2..min(10, 5)";
  p.window_size_right = 0, p.window_size_left = 0;
  EXPECT_EQ(range(4, 6, 1), (R{3, 4})) << "window (0, 0): the diagonal key only";
  p.window_size_left = -1, p.window_size_right = 1;
  EXPECT_EQ(range(4, 6, 1), (R{0, 5})) << "window (-1, 1)";
  p.window_size_left = 2, p.window_size_right = -1;
  EXPECT_EQ(range(4, 6, 1), (R{1, 6})) << "window (2, -1)";
  p.local = 0, p.attention_chunk = 4;
  EXPECT_EQ(range(4, 6, 1), (R{0, 4})) << "chunk 4, diagonal key 3: chunk 0";
  EXPECT_EQ(range(4, 6, 2), (R{4, 6})) << "chunk 4, diagonal key 4: chunk 1 (keys 4..5 exist)";
  EXPECT_EQ(range(9, 4, 0), R{}) << "chunk 4, diagonal key -5: chunk -2, no key";
  EXPECT_EQ(range(9, 4, 4), R{}) << "chunk 4, diagonal key -1: chunk -1 (floor, not truncation)";
  EXPECT_EQ(range(9, 4, 5), (R{0, 4})) << "chunk 4, diagonal key 0";
  p.causal = 1;
  EXPECT_EQ(range(4, 6, 2), (R{4, 5})) << "causal chunk 4, diagonal key 4: key 4 alone";
}

// ------------------------------------------------------------------------------------------------
// The sliding window
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariants, WindowZeroZeroKeepsOnlyTheDiagonal) {
  // One visible key: P = 1, so O_i = v of the diagonal key and LSE_i = its score, exactly.
  const std::pair<int64_t, int64_t> shapes[] = {{5, 5}, {3, 5}};
  for (bool causal : {false, true})
    for (auto [sq, sk] : shapes) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + " Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk));
      Problem pr;
      pr.Sq = sq, pr.Sk = sk, pr.Hq = 2, pr.Hkv = 1, pr.D = 3, pr.scale = 0.5f;
      pr.randomize(11);
      // With causal the right bound is 0 whatever window_size_right says.
      pr.var = window(causal, 0, causal ? 9 : 0);
      const ref::Output out = pr.run();
      const int64_t d = sk - sq;
      for (int64_t h = 0; h < pr.Hq; ++h)
        for (int64_t i = 0; i < sq; ++i) {
          double s = 0;
          for (int64_t e = 0; e < pr.D; ++e) s += static_cast<double>(pr.Q(0, i, h, e)) * pr.K(0, i + d, 0, e);
          EXPECT_NEAR(pr.lse(out, 0, h, i), 0.5 * s, 1e-12) << "h=" << h << " i=" << i;
          for (int64_t e = 0; e < pr.D; ++e) EXPECT_EQ(pr.o(out, 0, i, h, e), pr.V(0, i + d, 0, e)) << "i=" << i;
        }
    }
}

TEST(ReferenceVariants, WindowOfOneKeyBackAveragesTwoKeys) {
  // Window (1, 0), every score equal (Q = 0): row i averages v_{i-1} and v_i; row 0 has v_0 alone.
  Problem pr;
  pr.Sq = pr.Sk = 4, pr.D = 2;
  pr.randomize(3);
  std::fill(pr.q.begin(), pr.q.end(), 0.0f);
  pr.var = window(true, 1, 0);
  const ref::Output out = pr.run();
  for (int64_t e = 0; e < pr.D; ++e) {
    EXPECT_EQ(pr.o(out, 0, 0, 0, e), pr.V(0, 0, 0, e));
    for (int64_t i = 1; i < 4; ++i)
      EXPECT_NEAR(pr.o(out, 0, i, 0, e), 0.5 * (pr.V(0, i - 1, 0, e) + pr.V(0, i, 0, e)), 1e-15) << "i=" << i;
  }
  EXPECT_EQ(pr.lse(out, 0, 0, 0), 0.0);
  for (int64_t i = 1; i < 4; ++i) EXPECT_NEAR(pr.lse(out, 0, 0, i), std::log(2.0), 1e-15);
}

TEST(ReferenceVariants, LeftLargerThanTheKeysIsUnbounded) {
  // A left bound past every key masks nothing: the same result as -1, and as no window at all (causal) or a
  // right-only window (not causal), bit for bit.
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Problem pr;
    pr.Sq = 7, pr.Sk = 9, pr.Hq = 2, pr.Hkv = 2;
    pr.randomize(5);
    pr.var = window(causal, 100, 2);
    const ref::Output wide = pr.run();
    pr.var.left = -1;
    expect_identical(wide, pr.run());
    if (causal) {
      pr.var = Variant{};
      pr.var.causal = true;
      expect_identical(wide, pr.run());
    }
    // ... and the right bound did mask (the test would not see a window that does nothing).
    pr.var = Variant{};
    pr.var.causal = causal;
    if (!causal) {
      EXPECT_NE(pr.run().o, wide.o);
    }
  }
}

TEST(ReferenceVariants, UnboundedWindowIsNoWindow) {
  Problem pr;
  pr.Sq = 5, pr.Sk = 8, pr.Hq = 2, pr.Hkv = 1;
  pr.randomize(6);
  const ref::Output plain = pr.run();
  pr.var = window(false, -1, -1);
  expect_identical(plain, pr.run());
}

TEST(ReferenceVariants, MatchesBruteForceOverWindowsChunksAndShapes) {
  // Windows x chunks x causal over Sq < Sk, Sq = Sk, Sq > Sk (rows above the first key), seqused_k and GQA, against
  // the brute force's key-by-key mask.
  const std::pair<int32_t, int32_t> windows[] = {{0, 0}, {1, 0}, {3, -1}, {-1, 2}, {2, 1}, {100, 7}, {-1, -1}};
  const std::pair<int64_t, int64_t> shapes[] = {{6, 6}, {4, 9}, {9, 4}, {1, 7}, {7, 1}};
  uint64_t seed = 40;
  int masked_rows = 0;
  for (auto [sq, sk] : shapes)
    for (bool causal : {false, true})
      for (int32_t chunk : {0, 3})
        for (int w = -1; w < static_cast<int>(std::size(windows)); ++w) {
          Problem pr;
          pr.B = 2, pr.Sq = sq, pr.Sk = sk, pr.Hq = 4, pr.Hkv = 2, pr.D = 3;
          pr.seqused_k = {static_cast<int32_t>(sk), static_cast<int32_t>(std::max<int64_t>(0, sk - 2))};
          pr.randomize(seed++);
          pr.var.causal = causal, pr.var.chunk = chunk;
          if (w >= 0) pr.var.local = true, pr.var.left = windows[w].first, pr.var.right = windows[w].second;
          SCOPED_TRACE("Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk) + " causal=" + std::to_string(causal) +
                       " chunk=" + std::to_string(chunk) + " window=" +
                       (w < 0 ? "none" : std::to_string(pr.var.left) + "," + std::to_string(pr.var.right)));
          const ref::Output out = pr.run();
          expect_near_all(out, brute_force(pr), 1e-12);
          for (double l : out.lse) masked_rows += std::isinf(l);
        }
  EXPECT_GT(masked_rows, 0) << "the grid must include rows that see no key";
}

// ------------------------------------------------------------------------------------------------
// attention_chunk
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariants, ChunkOfTwoAveragesTheRowsChunk) {
  // Q = 0 (equal scores), causal, chunk 2, Sq = Sk = 6: rows 0, 2, 4 start a chunk (their own key only); rows 1, 3, 5
  // average their chunk's two keys.
  Problem pr;
  pr.Sq = pr.Sk = 6, pr.D = 2;
  pr.randomize(8);
  std::fill(pr.q.begin(), pr.q.end(), 0.0f);
  pr.var.causal = true, pr.var.chunk = 2;
  const ref::Output out = pr.run();
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t e = 0; e < pr.D; ++e) {
      const double want = i % 2 == 0 ? pr.V(0, i, 0, e) : 0.5 * (pr.V(0, i - 1, 0, e) + pr.V(0, i, 0, e));
      EXPECT_NEAR(pr.o(out, 0, i, 0, e), want, 1e-15) << "i=" << i;
    }
}

TEST(ReferenceVariants, ChunkFloorsNegativeDiagonals) {
  // Sq = 5 queries over Sk = 2 keys, not causal, chunk 2: d = -3, so rows 0..2 have diagonal keys -3..-1, in chunks
  // -2 and -1 (floor division): no key. Rows 3 and 4 (diagonal keys 0 and 1) see keys 0 and 1. Truncating division
  // would put row 2 (diagonal -1) in chunk 0.
  Problem pr;
  pr.Sq = 5, pr.Sk = 2, pr.D = 2;
  pr.randomize(9);
  pr.var.chunk = 2;
  const ref::Output out = pr.run();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pr.lse(out, 0, 0, i), -kInf) << "i=" << i;
    for (int64_t e = 0; e < pr.D; ++e) EXPECT_EQ(pr.o(out, 0, i, 0, e), 0.0);
  }
  for (int64_t i = 3; i < 5; ++i) EXPECT_TRUE(std::isfinite(pr.lse(out, 0, 0, i))) << "i=" << i;
}

TEST(ReferenceVariants, ChunkAsLargeAsTheKeysChangesNothing) {
  // One chunk holding every key and every diagonal (d >= 0): the plain problem, bit for bit.
  for (bool causal : {false, true}) {
    Problem pr;
    pr.Sq = 4, pr.Sk = 6, pr.Hq = 2, pr.Hkv = 1;
    pr.randomize(12);
    pr.var.causal = causal;
    const ref::Output plain = pr.run();
    pr.var.chunk = 6;
    expect_identical(plain, pr.run());
    pr.var.chunk = 5;  // the last key in a chunk of its own: row 3 (diagonal 5) sees it alone
    EXPECT_NE(pr.run().o, plain.o);
  }
}

// ------------------------------------------------------------------------------------------------
// softcap
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariants, SoftcapIsTheTanhFormula) {
  // One query, three keys, D = 1, scale 1: scores s_j = q * k_j; capped c * tanh(s_j / c); a softmax by hand.
  Problem pr;
  pr.Sq = 1, pr.Sk = 3, pr.D = 1, pr.scale = 1.0f;
  pr.resize();
  pr.q = {2.0f};
  pr.k = {3.0f, -1.0f, 0.5f};
  pr.v = {1.0f, 10.0f, 100.0f};
  pr.var.softcap = 5.0f;
  const ref::Output out = pr.run();
  double e[3], sum = 0, num = 0;
  for (int j = 0; j < 3; ++j) {
    e[j] = std::exp(5.0 * std::tanh(2.0 * pr.k[static_cast<size_t>(j)] / 5.0));
    sum += e[j];
    num += e[j] * pr.v[static_cast<size_t>(j)];
  }
  EXPECT_NEAR(pr.o(out, 0, 0, 0, 0), num / sum, 1e-13);
  EXPECT_NEAR(pr.lse(out, 0, 0, 0), std::log(sum), 1e-14);
  // The cap changes the answer (scores 6, -2, 1 are not small against 5).
  pr.var.softcap = 0.0f;
  EXPECT_GT(std::fabs(pr.o(pr.run(), 0, 0, 0, 0) - num / sum), 1.0);
}

TEST(ReferenceVariants, SoftcapBoundsTheScores) {
  // Scores in the thousands, capped at 30: LSE <= 30 + log(keys), and the result is the brute force's.
  Problem pr;
  pr.Sq = 4, pr.Sk = 5, pr.Hq = 2, pr.Hkv = 2, pr.D = 8;
  pr.randomize(13, 40.0f);
  pr.var.softcap = 30.0f;
  const ref::Output out = pr.run();
  for (double l : out.lse) {
    EXPECT_TRUE(std::isfinite(l));
    EXPECT_LE(l, 30.0 + std::log(5.0) + 1e-12);
  }
  expect_near_all(out, brute_force(pr), 1e-10);
}

TEST(ReferenceVariants, SoftcapAndWindowAndSinksTogetherMatchBruteForce) {
  Problem pr;
  pr.B = 2, pr.Sq = 6, pr.Sk = 8, pr.Hq = 4, pr.Hkv = 2, pr.D = 4;
  pr.randomize(14, 2.0f);
  pr.var = window(false, 2, 1);
  pr.var.softcap = 3.0f;
  pr.var.chunk = 5;
  pr.var.sinks = {0.5f, -1.0f, 2.0f, -30.0f};
  expect_near_all(pr.run(), brute_force(pr), 1e-12);
  pr.var.causal = true;
  expect_near_all(pr.run(), brute_force(pr), 1e-12);
}

// ------------------------------------------------------------------------------------------------
// sinks
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariants, SinksAddLog1pToLseAndScaleO) {
  // With Z the denominator without the sink: LSE' = log(Z + e^t) = LSE + log1p(e^(t - LSE)), and
  // O' = O * Z / (Z + e^t) = O * exp(LSE - LSE'). Per query head h its own t = sinks[h] (GQA: two heads per KV head).
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Problem pr;
    pr.B = 2, pr.Sq = 5, pr.Sk = 7, pr.Hq = 4, pr.Hkv = 2, pr.D = 4;
    pr.randomize(15);
    pr.var.causal = causal;
    const ref::Output plain = pr.run();
    pr.var.sinks = {0.0f, 1.5f, -2.0f, 6.0f};
    const ref::Output with = pr.run();
    for (int64_t b = 0; b < pr.B; ++b)
      for (int64_t h = 0; h < pr.Hq; ++h)
        for (int64_t i = 0; i < pr.Sq; ++i) {
          const double l = pr.lse(plain, b, h, i), t = pr.var.sinks[static_cast<size_t>(h)];
          const double want = l + std::log1p(std::exp(t - l));
          EXPECT_NEAR(pr.lse(with, b, h, i), want, 1e-13 * std::max(1.0, std::fabs(want))) << "h=" << h << " i=" << i;
          for (int64_t d = 0; d < pr.D; ++d)
            EXPECT_NEAR(pr.o(with, b, i, h, d), pr.o(plain, b, i, h, d) * std::exp(l - want), 1e-13);
        }
  }
}

TEST(ReferenceVariants, SinkOfMinusInfinityIsNoSink) {
  Problem pr;
  pr.Sq = 4, pr.Sk = 4, pr.Hq = 2, pr.Hkv = 1;
  pr.randomize(16);
  pr.var.causal = true;
  const ref::Output plain = pr.run();
  pr.var.sinks = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  expect_identical(plain, pr.run());
}

TEST(ReferenceVariants, HugeSinkTakesTheWholeRowWithoutOverflow) {
  // e^1000 overflows a double: the reference must keep the sink inside its running maximum. O -> 0, LSE = 1000.
  Problem pr;
  pr.Sq = 2, pr.Sk = 3;
  pr.randomize(17);
  pr.var.sinks = {1000.0f};
  const ref::Output out = pr.run();
  for (double x : out.o) EXPECT_LT(std::fabs(x), 1e-300);
  for (double l : out.lse) EXPECT_DOUBLE_EQ(l, 1000.0);
}

TEST(ReferenceVariants, RowWithoutKeysGivesZeroAndTheSinkOrMinusInfinity) {
  // Causal, Sq = 4 > Sk = 2: rows 0 and 1 see no key. Window (0, 0) with seqused_k = 0 for the second batch entry:
  // none of its rows sees a key.
  Problem pr;
  pr.B = 2, pr.Sq = 4, pr.Sk = 2, pr.Hq = 2, pr.Hkv = 1;
  pr.seqused_k = {2, 0};
  pr.randomize(18);
  pr.var = window(true, 0, 0);
  for (bool sinks : {false, true}) {
    SCOPED_TRACE(sinks ? "sinks" : "no sinks");
    pr.var.sinks = sinks ? std::vector<float>{0.25f, -3.0f} : std::vector<float>{};
    const ref::Output out = pr.run();
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 4; ++i) {
          const bool empty = b == 1 || i < 2;
          if (!empty) {
            EXPECT_TRUE(std::isfinite(pr.lse(out, b, h, i)));
            continue;
          }
          EXPECT_EQ(pr.lse(out, b, h, i), sinks ? static_cast<double>(pr.var.sinks[static_cast<size_t>(h)]) : -kInf)
              << "b=" << b << " h=" << h << " i=" << i;
          for (int64_t d = 0; d < pr.D; ++d) EXPECT_EQ(pr.o(out, b, i, h, d), 0.0);
        }
  }
}

// ------------------------------------------------------------------------------------------------
// Rows, threads, the low-precision model, invalid problems
// ------------------------------------------------------------------------------------------------

TEST(ReferenceVariants, RowSubsetAndThreadCountsDoNotMatter) {
  Problem pr;
  pr.B = 2, pr.Sq = 40, pr.Sk = 50, pr.Hq = 4, pr.Hkv = 2, pr.D = 8;
  pr.randomize(19);
  pr.var = window(true, 7, 0);
  pr.var.chunk = 16, pr.var.softcap = 4.0f, pr.var.sinks = {0.1f, 0.2f, 0.3f, 0.4f};
  const ref::Output all = pr.run({}, 1);
  expect_identical(all, pr.run({}, 3));
  const std::vector<int64_t> rows = {0, 13, 39};
  const ref::Output some = pr.run(rows, 2);
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h)
      for (int64_t i : rows) {
        EXPECT_EQ(pr.lse(some, b, h, i), pr.lse(all, b, h, i));
        for (int64_t d = 0; d < pr.D; ++d) EXPECT_EQ(pr.o(some, b, i, h, d), pr.o(all, b, i, h, d));
      }
}

TEST(ReferenceVariants, LowPrecisionIsCloseToFloat64) {
  Problem pr;
  pr.B = 1, pr.Sq = 30, pr.Sk = 45, pr.Hq = 2, pr.Hkv = 1, pr.D = 16;
  pr.randomize(20, 2.0f);
  pr.var = window(false, 9, 4);
  pr.var.softcap = 5.0f, pr.var.sinks = {1.0f, -1.0f}, pr.var.chunk = 20;
  flashcore_attention_params p = pr.params();
  // bf16 storage, as a kernel's inputs: the model rounds P to bf16 and O at the end.
  std::vector<uint16_t> q16(pr.q.size()), k16(pr.k.size()), v16(pr.v.size());
  for (size_t i = 0; i < q16.size(); ++i) q16[i] = ref::float_to_bf16(pr.q[i]);
  for (size_t i = 0; i < k16.size(); ++i) k16[i] = ref::float_to_bf16(pr.k[i]), v16[i] = ref::float_to_bf16(pr.v[i]);
  p.q = q16.data(), p.k = k16.data(), p.v = v16.data(), p.dtype = FLASHCORE_DTYPE_BF16;
  auto errors = [](const flashcore_attention_params& problem, double& o_err, double& lse_err) {
    const ref::Output exact = ref::attention(problem), lowp = ref::attention_lowp(problem);
    o_err = lse_err = 0;
    for (size_t i = 0; i < exact.o.size(); ++i) o_err = std::max(o_err, std::fabs(exact.o[i] - lowp.o[i]));
    for (size_t i = 0; i < exact.lse.size(); ++i) lse_err = std::max(lse_err, std::fabs(exact.lse[i] - lowp.lse[i]));
  };
  double o_err = 0, lse_err = 0;
  errors(p, o_err, lse_err);
  EXPECT_GT(o_err, 0.0) << "the model rounds";
  EXPECT_LT(o_err, 0.05);
  // The model's tanh has fp16's precision (a kernel's tanh.approx.f32): each capped score is off by up to
  // softcap * 2^-12, and so is the LSE, but no more.
  EXPECT_GT(lse_err, 1e-5) << "the model's tanh is rounded";
  EXPECT_LT(lse_err, 5.0 * 0x1p-11);
  // fp32 inputs: no rounding anywhere, tanh included.
  p = pr.params();
  errors(p, o_err, lse_err);
  EXPECT_LT(o_err, 1e-5);
  EXPECT_LT(lse_err, 1e-5);
}

TEST(ReferenceVariants, RejectsInvalidVariantFields) {
  Problem pr;
  pr.Sq = 2, pr.Sk = 2, pr.Hq = 2, pr.Hkv = 1;
  pr.randomize(21);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> bad_sinks[] = {{0.0f, nan}, {inf, 0.0f}};
  auto expect_throws = [&](const char* what, auto&& mutate) {
    SCOPED_TRACE(what);
    Problem bad = pr;
    mutate(bad.var);
    EXPECT_THROW(bad.run(), std::invalid_argument);
  };
  {
    SCOPED_TRACE("local = 2");
    flashcore_attention_params p = pr.params();
    p.local = 2;
    EXPECT_THROW(ref::attention(p), std::invalid_argument);
  }
  expect_throws("window_size_left = -2", [](Variant& v) { v = window(false, -2, 0); });
  expect_throws("window_size_right = -2", [](Variant& v) { v = window(false, 0, -2); });
  expect_throws("softcap = -1", [](Variant& v) { v.softcap = -1.0f; });
  expect_throws("softcap = NaN", [&](Variant& v) { v.softcap = nan; });
  expect_throws("softcap = inf", [&](Variant& v) { v.softcap = inf; });
  expect_throws("attention_chunk = -1", [](Variant& v) { v.chunk = -1; });
  expect_throws("sinks NaN", [&](Variant& v) { v.sinks = bad_sinks[0]; });
  expect_throws("sinks +inf", [&](Variant& v) { v.sinks = bad_sinks[1]; });
  // With causal the right bound is not read (the library does not read it either): any value means 0.
  Problem ok = pr;
  ok.var = window(true, 1, 0);
  const ref::Output want = ok.run();
  ok.var.right = -5;
  EXPECT_NO_THROW(expect_identical(ok.run(), want));
}

// ------------------------------------------------------------------------------------------------
// The backward: finite differences of the forward, the sinks' gradient, the low-precision model
// ------------------------------------------------------------------------------------------------

namespace {

// L = sum(O * G) through the forward reference (one thread: it runs hundreds of times per test).
double loss(const Problem& pr) {
  const ref::Output out = ref::attention(pr.params(), {}, 1);
  double l = 0;
  for (size_t i = 0; i < out.o.size(); ++i) l += out.o[i] * static_cast<double>(pr.g[i]);
  return l;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::fabs(e));
  return m;
}

// The five-point central difference of L in one float of the problem (finite_difference.h).
double finite_difference(Problem& pr, float& x) {
  return ::finite_difference(x, [&] { return loss(pr); });
}

void expect_matches_finite_differences(Problem& pr, double tol = 2e-6) {
  const flashcore_attention_params p = pr.params();
  const ref::Gradients an = ref::attention_backward(p, pr.g.data());
  const double scale = std::max({1.0, max_abs(an.dq), max_abs(an.dk), max_abs(an.dv)});
  struct Tensor {
    const char* name;
    std::vector<float>* x;
    const std::vector<double>* grad;
  } tensors[] = {{"dq", &pr.q, &an.dq}, {"dk", &pr.k, &an.dk}, {"dv", &pr.v, &an.dv}};
  for (const Tensor& t : tensors)
    for (size_t i = 0; i < t.x->size(); ++i)
      ASSERT_NEAR((*t.grad)[i], finite_difference(pr, (*t.x)[i]), tol * scale) << t.name << " index " << i;
  if (!pr.var.sinks.empty()) {
    const std::vector<double> dsinks = ref::attention_backward_sinks(p, pr.g.data());
    ASSERT_EQ(dsinks.size(), pr.var.sinks.size());
    for (size_t h = 0; h < dsinks.size(); ++h)
      EXPECT_NEAR(dsinks[h], finite_difference(pr, pr.var.sinks[h]), tol * std::max(1.0, std::fabs(dsinks[h])))
          << "dsinks[" << h << "]";
  }
}

}  // namespace

TEST(ReferenceVariantsBackward, MatchesFiniteDifferences) {
  struct FdCase {
    const char* name;
    int64_t Sq, Sk;
    Variant var;
    float amplitude;
  };
  Variant capped;
  capped.softcap = 2.0f;
  Variant capped_causal = capped;
  capped_causal.causal = true;
  Variant chunked;
  chunked.causal = true, chunked.chunk = 3;
  Variant chunked_full;
  chunked_full.chunk = 4;
  Variant sinks;
  sinks.sinks = {0.5f, -1.0f, 1.5f, 0.0f};
  Variant sinks_window = window(true, 1, 0);
  sinks_window.sinks = {0.5f, -1.0f, 1.5f, 0.0f};
  Variant everything = window(false, 2, 1);
  everything.softcap = 1.5f, everything.chunk = 5, everything.sinks = {-0.5f, 0.0f, 2.0f, 1.0f};
  const FdCase cases[] = {
      {"window (1, 0) causal", 6, 6, window(true, 1, 0), 1.0f},
      {"window (2, 1)", 5, 7, window(false, 2, 1), 1.0f},
      {"window (0, 0), Sq > Sk", 7, 4, window(false, 0, 0), 1.0f},
      {"window (-1, 1)", 4, 6, window(false, -1, 1), 1.0f},
      {"chunk 3 causal", 7, 7, chunked, 1.0f},
      {"chunk 4, Sq > Sk", 6, 3, chunked_full, 1.0f},
      {"softcap 2 (scores well past it)", 5, 6, capped, 3.0f},
      {"softcap 2 causal", 6, 4, capped_causal, 3.0f},
      {"sinks", 4, 5, sinks, 1.0f},
      {"sinks, window, rows without keys", 6, 4, sinks_window, 1.0f},
      {"window, softcap, chunk and sinks", 6, 8, everything, 2.0f},
  };
  uint64_t seed = 300;
  for (const FdCase& c : cases) {
    SCOPED_TRACE(c.name);
    Problem pr;
    pr.Sq = c.Sq, pr.Sk = c.Sk, pr.Hq = 4, pr.Hkv = 2, pr.D = 3;
    pr.var = c.var;
    pr.randomize(seed++, c.amplitude);
    expect_matches_finite_differences(pr);
  }
}

TEST(ReferenceVariantsBackward, WindowedKeysGetNoGradientFromRowsThatDoNotSeeThem) {
  // Window (0, 0): each row sees its diagonal key alone, so P = 1, dS = 0 and dQ = dK = 0; dV_j = dO of the rows whose
  // diagonal is j (summed over the query heads of the group).
  Problem pr;
  pr.Sq = 4, pr.Sk = 6, pr.Hq = 2, pr.Hkv = 1, pr.D = 3;
  pr.randomize(31);
  pr.var = window(false, 0, 0);
  const ref::Gradients gr = ref::attention_backward(pr.params(), pr.g.data());
  for (double x : gr.dq) EXPECT_EQ(x, 0.0);
  for (double x : gr.dk) EXPECT_EQ(x, 0.0);
  for (int64_t j = 0; j < 6; ++j)
    for (int64_t d = 0; d < pr.D; ++d) {
      double want = 0;
      if (j >= 2)
        for (int64_t h = 0; h < 2; ++h) want += pr.g[static_cast<size_t>(((j - 2) * pr.Hq + h) * pr.D + d)];
      EXPECT_EQ(gr.dv[static_cast<size_t>(j * pr.D + d)], want) << "j=" << j;
    }
}

TEST(ReferenceVariantsBackward, SinksGradientIsZeroWithoutSinksAndOnRowsWithoutKeys) {
  Problem pr;
  pr.Sq = 3, pr.Sk = 1, pr.Hq = 2, pr.Hkv = 1;
  pr.randomize(32);
  pr.var.causal = true;  // rows 0 and 1 see no key; row 2 sees key 0
  for (double x : ref::attention_backward_sinks(pr.params(), pr.g.data())) EXPECT_EQ(x, 0.0);
  // One key: O_i = v_0 (1 - P_sink), so dL/dsink = -P_sink (1 - P_sink) (g_2 . v_0), from row 2 alone.
  pr.var.sinks = {0.3f, -std::numeric_limits<float>::infinity()};
  const std::vector<double> ds = ref::attention_backward_sinks(pr.params(), pr.g.data());
  double s = 0, gv = 0;
  for (int64_t d = 0; d < pr.D; ++d) {
    s += static_cast<double>(pr.Q(0, 2, 0, d)) * pr.K(0, 0, 0, d);
    gv += static_cast<double>(pr.g[static_cast<size_t>((2 * pr.Hq + 0) * pr.D + d)]) * pr.V(0, 0, 0, d);
  }
  s /= std::sqrt(static_cast<double>(pr.D));
  const double t = static_cast<double>(0.3f);
  const double p_sink = std::exp(t) / (std::exp(t) + std::exp(s));
  EXPECT_NEAR(ds[0], -p_sink * (1 - p_sink) * gv, 1e-14);
  EXPECT_EQ(ds[1], 0.0) << "a -inf sink takes no share";
}

TEST(ReferenceVariantsBackward, LowPrecisionIsCloseToFloat64) {
  Problem pr;
  pr.Sq = 24, pr.Sk = 30, pr.Hq = 2, pr.Hkv = 1, pr.D = 16;
  pr.randomize(33, 2.0f);
  pr.var = window(true, 8, 0);
  pr.var.softcap = 4.0f, pr.var.sinks = {0.5f, 1.0f}, pr.var.chunk = 16;
  const flashcore_attention_params p = pr.params();
  const ref::Gradients exact = ref::attention_backward(p, pr.g.data()), lowp = ref::attention_backward_lowp(p, pr.g.data());
  // fp32 storage: the model computes in float32 without rounding P or dS, so it is close to float64.
  auto rel = [](const std::vector<double>& a, const std::vector<double>& b) {
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]));
    return e / std::max(1e-30, max_abs(b));
  };
  EXPECT_LT(rel(lowp.dq, exact.dq), 1e-5);
  EXPECT_LT(rel(lowp.dk, exact.dk), 1e-5);
  EXPECT_LT(rel(lowp.dv, exact.dv), 1e-5);
  EXPECT_GT(max_abs(exact.dq), 0.0);
}

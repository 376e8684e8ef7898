// The 8-bit (e4m3) forward path on the GPU: e4m3 Q, K, V with per-(batch, KV head) descales against the float64
// reference (src/reference) of the dequantized inputs, and precision = FP8 (16-bit inputs quantized by the library)
// against the float64 reference of the unquantized inputs.
//
// Tolerances (P, the softmax probabilities, is rounded to e4m3 before the P*V product, as in FlashAttention-3's FP8
// path, so O carries an error of ~1-3% of its RMS):
//   e4m3 inputs:      relative RMSE of O <= 0.035, max |O - ref| <= 0.08 * max |ref| + 1e-2,
//                     |LSE - ref| <= 2e-2 + 2e-3 * |ref| (scores are exact products of e4m3 values, accumulated by
//                     the tensor cores; the LSE sums the unrounded P)
//   precision = FP8:  relative RMSE of O <= 0.07, max |O - ref| <= 0.2 * max |ref| + 2e-2, |LSE - ref| <= 0.25
//                     (the scores of quantized Q and K are off by up to a few percent of themselves)
//   precision = INT8: relative RMSE of O <= 0.025, max |O - ref| <= 0.08 * max |ref| + 1e-2, |LSE - ref| <= 0.1
//                     (int8 Q per token and K per 128 keys: scores off by ~1% of their spread; P V in 16 bits)
// Every case also requires: O and LSE poisoned (0xFF bytes: NaN) before each call and every element written, O
// finite, O = 0 and LSE = -inf exactly on rows that see no key (causal, seqlen_q > seqlen_k), the padding between
// O's heads untouched, and two runs bit-identical. A CPU-only part (E4m3Codec, Fp8Harness) checks the e4m3 codec
// against cuda_fp8.h and the comparison itself against an emulation of such a kernel.
//
// Without a GPU served by the sm90 backend, or without e4m3 kernels for a head dim in this build, the GPU tests
// skip with the reason. Seeds: fixed per case name; FLASHCORE_SEED=<n> changes the base.
#include <gtest/gtest.h>

#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "check/check.h"
#include "check/check_fp8.h"
#include "flashcore/flashcore.h"
#include "gpu_skip.h"
#include "reference/reference.h"

namespace {

namespace ref = flashcore::reference;

// The exact host e4m3 codec and the skip reason are the check library's (src/check/check_fp8.h), which `flashcore
// check` uses too.
using flashcore::check::fp8::e4m3_to_float;
using flashcore::check::fp8::float_to_e4m3;
using flashcore::check::fp8::float_to_fp8;
using flashcore::check::fp8::fp8_to_float;

// ------------------------------------------------------------------------------------------------
// Problems
// ------------------------------------------------------------------------------------------------
enum class Fill {
  kNormal,     // e4m3 ~ N(0, sigma^2) (saturated); 16-bit inputs ~ N(0, 1)
  kZeroBlock,  // kNormal, and in batch 0: Q rows 0..63 zero, K rows 0..127 of KV head 0 zero, V of the last KV head zero
  kHugeRange,  // e4m3 codes drawn over the whole finite range, a quarter of them +-448; every descale 64
};

struct Problem {
  std::string name;
  int64_t B = 1, Sq = 128, Sk = 128, Hq = 2, Hkv = 2, D = 128;
  bool causal = false;
  flashcore_dtype in = FLASHCORE_DTYPE_FP8_E4M3;  // or FP8_E5M2; FP16 / BF16 with precision = FP8
  int32_t precision = FLASHCORE_PRECISION_NATIVE;
  flashcore_dtype out = FLASHCORE_DTYPE_BF16;  // O's dtype
  bool out_same = false;                       // pass out_dtype = SAME (then `out` must be what SAME means)
  bool bhsd = false;                           // (B, H, S, D) instead of (B, S, H, D)
  int64_t in_pad = 0, out_pad = 0;             // extra elements between heads (Q/K/V: multiple of 16; O: of 8)
  bool lse = true;
  float softmax_scale = 0.0f;
  float sigma = 32.0f;              // spread of the e4m3 values
  float descale_unit = 1.0f / 32;   // descales = unit * k / 64, k uniform in [32, 128]: real values ~ N(0, 1) * [0.5, 2]
  bool null_descales = false;       // pass NULL descales (real values = the e4m3 values)
  Fill fill = Fill::kNormal;
  const char* kernel_config = nullptr;
};

bool eight_bit(const Problem& p) { return p.in == FLASHCORE_DTYPE_FP8_E4M3 || p.in == FLASHCORE_DTYPE_FP8_E5M2; }
int64_t in_bytes(const Problem& p) { return eight_bit(p) ? 1 : 2; }

std::string describe(const Problem& p) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s%s -> %s B=%lld Hq=%lld Hkv=%lld Sq=%lld Sk=%lld D=%lld%s%s%s%s%s%s",
                p.in == FLASHCORE_DTYPE_FP8_E4M3   ? "e4m3"
                : p.in == FLASHCORE_DTYPE_FP8_E5M2 ? "e5m2"
                : p.in == FLASHCORE_DTYPE_BF16     ? "bf16"
                                                   : "fp16",
                p.precision == FLASHCORE_PRECISION_FP8    ? " (precision=FP8)"
                : p.precision == FLASHCORE_PRECISION_INT8 ? " (precision=INT8)"
                                                          : "",
                p.out == FLASHCORE_DTYPE_BF16 ? "bf16" : "fp16", static_cast<long long>(p.B),
                static_cast<long long>(p.Hq), static_cast<long long>(p.Hkv), static_cast<long long>(p.Sq),
                static_cast<long long>(p.Sk), static_cast<long long>(p.D), p.causal ? " causal" : "",
                p.bhsd ? " bhsd" : " bshd", p.in_pad || p.out_pad ? " padded" : "", p.lse ? "" : " no-lse",
                p.null_descales ? " null-descales" : "",
                p.fill == Fill::kZeroBlock ? " zero-block" : p.fill == Fill::kHugeRange ? " huge-range" : "");
  std::string s = buf;
  if (p.kernel_config) s += std::string(" config=") + p.kernel_config;
  return s;
}

flashcore_tensor_strides strides_of(const Problem& p, int64_t S, int64_t H, int64_t pad) {
  const int64_t row = p.D + pad;
  if (p.bhsd) return {H * S * row, row, S * row, 1};
  return {S * H * row, H * row, row, 1};
}

int64_t offset(const flashcore_tensor_strides& s, int64_t b, int64_t i, int64_t h, int64_t d) {
  return b * s.batch + i * s.seq + h * s.head + d;
}

int64_t extent(const flashcore_tensor_strides& s, int64_t B, int64_t S, int64_t H, int64_t D) {
  return offset(s, B - 1, S - 1, H - 1, D - 1) + 1;
}

// Keys query row i sees (causal: bottom-right aligned).
int64_t visible_keys(const Problem& p, int64_t i) {
  if (!p.causal) return p.Sk;
  return std::clamp<int64_t>(i + p.Sk - p.Sq + 1, 0, p.Sk);
}

// The inputs on the host: the bytes of Q, K, V in their layout (padding: e4m3 NaN / 16-bit NaN, which a kernel that
// reads it would carry into O), the descales, and the real values dense (B, S, H, D) for the reference.
struct HostData {
  flashcore_tensor_strides qs{}, ks{}, vs{}, os{};
  int64_t q_ext = 0, kv_ext = 0, o_ext = 0;
  std::vector<uint8_t> q, k, v;    // in_bytes per element
  std::vector<float> qd, kd, vd;   // (B, Hkv); empty with null_descales or 16-bit inputs
  std::vector<float> qf, kf, vf;   // real values, dense BSHD
};

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint16_t to_16bit(float x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
}
float from_16bit(uint16_t x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x);
}

HostData make_inputs(const Problem& p, uint64_t seed) {
  HostData h;
  h.qs = strides_of(p, p.Sq, p.Hq, p.in_pad);
  h.ks = h.vs = strides_of(p, p.Sk, p.Hkv, p.in_pad);
  h.os = strides_of(p, p.Sq, p.Hq, p.out_pad);
  h.q_ext = extent(h.qs, p.B, p.Sq, p.Hq, p.D);
  h.kv_ext = extent(h.ks, p.B, p.Sk, p.Hkv, p.D);
  h.o_ext = extent(h.os, p.B, p.Sq, p.Hq, p.D);
  const int64_t eb = in_bytes(p);
  const uint8_t pad_byte = eight_bit(p) ? 0x7F : 0xFF;  // NaN in e4m3 and e5m2; 0xFFFF is NaN in fp16 and bf16
  h.q.assign(static_cast<size_t>(h.q_ext * eb), pad_byte);
  h.k.assign(static_cast<size_t>(h.kv_ext * eb), pad_byte);
  h.v.assign(static_cast<size_t>(h.kv_ext * eb), pad_byte);
  h.qf.assign(static_cast<size_t>(p.B * p.Sq * p.Hq * p.D), 0.0f);
  h.kf.assign(static_cast<size_t>(p.B * p.Sk * p.Hkv * p.D), 0.0f);
  h.vf.assign(h.kf.size(), 0.0f);

  std::mt19937_64 rng(splitmix(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k64(32, 128), any_code(0, 253), coin(0, 3);
  const int64_t group = p.Hq / p.Hkv;
  if (eight_bit(p) && !p.null_descales) {
    for (std::vector<float>* d : {&h.qd, &h.kd, &h.vd}) {
      d->resize(static_cast<size_t>(p.B * p.Hkv));
      for (float& x : *d) x = p.fill == Fill::kHugeRange ? 64.0f : p.descale_unit * static_cast<float>(k64(rng)) / 64.0f;
    }
  }
  auto descale_of = [&](const std::vector<float>& d, int64_t b, int64_t hkv) {
    return d.empty() ? 1.0f : d[static_cast<size_t>(b * p.Hkv + hkv)];
  };
  // One tensor: draw every element (in storage order of the dense index, so layouts share values), store it in the
  // layout, keep its real value.
  auto fill = [&](int t, int64_t S, int64_t H, const flashcore_tensor_strides& st, std::vector<uint8_t>& bytes,
                  std::vector<float>& real, const std::vector<float>& descale) {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t hh = 0; hh < H; ++hh) {
          const int64_t hkv = t == 0 ? hh / group : hh;
          bool zero = false;
          if (p.fill == Fill::kZeroBlock && b == 0) {
            zero = (t == 0 && i < 64) || (t == 1 && i < 128 && hkv == 0) || (t == 2 && hkv == p.Hkv - 1);
          }
          for (int64_t d = 0; d < p.D; ++d) {
            const size_t at = static_cast<size_t>(offset(st, b, i, hh, d));
            const size_t dense = static_cast<size_t>(((b * S + i) * H + hh) * p.D + d);
            float value = 0.0f;
            if (eight_bit(p)) {
              uint8_t code = 0;
              if (p.fill == Fill::kHugeRange) {
                const int c = any_code(rng);  // 0..253: skip the NaN codes 0x7F and 0xFF
                code = static_cast<uint8_t>(c < 127 ? c : c + 1);
                if (coin(rng) == 0) code = (code & 0x80) | 0x7E;
              } else {
                code = float_to_fp8(p.sigma * normal(rng), p.in);
              }
              if (zero) code = 0;
              bytes[at] = code;
              value = fp8_to_float(code, p.in) * descale_of(descale, b, hkv);
            } else {
              const uint16_t x = zero ? uint16_t{0} : to_16bit(normal(rng), p.in);
              std::memcpy(&bytes[at * 2], &x, 2);
              value = from_16bit(x, p.in);
            }
            real[dense] = value;
          }
        }
  };
  fill(0, p.Sq, p.Hq, h.qs, h.q, h.qf, h.qd);
  fill(1, p.Sk, p.Hkv, h.ks, h.k, h.kf, h.kd);
  fill(2, p.Sk, p.Hkv, h.vs, h.v, h.vf, h.vd);
  return h;
}

// ------------------------------------------------------------------------------------------------
// The comparison
// ------------------------------------------------------------------------------------------------
struct Tolerance {
  double rel_rmse, max_rel, max_abs, lse_abs, lse_rel;
};
constexpr Tolerance kTol8Bit{0.035, 0.08, 1e-2, 2e-2, 2e-3};
constexpr Tolerance kTolPrecisionFp8{0.07, 0.2, 2e-2, 0.25, 0.0};
constexpr Tolerance kTolPrecisionInt8{0.025, 0.08, 1e-2, 0.1, 0.0};

Tolerance tolerance_of(const Problem& p) {
  if (p.precision == FLASHCORE_PRECISION_INT8) return kTolPrecisionInt8;
  return p.precision == FLASHCORE_PRECISION_FP8 ? kTolPrecisionFp8 : kTol8Bit;
}

struct Verdict {
  double rel_rmse = 0, max_err = 0, max_ref = 0, lse_err = 0, lse_excess = 0;  // lse_excess: max err / its tolerance
  int64_t rows = 0, unwritten = 0, nonfinite = 0, masked_bad = 0, pad_written = 0, lse_bad = 0;
  std::string first;  // the first whole-buffer problem
  bool passed = false;
  std::string why;    // every failed rule
};

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

// o: the O buffer (h.o_ext 16-bit elements of p.out, padding included); lse: (B, Hq, Sq) or empty.
Verdict compare(const Problem& p, const HostData& h, const std::vector<uint16_t>& o, const std::vector<float>& lse,
                uint64_t seed) {
  Verdict v;
  const Tolerance tol = tolerance_of(p);
  auto note = [&](const std::string& s) {
    if (v.first.empty()) v.first = s;
  };
  // Whole buffers: every element written and finite, masked rows exact, O's padding untouched.
  std::vector<bool> in_tensor(static_cast<size_t>(h.o_ext), false);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t i = 0; i < p.Sq; ++i) {
      const bool masked = visible_keys(p, i) == 0;
      for (int64_t hh = 0; hh < p.Hq; ++hh) {
        for (int64_t d = 0; d < p.D; ++d) {
          const size_t at = static_cast<size_t>(offset(h.os, b, i, hh, d));
          in_tensor[at] = true;
          const float x = from_16bit(o[at], p.out);
          if (o[at] == 0xFFFF) {
            ++v.unwritten;
            note("O unwritten at b=" + std::to_string(b) + " row=" + std::to_string(i) + " h=" + std::to_string(hh));
          } else if (!std::isfinite(x)) {
            ++v.nonfinite;
            note("O non-finite at b=" + std::to_string(b) + " row=" + std::to_string(i) + " h=" + std::to_string(hh));
          } else if (masked && x != 0.0f) {
            ++v.masked_bad;
            note("O nonzero on a row that sees no key: row " + std::to_string(i));
          }
        }
        if (!p.lse) continue;
        const float l = lse[static_cast<size_t>((b * p.Hq + hh) * p.Sq + i)];
        if (masked ? l != -std::numeric_limits<float>::infinity() : !std::isfinite(l)) {
          ++v.lse_bad;
          note("LSE " + fmt(l) + " at b=" + std::to_string(b) + " h=" + std::to_string(hh) + " row=" +
               std::to_string(i) + (masked ? " (a row that sees no key: want -inf)" : ""));
        }
      }
    }
  for (size_t at = 0; at < in_tensor.size(); ++at) {
    if (!in_tensor[at] && o[at] != 0xFFFF) {
      ++v.pad_written;
      note("O's padding written at element " + std::to_string(at));
    }
  }

  // The reference on the checked rows (every row of small problems, 64 of large ones).
  flashcore::check::Case c;
  c.seqlen_q = p.Sq, c.seqlen_k = p.Sk, c.causal = p.causal;
  std::vector<int64_t> rows = flashcore::check::checked_rows(c, seed);
  flashcore_attention_params host;
  flashcore_attention_params_init(&host);
  host.q = h.qf.data(), host.k = h.kf.data(), host.v = h.vf.data();
  host.q_strides = {p.Sq * p.Hq * p.D, p.Hq * p.D, p.D, 1};
  host.k_strides = host.v_strides = {p.Sk * p.Hkv * p.D, p.Hkv * p.D, p.D, 1};
  host.batch = p.B, host.seqlen_q = p.Sq, host.seqlen_k = p.Sk, host.num_heads_q = p.Hq, host.num_heads_kv = p.Hkv;
  host.head_dim = p.D, host.dtype = FLASHCORE_DTYPE_FP32, host.causal = p.causal ? 1 : 0;
  host.softmax_scale = p.softmax_scale;
  const ref::Output r = ref::attention(host, rows);
  if (rows.empty()) {
    for (int64_t i = 0; i < p.Sq; ++i) rows.push_back(i);
  }
  v.rows = static_cast<int64_t>(rows.size());
  double sum_err2 = 0, sum_ref2 = 0;
  std::string worst;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hh = 0; hh < p.Hq; ++hh)
      for (int64_t i : rows) {
        for (int64_t d = 0; d < p.D; ++d) {
          const double want = r.o[static_cast<size_t>(((b * p.Sq + i) * p.Hq + hh) * p.D + d)];
          const double got = from_16bit(o[static_cast<size_t>(offset(h.os, b, i, hh, d))], p.out);
          const double e = std::isfinite(got) ? std::fabs(got - want) : std::numeric_limits<double>::infinity();
          sum_err2 += e * e, sum_ref2 += want * want;
          v.max_ref = std::max(v.max_ref, std::fabs(want));
          if (!(e <= v.max_err)) {
            v.max_err = e;
            worst = "b=" + std::to_string(b) + " h=" + std::to_string(hh) + " row=" + std::to_string(i) + " d=" +
                    std::to_string(d) + ": got " + fmt(got) + ", want " + fmt(want);
          }
        }
        if (!p.lse) continue;
        const double want = r.lse[static_cast<size_t>((b * p.Hq + hh) * p.Sq + i)];
        if (!std::isfinite(want)) continue;  // rows that see no key: checked exactly above
        const double got = lse[static_cast<size_t>((b * p.Hq + hh) * p.Sq + i)];
        const double e = std::isfinite(got) ? std::fabs(got - want) : std::numeric_limits<double>::infinity();
        v.lse_err = std::max(v.lse_err, e);
        v.lse_excess = std::max(v.lse_excess, e / (tol.lse_abs + tol.lse_rel * std::fabs(want)));
      }
  v.rel_rmse =
      sum_ref2 > 0 ? std::sqrt(sum_err2 / sum_ref2) : (sum_err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);

  // The verdict.
  auto fail = [&](const std::string& s) { v.why += (v.why.empty() ? "" : "; ") + s; };
  if (v.unwritten) fail(std::to_string(v.unwritten) + " O elements kept the NaN poison");
  if (v.nonfinite) fail(std::to_string(v.nonfinite) + " O elements are NaN/Inf");
  if (v.masked_bad) fail(std::to_string(v.masked_bad) + " O elements of rows that see no key are not 0");
  if (v.lse_bad) fail(std::to_string(v.lse_bad) + " LSE entries unwritten, non-finite, or not -inf on rows without keys");
  if (v.pad_written) fail(std::to_string(v.pad_written) + " elements of O's padding were written");
  if (!(v.rel_rmse <= tol.rel_rmse)) fail("relative RMSE " + fmt(v.rel_rmse) + " > " + fmt(tol.rel_rmse));
  const double max_tol = tol.max_rel * v.max_ref + tol.max_abs;
  if (!(v.max_err <= max_tol)) fail("max |O - ref| " + fmt(v.max_err) + " > " + fmt(max_tol) + " (worst at " + worst + ")");
  if (!(v.lse_excess <= 1.0)) fail("LSE error " + fmt(v.lse_err) + " exceeds its tolerance (" + fmt(v.lse_excess) + "x)");
  if (!v.first.empty()) fail("first: " + v.first);
  v.passed = v.why.empty();
  return v;
}

std::string report(const Problem& p, const Verdict& v, uint64_t seed) {
  return describe(p) + " [seed " + std::to_string(seed) + "]: rel RMSE " + fmt(v.rel_rmse) + ", max err " +
         fmt(v.max_err) + " (max |ref| " + fmt(v.max_ref) + "), LSE err " + fmt(v.lse_err) + ", rows/head " +
         std::to_string(v.rows);
}

// ------------------------------------------------------------------------------------------------
// A CPU emulation of an FA3-style 8-bit kernel (for the harness's own tests): fp32 scores of the e4m3 values times
// softmax_scale * q_descale * k_descale, softmax in fp32 against the row max, P rounded to e4m3 before the P*V
// product, O = v_descale * sum(P8 V8) / sum(P) rounded to O's dtype. precision = FP8: Q, K, V first quantized per
// (batch, KV head), the absolute maximum mapped to 448.
// ------------------------------------------------------------------------------------------------
struct Quantized {
  std::vector<uint8_t> q, k, v;  // dense BSHD codes
  std::vector<float> qd, kd, vd; // (B, Hkv)
};

Quantized quantize_like_the_library(const Problem& p, const HostData& h) {
  Quantized z;
  const int64_t group = p.Hq / p.Hkv;
  auto one = [&](const std::vector<float>& real, int64_t S, int64_t H, bool is_q, std::vector<uint8_t>& codes,
                 std::vector<float>& descale) {
    codes.resize(real.size());
    descale.assign(static_cast<size_t>(p.B * p.Hkv), 1.0f);
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t hkv = 0; hkv < p.Hkv; ++hkv) {
        float amax = 0;
        const int64_t h0 = is_q ? hkv * group : hkv, h1 = is_q ? h0 + group : hkv + 1;
        for (int64_t i = 0; i < S; ++i)
          for (int64_t hh = h0; hh < h1; ++hh)
            for (int64_t d = 0; d < p.D; ++d)
              amax = std::max(amax, std::fabs(real[static_cast<size_t>(((b * S + i) * H + hh) * p.D + d)]));
        const float ds = amax > 0 ? amax / 448.0f : 1.0f;
        descale[static_cast<size_t>(b * p.Hkv + hkv)] = ds;
        for (int64_t i = 0; i < S; ++i)
          for (int64_t hh = h0; hh < h1; ++hh)
            for (int64_t d = 0; d < p.D; ++d) {
              const size_t at = static_cast<size_t>(((b * S + i) * H + hh) * p.D + d);
              codes[at] = float_to_e4m3(real[at] / ds);
            }
      }
  };
  one(h.qf, p.Sq, p.Hq, true, z.q, z.qd);
  one(h.kf, p.Sk, p.Hkv, false, z.k, z.kd);
  one(h.vf, p.Sk, p.Hkv, false, z.v, z.vd);
  return z;
}

void emulate(const Problem& p, const HostData& h, std::vector<uint16_t>& o, std::vector<float>& lse) {
  float table[256];
  for (int b = 0; b < 256; ++b) table[b] = fp8_to_float(static_cast<uint8_t>(b), eight_bit(p) ? p.in : FLASHCORE_DTYPE_FP8_E4M3);
  auto dec = [&](uint8_t b) { return table[b]; };
  Quantized z;
  if (eight_bit(p)) {  // the stored codes, densified, and the given descales
    auto dense = [&](const std::vector<uint8_t>& src, const flashcore_tensor_strides& st, int64_t S, int64_t H) {
      std::vector<uint8_t> out(static_cast<size_t>(p.B * S * H * p.D));
      for (int64_t b = 0; b < p.B; ++b)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t hh = 0; hh < H; ++hh)
            for (int64_t d = 0; d < p.D; ++d)
              out[static_cast<size_t>(((b * S + i) * H + hh) * p.D + d)] =
                  src[static_cast<size_t>(offset(st, b, i, hh, d))];
      return out;
    };
    z.q = dense(h.q, h.qs, p.Sq, p.Hq), z.k = dense(h.k, h.ks, p.Sk, p.Hkv), z.v = dense(h.v, h.vs, p.Sk, p.Hkv);
    const std::vector<float> ones(static_cast<size_t>(p.B * p.Hkv), 1.0f);
    z.qd = h.qd.empty() ? ones : h.qd, z.kd = h.kd.empty() ? ones : h.kd, z.vd = h.vd.empty() ? ones : h.vd;
  } else {
    z = quantize_like_the_library(p, h);
  }
  o.assign(static_cast<size_t>(h.o_ext), 0xFFFF);
  lse.assign(p.lse ? static_cast<size_t>(p.B * p.Hq * p.Sq) : 0, std::numeric_limits<float>::quiet_NaN());
  const float scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.D));
  const int64_t group = p.Hq / p.Hkv;
  std::vector<float> s(static_cast<size_t>(p.Sk)), acc(static_cast<size_t>(p.D));
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t hh = 0; hh < p.Hq; ++hh) {
      const int64_t hkv = hh / group, bh = b * p.Hkv + hkv;
      const float score_scale = scale * z.qd[static_cast<size_t>(bh)] * z.kd[static_cast<size_t>(bh)];
      for (int64_t i = 0; i < p.Sq; ++i) {
        const int64_t n = visible_keys(p, i);
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        for (int64_t j = 0; j < n; ++j) {
          float dot = 0;
          for (int64_t d = 0; d < p.D; ++d)
            dot += dec(z.q[static_cast<size_t>(((b * p.Sq + i) * p.Hq + hh) * p.D + d)]) *
                   dec(z.k[static_cast<size_t>(((b * p.Sk + j) * p.Hkv + hkv) * p.D + d)]);
          s[static_cast<size_t>(j)] = dot * score_scale;
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float pj = std::exp(s[static_cast<size_t>(j)] - m);
          l += pj;
          const float p8 = e4m3_to_float(float_to_e4m3(pj));  // P is e4m3 for either 8-bit input type
          for (int64_t d = 0; d < p.D; ++d)
            acc[static_cast<size_t>(d)] += p8 * dec(z.v[static_cast<size_t>(((b * p.Sk + j) * p.Hkv + hkv) * p.D + d)]);
        }
        for (int64_t d = 0; d < p.D; ++d) {
          const float x = n > 0 ? acc[static_cast<size_t>(d)] * z.vd[static_cast<size_t>(bh)] / l : 0.0f;
          o[static_cast<size_t>(offset(h.os, b, i, hh, d))] = to_16bit(x, p.out);
        }
        if (p.lse) {
          lse[static_cast<size_t>((b * p.Hq + hh) * p.Sq + i)] =
              n > 0 ? m + std::log(l) : -std::numeric_limits<float>::infinity();
        }
      }
    }
}

// ------------------------------------------------------------------------------------------------
// The device side
// ------------------------------------------------------------------------------------------------
// "" when the 8-bit kernels of `dtype` (e4m3 or e5m2) for (head_dim, causal) run on this device; otherwise why not.
std::string fp8_skip_reason(int64_t head_dim, bool causal, flashcore_dtype dtype = FLASHCORE_DTYPE_FP8_E4M3) {
  if (const std::string& why = flashcore::testing::gpu_skip_reason(); !why.empty()) return "GPU test skipped: " + why;
  return flashcore::check::fp8::skip_reason(head_dim, causal, dtype);
}

// "" when the int8 Q K^T kernels of precision = INT8 serve (head_dim, causal) on this device; otherwise why not.
std::string int8_skip_reason(int64_t head_dim, bool causal) {
  if (const std::string& why = flashcore::testing::gpu_skip_reason(); !why.empty()) return "GPU test skipped: " + why;
  if (const std::string why = flashcore::check::fp8::skip_reason(head_dim, causal); !why.empty()) return why;
  int32_t count = 0;
  const flashcore_status st = flashcore_list_kernel_configs(FLASHCORE_DTYPE_INT8, static_cast<int32_t>(head_dim),
                                                            causal ? 1 : 0, nullptr, 0, &count);
  if (st != FLASHCORE_SUCCESS || count == 0) {
    return "no int8 Q K^T kernel (precision = INT8) for head_dim " + std::to_string(head_dim) +
           (causal ? " causal" : "") + " in this build (FLASHCORE_DTYPES without i8?)";
  }
  return "";
}

#define FLASHCORE_REQUIRE_INT8(head_dim, causal)                                            \
  do {                                                                                      \
    if (const std::string why_ = int8_skip_reason((head_dim), (causal)); !why_.empty()) {   \
      GTEST_SKIP() << why_;                                                                 \
    }                                                                                       \
  } while (0)

#define FLASHCORE_REQUIRE_FP8(head_dim, causal)                                            \
  do {                                                                                     \
    if (const std::string why_ = fp8_skip_reason((head_dim), (causal)); !why_.empty()) {  \
      GTEST_SKIP() << why_;                                                                \
    }                                                                                      \
  } while (0)

struct DevMem {
  void* ptr = nullptr;
  DevMem() = default;
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  ~DevMem() {
    if (ptr) cudaFree(ptr);
  }
  bool alloc(size_t bytes) { return cudaMalloc(&ptr, std::max<size_t>(bytes, 1)) == cudaSuccess; }
};

// The inputs on the device and the call's params (with a zero-filled workspace of the size the library asks for).
class DeviceProblem {
 public:
  // False (with a gtest failure) when an allocation, copy or the workspace query fails.
  bool upload(const Problem& p, const HostData& h) {
    p_ = p;
    const size_t eb = static_cast<size_t>(in_bytes(p));
    o_elems_ = static_cast<size_t>(h.o_ext);
    lse_count_ = p.lse ? static_cast<size_t>(p.B * p.Hq * p.Sq) : 0;
    if (!q_.alloc(h.q.size()) || !k_.alloc(h.k.size()) || !v_.alloc(h.v.size()) || !o_.alloc(o_elems_ * 2) ||
        (p.lse && !lse_.alloc(lse_count_ * 4))) {
      ADD_FAILURE() << "cudaMalloc failed";
      return false;
    }
    bool ok = cudaMemcpy(q_.ptr, h.q.data(), h.q.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(k_.ptr, h.k.data(), h.k.size(), cudaMemcpyHostToDevice) == cudaSuccess &&
              cudaMemcpy(v_.ptr, h.v.data(), h.v.size(), cudaMemcpyHostToDevice) == cudaSuccess;
    for (auto [host, dev] : {std::pair{&h.qd, &qd_}, std::pair{&h.kd, &kd_}, std::pair{&h.vd, &vd_}}) {
      if (host->empty()) continue;
      ok = ok && dev->alloc(host->size() * 4) &&
           cudaMemcpy(dev->ptr, host->data(), host->size() * 4, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    if (!ok) {
      ADD_FAILURE() << "uploading the inputs failed";
      return false;
    }
    flashcore_attention_params_init(&params);
    params.q = q_.ptr, params.k = k_.ptr, params.v = v_.ptr, params.o = o_.ptr;
    params.lse = p.lse ? static_cast<float*>(lse_.ptr) : nullptr;
    params.lse_capacity = static_cast<int64_t>(lse_count_);
    params.q_strides = h.qs, params.k_strides = h.ks, params.v_strides = h.vs, params.o_strides = h.os;
    params.batch = p.B, params.seqlen_q = p.Sq, params.seqlen_k = p.Sk;
    params.num_heads_q = p.Hq, params.num_heads_kv = p.Hkv, params.head_dim = p.D;
    params.dtype = p.in;
    params.out_dtype = p.out_same ? FLASHCORE_DTYPE_SAME : p.out;
    params.causal = p.causal ? 1 : 0;
    params.softmax_scale = p.softmax_scale;
    params.precision = p.precision;
    params.kernel_config = p.kernel_config;
    params.q_descale = static_cast<const float*>(qd_.ptr);
    params.k_descale = static_cast<const float*>(kd_.ptr);
    params.v_descale = static_cast<const float*>(vd_.ptr);
    (void)eb;
    uint64_t bytes = 0;
    const flashcore_status st = flashcore_attention_workspace_size(&params, &bytes);
    if (st != FLASHCORE_SUCCESS) {
      ADD_FAILURE() << "flashcore_attention_workspace_size: " << flashcore_status_string(st) << ": "
                    << flashcore_last_error();
      return false;
    }
    EXPECT_GT(bytes, 0u) << "an 8-bit call needs a workspace";
    if (!ws_.alloc(bytes) || cudaMemset(ws_.ptr, 0, bytes) != cudaSuccess) {
      ADD_FAILURE() << "workspace of " << bytes << " bytes";
      return false;
    }
    params.workspace = ws_.ptr, params.workspace_size = bytes;
    return true;
  }

  // Poisons O and LSE (0xFF bytes), runs params (or `other`), and copies O and LSE back.
  flashcore_status run(std::vector<uint16_t>& o, std::vector<float>& lse,
                       const flashcore_attention_params* other = nullptr) {
    o.assign(o_elems_, 0);
    lse.assign(lse_count_, 0.0f);
    EXPECT_EQ(cudaMemset(o_.ptr, 0xFF, o_elems_ * 2), cudaSuccess);
    if (lse_count_) {
      EXPECT_EQ(cudaMemset(lse_.ptr, 0xFF, lse_count_ * 4), cudaSuccess);
    }
    const flashcore_status st = flashcore_attention_forward(other ? other : &params, nullptr);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(o.data(), o_.ptr, o_elems_ * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    if (lse_count_) {
      EXPECT_EQ(cudaMemcpy(lse.data(), lse_.ptr, lse_count_ * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return st;
  }

  // A device array of B * Hkv floats all equal to `value` (for the NULL-vs-ones test).
  const float* constant_descales(float value) {
    const std::vector<float> host(static_cast<size_t>(p_.B * p_.Hkv), value);
    if (!ones_.ptr) {
      EXPECT_TRUE(ones_.alloc(host.size() * 4));
    }
    EXPECT_EQ(cudaMemcpy(ones_.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return static_cast<const float*>(ones_.ptr);
  }

  flashcore_attention_params params{};

 private:
  Problem p_;
  DevMem q_, k_, v_, o_, lse_, qd_, kd_, vd_, ws_, ones_;
  size_t o_elems_ = 0, lse_count_ = 0;
};

uint64_t base_seed() {
  static const uint64_t seed = [] {
    const char* env = std::getenv("FLASHCORE_SEED");
    return env && *env ? std::strtoull(env, nullptr, 0) : uint64_t{0xf8e4};
  }();
  return seed;
}

uint64_t seed_of(const std::string& name) {
  uint64_t h = base_seed() ^ 0xcbf29ce484222325ull;
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Runs p twice (poisoned outputs each time), requires bit-identical results, and judges the first against the
// reference. Returns the verdict (passed = false also for a failed call or a rerun that differs).
Verdict run_and_compare(const Problem& p, std::vector<uint16_t>* o_out = nullptr, std::vector<float>* lse_out = nullptr) {
  const uint64_t seed = seed_of(p.name);
  const HostData h = make_inputs(p, seed);
  DeviceProblem dev;
  Verdict v;
  if (!dev.upload(p, h)) {
    v.why = "setup failed";
    return v;
  }
  std::vector<uint16_t> o, o2;
  std::vector<float> lse, lse2;
  flashcore_status st = dev.run(o, lse);
  if (st != FLASHCORE_SUCCESS) {
    v.why = std::string("flashcore_attention_forward: ") + flashcore_status_string(st) + ": " + flashcore_last_error();
    return v;
  }
  st = dev.run(o2, lse2);
  v = compare(p, h, o, lse, seed);
  if (st != FLASHCORE_SUCCESS) {
    v.passed = false;
    v.why += "; the second call failed: " + std::string(flashcore_last_error());
  } else if (o != o2 || std::memcmp(lse.data(), lse2.data(), lse.size() * 4) != 0) {
    v.passed = false;
    v.why += "; the second run is not bit-identical to the first";
  }
  std::printf("  %s\n", report(p, v, seed).c_str());
  if (o_out) *o_out = o;
  if (lse_out) *lse_out = lse;
  return v;
}

// ------------------------------------------------------------------------------------------------
// The case list
// ------------------------------------------------------------------------------------------------
std::string sanitize(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

Problem make(int64_t D, bool causal, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
             flashcore_dtype out = FLASHCORE_DTYPE_BF16) {
  Problem p;
  p.D = D, p.causal = causal, p.B = B, p.Hq = Hq, p.Hkv = Hkv, p.Sq = Sq, p.Sk = Sk, p.out = out;
  return p;
}

std::vector<Problem> fp8_cases() {
  std::vector<Problem> list;
  auto add = [&](Problem p, const std::string& tag) {
    p.name = sanitize(tag + "_d" + std::to_string(p.D) + (p.causal ? "_causal" : "_full") + "_q" +
                      std::to_string(p.Sq) + "_k" + std::to_string(p.Sk) + "_h" + std::to_string(p.Hq) + "x" +
                      std::to_string(p.Hkv) + "_b" + std::to_string(p.B) +
                      (p.out == FLASHCORE_DTYPE_FP16 ? "_ofp16" : "_obf16"));
    list.push_back(p);
  };
  const int64_t dims[] = {64, 128, 256};
  const flashcore_dtype outs[] = {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16};
  // 1. Head dim x causal x O dtype, an odd square length.
  for (int64_t D : dims)
    for (bool causal : {false, true})
      for (flashcore_dtype out : outs) add(make(D, causal, 2, 2, 2, 113, 113, out), "grid");
  // 2. Sequence lengths 1, 17, 4097 (and 113 above), every head dim, causal and not.
  int n = 0;
  for (int64_t S : {1, 17, 4097})
    for (int64_t D : dims)
      for (bool causal : {false, true}) add(make(D, causal, S <= 17 ? 3 : 1, 2, 2, S, S, outs[n++ % 2]), "seqlen");
  // 3. GQA (8 query heads on 2 KV heads) and MQA.
  for (int64_t D : dims)
    for (bool causal : {false, true}) {
      add(make(D, causal, 2, 8, 2, 300, 300, outs[n++ % 2]), "gqa");
      add(make(D, causal, 1, 4, 1, 129, 200, outs[n++ % 2]), "mqa");
    }
  // 4. seqlen_q != seqlen_k both ways; causal with Sq > Sk has rows that see no key (O = 0, LSE = -inf).
  const int64_t pairs[][2] = {{1, 4097}, {17, 1000}, {113, 300}, {300, 113}, {1000, 17}, {4097, 113}, {128, 1}};
  for (const auto& pr : pairs)
    for (bool causal : {false, true})
      for (int64_t D : {int64_t{128}, int64_t{256}}) add(make(D, causal, 1, 4, 2, pr[0], pr[1], outs[n++ % 2]), "cross");
  // 5. Layouts: BHSD, padded head strides (Q/K/V +16 bytes, O +8 elements), both.
  for (int64_t D : dims)
    for (bool causal : {false, true}) {
      Problem p = make(D, causal, 2, 4, 2, 200, 333, outs[n++ % 2]);
      p.bhsd = true;
      add(p, "bhsd");
      p.bhsd = false, p.in_pad = 16, p.out_pad = 8;
      add(p, "padded");
      p.bhsd = true, p.in_pad = 32, p.out_pad = 16;
      add(p, "bhsd_padded");
    }
  // 6. Value ranges: real values N(0, 1) * [0.5, 2] from e4m3 spread over most of its range (sigma 64, descales
  // ~1/64), from small e4m3 values (sigma 1, subnormals included, descales ~1), NULL descales; a softmax scale.
  for (bool causal : {false, true}) {
    Problem p = make(128, causal, 2, 4, 2, 257, 257);
    p.sigma = 64, p.descale_unit = 1.0f / 64;
    add(p, "sigma64");
    p.sigma = 1, p.descale_unit = 1;
    add(p, "sigma1");
    p.sigma = 2, p.null_descales = true;
    add(p, "nulldescale");
    p = make(256, causal, 1, 4, 2, 200, 255, FLASHCORE_DTYPE_FP16);
    p.softmax_scale = 0.03f;
    add(p, "scale003");
    p = make(128, causal, 2, 2, 1, 100, 300);
    p.lse = false;
    add(p, "nolse");
    p = make(128, causal, 2, 2, 2, 65, 65);
    p.out_same = true;  // SAME: bf16 for 8-bit inputs
    add(p, "outsame");
  }
  // 7. Batch 5: five different descales per tensor and KV head.
  for (bool causal : {false, true}) add(make(128, causal, 5, 4, 2, 96, 160, outs[n++ % 2]), "batch5");
  // 8. e5m2 inputs (P stays e4m3): every head dim x causal, seqlen 1 and 4097, GQA, Sq != Sk, padded BHSD, zero
  // blocks, NULL descales.
  auto e5m2 = [](Problem p) {
    p.in = FLASHCORE_DTYPE_FP8_E5M2;
    return p;
  };
  for (int64_t D : dims)
    for (bool causal : {false, true}) {
      add(e5m2(make(D, causal, 2, 8, 2, 113, 113, outs[n++ % 2])), "e5m2_gqa");
      add(e5m2(make(D, causal, 1, 4, 2, 300, 113, outs[n++ % 2])), "e5m2_cross");
      add(e5m2(make(D, causal, 3, 2, 2, 1, 1, outs[n++ % 2])), "e5m2_seqlen");
    }
  for (bool causal : {false, true}) {
    add(e5m2(make(128, causal, 1, 2, 2, 4097, 4097, outs[n++ % 2])), "e5m2_seqlen");
    Problem p = e5m2(make(256, causal, 2, 4, 2, 200, 333, outs[n++ % 2]));
    p.bhsd = true, p.in_pad = 32, p.out_pad = 16;
    add(p, "e5m2_bhsd_padded");
    p = e5m2(make(128, causal, 2, 4, 2, 257, 257));
    p.fill = Fill::kZeroBlock;
    add(p, "e5m2_zeroblock");
    p = e5m2(make(64, causal, 2, 4, 2, 129, 200));
    p.sigma = 2, p.null_descales = true;
    add(p, "e5m2_nulldescale");
  }
  return list;
}

std::vector<Problem> precision_cases(int32_t precision = FLASHCORE_PRECISION_FP8) {
  const char* prefix = precision == FLASHCORE_PRECISION_INT8 ? "int8_" : "precision_";
  std::vector<Problem> list;
  int n = 0;
  const int64_t shapes[][4] = {{1, 1, 4, 4}, {113, 113, 4, 4}, {17, 300, 8, 2}, {300, 113, 4, 2}, {4097, 4097, 2, 2}};
  for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
    for (int64_t D : {64, 128, 256})
      for (bool causal : {false, true})
        for (const auto& s : shapes) {
          if (s[0] == 4097 && (n++ % 3) != 0) continue;  // a few of the long ones
          Problem p = make(D, causal, s[0] > 1000 ? 1 : 2, s[2], s[3], s[0], s[1], in);
          p.in = in;
          p.precision = precision;
          p.out_same = true;  // O in the input dtype
          p.name = sanitize(std::string(prefix) + (in == FLASHCORE_DTYPE_BF16 ? "bf16" : "fp16") + "_d" +
                            std::to_string(D) + (causal ? "_causal" : "_full") + "_q" + std::to_string(s[0]) + "_k" +
                            std::to_string(s[1]) + "_h" + std::to_string(s[2]) + "x" + std::to_string(s[3]));
          list.push_back(p);
        }
  return list;
}

std::string param_name(const testing::TestParamInfo<Problem>& info) { return info.param.name; }

// GoogleTest prints parameters with this instead of a byte dump.
void PrintTo(const Problem& p, std::ostream* os) { *os << describe(p); }

// "" when this build's validation takes p's arguments (precision = FP8 also needs its 16-bit dtype compiled in);
// otherwise the library's reason. Fake, never dereferenced device addresses.
std::string arguments_skip_reason(const Problem& p) {
  const HostData h = make_inputs(p, 1);
  flashcore_attention_params q;
  flashcore_attention_params_init(&q);
  const uintptr_t base = uintptr_t{1} << 40, step = uintptr_t{1} << 36;
  q.q = reinterpret_cast<const void*>(base), q.k = reinterpret_cast<const void*>(base + step);
  q.v = reinterpret_cast<const void*>(base + 2 * step), q.o = reinterpret_cast<void*>(base + 3 * step);
  q.q_strides = h.qs, q.k_strides = h.ks, q.v_strides = h.vs, q.o_strides = h.os;
  q.batch = p.B, q.seqlen_q = p.Sq, q.seqlen_k = p.Sk, q.num_heads_q = p.Hq, q.num_heads_kv = p.Hkv, q.head_dim = p.D;
  q.dtype = p.in, q.precision = p.precision, q.causal = p.causal ? 1 : 0;
  q.out_dtype = p.out_same ? FLASHCORE_DTYPE_SAME : p.out;
  const flashcore_status st = flashcore_attention_validate(&q);
  if (st == FLASHCORE_ERROR_UNSUPPORTED_DTYPE || st == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM)
    return std::string(flashcore_status_string(st)) + ": " + flashcore_last_error();
  return "";
}

}  // namespace

// ================================================================================================
// CPU only: the codec and the comparison (run everywhere)
// ================================================================================================
TEST(E4m3Codec, DecodeMatchesCudaFp8) {
  for (int b = 0; b < 256; ++b) {
    __nv_fp8_e4m3 x;
    x.__x = static_cast<__nv_fp8_storage_t>(b);
    const float want = static_cast<float>(x);
    const float got = e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << b;
    } else {
      EXPECT_EQ(got, want) << "code " << b;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code " << b;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
}

TEST(E4m3Codec, EncodeMatchesCudaFp8) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 448.0f, 449.0f, 464.0f, 1e9f, -1e9f, 0x1p-10f, 0x1p-9f * 0.5f,
                           0x1p-9f * 1.5f, 0x1p-9f * 2.5f, 0x1p-6f * 1.0625f, 1.0625f, 1.1875f, 0.0156f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::denorm_min()};
  for (int b = 0; b < 256; ++b) {  // every code, and the midpoints between neighbours (ties to even)
    const float v = e4m3_to_float(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    xs.push_back(v);
    const float next = e4m3_to_float(static_cast<uint8_t>(b + 1));
    if ((b & 0x7F) < 0x7E) xs.push_back(0.5f * (v + next)), xs.push_back(std::nextafter(0.5f * (v + next), 0.0f));
  }
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 24) - 12));
  for (float x : xs) {
    const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    EXPECT_EQ(static_cast<int>(float_to_e4m3(x)), static_cast<int>(want)) << "x = " << x;
  }
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
}

namespace {
// The harness on the emulation of an 8-bit kernel: must pass; and with errors planted: must fail.
Verdict emulated(const Problem& p, void (*plant)(const Problem&, std::vector<uint16_t>&, std::vector<float>&) = nullptr) {
  const uint64_t seed = seed_of(p.name);
  const HostData h = make_inputs(p, seed);
  std::vector<uint16_t> o;
  std::vector<float> lse;
  emulate(p, h, o, lse);
  if (plant) plant(p, o, lse);
  return compare(p, h, o, lse, seed);
}
}  // namespace

TEST(Fp8Harness, AnFa3StyleKernelPassesTheTolerances) {
  std::vector<Problem> list;
  for (bool causal : {false, true}) {
    list.push_back(make(128, causal, 2, 4, 2, 113, 300));
    list.push_back(make(256, causal, 1, 2, 1, 300, 113, FLASHCORE_DTYPE_FP16));  // rows without keys when causal
    list.push_back(make(64, causal, 1, 2, 2, 64, 4097));
    Problem wide = make(128, causal, 1, 2, 2, 97, 257);
    wide.sigma = 64, wide.descale_unit = 1.0f / 64, wide.bhsd = true, wide.in_pad = 16, wide.out_pad = 8;
    list.push_back(wide);
    Problem zero = make(128, causal, 2, 4, 2, 200, 200);
    zero.fill = Fill::kZeroBlock;
    list.push_back(zero);
    for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
      Problem prec = make(128, causal, 1, 4, 2, 150, 300, in);
      prec.in = in, prec.precision = FLASHCORE_PRECISION_FP8;
      list.push_back(prec);
    }
  }
  for (Problem& p : list) {
    p.name = sanitize(describe(p));
    const Verdict v = emulated(p);
    std::printf("  emulated %s\n", report(p, v, seed_of(p.name)).c_str());
    EXPECT_TRUE(v.passed) << report(p, v, seed_of(p.name)) << "\n  " << v.why;
  }
}

TEST(Fp8Harness, PlantedErrorsFail) {
  Problem p = make(128, true, 1, 4, 2, 200, 120);  // causal, Sq > Sk: rows 0..79 see no key
  p.name = "planted";
  ASSERT_TRUE(emulated(p).passed);
  using Plant = void (*)(const Problem&, std::vector<uint16_t>&, std::vector<float>&);
  const std::pair<const char*, Plant> plants[] = {
      {"O 6% too large",
       [](const Problem& q, std::vector<uint16_t>& o, std::vector<float>&) {
         for (uint16_t& x : o)
           if (x != 0xFFFF) x = to_16bit(from_16bit(x, q.out) * 1.06f, q.out);
       }},
      {"one element off by a lot",
       [](const Problem& q, std::vector<uint16_t>& o, std::vector<float>&) {
         const size_t at = static_cast<size_t>(offset(strides_of(q, q.Sq, q.Hq, q.out_pad), 0, q.Sq - 1, 1, 5));
         o[at] = to_16bit(from_16bit(o[at], q.out) + 3.0f, q.out);
       }},
      {"an unwritten element",
       [](const Problem& q, std::vector<uint16_t>& o, std::vector<float>&) {
         o[static_cast<size_t>(offset(strides_of(q, q.Sq, q.Hq, q.out_pad), 0, 150, 3, 7))] = 0xFFFF;
       }},
      {"a row without keys not zero",
       [](const Problem& q, std::vector<uint16_t>& o, std::vector<float>&) {
         o[static_cast<size_t>(offset(strides_of(q, q.Sq, q.Hq, q.out_pad), 0, 3, 0, 0))] = to_16bit(1e-3f, q.out);
       }},
      {"LSE off by 0.05",
       [](const Problem&, std::vector<uint16_t>&, std::vector<float>& lse) {
         for (float& l : lse)
           if (std::isfinite(l)) l += 0.05f;
       }},
      {"LSE of a row without keys finite",
       [](const Problem&, std::vector<uint16_t>&, std::vector<float>& lse) { lse[0] = 0.0f; }},
  };
  for (const auto& [what, plant] : plants) {
    SCOPED_TRACE(what);
    const Verdict v = emulated(p, plant);
    EXPECT_FALSE(v.passed) << what << " was not caught: " << report(p, v, 0);
  }
  Problem padded = make(128, false, 1, 2, 2, 64, 64);
  padded.out_pad = 8, padded.name = "planted_padded";
  ASSERT_TRUE(emulated(padded).passed);
  const Verdict v = emulated(padded, [](const Problem& q, std::vector<uint16_t>& o, std::vector<float>&) {
    o[static_cast<size_t>(offset(strides_of(q, q.Sq, q.Hq, q.out_pad), 0, 10, 0, q.D))] = 0;  // first pad element
  });
  EXPECT_FALSE(v.passed) << "a write into O's padding was not caught";
}

TEST(Fp8Harness, CaseListsCoverTheRequirements) {
  const std::vector<Problem> list = fp8_cases();
  auto any = [&](auto pred) { return std::any_of(list.begin(), list.end(), pred); };
  for (int64_t D : {128, 256})
    for (bool causal : {false, true})
      for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
        EXPECT_TRUE(any([&](const Problem& p) { return p.D == D && p.causal == causal && p.out == out; }));
  for (int64_t S : {1, 17, 113, 4097}) EXPECT_TRUE(any([&](const Problem& p) { return p.Sq == S && p.Sk == S; })) << S;
  EXPECT_TRUE(any([](const Problem& p) { return p.Hq == 8 && p.Hkv == 2; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.Sq < p.Sk; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.causal && p.Sq > p.Sk; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.bhsd; }));
  EXPECT_TRUE(any([](const Problem& p) { return p.in_pad > 0 && p.out_pad > 0; }));
  std::vector<std::string> names;
  for (const auto& l : {fp8_cases(), precision_cases(), precision_cases(FLASHCORE_PRECISION_INT8)})
    for (const Problem& p : l) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end()) << "duplicate case names";
}

// ================================================================================================
// GPU: e4m3 inputs against the reference
// ================================================================================================
class Fp8Forward : public testing::TestWithParam<Problem> {};

TEST_P(Fp8Forward, MatchesReferenceAndRerunsBitIdentical) {
  const Problem& p = GetParam();
  if (const std::string why = fp8_skip_reason(p.D, p.causal, p.in); !why.empty()) GTEST_SKIP() << why;
  const Verdict v = run_and_compare(p);
  EXPECT_TRUE(v.passed) << report(p, v, seed_of(p.name)) << "\n  " << v.why;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8Forward, testing::ValuesIn(fp8_cases()), param_name);

class Fp8PrecisionForward : public testing::TestWithParam<Problem> {};

// precision = FP8 from 16-bit inputs, against the float64 attention of the unquantized inputs.
TEST_P(Fp8PrecisionForward, MatchesUnquantizedReference) {
  const Problem& p = GetParam();
  FLASHCORE_REQUIRE_FP8(p.D, p.causal);
  if (const std::string why = arguments_skip_reason(p); !why.empty()) GTEST_SKIP() << why;
  const Verdict v = run_and_compare(p);
  EXPECT_TRUE(v.passed) << report(p, v, seed_of(p.name)) << "\n  " << v.why;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8PrecisionForward, testing::ValuesIn(precision_cases()), param_name);

class Int8PrecisionForward : public testing::TestWithParam<Problem> {};

// precision = INT8 (int8 Q K^T, P V in 16 bits) from 16-bit inputs, against the float64 attention of the unquantized
// inputs, with the tighter tolerance above.
TEST_P(Int8PrecisionForward, MatchesUnquantizedReference) {
  const Problem& p = GetParam();
  FLASHCORE_REQUIRE_INT8(p.D, p.causal);
  if (const std::string why = arguments_skip_reason(p); !why.empty()) GTEST_SKIP() << why;
  const Verdict v = run_and_compare(p);
  EXPECT_TRUE(v.passed) << report(p, v, seed_of(p.name)) << "\n  " << v.why;
}

INSTANTIATE_TEST_SUITE_P(Cases, Int8PrecisionForward, testing::ValuesIn(precision_cases(FLASHCORE_PRECISION_INT8)),
                         param_name);

// ================================================================================================
// GPU: special inputs
// ================================================================================================
// NULL descales mean 1: the same bits as descales of 1.0 (and the same as calling with descale arrays of ones for
// only some of the tensors).
TEST(Fp8Special, NullDescalesEqualOnes) {
  int ran = 0;
  for (bool causal : {false, true}) {
    if (!fp8_skip_reason(128, causal).empty()) continue;
    ++ran;
    Problem p = make(128, causal, 2, 4, 2, 150, 300);
    p.null_descales = true, p.sigma = 2, p.name = "null_vs_ones";
    const HostData h = make_inputs(p, seed_of(p.name));
    DeviceProblem dev;
    ASSERT_TRUE(dev.upload(p, h));
    std::vector<uint16_t> o_null, o_ones;
    std::vector<float> lse_null, lse_ones;
    ASSERT_EQ(dev.run(o_null, lse_null), FLASHCORE_SUCCESS) << flashcore_last_error();
    const Verdict v = compare(p, h, o_null, lse_null, seed_of(p.name));
    EXPECT_TRUE(v.passed) << report(p, v, 0) << "\n  " << v.why;
    flashcore_attention_params ones = dev.params;
    ones.q_descale = ones.k_descale = ones.v_descale = dev.constant_descales(1.0f);
    ASSERT_EQ(dev.run(o_ones, lse_ones, &ones), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_TRUE(o_null == o_ones) << "O with descales of 1.0 differs from O with NULL descales";
    EXPECT_EQ(std::memcmp(lse_null.data(), lse_ones.data(), lse_null.size() * 4), 0)
        << "LSE with descales of 1.0 differs from LSE with NULL descales";
    flashcore_attention_params mixed = dev.params;  // only k_descale given
    mixed.k_descale = ones.k_descale;
    ASSERT_EQ(dev.run(o_ones, lse_ones, &mixed), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_TRUE(o_null == o_ones) << "O with k_descale = 1.0 only differs from O with NULL descales";
  }
  if (ran == 0) GTEST_SKIP() << fp8_skip_reason(128, false);
}

// v_descale scales O and nothing else: the LSE bit-identical, O = 4x (up to O's and P's rounding) with v_descale 4.
TEST(Fp8Special, VDescaleScalesOnlyO) {
  FLASHCORE_REQUIRE_FP8(128, false);
  Problem p = make(128, false, 2, 4, 2, 100, 200);
  p.null_descales = true, p.sigma = 2, p.name = "v_descale_scales_o";
  const HostData h = make_inputs(p, seed_of(p.name));
  DeviceProblem dev;
  ASSERT_TRUE(dev.upload(p, h));
  std::vector<uint16_t> o1, o4;
  std::vector<float> lse1, lse4;
  ASSERT_EQ(dev.run(o1, lse1), FLASHCORE_SUCCESS) << flashcore_last_error();
  flashcore_attention_params four = dev.params;
  four.v_descale = dev.constant_descales(4.0f);
  ASSERT_EQ(dev.run(o4, lse4, &four), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(std::memcmp(lse1.data(), lse4.data(), lse1.size() * 4), 0) << "v_descale changed the LSE";
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < o1.size(); ++i) {
    const double a = 4.0 * from_16bit(o1[i], p.out), b = from_16bit(o4[i], p.out);
    err2 += (a - b) * (a - b), ref2 += a * a;
  }
  EXPECT_LE(std::sqrt(err2 / std::max(ref2, 1e-30)), 5e-3) << "O with v_descale = 4 is not 4x O with v_descale = 1";
}

// An all-zero block: Q rows 0..63 of batch 0 (uniform softmax), K rows 0..127 of KV head 0 (zero scores), V of the
// last KV head (O = 0 exactly for its query heads).
TEST(Fp8Special, AllZeroBlock) {
  int ran = 0;
  for (int64_t D : {128, 256})
    for (bool causal : {false, true}) {
      if (!fp8_skip_reason(D, causal).empty()) continue;
      ++ran;
      Problem p = make(D, causal, 2, 4, 2, 300, 300);
      p.fill = Fill::kZeroBlock;
      p.name = "zero_block_d" + std::to_string(D) + (causal ? "_causal" : "");
      std::vector<uint16_t> o;
      const Verdict v = run_and_compare(p, &o);
      EXPECT_TRUE(v.passed) << report(p, v, seed_of(p.name)) << "\n  " << v.why;
      const flashcore_tensor_strides os = strides_of(p, p.Sq, p.Hq, p.out_pad);
      int64_t nonzero = 0;
      for (int64_t i = 0; i < p.Sq && !o.empty(); ++i)
        for (int64_t hh = (p.Hkv - 1) * (p.Hq / p.Hkv); hh < p.Hq; ++hh)
          for (int64_t d = 0; d < p.D; ++d)
            nonzero += from_16bit(o[static_cast<size_t>(offset(os, 0, i, hh, d))], p.out) != 0.0f;
      EXPECT_EQ(nonzero, 0) << "O of the query heads whose V is all zero must be exactly 0";
    }
  if (ran == 0) GTEST_SKIP() << fp8_skip_reason(128, false);
}

// The whole e4m3 range, a quarter of the values +-448, every descale 64: real values up to 28672, scores up to
// ~1e10: everything finite, O within the range of V (P sums to 1 up to P's e4m3 rounding), LSE finite.
TEST(Fp8Special, HugeRangeStaysFinite) {
  int ran = 0;
  for (int64_t D : {128, 256})
    for (bool causal : {false, true})
      for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
        if (!fp8_skip_reason(D, causal).empty()) continue;
        ++ran;
        Problem p = make(D, causal, 1, 4, 2, 257, 300, out);
        p.fill = Fill::kHugeRange;
        p.name = "huge_d" + std::to_string(D) + (causal ? "_causal" : "") + (out == FLASHCORE_DTYPE_FP16 ? "_fp16" : "");
        const HostData h = make_inputs(p, seed_of(p.name));
        DeviceProblem dev;
        ASSERT_TRUE(dev.upload(p, h));
        std::vector<uint16_t> o, o2;
        std::vector<float> lse, lse2;
        ASSERT_EQ(dev.run(o, lse), FLASHCORE_SUCCESS) << flashcore_last_error();
        ASSERT_EQ(dev.run(o2, lse2), FLASHCORE_SUCCESS) << flashcore_last_error();
        EXPECT_TRUE(o == o2 && std::memcmp(lse.data(), lse2.data(), lse.size() * 4) == 0) << "reruns differ";
        float vmax = 0;
        for (float x : h.vf) vmax = std::max(vmax, std::fabs(x));
        const flashcore_tensor_strides os = strides_of(p, p.Sq, p.Hq, p.out_pad);
        int64_t bad = 0, out_of_range = 0, bad_lse = 0;
        for (int64_t i = 0; i < p.Sq; ++i)
          for (int64_t hh = 0; hh < p.Hq; ++hh) {
            for (int64_t d = 0; d < p.D; ++d) {
              const float x = from_16bit(o[static_cast<size_t>(offset(os, 0, i, hh, d))], p.out);
              bad += !std::isfinite(x);
              out_of_range += std::fabs(x) > 1.08f * vmax;
            }
            bad_lse += !std::isfinite(lse[static_cast<size_t>(hh * p.Sq + i)]) && visible_keys(p, i) > 0;
          }
        EXPECT_EQ(bad, 0) << describe(p) << ": non-finite O";
        EXPECT_EQ(out_of_range, 0) << describe(p) << ": |O| beyond 1.08 * max |V| = " << 1.08f * vmax;
        EXPECT_EQ(bad_lse, 0) << describe(p) << ": non-finite LSE";
      }
  if (ran == 0) GTEST_SKIP() << fp8_skip_reason(128, false);
}

// Forces the V route of 8-bit calls (FLASHCORE_FP8_V_TRANSPOSE: "kernel" or "pass") for its scope.
struct ForceVRoute {
  explicit ForceVRoute(const char* route) { setenv("FLASHCORE_FP8_V_TRANSPOSE", route, 1); }
  ~ForceVRoute() { unsetenv("FLASHCORE_FP8_V_TRANSPOSE"); }
  ForceVRoute(const ForceVRoute&) = delete;
  ForceVRoute& operator=(const ForceVRoute&) = delete;
};

// ================================================================================================
// GPU: the routes of V: transposed by the kernel's producer warps, by the pass into the workspace, or given transposed
// (FLASHCORE_FLAG_V_TRANSPOSED: flashcore_fp8_transpose_v once, then calls that read it as is, with a workspace of
// only its 256-byte head) give bit-identical O and LSE; and the errors.
// ================================================================================================
TEST(Fp8VTransposed, BitIdenticalToTheCallThatTransposes) {
  int ran = 0;
  struct Shape { int64_t D; bool causal; int64_t B, Hq, Hkv, Sq, Sk; flashcore_dtype in; };
  const Shape shapes[] = {{64, false, 2, 4, 2, 113, 1000, FLASHCORE_DTYPE_FP8_E4M3},
                          {128, true, 2, 8, 2, 777, 1000, FLASHCORE_DTYPE_FP8_E4M3},
                          {128, false, 3, 2, 2, 1, 17, FLASHCORE_DTYPE_FP8_E4M3},
                          {256, true, 1, 2, 1, 300, 4097, FLASHCORE_DTYPE_FP8_E4M3},
                          {128, false, 1, 4, 4, 200, 300, FLASHCORE_DTYPE_FP8_E5M2}};
  for (const Shape& s : shapes) {
    if (!fp8_skip_reason(s.D, s.causal, s.in).empty()) continue;
    Problem p = make(s.D, s.causal, s.B, s.Hq, s.Hkv, s.Sq, s.Sk);
    p.in = s.in;
    p.name = sanitize("v_transposed_d" + std::to_string(s.D) + "_q" + std::to_string(s.Sq) + "_k" + std::to_string(s.Sk));
    SCOPED_TRACE(describe(p));
    const HostData h = make_inputs(p, seed_of(p.name));
    // V as stored, transposed by the kernel's producer warps and by the pass into the workspace (each forced with
    // FLASHCORE_FP8_V_TRANSPOSE; the workspace is sized for the pass, the larger): bit-identical O and LSE, and the
    // kernel's route needs only the workspace's zero-filled head.
    uint64_t bytes = 0;
    DeviceProblem dev;
    std::vector<uint16_t> o, o2, o_pass;
    std::vector<float> lse, lse2, lse_pass;
    {
      const ForceVRoute route("pass");
      ASSERT_TRUE(dev.upload(p, h));
      ASSERT_EQ(flashcore_fp8_transposed_v_size(&dev.params, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
      EXPECT_EQ(dev.params.workspace_size, 256u + bytes) << "the pass: the zero-filled head, then V transposed";
      ASSERT_EQ(dev.run(o_pass, lse_pass), FLASHCORE_SUCCESS) << flashcore_last_error();
    }
    {
      const ForceVRoute route("kernel");
      uint64_t ws = 0;
      ASSERT_EQ(flashcore_attention_workspace_size(&dev.params, &ws), FLASHCORE_SUCCESS) << flashcore_last_error();
      EXPECT_EQ(ws, 256u) << "V transposed in the kernel: only the workspace's zero-filled head is needed";
      ASSERT_EQ(dev.run(o, lse), FLASHCORE_SUCCESS) << flashcore_last_error();
    }
    EXPECT_TRUE(o == o_pass) << "O differs between V transposed in the kernel and by the pass";
    EXPECT_EQ(std::memcmp(lse.data(), lse_pass.data(), lse.size() * 4), 0) << "LSE differs between the V routes";
    ASSERT_EQ(dev.run(o2, lse2), FLASHCORE_SUCCESS) << flashcore_last_error();  // the library's own choice
    EXPECT_TRUE(o == o2) << "O of the library's V route differs";
    EXPECT_EQ(bytes, static_cast<uint64_t>(s.B * s.Hkv * s.D * ((s.Sk + 127) / 128 * 128)));
    void* vt = nullptr;
    ASSERT_EQ(cudaMalloc(&vt, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemset(vt, 0xFF, bytes), cudaSuccess);  // poisoned: the transpose writes every byte
    ASSERT_EQ(flashcore_fp8_transpose_v(&dev.params, vt, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    flashcore_attention_params given = dev.params;
    given.v = vt;
    given.flags = FLASHCORE_FLAG_V_TRANSPOSED;
    uint64_t ws = 0;
    ASSERT_EQ(flashcore_attention_workspace_size(&given, &ws), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(ws, 256u) << "V given transposed: only the workspace's zero-filled head is needed";
    given.workspace_size = ws;
    ASSERT_EQ(dev.run(o2, lse2, &given), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_TRUE(o == o2) << "O differs from the call that transposes V itself";
    EXPECT_EQ(std::memcmp(lse.data(), lse2.data(), lse.size() * 4), 0) << "LSE differs";

    // Errors: the flag on the transpose itself, vt NULL or overlapping V, the flag on a 16-bit call.
    EXPECT_EQ(flashcore_fp8_transpose_v(&given, vt, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error()).find("FLASHCORE_FLAG_V_TRANSPOSED"), std::string::npos);
    EXPECT_EQ(flashcore_fp8_transpose_v(&dev.params, nullptr, nullptr), FLASHCORE_ERROR_NULL_POINTER);
    EXPECT_NE(std::string(flashcore_last_error()).find("vt"), std::string::npos);
    EXPECT_EQ(flashcore_fp8_transpose_v(&dev.params, const_cast<void*>(dev.params.v), nullptr),
              FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error()).find("overlaps v"), std::string::npos);
    EXPECT_EQ(cudaFree(vt), cudaSuccess);
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << fp8_skip_reason(128, false);
}

// ================================================================================================
// GPU: every compiled 8-bit kernel config, e4m3 and e5m2 (tuning options: persistent grids keep their counter in the
// workspace)
// ================================================================================================
namespace {

// The 8-bit keys (input dtype, head dim, causal) this device runs, each with the configs compiled for it.
struct Fp8ConfigKey {
  flashcore_dtype in;
  int64_t D;
  bool causal;
  std::vector<const char*> names;
};

void list_fp8_config_keys(std::vector<Fp8ConfigKey>& keys) {
  for (flashcore_dtype in : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2})
  for (int64_t D : {64, 128, 256})
    for (bool causal : {false, true}) {
      if (!fp8_skip_reason(D, causal, in).empty()) continue;
      int32_t count = 0;
      ASSERT_EQ(flashcore_list_kernel_configs(in, static_cast<int32_t>(D), causal, nullptr, 0, &count),
                FLASHCORE_SUCCESS);
      std::vector<const char*> names(static_cast<size_t>(count));
      ASSERT_EQ(flashcore_list_kernel_configs(in, static_cast<int32_t>(D), causal, names.data(), count, &count),
                FLASHCORE_SUCCESS);
      keys.push_back({in, D, causal, std::move(names)});
    }
}

}  // namespace

TEST(Fp8KernelConfigs, EveryConfigMatchesReference) {
  int ran = 0;
  std::vector<Fp8ConfigKey> keys;
  ASSERT_NO_FATAL_FAILURE(list_fp8_config_keys(keys));
  for (const auto& [in, D, causal, names] : keys) {
    for (const char* name : names) {
      for (flashcore_dtype out : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
        Problem p = make(D, causal, 2, 8, 2, 777, 1000, out);
        p.in = in;
        p.kernel_config = name;
        p.name = sanitize("config_" + std::string(in == FLASHCORE_DTYPE_FP8_E5M2 ? "e5m2_" : "") + name + "_d" +
                          std::to_string(D) + (causal ? "_causal" : "") + (out == FLASHCORE_DTYPE_FP16 ? "_fp16" : ""));
        SCOPED_TRACE(describe(p));
        const uint64_t seed = seed_of(p.name);
        const HostData h = make_inputs(p, seed);
        DeviceProblem dev;
        ASSERT_TRUE(dev.upload(p, h));
        char selected[128] = "";
        ASSERT_EQ(flashcore_attention_selected_config(&dev.params, selected, sizeof selected), FLASHCORE_SUCCESS)
            << flashcore_last_error();
        EXPECT_STREQ(selected, name);
        std::vector<uint16_t> o, o2;
        std::vector<float> lse, lse2;
        ASSERT_EQ(dev.run(o, lse), FLASHCORE_SUCCESS) << flashcore_last_error();
        // The library leaves the workspace's first 256 bytes zero (the next call's tile counter).
        std::vector<unsigned char> head(256, 0xAB);
        ASSERT_EQ(cudaMemcpy(head.data(), dev.params.workspace, 256, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_TRUE(std::all_of(head.begin(), head.end(), [](unsigned char b) { return b == 0; }))
            << "the workspace's first 256 bytes are not zero after a call";
        ASSERT_EQ(dev.run(o2, lse2), FLASHCORE_SUCCESS) << flashcore_last_error();
        EXPECT_TRUE(o == o2 && std::memcmp(lse.data(), lse2.data(), lse.size() * 4) == 0)
            << "the second run (same workspace) is not bit-identical";
        {  // V transposed by the kernel's producer warps where the tile can (the default route here is the pass)
          const ForceVRoute route("kernel");
          ASSERT_EQ(dev.run(o2, lse2), FLASHCORE_SUCCESS) << flashcore_last_error();
          EXPECT_TRUE(o == o2 && std::memcmp(lse.data(), lse2.data(), lse.size() * 4) == 0)
              << "V transposed in the kernel gives another O or LSE than the pass";
        }
        const Verdict v = compare(p, h, o, lse, seed);
        std::printf("  %s\n", report(p, v, seed).c_str());
        EXPECT_TRUE(v.passed) << report(p, v, seed) << "\n  " << v.why;
        ++ran;
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << fp8_skip_reason(128, false);
}

// The "-vote" rows of 8-bit P skip the O rescale only where it is a multiply by exactly 1 (their row maxima are exact,
// config.h kLazyRescale), so O and LSE are bit for bit those of the same row without the vote: long key ranges (many
// skipped rescales), causal and not, e4m3 and e5m2, both output dtypes.
TEST(Fp8KernelConfigs, VoteRowsAreBitIdenticalToTheRowsWithoutTheVote) {
  int ran = 0;
  std::vector<Fp8ConfigKey> keys;
  ASSERT_NO_FATAL_FAILURE(list_fp8_config_keys(keys));
  for (const auto& [in, D, causal, names] : keys) {
    for (const char* name : names) {
      const std::string vote = name;
      if (vote.size() < 5 || vote.compare(vote.size() - 5, 5, "-vote") != 0) continue;
      const std::string plain = vote.substr(0, vote.size() - 5);
      ASSERT_NE(std::find(names.begin(), names.end(), plain), names.end()) << plain << " is not compiled";
      const flashcore_dtype out = ran % 2 == 0 ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
      Problem p = make(D, causal, 2, 4, 2, 300, 4097, out);
      p.in = in;
      p.kernel_config = name;
      p.name = sanitize("vote_" + vote + "_d" + std::to_string(D) + (causal ? "_causal" : ""));
      SCOPED_TRACE(describe(p));
      const HostData h = make_inputs(p, seed_of(p.name));
      DeviceProblem dev;
      ASSERT_TRUE(dev.upload(p, h));
      std::vector<uint16_t> o, o_plain;
      std::vector<float> lse, lse_plain;
      ASSERT_EQ(dev.run(o, lse), FLASHCORE_SUCCESS) << flashcore_last_error();
      flashcore_attention_params q = dev.params;
      q.kernel_config = plain.c_str();
      ASSERT_EQ(dev.run(o_plain, lse_plain, &q), FLASHCORE_SUCCESS) << flashcore_last_error();
      EXPECT_TRUE(o == o_plain) << vote << ": O differs from " << plain;
      EXPECT_EQ(std::memcmp(lse.data(), lse_plain.data(), lse.size() * 4), 0)
          << vote << ": LSE differs from " << plain;
      ++ran;
    }
  }
  if (ran == 0) {
    const std::string why = fp8_skip_reason(128, false);
    GTEST_SKIP() << (why.empty() ? std::string("no 8-bit -vote config compiled in") : why);
  }
}

// ================================================================================================
// GPU: errors of 8-bit calls (rejected before anything is written)
// ================================================================================================
class Fp8Errors : public testing::Test {
 protected:
  void SetUp() override {
    FLASHCORE_REQUIRE_FP8(128, false);
    p = make(128, false, 2, 4, 2, 128, 256);
    p.name = "errors";
    h = make_inputs(p, 1);
    ASSERT_TRUE(dev.upload(p, h));
  }
  // forward returns `want`, with a message holding `needle`; O and LSE keep their poison.
  void expect_rejected(const char* what, const flashcore_attention_params& q, flashcore_status want,
                       const std::string& needle) {
    SCOPED_TRACE(what);
    std::vector<uint16_t> o;
    std::vector<float> lse;
    const flashcore_status st = dev.run(o, lse, &q);
    EXPECT_EQ(st, want) << what << ": got " << flashcore_status_string(st) << " (" << flashcore_last_error() << ")";
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find(needle), std::string::npos) << what << ": message '" << message << "' lacks '" << needle << "'";
    EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](uint16_t x) { return x == 0xFFFF; })) << what << ": O was written";
    for (float l : lse) {
      uint32_t bits;
      std::memcpy(&bits, &l, 4);
      ASSERT_EQ(bits, 0xFFFFFFFFu) << what << ": LSE was written";
    }
  }
  Problem p;
  HostData h;
  DeviceProblem dev;
};

TEST_F(Fp8Errors, NoWorkspace) {
  flashcore_attention_params q = dev.params;
  q.workspace = nullptr, q.workspace_size = 0;
  expect_rejected("no workspace", q, FLASHCORE_ERROR_INVALID_ARGUMENT, "workspace");
  q = dev.params;
  q.workspace_size = dev.params.workspace_size - 1;
  expect_rejected("workspace one byte short", q, FLASHCORE_ERROR_INVALID_ARGUMENT, "workspace");
}

TEST_F(Fp8Errors, SequsedKIsRejected) {
  DevMem used;
  ASSERT_TRUE(used.alloc(static_cast<size_t>(p.B) * 4));
  ASSERT_EQ(cudaMemset(used.ptr, 0, static_cast<size_t>(p.B) * 4), cudaSuccess);
  flashcore_attention_params q = dev.params;
  q.seqused_k = static_cast<const int32_t*>(used.ptr);
  expect_rejected("e4m3 with seqused_k", q, FLASHCORE_ERROR_INVALID_ARGUMENT, "seqused_k");
}

TEST_F(Fp8Errors, PrecisionFp8) {
  // precision = FP8 on 8-bit inputs, and on 16-bit inputs without a workspace / with descales.
  flashcore_attention_params q = dev.params;
  q.precision = FLASHCORE_PRECISION_FP8;
  expect_rejected("precision = FP8 with e4m3 inputs", q, FLASHCORE_ERROR_INVALID_ARGUMENT, "precision");
  Problem p16 = make(128, false, 2, 4, 2, 128, 256);
  p16.in = FLASHCORE_DTYPE_BF16, p16.precision = FLASHCORE_PRECISION_FP8, p16.out_same = true, p16.name = "errors16";
  if (const std::string why = arguments_skip_reason(p16); !why.empty()) GTEST_SKIP() << why;
  const HostData h16 = make_inputs(p16, 2);
  DeviceProblem dev16;
  ASSERT_TRUE(dev16.upload(p16, h16));
  q = dev16.params;
  q.workspace = nullptr, q.workspace_size = 0;
  std::vector<uint16_t> o;
  std::vector<float> lse;
  const flashcore_status st = dev16.run(o, lse, &q);
  EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_last_error();
  EXPECT_NE(std::string(flashcore_last_error()).find("workspace"), std::string::npos) << flashcore_last_error();
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](uint16_t x) { return x == 0xFFFF; })) << "O was written";
  q = dev16.params;
  q.v_descale = dev.constant_descales(1.0f);
  EXPECT_EQ(dev16.run(o, lse, &q), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("v_descale"), std::string::npos) << flashcore_last_error();
}

// A good call after the rejected ones writes O (the errors leave no state behind).
TEST_F(Fp8Errors, GoodCallAfterErrors) {
  flashcore_attention_params bad = dev.params;
  bad.workspace = nullptr, bad.workspace_size = 0;
  std::vector<uint16_t> o;
  std::vector<float> lse;
  ASSERT_NE(dev.run(o, lse, &bad), FLASHCORE_SUCCESS);
  ASSERT_EQ(dev.run(o, lse), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_STREQ(flashcore_last_error(), "");
  const Verdict v = compare(p, h, o, lse, 1);
  EXPECT_TRUE(v.passed) << report(p, v, 1) << "\n  " << v.why;
}

// One workspace, zero-filled once, shared by precision = FP8 calls of different shapes on the causal (dynamic
// schedule) default, as the Python op and a serving engine use it: every call must find its scheduler's counter zero.
// (The counter once sat at a shape-dependent offset: the second shape read scratch bytes of the first and ran tiles
// that do not exist, an illegal address; found by the Python suite on the H200.) The first shape's output must come
// back bit-identical after the other shape ran in between.
TEST(Fp8Workspace, SharedAcrossShapesOfPrecisionFp8Calls) {
  FLASHCORE_REQUIRE_FP8(128, true);
  struct Shape {
    int64_t b, s, hq, hkv;
  };
  const Shape shapes[3] = {{2, 300, 8, 2}, {1, 1000, 4, 4}, {2, 300, 8, 2}};
  auto params_for = [](const Shape& sh, const void* q, const void* k, const void* v, void* o) {
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = q, p.k = k, p.v = v, p.o = o;
    p.batch = sh.b, p.seqlen_q = sh.s, p.seqlen_k = sh.s, p.num_heads_q = sh.hq, p.num_heads_kv = sh.hkv;
    p.head_dim = 128, p.dtype = FLASHCORE_DTYPE_BF16, p.causal = 1, p.precision = FLASHCORE_PRECISION_FP8;
    flashcore_attention_params_set_contiguous(&p, 0);
    return p;
  };
  // Buffers for the largest shape; inputs ~ N(0, 1) in bf16.
  const size_t elems = 2 * 1000 * 8 * 128;
  std::vector<uint16_t> host(elems);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (uint16_t& x : host) {
    const float f = normal(rng);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *ws = nullptr;
  for (void** ptr : {&q, &k, &v, &o}) ASSERT_EQ(cudaMalloc(ptr, elems * 2), cudaSuccess);
  for (void* ptr : {q, k, v}) ASSERT_EQ(cudaMemcpy(ptr, host.data(), elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  uint64_t ws_bytes = 0;
  for (const Shape& sh : shapes) {
    const flashcore_attention_params p = params_for(sh, q, k, v, o);
    uint64_t bytes = 0;
    ASSERT_EQ(flashcore_attention_workspace_size(&p, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
    ws_bytes = std::max(ws_bytes, bytes);
  }
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(ws, 0, ws_bytes), cudaSuccess);
  std::vector<std::vector<uint16_t>> outs;
  for (const Shape& sh : shapes) {
    flashcore_attention_params p = params_for(sh, q, k, v, o);
    p.workspace = ws, p.workspace_size = ws_bytes;
    const size_t n = static_cast<size_t>(sh.b * sh.s * sh.hq * 128);
    ASSERT_EQ(cudaMemset(o, 0xff, n * 2), cudaSuccess);  // NaN poison
    ASSERT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a precision = FP8 call after one of another shape failed";
    std::vector<uint16_t> out(n);
    ASSERT_EQ(cudaMemcpy(out.data(), o, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint16_t x : out) ASSERT_NE(x, 0xffffu) << "an O element was left unwritten";
    outs.push_back(std::move(out));
  }
  uint8_t head[256];
  ASSERT_EQ(cudaMemcpy(head, ws, sizeof(head), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::all_of(head, head + sizeof(head), [](uint8_t x) { return x == 0; }))
      << "the workspace's first 256 bytes must stay zero";
  EXPECT_TRUE(outs[0] == outs[2]) << "the first shape's O changed after a call of another shape on the same workspace";
  for (void* ptr : {q, k, v, o, ws}) cudaFree(ptr);
}

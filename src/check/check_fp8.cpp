// The 8-bit cases of `flashcore check`: list, runner and comparison (check_fp8.h).
#include "check/check_fp8.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include "core/dtype.h"
#include "check/check.h"
#include "check/check_util.h"
#include "reference/reference.h"

namespace flashcore::check::fp8 {

namespace ref = flashcore::reference;

namespace {

// An 8-bit float format: mantissa bits, exponent bias, the largest finite magnitude and its code.
struct Fp8Format {
  int man;
  int bias;
  float max_finite;
  uint8_t max_code;
};
constexpr Fp8Format kE4m3{3, 7, 448.0f, 0x7E};
constexpr Fp8Format kE5m2{2, 15, 57344.0f, 0x7B};

// The magnitude of a finite code whose sign bit is clear.
float decode_finite(uint8_t b, const Fp8Format& f) {
  const int e = b >> f.man, m = b & ((1 << f.man) - 1);
  return e == 0 ? std::ldexp(static_cast<float>(m), 1 - f.bias - f.man)
                : std::ldexp(1.0f + std::ldexp(static_cast<float>(m), -f.man), e - f.bias);
}

// Round to nearest even, saturating to the largest finite magnitude (as __nv_cvt_float_to_fp8 with
// __NV_SATFINITE); x is not NaN.
uint8_t encode(float x, const Fp8Format& f) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= f.max_finite) return sign | f.max_code;
  // Subnormal: a multiple of the smallest one (rounding up to the smallest normal gives that code too).
  if (a < std::ldexp(1.0f, 1 - f.bias)) {
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, f.bias - 1 + f.man)));
  }
  int e = 0;
  const float fr = std::frexp(a, &e);  // a = (2 fr) * 2^(e - 1)
  int exp = e - 1;
  int m = static_cast<int>(std::nearbyint(std::ldexp(2.0f * fr - 1.0f, f.man)));
  if (m == (1 << f.man)) m = 0, ++exp;
  const int code = ((exp + f.bias) << f.man) | m;
  return sign | static_cast<uint8_t>(code > f.max_code ? f.max_code : code);
}

}  // namespace

float e4m3_to_float(uint8_t b) {
  if ((b & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();  // no infinities in e4m3 ("fn")
  const float v = decode_finite(b & 0x7F, kE4m3);
  return (b & 0x80) ? -v : v;
}

uint8_t float_to_e4m3(float x) { return std::isnan(x) ? 0x7F : encode(x, kE4m3); }

float e5m2_to_float(uint8_t b) {
  float v;
  if ((b & 0x7C) == 0x7C) {  // exponent all ones: infinity (mantissa 0) or NaN
    v = (b & 3) == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else {
    v = decode_finite(b & 0x7F, kE5m2);
  }
  return (b & 0x80) ? -v : v;
}

uint8_t float_to_e5m2(float x) { return std::isnan(x) ? 0x7F : encode(x, kE5m2); }

float fp8_to_float(uint8_t bits, flashcore_dtype dtype) {
  return dtype == FLASHCORE_DTYPE_FP8_E5M2 ? e5m2_to_float(bits) : e4m3_to_float(bits);
}
uint8_t float_to_fp8(float x, flashcore_dtype dtype) {
  return dtype == FLASHCORE_DTYPE_FP8_E5M2 ? float_to_e5m2(x) : float_to_e4m3(x);
}

bool is_precision_fp8(const Case& c) { return c.precision == FLASHCORE_PRECISION_FP8; }
bool is_precision_int8(const Case& c) { return c.precision == FLASHCORE_PRECISION_INT8; }

flashcore_dtype resolved_out_dtype(const Case& c) { return flashcore::resolved_out_dtype(c.dtype, c.out_dtype); }

const char* precision_name(const Case& c) {
  return is_precision_fp8(c) ? "fp8" : is_precision_int8(c) ? "int8" : "native";
}

namespace {

const char* short_name(flashcore_dtype dt) {
  switch (dt) {
    case FLASHCORE_DTYPE_FP8_E4M3: return "e4m3";
    case FLASHCORE_DTYPE_FP8_E5M2: return "e5m2";
    case FLASHCORE_DTYPE_BF16: return "bf16";
    case FLASHCORE_DTYPE_FP16: return "fp16";
    default: return flashcore::dtype_name(dt);
  }
}

bool eight_bit(const Case& c) { return flashcore::is_8bit(c.dtype); }

// The key of the kernels a case runs in the kernel table: its 8-bit dtype, e4m3 for precision = FP8,
// FLASHCORE_DTYPE_INT8 (the int8 Q K^T kernels) for precision = INT8.
flashcore_dtype kernel_dtype(const Case& c) {
  if (eight_bit(c)) return c.dtype;
  return is_precision_int8(c) ? FLASHCORE_DTYPE_INT8 : FLASHCORE_DTYPE_FP8_E4M3;
}

}  // namespace

std::string case_name(const Case& c) {
  const char* precision = is_precision_fp8(c) ? "_fp8" : is_precision_int8(c) ? "_int8" : "";
  std::string n = std::string(short_name(c.dtype)) + precision + "_d" + std::to_string(c.head_dim) + "_b" +
                  std::to_string(c.batch) + "_h" + std::to_string(c.heads_q) + "x" + std::to_string(c.heads_kv) +
                  "_q" + std::to_string(c.seqlen_q) + "_k" + std::to_string(c.seqlen_k) +
                  (c.causal ? "_causal" : "_full") + (c.bhsd ? "_bhsd" : "_bshd") + "_o" +
                  short_name(resolved_out_dtype(c));
  if (!c.with_lse) n += "_nolse";
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = 'p';
  return n;
}

std::string describe(const Case& c) {
  std::ostringstream s;
  s << short_name(c.dtype);
  if (is_precision_fp8(c)) s << " precision=fp8";
  if (is_precision_int8(c)) s << " precision=int8";
  s << "->" << short_name(resolved_out_dtype(c)) << " B=" << c.batch << " Hq=" << c.heads_q << " Hkv=" << c.heads_kv
    << " Sq=" << c.seqlen_q << " Sk=" << c.seqlen_k << " D=" << c.head_dim << (c.causal ? " causal" : "")
    << (c.bhsd ? " bhsd" : " bshd");
  if (!c.with_lse) s << " no-lse";
  if (c.kernel_config != nullptr) s << " config=" << c.kernel_config;
  return s.str();
}

// ------------------------------------------------------------------------------------------------
// The list
// ------------------------------------------------------------------------------------------------
std::vector<Case> cases(bool quick) {
  std::vector<Case> list;
  std::set<std::string> names;
  // A 16-bit dtype runs with `precision` (FP8 unless given: 16-bit native cases are flashcore::check's).
  auto add = [&](int64_t D, bool causal, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk,
                 flashcore_dtype out, flashcore_dtype dtype = FLASHCORE_DTYPE_FP8_E4M3,
                 int32_t precision = FLASHCORE_PRECISION_FP8) -> Case& {
    Case c;
    c.head_dim = D, c.causal = causal, c.batch = B, c.heads_q = Hq, c.heads_kv = Hkv, c.seqlen_q = Sq, c.seqlen_k = Sk;
    c.dtype = dtype;
    c.out_dtype = out;
    if (!flashcore::is_8bit(dtype)) c.precision = precision;
    list.push_back(c);
    return list.back();
  };
  const int64_t dims[] = {64, 128, 256};
  const flashcore_dtype outs[] = {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16};
  const flashcore_dtype SAME = FLASHCORE_DTYPE_SAME;
  const int32_t int8 = FLASHCORE_PRECISION_INT8;
  if (quick) {
    int n = 0;
    for (int64_t D : dims)
      for (bool causal : {false, true}) add(D, causal, 2, 2, 2, 113, 113, outs[n++ % 2]);
    add(128, true, 1, 4, 2, 95, 33, FLASHCORE_DTYPE_BF16).bhsd = true;  // rows that see no key
    add(256, false, 1, 4, 1, 33, 95, FLASHCORE_DTYPE_FP16);
    add(128, true, 1, 4, 2, 65, 65, SAME, FLASHCORE_DTYPE_BF16);
    add(128, false, 1, 2, 2, 33, 95, SAME, FLASHCORE_DTYPE_FP16);
    add(64, true, 1, 4, 2, 113, 113, SAME, FLASHCORE_DTYPE_FP8_E5M2);
    add(256, false, 1, 4, 1, 33, 95, FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_FP8_E5M2);
    add(128, true, 1, 4, 2, 65, 65, SAME, FLASHCORE_DTYPE_BF16, int8);
    add(64, false, 1, 2, 2, 33, 95, SAME, FLASHCORE_DTYPE_FP16, int8);
  } else {
    // 1. Head dim x causal x O dtype x seqlen (square), alternating layouts.
    const int64_t seqlens[] = {1, 17, 113, 1000, 4097};
    for (int64_t D : dims)
      for (bool causal : {false, true})
        for (flashcore_dtype out : outs)
          for (size_t i = 0; i < std::size(seqlens); ++i) {
            const int64_t S = seqlens[i];
            add(D, causal, S <= 113 ? 2 : 1, 2, 2, S, S, out).bhsd = (i + (out == outs[1])) % 2 == 1;
          }
    // 2. seqlen_q != seqlen_k both ways (causal with Sq > Sk: rows that see no key).
    const int64_t pairs[][2] = {{1, 4097}, {17, 1000}, {113, 300}, {300, 113}, {1000, 17}, {4097, 113}, {128, 1}};
    int n = 0;
    for (const auto& pr : pairs)
      for (bool causal : {false, true}) {
        add(dims[n % 3], causal, 1, 4, 2, pr[0], pr[1], outs[n % 2]).bhsd = n % 3 == 2;
        ++n;
      }
    // 3. GQA 4, MQA; batch 5 (descales differ per batch and KV head); no LSE; O in the default (SAME).
    for (int64_t D : dims)
      for (bool causal : {false, true}) {
        add(D, causal, 2, 8, 2, 300, 300, outs[n++ % 2]);
        add(D, causal, 1, 4, 1, 129, 200, outs[n++ % 2]).bhsd = true;
      }
    for (bool causal : {false, true}) {
      add(128, causal, 5, 4, 2, 96, 160, SAME);
      add(256, causal, 2, 2, 1, 100, 300, FLASHCORE_DTYPE_FP16).with_lse = false;
    }
    // 4. precision = FP8 from both 16-bit dtypes (O in the input dtype).
    for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
      for (int64_t D : dims)
        for (bool causal : {false, true}) {
          add(D, causal, 2, 4, 2, 113, 113, SAME, in);
          add(D, causal, 1, 8, 2, 17, 300, SAME, in);
        }
    add(128, true, 1, 2, 2, 4097, 4097, SAME, FLASHCORE_DTYPE_BF16);
    add(256, false, 1, 4, 2, 300, 113, SAME, FLASHCORE_DTYPE_FP16).bhsd = true;
    // 4b. precision = INT8 (int8 Q K^T, P V in 16 bits) likewise; O is always in the input dtype.
    for (flashcore_dtype in : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16})
      for (int64_t D : dims)
        for (bool causal : {false, true}) {
          add(D, causal, 2, 4, 2, 113, 113, SAME, in, int8);
          add(D, causal, 1, 8, 2, 17, 300, SAME, in, int8);
        }
    add(128, true, 1, 2, 2, 4097, 4097, SAME, FLASHCORE_DTYPE_FP16, int8);
    add(256, false, 1, 4, 2, 300, 113, SAME, FLASHCORE_DTYPE_BF16, int8).bhsd = true;
    // 5. e5m2 inputs: every head dim x causal at an odd length, GQA, Sq != Sk both ways, BHSD, O in fp16.
    const flashcore_dtype e5m2 = FLASHCORE_DTYPE_FP8_E5M2;
    for (int64_t D : dims)
      for (bool causal : {false, true}) {
        add(D, causal, 2, 8, 2, 113, 113, outs[n++ % 2], e5m2);
        add(D, causal, 1, 4, 1, 17, 1000, outs[n++ % 2], e5m2).bhsd = true;
        add(D, causal, 1, 4, 2, 1000, 17, SAME, e5m2);
      }
    add(128, true, 1, 2, 2, 4097, 4097, SAME, e5m2);
  }
  for (Case& c : list) {
    std::string name = case_name(c), base = name;
    for (int k = 2; !names.insert(name).second; ++k) name = base + "_" + std::to_string(k);
    c.name = name;
  }
  return list;
}

// ------------------------------------------------------------------------------------------------
// Rows, tolerances
// ------------------------------------------------------------------------------------------------
using detail::splitmix;

// The 16-bit sweep's rule, on the same sizes.
std::vector<int64_t> checked_rows(const Case& c, uint64_t seed) {
  flashcore::check::Case same;
  same.seqlen_q = c.seqlen_q, same.seqlen_k = c.seqlen_k, same.causal = c.causal;
  return flashcore::check::checked_rows(same, seed);
}

Tolerance tolerance(const Case& c) {
  if (is_precision_fp8(c)) return {0.07, 0.2, 2e-2, 0.25, 0.0};
  // int8 Q per token and K per 128 keys: scores off by ~1% of their spread; P V in 16 bits.
  if (is_precision_int8(c)) return {0.025, 0.08, 1e-2, 0.1, 0.0};
  return {0.035, 0.08, 1e-2, 2e-2, 2e-3};
}

// ------------------------------------------------------------------------------------------------
// The runner
// ------------------------------------------------------------------------------------------------
std::string skip_reason(int64_t head_dim, bool causal, flashcore_dtype dtype) {
  int32_t count = 0;
  // The library's own device checks first (driver, device, backend table), as any caller would see them.
  if (flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 128, 0, nullptr, 0, &count) != FLASHCORE_SUCCESS)
    return flashcore_last_error();
  if (std::string why = detail::sm90_skip_reason("the 8-bit path needs"); !why.empty()) return why;
  if (flashcore_list_kernel_configs(dtype, static_cast<int32_t>(head_dim), causal ? 1 : 0, nullptr, 0, &count) !=
      FLASHCORE_SUCCESS)
    return flashcore_last_error();
  if (count == 0)
    return std::string("no ") + (dtype == FLASHCORE_DTYPE_INT8 ? "int8 Q K^T (precision = INT8)" : short_name(dtype)) +
           " kernel for head_dim " + std::to_string(head_dim) + (causal ? " causal" : "") + " in this build";
  return "";
}

namespace {

using DeviceMem = detail::DeviceBuffer;

void append(std::string& msg, const std::string& part) { msg += (msg.empty() ? "" : "; ") + part; }

bool cuda_ok(cudaError_t e, const char* what, Result& r) {
  if (e == cudaSuccess) return true;
  r.passed = false;
  append(r.message, std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  return false;
}

std::string fmt(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", x);
  return buf;
}

flashcore_tensor_strides strides(const Case& c, int64_t S, int64_t H) {
  const int64_t D = c.head_dim;
  if (c.bhsd) return {H * S * D, D, S * D, 1};
  return {S * H * D, H * D, D, 1};
}

int64_t at(const flashcore_tensor_strides& s, int64_t b, int64_t i, int64_t h, int64_t d) {
  return b * s.batch + i * s.seq + h * s.head + d;
}

uint16_t to_16bit(float x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::float_to_half(x) : ref::float_to_bf16(x);
}
float from_16bit(uint16_t x, flashcore_dtype dt) {
  return dt == FLASHCORE_DTYPE_FP16 ? ref::half_to_float(x) : ref::bf16_to_float(x);
}

}  // namespace

Result run_case(const Case& c, uint64_t seed, int repeats) {
  Result r;
  r.seed = seed;
  const int64_t B = c.batch, Sq = c.seqlen_q, Sk = c.seqlen_k, Hq = c.heads_q, Hkv = c.heads_kv, D = c.head_dim;
  if (B <= 0 || Sq <= 0 || Sk <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0 || Hq % Hkv != 0) {
    r.message = "invalid case: " + describe(c);
    return r;
  }
  if (std::string why = skip_reason(D, c.causal, kernel_dtype(c)); !why.empty()) {
    r.skipped = true, r.message = why;
    return r;
  }
  // 8-bit inputs (e4m3 or e5m2) with descales; otherwise 16-bit inputs that precision = FP8 / INT8 quantizes itself
  // (no descales), judged against the reference of the unquantized values.
  const bool e4m3 = eight_bit(c);
  if (!e4m3 && (c.dtype != FLASHCORE_DTYPE_FP16 && c.dtype != FLASHCORE_DTYPE_BF16)) {
    r.message = std::string("no input generator for dtype ") + flashcore::dtype_name(c.dtype);
    return r;
  }
  const flashcore_dtype out = resolved_out_dtype(c);
  const size_t eb = e4m3 ? 1 : 2;
  const flashcore_tensor_strides qs = strides(c, Sq, Hq), ks = strides(c, Sk, Hkv), os = qs;
  const int64_t nq = B * Sq * Hq * D, nkv = B * Sk * Hkv * D, nlse = c.with_lse ? B * Hq * Sq : 0;

  // Inputs (in the layout), the real values (dense BSHD) for the reference, the descales.
  std::mt19937_64 rng(splitmix(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k64(32, 128);
  std::vector<float> qd, kd, vd;
  if (e4m3) {
    for (std::vector<float>* d : {&qd, &kd, &vd}) {
      d->resize(static_cast<size_t>(B * Hkv));
      for (float& x : *d) x = static_cast<float>(k64(rng)) / 64.0f / 64.0f;  // exact products with e4m3 values
    }
  }
  std::vector<uint8_t> hq(static_cast<size_t>(nq) * eb), hk(static_cast<size_t>(nkv) * eb),
      hv(static_cast<size_t>(nkv) * eb);
  std::vector<float> fq(static_cast<size_t>(nq)), fk(static_cast<size_t>(nkv)), fv(static_cast<size_t>(nkv));
  const int64_t group = Hq / Hkv;
  auto fill = [&](bool is_q, int64_t S, int64_t H, const flashcore_tensor_strides& st, std::vector<uint8_t>& bytes,
                  std::vector<float>& real, const std::vector<float>& descale) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < S; ++i)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const size_t pos = static_cast<size_t>(at(st, b, i, h, d));
            const size_t dense = static_cast<size_t>(((b * S + i) * H + h) * D + d);
            if (e4m3) {
              const uint8_t code = float_to_fp8(64.0f * normal(rng), c.dtype);
              bytes[pos] = code;
              real[dense] = fp8_to_float(code, c.dtype) * descale[static_cast<size_t>(b * Hkv + (is_q ? h / group : h))];
            } else {
              const uint16_t x = to_16bit(normal(rng), c.dtype);
              std::memcpy(&bytes[pos * 2], &x, 2);
              real[dense] = from_16bit(x, c.dtype);
            }
          }
  };
  fill(true, Sq, Hq, qs, hq, fq, qd);
  fill(false, Sk, Hkv, ks, hk, fk, kd);
  fill(false, Sk, Hkv, ks, hv, fv, vd);

  DeviceMem dq, dk, dv, dout, dlse, dqd, dkd, dvd, dws;
  if (!cuda_ok(cudaMalloc(&dq.ptr, hq.size()), "cudaMalloc(q)", r) ||
      !cuda_ok(cudaMalloc(&dk.ptr, hk.size()), "cudaMalloc(k)", r) ||
      !cuda_ok(cudaMalloc(&dv.ptr, hv.size()), "cudaMalloc(v)", r) ||
      !cuda_ok(cudaMalloc(&dout.ptr, static_cast<size_t>(nq) * 2), "cudaMalloc(o)", r) ||
      (nlse && !cuda_ok(cudaMalloc(&dlse.ptr, static_cast<size_t>(nlse) * 4), "cudaMalloc(lse)", r)) ||
      !cuda_ok(cudaMemcpy(dq.ptr, hq.data(), hq.size(), cudaMemcpyHostToDevice), "cudaMemcpy(q)", r) ||
      !cuda_ok(cudaMemcpy(dk.ptr, hk.data(), hk.size(), cudaMemcpyHostToDevice), "cudaMemcpy(k)", r) ||
      !cuda_ok(cudaMemcpy(dv.ptr, hv.data(), hv.size(), cudaMemcpyHostToDevice), "cudaMemcpy(v)", r))
    return r;
  if (e4m3) {
    const size_t bytes = static_cast<size_t>(B * Hkv) * 4;
    if (!cuda_ok(cudaMalloc(&dqd.ptr, bytes), "cudaMalloc(q_descale)", r) ||
        !cuda_ok(cudaMalloc(&dkd.ptr, bytes), "cudaMalloc(k_descale)", r) ||
        !cuda_ok(cudaMalloc(&dvd.ptr, bytes), "cudaMalloc(v_descale)", r) ||
        !cuda_ok(cudaMemcpy(dqd.ptr, qd.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(q_descale)", r) ||
        !cuda_ok(cudaMemcpy(dkd.ptr, kd.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(k_descale)", r) ||
        !cuda_ok(cudaMemcpy(dvd.ptr, vd.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy(v_descale)", r))
      return r;
  }

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = dq.ptr, p.k = dk.ptr, p.v = dv.ptr, p.o = dout.ptr, p.lse = static_cast<float*>(dlse.ptr);
  p.lse_capacity = nlse;
  p.q_strides = qs, p.k_strides = p.v_strides = ks, p.o_strides = os;
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
  p.dtype = c.dtype, p.out_dtype = c.out_dtype, p.precision = c.precision, p.causal = c.causal ? 1 : 0;
  p.q_descale = static_cast<const float*>(dqd.ptr);
  p.k_descale = static_cast<const float*>(dkd.ptr);
  p.v_descale = static_cast<const float*>(dvd.ptr);
  p.kernel_config = c.kernel_config;
  uint64_t ws_bytes = 0;
  if (!detail::validate_and_size(p, ws_bytes, r)) return r;
  if (ws_bytes > 0) {
    if (!cuda_ok(cudaMalloc(&dws.ptr, ws_bytes), "cudaMalloc(workspace)", r) ||
        !cuda_ok(cudaMemset(dws.ptr, 0, ws_bytes), "cudaMemset(workspace)", r))
      return r;
    p.workspace = dws.ptr, p.workspace_size = ws_bytes;
  }

  // Run `repeats` times, O and LSE poisoned (0xFF bytes: NaN) before every call.
  detail::OwnedStream stream;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", r)) return r;
  std::vector<uint16_t> ho(static_cast<size_t>(nq)), first_o;
  std::vector<float> hlse(static_cast<size_t>(nlse)), first_lse;
  for (int rep = 0; rep < std::max(1, repeats); ++rep) {
    if (!cuda_ok(cudaMemsetAsync(dout.ptr, 0xFF, ho.size() * 2, stream.stream), "cudaMemsetAsync(o)", r) ||
        (nlse && !cuda_ok(cudaMemsetAsync(dlse.ptr, 0xFF, hlse.size() * 4, stream.stream), "cudaMemsetAsync(lse)", r)))
      return r;
    const flashcore_status fs = flashcore_attention_forward(&p, reinterpret_cast<flashcore_stream_t>(stream.stream));
    if (fs != FLASHCORE_SUCCESS) {
      r.message =
          std::string("flashcore_attention_forward: ") + flashcore_status_string(fs) + ": " + flashcore_last_error();
      return r;
    }
    if (!cuda_ok(cudaGetLastError(), "kernel launch", r) ||
        !cuda_ok(cudaMemcpyAsync(ho.data(), dout.ptr, ho.size() * 2, cudaMemcpyDeviceToHost, stream.stream),
                 "cudaMemcpyAsync(o)", r) ||
        (nlse && !cuda_ok(cudaMemcpyAsync(hlse.data(), dlse.ptr, hlse.size() * 4, cudaMemcpyDeviceToHost, stream.stream),
                          "cudaMemcpyAsync(lse)", r)) ||
        !cuda_ok(cudaStreamSynchronize(stream.stream), "cudaStreamSynchronize (kernel execution)", r))
      return r;
    if (rep == 0) {
      first_o = ho, first_lse = hlse;
    } else if (ho != first_o || std::memcmp(hlse.data(), first_lse.data(), hlse.size() * 4) != 0) {
      if (r.deterministic) append(r.message, "run " + std::to_string(rep) + " is not bit-identical to run 0");
      r.deterministic = false;
    }
  }

  // Whole buffers: written, finite, exact on rows that see no key.
  auto visible = [&](int64_t i) { return c.causal ? std::clamp<int64_t>(i + Sk - Sq + 1, 0, Sk) : Sk; };
  int64_t unwritten = 0, nonfinite = 0, masked_bad = 0, lse_bad = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sq; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        const bool masked = visible(i) == 0;
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t bits = first_o[static_cast<size_t>(at(os, b, i, h, d))];
          const float x = from_16bit(bits, out);
          unwritten += bits == 0xFFFF;
          nonfinite += bits != 0xFFFF && !std::isfinite(x);
          masked_bad += masked && std::isfinite(x) && x != 0.0f;
        }
        if (!nlse) continue;
        const float l = first_lse[static_cast<size_t>((b * Hq + h) * Sq + i)];
        lse_bad += masked ? l != -std::numeric_limits<float>::infinity() : !std::isfinite(l);
      }
  r.unwritten = unwritten > 0, r.nonfinite = nonfinite > 0;
  if (unwritten) append(r.message, std::to_string(unwritten) + " O elements kept the NaN poison (unwritten)");
  if (nonfinite) append(r.message, std::to_string(nonfinite) + " O elements are NaN/Inf");
  if (masked_bad) append(r.message, std::to_string(masked_bad) + " O elements of rows that see no key are not 0");
  if (lse_bad)
    append(r.message, std::to_string(lse_bad) + " LSE entries unwritten, non-finite, or not -inf on rows without keys");

  // The reference on the checked rows.
  flashcore_attention_params host;
  flashcore_attention_params_init(&host);
  host.q = fq.data(), host.k = fk.data(), host.v = fv.data();
  host.q_strides = {Sq * Hq * D, Hq * D, D, 1};
  host.k_strides = host.v_strides = {Sk * Hkv * D, Hkv * D, D, 1};
  host.batch = B, host.seqlen_q = Sq, host.seqlen_k = Sk, host.num_heads_q = Hq, host.num_heads_kv = Hkv;
  host.head_dim = D, host.dtype = FLASHCORE_DTYPE_FP32, host.causal = c.causal ? 1 : 0;
  std::vector<int64_t> rows = checked_rows(c, seed);
  const ref::Output want = ref::attention(host, rows);
  if (rows.empty())
    for (int64_t i = 0; i < Sq; ++i) rows.push_back(i);
  r.rows_checked = static_cast<int64_t>(rows.size());
  const Tolerance tol = tolerance(c);
  double err2 = 0, ref2 = 0, lse_ratio = 0;
  std::string worst;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i : rows) {
        for (int64_t d = 0; d < D; ++d) {
          const double w = want.o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D + d)];
          const double g = from_16bit(first_o[static_cast<size_t>(at(os, b, i, h, d))], out);
          const double e = std::isfinite(g) ? std::fabs(g - w) : std::numeric_limits<double>::infinity();
          err2 += e * e, ref2 += w * w;
          r.max_ref = std::max(r.max_ref, std::fabs(w));
          if (!(e <= r.o_err)) {
            r.o_err = e;
            worst = "b=" + std::to_string(b) + " h=" + std::to_string(h) + " row=" + std::to_string(i) + " d=" +
                    std::to_string(d) + ": got " + fmt(g) + ", want " + fmt(w);
          }
        }
        if (!nlse) continue;
        const double w = want.lse[static_cast<size_t>((b * Hq + h) * Sq + i)];
        if (!std::isfinite(w)) continue;
        const double g = first_lse[static_cast<size_t>((b * Hq + h) * Sq + i)];
        const double e = std::isfinite(g) ? std::fabs(g - w) : std::numeric_limits<double>::infinity();
        const double t = tol.lse_abs + tol.lse_rel * std::fabs(w);
        if (!(e / t <= lse_ratio)) lse_ratio = e / t, r.lse_err = e, r.lse_tol = t;
      }
  if (nlse && r.lse_tol == 0) r.lse_tol = tol.lse_abs;
  r.rel_rmse = ref2 > 0 ? std::sqrt(err2 / ref2) : (err2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  r.rel_rmse_tol = tol.rel_rmse;
  r.o_tol = tol.max_rel * r.max_ref + tol.max_abs;
  const bool rmse_ok = r.rel_rmse <= r.rel_rmse_tol, max_ok = r.o_err <= r.o_tol, lse_ok = lse_ratio <= 1.0;
  if (!rmse_ok) append(r.message, "relative RMSE " + fmt(r.rel_rmse) + " > " + fmt(r.rel_rmse_tol));
  if (!max_ok) append(r.message, "max |O - ref| " + fmt(r.o_err) + " > " + fmt(r.o_tol) + " (worst at " + worst + ")");
  if (!lse_ok) append(r.message, "LSE error " + fmt(r.lse_err) + " > " + fmt(r.lse_tol));
  r.passed = rmse_ok && max_ok && lse_ok && !unwritten && !nonfinite && !masked_bad && !lse_bad && r.deterministic;
  return r;
}

}  // namespace flashcore::check::fp8

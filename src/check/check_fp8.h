// The 8-bit cases of `flashcore check` (and of `flashcore bench --check` for e4m3 / precision fp8 / int8 rows): the
// e4m3 path with per-(batch, KV head) descales judged against the float64 reference (src/reference) of the dequantized
// inputs, and precision = FP8 / INT8 (16-bit inputs quantized by the library) against the float64 reference of the
// unquantized inputs. flashcore::check (src/check) covers the 16-bit path; this is its 8-bit counterpart, with the
// 8-bit tolerance rule (tests/gpu/test_fp8.cpp's):
//   e4m3 inputs:      relative RMSE of O <= 0.035, max |O - ref| <= 0.08 * max |ref| + 1e-2,
//                     |LSE - ref| <= 2e-2 + 2e-3 * |ref|
//   precision = FP8:  relative RMSE of O <= 0.07, max |O - ref| <= 0.2 * max |ref| + 2e-2, |LSE - ref| <= 0.25
//   precision = INT8: relative RMSE of O <= 0.025, max |O - ref| <= 0.08 * max |ref| + 1e-2, |LSE - ref| <= 0.1
//                     (int8 Q per token and K per 128 keys: scores off by ~1% of their spread; P V in 16 bits)
// (on the e4m3 paths P, the softmax probabilities, is rounded to e4m3 before the P*V product, as in
// FlashAttention-3's FP8 path), and the rules of the 16-bit sweep: O and LSE poisoned (NaN) before every call and
// every element written, O finite, O = 0 / LSE = -inf exactly on rows that see no key, bit-identical repeats.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::check::fp8 {

// e4m3 ("fn": no infinities, NaN = S.1111.111, largest finite 448), exact on the host.
float e4m3_to_float(uint8_t bits);
// Round to nearest even, saturating to +-448 (as __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN -> 0x7F.
uint8_t float_to_e4m3(float x);
// e5m2 (IEEE-like: S.11111.00 infinities, S.11111.xx NaN, largest finite 57344), exact on the host.
float e5m2_to_float(uint8_t bits);
// Round to nearest even, saturating to +-57344 (as __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN -> 0x7F.
uint8_t float_to_e5m2(float x);
// The codec of an 8-bit dtype (FLASHCORE_DTYPE_FP8_E4M3 or _E5M2).
float fp8_to_float(uint8_t bits, flashcore_dtype dtype);
uint8_t float_to_fp8(float x, flashcore_dtype dtype);

struct Case {
  std::string name;  // [A-Za-z0-9_] (case_name)
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1, head_dim = 128;
  bool causal = false;
  bool bhsd = false;
  bool with_lse = true;
  // FLASHCORE_DTYPE_FP8_E4M3 / _E5M2: 8-bit inputs (~N(0, 1) * 64, rounded, saturated) with descales (k / 64) / 64, k
  // uniform in [32, 128], per (batch, KV head): real values ~N(0, 1) * [0.5, 2]. FP16 / BF16: N(0, 1) inputs, run
  // with precision.
  flashcore_dtype dtype = FLASHCORE_DTYPE_FP8_E4M3;
  int32_t precision = FLASHCORE_PRECISION_NATIVE;  // FLASHCORE_PRECISION_FP8 or _INT8 with a 16-bit dtype
  flashcore_dtype out_dtype = FLASHCORE_DTYPE_SAME;  // passed as is (SAME: bf16 for e4m3, the input dtype otherwise)
  const char* kernel_config = nullptr;  // a name from flashcore_list_kernel_configs (nullptr: the default); the
                                        // autotuner's gate (`flashcore tune --dtype e4m3`)
};

// O's dtype: out_dtype, or what SAME means for the case.
flashcore_dtype resolved_out_dtype(const Case& c);
// True for a precision = FP8 case.
bool is_precision_fp8(const Case& c);
// True for a precision = INT8 case.
bool is_precision_int8(const Case& c);

// "e4m3_d128_b2_h4x2_q113_k113_causal_bshd_obf16", "bf16_fp8_d128_...", "bf16_int8_d128_...": unique per shape and
// options.
std::string case_name(const Case& c);
// "e4m3->bf16 B=2 Hq=4 Hkv=2 Sq=113 Sk=113 D=128 causal bshd", "bf16 precision=fp8 ...", "bf16 precision=int8 ...".
std::string describe(const Case& c);
// "fp8_e4m3" / "bf16" ... and "native" / "fp8" / "int8": the case's dtype and precision words (for JSON / CSV).
const char* precision_name(const Case& c);

// The list `flashcore check` adds to flashcore::check::cases: quick = a few small ones (every head dim x causal, O in
// both 16-bit dtypes, rows without keys, precision = FP8 and precision = INT8 from both 16-bit dtypes); full = the
// grid of head dims x causal x O dtype x seqlens 1, 17, 113, 1000, 4097, GQA / MQA, seqlen_q != seqlen_k both ways,
// BHSD, batch 5, precision = FP8 and precision = INT8 cases. Cases for head dims or dtypes this build lacks are in
// the list; run_case skips them.
std::vector<Case> cases(bool quick);

// Query rows compared against the reference, for every batch and head: empty = all, used when
// seqlen_q * seqlen_k <= 256 * 256 or seqlen_q <= 64; otherwise 64 rows: the first two, the last two, the 64-row
// tile edges up to 256, the last tile's edges, the first rows that see a key (causal, Sq > Sk), and random rows of
// `seed` (the rule of flashcore::check::checked_rows).
std::vector<int64_t> checked_rows(const Case& c, uint64_t seed);

struct Tolerance {
  double rel_rmse, max_rel, max_abs, lse_abs, lse_rel;
};
Tolerance tolerance(const Case& c);

struct Result {
  bool passed = false;
  bool skipped = false;          // no device / no sm90 backend / not compiled in (message: why)
  double rel_rmse = 0, rel_rmse_tol = 0;
  double o_err = 0, o_tol = 0;   // max |O - ref| and its bound (max_rel * max |ref| + max_abs)
  double max_ref = 0;
  double lse_err = 0, lse_tol = 0;  // max |LSE - ref| over finite entries, and the bound at that entry
  bool deterministic = true;
  bool unwritten = false, nonfinite = false;
  int64_t rows_checked = 0;
  uint64_t seed = 0;
  std::string message;  // why it failed / was skipped ("" when it passed)
};

// Fresh inputs from `seed`, a zero-filled workspace of flashcore_attention_workspace_size bytes, O and LSE poisoned
// before every call, `repeats` calls (bit-identical), the comparison above. Runs on a private stream.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);

// "" when an 8-bit case of (head_dim, causal) can run here; else why not (no device, not the sm90 backend, no kernel
// of the 8-bit dtype compiled for it). precision = FP8 runs the e4m3 kernels, precision = INT8 the int8 Q K^T ones
// (dtype FLASHCORE_DTYPE_INT8, their key in the kernel table).
std::string skip_reason(int64_t head_dim, bool causal, flashcore_dtype dtype = FLASHCORE_DTYPE_FP8_E4M3);

}  // namespace flashcore::check::fp8

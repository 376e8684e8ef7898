// The correctness sweep shared by the GPU test suite and `flashcore check`: one case list, one runner.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::check {

enum class Layout { BSHD, BHSD };

struct Case {
  std::string name;
  int64_t batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 1, heads_kv = 1, head_dim = 128;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  bool causal = false;
  Layout layout = Layout::BSHD;
  float input_scale = 1.0f;    // inputs ~ N(0, 1) * input_scale (30 for the large-magnitude cases)
  float softmax_scale = 0.0f;  // 0 = default 1/sqrt(head_dim)
  bool with_lse = true;
};

// The list. `quick` = a small subset for sanitizers/smoke runs (every dtype x head dim x causal, small
// shapes). The full list covers the GPU-suite requirements of issue #3.
std::vector<Case> cases(bool quick);

// "B,H,S,D[,Hkv[,Sk]]" -> Case, with dtype and causal given. Returns false and sets err on a bad string.
bool parse_shape(const std::string& text, Case& out, std::string& err);

struct Result {
  bool passed = false;
  bool skipped = false;      // e.g. no device / not compiled in
  double o_err = 0, o_tol = 0;      // max |O - ref| and the allowed bound
  double lse_err = 0, lse_tol = 0;  // max |LSE - ref| over finite entries and the bound
  double lowp_o_err = 0;            // the low-precision yardstick's own error
  bool nonfinite = false;    // NaN/Inf in output where the reference is finite
  bool unwritten = false;    // an output element kept its poison value
  bool deterministic = true; // bit-identical over the requested repeats
  std::string message;       // why it failed / was skipped
};

// Allocate device buffers, fill fresh random inputs (seed), poison O and LSE with NaN before every call,
// run flashcore_attention_forward, compare against the float64 reference (on a sample of rows when the
// problem is large), and, when repeats > 1, check bit-exact determinism over `repeats` runs.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);

std::string describe(const Case& c);  // one line, e.g. "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 causal bshd"

}  // namespace flashcore::check

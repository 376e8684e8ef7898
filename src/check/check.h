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
  const char* kernel_config = nullptr;  // a name from flashcore_list_kernel_configs (nullptr: the default)
  // A KV cache's lengths (flashcore_attention_params::seqused_k), one per batch entry; empty: not given. The K/V
  // rows past each length are filled with NaN, which must never reach O or LSE.
  std::vector<int32_t> seqused_k;
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
  std::string message;       // why it failed / was skipped ("" when it passed)
  // Extensions (appended; older fields unchanged):
  double lowp_lse_err = 0;   // the yardstick's own relative LSE error
  int64_t rows_checked = 0;  // query rows compared against the reference per (batch, head)
  uint64_t seed = 0;         // the seed the inputs came from (to reproduce a failure)
};

// Allocate device buffers, fill fresh random inputs (seed), poison O and LSE with NaN before every call,
// run flashcore_attention_forward, compare against the float64 reference (on a sample of rows when the
// problem is large), and, when repeats > 1, check bit-exact determinism over `repeats` runs.
//
// Tolerances (see check.cpp): o_err <= 2 * lowp_o_err + atol (atol 1e-3 fp16, 4e-3 bf16), where lowp_o_err
// is the error of reference::attention_lowp(); lse_err (relative to max(1, |ref|)) <= 2 * lowp_lse_err + 1e-3.
// Skipped (skipped = true, message = reason) without an sm_90 device, or when flashcore_attention_validate
// reports the (dtype, head_dim) as not compiled in. Runs on a private non-blocking stream.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);

// The same, enqueued on `stream` (nullptr = the legacy default stream), which the caller owns.
Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t stream);

// The query rows run_case compares against the reference (for every batch and head): empty = all rows,
// used when Sq * Sk <= 256 * 256 or Sq <= 64; otherwise 64 rows: 0, 1, Sq-2, Sq-1, the 64-row tile edges
// 63/64, 127/128, 191/192, 255/256, the edges of the last tile, the first rows that see a key (causal,
// Sq > Sk), and random rows drawn from `seed`.
std::vector<int64_t> checked_rows(const Case& c, uint64_t seed);

// Why GPU cases cannot run here ("" when an sm_90 device is present), e.g. "no CUDA device (...)".
std::string device_skip_reason();

std::string describe(const Case& c);  // one line, e.g. "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 causal bshd"

}  // namespace flashcore::check

// The backward pass's correctness runner (flashcore_attention_backward), shared by `flashcore check --mode bwd` and
// `flashcore bench --mode bwd --check`: random inputs, the forward for O and LSE, the backward, and dQ, dK, dV (and,
// with sinks, dL/dsinks) against the float64 reference (reference::attention_backward, attention_backward_sinks).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check/check.h"
#include "flashcore/flashcore.h"

namespace flashcore::check::bwd {

// Tolerance (see check_bwd.cpp for the derivation): for each of dQ, dK and dV,
//   err = max |dX - dX_ref| / max |dX_ref|        (max over every element of the tensor; dX_ref float64)
//   pass iff err <= tolerance(dtype):  2.5e-3 (fp16), 2e-2 (bf16)
// and beyond it: every element written (not the NaN poison), finite, and dQ exactly 0 on query rows that see no key
// (causal or a window leaving the row no key). A window and sinks keep the same bound; softcap adds the kernel's
// tanh.approx error (relative 2^-11 of every capped score, which the float64 reference does not have):
//   tolerance(dtype) + 0.5 * 2^-11 * max |softcap * tanh(s / softcap)|   (softcap_tolerance; the max over the
//   (query, key) pairs the case's rows see; check_bwd.cpp derives the factor 0.5)
// dL/dsinks (cases with sinks; num_heads_q floats):
//   err = max_h |dsinks[h] - ref[h]| / max_h |ref[h]|
//   pass iff err <= tol + eps * max_h A_h / max_h |ref[h]|,  tol the case's bound above (tolerance(dtype), or
//   softcap_tolerance), eps = 2^-8 (bf16) / 2^-11 (fp16),
//   A_h = sum over the rows i of head h (every batch entry) of |exp(sinks[h] - LSE_i) * rowsum(dO_i * O_i)|, over the
//   O and LSE the library's forward wrote (one rounding of the stored O per term), and every entry written and finite.
double tolerance(flashcore_dtype dtype);
// eps above: the relative rounding of the O the forward stores in `dtype` (2^-8 bf16, 2^-11 fp16).
double dsinks_o_rounding(flashcore_dtype dtype);
// The bound of a softcap case (dQ, dK, dV, and dsinks' first part): tolerance(dtype) + 0.5 * 2^-11 * max_capped_score.
double softcap_tolerance(flashcore_dtype dtype, double max_capped_score);

struct Result {
  bool passed = false;
  bool skipped = false;          // no device, or the library's backward does not take this case (head dim, dtype, arch)
  double dq_err = 0, dk_err = 0, dv_err = 0;  // max |dX - ref| / max |ref| (the worse of the deterministic=0 and =1 runs)
  double dq_max = 0, dk_max = 0, dv_max = 0;  // max |ref|: the scale of each error
  double tol = 0;                // the bound on each of the three errors (softcap: softcap_tolerance)
  bool nonfinite = false;        // NaN/Inf in dQ, dK, dV or dsinks
  bool unwritten = false;        // an element kept its poison
  bool masked_bad = false;       // dQ not 0 on a row that sees no key
  bool deterministic = true;     // the deterministic=1 runs: dQ, dK, dV (and dsinks) bit-identical (repeats > 1)
  bool dkdv_deterministic = true;  // the deterministic=0 runs: dK, dV (and dsinks) bit-identical (repeats > 1)
  int runs = 0;                  // backward calls per mode (deterministic = 1, then 0)
  uint64_t workspace_bytes = 0;  // flashcore_attention_backward_workspace_size
  uint64_t seed = 0;
  std::string message;           // why it failed / was skipped ("" when it passed)
  // Cases with sinks: dL/dsinks (asked for with params.dsinks), NaN when the case has no sinks or it did not run.
  bool with_dsinks = false;      // the case has sinks: dsinks was asked for and judged
  double dsinks_err = NAN;       // max_h |dsinks - ref| / max_h |ref| (the worse of every run)
  double dsinks_max = NAN;       // max_h |ref|
  double dsinks_tol = NAN;       // its bound: tol + eps * max_h A_h / max_h |ref| (see tolerance())
};

// The backward case list (the fields of check::Case that the backward takes: dense tensors, with LSE, no serving or
// ring fields; the variants local / window_left / window_right, softcap and sinks since ABI 0.6). quick: every dtype x
// head dim (64, 128) x causal, small shapes, some GQA with seqlen_q != seqlen_k and fully masked rows, and 4 variant
// cases (a window, softcap, sinks with rows that see no key, and window + softcap + sinks). The full list: square
// seqlens 1..2048 over dtype x head dim x causal, seqlen_q != seqlen_k both ways, GQA 2 / 8 and MQA, batch 7, both
// layouts, non-default softmax scales, inputs scaled by 3; the variants: windows (0,0), (1,0), left-only, right-only,
// both, past every key, causal and not, with GQA; softcap 30 alone and with a window; sinks alone, with a window, with
// rows that see no key, with GQA; all three together. Names start "bwd_"; the variants' hold the forward's suffixes
// _win<L>x<R> (R = 0 with causal; inf for -1), _cap<C>, _sinks (--filter _win / _cap / _sinks).
std::vector<Case> cases(bool quick);

// Multiply-adds of the float64 reference for the case (about 5 per (query, visible key, head_dim) triple and query
// head, 2 more with sinks for dL/dsinks' forward, 1 more with softcap for the tolerance's pass over the scores; a
// window counts the keys its rows see): what `bench --check` compares with kMaxReferenceMacs.
double reference_macs(const Case& c);
inline constexpr double kMaxReferenceMacs = 2e10;

// Allocates the case's tensors, fills Q, K, V and dO with N(0, 1) * input_scale (dO: N(0, 1)) from `seed`, runs the
// forward (O, LSE), then the backward `repeats` times (at least once) with deterministic = 1 and `repeats` times with
// deterministic = 0, poisoning dQ, dK, dV and the backward's workspace (NaN bytes: "any contents") before every call.
// Every run's dQ, dK, dV are judged; with repeats > 1 the deterministic=1 runs must be bit-identical in dQ, dK and
// dV, and the deterministic=0 runs in dK and dV. The case's variant fields (local, window_left / _right, softcap,
// sinks, attention_chunk) go to both the forward (so that O and LSE are the variant's) and the backward; with sinks,
// dsinks (num_heads_q floats, NaN-poisoned before every call) is asked for, judged against
// reference::attention_backward_sinks, and must be bit-identical over the runs of either mode (repeats > 1).
// Cases that use a field the backward does not take (serving layouts, ring, no LSE, kernel_config, num_splits) or
// sinks of a size other than heads_q fail with "invalid case"; fields the library refuses (attention_chunk in 0.6)
// fail with its message. Skipped without a device, or when the library refuses the
// case with FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM / _DTYPE / _ARCH (the v1 backward: fp16 / bf16, head dim 64 / 128,
// on either backend).
// Runs on a private non-blocking stream.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);
Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t stream);

}  // namespace flashcore::check::bwd

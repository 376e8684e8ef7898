// The backward pass's correctness runner (flashcore_attention_backward), shared by `flashcore check --mode bwd` and
// `flashcore bench --mode bwd --check`: random inputs, the forward for O and LSE, the backward, and dQ, dK, dV against
// the float64 reference (reference::attention_backward).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "check/check.h"
#include "flashcore/flashcore.h"

namespace flashcore::check::bwd {

// Tolerance (see check_bwd.cpp for the derivation): for each of dQ, dK and dV,
//   err = max |dX - dX_ref| / max |dX_ref|        (max over every element of the tensor; dX_ref float64)
//   pass iff err <= tolerance(dtype):  2.5e-3 (fp16), 2e-2 (bf16)
// and beyond it: every element written (not the NaN poison), finite, and dQ exactly 0 on query rows that see no key.
double tolerance(flashcore_dtype dtype);

struct Result {
  bool passed = false;
  bool skipped = false;          // no device, or the library's backward does not take this case (head dim, dtype, arch)
  double dq_err = 0, dk_err = 0, dv_err = 0;  // max |dX - ref| / max |ref| (the worse of the deterministic=0 and =1 runs)
  double dq_max = 0, dk_max = 0, dv_max = 0;  // max |ref|: the scale of each error
  double tol = 0;                // the bound on each of the three errors
  bool nonfinite = false;        // NaN/Inf in dQ, dK or dV
  bool unwritten = false;        // an element kept its poison
  bool masked_bad = false;       // dQ not 0 on a row that sees no key
  bool deterministic = true;     // the deterministic=1 runs: dQ, dK and dV bit-identical (repeats > 1)
  bool dkdv_deterministic = true;  // the deterministic=0 runs: dK and dV bit-identical (repeats > 1)
  int runs = 0;                  // backward calls per mode (deterministic = 1, then 0)
  uint64_t workspace_bytes = 0;  // flashcore_attention_backward_workspace_size
  uint64_t seed = 0;
  std::string message;           // why it failed / was skipped ("" when it passed)
};

// The backward case list (the fields of check::Case that the backward takes: dense tensors, with LSE, no serving or
// ring fields). quick: every dtype x head dim (64, 128) x causal, small shapes, some GQA with seqlen_q != seqlen_k and
// fully masked rows. The full list: square seqlens 1..2048 over dtype x head dim x causal, seqlen_q != seqlen_k both
// ways, GQA 2 / 8 and MQA, batch 7, both layouts, non-default softmax scales, inputs scaled by 3. Names start "bwd_".
std::vector<Case> cases(bool quick);

// Multiply-adds of the float64 reference for the case (about 5 per (query, key, head_dim) triple and query head):
// what `bench --check` compares with kMaxReferenceMacs.
double reference_macs(const Case& c);
inline constexpr double kMaxReferenceMacs = 2e10;

// Allocates the case's tensors, fills Q, K, V and dO with N(0, 1) * input_scale (dO: N(0, 1)) from `seed`, runs the
// forward (O, LSE), then the backward `repeats` times (at least once) with deterministic = 1 and `repeats` times with
// deterministic = 0, poisoning dQ, dK, dV and the backward's workspace (NaN bytes: "any contents") before every call.
// Every run's dQ, dK, dV are judged; with repeats > 1 the deterministic=1 runs must be bit-identical in dQ, dK and
// dV, and the deterministic=0 runs in dK and dV. Cases that use a field the backward does not take (serving layouts,
// ring, no LSE, kernel_config) fail with "invalid case". Skipped without a device, or when the library refuses the
// case with FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM / _DTYPE / _ARCH (the v1 backward: fp16 / bf16, head dim 64 / 128,
// on either backend).
// Runs on a private non-blocking stream.
Result run_case(const Case& c, uint64_t seed, int repeats = 1);
Result run_case_on_stream(const Case& c, uint64_t seed, int repeats, flashcore_stream_t stream);

}  // namespace flashcore::check::bwd

// CPU reference attention with float64 accumulation (used by tests and `flashcore check`).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::reference {

// Host-side problem: the same struct as the C ABI, but q/k/v point to HOST memory of `dtype`
// (FLASHCORE_DTYPE_FP16, _BF16 or _FP32) with the given element strides, and seqused_k (if set) to a HOST int32
// array of batch lengths. o and lse are ignored.
//
// Computes, for the selected query rows, O in float64 as a dense (batch, seqlen_q, heads_q, head_dim)
// array and LSE in float64 as (batch, heads_q, seqlen_q). Rows not selected are left untouched.
// `rows`: query positions to compute (for every batch and head); empty = all rows.
// Fully masked rows give O = 0 and LSE = -inf. Uses up to `threads` host threads (0 = hardware).
// Unselected rows of the outputs are 0. Throws std::invalid_argument on an invalid problem.
struct Output {
  std::vector<double> o;    // batch * seqlen_q * heads_q * head_dim
  std::vector<double> lse;  // batch * heads_q * seqlen_q
};
Output attention(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows = {},
                 int threads = 0);

// The same problem computed the way a low-precision GPU kernel (or PyTorch SDPA) would: float32 scores
// and softmax, probabilities rounded to `dtype` before the P*V product, float32 accumulation, output
// rounded to `dtype`. Its error against attention() is the yardstick for kernel tolerances.
Output attention_lowp(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows = {},
                      int threads = 0);

// dtype conversions on the host (round-to-nearest-even).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

// Element `index` of a host array of `dtype` (fp16, bf16 or fp32) as float (exact).
float load_element(const void* base, flashcore_dtype dtype, int64_t index);
// x rounded (RNE) to `dtype` and back to float; identity for fp32.
float round_to_dtype(float x, flashcore_dtype dtype);
// The softmax scale the problem means: softmax_scale, or 1/sqrt(head_dim) when it is 0.
double resolved_softmax_scale(const flashcore_attention_params& problem);

// Runs fn(0) .. fn(n-1) on up to `threads` host threads (0 = hardware), dynamically balanced.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

}  // namespace flashcore::reference

// CPU reference attention with float64 accumulation, forward and backward (used by tests and `flashcore check`).
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

// The backward pass of attention(): the gradients of L = sum(O * dO) with respect to Q, K and V, for the upstream
// gradient dO at `host_dout`, a HOST array of `dtype` (fp16, bf16 or fp32) of Q's shape (batch, seqlen_q, heads_q,
// head_dim) addressed through host_problem.dout_strides (host_problem.dout itself is not read; nor are o, lse, dq, dk,
// dv). The rest of the problem is read as attention() reads it: the same bottom-right causal mask, seqused_k, GQA
// (dk and dv of KV head g are summed over the query heads h with h / (heads_q / heads_kv) == g) and softmax_scale
// (0 = 1/sqrt(head_dim)). With s = scale * Q K^T (+ mask), P = softmax(s) row by row:
//   dV = P^T dO,  dP = dO V^T,  D_i = sum_j P_ij dP_ij (= rowsum(dO * O)),  dS = P * (dP - D),
//   dQ = scale * dS K,  dK = scale * dS^T Q.
// A query row that sees no key has P = 0: it contributes nothing, and its dq is 0 (as are dk and dv of a key no row
// sees). Outputs are float64, dense: dq (batch, seqlen_q, heads_q, head_dim), dk and dv (batch, seqlen_k, heads_kv,
// head_dim). Each output element is summed in a fixed order: the result does not depend on `threads` (0 = hardware).
// Throws std::invalid_argument on an invalid problem or a NULL host_dout.
struct Gradients {
  std::vector<double> dq;  // batch * seqlen_q * heads_q * head_dim
  std::vector<double> dk;  // batch * seqlen_k * heads_kv * head_dim
  std::vector<double> dv;  // batch * seqlen_k * heads_kv * head_dim
};
Gradients attention_backward(const flashcore_attention_params& host_problem, const void* host_dout, int threads = 0);

// The same gradients computed the way a low-precision GPU backward kernel would (the yardstick for its tolerances,
// as attention_lowp() is for the forward's): O and LSE of attention_lowp() (O rounded to `dtype`, as the forward
// writes it), float32 scores, P = exp(s - LSE) and dP = dO V^T in float32, D_i = rowsum(dO * O) in float32,
// dS = P * (dP - D) in float32; P and dS rounded to `dtype` before the dV = P^T dO, dK = dS^T Q and dQ = dS K
// products, which accumulate in float32; the softmax scale applied to the float32 sums of dK and dQ; outputs rounded
// to `dtype`. Identity rounding for fp32 inputs.
Gradients attention_backward_lowp(const flashcore_attention_params& host_problem, const void* host_dout,
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

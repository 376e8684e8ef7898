// CPU reference attention with float64 accumulation, forward and backward (used by tests and `flashcore check`).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "flashcore/flashcore.h"

namespace flashcore::reference {

// Host-side problem: the same struct as the C ABI, but q/k/v point to HOST memory of `dtype`
// (FLASHCORE_DTYPE_FP16, _BF16 or _FP32) with the given element strides, seqused_k (if set) to a HOST int32
// array of batch lengths, and sinks (if set) to a HOST float32 array of num_heads_q sink logits. o and lse are
// ignored. The struct is read as a current one (struct_size is not looked at): its variant fields must hold their
// defaults (zeros) or meaningful values.
//
// The mask and the variants follow flashcore.h (FlashAttention's semantics), with d = keys - seqlen_q for a
// sequence of `keys` keys (seqlen_k, or seqused_k[b]): query row i sees key j when
//   causal:                 j <= i + d
//   local = 1:              i + d - window_size_left <= j   (unless window_size_left = -1)
//                           j <= i + d + window_size_right  (unless window_size_right = -1; with causal the bound
//                                                            is i + d whatever window_size_right says)
//   attention_chunk = c > 0: floor(j / c) == floor((i + d) / c)
// (visible_key_range below). softcap > 0 turns every score s = scale * q.k into softcap * tanh(s / softcap) before
// the softmax. A sink logit t = sinks[h] (not scaled) joins the softmax denominator of every row of head h:
//   O_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(t)),   LSE_i = log(sum_j exp(s_ij) + exp(t)).
// Sinks must be finite or -inf (a sink that takes nothing).
//
// Computes, for the selected query rows, O in float64 as a dense (batch, seqlen_q, heads_q, head_dim_v) (V's head dim:
// head_dim_v, or head_dim when it is 0) array and LSE in float64 as (batch, heads_q, seqlen_q). Rows not selected are left untouched.
// `rows`: query positions to compute (for every batch and head); empty = all rows.
// Rows that see no key give O = 0 and LSE = -inf (LSE = sinks[h] with sinks). Uses up to `threads` host threads
// (0 = hardware). Unselected rows of the outputs are 0. Throws std::invalid_argument on an invalid problem.
struct Output {
  std::vector<double> o;    // batch * seqlen_q * heads_q * head_dim_v
  std::vector<double> lse;  // batch * heads_q * seqlen_q
};
Output attention(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows = {},
                 int threads = 0);

// The same problem computed the way a low-precision GPU kernel (or PyTorch SDPA) would: float32 scores
// (softcap's tanh rounded to fp16 precision for 16-bit inputs, as the hardware's tanh.approx.f32 is about that
// precise) and softmax (the sink's term added to the float32 denominator), probabilities rounded to `dtype` before
// the P*V product, float32 accumulation, output rounded to `dtype`. Its error against attention() is the yardstick
// for kernel tolerances.
Output attention_lowp(const flashcore_attention_params& host_problem, const std::vector<int64_t>& rows = {},
                      int threads = 0);

// The backward pass of attention(): the gradients of L = sum(O * dO) with respect to Q, K and V, for the upstream
// gradient dO at `host_dout`, a HOST array of `dtype` (fp16, bf16 or fp32) of O's shape (batch, seqlen_q, heads_q,
// head_dim_v) addressed through host_problem.dout_strides (host_problem.dout itself is not read; nor are o, lse, dq,
// dk, dv). head_dim_v is V's head dim (head_dim when it is 0; it may differ, as in (192, 128)): Q and K have head_dim
// columns, V, O and dO head_dim_v. The rest of the problem is read as attention() reads it: the same bottom-right
// mask (causal, the window, attention_chunk), seqused_k, softcap, sinks, GQA (dk and dv of KV head g are summed over
// the query heads h with h / (heads_q / heads_kv) == g) and softmax_scale (0 = 1/sqrt(head_dim)). With
// s = cap(scale * Q K^T) (+ mask), P = exp(s - LSE) row by row (the forward's probabilities: with a sink they sum to
// less than 1):
//   dV = P^T dO,  dP = dO V^T,  D_i = sum_j P_ij dP_ij (= rowsum(dO * O)),  dS = P * (dP - D) * cap'(s),
//   dQ = scale * dS K,  dK = scale * dS^T Q,
// where cap' = 1 - (s / softcap)^2 (the derivative of softcap * tanh(x / softcap)) with a softcap, else 1; Q K^T is
// over head_dim columns, dO V^T and rowsum(dO * O) over head_dim_v. The sinks act through LSE only; their own
// gradient is attention_backward_sinks().
// A query row that sees no key has P = 0: it contributes nothing, and its dq is 0 (as are dk and dv of a key no row
// sees). Outputs are float64, dense: dq (batch, seqlen_q, heads_q, head_dim), dk (batch, seqlen_k, heads_kv,
// head_dim) and dv (batch, seqlen_k, heads_kv, head_dim_v). Each output element is summed in a fixed order: the
// result does not depend on `threads` (0 = hardware).
// Throws std::invalid_argument on an invalid problem or a NULL host_dout.
struct Gradients {
  std::vector<double> dq;  // batch * seqlen_q * heads_q * head_dim
  std::vector<double> dk;  // batch * seqlen_k * heads_kv * head_dim
  std::vector<double> dv;  // batch * seqlen_k * heads_kv * head_dim_v
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

// The gradient of L = sum(O * dO) with respect to the sink logits (float64, num_heads_q entries; all 0 without
// sinks): dL/dsinks[h] = -sum over the rows i of head h (every batch entry) of exp(sinks[h] - LSE_i) * (dO_i . O_i)
// (over head_dim_v). Reads the problem and host_dout as attention_backward() does.
std::vector<double> attention_backward_sinks(const flashcore_attention_params& host_problem, const void* host_dout,
                                             int threads = 0);

// The keys a query row sees: [begin, end), empty when end <= begin.
struct KeyRange {
  int64_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  bool contains(int64_t j) const { return j >= begin && j < end; }
};
// The keys query row i of a sequence of seqlen_q queries and `keys` keys sees under the problem's causal, local,
// window_size_left / _right and attention_chunk (the rule above); its sizes and pointers are not read.
KeyRange visible_key_range(const flashcore_attention_params& problem, int64_t seqlen_q, int64_t keys, int64_t i);

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

// precision = FP8 / INT8 (flashcore.h) on the sm90 backend: a 16-bit call runs as an 8-bit (e4m3) or int8 Q K^T one
// on copies the library quantizes into the workspace. The workspace layouts (core::WorkspaceLayout), the key of
// the row such a call runs, the quantized call itself and the preparation kernels' parameters.
#pragma once
#include "core/plan.h"
#include "flashcore/flashcore.h"
#include "kernels/common/fp8_prep_params.h"
#include "kernels/common/int8_prep_params.h"

namespace flashcore::sm90 {

// The workspace of a precision = FP8 / INT8 call (p.precision), every part 256-byte aligned after the zero-filled
// head, which the row's dynamic scheduler uses (the row gets the whole workspace):
//   FP8:  head | amax[3][B*Hkv], descale[3][B*Hkv] | Q8 (B, Sq, Hq, D) | K8 (B, Sk, Hkv, D) | the transposed V
//   INT8: head | q_scale | k_scale | k_partial | k_mean | lse_shift | Q8 (B, Sq, Hq, D) | K8 (B, Sk, Hkv, D)
core::WorkspaceLayout quantized_layout(const flashcore_attention_params& p);

// The key of the row the call runs: e4m3 Q, K, V with O in the input dtype unless out_dtype says otherwise (FP8);
// int8 Q and K with V and O in the input dtype (INT8). The call itself for NATIVE.
flashcore_attention_params quantized_key(const flashcore_attention_params& p);

// The whole quantized call: Q and K (and for FP8 the descales) in the workspace `ws` laid out by `l`.
flashcore_attention_params quantized_call(const flashcore_attention_params& p, const core::WorkspaceLayout& l);

// The preparation kernels' parameters for `p` and its workspace.
kernels::Fp8PrepParams fp8_quantize_params(const flashcore_attention_params& p, const core::WorkspaceLayout& l);
kernels::Int8PrepParams int8_prep_params(const flashcore_attention_params& p, const core::WorkspaceLayout& l,
                                         float softmax_scale);

}  // namespace flashcore::sm90

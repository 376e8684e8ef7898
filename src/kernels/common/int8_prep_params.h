// Parameters of the int8 preparation kernels (kernels/common/int8_prep.cuh) of precision = INT8, visible to host code.
// Layouts (all in the call's workspace, api/backend.cpp: Int8Layout):
//   q8 (batch, seqlen_q, heads_q, head_dim) int8, contiguous; q_scale (batch, heads_q, seqlen_q) float
//   k8 (batch, seqlen_k, heads_kv, head_dim) int8, contiguous: K less its mean over the keys of its (batch, KV head);
//   k_scale (batch, heads_kv, ceil(seqlen_k / 128)) float, one per block of 128 keys
//   k_partial (batch * heads_kv, ceil(seqlen_k / kInt8SumChunk), head_dim) float: K's sums over chunks of keys
//   k_mean (batch * heads_kv, head_dim) float
//   lse_shift (batch, heads_q, seqlen_q) float: q . k_mean, which the smoothing took out of every score of the row
// A scale is amax / 127 (1 for an all-zero row or block, NaN where the row or block holds a NaN or an infinity, so
// that the attention's output is NaN there as it would be in 16 bits).
#pragma once
#include <cstdint>

#include "kernels/common/fp8_prep_params.h"  // Fp8Tensor: a (batch, seq, heads, head_dim) tensor and its strides

namespace flashcore::kernels {

inline constexpr int kInt8KeyBlock = 128;   // keys per K scale
inline constexpr int kInt8SumChunk = 256;  // keys per partial sum of the K mean (a block of the sum pass each)

constexpr int64_t int8_key_blocks(int64_t seqlen_k) { return (seqlen_k + kInt8KeyBlock - 1) / kInt8KeyBlock; }
constexpr int64_t int8_sum_chunks(int64_t seqlen_k) { return (seqlen_k + kInt8SumChunk - 1) / kInt8SumChunk; }

struct Int8PrepParams {
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  Fp8Tensor q, k;  // the call's 16-bit inputs
  int8_t* q8;
  int8_t* k8;
  float* q_scale;
  float* k_scale;
  float* k_partial;
  float* k_mean;
  float* lse_shift;  // nullptr: the call wants no LSE
  float* lse;        // the call's LSE (batch, heads_q, seqlen_q), for int8_lse_shift_kernel
  float softmax_scale;
  // Set by the launcher (int8_prep.cu) from the sizes above, for the query rows' index split.
  FastDiv div_heads_q, div_seqlen_q;
};

}  // namespace flashcore::kernels

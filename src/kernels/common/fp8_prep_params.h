// Parameters of the 8-bit preparation kernels (kernels/common/fp8_prep.cuh), visible to host code:
//   - the transposed V the 8-bit attention kernel reads (its P V GEMM needs V with the key index innermost);
//   - for precision = FP8 calls, the per-(batch, KV head) absolute maxima of 16-bit Q, K, V and their e4m3 copies.
#pragma once
#include <cstdint>

#include "kernels/common/fast_div.h"

namespace flashcore::kernels {

// A (batch, seqlen, heads, head_dim) tensor: element strides, the head_dim stride is 1.
struct Fp8Tensor {
  const void* data;
  int64_t stride_batch, stride_seq, stride_head;
};

// The transposed V: (batch, kv_heads, head_dim, padded_keys) e4m3 bytes, keys innermost and padded to a multiple of
// 128 (zeros past seqlen_k), the keys of each group of 32 in the order of kernels::p8_key_of_slot (element.cuh).
constexpr int64_t fp8_vt_padded_keys(int64_t seqlen_k) { return (seqlen_k + 127) / 128 * 128; }

struct Fp8PrepParams {
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  Fp8Tensor q, k, v;  // the call's inputs (16-bit for precision = FP8; only v for an 8-bit call)
  // precision = FP8: amax[3][batch * heads_kv] (zeroed before the amax kernel), descale[3][batch * heads_kv]
  // (amax / 448, 1 where amax is 0), and the e4m3 Q (batch, seqlen_q, heads_q, head_dim) and K (batch, seqlen_k,
  // heads_kv, head_dim), contiguous. nullptr for an 8-bit call.
  float* amax;
  float* descale;
  uint8_t* q8;
  uint8_t* k8;
  uint8_t* vt;  // the transposed V (always)
  // Set by the launcher (fp8_prep.cu) from the sizes above, for the index splits of the passes.
  FastDiv div_heads_q, div_heads_kv, div_seqlen_q, div_seqlen_k, div_group;
};

}  // namespace flashcore::kernels

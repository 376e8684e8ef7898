// Parameters of the portable forward kernel, built on the host (backend.cpp) and passed by value. Pointers and
// strides are the C ABI's (strides in elements, the head_dim stride 1); the kernel forms every address in
// 64-bit arithmetic.
#pragma once
#include <cstdint>

#include "kernels/common/serving_layout.h"
#include "kernels/common/tensor_ref.h"
#include "kernels/common/variant_params.h"

namespace flashcore::sm80 {

using kernels::TensorRef;

// The serving layouts (seqused_k, packed, paged; LSE strides): kernels/common/serving_layout.h; the window, chunk,
// softcap and sinks: kernels/common/variant_params.h.
struct FwdParams : kernels::ServingLayout, kernels::VariantParams {
  TensorRef q, k, v, o;  // o.ptr is written (const only to share the type)
  float* lse;            // optional, (B, Hq, Sq) contiguous
  int64_t seqlen_q;
  int64_t seqlen_k;
  int num_heads_q;
  int head_ratio;        // num_heads_q / num_heads_kv
  int num_m_blocks;      // ceil(seqlen_q / kBlockM)
  int num_tiles;         // num_m_blocks * num_heads_q * batch (= gridDim.x)
  int num_slices;      // batch * num_heads_q
  int section_slices;  // causal tile order: slices per L2 section (tile_math.h, lpt_section_slices)
  float scale_log2;      // softmax_scale * log2(e)
};

}  // namespace flashcore::sm80

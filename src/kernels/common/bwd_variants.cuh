// The variants' P^T in the backward, both backends (sm90/bwd_mainloop.cuh, sm80/bwd_mainloop.cuh): one warp's or
// warpgroup's S^T fragments (keys x kCols queries, row-pair fragments of fragment.cuh) become P^T = exp2(S^T *
// scale_log2 - lse_log2), 0 at the pairs the window or the sequence's end masks, packed into dV's A fragments as they
// are computed (pack_p_fragments' order). With a softcap (kSoftcap: a separate copy of the loop, as a branch per
// element compiled to reconvergence points), S^T = tanh(S^T * softcap_scale) first, and s keeps P^T times the tanh's
// derivative 1 - tanh^2, which dS^T = P^T (dP^T - D) then takes without another register array. The window's test is
// branch-free: element (j, i, e) is key key_row + 8i, at rel0 + 8i - 8j - e from the diagonal, visible iff that lies in
// [lo, hi], narrowed per key row by the chunks (kWindow: the causal kernels; the non-causal ones mask only keys past
// len_k).
#pragma once
#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/warp.cuh"

namespace flashcore::kernels {

// Columns' statistics read from shared memory as needed (sm90: column group j's pair at float2 index 4j of the
// thread's lane), instead of an array held in registers.
struct BwdStatColumns {
  const float2* at;
  __device__ __forceinline__ float2 operator[](int j) const { return at[4 * j]; }
};

// Stats: the columns' scaled LSE, stat[j] the pair of column group j (an array, or BwdStatColumns).
template <class Element, int kCols, bool kSoftcap, bool kWindow, class Stats>
__device__ __forceinline__ void bwd_variant_probabilities(float (&s)[kCols / 2], uint32_t (&pa)[kCols / 16][4],
                                                          const Stats& stat, float softcap_scale,
                                                          float scale_log2, bool masked, int key_row, int len_k,
                                                          int rel0, int lo, int hi, int chunk, int chunk_rel) {
  // Chunks: key k sees the queries whose diagonal position lies in its chunk, i.e. rel in [r - chunk + 1, r] with
  // r = k mod chunk (relative to the diagonal; chunk_rel shifts that to the caller's rel: sm80 counts from the
  // main diagonal). Bounds per key row, computed for masked steps of chunked calls only.
  int lo_row[2] = {lo, lo}, hi_row[2] = {hi, hi};
  if (kWindow && masked && chunk > 0) {
    // (From an opaque copy of the key row: hoisted out of the step loop, the bounds spilled in the portable d128
    // kernels, which sit at 255 registers.)
    const int key = static_cast<int>(opaque_u32(static_cast<uint32_t>(key_row)));
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = (key + 8 * i) % chunk + chunk_rel;
      hi_row[i] = r < hi ? r : hi;
      lo_row[i] = r - chunk + 1 > lo ? r - chunk + 1 : lo;
    }
  }
#pragma unroll
  for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float x[2], g[2] = {1.f, 1.f};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[e] = s[acc_index(j, i, e)];
        if constexpr (kSoftcap) {
          x[e] = tanh_approx(x[e] * softcap_scale);
          g[e] = fmaf(-x[e], x[e], 1.f);
        }
        x[e] = exp2f(fmaf(x[e], scale_log2, -(e ? stat[j].y : stat[j].x)));
        if (masked) {
          const int rel = rel0 + 8 * i - 8 * j - e;
          const bool keep = key_row + 8 * i < len_k && (!kWindow || ((rel <= hi_row[i]) & (rel >= lo_row[i])));
          x[e] = keep ? x[e] : 0.f;
        }
      }
      pa[j / 2][(j % 2) * 2 + i] = ElemTraits<Element>::pack2(x[0], x[1]);
      s[acc_index(j, i, 0)] = kSoftcap ? x[0] * g[0] : x[0];
      s[acc_index(j, i, 1)] = kSoftcap ? x[1] * g[1] : x[1];
    }
  }
}

}  // namespace flashcore::kernels

// The backward's shared-memory GEMM issue (bwd_mainloop.cuh, bwd_mainloop_wide.cuh): one commit group per call, the
// operands' descriptors advanced per k-step as one add each (ptx.cuh SmemDesc).
#pragma once
#include <cstdint>

#include "kernels/sm90/ptx.cuh"

namespace flashcore::sm90 {

// acc (+)= A * B over the head dim: k-step k is 16-column step k % (kRowBytes / 32) of chunk k / (kRowBytes / 32) of
// both operands (both K-major, kRowBytes-byte swizzled rows), whose chunks lie a_chunk and b_chunk bytes apart. The
// first k-step overwrites acc.
template <class Wgmma, int kHeadDim, int kRowBytes = 128, int kRegs>
__device__ __forceinline__ void bwd_gemm_head_dim(float (&acc)[kRegs], SmemDesc a, uint32_t a_chunk, SmemDesc b,
                                                  uint32_t b_chunk) {
  constexpr int kStepsPerChunk = kRowBytes / 32;  // 16 columns of 16-bit elements a k-step
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kHeadDim / 16; ++k) {
    const int chunk = k / kStepsPerChunk, kk = k % kStepsPerChunk;
    Wgmma::mma(acc, (a + (chunk * a_chunk + kk * 32)).u64(), (b + (chunk * b_chunk + kk * 32)).u64(), k > 0 ? 1 : 0);
  }
  wgmma_commit_group();
}

// acc (+)= A * B over kSteps k-steps of 16, A and B advancing a_step and b_step bytes per k-step; accumulate = false
// overwrites acc at the first.
template <class Wgmma, int kSteps, int kRegs>
__device__ __forceinline__ void bwd_gemm_steps(float (&acc)[kRegs], SmemDesc a, SmemDesc b, uint32_t a_step,
                                               uint32_t b_step, bool accumulate) {
  wgmma_fence();
#pragma unroll
  for (int t = 0; t < kSteps; ++t) {
    Wgmma::mma(acc, (a + t * a_step).u64(), (b + t * b_step).u64(), accumulate || t > 0 ? 1 : 0);
  }
  wgmma_commit_group();
}

}  // namespace flashcore::sm90

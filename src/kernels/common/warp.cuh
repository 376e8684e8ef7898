// Warp-level helpers that every backend uses: named barriers, quad reductions, fast exp2.
#pragma once
#include <cstdint>

namespace flashcore::kernels {

// x, which the compiler cannot see through: values derived from it are computed where they are used (from one copy
// of x) rather than kept in registers from before a loop.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

// ldmatrix x4: lanes 8m..8m+7 give the row addresses (16 bytes each) of 8x8 matrix m; every lane receives,
// in r[m], row lane/4, elements 2*(lane%4) and +1 of matrix m (.trans: the transposed matrix's, i.e. column
// lane/4, rows 2*(lane%4) and +1 of what is stored). volatile + memory: never moved across a barrier.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Named barriers (bar.sync / bar.arrive with an id and a thread count; id 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// A named barrier that also ORs a predicate over its threads (barrier.red.or.pred): every thread gets the result.
__device__ __forceinline__ bool named_barrier_or(uint32_t id, uint32_t threads, bool pred) {
  uint32_t result;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred p, %2, %3, p;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(result)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(threads)
      : "memory");
  return result != 0;
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// MUFU.TANH (sm_75 and newer): about 2^-11 relative error, one instruction (tanhf is ~20; the softcap's tanh runs on
// every score, FlashAttention's kernels use the same instruction).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Max and sum over the 4 threads of a quad (the threads that share a fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Max and sum over aligned groups of kLanes consecutive lanes (a power of two up to 32); every lane of the warp
// must take part.
template <int kLanes>
__device__ __forceinline__ float lanes_max(float x) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
template <int kLanes>
__device__ __forceinline__ float lanes_sum(float x) {
#pragma unroll
  for (int off = kLanes / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

}  // namespace flashcore::kernels

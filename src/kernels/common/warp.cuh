// Warp-level helpers that every backend uses: named barriers, quad reductions, fast exp2.
#pragma once
#include <cstdint>

namespace flashcore::kernels {

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

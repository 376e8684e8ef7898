// The Ampere instructions the portable kernel is built from, as inline PTX: CCCL's cuda::ptx (CUDA 13) wraps
// the bulk (TMA) copies, mbarriers and fences but not mma.sync, ldmatrix or the non-bulk cp.async, so they are
// written here. Every wrapper is one instruction; the shared-memory operands are 32-bit shared-window
// addresses (smem_addr).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common/warp.cuh"

namespace flashcore::sm80 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

using kernels::opaque_u32;  // (kernels/common/warp.cuh)

// cp.async.cg: 16 bytes global -> shared, bypassing L1. When `valid` is false the source size is 0: nothing is
// read and the 16 destination bytes are zero-filled (rows past the end of a sequence). `src` must still be a
// valid global address (the callers pass a clamped one).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const uint32_t src_size = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(static_cast<uint64_t>(__cvta_generic_to_global(src))), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// A float added to global memory with no value returned (RED; atomicAdd here compiled to ATOMG, which waits for
// the old value).
__device__ __forceinline__ void red_add_f32(float* at, float x) {
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;\n" ::"l"(at), "f"(x));
}

// ldmatrix x4 (and .trans): kernels/common/warp.cuh, shared with the sm90 producer's V transpose.
using kernels::ldmatrix_x4;
using kernels::ldmatrix_x4_trans;

// D(16x8, f32) += A(16x16, row-major) * B(16x8, column-major), 16-bit inputs. Fragments (g = lane/4,
// t = lane%4): a[0] (row g, k 2t..2t+1), a[1] (row g+8, same k), a[2] (row g, k 2t+8..), a[3] (row g+8, k 2t+8..);
// b[0] (k 2t..2t+1, col g), b[1] (k 2t+8.., col g); d[2i+e] (row g+8i, col 2t+e) -- kernels/common/fragment.cuh.
template <class T>
struct Mma16816;

template <>
struct Mma16816<__nv_bfloat16> {
  __device__ __forceinline__ static void mma(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16816<__half> {
  __device__ __forceinline__ static void mma(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

}  // namespace flashcore::sm80

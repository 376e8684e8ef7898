// Hopper-only instructions that CCCL's cuda::ptx does not wrap: warpgroup MMA (wgmma), register
// reallocation (setmaxnreg) and stmatrix. mbarrier, TMA and fences come from cuda::ptx (pipeline.cuh, producer.cuh).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace flashcore::sm90 {

// setmaxnreg: hand registers from the producer warpgroup to the consumer warpgroups. Effective only when the
// kernel has a register cap at entry (__launch_bounds__(threads, 1)).
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// elect.sync over the full warp: true in exactly one lane (the same one each time). Every lane of the warp must
// call it (converged). A branch on its result is one thread that ptxas knows to be alone, so it keeps values the
// warp computed uniformly (a TMA's tensor map and coordinates) in uniform registers instead of moving them from
// general ones lane by lane.
__device__ __forceinline__ bool elect_one_sync() {
  uint32_t pred = 0;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "elect.sync _|p, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(pred));
  return pred != 0;
}

// stmatrix x4 (sm_90): the inverse of ldmatrix x4 (kernels/common/warp.cuh). Lanes 8m..8m+7 give the row addresses
// (16 bytes each) of 8x8 matrix m; every lane's r[m] goes to row lane/4, elements 2*(lane%4) and +1 of matrix m.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// Shared-memory matrix descriptor for a 128-byte-swizzled operand (PTX ISA "Matrix Descriptor Format").
//   bits  0-13: start address >> 4      bits 16-29: leading-dimension byte offset >> 4
//   bits 32-45: stride-dimension byte offset >> 4      bits 62-63: swizzle mode (1 = 128B)
// The tile must sit at a 1024-byte-aligned base (the swizzle pattern repeats every 8 rows of 128 B); the
// start address may move inside it by multiples of 16 bytes to select k-slices.
__device__ __forceinline__ uint64_t make_smem_desc_sw128(const void* smem_ptr, uint32_t leading_byte_offset,
                                                         uint32_t stride_byte_offset) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
  uint64_t desc = 0;
  desc |= static_cast<uint64_t>((addr >> 4) & 0x3FFF);
  desc |= static_cast<uint64_t>((leading_byte_offset >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((stride_byte_offset >> 4) & 0x3FFF) << 32;
  desc |= static_cast<uint64_t>(1) << 62;
  return desc;
}

// The same for a 64-byte-swizzled operand (bits 62-63 = 2): 64-byte rows, the pattern repeats every 8 rows (512 B).
__device__ __forceinline__ uint64_t make_smem_desc_sw64(const void* smem_ptr, uint32_t leading_byte_offset,
                                                        uint32_t stride_byte_offset) {
  return (make_smem_desc_sw128(smem_ptr, leading_byte_offset, stride_byte_offset) & ~(uint64_t{3} << 62)) |
         (uint64_t{2} << 62);
}

// And for a 32-byte-swizzled operand (bits 62-63 = 3): 32-byte rows, the pattern repeats every 8 rows (256 B).
__device__ __forceinline__ uint64_t make_smem_desc_sw32(const void* smem_ptr, uint32_t leading_byte_offset,
                                                        uint32_t stride_byte_offset) {
  return make_smem_desc_sw128(smem_ptr, leading_byte_offset, stride_byte_offset) | (uint64_t{3} << 62);
}

// A K-major operand stored in rows of kRowBytes (128, 64 or 32), swizzled to that width; 8-row groups are contiguous.
template <int kRowBytes>
__device__ __forceinline__ uint64_t make_smem_desc_kmajor(const void* smem_ptr) {
  static_assert(kRowBytes == 128 || kRowBytes == 64 || kRowBytes == 32, "128-, 64- or 32-byte rows");
  if constexpr (kRowBytes == 128) {
    return make_smem_desc_sw128(smem_ptr, 16, 1024);
  } else if constexpr (kRowBytes == 64) {
    return make_smem_desc_sw64(smem_ptr, 16, 512);
  } else {
    return make_smem_desc_sw32(smem_ptr, 16, 256);
  }
}

// The position of 16-byte unit `unit` of row `row` in a chunk of kRowBytes-byte rows swizzled to that width (TMA's
// and wgmma's 128- and 64-byte swizzles: the unit index XOR the row's 128-byte line within the 1024-byte pattern),
// for chunks that start 1024-byte aligned. 128-byte rows: unit ^ (row % 8); 64-byte rows: unit ^ ((row / 2) % 4).
// Either way eight consecutive rows at one logical unit fall in eight different 16-byte bank groups.
template <int kRowBytes>
__device__ __forceinline__ int swizzled_unit(int row, int unit) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "128- or 64-byte rows");
  return kRowBytes == 128 ? unit ^ (row % 8) : unit ^ ((row / 2) % 4);
}

// An MN-major B operand (a key-major V: rows = the k dimension) stored as chunks of kRowBytes-byte rows (128 or 64),
// swizzled to that width, chunk c holding columns [c * kRowBytes / elem, ...) of every row: the leading byte offset is
// the distance between chunks (the next columns of the N dimension), the stride byte offset that between groups of 8
// rows (CUTLASS's canonical MN-major layouts: ((T, R/16, m), (8, k)) : ((1, T, LBO), (R/16 T, SBO)) for R-byte rows).
template <int kRowBytes>
__device__ __forceinline__ uint64_t make_smem_desc_mn_major(const void* smem_ptr, uint32_t chunk_bytes) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "128- or 64-byte rows");
  if constexpr (kRowBytes == 128) {
    return make_smem_desc_sw128(smem_ptr, chunk_bytes, 1024);
  } else {
    return make_smem_desc_sw64(smem_ptr, chunk_bytes, 512);
  }
}

// A descriptor as two 32-bit words, for operands whose start address moves by known byte offsets (k-steps, pipeline
// stages): the fixed fields are built once, and a move adds offset >> 4 to the low word (one integer add per wgmma
// instead of rebuilding the descriptor: docs/decisions.md#wgmma-desc). Shared-memory addresses stay below 2^18, so the
// start address field (bits 0-13) never carries into the leading byte offset. Offsets must be multiples of 16. (u64()
// packs the words with mov.b64: the same pack written as shift-or took 14 more R2UR and 11 more IMAD per d128 kernel.)
struct SmemDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ explicit SmemDesc(uint64_t d) : lo(static_cast<uint32_t>(d)), hi(static_cast<uint32_t>(d >> 32)) {}
  __device__ __forceinline__ SmemDesc(uint32_t l, uint32_t h) : lo(l), hi(h) {}
  __device__ __forceinline__ SmemDesc operator+(uint32_t byte_offset) const { return {lo + (byte_offset >> 4), hi}; }
  __device__ __forceinline__ uint64_t u64() const {
    uint64_t d;
    asm("mov.b64 %0, {%1, %2};\n" : "=l"(d) : "r"(lo), "r"(hi));
    return d;
  }
};

// wgmma.fence: order register accesses of earlier instructions before the next wgmma.mma_async.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keep the compiler from moving accumulator accesses across wgmma boundaries.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// WgmmaSS<T, N>: both operands in shared memory (K-major); WgmmaRS<T, N>: A from registers, B N-major;
// WgmmaSSTransA<T, N>: both in shared memory, A M-major; WgmmaRSKMajorB<T, N>: A from registers, B K-major.
template <class T, int N>
struct WgmmaSS;
template <class T, int N>
struct WgmmaRS;
template <class T, int N>
struct WgmmaSSTransA;
template <class T, int N>
struct WgmmaRSKMajorB;

#include "kernels/sm90/wgmma_ops.inc"

}  // namespace flashcore::sm90

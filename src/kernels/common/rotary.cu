// The queries' rotary embedding on append (flashcore.h rotary_cos): Q rotated into a contiguous copy in the workspace,
// which the attention then reads (api/backend.cpp). One thread per 16-byte unit of a (row, head), grid-stride;
// compiled for every backend's archs (src/CMakeLists.txt, FLASHCORE_COMMON_KERNEL_SOURCES). The same pass widens an
// e4m3 Q on an e4m3 KV cache into its 16-bit copy (launch_widen_q).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "core/dtype.h"
#include "kernels/common/rotary.cuh"

namespace flashcore::kernels {

struct RotaryQParams {
  const char* q;
  int64_t q_stride[3];  // bytes: batch (0 when packed), seq, head
  char* out;            // (rows, heads, units * 16 bytes), contiguous
  const int32_t* cu_seqlens_q;  // packed queries: sequence of each row; nullptr: rows of seqlen_q per sequence
  int64_t total_q;
  int64_t rows;
  int batch;
  int seqlen_q;
  int heads;
  int units;            // 16-byte units of a head's row
  int by_row;           // 1: query i of a sequence at its first position + i (causal or a window); 0: all at the first
  RotaryParams rotary;
  // > 0: Q is e4m3 (units of 16 elements) and the copy its exact 16-bit values (32 bytes a unit), no rotation:
  // 1 fp16, 2 bf16.
  int widen;
};

// 16 e4m3 values as 16-bit ones (exact: every e4m3 value is an fp16 and a bf16 value), in two 16-byte halves.
__device__ __forceinline__ void widen_unit(const uint4& in, bool bf16, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t out[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(w[j / 2] >> (16 * (j % 2)));
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
    if (bf16) {
      const __nv_bfloat162 b = __float22bfloat162_rn(__half22float2(__half2(h)));
      out[j] = *reinterpret_cast<const uint32_t*>(&b);
    } else {
      out[j] = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

__global__ void __launch_bounds__(256) flashcore_rotary_q(const __grid_constant__ RotaryQParams a) {
  const int64_t n = a.rows * a.heads * a.units;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * blockDim.x) {
    const int unit = static_cast<int>(idx % a.units);
    const int64_t rh = idx / a.units;
    const int head = static_cast<int>(rh % a.heads);
    const int64_t row = rh / a.heads;
    int64_t b, i;
    const char* src;
    if (a.cu_seqlens_q != nullptr) {
      b = packed_owner(a.cu_seqlens_q, a.batch, a.total_q, row);
      const int64_t first = a.cu_seqlens_q[b];
      i = row - (first < 0 ? 0 : first);
      if (i < 0) i = 0;  // a row of no sequence (garbage offsets): the attention never reads it
      src = a.q + row * a.q_stride[1] + head * a.q_stride[2];
    } else {
      b = row / a.seqlen_q;
      i = row - b * a.seqlen_q;
      src = a.q + b * a.q_stride[0] + i * a.q_stride[1] + head * a.q_stride[2];
    }
    if (a.widen > 0) {
      char* dst = a.out + (row * a.heads + head) * int64_t{a.units} * 32 + unit * 32;
      uint4 lo, hi;
      widen_unit(*reinterpret_cast<const uint4*>(src + unit * 16), a.widen == 2, lo, hi);
      *reinterpret_cast<uint4*>(dst) = lo;
      *reinterpret_cast<uint4*>(dst + 16) = hi;
      continue;
    }
    char* dst = a.out + (row * a.heads + head) * int64_t{a.units} * 16;
    auto store = [&](int u, const uint4& v) { *reinterpret_cast<uint4*>(dst + u * 16) = v; };
    if (!rotate_unit(a.rotary, rotary_row(a.rotary, b, a.by_row ? i : 0), unit, src, store)) {
      *reinterpret_cast<uint4*>(dst + unit * 16) = *reinterpret_cast<const uint4*>(src + unit * 16);
    }
  }
}

namespace {
RotaryQParams q_pass_params(const flashcore_attention_params& p, void* out) {
  const int64_t elem = dtype_size(p.dtype);
  RotaryQParams a{};
  a.q = static_cast<const char*>(p.q);
  a.q_stride[0] = p.cu_seqlens_q != nullptr ? 0 : p.q_strides.batch * elem;
  a.q_stride[1] = p.q_strides.seq * elem;
  a.q_stride[2] = p.q_strides.head * elem;
  a.out = static_cast<char*>(out);
  a.cu_seqlens_q = p.cu_seqlens_q;
  a.total_q = p.total_q;
  a.rows = p.cu_seqlens_q != nullptr ? p.total_q : p.batch * p.seqlen_q;
  a.batch = static_cast<int>(p.batch);
  a.seqlen_q = static_cast<int>(p.seqlen_q);
  a.heads = static_cast<int>(p.num_heads_q);
  a.units = static_cast<int>(p.head_dim * elem / 16);
  a.by_row = p.causal != 0 || p.local != 0 ? 1 : 0;
  return a;
}

cudaError_t launch_q_pass(RotaryQParams& a, int sms, cudaStream_t stream) {
  const int64_t blocks = (a.rows * a.heads * a.units + 255) / 256;
  const int64_t cap = int64_t{sms > 0 ? sms : 1} * 8;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks < cap ? blocks : cap));
  config.blockDim = dim3(256);
  config.stream = stream;
  void* args[] = {&a};
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&flashcore_rotary_q), args);
}
}  // namespace

cudaError_t launch_rotary_q(const flashcore_attention_params& p, void* out, int sms, cudaStream_t stream) {
  RotaryQParams a = q_pass_params(p, out);
  a.rotary = rotary_params(p);
  return launch_q_pass(a, sms, stream);
}

cudaError_t launch_widen_q(const flashcore_attention_params& p, flashcore_dtype to, void* out, int sms,
                           cudaStream_t stream) {
  RotaryQParams a = q_pass_params(p, out);  // (units: 16 e4m3 values)
  a.widen = to == FLASHCORE_DTYPE_BF16 ? 2 : 1;
  return launch_q_pass(a, sms, stream);
}

}  // namespace flashcore::kernels

// The queries' rotary embedding on append (flashcore.h rotary_cos): Q rotated into a contiguous copy in the workspace,
// which the attention then reads (api/backend.cpp). One thread per 16-byte unit of a (row, head), grid-stride;
// compiled for every backend's archs (src/CMakeLists.txt, FLASHCORE_COMMON_KERNEL_SOURCES).
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
};

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
    char* dst = a.out + (row * a.heads + head) * int64_t{a.units} * 16;
    if (!rotate_unit(a.rotary, rotary_row(a.rotary, b, a.by_row ? i : 0), unit, src, dst)) {
      *reinterpret_cast<uint4*>(dst + unit * 16) = *reinterpret_cast<const uint4*>(src + unit * 16);
    }
  }
}

cudaError_t launch_rotary_q(const flashcore_attention_params& p, void* out, int sms, cudaStream_t stream) {
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
  a.rotary = rotary_params(p);
  const int64_t blocks = (a.rows * a.heads * a.units + 255) / 256;
  const int64_t cap = int64_t{sms > 0 ? sms : 1} * 8;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks < cap ? blocks : cap));
  config.blockDim = dim3(256);
  config.stream = stream;
  void* args[] = {&a};
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&flashcore_rotary_q), args);
}

}  // namespace flashcore::kernels

// Appending new keys and values to a KV cache before the attention of the same call (flashcore_attention_params::
// k_new / v_new): one thread per 16-byte unit of a row, grid-stride. Positions past the cache's capacity and
// page ids outside the pool are skipped (never written), so garbage lengths or tables cannot write out of bounds.
#pragma once
#include <cuda_runtime.h>

#include "kernels/common/append_params.h"

namespace flashcore::kernels {

__global__ void __launch_bounds__(256) flashcore_append_kv(const __grid_constant__ AppendParams a) {
  const int64_t units = a.rows * a.row_units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / a.row_units;
    const int unit = static_cast<int>(i - row * a.row_units);
    const int head = static_cast<int>(row % a.heads);
    const int64_t bt = row / a.heads;
    const int t = static_cast<int>(bt % a.seqlen_new);
    const int64_t b = bt / a.seqlen_new;
    const int64_t used = a.seqused_k[b];
    const int64_t pos = (used < 0 ? 0 : (used > a.capacity ? a.capacity : used)) + t;
    if (pos >= a.capacity) continue;
    int64_t entry = b, dst_row = pos;
    if (a.block_table != nullptr) {
      entry = a.block_table[b * a.block_table_stride + pos / a.page_size];
      if (entry < 0 || entry >= a.num_pages) continue;
      dst_row = pos % a.page_size;
    }
#pragma unroll
    for (int tensor = 0; tensor < 2; ++tensor) {
      if (unit >= a.units[tensor]) continue;  // V's rows are shorter than K's (head_dim_v < head_dim), or longer
      const int64_t* ss = a.src_stride[tensor];
      const int64_t* ds = a.dst_stride[tensor];
      const uint4 value =
          *reinterpret_cast<const uint4*>(a.src[tensor] + b * ss[0] + t * ss[1] + head * ss[2] + unit * 16);
      *reinterpret_cast<uint4*>(a.dst[tensor] + entry * ds[0] + dst_row * ds[1] + head * ds[2] + unit * 16) = value;
    }
  }
}

}  // namespace flashcore::kernels

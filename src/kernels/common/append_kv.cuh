// Appending new keys and values to a KV cache before the attention of the same call (flashcore_attention_params::
// k_new / v_new): one thread per 16-byte unit of a new row, grid-stride; an e4m3 cache takes each unit as 8 bytes.
// Positions past the cache's capacity and page ids outside the pool are skipped (never written), so garbage lengths
// or tables cannot write out of bounds.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/common/append_params.h"
#include "kernels/common/rotary.cuh"

namespace flashcore::kernels {

// Eight 16-bit values (a unit of a new row) as e4m3 bytes of x / descale (AppendParams::kv8).
__device__ __forceinline__ uint2 e4m3_unit(const uint4& v, int bf16, float descale) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  uint32_t out[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint32_t bytes = 0;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t pair = w[2 * j + k];
      const float2 f = make_float2(__fdiv_rn(elem_of(static_cast<uint16_t>(pair & 0xffffu), bf16), descale),
                                   __fdiv_rn(elem_of(static_cast<uint16_t>(pair >> 16), bf16), descale));
      bytes |= uint32_t{__nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3)} << (16 * k);
    }
    out[j] = bytes;
  }
  return make_uint2(out[0], out[1]);
}

__global__ void __launch_bounds__(256) flashcore_append_kv(const __grid_constant__ AppendParams a) {
  const int64_t units = a.rows * a.row_units;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < units; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / a.row_units;
    const int unit = static_cast<int>(i - row * a.row_units);
    const int head = static_cast<int>(row % a.heads);
    const int64_t bt = row / a.heads;  // the new row: (b, t), or packed row bt
    int64_t b, t, src_b, src_row;  // sequence, its new row, and where that row is in k_new / v_new
    if (a.cu_seqlens_k_new != nullptr) {
      b = packed_owner(a.cu_seqlens_k_new, a.batch, a.total_k_new, bt);
      const int64_t first = a.cu_seqlens_k_new[b], next = a.cu_seqlens_k_new[b + 1];
      const int64_t row0 = first < 0 ? 0 : (first > a.total_k_new ? a.total_k_new : first);
      t = bt - row0;
      if (t < 0 || bt >= (next > a.total_k_new ? a.total_k_new : next)) continue;  // garbage offsets
      src_b = 0;
      src_row = bt;
    } else {
      t = bt % a.seqlen_new;
      b = bt / a.seqlen_new;
      src_b = b;
      src_row = t;
    }
    int64_t slot = b;
    if (a.kv_batch_idx != nullptr) {
      slot = a.kv_batch_idx[b];
      if (slot < 0 || slot >= a.kv_batch_size) continue;  // the sequence has no cache slot: no append
    }
    const int64_t used = a.seqused_k[b];
    const int64_t pos = (used < 0 ? 0 : (used > a.capacity ? a.capacity : used)) + t;
    if (pos >= a.capacity) continue;
    int64_t entry = slot, dst_row = pos;
    if (a.block_table != nullptr) {
      entry = a.block_table[slot * a.block_table_stride + pos / a.page_size];
      if (entry < 0 || entry >= a.num_pages) continue;
      dst_row = pos % a.page_size;
    }
#pragma unroll
    for (int tensor = 0; tensor < 2; ++tensor) {
      if (unit >= a.units[tensor]) continue;  // V's rows are shorter than K's (head_dim_v < head_dim), or longer
      const int64_t* ss = a.src_stride[tensor];
      const int64_t* ds = a.dst_stride[tensor];
      const char* src = a.src[tensor] + src_b * ss[0] + src_row * ss[1] + head * ss[2];
      char* dst = a.dst[tensor] + entry * ds[0] + dst_row * ds[1] + head * ds[2];
      const float* descale = a.descale[tensor];
      auto store = [&](int u, const uint4& v) {
        if (a.kv8) {
          const float d = descale != nullptr ? descale[b * a.heads + head] : 1.f;
          *reinterpret_cast<uint2*>(dst + u * 8) = e4m3_unit(v, a.bf16, d);
        } else {
          *reinterpret_cast<uint4*>(dst + u * 16) = v;
        }
      };
      // The new keys' rotary embedding, at the row's position from the sequence's length before the append.
      if (tensor == 0 && a.rotary.cos != nullptr && rotate_unit(a.rotary, rotary_row(a.rotary, b, t), unit, src, store)) {
        continue;
      }
      store(unit, *reinterpret_cast<const uint4*>(src + unit * 16));
    }
  }
}

}  // namespace flashcore::kernels

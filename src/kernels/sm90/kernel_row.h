// What host code knows of one compiled sm90 kernel: its key (dtype, out dtype, head dim, causal, config name),
// its launch shape and the address of its __global__ function. The generated units define one KernelRow each
// (kernel.cuh, FLASHCORE_SM90_DEFINE_ROW); backend.cpp lists them (generated rows.inc) and launches them.
// Runtime variants (variant.h) are KernelRows too, loaded from cubins.
#pragma once
#include <cstdint>

#include "flashcore/flashcore.h"
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

struct KernelRow {
  const char* name;  // the config's name, e.g. "128x128x2-pp-static" (unique per dtype/head dim/causal)
  flashcore_dtype dtype;
  flashcore_dtype out_dtype;
  int head_dim;
  bool causal;
  bool is_default;  // the library's choice for its (dtype, out dtype, head dim, causal)
  TileShape shape;
  int threads;
  int smem_bytes;
  bool separate_o;
  const void* kernel;  // flashcore_fwd_sm90_kernel<KernelConfig<Row>>, or a runtime variant's cudaKernel_t
  float test_scale_factor = 1.0f;  // multiplies the softmax scale: 1, except for a deliberately faulty test row
  // A default row with a condition (configs.txt "default(seqlen_k<=N)"): the choice only for calls with at most N keys;
  // 0: no condition. select() takes the first default row, in configs.txt order, whose condition the call meets.
  int64_t max_seqlen_k = 0;
  // What tools/check_sass.sh reads through `flashcore info --kernels` (compiled rows; runtime variants leave them
  // empty): the generated row's struct name, which the kernel's SASS symbol carries, and config.h's kTwoPSets.
  const char* symbol = nullptr;
  bool two_p_sets = false;
  int head_dim_v = 0;  // V's and O's head dim (0: head_dim; runtime variants leave it so)
  // K's and V's dtype where it differs from Q's: FLASHCORE_DTYPE_FP8_E4M3 for the e4m3 KV-cache rows
  // (configs_kv8.txt, FLASHCORE_FLAG_KV_FP8_E4M3); FLASHCORE_DTYPE_SAME otherwise.
  flashcore_dtype kv_dtype = FLASHCORE_DTYPE_SAME;
};

// V's and O's head dim of row r.
inline int v_head_dim(const KernelRow& r) { return r.head_dim_v != 0 ? r.head_dim_v : r.head_dim; }

// Whether `r` is the default for a call with `seqlen_k` keys, its condition (if any) met; INT64_MAX: the key's
// unconditional default.
inline bool is_default_for(const KernelRow& r, int64_t seqlen_k) {
  return r.is_default && (r.max_seqlen_k == 0 || seqlen_k <= r.max_seqlen_k);
}

}  // namespace flashcore::sm90

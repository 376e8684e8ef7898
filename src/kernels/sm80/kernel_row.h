// What host code knows of one compiled portable kernel: its key (dtype, out dtype, head dim, causal, config
// name), its launch shape and the address of its __global__ function. The generated units define one KernelRow
// each (kernel.cuh, FLASHCORE_SM80_DEFINE_ROW); backend.cpp lists them (generated rows.inc) and launches them.
#pragma once
#include "flashcore/flashcore.h"
#include "kernels/sm80/tile_shape.h"

namespace flashcore::sm80 {

struct KernelRow {
  const char* name;  // the config's name, e.g. "128x64x2-w4" (unique per dtype/head dim/causal)
  flashcore_dtype dtype;
  flashcore_dtype out_dtype;
  int head_dim;
  bool causal;
  bool is_default;  // a default candidate: the first one (configs.txt order) that fits the device and the call wins
  // Conditions of a default candidate (configs.txt, "default(...)"): the call's seqlen_k at most max_seqlen_k (0: any),
  // and at least min_ctas_per_sm CTAs of the row resident per SM on the device (shared memory and registers).
  long long max_seqlen_k;
  int min_ctas_per_sm;
  TileShape shape;
  int threads;
  int smem_bytes;
  const void* kernel;  // flashcore_fwd_sm80_kernel<KernelConfig<Row>>
  int head_dim_v;      // V's and O's head dim (head_dim, or MLA's 128 beside 192)
};

}  // namespace flashcore::sm80

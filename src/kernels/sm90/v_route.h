// Where an 8-bit call's V, given as stored, is transposed into the K-major layout 8-bit wgmma reads (see
// docs/decisions.md#v-route): by the kernel's producer warps (transpose_v.cuh), or by a pass into the workspace before
// the kernel. Host-only arithmetic, tested on the CPU.
//
// In the kernel, every query tile transposes each V block it reads, at a cost per tile that is about fixed and does
// not depend on the memory. The pass moves V through DRAM once (read and written), plus a launch, and its cost is
// shared by the query tiles of a KV head (a causal tile counting half). So the kernel's route wins up to some number
// of tiles per KV head, and that number falls as DRAM gets faster:
//   - head dim 64: the kernel's route at every length (H100, v35: ahead up to 2k keys, level at 4k-16k; H200, v44:
//     ahead or level everywhere);
//   - head dims 128 and 256: up to 16 tiles on an H100 (3.35 TB/s, v35's crossover), scaled by the DRAM bandwidth
//     against the H100's: about 11 on an H200 (4.9 TB/s), where v44 measured the crossover between 8 and 16.
#pragma once
#include <cstdint>

namespace flashcore::sm90 {

inline constexpr double kVRouteReferenceTiles = 16;       // the H100's crossover, head dims >= 128
// H100 SXM (2 x 2619 MHz x 5120 bits, as core::dram_peak_gbps_of computes it): 3352 GB/s.
inline constexpr double kVRouteReferenceDramGbps = 2.0 * 2619 * (5120 / 8) / 1000;

// The most query tiles per KV head (a causal tile counting half) for which the kernel's route is taken at head dims
// >= 128 on a device with this DRAM peak (0: unknown, the H100's figure).
constexpr double in_kernel_v_tile_limit(double dram_gbps) {
  return dram_gbps > 0 ? kVRouteReferenceTiles * kVRouteReferenceDramGbps / dram_gbps : kVRouteReferenceTiles;
}

// Whether V is transposed in the kernel for a call of `query_tiles` tiles per KV head (ceil(seqlen_q / block_m) x
// the GQA group), given that the tile can transpose in place (tile_shape.h).
constexpr bool v_transposed_in_kernel(int head_dim, bool causal, int64_t query_tiles, double dram_gbps) {
  if (head_dim < 128) return true;
  return (causal ? 0.5 : 1.0) * static_cast<double>(query_tiles) <= in_kernel_v_tile_limit(dram_gbps);
}

}  // namespace flashcore::sm90

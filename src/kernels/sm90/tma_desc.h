// Host-side encoding of TMA tensor maps (cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion so libflashcore has no link-time dependency on libcuda).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::sm90 {

// A (batch, seq, heads, head_dim) tensor viewed as the 4-D map (head_dim, seq, heads, batch) with the
// caller's strides, 128-byte swizzle, and a box of one 128-byte row chunk x box_rows rows of one head and batch (64-byte
// chunks and swizzle where the row is not whole 128 bytes: smem_plan.h swizzle_row_bytes).
// chunked: the 5-D map (chunk elements, seq, head_dim / chunk, heads, batch), the chunk dimension a chunk apart, whose
// box is every chunk of box_rows rows, chunk-major in shared memory. Out-of-range rows read as zero and are clipped
// on store.
struct TensorMapArgs {
  const char* name;  // "q", "k", "v", "o": for error messages
  const void* base;
  flashcore_dtype dtype;
  int64_t head_dim, seqlen, heads, batch;
  flashcore_tensor_strides strides;  // elements
  int box_rows;
  int row_elems = 0;  // elements per box row (64 or 128 bytes' worth); 0: the head dim, at most 128 bytes of it
  bool chunked = false;  // the 5-D map (tile_shape.h tma_chunked); only for 16-bit head dims of several chunks
};

flashcore_status encode_tensor_map(CUtensorMap* map, const TensorMapArgs& args, std::string& error);

}  // namespace flashcore::sm90

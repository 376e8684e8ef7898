// Runtime kernel variants: sm90 tile configs that are not compiled into the library, built as cubins by nvcc
// from the kernel sources and loaded with cudaLibraryLoadFromFile (the autotuner's --build, docs/tuning.md).
// A registered variant is a KernelRow like the compiled ones: select() finds it by name, launch() runs it.
#pragma once
#include <string>

#include "flashcore/flashcore.h"
#include "kernels/sm90/config_grammar.h"
#include "kernels/sm90/kernel_row.h"
#include "kernels/sm90/tile_shape.h"

namespace flashcore::sm90 {

struct VariantSpec {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;  // FP16 or BF16; O has the same dtype
  int head_dim = 128;
  bool causal = false;
  TileShape shape{};
};

// Config names ("128x176x2-static", "192x128x3-pp-onecta-vote") and their parse: config_grammar.h.

// The host mirror of KernelConfig (config.h): what a spec costs before it is built.
struct Footprint {
  int threads = 0;
  int smem_bytes = 0;
  bool separate_o = false;
  int consumer_regs = 0;     // setmaxnreg budget per consumer thread
  int estimated_regs = 0;    // accumulators + fragments + overhead per consumer thread
};
Footprint footprint(const VariantSpec& spec);

// Whether the spec can be built and run: head dim 96 or a multiple of 64 (64..256), block_m in {64, 128, 192} (or 8: a
// transposed split-KV decode row, smem_plan.h swaps_gemms), block_n a multiple of 16 in [16, 256], stages 1..4,
// ping-pong only with >= 2 consumer warpgroups, shared memory <= 227 KB and the register estimate within the consumer
// budget. On false, `why` says which rule failed.
bool feasible(const VariantSpec& spec, std::string& why);

// The kernel sources nvcc builds variants from: $FLASHCORE_KERNEL_SOURCES, else the source tree this library
// was built from (when it still exists), else <prefix>/share/flashcore/src beside the installed library.
// "" when none is found.
// The directory is a `src` directory (it holds kernels/sm90/kernel.cuh); flashcore/flashcore.h is taken from
// the `include` directory beside it. A set but unusable $FLASHCORE_KERNEL_SOURCES gives "".
std::string kernel_source_dir();

// The nvcc build_variant runs, by the lookup order below; "" when none is found.
std::string find_nvcc();

// The start of the cubin names build_variant makes for `spec`, e.g. "sm90_bf16_d128_c0_128x160x2-pp-static"; the
// full name is "<stem>_<16 hex digits of the hash>.cubin" (a machine without nvcc finds prebuilt cubins by it).
std::string cubin_stem(const VariantSpec& spec);
// The name of the row struct in a variant's generated unit ("v_" + the stem, '-' -> '_'): part of its kernel's
// mangled name, by which register_variant checks that a cubin is the spec's.
std::string variant_symbol(const VariantSpec& spec);

// Compile `spec` into a cubin under `out_dir` (created if needed). The file name carries the spec and a hash of
// the sources and flags, so an existing cubin is reused (also without nvcc: a machine with the same sources
// finds cubins built elsewhere). nvcc: $FLASHCORE_NVCC, $CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin.
// Rejects specs that are not feasible() and cubins whose kernel spills (local memory).
// Status: INVALID_ARGUMENT when the spec is not feasible or its kernel would use local memory (spills, a stack
// frame) or ptxas ignored setmaxnreg / serialized wgmma (C7508, C7510, C7512: what tools/check_sass.sh rejects in
// the library); UNSUPPORTED_ARCH when no nvcc or no kernel sources are found; INTERNAL when nvcc fails (`error` holds
// its output) or `out_dir` cannot be written. Beside the cubin: the generated unit (.cu) and nvcc's report (.log).
flashcore_status build_variant(const VariantSpec& spec, const std::string& out_dir, std::string& cubin_path,
                               std::string& error);

// Load a cubin made by build_variant for `spec` and add it to the rows select() searches, under
// config_name(spec.shape). Checks the image (one kernel, sm_90, no local memory) on the current device. A name
// that is compiled into the library for the same key is refused; registering the same path again returns the
// same row. The row lives until the process ends.
// Status: NO_DEVICE / CUDA when the cubin cannot be loaded (no GPU, CUDA error), UNSUPPORTED_ARCH when its image
// is not sm_90, INVALID_ARGUMENT when the spec is not feasible, the name is taken or the cubin is not the spec's.
flashcore_status register_variant(const VariantSpec& spec, const std::string& cubin_path, const KernelRow** row,
                                  std::string& error);

// Test hook for the tuner's correctness gate: registers `spec` from `cubin_path` under `name`, launched with the
// softmax scale multiplied by 1.05 (a deliberately wrong variant that must never be chosen).
flashcore_status register_faulty_variant_for_testing(const VariantSpec& spec, const std::string& cubin_path,
                                                     const std::string& name, std::string& error);

// FNV-1a 64 of a file's bytes as 16 hex digits ("" when unreadable): the identity a tuning table records.
std::string file_hash(const std::string& path);

}  // namespace flashcore::sm90

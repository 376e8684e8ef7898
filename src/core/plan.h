// One plan per call, behind one backend interface. A backend (src/kernels/<arch>/backend.cpp) decides everything about
// a call once, in plan(): the kernel row, the split of its key ranges, the V route, the workspace layout and the
// launches around the kernel (KV append, 8-bit preparation, combine); run() only launches what the plan says. The C
// ABI's workspace-size query, selected_config, forward and the public plan/run pair all read the same Plan.
// This header sits below both src/api/ and src/kernels/: it includes neither.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"

namespace flashcore::core {

// Byte offsets of the parts of a call's device workspace, decided in one place (the backend's plan). Every layout
// starts with the same 256-byte zero-filled head (flashcore.h: it is zero again after every call): the dynamic
// scheduler's tile counter in bytes [0, 16) and the split-KV merge counters in [16, 256). A part the call does not
// have stays 0; every part is 256-byte aligned.
struct WorkspaceLayout {
  static constexpr size_t kHead = 256;        // the zero-filled head
  static constexpr size_t kTileCounter = 0;   // int: the dynamic scheduler's next tile
  static constexpr size_t kSplitCounters = 16;  // one byte per cut tile: parts merged so far
  size_t bytes = 0;  // what the call needs (0: no workspace at all)
  // Split-KV partials: fp32 O (rows x head_dim) and LSE (rows).
  size_t o_partial = 0, lse_partial = 0;
  // 8-bit calls: V transposed (key index innermost), unless the kernel transposes V itself or V comes transposed.
  size_t vt = 0;
  // precision = FP8: amax[3][B*Hkv] then descale[3][B*Hkv] (Q, K, V), the e4m3 Q (B, Sq, Hq, D) and K (B, Sk, Hkv, D)
  // (the transposed V is `vt`).
  size_t fp8_scales = 0;
  // precision = INT8: per-token Q scales, per-128-key-block K scales, the partial and whole per-channel K means, the
  // LSE shift per query row, the int8 Q and K.
  size_t q_scale = 0, k_scale = 0, k_partial = 0, k_mean = 0, lse_shift = 0;
  size_t q8 = 0, k8 = 0;  // the 8-bit copies of Q and K (FP8 or INT8)
};

inline constexpr size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// How a tile's key range is cut (split-KV), decided by the sm90 plan (kernels/sm90/split_plan.h).
struct SplitKv {
  int splits = 1;            // parts per tile (decode rows) or per remaining tile (the prefill rows' last round)
  int blocks_per_split = 1;  // key blocks per part
  bool last_round = false;   // prefill: whole tiles first, then the last round's tiles cut
  int64_t whole = 0, total = 0;  // last_round: whole tiles, and the tile index space
  bool fused_merge = false;  // the tiles' last parts merge the partials (no combine kernel after the grid)
};

struct BackendOps;

// Everything dispatch decided about one call. Pointers of the call are not part of it: run() takes the call again
// (the same shapes, new pointers: a CUDA graph's replay, an engine's next step) and reads its tensors from there.
struct Plan {
  const BackendOps* backend = nullptr;
  int device = 0, cc = 0, sms = 0;
  const void* row = nullptr;     // the backend's kernel row (sm90::KernelRow, sm80::KernelRow)
  const char* config = nullptr;  // its name (static, or a registered variant's: lives as long as the process)
  bool gqa_packed = false;       // decode with shared KV heads runs with a KV group's query heads as rows (gqa_pack.h)
  int32_t precision = FLASHCORE_PRECISION_NATIVE;  // FP8 / INT8: a quantization launch first, then the 8-bit row
  bool v_in_kernel = false;      // 8-bit: the kernel's producer warps transpose V tiles in shared memory
  bool v_pass = false;           // 8-bit: a transpose launch writes V into the workspace first
  bool append_kv = false;        // k_new: the append launch first
  bool combine = false;          // split-KV partials merged by the combine launch after the kernel
  bool lse_shift = false;        // precision = INT8 with an LSE: the shift launch after the kernel
  SplitKv split;
  WorkspaceLayout workspace;
  // Q's copy in the workspace (rotated: flashcore.h rotary_cos; or an e4m3 Q widened on an e4m3 KV cache): its
  // offset, after the backend's bytes (workspace.bytes counts it); its launch runs before the backend's
  // (api/backend.cpp).
  size_t q_copy = 0;
};

// One backend's view of a compiled kernel, for listings.
struct RowInfo {
  const char* name;
  flashcore_dtype dtype, out_dtype;
  int head_dim;
  bool causal, is_default;
  int smem_bytes;
  bool variant = false;  // a runtime variant (sm90/variant.h), not compiled into the library
  int head_dim_v = 0;    // V's and O's head dim (0: head_dim)
};

// The tuning tables' choice for a call's shape bucket (api/tuning.cpp choose): a config name, or nullptr.
using TunedChoice = const char* (*)(int device, int cc, flashcore_dtype dtype, int head_dim, bool causal,
                                    int64_t seqlen_q, int64_t seqlen_k, bool workspace_given);

// What a plan is made for, beside the call: the workspace the caller gives (UINT64_MAX: whatever the plan reports,
// which the caller then allocates), and the tables' choice.
struct PlanRequest {
  uint64_t workspace_capacity = 0;
  TunedChoice tuned = nullptr;
};

// A backend: the compute capabilities it serves, its rows, and plan/run. Adding a backend is one BackendOps in its
// folder and one line in the table (src/api/backend.cpp); nothing else in src/api changes.
struct BackendOps {
  const char* name;
  int cc_min, cc_max;  // compute capabilities served by default, inclusive
  // Whether a compiled image runs on `cc` (also outside [cc_min, cc_max], when FLASHCORE_BACKEND forces it).
  bool (*has_image)(int cc);
  // The archs (major * 10 + minor) its images were compiled for.
  void (*compiled_archs)(std::vector<int>& out);
  // Its rows that can run on `cc` (0: every compiled row), runtime variants last, in table order.
  void (*rows)(int cc, std::vector<RowInfo>& out);
  // The config a call of this key runs by default on `cc` for long key ranges (listings name it first), or nullptr.
  const char* (*default_config)(int cc, flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal);
  // Whether `name` runs for the key on `cc`; *needs_workspace (when not NULL) whether it needs a workspace.
  bool (*config_available)(int cc, flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                           const char* name, bool* needs_workspace);
  // Plan a validated call (plans do not depend on the softmax scale). plan.backend, device, cc and sms are set on
  // entry.
  flashcore_status (*plan)(const flashcore_attention_params& p, const PlanRequest& request, Plan& plan,
                           std::string& error);
  // Launch a plan for `p` (the call it was made for, or one of the same shapes).
  flashcore_status (*run)(const Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                          cudaStream_t stream, std::string& error);
  // The backward pass (flashcore.h flashcore_attention_backward), nullptr where the backend has none: whether a
  // kernel is compiled for (dtype, head_dim, head_dim_v) (variants: its variants' kernels, for a window, chunks or
  // softcap), the workspace bytes of a validated call, and its launches.
  bool (*backward_compiled)(flashcore_dtype dtype, int head_dim, int head_dim_v, bool variants) = nullptr;
  uint64_t (*backward_workspace)(const flashcore_attention_params& p) = nullptr;
  flashcore_status (*backward)(const flashcore_attention_params& p, float softmax_scale, int device,
                               cudaStream_t stream, std::string& error) = nullptr;
};

}  // namespace flashcore::core

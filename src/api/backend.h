// The backend table: every compiled kernel is a row keyed by (arch, dtype, out dtype, head dim, causal,
// tile config). The API asks this table, never a backend directly; a new arch backend (sm80) or a new tile
// config is a new set of rows (src/kernels/<arch>/...), not a new code path here.
#pragma once
#include <cstddef>
#include <string>

#include <cuda_runtime_api.h>

#include "core/plan.h"
#include "flashcore/flashcore.h"

namespace flashcore::backend {

// True when some backend compiled a kernel for (dtype, head_dim) (any arch).
bool is_compiled(flashcore_dtype dtype, int head_dim);
// True when some backend compiled a kernel for (dtype, head_dim) with V's head dim head_dim_v (any arch).
bool is_compiled_pair(flashcore_dtype dtype, int head_dim, int head_dim_v);
// The (head_dim, head_dim_v) pairs with head_dim_v != head_dim compiled for dtype (FLASHCORE_DTYPE_SAME: any), sorted;
// writes at most `capacity` to `out` and returns the count.
int compiled_head_dim_pairs(flashcore_dtype dtype, int (*out)[2], int capacity);

// Head dims some backend compiled for `dtype` (FLASHCORE_DTYPE_SAME: for any dtype), ascending; writes at most
// `capacity` of them to `out` and returns how many there are.
int compiled_head_dims(flashcore_dtype dtype, int* out, int capacity);

// Compute capabilities (major*10 + minor, e.g. 90) that some backend serves; writes at most `capacity`
// of them to `out` and returns how many there are.
int compiled_archs(int* out, int capacity);

// Name of the backend that serves a device of compute capability `cc`, or nullptr when none does:
//   "sm90" for 9.0 (Hopper: wgmma + TMA, sm_90a);
//   "sm80" for 8.x (Ampere, Ada: the portable mma.sync + cp.async kernels) when a compiled image runs there
//          (FLASHCORE_SM80_ARCHS holds an arch of the same major version, at most cc), and for GPUs newer than
//          Hopper (10.x, 12.x, ...) from the PTX compiled beside that SASS (FLASHCORE_SM80_PTX: the newest arch's,
//          at most cc), which the driver JIT-compiles at first use (kernels/sm80/image_rule.h).
// The environment variable FLASHCORE_BACKEND (read at every call) overrides the choice: "sm80" or "sm90" forces
// that backend wherever it has an image (FLASHCORE_BACKEND=sm80 runs the portable kernels on a Hopper GPU, from
// their plain sm_90 image, for testing and measuring); any other name serves nothing. Unset, "" or "auto": the
// table's choice.
const char* backend_for_arch(int cc);

// The value of FLASHCORE_BACKEND when it forces a backend (neither unset, "" nor "auto"), else nullptr.
const char* forced_backend();

// Kernel-config names compiled for (dtype, head_dim, causal) that can run on `cc` (through the backend
// backend_for_arch(cc) names), the one forward() picks by default first.
int kernel_configs(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char** out, int capacity);

// Whether the backend serving `cc` (backend_for_arch) has the config `name` for (dtype -> dtype, head_dim,
// causal): compiled in, or on sm90 a runtime variant registered under that name (sm90/variant.h). Sets
// *needs_workspace (when not NULL) to whether the config needs a device workspace (dynamic scheduler).
bool config_available(int cc, flashcore_dtype dtype, int head_dim, bool causal, const char* name,
                      bool* needs_workspace);

// The plan of a validated call on `device` (compute capability `cc`) for a workspace of `workspace_capacity` bytes
// (UINT64_MAX: the size the plan reports, which the caller then allocates): made by the backend that serves `cc`
// (core/plan.h). workspace_size(), forward(), selected_config() and the C ABI's plan/run pair all go through it.
flashcore_status plan(const flashcore_attention_params& p, int device, int cc, uint64_t workspace_capacity,
                      core::Plan& out, std::string& error);

// Launch `plan` for `p` (the call it was made for, or one with the same shapes) on `stream`.
flashcore_status run(const core::Plan& plan, const flashcore_attention_params& p, float softmax_scale,
                     cudaStream_t stream, std::string& error);

// workspace_size(), forward() and selected_config() agree on the config a call runs (they read one plan): the one p.kernel_config
// names; for a call that names none on an sm90 device, the tuning table's choice for its shape bucket
// (tuning::choose; tables are measured with O in the input dtype, so a call with another out_dtype runs the
// default), else the backend's default. forward() and selected_config() count a workspace as given when
// p.workspace is set and p.workspace_size > 0; workspace_size() counts it as given, so that it reports what a
// caller who allocates the workspace runs.

// Bytes of device workspace the call needs (0 for most calls) on the current device. `p` has passed validation.
flashcore_status workspace_size(const flashcore_attention_params& p, int cc, size_t& bytes, std::string& error);

// Enqueue the forward pass on `device` (compute capability `cc`). `p` has passed validation (struct upgraded
// to the current layout); `softmax_scale` is resolved. On failure returns a status and writes a message naming
// the cause into `error`; nothing is enqueued then.
flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                         cudaStream_t stream, std::string& error);

// The backward pass (flashcore.h flashcore_attention_backward) of a validated call (validate_backward_arguments) on a
// device of compute capability `cc`: whether some backend compiled it for (dtype, head_dim, head_dim_v; 0: head_dim)
// (any arch; variants: with its variants' kernels, for a window, chunks or softcap), the workspace
// bytes, and the launches. A backend without a backward (core::BackendOps::backward nullptr) returns
// UNSUPPORTED_ARCH naming itself.
bool backward_compiled(flashcore_dtype dtype, int head_dim, int head_dim_v = 0, bool variants = false);
flashcore_status backward_workspace_size(const flashcore_attention_params& p, int cc, uint64_t& bytes,
                                         std::string& error);
flashcore_status backward(const flashcore_attention_params& p, float softmax_scale, int device, int cc,
                          cudaStream_t stream, std::string& error);

// 8-bit V in the kernels' transposed layout (flashcore.h: flashcore_fp8_transpose_v): its bytes, and the transpose of
// p's V into `vt` on `stream` (sm90 backend). `p` has passed validation and is an 8-bit call without
// FLASHCORE_FLAG_V_TRANSPOSED.
size_t fp8_transposed_v_bytes(const flashcore_attention_params& p);
flashcore_status fp8_transpose_v(const flashcore_attention_params& p, void* vt, int cc, cudaStream_t stream,
                                 std::string& error);

// The name of the config forward() would run for `p` on `device` (a static string, or a registered variant's
// name: it lives as long as the process). `p` has passed validation.
flashcore_status selected_config(const flashcore_attention_params& p, int device, int cc, const char*& name,
                                 std::string& error);

}  // namespace flashcore::backend

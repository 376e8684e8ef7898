// Host entry into the portable (sm80) backend: the compiled rows, the archs they were compiled for, their
// selection for a device and their launch (backend.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "core/plan.h"
#include "flashcore/flashcore.h"
#include "kernels/sm80/kernel_row.h"

namespace flashcore::sm80 {

// Every kernel compiled into this library (generated rows.inc), in configs.txt order.
const KernelRow* const* rows(int& count);

// The archs the kernels were compiled for (FLASHCORE_SM80_ARCHS, e.g. 80, 86, 89, 90), ascending.
const int* compiled_archs(int& count);

// True when a compiled image can run on compute capability `cc` (image_rule.h): some compiled arch a with the same
// major version and a <= cc (SASS runs on later minor versions of its major: sm_80 on 8.6/8.7/8.9, sm_90 on 9.0),
// or, with the PTX compiled in (FLASHCORE_SM80_PTX), any cc >= its arch (10.x, 12.x: JIT-compiled by the driver).
bool has_image_for(int cc);

// The arch of the PTX compiled in beside the SASS (the newest of FLASHCORE_SM80_ARCHS), 0 when there is none.
int ptx_arch();

// Per-block shared memory (opt-in) of compute capability `cc`: 163 KB for 8.0/8.7, 227 KB for 9.0, 99 KB
// otherwise (8.6, 8.9, and the GPUs newer than Hopper that run the PTX: the smallest of them, 12.x, has 99 KB).
// Rows above it are not offered on such a device.
int smem_limit(int cc);

// True when `row` fits a device of compute capability `cc`.
bool fits(const KernelRow& row, int cc);

// CTAs of `row` resident per SM on compute capability `cc` (by shared memory and a full register budget).
int ctas_per_sm(const KernelRow& row, int cc);

// The row for (dtype, out dtype, head dim, causal) on `cc`: the one named `config` when it is not NULL, else
// the first default candidate (configs.txt order) that fits and whose conditions hold: `seqlen_k` at most the row's
// max_seqlen_k, and at least its min_ctas_per_sm resident CTAs (pass INT64_MAX for the long-sequence default).
// nullptr (with a message in `error`) when none. head_dim_v: V's head dim (0: head_dim).
const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, int cc, int64_t seqlen_k, std::string& error, int head_dim_v = 0);

// Launch `row` on `device` (compute capability `cc`). `p` has passed validation; `softmax_scale` is resolved.
flashcore_status launch(const KernelRow& row, const flashcore_attention_params& p, float softmax_scale, int device,
                        int cc, cudaStream_t stream, std::string& error);

// The portable backend's plan and run (core/plan.h), for the backend table.
extern const core::BackendOps kBackend;

}  // namespace flashcore::sm80

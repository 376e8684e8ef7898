// Host entry into the sm90 backend: the compiled rows, their selection and launch (backend.cpp).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "kernels/sm90/kernel_row.h"

namespace flashcore::sm90 {

// Every kernel compiled into this library (generated rows.inc), in configs.txt order.
const KernelRow* const* rows(int& count);

// The runtime variants registered so far (variant.h), in registration order: rows select() finds by name after
// the compiled ones, never a default, and not in rows(). They live until the process ends.
std::vector<const KernelRow*> registered_rows();

// The row for (dtype, out dtype, head dim, causal): the one named `config` when it is not NULL (a compiled row,
// else a registered variant), else the default. nullptr (with a message in `error`) when none matches.
const KernelRow* select(flashcore_dtype dtype, flashcore_dtype out_dtype, int head_dim, bool causal,
                        const char* config, std::string& error);

// Device workspace the row needs (the dynamic scheduler's counter), in bytes.
size_t workspace_bytes(const KernelRow& row);

// Encode the tensor maps and launch `row` on `device`. `p` has passed validation; `softmax_scale` is resolved.
flashcore_status launch(const KernelRow& row, const flashcore_attention_params& p, float softmax_scale, int device,
                        cudaStream_t stream, std::string& error);

}  // namespace flashcore::sm90

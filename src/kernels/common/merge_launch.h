// Host launches of the arch-neutral merge and row copy kernels (merge.cu), compiled for every backend's archs.
#pragma once
#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "kernels/common/merge_params.h"

namespace flashcore::kernels {

// part_dtype: FP16, BF16 or FP32 (or anything when m.o_part is NULL); out_dtype: FP16 or BF16 (anything when
// m.o_out is NULL). cudaErrorInvalidValue for a combination that is not compiled.
cudaError_t launch_merge(const MergeParams& m, flashcore_dtype part_dtype, flashcore_dtype out_dtype, int head_dim,
                         cudaStream_t stream);

cudaError_t launch_copy_rows(const CopyRowsParams& c, cudaStream_t stream);

}  // namespace flashcore::kernels

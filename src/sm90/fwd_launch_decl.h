// Declaration of the per-instantiation launchers (defined in the generated units).
#pragma once
#include <cuda_runtime_api.h>

#include "sm90/kernel_params.h"

namespace flashcore::sm90 {

template <class Element, int kHeadDim, bool kCausal>
cudaError_t launch_fwd(const FwdParams& params, unsigned num_ctas, int device, cudaStream_t stream);

}  // namespace flashcore::sm90

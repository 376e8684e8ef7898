// Host helpers every backend's launcher shares: CUDA error messages, the multiprocessor count, and the
// per-(kernel, CUDA context) record of one-time kernel preparation (image check, shared-memory opt-in), which a
// cudaDeviceReset (a new context) invalidates.
#pragma once
#include <string>

#include <cuda_runtime_api.h>

namespace flashcore::api {

// "<what>: <cudaErrorName>: <description>".
std::string cuda_message(const char* what, cudaError_t err);

// Multiprocessor count of `device` (cached for devices 0..63).
cudaError_t sm_count(int device, int& sms);

// Whether `kernel` was prepared on `device` in the current CUDA context; mark_prepared records that it was.
bool is_prepared(const void* kernel, int device);
void mark_prepared(const void* kernel, int device);

}  // namespace flashcore::api

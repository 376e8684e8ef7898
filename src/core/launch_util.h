// Host helpers every backend's launcher shares: CUDA error messages, the multiprocessor count, and the
// per-(kernel, CUDA context) record of one-time kernel preparation (image check, shared-memory opt-in), which a
// cudaDeviceReset (a new context) invalidates.
#pragma once
#include <functional>
#include <string>

#include <cuda_runtime_api.h>

#include "flashcore/flashcore.h"
#include "kernels/common/serving_layout.h"

namespace flashcore::core {

// Programmatic dependent launch on `config`: the grid is set up and its CTAs placed while the previous kernel on the
// stream finishes; the kernel waits for it (griddepcontrol) before touching memory. `attribute` outlives the launch.
inline void allow_dependent_launch(cudaLaunchConfig_t& config, cudaLaunchAttribute& attribute) {
  attribute = cudaLaunchAttribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
}

// "<what>: <cudaErrorName>: <description>".
std::string cuda_message(const char* what, cudaError_t err);

// Multiprocessor count of `device` (cached for devices 0..63).
cudaError_t sm_count(int device, int& sms);

// DRAM peak in GB/s from a memory clock (kHz) and bus width (bits), double data rate; 0 if either is unknown.
constexpr double dram_peak_gbps_of(int memory_clock_khz, int bus_width_bits) {
  return memory_clock_khz > 0 && bus_width_bits > 0 ? 2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8.0) / 1e9
                                                    : 0.0;
}

// DRAM peak of `device` in GB/s (dram_peak_gbps_of its attributes; 0 where it reports neither), cached for devices
// 0..63.
cudaError_t dram_peak_gbps(int device, double& gbps);

// Once per (kernel, CUDA context): load the kernel's attributes, ask `image_error` whether the loaded image is one
// this backend may launch ("" = yes, else the message, reported as UNSUPPORTED_ARCH), and raise its dynamic
// shared-memory limit to `smem_bytes`. `what` names the image in messages ("sm90 kernel image").
flashcore_status prepare_kernel(const void* kernel, int device, int smem_bytes, const char* what,
                                const std::function<std::string(const cudaFuncAttributes&)>& image_error,
                                std::string& error);

// Causal tile order (kernels/common/tile_math.h): (batch, head) slices of the call and slices per L2 section for a
// grid of m_blocks query blocks per slice.
void tile_order(const flashcore_attention_params& p, int64_t m_blocks, int& num_slices, int& section_slices);

// The call's serving layouts as the kernels read them (every field but seqused_k_add and cu_seqlens_k_new / total_k_new,
// which the append sets).
void set_serving_layout(kernels::ServingLayout& s, const flashcore_attention_params& p);

// A call with k_new / v_new: launch the append of the new rows into the cache on `stream` (before the forward, which
// then reads seqlen_new more keys per sequence, s.seqused_k_add, or its packed count, s.cu_seqlens_k_new). Any backend;
// nothing to do without k_new.
flashcore_status append_new_kv(const flashcore_attention_params& p, int device, cudaStream_t stream,
                               kernels::ServingLayout& s, std::string& error);

}  // namespace flashcore::core

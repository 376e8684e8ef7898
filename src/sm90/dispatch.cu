// Host dispatch of the sm90 forward kernels: encode the tensor maps, pick the instantiation for
// (dtype, head dim, causal), launch.
#include <cmath>
#include <string>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm90/fwd_launch.h"
#include "sm90/fwd_launch_decl.h"
#include "sm90/tile_config.h"
#include "sm90/tma_desc.h"

namespace flashcore::sm90 {
namespace {

// Multiprocessor count of device `device` (cached for devices 0..63).
cudaError_t sm_count(int device, int& sms) {
  static int cache[64];
  const bool cached = device >= 0 && device < 64;
  if (cached && (sms = __atomic_load_n(&cache[device], __ATOMIC_ACQUIRE)) > 0) return cudaSuccess;
  const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess && cached) __atomic_store_n(&cache[device], sms, __ATOMIC_RELEASE);
  return err;
}

template <class Element, int kHeadDim>
cudaError_t launch_for_mask(bool causal, const FwdParams& fp, unsigned ctas, int device, cudaStream_t stream) {
  return causal ? launch_fwd<Element, kHeadDim, true>(fp, ctas, device, stream)
                : launch_fwd<Element, kHeadDim, false>(fp, ctas, device, stream);
}

// Returns false when (dtype, head_dim) is not compiled in.
bool launch_compiled(flashcore_dtype dtype, int head_dim, bool causal, const FwdParams& fp, unsigned ctas,
                     int device, cudaStream_t stream, cudaError_t& err) {
#define FLASHCORE_SM90_KERNEL(DTYPE_ENUM, ELEMENT, HD)                 \
  if (dtype == DTYPE_ENUM && head_dim == HD) {                         \
    err = launch_for_mask<ELEMENT, HD>(causal, fp, ctas, device, stream);     \
    return true;                                                       \
  }
#include "sm90/compiled_kernels.inc"
#undef FLASHCORE_SM90_KERNEL
  return false;
}

}  // namespace

bool is_compiled(flashcore_dtype dtype, int head_dim) {
#define FLASHCORE_SM90_KERNEL(DTYPE_ENUM, ELEMENT, HD) \
  if (dtype == DTYPE_ENUM && head_dim == HD) return true;
#include "sm90/compiled_kernels.inc"
#undef FLASHCORE_SM90_KERNEL
  return false;
}

flashcore_status forward(const flashcore_attention_params& p, float softmax_scale, int device, cudaStream_t stream,
                         std::string& error) {
  if (!is_compiled(p.dtype, static_cast<int>(p.head_dim))) {
    error = "head_dim = " + std::to_string(p.head_dim) + " is not compiled in for this dtype";
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  const TileShape shape = tile_shape_for(static_cast<int>(p.head_dim), p.causal != 0);

  FwdParams fp{};
  const TensorMapArgs maps[4] = {
      {"q", p.q, p.dtype, p.head_dim, p.seqlen_q, p.num_heads_q, p.batch, p.q_strides, shape.block_m},
      {"k", p.k, p.dtype, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.k_strides, shape.block_n},
      {"v", p.v, p.dtype, p.head_dim, p.seqlen_k, p.num_heads_kv, p.batch, p.v_strides, shape.block_n},
      {"o", p.o, p.dtype, p.head_dim, p.seqlen_q, p.num_heads_q, p.batch, p.o_strides, 64},
  };
  CUtensorMap* targets[4] = {&fp.tma_q, &fp.tma_k, &fp.tma_v, &fp.tma_o};
  for (int i = 0; i < 4; ++i) {
    const flashcore_status st = encode_tensor_map(targets[i], maps[i], error);
    if (st != FLASHCORE_SUCCESS) return st;
  }

  const long long m_blocks = (p.seqlen_q + shape.block_m - 1) / shape.block_m;
  const long long tiles = m_blocks * p.num_heads_q * p.batch;
  if (tiles > 0x7fffffffLL - 4096) {
    error = "batch * num_heads_q * ceil(seqlen_q / " + std::to_string(shape.block_m) + ") = " +
            std::to_string(tiles) + " exceeds the tile limit 2^31-4097";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  fp.lse = p.lse;
  fp.seqlen_q = static_cast<int>(p.seqlen_q);
  fp.seqlen_k = static_cast<int>(p.seqlen_k);
  fp.num_heads_q = static_cast<int>(p.num_heads_q);
  fp.head_ratio = static_cast<int>(p.num_heads_q / p.num_heads_kv);
  fp.num_m_blocks = static_cast<int>(m_blocks);
  fp.num_tiles = static_cast<int>(tiles);
  fp.scale_log2 = softmax_scale * static_cast<float>(M_LOG2E);

  int sms = 0;
  cudaError_t err = sm_count(device, sms);
  if (err != cudaSuccess) {
    error = std::string("cannot query the device: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    return FLASHCORE_ERROR_CUDA;
  }
  const bool persistent = persistent_grid(static_cast<int>(p.head_dim), p.causal != 0);
  const unsigned ctas = static_cast<unsigned>(!persistent || tiles < sms ? tiles : sms);

  if (!launch_compiled(p.dtype, static_cast<int>(p.head_dim), p.causal != 0, fp, ctas, device, stream, err)) {
    error = "no kernel compiled for this dtype and head_dim = " + std::to_string(p.head_dim);
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if (err != cudaSuccess) {
    error = std::string("kernel launch failed: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::sm90

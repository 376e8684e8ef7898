#include "kernels/sm90/tma_desc.h"

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <string>

#include "core/dtype.h"
#include "kernels/sm90/smem_plan.h"

namespace flashcore::sm90 {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn(std::string& error) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t status = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                                       &query);
    if (err == cudaSuccess && query != cudaDriverEntryPointSuccess) err = cudaErrorSymbolNotFound;
    if (err == cudaSuccess) fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
    return err;
  }();
  if (fn == nullptr) {
    error = std::string("cannot load cuTensorMapEncodeTiled from the CUDA driver: ") + cudaGetErrorString(status);
  }
  return fn;
}

// A dimension of extent 1 never advances its stride; give TMA a legal (non-zero, 16-byte multiple) one.
cuuint64_t stride_bytes(int64_t stride_elems, int64_t extent, int64_t elem_bytes) {
  const int64_t bytes = stride_elems * elem_bytes;
  return static_cast<cuuint64_t>(extent == 1 && bytes == 0 ? 16 : bytes);
}

}  // namespace

flashcore_status encode_tensor_map(CUtensorMap* map, const TensorMapArgs& a, std::string& error) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn(error);
  if (encode == nullptr) return FLASHCORE_ERROR_CUDA;

  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;  // 8-bit dtypes: TMA only moves bytes
  if (a.dtype == FLASHCORE_DTYPE_BF16) type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  if (a.dtype == FLASHCORE_DTYPE_FP16) type = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int64_t elem = dtype_size(a.dtype);
  if (elem != 1 && elem != 2) {
    error = std::string("tensor '") + a.name + "': no TMA element type for dtype " + dtype_name(a.dtype);
    return FLASHCORE_ERROR_INTERNAL;
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(a.head_dim), static_cast<cuuint64_t>(a.seqlen),
                              static_cast<cuuint64_t>(a.heads), static_cast<cuuint64_t>(a.batch)};
  const cuuint64_t strides[3] = {stride_bytes(a.strides.seq, a.seqlen, elem),
                                 stride_bytes(a.strides.head, a.heads, elem),
                                 stride_bytes(a.strides.batch, a.batch, elem)};
  // One 128-byte row chunk per box row; a row of 64 bytes (8-bit head dim 64, or a transposed 8-bit V in 64-key
  // chunks) is one box of 64-byte swizzled rows, and one of 32 bytes (a transposed V in 32-key chunks) of 32-byte ones.
  // Without row_elems: the kernel's own chunk width (smem_plan.h swizzle_row_bytes): 128 bytes, or 64 where the row is
  // not whole 128 bytes (8-bit head dim 64, 16-bit head dim 96).
  const int64_t row_elems =
      a.row_elems > 0 ? a.row_elems : swizzle_row_bytes(static_cast<int>(a.head_dim * elem)) / elem;
  const int64_t row_bytes = row_elems * elem;
  const CUtensorMapSwizzle swizzle = row_bytes == 32   ? CU_TENSOR_MAP_SWIZZLE_32B
                                     : row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                       : CU_TENSOR_MAP_SWIZZLE_128B;
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(row_elems), static_cast<cuuint32_t>(a.box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  // L2 promotion no wider than a box row: with 256-byte promotion of 128-byte rows a streaming read (the decode
  // rows) stops at 4.2 TB/s on an H200, with 128 bytes (or none) it reaches 4.5 TB/s, as cp.async does
  // (bench/micro/kv_stream.cu, docs/decisions.md#tma-l2-promotion).
  const CUtensorMapL2promotion promotion =
      row_bytes <= 64 ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  if (a.chunked && ((row_bytes != 128 && row_bytes != 64) || a.head_dim <= row_elems || a.head_dim % row_elems != 0)) {
    error = std::string("tensor '") + a.name + "': a chunked map needs whole 128- or 64-byte chunks (head_dim " +
            std::to_string(a.head_dim) + ")";
    return FLASHCORE_ERROR_INTERNAL;
  }
  CUresult res;
  if (a.chunked) {
    const cuuint64_t dims5[5] = {static_cast<cuuint64_t>(row_elems), dims[1],
                                 static_cast<cuuint64_t>(a.head_dim / row_elems), dims[2], dims[3]};
    const cuuint64_t strides5[4] = {strides[0], static_cast<cuuint64_t>(row_bytes), strides[1], strides[2]};
    const cuuint32_t box5[5] = {static_cast<cuuint32_t>(row_elems), static_cast<cuuint32_t>(a.box_rows),
                                static_cast<cuuint32_t>(a.head_dim / row_elems), 1, 1};
    const cuuint32_t elem_strides5[5] = {1, 1, 1, 1, 1};
    res = encode(map, type, 5, const_cast<void*>(a.base), dims5, strides5, box5, elem_strides5,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  } else {
    res = encode(map, type, 4, const_cast<void*>(a.base), dims, strides, box, elem_strides,
                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  }
  if (res != CUDA_SUCCESS) {
    error = std::string("cuTensorMapEncodeTiled rejected tensor '") + a.name + "' (CUresult " +
            std::to_string(static_cast<int>(res)) + "): dims (" + std::to_string(a.head_dim) + ", " +
            std::to_string(a.seqlen) + ", " + std::to_string(a.heads) + ", " + std::to_string(a.batch) +
            "), byte strides (" + std::to_string(strides[0]) + ", " + std::to_string(strides[1]) + ", " +
            std::to_string(strides[2]) + ")";
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::sm90

// Validation of flashcore_attention_params: argument checks (no device access), then device checks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashcore/flashcore.h"

namespace flashcore::api {

// Largest stride in bytes the tensor memory accelerator accepts is 2^40 - 16 (cuTensorMapEncodeTiled:
// globalStrides[i] < 2^40 and a multiple of 16).
inline constexpr int64_t kMaxStrideBytes = int64_t{1} << 40;
inline constexpr int kAlignment = 16;  // bytes, for every tensor base pointer and the workspace
// Every size must be <= INT32_MAX (which also keeps each TMA globalDim below its 2^32 limit). seqlen_q and
// seqlen_k must leave room for the kernels' 32-bit block arithmetic ((n_block + 1) * kBlockN, row + seqlen_k -
// seqlen_q; the largest block is 256 rows): at most INT32_MAX - 512.
inline constexpr int64_t kMaxSeqlen = int64_t{INT32_MAX} - 512;
// softmax_scale, when not 0 (the default 1/sqrt(head_dim)), must lie in [2^-100, 2^100]: then scale * log2(e)
// is a normal float, and so is every product the kernel forms from it before exp2.
inline constexpr float kMinSoftmaxScale = 0x1p-100f;
inline constexpr float kMaxSoftmaxScale = 0x1p100f;
// Paged KV caches: page_size from 1 to 65536 rows (since 0.8; the sm90 kernels take multiples of 16, a TMA box slice
// of whole 8-row swizzle atoms that divides every key block: api/backend.cpp sends the others to the portable
// kernels); num_splits at most 256.
inline constexpr int64_t kMinPageSize = 1;
inline constexpr int64_t kTmaPageMultiple = 16;
inline constexpr int64_t kMaxPageSize = 65536;
inline constexpr int32_t kMaxSplits = 256;

// Argument checks, in this order (the first failing check wins; its status is returned):
//   1. INVALID_ARGUMENT    params is NULL, struct_size != sizeof(flashcore_attention_params)
//   1b. the serving fields (cu_seqlens_q/k with total_q/k, block_table with page_size, num_pages and
//       block_table_stride, num_splits, flags): INVALID_ARGUMENT, INVALID_SIZE or SIZE_OVERFLOW naming the field.
//       With cu_seqlens_q (_k) the Q/O (K/V) checks below see one batch entry of total_q (total_k) rows; with
//       block_table, K/V are num_pages entries of page_size rows; LSE holds num_heads_q * total_q floats.
//   2. NULL_POINTER        q, k, v, o NULL; workspace NULL while workspace_size > 0
//   3. INVALID_SIZE        batch, seqlen_q, seqlen_k, num_heads_q, num_heads_kv, head_dim <= 0
//   4. SIZE_OVERFLOW       a size > INT32_MAX (seqlen_q / seqlen_k > kMaxSeqlen); a stride of q, k, v, o at or
//                          above 2^40 bytes; a tensor's extent overflowing int64 or wrapping the address space;
//                          LSE's extent; workspace + workspace_size wrapping the address space. (Byte sizes use
//                          dtype_size(dtype), taken as 1 for a dtype without a size; such a dtype fails in 7.)
//   5. INVALID_SIZE        lse_capacity < 0; lse_capacity > 0 with lse != NULL but below batch*num_heads_q*seqlen_q
//   6. INVALID_HEAD_RATIO  num_heads_q % num_heads_kv != 0
//   7. UNSUPPORTED_DTYPE   dtype not compiled; out_dtype neither FLASHCORE_DTYPE_SAME nor dtype
//   8. UNSUPPORTED_HEAD_DIM head_dim not compiled for dtype
//   9. MISALIGNED_POINTER  q, k, v, o, lse, workspace not 16-byte aligned
//  10. INVALID_STRIDE      a dim stride != 1; a batch/seq/head stride negative, 0 for a dimension of size > 1, or
//                          not a multiple of 16 bytes (stride_multiple(dtype) elements)
//  11. INVALID_ARGUMENT    softmax_scale not 0 and outside [2^-100, 2^100] (NaN, inf, negative, denormal, ...);
//                          causal not 0/1; reserved != 0
//  12. OVERLAPPING_OUTPUT  O overlaps Q, K or V; distinct elements of O share memory; LSE overlaps Q, K, V or O
// Within a step, tensors are checked in the order q, k, v, o (then lse, workspace) and sizes in the order above.
// kernel_config is checked by the backend. Touches no device. On failure returns the status and writes a
// message naming the argument and its value.
flashcore_status validate_arguments(const flashcore_attention_params* params, std::string& message);

// The backward's arguments (flashcore_attention_backward), for params that passed validate_arguments, in this order:
//   NULL_POINTER        lse, dout, dq, dk, dv NULL
//   INVALID_ARGUMENT    seqused_k on a dense batch (packed batches take seqused_k and seqused_q); a field the backward
//                       does not take yet, named: cu_seqlens_q without cu_seqlens_k or the reverse, block_table, k_new,
//                       precision (not NATIVE), out_dtype (not SAME or dtype), kernel_config, flags; deterministic not
//                       0/1; reserved3 != 0
//   UNSUPPORTED_DTYPE   an 8-bit dtype
//   UNSUPPORTED_HEAD_DIM no backward kernel compiled for (dtype, head_dim) (64 and 128 exist)
//   SIZE_OVERFLOW       dout, dq, dk, dv's extents
//   MISALIGNED_POINTER  dout, dq, dk, dv not 16-byte aligned
//   INVALID_STRIDE      their strides, as the forward's
//   OVERLAPPING_OUTPUT  dq, dk or dv overlapping q, k, v, o, dout, lse, each other or itself
// Touches no device.
flashcore_status validate_backward_arguments(const flashcore_attention_params& p, std::string& message);

// The arguments of flashcore_fp8_transpose_v / flashcore_fp8_transposed_v_size: only V's fields are read (dtype
// 8-bit, batch, seqlen_k, num_heads_kv, head_dim compiled for it, v 16-byte aligned, v_strides as in
// validate_arguments); flags must not have FLASHCORE_FLAG_V_TRANSPOSED. Touches no device.
flashcore_status validate_v_transpose(const flashcore_attention_params& p, std::string& message);
// The output of flashcore_fp8_transpose_v, for params that passed validate_v_transpose: vt not NULL (NULL_POINTER),
// 16-byte aligned (MISALIGNED_POINTER), not overlapping V (INVALID_ARGUMENT: the transpose reads V while it writes).
flashcore_status check_v_transpose_output(const flashcore_attention_params& p, const void* vt, std::string& message);

// Device checks, for params that passed validate_arguments, in this order:
//   NO_DEVICE         no CUDA device visible
//   CUDA              the current device cannot be queried
//   UNSUPPORTED_ARCH  no backend serves the current device's compute capability
//   INVALID_ARGUMENT  q, k, v, o, lse (when not NULL) or workspace (when not NULL) is host memory (registered
//                     or not) or device memory of another device (managed memory is accepted)
//   CUDA              cudaPointerGetAttributes failed for one of them
// One cudaPointerGetAttributes per pointer; no CUDA error is left behind for the caller. On success `device`
// is the current device's ordinal and `cc` its compute capability (major * 10 + minor), which the launch uses
// rather than asking again.
// `ptr` must be device memory of `device` or managed memory (cudaPointerGetAttributes, one call); else
// INVALID_ARGUMENT (or CUDA) with a message naming `name`.
flashcore_status check_device_pointer(const char* name, const void* ptr, int device, std::string& message);

flashcore_status validate_device(const flashcore_attention_params& params, int& device, int& cc,
                                 std::string& message);

// softmax_scale, or 1/sqrt(head_dim) when it is 0.
float resolve_softmax_scale(const flashcore_attention_params& params);

// True when some head dim is compiled for `dtype` (by any backend).
bool dtype_compiled(flashcore_dtype dtype);

}  // namespace flashcore::api

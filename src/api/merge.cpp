// flashcore_attention_merge: argument checks, then the arch-neutral merge kernel (kernels/common/merge.cuh).
#include <cstring>
#include <utility>
#include <string>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "api/error.h"
#include "core/launch_util.h"
#include "api/merge.h"
#include "api/validate.h"
#include "kernels/common/merge_launch.h"

namespace flashcore::api {

bool merge_takes_head_dim(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

namespace {

struct Span {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
};

// A (batch, seq, head, dim) or (batch, head, seq) operand of the merge, for the checks below.
struct Operand {
  const char* name;
  const void* ptr;
  int64_t elem_bytes;
  int64_t stride[4];  // in the order of `size`
  int64_t size[4];
  int dims;
  Span span() const {
    int64_t last = 0;
    for (int i = 0; i < dims; ++i) last += (size[i] - 1) * stride[i];
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    return {base, base + static_cast<uintptr_t>((last + 1) * elem_bytes)};
  }
};

flashcore_status check_operand(const Operand& t, std::string& message) {
  // O rows: 16-byte aligned; an LSE: a float's 4 bytes (a row range of a larger LSE starts anywhere).
  const uintptr_t alignment = t.dims == 4 ? kAlignment : 4;
  if (reinterpret_cast<uintptr_t>(t.ptr) % alignment != 0) {
    message = std::string(t.name) + " is not " + std::to_string(alignment) + "-byte aligned";
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }
  for (int i = 0; i < t.dims; ++i) {
    const int64_t s = t.stride[i];
    const bool last = i == t.dims - 1 && t.dims == 4;  // the dim stride of a 4-D operand
    // O rows are read and written in element pairs: their strides are even; LSE entries are single floats.
    const bool odd = t.dims == 4 && s % 2 != 0;
    if (last ? s != 1 : (s < 0 || odd || s * t.elem_bytes >= kMaxStrideBytes || (s == 0 && t.size[i] > 1))) {
      static const char* kNames4[] = {"batch", "seq", "head", "dim"};
      static const char* kNames3[] = {"batch", "head", "seq"};
      message = std::string(t.name) + "_strides." + (t.dims == 4 ? kNames4[i] : kNames3[i]) + " = " +
                std::to_string(s) + (last ? " must be 1" : t.dims == 4 ? " must be an even, non-negative element count below 2^40 bytes" : " must be a non-negative element count below 2^40 bytes");
      return FLASHCORE_ERROR_INVALID_STRIDE;
    }
  }
  return FLASHCORE_SUCCESS;
}

Operand tensor(const char* name, const void* ptr, int64_t elem_bytes, const flashcore_tensor_strides& s,
               const flashcore_merge_params& m) {
  return {name, ptr, elem_bytes, {s.batch, s.seq, s.head, s.dim}, {m.batch, m.seqlen, m.num_heads, m.head_dim}, 4};
}

Operand lse(const char* name, const void* ptr, const flashcore_lse_strides& s, const flashcore_merge_params& m) {
  return {name, ptr, 4, {s.batch, s.head, s.seq, 0}, {m.batch, m.num_heads, m.seqlen, 1}, 3};
}

bool is_16bit(flashcore_dtype d) { return d == FLASHCORE_DTYPE_FP16 || d == FLASHCORE_DTYPE_BF16; }

}  // namespace

flashcore_status validate_merge(const flashcore_merge_params* user, flashcore_merge_params& m, std::string& message) {
  if (user == nullptr) {
    message = "params is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (user->struct_size != sizeof(flashcore_merge_params)) {
    message = "struct_size = " + std::to_string(user->struct_size) + " is not sizeof(flashcore_merge_params) = " +
              std::to_string(sizeof(flashcore_merge_params)) + " (use flashcore_merge_params_init)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  m = *user;
  const bool has_part = m.o_part != nullptr;
  if (has_part != (m.lse_part != nullptr)) {
    message = has_part ? "lse_part is NULL while o_part is given" : "o_part is NULL while lse_part is given";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (m.o_acc == nullptr || m.lse_acc == nullptr) {
    message = m.o_acc == nullptr ? "o_acc is NULL" : "lse_acc is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (m.init != 0 && m.init != 1) {
    message = "init = " + std::to_string(m.init) + " must be 0 or 1";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (m.init == 1 && !has_part) {
    message = "init = 1 needs o_part and lse_part (the part becomes the state)";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  const char* names[] = {"batch", "seqlen", "num_heads", "head_dim"};
  const int64_t sizes[] = {m.batch, m.seqlen, m.num_heads, m.head_dim};
  for (int i = 0; i < 4; ++i) {
    if (sizes[i] <= 0) {
      message = std::string(names[i]) + " = " + std::to_string(sizes[i]) + " must be positive";
      return FLASHCORE_ERROR_INVALID_SIZE;
    }
    if (sizes[i] > INT32_MAX) {
      message = std::string(names[i]) + " = " + std::to_string(sizes[i]) + " exceeds INT32_MAX";
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  if (m.batch * m.seqlen > INT32_MAX || m.batch * m.seqlen * m.num_heads > int64_t{1} << 40) {
    message = "batch * seqlen * num_heads = " + std::to_string(m.batch * m.seqlen * m.num_heads) + " is too large";
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  if (!merge_takes_head_dim(m.head_dim)) {
    message = "head_dim = " + std::to_string(m.head_dim) + " is not 64, 128 or 256";
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if (has_part && !is_16bit(m.part_dtype) && m.part_dtype != FLASHCORE_DTYPE_FP32) {
    message = std::string("part_dtype = ") + dtype_name(m.part_dtype) + " is not fp16, bf16 or fp32";
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (m.o_out != nullptr && !is_16bit(m.out_dtype)) {
    message = std::string("out_dtype = ") + dtype_name(m.out_dtype) + " is not fp16 or bf16";
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  Operand ops[5];
  int n = 0;
  ops[n++] = tensor("o_acc", m.o_acc, 4, m.o_acc_strides, m);
  ops[n++] = lse("lse_acc", m.lse_acc, m.lse_acc_strides, m);
  const int first_input = n;
  if (has_part) {
    ops[n++] = tensor("o_part", m.o_part, dtype_size(m.part_dtype), m.o_part_strides, m);
    ops[n++] = lse("lse_part", m.lse_part, m.lse_part_strides, m);
  }
  if (m.o_out != nullptr) ops[n++] = tensor("o_out", m.o_out, dtype_size(m.out_dtype), m.o_out_strides, m);
  for (int i = 0; i < n; ++i) {
    if (const flashcore_status s = check_operand(ops[i], message); s != FLASHCORE_SUCCESS) return s;
  }
  // The state is updated in place; nothing else may share memory with it or with o_out.
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const bool inputs_only = i >= first_input && j >= first_input && std::strcmp(ops[j].name, "o_out") != 0;
      if (!inputs_only && ops[i].span().overlaps(ops[j].span())) {
        message = std::string(ops[i].name) + " overlaps " + ops[j].name;
        return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
      }
    }
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status validate_merge_device(const flashcore_merge_params& m, std::string& message) {
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    (void)cudaGetLastError();
    message = core::cuda_message("cudaGetDevice", err);
    return err == cudaErrorNoDevice ? FLASHCORE_ERROR_NO_DEVICE : FLASHCORE_ERROR_CUDA;
  }
  const std::pair<const char*, const void*> pointers[] = {
      {"o_acc", m.o_acc}, {"lse_acc", m.lse_acc}, {"o_part", m.o_part}, {"lse_part", m.lse_part}, {"o_out", m.o_out}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr == nullptr) continue;
    if (const flashcore_status s = check_device_pointer(name, ptr, device, message); s != FLASHCORE_SUCCESS) return s;
  }
  return FLASHCORE_SUCCESS;
}

kernels::MergeParams merge_kernel_params(const flashcore_merge_params& m) {
  kernels::MergeParams k{};
  k.seqlen = m.seqlen;
  k.heads = m.num_heads;
  k.rows = m.batch * m.seqlen * m.num_heads;
  auto copy3 = [](int64_t(&dst)[3], int64_t a, int64_t b, int64_t c) {
    dst[0] = a;
    dst[1] = b;
    dst[2] = c;
  };
  k.o_part = m.o_part;
  copy3(k.part_stride, m.o_part_strides.batch, m.o_part_strides.seq, m.o_part_strides.head);
  k.lse_part = m.lse_part;
  copy3(k.lse_part_stride, m.lse_part_strides.batch, m.lse_part_strides.head, m.lse_part_strides.seq);
  k.o_acc = m.o_acc;
  copy3(k.acc_stride, m.o_acc_strides.batch, m.o_acc_strides.seq, m.o_acc_strides.head);
  k.lse_acc = m.lse_acc;
  copy3(k.lse_acc_stride, m.lse_acc_strides.batch, m.lse_acc_strides.head, m.lse_acc_strides.seq);
  k.o_out = m.o_out;
  copy3(k.out_stride, m.o_out_strides.batch, m.o_out_strides.seq, m.o_out_strides.head);
  k.init = m.init;
  return k;
}

flashcore_status launch_merge_checked(const flashcore_merge_params& m, cudaStream_t stream, std::string& message) {
  const cudaError_t err = kernels::launch_merge(merge_kernel_params(m), m.part_dtype, m.out_dtype,
                                                static_cast<int>(m.head_dim), stream);
  if (err != cudaSuccess) {
    message = core::cuda_message("merge kernel launch", err);
    return FLASHCORE_ERROR_CUDA;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::api

extern "C" {

void flashcore_merge_params_init(flashcore_merge_params* params) {
  flashcore::api::clear_error();
  if (params == nullptr) {
    flashcore::api::set_error(FLASHCORE_ERROR_NULL_POINTER, "flashcore_merge_params_init: params is NULL");
    return;
  }
  std::memset(params, 0, sizeof(*params));
  params->struct_size = sizeof(*params);
  params->o_part_strides.dim = params->o_acc_strides.dim = params->o_out_strides.dim = 1;
  params->part_dtype = FLASHCORE_DTYPE_BF16;
  params->out_dtype = FLASHCORE_DTYPE_BF16;
}

flashcore_status flashcore_attention_merge(const flashcore_merge_params* params, flashcore_stream_t stream) {
  return flashcore::api::guarded("flashcore_attention_merge", [&]() -> flashcore_status {
    flashcore_merge_params m;
    std::string message;
    flashcore_status status = flashcore::api::validate_merge(params, m, message);
    if (status == FLASHCORE_SUCCESS) status = flashcore::api::validate_merge_device(m, message);
    if (status == FLASHCORE_SUCCESS) {
      status = flashcore::api::launch_merge_checked(m, reinterpret_cast<cudaStream_t>(stream), message);
    }
    if (status != FLASHCORE_SUCCESS) return flashcore::api::set_error(status, "flashcore_attention_merge: " + message);
    return FLASHCORE_SUCCESS;
  });
}

}  // extern "C"

#include "api/validate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <utility>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "api/dtype.h"

namespace flashcore::api {
namespace {

// Concatenates its arguments into a string (the error messages).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

std::string hex(const void* ptr) { return cat("0x", std::hex, reinterpret_cast<uintptr_t>(ptr)); }

// One strided 4-D tensor (batch, seq, head, dim) as the validator sees it.
struct Tensor {
  const char* name;       // "q"
  const void* ptr;
  const flashcore_tensor_strides* strides;
  const char* size_names[4];  // "batch", "seqlen_q", "num_heads_q", "head_dim"
  int64_t sizes[4];
};

constexpr const char* kDimNames[4] = {"batch", "seq", "head", "dim"};

int64_t stride_at(const flashcore_tensor_strides& s, int d) {
  switch (d) {
    case 0: return s.batch;
    case 1: return s.seq;
    case 2: return s.head;
    default: return s.dim;
  }
}

// A byte range [begin, end).
struct Span {
  uintptr_t begin = 0, end = 0;
  bool overlaps(const Span& o) const { return begin < o.end && o.begin < end; }
};

std::string describe(const char* name, const Span& s) {
  return cat(name, " [", hex(reinterpret_cast<const void*>(s.begin)), ", ",
             hex(reinterpret_cast<const void*>(s.end)), ")");
}

// Largest element offset of `t`, with the dim stride taken as 1 and negative strides as 0 (both are
// rejected later with INVALID_STRIDE; this phase only looks for overflow). False on int64 overflow.
bool max_offset(const Tensor& t, int64_t& out, std::string* message) {
  int64_t total = 0;
  for (int d = 0; d < 4; ++d) {
    const int64_t stride = d == 3 ? 1 : std::max<int64_t>(stride_at(*t.strides, d), 0);
    int64_t term = 0;
    if (__builtin_mul_overflow(t.sizes[d] - 1, stride, &term) || __builtin_add_overflow(total, term, &total)) {
      if (message != nullptr)
        *message = cat(t.name, "'s extent overflows int64: (", t.size_names[d], " - 1) * ", t.name, "_strides.",
                    kDimNames[d], " = ", t.sizes[d] - 1, " * ", stride, " (all index math is 64-bit)");
      return false;
    }
  }
  out = total;
  return true;
}

// Byte span of `t`; valid only once the size/stride checks passed.
Span span_of(const Tensor& t, int64_t elem_size) {
  int64_t offset = 0;
  max_offset(t, offset, nullptr);
  const auto begin = reinterpret_cast<uintptr_t>(t.ptr);
  return Span{begin, begin + static_cast<uintptr_t>((offset + 1) * elem_size)};
}

flashcore_status check_overflow(const Tensor& t, int64_t elem_size, std::string& message) {
  for (int d = 0; d < 3; ++d) {
    const int64_t stride = stride_at(*t.strides, d);
    int64_t bytes = 0;
    if (stride > 0 && (__builtin_mul_overflow(stride, elem_size, &bytes) || bytes >= kMaxStrideBytes)) {
      message = cat(t.name, "_strides.", kDimNames[d], " = ", stride, " elements (", elem_size,
                    " bytes each) is not below 2^40 bytes, the TMA stride limit");
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  int64_t offset = 0, bytes = 0;
  if (!max_offset(t, offset, &message)) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  uintptr_t end = 0;
  if (__builtin_add_overflow(offset, 1, &bytes) || __builtin_mul_overflow(bytes, elem_size, &bytes)) {
    message = cat(t.name, "'s byte extent overflows int64: (", offset, " + 1) elements * ", elem_size, " bytes");
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  if (__builtin_add_overflow(reinterpret_cast<uintptr_t>(t.ptr), static_cast<uintptr_t>(bytes), &end)) {
    message = cat(t.name, " = ", hex(t.ptr), " plus its extent of ", bytes, " bytes wraps the address space");
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status check_strides(const Tensor& t, flashcore_dtype dtype, std::string& message) {
  const flashcore_tensor_strides& s = *t.strides;
  const int64_t multiple = stride_multiple(dtype);
  if (s.dim != 1) {
    message = cat(t.name, "_strides.dim = ", s.dim, " must be 1 (the head_dim dimension must be contiguous)");
    return FLASHCORE_ERROR_INVALID_STRIDE;
  }
  for (int d = 0; d < 3; ++d) {
    const int64_t stride = stride_at(s, d);
    const char* what = nullptr;
    std::string detail;
    if (stride < 0) {
      what = " is negative";
    } else if (stride == 0 && t.sizes[d] > 1) {
      what = " is 0 but ";
      detail = cat(t.size_names[d], " = ", t.sizes[d], " > 1 (a zero stride is allowed only for a size-1 dimension)");
    } else if (stride % multiple != 0) {
      detail = cat(" is not a multiple of ", multiple, " elements (16 bytes; TMA needs 16-byte strides)");
    }
    if (what != nullptr || !detail.empty()) {
      message = cat(t.name, "_strides.", kDimNames[d], " = ", stride, what != nullptr ? what : "", detail);
      return FLASHCORE_ERROR_INVALID_STRIDE;
    }
  }
  return FLASHCORE_SUCCESS;
}

// Distinct elements of `t` must not share memory (a race on O). Sufficient test: with the dimensions of
// size > 1 sorted by stride, each stride exceeds the largest offset reachable through the smaller ones.
flashcore_status check_self_overlap(const Tensor& t, std::string& message) {
  std::pair<int64_t, int> dims[4];
  int n = 0;
  for (int d = 0; d < 4; ++d) {
    if (t.sizes[d] > 1) dims[n++] = {stride_at(*t.strides, d), d};
  }
  for (int i = 1; i < n; ++i) {  // insertion sort (std::sort on 4 elements trips GCC 12's -Warray-bounds)
    for (int j = i; j > 0 && dims[j] < dims[j - 1]; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t reach = 0;  // largest offset reachable through the dimensions so far
  for (int i = 0; i < n; ++i) {
    const auto [stride, d] = dims[i];
    if (stride <= reach) {
      message = cat(t.name, "_strides.", kDimNames[d], " = ", stride, " makes distinct elements of ", t.name,
                    " share memory (the smaller strides already reach offset ", reach, ")");
      return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
    }
    reach += (t.sizes[d] - 1) * stride;  // cannot overflow: max_offset succeeded
  }
  return FLASHCORE_SUCCESS;
}

std::string compiled_dtypes() {
  std::string out;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    if (dtype_compiled(dt)) out += cat(out.empty() ? "" : ", ", dtype_name(dt));
  }
  return out.empty() ? "none" : out;
}

std::string compiled_head_dims(flashcore_dtype dtype) {
  int dims[FLASHCORE_MAX_CAPS];
  const int n = std::min(backend::compiled_head_dims(dtype, dims, FLASHCORE_MAX_CAPS), FLASHCORE_MAX_CAPS);
  std::string out;
  for (int i = 0; i < n; ++i) out += cat(out.empty() ? "" : ", ", dims[i]);
  return out.empty() ? "none" : out;
}

}  // namespace

bool dtype_compiled(flashcore_dtype dtype) {
  return dtype != FLASHCORE_DTYPE_SAME && backend::compiled_head_dims(dtype, nullptr, 0) > 0;
}

float resolve_softmax_scale(const flashcore_attention_params& p) {
  return p.softmax_scale != 0.0f ? p.softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
}

flashcore_status validate_arguments(const flashcore_attention_params* params, std::string& message) {
  if (params == nullptr) {
    message = "params is NULL";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const flashcore_attention_params& p = *params;
  if (p.struct_size != sizeof(flashcore_attention_params)) {
    message = cat("params->struct_size = ", p.struct_size, " but sizeof(flashcore_attention_params) = ",
                  sizeof(flashcore_attention_params), " (call flashcore_attention_params_init first)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }

  const Tensor tensors[4] = {
      {"q", p.q, &p.q_strides, {"batch", "seqlen_q", "num_heads_q", "head_dim"}, {p.batch, p.seqlen_q, p.num_heads_q, p.head_dim}},
      {"k", p.k, &p.k_strides, {"batch", "seqlen_k", "num_heads_kv", "head_dim"}, {p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim}},
      {"v", p.v, &p.v_strides, {"batch", "seqlen_k", "num_heads_kv", "head_dim"}, {p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim}},
      {"o", p.o, &p.o_strides, {"batch", "seqlen_q", "num_heads_q", "head_dim"}, {p.batch, p.seqlen_q, p.num_heads_q, p.head_dim}},
  };
  const Tensor& o = tensors[3];

  // Required pointers.
  for (const Tensor& t : tensors) {
    if (t.ptr == nullptr) {
      message = cat(t.name, " is NULL");
      return FLASHCORE_ERROR_NULL_POINTER;
    }
  }
  if (p.workspace == nullptr && p.workspace_size > 0) {
    message = cat("workspace is NULL but workspace_size = ", p.workspace_size);
    return FLASHCORE_ERROR_NULL_POINTER;
  }

  // Sizes.
  const std::pair<const char*, int64_t> sizes[] = {{"batch", p.batch},           {"seqlen_q", p.seqlen_q},
                                                   {"seqlen_k", p.seqlen_k},     {"num_heads_q", p.num_heads_q},
                                                   {"num_heads_kv", p.num_heads_kv}, {"head_dim", p.head_dim}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      message = cat(name, " = ", value, " must be positive");
      return FLASHCORE_ERROR_INVALID_SIZE;
    }
  }
  for (const auto& [name, value] : sizes) {
    const bool seqlen = std::strncmp(name, "seqlen_", 7) == 0;
    if (seqlen && value > kMaxSeqlen) {
      message = cat(name, " = ", value, " exceeds ", kMaxSeqlen,
                    " (INT32_MAX - 512: the kernels' 32-bit block arithmetic needs that headroom)");
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
    if (value > INT32_MAX) {
      message = cat(name, " = ", value, " exceeds INT32_MAX (", INT32_MAX, ")");
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  // A dtype without a size (unknown enum value, FLASHCORE_DTYPE_SAME) is rejected below; size it as 1 byte here.
  const int64_t elem_size = std::max<int64_t>(dtype_size(p.dtype), 1);
  for (const Tensor& t : tensors) {
    if (const flashcore_status s = check_overflow(t, elem_size, message); s != FLASHCORE_SUCCESS) return s;
  }
  int64_t lse_count = 0, lse_bytes = 0;
  uintptr_t lse_end = 0;
  if (__builtin_mul_overflow(p.batch, p.num_heads_q, &lse_count) ||
      __builtin_mul_overflow(lse_count, p.seqlen_q, &lse_count) ||
      __builtin_mul_overflow(lse_count, int64_t{sizeof(float)}, &lse_bytes) ||
      (p.lse != nullptr &&
       __builtin_add_overflow(reinterpret_cast<uintptr_t>(p.lse), static_cast<uintptr_t>(lse_bytes), &lse_end))) {
    message = cat("lse's extent overflows: batch * num_heads_q * seqlen_q * 4 bytes = ", p.batch, " * ",
                  p.num_heads_q, " * ", p.seqlen_q, " * 4 from lse = ", hex(p.lse));
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  uintptr_t workspace_end = 0;
  if (p.workspace != nullptr &&
      __builtin_add_overflow(reinterpret_cast<uintptr_t>(p.workspace), p.workspace_size, &workspace_end)) {
    message = cat("workspace = ", hex(p.workspace), " plus workspace_size = ", p.workspace_size,
                  " bytes wraps the address space");
    return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }

  // The LSE buffer's declared capacity.
  if (p.lse_capacity < 0) {
    message = cat("lse_capacity = ", p.lse_capacity, " must be >= 0 (0: not given)");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  if (p.lse != nullptr && p.lse_capacity > 0 && p.lse_capacity < lse_count) {
    message = cat("lse_capacity = ", p.lse_capacity, " floats is less than the ", lse_count,
                  " that lse receives (batch * num_heads_q * seqlen_q = ", p.batch, " * ", p.num_heads_q, " * ",
                  p.seqlen_q, ")");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }

  // GQA / MQA head ratio.
  if (p.num_heads_q % p.num_heads_kv != 0) {
    message = cat("num_heads_q = ", p.num_heads_q, " is not a multiple of num_heads_kv = ", p.num_heads_kv);
    return FLASHCORE_ERROR_INVALID_HEAD_RATIO;
  }

  // What this build compiled.
  if (!dtype_compiled(p.dtype)) {
    const bool gpu_dtype = p.dtype == FLASHCORE_DTYPE_FP16 || p.dtype == FLASHCORE_DTYPE_BF16;
    message = cat("dtype = ", static_cast<int>(p.dtype), " (", dtype_name(p.dtype), ") ",
                  gpu_dtype ? "is not compiled into this build (FLASHCORE_DTYPES)" : "has no GPU kernel",
                  "; compiled dtypes: ", compiled_dtypes());
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (p.out_dtype != FLASHCORE_DTYPE_SAME && p.out_dtype != p.dtype) {
    message = cat("out_dtype = ", static_cast<int>(p.out_dtype), " (", dtype_name(p.out_dtype), ") differs from dtype = ",
                  static_cast<int>(p.dtype), " (", dtype_name(p.dtype),
                  "); this build writes O in the input dtype only (use FLASHCORE_DTYPE_SAME)");
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (p.head_dim > INT_MAX || !backend::is_compiled(p.dtype, static_cast<int>(p.head_dim))) {
    message = cat("head_dim = ", p.head_dim, " is not compiled for ", dtype_name(p.dtype),
                  "; compiled head dims: ", compiled_head_dims(p.dtype));
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }

  // Alignment.
  const std::pair<const char*, const void*> pointers[] = {{"q", p.q},     {"k", p.k},     {"v", p.v},
                                                          {"o", p.o},     {"lse", p.lse}, {"workspace", p.workspace}};
  for (const auto& [name, ptr] : pointers) {
    if (reinterpret_cast<uintptr_t>(ptr) % kAlignment != 0) {
      message = cat(name, " = ", hex(ptr), " is not ", kAlignment, "-byte aligned");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
  }

  if (reinterpret_cast<uintptr_t>(p.seqused_k) % alignof(int32_t) != 0) {
    message = cat("seqused_k = ", hex(p.seqused_k), " is not 4-byte aligned (int32 lengths)");
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }

  // Strides.
  for (const Tensor& t : tensors) {
    if (const flashcore_status s = check_strides(t, p.dtype, message); s != FLASHCORE_SUCCESS) return s;
  }

  // Scalars. The comparisons are false for NaN, so NaN fails the range check too.
  if (p.softmax_scale != 0.0f && !(p.softmax_scale >= kMinSoftmaxScale && p.softmax_scale <= kMaxSoftmaxScale)) {
    message = cat("softmax_scale = ", p.softmax_scale,
                  " must be 0 (selects 1/sqrt(head_dim)) or within [2^-100, 2^100] (finite, positive, and large "
                  "enough that softmax_scale * log2(e) is a normal float)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.causal != 0 && p.causal != 1) {
    message = cat("causal = ", p.causal, " must be 0 or 1");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.reserved != 0) {
    message = cat("reserved = ", p.reserved, " must be 0");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }

  // Outputs must not overlap the inputs, each other, or themselves.
  const Span o_span = span_of(o, elem_size);
  for (int i = 0; i < 3; ++i) {
    const Span s = span_of(tensors[i], elem_size);
    if (o_span.overlaps(s)) {
      message = cat(describe("o", o_span), " overlaps ", describe(tensors[i].name, s));
      return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
    }
  }
  if (const flashcore_status s = check_self_overlap(o, message); s != FLASHCORE_SUCCESS) return s;
  if (p.lse != nullptr) {
    const Span lse_span{reinterpret_cast<uintptr_t>(p.lse), lse_end};
    for (const Tensor& t : tensors) {
      const Span s = span_of(t, elem_size);
      if (lse_span.overlaps(s)) {
        message = cat(describe("lse", lse_span), " overlaps ", describe(t.name, s));
        return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
      }
    }
  }
  return FLASHCORE_SUCCESS;
}

namespace {

// "9.0, 10.0" from backend::compiled_archs.
std::string compiled_arch_list() {
  int archs[16] = {};
  const int n = std::min(backend::compiled_archs(archs, 16), 16);
  std::string out;
  for (int i = 0; i < n; ++i) out += cat(i ? ", " : "", "sm_", archs[i], " (compute capability ", archs[i] / 10, ".", archs[i] % 10, ")");
  return out.empty() ? "none" : out;
}

// `ptr` must be device memory of `device` or managed memory (cudaPointerGetAttributes, one call).
flashcore_status check_device_pointer(const char* name, const void* ptr, int device, std::string& message) {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error for the caller's next CUDA call
    message = cat("cudaPointerGetAttributes(", name, " = ", hex(ptr), ") failed: ", cudaGetErrorString(err));
    return FLASHCORE_ERROR_CUDA;
  }
  const char* kind = nullptr;
  switch (attr.type) {
    case cudaMemoryTypeManaged: return FLASHCORE_SUCCESS;
    case cudaMemoryTypeDevice:
      if (attr.device == device) return FLASHCORE_SUCCESS;
      message = cat(name, " = ", hex(ptr), " is memory of device ", attr.device,
                    "; FlashCore needs device memory of the current device ", device);
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    case cudaMemoryTypeHost: kind = "page-locked host memory"; break;
    case cudaMemoryTypeUnregistered: kind = "host memory (not known to CUDA)"; break;
  }
  message = cat(name, " = ", hex(ptr), " is ", kind != nullptr ? kind : "memory of an unknown kind",
                "; FlashCore needs device memory of device ", device);
  return FLASHCORE_ERROR_INVALID_ARGUMENT;
}

// Why cudaGetDeviceCount found nothing, in words a user can act on (cudaErrorInsufficientDriver covers both a
// missing and an old driver; cudaDriverGetVersion tells them apart).
std::string no_device_reason(cudaError_t count_err) {
  int driver = 0;
  const cudaError_t err = cudaDriverGetVersion(&driver);
  (void)cudaGetLastError();
  if (err != cudaSuccess || driver == 0) {
    return "no NVIDIA driver found (libcuda.so.1 could not be loaded); this CUDA 13 build needs driver R580 or newer";
  }
  if (count_err == cudaErrorInsufficientDriver || driver < CUDART_VERSION) {
    return cat("NVIDIA driver too old for this CUDA ", CUDART_VERSION / 1000, " build (needs driver R580 or newer; ",
               "the installed one supports CUDA ", driver / 1000, ".", (driver % 1000) / 10, ")");
  }
  return cat("no GPU (the NVIDIA driver sees no device", count_err != cudaSuccess ? cat("; ", cudaGetErrorString(count_err)) : "",
             "; check CUDA_VISIBLE_DEVICES)");
}

}  // namespace

flashcore_status validate_device(const flashcore_attention_params& p, int& device, int& cc, std::string& message) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count <= 0) {
    (void)cudaGetLastError();  // do not leave the error for the caller's next CUDA call
    message = cat("no CUDA device visible: ", no_device_reason(count_err));
    return FLASHCORE_ERROR_NO_DEVICE;
  }
  int major = 0, minor = 0;
  device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    message = cat("querying the current CUDA device failed: ", cudaGetErrorString(err));
    return FLASHCORE_ERROR_CUDA;
  }
  cc = major * 10 + minor;
  if (backend::backend_for_arch(cc) == nullptr) {
    cudaDeviceProp prop{};
    const char* name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "unknown name";
    (void)cudaGetLastError();
    message = cat("device ", device, " (", name, ") is sm_", major, minor, " (compute capability ", major, ".",
                  minor, "); this build has kernels for ", compiled_arch_list(), " only");
    if (const char* forced = backend::forced_backend(); forced != nullptr) {
      message += cat("; FLASHCORE_BACKEND=", forced, " is set (it names the backend to use: sm80, sm90, or auto)");
    }
    return FLASHCORE_ERROR_UNSUPPORTED_ARCH;
  }
  const std::pair<const char*, const void*> pointers[] = {{"q", p.q},     {"k", p.k},
                                                          {"v", p.v},     {"o", p.o},
                                                          {"lse", p.lse}, {"workspace", p.workspace},
                                                          {"seqused_k", p.seqused_k}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr == nullptr) continue;  // only lse, workspace and seqused_k may be NULL here
    if (const flashcore_status s = check_device_pointer(name, ptr, device, message); s != FLASHCORE_SUCCESS) return s;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::api

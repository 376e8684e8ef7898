#include "api/validate.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <tuple>
#include <utility>

#include <cuda_runtime_api.h>

#include "api/backend.h"
#include "core/dtype.h"
#include "core/variants.h"
#include "kernels/common/fp8_prep_params.h"

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
  for (flashcore_dtype dt :
       {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
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

// A call whose V has a head dim of its own (head_dim_v != 0 and != head_dim, since 0.7): the pair must be compiled,
// and only the 16-bit native forward takes it.
flashcore_status check_head_dim_v(const flashcore_attention_params& p, std::string& message) {
  if (p.head_dim_v < 0) {
    message = cat("head_dim_v = ", p.head_dim_v, " must be positive (or 0: head_dim)");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  const char* refusal = is_8bit(p.dtype)                              ? "8-bit inputs"
                        : p.precision != FLASHCORE_PRECISION_NATIVE   ? "precision = FP8 / INT8"
                        : (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0 ? "FLASHCORE_FLAG_V_TRANSPOSED"
                                                                       : nullptr;
  if (refusal != nullptr) {
    message = cat("head_dim_v = ", p.head_dim_v, " differs from head_dim = ", p.head_dim, ": ", refusal,
                  " take one head dim for Q, K and V");
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if (p.head_dim_v > INT_MAX ||
      !backend::is_compiled_pair(p.dtype, static_cast<int>(p.head_dim), static_cast<int>(p.head_dim_v))) {
    int pairs[FLASHCORE_MAX_CAPS][2];
    const int n = std::min(backend::compiled_head_dim_pairs(p.dtype, pairs, FLASHCORE_MAX_CAPS), FLASHCORE_MAX_CAPS);
    std::string list;
    for (int i = 0; i < n; ++i) list += cat(list.empty() ? "" : ", ", "(", pairs[i][0], ", ", pairs[i][1], ")");
    message = cat("(head_dim, head_dim_v) = (", p.head_dim, ", ", p.head_dim_v, ") is not compiled for ",
                  dtype_name(p.dtype), "; compiled pairs with a V head dim of its own: ", list.empty() ? "none" : list);
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace

bool dtype_compiled(flashcore_dtype dtype) {
  // (INT8 keys the kernels of precision = INT8; it is not a call's dtype.)
  return dtype != FLASHCORE_DTYPE_SAME && !is_int8_qk(dtype) && backend::compiled_head_dims(dtype, nullptr, 0) > 0;
}

float resolve_softmax_scale(const flashcore_attention_params& p) {
  return p.softmax_scale != 0.0f ? p.softmax_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.head_dim)));
}

namespace {
// Rotary embedding on append (flashcore.h rotary_cos, since 0.8).
flashcore_status check_rotary(const flashcore_attention_params& p, std::string& message) {
  if (p.rotary_cos == nullptr) {
    const std::pair<const char*, bool> stray[] = {{"rotary_sin", p.rotary_sin != nullptr},
                                                  {"rotary_seqlen", p.rotary_seqlen != 0},
                                                  {"rotary_dim", p.rotary_dim != 0},
                                                  {"rotary_interleaved", p.rotary_interleaved != 0},
                                                  {"rotary_seqlens", p.rotary_seqlens != nullptr}};
    for (const auto& [name, set] : stray) {
      if (set) {
        message = cat(name, " is set but rotary_cos is NULL (no rotary embedding: leave it at its default)");
        return FLASHCORE_ERROR_INVALID_ARGUMENT;
      }
    }
    return FLASHCORE_SUCCESS;
  }
  if (p.rotary_sin == nullptr) {
    message = "rotary_sin is NULL but rotary_cos is set (the rotation takes both tables)";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (p.k_new == nullptr) {
    message = "rotary_cos is set but k_new is NULL (the rotary embedding rotates the keys an append writes, and Q)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.rotary_dim <= 0 || p.rotary_dim % 16 != 0 || p.rotary_dim > p.head_dim) {
    message = cat("rotary_dim = ", p.rotary_dim, " must be a positive multiple of 16, at most head_dim = ", p.head_dim,
                  ", with rotary_cos");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.rotary_seqlen <= 0 || p.rotary_seqlen > kMaxSeqlen) {
    message = cat("rotary_seqlen = ", p.rotary_seqlen, " must be in [1, ", kMaxSeqlen, "] with rotary_cos (the tables' rows)");
    return p.rotary_seqlen <= 0 ? FLASHCORE_ERROR_INVALID_SIZE : FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  if (p.rotary_interleaved != 0 && p.rotary_interleaved != 1) {
    message = cat("rotary_interleaved = ", p.rotary_interleaved, " must be 0 (GPT-NeoX halves) or 1 (GPT-J pairs)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const std::pair<const char*, const void*> tables[] = {{"rotary_cos", p.rotary_cos}, {"rotary_sin", p.rotary_sin}};
  for (const auto& [name, ptr] : tables) {
    if (reinterpret_cast<uintptr_t>(ptr) % 2 != 0) {
      message = cat(name, " = ", hex(ptr), " is not 2-byte aligned (16-bit entries)");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
  }
  return FLASHCORE_SUCCESS;
}

// The KV-cache fields since 0.8 (flashcore.h): cache slots (kv_batch_idx), left padding (leftpad_k) and packed appends
// (cu_seqlens_k_new).
flashcore_status check_cache_slots(const flashcore_attention_params& p, std::string& message) {
  const std::pair<const char*, bool> needs_cache[] = {{"kv_batch_idx", p.kv_batch_idx != nullptr},
                                                      {"leftpad_k", p.leftpad_k != nullptr}};
  for (const auto& [name, set] : needs_cache) {
    if (!set) continue;
    if (p.seqused_k == nullptr) {
      message = cat(name, " is set but seqused_k is NULL (", name, " applies to a KV cache, whose lengths seqused_k ",
                    "gives)");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.cu_seqlens_k != nullptr) {
      message = cat(name, " with cu_seqlens_k: ", name, " applies to a KV cache (dense or paged), not packed K/V");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  }
  if (p.leftpad_k != nullptr && p.block_table != nullptr) {
    message = "leftpad_k with block_table: a paged cache takes no left padding (as in FlashAttention-2); pad a dense "
              "cache, or start the sequence at a page";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.kv_batch_idx == nullptr && p.kv_batch_size != 0) {
    message = cat("kv_batch_size = ", p.kv_batch_size, " is set but kv_batch_idx is NULL (leave it 0)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.kv_batch_idx != nullptr && (p.kv_batch_size <= 0 || p.kv_batch_size > INT32_MAX)) {
    message = cat("kv_batch_size = ", p.kv_batch_size, " must be in [1, INT32_MAX] with kv_batch_idx (the cache's ",
                  p.block_table != nullptr ? "block_table rows" : "K and V batch entries", ")");
    return p.kv_batch_size <= 0 ? FLASHCORE_ERROR_INVALID_SIZE : FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  if (p.seqused_q != nullptr && p.cu_seqlens_q == nullptr) {
    message = "seqused_q is set but cu_seqlens_q is NULL (seqused_q counts the queries of packed sequences)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (const flashcore_status s = check_rotary(p, message); s != FLASHCORE_SUCCESS) return s;
  if (p.cu_seqlens_k_new == nullptr && p.total_k_new != 0) {
    message = cat("total_k_new = ", p.total_k_new, " is set but cu_seqlens_k_new is NULL (leave it 0)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.cu_seqlens_k_new != nullptr) {
    if (p.k_new == nullptr) {
      message = "cu_seqlens_k_new is set but k_new is NULL (it gives the rows of a packed append)";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.total_k_new <= 0 || p.total_k_new > kMaxSeqlen) {
      message = cat("total_k_new = ", p.total_k_new, " must be in [1, ", kMaxSeqlen, "] with cu_seqlens_k_new");
      return p.total_k_new <= 0 ? FLASHCORE_ERROR_INVALID_SIZE : FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  return FLASHCORE_SUCCESS;
}

// The serving fields (flashcore.h): packed variable-length batches, paged KV caches, the split count.
flashcore_status check_serving_fields(const flashcore_attention_params& p, std::string& message) {
  if ((p.flags & ~FLASHCORE_FLAGS_ALL) != 0) {
    message = cat("flags = ", p.flags, " has bits this library does not know (known: FLASHCORE_FLAGS_ALL = ",
                  FLASHCORE_FLAGS_ALL, ")");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const std::tuple<const char*, const int32_t*, const char*, int64_t> packed[] = {
      {"cu_seqlens_q", p.cu_seqlens_q, "total_q", p.total_q}, {"cu_seqlens_k", p.cu_seqlens_k, "total_k", p.total_k}};
  for (const auto& [cu_name, cu, total_name, total] : packed) {
    if (cu == nullptr && total != 0) {
      message = cat(total_name, " = ", total, " is set but ", cu_name, " is NULL (", total_name,
                    " is the row count of a packed variable-length tensor: leave it 0 for a dense batch)");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (cu != nullptr && total <= 0) {
      message = cat(total_name, " = ", total, " must be positive with ", cu_name, " (the packed tensor's rows)");
      return FLASHCORE_ERROR_INVALID_SIZE;
    }
    if (cu != nullptr && total > kMaxSeqlen) {
      message = cat(total_name, " = ", total, " exceeds ", kMaxSeqlen, " (INT32_MAX - 512)");
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  if (const flashcore_status s = check_cache_slots(p, message); s != FLASHCORE_SUCCESS) return s;
  if (p.block_table == nullptr) {
    const std::pair<const char*, int64_t> paging[] = {
        {"page_size", p.page_size}, {"num_pages", p.num_pages}, {"block_table_stride", p.block_table_stride}};
    for (const auto& [name, value] : paging) {
      if (value != 0) {
        message = cat(name, " = ", value, " is set but block_table is NULL (no paged KV cache: leave it 0)");
        return FLASHCORE_ERROR_INVALID_ARGUMENT;
      }
    }
  } else {
    if (p.cu_seqlens_k != nullptr) {
      message = "block_table and cu_seqlens_k are both set: a paged KV cache takes its lengths from seqused_k, not "
                "from packed K/V offsets (set one of them)";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.page_size < kMinPageSize || p.page_size > kMaxPageSize) {
      message = cat("page_size = ", p.page_size, " must be in [", kMinPageSize, ", ", kMaxPageSize, "] with block_table");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.num_pages <= 0 || p.num_pages > INT32_MAX) {
      message = cat("num_pages = ", p.num_pages, " must be in [1, INT32_MAX] with block_table");
      return p.num_pages <= 0 ? FLASHCORE_ERROR_INVALID_SIZE : FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
    const int64_t pages_per_seq = (std::max<int64_t>(p.seqlen_k, 0) + p.page_size - 1) / p.page_size;
    int64_t table_entries = 0;
    if (p.block_table_stride < 0 || (p.block_table_stride > 0 && p.block_table_stride < pages_per_seq)) {
      message = cat("block_table_stride = ", p.block_table_stride, " must be 0 or at least ceil(seqlen_k / page_size) = ",
                    pages_per_seq, " (the entries of one sequence's row)");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    const int64_t table_rows = p.kv_batch_idx != nullptr ? p.kv_batch_size : p.batch;  // a row per cache slot
    if (__builtin_mul_overflow(std::max<int64_t>(table_rows, 0),
                               p.block_table_stride > 0 ? p.block_table_stride : pages_per_seq, &table_entries) ||
        table_entries > (int64_t{1} << 40)) {
      message = cat("block_table's extent (", p.kv_batch_idx != nullptr ? "kv_batch_size" : "batch",
                    " * block_table_stride = ", table_rows, " * ", p.block_table_stride, ") is out of range");
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  if (p.k_new == nullptr) {
    if (p.v_new != nullptr || p.seqlen_new != 0) {
      message = cat(p.v_new != nullptr ? "v_new is set" : "seqlen_new is set", " but k_new is NULL (an append gives ",
                    "k_new, v_new and seqlen_new together)");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  } else {
    if (p.v_new == nullptr) {
      message = "v_new is NULL but k_new is set (an append writes keys and values together)";
      return FLASHCORE_ERROR_NULL_POINTER;
    }
    if (p.seqused_k == nullptr || p.cu_seqlens_k != nullptr) {
      message = p.seqused_k == nullptr
                    ? "k_new is set but seqused_k is NULL (the append writes at each sequence's length, seqused_k)"
                    : "k_new with cu_seqlens_k: an append needs a KV cache (dense or paged), not packed K/V";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.cu_seqlens_k_new != nullptr) {
      if (p.seqlen_new != 0) {
        message = cat("seqlen_new = ", p.seqlen_new, " with cu_seqlens_k_new: packed new rows are counted by ",
                      "cu_seqlens_k_new (leave seqlen_new 0)");
        return FLASHCORE_ERROR_INVALID_ARGUMENT;
      }
    } else if (p.seqlen_new <= 0 || p.seqlen_new > kMaxSeqlen) {
      message = cat("seqlen_new = ", p.seqlen_new, " must be in [1, ", kMaxSeqlen, "] with k_new");
      return p.seqlen_new <= 0 ? FLASHCORE_ERROR_INVALID_SIZE : FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  if (p.num_splits < 0 || p.num_splits > kMaxSplits) {
    message = cat("num_splits = ", p.num_splits, " must be in [0, ", kMaxSplits, "] (0: the library's choice)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.num_splits > 1 && p.cu_seqlens_q != nullptr) {
    message = cat("num_splits = ", p.num_splits, " with cu_seqlens_q: split-KV is not available for packed "
                  "variable-length queries yet (use 0 or 1)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return FLASHCORE_SUCCESS;
}
}  // namespace

namespace {
// The fields since 0.3: 8-bit descales and the precision of 16-bit calls (flashcore.h).
flashcore_status check_8bit_fields(const flashcore_attention_params& p, std::string& message) {
  if (p.reserved2 != 0) {
    message = cat("reserved2 = ", p.reserved2, " must be 0");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.precision != FLASHCORE_PRECISION_NATIVE && p.precision != FLASHCORE_PRECISION_FP8 &&
      p.precision != FLASHCORE_PRECISION_INT8) {
    message = cat("precision = ", p.precision,
                  " must be FLASHCORE_PRECISION_NATIVE (0), FLASHCORE_PRECISION_FP8 (1) or FLASHCORE_PRECISION_INT8 (2)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const char* precision_name = p.precision == FLASHCORE_PRECISION_INT8 ? "precision = INT8" : "precision = FP8";
  const char* descale = p.q_descale != nullptr ? "q_descale"
                        : p.k_descale != nullptr ? "k_descale"
                        : p.v_descale != nullptr ? "v_descale"
                                                 : nullptr;
  const bool kv8 = (p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0;
  if (descale != nullptr && !is_8bit(p.dtype) && !(kv8 && p.q_descale == nullptr)) {
    message = cat(descale, " is set but dtype = ", dtype_name(p.dtype), ": descales apply to 8-bit inputs only",
                  p.precision != FLASHCORE_PRECISION_NATIVE ? cat(" (", precision_name, " computes its own)") : "");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if ((p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0 && !is_8bit(p.dtype)) {
    message = cat("flags has FLASHCORE_FLAG_V_TRANSPOSED, but dtype = ", dtype_name(p.dtype),
                  ": only 8-bit V is given transposed (flashcore_fp8_transpose_v)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.precision != FLASHCORE_PRECISION_NATIVE && is_8bit(p.dtype)) {
    message = cat(precision_name, " is for 16-bit inputs; dtype = ", dtype_name(p.dtype),
                  " is already 8-bit (use FLASHCORE_PRECISION_NATIVE)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if ((is_8bit(p.dtype) && !kv8) || p.precision != FLASHCORE_PRECISION_NATIVE) {
    const std::pair<const char*, const void*> serving[] = {{"seqused_k", p.seqused_k},
                                                           {"cu_seqlens_q", p.cu_seqlens_q},
                                                           {"cu_seqlens_k", p.cu_seqlens_k},
                                                           {"block_table", p.block_table},
                                                           {"k_new", p.k_new}};
    for (const auto& [name, ptr] : serving) {
      if (ptr != nullptr) {
        message = cat(name, " is set, but ", is_8bit(p.dtype) ? "8-bit inputs" : precision_name,
                      " take dense batches only (no serving layouts yet)");
        return FLASHCORE_ERROR_INVALID_ARGUMENT;
      }
    }
  }
  return FLASHCORE_SUCCESS;
}
}  // namespace

// FLASHCORE_FLAG_KV_FP8_E4M3 (since 0.9): an e4m3 KV cache under 16-bit Q, and what this version does not take with it.
flashcore_status check_kv8(const flashcore_attention_params& p, std::string& message) {
  if ((p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) == 0) return FLASHCORE_SUCCESS;
  const char* refusal = nullptr;
  std::string what;
  const bool q8 = p.dtype == FLASHCORE_DTYPE_FP8_E4M3;  // an e4m3 Q (widened on the device: api/backend.cpp)
  if ((is_8bit(p.dtype) && !q8) || is_int8_qk(p.dtype)) {
    what = cat("dtype = ", dtype_name(p.dtype)), refusal = "Q must be fp16, bf16 or e4m3";
  } else if (p.precision != FLASHCORE_PRECISION_NATIVE) {
    what = "precision != FLASHCORE_PRECISION_NATIVE", refusal = "the e4m3 cache is read as stored";
  } else if (p.q_descale != nullptr && !q8) {
    what = "q_descale is set", refusal = "Q is 16-bit and takes no descale (k_descale and v_descale scale the cache)";
  } else if ((p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0) {
    what = "FLASHCORE_FLAG_V_TRANSPOSED", refusal = "the cache's V is read as stored";
  } else if (q8 && (p.k_new != nullptr || p.v_new != nullptr)) {
    what = cat(p.k_new != nullptr ? "k_new" : "v_new", " is set with dtype = e4m3"),
    refusal = "appends take 16-bit rows under 16-bit Q (the library quantizes them); under an e4m3 Q, write the "
              "e4m3 rows into the cache and count them in seqused_k";
  } else if (q8 && p.rotary_cos != nullptr) {
    what = "rotary_cos is set with dtype = e4m3", refusal = "an e4m3 Q is not rotated (rotate it before quantizing)";
  } else if (p.local != 0 || p.softcap != 0.f || p.sinks != nullptr || p.attention_chunk != 0) {
    what = p.local != 0 ? "local = 1" : p.softcap != 0.f ? "softcap is set" : p.sinks != nullptr ? "sinks is set"
                                                                                                : "attention_chunk is set";
    refusal = "the attention variants do not take an e4m3 cache yet";
  } else if (core::split_head_dims(p)) {
    what = cat("head_dim_v = ", p.head_dim_v), refusal = "an e4m3 cache takes one head dim for K and V";
  } else if (p.kernel_config != nullptr) {
    what = "kernel_config is set", refusal = "an e4m3 cache runs its own rows (configs_kv8.txt)";
  }
  if (refusal == nullptr) return FLASHCORE_SUCCESS;
  message = cat("flags has FLASHCORE_FLAG_KV_FP8_E4M3 and ", what, ": ", refusal);
  return FLASHCORE_ERROR_INVALID_ARGUMENT;
}

// The fields since 0.5: the sliding window, softcap, sinks and attention_chunk (flashcore.h).
flashcore_status check_variant_fields(const flashcore_attention_params& p, std::string& message) {
  if (p.reserved4 != 0) {
    message = cat("reserved4 = ", p.reserved4, " must be 0");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.local != 0 && p.local != 1) {
    message = cat("local = ", p.local, " must be 0 or 1");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.local == 1) {
    if (p.window_size_left < -1) {
      message = cat("window_size_left = ", p.window_size_left, " must be -1 (unbounded) or >= 0");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (p.causal == 0 && p.window_size_right < -1) {
      message = cat("window_size_right = ", p.window_size_right, " must be -1 (unbounded) or >= 0");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  }
  if (!(p.softcap >= 0.f && p.softcap <= 3.0e38f)) {  // (false for NaN)
    message = cat("softcap = ", p.softcap, " must be 0 (none) or a finite positive cap");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.attention_chunk < 0) {
    message = cat("attention_chunk = ", p.attention_chunk, " must be 0 (none) or a positive chunk length");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.sinks != nullptr && reinterpret_cast<uintptr_t>(p.sinks) % 4 != 0) {
    message = cat("sinks = ", hex(p.sinks), " is not 4-byte aligned (float32, one per query head)");
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }
  const char* variant = p.local == 1 ? "local" : p.softcap != 0.f ? "softcap" : p.sinks != nullptr ? "sinks"
                        : p.attention_chunk != 0                  ? "attention_chunk"
                                                                  : nullptr;
  if (variant == nullptr) return FLASHCORE_SUCCESS;
  if (is_8bit(p.dtype) || p.precision != FLASHCORE_PRECISION_NATIVE) {
    message = cat(variant, " is set, but ", is_8bit(p.dtype) ? "8-bit inputs" : "an 8-bit precision",
                  " take no window, softcap, sinks or attention_chunk in this version (16-bit calls do)");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  // The masks compare positions in 32 bits (kernels/common/mask.cuh): a row plus both lengths must fit.
  if (p.local == 1 && p.seqlen_q + p.seqlen_k > (int64_t{1} << 31) - 1024) {
    message = cat("seqlen_q + seqlen_k = ", p.seqlen_q + p.seqlen_k,
                  " with local = 1: windowed calls take seqlen_q + seqlen_k < 2^31 - 1024");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  // (A chunk's end, chunk_start(i + d) + attention_chunk with the chunk capped at seqlen_k, reaches 2 * seqlen_k.)
  if (p.attention_chunk > 0 && p.seqlen_q + 2 * p.seqlen_k > (int64_t{1} << 31) - 1024) {
    message = cat("seqlen_q + 2 * seqlen_k = ", p.seqlen_q + 2 * p.seqlen_k,
                  " with attention_chunk > 0: chunked calls take seqlen_q + 2 * seqlen_k < 2^31 - 1024");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }
  return FLASHCORE_SUCCESS;
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

  if (const flashcore_status s = check_serving_fields(p, message); s != FLASHCORE_SUCCESS) return s;
  if (const flashcore_status s = check_kv8(p, message); s != FLASHCORE_SUCCESS) return s;
  if (const flashcore_status s = check_8bit_fields(p, message); s != FLASHCORE_SUCCESS) return s;
  if (const flashcore_status s = check_variant_fields(p, message); s != FLASHCORE_SUCCESS) return s;

  // The tensors as the kernels address them: packed (varlen) Q/O and K/V are one batch entry of total rows (their
  // batch strides are ignored); a paged K/V is num_pages entries of page_size rows.
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  const bool paged = p.block_table != nullptr;
  flashcore_tensor_strides qs = p.q_strides, os = p.o_strides, ks = p.k_strides, vs = p.v_strides;
  if (varlen_q) qs.batch = os.batch = 0;
  if (varlen_k) ks.batch = vs.batch = 0;
  const int64_t q_entries = varlen_q ? 1 : p.batch, q_rows = varlen_q ? p.total_q : p.seqlen_q;
  const bool slots = p.kv_batch_idx != nullptr;  // a dense cache's batch entries are its slots
  const int64_t kv_entries = varlen_k ? 1 : (paged ? p.num_pages : (slots ? p.kv_batch_size : p.batch));
  const int64_t kv_rows = varlen_k ? p.total_k : (paged ? p.page_size : p.seqlen_k);
  const char* q_entry_name = varlen_q ? "1 (packed)" : "batch";
  const char* q_row_name = varlen_q ? "total_q" : "seqlen_q";
  const char* kv_entry_name = varlen_k ? "1 (packed)" : (paged ? "num_pages" : (slots ? "kv_batch_size" : "batch"));
  const char* kv_row_name = varlen_k ? "total_k" : (paged ? "page_size" : "seqlen_k");
  // V given transposed (FLASHCORE_FLAG_V_TRANSPOSED): (batch, num_heads_kv, head_dim, padded keys) bytes, keys
  // innermost; described here as (batch, head_dim rows, num_heads_kv, padded keys) so that the checks below apply.
  // (Sizes are checked below: until then the products saturate, so that garbage sizes cannot overflow here.)
  const bool v_transposed = (p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0;
  const int64_t vt_keys = p.seqlen_k > 0 && p.seqlen_k <= kMaxSeqlen ? kernels::fp8_vt_padded_keys(p.seqlen_k) : 0;
  auto saturating_mul = [](int64_t a, int64_t b) {
    int64_t r = 0;
    return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
  };
  if (v_transposed) {
    const int64_t head_stride = saturating_mul(p.head_dim, vt_keys);
    vs = flashcore_tensor_strides{saturating_mul(p.num_heads_kv, head_stride), vt_keys, head_stride, 1};
  }
  // V and O are (..., head_dim_v): head_dim unless the call gives V a head dim of its own (since 0.7).
  const int64_t dv = core::head_dim_v(p);
  const char* dv_name = p.head_dim_v != 0 ? "head_dim_v" : "head_dim";
  const Tensor v_given = {"v", p.v, &vs, {kv_entry_name, kv_row_name, "num_heads_kv", dv_name},
                          {kv_entries, kv_rows, p.num_heads_kv, dv}};
  const Tensor v_transposed_view = {"v (transposed)", p.v, &vs,
                                    {"batch", "head_dim", "num_heads_kv", "seqlen_k rounded up to 128"},
                                    {p.batch, p.head_dim, p.num_heads_kv, vt_keys}};
  const Tensor tensors[4] = {
      {"q", p.q, &qs, {q_entry_name, q_row_name, "num_heads_q", "head_dim"}, {q_entries, q_rows, p.num_heads_q, p.head_dim}},
      {"k", p.k, &ks, {kv_entry_name, kv_row_name, "num_heads_kv", "head_dim"}, {kv_entries, kv_rows, p.num_heads_kv, p.head_dim}},
      v_transposed ? v_transposed_view : v_given,
      {"o", p.o, &os, {q_entry_name, q_row_name, "num_heads_q", dv_name}, {q_entries, q_rows, p.num_heads_q, dv}},
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
  // O is in the output dtype (which differs from the input's for 8-bit inputs).
  const flashcore_dtype out_dtype = resolved_out_dtype(p.dtype, p.out_dtype);
  const int64_t o_elem_size = std::max<int64_t>(dtype_size(out_dtype), 1);
  // K and V: 1 byte in an e4m3 cache (FLASHCORE_FLAG_KV_FP8_E4M3).
  const flashcore_dtype kv_dtype = kv_storage_dtype(p);
  const int64_t kv_elem_size = std::max<int64_t>(dtype_size(kv_dtype), 1);
  auto elem_size_of = [&](const Tensor& t) { return &t == &o ? o_elem_size : &t == &tensors[0] ? elem_size : kv_elem_size; };
  auto dtype_of = [&](const Tensor& t) { return &t == &o ? out_dtype : &t == &tensors[0] ? p.dtype : kv_dtype; };
  for (const Tensor& t : tensors) {
    if (const flashcore_status s = check_overflow(t, elem_size_of(t), message); s != FLASHCORE_SUCCESS) return s;
  }
  int64_t lse_count = 0, lse_bytes = 0;
  uintptr_t lse_end = 0;
  // LSE: (batch, num_heads_q, seqlen_q), or (num_heads_q, total_q) for packed Q.
  if (__builtin_mul_overflow(q_entries, p.num_heads_q, &lse_count) ||
      __builtin_mul_overflow(lse_count, q_rows, &lse_count) ||
      __builtin_mul_overflow(lse_count, int64_t{sizeof(float)}, &lse_bytes) ||
      (p.lse != nullptr &&
       __builtin_add_overflow(reinterpret_cast<uintptr_t>(p.lse), static_cast<uintptr_t>(lse_bytes), &lse_end))) {
    message = cat("lse's extent overflows: ", varlen_q ? "num_heads_q * total_q" : "batch * num_heads_q * seqlen_q",
                  " * 4 bytes = ", q_entries, " * ", p.num_heads_q, " * ", q_rows, " * 4 from lse = ", hex(p.lse));
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
    message = cat("lse_capacity = ", p.lse_capacity, " floats is less than the ", lse_count, " that lse receives (",
                  varlen_q ? "num_heads_q * total_q = " : "batch * num_heads_q * seqlen_q = ", q_entries, " * ",
                  p.num_heads_q, " * ", q_rows, ")");
    return FLASHCORE_ERROR_INVALID_SIZE;
  }

  // GQA / MQA head ratio.
  if (p.num_heads_q % p.num_heads_kv != 0) {
    message = cat("num_heads_q = ", p.num_heads_q, " is not a multiple of num_heads_kv = ", p.num_heads_kv);
    return FLASHCORE_ERROR_INVALID_HEAD_RATIO;
  }

  // What this build compiled.
  if (!dtype_compiled(p.dtype)) {
    const bool gpu_dtype = p.dtype == FLASHCORE_DTYPE_FP16 || p.dtype == FLASHCORE_DTYPE_BF16 || is_8bit(p.dtype);
    message = cat("dtype = ", static_cast<int>(p.dtype), " (", dtype_name(p.dtype), ") ",
                  gpu_dtype            ? "is not compiled into this build (FLASHCORE_DTYPES)"
                  : is_int8_qk(p.dtype) ? "keys the kernels of precision = FLASHCORE_PRECISION_INT8 and is not a call's "
                                          "dtype (pass 16-bit Q, K, V with precision = FLASHCORE_PRECISION_INT8)"
                                        : "has no GPU kernel",
                  "; compiled dtypes: ", compiled_dtypes());
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (is_8bit(p.dtype)) {
    if (out_dtype != FLASHCORE_DTYPE_BF16 && out_dtype != FLASHCORE_DTYPE_FP16) {
      message = cat("out_dtype = ", static_cast<int>(p.out_dtype), " (", dtype_name(p.out_dtype), ") for dtype = ",
                    dtype_name(p.dtype), ": 8-bit inputs write O in fp16 or bf16 (FLASHCORE_DTYPE_SAME: bf16)");
      return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
    }
  } else if (p.out_dtype != FLASHCORE_DTYPE_SAME && p.out_dtype != p.dtype &&
             !(p.precision == FLASHCORE_PRECISION_FP8 &&
               (p.out_dtype == FLASHCORE_DTYPE_FP16 || p.out_dtype == FLASHCORE_DTYPE_BF16))) {
    message = cat("out_dtype = ", static_cast<int>(p.out_dtype), " (", dtype_name(p.out_dtype), ") differs from dtype = ",
                  static_cast<int>(p.dtype), " (", dtype_name(p.dtype),
                  "); 16-bit inputs write O in the input dtype (use FLASHCORE_DTYPE_SAME), or with precision = FP8 in fp16 or bf16");
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (p.head_dim > INT_MAX || !backend::is_compiled(p.dtype, static_cast<int>(p.head_dim))) {
    message = cat("head_dim = ", p.head_dim, " is not compiled for ", dtype_name(p.dtype),
                  "; compiled head dims: ", compiled_head_dims(p.dtype));
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if (core::split_head_dims(p)) {
    if (const flashcore_status st = check_head_dim_v(p, message); st != FLASHCORE_SUCCESS) return st;
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

  const std::pair<const char*, const void*> descales[] = {{"q_descale", p.q_descale},
                                                          {"k_descale", p.k_descale},
                                                          {"v_descale", p.v_descale},
                                                          {"sinks", p.sinks}};
  for (const auto& [name, ptr] : descales) {
    if (reinterpret_cast<uintptr_t>(ptr) % alignof(float) != 0) {
      message = cat(name, " = ", hex(ptr), " is not 4-byte aligned (float32 entries)");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
  }
  const std::pair<const char*, const int32_t*> int_arrays[] = {{"seqused_k", p.seqused_k},
                                                               {"cu_seqlens_q", p.cu_seqlens_q},
                                                               {"cu_seqlens_k", p.cu_seqlens_k},
                                                               {"block_table", p.block_table},
                                                               {"kv_batch_idx", p.kv_batch_idx},
                                                               {"leftpad_k", p.leftpad_k},
                                                               {"cu_seqlens_k_new", p.cu_seqlens_k_new},
                                                               {"seqused_q", p.seqused_q},
                                                               {"rotary_seqlens", p.rotary_seqlens}};
  for (const auto& [name, ptr] : int_arrays) {
    if (reinterpret_cast<uintptr_t>(ptr) % alignof(int32_t) != 0) {
      message = cat(name, " = ", hex(ptr), " is not 4-byte aligned (int32 entries)");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
  }

  // Strides.
  for (const Tensor& t : tensors) {
    if (const flashcore_status s = check_strides(t, dtype_of(t), message); s != FLASHCORE_SUCCESS) return s;
  }

  // KV-cache append: k_new / v_new are read while K and V are written, then O is written.
  if (p.k_new != nullptr) {
    // Packed new rows (cu_seqlens_k_new): one batch entry of total_k_new rows, batch strides ignored.
    const bool packed_new = p.cu_seqlens_k_new != nullptr;
    flashcore_tensor_strides kns = p.k_new_strides, vns = p.v_new_strides;
    if (packed_new) kns.batch = vns.batch = 0;
    const int64_t new_entries = packed_new ? 1 : p.batch, new_rows = packed_new ? p.total_k_new : p.seqlen_new;
    const char* new_entry_name = packed_new ? "1 (packed)" : "batch";
    const char* new_row_name = packed_new ? "total_k_new" : "seqlen_new";
    const Tensor news[2] = {
        {"k_new", p.k_new, &kns, {new_entry_name, new_row_name, "num_heads_kv", "head_dim"},
         {new_entries, new_rows, p.num_heads_kv, p.head_dim}},
        {"v_new", p.v_new, &vns, {new_entry_name, new_row_name, "num_heads_kv", dv_name},
         {new_entries, new_rows, p.num_heads_kv, dv}},
    };
    for (const Tensor& t : news) {
      if (const flashcore_status st = check_overflow(t, elem_size, message); st != FLASHCORE_SUCCESS) return st;
      if (reinterpret_cast<uintptr_t>(t.ptr) % kAlignment != 0) {
        message = cat(t.name, " = ", hex(t.ptr), " is not ", kAlignment, "-byte aligned");
        return FLASHCORE_ERROR_MISALIGNED_POINTER;
      }
      if (const flashcore_status st = check_strides(t, p.dtype, message); st != FLASHCORE_SUCCESS) return st;
      const Span span = span_of(t, elem_size);
      for (int i = 1; i < 4; ++i) {  // k, v (written by the append), o
        const Span other = span_of(tensors[i], elem_size_of(tensors[i]));
        if (span.overlaps(other)) {
          message = cat(describe(t.name, span), " overlaps ", describe(tensors[i].name, other));
          return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
        }
      }
    }
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
  const Span o_span = span_of(o, o_elem_size);
  for (int i = 0; i < 3; ++i) {
    const Span s = span_of(tensors[i], elem_size_of(tensors[i]));
    if (o_span.overlaps(s)) {
      message = cat(describe("o", o_span), " overlaps ", describe(tensors[i].name, s));
      return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
    }
  }
  if (const flashcore_status s = check_self_overlap(o, message); s != FLASHCORE_SUCCESS) return s;
  if (p.lse != nullptr) {
    const Span lse_span{reinterpret_cast<uintptr_t>(p.lse), lse_end};
    for (const Tensor& t : tensors) {
      const Span s = span_of(t, elem_size_of(t));
      if (lse_span.overlaps(s)) {
        message = cat(describe("lse", lse_span), " overlaps ", describe(t.name, s));
        return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
      }
    }
  }
  return FLASHCORE_SUCCESS;
}

flashcore_status validate_backward_arguments(const flashcore_attention_params& p, std::string& message) {
  if ((p.flags & FLASHCORE_FLAG_KV_FP8_E4M3) != 0) {
    message = "flags has FLASHCORE_FLAG_KV_FP8_E4M3: the backward takes 16-bit K and V (an e4m3 cache is for inference)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  // Packed (varlen) tensors are one batch entry of total rows, their batch strides ignored, as in the forward.
  const bool varlen_q = p.cu_seqlens_q != nullptr, varlen_k = p.cu_seqlens_k != nullptr;
  const int64_t qe = varlen_q ? 1 : p.batch, qr = varlen_q ? p.total_q : p.seqlen_q;
  const int64_t ke = varlen_k ? 1 : p.batch, kr = varlen_k ? p.total_k : p.seqlen_k;
  const char* qen = varlen_q ? "1 (packed)" : "batch";
  const char* qrn = varlen_q ? "total_q" : "seqlen_q";
  const char* ken = varlen_k ? "1 (packed)" : "batch";
  const char* krn = varlen_k ? "total_k" : "seqlen_k";
  auto packed = [](flashcore_tensor_strides s, bool varlen) {
    if (varlen) s.batch = 0;
    return s;
  };
  const flashcore_tensor_strides qs = packed(p.q_strides, varlen_q), ks = packed(p.k_strides, varlen_k),
                                 vs = packed(p.v_strides, varlen_k), os = packed(p.o_strides, varlen_q),
                                 dos = packed(p.dout_strides, varlen_q), dqs = packed(p.dq_strides, varlen_q),
                                 dks = packed(p.dk_strides, varlen_k), dvs = packed(p.dv_strides, varlen_k);
  // V, O, dO and dV have head_dim_v columns (head_dim where it is 0).
  const int64_t hdv = core::head_dim_v(p);
  const char* hdvn = core::split_head_dims(p) ? "head_dim_v" : "head_dim";
  const Tensor tensors[6] = {
      {"q", p.q, &qs, {qen, qrn, "num_heads_q", "head_dim"}, {qe, qr, p.num_heads_q, p.head_dim}},
      {"k", p.k, &ks, {ken, krn, "num_heads_kv", "head_dim"}, {ke, kr, p.num_heads_kv, p.head_dim}},
      {"v", p.v, &vs, {ken, krn, "num_heads_kv", hdvn}, {ke, kr, p.num_heads_kv, hdv}},
      {"o", p.o, &os, {qen, qrn, "num_heads_q", hdvn}, {qe, qr, p.num_heads_q, hdv}},
      {"dout", p.dout, &dos, {qen, qrn, "num_heads_q", hdvn}, {qe, qr, p.num_heads_q, hdv}},
      {"lse", p.lse, nullptr, {}, {}},
  };
  const Tensor outputs[3] = {
      {"dq", p.dq, &dqs, {qen, qrn, "num_heads_q", "head_dim"}, {qe, qr, p.num_heads_q, p.head_dim}},
      {"dk", p.dk, &dks, {ken, krn, "num_heads_kv", "head_dim"}, {ke, kr, p.num_heads_kv, p.head_dim}},
      {"dv", p.dv, &dvs, {ken, krn, "num_heads_kv", hdvn}, {ke, kr, p.num_heads_kv, hdv}},
  };
  if (p.lse == nullptr) {
    message = "lse is NULL: the backward reads the forward's LSE (flashcore_attention_forward with lse set)";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  for (const Tensor* t : {&tensors[4], &outputs[0], &outputs[1], &outputs[2]}) {
    if (t->ptr == nullptr) {
      message = cat(t->name, " is NULL");
      return FLASHCORE_ERROR_NULL_POINTER;
    }
  }
  if (p.seqused_k != nullptr && p.cu_seqlens_q == nullptr) {
    message = "seqused_k is set on a dense batch: the backward takes seqused_k (and seqused_q) with cu_seqlens_q and "
              "cu_seqlens_k (packed batches) only";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  const std::pair<const char*, bool> not_yet[] = {
      {"block_table", p.block_table != nullptr},
      {"k_new", p.k_new != nullptr},
      {"precision", p.precision != FLASHCORE_PRECISION_NATIVE},
      {"out_dtype", p.out_dtype != FLASHCORE_DTYPE_SAME && p.out_dtype != p.dtype},
      {"kernel_config", p.kernel_config != nullptr},
      {"flags", p.flags != 0},
  };
  for (const auto& [field, set] : not_yet) {
    if (set) {
      message = cat(field, " is set: the backward takes dense or packed (cu_seqlens_q and cu_seqlens_k) batches in the ",
                    "input dtype with the library's kernel only (no block_table, k_new, precision, out_dtype, ",
                    "kernel_config or flags) in this version");
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
  }
  if ((p.cu_seqlens_q != nullptr) != (p.cu_seqlens_k != nullptr)) {
    message = cat(p.cu_seqlens_q != nullptr ? "cu_seqlens_q is set and cu_seqlens_k is NULL"
                                            : "cu_seqlens_k is set and cu_seqlens_q is NULL",
                  ": the backward of a packed batch takes both");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.deterministic != 0 && p.deterministic != 1) {
    message = cat("deterministic = ", p.deterministic, " must be 0 or 1");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.reserved3 != 0) {
    message = cat("reserved3 = ", p.reserved3, " must be 0");
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.dtype != FLASHCORE_DTYPE_FP16 && p.dtype != FLASHCORE_DTYPE_BF16) {
    message = cat("dtype = ", dtype_name(p.dtype), ": the backward takes fp16 and bf16");
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if (!backend::backward_compiled(p.dtype, static_cast<int>(p.head_dim), static_cast<int>(core::head_dim_v(p)))) {
    if (core::split_head_dims(p)) {
      message = cat("head_dim_v = ", p.head_dim_v, " with head_dim = ", p.head_dim, " has no backward kernel for ",
                    dtype_name(p.dtype),
                    " in this build (the backward takes (head_dim, head_dim_v) = (192, 128) on Hopper, where "
                    "FLASHCORE_HEAD_DIMS holds 192; else one head dim for Q, K and V)");
    } else {
      message = cat("head_dim = ", p.head_dim, " has no backward kernel for ", dtype_name(p.dtype),
                    " in this build (the backward has head dims 64, 128 and, on Hopper, 96, 192 and 256, where "
                    "FLASHCORE_HEAD_DIMS holds them)");
    }
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  if ((core::windowed_call(p) || p.softcap != 0.f) &&
      !backend::backward_compiled(p.dtype, static_cast<int>(p.head_dim), static_cast<int>(core::head_dim_v(p)), true)) {
    message = cat("head_dim = ", p.head_dim, " with ", p.softcap != 0.f ? "softcap" : "a window or attention_chunk",
                  ": this build's backward has no variants' kernel at this head dim (it has them wherever it has the "
                  "plain kernels: head dims 64 and 128, and on Hopper 96, 192, (192, 128) and 256)");
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  const int64_t elem_size = dtype_size(p.dtype);
  for (const Tensor* t : {&tensors[4], &outputs[0], &outputs[1], &outputs[2]}) {
    if (const flashcore_status s = check_overflow(*t, elem_size, message); s != FLASHCORE_SUCCESS) return s;
    if (reinterpret_cast<uintptr_t>(t->ptr) % kAlignment != 0) {
      message = cat(t->name, " = ", hex(t->ptr), " is not ", kAlignment, "-byte aligned");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
    if (const flashcore_status s = check_strides(*t, p.dtype, message); s != FLASHCORE_SUCCESS) return s;
  }
  const uintptr_t lse_begin = reinterpret_cast<uintptr_t>(p.lse);
  const Span lse_span{lse_begin, lse_begin + static_cast<uintptr_t>(qe * p.num_heads_q * qr * 4)};
  for (int i = 0; i < 3; ++i) {
    const Span out = span_of(outputs[i], elem_size);
    for (const Tensor& t : tensors) {
      const Span in = t.strides == nullptr ? lse_span : span_of(t, elem_size);
      if (out.overlaps(in)) {
        message = cat(describe(outputs[i].name, out), " overlaps ", describe(t.name, in));
        return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
      }
    }
    for (int j = 0; j < i; ++j) {
      const Span other = span_of(outputs[j], elem_size);
      if (out.overlaps(other)) {
        message = cat(describe(outputs[i].name, out), " overlaps ", describe(outputs[j].name, other));
        return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
      }
    }
    if (const flashcore_status s = check_self_overlap(outputs[i], message); s != FLASHCORE_SUCCESS) return s;
  }
  if (p.dsinks != nullptr) {
    if (p.sinks == nullptr) {
      message = "dsinks is set but sinks is NULL: dL/dsinks is the gradient of the sinks the forward took";
      return FLASHCORE_ERROR_INVALID_ARGUMENT;
    }
    if (reinterpret_cast<uintptr_t>(p.dsinks) % alignof(float) != 0) {
      message = cat("dsinks = ", hex(p.dsinks), " is not 4-byte aligned (float32, one per query head)");
      return FLASHCORE_ERROR_MISALIGNED_POINTER;
    }
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p.dsinks);
    const Span dsinks_span{begin, begin + static_cast<uintptr_t>(p.num_heads_q) * 4};
    const uintptr_t sinks_begin = reinterpret_cast<uintptr_t>(p.sinks);
    const Span sinks_span{sinks_begin, sinks_begin + static_cast<uintptr_t>(p.num_heads_q) * 4};
    if (dsinks_span.overlaps(sinks_span)) {
      message = cat(describe("dsinks", dsinks_span), " overlaps ", describe("sinks", sinks_span));
      return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
    }
    for (const Tensor& t : outputs) {
      const Span out = span_of(t, dtype_size(p.dtype));
      if (dsinks_span.overlaps(out)) {
        message = cat(describe("dsinks", dsinks_span), " overlaps ", describe(t.name, out));
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

}  // namespace

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

namespace {

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

flashcore_status validate_v_transpose(const flashcore_attention_params& p, std::string& message) {
  if (!is_8bit(p.dtype)) {
    message = cat("dtype = ", static_cast<int>(p.dtype), " (", dtype_name(p.dtype),
                  "): the transposed V layout is for 8-bit (FLASHCORE_DTYPE_FP8_E4M3 / _E5M2) calls");
    return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  }
  if ((p.flags & FLASHCORE_FLAG_V_TRANSPOSED) != 0) {
    message = "flags has FLASHCORE_FLAG_V_TRANSPOSED: v must be V as given (v_strides), not already transposed";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  if (p.v == nullptr) {
    message = "v is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (core::split_head_dims(p)) {
    message = cat("head_dim_v = ", p.head_dim_v, " differs from head_dim = ", p.head_dim,
                  ": 8-bit V takes Q's and K's head dim");
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  const std::pair<const char*, int64_t> sizes[] = {
      {"batch", p.batch}, {"seqlen_k", p.seqlen_k}, {"num_heads_kv", p.num_heads_kv}, {"head_dim", p.head_dim}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      message = cat(name, " = ", value, " must be positive");
      return FLASHCORE_ERROR_INVALID_SIZE;
    }
    if (value > kMaxSeqlen) {
      message = cat(name, " = ", value, " exceeds ", kMaxSeqlen);
      return FLASHCORE_ERROR_SIZE_OVERFLOW;
    }
  }
  if (p.head_dim > INT_MAX || !backend::is_compiled(p.dtype, static_cast<int>(p.head_dim))) {
    message = cat("head_dim = ", p.head_dim, " is not compiled for ", dtype_name(p.dtype),
                  "; compiled head dims: ", compiled_head_dims(p.dtype));
    return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;
  }
  const Tensor v = {"v", p.v, &p.v_strides, {"batch", "seqlen_k", "num_heads_kv", "head_dim"},
                    {p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim}};
  if (const flashcore_status s = check_overflow(v, 1, message); s != FLASHCORE_SUCCESS) return s;
  if (reinterpret_cast<uintptr_t>(p.v) % kAlignment != 0) {
    message = cat("v = ", hex(p.v), " is not ", kAlignment, "-byte aligned");
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }
  return check_strides(v, p.dtype, message);
}

flashcore_status check_v_transpose_output(const flashcore_attention_params& p, const void* vt, std::string& message) {
  if (vt == nullptr) {
    message = "vt is NULL";
    return FLASHCORE_ERROR_NULL_POINTER;
  }
  if (reinterpret_cast<uintptr_t>(vt) % kAlignment != 0) {
    message = cat("vt is not ", kAlignment, "-byte aligned");
    return FLASHCORE_ERROR_MISALIGNED_POINTER;
  }
  const Tensor v = {"v", p.v, &p.v_strides, {"batch", "seqlen_k", "num_heads_kv", "head_dim"},
                    {p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim}};
  const auto begin = reinterpret_cast<uintptr_t>(vt);
  const Span out{begin, begin + static_cast<uintptr_t>(p.batch * p.num_heads_kv * p.head_dim *
                                                       kernels::fp8_vt_padded_keys(p.seqlen_k))};
  if (out.overlaps(span_of(v, 1))) {
    message = "vt overlaps v (the transpose cannot run in place)";
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  }
  return FLASHCORE_SUCCESS;
}

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
                                                          {"seqused_k", p.seqused_k},
                                                          {"cu_seqlens_q", p.cu_seqlens_q},
                                                          {"cu_seqlens_k", p.cu_seqlens_k},
                                                          {"block_table", p.block_table},
                                                          {"k_new", p.k_new},
                                                          {"v_new", p.v_new},
                                                          {"kv_batch_idx", p.kv_batch_idx},
                                                          {"leftpad_k", p.leftpad_k},
                                                          {"cu_seqlens_k_new", p.cu_seqlens_k_new},
                                                          {"seqused_q", p.seqused_q},
                                                          {"rotary_cos", p.rotary_cos},
                                                          {"rotary_sin", p.rotary_sin},
                                                          {"rotary_seqlens", p.rotary_seqlens},
                                                          {"q_descale", p.q_descale},
                                                          {"k_descale", p.k_descale},
                                                          {"v_descale", p.v_descale},
                                                          {"sinks", p.sinks}};
  for (const auto& [name, ptr] : pointers) {
    if (ptr == nullptr) continue;  // the optional pointers may be NULL
    if (const flashcore_status s = check_device_pointer(name, ptr, device, message); s != FLASHCORE_SUCCESS) return s;
  }
  return FLASHCORE_SUCCESS;
}

}  // namespace flashcore::api

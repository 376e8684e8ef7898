// Fuzz test of argument validation, without a GPU: random params (mostly a valid problem with a few fields
// replaced by hostile values) from a fixed seed, each checked against an independent oracle written from the
// documented rules (src/api/validate.h), not from validate.cpp.
//
// Which status wins when several rules fail: the first failing step of the list in validate.h,
//    1 INVALID_ARGUMENT (struct_size)    2 NULL_POINTER          3 INVALID_SIZE (sizes)     4 SIZE_OVERFLOW
//    5 INVALID_SIZE (lse_capacity)       6 INVALID_HEAD_RATIO    7 UNSUPPORTED_DTYPE        8 UNSUPPORTED_HEAD_DIM
//    9 MISALIGNED_POINTER               10 INVALID_STRIDE       11 INVALID_ARGUMENT (scalars) 12 OVERLAPPING_OUTPUT
// The oracle applies the steps in that order. Pointers are made-up addresses: validation never dereferences
// them, and forward() (also called for rejected cases, and for accepted ones when no GPU is visible) must fail
// before any device access.
//
// FLASHCORE_FUZZ_SEED / FLASHCORE_FUZZ_CASES in the environment change the seed / the case count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "api/backend.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"

namespace {

using i128 = __int128;
constexpr i128 kInt64Max = std::numeric_limits<int64_t>::max();
constexpr i128 kAddressLimit = static_cast<i128>(std::numeric_limits<uintptr_t>::max()) + 1;  // 2^64
constexpr int kHeadDims[] = {64, 128, 256};

// ------------------------------------------------------------------------------------------------
// The oracle.
// ------------------------------------------------------------------------------------------------

// Bytes per element by the documented table; a dtype without a size counts as 1 byte in the overflow checks.
int64_t bytes_of(int dtype) {
  switch (dtype) {
    case FLASHCORE_DTYPE_FP16:
    case FLASHCORE_DTYPE_BF16: return 2;
    case FLASHCORE_DTYPE_FP32: return 4;
    case FLASHCORE_DTYPE_FP8_E4M3:
    case FLASHCORE_DTYPE_FP8_E5M2: return 1;
    default: return 1;
  }
}

struct View {
  uintptr_t ptr;
  int64_t size[4];    // batch, seq, heads, dim
  int64_t stride[4];  // element strides
};

View view(const void* ptr, const flashcore_tensor_strides& s, int64_t b, int64_t seq, int64_t h, int64_t d) {
  return {reinterpret_cast<uintptr_t>(ptr), {b, seq, h, d}, {s.batch, s.seq, s.head, s.dim}};
}

// Largest element offset, negative strides as 0 and the dim stride as 1 (the overflow phase's reading).
i128 last_offset(const View& t) {
  i128 total = 0;
  for (int d = 0; d < 4; ++d) total += static_cast<i128>(t.size[d] - 1) * (d == 3 ? 1 : std::max<int64_t>(t.stride[d], 0));
  return total;
}

struct Range {
  i128 begin, end;
};
bool overlap(Range a, Range b) { return a.begin < b.end && b.begin < a.end; }
Range range_of(const View& t, int64_t elem) { return {t.ptr, t.ptr + (last_offset(t) + 1) * elem}; }

bool compiled(int dtype, int64_t head_dim) {
  if (dtype != FLASHCORE_DTYPE_FP16 && dtype != FLASHCORE_DTYPE_BF16 && dtype != FLASHCORE_DTYPE_FP8_E4M3 &&
      dtype != FLASHCORE_DTYPE_FP8_E5M2)
    return false;
  return head_dim > 0 && head_dim <= 1024 &&
         flashcore::backend::is_compiled(static_cast<flashcore_dtype>(dtype), static_cast<int>(head_dim));
}
bool dtype_compiled(int dtype) {
  for (int hd : kHeadDims)
    if (compiled(dtype, hd)) return true;
  return false;
}

flashcore_status oracle(const flashcore_attention_params& given) {
  // Accepted layouts: the current one, the 0.1 one, whose caller has none of the 0.2 fields (defaults), and the 0.2
  // one (the fields since 0.3 are never mutated here: zero, their defaults, either way).
  if (given.struct_size != sizeof(flashcore_attention_params) &&
      given.struct_size != FLASHCORE_ATTENTION_PARAMS_V1_SIZE && given.struct_size != FLASHCORE_ATTENTION_PARAMS_V2_SIZE)
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  flashcore_attention_params p = given;
  if (given.struct_size == FLASHCORE_ATTENTION_PARAMS_V1_SIZE) {
    p.out_dtype = FLASHCORE_DTYPE_SAME;
    p.reserved = 0;
    p.lse_capacity = 0;
    p.workspace = nullptr;
    p.workspace_size = 0;
    p.kernel_config = nullptr;
  }

  if (!p.q || !p.k || !p.v || !p.o) return FLASHCORE_ERROR_NULL_POINTER;
  if (!p.workspace && p.workspace_size > 0) return FLASHCORE_ERROR_NULL_POINTER;

  const int64_t sizes[] = {p.batch, p.seqlen_q, p.seqlen_k, p.num_heads_q, p.num_heads_kv, p.head_dim};
  for (int64_t s : sizes)
    if (s <= 0) return FLASHCORE_ERROR_INVALID_SIZE;

  for (int64_t s : sizes)
    if (s > INT32_MAX) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  if (p.seqlen_q > int64_t{INT32_MAX} - 512 || p.seqlen_k > int64_t{INT32_MAX} - 512) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  const int64_t elem = bytes_of(p.dtype);
  // O is in the output dtype: out_dtype, or for SAME the input dtype (bf16 for 8-bit inputs).
  const bool eight_bit = p.dtype == FLASHCORE_DTYPE_FP8_E4M3 || p.dtype == FLASHCORE_DTYPE_FP8_E5M2;
  const int out = p.out_dtype != FLASHCORE_DTYPE_SAME ? p.out_dtype : (eight_bit ? FLASHCORE_DTYPE_BF16 : p.dtype);
  const int64_t o_elem = bytes_of(out);
  const View t[4] = {view(p.q, p.q_strides, p.batch, p.seqlen_q, p.num_heads_q, p.head_dim),
                     view(p.k, p.k_strides, p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim),
                     view(p.v, p.v_strides, p.batch, p.seqlen_k, p.num_heads_kv, p.head_dim),
                     view(p.o, p.o_strides, p.batch, p.seqlen_q, p.num_heads_q, p.head_dim)};
  for (const View& x : t) {
    const int64_t elem = &x == &t[3] ? o_elem : bytes_of(p.dtype);
    for (int d = 0; d < 3; ++d)
      if (x.stride[d] > 0 && static_cast<i128>(x.stride[d]) * elem >= (i128{1} << 40)) return FLASHCORE_ERROR_SIZE_OVERFLOW;
    const i128 off = last_offset(x);
    if (off > kInt64Max || (off + 1) * elem > kInt64Max) return FLASHCORE_ERROR_SIZE_OVERFLOW;
    if (x.ptr + (off + 1) * elem >= kAddressLimit) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  }
  const i128 lse_count = static_cast<i128>(p.batch) * p.num_heads_q * p.seqlen_q;
  if (lse_count * 4 > kInt64Max) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  if (p.lse && reinterpret_cast<uintptr_t>(p.lse) + lse_count * 4 >= kAddressLimit) return FLASHCORE_ERROR_SIZE_OVERFLOW;
  if (p.workspace && reinterpret_cast<uintptr_t>(p.workspace) + static_cast<i128>(p.workspace_size) >= kAddressLimit)
    return FLASHCORE_ERROR_SIZE_OVERFLOW;

  if (p.lse_capacity < 0) return FLASHCORE_ERROR_INVALID_SIZE;
  if (p.lse && p.lse_capacity > 0 && p.lse_capacity < lse_count) return FLASHCORE_ERROR_INVALID_SIZE;

  if (p.num_heads_q % p.num_heads_kv != 0) return FLASHCORE_ERROR_INVALID_HEAD_RATIO;

  if (!dtype_compiled(p.dtype)) return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  if (eight_bit && out != FLASHCORE_DTYPE_FP16 && out != FLASHCORE_DTYPE_BF16) return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;
  if (!eight_bit && p.out_dtype != FLASHCORE_DTYPE_SAME && p.out_dtype != p.dtype) return FLASHCORE_ERROR_UNSUPPORTED_DTYPE;

  if (!compiled(p.dtype, p.head_dim)) return FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM;

  const void* const pointers[] = {p.q, p.k, p.v, p.o, p.lse, p.workspace};
  for (const void* ptr : pointers)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return FLASHCORE_ERROR_MISALIGNED_POINTER;

  for (const View& x : t) {
    const int64_t elem = &x == &t[3] ? o_elem : bytes_of(p.dtype);
    if (x.stride[3] != 1) return FLASHCORE_ERROR_INVALID_STRIDE;
    for (int d = 0; d < 3; ++d) {
      const int64_t s = x.stride[d];
      if (s < 0 || (s == 0 && x.size[d] > 1) || (s * elem) % 16 != 0) return FLASHCORE_ERROR_INVALID_STRIDE;
    }
  }

  const float scale = p.softmax_scale;
  if (scale != 0.0f && !(scale >= std::ldexp(1.0f, -100) && scale <= std::ldexp(1.0f, 100)))
    return FLASHCORE_ERROR_INVALID_ARGUMENT;
  if (p.causal != 0 && p.causal != 1) return FLASHCORE_ERROR_INVALID_ARGUMENT;
  if (p.reserved != 0) return FLASHCORE_ERROR_INVALID_ARGUMENT;

  const Range o = range_of(t[3], o_elem);
  for (int i = 0; i < 3; ++i)
    if (overlap(o, range_of(t[i], elem))) return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
  // O must not reach one element twice: with O's dimensions of size > 1 ordered by stride, each stride must
  // exceed the largest offset reachable through the smaller ones.
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (int d = 0; d < 4; ++d)
    if (t[3].size[d] > 1) dims.push_back({t[3].stride[d], t[3].size[d]});
  std::sort(dims.begin(), dims.end());
  i128 reach = 0;
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
    reach += static_cast<i128>(size - 1) * stride;
  }
  if (p.lse) {
    const Range lse{reinterpret_cast<uintptr_t>(p.lse), reinterpret_cast<uintptr_t>(p.lse) + lse_count * 4};
    for (const View& x : t)
      if (overlap(lse, range_of(x, &x == &t[3] ? o_elem : elem))) return FLASHCORE_ERROR_OVERLAPPING_OUTPUT;
  }
  return FLASHCORE_SUCCESS;
}

// ------------------------------------------------------------------------------------------------
// The generator.
// ------------------------------------------------------------------------------------------------

class Gen {
 public:
  explicit Gen(uint64_t seed) : rng_(seed) {}
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <typename T>
  T pick(const std::vector<T>& v) { return v[static_cast<size_t>(uniform(0, static_cast<int64_t>(v.size()) - 1))]; }
  uint64_t bits() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

void* address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// A valid problem: small sizes, bshd or bhsd with optional padding, separate made-up 16-byte aligned buffers.
flashcore_attention_params valid_problem(Gen& g, flashcore_dtype dtype, int head_dim) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  const bool eight_bit = dtype == FLASHCORE_DTYPE_FP8_E4M3 || dtype == FLASHCORE_DTYPE_FP8_E5M2;  // O: fp16 / bf16
  p.out_dtype = g.chance(0.8) ? FLASHCORE_DTYPE_SAME
                              : (eight_bit ? g.pick<flashcore_dtype>({FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) : dtype);
  p.dtype = dtype;
  p.head_dim = head_dim;
  p.batch = g.uniform(1, 4);
  p.seqlen_q = g.uniform(1, 300);
  p.seqlen_k = g.uniform(1, 300);
  p.num_heads_kv = g.uniform(1, 4);
  p.num_heads_q = p.num_heads_kv * g.uniform(1, 4);
  flashcore_attention_params_set_contiguous(&p, g.chance(0.5) ? 1 : 0);
  if (g.chance(0.3)) {  // padded rows
    const int64_t pad = (eight_bit ? 16 : 8) * g.uniform(1, 4);
    for (flashcore_tensor_strides* s : {&p.q_strides, &p.o_strides}) {
      if (s->seq > s->head) s->seq += pad, s->batch += pad * p.seqlen_q;
      else s->head += pad, s->batch += pad * p.num_heads_q;
    }
  }
  const uintptr_t region = uintptr_t{1} << 36;  // 64 GiB apart: no overlap for these sizes
  const uintptr_t base = (uintptr_t{1} << 40) + static_cast<uintptr_t>(g.uniform(0, 1 << 20)) * 256;
  p.q = address(base);
  p.k = address(base + region);
  p.v = address(base + 2 * region);
  p.o = address(base + 3 * region);
  p.lse = g.chance(0.5) ? static_cast<float*>(address(base + 4 * region)) : nullptr;
  if (g.chance(0.5)) p.lse_capacity = p.batch * p.num_heads_q * p.seqlen_q + g.uniform(0, 4);
  if (g.chance(0.2)) p.workspace = address(base + 5 * region), p.workspace_size = 16 * g.uniform(0, 64);
  p.causal = g.chance(0.5) ? 1 : 0;
  p.softmax_scale = g.chance(0.5) ? 0.0f : static_cast<float>(g.uniform(1, 1000)) / 256.0f;
  return p;
}

int64_t hostile_size(Gen& g) {
  return g.pick<int64_t>({0, -1, std::numeric_limits<int64_t>::min(), 1, 2, 7, 64, 96, 128, 256, 4096,
                          int64_t{INT32_MAX}, int64_t{INT32_MAX} + 1, int64_t{INT32_MAX} - 512,
                          int64_t{INT32_MAX} - 511, int64_t{1} << 32, std::numeric_limits<int64_t>::max(),
                          g.uniform(1, 1000), -g.uniform(1, 1000)});
}

int64_t hostile_stride(Gen& g) {
  return g.pick<int64_t>({0, -8, -1, 1, 2, 4, 8, 12, 16, 24, 100, int64_t{1} << 36, (int64_t{1} << 39) - 8,
                          int64_t{1} << 39, int64_t{1} << 40, (int64_t{1} << 62), std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<int64_t>::min(), 8 * g.uniform(1, 100000), g.uniform(-100, 100000)});
}

const void* hostile_pointer(Gen& g, const flashcore_attention_params& p) {
  const auto shift = [](const void* a, int64_t by) {
    return address(reinterpret_cast<uintptr_t>(a) + static_cast<uintptr_t>(by));
  };
  switch (g.uniform(0, 8)) {
    case 0: return nullptr;
    case 1: return shift(p.q, g.pick<int64_t>({1, 2, 4, 8}));
    case 2: return p.q;
    case 3: return p.k;
    case 4: return shift(p.o, 16 * g.uniform(-64, 64));
    case 5: return address(~uintptr_t{0} - 63);            // 16-byte aligned, near the top
    case 6: return address(g.bits());                      // anything
    case 7: return address(g.bits() & ~uintptr_t{15});     // aligned anything
    default: return shift(p.v, 16 * g.uniform(0, 1 << 12));
  }
}

float hostile_scale(Gen& g) {
  const float inf = std::numeric_limits<float>::infinity();
  return g.pick<float>({std::numeric_limits<float>::quiet_NaN(), inf, -inf, -1.0f, -0.0f, 0.0f,
                        std::numeric_limits<float>::denorm_min(), 1e-40f, std::numeric_limits<float>::min(),
                        std::ldexp(1.0f, -101), std::ldexp(1.0f, -100), std::ldexp(1.0f, 100), std::ldexp(1.0f, 101),
                        std::numeric_limits<float>::max(), 1e-30f, 1e30f, 0.125f});
}

int64_t& size_field(flashcore_attention_params& p, int64_t which) {
  switch (which) {
    case 0: return p.batch;
    case 1: return p.seqlen_q;
    case 2: return p.seqlen_k;
    case 3: return p.num_heads_q;
    case 4: return p.num_heads_kv;
    default: return p.head_dim;
  }
}

flashcore_tensor_strides& strides_of(flashcore_attention_params& p, int64_t which) {
  return which == 0 ? p.q_strides : which == 1 ? p.k_strides : which == 2 ? p.v_strides : p.o_strides;
}

void mutate(Gen& g, flashcore_attention_params& p) {
  switch (g.uniform(0, 14)) {
    case 0: size_field(p, g.uniform(0, 5)) = hostile_size(g); break;
    case 1:
    case 2: {
      flashcore_tensor_strides& s = strides_of(p, g.uniform(0, 3));
      int64_t* field[] = {&s.batch, &s.seq, &s.head, &s.dim};
      *field[g.uniform(0, 3)] = hostile_stride(g);
      break;
    }
    case 3: {
      const void* ptr = hostile_pointer(g, p);
      switch (g.uniform(0, 3)) {
        case 0: p.q = ptr; break;
        case 1: p.k = ptr; break;
        case 2: p.v = ptr; break;
        default: p.o = const_cast<void*>(ptr);
      }
      break;
    }
    case 4: p.lse = static_cast<float*>(const_cast<void*>(hostile_pointer(g, p))); break;
    case 5: p.dtype = static_cast<flashcore_dtype>(g.pick<int>({-1, 0, 1, 2, 3, 4, 5, 99, -7})); break;
    case 6: p.out_dtype = static_cast<flashcore_dtype>(g.pick<int>({-1, -1, 0, 1, 2, 3, 4, 42, p.dtype})); break;
    case 7: p.softmax_scale = hostile_scale(g); break;
    case 8: p.causal = g.pick<int32_t>({-1, 0, 1, 2, INT32_MAX, INT32_MIN}); break;
    case 9: p.reserved = g.pick<int32_t>({0, 1, -1}); break;
    case 10: {
      const i128 product = static_cast<i128>(p.batch) * p.num_heads_q * p.seqlen_q;
      const int64_t needed = product > 0 && product <= kInt64Max ? static_cast<int64_t>(product) : 1;
      p.lse_capacity = g.pick<int64_t>({-1, 0, needed - 1, needed,
                                        std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()});
      break;
    }
    case 11:
      p.workspace = const_cast<void*>(g.chance(0.3) ? nullptr : hostile_pointer(g, p));
      p.workspace_size = g.pick<uint64_t>({0, 16, 4096, ~uint64_t{0}, uint64_t{1} << 63});
      break;
    case 12: p.struct_size = g.pick<uint32_t>({0, FLASHCORE_ATTENTION_PARAMS_V1_SIZE, sizeof(p) - 4, 1u << 20}); break;
    case 13: {  // O over or next to an input
      const void* in[] = {p.q, p.k, p.v};
      p.o = address(reinterpret_cast<uintptr_t>(in[g.uniform(0, 2)]) + 16 * g.uniform(-4096, 4096));
      break;
    }
    default: p.lse = static_cast<float*>(address(reinterpret_cast<uintptr_t>(p.o) + 16 * g.uniform(-4096, 4096)));
  }
}

// True when `message` names an argument: one of the names below as a whole word.
bool names_an_argument(const std::string& message) {
  static const char* const kNames[] = {
      "params", "struct_size", "q", "k", "v", "o", "lse", "workspace", "workspace_size", "batch", "seqlen_q",
      "seqlen_k", "num_heads_q", "num_heads_kv", "head_dim", "dtype", "out_dtype", "softmax_scale", "causal",
      "reserved", "lse_capacity", "q_strides", "k_strides", "v_strides", "o_strides"};
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (const char* name : kNames) {
    const std::string n = name;
    for (size_t at = message.find(n); at != std::string::npos; at = message.find(n, at + 1)) {
      const bool left = at == 0 || !is_word(message[at - 1]);
      const bool right = at + n.size() == message.size() || !is_word(message[at + n.size()]) ||
                         message.compare(at + n.size(), 9, "_strides.") == 0;
      if (left && right) return true;
    }
  }
  return false;
}

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

TEST(FuzzValidation, AgreesWithTheOracle) {
  const uint64_t seed = env_or("FLASHCORE_FUZZ_SEED", 20240611);
  const int64_t cases = static_cast<int64_t>(env_or("FLASHCORE_FUZZ_CASES", 20000));
  std::vector<std::pair<flashcore_dtype, int>> compiled_pairs;
  for (flashcore_dtype dt :
       {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2})
    for (int hd : kHeadDims)
      if (compiled(dt, hd)) compiled_pairs.push_back({dt, hd});
  ASSERT_FALSE(compiled_pairs.empty()) << "this build compiled no kernel at all";
  const bool device = flashcore::testing::cuda_device_visible();

  Gen g(seed);
  std::map<flashcore_status, int64_t> by_status;
  int64_t mismatches = 0, unnamed = 0, forward_mismatches = 0;
  for (int64_t i = 0; i < cases; ++i) {
    const auto [dtype, head_dim] = compiled_pairs[static_cast<size_t>(g.uniform(0, int64_t(compiled_pairs.size()) - 1))];
    flashcore_attention_params p = valid_problem(g, dtype, head_dim);
    const int64_t n_mutations = g.pick<int64_t>({0, 1, 1, 1, 2, 2, 3});
    for (int64_t m = 0; m < n_mutations; ++m) mutate(g, p);

    const flashcore_status want = oracle(p);
    const flashcore_status got = flashcore_attention_validate(&p);
    const std::string message = flashcore_last_error();
    ++by_status[got];
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "case " << i << " (seed " << seed << "): validate returned " << flashcore_status_string(got)
                    << " (" << message << "), the oracle expects " << flashcore_status_string(want);
    }
    if (got != FLASHCORE_SUCCESS && !names_an_argument(message) && ++unnamed <= 10) {
      ADD_FAILURE() << "case " << i << ": message names no argument: '" << message << "'";
    }
    // forward() runs the same checks first; an accepted case can only get as far as the device checks here
    // (no device, or made-up pointers that are not device memory).
    if (got != FLASHCORE_SUCCESS || !device) {
      const flashcore_status fwd = flashcore_attention_forward(&p, nullptr);
      const flashcore_status fwd_want = got != FLASHCORE_SUCCESS ? got : FLASHCORE_ERROR_NO_DEVICE;
      if (fwd != fwd_want && ++forward_mismatches <= 10) {
        ADD_FAILURE() << "case " << i << ": forward returned " << flashcore_status_string(fwd) << " ("
                      << flashcore_last_error() << "), validate " << flashcore_status_string(got);
      }
    }
  }
  std::printf("fuzz validation: seed %llu, %lld cases run, %lld accepted, rejected by status:\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(cases),
              static_cast<long long>(by_status[FLASHCORE_SUCCESS]));
  for (const auto& [status, count] : by_status) {
    if (status != FLASHCORE_SUCCESS) std::printf("  %-28s %lld\n", flashcore_status_string(status), static_cast<long long>(count));
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(unnamed, 0);
  EXPECT_EQ(forward_mismatches, 0);
  // The generator must exercise both sides: a fuzz test that rejects everything checks little.
  EXPECT_GT(by_status[FLASHCORE_SUCCESS], cases / 20);
  EXPECT_GE(by_status.size(), 10u) << "fewer distinct statuses than expected";
}

}  // namespace

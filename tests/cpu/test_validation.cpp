// The C ABI's argument validation, exhaustively, without a GPU: every check of flashcore_attention_validate /
// _forward, its status, its message (naming the argument and its value) and that O/LSE stay untouched.
// Host buffers stand in for device pointers: every failing case fails before any device access.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "api/backend.h"
#include "cpu/validation_util.h"
#include "cpu/configured_archs.h"

namespace {

constexpr int kHeadDims[] = {64, 128, 256};

using flashcore::test::Compiled;
using flashcore::test::first_compiled;
using flashcore::test::HostBuffer;

class Validation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 16, SK = 24, HQ = 4, HKV = 2;

  void SetUp() override {
    const Compiled c = first_compiled();
    ASSERT_GT(c.head_dim, 0) << "this build compiled no kernel at all";
    D = c.head_dim;
    q_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    k_ = std::make_unique<HostBuffer>(B * SK * HKV * D * 2);
    v_ = std::make_unique<HostBuffer>(B * SK * HKV * D * 2);
    o_ = std::make_unique<HostBuffer>(B * SQ * HQ * D * 2);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    flashcore_attention_params_init(&p);
    p.out_dtype = FLASHCORE_DTYPE_SAME;  // the 0.2 default; set here too until params_init sets it
    p.q = q_->data();
    p.k = k_->data();
    p.v = v_->data();
    p.o = o_->data();
    p.lse = reinterpret_cast<float*>(lse_->data());
    p.batch = B;
    p.seqlen_q = SQ;
    p.seqlen_k = SK;
    p.num_heads_q = HQ;
    p.num_heads_kv = HKV;
    p.head_dim = D;
    p.dtype = c.dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }

  // validate() and forward() both return `want` with a message holding every needle; O and LSE untouched.
  void expect_error(flashcore_status want, const std::vector<std::string>& needles) {
    expect_error(&p, want, needles);
  }
  void expect_error(const flashcore_attention_params* params, flashcore_status want,
                    const std::vector<std::string>& needles) {
    for (int forward = 0; forward < 2; ++forward) {
      SCOPED_TRACE(forward ? "flashcore_attention_forward" : "flashcore_attention_validate");
      const flashcore_status got =
          forward ? flashcore_attention_forward(params, nullptr) : flashcore_attention_validate(params);
      EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << flashcore_last_error();
      const std::string message = flashcore_last_error();
      for (const std::string& needle : needles) {
        EXPECT_NE(message.find(needle), std::string::npos) << "message '" << message << "' lacks '" << needle << "'";
      }
    }
    EXPECT_TRUE(o_->untouched()) << "O was written by a failing call";
    EXPECT_TRUE(lse_->untouched()) << "LSE was written by a failing call";
  }

  int64_t D = 0;
  flashcore_attention_params p{};
  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_;
};

// ---- INVALID_ARGUMENT: params / struct_size ----
TEST_F(Validation, NullParams) { expect_error(nullptr, FLASHCORE_ERROR_INVALID_ARGUMENT, {"params is NULL"}); }

TEST_F(Validation, WrongStructSize) {
  p.struct_size = 12;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"struct_size = 12"});
  p.struct_size = 0;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"struct_size = 0"});
}

// ---- NULL_POINTER ----
TEST_F(Validation, NullTensors) {
  for (const char* name : {"q", "k", "v", "o"}) {
    SCOPED_TRACE(name);
    flashcore_attention_params bad = p;
    const void** slot = name[0] == 'q' ? &bad.q : name[0] == 'k' ? &bad.k : name[0] == 'v' ? &bad.v : nullptr;
    if (slot != nullptr) *slot = nullptr; else bad.o = nullptr;
    expect_error(&bad, FLASHCORE_ERROR_NULL_POINTER, {std::string(name) + " is NULL"});
  }
}

TEST_F(Validation, NullLseIsFine) {
  p.lse = nullptr;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- INVALID_SIZE ----
TEST_F(Validation, NonPositiveSizes) {
  int64_t flashcore_attention_params::*fields[] = {
      &flashcore_attention_params::batch,       &flashcore_attention_params::seqlen_q,
      &flashcore_attention_params::seqlen_k,    &flashcore_attention_params::num_heads_q,
      &flashcore_attention_params::num_heads_kv, &flashcore_attention_params::head_dim};
  const char* names[] = {"batch", "seqlen_q", "seqlen_k", "num_heads_q", "num_heads_kv", "head_dim"};
  for (int i = 0; i < 6; ++i) {
    for (int64_t value : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      SCOPED_TRACE(names[i]);
      flashcore_attention_params bad = p;
      bad.*fields[i] = value;
      expect_error(&bad, FLASHCORE_ERROR_INVALID_SIZE, {std::string(names[i]) + " = " + std::to_string(value)});
    }
  }
}

// ---- SIZE_OVERFLOW ----
TEST_F(Validation, SizeAboveInt32Max) {
  p.seqlen_k = int64_t{INT32_MAX} + 1;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"seqlen_k = 2147483648", "INT32_MAX"});
  p.seqlen_k = SK;
  p.batch = std::numeric_limits<int64_t>::max();
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"batch = 9223372036854775807"});
}

TEST_F(Validation, ExtentOverflowsInt64) {
  // (INT32_MAX - 513) * 2^36 > 2^63, while 2^36 elements (2^37 bytes) is below the TMA stride limit.
  p.seqlen_q = int64_t{INT32_MAX} - 512;
  p.q_strides.seq = int64_t{1} << 36;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"q's extent overflows int64", "seqlen_q", "68719476736"});
}

TEST_F(Validation, ByteExtentOverflowsInt64) {
  // Element extent fits (just below 2^63) but times 2 bytes does not.
  p.batch = 1 << 20;
  p.k_strides.batch = (int64_t{1} << 38) - 8;
  p.k_strides.seq = (int64_t{1} << 38) - 8;
  p.seqlen_k = int64_t{1} << 20;
  p.k_strides.head = (int64_t{1} << 38) - 8;
  p.num_heads_kv = (int64_t{1} << 24);
  p.num_heads_q = p.num_heads_kv;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"k's"});
}

TEST_F(Validation, StrideAtTmaLimit) {
  p.batch = 1;  // the limit applies to every stride, even of a size-1 dimension (TMA encodes them all)
  p.v_strides.batch = int64_t{1} << 39;  // 2^40 bytes at 2 bytes per element
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"v_strides.batch = 549755813888", "2^40"});
  p.v_strides.batch = (int64_t{1} << 39) - 8;  // just below: accepted
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(Validation, LseExtentOverflow) {
  p.lse = reinterpret_cast<float*>(uintptr_t{0} - 256);  // 512-byte extent wraps the address space
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"lse"});
}

TEST_F(Validation, PointerPlusExtentWraps) {
  p.o = reinterpret_cast<void*>(uintptr_t{0} - 64);
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"o = 0xffffffffffffffc0", "wraps"});
}

TEST_F(Validation, SeqlenLeavesRoomForBlockArithmetic) {
  // The kernels form (n_block + 1) * kBlockN and row + seqlen_k - seqlen_q in 32 bits: INT32_MAX - 512 at most.
  p.seqlen_q = int64_t{INT32_MAX} - 511;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"seqlen_q = 2147483136", "exceeds 2147483135", "INT32_MAX - 512"});
  p.seqlen_q = SQ;
  p.seqlen_k = INT32_MAX;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"seqlen_k = 2147483647", "exceeds 2147483135"});
  p.seqlen_k = int64_t{INT32_MAX} - 512;  // the limit itself passes the size checks (fails later on overlap)
  EXPECT_NE(flashcore_attention_validate(&p), FLASHCORE_ERROR_SIZE_OVERFLOW) << flashcore_last_error();
}

TEST_F(Validation, WorkspaceWrapsAddressSpace) {
  p.workspace = reinterpret_cast<void*>(uintptr_t{0} - 4096);
  p.workspace_size = 8192;
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"workspace = 0xfffffffffffff000", "workspace_size = 8192", "wraps"});
}

// ---- lse_capacity (INVALID_SIZE) ----
TEST_F(Validation, LseCapacity) {
  const int64_t needed = B * HQ * SQ;
  p.lse_capacity = -1;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"lse_capacity = -1"});
  p.lse_capacity = needed - 1;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE,
               {"lse_capacity = " + std::to_string(needed - 1), "less than the " + std::to_string(needed)});
  p.lse_capacity = needed;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.lse_capacity = 0;  // not given
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.lse = nullptr;  // no LSE: a capacity is not checked against anything
  p.lse_capacity = 1;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.lse_capacity = -5;  // but a negative one is still nonsense
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_INVALID_SIZE);
}

// ---- workspace ----
TEST_F(Validation, Workspace) {
  p.workspace_size = 256;
  expect_error(FLASHCORE_ERROR_NULL_POINTER, {"workspace is NULL", "workspace_size = 256"});
  HostBuffer ws(256);
  p.workspace = ws.data() + 8;
  expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, {"workspace = 0x", "16-byte aligned"});
  p.workspace = ws.data();
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.workspace_size = 0;  // a buffer without a size is fine (the backend asks for what it needs)
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- INVALID_HEAD_RATIO ----
TEST_F(Validation, HeadRatio) {
  p.num_heads_q = 3;
  p.num_heads_kv = 2;
  expect_error(FLASHCORE_ERROR_INVALID_HEAD_RATIO, {"num_heads_q = 3", "num_heads_kv = 2"});
}

TEST_F(Validation, GqaAndMqaRatiosAreFine) {
  for (int64_t hkv : {int64_t{1}, int64_t{2}}) {  // MQA, GQA (the K/V buffers hold HKV = 2 heads)
    p.num_heads_kv = hkv;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
    EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }
}

// ---- UNSUPPORTED_DTYPE ----
TEST_F(Validation, DtypesWithoutGpuKernel) {
  p.dtype = FLASHCORE_DTYPE_FP32;
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype = 2", "fp32"});
  p.dtype = static_cast<flashcore_dtype>(99);
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype = 99"});
}

// Every GPU dtype is either compiled (accepted with one of its head dims) or rejected as not compiled in: runs
// (and can fail) in every build, whichever dtypes it compiled.
TEST_F(Validation, DtypeCompiledOrNotCompiledIn) {
  for (flashcore_dtype dt :
       {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
    SCOPED_TRACE(dt);
    int compiled_head_dim = flashcore::backend::is_compiled(dt, static_cast<int>(D)) ? static_cast<int>(D) : 0;
    for (int hd : kHeadDims) {
      if (compiled_head_dim == 0 && flashcore::backend::is_compiled(dt, hd)) compiled_head_dim = hd;
    }
    flashcore_attention_params q = p;
    q.dtype = dt;
    if (compiled_head_dim == D) {
      EXPECT_EQ(flashcore_attention_validate(&q), FLASHCORE_SUCCESS) << flashcore_last_error();
    } else if (compiled_head_dim != 0) {  // the buffers are sized for D: only the dtype checks must pass
      q.head_dim = compiled_head_dim;
      ASSERT_EQ(flashcore_attention_params_set_contiguous(&q, 0), FLASHCORE_SUCCESS);
      const flashcore_status st = flashcore_attention_validate(&q);
      EXPECT_NE(st, FLASHCORE_ERROR_UNSUPPORTED_DTYPE) << flashcore_last_error();
      EXPECT_NE(st, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM) << flashcore_last_error();
    } else {
      expect_error(&q, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype = " + std::to_string(dt), "not compiled"});
    }
  }
}

TEST_F(Validation, OutDtype) {
  const flashcore_dtype other = p.dtype == FLASHCORE_DTYPE_BF16 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
  p.out_dtype = other;
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype = " + std::to_string(other), "differs from dtype"});
  for (flashcore_dtype bad : {FLASHCORE_DTYPE_FP32, FLASHCORE_DTYPE_FP8_E4M3, static_cast<flashcore_dtype>(77)}) {
    p.out_dtype = bad;
    expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype = " + std::to_string(bad)});
  }
  p.out_dtype = p.dtype;  // naming the input dtype explicitly is the same as FLASHCORE_DTYPE_SAME
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- UNSUPPORTED_HEAD_DIM ----
TEST_F(Validation, HeadDimNotCompiled) {
  for (int64_t hd : {int64_t{80}, int64_t{8}, int64_t{512}, int64_t{INT32_MAX}}) {
    p.head_dim = hd;
    flashcore_attention_params_set_contiguous(&p, 0);
    if (hd == INT32_MAX) p.q_strides = p.k_strides = p.v_strides = p.o_strides = {0, 0, 0, 1};
    expect_error(FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim = " + std::to_string(hd)});
  }
  for (int hd : kHeadDims) {
    if (flashcore::backend::is_compiled(p.dtype, hd)) continue;
    p.head_dim = hd;
    flashcore_attention_params_set_contiguous(&p, 0);
    expect_error(FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim = " + std::to_string(hd), "not compiled"});
  }
}

// ---- MISALIGNED_POINTER ----
TEST_F(Validation, MisalignedPointers) {
  auto shift = [](const void* ptr, int bytes) { return static_cast<const unsigned char*>(ptr) + bytes; };
  for (int which = 0; which < 5; ++which) {
    for (int bytes : {2, 8}) {
      flashcore_attention_params bad = p;
      const char* name = "q";
      switch (which) {
        case 0: bad.q = shift(p.q, bytes); break;
        case 1: bad.k = shift(p.k, bytes); name = "k"; break;
        case 2: bad.v = shift(p.v, bytes); name = "v"; break;
        case 3: bad.o = const_cast<unsigned char*>(shift(p.o, bytes)); name = "o"; break;
        default: bad.lse = reinterpret_cast<float*>(const_cast<unsigned char*>(shift(p.lse, bytes))); name = "lse";
      }
      SCOPED_TRACE(name);
      expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {std::string(name) + " = 0x", "16-byte aligned"});
    }
  }
}

// ---- INVALID_STRIDE ----
struct StrideCase {
  const char* tensor;  // "q", "k", "v", "o"
  const char* dim;     // "batch", "seq", "head", "dim"
  int64_t value;
  const char* needle;
};

int64_t& stride_ref(flashcore_attention_params& p, const std::string& tensor, const std::string& dim) {
  flashcore_tensor_strides& s =
      tensor == "q" ? p.q_strides : tensor == "k" ? p.k_strides : tensor == "v" ? p.v_strides : p.o_strides;
  return dim == "batch" ? s.batch : dim == "seq" ? s.seq : dim == "head" ? s.head : s.dim;
}

TEST_F(Validation, InvalidStrides) {
  const StrideCase cases[] = {
      {"q", "dim", 2, "must be 1"},           {"k", "dim", 0, "must be 1"},
      {"v", "dim", -1, "must be 1"},          {"o", "dim", 8, "must be 1"},
      {"q", "seq", 12, "is not a multiple of 8 elements (16 bytes; TMA needs 16-byte strides)"},
      {"k", "batch", 4, "is not a multiple of 8"}, {"v", "head", 1, "is not a multiple of 8"},
      {"o", "seq", 100, "is not a multiple of 8"}, {"q", "batch", -8, "is negative"},
      {"k", "seq", -1024, "is negative"},     {"o", "head", -8, "is negative"},
      {"q", "head", 0, "is 0 but num_heads_q = 4"}, {"k", "seq", 0, "is 0 but seqlen_k = 24"},
      {"o", "batch", 0, "is 0 but batch = 2"},
  };
  for (const StrideCase& c : cases) {
    flashcore_attention_params bad = p;
    stride_ref(bad, c.tensor, c.dim) = c.value;
    const std::string name = std::string(c.tensor) + "_strides." + c.dim + " = " + std::to_string(c.value);
    SCOPED_TRACE(name);
    expect_error(&bad, FLASHCORE_ERROR_INVALID_STRIDE, {name, c.needle});
  }
}

TEST_F(Validation, SeqStrideMessageMatchesDocumentation) {
  p.q_strides.seq = 12;
  expect_error(FLASHCORE_ERROR_INVALID_STRIDE,
               {"q_strides.seq = 12 is not a multiple of 8 elements (16 bytes; TMA needs 16-byte strides)"});
}

TEST_F(Validation, ZeroStrideAllowedForSizeOneDimension) {
  p.batch = 1;
  p.num_heads_q = p.num_heads_kv = 1;
  p.q_strides.batch = p.k_strides.batch = p.v_strides.batch = p.o_strides.batch = 0;
  p.q_strides.head = p.k_strides.head = p.v_strides.head = p.o_strides.head = 0;
  p.q_strides.seq = p.o_strides.seq = D;
  p.k_strides.seq = p.v_strides.seq = D;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(Validation, PaddedAndPackedLayoutsAreFine) {
  // Q, K, V packed in one (B, S, 3, H, D)-like buffer is legal for inputs; O may have padded strides.
  p.num_heads_q = p.num_heads_kv = 2;
  p.seqlen_k = p.seqlen_q = 8;
  const int64_t row = 3 * 2 * D;
  for (flashcore_tensor_strides* s : {&p.q_strides, &p.k_strides, &p.v_strides}) *s = {8 * row, row, D, 1};
  p.k = static_cast<const unsigned char*>(p.q) + 2 * D * 2;
  p.v = static_cast<const unsigned char*>(p.q) + 4 * D * 2;
  p.o_strides = {8 * 2 * D + 64, 2 * D + 8, D, 1};  // padded rows
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- INVALID_ARGUMENT: scalars ----
TEST_F(Validation, BadSoftmaxScale) {
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity(), -0.5f}) {
    p.softmax_scale = scale;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"softmax_scale = "});
  }
  p.softmax_scale = -0.5f;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"softmax_scale = -0.5"});
  for (float scale : {0.0f, 0.125f, 1e-30f, 1e30f}) {
    p.softmax_scale = scale;
    EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  }
}

TEST_F(Validation, SoftmaxScaleRange) {
  // Outside [2^-100, 2^100]: denormals, tiny normals whose product with log2(e) would not stay normal, huge ones.
  for (float scale : {0x1p-101f, 1e-40f, std::numeric_limits<float>::denorm_min(),
                      std::numeric_limits<float>::min(), 0x1p101f, std::numeric_limits<float>::max()}) {
    SCOPED_TRACE(scale);
    p.softmax_scale = scale;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"softmax_scale = ", "[2^-100, 2^100]"});
  }
  for (float scale : {0x1p-100f, 0x1p100f, -0.0f}) {  // the ends are included; -0 is 0, the default
    p.softmax_scale = scale;
    EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << scale << ": " << flashcore_last_error();
  }
}

TEST_F(Validation, ReservedMustBeZero) {
  p.reserved = 1;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved = 1", "must be 0"});
  p.reserved = -7;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved = -7"});
}

TEST_F(Validation, BadCausalFlag) {
  p.causal = 2;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"causal = 2"});
  p.causal = -1;
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"causal = -1"});
  p.causal = 1;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- OVERLAPPING_OUTPUT ----
TEST_F(Validation, OutputOverlapsInputs) {
  p.o = const_cast<void*>(p.q);
  expect_error(FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"o [0x", "overlaps q [0x"});
  p.o = static_cast<unsigned char*>(const_cast<void*>(p.k)) + 64;  // partial overlap with k
  p.o_strides = p.k_strides;
  p.seqlen_q = p.seqlen_k;
  p.num_heads_q = p.num_heads_kv;
  p.q_strides = p.k_strides;
  expect_error(FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"overlaps k"});
  p.o = static_cast<unsigned char*>(const_cast<void*>(p.v)) + 16 * 1024 * 1024;  // far away: still no overlap
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  // O over the last 16 B of V. V and O share one allocation, so O can overlap nothing else whatever the
  // heap layout (with separate allocations, O's span past V's end could reach Q or K first).
  const int64_t v_bytes = B * SK * HKV * D * 2;
  HostBuffer v_and_o(v_bytes + B * SK * HKV * D * 2);
  std::memcpy(v_and_o.data(), p.v, v_bytes);
  p.v = v_and_o.data();
  p.o = v_and_o.data() + v_bytes - 16;
  expect_error(FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"overlaps v"});
}

TEST_F(Validation, AdjacentBuffersDoNotOverlap) {
  // O placed right after Q's last element: spans are half-open.
  const int64_t q_bytes = B * SQ * HQ * D * 2;
  HostBuffer both(2 * q_bytes);
  p.q = both.data();
  p.o = both.data() + q_bytes;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  p.o = both.data() + q_bytes - 16;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_OVERLAPPING_OUTPUT);
}

TEST_F(Validation, LseOverlaps) {
  const char* names[] = {"q", "k", "v", "o"};
  const void* bases[] = {p.q, p.k, p.v, p.o};
  for (int i = 0; i < 4; ++i) {
    flashcore_attention_params bad = p;
    bad.lse = static_cast<float*>(const_cast<void*>(bases[i])) + 4 * (i + 1);
    SCOPED_TRACE(names[i]);
    expect_error(&bad, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"lse [0x", std::string("overlaps ") + names[i] + " [0x"});
  }
}

TEST_F(Validation, OutputOverlapsItself) {
  p.o_strides.seq = 8;  // rows of HQ * D elements overlap each other
  expect_error(FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"o_strides.", "share memory"});
}

// ---- ordering: the first failing check wins ----
TEST_F(Validation, OrderOfChecks) {
  p.q = nullptr;
  p.batch = 0;
  expect_error(FLASHCORE_ERROR_NULL_POINTER, {"q is NULL"});
  p.q = q_->data();
  p.num_heads_q = 3;  // head ratio and size error: size first
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"batch = 0"});
  p.batch = B;
  p.dtype = FLASHCORE_DTYPE_FP32;  // ratio before dtype
  expect_error(FLASHCORE_ERROR_INVALID_HEAD_RATIO, {"num_heads_q = 3"});
  p.num_heads_q = HQ;
  p.head_dim = 80;  // dtype before head dim
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype = 2"});
  p.dtype = first_compiled().dtype;
  p.q = static_cast<const unsigned char*>(p.q) + 2;  // head dim before alignment
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim = 80"});
  p.head_dim = D;
  p.q_strides.seq = 12;  // alignment before strides
  expect_error(FLASHCORE_ERROR_MISALIGNED_POINTER, {"q = 0x"});
  p.q = q_->data();
  p.softmax_scale = -1.0f;  // strides before scalars
  expect_error(FLASHCORE_ERROR_INVALID_STRIDE, {"q_strides.seq = 12"});
  p.q_strides.seq = HQ * D;
  p.o = const_cast<void*>(p.q);  // scalars before overlap
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"softmax_scale = -1"});
}

TEST_F(Validation, OrderOfTheNewChecks) {
  // workspace NULL (NULL_POINTER) before a size error.
  p.workspace_size = 16;
  p.batch = 0;
  expect_error(FLASHCORE_ERROR_NULL_POINTER, {"workspace is NULL"});
  p.workspace_size = 0;
  p.batch = B;
  // lse_capacity (INVALID_SIZE, step 5) after size overflow, before the head ratio.
  p.lse_capacity = 1;
  p.num_heads_q = 3;
  expect_error(FLASHCORE_ERROR_INVALID_SIZE, {"lse_capacity = 1"});
  p.seqlen_q = int64_t{INT32_MAX};
  expect_error(FLASHCORE_ERROR_SIZE_OVERFLOW, {"seqlen_q = 2147483647"});
  p.seqlen_q = SQ;
  p.lse_capacity = 0;
  // out_dtype (UNSUPPORTED_DTYPE) after the head ratio, before the head dim.
  p.out_dtype = FLASHCORE_DTYPE_FP32;
  expect_error(FLASHCORE_ERROR_INVALID_HEAD_RATIO, {"num_heads_q = 3"});
  p.num_heads_q = HQ;
  p.head_dim = 80;
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"out_dtype = 2"});
  p.head_dim = D;
  p.out_dtype = FLASHCORE_DTYPE_SAME;
  // reserved (INVALID_ARGUMENT) after the strides, before overlap.
  p.reserved = 3;
  p.o_strides.seq = 12;
  expect_error(FLASHCORE_ERROR_INVALID_STRIDE, {"o_strides.seq = 12"});
  p.o_strides.seq = HQ * D;
  p.o = const_cast<void*>(p.q);
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved = 3"});
}

// ---- device checks ----
TEST_F(Validation, ValidParamsWithoutGpuGiveNoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  EXPECT_EQ(flashcore_attention_forward(&p, nullptr), FLASHCORE_ERROR_NO_DEVICE);
  EXPECT_NE(std::string(flashcore_last_error()).find("no CUDA device visible"), std::string::npos)
      << flashcore_last_error();
  EXPECT_TRUE(o_->untouched());
  EXPECT_TRUE(lse_->untouched());
  // validate() does no device work: still fine.
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS);
  EXPECT_STREQ(flashcore_last_error(), "");
}

// ---- last_error ----
TEST_F(Validation, SuccessClearsLastError) {
  p.causal = 7;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_STRNE(flashcore_last_error(), "");
  p.causal = 0;
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS);
  EXPECT_STREQ(flashcore_last_error(), "");
}

TEST_F(Validation, LastErrorIsThreadLocal) {
  p.q_strides.seq = 12;
  ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_ERROR_INVALID_STRIDE);
  const std::string main_message = flashcore_last_error();
  std::string other_before, other_after;
  std::thread([&] {
    other_before = flashcore_last_error();
    flashcore_attention_params bad = p;
    bad.q_strides.seq = HQ * D;
    bad.num_heads_q = 3;
    flashcore_attention_validate(&bad);
    other_after = flashcore_last_error();
  }).join();
  EXPECT_EQ(other_before, "");
  EXPECT_NE(other_after.find("num_heads_q = 3"), std::string::npos) << other_after;
  EXPECT_EQ(std::string(flashcore_last_error()), main_message);
}

// ---- set_contiguous ----
// Sets sizes (B=2, Sq=5, Sk=7, Hq=6, Hkv=3, D=64) and checks the strides of Q/O and K/V for `bhsd_layout`.
void expect_contiguous(int bhsd_layout) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = 2, p.seqlen_q = 5, p.seqlen_k = 7, p.num_heads_q = 6, p.num_heads_kv = 3, p.head_dim = 64;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, bhsd_layout), FLASHCORE_SUCCESS);
  const struct {
    const flashcore_tensor_strides* strides;
    int64_t seq, heads;
  } tensors[] = {{&p.q_strides, 5, 6}, {&p.o_strides, 5, 6}, {&p.k_strides, 7, 3}, {&p.v_strides, 7, 3}};
  for (const auto& t : tensors) {
    const flashcore_tensor_strides& s = *t.strides;
    EXPECT_EQ(s.batch, t.seq * t.heads * 64);
    EXPECT_EQ(s.seq, bhsd_layout ? 64 : t.heads * 64);
    EXPECT_EQ(s.head, bhsd_layout ? t.seq * 64 : 64);
    EXPECT_EQ(s.dim, 1);
  }
}

TEST(SetContiguous, Bshd) { expect_contiguous(0); }
TEST(SetContiguous, Bhsd) { expect_contiguous(1); }

TEST(SetContiguous, BadInput) {
  EXPECT_EQ(flashcore_attention_params_set_contiguous(nullptr, 0), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("params is NULL"), std::string::npos);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = 1, p.seqlen_q = 4, p.seqlen_k = 4, p.num_heads_q = 1, p.num_heads_kv = 1, p.head_dim = 64;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 2), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("bhsd_layout = 2"), std::string::npos);
  p.seqlen_k = 0;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_ERROR_INVALID_SIZE);
  EXPECT_NE(std::string(flashcore_last_error()).find("seqlen_k = 0"), std::string::npos);
  p.seqlen_k = 4;
  p.struct_size = 1;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_ERROR_INVALID_ARGUMENT);
}

TEST(ParamsInit, Defaults) {
  flashcore_attention_params p;
  std::memset(&p, 0x7F, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(flashcore_attention_params));
  EXPECT_EQ(p.q, nullptr);
  EXPECT_EQ(p.lse, nullptr);
  EXPECT_EQ(p.q_strides.dim, 1);
  EXPECT_EQ(p.k_strides.dim, 1);
  EXPECT_EQ(p.v_strides.dim, 1);
  EXPECT_EQ(p.o_strides.dim, 1);
  EXPECT_EQ(p.q_strides.seq, 0);
  EXPECT_EQ(p.causal, 0);
  EXPECT_EQ(p.softmax_scale, 0.0f);
  flashcore_attention_params_init(nullptr);  // must not crash
}

// ---- status strings, version, capabilities ----
TEST(StatusString, EveryCodeHasADistinctString) {
  std::set<std::string> seen;
  for (int s = FLASHCORE_SUCCESS; s <= FLASHCORE_ERROR_NCCL; ++s) {
    const char* text = flashcore_status_string(static_cast<flashcore_status>(s));
    ASSERT_NE(text, nullptr);
    EXPECT_STRNE(text, "");
    EXPECT_STRNE(text, "unknown status") << s;
    EXPECT_TRUE(seen.insert(text).second) << "duplicate string for status " << s << ": " << text;
  }
  EXPECT_STREQ(flashcore_status_string(FLASHCORE_SUCCESS), "success");
  EXPECT_STREQ(flashcore_status_string(FLASHCORE_ERROR_INVALID_STRIDE), "invalid stride");
  EXPECT_STREQ(flashcore_status_string(static_cast<flashcore_status>(1234)), "unknown status");
  EXPECT_STREQ(flashcore_status_string(static_cast<flashcore_status>(-1)), "unknown status");
}

TEST(Version, MatchesHeader) {
  int major = -1, minor = -1, patch = -1;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_EQ(minor, FLASHCORE_VERSION_MINOR);
  EXPECT_EQ(patch, FLASHCORE_VERSION_PATCH);
  EXPECT_EQ(std::string(flashcore_version_string()), std::to_string(major) + "." + std::to_string(minor) + "." +
                                                         std::to_string(patch));
  flashcore_version(nullptr, nullptr, nullptr);  // must not crash
}

TEST(Capabilities, MatchCompiledKernels) {
  flashcore_capabilities caps{};
  caps.struct_size = sizeof(caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  std::set<int> dtypes(caps.dtypes, caps.dtypes + caps.num_dtypes);
  std::set<int> head_dims(caps.head_dims, caps.head_dims + caps.num_head_dims);
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    for (int hd : kHeadDims) {
      if (flashcore::backend::is_compiled(dt, hd)) {
        EXPECT_TRUE(dtypes.count(dt)) << dt;
        EXPECT_TRUE(head_dims.count(hd)) << hd;
      }
    }
  }
  EXPECT_GE(caps.num_dtypes, 1);
  EXPECT_GE(caps.num_head_dims, 1);
  EXPECT_FALSE(dtypes.count(FLASHCORE_DTYPE_FP32));
  EXPECT_EQ(std::vector<int>(caps.archs, caps.archs + caps.num_archs), flashcore::testing::configured_archs());
  if (!flashcore::testing::cuda_device_visible()) {
    EXPECT_EQ(caps.device_arch, 0);
    EXPECT_EQ(caps.device_supported, 0);
  } else {
    EXPECT_GT(caps.device_arch, 0);
    if (std::getenv("FLASHCORE_BACKEND") == nullptr) {
      EXPECT_EQ(caps.device_supported, flashcore::testing::expected_backend(caps.device_arch).empty() ? 0 : 1);
    }
  }
}

TEST(Capabilities, BadInput) {
  EXPECT_EQ(flashcore_get_capabilities(nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("caps is NULL"), std::string::npos);
  flashcore_capabilities caps{};
  caps.struct_size = 4;
  EXPECT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("struct_size = 4"), std::string::npos);
}

}  // namespace

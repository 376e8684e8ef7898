// Argument validation of the backward pass (ABI 0.4: flashcore_attention_backward, _backward_workspace_size and the
// fields dout, dq, dk, dv, their strides, deterministic, reserved3; ABI 0.6: dsinks), without a GPU: the forward's
// checks first and unchanged, then every backward rule's status and a message naming the field, nothing written by a
// failing call; the valid combinations pass the argument checks; the 0.3 struct layout
// (FLASHCORE_ATTENTION_PARAMS_V3_SIZE) and params_init_sized / set_contiguous with it. (The variants themselves, and
// the 0.5 layout: tests/cpu/test_variant_validation.cpp.)
// Host buffers stand in for device memory: the argument checks touch no device, and every failing call fails before
// any device access. A call that passes them then fails the device checks: NO_DEVICE without a GPU, or (with one)
// INVALID_ARGUMENT because the buffers are host memory (passed_argument_checks).
//
// The workspace-size rules need the size, which flashcore_attention_backward_workspace_size may only give on a device
// (it checks the device like flashcore_attention_workspace_size does): those tests skip, saying so, when it cannot;
// tests/gpu/test_backward.cpp covers them on a GPU.
#include <gtest/gtest.h>

#include <cctype>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/backend.h"
#include "cpu/validation_util.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"

namespace {

using flashcore::test::HostBuffer;

// True when `name` occurs in `message` as a whole name, not inside a longer identifier: "q" is named in
// "dq [0x10, 0x20) overlaps q [0x0, 0x40)" but not in "dq is NULL"; "dq_strides.seq" in "dq_strides.seq = 12 ...".
bool names(const std::string& message, const std::string& name) {
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
  for (size_t at = message.find(name); at != std::string::npos; at = message.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || !ident(message[at - 1])) && (end == message.size() || !ident(message[end]))) return true;
  }
  return false;
}

// The status of a call that passed every argument check on these host buffers: the device checks' verdict.
bool passed_argument_checks(flashcore_status st, const std::string& message) {
  if (st == FLASHCORE_ERROR_NO_DEVICE || st == FLASHCORE_ERROR_UNSUPPORTED_ARCH || st == FLASHCORE_ERROR_CUDA) {
    return true;
  }
  return st == FLASHCORE_ERROR_INVALID_ARGUMENT && message.find("host memory") != std::string::npos;
}

// A (dtype, head_dim) the backward takes (fp16 / bf16, head_dim 128 or 64) that this build compiled, as the
// capabilities report it; head_dim 0 when there is none.
struct BackwardCompiled {
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int head_dim = 0;
};
BackwardCompiled backward_compiled() {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  if (flashcore_get_capabilities(&caps) != FLASHCORE_SUCCESS) return {};
  auto listed = [](const auto* values, int n, int value) {
    for (int i = 0; i < n; ++i) {
      if (static_cast<int>(values[i]) == value) return true;
    }
    return false;
  };
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16}) {
    for (int hd : {128, 64}) {
      if (listed(caps.dtypes, caps.num_dtypes, dt) && listed(caps.head_dims, caps.num_head_dims, hd) &&
          flashcore::backend::is_compiled(dt, hd)) {
        return {dt, hd};
      }
    }
  }
  return {};
}

// ---- the layout of the 0.4 fields ----
TEST(BackwardAbi, LayoutOfTheFieldsSince04) {
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V3_SIZE}, 480u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dout), size_t{FLASHCORE_ATTENTION_PARAMS_V3_SIZE});
  EXPECT_EQ(offsetof(flashcore_attention_params, dq), 488u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dk), 496u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dv), 504u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dout_strides), 512u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dq_strides), 544u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dk_strides), 576u);
  EXPECT_EQ(offsetof(flashcore_attention_params, dv_strides), 608u);
  EXPECT_EQ(offsetof(flashcore_attention_params, deterministic), 640u);
  EXPECT_EQ(offsetof(flashcore_attention_params, reserved3), 644u);
  // The 0.4 layout ends after reserved3 (0.5 appends the variant fields: tests/cpu/test_variant_validation.cpp).
  EXPECT_EQ(size_t{FLASHCORE_ATTENTION_PARAMS_V4_SIZE}, 648u);
  EXPECT_GE(sizeof(flashcore_attention_params), 648u);
  int major = 0, minor = 0, patch = 0;
  flashcore_version(&major, &minor, &patch);
  EXPECT_EQ(major, FLASHCORE_VERSION_MAJOR);
  EXPECT_GE(minor, 4) << "the library predates the backward";
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(caps.params_struct_size, sizeof(flashcore_attention_params));
}

TEST(BackwardAbi, InitSetsTheDefaultsOfTheFieldsSince04) {
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(p));
  EXPECT_EQ(p.dout, nullptr);
  EXPECT_EQ(p.dq, nullptr);
  EXPECT_EQ(p.dk, nullptr);
  EXPECT_EQ(p.dv, nullptr);
  for (const flashcore_tensor_strides* s : {&p.dout_strides, &p.dq_strides, &p.dk_strides, &p.dv_strides}) {
    EXPECT_EQ(s->batch, 0);
    EXPECT_EQ(s->seq, 0);
    EXPECT_EQ(s->head, 0);
    EXPECT_EQ(s->dim, 1);
  }
  EXPECT_EQ(p.deterministic, 0);
  EXPECT_EQ(p.reserved3, 0);
}

TEST(BackwardAbi, InitSizedWithTheV3SizeWritesNothingPastIt) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC3);
  auto* v3 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  flashcore_attention_params_init_sized(v3, FLASHCORE_ATTENTION_PARAMS_V3_SIZE);
  EXPECT_STREQ(flashcore_last_error(), "");
  EXPECT_EQ(v3->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V3_SIZE});
  EXPECT_EQ(v3->q_strides.dim, 1);
  EXPECT_EQ(v3->o_strides.dim, 1);
  EXPECT_EQ(v3->out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(v3->q_descale, nullptr);
  EXPECT_EQ(v3->precision, FLASHCORE_PRECISION_NATIVE);
  EXPECT_EQ(v3->reserved2, 0);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V3_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC3) << "byte " << i << " written past a 0.3 struct by params_init_sized";
  }
}

// ---- set_contiguous: dout and dq take Q's strides, dk and dv K's ----
void expect_gradient_strides_contiguous(int bhsd_layout) {
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = 2, p.seqlen_q = 5, p.seqlen_k = 7, p.num_heads_q = 6, p.num_heads_kv = 3, p.head_dim = 64;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, bhsd_layout), FLASHCORE_SUCCESS) << flashcore_last_error();
  auto same = [](const flashcore_tensor_strides& a, const flashcore_tensor_strides& b) {
    return a.batch == b.batch && a.seq == b.seq && a.head == b.head && a.dim == b.dim;
  };
  EXPECT_EQ(p.q_strides.seq, bhsd_layout ? 64 : 6 * 64);  // the layout asked for
  EXPECT_TRUE(same(p.dout_strides, p.q_strides));
  EXPECT_TRUE(same(p.dq_strides, p.q_strides));
  EXPECT_TRUE(same(p.dk_strides, p.k_strides));
  EXPECT_TRUE(same(p.dv_strides, p.k_strides));
  EXPECT_FALSE(same(p.q_strides, p.k_strides));  // (the sizes make Q's and K's strides differ)
}

TEST(SetContiguousBackward, BshdFillsTheGradientStrides) { expect_gradient_strides_contiguous(0); }
TEST(SetContiguousBackward, BhsdFillsTheGradientStrides) { expect_gradient_strides_contiguous(1); }

// ---- the fixture: a valid backward problem on host buffers ----
class BackwardValidation : public ::testing::Test {
 protected:
  static constexpr int64_t B = 2, SQ = 16, SK = 24, HQ = 4, HKV = 2;
  static constexpr int64_t DMAX = 256;  // the buffers hold head_dim 256 (the rejected head dims below)
  static constexpr int64_t SEQLEN_NEW = 2;

  void SetUp() override {
    const BackwardCompiled c = backward_compiled();
    if (c.head_dim == 0) {
      GTEST_SKIP() << "this build compiled no fp16 / bf16 kernel of head_dim 64 or 128, the backward's";
    }
    dtype = c.dtype;
    D = c.head_dim;
    const int64_t q_bytes = B * SQ * HQ * DMAX * 2, kv_bytes = B * SK * HKV * DMAX * 2;
    q_ = std::make_unique<HostBuffer>(q_bytes);
    k_ = std::make_unique<HostBuffer>(kv_bytes);
    v_ = std::make_unique<HostBuffer>(kv_bytes);
    o_ = std::make_unique<HostBuffer>(q_bytes);
    lse_ = std::make_unique<HostBuffer>(B * HQ * SQ * 4);
    dout_ = std::make_unique<HostBuffer>(q_bytes);
    dq_ = std::make_unique<HostBuffer>(q_bytes);
    dk_ = std::make_unique<HostBuffer>(kv_bytes);
    dv_ = std::make_unique<HostBuffer>(kv_bytes);
    k_new_ = std::make_unique<HostBuffer>(B * SEQLEN_NEW * HKV * DMAX * 2);
    v_new_ = std::make_unique<HostBuffer>(B * SEQLEN_NEW * HKV * DMAX * 2);
    ints_ = std::make_unique<HostBuffer>(1024);  // seqused_k, cu_seqlens_q / _k, block_table (contents unread)
    sinks_ = std::make_unique<HostBuffer>(HQ * 4);
    dsinks_ = std::make_unique<HostBuffer>(HQ * 4);
    flashcore_attention_params_init(&p);
    p.q = q_->data(), p.k = k_->data(), p.v = v_->data(), p.o = o_->data();
    p.lse = reinterpret_cast<float*>(lse_->data());
    p.dout = dout_->data(), p.dq = dq_->data(), p.dk = dk_->data(), p.dv = dv_->data();
    p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.num_heads_q = HQ, p.num_heads_kv = HKV, p.head_dim = D;
    p.dtype = dtype;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();

    // The workspace: the size the library asks for when it can say without a device; else a generous one (the
    // header's estimate, (4 * head_dim + 8) * batch * num_heads_q * seqlen_q bytes, times 4, plus 1 MiB), which
    // a GPU-less call never gets to compare against the size.
    uint64_t bytes = 0;
    size_status = flashcore_attention_backward_workspace_size(&p, &bytes);
    size_message = flashcore_last_error();
    workspace_known = size_status == FLASHCORE_SUCCESS;
    workspace_bytes = workspace_known ? bytes : uint64_t((4 * DMAX + 8) * B * HQ * SQ * 4 + (1 << 20));
    workspace_ = std::make_unique<HostBuffer>(workspace_bytes + 64);
    p.workspace = workspace_->data();
    p.workspace_size = workspace_bytes;
    expect_passes_argument_checks(p);
  }

  // Nothing the backward writes (dq, dk, dv), nor its inputs O and LSE, was written.
  void expect_untouched() {
    EXPECT_TRUE(dq_->untouched()) << "dq was written by a failing call";
    EXPECT_TRUE(dk_->untouched()) << "dk was written by a failing call";
    EXPECT_TRUE(dv_->untouched()) << "dv was written by a failing call";
    EXPECT_TRUE(dsinks_->untouched()) << "dsinks was written by a failing call";
    EXPECT_TRUE(o_->untouched()) << "o was written";
    EXPECT_TRUE(lse_->untouched()) << "lse was written";
  }

  // flashcore_attention_backward returns `want` with a message naming every one of `fields` (names()).
  void expect_error(flashcore_status want, const std::vector<std::string>& fields) { expect_error(&p, want, fields); }
  void expect_error(const flashcore_attention_params* params, flashcore_status want,
                    const std::vector<std::string>& fields) {
    const flashcore_status got = flashcore_attention_backward(params, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_EQ(got, want) << "got " << flashcore_status_string(got) << ": " << message;
    for (const std::string& field : fields) {
      EXPECT_TRUE(names(message, field)) << "message '" << message << "' does not name '" << field << "'";
    }
    expect_untouched();
  }
  // The backward returns what the forward's validation returns for `params`, with the same message.
  void expect_forward_verdict(const flashcore_attention_params& params) {
    const flashcore_status forward = flashcore_attention_validate(&params);
    const std::string forward_message = flashcore_last_error();
    ASSERT_NE(forward, FLASHCORE_SUCCESS) << "the mutation is valid for the forward";
    const flashcore_status backward = flashcore_attention_backward(&params, nullptr);
    EXPECT_EQ(backward, forward) << "backward: " << flashcore_status_string(backward) << ": " << flashcore_last_error()
                                 << "\nforward: " << flashcore_status_string(forward) << ": " << forward_message;
    EXPECT_EQ(std::string(flashcore_last_error()), forward_message);
    expect_untouched();
  }
  void expect_passes_argument_checks(const flashcore_attention_params& params) {
    const flashcore_status st = flashcore_attention_backward(&params, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_TRUE(passed_argument_checks(st, message)) << flashcore_status_string(st) << ": " << message;
    expect_untouched();
  }
  // Skips the current test unless the workspace size is known here (see the file's comment).
  bool workspace_size_unknown_here() const { return !workspace_known; }

  const void* shifted(const void* ptr, int64_t bytes) const { return static_cast<const unsigned char*>(ptr) + bytes; }
  void* shifted(void* ptr, int64_t bytes) const { return static_cast<unsigned char*>(ptr) + bytes; }

  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t D = 0;
  flashcore_attention_params p{};
  flashcore_status size_status = FLASHCORE_SUCCESS;
  std::string size_message;
  bool workspace_known = false;
  uint64_t workspace_bytes = 0;
  const float* sinks() const { return reinterpret_cast<const float*>(sinks_->data()); }
  float* dsinks() const { return reinterpret_cast<float*>(dsinks_->data()); }

  std::unique_ptr<HostBuffer> q_, k_, v_, o_, lse_, dout_, dq_, dk_, dv_, k_new_, v_new_, ints_, workspace_, sinks_,
      dsinks_;
};

TEST_F(BackwardValidation, ValidProblemPassesTheArgumentChecks) {
  expect_passes_argument_checks(p);
  for (int causal : {0, 1}) {
    p.causal = causal;
    for (float scale : {0.0f, 0.3f}) {
      p.softmax_scale = scale;
      expect_passes_argument_checks(p);
    }
  }
}

TEST_F(BackwardValidation, ValidProblemWithoutGpuGivesNoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  EXPECT_EQ(flashcore_attention_backward(&p, nullptr), FLASHCORE_ERROR_NO_DEVICE) << flashcore_last_error();
  EXPECT_STRNE(flashcore_last_error(), "");
  expect_untouched();
}

TEST_F(BackwardValidation, NullParams) {
  EXPECT_EQ(flashcore_attention_backward(nullptr, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("params is NULL"), std::string::npos) << flashcore_last_error();
  uint64_t bytes = 0;
  EXPECT_EQ(flashcore_attention_backward_workspace_size(nullptr, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("params is NULL"), std::string::npos) << flashcore_last_error();
}

// ---- the forward's checks come first, unchanged ----
TEST_F(BackwardValidation, ForwardChecksComeFirstAndUnchanged) {
  // Each mutation breaks a forward rule; dout is also NULL (a backward error), which must not be what is reported.
  using P = flashcore_attention_params;
  const std::pair<const char*, std::function<void(P&)>> mutations[] = {
      {"struct_size = 12", [](P& x) { x.struct_size = 12; }},
      {"q = NULL", [](P& x) { x.q = nullptr; }},
      {"o = NULL", [](P& x) { x.o = nullptr; }},
      {"batch = 0", [](P& x) { x.batch = 0; }},
      {"seqlen_k = INT32_MAX", [](P& x) { x.seqlen_k = INT32_MAX; }},
      {"num_heads_q = 3", [](P& x) { x.num_heads_q = 3; }},
      {"dtype = fp32", [](P& x) { x.dtype = FLASHCORE_DTYPE_FP32; }},
      {"head_dim = 80", [](P& x) {
         x.head_dim = 80;
         flashcore_attention_params_set_contiguous(&x, 0);
       }},
      {"q misaligned", [this](P& x) { x.q = shifted(x.q, 2); }},
      {"lse misaligned", [this](P& x) { x.lse = static_cast<float*>(shifted(x.lse, 4)); }},
      {"q_strides.seq = 12", [](P& x) { x.q_strides.seq = 12; }},
      {"o_strides.dim = 2", [](P& x) { x.o_strides.dim = 2; }},
      {"softmax_scale = -1", [](P& x) { x.softmax_scale = -1.0f; }},
      {"causal = 2", [](P& x) { x.causal = 2; }},
      {"reserved = 1", [](P& x) { x.reserved = 1; }},
      {"reserved2 = 1", [](P& x) { x.reserved2 = 1; }},
      {"precision = 7", [](P& x) { x.precision = 7; }},
      {"num_splits = -1", [](P& x) { x.num_splits = -1; }},
      {"flags = 0x80", [](P& x) { x.flags = 0x80u; }},
      {"lse_capacity = 1", [](P& x) { x.lse_capacity = 1; }},
      {"o overlaps q", [](P& x) { x.o = const_cast<void*>(x.q); }},
      {"lse inside o", [](P& x) { x.lse = static_cast<float*>(x.o); }},
      {"workspace misaligned", [this](P& x) { x.workspace = shifted(x.workspace, 8); }},
      {"workspace NULL with workspace_size > 0", [](P& x) { x.workspace = nullptr; }},
  };
  for (const auto& [what, mutate] : mutations) {
    SCOPED_TRACE(what);
    flashcore_attention_params bad = p;
    mutate(bad);
    bad.dout = nullptr;
    expect_forward_verdict(bad);
  }
}

TEST_F(BackwardValidation, ForwardIgnoresTheBackwardFields) {
  // Garbage in every backward field: the forward's validation does not look at them.
  p.dout = nullptr;
  p.dq = shifted(p.dq, 2);
  p.dk = const_cast<void*>(p.q);
  p.dv = p.o;
  p.dq_strides = {3, 5, 7, 9};
  p.dout_strides = {-8, 0, 0, 0};
  p.deterministic = 7;
  p.reserved3 = 11;
  p.dsinks = static_cast<float*>(shifted(dsinks(), 1));  // misaligned, and set without sinks
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

// ---- NULL_POINTER ----
TEST_F(BackwardValidation, LseIsRequired) {
  p.lse = nullptr;
  ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << "the forward takes no LSE: " << flashcore_last_error();
  expect_error(FLASHCORE_ERROR_NULL_POINTER, {"lse"});
}

TEST_F(BackwardValidation, NullGradientTensors) {
  const std::pair<const char*, const void* flashcore_attention_params::*> inputs[] = {
      {"dout", &flashcore_attention_params::dout}};
  const std::pair<const char*, void* flashcore_attention_params::*> outputs[] = {
      {"dq", &flashcore_attention_params::dq}, {"dk", &flashcore_attention_params::dk},
      {"dv", &flashcore_attention_params::dv}};
  for (const auto& [name, field] : inputs) {
    SCOPED_TRACE(name);
    flashcore_attention_params bad = p;
    bad.*field = nullptr;
    expect_error(&bad, FLASHCORE_ERROR_NULL_POINTER, {name});
  }
  for (const auto& [name, field] : outputs) {
    SCOPED_TRACE(name);
    flashcore_attention_params bad = p;
    bad.*field = nullptr;
    expect_error(&bad, FLASHCORE_ERROR_NULL_POINTER, {name});
  }
}

// ---- MISALIGNED_POINTER ----
TEST_F(BackwardValidation, MisalignedGradientTensors) {
  for (int64_t by : {int64_t{2}, int64_t{8}}) {
    SCOPED_TRACE("by " + std::to_string(by) + " bytes");
    flashcore_attention_params bad = p;
    bad.dout = shifted(p.dout, by);
    expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {"dout"});
    bad = p;
    bad.dq = shifted(p.dq, by);
    expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {"dq"});
    bad = p;
    bad.dk = shifted(p.dk, by);
    expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {"dk"});
    bad = p;
    bad.dv = shifted(p.dv, by);
    expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {"dv"});
  }
}

// ---- INVALID_STRIDE ----
TEST_F(BackwardValidation, GradientStrides) {
  const std::pair<const char*, flashcore_tensor_strides flashcore_attention_params::*> tensors[] = {
      {"dout", &flashcore_attention_params::dout_strides},
      {"dq", &flashcore_attention_params::dq_strides},
      {"dk", &flashcore_attention_params::dk_strides},
      {"dv", &flashcore_attention_params::dv_strides}};
  struct Bad {
    const char* dim;
    int64_t flashcore_tensor_strides::*stride;
    int64_t value;
    const char* why;
  };
  const Bad bads[] = {
      {"dim", &flashcore_tensor_strides::dim, 2, "dim stride != 1"},
      {"dim", &flashcore_tensor_strides::dim, 0, "dim stride 0"},
      {"dim", &flashcore_tensor_strides::dim, -1, "dim stride -1"},
      {"seq", &flashcore_tensor_strides::seq, -8, "negative"},
      {"head", &flashcore_tensor_strides::head, -64, "negative"},
      {"batch", &flashcore_tensor_strides::batch, -1024, "negative"},
      {"seq", &flashcore_tensor_strides::seq, 0, "zero for a sequence of more than one row"},
      {"head", &flashcore_tensor_strides::head, 0, "zero for more than one head"},
      {"batch", &flashcore_tensor_strides::batch, 0, "zero for a batch of more than one"},
      {"seq", &flashcore_tensor_strides::seq, 12, "not a multiple of 8 elements"},
      {"head", &flashcore_tensor_strides::head, 4, "not a multiple of 8 elements"},
      {"batch", &flashcore_tensor_strides::batch, 100003, "not a multiple of 8 elements"},
  };
  for (const auto& [name, strides] : tensors) {
    for (const Bad& bad_stride : bads) {
      const std::string field = std::string(name) + "_strides." + bad_stride.dim;
      SCOPED_TRACE(field + " = " + std::to_string(bad_stride.value) + " (" + bad_stride.why + ")");
      flashcore_attention_params bad = p;
      (bad.*strides).*(bad_stride.stride) = bad_stride.value;
      expect_error(&bad, FLASHCORE_ERROR_INVALID_STRIDE, {field});
    }
  }
}

TEST_F(BackwardValidation, ZeroStrideIsFineForASizeOneDimension) {
  p.batch = 1;
  p.num_heads_q = p.num_heads_kv = 1;
  for (flashcore_tensor_strides* s : {&p.q_strides, &p.k_strides, &p.v_strides, &p.o_strides, &p.dout_strides,
                                      &p.dq_strides, &p.dk_strides, &p.dv_strides}) {
    s->batch = 0;
    s->head = 0;
  }
  ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  expect_passes_argument_checks(p);
}

TEST_F(BackwardValidation, GradientLayoutsNeedNotBeTheInputs) {
  // Q, K, V, O in (B, S, H, D); dO and dQ in (B, H, S, D); dK and dV with padded rows and heads.
  p.dout_strides = p.dq_strides = {SQ * HQ * D, D, SQ * D, 1};
  p.dk_strides = p.dv_strides = {SK * HKV * (D + 16), HKV * (D + 16), D + 16, 1};
  expect_passes_argument_checks(p);
  // And the other way round: inputs in (B, H, S, D), gradients in (B, S, H, D).
  flashcore_attention_params q = p;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&q, 1), FLASHCORE_SUCCESS);
  q.dout_strides = q.dq_strides = {SQ * HQ * D, HQ * D, D, 1};
  q.dk_strides = q.dv_strides = {SK * HKV * D, HKV * D, D, 1};
  ASSERT_EQ(flashcore_attention_validate(&q), FLASHCORE_SUCCESS) << flashcore_last_error();
  expect_passes_argument_checks(q);
}

// ---- INVALID_ARGUMENT: deterministic, reserved3 ----
TEST_F(BackwardValidation, Deterministic) {
  for (int32_t bad : {2, -1, INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE(bad);
    p.deterministic = bad;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"deterministic"});
  }
  for (int32_t good : {0, 1}) {
    p.deterministic = good;
    expect_passes_argument_checks(p);
  }
}

TEST_F(BackwardValidation, Reserved3MustBeZero) {
  for (int32_t bad : {1, -1, INT32_MAX}) {
    SCOPED_TRACE(bad);
    p.reserved3 = bad;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"reserved3"});
  }
}

// ---- INVALID_ARGUMENT: what the forward takes and the backward does not yet ----
TEST_F(BackwardValidation, FeaturesTheBackwardDoesNotTakeYet) {
  using P = flashcore_attention_params;
  const int32_t* ints = reinterpret_cast<const int32_t*>(ints_->data());
  const std::pair<const char*, std::function<void(P&)>> features[] = {
      {"seqused_k", [&](P& x) { x.seqused_k = ints; }},
      {"cu_seqlens_q",
       [&](P& x) {
         x.cu_seqlens_q = ints + 16;
         x.total_q = SQ;
       }},
      {"cu_seqlens_k",
       [&](P& x) {
         x.cu_seqlens_k = ints + 32;
         x.total_k = SK;
       }},
      {"block_table",
       [&](P& x) {
         x.block_table = ints + 48;
         x.page_size = 16;
         x.num_pages = 2;
       }},
      {"kernel_config", [](P& x) { x.kernel_config = "128x128x2-pp-static"; }},
  };
  for (const auto& [name, set] : features) {
    SCOPED_TRACE(name);
    flashcore_attention_params with = p;
    set(with);
    ASSERT_EQ(flashcore_attention_validate(&with), FLASHCORE_SUCCESS) << "the forward takes it: " << flashcore_last_error();
    expect_error(&with, FLASHCORE_ERROR_INVALID_ARGUMENT, {name});
  }
}

TEST_F(BackwardValidation, KvAppendIsNotTaken) {
  // k_new needs seqused_k (itself not taken by the backward): the message names one of the two.
  p.k_new = k_new_->data();
  p.v_new = v_new_->data();
  p.seqlen_new = SEQLEN_NEW;
  p.k_new_strides = p.v_new_strides = {SEQLEN_NEW * HKV * D, HKV * D, D, 1};
  p.seqused_k = reinterpret_cast<const int32_t*>(ints_->data());
  ASSERT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << "the forward takes it: " << flashcore_last_error();
  const flashcore_status st = flashcore_attention_backward(&p, nullptr);
  const std::string message = flashcore_last_error();
  EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_status_string(st) << ": " << message;
  EXPECT_TRUE(names(message, "k_new") || names(message, "seqused_k")) << message;
  expect_untouched();
}

TEST_F(BackwardValidation, PrecisionMustBeNative) {
  for (int32_t precision : {FLASHCORE_PRECISION_FP8, FLASHCORE_PRECISION_INT8}) {
    SCOPED_TRACE(precision);
    flashcore_attention_params with = p;
    with.precision = precision;
    if (flashcore_attention_validate(&with) == FLASHCORE_SUCCESS) {
      expect_error(&with, FLASHCORE_ERROR_INVALID_ARGUMENT, {"precision"});
    } else {  // not compiled into this build: the forward's verdict
      expect_forward_verdict(with);
    }
  }
}

TEST_F(BackwardValidation, OutDtype) {
  const flashcore_dtype other = dtype == FLASHCORE_DTYPE_BF16 ? FLASHCORE_DTYPE_FP16 : FLASHCORE_DTYPE_BF16;
  // A 16-bit call with another out_dtype is the forward's error already (UNSUPPORTED_DTYPE naming out_dtype).
  p.out_dtype = other;
  expect_forward_verdict(p);
  EXPECT_TRUE(names(flashcore_last_error(), "out_dtype")) << flashcore_last_error();
  // With precision = FP8 the forward takes it; the backward takes neither.
  p.precision = FLASHCORE_PRECISION_FP8;
  if (flashcore_attention_validate(&p) == FLASHCORE_SUCCESS) {
    const flashcore_status st = flashcore_attention_backward(&p, nullptr);
    const std::string message = flashcore_last_error();
    EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT) << flashcore_status_string(st) << ": " << message;
    EXPECT_TRUE(names(message, "out_dtype") || names(message, "precision")) << message;
    expect_untouched();
  }
  // The input dtype named explicitly is the same as FLASHCORE_DTYPE_SAME.
  p.precision = FLASHCORE_PRECISION_NATIVE;
  p.out_dtype = dtype;
  expect_passes_argument_checks(p);
}

TEST_F(BackwardValidation, FlagsMustBeZero) {
  for (uint32_t flags : {FLASHCORE_FLAG_V_TRANSPOSED, 2u, 0x80000000u}) {
    SCOPED_TRACE(flags);
    p.flags = flags;
    expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"flags"});
  }
}

// ---- UNSUPPORTED_DTYPE / UNSUPPORTED_HEAD_DIM ----
TEST_F(BackwardValidation, Fp8DtypesAreNotTaken) {
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP8_E4M3, FLASHCORE_DTYPE_FP8_E5M2}) {
    SCOPED_TRACE(dt);
    flashcore_attention_params with = p;
    with.dtype = dt;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
    const flashcore_status forward = flashcore_attention_validate(&with);
    if (forward == FLASHCORE_SUCCESS) {
      expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype"});
    } else {  // not compiled (for this head dim): the forward's verdict
      expect_forward_verdict(with);
    }
  }
  p.dtype = FLASHCORE_DTYPE_FP32;  // no GPU kernel at all
  expect_error(FLASHCORE_ERROR_UNSUPPORTED_DTYPE, {"dtype"});
}

TEST_F(BackwardValidation, HeadDims) {
  for (int64_t hd : {int64_t{256}, int64_t{192}, int64_t{96}, int64_t{32}}) {
    if (hd != 32 && flashcore::backend::backward_compiled(dtype, static_cast<int>(hd))) continue;  // (sm90, below)
    SCOPED_TRACE(hd);
    flashcore_attention_params with = p;
    with.head_dim = hd;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
    expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim"});
  }
  // 64, 128 and (sm90, 0.9) 96, 192 and 256 pass where this build compiled their backward for the dtype.
  for (int64_t hd : {int64_t{64}, int64_t{96}, int64_t{128}, int64_t{192}, int64_t{256}}) {
    if (!flashcore::backend::backward_compiled(dtype, static_cast<int>(hd))) continue;
    SCOPED_TRACE(hd);
    flashcore_attention_params with = p;
    with.head_dim = hd;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
    expect_passes_argument_checks(with);
  }
}

// V with a head dim of its own: (192, 128) (MLA, sm90) passes where compiled, V, O, dO and dV read with 128 columns;
// another pair is refused naming head_dim_v.
TEST_F(BackwardValidation, HeadDimV) {
  flashcore_attention_params with = p;
  with.head_dim = 192, with.head_dim_v = 128;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
  if (flashcore::backend::backward_compiled(dtype, 192, 128)) {
    expect_passes_argument_checks(with);
  } else {
    expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim_v"});
  }
  with.head_dim = 128, with.head_dim_v = 64;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
  expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim_v"});
}

// The variants at the sm90 backend's other head dims (0.9): a softcap, a window, both, pass the argument checks where
// the head dim's variants' kernels are compiled (every sm90 head dim of the backward), and are refused naming head_dim
// and the variant where only its plain kernels are.
TEST_F(BackwardValidation, WideHeadDimsTakeTheVariantsWhereCompiled) {
  int checked = 0;
  for (int64_t hd : {int64_t{96}, int64_t{192}, int64_t{256}}) {
    if (!flashcore::backend::backward_compiled(dtype, static_cast<int>(hd))) continue;
    SCOPED_TRACE(hd);
    const bool variants = flashcore::backend::backward_compiled(dtype, static_cast<int>(hd), 0, true);
    flashcore_attention_params with = p;
    with.head_dim = hd;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&with, 0), FLASHCORE_SUCCESS);
    with.softcap = 30.f;
    if (variants) {
      expect_passes_argument_checks(with);
    } else {
      expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim", "softcap"});
    }
    with.local = 1, with.window_size_left = 16, with.window_size_right = 0;
    with.softcap = 0.f;
    if (variants) {
      expect_passes_argument_checks(with);
    } else {
      expect_error(&with, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM, {"head_dim", "window"});
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no backward of head dim 96, 192 or 256 in this build";
}

// ---- OVERLAPPING_OUTPUT ----
TEST_F(BackwardValidation, GradientsOverlappingTheirInputsOrEachOther) {
  // The output moves into the other tensor's buffer (every buffer holds head_dim 256, so the moved span stays inside
  // it and overlaps nothing else), except with LSE, a small buffer, which moves into the output's instead.
  const std::pair<const char*, const void*> others[] = {{"q", p.q},   {"k", p.k},   {"v", p.v},
                                                        {"o", p.o},   {"dout", p.dout}, {"lse", nullptr},
                                                        {"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}};
  const std::pair<const char*, void* flashcore_attention_params::*> outputs[] = {
      {"dq", &flashcore_attention_params::dq}, {"dk", &flashcore_attention_params::dk},
      {"dv", &flashcore_attention_params::dv}};
  for (const auto& [out_name, field] : outputs) {
    for (const auto& [other_name, other] : others) {
      if (std::string(out_name) == other_name) continue;
      for (int64_t offset : {int64_t{0}, int64_t{64}}) {  // at the same address, and partly
        SCOPED_TRACE(std::string(out_name) + " and " + other_name + " " + std::to_string(offset) + " bytes apart");
        flashcore_attention_params bad = p;
        if (other != nullptr) {
          bad.*field = const_cast<void*>(shifted(other, offset));
        } else {
          bad.lse = static_cast<float*>(shifted(p.*field, offset));
        }
        expect_error(&bad, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {out_name, other_name});
      }
    }
  }
}

TEST_F(BackwardValidation, OverlapsAtTheEnds) {
  // dq right after dO's last byte (spans are half-open) is fine; 16 bytes earlier it overlaps dO's last row.
  const int64_t q_bytes = B * SQ * HQ * D * 2;
  HostBuffer both(2 * static_cast<size_t>(q_bytes));
  p.dout = both.data();
  p.dq = both.data() + q_bytes;
  expect_passes_argument_checks(p);
  p.dq = both.data() + q_bytes - 16;
  const flashcore_status st = flashcore_attention_backward(&p, nullptr);
  EXPECT_EQ(st, FLASHCORE_ERROR_OVERLAPPING_OUTPUT) << flashcore_last_error();
  EXPECT_TRUE(names(flashcore_last_error(), "dq") && names(flashcore_last_error(), "dout")) << flashcore_last_error();
}

TEST_F(BackwardValidation, InputsMayShareMemory) {
  // dO, Q, K, V, O and LSE are read only: dO may alias O (or anything else read).
  p.dout = p.o;
  expect_passes_argument_checks(p);
}

// ---- dsinks (since 0.6): the sinks' gradient, an output of a backward with sinks ----
TEST_F(BackwardValidation, DsinksIsOptionalWithSinks) {
  p.sinks = sinks();
  expect_passes_argument_checks(p);  // dsinks NULL: not computed
  p.dsinks = dsinks();
  expect_passes_argument_checks(p);
  p.deterministic = 1;
  expect_passes_argument_checks(p);
}

TEST_F(BackwardValidation, DsinksNeedsSinks) {
  p.dsinks = dsinks();
  expect_error(FLASHCORE_ERROR_INVALID_ARGUMENT, {"dsinks", "sinks"});
  uint64_t bytes = 0;
  EXPECT_EQ(flashcore_attention_backward_workspace_size(&p, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(flashcore_last_error(), "dsinks")) << flashcore_last_error();
  // The forward ignores it.
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
}

TEST_F(BackwardValidation, MisalignedDsinks) {
  p.sinks = sinks();
  for (int64_t by : {int64_t{1}, int64_t{2}, int64_t{3}}) {
    SCOPED_TRACE("by " + std::to_string(by) + " bytes");
    flashcore_attention_params bad = p;
    bad.dsinks = static_cast<float*>(shifted(dsinks(), by));
    expect_error(&bad, FLASHCORE_ERROR_MISALIGNED_POINTER, {"dsinks"});
  }
  // float32: 4-byte alignment is enough (not the tensors' 16).
  for (int64_t by : {int64_t{4}, int64_t{8}, int64_t{12}}) {
    SCOPED_TRACE("by " + std::to_string(by) + " bytes");
    flashcore_attention_params good = p;
    good.dsinks = static_cast<float*>(shifted(dsinks(), by));
    expect_passes_argument_checks(good);
  }
}

TEST_F(BackwardValidation, DsinksOverlappingSinksOrTheGradients) {
  // dsinks spans num_heads_q floats: at sinks' address, 4 bytes into it or ending 4 bytes into it, and at, inside or
  // at the end of dq, dk and dv: OVERLAPPING_OUTPUT naming dsinks and the other.
  HostBuffer around(3 * HQ * 4);  // sinks in the middle third
  p.sinks = reinterpret_cast<const float*>(around.data() + HQ * 4);
  void* const sinks_at = around.data() + HQ * 4;
  const int64_t q_bytes = B * SQ * HQ * D * 2, kv_bytes = B * SK * HKV * D * 2;
  struct Place {
    const char* other;
    void* base;
    int64_t offset;
  };
  const Place places[] = {
      {"sinks", sinks_at, 0},       {"sinks", sinks_at, 4},          {"sinks", sinks_at, -(HQ * 4) + 4},
      {"dq", p.dq, 0},              {"dq", p.dq, 64},                {"dq", p.dq, q_bytes - 4},
      {"dk", p.dk, 0},              {"dk", p.dk, kv_bytes / 2},      {"dv", p.dv, 0},
      {"dv", p.dv, kv_bytes - 8},
  };
  for (const Place& place : places) {
    SCOPED_TRACE(std::string("dsinks at ") + place.other + " + " + std::to_string(place.offset) + " bytes");
    flashcore_attention_params bad = p;
    bad.dsinks = static_cast<float*>(shifted(place.base, place.offset));
    expect_error(&bad, FLASHCORE_ERROR_OVERLAPPING_OUTPUT, {"dsinks", place.other});
  }
  EXPECT_TRUE(around.untouched());
}

TEST_F(BackwardValidation, DsinksNextToSinksOrAGradientIsFine) {
  // Spans are half-open: dsinks right after sinks' last float, or right after dq's last element, overlaps nothing.
  HostBuffer both(2 * HQ * 4);
  p.sinks = reinterpret_cast<const float*>(both.data());
  p.dsinks = reinterpret_cast<float*>(both.data() + HQ * 4);
  expect_passes_argument_checks(p);
  // dsinks just before sinks.
  p.dsinks = reinterpret_cast<float*>(both.data());
  p.sinks = reinterpret_cast<const float*>(both.data() + HQ * 4);
  expect_passes_argument_checks(p);
  // Right after dq's last byte (dq's buffer holds head_dim 256, so the floats lie inside it and overlap nothing else).
  p.dsinks = static_cast<float*>(shifted(p.dq, B * SQ * HQ * D * 2));
  expect_passes_argument_checks(p);
  EXPECT_TRUE(both.untouched());
}

TEST_F(BackwardValidation, ForwardChecksComeBeforeTheDsinksRules) {
  // dsinks set without sinks (a backward error) and a forward error: the forward's verdict.
  p.dsinks = dsinks();
  flashcore_attention_params bad = p;
  bad.q_strides.seq = 12;
  expect_forward_verdict(bad);
  bad = p;
  bad.softcap = -1.0f;
  expect_forward_verdict(bad);
  bad = p;
  bad.attention_chunk = -1;  // the forward's rule (0 or a chunk length)
  expect_forward_verdict(bad);
}

// ---- workspace ----
TEST_F(BackwardValidation, WorkspaceSizeNeedsBytes) {
  EXPECT_EQ(flashcore_attention_backward_workspace_size(&p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_STRNE(flashcore_last_error(), "");
}

TEST_F(BackwardValidation, WorkspaceSizeAppliesTheForwardChecks) {
  uint64_t bytes = 0;
  flashcore_attention_params bad = p;
  bad.q = nullptr;
  EXPECT_EQ(flashcore_attention_backward_workspace_size(&bad, &bytes), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_TRUE(names(flashcore_last_error(), "q")) << flashcore_last_error();
  bad = p;
  bad.q_strides.seq = 12;
  EXPECT_EQ(flashcore_attention_backward_workspace_size(&bad, &bytes), FLASHCORE_ERROR_INVALID_STRIDE);
  EXPECT_TRUE(names(flashcore_last_error(), "q_strides.seq")) << flashcore_last_error();
}

TEST_F(BackwardValidation, Workspace) {
  if (workspace_size_unknown_here()) {
    GTEST_SKIP() << "flashcore_attention_backward_workspace_size needs a device here (" << flashcore_status_string(size_status)
                 << ": " << size_message << "); tests/gpu/test_backward.cpp checks the workspace rules on a GPU";
  }
  // At least the fp32 dQ accumulator (flashcore.h).
  EXPECT_GE(workspace_bytes, uint64_t(B * HQ * SQ * D * 4));
  // The query does not depend on the workspace fields (it is asked before there is a workspace).
  flashcore_attention_params none = p;
  none.workspace = nullptr;
  none.workspace_size = 0;
  uint64_t bytes = 0;
  ASSERT_EQ(flashcore_attention_backward_workspace_size(&none, &bytes), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(bytes, workspace_bytes);
  // No workspace, or too small a one: INVALID_ARGUMENT naming it.
  expect_error(&none, FLASHCORE_ERROR_INVALID_ARGUMENT, {});
  EXPECT_NE(std::string(flashcore_last_error()).find("workspace"), std::string::npos) << flashcore_last_error();
  for (uint64_t size : {workspace_bytes - 1, workspace_bytes / 2, uint64_t{16}}) {
    if (size >= workspace_bytes) continue;
    SCOPED_TRACE(size);
    flashcore_attention_params small = p;
    small.workspace_size = size;
    expect_error(&small, FLASHCORE_ERROR_INVALID_ARGUMENT, {});
    EXPECT_NE(std::string(flashcore_last_error()).find("workspace"), std::string::npos) << flashcore_last_error();
  }
  // Exactly the size, or more, is fine.
  expect_passes_argument_checks(p);
  p.workspace_size = workspace_bytes + 64;
  expect_passes_argument_checks(p);
}

// ---- struct sizes: the 0.3 layout and the sizes around it ----
TEST_F(BackwardValidation, V3SizedStructIsAcceptedAndItsBackwardFieldsAreDefaults) {
  // A 0.3 caller's struct ends at 480 bytes; what follows in its memory (junk that would be a non-NULL dout and
  // invalid strides) is never read: the backward sees the defaults, whose dout is NULL.
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xEE);
  std::memcpy(buf.data(), &p, FLASHCORE_ATTENTION_PARAMS_V3_SIZE);
  auto* v3 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v3->struct_size = FLASHCORE_ATTENTION_PARAMS_V3_SIZE;
  EXPECT_EQ(flashcore_attention_validate(v3), FLASHCORE_SUCCESS) << flashcore_last_error();
  expect_error(v3, FLASHCORE_ERROR_NULL_POINTER, {"dout"});
  // A 0.3-era error in it is still found first.
  v3->q_strides.seq = 12;
  expect_error(v3, FLASHCORE_ERROR_INVALID_STRIDE, {"q_strides.seq"});
  v3->q_strides = p.q_strides;
  // set_contiguous fills the strides it has, and nothing past them.
  ASSERT_EQ(flashcore_attention_params_set_contiguous(v3, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(v3->q_strides.seq, HQ * D);
  // The workspace query reads no more of it either (whatever it answers without the backward's fields).
  uint64_t bytes = 0;
  (void)flashcore_attention_backward_workspace_size(v3, &bytes);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V3_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xEE) << "byte " << i << " written past a 0.3 struct";
  }
}

TEST_F(BackwardValidation, NewerCallersZeroTailIsAccepted) {
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 16, 0);
  std::memcpy(buf.data(), &p, sizeof(p));
  auto* newer = reinterpret_cast<flashcore_attention_params*>(buf.data());
  newer->struct_size = static_cast<uint32_t>(buf.size());
  expect_passes_argument_checks(*newer);
  buf[sizeof(p) + 3] = 1;
  expect_error(newer, FLASHCORE_ERROR_INVALID_ARGUMENT, {});
  EXPECT_NE(std::string(flashcore_last_error()).find("byte " + std::to_string(sizeof(p) + 3)), std::string::npos)
      << flashcore_last_error();
}

// Sizes next to the 0.3 one are not layouts: rejected by the forward and the backward, naming the accepted ones.
TEST_F(BackwardValidation, SizesAroundV3AreRejected) {
  for (uint32_t size : {uint32_t{481}, uint32_t{484}, uint32_t{488}, uint32_t{512}, uint32_t{576}, uint32_t{640},
                        uint32_t{644}, uint32_t{647}}) {
    SCOPED_TRACE(size);
    std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0);
    std::memcpy(buf.data(), &p, sizeof(p));
    std::memcpy(buf.data(), &size, sizeof(size));
    const auto* sized = reinterpret_cast<const flashcore_attention_params*>(buf.data());
    EXPECT_EQ(flashcore_attention_validate(sized), FLASHCORE_ERROR_INVALID_ARGUMENT);
    expect_error(sized, FLASHCORE_ERROR_INVALID_ARGUMENT, {});
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("struct_size = " + std::to_string(size)), std::string::npos) << message;
    EXPECT_NE(message.find("480"), std::string::npos) << message;
  }
}

}  // namespace

// The header-only C++ layer (include/flashcore/flashcore.hpp), without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "api/params.h"
#include "cpu/configured_archs.h"
#include "flashcore/flashcore.hpp"
#include "gpu/gpu_skip.h"

namespace {

// Runs `call`, which must throw flashcore::Error with `status` and a message containing `needle`.
template <typename Call>
void expect_error(Call&& call, flashcore_status status, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no flashcore::Error thrown (expected '" << needle << "')";
  } catch (const flashcore::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Views over host vectors (stand-ins for device memory) for a compiled (dtype, head dim).
struct Problem {
  flashcore_dtype dtype;
  int64_t b = 2, sq = 16, sk = 32, hq = 4, hkv = 2, d = 0;
  std::vector<uint16_t> q, k, v, o;
  flashcore::TensorView qv, kv, vv, ov;

  explicit Problem(bool bhsd = false) {
    const flashcore::Capabilities caps = flashcore::capabilities();
    dtype = caps.dtypes.at(0);
    d = caps.head_dims.at(0);
    q.assign(b * sq * hq * d, 0x1234);
    k.assign(b * sk * hkv * d, 0);
    v.assign(b * sk * hkv * d, 0);
    o.assign(b * sq * hq * d, 0x5555);
    auto make = bhsd ? &flashcore::TensorView::bhsd : &flashcore::TensorView::bshd;
    qv = make(q.data(), dtype, b, sq, hq, d);
    kv = make(k.data(), dtype, b, sk, hkv, d);
    vv = make(v.data(), dtype, b, sk, hkv, d);
    ov = make(o.data(), dtype, b, sq, hq, d);
  }
  bool o_untouched() const {
    for (uint16_t x : o) {
      if (x != 0x5555) return false;
    }
    return true;
  }
};

void expect_strides(const flashcore::TensorView& t, int64_t batch, int64_t seq, int64_t head) {
  const flashcore_tensor_strides want{batch, seq, head, 1};
  EXPECT_EQ(std::vector<int64_t>({t.strides.batch, t.strides.seq, t.strides.head, t.strides.dim}),
            std::vector<int64_t>({want.batch, want.seq, want.head, want.dim}));
  EXPECT_EQ(t.numel(), t.batch * t.seq * t.heads * t.head_dim);
  EXPECT_EQ(t.offset(t.batch - 1, t.seq - 1, t.heads - 1, t.head_dim - 1), t.numel() - 1);  // dense
}

TEST(TensorView, BshdStrides) {
  const auto t = flashcore::TensorView::bshd(nullptr, FLASHCORE_DTYPE_FP16, 2, 5, 3, 64);
  expect_strides(t, 5 * 3 * 64, 3 * 64, 64);
  EXPECT_EQ(t.offset(1, 2, 1, 7), 1 * 960 + 2 * 192 + 64 + 7);
}

TEST(TensorView, BhsdStrides) {
  const auto t = flashcore::TensorView::bhsd(nullptr, FLASHCORE_DTYPE_BF16, 2, 5, 3, 128);
  expect_strides(t, 3 * 5 * 128, 128, 5 * 128);
  EXPECT_EQ(t.offset(1, 2, 1, 7), 1 * 1920 + 2 * 128 + 640 + 7);
}

TEST(TensorView, MatchesSetContiguous) {
  for (int bhsd = 0; bhsd < 2; ++bhsd) {
    Problem pr(bhsd == 1);
    const flashcore_attention_params from_views = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov);
    flashcore_attention_params from_c = from_views;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&from_c, bhsd), FLASHCORE_SUCCESS);
    for (auto member : {&flashcore_attention_params::q_strides, &flashcore_attention_params::k_strides,
                        &flashcore_attention_params::v_strides, &flashcore_attention_params::o_strides}) {
      EXPECT_EQ((from_views.*member).batch, (from_c.*member).batch);
      EXPECT_EQ((from_views.*member).seq, (from_c.*member).seq);
      EXPECT_EQ((from_views.*member).head, (from_c.*member).head);
      EXPECT_EQ((from_views.*member).dim, (from_c.*member).dim);
    }
  }
}

TEST(MakeParams, FillsEveryField) {
  Problem pr;
  float lse[1];
  const auto p = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov, {/*causal=*/true, /*softmax_scale=*/0.25f, lse});
  EXPECT_EQ(p.struct_size, sizeof(flashcore_attention_params));
  EXPECT_EQ(p.q, pr.q.data());
  EXPECT_EQ(p.k, pr.k.data());
  EXPECT_EQ(p.v, pr.v.data());
  EXPECT_EQ(p.o, pr.o.data());
  EXPECT_EQ(p.lse, lse);
  EXPECT_EQ(p.batch, pr.b);
  EXPECT_EQ(p.seqlen_q, pr.sq);
  EXPECT_EQ(p.seqlen_k, pr.sk);
  EXPECT_EQ(p.num_heads_q, pr.hq);
  EXPECT_EQ(p.num_heads_kv, pr.hkv);
  EXPECT_EQ(p.head_dim, pr.d);
  EXPECT_EQ(p.dtype, pr.dtype);
  EXPECT_EQ(p.causal, 1);
  EXPECT_EQ(p.softmax_scale, 0.25f);
  EXPECT_EQ(p.out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(p.lse_capacity, pr.b * pr.hq * pr.sq);
  EXPECT_EQ(p.kernel_config, nullptr);
}

TEST(MakeParams, MismatchedViewsThrow) {
  Problem pr;
  auto expect_invalid = [&](const flashcore::TensorView& q, const flashcore::TensorView& k,
                            const flashcore::TensorView& v, const flashcore::TensorView& o, const char* needle) {
    expect_error([&] { flashcore::make_params(q, k, v, o); }, FLASHCORE_ERROR_INVALID_ARGUMENT, needle);
  };
  auto k2 = pr.kv;
  k2.batch = 3;
  expect_invalid(pr.qv, k2, pr.vv, pr.ov, "batch sizes");
  auto v2 = pr.vv;
  v2.seq = 31;
  expect_invalid(pr.qv, pr.kv, v2, pr.ov, "seqlens of k and v");
  auto o2 = pr.ov;
  o2.heads = 2;
  expect_invalid(pr.qv, pr.kv, pr.vv, o2, "head counts of q and o");
  auto q2 = pr.qv;
  q2.dtype = pr.dtype == FLASHCORE_DTYPE_FP16 ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
  expect_invalid(q2, pr.kv, pr.vv, pr.ov, "dtypes");
  auto k3 = pr.kv;
  k3.head_dim = 32;
  expect_invalid(pr.qv, k3, pr.vv, pr.ov, "head dims");
}

TEST(Error, CarriesStatusAndMessage) {
  const flashcore::Error e(FLASHCORE_ERROR_INVALID_STRIDE, "q_strides.seq = 12");
  EXPECT_EQ(e.status(), FLASHCORE_ERROR_INVALID_STRIDE);
  EXPECT_STREQ(e.what(), "invalid stride: q_strides.seq = 12");
  EXPECT_NO_THROW(flashcore::check(FLASHCORE_SUCCESS));
  EXPECT_THROW(flashcore::check(FLASHCORE_ERROR_INTERNAL), flashcore::Error);
}

TEST(Validate, ThrowsWithTheCMessage) {
  Problem pr;
  EXPECT_NO_THROW(flashcore::validate(pr.qv, pr.kv, pr.vv, pr.ov));
  pr.qv.strides.seq = 12;
  expect_error([&] { flashcore::validate(pr.qv, pr.kv, pr.vv, pr.ov); }, FLASHCORE_ERROR_INVALID_STRIDE,
               "q_strides.seq = 12 is not a multiple of 8");
}

TEST(AttentionForward, ArgumentErrorsThrowBeforeDeviceAccess) {
  Problem pr;
  pr.kv.heads = pr.vv.heads = 3;  // 4 % 3 != 0
  expect_error([&] { flashcore::attention_forward(pr.qv, pr.kv, pr.vv, pr.ov, {true}); },
               FLASHCORE_ERROR_INVALID_HEAD_RATIO, "num_heads_q = 4");
  EXPECT_TRUE(pr.o_untouched());
}

TEST(AttentionForward, NoDeviceThrowsNoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  Problem pr;
  expect_error([&] { flashcore::attention_forward(pr.qv, pr.kv, pr.vv, pr.ov); }, FLASHCORE_ERROR_NO_DEVICE,
               "no CUDA device visible");
  EXPECT_TRUE(pr.o_untouched());
}

// The build configuration (tests/CMakeLists.txt passes FLASHCORE_DTYPES / FLASHCORE_HEAD_DIMS), as the truth
// the library's capabilities are held to: not derived from the library itself.
std::vector<flashcore_dtype> configured_dtypes() {
  std::vector<flashcore_dtype> out;
  const std::string list = "," FLASHCORE_TEST_DTYPES ",";
  for (auto [name, dt] : {std::pair{",fp16,", FLASHCORE_DTYPE_FP16}, std::pair{",bf16,", FLASHCORE_DTYPE_BF16},
                          std::pair{",e4m3,", FLASHCORE_DTYPE_FP8_E4M3}, std::pair{",e5m2,", FLASHCORE_DTYPE_FP8_E5M2}}) {
    if (list.find(name) != std::string::npos) out.push_back(dt);
  }
  return out;
}
// O's dtypes: each 16-bit input dtype, and both 16-bit dtypes when 8-bit kernels are built (they write either).
std::vector<flashcore_dtype> configured_out_dtypes() {
  const std::vector<flashcore_dtype> in = configured_dtypes();
  auto has = [&](flashcore_dtype dt) { return std::find(in.begin(), in.end(), dt) != in.end(); };
  std::vector<flashcore_dtype> out;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16}) {
    if (has(dt) || has(FLASHCORE_DTYPE_FP8_E4M3) || has(FLASHCORE_DTYPE_FP8_E5M2)) out.push_back(dt);
  }
  return out;
}
std::vector<int> configured_head_dims() {
  std::vector<int> out;
  const std::string list = "," FLASHCORE_TEST_HEAD_DIMS ",";
  for (int hd : {64, 96, 128, 192, 256}) {
    if (list.find("," + std::to_string(hd) + ",") != std::string::npos) out.push_back(hd);
  }
  return out;
}

// Compute capability of the current device asked from CUDA directly; 0 without a device.
int device_arch_from_cuda() {
  int count = 0, device = 0, major = 0, minor = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaGetDevice(&device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess;
  (void)cudaGetLastError();
  return ok ? major * 10 + minor : 0;
}

TEST(Capabilities, MatchBuildConfigurationAndDevice) {
  const flashcore::Capabilities caps = flashcore::capabilities();
  EXPECT_EQ(caps.dtypes, configured_dtypes());
  EXPECT_EQ(caps.head_dims, configured_head_dims());
  EXPECT_EQ(caps.out_dtypes, configured_out_dtypes());
  EXPECT_EQ(caps.archs, flashcore::testing::configured_archs());
  EXPECT_EQ(caps.device_arch, device_arch_from_cuda());
  if (std::getenv("FLASHCORE_BACKEND") == nullptr) {  // a forced backend is tested in test_backend_table.cpp
    const std::string backend = flashcore::testing::expected_backend(caps.device_arch);
    EXPECT_EQ(caps.device_supported, caps.device_arch > 0 && !backend.empty());
    EXPECT_EQ(caps.device_backend, backend);
  }
  EXPECT_EQ(caps.params_struct_size, sizeof(flashcore_attention_params));
  EXPECT_EQ(flashcore::version(), std::to_string(FLASHCORE_VERSION_MAJOR) + "." +
                                      std::to_string(FLASHCORE_VERSION_MINOR) + "." +
                                      std::to_string(FLASHCORE_VERSION_PATCH));
}

// ---- the growable params struct ----

// A valid problem's params (host buffers stand in for device memory: validation never touches them).
flashcore_attention_params valid_params(Problem& pr) {
  flashcore_attention_params p = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov);
  EXPECT_EQ(flashcore_attention_validate(&p), FLASHCORE_SUCCESS) << flashcore_last_error();
  return p;
}

// `p` in a buffer of `size` bytes, struct_size = size; bytes from `fill_from` to the end are set to `fill`.
std::vector<unsigned char> as_bytes(const flashcore_attention_params& p, size_t size, size_t fill_from,
                                    unsigned char fill) {
  std::vector<unsigned char> buf(std::max(size, sizeof(p)), 0);
  std::memcpy(buf.data(), &p, sizeof(p));
  for (size_t i = fill_from; i < buf.size(); ++i) buf[i] = fill;
  const uint32_t struct_size = static_cast<uint32_t>(size);
  std::memcpy(buf.data(), &struct_size, sizeof(struct_size));
  return buf;
}
const flashcore_attention_params* params_at(const std::vector<unsigned char>& buf) {
  return reinterpret_cast<const flashcore_attention_params*>(buf.data());
}

TEST(StructSize, LayoutConstants) {
  EXPECT_EQ(offsetof(flashcore_attention_params, out_dtype), 236u);
  EXPECT_EQ(flashcore::api::kParamsV1FieldBytes, 236u);
  EXPECT_GT(sizeof(flashcore_attention_params), size_t{FLASHCORE_ATTENTION_PARAMS_V1_SIZE});
  EXPECT_EQ(offsetof(flashcore_capabilities, params_struct_size), size_t{FLASHCORE_CAPABILITIES_V1_SIZE});
}

TEST(StructSize, InitSetsTheDefaultsOfTheNewFields) {
  flashcore_attention_params p;
  std::memset(&p, 0x5A, sizeof(p));
  flashcore_attention_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(p));
  EXPECT_EQ(p.out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(p.reserved, 0);
  EXPECT_EQ(p.lse_capacity, 0);
  EXPECT_EQ(p.workspace, nullptr);
  EXPECT_EQ(p.workspace_size, 0u);
  EXPECT_EQ(p.kernel_config, nullptr);
}

TEST(StructSize, InitWritesNoMoreThanTheCallersLayout) {
  // The exported flashcore_attention_params_init is what a 0.1 binary calls: 240 bytes, not one more.
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params) + 64, 0xC3);
  auto* p = reinterpret_cast<flashcore_attention_params*>(buf.data());
  (flashcore_attention_params_init)(p);  // the function, not the header's macro
  EXPECT_EQ(p->struct_size, uint32_t{FLASHCORE_ATTENTION_PARAMS_V1_SIZE});
  EXPECT_EQ(p->q_strides.dim, 1);
  for (size_t i = FLASHCORE_ATTENTION_PARAMS_V1_SIZE; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xC3) << i;
  // _sized with a newer caller's size: zeros past the known fields; nothing past struct_size.
  std::fill(buf.begin(), buf.end(), 0xC3);
  flashcore_attention_params_init_sized(p, sizeof(flashcore_attention_params) + 8);
  EXPECT_EQ(p->out_dtype, FLASHCORE_DTYPE_SAME);
  for (size_t i = sizeof(flashcore_attention_params); i < buf.size(); ++i) EXPECT_EQ(buf[i], i < sizeof(*p) + 8 ? 0 : 0xC3) << i;
  // A size no call accepts: nothing written, the reason recorded.
  std::fill(buf.begin(), buf.end(), 0xC3);
  flashcore_attention_params_init_sized(p, 100);
  EXPECT_NE(std::string(flashcore_last_error()).find("struct_size = 100"), std::string::npos);
  for (unsigned char b : buf) ASSERT_EQ(b, 0xC3);
}

TEST(StructSize, V1LayoutIsAcceptedAndItsTailIgnored) {
  Problem pr;
  flashcore_attention_params p = valid_params(pr);
  // Bytes 236.. of a 0.1 struct are padding (garbage) or beyond it: fill them with junk that would be invalid.
  const auto buf = as_bytes(p, FLASHCORE_ATTENTION_PARAMS_V1_SIZE, 236, 0xEE);
  EXPECT_EQ(flashcore_attention_validate(params_at(buf)), FLASHCORE_SUCCESS) << flashcore_last_error();

  flashcore_attention_params up;
  std::string message;
  ASSERT_EQ(flashcore::api::upgrade_params(params_at(buf), up, message), FLASHCORE_SUCCESS) << message;
  EXPECT_EQ(up.struct_size, sizeof(up));
  EXPECT_EQ(std::memcmp(reinterpret_cast<const unsigned char*>(&up) + 4, buf.data() + 4, 232), 0)
      << "the 0.1 fields are copied as they are";
  EXPECT_EQ(up.out_dtype, FLASHCORE_DTYPE_SAME);
  EXPECT_EQ(up.reserved, 0);
  EXPECT_EQ(up.lse_capacity, 0);
  EXPECT_EQ(up.workspace, nullptr);
  EXPECT_EQ(up.workspace_size, 0u);
  EXPECT_EQ(up.kernel_config, nullptr);

  // A bad stride in a 0.1 struct is still found.
  p.q_strides.seq = 12;
  const auto bad = as_bytes(p, FLASHCORE_ATTENTION_PARAMS_V1_SIZE, 236, 0xEE);
  EXPECT_EQ(flashcore_attention_validate(params_at(bad)), FLASHCORE_ERROR_INVALID_STRIDE);
  EXPECT_NE(std::string(flashcore_last_error()).find("q_strides.seq = 12"), std::string::npos) << flashcore_last_error();
}

TEST(StructSize, CurrentLayoutCopiesEveryField) {
  Problem pr;
  flashcore_attention_params p = valid_params(pr);
  p.lse_capacity = 77;
  p.workspace_size = 5;
  p.kernel_config = "default";
  flashcore_attention_params up;
  std::string message;
  ASSERT_EQ(flashcore::api::upgrade_params(&p, up, message), FLASHCORE_SUCCESS) << message;
  EXPECT_EQ(up.lse_capacity, 77);
  EXPECT_EQ(up.workspace_size, 5u);
  EXPECT_STREQ(up.kernel_config, "default");
  EXPECT_EQ(up.q, p.q);
  EXPECT_EQ(up.head_dim, p.head_dim);
}

TEST(StructSize, NewerCallerWithZeroTailIsAccepted) {
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  for (size_t extra : {size_t{1}, size_t{8}, size_t{64}, size_t{4096} - sizeof(p)}) {
    SCOPED_TRACE(extra);
    const auto buf = as_bytes(p, sizeof(p) + extra, sizeof(p), 0);
    EXPECT_EQ(flashcore_attention_validate(params_at(buf)), FLASHCORE_SUCCESS) << flashcore_last_error();
  }
}

TEST(StructSize, NewerCallerWithNonzeroTailIsRejectedNamingTheOffset) {
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  auto buf = as_bytes(p, sizeof(p) + 16, sizeof(p), 0);
  buf[sizeof(p) + 3] = 1;
  buf[sizeof(p) + 9] = 1;
  for (int forward = 0; forward < 2; ++forward) {
    const flashcore_status st =
        forward ? flashcore_attention_forward(params_at(buf), nullptr) : flashcore_attention_validate(params_at(buf));
    EXPECT_EQ(st, FLASHCORE_ERROR_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("byte " + std::to_string(sizeof(p) + 3)), std::string::npos) << message;
    EXPECT_NE(message.find("struct_size = " + std::to_string(sizeof(p) + 16)), std::string::npos) << message;
  }
  auto copy = buf;
  EXPECT_EQ(flashcore_attention_params_set_contiguous(reinterpret_cast<flashcore_attention_params*>(copy.data()), 0),
            FLASHCORE_ERROR_INVALID_ARGUMENT);
}

TEST(StructSize, OtherSizesAreRejectedNamingTheAcceptedOnes) {
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  for (size_t size : {size_t{0}, size_t{4}, size_t{236}, size_t{239}, size_t{241}, size_t{248}, sizeof(p) - 1,
                      size_t{4097}, size_t{0xFFFFFFFF}}) {
    SCOPED_TRACE(size);
    const auto buf = as_bytes(p, std::min<size_t>(size, 4096), sizeof(p), 0);
    auto sized = buf;
    const uint32_t struct_size = static_cast<uint32_t>(size);
    std::memcpy(sized.data(), &struct_size, sizeof(struct_size));
    EXPECT_EQ(flashcore_attention_validate(params_at(sized)), FLASHCORE_ERROR_INVALID_ARGUMENT);
    const std::string message = flashcore_last_error();
    EXPECT_NE(message.find("struct_size = " + std::to_string(size)), std::string::npos) << message;
    EXPECT_NE(message.find("240"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(sizeof(p))), std::string::npos) << message;
  }
}

TEST(StructSize, SetContiguousOnAV1StructWritesOnlyV1Fields) {
  // A 0.1 caller's struct: 240 bytes, followed here by canary bytes that must survive.
  flashcore_attention_params init;
  flashcore_attention_params_init(&init);
  std::vector<unsigned char> buf(FLASHCORE_ATTENTION_PARAMS_V1_SIZE + 64, 0xC3);
  std::memcpy(buf.data(), &init, flashcore::api::kParamsV1FieldBytes);
  auto* p = reinterpret_cast<flashcore_attention_params*>(buf.data());
  p->struct_size = FLASHCORE_ATTENTION_PARAMS_V1_SIZE;
  p->batch = 2, p->seqlen_q = 5, p->seqlen_k = 7, p->num_heads_q = 6, p->num_heads_kv = 3, p->head_dim = 64;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(p->q_strides.seq, 6 * 64);
  EXPECT_EQ(p->k_strides.batch, 7 * 3 * 64);
  EXPECT_EQ(p->o_strides.head, 64);
  for (size_t i = flashcore::api::kParamsV1FieldBytes; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC3) << "byte " << i << " written by set_contiguous on a 0.1 struct";
  }
}

// ---- capabilities of the 0.1 layout ----

TEST(Capabilities, V1SizeGetsTheV1FieldsAndNothingPastThem) {
  flashcore_capabilities full;
  flashcore_capabilities_init(&full);
  ASSERT_EQ(flashcore_get_capabilities(&full), FLASHCORE_SUCCESS) << flashcore_last_error();
  std::vector<unsigned char> buf(sizeof(flashcore_capabilities) + 16, 0xC3);
  const uint32_t v1 = FLASHCORE_CAPABILITIES_V1_SIZE;
  std::memcpy(buf.data(), &v1, sizeof(v1));
  ASSERT_EQ(flashcore_get_capabilities(reinterpret_cast<flashcore_capabilities*>(buf.data())), FLASHCORE_SUCCESS)
      << flashcore_last_error();
  std::memcpy(&full.struct_size, &v1, sizeof(v1));
  EXPECT_EQ(std::memcmp(buf.data(), &full, FLASHCORE_CAPABILITIES_V1_SIZE), 0) << "the 0.1 fields differ";
  for (size_t i = FLASHCORE_CAPABILITIES_V1_SIZE; i < buf.size(); ++i) {
    ASSERT_EQ(buf[i], 0xC3) << "byte " << i << " written past a 0.1 caller's struct";
  }
}

TEST(Capabilities, InBetweenSizesGetTheWholeFieldsThatFit) {
  std::vector<unsigned char> buf(sizeof(flashcore_capabilities), 0xC3);
  const uint32_t size = offsetof(flashcore_capabilities, out_dtypes) + 6;  // params_struct_size, num_out_dtypes, 6 bytes
  std::memcpy(buf.data(), &size, sizeof(size));
  auto* caps = reinterpret_cast<flashcore_capabilities*>(buf.data());
  ASSERT_EQ(flashcore_get_capabilities(caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  EXPECT_EQ(caps->struct_size, size);
  EXPECT_EQ(caps->params_struct_size, sizeof(flashcore_attention_params));
  EXPECT_EQ(caps->num_out_dtypes, static_cast<int32_t>(configured_out_dtypes().size()));
  for (size_t i = offsetof(flashcore_capabilities, out_dtypes); i < size; ++i) EXPECT_EQ(buf[i], 0) << i;
  for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xC3) << i;
}

TEST(Capabilities, SizesOutsideTheReleasedRangeAreRejected) {
  for (uint32_t size : {uint32_t{0}, uint32_t{FLASHCORE_CAPABILITIES_V1_SIZE - 1},
                        static_cast<uint32_t>(sizeof(flashcore_capabilities) + 1)}) {
    std::vector<unsigned char> buf(sizeof(flashcore_capabilities) + 8, 0);
    std::memcpy(buf.data(), &size, sizeof(size));
    EXPECT_EQ(flashcore_get_capabilities(reinterpret_cast<flashcore_capabilities*>(buf.data())),
              FLASHCORE_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(flashcore_last_error()).find("struct_size = " + std::to_string(size)), std::string::npos)
        << flashcore_last_error();
  }
  flashcore_capabilities_init(nullptr);  // must not crash
}

// ---- workspace_size, list_kernel_configs ----

TEST(WorkspaceSize, NullArguments) {
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  EXPECT_EQ(flashcore_attention_workspace_size(&p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("bytes is NULL"), std::string::npos);
  uint64_t bytes = 123;
  EXPECT_EQ(flashcore_attention_workspace_size(nullptr, &bytes), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("params is NULL"), std::string::npos);
  EXPECT_EQ(bytes, 0u);
}

TEST(WorkspaceSize, ValidatesArgumentsLikeForward) {
  Problem pr;
  flashcore_attention_params p = valid_params(pr);
  p.num_heads_kv = 3;
  uint64_t bytes = 0;
  EXPECT_EQ(flashcore_attention_workspace_size(&p, &bytes), FLASHCORE_ERROR_INVALID_HEAD_RATIO);
  EXPECT_NE(std::string(flashcore_last_error()).find("num_heads_q = 4"), std::string::npos);
}

TEST(WorkspaceSize, NoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  uint64_t bytes = 0;
  EXPECT_EQ(flashcore_attention_workspace_size(&p, &bytes), FLASHCORE_ERROR_NO_DEVICE);
  EXPECT_NE(std::string(flashcore_last_error()).find("no CUDA device visible"), std::string::npos);
}

// WorkspaceSize on a Hopper GPU (it needs device buffers): tests/gpu/test_kernel_configs.cpp.

TEST(Plan, NullArguments) {
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  EXPECT_EQ(flashcore_attention_plan(&p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("plan is NULL"), std::string::npos);
  flashcore_plan* plan = reinterpret_cast<flashcore_plan*>(&pr);  // overwritten with NULL on failure
  EXPECT_EQ(flashcore_attention_plan(nullptr, &plan), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(plan, nullptr);
  uint64_t bytes = 0;
  char name[8];
  EXPECT_EQ(flashcore_plan_workspace_size(nullptr, &bytes), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(flashcore_plan_config(nullptr, name, sizeof(name)), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(flashcore_attention_run(nullptr, &p, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("plan is NULL"), std::string::npos);
  flashcore_plan_destroy(nullptr);  // nothing
}

TEST(Plan, ValidatesArgumentsLikeForward) {
  Problem pr;
  flashcore_attention_params p = valid_params(pr);
  p.num_heads_kv = 3;
  flashcore_plan* plan = nullptr;
  EXPECT_EQ(flashcore_attention_plan(&p, &plan), FLASHCORE_ERROR_INVALID_HEAD_RATIO);
  EXPECT_NE(std::string(flashcore_last_error()).find("num_heads_q = 4"), std::string::npos);
  EXPECT_EQ(plan, nullptr);
}

TEST(Plan, NoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  Problem pr;
  const flashcore_attention_params p = valid_params(pr);
  flashcore_plan* plan = nullptr;
  EXPECT_EQ(flashcore_attention_plan(&p, &plan), FLASHCORE_ERROR_NO_DEVICE);
  EXPECT_EQ(plan, nullptr);
}

// Plans on a Hopper GPU (run against forward, reuse, mismatches): tests/gpu/test_plan.cpp.

TEST(StreamCaptureId, NullPointer) {
  EXPECT_EQ(flashcore_stream_capture_id(nullptr, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("capture_id is NULL"), std::string::npos);
}

TEST(StreamCaptureId, NoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  uint64_t id = 77;
  EXPECT_EQ(flashcore_stream_capture_id(nullptr, &id), FLASHCORE_ERROR_CUDA);
  EXPECT_EQ(id, 0u);
  EXPECT_NE(std::string(flashcore_last_error()).find("cudaStreamGetCaptureInfo"), std::string::npos);
}

// StreamCaptureId during real captures: tests/gpu/test_reliability.cpp.

TEST(ListKernelConfigs, NullAndBadArguments) {
  const char* names[4] = {};
  EXPECT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 64, 0, names, 4, nullptr), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_NE(std::string(flashcore_last_error()).find("count is NULL"), std::string::npos);
  int32_t count = 7;
  EXPECT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 64, 0, nullptr, 2, &count), FLASHCORE_ERROR_NULL_POINTER);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 64, 0, names, -1, &count), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 64, 2, names, 4, &count), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("causal = 2"), std::string::npos);
}

TEST(ListKernelConfigs, NoDevice) {
  if (flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "a CUDA device is visible; this test covers the GPU-less case";
  int32_t count = 7;
  EXPECT_EQ(flashcore_list_kernel_configs(FLASHCORE_DTYPE_BF16, 64, 0, nullptr, 0, &count), FLASHCORE_ERROR_NO_DEVICE);
  EXPECT_EQ(count, 0);
  EXPECT_NE(std::string(flashcore_last_error()).find("no CUDA device visible"), std::string::npos);
}

TEST(ListKernelConfigs, OnAHopperGpu) {
  FLASHCORE_REQUIRE_GPU();
  const flashcore::Capabilities caps = flashcore::capabilities();
  const std::vector<std::string> names = flashcore::kernel_configs(caps.dtypes.at(0), caps.head_dims.at(0), false);
  ASSERT_FALSE(names.empty());
  EXPECT_FALSE(names[0].empty());
  int32_t count = -1;
  EXPECT_EQ(flashcore_list_kernel_configs(caps.dtypes.at(0), 80, 0, nullptr, 0, &count), FLASHCORE_SUCCESS);
  EXPECT_EQ(count, 0) << "head_dim 80 is never compiled";
}

}  // namespace

// The backward's C++ layer: make_backward_params fills the backward's fields from the views and refuses a gradient
// view whose shape or dtype is not its tensor's.
TEST(MakeBackwardParams, FillsTheBackwardFields) {
  Problem pr;
  std::vector<uint16_t> dout(pr.o.size()), dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size());
  std::vector<float> lse(pr.b * pr.hq * pr.sq);
  const auto doutv = flashcore::TensorView::bshd(dout.data(), pr.dtype, pr.b, pr.sq, pr.hq, pr.d);
  const auto dqv = flashcore::TensorView::bshd(dq.data(), pr.dtype, pr.b, pr.sq, pr.hq, pr.d);
  const auto dkv = flashcore::TensorView::bhsd(dk.data(), pr.dtype, pr.b, pr.sk, pr.hkv, pr.d);
  const auto dvv = flashcore::TensorView::bshd(dv.data(), pr.dtype, pr.b, pr.sk, pr.hkv, pr.d);
  flashcore::BackwardOptions opt;
  opt.forward.causal = true;
  opt.forward.lse = lse.data();
  opt.deterministic = true;
  const flashcore_attention_params p =
      flashcore::make_backward_params(pr.qv, pr.kv, pr.vv, pr.ov, doutv, dqv, dkv, dvv, opt);
  EXPECT_EQ(p.dout, dout.data());
  EXPECT_EQ(p.dq, dq.data());
  EXPECT_EQ(p.dk, dk.data());
  EXPECT_EQ(p.dv, dv.data());
  EXPECT_EQ(p.dk_strides.seq, dkv.strides.seq);
  EXPECT_EQ(p.dq_strides.seq, dqv.strides.seq);
  EXPECT_EQ(p.deterministic, 1);
  EXPECT_EQ(p.causal, 1);
  EXPECT_EQ(p.lse, lse.data());
  EXPECT_EQ(p.local, 0);
  EXPECT_EQ(p.dsinks, nullptr);
  const auto wrong = flashcore::TensorView::bshd(dk.data(), pr.dtype, pr.b, pr.sq, pr.hkv, pr.d);  // q's length
  expect_error([&] { flashcore::make_backward_params(pr.qv, pr.kv, pr.vv, pr.ov, doutv, dqv, wrong, dvv, opt); },
               FLASHCORE_ERROR_INVALID_ARGUMENT, "dk");
}

// The variants through the C++ layer: window_size {-1, -1} is no window, any bound >= 0 sets local; softcap, sinks,
// attention_chunk and (backward) dsinks reach the C struct.
TEST(MakeParams, TheVariants) {
  Problem pr;
  const auto plain = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov);
  EXPECT_EQ(plain.local, 0);
  EXPECT_EQ(plain.softcap, 0.0f);
  EXPECT_EQ(plain.sinks, nullptr);
  EXPECT_EQ(plain.attention_chunk, 0);
  float sinks[4] = {}, dsinks[4] = {};
  flashcore::ForwardOptions f;
  f.window_size_left = 127;
  f.softcap = 30.0f;
  f.sinks = sinks;
  f.attention_chunk = 8192;
  const auto p = flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov, f);
  EXPECT_EQ(p.attention_chunk, 8192);
  EXPECT_EQ(p.local, 1);
  EXPECT_EQ(p.window_size_left, 127);
  EXPECT_EQ(p.window_size_right, -1);
  EXPECT_EQ(p.softcap, 30.0f);
  EXPECT_EQ(p.sinks, sinks);
  f.window_size_left = -1;
  f.window_size_right = 0;
  EXPECT_EQ(flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov, f).local, 1);
  f.window_size_right = -1;
  EXPECT_EQ(flashcore::make_params(pr.qv, pr.kv, pr.vv, pr.ov, f).local, 0);

  std::vector<uint16_t> dout(pr.o.size()), dq(pr.q.size()), dk(pr.k.size()), dv(pr.v.size());
  flashcore::BackwardOptions opt;
  opt.forward = f;
  opt.dsinks = dsinks;
  const auto b = flashcore::make_backward_params(
      pr.qv, pr.kv, pr.vv, pr.ov, flashcore::TensorView::bshd(dout.data(), pr.dtype, pr.b, pr.sq, pr.hq, pr.d),
      flashcore::TensorView::bshd(dq.data(), pr.dtype, pr.b, pr.sq, pr.hq, pr.d),
      flashcore::TensorView::bshd(dk.data(), pr.dtype, pr.b, pr.sk, pr.hkv, pr.d),
      flashcore::TensorView::bshd(dv.data(), pr.dtype, pr.b, pr.sk, pr.hkv, pr.d), opt);
  EXPECT_EQ(b.sinks, sinks);
  EXPECT_EQ(b.dsinks, dsinks);
  EXPECT_EQ(b.softcap, 30.0f);
  EXPECT_EQ(b.attention_chunk, 8192);
}

// Head dims beyond 64 / 128 / 256 (issue #72) on the GPU, through the C ABI (check::run_case) against the float64
// reference with the suite's tolerance rule (check.h): head dims 96 and 192, and (head_dim, head_dim_v) = (192, 128), V's
// and O's head dim of its own (ABI 0.7, DeepSeek MLA prefill). Odd and unequal lengths (Sq > Sk: rows that see no
// key), GQA and MQA, both layouts, fp16 and bf16, a KV cache (seqused_k, NaN past it), packed and paged batches, a
// KV append whose V rows are shorter than K's, and the variants (window, softcap, sinks, chunks); bit-exact reruns.
// Also the refusals: the backward, 8-bit inputs and a kernel_config of another pair, each naming head_dim_v.
//
// Whichever backend serves the device runs these (FLASHCORE_BACKEND=sm80 selects the portable one on Hopper); a pair
// this build did not compile is skipped with the reason. Seeds: fixed per case name; FLASHCORE_SEED moves them.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "check/check.h"
#include "check/check_util.h"
#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

namespace check = flashcore::check;
using check::Case;
using flashcore::test::dtype_text;
using flashcore::test::report;

uint64_t case_seed(const std::string& name) { return flashcore::test::case_seed(name, 0x51ed27a3c4f1b0d9ull); }

struct Dims {
  int64_t d, dv;
};
const Dims kDims[] = {{96, 96}, {192, 192}, {192, 128}};
const flashcore_dtype kDtypes[] = {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16};

struct Param {
  std::string name;
  Case c;
};
void PrintTo(const Param& p, std::ostream* os) { *os << p.name << ": " << check::describe(p.c); }
std::string param_name(const testing::TestParamInfo<Param>& info) { return info.param.name; }

std::string dims_text(const Dims& dims) {
  return "d" + std::to_string(dims.d) + (dims.dv != dims.d ? "v" + std::to_string(dims.dv) : "");
}

Case dense(flashcore_dtype dt, const Dims& dims, bool causal, int64_t b, int64_t hq, int64_t hkv, int64_t sq,
           int64_t sk) {
  Case c;
  c.dtype = dt, c.head_dim = dims.d, c.head_dim_v = dims.dv, c.causal = causal;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.seqlen_k = sk;
  return c;
}

// Dense calls: seqlen 1, 17, 113, 4097, Sq != Sk both ways, decode against a long cache; GQA 4:2, 8:1 (MQA), equal
// heads; BSHD and BHSD.
std::vector<Param> dense_grid() {
  const struct { int64_t sq, sk, hq, hkv; } shapes[] = {{1, 1, 4, 2},       {17, 17, 8, 1},   {113, 113, 4, 4},
                                                        {4097, 4097, 4, 2}, {17, 1000, 4, 2}, {1000, 17, 8, 2},
                                                        {1, 4097, 8, 1},    {255, 2048, 4, 2}};
  std::vector<Param> out;
  int n = 0;
  for (const Dims& dims : kDims)
    for (flashcore_dtype dt : kDtypes)
      for (bool causal : {false, true})
        for (const auto& s : shapes) {
          Case c = dense(dt, dims, causal, s.sq * s.sk <= 65536 ? 2 : 1, s.hq, s.hkv, s.sq, s.sk);
          if (n++ % 2) c.layout = check::Layout::BHSD;
          out.push_back({std::string(dtype_text(dt)) + "_" + dims_text(dims) + (causal ? "_causal" : "_full") + "_q" +
                             std::to_string(s.sq) + "_k" + std::to_string(s.sk) + "_h" + std::to_string(s.hq) + "x" +
                             std::to_string(s.hkv) + (c.layout == check::Layout::BHSD ? "_bhsd" : ""),
                         c});
        }
  return out;
}

// Serving layouts: a KV cache (seqused_k), packed Q and K/V, paged caches of 16- and 64-row pages, packed Q on a paged
// cache.
std::vector<Param> serving_grid() {
  std::vector<Param> out;
  for (const Dims& dims : kDims)
    for (bool causal : {false, true}) {
      const std::string base = dims_text(dims) + (causal ? "_causal" : "_full");
      const flashcore_dtype dt = causal ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
      Case used = dense(dt, dims, causal, 3, 4, 2, 65, 700);
      used.seqused_k = {0, 333, 700};
      out.push_back({base + "_seqused", used});

      Case packed = dense(dt, dims, causal, 4, 4, 1, 300, 640);
      packed.varlen_q = {1, 17, 0, 300}, packed.varlen_k = {20, 17, 5, 640};
      out.push_back({base + "_packed", packed});

      for (int page : {16, 64}) {
        Case paged = dense(dt, dims, causal, 5, 8, 2, 1, 4097);
        paged.page_size = page, paged.seqused_k = {0, 1, 17, 113, 4097};
        out.push_back({base + "_paged" + std::to_string(page) + "_decode", paged});
      }
      Case chunked = dense(dt, dims, causal, 3, 4, 2, 200, 1000);
      chunked.page_size = 64, chunked.seqused_k = {9, 200, 1000}, chunked.varlen_q = {5, 200, 0};
      out.push_back({base + "_paged64_packed_q", chunked});

    }
  return out;
}

// The variants rows: a window with softcap, sinks with chunks, all of them on a packed batch.
std::vector<Param> variant_grid() {
  std::vector<Param> out;
  for (const Dims& dims : kDims)
    for (bool causal : {false, true}) {
      const std::string base = dims_text(dims) + (causal ? "_causal" : "_full");
      Case window = dense(FLASHCORE_DTYPE_BF16, dims, causal, 1, 4, 2, 1000, 1000);
      check::detail::with_window(window, 100, causal ? 0 : 7).softcap = 20.0f;
      out.push_back({base + "_window100_cap20", window});
      Case sinks = dense(FLASHCORE_DTYPE_FP16, dims, causal, 1, 4, 4, 400, 1000);
      sinks.sinks = check::detail::sink_logits(4), sinks.attention_chunk = causal ? 128 : 0;
      sinks.layout = check::Layout::BHSD;
      out.push_back({base + "_sinks" + (causal ? "_chunk128" : ""), sinks});
      Case packed = dense(FLASHCORE_DTYPE_BF16, dims, causal, 3, 4, 2, 300, 640);
      packed.varlen_q = {1, 300, 17}, packed.varlen_k = {640, 300, 5};
      check::detail::with_window(packed, 64, causal ? 0 : 64).sinks = check::detail::sink_logits(4);
      out.push_back({base + "_packed_window64_sinks", packed});
    }
  return out;
}

class HeadDims : public testing::TestWithParam<Param> {};

TEST_P(HeadDims, MatchesReferenceAndRerunsBitExact) {
  FLASHCORE_REQUIRE_GPU();
  const Param& prm = GetParam();
  const check::Result r = check::run_case(prm.c, case_seed(prm.name), /*repeats=*/2);
  if (r.skipped) GTEST_SKIP() << check::describe(prm.c) << ": " << r.message;
  std::printf("  %s\n", report(prm.c, r).c_str());
  EXPECT_TRUE(r.passed) << report(prm.c, r) << "\n  " << r.message;
  EXPECT_FALSE(r.unwritten) << r.message;
  EXPECT_FALSE(r.nonfinite) << r.message;
  EXPECT_FALSE(r.out_of_bounds_write) << r.message;
  EXPECT_TRUE(r.deterministic) << "reruns are not bit-identical: " << r.message;
}

INSTANTIATE_TEST_SUITE_P(Dense, HeadDims, testing::ValuesIn(dense_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Serving, HeadDims, testing::ValuesIn(serving_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Variants, HeadDims, testing::ValuesIn(variant_grid()), param_name);

// A (192, 128) call the library does not take returns UNSUPPORTED_HEAD_DIM (or INVALID_ARGUMENT for a kernel_config
// of another pair) naming head_dim_v, before any device work; the backward runs where it has the pair's kernel.
TEST(HeadDimsRefusals, NameHeadDimV) {
  FLASHCORE_REQUIRE_GPU();
  const int64_t B = 1, S = 64, H = 2, D = 192, DV = 128;
  flashcore::test::DeviceBuffer q(B * S * H * D * 2), k(B * S * H * D * 2), v(B * S * H * DV * 2), o(B * S * H * DV * 2);
  flashcore::test::DeviceBuffer lse(B * H * S * 4), dq(B * S * H * D * 2), dk(B * S * H * D * 2),
      dv(B * S * H * DV * 2), dout(B * S * H * DV * 2), ws(1 << 24);
  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = B, p.seqlen_q = p.seqlen_k = S, p.num_heads_q = p.num_heads_kv = H, p.head_dim = D, p.head_dim_v = DV;
  p.dtype = FLASHCORE_DTYPE_BF16;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  EXPECT_EQ(p.v_strides.seq, H * DV) << "set_contiguous gives V rows of head_dim_v";
  EXPECT_EQ(p.o_strides.seq, H * DV);
  EXPECT_EQ(p.k_strides.seq, H * D);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr, p.lse = static_cast<float*>(lse.ptr);
  if (!flashcore::testing::cuda_device_visible()) GTEST_SKIP() << "no CUDA device";
  const flashcore_status fwd = flashcore_attention_validate(&p);
  if (fwd == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM) GTEST_SKIP() << "(192, 128) not compiled: " << flashcore_last_error();
  ASSERT_EQ(fwd, FLASHCORE_SUCCESS) << flashcore_last_error();

  // The backward takes the pair where its kernel is compiled (the sm90 backend; its results: test_backward.cpp's
  // d192v128 cases); elsewhere (the portable backend) it is refused naming head_dim_v.
  flashcore_attention_params b = p;
  b.dout = dout.ptr, b.dq = dq.ptr, b.dk = dk.ptr, b.dv = dv.ptr;
  b.workspace = ws.ptr, b.workspace_size = 1 << 24;
  uint64_t bytes = 0;
  const flashcore_status bws = flashcore_attention_backward_workspace_size(&b, &bytes);
  if (bws == FLASHCORE_SUCCESS) {
    ASSERT_LE(bytes, uint64_t{1} << 24);
    EXPECT_EQ(flashcore_attention_backward(&b, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  } else {
    EXPECT_EQ(bws, FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
    EXPECT_NE(std::string(flashcore_last_error()).find("head_dim_v"), std::string::npos) << flashcore_last_error();
    EXPECT_EQ(flashcore_attention_backward(&b, nullptr), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
  }

  // 8-bit inputs and the 8-bit precisions.
  flashcore_attention_params e = p;
  e.dtype = FLASHCORE_DTYPE_FP8_E4M3;
  EXPECT_NE(flashcore_attention_validate(&e), FLASHCORE_SUCCESS);
  EXPECT_NE(std::string(flashcore_last_error()).find("head_dim"), std::string::npos) << flashcore_last_error();
  flashcore_attention_params f = p;
  f.precision = FLASHCORE_PRECISION_FP8;
  EXPECT_EQ(flashcore_attention_validate(&f), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
  EXPECT_NE(std::string(flashcore_last_error()).find("head_dim_v"), std::string::npos) << flashcore_last_error();

  // A pair that is not compiled, and a negative head_dim_v.
  flashcore_attention_params g = p;
  g.head_dim_v = 64;
  EXPECT_EQ(flashcore_attention_validate(&g), FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM);
  EXPECT_NE(std::string(flashcore_last_error()).find("(192, 64)"), std::string::npos) << flashcore_last_error();
  g.head_dim_v = -1;
  EXPECT_EQ(flashcore_attention_validate(&g), FLASHCORE_ERROR_INVALID_SIZE);
  EXPECT_NE(std::string(flashcore_last_error()).find("head_dim_v"), std::string::npos) << flashcore_last_error();

  // A kernel_config that no row of the pair has: the message names the pair's key.
  flashcore_attention_params h = p;
  h.kernel_config = "1x1x1-no-such-config";
  EXPECT_EQ(flashcore_attention_forward(&h, nullptr), FLASHCORE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcore_last_error()).find("head_dim_v = 128"), std::string::npos) << flashcore_last_error();
}

// A KV append whose V rows (head_dim_v) are shorter than K's: the cache gets exactly the new rows (K's 192 columns,
// V's 128, nothing past them), and the attention that follows equals the same call on a cache that already held them.
TEST(HeadDimsAppend, WritesShorterVRowsAndAttendsToThem) {
  FLASHCORE_REQUIRE_GPU();
  const int64_t B = 2, Sk = 300, Hq = 4, Hkv = 2, D = 192, DV = 128, New = 3, Sq = 3;
  const int32_t used[B] = {100, 296};
  auto bits = [](uint64_t i) { return static_cast<uint16_t>(0x3c00 ^ ((i * 2654435761ull >> 7) & 0x3ff)); };  // fp16
  auto filled = [&](int64_t n, uint64_t salt) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = bits(static_cast<uint64_t>(i) * 31 + salt);
    return v;
  };
  const std::vector<uint16_t> hq = filled(B * Sq * Hq * D, 1), hk = filled(B * Sk * Hkv * D, 2),
                              hv = filled(B * Sk * Hkv * DV, 3), hkn = filled(B * New * Hkv * D, 4),
                              hvn = filled(B * New * Hkv * DV, 5);
  // The cache with the new rows written in by hand: rows used[b] .. used[b] + New of sequence b.
  std::vector<uint16_t> ek = hk, ev = hv;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < New; ++t)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t row = used[b] + t;
        for (int64_t d = 0; d < D; ++d)
          ek[static_cast<size_t>(((b * Sk + row) * Hkv + h) * D + d)] = hkn[static_cast<size_t>(((b * New + t) * Hkv + h) * D + d)];
        for (int64_t d = 0; d < DV; ++d)
          ev[static_cast<size_t>(((b * Sk + row) * Hkv + h) * DV + d)] = hvn[static_cast<size_t>(((b * New + t) * Hkv + h) * DV + d)];
      }
  using flashcore::test::DeviceBuffer;
  auto upload = [](const std::vector<uint16_t>& host) {
    auto buf = std::make_unique<DeviceBuffer>(host.size() * 2);
    EXPECT_EQ(cudaMemcpy(buf->ptr, host.data(), host.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    return buf;
  };
  const auto q = upload(hq), k = upload(hk), v = upload(hv), kn = upload(hkn), vn = upload(hvn), k2 = upload(ek),
             v2 = upload(ev);
  DeviceBuffer o1(B * Sq * Hq * DV * 2), o2(B * Sq * Hq * DV * 2), lens(B * 4), lens2(B * 4);
  const int32_t after[B] = {used[0] + static_cast<int32_t>(New), used[1] + static_cast<int32_t>(New)};
  ASSERT_EQ(cudaMemset(o1.ptr, 0xff, B * Sq * Hq * DV * 2), cudaSuccess);  // poisoned: every element must be written
  ASSERT_EQ(cudaMemset(o2.ptr, 0xff, B * Sq * Hq * DV * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lens.ptr, used, sizeof used, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(lens2.ptr, after, sizeof after, cudaMemcpyHostToDevice), cudaSuccess);

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.batch = B, p.seqlen_q = Sq, p.seqlen_k = Sk, p.num_heads_q = Hq, p.num_heads_kv = Hkv, p.head_dim = D;
  p.head_dim_v = DV, p.dtype = FLASHCORE_DTYPE_FP16, p.causal = 1;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS);
  flashcore_attention_params ref = p;
  p.q = q->ptr, p.k = k->ptr, p.v = v->ptr, p.o = o1.ptr, p.seqused_k = static_cast<const int32_t*>(lens.ptr);
  p.k_new = kn->ptr, p.v_new = vn->ptr, p.seqlen_new = New;
  p.k_new_strides = {New * Hkv * D, Hkv * D, D, 1};
  p.v_new_strides = {New * Hkv * DV, Hkv * DV, DV, 1};
  const flashcore_status st = flashcore_attention_forward(&p, nullptr);
  if (st == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM) GTEST_SKIP() << flashcore_last_error();
  ASSERT_EQ(st, FLASHCORE_SUCCESS) << flashcore_last_error();
  ref.q = q->ptr, ref.k = k2->ptr, ref.v = v2->ptr, ref.o = o2.ptr, ref.seqused_k = static_cast<const int32_t*>(lens2.ptr);
  ASSERT_EQ(flashcore_attention_forward(&ref, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint16_t> got_k(hk.size()), got_v(hv.size()), out1(static_cast<size_t>(B * Sq * Hq * DV)), out2(out1.size());
  ASSERT_EQ(cudaMemcpy(got_k.data(), k->ptr, got_k.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_v.data(), v->ptr, got_v.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out1.data(), o1.ptr, out1.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out2.data(), o2.ptr, out2.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got_k, ek) << "K after the append";
  EXPECT_EQ(got_v, ev) << "V after the append (rows of head_dim_v)";
  EXPECT_EQ(out1, out2) << "O of the appending call differs from the same call on the filled cache";
}

// Capabilities list the pair, and listings of head dim 192 name only the rows whose V has 192 columns.
TEST(HeadDimsRefusals, CapabilitiesListThePair) {
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS);
  bool has_192 = false, has_pair = false;
  for (int i = 0; i < caps.num_head_dims; ++i) has_192 = has_192 || caps.head_dims[i] == 192;
  for (int i = 0; i < caps.num_head_dim_pairs; ++i) {
    has_pair = has_pair || (caps.head_dim_pairs[i][0] == 192 && caps.head_dim_pairs[i][1] == 128);
    EXPECT_NE(caps.head_dim_pairs[i][0], caps.head_dim_pairs[i][1]) << "pairs list only V head dims of their own";
  }
  if (!has_192) GTEST_SKIP() << "head dim 192 not compiled";
  EXPECT_TRUE(has_pair) << "the (192, 128) rows are compiled with head dim 192";
}

}  // namespace

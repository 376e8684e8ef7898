// The attention variants of ABI 0.5 (issue #72) on the GPU, through the C ABI (flashcore_attention_forward by way of
// check::run_case) against the float64 reference (reference::attention, with the suite's tolerance rule: check.h):
// sliding windows (local, window_size_left / _right) causal and not, softcap, sinks, attention_chunk (0.6.1), alone and
// together; Sq = Sk, Sq < Sk, Sq > Sk (rows that see no key: O = 0, LSE = -inf, or sinks[h] with sinks), seqlen 1,
// 17, 113 and 1000; GQA 8:2; fp16 and bf16; head dims 64 and 128 (a head dim or dtype this build did not compile is
// skipped with the reason); packed (cu_seqlens_q / _k), KV-cache (seqused_k) and paged calls with a window; LSE
// checked everywhere; bit-exact reruns. Also: every compiled kernel config runs the variants or refuses them naming
// the field, sinks far above the scores do not overflow, and a 0.4-sized struct (FLASHCORE_ATTENTION_PARAMS_V4_SIZE)
// runs as a call without variants whatever its memory holds past 648 bytes.
//
// Whichever backend serves the device runs these (FLASHCORE_BACKEND=sm80 selects the portable one on Hopper).
// Seeds: fixed per case name; FLASHCORE_SEED=<n> in the environment mixes in another base seed. Every failure
// message names its seed (check::run_case(case, seed) reproduces it).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

namespace check = flashcore::check;
using check::Case;
using flashcore::test::dtype_text;
using flashcore::test::max_of;
using flashcore::test::report;

uint64_t case_seed(const std::string& name) { return flashcore::test::case_seed(name, 0x9e3779b97f4a7c15ull); }

const flashcore_dtype kDtypes[] = {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16};
const int kHeadDims[] = {64, 128};

struct Param {
  std::string name;
  Case c;
};
void PrintTo(const Param& p, std::ostream* os) { *os << p.name << ": " << check::describe(p.c); }
std::string param_name(const testing::TestParamInfo<Param>& info) { return info.param.name; }

std::string bound_text(int32_t w) { return w < 0 ? std::string("inf") : std::to_string(w); }
std::string base_name(flashcore_dtype dt, int hd, bool causal) {
  return std::string(dtype_text(dt)) + "_d" + std::to_string(hd) + (causal ? "_causal" : "_full");
}

Case dense(flashcore_dtype dt, int hd, bool causal, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk) {
  Case c;
  c.dtype = dt, c.head_dim = hd, c.causal = causal, c.batch = b, c.heads_q = hq, c.heads_kv = hkv;
  c.seqlen_q = sq, c.seqlen_k = sk;
  return c;
}

Case& with_window(Case& c, int32_t left, int32_t right) {
  c.local = true, c.window_left = left, c.window_right = right;
  return c;
}

// Sink logits for `heads` query heads over [-3, 5]: some heads' sinks weigh little against O(1) scores, some take
// most of a row.
std::vector<float> sinks_for(int64_t heads) {
  std::vector<float> s(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) s[static_cast<size_t>(h)] = -3.0f + 2.0f * static_cast<float>(h % 5);
  return s;
}

// Shapes (Sq, Sk) the grids cycle through: square at 1, 17, 113 and 1000; Sq < Sk and Sq > Sk (causal: rows with no
// key); decode against a long cache; a long query block against one key.
const std::pair<int64_t, int64_t> kShapes[] = {{1000, 1000}, {113, 113}, {17, 17},   {1, 1},
                                               {113, 1000},  {1000, 113}, {1, 1000}, {17, 1}};

std::string shape_text(int64_t sq, int64_t sk) { return "_q" + std::to_string(sq) + "_k" + std::to_string(sk); }

// ---- the grids ----

// Windows x causal x dtype x head dim: the diagonal alone (0, 0), one key back (1, 0), left-only (16, -1),
// right-only (-1, 16), both (100, 7), and a left bound past every key (5000, 3); shapes and heads (GQA 8:2 or 2:2)
// cycle through the grid, so every window meets several shapes.
std::vector<Param> window_grid() {
  const std::pair<int32_t, int32_t> windows[] = {{0, 0}, {1, 0}, {16, -1}, {-1, 16}, {100, 7}, {5000, 3}};
  std::vector<Param> out;
  int n = 0;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true})
        for (const auto& [left, right] : windows) {
          const auto [sq, sk] = kShapes[static_cast<size_t>(n * 3) % std::size(kShapes)];
          const bool gqa = n % 2 == 0;
          Case c = dense(dt, hd, causal, sq * sk <= 65536 ? 2 : 1, gqa ? 8 : 2, 2, sq, sk);
          if (n % 5 == 4) c.layout = check::Layout::BHSD;
          with_window(c, left, right);
          out.push_back({base_name(dt, hd, causal) + "_win" + bound_text(left) + "x" + bound_text(right) +
                             shape_text(sq, sk) + (gqa ? "_gqa" : ""),
                         c});
          ++n;
        }
  return out;
}

// softcap 30 and 5, alone (30 also on inputs * 30: scores in the hundreds, every one capped) and with a window.
std::vector<Param> softcap_grid() {
  const std::pair<int64_t, int64_t> shapes[] = {{1000, 1000}, {113, 1000}, {1000, 113}, {17, 17}};
  std::vector<Param> out;
  int n = 0;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true}) {
        const auto [sq, sk] = shapes[static_cast<size_t>(n) % std::size(shapes)];
        for (float cap : {30.0f, 5.0f}) {
          Case c = dense(dt, hd, causal, 1, 8, 2, sq, sk);
          c.softcap = cap;
          if (cap == 30.0f && n % 2 == 0) c.input_scale = 30.0f;
          out.push_back({base_name(dt, hd, causal) + "_cap" + std::to_string(static_cast<int>(cap)) +
                             shape_text(sq, sk) + (c.input_scale != 1.0f ? "_x30" : ""),
                         c});
        }
        Case w = dense(dt, hd, causal, 1, 4, 2, 1000, 1000);
        with_window(w, 64, causal ? 0 : 32).softcap = 30.0f;
        out.push_back({base_name(dt, hd, causal) + "_cap30_win64", w});
        ++n;
      }
  return out;
}

// Sinks alone, with a window, on rows that see no key (causal Sq > Sk; a window (0, 0) with Sq > Sk), with GQA 8:2.
std::vector<Param> sinks_grid() {
  std::vector<Param> out;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true}) {
        const std::string base = base_name(dt, hd, causal);
        Case alone = dense(dt, hd, causal, 2, 4, 4, 113, 113);
        alone.sinks = sinks_for(4);
        out.push_back({base + "_sinks_q113_k113", alone});

        Case windowed = dense(dt, hd, causal, 1, 8, 2, 1000, 1000);
        with_window(windowed, 128, causal ? 0 : 16).sinks = sinks_for(8);
        out.push_back({base + "_sinks_win128_q1000_k1000_gqa", windowed});

        // Rows without a key: causal with Sq > Sk (its first 887 rows), or a window (0, 0) with Sq > Sk (the rows whose
        // diagonal key is negative), where O = 0 and LSE = sinks[h].
        Case empty_rows = dense(dt, hd, causal, 1, 4, 2, 1000, 113);
        if (!causal) with_window(empty_rows, 0, 0);
        empty_rows.sinks = sinks_for(4);
        out.push_back({base + (causal ? "_sinks" : "_sinks_win0x0") + "_q1000_k113_rows_without_keys", empty_rows});

        Case decode = dense(dt, hd, causal, 2, 8, 2, 1, 1000);
        decode.sinks = sinks_for(8);
        out.push_back({base + "_sinks_decode_q1_k1000_gqa", decode});
      }
  return out;
}

// Serving layouts with a variant: packed Q and K (cu_seqlens), packed Q against a dense KV cache (seqused_k), a dense
// KV cache, paged decode and paged chunked prefill; one sequence of each batch has no key.
std::vector<Param> serving_grid() {
  std::vector<Param> out;
  const std::vector<int32_t> lq = {1, 17, 0, 113, 300}, lk = {5, 0, 40, 113, 333};
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims) {
      const std::string base = std::string(dtype_text(dt)) + "_d" + std::to_string(hd);
      {
        Case c = dense(dt, hd, true, static_cast<int64_t>(lq.size()), 4, 2, max_of(lq), max_of(lk));
        c.varlen_q = lq, c.varlen_k = lk;
        with_window(c, 32, 0).sinks = sinks_for(4);
        out.push_back({base + "_causal_varlen_qk_win32_sinks", c});
      }
      {
        Case c = dense(dt, hd, false, static_cast<int64_t>(lq.size()), 4, 2, max_of(lq), 400);
        c.varlen_q = lq;
        c.seqused_k = {400, 17, 0, 200, 333};
        with_window(c, 64, 8).softcap = 20.0f;
        out.push_back({base + "_full_varlen_q_kvcache_win64x8_cap20", c});
      }
      {
        Case c = dense(dt, hd, true, 3, 8, 2, 64, 1000);
        c.seqused_k = {1000, 100, 0};
        with_window(c, 100, 0);
        out.push_back({base + "_causal_kvcache_win100", c});
      }
      {
        // Paged decode: caches of 0, 1, 17, 113 and 4097 keys in one batch, a window of 256 keys back.
        Case c = dense(dt, hd, true, 5, 8, 2, 1, 4097);
        c.page_size = 64, c.seqused_k = {0, 1, 17, 113, 4097};
        with_window(c, 256, 0).sinks = sinks_for(8);
        out.push_back({base + "_causal_paged_decode_win256_sinks", c});
      }
      {
        // Paged chunked prefill: packed queries against a paged cache, with a window.
        Case c = dense(dt, hd, true, 4, 4, 2, 33, 1500);
        c.page_size = 32, c.seqused_k = {0, 17, 600, 1500}, c.varlen_q = {4, 17, 33, 0};
        with_window(c, 200, 0);
        out.push_back({base + "_causal_paged_prefill_win200", c});
      }
    }
  return out;
}

// attention_chunk (Llama 4's chunked attention), causal and not: chunks of 1, 7, 64, 100, 128, 300 and 5000 keys
// (one key; smaller than a key block; a block; across block edges; a chunk past every key), on every shape of kShapes
// in turn (Sq > Sk: the rows whose diagonal position is negative see no key, also without causal); with a window,
// softcap or sinks on some; and chunked serving calls (packed Q and K, a KV cache, paged decode and paged chunked
// prefill).
std::vector<Param> chunk_grid() {
  const int32_t chunks[] = {1, 7, 64, 100, 128, 300, 5000};
  std::vector<Param> out;
  int n = 0;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true})
        for (int32_t chunk : chunks) {
          const auto [sq, sk] = kShapes[static_cast<size_t>(n * 5 + 1) % std::size(kShapes)];
          const bool gqa = n % 2 == 1;
          Case c = dense(dt, hd, causal, sq * sk <= 65536 ? 2 : 1, gqa ? 8 : 2, 2, sq, sk);
          c.attention_chunk = chunk;
          std::string what = "_chunk" + std::to_string(chunk);
          if (n % 4 == 1) {
            with_window(c, 40, causal ? 0 : 20);
            what += causal ? "_win40" : "_win40x20";
          }
          if (n % 5 == 2) c.softcap = 20.0f, what += "_cap20";
          if (n % 3 == 0) c.sinks = sinks_for(c.heads_q), what += "_sinks";
          if (n % 7 == 3) c.layout = check::Layout::BHSD;
          out.push_back({base_name(dt, hd, causal) + what + shape_text(sq, sk) + (gqa ? "_gqa" : ""), c});
          ++n;
        }
  const std::vector<int32_t> lq = {1, 17, 0, 113, 300}, lk = {5, 0, 40, 113, 333};
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims) {
      const std::string base = std::string(dtype_text(dt)) + "_d" + std::to_string(hd);
      {
        Case c = dense(dt, hd, true, static_cast<int64_t>(lq.size()), 4, 2, max_of(lq), max_of(lk));
        c.varlen_q = lq, c.varlen_k = lk, c.attention_chunk = 48;
        out.push_back({base + "_causal_varlen_qk_chunk48", c});
      }
      {
        Case c = dense(dt, hd, false, static_cast<int64_t>(lq.size()), 4, 2, max_of(lq), 400);
        c.varlen_q = lq, c.seqused_k = {400, 17, 0, 200, 333}, c.attention_chunk = 100;
        c.sinks = sinks_for(4);
        out.push_back({base + "_full_varlen_q_kvcache_chunk100_sinks", c});
      }
      {
        // Paged decode: caches of 0, 1, 17, 113 and 4097 keys, chunks of 1024 (the last query sees its cache's keys
        // from the start of their chunk only).
        Case c = dense(dt, hd, true, 5, 8, 2, 1, 4097);
        c.page_size = 64, c.seqused_k = {0, 1, 17, 113, 4097}, c.attention_chunk = 1024;
        out.push_back({base + "_causal_paged_decode_chunk1024", c});
      }
      {
        Case c = dense(dt, hd, true, 4, 4, 2, 33, 1500);
        c.page_size = 32, c.seqused_k = {0, 17, 600, 1500}, c.varlen_q = {4, 17, 33, 0}, c.attention_chunk = 256;
        with_window(c, 100, 0);
        out.push_back({base + "_causal_paged_prefill_chunk256_win100", c});
      }
    }
  return out;
}

// Everything at once, causal and not.
std::vector<Param> combined_grid() {
  std::vector<Param> out;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true}) {
        Case c = dense(dt, hd, causal, 2, 8, 2, 333, 777);
        with_window(c, 200, 50);
        c.softcap = 20.0f, c.sinks = sinks_for(8);
        if (causal) c.layout = check::Layout::BHSD;
        out.push_back({base_name(dt, hd, causal) + "_win200x50_cap20_sinks_q333_k777", c});
      }
  return out;
}

void expect_passes(const Case& c, const std::string& name, int repeats) {
  const check::Result r = check::run_case(c, case_seed(name), repeats);
  if (r.skipped) GTEST_SKIP() << check::describe(c) << ": " << r.message;
  std::printf("  %s\n", report(c, r).c_str());
  EXPECT_TRUE(r.passed) << report(c, r) << "\n  " << r.message;
  EXPECT_FALSE(r.unwritten) << r.message;
  EXPECT_FALSE(r.nonfinite) << r.message;
  EXPECT_FALSE(r.out_of_bounds_write) << r.message;
  EXPECT_TRUE(r.deterministic) << "reruns are not bit-identical: " << r.message;
}

}  // namespace

class AttentionVariant : public testing::TestWithParam<Param> {};

TEST_P(AttentionVariant, MatchesReferenceAndRerunsBitExact) {
  FLASHCORE_REQUIRE_GPU();
  expect_passes(GetParam().c, GetParam().name, /*repeats=*/2);
}

INSTANTIATE_TEST_SUITE_P(Window, AttentionVariant, testing::ValuesIn(window_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Softcap, AttentionVariant, testing::ValuesIn(softcap_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Sinks, AttentionVariant, testing::ValuesIn(sinks_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Serving, AttentionVariant, testing::ValuesIn(serving_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Combined, AttentionVariant, testing::ValuesIn(combined_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Chunk, AttentionVariant, testing::ValuesIn(chunk_grid()), param_name);

// Sinks far above every score (100: exp(100) overflows float32) take the whole row: O ~ 0 and LSE = 100; far below
// (-100) they take nothing. A kernel must keep the sink inside its running maximum to get there.
TEST(AttentionVariants, SinksFarFromTheScoresDoNotOverflow) {
  FLASHCORE_REQUIRE_GPU();
  int ran = 0;
  for (flashcore_dtype dt : kDtypes)
    for (int hd : kHeadDims)
      for (bool causal : {false, true}) {
        Case c = dense(dt, hd, causal, 1, 4, 2, 200, 300);
        c.sinks = {100.0f, -100.0f, 60.0f, 0.0f};
        const std::string name = base_name(dt, hd, causal) + "_extreme_sinks";
        const check::Result r = check::run_case(c, case_seed(name), 1);
        if (r.skipped) continue;
        ++ran;
        std::printf("  %s\n", report(c, r).c_str());
        EXPECT_TRUE(r.passed) << name << ": " << report(c, r) << "\n  " << r.message;
      }
  if (ran == 0) GTEST_SKIP() << "no fp16 / bf16 kernel of head dim 64 or 128 compiled in";
}

// Every kernel config compiled for the device (not only the one dispatch picks) either runs the variants correctly or
// refuses the call with an error that names the variant it does not take: a config must never ignore a mask.
TEST(AttentionVariants, EveryConfigRunsTheVariantsOrRefusesThem) {
  FLASHCORE_REQUIRE_GPU();
  int runs = 0, refused = 0;
  for (int hd : kHeadDims)
    for (bool causal : {false, true}) {
      std::vector<std::string> configs;
      ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, hd, causal, configs), FLASHCORE_SUCCESS)
          << flashcore_last_error();
      for (const std::string& config : configs) {
        if (flashcore::test::not_a_serving_config(config)) continue;  // test_variants.cpp's deliberately broken one
        Case c = dense(FLASHCORE_DTYPE_BF16, hd, causal, 2, 8, 2, 300, 1000);
        with_window(c, 150, 40);
        c.softcap = 20.0f, c.sinks = sinks_for(8), c.attention_chunk = 200;
        c.kernel_config = config.c_str();
        const std::string name = "config " + config + " d" + std::to_string(hd) + (causal ? " causal" : "");
        const check::Result r = check::run_case(c, case_seed(name), 1);
        if (r.skipped) continue;
        const bool call_refused = r.message.rfind("flashcore_attention_", 0) == 0;
        if (call_refused) {
          ++refused;
          const bool names_variant = r.message.find("local") != std::string::npos ||
                                     r.message.find("window") != std::string::npos ||
                                     r.message.find("softcap") != std::string::npos ||
                                     r.message.find("sinks") != std::string::npos ||
                                     r.message.find("attention_chunk") != std::string::npos;
          EXPECT_TRUE(names_variant) << name << " refused the call without naming a variant: " << r.message;
          continue;
        }
        ++runs;
        EXPECT_TRUE(r.passed) << name << ": " << report(c, r) << "\n  " << r.message;
      }
    }
  if (runs + refused == 0) GTEST_SKIP() << "no bf16 config of head dim 64 or 128 compiled in";
  std::printf("variant configs: %d run, %d refused\n", runs, refused);
  EXPECT_GT(runs, 0) << "every config refused the variants";
}

// A 0.4 caller (struct_size FLASHCORE_ATTENTION_PARAMS_V4_SIZE) runs as a call without variants, bit for bit, whatever
// its memory holds past the 0.4 fields (here bytes that would be local = 1, a window of 0 and a softcap, were they
// read); the same bytes in a current struct change the result (so the comparison can tell).
TEST(AttentionVariants, V4SizedStructRunsWithoutVariants) {
  FLASHCORE_REQUIRE_GPU();
  flashcore_capabilities caps;
  flashcore_capabilities_init(&caps);
  ASSERT_EQ(flashcore_get_capabilities(&caps), FLASHCORE_SUCCESS) << flashcore_last_error();
  if (caps.num_dtypes == 0 || caps.num_head_dims == 0) GTEST_SKIP() << "no kernel compiled in";
  flashcore_dtype dt = caps.dtypes[0];
  for (int i = 0; i < caps.num_dtypes; ++i)
    if (caps.dtypes[i] == FLASHCORE_DTYPE_BF16 || caps.dtypes[i] == FLASHCORE_DTYPE_FP16) dt = caps.dtypes[i];
  if (dt != FLASHCORE_DTYPE_BF16 && dt != FLASHCORE_DTYPE_FP16) GTEST_SKIP() << "no 16-bit kernel compiled in";
  const int64_t B = 1, S = 256, H = 2, D = caps.head_dims[0];
  const size_t elements = static_cast<size_t>(B * S * H * D), bytes = elements * 2;
  flashcore::test::DeviceBuffer q(bytes), k(bytes), v(bytes), o(bytes);
  std::vector<uint16_t> host(elements);
  uint32_t x = 12345;
  for (uint16_t& e : host) {  // small values of either 16-bit format (exponent bits well inside both ranges)
    x = x * 1664525u + 1013904223u;
    e = static_cast<uint16_t>((dt == FLASHCORE_DTYPE_BF16 ? 0x3c00u : 0x3000u) | ((x >> 16) & 0x03ffu) | ((x >> 8) & 0x8000u));
  }
  for (void* ptr : {q.ptr, k.ptr, v.ptr}) ASSERT_EQ(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr;
  p.batch = B, p.seqlen_q = p.seqlen_k = S, p.num_heads_q = p.num_heads_kv = H, p.head_dim = D, p.dtype = dt;
  ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
  auto run = [&](const flashcore_attention_params* params) {
    std::vector<uint16_t> out(elements);
    EXPECT_EQ(cudaMemset(o.ptr, 0xff, bytes), cudaSuccess);
    EXPECT_EQ(flashcore_attention_forward(params, nullptr), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), o.ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  };
  const std::vector<uint16_t> plain = run(&p);

  // The tail a 0.4 caller's memory might hold: local = 1, window (0, 0), softcap 2.
  flashcore_attention_params tail = p;
  tail.local = 1, tail.window_size_left = 0, tail.window_size_right = 0, tail.softcap = 2.0f;
  std::vector<unsigned char> buf(sizeof(flashcore_attention_params));
  std::memcpy(buf.data(), &tail, sizeof(tail));
  auto* v4 = reinterpret_cast<flashcore_attention_params*>(buf.data());
  v4->struct_size = FLASHCORE_ATTENTION_PARAMS_V4_SIZE;
  EXPECT_EQ(run(v4), plain) << "a 0.4-sized struct's bytes past 648 reached the kernel";
  EXPECT_NE(run(&tail), plain) << "the window and softcap changed nothing: the comparison above proves nothing";
}

// Packed variable-length batches (flashcore_attention_params::cu_seqlens_q / cu_seqlens_k, total_q / total_k)
// against the float64 reference, per sequence: varlen Q alone (dense K/V), varlen Q + K, and varlen Q + K with
// seqused_k (min(seqused_k[b], its length) keys); causal bottom-right per sequence; GQA / MQA; head dims 64, 128, 256;
// fp16 / bf16; sequences of 0 queries or 0 keys; guard rows around O and LSE that must keep their poison (a tile never
// writes past its sequence or the tensor); bit-exact reruns; every d128 config; and a CUDA graph replayed with new
// lengths (cu_seqlens are read on the device only).
//
// Seeds: fixed per case name; FLASHCORE_SEED=<n> in the environment mixes in another base seed. Every failure
// message names its seed (check::run_case(case, seed) reproduces it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/device_buffer.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

namespace check = flashcore::check;
using check::Case;

uint64_t case_seed(const std::string& name) { return flashcore::test::case_seed(name, 0xcbf29ce484222325ull); }

using flashcore::test::dtype_text;
using flashcore::test::max_of;
using flashcore::test::report;

void expect_passes(const Case& c, const std::string& name, int repeats) {
  const check::Result r = check::run_case(c, case_seed(name), repeats);
  if (r.skipped) GTEST_SKIP() << check::describe(c) << ": " << r.message;
  EXPECT_TRUE(r.passed) << report(c, r) << "\n  " << r.message;
  EXPECT_FALSE(r.out_of_bounds_write) << "a write landed outside O / LSE: " << r.message;
  EXPECT_FALSE(r.unwritten);
  EXPECT_FALSE(r.nonfinite);
  EXPECT_TRUE(r.deterministic) << "reruns are not bit-identical: " << r.message;
}

// Packed Q of lengths lq; packed K/V of lengths lk, or (lk empty) a dense K/V of dense_sk rows per sequence.
Case varlen_case(flashcore_dtype dt, int64_t hd, bool causal, int64_t hq, int64_t hkv, std::vector<int32_t> lq,
                 std::vector<int32_t> lk, int64_t dense_sk = 0) {
  Case c;
  c.dtype = dt, c.head_dim = hd, c.causal = causal, c.heads_q = hq, c.heads_kv = hkv;
  c.batch = static_cast<int64_t>(lq.size());
  c.seqlen_q = std::max(1, max_of(lq));  // the tight bound
  c.seqlen_k = lk.empty() ? dense_sk : std::max(1, max_of(lk));
  c.varlen_q = std::move(lq);
  c.varlen_k = std::move(lk);
  return c;
}

struct Param {
  std::string name;
  Case c;
};
void PrintTo(const Param& p, std::ostream* os) { *os << p.name << ": " << check::describe(p.c); }
std::string param_name(const testing::TestParamInfo<Param>& info) { return info.param.name; }

// Five sequences: a single query, 17, none, 113 (against 50 keys: causal rows with no key), 300.
const std::vector<int32_t> kLq5 = {1, 17, 0, 113, 300};
const std::vector<int32_t> kLk5 = {5, 0, 40, 50, 333};       // sequence 1: 17 queries, no key
const std::vector<int32_t> kLk5Long = {64, 17, 200, 113, 400};
const std::vector<int32_t> kUsed5 = {0, 20, 150, 113, 399};  // 20 > 17: min() gives 17; sequence 0: no key

std::vector<Param> varlen_grid() {
  std::vector<Param> out;
  const struct { int64_t hq, hkv; } heads[] = {{4, 4}, {8, 2}, {8, 1}};  // MHA, GQA 4, MQA
  const char* modes[] = {"q", "qk", "qk_used"};
  int n = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t hd : {64, 128, 256})
      for (bool causal : {false, true})
        for (int mode = 0; mode < 3; ++mode) {
          const auto h = heads[n % 3];
          Case c = mode == 0 ? varlen_case(dt, hd, causal, h.hq, h.hkv, kLq5, {}, 257)
                             : varlen_case(dt, hd, causal, h.hq, h.hkv, kLq5, mode == 1 ? kLk5 : kLk5Long);
          if (mode == 2) c.seqused_k = kUsed5;
          out.push_back({std::string(dtype_text(dt)) + "_d" + std::to_string(hd) + (causal ? "_causal_" : "_full_") +
                             modes[mode] + "_h" + std::to_string(h.hq) + "x" + std::to_string(h.hkv),
                         c});
          ++n;
        }
  return out;
}

std::vector<Param> varlen_extras() {
  std::vector<Param> out;
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  std::mt19937 rng(424242);
  std::uniform_int_distribution<int32_t> len(64, 1024);
  std::vector<int32_t> a(32), b(32), c32(32);
  for (auto* v : {&a, &b, &c32})
    for (int32_t& x : *v) x = len(rng);
  // 32 sequences of 64..1024 rows: self-attention prefill (q = k lengths, causal) and cross lengths.
  out.push_back({"batch32_prefill_bf16_d128_causal", varlen_case(BF16, 128, true, 8, 2, a, a)});
  out.push_back({"batch32_cross_fp16_d256_full", varlen_case(F16, 256, false, 4, 1, b, c32)});
  // Loose bounds: params.seqlen_q / seqlen_k above every sequence's length.
  {
    Case c = varlen_case(F16, 128, true, 4, 2, kLq5, kLk5);
    c.seqlen_q = 777, c.seqlen_k = 2000;
    out.push_back({"loose_bounds_fp16_d128_causal", c});
    Case d = varlen_case(BF16, 64, false, 2, 1, kLq5, {}, 300);
    d.seqlen_q = 4096;
    out.push_back({"loose_bound_q_only_bf16_d64_full", d});
  }
  // Head-major packed layout (num_heads, total, head_dim).
  {
    Case c = varlen_case(BF16, 128, true, 8, 2, kLq5, kLk5Long);
    c.layout = check::Layout::BHSD;
    c.seqused_k = kUsed5;
    out.push_back({"head_major_bf16_d128_causal_qk_used", c});
    Case d = varlen_case(F16, 256, false, 4, 4, kLq5, {}, 129);
    d.layout = check::Layout::BHSD;
    out.push_back({"head_major_fp16_d256_full_q", d});
  }
  // One sequence; only the last of four has rows; single-query sequences (decode-shaped, unsplit with varlen Q).
  out.push_back({"one_sequence_bf16_d128_causal", varlen_case(BF16, 128, true, 4, 2, {300}, {300})});
  out.push_back({"leading_empty_fp16_d64_causal", varlen_case(F16, 64, true, 4, 2, {0, 0, 0, 200}, {0, 7, 0, 250})});
  {
    std::vector<int32_t> ones(16, 1), keys(16);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int32_t>(i * 97 % 1500);
    out.push_back({"decode_rows_bf16_d128_causal", varlen_case(BF16, 128, true, 32, 8, ones, keys)});
  }
  // No LSE; large inputs with a non-default scale.
  {
    Case c = varlen_case(BF16, 256, true, 4, 2, kLq5, kLk5);
    c.with_lse = false;
    out.push_back({"no_lse_bf16_d256_causal", c});
    Case d = varlen_case(F16, 64, false, 4, 2, kLq5, kLk5Long);
    d.input_scale = 30.0f, d.softmax_scale = 0.3f;
    out.push_back({"large_inputs_fp16_d64_full", d});
  }
  return out;
}

class VarlenCase : public testing::TestWithParam<Param> {};

TEST_P(VarlenCase, MatchesReferenceAndRerunsBitExact) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  expect_passes(GetParam().c, GetParam().name, /*repeats=*/2);
}

INSTANTIATE_TEST_SUITE_P(Grid, VarlenCase, testing::ValuesIn(varlen_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Extras, VarlenCase, testing::ValuesIn(varlen_extras()), param_name);

// The varlen rows of check::cases (also run by ForwardCase) are in the full list; this checks that they are there.
TEST(Varlen, CaseListsHaveVarlenCases) {
  for (bool quick : {false, true}) {
    int varlen = 0;
    for (const Case& c : check::cases(quick)) varlen += c.varlen_q.empty() ? 0 : 1;
    EXPECT_GE(varlen, quick ? 2 : 10) << (quick ? "quick" : "full") << " list";
  }
}

// Every config compiled for bf16 d64, d128 and d256 (except the split-KV rows: num_splits > 1 is not available with
// cu_seqlens_q) on a varlen Q + K + seqused_k batch: one CTA per tile, static and dynamic persistent schedules.
TEST(Varlen, EveryConfigPasses) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  int runs = 0;
  for (int head_dim : {64, 128, 256}) {
    for (bool causal : {false, true}) {
      std::vector<std::string> configs;
      ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, head_dim, causal, configs), FLASHCORE_SUCCESS)
          << flashcore_last_error();
      for (const std::string& config : configs) {
        if (config.size() > 6 && config.compare(config.size() - 6, 6, "-split") == 0) continue;
        if (flashcore::test::not_a_serving_config(config)) continue;
        Case c = varlen_case(FLASHCORE_DTYPE_BF16, head_dim, causal, 8, 2, kLq5, kLk5Long);
        c.seqused_k = kUsed5;
        c.kernel_config = config.c_str();
        const check::Result r =
            check::run_case(c, case_seed("config " + config) + head_dim + (causal ? 1 : 0), /*repeats=*/1);
        if (r.skipped || flashcore::test::refused_for_layout(config, r, /*paged=*/false)) continue;
        ++runs;
        EXPECT_TRUE(r.passed) << "d" << head_dim << " " << config << ": " << report(c, r) << "\n  " << r.message;
      }
    }
  }
  if (runs == 0) GTEST_SKIP() << "no bf16 config ran";
  std::printf("varlen configs: %d case(s) run\n", runs);
}

// A packed batch runs the row configs.txt marks "packed" for its head dim and mask (sm90 backend.cpp, varlen_row), a
// dynamic one only when the call gives a workspace, else the default where it takes one CTA per tile: here the
// dynamic rows for d64 (192x128x3-pp-onecta without a workspace), at d128 the packed flavour of the dynamic vote rows
// (the onecta vote rows without a workspace).
TEST(Varlen, SelectsThePackedRows) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  const struct { int head_dim; bool causal; const char* expected; const char* with_workspace; } rows[] = {
      {64, false, "192x128x3-pp-onecta", "192x128x3-pp-dynamic"},
      {64, true, "192x128x3-pp-onecta", "192x128x3-pp-dynamic"},
      {128, false, "128x128x2-pp-onecta-vote", "128x128x2-pp-dynamic-vote-packed"},
      {128, true, "128x128x2-pp-onecta-vote", "128x128x2-pp-dynamic-vote-packed"},
  };
  // Q, K, V, O of (64 rows, 2 heads, head dim <= 128) bf16, 32 KB each, apart; then cu_seqlens, all 0 (valid, and
  // not read to select a row).
  constexpr size_t kPart = 64 << 10;
  flashcore::test::DeviceBuffer dev(5 * kPart);
  uint8_t* buf = static_cast<uint8_t*>(dev.ptr);
  ASSERT_EQ(cudaMemset(buf, 0, 5 * kPart), cudaSuccess);
  int run = 0;
  for (const auto& row : rows) {
    std::vector<std::string> configs;
    ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, row.head_dim, row.causal, configs),
              FLASHCORE_SUCCESS) << flashcore_last_error();
    if (configs.empty()) continue;  // head dim not compiled in
    flashcore_attention_params p;
    flashcore_attention_params_init(&p);
    p.q = buf, p.k = buf + kPart, p.v = buf + 2 * kPart, p.o = buf + 3 * kPart;
    p.batch = 2, p.seqlen_q = p.seqlen_k = 64, p.num_heads_q = p.num_heads_kv = 2, p.head_dim = row.head_dim;
    p.dtype = FLASHCORE_DTYPE_BF16, p.causal = row.causal ? 1 : 0;
    ASSERT_EQ(flashcore_attention_params_set_contiguous(&p, 0), FLASHCORE_SUCCESS) << flashcore_last_error();
    p.cu_seqlens_q = p.cu_seqlens_k = reinterpret_cast<const int32_t*>(buf + 4 * kPart);
    p.total_q = p.total_k = 64;
    char name[128] = "";
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_STREQ(name, row.expected) << "d" << row.head_dim << (row.causal ? " causal" : " non-causal");
    p.workspace = buf + 4 * kPart + 1024, p.workspace_size = 256;  // zero-filled, past cu_seqlens
    ASSERT_EQ(flashcore_attention_selected_config(&p, name, sizeof name), FLASHCORE_SUCCESS) << flashcore_last_error();
    EXPECT_STREQ(name, row.with_workspace) << "d" << row.head_dim << (row.causal ? " causal" : " non-causal")
                                           << ", with a workspace";
    ++run;
  }
  if (run == 0) GTEST_SKIP() << "neither head dim 64 nor 128 compiled in";
}

void expect_graph_passes(const Case& captured, const Case& replayed, const std::string& name) {
  const check::Result r = check::run_graph_replay(captured, replayed, case_seed(name));
  if (r.skipped) {
    std::printf("  %s skipped: %s\n", name.c_str(), r.message.c_str());
    return;
  }
  EXPECT_TRUE(r.passed) << name << ": " << report(replayed, r) << "\n  " << r.message;
}

// The dynamic rows on a packed batch of long sequences between short and empty ones: the producer passes over long
// runs of row-less query blocks (sm90 scheduler.cuh), with enough query blocks for the causal L2 sections
// (tile_math.h) and 6 query heads, so that a section holds parts of several sequences. Every real tile must run
// once (the whole-output scan finds a skipped one), and the rerun must be bit-identical (the counter is back at 0).
TEST(Varlen, DynamicRowsOnLongVariedBatches) {
  FLASHCORE_REQUIRE_BACKEND("sm90");  // sm90 config names
  const std::vector<int32_t> lens = {4096, 100, 0, 2500, 1, 3000, 900, 1800};
  // K/V of 1 MB per query head (2 x 4096 keys x head dim x 2 bytes / heads per KV head): 32 slices per section.
  const struct { int head_dim; bool causal; int64_t heads_kv; const char* config; } rows[] = {
      {64, false, 6, "192x128x3-pp-dynamic"},
      {64, true, 6, "192x128x3-pp-dynamic"},
      {128, false, 3, "128x128x2-pp-dynamic-vote-packed"},
      {128, true, 3, "128x128x2-pp-dynamic-vote-packed"},
  };
  int runs = 0;
  for (const auto& row : rows) {
    std::vector<std::string> configs;
    ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, row.head_dim, row.causal, configs),
              FLASHCORE_SUCCESS) << flashcore_last_error();
    if (std::find(configs.begin(), configs.end(), row.config) == configs.end()) continue;  // not compiled in
    Case c = varlen_case(FLASHCORE_DTYPE_BF16, row.head_dim, row.causal, 6, row.heads_kv, lens, lens);
    c.kernel_config = row.config;
    const std::string name = "long varied batch d" + std::to_string(row.head_dim) + (row.causal ? " causal" : "");
    const check::Result r = check::run_case(c, case_seed(name), /*repeats=*/2);
    ASSERT_FALSE(r.skipped) << name << ": " << r.message;
    ++runs;
    EXPECT_TRUE(r.passed) << name << ": " << report(c, r) << "\n  " << r.message;
    EXPECT_FALSE(r.unwritten) << name;
    EXPECT_TRUE(r.deterministic) << name << ": " << r.message;
  }
  if (runs == 0) GTEST_SKIP() << "no dynamic bf16 row compiled";
}

// One forward captured in a CUDA graph, replayed with the captured lengths, then with new cu_seqlens_q / cu_seqlens_k
// (and seqused_k) contents of the same totals: the lengths must be read on the device at replay time.
TEST(Varlen, GraphReplaysWithNewLengths) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  const std::vector<int32_t> lq2 = {300, 0, 113, 17, 1}, lk2 = {333, 50, 0, 40, 5};  // the same sums
  expect_graph_passes(varlen_case(FLASHCORE_DTYPE_BF16, 128, true, 8, 2, kLq5, kLk5),
                      varlen_case(FLASHCORE_DTYPE_BF16, 128, true, 8, 2, lq2, lk2), "graph qk");
  {
    Case a = varlen_case(FLASHCORE_DTYPE_FP16, 64, false, 4, 1, kLq5, kLk5Long);
    a.seqused_k = kUsed5;
    Case b = varlen_case(FLASHCORE_DTYPE_FP16, 64, false, 4, 1, {17, 1, 300, 0, 113}, {400, 200, 17, 113, 64});
    b.seqused_k = {5, 1, 0, 113, 64};
    expect_graph_passes(a, b, "graph qk used");
  }
  {
    // Varlen Q against a dense K/V, with new seqused_k.
    Case a = varlen_case(FLASHCORE_DTYPE_BF16, 256, true, 4, 2, kLq5, {}, 500);
    a.seqused_k = {500, 0, 17, 113, 300};
    Case b = varlen_case(FLASHCORE_DTYPE_BF16, 256, true, 4, 2, {113, 300, 1, 17, 0}, {}, 500);
    b.seqused_k = {1, 499, 0, 250, 500};
    expect_graph_passes(a, b, "graph q used");
  }
}

}  // namespace

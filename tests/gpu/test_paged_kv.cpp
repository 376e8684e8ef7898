// Paged KV caches (flashcore_attention_params::block_table, block_table_stride, page_size, num_pages) against the
// float64 reference: page sizes 16, 32, 64, 128, 256; cache lengths 0, 1, 17, 113 and 4097 in one batch (seqused_k);
// decode (Sq = 1, GQA 4 and 8: packed, and split-KV when the library takes it, num_splits 0 / 1 / 3 / 8), chunked
// prefill (Sq = 4, 17) and paged + packed variable-length Q; causal bottom-right per sequence; head dims 64, 128, 256;
// fp16 / bf16. The pool is scattered in a random page order, the table's entries past each sequence's pages are
// garbage (-1, INT32_MAX, ids past num_pages, ids of NaN pages), the pool's unused pages and the rows past each
// length are NaN: none of it may reach O or LSE. O and LSE have guards that must keep their poison. Bit-exact reruns,
// every d128 config, and CUDA graphs replayed with a new table, new lengths and new inputs.
//
// Seeds: fixed per case name; FLASHCORE_SEED=<n> in the environment mixes in another base seed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "check/check.h"
#include "flashcore/flashcore.h"
#include "gpu/gpu_skip.h"
#include "gpu/serving_test_util.h"

namespace {

namespace check = flashcore::check;
using check::Case;

uint64_t case_seed(const std::string& name) { return flashcore::test::case_seed(name, 0x84222325cbf29ce4ull); }

using flashcore::test::dtype_text;
using flashcore::test::max_of;
using flashcore::test::report;

int64_t table_width(int64_t seqlen_k, int page) { return (seqlen_k + page - 1) / page; }

// A paged cache of `used` keys per sequence (seqlen_k: the longest), queried by a dense Q of sq rows per sequence or,
// when lq is not empty, by a packed Q of those lengths.
Case paged_case(flashcore_dtype dt, int64_t hd, bool causal, int64_t hq, int64_t hkv, int64_t sq, int page,
                std::vector<int32_t> used, std::vector<int32_t> lq = {}) {
  Case c;
  c.dtype = dt, c.head_dim = hd, c.causal = causal, c.heads_q = hq, c.heads_kv = hkv;
  c.batch = static_cast<int64_t>(used.size());
  c.seqlen_q = lq.empty() ? sq : std::max(1, max_of(lq));
  c.seqlen_k = std::max(1, max_of(used));
  c.page_size = page;
  c.seqused_k = std::move(used);
  c.varlen_q = std::move(lq);
  return c;
}

struct Param {
  std::string name;
  Case c;
};
void PrintTo(const Param& p, std::ostream* os) { *os << p.name << ": " << check::describe(p.c); }
std::string param_name(const testing::TestParamInfo<Param>& info) { return info.param.name; }

const std::vector<int32_t> kCache5 = {0, 1, 17, 113, 4097};
const std::vector<int32_t> kChunkQ = {4, 17, 1, 0, 113};      // a chunk per sequence (0: a sequence not in this step)
const std::vector<int32_t> kChunkUsed = {0, 17, 1, 113, 4097};  // sequence 0: queries and no key yet

const int kPages[] = {16, 32, 64, 128, 256};
const int64_t kHeadDims[] = {64, 128, 256};

// Page size x (decode GQA 4, decode GQA 8, chunk of 4, chunk of 17) x causal: 40 cases, dtype and head dim cycling;
// every 5th a wider block table, every 7th a head-major pool (num_pages, heads_kv, page_size, head_dim).
std::vector<Param> paged_grid() {
  std::vector<Param> out;
  const struct { const char* name; int64_t sq, hq, hkv; } shapes[] = {
      {"decode_gqa4", 1, 8, 2}, {"decode_gqa8", 1, 16, 2}, {"chunk4", 4, 8, 2}, {"chunk17", 17, 4, 2}};
  int n = 0;
  for (int page : kPages)
    for (const auto& sh : shapes)
      for (bool causal : {false, true}) {
        const flashcore_dtype dt = n % 2 ? FLASHCORE_DTYPE_BF16 : FLASHCORE_DTYPE_FP16;
        const int64_t hd = kHeadDims[(n / 2) % 3];
        Case c = paged_case(dt, hd, causal, sh.hq, sh.hkv, sh.sq, page, kCache5);
        std::string name = std::string(dtype_text(dt)) + "_d" + std::to_string(hd) + "_page" + std::to_string(page) +
                           "_" + sh.name + (causal ? "_causal" : "_full");
        if (n % 5 == 3) {
          c.block_table_stride = table_width(c.seqlen_k, page) + 5;
          name += "_widetable";
        }
        if (n % 7 == 4) {
          c.layout = check::Layout::BHSD;
          name += "_headmajor";
        }
        out.push_back({name, c});
        ++n;
      }
  return out;
}

// Paged + packed Q (chunked prefill): dtype x head dim x causal, page sizes cycling.
std::vector<Param> paged_varlen_grid() {
  std::vector<Param> out;
  int n = 0;
  for (flashcore_dtype dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t hd : kHeadDims)
      for (bool causal : {false, true}) {
        const int page = kPages[n % 5];
        const int64_t hq = n % 2 ? 8 : 4, hkv = n % 3 ? 2 : 4;
        Case c = paged_case(dt, hd, causal, hq, hkv, 0, page, kChunkUsed, kChunkQ);
        std::string name = std::string(dtype_text(dt)) + "_d" + std::to_string(hd) + "_page" + std::to_string(page) +
                           "_varq_h" + std::to_string(hq) + "x" + std::to_string(hkv) + (causal ? "_causal" : "_full");
        if (n % 4 == 1) {
          c.block_table_stride = table_width(c.seqlen_k, page) + 1;
          name += "_widetable";
        }
        out.push_back({name, c});
        ++n;
      }
  return out;
}

std::vector<Param> paged_extras() {
  std::vector<Param> out;
  const flashcore_dtype F16 = FLASHCORE_DTYPE_FP16, BF16 = FLASHCORE_DTYPE_BF16;
  // Without seqused_k: every sequence uses all seqlen_k keys (1000: a partial last page).
  for (int page : {16, 64, 256}) {
    Case c = paged_case(page == 64 ? F16 : BF16, 128, page != 16, 8, 2, page == 256 ? 1 : 17, page, {1000, 1000, 1000});
    c.seqused_k.clear();
    out.push_back({"no_seqused_page" + std::to_string(page), c});
  }
  // num_splits on decode: 0 (the library's choice), 1 (never), 3 and 8 (at most that many parts).
  int n = 0;
  for (int splits : {0, 1, 3, 8})
    for (int gqa : {4, 8}) {
      Case c = paged_case(n % 2 ? F16 : BF16, kHeadDims[n % 3], n % 3 == 1, 2 * gqa, 2, 1, n % 2 ? 64 : 256, kCache5);
      c.num_splits = splits;
      out.push_back({"decode_splits" + std::to_string(splits) + "_gqa" + std::to_string(gqa), c});
      ++n;
    }
  // A loose seqlen_k (the table is 8192 keys wide, the longest cache 4097): many garbage entries per row.
  {
    Case c = paged_case(BF16, 128, true, 8, 2, 1, 16, kCache5);
    c.seqlen_k = 8192;
    out.push_back({"loose_seqlen_k_decode_page16", c});
    Case d = paged_case(F16, 64, true, 4, 4, 0, 32, kChunkUsed, kChunkQ);
    d.seqlen_k = 6000;
    out.push_back({"loose_seqlen_k_varq_page32", d});
  }
  // Many sequences, longer chunks; no LSE; MQA.
  {
    std::vector<int32_t> used(24), lq(24);
    for (size_t i = 0; i < used.size(); ++i) {
      used[i] = static_cast<int32_t>((i * 389) % 2500);
      lq[i] = static_cast<int32_t>((i * 37) % 150);
    }
    out.push_back({"batch24_varq_bf16_d128_causal_page64", paged_case(BF16, 128, true, 8, 2, 0, 64, used, lq)});
    Case c = paged_case(F16, 256, true, 8, 1, 17, 128, kCache5);
    c.with_lse = false;
    out.push_back({"no_lse_mqa_fp16_d256_page128", c});
  }
  // Pages that are not powers of two (any multiple of 16 is valid): key -> page by division, and key blocks cut in
  // slices of gcd(page, block_n) rows: 48 and 80 give slices of 16 (8 per 128-key block, a split row's table-warp
  // chunk holds two blocks), 96 slices of 32, 192 of 64 (a page straddles two 128-key blocks). Decode (split rows),
  // chunked prefill (the per-block reads) and a decode without cache lengths, each head dim.
  {
    int n = 0;
    for (int page : {48, 80, 96, 192})
      for (int64_t hd : kHeadDims) {
        const int k = n % 3 + n / 3;  // head dim + page: every head dim meets every variant and both masks
        const flashcore_dtype dt = n % 2 ? F16 : BF16;
        const bool causal = k % 2 == 1;
        const std::string tail = std::string(dtype_text(dt)) + "_d" + std::to_string(hd) + "_page" +
                                 std::to_string(page) + (causal ? "_causal" : "_full");
        out.push_back({"odd_page_decode_gqa4_" + tail, paged_case(dt, hd, causal, 8, 2, 1, page, kCache5)});
        if (k % 3 == 0) {
          out.push_back(
              {"odd_page_varq_" + tail, paged_case(dt, hd, causal, 4, 2, 0, page, kChunkUsed, kChunkQ)});
        }
        if (k % 3 == 2) {
          Case c = paged_case(dt, hd, causal, 16, 2, 1, page, {3000, 3000});
          c.seqused_k.clear();
          out.push_back({"odd_page_decode_gqa8_no_seqused_" + tail, c});
        }
        ++n;
      }
  }
  return out;
}

class PagedKvCase : public testing::TestWithParam<Param> {};

TEST_P(PagedKvCase, MatchesReferenceAndRerunsBitExact) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  const Case& c = GetParam().c;
  const check::Result r = check::run_case(c, case_seed(GetParam().name), /*repeats=*/2);
  if (r.skipped) GTEST_SKIP() << check::describe(c) << ": " << r.message;
  EXPECT_TRUE(r.passed) << report(c, r) << "\n  " << r.message;
  EXPECT_FALSE(r.out_of_bounds_write) << "a write landed outside O / LSE: " << r.message;
  EXPECT_FALSE(r.unwritten);
  EXPECT_FALSE(r.nonfinite) << "NaN from the pool (unused pages / rows, garbage table entries) reached O or LSE";
  EXPECT_TRUE(r.deterministic) << "reruns are not bit-identical: " << r.message;
}

INSTANTIATE_TEST_SUITE_P(PageSizes, PagedKvCase, testing::ValuesIn(paged_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(ChunkedPrefill, PagedKvCase, testing::ValuesIn(paged_varlen_grid()), param_name);
INSTANTIATE_TEST_SUITE_P(Extras, PagedKvCase, testing::ValuesIn(paged_extras()), param_name);

TEST(PagedKv, CaseListsHavePagedCases) {
  for (bool quick : {false, true}) {
    int paged = 0, paged_varlen = 0, splits = 0;
    for (const Case& c : check::cases(quick)) {
      paged += c.page_size > 0 ? 1 : 0;
      paged_varlen += c.page_size > 0 && !c.varlen_q.empty() ? 1 : 0;
      splits += c.num_splits > 1 ? 1 : 0;
    }
    EXPECT_GE(paged, quick ? 3 : 20) << (quick ? "quick" : "full") << " list";
    EXPECT_GE(paged_varlen, 1);
    EXPECT_GE(splits, 1);
  }
}

// Every config compiled for bf16 d128 on paged decode (GQA 4) and paged chunked prefill.
TEST(PagedKv, EveryD128ConfigPasses) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  int runs = 0;
  for (bool causal : {false, true}) {
    std::vector<std::string> configs;
    ASSERT_EQ(flashcore::test::kernel_configs(FLASHCORE_DTYPE_BF16, 128, causal, configs), FLASHCORE_SUCCESS)
        << flashcore_last_error();
    for (const std::string& config : configs) {
      if (flashcore::test::not_a_serving_config(config)) continue;
      for (int shape = 0; shape < 2; ++shape) {
        Case c = shape == 0 ? paged_case(FLASHCORE_DTYPE_BF16, 128, causal, 8, 2, 1, 64, kCache5)
                            : paged_case(FLASHCORE_DTYPE_BF16, 128, causal, 8, 2, 17, 32, {333, 0, 1000, 17});
        c.kernel_config = config.c_str();
        const check::Result r = check::run_case(c, case_seed("config " + config + std::to_string(shape * 2 + causal)), 1);
        if (r.skipped || flashcore::test::refused_for_layout(config, r, /*paged=*/true)) continue;
        ++runs;
        EXPECT_TRUE(r.passed) << config << ": " << report(c, r) << "\n  " << r.message;
      }
    }
  }
  if (runs == 0) GTEST_SKIP() << "no bf16 d128 config ran";
  std::printf("paged configs: %d case(s) run\n", runs);
}

void expect_graph_passes(const Case& captured, const Case& replayed, const std::string& name) {
  const check::Result r = check::run_graph_replay(captured, replayed, case_seed(name));
  if (r.skipped) {
    std::printf("  %s skipped: %s\n", name.c_str(), r.message.c_str());
    return;
  }
  EXPECT_TRUE(r.passed) << name << ": " << report(replayed, r) << "\n  " << r.message;
}

// One forward captured in a CUDA graph, replayed with the captured table, then with a new page order, new seqused_k
// (and, with varlen Q, new cu_seqlens_q of the same total) and new inputs: all read on the device at replay time.
TEST(PagedKv, GraphReplaysWithNewTableAndLengths) {
  FLASHCORE_REQUIRE_GPU();  // serving layouts: both backends (FLASHCORE_BACKEND=sm80 runs the portable one)
  // Decode, GQA 4 (packed, possibly split-KV), page 64.
  expect_graph_passes(paged_case(FLASHCORE_DTYPE_BF16, 128, false, 8, 2, 1, 64, kCache5),
                      paged_case(FLASHCORE_DTYPE_BF16, 128, false, 8, 2, 1, 64, {4097, 113, 0, 1, 17}), "graph decode");
  // Decode with num_splits = 3, GQA 8, causal, page 16.
  {
    Case a = paged_case(FLASHCORE_DTYPE_FP16, 64, true, 16, 2, 1, 16, kCache5);
    Case b = paged_case(FLASHCORE_DTYPE_FP16, 64, true, 16, 2, 1, 16, {2000, 4097, 1, 0, 300});
    a.num_splits = b.num_splits = 3;
    expect_graph_passes(a, b, "graph decode splits");
  }
  // Chunked prefill: paged + packed Q, page 256, new chunk lengths of the same total.
  expect_graph_passes(paged_case(FLASHCORE_DTYPE_BF16, 256, true, 4, 2, 0, 256, kChunkUsed, kChunkQ),
                      paged_case(FLASHCORE_DTYPE_BF16, 256, true, 4, 2, 0, 256, {4097, 0, 300, 17, 1},
                                 {113, 1, 0, 17, 4}),
                      "graph chunked prefill");
}

}  // namespace

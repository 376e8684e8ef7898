// The GPU case list itself (no device needed): it covers what the GPU suite must cover, stays affordable,
// and parse_shape / describe / checked_rows behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "check/check.h"
#include "reference/reference.h"

namespace check = flashcore::check;

namespace {

template <typename Pred>
bool any(const std::vector<check::Case>& list, Pred pred) {
  return std::any_of(list.begin(), list.end(), pred);
}

bool fully_masked_rows(const check::Case& c) { return c.causal && c.seqlen_q > c.seqlen_k; }

// The keys the reference reads for query row i of the case (it reads only the visible ones: a window or a chunk makes
// a long case cheap). Rows of a causal case without a variant count all seqlen_k keys, as they always have here.
int64_t keys_read(const check::Case& c, int64_t i) {
  if (!c.local && c.attention_chunk == 0) return c.seqlen_k;
  const flashcore::reference::KeyRange r =
      flashcore::reference::visible_key_range(check::mask_of(c), c.seqlen_q, c.seqlen_k, i);
  return r.end - r.begin;
}

}  // namespace

TEST(CheckCases, FullListCoversTheRequirements) {
  const auto list = check::cases(false);
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128, 256})
      for (bool causal : {false, true})
        EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.dtype == dt && c.head_dim == D && c.causal == causal; }))
            << "dtype " << dt << " D=" << D << " causal=" << causal;
  for (int64_t S : {1, 2, 17, 63, 64, 65, 113, 127, 128, 129, 255, 1000, 2048, 4097}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.seqlen_q == S && c.seqlen_k == S; })) << "S=" << S;
    // ...for every head dim, dtype and causal flag.
    for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
      for (int64_t D : {64, 128, 256})
        for (bool causal : {false, true})
          EXPECT_TRUE(any(list, [&](const check::Case& c) {
            return c.seqlen_q == S && c.seqlen_k == S && c.dtype == dt && c.head_dim == D && c.causal == causal;
          })) << "S=" << S << " dtype " << dt << " D=" << D << " causal=" << causal;
  }
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q < c.seqlen_k; }));
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q > c.seqlen_k; }));
  }
  EXPECT_TRUE(any(list, fully_masked_rows));
  for (int64_t ratio : {1, 2, 8})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.heads_kv > 1 && c.heads_q / c.heads_kv == ratio; }))
        << "GQA ratio " << ratio;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.heads_kv == 1 && c.heads_q > 1; })) << "MQA";
  for (auto layout : {check::Layout::BSHD, check::Layout::BHSD})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.layout == layout; }));
  for (int64_t B : {1, 7}) EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.batch == B; })) << "B=" << B;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.input_scale == 30.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softmax_scale != 0.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.with_lse; }));

  // The variants (ABI 0.5): windows causal and not (the diagonal alone, left-only, right-only, a left bound past every
  // key), softcap alone and with a window, sinks alone, with rows that see no key and with a window, serving layouts
  // with a variant, each dtype and head dim with a variant, and attention_chunk causal and not, with another variant,
  // with rows that see no key, packed and paged.
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return c.local && c.causal == causal && c.window_left == 0 && (causal || c.window_right == 0);
    })) << "window (0, 0), causal=" << causal;
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.local && c.causal == causal && c.window_right == -1; }));
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.local && c.causal == causal && c.window_left == -1; }));
    EXPECT_TRUE(any(list, [&](const check::Case& c) {
      return c.local && c.causal == causal && c.window_left > c.seqlen_k;
    })) << "a left bound past every key, causal=" << causal;
  }
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softcap > 0 && !c.local && c.sinks.empty(); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softcap > 0 && c.local; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softcap > 0 && c.input_scale == 30.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && !c.local && c.attention_chunk == 0; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && fully_masked_rows(c); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return !c.sinks.empty() && c.local; }));
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.attention_chunk > 0 && c.causal == causal; }))
        << "attention_chunk, causal=" << causal;
  }
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.local; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && !c.sinks.empty(); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.attention_chunk >= c.seqlen_k; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && fully_masked_rows(c); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && !c.varlen_q.empty(); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.attention_chunk > 0 && c.page_size > 0; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return check::has_variant(c) && !c.varlen_q.empty(); }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return check::has_variant(c) && c.page_size > 0; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return check::has_variant(c) && !c.seqused_k.empty(); }));
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128, 256})
      EXPECT_TRUE(any(list, [&](const check::Case& c) { return check::has_variant(c) && c.dtype == dt && c.head_dim == D; }))
          << "a variant with dtype " << dt << " D=" << D;
  for (const auto& c : list)
    if (!c.sinks.empty()) {
      EXPECT_EQ(static_cast<int64_t>(c.sinks.size()), c.heads_q) << c.name;
    }
}

TEST(CheckCases, QuickListIsSmallAndCoversDtypeHeadDimCausal) {
  const auto quick = check::cases(true);
  EXPECT_GE(quick.size(), 20u);
  EXPECT_LE(quick.size(), 44u);  // 24 dense, 6 serving, 1 ring, 4 variant, 6 head-dim (96, 192, 192/128) cases
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128, 256})
      for (bool causal : {false, true})
        EXPECT_TRUE(any(quick, [&](const check::Case& c) {
          return c.dtype == dt && c.head_dim == D && c.causal == causal && c.seqlen_q % 2 == 1;
        })) << "dtype " << dt << " D=" << D << " causal=" << causal;
  for (const auto& c : quick) EXPECT_LE(c.batch * c.heads_q * c.seqlen_q * c.seqlen_k, 64 * 1024) << check::describe(c);
  EXPECT_TRUE(any(quick, fully_masked_rows));
  EXPECT_TRUE(any(quick, [](const check::Case& c) { return c.local; }));
  EXPECT_TRUE(any(quick, [](const check::Case& c) { return c.softcap > 0; }));
  EXPECT_TRUE(any(quick, [](const check::Case& c) { return !c.sinks.empty(); }));
  EXPECT_FALSE(any(quick, [](const check::Case& c) { return c.attention_chunk != 0; }));
}

TEST(CheckCases, NamesAreUniqueAndSafe) {
  for (bool quick : {false, true}) {
    std::set<std::string> names;
    for (const auto& c : check::cases(quick)) {
      EXPECT_FALSE(c.name.empty());
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate name " << c.name;
      for (char ch : c.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
      EXPECT_EQ(c.heads_q % c.heads_kv, 0) << c.name;
    }
  }
}

TEST(CheckCases, FullListIsAffordable) {
  // Multiply-adds of the two host references (float64 and low precision) over the checked rows, plus
  // the input elements generated. Budget: well under a minute on 16 cores.
  double macs = 0, elements = 0;
  for (const auto& c : check::cases(false)) {
    auto rows = check::checked_rows(c, 1);
    if (rows.empty())
      for (int64_t i = 0; i < c.seqlen_q; ++i) rows.push_back(i);
    double keys = 0;
    for (int64_t i : rows) keys += static_cast<double>(keys_read(c, i));
    macs += 2.0 * 2.0 * static_cast<double>(c.batch * c.heads_q) * keys * static_cast<double>(c.head_dim);
    elements += static_cast<double>(c.batch * c.head_dim) *
                static_cast<double>(c.seqlen_q * c.heads_q * 2 + c.seqlen_k * c.heads_kv * 2);
  }
  std::printf("full list: %zu cases, %.3g reference multiply-adds, %.3g tensor elements\n", check::cases(false).size(),
              macs, elements);
  EXPECT_LT(macs, 4e10);  // 2.97e10 before the head dim 192 cases (0.58e10)
  EXPECT_LT(elements, 1e9);
}

TEST(CheckCases, CheckedRowsSampleLargeProblems) {
  check::Case small;
  small.seqlen_q = small.seqlen_k = 255;
  EXPECT_TRUE(check::checked_rows(small, 1).empty()) << "small problems check every row";

  check::Case big;
  big.seqlen_q = 4097, big.seqlen_k = 4097;
  const auto rows = check::checked_rows(big, 7);
  EXPECT_EQ(rows.size(), 64u);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  for (int64_t r : {0, 63, 64, 127, 128, 4096}) EXPECT_TRUE(std::count(rows.begin(), rows.end(), r)) << "row " << r;
  EXPECT_EQ(rows, check::checked_rows(big, 7)) << "deterministic for a seed";
  EXPECT_NE(rows, check::checked_rows(big, 8)) << "random part depends on the seed";

  check::Case masked = big;
  masked.seqlen_q = 4097, masked.seqlen_k = 113, masked.causal = true;
  const auto mrows = check::checked_rows(masked, 1);
  for (int64_t r : {4097 - 113 - 1, 4097 - 113}) EXPECT_TRUE(std::count(mrows.begin(), mrows.end(), r)) << "row " << r;
}

TEST(CheckCases, ParseShape) {
  check::Case c;
  c.dtype = FLASHCORE_DTYPE_FP16, c.causal = true;
  std::string err;
  ASSERT_TRUE(check::parse_shape("2,8,1024,128", c, err)) << err;
  EXPECT_EQ(c.batch, 2);
  EXPECT_EQ(c.heads_q, 8);
  EXPECT_EQ(c.heads_kv, 8);
  EXPECT_EQ(c.seqlen_q, 1024);
  EXPECT_EQ(c.seqlen_k, 1024);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.dtype, FLASHCORE_DTYPE_FP16) << "dtype is kept";
  EXPECT_TRUE(c.causal) << "causal is kept";
  ASSERT_TRUE(check::parse_shape("1,32,113,64,4,4097", c, err)) << err;
  EXPECT_EQ(c.heads_kv, 4);
  EXPECT_EQ(c.seqlen_k, 4097);
  EXPECT_FALSE(c.name.empty());

  const check::Case before = c;
  for (const char* bad : {"", "1,2,3", "1,2,3,4,5,6,7", "1,2,x,4", "1,2,3,4,", "0,2,3,4", "1,-2,3,4", "1,6,3,64,4",
                          "1,2,3,64 ", "1,,3,4", "99999999999999999999,1,1,64"}) {
    err.clear();
    EXPECT_FALSE(check::parse_shape(bad, c, err)) << "'" << bad << "'";
    EXPECT_FALSE(err.empty()) << "'" << bad << "'";
  }
  EXPECT_EQ(c.seqlen_k, before.seqlen_k) << "a failed parse leaves the case alone";
}

TEST(CheckCases, Describe) {
  check::Case c;
  c.dtype = FLASHCORE_DTYPE_BF16, c.batch = 2, c.heads_q = 8, c.heads_kv = 2, c.seqlen_q = 113, c.seqlen_k = 4097;
  c.head_dim = 128, c.causal = true, c.layout = check::Layout::BSHD;
  EXPECT_EQ(check::describe(c), "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 causal bshd");
  c.layout = check::Layout::BHSD, c.causal = false, c.input_scale = 30, c.softmax_scale = 0.5f;
  EXPECT_EQ(check::describe(c), "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 bhsd inputs*30 softmax_scale=0.5");
  EXPECT_FALSE(check::has_variant(c));
  c.local = true, c.window_left = 16, c.window_right = -1, c.softcap = 30, c.sinks.assign(8, 0.5f);
  c.attention_chunk = 64;
  EXPECT_TRUE(check::has_variant(c));
  EXPECT_EQ(check::describe(c), "bf16 B=2 Hq=8 Hkv=2 Sq=113 Sk=4097 D=128 bhsd inputs*30 softmax_scale=0.5 "
                                "window=(16,-1) softcap=30 sinks attention_chunk=64");
  c.causal = true;  // the right bound is 0 with causal, whatever window_right says
  EXPECT_NE(check::describe(c).find("window=(16,0)"), std::string::npos) << check::describe(c);
}

TEST(CheckCases, CheckedRowsOfVariantsIncludeWhereTheMaskChangesShape) {
  check::Case c;
  c.seqlen_q = 4097, c.seqlen_k = 4097, c.causal = true;
  c.local = true, c.window_left = 100;
  auto has = [](const std::vector<int64_t>& rows, int64_t r) { return std::count(rows.begin(), rows.end(), r) > 0; };
  auto rows = check::checked_rows(c, 3);
  EXPECT_EQ(rows.size(), 72u);
  for (int64_t r : {99, 100, 101}) EXPECT_TRUE(has(rows, r)) << "row " << r << ": the first whole windows";
  c.local = false, c.attention_chunk = 1000;
  rows = check::checked_rows(c, 3);
  for (int64_t r : {999, 1000, 1999, 2000, 2999, 3000}) EXPECT_TRUE(has(rows, r)) << "row " << r << ": chunk edges";
  // Sq < Sk: row i's diagonal key is i + 2097, so the first chunk edges in the rows are keys 3000 and 4000.
  c.seqlen_q = 2000;
  rows = check::checked_rows(c, 3);
  for (int64_t r : {902, 903, 1902, 1903}) EXPECT_TRUE(has(rows, r)) << "row " << r;
  // Sq > Sk: row 0's diagonal is -1000; the edge at key 0 is row 1000 (the first that sees a key), then 2000, 3000.
  c.seqlen_q = 4097, c.seqlen_k = 3097;
  rows = check::checked_rows(c, 3);
  for (int64_t r : {999, 1000, 1999, 2000, 2999, 3000}) EXPECT_TRUE(has(rows, r)) << "row " << r;
}

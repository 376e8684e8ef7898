// The backward's case list (src/check/check_bwd.h; no device needed): it covers the backward's v1 scope, stays
// affordable for the float64 reference, and its names are unique.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "check/check_bwd.h"

namespace check = flashcore::check;
namespace bwd = flashcore::check::bwd;

namespace {

template <typename Pred>
bool any(const std::vector<check::Case>& list, Pred pred) {
  return std::any_of(list.begin(), list.end(), pred);
}

bool fully_masked_rows(const check::Case& c) { return c.causal && c.seqlen_q > c.seqlen_k; }

}  // namespace

TEST(BwdCheckCases, FullListCoversTheBackwardScope) {
  const auto list = bwd::cases(false);
  for (int64_t S : {1, 17, 64, 65, 128, 129, 1000, 2048})
    for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
      for (int64_t D : {64, 128})
        for (bool causal : {false, true})
          EXPECT_TRUE(any(list, [&](const check::Case& c) {
            return c.seqlen_q == S && c.seqlen_k == S && c.dtype == dt && c.head_dim == D && c.causal == causal;
          })) << "S=" << S << " dtype " << dt << " D=" << D << " causal=" << causal;
  for (bool causal : {false, true}) {
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q < c.seqlen_k; }));
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.causal == causal && c.seqlen_q > c.seqlen_k; }));
  }
  EXPECT_TRUE(any(list, fully_masked_rows));
  for (int64_t ratio : {2, 8})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.heads_kv > 1 && c.heads_q / c.heads_kv == ratio; }))
        << "GQA ratio " << ratio;
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.heads_kv == 1 && c.heads_q > 1; })) << "MQA";
  for (auto layout : {check::Layout::BSHD, check::Layout::BHSD})
    EXPECT_TRUE(any(list, [&](const check::Case& c) { return c.layout == layout; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.batch == 7; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.softmax_scale != 0.0f; }));
  EXPECT_TRUE(any(list, [](const check::Case& c) { return c.input_scale != 1.0f; }));
  for (const auto& c : list) {
    EXPECT_TRUE(c.head_dim == 64 || c.head_dim == 128) << c.name;  // the v1 backward's head dims
    EXPECT_TRUE(c.with_lse && !check::is_serving(c) && c.ring_world == 0 && c.seqused_k.empty()) << c.name;
  }
}

TEST(BwdCheckCases, QuickListIsSmall) {
  const auto quick = bwd::cases(true);
  EXPECT_GE(quick.size(), 16u);
  EXPECT_LE(quick.size(), 24u);
  for (auto dt : {FLASHCORE_DTYPE_FP16, FLASHCORE_DTYPE_BF16})
    for (int64_t D : {64, 128})
      for (bool causal : {false, true})
        EXPECT_TRUE(any(quick, [&](const check::Case& c) {
          return c.dtype == dt && c.head_dim == D && c.causal == causal && c.seqlen_q % 2 == 1;
        })) << "dtype " << dt << " D=" << D << " causal=" << causal;
  for (const auto& c : quick) EXPECT_LE(c.batch * c.heads_q * c.seqlen_q * c.seqlen_k, 64 * 1024) << c.name;
  EXPECT_TRUE(any(quick, fully_masked_rows));
}

TEST(BwdCheckCases, NamesAreUniqueAndSafe) {
  for (bool quick : {false, true}) {
    std::set<std::string> names;
    for (const auto& c : bwd::cases(quick)) {
      EXPECT_EQ(c.name.rfind("bwd_", 0), 0u) << c.name;
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate name " << c.name;
      for (char ch : c.name) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_') << c.name;
      EXPECT_EQ(c.heads_q % c.heads_kv, 0) << c.name;
    }
  }
}

TEST(BwdCheckCases, FullListIsAffordable) {
  // The float64 reference does every (query, key) pair of every query head, about 5 multiply-adds per head_dim
  // element each (bwd::reference_macs). Budget: about a minute on 16 cores.
  double macs = 0;
  for (const auto& c : bwd::cases(false)) macs += bwd::reference_macs(c);
  std::printf("backward list: %zu cases, %.3g reference multiply-adds\n", bwd::cases(false).size(), macs);
  EXPECT_LT(macs, 5e10);
}

TEST(BwdCheckCases, Tolerances) {
  EXPECT_LT(bwd::tolerance(FLASHCORE_DTYPE_FP16), bwd::tolerance(FLASHCORE_DTYPE_BF16));
  EXPECT_GT(bwd::tolerance(FLASHCORE_DTYPE_FP16), 0.0);
  EXPECT_LT(bwd::tolerance(FLASHCORE_DTYPE_BF16), 0.05);  // a wrong mask or a dropped key block is ~0.1 .. 1
}

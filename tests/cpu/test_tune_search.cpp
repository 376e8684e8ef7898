// The autotuner's search (tools/flashcore/tune_search.h): elites, proposals, determinism.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tune_search.h"

namespace {

using flashcore::sm90::Schedule;
using flashcore::sm90::TileShape;
using flashcore::sm90::VariantSpec;
namespace tune = fccli::tune;

VariantSpec d128() {
  VariantSpec s;
  s.dtype = FLASHCORE_DTYPE_BF16;
  s.head_dim = 128;
  s.causal = false;
  s.shape = {128, 128, 2, true, Schedule::kStaticPersistent, false};
  return s;
}

std::vector<std::string> names(const std::vector<TileShape>& shapes) {
  std::vector<std::string> out;
  for (const TileShape& t : shapes) out.push_back(flashcore::sm90::config_name(t));
  return out;
}

TEST(TuneSearch, TopKOrdersByTimeThenName) {
  const std::vector<tune::Measured> all = {{"b", 2.0}, {"a", 1.0}, {"d", 3.0}, {"c", 1.0}};
  const std::vector<tune::Measured> top = tune::top_k(all, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].config, "a");
  EXPECT_EQ(top[1].config, "c");  // same time as "a": by name
  EXPECT_EQ(top[2].config, "b");
  EXPECT_EQ(tune::top_k(all, 10).size(), 4u);
}

TEST(TuneSearch, ProposalsAreFeasibleNewAndUnique) {
  const VariantSpec base = d128();
  const std::set<std::string> seen = {"128x128x2-pp-static", "128x144x2-pp-static"};
  const std::vector<TileShape> p = tune::propose(base, {base.shape}, seen, 8, 1, 1);
  ASSERT_FALSE(p.empty());
  EXPECT_LE(p.size(), 8u);
  std::set<std::string> unique;
  for (const TileShape& t : p) {
    VariantSpec s = base;
    s.shape = t;
    std::string why;
    EXPECT_TRUE(flashcore::sm90::feasible(s, why)) << flashcore::sm90::config_name(t) << ": " << why;
    const std::string name = flashcore::sm90::config_name(t);
    EXPECT_EQ(seen.count(name), 0u) << name;
    EXPECT_TRUE(unique.insert(name).second) << name;
  }
}

TEST(TuneSearch, DeterministicGivenSeed) {
  const VariantSpec base = d128();
  const std::vector<TileShape> elites = {base.shape, {128, 176, 2, false, Schedule::kOneTilePerCta, false},
                                         {192, 128, 2, true, Schedule::kStaticPersistent, false}};
  const auto a = names(tune::propose(base, elites, {}, 12, 7, 2));
  const auto b = names(tune::propose(base, elites, {}, 12, 7, 2));
  EXPECT_EQ(a, b);
  // Another seed or step reorders the shuffled mutations.
  bool differs = false;
  for (uint64_t seed = 8; seed < 16 && !differs; ++seed) differs = names(tune::propose(base, elites, {}, 12, seed, 2)) != a;
  EXPECT_TRUE(differs);
}

TEST(TuneSearch, OneDimensionMutationsOfTheBest) {
  const VariantSpec base = d128();
  const std::vector<TileShape> p = tune::propose(base, {base.shape}, {}, 64, 3, 1);
  // Every proposal from a single parent differs from it in exactly one field.
  for (const TileShape& t : p) {
    const TileShape& s = base.shape;
    const int diffs = (t.block_m != s.block_m) + (t.block_n != s.block_n) + (t.stages != s.stages) +
                      (t.pingpong != s.pingpong) + (t.schedule != s.schedule) + (t.rescale_vote != s.rescale_vote);
    // block_m 64 also turns ping-pong off (one consumer warpgroup): two fields, one decision.
    EXPECT_TRUE(diffs == 1 || (diffs == 2 && t.block_m == 64 && !t.pingpong)) << flashcore::sm90::config_name(t);
  }
  std::set<std::string> got;
  for (const std::string& n : names(p)) got.insert(n);
  EXPECT_TRUE(got.count("128x144x2-pp-static"));
  EXPECT_TRUE(got.count("128x128x2-static"));
  EXPECT_TRUE(got.count("128x128x2-pp-dynamic"));
}

TEST(TuneSearch, Geomean) {
  EXPECT_DOUBLE_EQ(tune::geomean({}), 1.0);
  EXPECT_NEAR(tune::geomean({1.0, 4.0}), 2.0, 1e-12);
}

}  // namespace

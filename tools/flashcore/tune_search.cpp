// The autotuner's search (tune_search.h).
#include "tune_search.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace fccli::tune {

using flashcore::sm90::Schedule;

std::vector<Measured> top_k(std::vector<Measured> all, int k) {
  std::sort(all.begin(), all.end(), [](const Measured& a, const Measured& b) {
    return a.ms != b.ms ? a.ms < b.ms : a.config < b.config;
  });
  if (k >= 0 && static_cast<size_t>(k) < all.size()) all.resize(static_cast<size_t>(k));
  return all;
}

namespace {

// Fisher-Yates with the generator's raw output: the same sequence with every standard library.
template <class T>
void shuffle(std::vector<T>& v, std::mt19937_64& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(rng() % i)]);
}

std::vector<TileShape> mutations(const TileShape& s) {
  std::vector<TileShape> out;
  auto add = [&](TileShape t) { out.push_back(t); };
  for (int bm : {64, 128, 192}) {
    if (bm == s.block_m) continue;
    TileShape t = s;
    t.block_m = bm;
    t.pingpong = s.pingpong && bm >= 128;  // ping-pong needs two consumer warpgroups
    add(t);
  }
  for (int dn : {-32, -16, 16, 32}) {
    TileShape t = s;
    t.block_n = s.block_n + dn;
    add(t);
  }
  for (int ds : {-1, 1}) {
    TileShape t = s;
    t.stages = s.stages + ds;
    add(t);
  }
  {
    TileShape t = s;
    t.pingpong = !s.pingpong;
    add(t);
  }
  for (Schedule sch : {Schedule::kOneTilePerCta, Schedule::kStaticPersistent, Schedule::kDynamicPersistent}) {
    if (sch == s.schedule) continue;
    TileShape t = s;
    t.schedule = sch;
    add(t);
  }
  {
    TileShape t = s;
    t.rescale_vote = !s.rescale_vote;
    add(t);
  }
  return out;
}

TileShape crossover(const TileShape& a, const TileShape& b, std::mt19937_64& rng) {
  auto pick = [&](auto x, auto y) { return (rng() & 1u) ? x : y; };
  TileShape t;
  t.block_m = pick(a.block_m, b.block_m);
  t.block_n = pick(a.block_n, b.block_n);
  t.stages = pick(a.stages, b.stages);
  t.pingpong = pick(a.pingpong, b.pingpong);
  t.schedule = pick(a.schedule, b.schedule);
  t.rescale_vote = pick(a.rescale_vote, b.rescale_vote);
  return t;
}

}  // namespace

std::vector<TileShape> propose(const VariantSpec& base, const std::vector<TileShape>& elites,
                               const std::set<std::string>& seen, int count, uint64_t seed, int generation) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(generation) * 1000003ull + 1);
  std::vector<TileShape> out;
  std::set<std::string> taken = seen;
  auto consider = [&](const TileShape& t) {
    if (static_cast<int>(out.size()) >= count) return;
    VariantSpec spec = base;
    spec.shape = t;
    std::string why;
    const std::string name = flashcore::sm90::config_name(t);
    if (taken.count(name) || !flashcore::sm90::feasible(spec, why)) return;
    taken.insert(name);
    out.push_back(t);
  };
  for (const TileShape& e : elites) {
    std::vector<TileShape> m = mutations(e);
    shuffle(m, rng);
    for (const TileShape& t : m) consider(t);
  }
  // Crossovers: a bounded number of draws (most pairs of close elites give back a parent or a seen shape).
  for (int draw = 0; elites.size() >= 2 && draw < 8 * count && static_cast<int>(out.size()) < count; ++draw) {
    const size_t i = static_cast<size_t>(rng() % elites.size());
    size_t j = static_cast<size_t>(rng() % (elites.size() - 1));
    if (j >= i) ++j;
    consider(crossover(elites[i], elites[j], rng));
  }
  return out;
}

double geomean(const std::vector<double>& values) {
  double log_sum = 0;
  int n = 0;
  for (double v : values) {
    if (v > 0) {
      log_sum += std::log(v);
      ++n;
    }
  }
  return n > 0 ? std::exp(log_sum / n) : 1.0;
}

}  // namespace fccli::tune

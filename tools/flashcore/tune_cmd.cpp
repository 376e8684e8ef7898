// `flashcore tune`: the autotuner. For each (dtype, head dim, causal) key and sequence-length bucket it times the
// kernel configs that pass the correctness gate, keeps the top-K elites per bucket, optionally builds new
// variants around them (--build), and writes a tuning table that dispatch reads at first use (docs/tuning.md).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <tuple>
#include <thread>

#include "api/tuning.h"
#include "kernels/sm90/launch.h"
#include "commands.h"
#include "common.h"
#include "random_pool.h"
#include "tune_search.h"

#ifdef FLASHCORE_CLI_HAVE_CHECK
#include "check/check.h"
#include "check/check_fp8.h"
#endif

namespace fccli {

void print_tune_help() {
  std::printf(
      "usage: flashcore tune [options]\n"
      "\n"
      "Times every kernel config compiled for each (dtype, head dim, causal) on one shape per sequence-length\n"
      "bucket (batch = tokens / seqlen, heads = hidden / head_dim), after a correctness gate (float64 reference\n"
      "with the test suite's tolerance, bit-exact determinism); keeps the top-K per bucket and writes the winners\n"
      "as a tuning table that the library reads at first use (docs/tuning.md).\n"
      "options:\n"
      "  --dtype D          fp16 | bf16 | both (default both) | e4m3 | e5m2 (8-bit inputs with per-(batch, KV head)\n"
      "                     descales, O in bf16; the entries serve both O dtypes; not with --build)\n"
      "  --head-dims LIST   e.g. 64,128 (default: every compiled head dim)\n"
      "  --causal C         0 | 1 | both (default both)\n"
      "  --seqlens LIST     bucket shapes (default 512,1024,2048,4096,8192,16384; none: only the decode ones)\n"
      "  --no-decode        leave out the decode buckets (Sq = 1 against Sk = 2k/4k/8k/16k/64k keys, GQA 32/8\n"
      "                     heads, batch 128/32/8/4/1: the serving shapes the dense API can run)\n"
      "  --tokens N         batch * seqlen of each shape (default 16384)\n"
      "  --hidden N         heads * head_dim of each shape (default 2048)\n"
      "  --top-k K          elites kept per bucket (default 3)\n"
      "  --build            also generate, compile (nvcc) and load new variants around the elites\n"
      "  --generations N    search steps with --build (default 1: the neighbourhood of the defaults; later\n"
      "                     steps mutate and cross the measured elites)\n"
      "  --population N     new variants per key and step (default 6)\n"
      "  --variants LIST    with --build: also these configs (names as in configs.txt, e.g.\n"
      "                     128x160x2-pp-dynamic-vote) in step 1, for every key where they are feasible\n"
      "  --cubin-dir DIR    where built variants go and are reused from (default <cache>/variants)\n"
      "  --compile-only     with --build: compile step 1's variants and stop (no GPU needed)\n"
      "  --jobs N           parallel nvcc runs with --build (default: the core count)\n"
      "  --rounds N         timing rounds per bucket, candidates in rotating order (default 5)\n"
      "  --iters N          calls per candidate and round (default 8)\n"
      "  --seed N           search seed (default 1)\n"
      "  --max-minutes N    no new search step for a key after N minutes (the table keeps what was measured)\n"
      "  --out FILE         the table (default: the path dispatch reads, see docs/tuning.md)\n"
      "  --report FILE      also write the report (markdown)\n"
      "  --device N         CUDA device (default 0)\n"
      "  --quiet            no progress bar\n"
      "  --test-faulty-variant  (tests) also offer each key's default built with a wrong softmax scale, as\n"
      "                     <default>-faulty: the gate must reject it (needs nvcc or its cubin in --cubin-dir,\n"
      "                     which --build --compile-only --test-faulty-variant builds)\n"
      "\n"
      "Hopper (sm90) only: the tables and variants are the sm90 kernels'; on a GPU the portable backend serves it\n"
      "exits 3. --build --compile-only needs no GPU.\n"
      "\n"
      "exit status: 0 table written, 1 failure, 2 bad arguments, 3 no Hopper GPU\n");
}

namespace {

using flashcore::sm90::TileShape;
using flashcore::sm90::VariantSpec;
namespace sm90 = flashcore::sm90;
namespace tuning = flashcore::tuning;
using tune::Measured;

struct TuneOptions {
  ProblemFlags problem;
  std::vector<int> head_dims;
  std::vector<int64_t> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  bool decode = true;  // also the decode shapes (one query row per sequence against a KV cache)
  int64_t tokens = 16384, hidden = 2048;
  int top_k = 3;
  bool build = false, compile_only = false;
  int generations = 1, population = 6;
  std::vector<TileShape> variants;  // --variants: named shapes added to step 1 of the search
  std::string cubin_dir, out_path, report_path;
  int rounds = 5, iters = 8;
  int jobs = std::max(1u, std::thread::hardware_concurrency());  // parallel nvcc runs
  uint64_t seed = 1;
  int device = 0;
  bool quiet = false;
  double max_minutes = 0;    // 0: no limit; else the search stops starting new steps past it
  bool test_faulty = false;  // add a deliberately wrong variant per key (tests: the gate must reject it)
};

TuneOptions parse_tune_options(int argc, char** argv, int first) {
  TuneOptions o;
  o.problem.dtypes = {FLASHCORE_DTYPE_BF16, FLASHCORE_DTYPE_FP16};
  Args a(argc, argv, first);
  auto int_list = [](const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
    std::vector<int64_t> v;
    for (const std::string& s : split(text, ',')) v.push_back(parse_int(flag, s, lo, hi));
    if (v.empty()) usage_error(flag + ": empty list");
    return v;
  };
  while (!a.done()) {
    const std::string f = a.next();
    if (f == "-h" || f == "--help") {
      print_tune_help();
      throw CliError(kExitOk, "");
    } else if (f == "--dtype") {
      o.problem.dtypes = parse_dtypes(a.value(f), /*allow_8bit=*/true);
    } else if (parse_problem_flag(f, a, o.problem)) {
    } else if (f == "--variants") {
      for (const std::string& name : split(a.value(f), ',')) {
        TileShape shape{};
        if (!sm90::parse_config_name(name, shape)) usage_error("--variants: '" + name + "' is not a config name");
        o.variants.push_back(shape);
      }
      if (o.variants.empty()) usage_error("--variants: empty list");
    } else if (f == "--head-dims") {
      for (int64_t d : int_list(f, a.value(f), 1, 1024)) o.head_dims.push_back(static_cast<int>(d));
    } else if (f == "--no-decode") {
      a.no_value(f);
      o.decode = false;
    } else if (f == "--seqlens") {
      const std::string v = a.value(f);
      o.seqlens = v == "none" ? std::vector<int64_t>{} : int_list(f, v, 1, 1 << 20);
    } else if (f == "--tokens" || f == "--hidden") {
      (f == "--tokens" ? o.tokens : o.hidden) = parse_int(f, a.value(f), 1, int64_t{1} << 30);
    } else if (f == "--top-k") {
      o.top_k = static_cast<int>(parse_int(f, a.value(f), 1, 64));
    } else if (f == "--test-faulty-variant") {
      a.no_value(f);
      o.test_faulty = true;
    } else if (f == "--build" || f == "--compile-only" || f == "--quiet") {
      a.no_value(f);
      (f == "--build" ? o.build : f == "--quiet" ? o.quiet : o.compile_only) = true;
    } else if (f == "--generations" || f == "--population" || f == "--rounds" || f == "--iters" || f == "--jobs") {
      int& v = f == "--generations" ? o.generations : f == "--population" ? o.population
               : f == "--rounds"    ? o.rounds
               : f == "--jobs"      ? o.jobs
                                    : o.iters;
      v = static_cast<int>(parse_int(f, a.value(f), 1, 1000));
    } else if (f == "--cubin-dir" || f == "--out" || f == "--report") {
      std::string& s = f == "--cubin-dir" ? o.cubin_dir : f == "--out" ? o.out_path : o.report_path;
      s = a.value(f);
      if (s.empty()) usage_error(f + ": empty path");
    } else if (f == "--max-minutes") {
      o.max_minutes = static_cast<double>(parse_int(f, a.value(f), 1, 24 * 60));
    } else if (f == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(f, a.value(f), 0, INT64_MAX));
    } else if (f == "--device") {
      o.device = static_cast<int>(parse_int(f, a.value(f), 0, 1023));
    } else {
      usage_error("unknown option '" + f + "'");
    }
  }
  if (o.problem.causal.empty()) o.problem.causal = {false, true};
  if (o.compile_only && !o.build) usage_error("--compile-only needs --build");
  if (!o.variants.empty() && !o.build) usage_error("--variants needs --build");
  for (flashcore_dtype dt : o.problem.dtypes)
    if (flashcore::is_8bit(dt) && o.build)
      usage_error(std::string("--build makes 16-bit variants only; --dtype ") + cli_dtype_name(dt) +
                  " tunes among the compiled 8-bit configs (leave --build out)");
  if (o.seqlens.empty() && !o.decode) usage_error("--seqlens none with --no-decode leaves no bucket to tune");
  if (o.cubin_dir.empty()) o.cubin_dir = tuning::cache_dir() + "/variants";
  return o;
}

// The problem a bucket is timed on; its key in the table is (bucket_of(sq), bucket_of(sk)).
struct BucketShape {
  int64_t batch, heads_q, heads_kv, sq, sk;
  bool operator<(const BucketShape& o) const { return std::tie(sq, sk) < std::tie(o.sq, o.sk); }
  std::string text() const {
    return sq == sk ? "S=" + std::to_string(sq) : "Sq=" + std::to_string(sq) + " Sk=" + std::to_string(sk);
  }
};

std::vector<BucketShape> bucket_shapes(const TuneOptions& o, int head_dim) {
  std::vector<BucketShape> out;
  const int64_t heads = std::max<int64_t>(1, o.hidden / head_dim);
  for (int64_t s : o.seqlens) out.push_back({std::max<int64_t>(1, o.tokens / s), heads, heads, s, s});
  if (o.decode) {
    const std::pair<int64_t, int64_t> decode[] = {{128, 2048}, {32, 4096}, {8, 8192}, {4, 16384}, {1, 65536}};
    for (const auto& [batch, sk] : decode) out.push_back({batch, 32, 8, 1, sk});
  }
  return out;
}

// One (dtype, head dim, causal) key and what the tuner knows of it.
struct KeyState {
  VariantSpec base;                           // the key, with the default config's shape
  std::string default_config;                 // the default of long sequences (flashcore_list_kernel_configs' first)
  std::map<BucketShape, std::string> bucket_default;  // what the library runs on the bucket without a table (an
                                                      // 8-bit key's default depends on the key count)
  std::vector<std::string> configs;           // candidates that passed the gate, default first
  std::map<std::string, std::string> cubins;  // config -> cubin path, for built variants
  std::map<std::string, std::string> rejected;  // config -> why (gate, build)
  std::map<BucketShape, std::vector<Measured>> times;  // bucket -> latest measurement of every candidate
};

// ---------------------------------------------------------------------------------------------------
// Progress: a bar with the time left, estimated from the work done so far.

class Progress {
 public:
  explicit Progress(bool on) : on_(on && isatty(2)), t0_(std::chrono::steady_clock::now()) {}
  void add_total(double units) { total_ += units; }
  void step(double units, const std::string& what) {
    done_ += units;
    if (!on_) return;
    const double elapsed = seconds();
    const double frac = total_ > 0 ? std::min(1.0, done_ / total_) : 1.0;
    const double left = frac > 0 ? elapsed * (1 - frac) / frac : 0;
    const int filled = static_cast<int>(frac * 30);
    std::fprintf(stderr, "\r\033[K[%s%s] %3.0f%%  %s left  %s", std::string(filled, '#').c_str(),
                 std::string(30 - filled, '.').c_str(), frac * 100, clock_text(left).c_str(), what.c_str());
    std::fflush(stderr);
  }
  void clear() const {
    if (on_) std::fprintf(stderr, "\r\033[K");
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  static std::string clock_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
    return buf;
  }

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
  double total_ = 0, done_ = 0;
};

// ---------------------------------------------------------------------------------------------------
// The correctness gate: the suite's tolerance rule against the float64 reference, on shapes that reach every
// code path a tile config changes (partial tiles, Sq != Sk, GQA, more tiles than SMs, one query row), and
// bit-identical repeats.

std::string gate(const VariantSpec& key, const std::string& config, uint64_t seed) {
#ifdef FLASHCORE_CLI_HAVE_CHECK
  struct Shape {
    int64_t b, hq, hkv, sq, sk;
  };
  const int64_t wide_heads = std::max<int64_t>(1, 8192 / key.head_dim);  // 2048-row sequences: > 132 SMs of tiles
  const Shape shapes[] = {{2, 8, 2, 1000, 1000}, {1, 3, 1, 113, 4097}, {1, wide_heads, wide_heads, 2048, 2048},
                          {3, 2, 2, 1, 17}};
  for (const Shape& s : shapes) {
    if (flashcore::is_8bit(key.dtype)) {  // the 8-bit rule (check/check_fp8.h), descales other than 1
      flashcore::check::fp8::Case c;
      c.name = "gate";
      c.batch = s.b, c.heads_q = s.hq, c.heads_kv = s.hkv, c.seqlen_q = s.sq, c.seqlen_k = s.sk;
      c.head_dim = key.head_dim, c.dtype = key.dtype, c.causal = key.causal;
      c.kernel_config = config.c_str();
      const flashcore::check::fp8::Result r = flashcore::check::fp8::run_case(c, seed, 2);
      if (r.skipped) return "skipped: " + r.message;
      if (!r.passed || !r.deterministic) {
        return flashcore::check::fp8::describe(c) + ": " + (r.message.empty() ? "not deterministic" : r.message);
      }
      continue;
    }
    flashcore::check::Case c;
    c.name = "gate";
    c.batch = s.b;
    c.heads_q = s.hq;
    c.heads_kv = s.hkv;
    c.seqlen_q = s.sq;
    c.seqlen_k = s.sk;
    c.head_dim = key.head_dim;
    c.dtype = key.dtype;
    c.causal = key.causal;
    c.kernel_config = config.c_str();
    const flashcore::check::Result r = flashcore::check::run_case(c, seed, 2);
    if (r.skipped) return "skipped: " + r.message;
    if (!r.passed || !r.deterministic) {
      return flashcore::check::describe(c) + ": " + (r.message.empty() ? "not deterministic" : r.message);
    }
  }
  return "";
#else
  (void)key, (void)config, (void)seed;
  return "this flashcore program was built without the correctness check (flashcore_check)";
#endif
}

// ---------------------------------------------------------------------------------------------------
// Timing: one bucket's shape, every candidate on the same rotating buffers (more than twice the L2 in all),
// candidates in rotating order each round so that clock and temperature drift spread over all of them.

class BucketTimer {
 public:
  BucketTimer(const VariantSpec& key, const BucketShape& b, const TuneOptions& o, const DeviceInfo& dev,
              RandomPool& pool, cudaStream_t stream)
      : o_(o), stream_(stream) {
    flashcore_attention_params p =
        problem_params(b.batch, b.sq, b.sk, b.heads_q, b.heads_kv, key.head_dim, key.dtype, key.causal, false);
    // Q, K, V of 2 bytes per element (1 for 8-bit inputs), O of 2.
    const size_t esize = static_cast<size_t>(flashcore::dtype_size(key.dtype));
    const size_t q_elems = static_cast<size_t>(b.batch * b.sq * b.heads_q * key.head_dim);
    const size_t kv_elems = static_cast<size_t>(b.batch * b.sk * b.heads_kv * key.head_dim);
    auto align = [](size_t x) { return (x + 255) & ~size_t{255}; };
    const size_t q_bytes = align(q_elems * esize), kv_bytes = align(kv_elems * esize), o_bytes = align(q_elems * 2);
    const size_t set_bytes = q_bytes + 2 * kv_bytes + o_bytes;  // Q K V O
    size_t sets = static_cast<size_t>(2 * dev.l2_bytes) / set_bytes + 1;
    sets = std::min<size_t>(sets, 64);
    FC_CUDA(cudaMalloc(&arena_, sets * set_bytes));
    std::mt19937_64 rng(static_cast<uint64_t>(b.sq * 31 + b.sk) * 7919u + static_cast<uint64_t>(key.head_dim));
    char* base = static_cast<char*>(arena_);
    // 8-bit inputs: the pool's values are N(0, 1) * 64, so descales of 1/64 (per (batch, KV head), shared by the
    // sets) give scores of the 16-bit keys' spread.
    if (flashcore::is_8bit(key.dtype)) {
      const size_t n = static_cast<size_t>(b.batch * b.heads_kv);
      const std::vector<float> host(3 * n, 1.0f / 64);
      FC_CUDA(cudaMalloc(&descales_, host.size() * sizeof(float)));
      FC_CUDA(cudaMemcpy(descales_, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
      const float* d = static_cast<const float*>(descales_);
      p.q_descale = d, p.k_descale = d + n, p.v_descale = d + 2 * n;
    }
    for (size_t i = 0; i < sets; ++i) {
      char* s = base + i * set_bytes;
      pool.fill(s, q_elems * esize, key.dtype, rng, stream_);
      pool.fill(s + q_bytes, kv_elems * esize, key.dtype, rng, stream_);
      pool.fill(s + q_bytes + kv_bytes, kv_elems * esize, key.dtype, rng, stream_);
      p.q = s;
      p.k = s + q_bytes;
      p.v = s + q_bytes + kv_bytes;
      p.o = s + q_bytes + 2 * kv_bytes;
      params_.push_back(p);
    }
    FC_CUDA(cudaStreamSynchronize(stream_));
  }
  ~BucketTimer() {
    cudaFree(arena_);
    cudaFree(workspace_);
    cudaFree(descales_);
  }
  BucketTimer(const BucketTimer&) = delete;
  BucketTimer& operator=(const BucketTimer&) = delete;

  // Median per-call milliseconds of each config, in the order given.
  std::vector<double> time(const std::vector<std::string>& configs) {
    const size_t n = configs.size();
    std::vector<std::vector<double>> samples(n);
    // One zero-filled workspace, as large as the largest need (dynamic scheduler counter, split-KV partials).
    uint64_t need = 0;
    for (const std::string& c : configs) {
      params_[0].kernel_config = c.c_str();
      uint64_t bytes = 0;
      if (flashcore_attention_workspace_size(&params_[0], &bytes) != FLASHCORE_SUCCESS)
        throw CliError(kExitFailure, "config " + c + ": workspace_size: " + flashcore_last_error());
      need = std::max(need, bytes);
    }
    if (need > workspace_bytes_) {
      cudaFree(workspace_);
      workspace_ = nullptr;
      FC_CUDA(cudaMalloc(&workspace_, need));
      FC_CUDA(cudaMemset(workspace_, 0, need));
      workspace_bytes_ = need;
    }
    for (flashcore_attention_params& p : params_) {
      p.workspace = workspace_;
      p.workspace_size = workspace_bytes_;
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    FC_CUDA(cudaEventCreate(&start));
    FC_CUDA(cudaEventCreate(&stop));
    for (size_t c = 0; c < n; ++c) run(configs[c], 2);  // warm-up: first-use work stays out of the timing
    for (int round = 0; round < o_.rounds; ++round) {
      for (size_t i = 0; i < n; ++i) {
        const size_t c = (i + static_cast<size_t>(round)) % n;
        run(configs[c], 1);
        FC_CUDA(cudaEventRecord(start, stream_));
        run(configs[c], o_.iters);
        FC_CUDA(cudaEventRecord(stop, stream_));
        FC_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        FC_CUDA(cudaEventElapsedTime(&ms, start, stop));
        samples[c].push_back(ms / o_.iters);
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::vector<double> medians;
    for (std::vector<double>& s : samples) {
      std::sort(s.begin(), s.end());
      medians.push_back(s[s.size() / 2]);
    }
    return medians;
  }

 private:
  void run(const std::string& config, int calls) {
    for (int i = 0; i < calls; ++i) {
      flashcore_attention_params& p = params_[next_++ % params_.size()];
      p.kernel_config = config.c_str();
      const flashcore_status st = flashcore_attention_forward(&p, stream_);
      if (st != FLASHCORE_SUCCESS) {
        throw CliError(kExitFailure, "config " + config + ": " + flashcore_status_string(st) + ": " +
                                         flashcore_last_error());
      }
    }
  }

  const TuneOptions& o_;
  cudaStream_t stream_;
  void* arena_ = nullptr;
  void* workspace_ = nullptr;
  void* descales_ = nullptr;  // 8-bit: q, k, v descales
  uint64_t workspace_bytes_ = 0;
  std::vector<flashcore_attention_params> params_;
  size_t next_ = 0;
};

// ---------------------------------------------------------------------------------------------------

std::string key_text(const VariantSpec& k) {
  return std::string(cli_dtype_name(k.dtype)) + " d" + std::to_string(k.head_dim) + (k.causal ? " causal" : " non-causal");
}

// The proposals of search step `generation` for one key (tune::propose), and in step 1 also the --variants shapes
// that are feasible for it and not already seen or proposed (infeasible ones are reported in `rejected`, as a
// proposal's build failure would be).
std::vector<TileShape> step_proposals(const VariantSpec& base, const std::vector<TileShape>& parents,
                                      std::set<std::string> seen, const TuneOptions& o, int generation,
                                      std::map<std::string, std::string>& rejected) {
  std::vector<TileShape> out = tune::propose(base, parents, seen, o.population, o.seed, generation);
  if (generation != 1) return out;
  for (const TileShape& t : out) seen.insert(sm90::config_name(t));
  for (const TileShape& shape : o.variants) {
    VariantSpec spec = base;
    spec.shape = shape;
    const std::string name = sm90::config_name(shape);
    if (!seen.insert(name).second) continue;
    std::string why;
    if (sm90::feasible(spec, why)) out.push_back(shape);
    else rejected[name] = "--variants: not feasible: " + why;
  }
  return out;
}

// The key's elites over all its buckets, best first: by mean rank, ties by name.
std::vector<TileShape> key_elites(const KeyState& ks, int k) {
  std::map<std::string, double> rank_sum;
  for (const auto& [bucket, all] : ks.times) {
    const std::vector<Measured> top = tune::top_k(all, k);
    for (size_t i = 0; i < top.size(); ++i) rank_sum[top[i].config] += static_cast<double>(i);
    for (const Measured& m : all)
      if (!rank_sum.count(m.config)) rank_sum[m.config] += 0;  // every measured config is a candidate parent
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, r] : rank_sum) order.push_back({r, name});
  std::sort(order.begin(), order.end());
  std::vector<TileShape> out;
  for (const auto& [r, name] : order) {
    TileShape s{};
    if (sm90::parse_config_name(name, s)) out.push_back(s);
    if (static_cast<int>(out.size()) >= k) break;
  }
  return out;
}

// nvcc on every spec, `jobs` at a time; per spec the cubin's path, or "" with the reason in errors[i].
std::vector<std::string> build_all(const std::vector<VariantSpec>& specs, const TuneOptions& o, Progress& prog,
                                   std::vector<std::string>& errors) {
  std::vector<std::string> cubins(specs.size());
  errors.assign(specs.size(), "");
  std::mutex mu;
  size_t next = 0;
  auto worker = [&]() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      if (next >= specs.size()) return;
      const size_t i = next++;
      lock.unlock();
      std::string cubin, error;
      const bool ok = sm90::build_variant(specs[i], o.cubin_dir, cubin, error) == FLASHCORE_SUCCESS;
      lock.lock();
      (ok ? cubins[i] : errors[i]) = ok ? cubin : error;
      prog.step(1, key_text(specs[i]) + ": built " + sm90::config_name(specs[i].shape));
    }
  };
  std::vector<std::thread> threads;
  const int n_threads = std::max(1, std::min<int>(o.jobs, static_cast<int>(specs.size())));
  for (int t = 0; t < n_threads; ++t) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  return cubins;
}

// Build (in parallel), load and gate the proposals of one search step; the survivors join ks.configs.
int grow(KeyState& ks, const std::vector<TileShape>& proposals, const TuneOptions& o, Progress& prog) {
  std::vector<VariantSpec> specs;
  for (const TileShape& shape : proposals) {
    specs.push_back(ks.base);
    specs.back().shape = shape;
  }
  std::vector<std::string> errors;
  const std::vector<std::string> cubins = build_all(specs, o, prog, errors);
  int added = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string name = sm90::config_name(specs[i].shape);
    std::string error;
    const sm90::KernelRow* row = nullptr;
    prog.step(0, key_text(ks.base) + ": gate " + name);
    if (cubins[i].empty()) {
      ks.rejected[name] = "build: " + errors[i];
    } else if (sm90::register_variant(specs[i], cubins[i], &row, error) != FLASHCORE_SUCCESS) {
      ks.rejected[name] = "load: " + error;
    } else if (std::string why = gate(specs[i], name, o.seed); !why.empty()) {
      ks.rejected[name] = "gate: " + why;
    } else {
      ks.cubins[name] = cubins[i];
      ks.configs.push_back(name);
      ++added;
    }
    prog.step(1, key_text(ks.base) + ": gated " + name);
  }
  return added;
}

// The config the library runs on the bucket's shape without a table (8-bit keys have defaults per key count,
// configs_fp8.txt); the key's default of long sequences if none is found.
std::string library_default(const KeyState& ks, const BucketShape& b) {
  std::string error;
  const sm90::KernelRow* row =
      sm90::select(ks.base.dtype, flashcore::resolved_out_dtype(ks.base.dtype, FLASHCORE_DTYPE_SAME),
                   ks.base.head_dim, ks.base.causal, nullptr, b.sk, error);
  return row != nullptr ? row->name : ks.default_config;
}

// The default a bucket's speedup is measured against.
std::string default_of(const KeyState& ks, const BucketShape& b) {
  const auto it = ks.bucket_default.find(b);
  return it != ks.bucket_default.end() ? it->second : ks.default_config;
}

void measure_key(KeyState& ks, const std::vector<std::string>& which, const TuneOptions& o, const DeviceInfo& dev,
                 RandomPool& pool, cudaStream_t stream, Progress& prog) {
  for (const BucketShape& b : bucket_shapes(o, ks.base.head_dim)) {
    prog.step(0, key_text(ks.base) + " " + b.text());
    // The bucket's default (when it passed the gate) and the current elites are timed again beside the
    // newcomers: one run, one comparison.
    std::string def = library_default(ks, b);
    if (std::find(ks.configs.begin(), ks.configs.end(), def) == ks.configs.end()) def = ks.default_config;
    ks.bucket_default[b] = def;
    std::vector<std::string> set{def};
    if (def != ks.default_config) set.push_back(ks.default_config);
    for (const Measured& m : tune::top_k(ks.times[b], o.top_k))
      if (std::find(set.begin(), set.end(), m.config) == set.end()) set.push_back(m.config);
    for (const std::string& c : which)
      if (std::find(set.begin(), set.end(), c) == set.end()) set.push_back(c);
    BucketTimer timer(ks.base, b, o, dev, pool, stream);
    const std::vector<double> ms = timer.time(set);
    std::vector<Measured>& all = ks.times[b];
    for (size_t i = 0; i < set.size(); ++i) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Measured& m) { return m.config == set[i]; });
      if (it != all.end()) it->ms = ms[i];
      else all.push_back({set[i], ms[i]});
    }
    prog.step(1, key_text(ks.base) + " " + b.text());
  }
}

std::string iso_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

tuning::Table make_table(const std::vector<KeyState>& keys, const tuning::DeviceKey& dk, const TuneOptions& o) {
  tuning::Table t;
  t.device = dk;
  t.library_version = flashcore_version_string();
  t.kernels_hash = flashcore::tuning::kernels_hash();
  t.seed = o.seed;
  t.created = iso_now();
  for (const KeyState& ks : keys) {
    for (const auto& [b, all] : ks.times) {
      const std::vector<Measured> top = tune::top_k(all, o.top_k);
      if (top.empty()) continue;
      tuning::Entry e;
      e.dtype = ks.base.dtype;
      e.head_dim = ks.base.head_dim;
      e.causal = ks.base.causal;
      e.seqlen_q = tuning::bucket_of(b.sq);
      e.seqlen_k = tuning::bucket_of(b.sk);
      e.config = top[0].config;
      for (const Measured& m : top) {
        tuning::Candidate c;
        c.config = m.config;
        c.ms = m.ms;
        if (auto it = ks.cubins.find(m.config); it != ks.cubins.end()) {
          c.cubin = it->second;
          c.cubin_hash = sm90::file_hash(it->second);
        }
        e.elites.push_back(c);
      }
      e.cubin = e.elites[0].cubin;
      e.cubin_hash = e.elites[0].cubin_hash;
      double def_ms = 0;
      for (const Measured& m : all)
        if (m.config == default_of(ks, b)) def_ms = m.ms;
      e.speedup = def_ms > 0 ? def_ms / top[0].ms : 1.0;
      t.entries.push_back(e);
    }
  }
  return t;
}

std::string report_text(const std::vector<KeyState>& keys, const TuneOptions& o, const DeviceInfo& dev,
                        double seconds) {
  std::ostringstream r;
  char line[512];
  r << "# flashcore tune: " << dev.name << " (" << dev.sms << " SMs), library " << flashcore_version_string()
    << ", seed " << o.seed << ", " << Progress::clock_text(seconds) << "\n\n";
  r << "| dtype | d | causal | bucket (B x Hq/Hkv) | default | ms | winner | ms | speedup | elites |\n";
  r << "|---|---|---|---|---|---|---|---|---|---|\n";
  std::vector<double> all_speedups;
  for (const KeyState& ks : keys) {
    for (const auto& [b, all] : ks.times) {
      const std::vector<Measured> top = tune::top_k(all, o.top_k);
      if (top.empty()) continue;
      double def_ms = 0;
      const std::string def = default_of(ks, b);
      for (const Measured& m : all)
        if (m.config == def) def_ms = m.ms;
      const double speedup = def_ms > 0 ? def_ms / top[0].ms : 1.0;
      all_speedups.push_back(speedup);
      std::string elites;
      for (const Measured& m : top) elites += (elites.empty() ? "" : ", ") + m.config;
      const std::string where = b.text() + " (" + std::to_string(b.batch) + " x " + std::to_string(b.heads_q) + "/" +
                                std::to_string(b.heads_kv) + ")";
      std::snprintf(line, sizeof line, "| %s | %d | %d | %s | %s | %.4f | %s | %.4f | %.3f | %s |\n",
                    cli_dtype_name(ks.base.dtype), ks.base.head_dim, ks.base.causal ? 1 : 0, where.c_str(),
                    def.c_str(), def_ms, top[0].config.c_str(),
                    top[0].ms, speedup, elites.c_str());
      r << line;
    }
  }
  std::snprintf(line, sizeof line, "\nGeometric-mean speedup of the winners over the defaults: %.3f over %zu buckets\n",
                tune::geomean(all_speedups), all_speedups.size());
  r << line;
  bool any_rejected = false;
  for (const KeyState& ks : keys) {
    for (const auto& [name, why] : ks.rejected) {
      if (!any_rejected) r << "\nRejected candidates (never chosen):\n";
      any_rejected = true;
      r << "- " << key_text(ks.base) << " " << name << ": " << why << "\n";
    }
  }
  return r.str();
}

}  // namespace

int run_tune(int argc, char** argv, int first) {
  const TuneOptions o = parse_tune_options(argc, argv, first);
  const flashcore_capabilities caps = capabilities();
  std::vector<int> head_dims = o.head_dims;
  if (head_dims.empty())
    for (int i = 0; i < caps.num_head_dims; ++i) head_dims.push_back(caps.head_dims[i]);

  Progress prog(!o.quiet);
  std::vector<KeyState> keys;
  if (o.compile_only) {
    std::vector<std::pair<size_t, VariantSpec>> jobs;  // (index into keys, variant)
    // Step 1 of the search proposes around each key's default, which needs no measurement: its variants can be
    // compiled on a machine without a GPU and carried to one without nvcc (--cubin-dir there).
    for (flashcore_dtype dt : o.problem.dtypes) {
      for (int hd : head_dims) {
        for (bool causal : o.problem.causal) {
          KeyState ks;
          ks.base.dtype = dt;
          ks.base.head_dim = hd;
          ks.base.causal = causal;
          int n = 0;
          const sm90::KernelRow* const* rows = sm90::rows(n);
          std::set<std::string> seen;
          for (int i = 0; i < n; ++i) {
            const sm90::KernelRow& r = *rows[i];
            if (r.dtype != dt || r.head_dim != hd || r.causal != causal) continue;
            seen.insert(r.name);
            if (sm90::is_default_for(r, INT64_MAX)) ks.base.shape = r.shape, ks.default_config = r.name;
          }
          if (ks.default_config.empty()) continue;
          if (o.test_faulty) jobs.push_back({keys.size(), ks.base});  // the default's cubin, built as a variant
          for (const TileShape& t : step_proposals(ks.base, {ks.base.shape}, seen, o, 1, ks.rejected)) {
            VariantSpec spec = ks.base;
            spec.shape = t;
            jobs.push_back({keys.size(), spec});
          }
          keys.push_back(ks);
        }
      }
    }
    std::vector<VariantSpec> specs;
    for (const auto& job : jobs) specs.push_back(job.second);
    prog.add_total(static_cast<double>(specs.size()));
    std::vector<std::string> errors;
    const std::vector<std::string> cubins = build_all(specs, o, prog, errors);
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string name = sm90::config_name(specs[i].shape);
      KeyState& ks = keys[jobs[i].first];
      if (cubins[i].empty()) ks.rejected[name] = "build: " + errors[i];
      else ks.cubins[name] = cubins[i];
    }
    prog.clear();
    int built = 0;
    for (const KeyState& ks : keys) {
      for (const auto& [name, path] : ks.cubins) {
        std::printf("built %s %s: %s\n", key_text(ks.base).c_str(), name.c_str(), path.c_str());
        ++built;
      }
      for (const auto& [name, why] : ks.rejected) {
        std::printf("FAILED %s %s: %s\n", key_text(ks.base).c_str(), name.c_str(), why.c_str());
      }
    }
    std::printf("%d variant(s) in %s\n", built, o.cubin_dir.c_str());
    return built > 0 ? kExitOk : kExitFailure;
  }

  const DeviceInfo dev = require_device(o.device);
  // The tables and the variants are the sm90 kernels' (the portable backend picks its row by the device's shared
  // memory and reads no table).
  require_hopper_backend(dev, "the autotuner");
  tuning::DeviceKey dk;
  if (!tuning::device_key(o.device, dk)) {
    throw CliError(kExitFailure, "cannot query device " + std::to_string(o.device));
  }
  const std::string out_path = o.out_path.empty() ? tuning::table_path(dk) : o.out_path;

  for (flashcore_dtype dt : o.problem.dtypes) {
    if (!caps_has_dtype(caps, dt)) continue;
    for (int hd : head_dims) {
      if (!caps_has_head_dim(caps, hd)) usage_error("head dim " + std::to_string(hd) + " is not compiled in");
      for (bool causal : o.problem.causal) {
        const char* names[32];
        int32_t count = 0;
        if (flashcore_list_kernel_configs(dt, hd, causal ? 1 : 0, names, 32, &count) != FLASHCORE_SUCCESS)
          throw CliError(kExitFailure, std::string("list_kernel_configs: ") + flashcore_last_error());
        if (count == 0) continue;
        KeyState ks;
        ks.base.dtype = dt;
        ks.base.head_dim = hd;
        ks.base.causal = causal;
        ks.default_config = names[0];
        if (!sm90::parse_config_name(ks.default_config, ks.base.shape))
          throw CliError(kExitFailure, "cannot parse config name " + ks.default_config);
        for (int i = 0; i < std::min(count, 32); ++i) ks.configs.push_back(names[i]);
        const double buckets = static_cast<double>(bucket_shapes(o, hd).size());
        prog.add_total(static_cast<double>(ks.configs.size()) + buckets);
        if (o.build) prog.add_total(static_cast<double>(o.generations) * (2.0 * o.population + buckets));
        keys.push_back(ks);
      }
    }
  }
  if (keys.empty()) usage_error("nothing to tune: no compiled config for the requested dtypes / head dims");

  cudaStream_t stream = nullptr;
  FC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<RandomPool> pool(new RandomPool(o.seed));

  if (o.test_faulty) {
    for (KeyState& ks : keys) {
      std::string cubin, error;
      const std::string name = ks.default_config + "-faulty";
      if (sm90::build_variant(ks.base, o.cubin_dir, cubin, error) != FLASHCORE_SUCCESS ||
          sm90::register_faulty_variant_for_testing(ks.base, cubin, name, error) != FLASHCORE_SUCCESS)
        throw CliError(kExitFailure, "--test-faulty-variant: " + error);
      ks.configs.push_back(name);
    }
  }

  // Step 0: the compiled configs, gated, then timed on every bucket.
  for (KeyState& ks : keys) {
    std::vector<std::string> passed;
    for (const std::string& c : ks.configs) {
      prog.step(0, key_text(ks.base) + ": gate " + c);
      if (std::string why = gate(ks.base, c, o.seed); why.empty()) passed.push_back(c);
      else ks.rejected[c] = "gate: " + why;
      prog.step(1, key_text(ks.base) + ": gate " + c);
    }
    ks.configs = passed;
    if (std::find(passed.begin(), passed.end(), ks.default_config) == passed.end())
      throw CliError(kExitFailure, key_text(ks.base) + ": the default config " + ks.default_config +
                                       " fails the correctness gate: " + ks.rejected[ks.default_config]);
    measure_key(ks, ks.configs, o, dev, *pool, stream, prog);
  }

  // Search steps: step 1 around the defaults (reproducible without a GPU, see --compile-only), later steps
  // around the measured elites.
  for (int g = 1; o.build && g <= o.generations; ++g) {
    for (KeyState& ks : keys) {
      if (o.max_minutes > 0 && prog.seconds() > 60 * o.max_minutes) {
        ks.rejected["(search step " + std::to_string(g) + ")"] = "skipped: --max-minutes reached";
        continue;
      }
      std::set<std::string> seen(ks.configs.begin(), ks.configs.end());
      for (const auto& [name, why] : ks.rejected) seen.insert(name);
      const std::vector<TileShape> parents = g == 1 ? std::vector<TileShape>{ks.base.shape} : key_elites(ks, o.top_k);
      const std::vector<TileShape> p = step_proposals(ks.base, parents, seen, o, g, ks.rejected);
      std::vector<std::string> before = ks.configs;
      grow(ks, p, o, prog);
      std::vector<std::string> fresh;
      for (const std::string& c : ks.configs)
        if (std::find(before.begin(), before.end(), c) == before.end()) fresh.push_back(c);
      if (!fresh.empty()) measure_key(ks, fresh, o, dev, *pool, stream, prog);
      else prog.step(static_cast<double>(bucket_shapes(o, ks.base.head_dim).size()), key_text(ks.base));
    }
  }
  prog.clear();
  pool.reset();
  FC_CUDA(cudaStreamDestroy(stream));

  const tuning::Table table = make_table(keys, dk, o);
  const std::string report = report_text(keys, o, dev, prog.seconds());
  std::fputs(report.c_str(), stdout);
  const std::string json = tuning::to_json(table);
  const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(out_path);
  out << json;
  if (!out) throw CliError(kExitFailure, "cannot write " + out_path);
  std::printf("\ntable: %s\n", out_path.c_str());
  if (!o.report_path.empty()) {
    std::ofstream rep(o.report_path);
    rep << report;
    if (!rep) throw CliError(kExitFailure, "cannot write " + o.report_path);
  }
  return kExitOk;
}

}  // namespace fccli

// `flashcore tvla`: fixed-versus-random timing test (TVLA-style Welch's t-test) of the forward pass.
//
// For each shape, N pairs of calls are timed with CUDA events; in each pair one call gets the fixed input and
// the other an input of the second class, in random order:
//   random: fresh random Q, K, V (copied, outside the timed region, from random offsets of a random pool)
//   zero:   all-zero Q, K, V
// Welch's t between the fixed and the other class is printed per shape and class; |t| < 4.5 is PASS.
// See docs/reliability.md for what this does and does not show.
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "commands.h"
#include "common.h"

namespace fccli {

void print_tvla_help() {
  std::printf(
      "usage: flashcore tvla [options]\n"
      "\n"
      "Fixed-versus-random timing test: per shape, N calls with a fixed input interleaved (random order per\n"
      "pair) with N calls with fresh random inputs, and N with all-zero inputs; each call timed with CUDA\n"
      "events; Welch's t per shape and class, PASS when |t| < threshold. See docs/reliability.md.\n"
      "\n"
      "options:\n"
      "  --shape B,H,S,D    a shape to test (repeatable; default: 8 shapes over head dims 64/128/256)\n"
      "  --causal 0|1|both  causal mask for --shape shapes (default 0)\n"
      "  --dtype fp16|bf16  input dtype (default bf16)\n"
      "  --n N              calls per class (default 400)\n"
      "  --threshold T      PASS when |t| < T (default 4.5)\n"
      "  --seed S           seed of the random inputs and the order (default 1)\n"
      "  --device I         CUDA device (default 0)\n"
      "\n"
      "exit status: 0 all PASS, 1 a FAIL or a run error, 2 bad arguments, 3 no supported GPU\n");
}

namespace {

struct TvlaShape {
  int64_t b, h, s, d;
  bool causal;
};

// 8 shapes over head dims 64, 128, 256, causal and not.
const TvlaShape kDefaultShapes[] = {
    {2, 16, 1024, 64, false},  {2, 16, 1024, 64, true},  {2, 16, 2048, 128, false}, {2, 16, 2048, 128, true},
    {1, 32, 4096, 128, true},  {2, 8, 1024, 256, false}, {2, 8, 1024, 256, true},   {1, 16, 2048, 256, true},
};

struct TvlaOptions {
  std::vector<TvlaShape> shapes;
  std::vector<bool> causal;  // for --shape; default: not causal
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  int64_t n = 400;
  int device = 0;
  uint64_t seed = 1;
  double threshold = 4.5;
};

TvlaOptions parse(int argc, char** argv, int first) {
  TvlaOptions o;
  std::vector<std::array<int64_t, 4>> given;
  Args a(argc, argv, first);
  while (!a.done()) {
    const std::string flag = a.next();
    if (flag == "-h" || flag == "--help") {
      print_tvla_help();
      throw CliError(kExitOk, "");
    } else if (flag == "--shape") {
      const std::vector<std::string> parts = split(a.value(flag), ',');
      if (parts.size() != 4) usage_error("--shape wants B,H,S,D (4 numbers), got " + std::to_string(parts.size()));
      given.push_back({parse_int(flag, parts[0], 1, 1 << 16), parse_int(flag, parts[1], 1, 1 << 16),
                       parse_int(flag, parts[2], 1, int64_t{1} << 24), parse_int(flag, parts[3], 1, 1024)});
    } else if (flag == "--causal") {
      o.causal = parse_causal(a.value(flag));
    } else if (flag == "--dtype") {
      const std::vector<flashcore_dtype> dts = parse_dtypes(a.value(flag));
      if (dts.size() != 1) usage_error("--dtype wants one of fp16, bf16");
      o.dtype = dts[0];
    } else if (flag == "--n") {
      o.n = parse_int(flag, a.value(flag), 2, 1000000);
    } else if (flag == "--threshold") {
      const std::string v = a.value(flag);
      char* end = nullptr;
      o.threshold = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.threshold > 0)) usage_error("--threshold wants a positive number");
    } else if (flag == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(flag, a.value(flag), 0, INT64_MAX));
    } else if (flag == "--device") {
      o.device = static_cast<int>(parse_int(flag, a.value(flag), 0, 1023));
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }
  if (o.causal.empty()) o.causal = {false};
  for (const auto& g : given)
    for (bool c : o.causal) o.shapes.push_back({g[0], g[1], g[2], g[3], c});
  if (given.empty()) o.shapes.assign(std::begin(kDefaultShapes), std::end(kDefaultShapes));
  return o;
}

// Random 16-bit floats of moderate magnitude (|x| in [2^-3, 2^2)), generated as bit patterns.
void fill_random(std::vector<uint16_t>& v, flashcore_dtype dt, std::mt19937_64& rng) {
  for (uint16_t& x : v) {
    const uint64_t r = rng();
    const uint16_t sign = static_cast<uint16_t>((r & 1) << 15);
    const uint16_t e = static_cast<uint16_t>((r >> 1) % 5);
    x = dt == FLASHCORE_DTYPE_FP16 ? static_cast<uint16_t>(sign | ((12 + e) << 10) | ((r >> 8) & 0x3ff))
                                   : static_cast<uint16_t>(sign | ((124 + e) << 7) | ((r >> 8) & 0x7f));
  }
}

struct Stats {
  double n = 0, mean = 0, m2 = 0;  // Welford
  void add(double x) {
    n += 1;
    const double d = x - mean;
    mean += d / n;
    m2 += d * (x - mean);
  }
  double var() const { return n > 1 ? m2 / (n - 1) : 0; }
};

double welch_t(const Stats& a, const Stats& b) {
  const double se = std::sqrt(a.var() / a.n + b.var() / b.n);
  return se > 0 ? (a.mean - b.mean) / se : 0.0;
}

struct DeviceMem {
  void* p = nullptr;
  explicit DeviceMem(size_t bytes) { FC_CUDA(cudaMalloc(&p, bytes)); }
  ~DeviceMem() { cudaFree(p); }
  DeviceMem(const DeviceMem&) = delete;
  DeviceMem& operator=(const DeviceMem&) = delete;
  unsigned char* b() const { return static_cast<unsigned char*>(p); }
};

// Returns true when every class of this shape passes.
bool run_shape(const TvlaOptions& o, const TvlaShape& sh, std::mt19937_64& rng) {
  const size_t elems = static_cast<size_t>(sh.b * sh.h * sh.s * sh.d), bytes = elems * 2;
  DeviceMem q(bytes), k(bytes), v(bytes), out(bytes), fixed(3 * bytes), zero(3 * bytes), pool(6 * bytes);
  std::vector<uint16_t> host(3 * elems);
  fill_random(host, o.dtype, rng);
  FC_CUDA(cudaMemcpy(fixed.p, host.data(), 3 * bytes, cudaMemcpyHostToDevice));
  FC_CUDA(cudaMemset(zero.p, 0, 3 * bytes));
  host.resize(6 * elems);
  fill_random(host, o.dtype, rng);
  FC_CUDA(cudaMemcpy(pool.p, host.data(), 6 * bytes, cudaMemcpyHostToDevice));

  flashcore_attention_params p;
  flashcore_attention_params_init(&p);
  p.out_dtype = FLASHCORE_DTYPE_SAME;
  p.q = q.p, p.k = k.p, p.v = v.p, p.o = out.p;
  p.batch = sh.b, p.seqlen_q = p.seqlen_k = sh.s, p.num_heads_q = p.num_heads_kv = sh.h, p.head_dim = sh.d;
  p.dtype = o.dtype, p.causal = sh.causal ? 1 : 0;
  if (flashcore_attention_params_set_contiguous(&p, 0) != FLASHCORE_SUCCESS)
    throw CliError(kExitFailure, std::string("set_contiguous: ") + flashcore_last_error());

  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  FC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  FC_CUDA(cudaEventCreate(&start));
  FC_CUDA(cudaEventCreate(&stop));

  // Copies the class's input into q, k, v (untimed), then times one call.
  auto timed_call = [&](const unsigned char* src) -> double {
    FC_CUDA(cudaMemcpyAsync(q.p, src, bytes, cudaMemcpyDeviceToDevice, stream));
    FC_CUDA(cudaMemcpyAsync(k.p, src + bytes, bytes, cudaMemcpyDeviceToDevice, stream));
    FC_CUDA(cudaMemcpyAsync(v.p, src + 2 * bytes, bytes, cudaMemcpyDeviceToDevice, stream));
    FC_CUDA(cudaEventRecord(start, stream));
    const flashcore_status st = flashcore_attention_forward(&p, reinterpret_cast<flashcore_stream_t>(stream));
    if (st != FLASHCORE_SUCCESS)
      throw CliError(kExitFailure, std::string("flashcore_attention_forward: ") + flashcore_status_string(st) + ": " +
                                       flashcore_last_error());
    FC_CUDA(cudaEventRecord(stop, stream));
    FC_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    FC_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return ms * 1000.0;
  };
  auto random_input = [&]() {  // a 16-byte aligned random window of the pool
    std::uniform_int_distribution<size_t> off(0, (3 * bytes) / 16);
    return pool.b() + off(rng) * 16;
  };

  for (int i = 0; i < 20; ++i) timed_call(fixed.b());  // warm-up

  bool all_pass = true;
  for (const char* cls : {"random", "zero"}) {
    Stats f, r;
    const bool is_random = std::string(cls) == "random";
    for (int64_t i = 0; i < o.n; ++i) {
      const unsigned char* other = is_random ? random_input() : zero.b();
      if (rng() & 1) {
        f.add(timed_call(fixed.b()));
        r.add(timed_call(other));
      } else {
        r.add(timed_call(other));
        f.add(timed_call(fixed.b()));
      }
    }
    const double t = welch_t(f, r);
    const bool pass = std::fabs(t) < o.threshold;
    all_pass = all_pass && pass;
    std::printf("  B=%-3lld H=%-3lld S=%-6lld D=%-4lld %-7s fixed-vs-%-7s fixed %9.2f us  other %9.2f us  t = %+8.2f  %s\n",
                static_cast<long long>(sh.b), static_cast<long long>(sh.h), static_cast<long long>(sh.s),
                static_cast<long long>(sh.d), sh.causal ? "causal" : "full", cls, f.mean, r.mean, t,
                pass ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return all_pass;
}

}  // namespace

int run_tvla(int argc, char** argv, int first) {
  const TvlaOptions o = parse(argc, argv, first);
  const DeviceInfo dev = require_device(o.device);  // throws CliError(kExitNoGpu, "no supported GPU found: ...")
  const flashcore_capabilities caps = capabilities();
  std::printf("flashcore tvla: %s (device %d), %s, n = %lld per class, seed %llu, PASS when |t| < %g\n",
              dev.name.c_str(), dev.index, dtype_name(o.dtype), static_cast<long long>(o.n),
              static_cast<unsigned long long>(o.seed), o.threshold);
  std::mt19937_64 rng(o.seed);
  int failed = 0, skipped = 0;
  for (const TvlaShape& sh : o.shapes) {
    if (!caps_has_dtype(caps, o.dtype) || !caps_has_head_dim(caps, sh.d)) {
      std::printf("  B=%lld H=%lld S=%lld D=%lld: SKIP (not compiled; compiled head dims: %s)\n",
                  static_cast<long long>(sh.b), static_cast<long long>(sh.h), static_cast<long long>(sh.s),
                  static_cast<long long>(sh.d), caps_head_dims_string(caps).c_str());
      ++skipped;
      continue;
    }
    if (!run_shape(o, sh, rng)) ++failed;
  }
  std::printf("tvla: %zu shape(s), %d with a FAIL, %d skipped\n", o.shapes.size(), failed, skipped);
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace fccli

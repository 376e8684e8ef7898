// `flashcore bench`: CUDA-event timing of flashcore_attention_forward (--mode bwd: flashcore_attention_backward; fwdbwd:
// both) with buffer rotation, optional CUDA graph mode, NVML power sampling, inline correctness check, table / JSON /
// CSV / repro output.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "check/check_fp8.h"
#include "nvml_sampler.h"
#include "random_pool.h"
#include "reference/reference.h"  // the fp16/bf16 conversions (flashcore_reference, linked through flashcore_check)

#ifdef FLASHCORE_CLI_HAVE_CHECK
#include "check/check.h"
#include "check/check_bwd.h"
#endif

namespace fccli {
namespace fp8 = flashcore::check::fp8;
namespace {

struct RowSpec {
  std::string tag;
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 128, seqlen_k = 128, head_dim = 64;
  flashcore_dtype dtype = FLASHCORE_DTYPE_BF16;
  bool causal = false;
  int32_t precision = FLASHCORE_PRECISION_NATIVE;    // FP8, INT8: 16-bit inputs quantized by the library, timed with it
  flashcore_dtype out_dtype = FLASHCORE_DTYPE_SAME;  // as passed (SAME: bf16 for e4m3, the input dtype otherwise)
  bool v_transposed = false;  // 8-bit: V transposed once before timing (--v-transposed)
  // The attention variants (--window, --softcap, --sinks): FlashAttention's window_size (-1 unbounded), the softcap
  // (0: none), per-head sinks (the values linspace(-1, 1) over the query heads).
  bool local = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sinks = false;
  int64_t head_dim_v = 0;  // V's and O's head dim where the shape gives one ("D/DV"); 0: head_dim
};

// The variant part of the dtype column: ":win(L,R)", ":cap(C)", ":sinks".
std::string variant_label(const RowSpec& r) {
  std::string s;
  if (r.local) s += ":win(" + std::to_string(r.window_left) + "," + std::to_string(r.window_right) + ")";
  if (r.softcap != 0.0f) s += ":cap(" + std::to_string(static_cast<int>(r.softcap)) + ")";
  if (r.sinks) s += ":sinks";
  return s;
}

// The sinks a row uses: linspace(-1, 1) over the query heads (a spread around the scores' scale, so that they move
// the softmax without taking it over).
std::vector<float> sink_values(int64_t heads_q) {
  std::vector<float> v(static_cast<size_t>(heads_q));
  for (int64_t h = 0; h < heads_q; ++h) v[h] = heads_q > 1 ? -1.0f + 2.0f * static_cast<float>(h) / (heads_q - 1) : 0.0f;
  return v;
}

// 8-bit kernels run: e4m3 inputs, or 16-bit inputs with precision = FP8 (e4m3 kernels) or INT8 (int8 Q K^T); such
// rows are checked by the 8-bit rule (check/check_fp8.h).
bool runs_8bit(const RowSpec& r) {
  return flashcore::is_8bit(r.dtype) || r.precision != FLASHCORE_PRECISION_NATIVE;
}

// The dtype column: "bf16", "e4m3" (O in bf16), "e4m3>fp16" (O in fp16), "bf16:fp8" (precision = FP8), "bf16:int8"
// (precision = INT8), "e4m3:vt" (V transposed once, --v-transposed).
std::string dtype_label(const RowSpec& r) {
  std::string s = cli_dtype_name(r.dtype);
  if (r.precision != FLASHCORE_PRECISION_NATIVE) s += std::string(":") + cli_precision_name(r.precision);
  if (r.v_transposed) s += ":vt";
  const flashcore_dtype out = flashcore::resolved_out_dtype(r.dtype, r.out_dtype);
  if (out != (flashcore::is_8bit(r.dtype) ? FLASHCORE_DTYPE_BF16 : r.dtype))
    s += std::string(">") + cli_dtype_name(out);
  return s + variant_label(r);
}

struct ShapeArg {
  std::string text;
  int64_t batch, heads_q, seqlen_q, head_dim, heads_kv, seqlen_k;
  int64_t head_dim_v = 0;  // "D/DV": V's and O's head dim (0: D)
};

struct Options {
  PassMode mode = PassMode::Fwd;  // what is timed: the forward, the backward (after one forward), or both
  bool deterministic = false;     // the backward's deterministic flag
  std::vector<std::string> presets;
  std::vector<ShapeArg> shapes;
  ProblemFlags problem;  // dtypes, causal (empty: default), layout
  int iters = 30;
  int warmup = 10;
  bool graph = false;
  int graph_calls = 20;
  bool check = false;
  std::string json_path, csv_path;
  bool rotate = true;
  bool repro = false;
  bool lse = true;
  bool v_transposed = false;  // 8-bit rows: V transposed once per buffer set before timing (FLASHCORE_FLAG_V_TRANSPOSED)
  bool local = false;         // --window L,R
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;       // --softcap C
  bool sinks = false;         // --sinks
  int power_ms = 200;
  int device = 0;
  bool quiet = false;
  uint64_t seed = 1234;
};

struct Stats {
  double median = NAN, mean = NAN, p99 = NAN, min = NAN;
};

struct RowResult {
  RowSpec spec;
  std::string status = "ok";  // ok | error | skipped (the library's backward does not take the row: head dim, dtype)
  std::string message;
  Stats ms;
  double flops = 0;
  double tflops = NAN;
  double kv_gbps = NAN;  // bytes of K and V the call reads (every key of every KV head once) / median time
  int rotate_sets = 0;
  int64_t bytes_per_set = 0;
  int64_t bwd_workspace_bytes = 0;  // flashcore_attention_backward_workspace_size (the backward's modes)
  PowerStats power;
  bool checked = false;
  std::string check_status;  // pass | FAIL | skip
  double check_o_err = NAN, check_o_tol = NAN, check_lse_err = NAN;
  double check_grad_err = NAN, check_grad_tol = NAN;  // backward: the largest of dQ, dK, dV's max |err| / max |ref|
  std::string check_message;
  std::string repro;
  std::string config;  // the kernel config the library ran (flashcore_attention_selected_config)
};

// ---------------------------------------------------------------------------------------------------
// Argument parsing

ShapeArg parse_shape_arg(const std::string& text) {
  std::vector<std::string> parts = split(text, ',');
  if (parts.size() < 4 || parts.size() > 6)
    usage_error("malformed shape '" + text + "' (expected B,H,S,D[,Hkv[,Sk]])");
  // D may be "D/DV": V's (and O's) head dim of its own, e.g. 192/128.
  int64_t head_dim_v = 0;
  if (const size_t slash = parts[3].find('/'); slash != std::string::npos) {
    const std::string dv = parts[3].substr(slash + 1);
    parts[3].resize(slash);
    if (dv.empty() || dv.size() > 12 || !std::all_of(dv.begin(), dv.end(), ::isdigit) || std::stoll(dv) <= 0)
      usage_error("malformed shape '" + text + "': DV = '" + dv + "' is not a positive integer");
    head_dim_v = std::stoll(dv);
  }
  const char* names[] = {"B", "H", "S", "D", "Hkv", "Sk"};
  int64_t v[6];
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    bool digits = !p.empty() && p.size() <= 12 && std::all_of(p.begin(), p.end(), ::isdigit);
    if (!digits) usage_error("malformed shape '" + text + "': " + names[i] + " = '" + p + "' is not a positive integer");
    v[i] = std::stoll(p);
    if (v[i] <= 0) usage_error("malformed shape '" + text + "': " + names[i] + " must be positive");
  }
  ShapeArg s{text, v[0], v[1], v[2], v[3], parts.size() > 4 ? v[4] : v[1], parts.size() > 5 ? v[5] : v[2], head_dim_v};
  if (s.heads_q % s.heads_kv != 0)
    usage_error("malformed shape '" + text + "': H = " + std::to_string(s.heads_q) + " is not a multiple of Hkv = " +
                std::to_string(s.heads_kv));
  return s;
}

Options parse_options(int argc, char** argv, int first) {
  Options o;
  o.problem.allow_8bit = true;
  Args a(argc, argv, first);
  while (!a.done()) {
    std::string f = a.next();
    if (f == "-h" || f == "--help") {
      print_bench_help();
      throw CliError(kExitOk, "");
    } else if (f == "seeds" || f == "grid" || f == "decode") {
      o.presets.push_back(f);
    } else if (f == "--preset") {
      std::string p = a.value(f);
      if (p != "seeds" && p != "grid" && p != "decode")
        usage_error("unknown preset '" + p + "' (expected seeds, grid or decode)");
      o.presets.push_back(p);
    } else if (f == "--shape") {
      o.shapes.push_back(parse_shape_arg(a.value(f)));
    } else if (f == "--mode") {
      o.mode = parse_mode(a.value(f));
    } else if (f == "--deterministic") {
      a.no_value(f);
      o.deterministic = true;
    } else if (parse_problem_flag(f, a, o.problem)) {
    } else if (f == "--iters") {
      o.iters = static_cast<int>(parse_int(f, a.value(f), 1, 1000000));
    } else if (f == "--warmup") {
      o.warmup = static_cast<int>(parse_int(f, a.value(f), 0, 1000000));
    } else if (f == "--graph") {
      a.no_value(f);
      o.graph = true;
    } else if (f == "--graph-calls") {
      o.graph_calls = static_cast<int>(parse_int(f, a.value(f), 1, 10000));
    } else if (f == "--check") {
      a.no_value(f);
      o.check = true;
    } else if (f == "--json") {
      o.json_path = a.value(f);
    } else if (f == "--csv") {
      o.csv_path = a.value(f);
    } else if (f == "--no-rotate") {
      a.no_value(f);
      o.rotate = false;
    } else if (f == "--repro") {
      a.no_value(f);
      o.repro = true;
    } else if (f == "--no-lse") {
      a.no_value(f);
      o.lse = false;
    } else if (f == "--window") {
      const std::vector<std::string> lr = split(a.value(f), ',');
      auto bound = [&](const std::string& t) {
        const bool ok = !t.empty() && t.size() <= 10 &&
                        std::all_of(t.begin() + (t[0] == '-' ? 1 : 0), t.end(), ::isdigit) && t != "-";
        if (!ok || std::stoll(t) < -1) usage_error("--window L,R: bounds are -1 (unbounded) or >= 0, got '" + t + "'");
        return static_cast<int32_t>(std::stoll(t));
      };
      if (lr.size() != 2) usage_error("--window L,R: two bounds, e.g. --window 4095,0");
      o.local = true, o.window_left = bound(lr[0]), o.window_right = bound(lr[1]);
    } else if (f == "--softcap") {
      o.softcap = static_cast<float>(std::atof(a.value(f).c_str()));
      if (!(o.softcap > 0.0f)) usage_error("--softcap C: a positive cap");
    } else if (f == "--sinks") {
      o.sinks = true;
    } else if (f == "--v-transposed") {
      a.no_value(f);
      o.v_transposed = true;
    } else if (f == "--power-ms") {
      o.power_ms = static_cast<int>(parse_int(f, a.value(f), 0, 600000));
    } else if (f == "--device") {
      o.device = static_cast<int>(parse_int(f, a.value(f), 0, 1023));
    } else if (f == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(f, a.value(f), 0, INT64_MAX));
    } else if (f == "--quiet" || f == "-q") {
      a.no_value(f);
      o.quiet = true;
    } else if (!f.empty() && f[0] == '-') {
      usage_error("unknown option '" + f + "'");
    } else {
      usage_error("unknown preset '" + f + "' (expected seeds, grid or decode)");
    }
  }
#ifndef FLASHCORE_CLI_HAVE_CHECK
  if (o.check) usage_error("--check: this flashcore was built without the check library");
#endif
  check_problem_flags(o.problem);  // --precision against --dtype, --out-dtype
  check_mode_flags(o.mode, o.problem);  // the backward: 16-bit, native precision
  if (runs_backward(o.mode) && !o.lse) usage_error("--no-lse: the backward needs the forward's LSE (--mode fwd only)");
  if (o.deterministic && !runs_backward(o.mode)) usage_error("--deterministic is for --mode bwd / fwdbwd");
  if (o.v_transposed && !(o.problem.dtypes.size() == 1 && flashcore::is_8bit(o.problem.dtypes[0])))
    usage_error("--v-transposed is for --dtype e4m3 / e5m2 (8-bit V given transposed)");
  if (o.presets.empty() && o.shapes.empty()) o.presets.push_back("seeds");
  return o;
}

// Rows in order: for each shape, for each dtype, for each causal.
std::vector<RowSpec> build_rows(const Options& o, const flashcore_capabilities& caps, int& skipped) {
  for (flashcore_dtype dt : o.problem.dtypes)
    if (!caps_has_dtype(caps, dt))
      usage_error(std::string("unsupported dtype ") + cli_dtype_name(dt) + ": not compiled into this FlashCore");
  require_precision_kernels(o.problem.precision, caps);
  for (const ShapeArg& s : o.shapes)
    if (!caps_has_head_dim(caps, s.head_dim))
      usage_error("unsupported head dim " + std::to_string(s.head_dim) + " in shape '" + s.text +
                  "' (compiled: " + caps_head_dims_string(caps) + ")");

  struct Shape {
    std::string tag;
    int64_t b, h, s, d, hkv, sk;
    bool from_preset;
    int64_t dv = 0;  // V's head dim of its own (0: d)
  };
  std::vector<Shape> shapes;
  for (const std::string& p : o.presets) {
    if (p == "seeds") {
      const Shape seeds[] = {{"mission", 1, 8, 512, 64, 8, 512, true},   {"small", 2, 8, 512, 64, 8, 512, true},
                             {"long", 2, 8, 2048, 64, 8, 2048, true},    {"tiny", 1, 1, 128, 64, 1, 128, true},
                             {"medium", 4, 16, 1024, 64, 16, 1024, true}, {"hd128", 2, 8, 512, 128, 8, 512, true},
                             {"large", 8, 16, 2048, 64, 16, 2048, true}};
      shapes.insert(shapes.end(), std::begin(seeds), std::end(seeds));
    } else if (p == "decode") {  // decode steps (bench/serving.py DECODE_ROWS): one new token, d128, 32 query / 8 KV heads
      for (const auto& [b, sk] : {std::pair<int64_t, int64_t>{1, 8192}, {8, 8192}, {32, 4096}, {64, 16384},
                                  {128, 2048}, {16, 65536}})
        shapes.push_back({"decode", b, 32, 1, 128, 8, sk, true});
    } else {  // grid: the FlashAttention-3 paper's grid, as the anchors
      for (int64_t d : {64, 128, 256})
        for (int64_t s = 512; s <= 16384; s *= 2)
          shapes.push_back({"grid", 16384 / s, 2048 / d, s, d, 2048 / d, s, true});
    }
  }
  for (const ShapeArg& s : o.shapes)
    shapes.push_back({"shape", s.batch, s.heads_q, s.seqlen_q, s.head_dim, s.heads_kv, s.seqlen_k, false, s.head_dim_v});

  std::vector<bool> default_causal = o.shapes.empty() ? std::vector<bool>{false, true} : std::vector<bool>{false};
  const std::vector<bool>& causal = o.problem.causal.empty() ? default_causal : o.problem.causal;
  std::vector<RowSpec> rows;
  skipped = 0;
  for (const Shape& s : shapes) {
    if (!caps_has_head_dim(caps, s.d)) {
      ++skipped;
      continue;
    }
    for (flashcore_dtype dt : o.problem.dtypes)
      for (bool c : causal)
        rows.push_back({s.tag, s.b, s.h, s.hkv, s.s, s.sk, s.d, dt, c,
                        flashcore::is_8bit(dt) ? FLASHCORE_PRECISION_NATIVE : o.problem.precision,
                        o.problem.out_dtype, o.v_transposed && flashcore::is_8bit(dt), o.local, o.window_left,
                        o.window_right, o.softcap, o.sinks, s.dv});
  }
  return rows;
}

// ---------------------------------------------------------------------------------------------------
// Arithmetic

// Number of (query, key) pairs that are computed: the TFLOPS rule of the anchors (S*S/2 for causal with
// Sq == Sk), the exact visible count for causal with Sq != Sk (bottom-right aligned mask).
double visible_pairs(const RowSpec& r) {
  double sq = static_cast<double>(r.seqlen_q), sk = static_cast<double>(r.seqlen_k);
  if (r.local) {  // a window: each row's visible keys, counted (FlashAttention's bounds, right 0 under causal)
    const int64_t right = r.causal ? 0 : r.window_right, d = r.seqlen_k - r.seqlen_q;
    double total = 0;
    for (int64_t i = 0; i < r.seqlen_q; ++i) {
      const int64_t lo = r.window_left < 0 ? 0 : std::max<int64_t>(i + d - r.window_left, 0);
      const int64_t hi = right < 0 ? r.seqlen_k - 1 : std::min<int64_t>(i + d + right, r.seqlen_k - 1);
      total += static_cast<double>(std::max<int64_t>(hi - lo + 1, 0));
    }
    return total;
  }
  if (!r.causal) return sq * sk;
  if (r.seqlen_q == r.seqlen_k) return sq * sk / 2.0;
  double total = 0;
  int64_t offset = r.seqlen_k - r.seqlen_q;
  for (int64_t i = 0; i < r.seqlen_q; ++i) {
    int64_t n = std::min<int64_t>(std::max<int64_t>(i + offset + 1, 0), r.seqlen_k);
    total += static_cast<double>(n);
  }
  return total;
}

// 2 FLOPs per multiply-add of S = Q K^T (head_dim) and of O = P V (head_dim_v).
double row_flops(const RowSpec& r) {
  const double dims = static_cast<double>(r.head_dim + (r.head_dim_v != 0 ? r.head_dim_v : r.head_dim));
  return 2.0 * static_cast<double>(r.batch) * static_cast<double>(r.heads_q) * dims * visible_pairs(r);
}

Stats summarize(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  s.median = (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(n);
  size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
  s.p99 = v[std::min(n - 1, rank ? rank - 1 : 0)];
  s.min = v.front();
  return s;
}

struct DeviceArena {
  void* ptr = nullptr;
  ~DeviceArena() {
    if (ptr) cudaFree(ptr);
  }
};

struct RowError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A row the library's backward does not take (FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM / _DTYPE): listed as skipped, not
// a failure.
struct RowSkip : RowError {
  using RowError::RowError;
};

// FLOPs of the timed work per forward FLOP, as FlashAttention counts them: the backward does 2.5x the forward's
// matrix products (5 GEMMs of the forward's size against 2), forward + backward 3.5x.
double mode_flop_factor(PassMode mode) { return mode == PassMode::Bwd ? 2.5 : mode == PassMode::FwdBwd ? 3.5 : 1.0; }

// ---------------------------------------------------------------------------------------------------
// One row

size_t align256(size_t x) { return (x + 255) & ~size_t{255}; }

class RowRunner {
 public:
  RowRunner(const Options& o, const DeviceInfo& dev, RandomPool& pool, cudaStream_t stream, PowerSampler* sampler)
      : o_(o), dev_(dev), pool_(pool), stream_(stream), sampler_(sampler) {}

  void run(RowResult& res) {
    const RowSpec& r = res.spec;
    res.flops = row_flops(r) * mode_flop_factor(o_.mode);
    const bool backward = runs_backward(o_.mode);
    flashcore_attention_params p;
    try {  // a row the library refuses is that row's error, not the run's
      p = problem_params(r.batch, r.seqlen_q, r.seqlen_k, r.heads_q, r.heads_kv, r.head_dim, r.dtype, r.causal,
                         o_.problem.bhsd, r.head_dim_v);
    } catch (const CliError& e) {
      throw RowError(e.what());
    }

    p.precision = r.precision;
    p.out_dtype = r.out_dtype;
    p.local = r.local ? 1 : 0;
    p.window_size_left = r.window_left, p.window_size_right = r.window_right;
    p.softcap = r.softcap;
    if (r.sinks) {
      const std::vector<float> host = sink_values(r.heads_q);
      FC_CUDA(cudaMalloc(&sinks_.ptr, host.size() * sizeof(float)));
      FC_CUDA(cudaMemcpy(sinks_.ptr, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
      p.sinks = static_cast<const float*>(sinks_.ptr);
    }
    // Inputs of 1 (e4m3) or 2 bytes per element; O always 16-bit.
    const size_t esize = static_cast<size_t>(flashcore::dtype_size(r.dtype));
    const size_t q_bytes = static_cast<size_t>(r.batch * r.seqlen_q * r.heads_q * r.head_dim) * esize;
    const int64_t dv = r.head_dim_v != 0 ? r.head_dim_v : r.head_dim;
    const size_t kv_bytes = static_cast<size_t>(r.batch * r.seqlen_k * r.heads_kv * r.head_dim) * esize;
    const size_t v_bytes = static_cast<size_t>(r.batch * r.seqlen_k * r.heads_kv * dv) * esize;
    const size_t o_bytes = static_cast<size_t>(r.batch * r.seqlen_q * r.heads_q * dv) * 2;
    const size_t lse_bytes = o_.lse ? static_cast<size_t>(r.batch * r.heads_q * r.seqlen_q) * 4 : 0;
    // Layout of one set: Q K V O [LSE], each 256-byte aligned; the backward's modes add dO dQ dK dV (16-bit).
    const size_t off_k = align256(q_bytes), off_v = off_k + align256(kv_bytes), off_o = off_v + align256(v_bytes);
    const size_t off_lse = off_o + align256(o_bytes);
    const size_t off_dout = off_lse + align256(lse_bytes), off_dq = off_dout + (backward ? align256(o_bytes) : 0);
    const size_t off_dk = off_dq + (backward ? align256(q_bytes) : 0), off_dv = off_dk + (backward ? align256(kv_bytes) : 0);
    const size_t set_bytes = off_dv + (backward ? align256(v_bytes) : 0);
    // Bytes one timed call reads or writes: the forward Q K V O [LSE]; the backward also dO, dQ, dK, dV.
    const size_t touched =
        q_bytes + kv_bytes + v_bytes + o_bytes + lse_bytes + (backward ? o_bytes + q_bytes + kv_bytes + v_bytes : 0);
    res.bytes_per_set = static_cast<int64_t>(touched);

    size_t sets = 1;
    if (o_.rotate) sets = static_cast<size_t>(2 * dev_.l2_bytes) / touched + 1;  // sets * touched > 2 * L2
    size_t free_b = 0, total_b = 0;
    FC_CUDA(cudaMemGetInfo(&free_b, &total_b));
    size_t fit = static_cast<size_t>(0.8 * static_cast<double>(free_b)) / set_bytes;
    if (fit == 0)
      throw RowError("does not fit in device memory (" + std::to_string(set_bytes >> 20) + " MiB per buffer set, " +
                     std::to_string(free_b >> 20) + " MiB free)");
    sets = std::min(sets, fit);
    res.rotate_sets = static_cast<int>(sets);

    DeviceArena arena;
    FC_CUDA(cudaMalloc(&arena.ptr, sets * set_bytes));
    std::mt19937_64 rng(o_.seed * 1000003u + static_cast<uint64_t>(r.seqlen_q * 31 + r.head_dim));
    char* base = static_cast<char*>(arena.ptr);
    for (size_t i = 0; i < sets; ++i) {
      char* s = base + i * set_bytes;
      pool_.fill(s, q_bytes, r.dtype, rng, stream_);
      pool_.fill(s + off_k, kv_bytes, r.dtype, rng, stream_);
      pool_.fill(s + off_v, v_bytes, r.dtype, rng, stream_);
      FC_CUDA(cudaMemsetAsync(s + off_o, 0, o_bytes, stream_));
      if (backward) pool_.fill(s + off_dout, o_bytes, r.dtype, rng, stream_);  // dO; dQ, dK, dV are written whole
    }
    // e4m3 inputs: descales per (batch, KV head), (k / 64) / 64 with k in [32, 128] (the pool's values are N(0, 1) * 64:
    // real values ~N(0, 1) * [0.5, 2]); shared by the sets.
    if (flashcore::is_8bit(r.dtype)) {
      const size_t n = static_cast<size_t>(r.batch * r.heads_kv);
      std::vector<float> host(3 * n);
      for (float& x : host) x = static_cast<float>(32 + rng() % 97) / 4096.0f;
      FC_CUDA(cudaMalloc(&descales_.ptr, host.size() * sizeof(float)));
      FC_CUDA(cudaMemcpy(descales_.ptr, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
      const float* d = static_cast<const float*>(descales_.ptr);
      p.q_descale = d, p.k_descale = d + n, p.v_descale = d + 2 * n;
    }
    FC_CUDA(cudaStreamSynchronize(stream_));

    params_.assign(sets, p);
    for (size_t i = 0; i < sets; ++i) {
      char* s = base + i * set_bytes;
      params_[i].q = s;
      params_[i].k = s + off_k;
      params_[i].v = s + off_v;
      params_[i].o = s + off_o;
      params_[i].lse = o_.lse ? reinterpret_cast<float*>(s + off_lse) : nullptr;
    }
    // --v-transposed: each set's V transposed once here (not timed), and read as is by the timed calls.
    if (r.v_transposed) {
      uint64_t vt_bytes = 0;
      flashcore_status vst = flashcore_fp8_transposed_v_size(&params_[0], &vt_bytes);
      if (vst != FLASHCORE_SUCCESS)
        throw RowError(std::string("fp8_transposed_v_size: ") + flashcore_status_string(vst) + ": " + flashcore_last_error());
      const size_t vt_set = align256(static_cast<size_t>(vt_bytes));
      FC_CUDA(cudaMalloc(&vt_.ptr, sets * vt_set));
      for (size_t i = 0; i < sets; ++i) {
        void* vt = static_cast<char*>(vt_.ptr) + i * vt_set;
        vst = flashcore_fp8_transpose_v(&params_[i], vt, stream_);
        if (vst != FLASHCORE_SUCCESS)
          throw RowError(std::string("fp8_transpose_v: ") + flashcore_status_string(vst) + ": " + flashcore_last_error());
        params_[i].v = vt;
        params_[i].flags |= FLASHCORE_FLAG_V_TRANSPOSED;
      }
      FC_CUDA(cudaStreamSynchronize(stream_));
    }
    flashcore_status st = flashcore_attention_validate(&params_[0]);
    if (st != FLASHCORE_SUCCESS)
      throw RowError(std::string("validate: ") + flashcore_status_string(st) + ": " + flashcore_last_error());
    // The backward's params: the forward's tensors (O and LSE as inputs), dO, dQ, dK, dV, and a workspace of its own
    // (any contents; the forward's must stay zero-filled), shared by the sets.
    if (backward) {
      bwd_params_ = params_;
      for (size_t i = 0; i < sets; ++i) {
        char* s = base + i * set_bytes;
        flashcore_attention_params& q = bwd_params_[i];
        q.dout = s + off_dout, q.dq = s + off_dq, q.dk = s + off_dk, q.dv = s + off_dv;
        q.dout_strides = q.dq_strides = q.q_strides;
        q.dk_strides = q.dv_strides = q.k_strides;
        q.deterministic = o_.deterministic ? 1 : 0;
      }
      uint64_t bwd_bytes = 0;
      st = flashcore_attention_backward_workspace_size(&bwd_params_[0], &bwd_bytes);
      // A head dim, dtype or device backend the library's backward does not take (the portable backend has none yet).
      if (st == FLASHCORE_ERROR_UNSUPPORTED_HEAD_DIM || st == FLASHCORE_ERROR_UNSUPPORTED_DTYPE ||
          st == FLASHCORE_ERROR_UNSUPPORTED_ARCH)
        throw RowSkip(std::string("backward: ") + flashcore_status_string(st) + ": " + flashcore_last_error());
      if (st != FLASHCORE_SUCCESS)
        throw RowError(std::string("backward_workspace_size: ") + flashcore_status_string(st) + ": " +
                       flashcore_last_error());
      res.bwd_workspace_bytes = static_cast<int64_t>(bwd_bytes);
      if (bwd_bytes > 0) {
        FC_CUDA(cudaMalloc(&bwd_workspace_.ptr, bwd_bytes));
        for (flashcore_attention_params& q : bwd_params_) {
          q.workspace = bwd_workspace_.ptr;
          q.workspace_size = bwd_bytes;
        }
      }
    }
    // The workspace the call needs (a tuned config may use the dynamic scheduler), zero-filled, shared by the sets.
    uint64_t ws_bytes = 0;
    st = flashcore_attention_workspace_size(&params_[0], &ws_bytes);
    if (st != FLASHCORE_SUCCESS)
      throw RowError(std::string("workspace_size: ") + flashcore_status_string(st) + ": " + flashcore_last_error());
    if (ws_bytes > 0) {
      FC_CUDA(cudaMalloc(&workspace_.ptr, ws_bytes));
      FC_CUDA(cudaMemset(workspace_.ptr, 0, ws_bytes));
      for (flashcore_attention_params& q : params_) {
        q.workspace = workspace_.ptr;
        q.workspace_size = ws_bytes;
      }
    }

    // --mode bwd: the forward once per set (untimed), for the O and LSE the backward reads.
    if (o_.mode == PassMode::Bwd) {
      for (size_t i = 0; i < sets; ++i) forward(i);
      FC_CUDA(cudaStreamSynchronize(stream_));
    }

    std::vector<double> times = o_.graph ? time_graph() : time_plain();
    res.ms = summarize(times);
    res.tflops = res.flops / (res.ms.median * 1e-3) / 1e12;
    // The KV stream figure is the forward's (K and V read once); not reported for the backward's modes.
    res.kv_gbps = backward ? NAN
                           : static_cast<double>(kv_bytes + v_bytes) / (res.ms.median * 1e-3) / 1e9;
    char config[128] = "";
    if (o_.mode != PassMode::Bwd &&
        flashcore_attention_selected_config(&params_[0], config, sizeof config) == FLASHCORE_SUCCESS) {
      res.config = config;  // the forward's kernel config (the backward has no config query)
    }
  }

  PowerStats power() const { return power_; }

 private:
  void forward(size_t i) {
    flashcore_status st = flashcore_attention_forward(&params_[i], stream_);
    if (st != FLASHCORE_SUCCESS)
      throw RowError(std::string("flashcore_attention_forward: ") + flashcore_status_string(st) + ": " +
                     flashcore_last_error());
  }
  void backward(size_t i) {
    flashcore_status st = flashcore_attention_backward(&bwd_params_[i], stream_);
    if (st != FLASHCORE_SUCCESS)
      throw RowError(std::string("flashcore_attention_backward: ") + flashcore_status_string(st) + ": " +
                     flashcore_last_error());
  }
  // One timed call on buffer set `set`: the forward, the backward, or the forward then the backward (--mode).
  void call(size_t set) {
    const size_t i = set % params_.size();
    if (o_.mode != PassMode::Bwd) forward(i);
    if (runs_backward(o_.mode)) backward(i);
  }

  // Keeps the GPU busy with more calls (untimed) until the sampler has seen `power_ms` of steady load.
  template <typename Launch>
  void extend_for_power(Launch launch, double per_launch_ms, std::chrono::steady_clock::time_point t0) {
    if (!sampler_ || !sampler_->available() || o_.power_ms <= 0) return;
    for (;;) {
      double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      double left = o_.power_ms - elapsed;
      if (left <= 0) break;
      int n = static_cast<int>(std::min(10000.0, std::max(1.0, left / std::max(per_launch_ms, 1e-3))));
      for (int i = 0; i < n; ++i) launch(i);
      FC_CUDA(cudaStreamSynchronize(stream_));
    }
  }

  std::vector<double> time_plain() {
    size_t set = 0;
    for (int i = 0; i < o_.warmup; ++i) call(set++);
    FC_CUDA(cudaStreamSynchronize(stream_));
    std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(o_.iters));
    for (auto& e : ev) FC_CUDA(cudaEventCreate(&e));
    std::vector<double> times;
    try {
      if (sampler_) sampler_->start();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o_.iters; ++i) {
        FC_CUDA(cudaEventRecord(ev[2 * i], stream_));
        call(set++);
        FC_CUDA(cudaEventRecord(ev[2 * i + 1], stream_));
      }
      FC_CUDA(cudaEventSynchronize(ev.back()));
      for (int i = 0; i < o_.iters; ++i) {
        float ms = 0;
        FC_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        times.push_back(ms);
      }
      double med = summarize(times).median;
      extend_for_power([&](int) { call(set++); }, med, t0);
      if (sampler_) power_ = sampler_->stop();
    } catch (...) {
      if (sampler_) sampler_->stop();
      for (auto& e : ev) cudaEventDestroy(e);
      throw;
    }
    for (auto& e : ev) FC_CUDA(cudaEventDestroy(e));
    return times;
  }

  // CUDA-graph mode: each graph holds graph_calls consecutive calls; enough graphs are captured to cover
  // every rotation set (at most 128). Per-call time = graph time / graph_calls: no launch overhead.
  std::vector<double> time_graph() {
    const size_t k = static_cast<size_t>(o_.graph_calls);
    size_t ngraphs = std::min<size_t>(128, (params_.size() + k - 1) / k);
    std::vector<cudaGraphExec_t> execs;
    std::vector<cudaEvent_t> ev;
    std::vector<double> times;
    auto cleanup = [&]() {
      for (auto& e : ev) cudaEventDestroy(e);
      for (auto& g : execs) cudaGraphExecDestroy(g);
    };
    try {
      // Plain calls first: one-time work (module loading, attribute setup) must not land in a capture.
      for (int i = 0; i < std::max(1, o_.warmup); ++i) call(static_cast<size_t>(i));
      FC_CUDA(cudaStreamSynchronize(stream_));
      for (size_t g = 0; g < ngraphs; ++g) {
        cudaGraph_t graph = nullptr;
        FC_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
          for (size_t i = 0; i < k; ++i) call(g * k + i);
        } catch (...) {
          cudaStreamEndCapture(stream_, &graph);
          if (graph) cudaGraphDestroy(graph);
          throw;
        }
        FC_CUDA(cudaStreamEndCapture(stream_, &graph));
        cudaGraphExec_t exec = nullptr;
        cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        FC_CUDA(err);
        execs.push_back(exec);
      }
      size_t launch = 0;
      int warm = std::max(1, (o_.warmup + static_cast<int>(k) - 1) / static_cast<int>(k));
      for (int i = 0; i < warm; ++i) FC_CUDA(cudaGraphLaunch(execs[launch++ % ngraphs], stream_));
      FC_CUDA(cudaStreamSynchronize(stream_));
      ev.resize(2 * static_cast<size_t>(o_.iters));
      for (auto& e : ev) FC_CUDA(cudaEventCreate(&e));
      if (sampler_) sampler_->start();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o_.iters; ++i) {
        FC_CUDA(cudaEventRecord(ev[2 * i], stream_));
        FC_CUDA(cudaGraphLaunch(execs[launch++ % ngraphs], stream_));
        FC_CUDA(cudaEventRecord(ev[2 * i + 1], stream_));
      }
      FC_CUDA(cudaEventSynchronize(ev.back()));
      for (int i = 0; i < o_.iters; ++i) {
        float ms = 0;
        FC_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
        times.push_back(ms / static_cast<double>(k));
      }
      double med_graph = summarize(times).median * static_cast<double>(k);
      extend_for_power([&](int) { FC_CUDA(cudaGraphLaunch(execs[launch++ % ngraphs], stream_)); }, med_graph, t0);
      if (sampler_) power_ = sampler_->stop();
    } catch (...) {
      if (sampler_) sampler_->stop();
      cleanup();
      throw;
    }
    cleanup();
    return times;
  }

  const Options& o_;
  const DeviceInfo& dev_;
  RandomPool& pool_;
  cudaStream_t stream_;
  PowerSampler* sampler_;
  std::vector<flashcore_attention_params> params_;
  std::vector<flashcore_attention_params> bwd_params_;  // the backward's modes: params_ with dO, dQ, dK, dV
  DeviceArena workspace_;
  DeviceArena bwd_workspace_;  // the backward's workspace (any contents)
  DeviceArena descales_;  // e4m3: q, k, v descales (3 x batch x heads_kv floats)
  DeviceArena sinks_;     // --sinks: one float per query head
  DeviceArena vt_;        // --v-transposed: each set's transposed V
  PowerStats power_;
};

// ---------------------------------------------------------------------------------------------------
// Output

std::string shape_text(const RowSpec& r) {
  std::string s = std::to_string(r.batch) + "," + std::to_string(r.heads_q) + "," + std::to_string(r.seqlen_q) + "," +
                  std::to_string(r.head_dim) + (r.head_dim_v != 0 ? "/" + std::to_string(r.head_dim_v) : "");
  if (r.heads_kv != r.heads_q || r.seqlen_k != r.seqlen_q) s += "," + std::to_string(r.heads_kv);
  if (r.seqlen_k != r.seqlen_q) s += "," + std::to_string(r.seqlen_k);
  return s;
}

std::string repro_command(const Options& o, const RowSpec& r) {
  std::string c = "flashcore bench --shape " + shape_text(r) + " --dtype " + cli_dtype_name(r.dtype) + " --causal " +
                  (r.causal ? "1" : "0") + " --layout " + (o.problem.bhsd ? "bhsd" : "bshd") + " --iters " +
                  std::to_string(o.iters) + " --warmup " + std::to_string(o.warmup);
  if (r.precision != FLASHCORE_PRECISION_NATIVE) c += std::string(" --precision ") + cli_precision_name(r.precision);
  if (r.out_dtype != FLASHCORE_DTYPE_SAME) c += std::string(" --out-dtype ") + cli_dtype_name(r.out_dtype);
  if (o.mode != PassMode::Fwd) c += std::string(" --mode ") + mode_name(o.mode);
  if (o.deterministic) c += " --deterministic";
  if (r.local) c += " --window " + std::to_string(r.window_left) + "," + std::to_string(r.window_right);
  if (r.softcap != 0.0f) {
    char cap[32];
    std::snprintf(cap, sizeof cap, "%g", static_cast<double>(r.softcap));
    c += std::string(" --softcap ") + cap;
  }
  if (r.sinks) c += " --sinks";
  if (o.graph) c += " --graph --graph-calls " + std::to_string(o.graph_calls);
  if (!o.rotate) c += " --no-rotate";
  if (!o.lse) c += " --no-lse";
  if (o.device) c += " --device " + std::to_string(o.device);
  return c;
}

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

double tflops_per_watt(const RowResult& r) {
  if (!r.power.valid || r.power.power_mean_w <= 0 || !std::isfinite(r.tflops)) return NAN;
  return r.tflops / r.power.power_mean_w;
}

const char* kTableFmt = "%-8s %-18s %-9s %-6s %10s %10s %10s %10s %8s %13s %7s %7s %6s %5s %7s %s\n";

void print_header(const Options& o, bool check) {
  if (runs_backward(o.mode))  // the forward's table is unchanged; the backward's says what its times are
    std::printf("mode %s%s: %s; TFLOPS = %.1f x the forward's FLOPs\n", mode_name(o.mode),
                o.deterministic ? " (deterministic)" : "",
                o.mode == PassMode::Bwd ? "flashcore_attention_backward alone (the forward ran once before, untimed)"
                                        : "flashcore_attention_forward then flashcore_attention_backward per call",
                mode_flop_factor(o.mode));
  std::printf(kTableFmt, "tag", "B,H,S,D[,Hkv,Sk]", "dtype", "causal", "median_ms", "mean_ms", "p99_ms", "min_ms",
              "TFLOPS", "KV_GB/s(peak)", "W_mean", "W_peak", "SM_MHz", "temp", "TFLOP/W", check ? "check" : "");
  std::fflush(stdout);
}

// hbm_peak_gbps: the device's DRAM peak, for the KV GB/s column's share (0: unknown, no share printed).
void print_row(const RowResult& r, bool check, double hbm_peak_gbps) {
  std::string chk;
  if (check && r.checked) {
    chk = r.check_status + (std::isfinite(r.check_o_err) ? " " + fmt("%.2e", r.check_o_err) : "");
    if (std::isfinite(r.check_grad_err)) chk += " grad " + fmt("%.2e", r.check_grad_err);
  }
  if (r.status != "ok") chk = r.status + ": " + r.message;
  const PowerStats& p = r.power;
  std::printf(kTableFmt, r.spec.tag.c_str(), shape_text(r.spec).c_str(), dtype_label(r.spec).c_str(),
              r.spec.causal ? "1" : "0", fmt("%.4f", r.ms.median).c_str(), fmt("%.4f", r.ms.mean).c_str(),
              fmt("%.4f", r.ms.p99).c_str(), fmt("%.4f", r.ms.min).c_str(), fmt("%.1f", r.tflops).c_str(),
              (fmt("%.0f", r.kv_gbps) + (hbm_peak_gbps > 0 ? fmt("(%.0f%%)", 100 * r.kv_gbps / hbm_peak_gbps) : ""))
                  .c_str(),
              p.valid ? fmt("%.0f", p.power_mean_w).c_str() : "n/a", p.valid ? fmt("%.0f", p.power_peak_w).c_str() : "n/a",
              p.valid ? fmt("%.0f", p.sm_clock_mean_mhz).c_str() : "n/a",
              p.valid ? fmt("%.0f", static_cast<double>(p.temp_max_c)).c_str() : "n/a",
              fmt("%.3f", tflops_per_watt(r)).c_str(), chk.c_str());
  std::fflush(stdout);
}

void write_json(const std::string& path, const Options& o, const DeviceInfo& dev, bool nvml,
                const std::vector<RowResult>& rows) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "{\n  \"tool\": \"flashcore bench\",\n  \"cli_version\": \"" FLASHCORE_CLI_VERSION "\",\n";
  f << "  \"library_version\": \"" << json_escape(flashcore_version_string()) << "\",\n";
  f << "  \"device\": {\"name\": \"" << json_escape(dev.name) << "\", \"sm\": " << dev.major << dev.minor
    << ", \"sms\": " << dev.sms << ", \"l2_bytes\": " << dev.l2_bytes << ", \"hbm_peak_gbps\": " << json_num(dev.hbm_peak_gbps())
    << ", \"max_sm_clock_mhz\": " << dev.clock_mhz << ", \"backend\": \"" << json_escape(dev.backend) << "\""
    << ", \"nvml\": " << (nvml ? "true" : "false") << "},\n";
  f << "  \"method\": {\"iters\": " << o.iters << ", \"warmup\": " << o.warmup
    << ", \"graph\": " << (o.graph ? "true" : "false") << ", \"graph_calls\": " << o.graph_calls
    << ", \"rotate\": " << (o.rotate ? "true" : "false") << ", \"lse\": " << (o.lse ? "true" : "false")
    << ", \"layout\": \"" << (o.problem.bhsd ? "bhsd" : "bshd") << "\", \"statistic\": \"median\""
    << ", \"tflops_rule\": \"" << (o.mode == PassMode::Bwd ? "2.5*" : o.mode == PassMode::FwdBwd ? "3.5*" : "")
    << "4*B*H*D*visible_pairs; causal Sq==Sk: S*S/2\", \"mode\": \"" << mode_name(o.mode)
    << "\", \"deterministic\": " << (o.deterministic ? "true" : "false") << "},\n";
  f << "  \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowResult& r = rows[i];
    const RowSpec& s = r.spec;
    f << (i ? ",\n" : "\n") << "    {\"tag\": \"" << json_escape(s.tag) << "\", \"batch\": " << s.batch
      << ", \"heads_q\": " << s.heads_q << ", \"heads_kv\": " << s.heads_kv << ", \"seqlen_q\": " << s.seqlen_q
      << ", \"seqlen_k\": " << s.seqlen_k << ", \"head_dim\": " << s.head_dim << ", \"dtype\": \""
      << dtype_name(s.dtype) << "\", \"out_dtype\": \"" << dtype_name(flashcore::resolved_out_dtype(s.dtype, s.out_dtype))
      << "\", \"precision\": \"" << cli_precision_name(s.precision)
      << "\", \"causal\": " << (s.causal ? "true" : "false") << ", \"status\": \"" << r.status
      << "\", \"message\": \"" << json_escape(r.message) << "\", \"median_ms\": " << json_num(r.ms.median)
      << ", \"mean_ms\": " << json_num(r.ms.mean) << ", \"p99_ms\": " << json_num(r.ms.p99)
      << ", \"min_ms\": " << json_num(r.ms.min) << ", \"flops\": " << json_num(r.flops)
      << ", \"tflops\": " << json_num(r.tflops) << ", \"kv_gbps\": " << json_num(r.kv_gbps) << ", \"config\": \"" << json_escape(r.config) << "\""
      << ", \"rotate_sets\": " << r.rotate_sets
      << ", \"bytes_per_set\": " << r.bytes_per_set << ", \"mode\": \"" << mode_name(o.mode)
      << "\", \"bwd_workspace_bytes\": " << r.bwd_workspace_bytes;
    const PowerStats& p = r.power;
    f << ", \"power_mean_w\": " << (p.valid ? json_num(p.power_mean_w) : "null")
      << ", \"power_peak_w\": " << (p.valid ? json_num(p.power_peak_w) : "null")
      << ", \"sm_clock_mean_mhz\": " << (p.valid ? json_num(p.sm_clock_mean_mhz) : "null")
      << ", \"sm_clock_min_mhz\": " << (p.valid ? json_num(p.sm_clock_min_mhz) : "null")
      << ", \"temp_max_c\": " << (p.valid ? json_num(p.temp_max_c) : "null")
      << ", \"power_samples\": " << p.samples << ", \"tflops_per_w\": " << json_num(tflops_per_watt(r));
    if (r.checked)
      f << ", \"check\": {\"status\": \"" << r.check_status << "\", \"o_err\": " << json_num(r.check_o_err)
        << ", \"o_tol\": " << json_num(r.check_o_tol) << ", \"lse_err\": " << json_num(r.check_lse_err)
        << ", \"grad_err\": " << json_num(r.check_grad_err) << ", \"grad_tol\": " << json_num(r.check_grad_tol)
        << ", \"message\": \"" << json_escape(r.check_message) << "\"}";
    else
      f << ", \"check\": null";
    f << ", \"repro\": \"" << json_escape(r.repro) << "\"}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

void write_csv(const std::string& path, const Options& o, const std::vector<RowResult>& rows) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "tag,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,dtype,causal,status,median_ms,mean_ms,p99_ms,min_ms,"
       "tflops,power_mean_w,power_peak_w,sm_clock_mean_mhz,temp_max_c,tflops_per_w,check,check_o_err,repro,out_dtype,"
       "precision,mode\n";
  auto num = [](double v) { return std::isfinite(v) ? json_num(v) : std::string(); };
  for (const RowResult& r : rows) {
    const RowSpec& s = r.spec;
    const PowerStats& p = r.power;
    f << s.tag << "," << s.batch << "," << s.heads_q << "," << s.heads_kv << "," << s.seqlen_q << "," << s.seqlen_k
      << "," << s.head_dim << "," << dtype_name(s.dtype) << "," << (s.causal ? 1 : 0) << "," << r.status << ","
      << num(r.ms.median) << "," << num(r.ms.mean) << "," << num(r.ms.p99) << "," << num(r.ms.min) << ","
      << num(r.tflops) << "," << (p.valid ? num(p.power_mean_w) : "") << "," << (p.valid ? num(p.power_peak_w) : "")
      << "," << (p.valid ? num(p.sm_clock_mean_mhz) : "") << "," << (p.valid ? std::to_string(p.temp_max_c) : "")
      << "," << num(tflops_per_watt(r)) << "," << (r.checked ? r.check_status : "") << ","
      << num(r.check_o_err) << ",\"" << r.repro << "\"," << dtype_name(flashcore::resolved_out_dtype(s.dtype, s.out_dtype))
      << "," << cli_precision_name(s.precision) << "," << mode_name(o.mode) << "\n";
  }
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

#ifdef FLASHCORE_CLI_HAVE_CHECK
// A row's check columns from either checker's result (check::Result or check::fp8::Result).
template <class CheckResult>
void record_check(const CheckResult& res, RowResult& r) {
  r.checked = true;
  r.check_status = res.skipped ? "skip" : (res.passed ? "pass" : "FAIL");
  r.check_o_err = res.o_err;
  r.check_o_tol = res.o_tol;
  r.check_lse_err = res.lse_err;
  r.check_message = res.message;
}

void check_row(const Options& o, RowResult& r) {
  if (runs_8bit(r.spec)) {  // the 8-bit rule (check/check_fp8.h)
    fp8::Case c;
    c.name = "bench-" + r.spec.tag;
    c.batch = r.spec.batch, c.seqlen_q = r.spec.seqlen_q, c.seqlen_k = r.spec.seqlen_k;
    c.heads_q = r.spec.heads_q, c.heads_kv = r.spec.heads_kv, c.head_dim = r.spec.head_dim;
    c.causal = r.spec.causal, c.bhsd = o.problem.bhsd, c.with_lse = o.lse;
    c.dtype = r.spec.dtype, c.precision = r.spec.precision, c.out_dtype = r.spec.out_dtype;
    const fp8::Result res = fp8::run_case(c, o.seed, 1);
    record_check(res, r);
    if (!res.skipped) {
      char rmse[96];
      std::snprintf(rmse, sizeof rmse, "relative RMSE %.3g (tolerance %.3g)", res.rel_rmse, res.rel_rmse_tol);
      r.check_message = r.check_message.empty() ? rmse : std::string(rmse) + "; " + r.check_message;
    }
    return;
  }
  namespace ck = flashcore::check;
  ck::Case c;
  c.name = "bench-" + r.spec.tag;
  c.batch = r.spec.batch;
  c.seqlen_q = r.spec.seqlen_q;
  c.seqlen_k = r.spec.seqlen_k;
  c.heads_q = r.spec.heads_q;
  c.heads_kv = r.spec.heads_kv;
  c.head_dim = r.spec.head_dim;
  c.head_dim_v = r.spec.head_dim_v;
  c.dtype = r.spec.dtype;
  c.causal = r.spec.causal;
  c.layout = o.problem.bhsd ? ck::Layout::BHSD : ck::Layout::BSHD;
  c.with_lse = o.lse;
  c.local = r.spec.local, c.window_left = r.spec.window_left, c.window_right = r.spec.window_right;
  c.softcap = r.spec.softcap;
  if (r.spec.sinks) c.sinks = sink_values(r.spec.heads_q);
  if (o.mode != PassMode::Bwd) record_check(ck::run_case(c, o.seed, 1), r);
  if (!runs_backward(o.mode)) return;

  // The backward (check/check_bwd.h), where the float64 reference of every (query, key) pair is affordable.
  namespace bwd = flashcore::check::bwd;
  std::string status, message;
  if (bwd::reference_macs(c) > bwd::kMaxReferenceMacs) {
    char why[200];
    std::snprintf(why, sizeof why,
                  "backward not checked: %.3g reference multiply-adds > %.3g (check smaller shapes with 'flashcore "
                  "check --mode bwd --shape')",
                  bwd::reference_macs(c), bwd::kMaxReferenceMacs);
    status = "skip", message = why;
  } else {
    const bwd::Result b = bwd::run_case(c, o.seed, 1);
    status = b.skipped ? "skip" : (b.passed ? "pass" : "FAIL");
    message = b.message;
    if (!b.skipped) {
      r.check_grad_err = std::max({b.dq_err, b.dk_err, b.dv_err});
      r.check_grad_tol = b.tol;
    }
  }
  if (!r.checked) {  // --mode bwd: the backward's verdict alone
    r.checked = true;
    r.check_status = status;
    r.check_message = message;
    return;
  }
  // fwdbwd: FAIL if either failed, skip only if both were skipped.
  const std::string fwd = r.check_status;
  r.check_status = fwd == "FAIL" || status == "FAIL" ? "FAIL" : (fwd == "skip" && status == "skip" ? "skip" : "pass");
  const std::string bwd_part = "backward " + status + (message.empty() ? "" : ": " + message);
  r.check_message = r.check_message.empty() ? bwd_part : r.check_message + "; " + bwd_part;
}
#endif

}  // namespace

void print_bench_help() {
  std::printf(
      "usage: flashcore bench [seeds|grid|decode]... [--shape B,H,S,D[,Hkv[,Sk]]]... [--mode fwd|bwd|fwdbwd]\n"
      "                       [options]\n"
      "\n"
      "Times flashcore_attention_forward with CUDA events (median of --iters calls after --warmup calls),\n"
      "rotating among enough input buffer sets that each timed cycle touches more than 2x the L2 cache.\n"
      "--mode bwd times flashcore_attention_backward alone (the forward runs once per buffer set first, untimed,\n"
      "for O and LSE; random dO), --mode fwdbwd the forward then the backward in each timed call.\n"
      "\n"
      "presets (default: seeds):\n"
      "  seeds            1,8,512,64 mission; 2,8,512,64 small; 2,8,2048,64 long; 1,1,128,64 tiny;\n"
      "                   4,16,1024,64 medium; 2,8,512,128 hd128; 8,16,2048,64 large\n"
      "  grid             head dim 64/128/256 x seqlen 512..16384, batch = 16384/S, heads = 2048/D\n"
      "  decode           one new token against a KV cache: batch x cache 1x8k 8x8k 32x4k 64x16k 128x2k 16x64k,\n"
      "                   d128, 32 query heads, 8 KV heads (the decode steps of a serving engine, from one long\n"
      "                   sequence to 128 short ones; bench/serving.py's decode table has the same rows; KV_GB/s,\n"
      "                   the rate K and V are read at, is the figure)\n"
      "options:\n"
      "  --shape SPEC     B,H,S,D[,Hkv[,Sk]] (repeatable)\n"
      "  --mode M         fwd | bwd | fwdbwd (default fwd): what is timed. The backward's modes take fp16 / bf16\n"
      "                   at native precision and need the LSE; rows the library's backward does not take (head\n"
      "                   dim 256 in v1) are listed as skipped\n"
      "  --deterministic  the backward with deterministic = 1 (dQ summed in a fixed order; --mode bwd / fwdbwd)\n"
      "  --dtype D        fp16 | bf16 | both | e4m3 | e5m2 (default bf16). e4m3, e5m2: 8-bit Q, K, V (random\n"
      "                   N(0,1)*64 in the 8-bit type) with random per-(batch, KV head) descales in [1/128, 1/32], O in bf16, a\n"
      "                   zero-filled workspace (the library transposes V into it, inside the timed call)\n"
      "  --v-transposed   with --dtype e4m3 / e5m2: V transposed once per buffer set before timing\n"
      "                   (flashcore_fp8_transpose_v, FLASHCORE_FLAG_V_TRANSPOSED): the calls skip their transpose\n"
      "  --precision P    native | fp8 | int8 (default native). fp8: 16-bit inputs quantized to e4m3 by the library\n"
      "                   and run by the 8-bit kernels; int8: the high-accuracy 8-bit mode (Q, K quantized to int8,\n"
      "                   int8 Q K^T, P V in 16 bits); the quantization is timed with the attention\n"
      "  --out-dtype D    bf16 | fp16: O of --dtype e4m3 / e5m2 (default bf16) or of --precision fp8 (default the\n"
      "                   input); --precision int8 writes O in the input dtype only\n"
      "  --causal C       0 | 1 | both (default: both for presets, 0 for --shape only)\n"
      "  --window L,R     a sliding window (FlashAttention's window_size, -1 unbounded; right 0 under causal);\n"
      "                   TFLOPS count each row's visible keys\n"
      "  --softcap C      logit softcapping: scores become C * tanh(score / C)\n"
      "  --sinks          per-head attention sinks (linspace(-1, 1) over the query heads)\n"
      "  --layout L       bshd | bhsd (default bshd)\n"
      "  --iters N        timed calls (default 30)\n"
      "  --warmup N       untimed calls first (default 10)\n"
      "  --graph          CUDA-graph mode: --graph-calls K calls per graph (default 20); time per call\n"
      "                   without launch overhead\n"
      "  --check          check each row against the reference (flashcore::check::run_case; e4m3 and\n"
      "                   --precision fp8 / int8 rows: the 8-bit rule of flashcore check; --mode bwd / fwdbwd:\n"
      "                   the backward's rule of flashcore check --mode bwd, on rows whose float64 reference\n"
      "                   is affordable: at most 2e10 multiply-adds, 5*B*H*Sq*Sk*D)\n"
      "  --no-rotate      reuse one buffer set (L2-warm numbers)\n"
      "  --no-lse         do not write the log-sum-exp output\n"
      "  --power-ms N     keep the GPU busy >= N ms per row while NVML samples power (default 200; 0 = off)\n"
      "  --json FILE      write all rows (with repro commands) as JSON\n"
      "  --csv FILE       write all rows as CSV\n"
      "  --repro          print a command reproducing each row\n"
      "  --device N       CUDA device (default 0)\n"
      "  --seed N         input seed (default 1234)\n"
      "  --quiet          no progress line on stderr\n"
      "\n"
      "TFLOPS = 4*B*H*Sq*Sk*D / median (halved for causal with Sq == Sk; visible pairs when Sq != Sk), the\n"
      "same count for every dtype; as FlashAttention counts them, x 2.5 for --mode bwd, x 3.5 for fwdbwd.\n"
      "KV_GB/s = bytes of K and V (B*Sk*Hkv*D*s each, s = 2, or 1 for e4m3) / median, with the share of the\n"
      "DRAM peak in brackets (forward only: n/a in the backward's modes).\n"
      "dtype column: bf16, fp16, e4m3 (O in bf16), e4m3>fp16 (O in fp16), bf16:fp8 (--precision fp8),\n"
      "bf16:int8 (--precision int8).\n");
}

int run_bench(int argc, char** argv, int first) {
  Options o = parse_options(argc, argv, first);
  flashcore_capabilities caps = capabilities();
  int skipped = 0;
  std::vector<RowSpec> specs = build_rows(o, caps, skipped);
  DeviceInfo dev = require_device(o.device);
  for (const RowSpec& spec : specs) {
    if (runs_8bit(spec)) {  // the 8-bit kernels are sm90's: say so once, before any row
      require_hopper_backend(dev, "8-bit attention (" + dtype_label(spec) + ")");
      break;
    }
  }
  if (skipped && !o.quiet)
    std::fprintf(stderr, "flashcore bench: note: %d preset shape(s) skipped: head dim not compiled (compiled: %s)\n",
                 skipped, caps_head_dims_string(caps).c_str());

  PowerSampler sampler(dev.pci_bus_id);
  if (!sampler.available() && !o.quiet)
    std::fprintf(stderr, "flashcore bench: note: power columns n/a (%s)\n", sampler.why_unavailable().c_str());

  cudaStream_t stream = nullptr;
  FC_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::unique_ptr<RandomPool> pool(new RandomPool(o.seed));
  std::vector<RowResult> results;
  const bool tty = isatty(2);
  const bool progress = !o.quiet && specs.size() > 1;
  int failures = 0;

  print_header(o, o.check);
  try {
    for (size_t i = 0; i < specs.size(); ++i) {
      RowResult r;
      r.spec = specs[i];
      r.repro = repro_command(o, r.spec);
      if (progress) {
        std::fprintf(stderr, "%s[%zu/%zu] %s %s causal=%d%s", tty ? "\r\033[K" : "", i + 1, specs.size(),
                     dtype_name(r.spec.dtype), shape_text(r.spec).c_str(), r.spec.causal ? 1 : 0, tty ? "" : "\n");
        std::fflush(stderr);
      }
      try {
        RowRunner runner(o, dev, *pool, stream, &sampler);
        runner.run(r);
        r.power = runner.power();
#ifdef FLASHCORE_CLI_HAVE_CHECK
        if (o.check) {
          check_row(o, r);
          if (r.check_status == "FAIL") ++failures;
        }
#endif
      } catch (const RowSkip& e) {  // the library's backward does not take this row: listed, not a failure
        r.status = "skipped";
        r.message = e.what();
      } catch (const RowError& e) {
        r.status = "error";
        r.message = e.what();
        ++failures;
      }
      if (progress && tty) std::fprintf(stderr, "\r\033[K");
      print_row(r, o.check, dev.hbm_peak_gbps());
      if (o.repro) std::printf("  repro: %s\n", r.repro.c_str());
      results.push_back(r);
    }
  } catch (...) {
    // A CUDA error (sticky) ends the run; keep what was measured.
    if (!o.json_path.empty()) write_json(o.json_path, o, dev, sampler.available(), results);
    if (!o.csv_path.empty()) write_csv(o.csv_path, o, results);
    throw;
  }
  pool.reset();
  FC_CUDA(cudaStreamDestroy(stream));
  if (!o.json_path.empty()) write_json(o.json_path, o, dev, sampler.available(), results);
  if (!o.csv_path.empty()) write_csv(o.csv_path, o, results);
  if (failures) {
    std::fprintf(stderr, "flashcore bench: %d of %zu row(s) failed\n", failures, results.size());
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace fccli

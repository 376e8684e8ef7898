// `flashcore check`: the correctness sweep (flashcore::check) from the command line.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "commands.h"
#include "common.h"
#include "check/check_fp8.h"

#ifdef FLASHCORE_CLI_HAVE_CHECK
#include "check/check.h"
#include "check/check_bwd.h"
#endif

namespace fccli {
namespace fp8 = flashcore::check::fp8;

void print_check_help() {
  std::printf(
      "usage: flashcore check [--quick | --shape B,H,S,D[,Hkv[,Sk]]...] [--mode fwd|bwd|fwdbwd] [options]\n"
      "\n"
      "Runs FlashCore against the float64 CPU reference, one line per case: 16-bit cases through\n"
      "flashcore::check::run_case, 8-bit cases (e4m3 and e5m2 inputs with per-(batch, KV head) descales, and\n"
      "--precision fp8 / int8: 16-bit inputs quantized by the library) through their own runner.\n"
      "Without --shape: the full case list, or the small subset with --quick; both end with the 8-bit cases\n"
      "when this build has e4m3 kernels, and with the --precision int8 ones when it has int8 Q K^T kernels.\n"
      "The 16-bit lists include the attention variants (sliding window, softcap, sinks, attention_chunk; their\n"
      "names hold _win<L>x<R>, _cap<C>, _sinks, _chunk<N>: --filter _win, --filter _sinks, ...).\n"
      "--mode bwd checks the backward pass instead (flashcore::check::bwd::run_case): random Q, K, V, dO, the\n"
      "forward once (O, LSE), then flashcore_attention_backward with deterministic = 1 and = 0, dQ, dK, dV\n"
      "(poisoned with NaN before every call, as is the backward's workspace) against the float64 reference; its\n"
      "case list (fp16 / bf16, head dims 64 / 128, names bwd_*; with the variants sliding window, softcap and\n"
      "sinks (and dL/dsinks), named as the forward's: --filter _win, _cap, _sinks) or --shape. --mode fwdbwd runs\n"
      "both lists.\n"
      "options:\n"
      "  --mode M         fwd | bwd | fwdbwd (default fwd): the forward's cases, the backward's, or both\n"
      "  --quick          small shapes of every dtype x head dim x causal (for sanitizers / smoke runs)\n"
      "  --shape SPEC     B,H,S,D[,Hkv[,Sk]] (repeatable); uses --dtype, --causal, --layout, --precision,\n"
      "                   --out-dtype\n"
      "  --dtype D        fp16 | bf16 | both | e4m3 | e5m2 (default bf16; --shape only)\n"
      "  --precision P    native | fp8 | int8 (default native; --shape only): fp8 runs 16-bit inputs through the\n"
      "                   e4m3 kernels (quantized by the library), int8 through the high-accuracy 8-bit mode\n"
      "                   (int8 Q K^T, P V in 16 bits)\n"
      "  --out-dtype D    bf16 | fp16: O of 8-bit cases (default bf16) or of --precision fp8 (default the input\n"
      "                   dtype; --precision int8 writes O in the input dtype only); --shape only\n"
      "  --causal C       0 | 1 | both (default both; --shape only)\n"
      "  --layout L       bshd | bhsd (default bshd; --shape only)\n"
      "  --filter TEXT    only cases whose name or description contains TEXT (8-bit: \"e4m3\", \"e5m2\", \"fp8\",\n"
      "                   \"int8\")\n"
      "  --determinism N  also require bit-identical output over N runs (backward: N runs with deterministic = 1\n"
      "                   give bit-identical dQ, dK, dV, and N runs with deterministic = 0 bit-identical dK, dV)\n"
      "  --seed N         input seed (default 1)\n"
      "  --device N       CUDA device (default 0)\n"
      "  --json FILE      write every case (shape, errors, tolerances, verdict, message) as JSON\n"
      "  --csv FILE       write every case as CSV, one row per case\n"
      "\n"
      "tolerances: 16-bit cases: max |O - ref| <= 2 * (the low-precision model's error) + 1e-3 (fp16) / 4e-3 (bf16),\n"
      "LSE likewise (relative). 8-bit cases (P is rounded to e4m3 in the kernel): 8-bit inputs against the\n"
      "reference of the dequantized inputs: relative RMSE of O <= 0.035, max |O - ref| <= 0.08 * max |ref| + 1e-2,\n"
      "|LSE - ref| <= 2e-2 + 2e-3 * |ref|; --precision fp8 against the reference of the unquantized inputs:\n"
      "relative RMSE <= 0.07, max |O - ref| <= 0.2 * max |ref| + 2e-2, |LSE - ref| <= 0.25; --precision int8\n"
      "(P V in 16 bits) likewise: relative RMSE <= 0.025, max |O - ref| <= 0.08 * max |ref| + 1e-2,\n"
      "|LSE - ref| <= 0.1. Every case: O and LSE written and finite, O = 0 / LSE = -inf on rows that see no key\n"
      "(LSE = sinks[h] with sinks).\n"
      "Backward (--mode bwd): for each of dQ, dK, dV, max |dX - ref| / max |ref| <= 2.5e-3 (fp16) / 2e-2 (bf16)\n"
      "(2-3x the error of a low-precision model of the FlashAttention backward; src/check/check_bwd.cpp);\n"
      "every gradient written and finite, dQ = 0 on rows that see no key.\n"
      "\n"
      "exit status: 0 all passed (or skipped), 1 a case failed, 2 bad arguments, 3 no supported GPU\n");
}

namespace {

struct CheckOptions {
  PassMode mode = PassMode::Fwd;
  bool quick = false;
  std::vector<std::string> shapes;
  ProblemFlags problem;  // dtypes, causal (default both), layout
  std::string filter;
  int repeats = 1;
  int device = 0;
  uint64_t seed = 1;
  std::string json_path, csv_path;
};

// Returns false when --help was printed.
bool parse_check_options(int argc, char** argv, int first, CheckOptions& o) {
  o.problem.allow_8bit = true;
  Args a(argc, argv, first);
  while (!a.done()) {
    std::string f = a.next();
    if (f == "-h" || f == "--help") {
      print_check_help();
      return false;
    } else if (f == "--quick") {
      a.no_value(f);
      o.quick = true;
    } else if (f == "--mode") {
      o.mode = parse_mode(a.value(f));
    } else if (f == "--shape") {
      o.shapes.push_back(a.value(f));
    } else if (parse_problem_flag(f, a, o.problem)) {
    } else if (f == "--filter") {
      o.filter = a.value(f);
    } else if (f == "--determinism") {
      o.repeats = static_cast<int>(parse_int(f, a.value(f), 1, 100000));
    } else if (f == "--seed") {
      o.seed = static_cast<uint64_t>(parse_int(f, a.value(f), 0, INT64_MAX));
    } else if (f == "--device") {
      o.device = static_cast<int>(parse_int(f, a.value(f), 0, 1023));
    } else if (f == "--json" || f == "--csv") {
      std::string& path = f == "--json" ? o.json_path : o.csv_path;
      path = a.value(f);
      if (path.empty()) usage_error(f + ": empty file name");
    } else {
      usage_error("unknown option '" + f + "'");
    }
  }
  if (o.quick && !o.shapes.empty()) usage_error("--quick and --shape are exclusive");
  check_problem_flags(o.problem);  // --precision against --dtype, --out-dtype
  check_mode_flags(o.mode, o.problem);  // the backward: 16-bit, native precision
  if (o.problem.causal.empty()) o.problem.causal = {false, true};
  return true;
}

}  // namespace

#ifndef FLASHCORE_CLI_HAVE_CHECK

int run_check(int argc, char** argv, int first) {
  CheckOptions o;
  if (!parse_check_options(argc, argv, first, o)) return kExitOk;
  usage_error("this flashcore was built without the check library");
}

#else

namespace ck = flashcore::check;
namespace bwd = flashcore::check::bwd;

namespace {

// One case of the run: a 16-bit one (flashcore::check), an 8-bit one (check/check_fp8.h), or a backward one
// (check/check_bwd.h: c through the backward).
struct Item {
  bool eight = false;
  ck::Case c;
  fp8::Case f;
  bool backward = false;
  const std::string& name() const { return eight ? f.name : c.name; }
  std::string description() const {
    return eight ? fp8::describe(f) : (backward ? "backward " : "") + ck::describe(c);
  }
};

// What the report files and the console line say of a case, whichever runner ran it.
struct CaseRow {
  std::string name, description, dtype, out_dtype, precision, shape, layout;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  bool causal = false, with_lse = true;
  uint64_t seed = 0;
  bool skipped = false, passed = false, deterministic = true;
  double o_err = NAN, o_tol = NAN, lse_err = NAN, lse_tol = NAN;
  double rel_rmse = NAN, rel_rmse_tol = NAN;  // 8-bit cases only
  std::string message;
  // Backward cases: "bwd" (the others "fwd"), each gradient's max |error| / max |ref|, their bound, and whether the
  // deterministic = 0 runs gave bit-identical dK and dV (deterministic: the deterministic = 1 runs, all three).
  std::string mode = "fwd";
  double dq_err = NAN, dk_err = NAN, dv_err = NAN, grad_tol = NAN;
  bool dkdv_deterministic = true;
  // Backward cases with sinks: dL/dsinks' max |error| / max |ref| and its bound (NaN without sinks).
  double dsinks_err = NAN, dsinks_tol = NAN;
};

const char* verdict_word(const CaseRow& r) { return r.skipped ? "skipped" : (r.passed ? "passed" : "failed"); }

std::string shape_text(int64_t b, int64_t hq, int64_t sq, int64_t d, int64_t hkv, int64_t sk) {
  return std::to_string(b) + "," + std::to_string(hq) + "," + std::to_string(sq) + "," + std::to_string(d) + "," +
         std::to_string(hkv) + "," + std::to_string(sk);
}

CaseRow run_item(const Item& it, uint64_t seed, int repeats) {
  CaseRow row;
  row.name = it.name();
  row.description = it.description();
  row.seed = seed;
  if (it.backward) {
    const ck::Case& c = it.c;
    row.mode = "bwd";
    row.dtype = dtype_name(c.dtype);
    row.out_dtype = row.dtype;
    row.precision = "native";
    row.batch = c.batch, row.heads_q = c.heads_q, row.heads_kv = c.heads_kv, row.seqlen_q = c.seqlen_q;
    row.seqlen_k = c.seqlen_k, row.head_dim = c.head_dim, row.causal = c.causal, row.with_lse = false;
    row.layout = c.layout == ck::Layout::BHSD ? "bhsd" : "bshd";
    const bwd::Result r = bwd::run_case(c, seed, repeats);
    row.skipped = r.skipped, row.passed = r.passed, row.deterministic = r.deterministic, row.message = r.message;
    row.dkdv_deterministic = r.dkdv_deterministic;
    row.dq_err = r.dq_err, row.dk_err = r.dk_err, row.dv_err = r.dv_err, row.grad_tol = r.tol;
    if (r.with_dsinks) row.dsinks_err = r.dsinks_err, row.dsinks_tol = r.dsinks_tol;
  } else if (it.eight) {
    const fp8::Case& c = it.f;
    row.dtype = dtype_name(c.dtype);
    row.out_dtype = dtype_name(fp8::resolved_out_dtype(c));
    row.precision = fp8::precision_name(c);
    row.batch = c.batch, row.heads_q = c.heads_q, row.heads_kv = c.heads_kv, row.seqlen_q = c.seqlen_q;
    row.seqlen_k = c.seqlen_k, row.head_dim = c.head_dim, row.causal = c.causal, row.with_lse = c.with_lse;
    row.layout = c.bhsd ? "bhsd" : "bshd";
    const fp8::Result r = fp8::run_case(c, seed, repeats);
    row.skipped = r.skipped, row.passed = r.passed, row.deterministic = r.deterministic, row.message = r.message;
    row.o_err = r.o_err, row.o_tol = r.o_tol, row.lse_err = r.lse_err, row.lse_tol = r.lse_tol;
    row.rel_rmse = r.rel_rmse, row.rel_rmse_tol = r.rel_rmse_tol;
  } else {
    const ck::Case& c = it.c;
    row.dtype = dtype_name(c.dtype);
    row.out_dtype = row.dtype;
    row.precision = "native";
    row.batch = c.batch, row.heads_q = c.heads_q, row.heads_kv = c.heads_kv, row.seqlen_q = c.seqlen_q;
    row.seqlen_k = c.seqlen_k, row.head_dim = c.head_dim, row.causal = c.causal, row.with_lse = c.with_lse;
    row.layout = c.layout == ck::Layout::BHSD ? "bhsd" : "bshd";
    const ck::Result r = ck::run_case(c, seed, repeats);
    row.skipped = r.skipped, row.passed = r.passed, row.deterministic = r.deterministic, row.message = r.message;
    row.o_err = r.o_err, row.o_tol = r.o_tol, row.lse_err = r.lse_err, row.lse_tol = r.lse_tol;
  }
  row.shape = shape_text(row.batch, row.heads_q, row.seqlen_q, row.head_dim, row.heads_kv, row.seqlen_k);
  return row;
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

void write_json(const std::string& path, const CheckOptions& o, const DeviceInfo& dev, const std::vector<CaseRow>& rows,
                int passed, int failed, int skipped) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "{\n  \"tool\": \"flashcore check\",\n  \"cli_version\": \"" FLASHCORE_CLI_VERSION "\",\n";
  f << "  \"library_version\": \"" << json_escape(flashcore_version_string()) << "\",\n";
  f << "  \"device\": {\"index\": " << dev.index << ", \"name\": \"" << json_escape(dev.name) << "\", \"sm\": "
    << dev.major << dev.minor << ", \"backend\": \"" << json_escape(dev.backend) << "\"},\n";
  f << "  \"seed\": " << o.seed << ",\n  \"determinism_runs\": " << o.repeats << ",\n";
  f << "  \"mode\": \"" << mode_name(o.mode) << "\",\n";
  f << "  \"summary\": {\"passed\": " << passed << ", \"failed\": " << failed << ", \"skipped\": " << skipped
    << "},\n  \"cases\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const CaseRow& r = rows[i];
    const bool ran = !r.skipped;
    f << (i ? ",\n" : "\n") << "    {\"name\": \"" << json_escape(r.name) << "\", \"description\": \""
      << json_escape(r.description) << "\", \"dtype\": \"" << r.dtype << "\", \"shape\": \"" << r.shape
      << "\", \"batch\": " << r.batch << ", \"heads_q\": " << r.heads_q << ", \"heads_kv\": " << r.heads_kv
      << ", \"seqlen_q\": " << r.seqlen_q << ", \"seqlen_k\": " << r.seqlen_k << ", \"head_dim\": " << r.head_dim
      << ", \"causal\": " << (r.causal ? "true" : "false") << ", \"layout\": \"" << r.layout << "\", \"seed\": "
      << r.seed << ", \"status\": \"" << verdict_word(r) << "\""
      << ", \"o_err\": " << (ran ? num(r.o_err) : "null") << ", \"o_tol\": " << (ran ? num(r.o_tol) : "null")
      << ", \"lse_err\": " << (ran && r.with_lse ? num(r.lse_err) : "null")
      << ", \"lse_tol\": " << (ran && r.with_lse ? num(r.lse_tol) : "null") << ", \"deterministic\": "
      << (ran && o.repeats > 1 ? (r.deterministic ? "true" : "false") : "null") << ", \"message\": \""
      << json_escape(r.message) << "\", \"out_dtype\": \"" << r.out_dtype << "\", \"precision\": \"" << r.precision
      << "\", \"rel_rmse\": " << (ran ? num(r.rel_rmse) : "null")
      << ", \"rel_rmse_tol\": " << (ran ? num(r.rel_rmse_tol) : "null") << ", \"mode\": \"" << r.mode
      << "\", \"dq_err\": " << (ran ? num(r.dq_err) : "null") << ", \"dk_err\": " << (ran ? num(r.dk_err) : "null")
      << ", \"dv_err\": " << (ran ? num(r.dv_err) : "null") << ", \"grad_tol\": " << (ran ? num(r.grad_tol) : "null")
      << ", \"dsinks_err\": " << (ran && std::isfinite(r.dsinks_tol) ? num(r.dsinks_err) : "null")
      << ", \"dsinks_tol\": " << (ran && std::isfinite(r.dsinks_tol) ? num(r.dsinks_tol) : "null")
      << ", \"dkdv_deterministic\": "
      << (ran && o.repeats > 1 && r.mode == "bwd" ? (r.dkdv_deterministic ? "true" : "false") : "null") << "}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

void write_csv(const std::string& path, const CheckOptions& o, const std::vector<CaseRow>& rows) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "name,dtype,shape,causal,layout,seed,o_err,o_tol,lse_err,lse_tol,deterministic,status,message,out_dtype,"
       "precision,rel_rmse,rel_rmse_tol,mode,dq_err,dk_err,dv_err,grad_tol,dkdv_deterministic\n";
  auto cell = [](bool have, double v) { return have && std::isfinite(v) ? num(v) : std::string(); };
  for (const CaseRow& r : rows) {
    const bool ran = !r.skipped;
    f << csv_field(r.name) << "," << r.dtype << "," << csv_field(r.shape) << "," << (r.causal ? 1 : 0) << ","
      << r.layout << "," << r.seed << "," << cell(ran, r.o_err) << "," << cell(ran, r.o_tol) << ","
      << cell(ran && r.with_lse, r.lse_err) << "," << cell(ran && r.with_lse, r.lse_tol) << ","
      << (ran && o.repeats > 1 ? (r.deterministic ? "yes" : "no") : "") << "," << verdict_word(r) << ","
      << csv_field(r.message) << "," << r.out_dtype << "," << r.precision << "," << cell(ran, r.rel_rmse) << ","
      << cell(ran, r.rel_rmse_tol) << "," << r.mode << "," << cell(ran, r.dq_err) << "," << cell(ran, r.dk_err) << ","
      << cell(ran, r.dv_err) << "," << cell(ran, r.grad_tol) << ","
      << (ran && o.repeats > 1 && r.mode == "bwd" ? (r.dkdv_deterministic ? "yes" : "no") : "") << "\n";
  }
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

}  // namespace

int run_check(int argc, char** argv, int first) {
  CheckOptions o;
  if (!parse_check_options(argc, argv, first, o)) return kExitOk;
  const std::vector<std::string>& shapes = o.shapes;
  const std::string& filter = o.filter;
  const int repeats = o.repeats;

  flashcore_capabilities caps = capabilities();
  // The 8-bit cases need the e4m3 kernels, except precision = INT8's: the int8 Q K^T kernels.
  const bool have_e4m3 = caps_has_dtype(caps, FLASHCORE_DTYPE_FP8_E4M3), have_int8 = have_int8_kernels();
  const bool fwd = o.mode != PassMode::Bwd, backward = runs_backward(o.mode);
  std::vector<Item> list;
  if (shapes.empty()) {
    if (fwd) {
      for (const ck::Case& c : ck::cases(o.quick)) list.push_back({false, c, {}});
      for (const fp8::Case& c : fp8::cases(o.quick))
        if (fp8::is_precision_int8(c) ? have_int8 : have_e4m3) list.push_back({true, {}, c});
    }
    if (backward)
      for (const ck::Case& c : bwd::cases(o.quick)) list.push_back({false, c, {}, true});
  } else {
    for (flashcore_dtype dt : o.problem.dtypes)
      if (!caps_has_dtype(caps, dt))
        usage_error(std::string("unsupported dtype ") + cli_dtype_name(dt) + ": not compiled into this FlashCore");
    require_precision_kernels(o.problem.precision, caps);
    for (const std::string& s : shapes) {
      for (flashcore_dtype dt : o.problem.dtypes) {
        for (bool c : o.problem.causal) {
          ck::Case cs;
          std::string err;
          if (!ck::parse_shape(s, cs, err)) usage_error("malformed shape '" + s + "': " + err);
          if (!caps_has_head_dim(caps, cs.head_dim))
            usage_error("unsupported head dim " + std::to_string(cs.head_dim) + " in shape '" + s +
                        "' (compiled: " + caps_head_dims_string(caps) + ")");
          if (flashcore::is_8bit(dt) || o.problem.precision != FLASHCORE_PRECISION_NATIVE) {
            fp8::Case f;
            f.batch = cs.batch, f.heads_q = cs.heads_q, f.heads_kv = cs.heads_kv, f.seqlen_q = cs.seqlen_q;
            f.seqlen_k = cs.seqlen_k, f.head_dim = cs.head_dim, f.causal = c, f.bhsd = o.problem.bhsd;
            f.dtype = dt;
            f.precision = flashcore::is_8bit(dt) ? FLASHCORE_PRECISION_NATIVE : o.problem.precision;
            f.out_dtype = o.problem.out_dtype;
            f.name = "shape " + s;
            list.push_back({true, {}, f});
            continue;
          }
          cs.dtype = dt;
          cs.causal = c;
          cs.layout = o.problem.bhsd ? ck::Layout::BHSD : ck::Layout::BSHD;
          cs.name = "shape " + s;
          if (fwd) list.push_back({false, cs, {}});
          if (backward) {  // 16-bit, native precision (check_mode_flags); the library decides on the head dim
            cs.name = "bwd shape " + s;
            list.push_back({false, cs, {}, true});
          }
        }
      }
    }
  }
  if (!filter.empty()) {
    std::vector<Item> kept;
    for (const Item& it : list)
      if (it.name().find(filter) != std::string::npos || it.description().find(filter) != std::string::npos)
        kept.push_back(it);
    list.swap(kept);
  }

  // Any GPU a backend serves: the cases a backend does not run (8-bit, the backward, off Hopper) are reported as SKIP
  // with the library's reason.
  const DeviceInfo dev = require_device(o.device);
  if (shapes.empty() && fwd && !have_e4m3)
    std::fprintf(stderr, "flashcore check: note: no e4m3 kernels in this build: the e4m3, e5m2 and precision fp8 "
                         "cases are left out\n");
  if (shapes.empty() && fwd && !have_int8)
    std::fprintf(stderr, "flashcore check: note: no int8 Q K^T kernels in this build: the precision int8 cases are "
                         "left out\n");

  int passed = 0, failed = 0, skipped = 0;
  std::vector<CaseRow> rows;
  auto write_files = [&]() {
    if (!o.json_path.empty()) write_json(o.json_path, o, dev, rows, passed, failed, skipped);
    if (!o.csv_path.empty()) write_csv(o.csv_path, o, rows);
  };
  try {
    for (size_t i = 0; i < list.size(); ++i) {
      const CaseRow r = run_item(list[i], o.seed + i, repeats);
      rows.push_back(r);
      const char* verdict = r.skipped ? "SKIP" : (r.passed ? "PASS" : "FAIL");
      if (r.skipped)
        ++skipped;
      else if (r.passed)
        ++passed;
      else
        ++failed;
      std::printf("%s  %-28s %s", verdict, r.name.c_str(), r.description.c_str());
      if (!r.skipped && r.mode == "bwd") {
        // Each gradient's max |error| / max |ref|, then the bound they share.
        std::printf("  dq=%.3e dk=%.3e dv=%.3e /%.1e", r.dq_err, r.dk_err, r.dv_err, r.grad_tol);
        if (std::isfinite(r.dsinks_tol)) std::printf(" dsinks=%.3e/%.1e", r.dsinks_err, r.dsinks_tol);
        if (repeats > 1)
          std::printf(" deterministic=%s dkdv_deterministic(det=0)=%s", r.deterministic ? "yes" : "NO",
                      r.dkdv_deterministic ? "yes" : "NO");
      } else if (!r.skipped) {
        if (std::isfinite(r.rel_rmse_tol)) std::printf("  rmse=%.3e/%.3e", r.rel_rmse, r.rel_rmse_tol);
        std::printf("  o_err=%.3e/%.3e", r.o_err, r.o_tol);
        if (r.with_lse) std::printf(" lse_err=%.3e/%.3e", r.lse_err, r.lse_tol);
        if (repeats > 1) std::printf(" deterministic=%s", r.deterministic ? "yes" : "NO");
      }
      if (!r.message.empty()) std::printf("  (%s)", r.message.c_str());
      std::printf("\n");
      std::fflush(stdout);
    }
  } catch (...) {
    write_files();  // keep what was checked before the error
    throw;
  }
  write_files();
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? kExitFailure : kExitOk;
}

#endif

}  // namespace fccli

// `flashcore check`: the correctness sweep (flashcore::check) from the command line.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "commands.h"
#include "common.h"

#ifdef FLASHCORE_CLI_HAVE_CHECK
#include "check/check.h"
#endif

namespace fccli {

void print_check_help() {
  std::printf(
      "usage: flashcore check [--quick | --shape B,H,S,D[,Hkv[,Sk]]...] [options]\n"
      "\n"
      "Runs FlashCore against the float64 CPU reference (flashcore::check::run_case), one line per case.\n"
      "Without --shape: the full case list, or the small subset with --quick.\n"
      "options:\n"
      "  --quick          small shapes of every dtype x head dim x causal (for sanitizers / smoke runs)\n"
      "  --shape SPEC     B,H,S,D[,Hkv[,Sk]] (repeatable); uses --dtype, --causal, --layout\n"
      "  --dtype D        fp16 | bf16 | both (default bf16; --shape only)\n"
      "  --causal C       0 | 1 | both (default both; --shape only)\n"
      "  --layout L       bshd | bhsd (default bshd; --shape only)\n"
      "  --filter TEXT    only cases whose name or description contains TEXT\n"
      "  --determinism N  also require bit-identical output over N runs\n"
      "  --seed N         input seed (default 1)\n"
      "  --device N       CUDA device (default 0)\n"
      "  --json FILE      write every case (shape, errors, tolerances, verdict, message) as JSON\n"
      "  --csv FILE       write every case as CSV, one row per case\n"
      "\n"
      "exit status: 0 all passed (or skipped), 1 a case failed, 2 bad arguments, 3 no Hopper GPU\n");
}

namespace {

struct CheckOptions {
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
  Args a(argc, argv, first);
  while (!a.done()) {
    std::string f = a.next();
    if (f == "-h" || f == "--help") {
      print_check_help();
      return false;
    } else if (f == "--quick") {
      a.no_value(f);
      o.quick = true;
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

namespace {

struct CaseRow {
  ck::Case c;
  ck::Result r;
  uint64_t seed = 0;
};

const char* verdict_word(const ck::Result& r) { return r.skipped ? "skipped" : (r.passed ? "passed" : "failed"); }

std::string shape_text(const ck::Case& c) {
  return std::to_string(c.batch) + "," + std::to_string(c.heads_q) + "," + std::to_string(c.seqlen_q) + "," +
         std::to_string(c.head_dim) + "," + std::to_string(c.heads_kv) + "," + std::to_string(c.seqlen_k);
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
    << dev.major << dev.minor << "},\n";
  f << "  \"seed\": " << o.seed << ",\n  \"determinism_runs\": " << o.repeats << ",\n";
  f << "  \"summary\": {\"passed\": " << passed << ", \"failed\": " << failed << ", \"skipped\": " << skipped
    << "},\n  \"cases\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ck::Case& c = rows[i].c;
    const ck::Result& r = rows[i].r;
    const bool ran = !r.skipped;
    f << (i ? ",\n" : "\n") << "    {\"name\": \"" << json_escape(c.name) << "\", \"description\": \""
      << json_escape(ck::describe(c)) << "\", \"dtype\": \"" << dtype_name(c.dtype) << "\", \"shape\": \""
      << shape_text(c) << "\", \"batch\": " << c.batch << ", \"heads_q\": " << c.heads_q
      << ", \"heads_kv\": " << c.heads_kv << ", \"seqlen_q\": " << c.seqlen_q << ", \"seqlen_k\": " << c.seqlen_k
      << ", \"head_dim\": " << c.head_dim << ", \"causal\": " << (c.causal ? "true" : "false")
      << ", \"layout\": \"" << (c.layout == ck::Layout::BHSD ? "bhsd" : "bshd") << "\", \"seed\": " << rows[i].seed
      << ", \"status\": \"" << verdict_word(r) << "\""
      << ", \"o_err\": " << (ran ? num(r.o_err) : "null") << ", \"o_tol\": " << (ran ? num(r.o_tol) : "null")
      << ", \"lse_err\": " << (ran && c.with_lse ? num(r.lse_err) : "null")
      << ", \"lse_tol\": " << (ran && c.with_lse ? num(r.lse_tol) : "null") << ", \"deterministic\": "
      << (ran && o.repeats > 1 ? (r.deterministic ? "true" : "false") : "null") << ", \"message\": \""
      << json_escape(r.message) << "\"}";
  }
  f << "\n  ]\n}\n";
  if (!f) throw CliError(kExitFailure, "error writing " + path);
}

void write_csv(const std::string& path, const CheckOptions& o, const std::vector<CaseRow>& rows) {
  std::ofstream f(path);
  if (!f) throw CliError(kExitFailure, "cannot write " + path);
  f << "name,dtype,shape,causal,layout,seed,o_err,o_tol,lse_err,lse_tol,deterministic,status,message\n";
  auto cell = [](bool have, double v) { return have && std::isfinite(v) ? num(v) : std::string(); };
  for (const CaseRow& row : rows) {
    const ck::Case& c = row.c;
    const ck::Result& r = row.r;
    const bool ran = !r.skipped;
    f << csv_field(c.name) << "," << dtype_name(c.dtype) << "," << csv_field(shape_text(c)) << ","
      << (c.causal ? 1 : 0) << "," << (c.layout == ck::Layout::BHSD ? "bhsd" : "bshd") << "," << row.seed << ","
      << cell(ran, r.o_err) << "," << cell(ran, r.o_tol) << "," << cell(ran && c.with_lse, r.lse_err) << ","
      << cell(ran && c.with_lse, r.lse_tol) << ","
      << (ran && o.repeats > 1 ? (r.deterministic ? "yes" : "no") : "") << "," << verdict_word(r) << ","
      << csv_field(r.message) << "\n";
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
  std::vector<ck::Case> list;
  if (shapes.empty()) {
    list = ck::cases(o.quick);
  } else {
    for (flashcore_dtype dt : o.problem.dtypes)
      if (!caps_has_dtype(caps, dt))
        usage_error(std::string("unsupported dtype ") + dtype_name(dt) + ": not compiled into this FlashCore");
    for (const std::string& s : shapes) {
      for (flashcore_dtype dt : o.problem.dtypes) {
        for (bool c : o.problem.causal) {
          ck::Case cs;
          std::string err;
          if (!ck::parse_shape(s, cs, err)) usage_error("malformed shape '" + s + "': " + err);
          if (!caps_has_head_dim(caps, cs.head_dim))
            usage_error("unsupported head dim " + std::to_string(cs.head_dim) + " in shape '" + s +
                        "' (compiled: " + caps_head_dims_string(caps) + ")");
          cs.dtype = dt;
          cs.causal = c;
          cs.layout = o.problem.bhsd ? ck::Layout::BHSD : ck::Layout::BSHD;
          cs.name = "shape " + s;
          list.push_back(cs);
        }
      }
    }
  }
  if (!filter.empty()) {
    std::vector<ck::Case> kept;
    for (const ck::Case& c : list)
      if (c.name.find(filter) != std::string::npos || ck::describe(c).find(filter) != std::string::npos)
        kept.push_back(c);
    list.swap(kept);
  }

  const DeviceInfo dev = require_hopper(o.device);

  int passed = 0, failed = 0, skipped = 0;
  std::vector<CaseRow> rows;
  auto write_files = [&]() {
    if (!o.json_path.empty()) write_json(o.json_path, o, dev, rows, passed, failed, skipped);
    if (!o.csv_path.empty()) write_csv(o.csv_path, o, rows);
  };
  try {
    for (size_t i = 0; i < list.size(); ++i) {
      const ck::Case& c = list[i];
      ck::Result r = ck::run_case(c, o.seed + i, repeats);
      rows.push_back({c, r, o.seed + i});
      const char* verdict = r.skipped ? "SKIP" : (r.passed ? "PASS" : "FAIL");
      if (r.skipped)
        ++skipped;
      else if (r.passed)
        ++passed;
      else
        ++failed;
      std::printf("%s  %-28s %s", verdict, c.name.c_str(), ck::describe(c).c_str());
      if (!r.skipped) {
        std::printf("  o_err=%.3e/%.3e", r.o_err, r.o_tol);
        if (c.with_lse) std::printf(" lse_err=%.3e/%.3e", r.lse_err, r.lse_tol);
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

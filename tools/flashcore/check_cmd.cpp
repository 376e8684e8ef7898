// `flashcore check`: the correctness sweep (flashcore::check) from the command line.
#include <cstdio>

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
      "Exit status: 0 all passed (or skipped), 1 a case failed, 2 bad arguments, 3 no Hopper GPU.\n");
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
    } else {
      usage_error("check: unknown option '" + f + "'");
    }
  }
  if (o.quick && !o.shapes.empty()) usage_error("check: --quick and --shape are exclusive");
  if (o.problem.causal.empty()) o.problem.causal = {false, true};
  return true;
}

}  // namespace

#ifndef FLASHCORE_CLI_HAVE_CHECK

int run_check(int argc, char** argv, int first) {
  CheckOptions o;
  if (!parse_check_options(argc, argv, first, o)) return kExitOk;
  usage_error("check: this flashcore was built without the check library");
}

#else

namespace ck = flashcore::check;

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

  require_hopper(o.device);

  int passed = 0, failed = 0, skipped = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const ck::Case& c = list[i];
    ck::Result r = ck::run_case(c, o.seed + i, repeats);
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
  std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? kExitFailure : kExitOk;
}

#endif

}  // namespace fccli

// `flashcore`: benchmark, correctness check and info tool for the FlashCore attention library. The program's entry,
// flashcore_cli_main (cli.h): main.cpp calls it; in the Python wheel it is part of libflashcore.so, and the
// wheel's flashcore/bin/flashcore is main.cpp linked to that one library.
#include "cli.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "common.h"

namespace {

void print_help(FILE* out) {
  std::fprintf(out,
      "usage: flashcore <command> [options]\n"
      "\n"
      "commands:\n"
      "  bench    time the forward pass (presets seeds, grid; --shape B,H,S,D[,Hkv[,Sk]])\n"
      "  check    correctness against the float64 reference (--quick, --shape, --determinism N)\n"
      "  info     version, compiled capabilities, device\n"
      "  tune     autotuner: time the kernel configs per shape bucket, write a tuning table (--build: new ones)\n"
      "  ring     ring attention scaling over this machine's GPUs (NCCL) against one GPU\n"
      "  tvla     fixed-vs-random timing test (Welch's t per shape; --shape B,H,S,D, --n N)\n"
      "\n"
      "  flashcore <command> --help   options of a command (also: flashcore help <command>)\n"
      "  flashcore --version          version\n"
      "\n"
      "exit status: 0 success, 1 failure, 2 bad arguments, 3 no GPU that runs the command (none, or one that no\n"
      "backend of this build serves, or a Hopper-only feature on another GPU)\n");
}

}  // namespace

extern "C" int flashcore_cli_main(int argc, char** argv) {
  using namespace fccli;
  try {
    if (argc < 2) {
      print_help(stderr);
      return kExitUsage;
    }
    std::string cmd = argv[1];
    if (cmd == "-h" || cmd == "--help" || cmd == "help") {
      if (cmd == "help" && argc > 2) {  // `flashcore help <command>` = `flashcore <command> --help`
        const std::string sub = argv[2];
        if (sub == "bench") { print_bench_help(); return kExitOk; }
        if (sub == "check") { print_check_help(); return kExitOk; }
        if (sub == "info") { print_info_help(); return kExitOk; }
        if (sub == "tvla") { print_tvla_help(); return kExitOk; }
        if (sub == "tune") { print_tune_help(); return kExitOk; }
        if (sub == "ring") { print_ring_help(); return kExitOk; }
        usage_error("help: unknown command '" + sub + "'");
      }
      print_help(stdout);
      return kExitOk;
    }
    if (cmd == "--version" || cmd == "-V") {
#ifdef FLASHCORE_CLI_HAVE_CHECK
      const char* check = "yes";
#else
      const char* check = "no";
#endif
      std::printf("flashcore %s (library %s, check: %s)\n", FLASHCORE_CLI_VERSION, flashcore_version_string(), check);
      return kExitOk;
    }
    int (*run)(int, char**, int) = nullptr;
    if (cmd == "bench") run = run_bench;
    if (cmd == "check") run = run_check;
    if (cmd == "info") run = run_info;
    if (cmd == "tvla") run = run_tvla;
    if (cmd == "tune") run = run_tune;
    if (cmd == "ring") run = run_ring;
    if (run == nullptr) usage_error("unknown command '" + cmd + "'");
    set_command(cmd);
    return run(argc, argv, 2);
  } catch (const CliError& e) {
    if (e.code == kExitOk) return kExitOk;  // e.g. --help inside a parser
    std::fprintf(stderr, "%s: %s\n", program_name().c_str(), e.what());
    return e.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program_name().c_str(), e.what());
    return kExitFailure;
  }
}

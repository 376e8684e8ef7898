// Subcommands of the `flashcore` program. Each takes argv after the subcommand and returns an exit code
// (or throws CliError).
#pragma once

namespace fccli {

int run_bench(int argc, char** argv, int first);
int run_check(int argc, char** argv, int first);
int run_info(int argc, char** argv, int first);
int run_tvla(int argc, char** argv, int first);

void print_bench_help();
void print_check_help();

}  // namespace fccli

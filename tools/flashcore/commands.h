// Subcommands of the `flashcore` program. Each takes argv after the subcommand and returns an exit code
// (or throws CliError). Every one accepts --help / -h; a usage error names the command and its --help.
#pragma once

namespace fccli {

int run_bench(int argc, char** argv, int first);
int run_check(int argc, char** argv, int first);
int run_info(int argc, char** argv, int first);
int run_tvla(int argc, char** argv, int first);
int run_tune(int argc, char** argv, int first);
int run_ring(int argc, char** argv, int first);

// Each prints the command's usage on stdout (for --help / -h, exit 0).
void print_bench_help();
void print_check_help();
void print_info_help();
void print_tvla_help();
void print_tune_help();
void print_ring_help();

}  // namespace fccli

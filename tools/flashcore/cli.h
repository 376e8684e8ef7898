// The `flashcore` program as a function: what main() runs (cli.cpp). Not part of the library's ABI: the Python
// wheel's libflashcore.so exports it for its flashcore/bin/flashcore launcher (tools/CMakeLists.txt), no other build.
#pragma once

#if defined(__GNUC__)
#define FLASHCORE_CLI_ENTRY __attribute__((visibility("default")))
#else
#define FLASHCORE_CLI_ENTRY
#endif

// Runs `flashcore argv[1] ...` and returns its exit status (0 success, 1 failure, 2 bad arguments, 3 no GPU that
// runs the command).
extern "C" FLASHCORE_CLI_ENTRY int flashcore_cli_main(int argc, char** argv);

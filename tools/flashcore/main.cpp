// `flashcore`: the program's main (cli.cpp holds the program; the wheel links this file to libflashcore.so alone).
#include "cli.h"

int main(int argc, char** argv) { return flashcore_cli_main(argc, argv); }

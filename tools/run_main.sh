#!/usr/bin/env bash
# FlashCore's main command: dependencies, Release build, then the benchmark of the seed shapes with a
# correctness check (`flashcore bench seeds --check`). Needs a GPU that FlashCore runs on (Hopper: the sm90 kernels;
# Ampere, Ada and newer: the portable ones); without one the CLI says "no supported GPU found" and this script exits
# with its non-zero code.
#
# Usage: bash tools/run_main.sh [extra flashcore bench arguments]
# Environment: FLASHCORE_BUILD_DIR (default build), FLASHCORE_CMAKE_ARGS, FLASHCORE_JOBS (default: the core count).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${FLASHCORE_BUILD_DIR:-build}"

bash tools/setup_deps.sh "$BUILD_DIR"
# shellcheck disable=SC1091
source "$BUILD_DIR/.tools/env.sh"
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FLASHCORE_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j"${FLASHCORE_JOBS:-$(nproc 2>/dev/null || echo 2)}" 2>&1 | tee "$BUILD_DIR/build.log"

CLI="$BUILD_DIR/bin/flashcore"
if [[ ! -x "$CLI" ]]; then
  echo "run_main: $CLI was not built (tools/CMakeLists.txt absent or FLASHCORE_BUILD_TOOLS=OFF)" >&2
  exit 1
fi
echo "==> $CLI bench seeds --check $*"
set +e
"$CLI" bench seeds --check "$@"
rc=$?
set -e
if [[ $rc -ne 0 ]]; then echo "run_main: flashcore bench exited with status $rc" >&2; fi
exit $rc

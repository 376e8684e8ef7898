#!/usr/bin/env bash
# FlashCore's test command (what CI runs): dependencies, configure, build everything, CTest (cpu + gpu
# labels; GPU tests skip visibly without an sm_90 GPU), the SASS check, the Python tests. Exits non-zero on
# any failure and prints a summary, which lists ctest's and pytest's skips grouped by reason.
# The dependencies include the Python tests' torch, numpy and transformers (installed when missing; see
# tools/setup_deps.sh; FLASHCORE_NO_TORCH=1 skips them, and the tests that need them skip).
#
# Usage: bash tools/run_tests.sh
# Environment: FLASHCORE_BUILD_DIR (default build), FLASHCORE_CMAKE_ARGS (extra configure arguments, e.g.
#   "-DFLASHCORE_HEAD_DIMS=128 -DFLASHCORE_DTYPES=bf16"), FLASHCORE_JOBS (default: the core count, nproc), CI=true (-Werror),
#   FLASHCORE_NO_TORCH=1 (install no torch/numpy/transformers for the Python tests).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${FLASHCORE_BUILD_DIR:-build}"
JOBS="${FLASHCORE_JOBS:-$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
WERROR=OFF
if [[ "${CI:-}" == "true" ]]; then WERROR=ON; fi

declare -a STEP_NAMES=() STEP_RESULTS=()
FAILED=0
record() {  # record <name> <exit code>
  STEP_NAMES+=("$1")
  if [[ "$2" -eq 0 ]]; then STEP_RESULTS+=("ok"); else STEP_RESULTS+=("FAILED (exit $2)"); FAILED=1; fi
}
summary() {
  echo
  echo "==================== FlashCore test summary ===================="
  for i in "${!STEP_NAMES[@]}"; do printf '  %-28s %s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}"; done
  if [[ -n "${SKIPS:-}" ]]; then
    echo "  skipped tests and why:"
    echo "$SKIPS" | sed 's/^/    /'
  fi
  if [[ -n "${PYTEST_SKIPS:-}" ]]; then
    echo "  skipped Python tests (pytest: ${PYTEST_COUNTS:-?}) and why:"
    echo "$PYTEST_SKIPS" | sed 's/^/    /'
  fi
  if [[ $FAILED -eq 0 ]]; then echo "  RESULT: PASS"; else echo "  RESULT: FAIL"; fi
  echo "================================================================"
}
section() { echo; echo "==> $*"; }

section "dependencies"
bash tools/setup_deps.sh "$BUILD_DIR"
rc=$?
record "dependencies" $rc
if [[ $rc -ne 0 ]]; then summary; exit 1; fi
# shellcheck disable=SC1091
source "$BUILD_DIR/.tools/env.sh"
# The Python tests' torch, numpy and transformers (about a minute from PyPI when missing) install beside the build;
# the tests wait for them.
bash tools/setup_deps.sh --python-tests "$BUILD_DIR" >"$BUILD_DIR/python_deps.log" 2>&1 &
PYDEPS_PID=$!

section "configure (Release, FLASHCORE_WERROR=$WERROR)"
# shellcheck disable=SC2086
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHCORE_WERROR="$WERROR" \
  -DFLASHCORE_BUILD_TESTS=ON -DFLASHCORE_BUILD_TOOLS=ON ${FLASHCORE_CMAKE_ARGS:-}
rc=$?
record "configure" $rc
if [[ $rc -ne 0 ]]; then summary; exit 1; fi

section "build (-j$JOBS; log: $BUILD_DIR/build.log)"
stamp="$BUILD_DIR/.build-start"
touch "$stamp"
cmake --build "$BUILD_DIR" -j"$JOBS" 2>&1 | tee "$BUILD_DIR/build.log"
rc=$?
# Objects not recompiled in this run keep their ptxas -v report in <object>.log (cmake/nvcc_log.sh): fold
# those into build.log so it always holds the report of every kernel.
find "$BUILD_DIR" -name '*.cu.o.log' ! -newer "$stamp" -print 2>/dev/null | sort | while read -r f; do
  obj="${f#"$BUILD_DIR"/}"
  obj="${obj%.log}"
  grep -qF "build $obj:" "$BUILD_DIR/build.ninja" || continue  # an instantiation no longer configured
  echo "# ptxas report kept from an earlier build: $obj"
  cat "$f"
done >>"$BUILD_DIR/build.log"
record "build" $rc
if [[ $rc -ne 0 ]]; then summary; exit 1; fi

section "Python test dependencies (installed beside the build; log: $BUILD_DIR/python_deps.log)"
wait "$PYDEPS_PID"
rc=$?
grep -E "Python tests|installing|installed|ERROR" "$BUILD_DIR/python_deps.log"
record "python test dependencies" $rc

# The SASS checks read the built library only: they run beside ctest and pytest (one core each on CI's two) and
# report after them.
SASS_PID=""
if [[ -f tools/check_sass.sh ]]; then
  rm -f "$BUILD_DIR/check_sass.rc" "$BUILD_DIR/check_sass_sm80.rc"
  (
    bash tools/check_sass.sh "$BUILD_DIR" >"$BUILD_DIR/check_sass.log" 2>&1
    echo $? >"$BUILD_DIR/check_sass.rc"
    bash tools/check_sass_sm80.sh "$BUILD_DIR" >"$BUILD_DIR/check_sass_sm80.log" 2>&1
    echo $? >"$BUILD_DIR/check_sass_sm80.rc"
  ) &
  SASS_PID=$!
fi

# pytest beside ctest where no GPU is visible (CI: ctest's packaging builds use the cores while pytest mostly waits on
# Python; on a GPU machine the two suites would share the GPU, so they take turns). Its log is printed after ctest's.
HAS_PYTESTS=0
if [[ -d python/tests ]] && compgen -G "python/tests/test_*.py" >/dev/null; then
  HAS_PYTESTS=1
  # The library this run built, unless the caller chose one (the package itself only looks in <repo>/build).
  if [[ -z "${FLASHCORE_LIBRARY:-}" && -f "$BUILD_DIR/lib/libflashcore.so" ]]; then
    FLASHCORE_LIBRARY="$(cd "$BUILD_DIR/lib" && pwd)/libflashcore.so"
    export FLASHCORE_LIBRARY
  fi
fi
run_pytest() {
  python3 -m pytest python/tests -q -rs >"$BUILD_DIR/pytest.log" 2>&1
  echo $? >"$BUILD_DIR/pytest.rc"
}
PYTEST_PID=""
rm -f "$BUILD_DIR/pytest.rc"
if [[ $HAS_PYTESTS -eq 1 ]] && ! nvidia-smi -L >/dev/null 2>&1; then
  run_pytest &
  PYTEST_PID=$!
fi

section "ctest (all labels)"
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error
record "ctest" $?
# gtest prints "<file>:<line>: Skipped" and then the reason: list them, grouped by reason, so that a skip is
# never silent.
SKIPS="$(awk '
  /^\[ RUN      \]/ { test = $4 }
  /: Skipped$/ {
    if ((getline reason) <= 0) reason = "(no reason given)"
    key = reason; if (!(key in count)) order[n++] = key
    if (!seen[test]++) { count[key]++; if (count[key] <= 3) names[key] = names[key] (count[key] > 1 ? ", " : "") test }
  }
  END { for (i = 0; i < n; i++) { k = order[i]; printf "%d test(s): %s\n      e.g. %s%s\n", count[k], k, names[k], (count[k] > 3 ? ", ..." : "") } }
' "$BUILD_DIR/Testing/Temporary/LastTest.log" 2>/dev/null)"

# The build and packaging tests print what they checked; ctest keeps a passing test's output in its log only.
if grep -qE '^(parent_project|install_consumer|wheel): ' "$BUILD_DIR/Testing/Temporary/LastTest.log" 2>/dev/null; then
  section "packaging (what build_parent_project_archs, packaging_install_consumer, packaging_wheel checked)"
  grep -E '^(plain_sm90|parent_project|parent_consumer|install_consumer|wheel): |^  \[attention' \
    "$BUILD_DIR/Testing/Temporary/LastTest.log"
fi

if [[ $HAS_PYTESTS -eq 1 ]]; then
  if [[ -n "$PYTEST_PID" ]]; then
    section "python tests (ran beside ctest)"
    wait "$PYTEST_PID"
  else
    section "python tests"
    run_pytest
  fi
  cat "$BUILD_DIR/pytest.log"
  record "pytest" "$(cat "$BUILD_DIR/pytest.rc" 2>/dev/null || echo 1)"
  PYTEST_COUNTS="$(grep -E '^(no tests ran|[0-9]+ [a-z]+).* in [0-9.]+s' "$BUILD_DIR/pytest.log" | tail -1 |
                   sed -E 's/ in [0-9.]+s.*//')"
  # pytest -rs prints "SKIPPED [count] file:line: reason" (a reason may go on over more lines): list them, grouped
  # by reason, as the ctest skips above.
  PYTEST_SKIPS="$(awk '
    /^=+ short test summary info =+$/ { in_summary = 1; next }
    !in_summary { next }
    /^SKIPPED \[[0-9]+\] / {
      n_this = substr($2, 2, length($2) - 2) + 0
      rest = substr($0, index($0, "] ") + 2)
      split_at = index(rest, ": ")
      where = split_at ? substr(rest, 1, split_at - 1) : "?"
      key = split_at ? substr(rest, split_at + 2) : rest
      sub(/^python\/tests\//, "", where)
      last = key
      if (!(key in count)) order[n++] = key
      count[key] += n_this
      if (!((key, where) in seen)) {
        seen[key, where] = 1
        if (++places[key] <= 3) names[key] = names[key] (places[key] > 1 ? ", " : "") where
      }
      next
    }
    /^(FAILED|ERROR|XFAIL|XPASS|PASSED|=)/ || /^(no tests ran|[0-9]+ [a-z]+).* in [0-9.]+s/ { last = ""; next }
    last != "" { more[last] = 1 }  # a reason over several lines: its first line stands for it, marked "..."
    END {
      for (i = 0; i < n; i++) {
        k = order[i]
        printf "%d test(s): %s%s\n      e.g. %s%s\n", count[k], k, (k in more ? " ..." : ""), names[k], (places[k] > 3 ? ", ..." : "")
      }
    }
  ' "$BUILD_DIR/pytest.log")"
else
  record "pytest (no python tests)" 0
fi

if [[ -n "$SASS_PID" ]]; then
  section "SASS check (tools/check_sass.sh, tools/check_sass_sm80.sh; ran beside ctest and pytest)"
  wait "$SASS_PID"
  for check in check_sass check_sass_sm80; do
    cat "$BUILD_DIR/$check.log" 2>/dev/null
    record "$check" "$(cat "$BUILD_DIR/$check.rc" 2>/dev/null || echo 1)"
  done
else
  record "check_sass (absent)" 0
fi

summary
exit $FAILED

#!/usr/bin/env bash
# compute-sanitizer over `flashcore check --quick` (small shapes of every dtype x head dim x causal).
#
#   tools/sanitize.sh [--out DIR] [--bin PATH] [--tools "memcheck racecheck synccheck initcheck"]
#                     [--timeout SECONDS] [-- <flashcore check args, default --quick>]
#
# One summary line per tool ("memcheck: 0 errors"); the sanitizer report of each tool is in
# DIR/<tool>.log and the program's own output in DIR/<tool>.out. Exit status: 0 when every tool found 0
# errors and every check passed; 1 otherwise; 3 when there is no GPU FlashCore runs on.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=sanitize_out
bin=$root/build/bin/flashcore
tools="memcheck racecheck synccheck initcheck"
limit=1800
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --tools) tools=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "sanitize.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
check_args=("$@")
[[ ${#check_args[@]} -eq 0 ]] && check_args=(--quick)

cs=$(command -v compute-sanitizer || true)
[[ -z $cs && -x ${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer ]] && cs=${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer
[[ -n $cs ]] || { echo "sanitize.sh: compute-sanitizer not found" >&2; exit 2; }
[[ -x $bin ]] || { echo "sanitize.sh: $bin not found (build first, or --bin)" >&2; exit 2; }
mkdir -p "$out"

status=0
summary=$out/summary.txt
: >"$summary"
for tool in $tools; do
  extra=()
  case $tool in
    memcheck) extra=(--leak-check full) ;;
    racecheck) extra=(--racecheck-report all) ;;
    synccheck|initcheck) ;;
    *) echo "sanitize.sh: unknown tool '$tool'" >&2; exit 2 ;;
  esac
  start=$(date +%s)
  timeout "$limit" "$cs" --tool "$tool" "${extra[@]}" --error-exitcode 99 --log-file "$out/$tool.log" \
    "$bin" check "${check_args[@]}" >"$out/$tool.out" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  if grep -q "no supported GPU found" "$out/$tool.out"; then
    line="$tool: no supported GPU found"
    status=3
  else
    # "ERROR SUMMARY: N errors" (every tool); racecheck also prints "RACECHECK SUMMARY: ... (N errors, ...)".
    n=$(grep -o "ERROR SUMMARY: [0-9]* error" "$out/$tool.log" 2>/dev/null | tail -1 | grep -o "[0-9]*" || true)
    if [[ -z $n ]]; then
      n=$(grep -o "RACECHECK SUMMARY: .*(\([0-9]*\) error" "$out/$tool.log" 2>/dev/null | grep -o "([0-9]*" | tr -d '(' | tail -1 || true)
    fi
    cases=$(grep -E "^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped" "$out/$tool.out" | tail -1)
    if [[ $rc -eq 124 ]]; then
      line="$tool: timed out after ${limit}s"
      status=1
    elif [[ -z $n ]]; then
      line="$tool: no sanitizer summary (exit $rc; see $out/$tool.log)"
      status=1
    else
      line="$tool: $n errors"
      [[ $n -ne 0 ]] && status=1
      if [[ $rc -ne 0 && $rc -ne 99 ]]; then
        line+=" (check exited $rc: ${cases:-see $out/$tool.out})"
        status=1
      fi
    fi
    line+="  [${cases:-no case summary}; ${secs}s]"
  fi
  echo "$line" | tee -a "$summary"
  [[ $status -eq 3 ]] && break
done
[[ $status -eq 0 ]] && echo "sanitize: all clean" | tee -a "$summary"
exit $status

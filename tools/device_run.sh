#!/usr/bin/env bash
# One call on a Hopper machine: GPU test suite, determinism, sanitizers, Python tests, benchmarks and the
# side-by-side report, each logged under OUT. Binaries come prebuilt (build/bin, build/lib); nothing is
# compiled here.
#
#   tools/device_run.sh [--out DIR] [--anchors FILE] [--ab-base CLI] STAGE...
#   stages: info tests check sanitize python tvla seeds grid report report-quick report-fp8 ab profile tune
#           report-tuned
#   report-fp8: the 8-bit tables only (FlashCore e4m3 and precision=fp8 against FA3 FP8, and the accuracy table).
#   tune: flashcore tune (--build with the cubins carried in $CUBINS, default .dev/cubins; more options in
#         $TUNE_ARGS) writing OUT/tuning.json; report-tuned: the report with that table installed
#         (FLASHCORE_TUNING_TABLE; without a tune stage: the library's built-in table) and the default configs
#         as a fifth system (flashcore_default).
#   report: FA3 is measured in the same process when .fa3/ (a copy of ../shared/fa3/prefill, carried) exists.
#   report-interleave: the report with the systems taking turns replay by replay (one SM clock for all: kernel
#       efficiency); sustained: bench/power_diag.py --cells grid, each system alone for 1.5 s per cell at its own power
#       ($SUSTAINED_DTYPE, default bf16); power: bench/power_diag.py on $POWER_CELLS (3 s per run, NVML power and clock).
#   report80 / tests80: the report against FA2 and the GPU suite with the portable backend forced (FLASHCORE_BACKEND=sm80).
# Prebuilt binaries travel packed: tools/device_pack.sh writes .carry/pack.tar.xz (and .carry/fa3.tar.xz); when they
# exist they are unpacked into build/ and .fa3/ first.
#   ab: the old CLI (--ab-base) against build/bin/flashcore, $AB_PASSES (3) alternating passes of the grid, both
#       dtypes; $AB_ARGS goes to bench/ab.py (e.g. "--shape 4,16,4096,128" to time chosen cells instead of the grid).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-device_out}"
anchors=""
ab_base=""
stages=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --anchors) anchors=$2; shift 2 ;;
    --ab-base) ab_base=$2; shift 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
mkdir -p "$out"
[[ -f .carry/pack.tar.xz ]] && tar -xJf .carry/pack.tar.xz
[[ -f .carry/fa3.tar.xz ]] && { chmod -R u+w .fa3 2>/dev/null; rm -rf .fa3; tar -xJf .carry/fa3.tar.xz; }
bin=build/bin
summary=()
run() {  # run NAME CMD...: log to OUT/NAME.log, remember the last line
  local name=$1; shift
  echo "==> $name: $*"
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$out/$name.log" | tail -1 | cut -c1-110)")")
  return $rc
}
anchor_args=()
[[ -n "$anchors" ]] && anchor_args=(--anchors "$anchors")
export PYTHONUNBUFFERED=1 FLASHCORE_LIBRARY=$PWD/build/lib/libflashcore.so
[[ -d .fa3 ]] && export PYTHONPATH=$PWD/.fa3${PYTHONPATH:+:$PYTHONPATH}

for stage in "${stages[@]}"; do
  case $stage in
    info) run info "$bin/flashcore" info; nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv >>"$out/info.log" ;;
    tests)
      run cpu_tests "$bin/flashcore_cpu_tests" --gtest_brief=1
      run gpu_tests "$bin/flashcore_gpu_tests" --gtest_brief=1
      run abi_v1 env LD_LIBRARY_PATH="$PWD/build/lib" "$bin/flashcore_abi_v1_caller"
      run abi_v2 env LD_LIBRARY_PATH="$PWD/build/lib" "$bin/flashcore_abi_v2_caller"
      run tune_test env FLASHCORE_KERNEL_SOURCES="$PWD/src" bash tools/test_tune_gpu.sh "$bin/flashcore" "${CUBINS:-.dev/cubins}" ;;
    check) run check_det "$bin/flashcore" check --quick --determinism 20 ;;
    tvla) run tvla "$bin/flashcore" tvla ;;
    ab) run ab python3 bench/ab.py --a "$ab_base" --b "$bin/flashcore" --passes "${AB_PASSES:-3}" --dtype both --out "$out/ab" ${AB_ARGS:-} ;;
    sanitize) run sanitize bash tools/sanitize.sh --out "$out/sanitize" ;;
    python) run pytest env PYTHONPATH=python python3 -m pytest python/tests -q -rs -x -p no:cacheprovider ;;
    seeds) run seeds "$bin/flashcore" bench seeds --dtype both --causal both --graph --check --json "$out/seeds.json" ;;
    grid) run grid "$bin/flashcore" bench grid --dtype bf16 --causal both --json "$out/grid.json" ;;
    report) run report python3 bench/report.py --dtype both --out "$out/report" "${anchor_args[@]}"; tar -C "$out" -czf "$out/report.tgz" report ;;
    report-quick) run report python3 bench/report.py --quick --dtype bf16 --out "$out/report" "${anchor_args[@]}" ;;
    report-fp8) run report_fp8 python3 bench/report.py --fp8 --no-grid --dtype bf16 --systems flashcore,fa3 \
      --out "$out/report_fp8" ;;
    tune)
      run tune env FLASHCORE_KERNEL_SOURCES="$PWD/src" "$bin/flashcore" tune --build --cubin-dir "${CUBINS:-.dev/cubins}" \
        --out "$out/tuning.json" --report "$out/tune_report.md" ${TUNE_ARGS:-} ;;
    report-tuned)
      # The table of the tune stage when there is one, else the library's built-in table for this GPU.
      table=()
      [[ -f "$out/tuning.json" ]] && table=(FLASHCORE_TUNING_TABLE="$out/tuning.json")
      run report_tuned env "${table[@]}" FLASHCORE_KERNEL_SOURCES="$PWD/src" python3 bench/report.py \
        --dtype both --systems flashcore,cudnn,fa2,fa3,flashcore_default --no-small --out "$out/report_tuned" "${anchor_args[@]}"
      tar -C "$out" -czf "$out/report_tuned.tgz" report_tuned ;;
    report-interleave) run report_interleave python3 bench/report.py --dtype both --interleave --rounds 2 --no-small \
      --out "$out/report_interleave" "${anchor_args[@]}" ;;
    sustained) run sustained python3 bench/power_diag.py --cells grid --systems flashcore,fa3,cudnn --seconds 1.5 \
      --passes 1 --dtype "${SUSTAINED_DTYPE:-bf16}" ;;
    power) run power python3 bench/power_diag.py --cells "${POWER_CELLS:-128:0:2048,128:0:8192}" \
      --systems flashcore,fa3,cudnn ;;
    report80) run report80 env FLASHCORE_BACKEND=sm80 python3 bench/report.py --systems flashcore,fa2 --dtype both \
      --rounds 2 --no-small --out "$out/report80" ;;
    tests80) run gpu_tests80 env FLASHCORE_BACKEND=sm80 "$bin/flashcore_gpu_tests" --gtest_brief=1 ;;
    profile) run profile bash tools/profile.sh --out "$out/profile" -- --shape 2,16,8192,128 --dtype bf16 ;;
    *) echo "unknown stage '$stage'"; exit 2 ;;
  esac
done
echo
echo "==================== device run summary ===================="
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# Nsight Compute profile of the FlashCore forward kernel on one shape.
#
#   tools/profile.sh [--out DIR] [--bin PATH] [--kernel REGEX] [--skip N] [--count N] [--full] \
#                    -- <flashcore bench args>
#
# Example:
#   tools/profile.sh --out prof -- --shape 2,16,4096,128 --dtype bf16 --causal 1
#
# Runs `ncu --clock-control none` (the GPU keeps its normal boost clock, as in `flashcore bench`) on
# `flashcore bench <args>` with --warmup 1 --iters 1 prepended (your args override), skips the warm-up
# launch and profiles the next launch of a kernel whose demangled name matches REGEX (default
# "flashcore"). Collected: speed of light, compute / memory workload, occupancy, launch stats, warp state
# (issue stall reasons), scheduler stats, plus tensor-pipe (wgmma), DRAM, warps-active and shared-memory
# bank-conflict metrics. --full uses `--set full` instead (slow).
#
# Writes DIR/profile.ncu-rep (open with ncu-ui), DIR/details.txt (ncu --page details),
# DIR/raw.csv (ncu --page raw --csv) and DIR/summary.txt (the key numbers, also printed).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
out=profile_out
bin=$root/build/bin/flashcore
kernel=flashcore
skip=1
count=1
full=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --kernel) kernel=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --full) full=1; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "profile.sh: unknown option '$1' (bench args go after --)" >&2; exit 2 ;;
  esac
done
bench_args=("$@")

ncu=$(command -v ncu || true)
if [[ -z $ncu ]]; then
  for c in "${CUDA_HOME:-/usr/local/cuda}/bin/ncu" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [[ -x $c ]] && ncu=$c && break
  done
fi
[[ -n $ncu ]] || { echo "profile.sh: ncu (Nsight Compute) not found" >&2; exit 2; }
[[ -x $bin ]] || { echo "profile.sh: $bin not found (build first, or --bin)" >&2; exit 2; }
mkdir -p "$out"
rep=$out/profile

sections=(SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis Occupancy LaunchStats WarpStateStats
          SchedulerStats)
metrics=(
  sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active
  sm__inst_executed_pipe_tensor_op_gmma.sum
  dram__throughput.avg.pct_of_peak_sustained_elapsed
  dram__bytes_read.sum
  dram__bytes_write.sum
  sm__warps_active.avg.pct_of_peak_sustained_active
  sm__throughput.avg.pct_of_peak_sustained_elapsed
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
  l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
  smsp__cycles_active.avg
  launch__registers_per_thread
)
common=(--clock-control none --target-processes all --kernel-name-base demangled -k "regex:$kernel"
        --launch-skip "$skip" --launch-count "$count" --export "$rep" --force-overwrite)
app=("$bin" bench --warmup 1 --iters 1 --power-ms 0 --quiet "${bench_args[@]}")

log=$out/ncu.log
if [[ $full -eq 1 ]]; then
  set_args=(--set full)
else
  set_args=()
  for s in "${sections[@]}"; do set_args+=(--section "$s"); done
fi
echo "profile.sh: $ncu ${common[*]} ${set_args[*]} --metrics ... ${app[*]}" >&2
if ! "$ncu" "${common[@]}" "${set_args[@]}" --metrics "$(IFS=,; echo "${metrics[*]}")" "${app[@]}" >"$log" 2>&1; then
  # A metric this ncu/GPU does not know makes ncu refuse the whole run: retry with the sections alone.
  echo "profile.sh: ncu failed with the extra metrics (see $out/ncu-first-attempt.log); retrying with sections only" >&2
  mv "$log" "$out/ncu-first-attempt.log"
  "$ncu" "${common[@]}" "${set_args[@]}" "${app[@]}" >"$log" 2>&1 || {
    tail -20 "$log" >&2
    echo "profile.sh: ncu failed (full log: $log)" >&2
    exit 1
  }
fi
if [[ ! -f $rep.ncu-rep ]]; then
  tail -20 "$log" >&2
  echo "profile.sh: no report written: did a kernel matching '$kernel' run? (log: $log)" >&2
  exit 1
fi

"$ncu" --import "$rep.ncu-rep" --page details >"$out/details.txt"
"$ncu" --import "$rep.ncu-rep" --page raw --csv >"$out/raw.csv"

python3 - "$out/raw.csv" "$out/details.txt" >"$out/summary.txt" <<'PY'
import csv, re, sys
raw_path, details_path = sys.argv[1], sys.argv[2]
rows = list(csv.reader(open(raw_path)))
# raw page: header row of metric names, a units row, then one row per profiled kernel.
hdr_i = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
names, units, data = rows[hdr_i], rows[hdr_i + 1], rows[hdr_i + 2:]
want = [
    ("kernel", r"^Kernel Name$"), ("grid", r"^Grid Size$"), ("block", r"^Block Size$"),
    ("duration", r"^gpu__time_duration\.sum$"),
    ("SM clock", r"^(smsp__cycles_elapsed\.avg\.per_second|gpc__cycles_elapsed\.avg\.per_second)$"),
    ("tensor pipe", r"^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$"),
    ("gmma instructions", r"^sm__inst_executed_pipe_tensor_op_gmma\.sum$"),
    ("SM throughput", r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$"),
    ("DRAM throughput", r"^(dram__throughput\.avg\.pct_of_peak_sustained_elapsed|gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed)$"),
    ("DRAM bytes", r"^dram__bytes_(read|write)\.sum$"),
    ("achieved occupancy", r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$"),
    ("registers/thread", r"^launch__registers_per_thread$"),
    ("shared memory/block", r"^launch__shared_mem_per_block(_dynamic|_static)?$"),
    ("smem bank conflicts", r"^l1tex__data_bank_conflicts_pipe_lsu_mem_shared.*\.sum$"),
    ("smem wavefronts", r"^l1tex__data_pipe_lsu_wavefronts_mem_shared\.sum$"),
    ("issue slot busy", r"^sm__inst_issued\.avg\.pct_of_peak_sustained_active$"),
]
for k, row in enumerate(data):
    print(f"== profiled launch {k}")
    for label, pat in want:
        for n, u, v in zip(names, units, row):
            if re.match(pat, n):
                print(f"  {label:22s} {v} {u}".rstrip() + f"   [{n}]")
    stalls = []
    for n, v in zip(names, row):
        m = re.match(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$", n)
        if m:
            try:
                stalls.append((float(v.replace(",", "")), m.group(1)))
            except ValueError:
                pass
    if stalls:
        stalls.sort(reverse=True)
        print("  issue stall reasons (cycles per issued instruction, top 8):")
        for v, s in stalls[:8]:
            print(f"    {s:22s} {v:.2f}")
# The rule-based advice of ncu (OPT / WRN lines) from the details page.
adv = [l.rstrip() for l in open(details_path) if re.search(r"\b(OPT|WRN)\b", l)]
if adv:
    print("== ncu advice")
    for l in adv[:20]:
        print("  " + l.strip()[:200])
PY
cat "$out/summary.txt"
echo "profile.sh: wrote $rep.ncu-rep, $out/details.txt, $out/raw.csv, $out/summary.txt" >&2

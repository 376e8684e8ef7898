#!/usr/bin/env bash
# A/B of two FlashCore libraries in one process, on the same tensors: A = $AB_OLD (default
# .carry/base/libflashcore_old.so), B = $AB_NEW (default build/lib/libflashcore.so), over the bf16 grid
# (bench/report.py, systems flashcore and flashcore_b). With AB_METHOD=interleave (the default) the two take turns
# replay by replay, so that both run at the same SM clock (docs/decisions.md#interleave: under the 700 W cap the clock
# moves by up to 25% within tens of milliseconds, more than most kernel changes gain); AB_METHOD=blocked times each
# library's replays in one block per round, as the report does by default. Then B / A per cell and the geometric mean.
# Run on the GPU machine from the repository root:
#   bash tools/ab_lib.sh OUT_DIR [extra bench/report.py arguments, e.g. --head-dims 128 --seqlens 4096,8192]
set -u
O=${1:?usage: tools/ab_lib.sh OUT_DIR [report.py arguments]}
shift
A=${AB_OLD:-.carry/base/libflashcore_old.so}
B=${AB_NEW:-build/lib/libflashcore.so}
method=()
case ${AB_METHOD:-interleave} in
  interleave) method=(--interleave) ;;
  blocked) ;;
  *) echo "ab_lib.sh: AB_METHOD must be interleave or blocked" >&2; exit 2 ;;
esac
mkdir -p "$O"
python3 bench/report.py --systems flashcore,flashcore_b --lib "$A" --lib-b "$B" "${method[@]}" \
  --rounds "${AB_ROUNDS:-3}" --dtype "${AB_DTYPE:-bf16}" --no-small --no-plots --out "$O/ab" "$@" \
  > "$O/ab.log" 2>&1 || { echo "ab_lib.sh: report.py failed (log: $O/ab.log)" >&2; tail -5 "$O/ab.log" >&2; exit 1; }
python3 tools/ab_summary.py "$O/ab/metrics.json"

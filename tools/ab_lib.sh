#!/usr/bin/env bash
# A/B of two FlashCore libraries through one Python harness (bench/report.py, FlashCore only, bf16 grid):
# .carry/base/libflashcore_old.so (A) against build/lib/libflashcore.so (B), two alternating passes, then the
# median per cell and the geometric mean. Run on the GPU machine from the repository root:
#   bash tools/ab_lib.sh OUT_DIR
set -u
O=${1:?usage: tools/ab_lib.sh OUT_DIR}
for p in 1 2; do
  for side in old new; do
    lib=.carry/base/libflashcore_old.so; [[ $side == new ]] && lib=build/lib/libflashcore.so
    python3 bench/report.py --systems flashcore --dtype bf16 --no-small --no-plots --lib $lib --out $O/lib_${side}_$p > $O/lib_${side}_$p.log 2>&1 || echo "fail $side $p"
  done
done
python3 - "$O" <<'PY'
import json, sys, statistics, math
O = sys.argv[1]
def load(side):
    out = {}
    for p in (1, 2):
        for c in json.load(open(f"{O}/lib_{side}_{p}/metrics.json"))["cells"]:
            t = c["systems"].get("flashcore", {}).get("tflops")
            if t: out.setdefault((c["D"], c["causal"], c["S"]), []).append(t)
    return out
a, b = load("old"), load("new")
logs = []
for k in sorted(a):
    r = statistics.median(b[k]) / statistics.median(a[k]); logs.append(math.log(r))
    print("lib A/B", k, [round(x) for x in a[k]], [round(x) for x in b[k]], round(r, 3))
print("lib A/B geomean", round(math.exp(sum(logs) / len(logs)), 3))
PY

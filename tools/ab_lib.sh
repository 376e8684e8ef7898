# A/B of two libraries through the same Python harness (bench/report.py, FlashCore only), alternating passes.
set -u
O=$1
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

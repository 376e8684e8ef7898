#!/usr/bin/env bash
# GPU test of `flashcore tune` end to end (run by tools/device_run.sh, stage tests): a short tuning run of one key
# with a deliberately wrong variant offered beside the compiled configs. The wrong variant must be rejected by the
# correctness gate and appear nowhere in the table; the table must parse, name only gated configs, and dispatch
# must read it (flashcore_attention_selected_config through the Python bindings is not needed: `flashcore bench`
# runs with the table installed). Exit 0 on success; 77 (skip) without a Hopper GPU.
# usage: tools/test_tune_gpu.sh path/to/flashcore [cubin dir]
set -u
BIN=${1:?usage: test_tune_gpu.sh path/to/flashcore [cubin dir]}
CUBINS=${2:-$(mktemp -d)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$BIN" info | grep -q "^device: .*sm_90" || { echo "SKIP: no Hopper GPU"; exit 77; }
"$BIN" tune --dtype bf16 --head-dims 128 --causal 0 --seqlens 1024,4096 --rounds 2 --iters 3 --quiet \
  --test-faulty-variant --cubin-dir "$CUBINS" --out "$tmp/table.json" --report "$tmp/report.md" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[[ $rc -eq 0 ]] || { echo "FAIL: flashcore tune exited $rc"; exit 1; }
python3 - "$tmp/table.json" "$tmp/report.md" <<'PY' || exit 1
import json, sys
table = json.load(open(sys.argv[1]))
report = open(sys.argv[2]).read()
assert table["format"] == "flashcore-tuning" and table["entries"], "empty or foreign table"
names = [c["config"] for e in table["entries"] for c in e["elites"]]
assert not any(n.endswith("-faulty") for n in names), f"a faulty variant was chosen: {names}"
assert "-faulty: gate:" in report, "the report does not list the faulty variant as rejected by the gate"
# --seqlens sets the prefill buckets; the decode buckets (seqlen_q 1 against 2k-64k keys) are always in the space.
assert {e["seqlen_q"] for e in table["entries"] if e["seqlen_q"] > 1} == {1024, 4096}, table["entries"]
print("PASS: the faulty variant was rejected by the gate and is not in the table;", len(names), "elites")
PY
# dispatch reads the table: a bench row with it installed runs (and the gate-checked config is what it runs)
FLASHCORE_TUNING_TABLE="$tmp/table.json" "$BIN" bench --shape 4,16,4096,128 --dtype bf16 --causal 0 --check --iters 3 \
  >"$tmp/bench" 2>&1 || { cat "$tmp/bench"; echo "FAIL: bench with the table installed"; exit 1; }
! grep -q "ignoring tuning table" "$tmp/bench" || { cat "$tmp/bench"; echo "FAIL: the table was ignored"; exit 1; }
echo "PASS: bench --check with the table installed"

# 8-bit keys (--dtype e4m3): the compiled e4m3 configs gated by the 8-bit rule and timed; dispatch reads the entries
# for e4m3 calls and for precision = FP8 calls (which run the e4m3 kernels). A hand-edited copy of the table names a
# compiled config other than the default at 8k keys: bench must report that config for both kinds of call.
if ! "$BIN" info | grep -q "^dtypes:.*e4m3"; then
  echo "SKIP: no e4m3 kernels in this build"
  exit 0
fi
"$BIN" tune --dtype e4m3 --head-dims 128 --causal 0 --no-decode --seqlens 1024,8192 --rounds 2 --iters 3 --quiet \
  --out "$tmp/e4m3.json" --report "$tmp/e4m3.md" >"$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
[[ $rc -eq 0 ]] || { echo "FAIL: flashcore tune --dtype e4m3 exited $rc"; exit 1; }
FORCED=128x128x3-pp-static
python3 - "$tmp/e4m3.json" "$tmp/e4m3_forced.json" "$FORCED" <<'PY' || exit 1
import json, sys
table = json.load(open(sys.argv[1]))
entries = table["entries"]
assert entries and all(e["dtype"] == "fp8_e4m3" for e in entries), entries
assert {e["seqlen_q"] for e in entries} == {1024, 8192}, entries
e8k = next(e for e in entries if e["seqlen_k"] == 8192)
e8k["config"] = sys.argv[3]
e8k["elites"] = [{"config": sys.argv[3], "ms": 1.0}]
json.dump(table, open(sys.argv[2], "w"), indent=1)
print("PASS: e4m3 table with", len(entries), "entries")
PY
for args in "--dtype e4m3" "--dtype bf16 --precision fp8"; do
  # shellcheck disable=SC2086
  FLASHCORE_TUNING_TABLE="$tmp/e4m3_forced.json" "$BIN" bench --shape 2,8192,16,128 $args --causal 0 --check \
    --iters 3 --json "$tmp/e4m3_bench.json" >"$tmp/bench" 2>&1 || { cat "$tmp/bench"; echo "FAIL: bench $args"; exit 1; }
  python3 - "$tmp/e4m3_bench.json" "$FORCED" "$args" <<'PY' || { cat "$tmp/bench"; exit 1; }
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
configs = {r["config"] for r in rows}
assert configs == {sys.argv[2]}, f"bench {sys.argv[3]} ran {configs}, the table names {sys.argv[2]}"
print(f"PASS: bench {sys.argv[3]} runs the table's e4m3 config {sys.argv[2]}")
PY
done

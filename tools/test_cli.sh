#!/usr/bin/env bash
# CPU-only test of the `flashcore` program: argument errors (exit 2, one line on stderr of the form
# "flashcore <cmd>: <problem>; see 'flashcore <cmd> --help'"), the no-GPU path of bench/check/tvla (exactly
# one line containing "no supported GPU found", exit 3; forced with CUDA_VISIBLE_DEVICES= so it also runs on GPU
# machines), help of every command (exit 0), version, info and info --json (exit 0).
# usage: tools/test_cli.sh path/to/flashcore
set -u
BIN=${1:?usage: test_cli.sh path/to/flashcore}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect RC PATTERN(on stderr+stdout, or "") LINES(stderr line count, or -) -- args...
expect() {
  local want_rc=$1 pattern=$2 want_lines=$3
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  local ok=1
  [[ $rc -eq $want_rc ]] || ok=0
  if [[ -n $pattern ]] && ! grep -q -- "$pattern" "$tmp/out" "$tmp/err"; then ok=0; fi
  if [[ $want_lines != - && $lines -ne $want_lines ]]; then ok=0; fi
  if [[ $ok -eq 1 ]]; then
    echo "ok    rc=$rc  ${*:2}"
  else
    echo "FAIL  rc=$rc (want $want_rc), stderr lines=$lines (want $want_lines), pattern '$pattern': $*"
    sed 's/^/      out: /' "$tmp/out" | head -5
    sed 's/^/      err: /' "$tmp/err" | head -5
    fails=$((fails + 1))
  fi
}

have_check=0
"$BIN" --version | grep -q "check: yes" && have_check=1
# A dtype and a head dim compiled into this build (builds may select subsets). The CLI's default dtype is
# bf16, which an fp16-only build rejects before it looks at the shape: every call that tests something
# other than the dtype passes --dtype "$DT".
DTYPES=$("$BIN" info | awk '/^dtypes:/ {print $2}')
DT=${DTYPES%%,*}
HD=$("$BIN" info | awk '/^head dims:/ {split($3, a, ","); print a[1]}')
if [[ -z $DT || -z $HD || $DT == none || $HD == none ]]; then
  echo "test_cli: cannot read compiled dtypes / head dims from '$BIN info'"
  exit 1
fi
S1="1,8,512,$HD"

# help, version, info
expect 0 "usage: flashcore" 0 -- "$BIN" --help
expect 0 "usage: flashcore" 0 -- "$BIN" -h
for cmd in bench check info tvla tune ring; do
  expect 0 "^usage: flashcore $cmd" 0 -- "$BIN" $cmd --help
  expect 0 "^usage: flashcore $cmd" 0 -- "$BIN" $cmd -h
  expect 0 "^usage: flashcore $cmd" 0 -- "$BIN" help $cmd
  # --help wins over the other arguments, even bad ones after it (ring has --gpus where the others have --device)
  opt=(--device 0)
  [[ $cmd == ring ]] && opt=(--gpus 1)
  expect 0 "^usage: flashcore $cmd" 0 -- "$BIN" $cmd "${opt[@]}" --help --bogus
done
expect 0 "^flashcore [0-9]" 0 -- "$BIN" --version
expect 0 "head dims" 0 -- "$BIN" info
# without a device, info says why in plain words (the driver is missing / too old, or there is no GPU)
expect 0 "^device: *none: \(no NVIDIA driver found\|NVIDIA driver too old\|no GPU\)" 0 -- \
  env CUDA_VISIBLE_DEVICES= "$BIN" info
expect 0 "" 0 -- env CUDA_VISIBLE_DEVICES= "$BIN" info --json "$tmp/info.json"
# the compiled sm90 kernels, for tools/check_sass.sh: one line each, no device needed
expect 0 "^r_[a-z0-9_]* two_p_sets=[01] v_in_place=[01]$" 0 -- env CUDA_VISIBLE_DEVICES= "$BIN" info --kernels
if command -v python3 >/dev/null 2>&1; then
  if python3 - "$tmp/info.json" <<'PY'; then echo "ok    info --json is valid JSON"; else echo "FAIL  info --json"; fails=$((fails + 1)); fi
import json, sys
d = json.load(open(sys.argv[1]))
caps = d["capabilities"]
assert d["tool"] == "flashcore info" and caps["dtypes"] and caps["head_dims"] and caps["archs"], d
assert d["device"] is None and d["device_reason"], d
PY
else
  expect 0 '"capabilities"' 0 -- cat "$tmp/info.json"
fi
expect 1 "cannot write" 1 -- "$BIN" info --json "$tmp/no/such/dir/info.json"

# the form of every usage error: one line, naming the command and its --help
usage_form() {  # usage_form CMD ARGS...: exit 2 and stderr is exactly one "flashcore CMD: ...; see 'flashcore CMD --help'"
  local cmd=$1
  expect 2 "" 1 -- "$BIN" "$@"
  if ! grep -qx "flashcore $cmd: .*; see 'flashcore $cmd --help'" "$tmp/err"; then
    echo "FAIL  usage error not of the form \"flashcore $cmd: <problem>; see 'flashcore $cmd --help'\": $*"
    sed 's/^/      err: /' "$tmp/err" | head -3
    fails=$((fails + 1))
  fi
}
for cmd in bench check info tvla tune; do
  usage_form $cmd --bogus
  usage_form $cmd --device
  usage_form $cmd --device x
done
usage_form bench --json
usage_form bench --iters 0
usage_form check --json
usage_form check --csv
usage_form check --quick --shape "$S1" --dtype "$DT"
usage_form info --json
usage_form info --json=
usage_form tvla --n 1
usage_form tune --compile-only
usage_form tune --top-k 0
usage_form tune --seqlens 512,x
usage_form tune --out=
# ring: the other commands' names (--head-dims, --iters), the old ones (--head-dim, --reps) as aliases
usage_form ring --bogus
usage_form ring --head-dims 64,128
usage_form ring --head-dims 32
usage_form ring --head-dim 512
usage_form ring --iters 0
usage_form ring --reps 0
expect 0 "old name: --head-dim" 0 -- "$BIN" ring --help
expect 0 "old name: --reps" 0 -- "$BIN" ring --help
expect 2 "^flashcore: unknown command 'frobnicate'; see 'flashcore --help'$" 1 -- "$BIN" frobnicate
expect 2 "^flashcore: help: unknown command 'frobnicate'; see 'flashcore --help'$" 1 -- "$BIN" help frobnicate

# usage errors: exit 2, exactly one line on stderr
expect 2 "usage" - -- "$BIN"
expect 2 "unknown command" 1 -- "$BIN" frobnicate
expect 2 "unknown preset 'nosuch'" 1 -- "$BIN" bench nosuch
expect 2 "unknown preset 'nosuch'" 1 -- "$BIN" bench --preset nosuch
expect 2 "unknown option '--bogus'" 1 -- "$BIN" bench --bogus
expect 2 "--v-transposed is for --dtype e4m3 / e5m2" 1 -- "$BIN" bench --v-transposed --dtype "$DT"
expect 2 "malformed shape" 1 -- "$BIN" bench --shape 1,2,3 --dtype "$DT"
expect 2 "malformed shape" 1 -- "$BIN" bench --shape 1,8,x,64 --dtype "$DT"
expect 2 "malformed shape" 1 -- "$BIN" bench --shape 1,8,512,64,8,512,9 --dtype "$DT"
expect 2 "malformed shape" 1 -- "$BIN" bench --shape 1,8,-512,64 --dtype "$DT"
expect 2 "malformed shape" 1 -- "$BIN" bench --shape 0,8,512,64 --dtype "$DT"
expect 2 "not a multiple" 1 -- "$BIN" bench --shape "$S1",3 --dtype "$DT"
expect 2 "unsupported head dim 80" 1 -- "$BIN" bench --shape 1,8,512,80 --dtype "$DT"
expect 2 "unsupported head dim 100" 1 -- "$BIN" bench --shape 2,4,256,100 --dtype "$DT"
expect 2 "unsupported dtype 'fp8'" 1 -- "$BIN" bench --dtype fp8
expect 2 "unsupported dtype 'fp32'" 1 -- "$BIN" bench --shape "$S1" --dtype fp32
# a known dtype that this build left out (e.g. -DFLASHCORE_DTYPES=fp16) is rejected by name
for d in fp16 bf16; do
  if [[ ",$DTYPES," != *",$d,"* ]]; then
    expect 2 "unsupported dtype $d: not compiled" 1 -- "$BIN" bench --shape "$S1" --dtype $d
  fi
done
# 8-bit: --dtype e4m3 (bench, check), --precision, --out-dtype; the 16-bit-only commands refuse e4m3
usage_form bench --precision x
usage_form bench --out-dtype fp32
usage_form check --precision
expect 2 "quantizes 16-bit inputs" 1 -- "$BIN" bench --shape "$S1" --dtype e4m3 --precision fp8
expect 2 "quantizes 16-bit inputs" 1 -- "$BIN" check --shape "$S1" --dtype e4m3 --precision fp8
expect 2 "dtype e5m2 is 8-bit already" 1 -- "$BIN" bench --shape "$S1" --dtype e5m2 --precision fp8
expect 2 "expected native, fp8 or int8" 1 -- "$BIN" check --precision int4
expect 2 "precision int8 quantizes 16-bit inputs" 1 -- "$BIN" bench --shape "$S1" --dtype e4m3 --precision int8
expect 2 "precision int8 quantizes 16-bit inputs" 1 -- "$BIN" check --shape "$S1" --dtype e5m2 --precision int8
# precision int8 writes O in the input dtype (the C ABI's out_dtype rule): another --out-dtype is refused
OTHER16=fp16
[[ $DT == fp16 ]] && OTHER16=bf16
expect 2 "int8 writes O in the input dtype" 1 -- "$BIN" bench --shape "$S1" --dtype "$DT" --precision int8 \
  --out-dtype $OTHER16
expect 2 "int8 writes O in the input dtype" 1 -- "$BIN" check --shape "$S1" --dtype both --precision int8 \
  --out-dtype "$DT"
expect 2 "build makes 16-bit variants only" 1 -- "$BIN" tune --dtype e5m2 --build
expect 2 "out-dtype is for" 1 -- "$BIN" bench --shape "$S1" --dtype "$DT" --out-dtype fp16
expect 2 "out-dtype is for" 1 -- "$BIN" check --shape "$S1" --dtype "$DT" --out-dtype bf16
expect 2 "build makes 16-bit variants only" 1 -- "$BIN" tune --dtype e4m3 --build --compile-only
expect 2 "expected fp16, bf16, both, e4m3 or e5m2" 1 -- "$BIN" tune --dtype fp4
expect 2 "16-bit inputs only" 1 -- "$BIN" tvla --dtype e4m3
expect 2 "unknown option '--precision'" 1 -- "$BIN" tune --precision fp8
expect 2 "--variants needs --build" 1 -- "$BIN" tune --variants 128x160x2-pp-dynamic-vote
expect 2 "--variants: 'x' is not a config name" 1 -- "$BIN" tune --build --variants 128x128x2-pp-static,x
for cmd in bench check; do
  expect 0 "e4m3" 0 -- "$BIN" $cmd --help
  expect 0 "--precision" 0 -- "$BIN" $cmd --help
  expect 0 "int8" 0 -- "$BIN" $cmd --help
done
HAVE_E4M3=0
[[ ",$DTYPES," == *",fp8_e4m3,"* ]] && HAVE_E4M3=1
if [[ ",$DTYPES," != *",fp8_e5m2,"* ]]; then
  expect 2 "unsupported dtype e5m2: not compiled" 1 -- "$BIN" bench --shape "$S1" --dtype e5m2
fi
# the int8 Q K^T kernels of --precision int8 (FLASHCORE_DTYPES i8): sm90 rows named r_i8_*
HAVE_INT8=0
"$BIN" info --kernels | grep -q '^r_i8_' && HAVE_INT8=1
if [[ $HAVE_INT8 -eq 0 ]]; then
  expect 2 "not compiled" 1 -- "$BIN" bench --shape "$S1" --dtype "$DT" --precision int8
  if [[ $have_check -eq 1 ]]; then
    expect 2 "not compiled" 1 -- "$BIN" check --shape "$S1" --dtype "$DT" --precision int8
  fi
fi
if [[ $HAVE_E4M3 -eq 0 ]]; then
  expect 2 "unsupported dtype e4m3: not compiled" 1 -- "$BIN" bench --shape "$S1" --dtype e4m3
  expect 2 "not compiled" 1 -- "$BIN" bench --shape "$S1" --dtype "$DT" --precision fp8
  if [[ $have_check -eq 1 ]]; then
    expect 2 "unsupported dtype e4m3: not compiled" 1 -- "$BIN" check --shape "$S1" --dtype e4m3
  fi
fi
# the backward's modes (--mode bwd / fwdbwd): 16-bit inputs at native precision, with LSE
for cmd in bench check; do
  usage_form $cmd --mode x
  expect 2 "expected fwd, bwd or fwdbwd" 1 -- "$BIN" $cmd --mode backward
  expect 0 "--mode" 0 -- "$BIN" $cmd --help
  expect 2 "the backward takes 16-bit inputs" 1 -- "$BIN" $cmd --mode bwd --shape "$S1" --dtype e4m3
  expect 2 "the backward runs at native precision" 1 -- "$BIN" $cmd --mode fwdbwd --shape "$S1" --dtype "$DT" \
    --precision fp8
done
expect 2 "the backward needs the forward's LSE" 1 -- "$BIN" bench --mode bwd --no-lse --dtype "$DT"
expect 2 "--deterministic is for --mode bwd" 1 -- "$BIN" bench --deterministic --dtype "$DT"
expect 2 "takes no value" 1 -- "$BIN" bench --mode bwd --deterministic=1
expect 0 "2.5" 0 -- "$BIN" bench --help
expect 2 "--causal" 1 -- "$BIN" bench --causal 2
expect 2 "--layout" 1 -- "$BIN" bench --layout sbhd
expect 2 "not an integer" 1 -- "$BIN" bench --iters abc
expect 2 "out of range" 1 -- "$BIN" bench --iters 0
expect 2 "needs a value" 1 -- "$BIN" bench --shape
expect 2 "takes no value" 1 -- "$BIN" bench --graph=1
expect 2 "unknown option" 1 -- "$BIN" info --bogus
expect 2 "unknown option" 1 -- "$BIN" check --bogus
expect 2 "exclusive" 1 -- "$BIN" check --quick --shape "$S1" --dtype "$DT"
if [[ $have_check -eq 1 ]]; then
  expect 2 "malformed shape" 1 -- "$BIN" check --shape 1,2 --dtype "$DT"
  expect 2 "unsupported head dim 80" 1 -- "$BIN" check --shape 1,8,512,80 --dtype "$DT"
  expect 2 "unsupported dtype" 1 -- "$BIN" check --shape "$S1" --dtype int8
  expect 2 "not an integer" 1 -- "$BIN" check --shape "$S1" --dtype "$DT" --determinism many
else
  expect 2 "without the check library" 1 -- "$BIN" check --quick
  expect 2 "without the check library" 1 -- "$BIN" bench --dtype "$DT" --check
fi

# no GPU: exactly one line containing "no supported GPU found", exit 3, nothing on stdout
nogpu() {
  expect 3 "no supported GPU found" 1 -- env CUDA_VISIBLE_DEVICES= "$BIN" "$@"
  if [[ -s $tmp/out ]]; then
    echo "FAIL  stdout not empty for no-GPU: $*"
    fails=$((fails + 1))
  fi
}
nogpu bench --dtype "$DT"
nogpu bench seeds --dtype "$DT"
nogpu bench grid --dtype "$DT" --causal both
nogpu bench --shape "$S1" --dtype "$DT" --graph --json "$tmp/x.json"
nogpu bench --shape "$S1" --dtype "$DT" --mode bwd --deterministic
nogpu bench grid --dtype "$DT" --mode fwdbwd
nogpu tvla --shape "$S1" --dtype "$DT" --n 10
nogpu tune --dtype "$DT" --out "$tmp/table.json"
if [[ $have_check -eq 1 ]]; then
  nogpu check --quick
  nogpu check --shape "$S1" --dtype "$DT" --determinism 3
  nogpu check --quick --json "$tmp/check.json" --csv "$tmp/check.csv"
  nogpu bench --shape "$S1" --dtype "$DT" --check
  nogpu check --quick --mode bwd
  nogpu check --shape "$S1" --dtype "$DT" --mode fwdbwd --determinism 3
  nogpu bench --shape "$S1" --dtype "$DT" --mode bwd --check
fi
if [[ $HAVE_E4M3 -eq 1 ]]; then
  nogpu bench --shape "$S1" --dtype e4m3 --out-dtype fp16
  nogpu tune --dtype e4m3 --head-dims 128 --out "$tmp/table.json"
  nogpu bench --shape "$S1" --dtype "$DT" --precision fp8 --json "$tmp/x.json"
  if [[ $have_check -eq 1 ]]; then
    nogpu check --shape "$S1" --dtype e4m3 --causal 1
    nogpu check --shape "$S1" --dtype "$DT" --precision fp8
    nogpu bench --shape "$S1" --dtype e4m3 --check
  fi
fi
if [[ $HAVE_INT8 -eq 1 ]]; then
  nogpu bench --shape "$S1" --dtype "$DT" --precision int8 --json "$tmp/x.json"
  nogpu bench --shape "$S1" --dtype "$DT" --precision int8 --out-dtype "$DT"  # the input dtype: allowed
  if [[ $have_check -eq 1 ]]; then
    nogpu check --shape "$S1" --dtype "$DT" --precision int8
    nogpu bench --shape "$S1" --dtype "$DT" --precision int8 --check
  fi
fi
# the no-GPU message says why (no driver / driver too old / no GPU), not only a CUDA error name
expect 3 "no supported GPU found: \(no NVIDIA driver found\|NVIDIA driver too old\|no GPU\)" 1 -- \
  env CUDA_VISIBLE_DEVICES= "$BIN" bench --dtype "$DT"
# nothing is written when nothing ran
for f in x.json check.json check.csv table.json; do
  if [[ -e $tmp/$f ]]; then
    echo "FAIL  $f written by a run that stopped for lack of a GPU"
    fails=$((fails + 1))
  fi
done
# a device index that does not exist is the same "no supported GPU found" path
expect 3 "no supported GPU found" 1 -- "$BIN" bench --dtype "$DT" --device 1023

if [[ $fails -ne 0 ]]; then
  echo "test_cli: $fails failure(s)"
  exit 1
fi
echo "test_cli: all passed"

#!/usr/bin/env bash
# Checks the portable (sm80) kernels in the built library (CI runs this right after tools/check_sass.sh; no GPU):
#   - every generated portable kernel is there once per arch of FLASHCORE_SM80_ARCHS, and in no other arch (the
#     backward's too: two per row of bwd_rows.inc);
#   - each of them has HMMA (mma.sync), LDGSTS (cp.async), LDSM (ldmatrix) and LDSM...MT88 (ldmatrix.trans),
#     and no LDL/STL (local memory);
#   - ptxas reported a 0-byte stack frame and 0 spill bytes for each of them, per arch (the -Xptxas -v report in
#     the build log: build/build.log, which tools/run_tests.sh completes from the per-object .cu.o.log files);
#   - the sm90 kernels are in the sm_90a image only (what tools/check_sass.sh checks inside them is unchanged by
#     the portable backend; --with-sm90 runs that script too).
# Usage: bash tools/check_sass_sm80.sh [build-dir] [--with-sm90]      (default: build)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="build"
WITH_SM90=0
for arg in "$@"; do
  case "$arg" in
    --with-sm90) WITH_SM90=1 ;;
    *) BUILD_DIR="$arg" ;;
  esac
done
[[ -f "$BUILD_DIR/.tools/env.sh" ]] && source "$BUILD_DIR/.tools/env.sh"

fail=0
err() { echo "check_sass_sm80: FAIL: $*"; fail=1; }

cache="$BUILD_DIR/CMakeCache.txt"
[[ -f "$cache" ]] || { echo "check_sass_sm80: FAIL: no $cache"; exit 1; }
if grep -qE "^FLASHCORE_BUILD_SM80:BOOL=(OFF|0|FALSE|NO)$" "$cache"; then
  echo "check_sass_sm80: the portable backend is not built (FLASHCORE_BUILD_SM80=OFF): nothing to check"
  exit 0
fi
archs=$(grep -E "^FLASHCORE_SM80_ARCHS:" "$cache" | cut -d= -f2- | tr ';' ' ')
[[ -n "$archs" ]] || { echo "check_sass_sm80: FAIL: FLASHCORE_SM80_ARCHS not found in $cache"; exit 1; }

lib=""
for cand in "$BUILD_DIR/lib/libflashcore.so" "$BUILD_DIR/lib/libflashcore.a" "$BUILD_DIR/lib/libflashcore_static.a"; do
  [[ -f "$cand" ]] && { lib="$cand"; break; }
done
[[ -n "$lib" ]] || { echo "check_sass_sm80: FAIL: no libflashcore in $BUILD_DIR/lib"; exit 1; }
command -v cuobjdump >/dev/null || { echo "check_sass_sm80: FAIL: cuobjdump not found (run tools/setup_deps.sh)"; exit 1; }

rows=$(grep -c "^FLASHCORE_SM80_ROW" "$BUILD_DIR/generated/kernels/sm80/rows.inc" 2>/dev/null || echo 0)
narchs=$(wc -w <<<"$archs")
expected=$((rows * narchs))
# tools/check_sass.sh's dump of the same library when it is newer than the library (run_tests.sh runs that first:
# one disassembly of the whole library instead of two), else a dump of our own.
sass="$BUILD_DIR/flashcore.sass"
if [[ ! -s "$sass" || "$sass" -ot "$lib" || "$lib" != "$BUILD_DIR/lib/libflashcore.so" ]]; then
  sass="$BUILD_DIR/flashcore_sm80.sass"
  cuobjdump --dump-sass "$lib" >"$sass" 2>"$sass.err" || { cat "$sass.err"; err "cuobjdump failed on $lib"; exit 1; }
fi

# One line per (kernel, arch): name, arch, HMMA, LDGSTS, LDSM, LDSM .MT88 (transposed), LDL/STL counts.
report=$(awk '
  function flush() { if (name != "") print name, arch, h, g, s, t, loc }
  /code for sm_/ { flush(); name = ""; arch = $NF; next }
  /Function : / { flush(); name = $NF; h = g = s = t = loc = 0; next }
  name != "" && /HMMA/   { h++ }
  name != "" && /LDGSTS/ { g++ }
  name != "" && /LDSM/   { s++ }
  name != "" && /LDSM[.A-Z0-9]*MT88/ { t++ }
  name != "" && /[^A-Z](LDL|STL)[. ]/ { loc++ }
  END { flush() }
' "$sass" | sort -u)

portable=$(grep flashcore_fwd_sm80_kernel <<<"$report" || true)
found=$(printf '%s\n' "$portable" | grep -c . || true)
echo "check_sass_sm80: $found portable kernel image(s) in $lib (expected $expected: $rows kernels x archs $archs)"
[[ "$found" -eq "$expected" && "$found" -gt 0 ]] || err "found $found portable kernel images, expected $expected"
for a in $archs; do
  n=$(awk -v a="sm_$a" '$2 == a' <<<"$portable" | grep -c . || true)
  [[ "$n" -eq "$rows" ]] || err "sm_$a: $n portable kernels, expected $rows"
done

while read -r name arch h g s t loc; do
  [[ -z "${name:-}" ]] && continue
  demangled=$(echo "$name" | c++filt 2>/dev/null || echo "$name")
  short=$(grep -o 'r80_[A-Za-z0-9_]*' <<<"$demangled" | head -1)
  status="ok"
  if ! grep -qw "${arch#sm_}" <<<"$archs"; then err "$short: an image for $arch, which is not in FLASHCORE_SM80_ARCHS"; status="FAIL"; fi
  [[ "$h" -gt 0 ]] || { err "$short ($arch): no HMMA"; status="FAIL"; }
  [[ "$g" -gt 0 ]] || { err "$short ($arch): no LDGSTS"; status="FAIL"; }
  [[ "$s" -gt 0 ]] || { err "$short ($arch): no LDSM"; status="FAIL"; }
  [[ "$t" -gt 0 ]] || { err "$short ($arch): no transposed LDSM (.MT88)"; status="FAIL"; }
  [[ "$loc" -eq 0 ]] || { err "$short ($arch): $loc local-memory instructions (LDL/STL)"; status="FAIL"; }
  printf 'check_sass_sm80: %-4s %-6s HMMA=%-4s LDGSTS=%-4s LDSM=%-4s LDSM.T=%-4s LDL/STL=%-3s %s\n' \
    "$status" "$arch" "$h" "$g" "$s" "$t" "$loc" "$short"
done <<<"$portable"

# The backward kernels (bwd_rows.inc: one row per (dtype, head dim, tile), each a causal and a non-causal kernel, plain
# and in the variants' flavour; the 128-row tiles, named _m128, plain only): the same instructions, no local memory,
# once per arch.
bwd_rows=$(grep -c "^FLASHCORE_SM80_BWD" "$BUILD_DIR/generated/kernels/sm80/bwd_rows.inc" 2>/dev/null || echo 0)
bwd_plain_rows=$(grep -c "^FLASHCORE_SM80_BWD(.*_m128)" "$BUILD_DIR/generated/kernels/sm80/bwd_rows.inc" 2>/dev/null || true)
bwd_expected=$(((4 * bwd_rows - 2 * ${bwd_plain_rows:-0}) * narchs))
backward=$(grep flashcore_bwd_sm80_kernel <<<"$report" || true)
bwd_found=$(printf '%s\n' "$backward" | grep -c . || true)
echo "check_sass_sm80: $bwd_found portable backward kernel image(s) (expected $bwd_expected: $bwd_rows rows x 4" \
     "(${bwd_plain_rows:-0} of them x 2) x archs $archs)"
[[ "$bwd_found" -eq "$bwd_expected" ]] || err "found $bwd_found portable backward kernel images, expected $bwd_expected"
while read -r name arch h g s t loc; do
  [[ -z "${name:-}" ]] && continue
  short=$(echo "$name" | c++filt 2>/dev/null | grep -o 'BwdConfig<[^>]*>' | head -1)
  [[ -n "$short" ]] || short="$name"
  status="ok"
  [[ "$h" -gt 0 && "$g" -gt 0 && "$s" -gt 0 && "$t" -gt 0 ]] || { err "$short ($arch): HMMA=$h LDGSTS=$g LDSM=$s LDSM.T=$t"; status="FAIL"; }
  [[ "$loc" -eq 0 ]] || { err "$short ($arch): $loc local-memory instructions (LDL/STL)"; status="FAIL"; }
  printf 'check_sass_sm80: %-4s %-6s HMMA=%-4s LDGSTS=%-4s LDSM=%-4s LDSM.T=%-4s LDL/STL=%-3s %s\n' \
    "$status" "$arch" "$h" "$g" "$s" "$t" "$loc" "$short"
done <<<"$backward"

# The sm90 kernels: in the sm_90a image only (a body for another arch would be the trap-only one).
wrong=$(grep flashcore_fwd_sm90_kernel <<<"$report" | awk '$2 != "sm_90a"' || true)
if [[ -n "$wrong" ]]; then
  err "sm90 kernels compiled for other archs than sm_90a: $(awk '{print $2}' <<<"$wrong" | sort -u | tr '\n' ' ')"
fi
n90=$(grep -c flashcore_fwd_sm90_kernel <<<"$report" || true)
echo "check_sass_sm80: $n90 sm90 kernel image(s), all sm_90a: $([[ -z "$wrong" ]] && echo yes || echo no)"

# ptxas -v report, per (kernel, arch): "Compiling entry function 'NAME' for 'sm_XX'", then "N bytes stack frame,
# N bytes spill stores, N bytes spill loads".
log="$BUILD_DIR/build.log"
if [[ ! -f "$log" ]]; then
  err "no build log at $log (the ptxas -v report is read from it)"
else
  spills=$(awk '
    /Compiling entry function / { name = $(NF - 2); arch = $NF; gsub(/\047/, "", name); gsub(/\047/, "", arch); next }
    name != "" && /bytes stack frame/ { print name, arch, $1, $5, $9; name = "" }
  ' "$log" | grep -E "flashcore_(fwd|bwd)_sm80_kernel" | sort -u)
  nspill=$(printf '%s\n' "$spills" | awk 'NF' | awk '{print $1, $2}' | sort -u | grep -c . || true)
  [[ "$nspill" -ge $((expected + bwd_expected)) ]] ||
    err "ptxas -v report covers $nspill portable kernel images, expected $((expected + bwd_expected))"
  while read -r name arch stack st ld; do
    [[ -z "${name:-}" ]] && continue
    if [[ "$stack" != 0 || "$st" != 0 || "$ld" != 0 ]]; then
      who=$(grep -o 'r80_[A-Za-z0-9_]*' <<<"$name" | head -1)
      err "${who:-$name} ($arch): stack $stack B, spill stores $st B, spill loads $ld B"
    fi
  done <<<"$spills"
  echo "check_sass_sm80: ptxas reports for $nspill portable kernel image(s): stack frame and spills checked"
fi

if [[ $WITH_SM90 -eq 1 ]]; then
  bash tools/check_sass.sh "$BUILD_DIR" || err "tools/check_sass.sh failed"
fi

if [[ $fail -eq 0 ]]; then echo "check_sass_sm80: PASS"; else echo "check_sass_sm80: FAILED"; fi
exit $fail

#!/usr/bin/env bash
# Checks that every compiled forward kernel is what its name says (CI runs this; no GPU needed):
#   - its SASS contains HGMMA (16-bit wgmma; QGMMA, the 8-bit wgmma, for the e4m3 and e5m2 rows *_e4m3_* / *_e5m2_*, which must have no
#     HGMMA; IGMMA, the int8 wgmma of Q K^T, and HGMMA, the 16-bit P V, for the int8 rows *_i8_*) and UTMALDG (TMA
#     loads), and UTMASTG (TMA stores) except the split-KV
#     kernels (rows named *_split_*), which write fp32 partials with plain stores for the combine kernel;
#   - the 8-bit rows whose tile lets the producer warps transpose V in shared memory (tile_shape.h
#     transposes_v_in_place: head dim 64, 128 with key blocks of whole 128 keys, 256 with 128-key blocks) have the
#     transposer's STSM (transpose_v.cuh);
#   - the fp16 / bf16 kernels of head dim 128 and 256 have UTMALDG.5D: the host encodes their Q map (and a dense
#     K/V's whose box is the whole tile) in 5-D, one box of every 128-byte chunk (tile_shape.h tma_chunked), and a
#     producer that still issued 4-D loads would stop with an illegal instruction;
#   - its SASS has no LDL/STL (local memory);
#   - ptxas reported 0 spill bytes and a 0-byte stack frame for it (from the build log's -Xptxas -v report);
#   - ptxas did not ignore setmaxnreg (C7508) or serialize wgmma (C7510-C7519) anywhere;
#   - the softmax overlaps the P V GEMM in every kernel with two P register sets (config.h kTwoPSets): at least 16
#     MUFU.EX2 between the wait for S (DEPBAR.LE gsb0, 0x1) and the wait for P V (DEPBAR.LE gsb0, 0x0) (see
#     docs/decisions.md#pv-overlap: ptxas had moved the second wait above the softmax);
#   (which kernels have two P sets and transpose V in place: `flashcore info --kernels`, from the library's own
#   constants, so that this script keeps no copy of those rules);
#   - no TMA load (UTMALDG) sits in a per-lane loop (an ELECT loop that moves its operands from general to uniform
#     registers lane by lane, closed by BRA.U.ANY): the producer is an elected thread that ptxas knows to be alone
#     (kernel.cuh, ptx.cuh elect_one_sync; docs/decisions.md#elected-producer). The epilogue's O stores (UTMASTG) are
#     not checked: a consumer thread issues them, and the split-KV rows' do sit in such loops (once per tile);
#   - src/kernels/sm90/wgmma_ops.inc matches tools/gen_wgmma.py.
# Usage: bash tools/check_sass.sh [build-dir]      (default: build)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD_DIR="${1:-build}"
[[ -f "$BUILD_DIR/.tools/env.sh" ]] && source "$BUILD_DIR/.tools/env.sh"

fail=0
err() { echo "check_sass: FAIL: $*"; fail=1; }

# The checked-in wgmma wrappers must be what the generator makes.
if ! python3 tools/gen_wgmma.py | cmp -s - src/kernels/sm90/wgmma_ops.inc; then
  err "src/kernels/sm90/wgmma_ops.inc is stale: run python3 tools/gen_wgmma.py > src/kernels/sm90/wgmma_ops.inc"
fi
if ! python3 tools/gen_wgmma.py --bwd | cmp -s - src/kernels/sm90/wgmma_bwd_ops.inc; then
  err "src/kernels/sm90/wgmma_bwd_ops.inc is stale: run python3 tools/gen_wgmma.py --bwd > src/kernels/sm90/wgmma_bwd_ops.inc"
fi

lib=""
for cand in "$BUILD_DIR/lib/libflashcore.so" "$BUILD_DIR/lib/libflashcore.a"; do
  [[ -f "$cand" ]] && { lib="$cand"; break; }
done
[[ -n "$lib" ]] || { echo "check_sass: FAIL: no libflashcore in $BUILD_DIR/lib"; exit 1; }
command -v cuobjdump >/dev/null || { echo "check_sass: FAIL: cuobjdump not found (run tools/setup_deps.sh)"; exit 1; }

expected=$(grep -c "^FLASHCORE_SM90_ROW" "$BUILD_DIR/generated/kernels/sm90/rows.inc" 2>/dev/null || echo 0)
# Per generated row: "<row> two_p_sets=0|1 v_in_place=0|1" (config.h kTwoPSets, tile_shape.h transposes_v_in_place).
cli="$BUILD_DIR/bin/flashcore"
[[ -x "$cli" ]] || { echo "check_sass: FAIL: no $cli (the kernel list comes from 'flashcore info --kernels')"; exit 1; }
kernels=$("$cli" info --kernels) || { echo "check_sass: FAIL: '$cli info --kernels' failed"; exit 1; }
declare -A two_p_sets v_in_place
while read -r row two in_place; do
  two_p_sets[$row]=${two#two_p_sets=}
  v_in_place[$row]=${in_place#v_in_place=}
done <<<"$kernels"
# The row a kernel symbol instantiates (KernelConfig<r_...>).
row_of() { if [[ "$1" =~ (r_[a-z0-9_]+) ]]; then echo "${BASH_REMATCH[1]}"; else echo "?"; fi; }
sass="$BUILD_DIR/flashcore.sass"
# Every image (check_sass_sm80.sh reads the portable ones from the same dump when it is newer than the library).
cuobjdump --dump-sass "$lib" >"$sass" 2>"$sass.err" || { cat "$sass.err"; err "cuobjdump failed on $lib"; exit 1; }

# One summary line per kernel: name, HGMMA, QGMMA, IGMMA, UTMALDG, UTMASTG, LDL/STL and STSM counts.
report=$(awk '
  /Function : / { if (name != "") print name, h, q, i, l, s, loc, t, l5, cv; name = $NF; h = q = i = l = s = loc = t = l5 = cv = 0; next }
  name != "" && /HGMMA/   { h++ }
  name != "" && /QGMMA/   { q++ }
  name != "" && /IGMMA/   { i++ }
  name != "" && /UTMALDG/ { l++ }
  name != "" && /UTMALDG\.5D/ { l5++ }
  name != "" && /UTMASTG/ { s++ }
  name != "" && /[^A-Z](LDL|STL)[. ]/ { loc++ }
  name != "" && /STSM/    { t++ }
  name != "" && /F2FP\.F16\.E4M3/ { cv++ }
  END { if (name != "") print name, h, q, i, l, s, loc, t, l5, cv }
' "$sass" | grep flashcore_fwd_sm90_kernel | sort -u)

found=$(printf '%s\n' "$report" | grep -c . || true)
echo "check_sass: $found forward kernel(s) in $lib (expected $expected from the generated instantiations)"
[[ "$found" -eq "$expected" && "$found" -gt 0 ]] || err "found $found forward kernels, expected $expected"

while read -r name h q i l s loc t l5 cv; do
  [[ -z "${name:-}" ]] && continue
  demangled=$(echo "$name" | c++filt 2>/dev/null || echo "$name")
  status="ok"
  if [[ "$demangled" == *_kve4m3_* ]]; then  # an e4m3 KV cache under 16-bit Q (convert_kv.cuh)
    [[ "$h" -gt 0 ]] || { err "$demangled: no HGMMA"; status="FAIL"; }
    [[ "$q" -eq 0 ]] || { err "$demangled: 16-bit GEMMs expected, found $q QGMMA"; status="FAIL"; }
    [[ "$cv" -gt 0 ]] || { err "$demangled: no F2FP.F16.E4M3 (e4m3 K/V widened in shared memory or into registers)"; status="FAIL"; }
  elif [[ "$demangled" == *_e4m3_* || "$demangled" == *_e5m2_* ]]; then
    [[ "$q" -gt 0 ]] || { err "$demangled: no QGMMA (8-bit wgmma)"; status="FAIL"; }
    [[ "$h" -eq 0 ]] || { err "$demangled: 8-bit kernel with $h HGMMA"; status="FAIL"; }
    in_place=${v_in_place[$(row_of "$name")]:-}
    [[ -n "$in_place" ]] || { err "$demangled: not in 'flashcore info --kernels'"; status="FAIL"; }
    if [[ "$in_place" == 1 ]]; then
      [[ "$t" -gt 0 ]] || { err "$demangled: no STSM (V transposed in the producer warps)"; status="FAIL"; }
    fi
  elif [[ "$demangled" == *_i8_* ]]; then
    [[ "$i" -gt 0 ]] || { err "$demangled: no IGMMA (int8 wgmma of Q K^T)"; status="FAIL"; }
    [[ "$h" -gt 0 ]] || { err "$demangled: no HGMMA (16-bit P V)"; status="FAIL"; }
  else
    [[ "$h" -gt 0 ]] || { err "$demangled: no HGMMA"; status="FAIL"; }
  fi
  [[ "$l" -gt 0 ]] || { err "$demangled: no UTMALDG"; status="FAIL"; }
  # A 16-bit head dim of several 128-byte chunks: the host encodes Q's map in 5-D (tile_shape.h tma_chunked), so the
  # producer must load it with a 5-D TMA (a 4-D load of a 5-D map is an illegal instruction).
  if [[ "$demangled" =~ r_(fp16|bf16)_d(128|256)_ ]]; then
    [[ "$l5" -gt 0 ]] || { err "$demangled: no UTMALDG.5D (a 16-bit tile of several chunks loads as one 5-D box)"; status="FAIL"; }
  fi
  [[ "$s" -gt 0 || "$demangled" == *_split_* ]] || { err "$demangled: no UTMASTG"; status="FAIL"; }
  [[ "$loc" -eq 0 ]] || { err "$demangled: $loc local-memory instructions (LDL/STL)"; status="FAIL"; }
  printf 'check_sass: %-4s HGMMA=%-4s QGMMA=%-4s IGMMA=%-3s UTMALDG=%-3s UTMASTG=%-3s LDL/STL=%-3s STSM=%-3s %s\n' "$status" "$h" \
    "$q" "$i" "$l" "$s" "$loc" "$t" \
    "$demangled"
done <<<"$report"

# The backward kernels (bwd_kernel.cuh): 16-bit wgmma (HGMMA), TMA loads (UTMALDG), the dQ bulk reduction
# (UBLKRED; the wide head dims' kernels, BwdWideConfig: vector atomic adds, REDG...F32x4, and stmatrix for P and
# dS) and no local memory, per kernel.
bwd_report=$(awk '
  /Function : / { if (name != "") print name, h, l, r, loc; name = $NF; h = l = r = loc = 0; next }
  name != "" && /HGMMA/   { h++ }
  name != "" && /UTMALDG/ { l++ }
  name != "" && (/UBLKRED/ || (name ~ /BwdWideConfig/ && /REDG.*F32x4/)) { r++ }
  name != "" && /[^A-Z](LDL|STL)[. ]/ { loc++ }
  END { if (name != "") print name, h, l, r, loc }
' "$sass" | grep flashcore_bwd_sm90_kernel | sort -u)
bwd_found=$(printf '%s\n' "$bwd_report" | grep -c . || true)
[[ "$bwd_found" -gt 0 ]] || echo "check_sass: no sm90 backward kernel in this build (FLASHCORE_HEAD_DIMS / FLASHCORE_DTYPES without 64 / 128 or fp16 / bf16)"
while read -r name h l r loc; do
  [[ -z "${name:-}" ]] && continue
  demangled=$(echo "$name" | c++filt 2>/dev/null || echo "$name")
  status="ok"
  [[ "$h" -gt 0 ]] || { err "$demangled: no HGMMA"; status="FAIL"; }
  [[ "$l" -gt 0 ]] || { err "$demangled: no UTMALDG"; status="FAIL"; }
  [[ "$r" -gt 0 ]] || { err "$demangled: no UBLKRED (the dQ bulk reduction; wide: REDG F32x4)"; status="FAIL"; }
  [[ "$loc" -eq 0 ]] || { err "$demangled: $loc local-memory instructions (LDL/STL)"; status="FAIL"; }
  printf 'check_sass: %-4s HGMMA=%-4s UTMALDG=%-3s dQ-RED=%-3s LDL/STL=%-3s %s\n' "$status" "$h" "$l" "$r" "$loc" "$demangled"
done <<<"$bwd_report"

# TMA loads in per-lane loops: a BRA.U.ANY within two instructions after a UTMALDG, per kernel.
lane_loops=$(awk '
  /Function : / { name = $NF; left = 0; next }
  name == "" { next }
  /UTMALDG/ { left = 2; next }
  left > 0 && /BRA\.U\.ANY/ { n[name]++; left = 0; next }
  left > 0 && /;/ { left-- }
  END { for (k in n) print k, n[k] }
' "$sass" | grep flashcore_fwd_sm90_kernel | sort -u)
while read -r name loops; do
  [[ -z "${name:-}" ]] && continue
  err "$(echo "$name" | c++filt 2>/dev/null || echo "$name"): $loops TMA load(s) in a per-lane ELECT loop (the producer thread is not an elected one)"
done <<<"$lane_loops"
echo "check_sass: TMA loads checked for per-lane loops"

# Softmax / P V overlap: the most MUFU.EX2 between a wait for S and the next wait for P V, per kernel.
overlap=$(awk '
  /Function : / { if (name != "") print name, best; name = $NF; best = 0; open_ = 0; next }
  name == "" { next }
  /WARPGROUP.DEPBAR.LE gsb0, 0x1/ { open_ = 1; n = 0; next }
  /WARPGROUP.DEPBAR.LE gsb0, 0x0/ { if (open_ && n > best) best = n; open_ = 0; next }
  open_ && /MUFU.EX2/ { n++ }
  END { if (name != "") print name, best }
' "$sass" | grep flashcore_fwd_sm90_kernel | sort -u)
two_sets=0
while read -r name ex2; do
  [[ -z "${name:-}" ]] && continue
  two=${two_p_sets[$(row_of "$name")]:-}
  [[ -n "$two" ]] || err "$(echo "$name" | c++filt 2>/dev/null || echo "$name"): not in 'flashcore info --kernels'"
  if [[ "$two" == 1 ]]; then
    two_sets=$((two_sets + 1))
    [[ "$ex2" -ge 16 ]] || err "$(echo "$name" | c++filt 2>/dev/null || echo "$name"): two P sets, but only $ex2 MUFU.EX2 between the S and P V waits (the softmax does not overlap the P V GEMM)"
  fi
done <<<"$overlap"
echo "check_sass: softmax / P V overlap checked in $two_sets kernel(s) with two P register sets"

# Every forward kernel has a key-block loop with MMAs and exponentials (tools/sass_loops.py); its per-class
# instruction counts go to $BUILD_DIR/main_loops.md (the static audit of docs/decisions.md#sass-check).
loops_md="$BUILD_DIR/main_loops.md"
if python3 tools/sass_loops.py "$sass" --function flashcore_fwd_sm90_kernel --markdown >"$loops_md"; then
  nloops=$(grep -c '^| r_' "$loops_md" || true)
  nkern=$(grep '^| r_' "$loops_md" | cut -d'|' -f2 | sort -u | wc -l)
  [[ "$nkern" -ge "$expected" ]] || err "tools/sass_loops.py found a main loop in $nkern forward kernels, expected $expected"
  echo "check_sass: main loops of $nkern forward kernel(s) ($nloops loops) in $loops_md"
else
  err "tools/sass_loops.py failed on $sass"
fi

# ptxas -v report: "Function properties for NAME" followed by "N bytes stack frame, N bytes spill stores, ...".
log="$BUILD_DIR/build.log"
if [[ ! -f "$log" ]]; then
  err "no build log at $log (the ptxas -v report is read from it)"
else
  spills=$(awk '
    /Function properties for / { name = $NF; next }
    name != "" && /bytes stack frame/ { print name, $1, $5, $9; name = "" }
  ' "$log" | grep flashcore_fwd_sm90_kernel | sort -u)
  nspill=$(printf '%s\n' "$spills" | grep -c . || true)
  [[ "$nspill" -ge "$expected" ]] || err "ptxas -v report covers $nspill forward kernels, expected $expected"
  while read -r name stack st ld; do
    [[ -z "${name:-}" ]] && continue
    if [[ "$stack" != 0 || "$st" != 0 || "$ld" != 0 ]]; then
      err "$(echo "$name" | c++filt 2>/dev/null || echo "$name"): stack $stack B, spill stores $st B, spill loads $ld B"
    fi
  done <<<"$spills"
  echo "check_sass: ptxas reports for $nspill forward kernel(s): stack frame and spills checked"
  if grep -E "C7508|C751[0-9]" "$log" >/dev/null; then
    grep -E "C7508|C751[0-9]" "$log" | head -5
    err "ptxas ignored setmaxnreg (C7508) or serialized wgmma (C7510-C7519)"
  fi
fi

if [[ $fail -eq 0 ]]; then echo "check_sass: PASS"; else echo "check_sass: FAILED"; fi
exit $fail

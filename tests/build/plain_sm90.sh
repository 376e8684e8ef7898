#!/usr/bin/env bash
# A kernel unit built for plain sm_90 (not sm_90a) must fail to compile with a message that says why: such a
# build would otherwise hold kernels with an empty body that "succeed" without writing O.
#   plain_sm90.sh NVCC SOURCE_DIR GENERATED_DIR
set -uo pipefail
nvcc=$1 src=$2 gen=$3
unit=$(ls "$gen"/kernels/sm90/r_*.cu 2>/dev/null | head -1)
[[ -n $unit ]] || { echo "plain_sm90: no generated kernel unit under $gen"; exit 1; }
out=$("$nvcc" -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 -I"$src/include" -I"$src/src" \
      -I"$gen" -c "$unit" -o /dev/null 2>&1)
rc=$?
if [[ $rc -eq 0 ]]; then echo "plain_sm90: FAIL: $unit compiled for plain sm_90"; exit 1; fi
if ! grep -q "need the sm_90a target" <<<"$out"; then
  echo "plain_sm90: FAIL: compilation failed, but not with FlashCore's message:"; echo "$out" | head -20; exit 1
fi
echo "plain_sm90: ok: $(grep -m1 'need the sm_90a target' <<<"$out")"

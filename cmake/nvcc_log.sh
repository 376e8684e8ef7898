#!/usr/bin/env bash
# CMAKE_CUDA_COMPILER_LAUNCHER: runs the nvcc command line given as arguments, prints its output as usual
# and keeps a copy in <object>.log (the ptxas -v register/spill report of that translation unit).
out=""
prev=""
for arg in "$@"; do
  if [[ "$prev" == "-o" ]]; then out="$arg"; fi
  prev="$arg"
done
if [[ -z "$out" ]]; then
  exec "$@"
fi
mkdir -p "$(dirname "$out")"
"$@" >"$out.log.tmp" 2>&1
rc=$?
cat "$out.log.tmp"
mv -f "$out.log.tmp" "$out.log"
exit $rc

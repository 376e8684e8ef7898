#!/usr/bin/env bash
# Packs what a device call needs into .carry/ (an ignored folder; pass carry: [".carry"] to the device tool):
#   .carry/pack.tar.xz  build/lib/libflashcore.so* and build/bin/{flashcore,flashcore_gpu_tests,flashcore_cpu_tests,
#                       flashcore_abi_v1_caller,flashcore_abi_v2_caller} (the binaries link the kernels statically:
#                       about 95 MB each unpacked, 15-25 MB packed)
#   .carry/fa3.tar.xz   .fa3/, a copy of ../shared/fa3/prefill (or $FA3_DIR), for the same-run FA3 columns
# tools/device_run.sh unpacks both before its stages. Run after building (cmake --build build).
#   bash tools/device_pack.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${1:-build}
mkdir -p .carry
files=()
for f in "$build"/lib/libflashcore.so*; do [[ -e $f ]] && files+=("$f"); done
for b in flashcore flashcore_gpu_tests flashcore_cpu_tests flashcore_abi_v1_caller flashcore_abi_v2_caller; do
  [[ -x $build/bin/$b ]] && files+=("$build/bin/$b")
done
[[ ${#files[@]} -gt 0 ]] || { echo "device_pack.sh: nothing built in $build" >&2; exit 1; }
tar -cJf .carry/pack.tar.xz --transform "s|^$build/|build/|" "${files[@]}"
fa3=${FA3_DIR:-../shared/fa3/prefill}
if [[ -d $fa3 ]]; then
  tmp=$(mktemp -d)
  cp -r "$fa3" "$tmp/.fa3"
  tar -C "$tmp" -cJf .carry/fa3.tar.xz .fa3
  chmod -R u+w "$tmp"; rm -rf "$tmp"
fi
du -ch .carry/*.tar.xz | tail -1 | awk '{print "device_pack.sh: .carry holds " $1 " of archives (the device tool carries at most 64 MiB)"}'

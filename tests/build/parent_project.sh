#!/usr/bin/env bash
# FlashCore inside a parent project whose CMAKE_CUDA_ARCHITECTURES lists other archs (80;90): its kernels must
# still be exactly FLASHCORE_CUDA_ARCHS (sm_90a) plus FLASHCORE_SM80_ARCHS (the parent sets 86, so an sm_80 or
# plain sm_90 image would be the parent's doing), without PTX (the targets set CUDA_ARCHITECTURES OFF; the
# -gencode flags are per source).
#   parent_project.sh SOURCE_DIR WORK_DIR      (builds one head dim and one dtype: about a minute on 2 cores)
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
cmake -S "$src/tests/build/parent_project" -B "$work" -G Ninja -DFLASHCORE_SOURCE_DIR="$src" >"$work/configure.log" 2>&1 ||
  { echo "parent_project: FAIL: configure"; tail -20 "$work/configure.log"; exit 1; }
cmake --build "$work" --target flashcore_static -j2 >"$work/build.log" 2>&1 ||
  { echo "parent_project: FAIL: build"; tail -20 "$work/build.log"; exit 1; }
lib=$(find "$work" -name libflashcore_static.a | head -1)
command -v cuobjdump >/dev/null || { echo "parent_project: FAIL: cuobjdump not on PATH"; exit 1; }
archs=$(cuobjdump --list-elf "$lib" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
ptx=$(cuobjdump --list-ptx "$lib" 2>/dev/null | grep -c '^PTX file' || true)
echo "parent_project: kernel images: ${archs:-none}; PTX entries: $ptx"
[[ "$archs" == "sm_86 sm_90a " && "$ptx" -eq 0 ]] || { echo "parent_project: FAIL: expected sm_86 and sm_90a SASS only"; exit 1; }
# Per object: the sm90 units hold sm_90a only, the portable units sm_86 only.
tmp=$(mktemp -d)
(cd "$tmp" && ar x "$lib") || { echo "parent_project: FAIL: cannot unpack $lib"; exit 1; }
for o in "$tmp"/*.cu.o; do
  got=$(cuobjdump --list-elf "$o" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
  case "$(basename "$o")" in
    r80_*) want="sm_86 " ;;
    *) want="sm_90a " ;;
  esac
  [[ "$got" == "$want" ]] || { echo "parent_project: FAIL: $(basename "$o") holds ${got:-none}, expected $want"; rm -rf "$tmp"; exit 1; }
done
rm -rf "$tmp"
echo "parent_project: ok"

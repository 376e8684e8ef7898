#!/usr/bin/env bash
# FlashCore inside a parent project (FetchContent with SOURCE_DIR = this checkout) whose CMAKE_CUDA_ARCHITECTURES
# lists other archs (80;90) and which sets no build type. Checks:
#   - the kernels are exactly FLASHCORE_CUDA_ARCHS (sm_90a) plus FLASHCORE_SM80_ARCHS (the parent sets 86, so an
#     sm_80 or plain sm_90 image would be the parent's doing), with PTX only of the newest portable arch (86:
#     FLASHCORE_SM80_PTX) in the portable and arch-neutral units, object by object (the targets set
#     CUDA_ARCHITECTURES OFF; the -gencode flags are per source);
#   - FlashCore's tests/CLI/install are off (checked in parent_project/CMakeLists.txt), the parent's build type
#     is left empty, and the libraries are built in FlashCore's own binary dir;
#   - a C program linked to flashcore::flashcore has no CUDA runtime on its link line, links and runs.
#   parent_project.sh SOURCE_DIR WORK_DIR      (builds one head dim and one dtype: about a minute on 2 cores)
set -uo pipefail
src=$1 work=$2
fail() { echo "parent_project: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd)
cmake -S "$src/tests/build/parent_project" -B "$work" -G Ninja -DFLASHCORE_SOURCE_DIR="$src" >"$work/configure.log" 2>&1 ||
  { tail -20 "$work/configure.log"; fail "configure"; }
cmake --build "$work" --target flashcore_static parent_consumer -j2 >"$work/build.log" 2>&1 ||
  { tail -20 "$work/build.log"; fail "build"; }

bt=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$work/CMakeCache.txt")
[[ -z $bt ]] || fail "the parent's CMAKE_BUILD_TYPE was set to '$bt'"
fcbin=$work/_deps/flashcore-build
lib=$(find "$fcbin" -name libflashcore_static.a | head -1)
so=$(find "$fcbin" -name 'libflashcore.so*' | head -1)
[[ -n $lib && -n $so ]] || fail "libflashcore_static.a / libflashcore.so not under FlashCore's binary dir $fcbin"
[[ ! -e $work/lib && ! -e $work/bin ]] || fail "FlashCore set output folders in the parent's binary dir ($work/lib, $work/bin)"
echo "parent_project: not top level: no tests/CLI/install, build type left empty, libraries in ${fcbin#"$work"/}/"

command -v cuobjdump >/dev/null || fail "cuobjdump not on PATH"
archs=$(cuobjdump --list-elf "$lib" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
ptx=$(cuobjdump --list-ptx "$lib" 2>/dev/null | grep -o 'sm_[0-9]*a\?\.ptx' | sort -u | tr '\n' ' ')
echo "parent_project: kernel images: ${archs:-none}; PTX: ${ptx:-none} (parent's CMAKE_CUDA_ARCHITECTURES: 80;90)"
[[ "$archs" == "sm_86 sm_90a " && "$ptx" == "sm_86.ptx " ]] ||
  fail "expected sm_86 and sm_90a SASS and compute_86 PTX (FLASHCORE_SM80_PTX) only"
# Per object: the sm90 units hold sm_90a only, the portable units sm_86 only, the arch-neutral units (merge.cu: the
# merge of partial results and the row copy; append.cu: the KV-cache append; rotary.cu: the queries' rotary
# embedding) both.
tmp=$(mktemp -d)
(cd "$tmp" && ar x "$lib") || fail "cannot unpack $lib"
for o in "$tmp"/*.cu.o; do
  got=$(cuobjdump --list-elf "$o" 2>/dev/null | grep -o 'sm_[0-9]*a\?' | sort -u | tr '\n' ' ')
  got_ptx=$(cuobjdump --list-ptx "$o" 2>/dev/null | grep -o 'sm_[0-9]*a\?\.ptx' | sort -u | tr '\n' ' ')
  case "$(basename "$o")" in
    r80_*) want="sm_86 " want_ptx="sm_86.ptx " ;;
    merge.cu.o | append.cu.o | rotary.cu.o) want="sm_86 sm_90a " want_ptx="sm_86.ptx " ;;
    *) want="sm_90a " want_ptx="" ;;
  esac
  [[ "$got" == "$want" ]] || { rm -rf "$tmp"; fail "$(basename "$o") holds ${got:-none}, expected $want"; }
  [[ "$got_ptx" == "$want_ptx" ]] ||
    { rm -rf "$tmp"; fail "$(basename "$o") holds PTX ${got_ptx:-none}, expected ${want_ptx:-none}"; }
done
rm -rf "$tmp"

link=$(awk '/^build parent_consumer:/ {on = 1} on && /LINK_LIBRARIES/ {print; exit}' "$work/build.ninja")
[[ -n $link ]] || fail "no link line for parent_consumer in build.ninja"
[[ $link == *libflashcore.so* ]] || fail "parent_consumer does not link libflashcore.so: $link"
if grep -qi 'cudart' <<<"$link"; then fail "the CUDA runtime leaks into the consumer's link line: $link"; fi
echo "parent_project: consumer link line:${link#*=}"
out=$("$work/parent_consumer" 2>&1) || { echo "$out"; fail "parent_consumer exited non-zero"; }
echo "$out"
echo "parent_project: ok"

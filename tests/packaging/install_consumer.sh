#!/usr/bin/env bash
# `cmake --install` of a FlashCore build into a fresh prefix, then examples/ (C and C++) as a consumer project:
# find_package(flashcore) configures, builds, links, and the programs run (on a machine without a GPU they
# must say so and exit 0). Also checks the installed file set and the pkg-config file.
#   install_consumer.sh BUILD_DIR SOURCE_DIR WORK_DIR     (no kernel is compiled: seconds)
set -uo pipefail
build=$1 src=$2 work=$3
fail() { echo "install_consumer: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd)
prefix=$work/prefix
version=$(sed -n 's/^#define FLASHCORE_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$src/include/flashcore/flashcore.h" | paste -sd.)
major=${version%%.*}

cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 || { cat "$work/install.log"; fail "cmake --install"; }
libdir=$(dirname "$(find "$prefix" -name libflashcore_static.a | head -1)")
[[ -d $libdir ]] || fail "libflashcore_static.a not installed"
for f in include/flashcore/flashcore.h include/flashcore/flashcore.hpp; do
  [[ -f $prefix/$f ]] || fail "$f not installed"
done
[[ -f $libdir/libflashcore.so.$version && ! -L $libdir/libflashcore.so.$version ]] || fail "libflashcore.so.$version"
[[ $(readlink "$libdir/libflashcore.so.$major") == "libflashcore.so.$version" ]] || fail "libflashcore.so.$major link"
[[ $(readlink "$libdir/libflashcore.so") == "libflashcore.so.$major" ]] || fail "libflashcore.so link"
for f in flashcoreConfig.cmake flashcoreConfigVersion.cmake flashcoreTargets.cmake; do
  [[ -f $libdir/cmake/flashcore/$f ]] || fail "cmake/flashcore/$f not installed"
done
# SameMajorVersion: requests 0.1 and <version> are met, 1.0 and a newer minor are not.
cat >"$work/version_check.cmake" <<CMAKE
foreach(want 0.1 $version 1.0 $major.99)
  string(REPLACE "." ";" parts "\${want}")
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  set(PACKAGE_FIND_VERSION \${want})
  unset(PACKAGE_VERSION_COMPATIBLE)
  include("$libdir/cmake/flashcore/flashcoreConfigVersion.cmake")
  string(APPEND result "\${want}:\${PACKAGE_VERSION_COMPATIBLE} ")
endforeach()
message("\${result}")
CMAKE
compat=$(cmake -P "$work/version_check.cmake" 2>&1)
[[ $compat == "0.1:TRUE $version:TRUE 1.0:FALSE $major.99:FALSE " ]] || fail "flashcoreConfigVersion.cmake: $compat"
echo "install_consumer: find_package(flashcore <v>) compatibility: $compat"
pc=$libdir/pkgconfig/flashcore.pc
[[ -f $pc ]] || fail "pkgconfig/flashcore.pc not installed"
if command -v pkg-config >/dev/null 2>&1; then
  pcv=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --modversion flashcore) || fail "pkg-config flashcore"
  flags=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs flashcore)
  inc=$(grep -o -- '-I[^ ]*' <<<"$flags" | head -1) inc=${inc#-I}  # the first: FlashCore's (then the CUDA toolkit's)
  [[ $pcv == "$version" && -f $inc/flashcore/flashcore.h && $flags == *-lflashcore* ]] || fail "pkg-config: $pcv: $flags"
  echo "install_consumer: pkg-config flashcore $pcv: $flags"
  # The README's one-liner: examples/attention.c (CUDA runtime calls, <math.h>) compiles and links with the .pc's
  # flags alone; at run time libflashcore.so.$major is found through the documented rpath, or LD_LIBRARY_PATH.
  export PKG_CONFIG_PATH=$libdir/pkgconfig
  cc=${CC:-cc}
  # shellcheck disable=SC2046  # pkg-config's output is a list of words
  "$cc" "$src/examples/attention.c" $(pkg-config --cflags --libs flashcore) \
    -Wl,-rpath,"$(pkg-config --variable=libdir flashcore)" -o "$work/attention_pc" >"$work/pc.log" 2>&1 ||
    { cat "$work/pc.log"; fail "cc examples/attention.c \$(pkg-config --cflags --libs flashcore) -Wl,-rpath,..."; }
  # shellcheck disable=SC2046
  "$cc" "$src/examples/attention.c" $(pkg-config --cflags --libs flashcore) -o "$work/attention_pc_norpath" \
    >>"$work/pc.log" 2>&1 || { cat "$work/pc.log"; fail "cc examples/attention.c \$(pkg-config --cflags --libs flashcore)"; }
  unset PKG_CONFIG_PATH
  resolved=$(env -u LD_LIBRARY_PATH ldd "$work/attention_pc" | awk '/libflashcore\.so/ {print $3}')
  [[ $(realpath "$resolved" 2>/dev/null) == $(realpath "$libdir/libflashcore.so.$major") ]] ||
    fail "attention_pc (rpath): libflashcore.so.$major resolves to '${resolved:-nothing}', not $libdir"
  # ldd's output whole before grep reads it: with pipefail, grep -q leaving early could fail ldd with SIGPIPE.
  norpath_ldd=$(env -u LD_LIBRARY_PATH ldd "$work/attention_pc_norpath" 2>&1)
  grep -q "libflashcore.so.$major => not found" <<<"$norpath_ldd" ||
    fail "attention_pc_norpath: libflashcore.so.$major found without rpath or LD_LIBRARY_PATH (test assumption)"
  resolved=$(LD_LIBRARY_PATH=$libdir ldd "$work/attention_pc_norpath" | awk '/libflashcore\.so/ {print $3}')
  [[ $(realpath "$resolved" 2>/dev/null) == $(realpath "$libdir/libflashcore.so.$major") ]] ||
    fail "attention_pc_norpath with LD_LIBRARY_PATH: libflashcore.so.$major resolves to '${resolved:-nothing}'"
  for prog in attention_pc attention_pc_norpath; do
    if [[ $prog == attention_pc ]]; then out=$(env -u LD_LIBRARY_PATH "$work/$prog" 2>&1); else out=$(LD_LIBRARY_PATH=$libdir "$work/$prog" 2>&1); fi
    rc=$?
    echo "$out" | sed "s/^/  [$prog] /"
    [[ $rc -eq 0 ]] || fail "$prog exited $rc"
  done
  echo "install_consumer: cc examples/attention.c \$(pkg-config --cflags --libs flashcore) links; libflashcore.so.$major found at run time through -Wl,-rpath,\$(pkg-config --variable=libdir flashcore), or LD_LIBRARY_PATH"
else
  grep -q "^Version: $version$" "$pc" || fail "flashcore.pc has no 'Version: $version'"
  echo "install_consumer: pkg-config not installed; flashcore.pc says Version: $version"
fi
echo "install_consumer: installed into $prefix: headers, libflashcore.so.$version (+ .so.$major, .so links), libflashcore_static.a, CMake package, flashcore.pc"

cmake -S "$src/examples" -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { tail -20 "$work/configure.log"; fail "configure examples/ with find_package(flashcore)"; }
cmake --build "$work/examples" >"$work/build.log" 2>&1 || { tail -20 "$work/build.log"; fail "build examples/"; }
echo "install_consumer: examples/ configured (find_package(flashcore $version)), built and linked (shared: attention_c, attention_cpp; static: attention_c_static)"

gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu=1; fi
for prog in attention_c attention_c_static attention_cpp; do
  out=$("$work/examples/$prog" 2>&1)
  rc=$?
  echo "$out" | sed "s/^/  [$prog] /"
  [[ $rc -eq 0 ]] || fail "$prog exited $rc"
  if [[ $gpu -eq 0 ]]; then grep -q "no supported GPU found" <<<"$out" || fail "$prog: no 'no GPU' message"; fi
done
echo "install_consumer: ok"

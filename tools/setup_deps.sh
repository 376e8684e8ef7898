#!/usr/bin/env bash
# Finds, and installs only if missing, what building and testing FlashCore needs (idempotent; safe to re-run):
#   cmake (>= 3.25), ninja, g++, nvcc (CUDA toolkit), GoogleTest, nlohmann/json, python3 + pytest, and
#   cuobjdump/nvdisasm for tools/check_sass.sh.
# Writes <build-dir>/.tools/env.sh, which the other scripts source to put nvcc and the SASS tools on PATH.
#
# With --python-tests (tools/run_tests.sh passes it) also what the Python tests need, from PyPI, each only when it
# is not importable (an installed copy is used whatever its version; nothing is downloaded when all are present):
#   torch==2.11.0 (PyPI's wheel, with its nvidia-* wheels; runs on the CPU without a GPU), numpy (2.4.6; 2.2.6 on
#   Python 3.10), transformers==5.17.0 (the adapter's tests). About a minute to download and install.
#   FLASHCORE_NO_TORCH=1 skips all three: the tests that need them then skip, with the reason.
#   When they are missing and cannot be installed, the script fails and says why.
#
# Nothing here needs the network, root or Debian when everything is already present. Otherwise:
#   - system packages come from apt-get, only if apt-get exists (through sudo when not root and sudo exists);
#   - pytest and cuobjdump/nvdisasm come from PyPI (pip); the SASS tools go into <build-dir>/.tools.
# When something cannot be installed the script says what is missing and how to install it.
#
# Where things are looked for:
#   nvcc                 PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin, /usr/local/cuda-*/bin
#   cuobjdump, nvdisasm  next to nvcc, /usr/local/cuda/bin, PATH, an earlier install in <build-dir>/.tools;
#                        else PyPI nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm of nvcc's version (X.Y.*),
#                        or, when PyPI has none, the newest of nvcc's major version (they read older cubins)
#
# Usage: bash tools/setup_deps.sh [--python-tests] [build-dir]      (default: build)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON_TESTS=0
if [[ "${1:-}" == "--python-tests" ]]; then PYTHON_TESTS=1; shift; fi
BUILD_DIR="${1:-${FLASHCORE_BUILD_DIR:-build}}"
mkdir -p "$BUILD_DIR/.tools"
TOOLS_DIR="$(cd "$BUILD_DIR/.tools" && pwd)"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
# Offline, fail fast instead of pip's default 5 retries with back-off.
PIP_NET_OPTS=(--retries 1 --timeout 15)

log() { echo "[setup_deps] $*"; }
die() { log "ERROR: $*"; exit 1; }

# ---- system packages: apt-get only when something is missing and apt-get exists ----
SUDO=""
APT_UPDATED=0
apt_install() {  # apt_install <debian package>...; returns 1 (after saying why) when it cannot
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing: $* (Debian/Ubuntu package names); apt-get is not available: install them with your package manager"
    return 1
  fi
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO="sudo"
    else
      log "missing: $*; not root and no sudo: ask an administrator to run: apt-get install $*"
      return 1
    fi
  fi
  if [[ $APT_UPDATED -eq 0 ]]; then
    log "apt-get update"
    $SUDO apt-get update -qq || { log "apt-get update failed (offline?)"; return 1; }
    APT_UPDATED=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
    { log "apt-get install $* failed"; return 1; }
}

# ---- nvcc: the CUDA toolkit is not installed by this script ----
if ! command -v nvcc >/dev/null 2>&1; then
  for dir in ${CUDA_HOME:+"$CUDA_HOME/bin"} ${CUDA_PATH:+"$CUDA_PATH/bin"} /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [[ -x "$dir/nvcc" ]]; then export PATH="$dir:$PATH"; break; fi
  done
fi
command -v nvcc >/dev/null 2>&1 ||
  die "nvcc not found (looked on PATH, in \$CUDA_HOME/bin, \$CUDA_PATH/bin and /usr/local/cuda*/bin); install the CUDA toolkit (>= 12.3) and put its bin/ on PATH"
NVCC_DIR="$(cd "$(dirname "$(command -v nvcc)")" && pwd)"
NVCC_VERSION="$(nvcc --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')"  # e.g. 13.0
[[ -n "$NVCC_VERSION" ]] || die "cannot read the release from 'nvcc --version'"
NVCC_MAJOR="${NVCC_VERSION%%.*}"

# ---- build tools ----
gtest_found() {
  local prefix f prefixes="${CMAKE_PREFIX_PATH:-}"
  for prefix in ${GTEST_ROOT:-} ${prefixes//:/ } ${CONDA_PREFIX:-} /usr /usr/local; do
    for f in "$prefix"/lib/cmake/GTest/GTestConfig.cmake "$prefix"/lib/*/cmake/GTest/GTestConfig.cmake \
             "$prefix"/lib64/cmake/GTest/GTestConfig.cmake "$prefix"/share/cmake/GTest/GTestConfig.cmake; do
      [[ -f "$f" ]] && return 0
    done
  done
  return 1
}
json_found() {  # the CMake package cmake/json.cmake finds (else it downloads the release at configure time)
  local prefix f prefixes="${CMAKE_PREFIX_PATH:-}"
  for prefix in ${nlohmann_json_ROOT:-} ${prefixes//:/ } ${CONDA_PREFIX:-} /usr /usr/local; do
    for f in "$prefix"/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake \
             "$prefix"/lib/cmake/nlohmann_json/nlohmann_jsonConfig.cmake \
             "$prefix"/lib/*/cmake/nlohmann_json/nlohmann_jsonConfig.cmake; do
      [[ -f "$f" ]] && return 0
    done
  done
  return 1
}
need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v ninja >/dev/null 2>&1 || need+=(ninja-build)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v python3 >/dev/null 2>&1 || need+=(python3)
gtest_found || need+=(libgtest-dev)
if [[ ${#need[@]} -gt 0 ]]; then
  apt_install "${need[@]}" ||
    die "cannot install ${need[*]} (cmake and ninja also come from pip: python3 -m pip install 'cmake>=3.25' ninja; GoogleTest: set GTEST_ROOT or CMAKE_PREFIX_PATH to its install prefix)"
fi

if ! json_found; then  # without it the configure step downloads the release: fine online, fatal offline
  apt_install nlohmann-json3-dev ||
    log "WARNING: nlohmann/json is not installed; configuring downloads its 3.11.3 release (needs the network), or set nlohmann_json_ROOT / CMAKE_PREFIX_PATH to an installed copy"
fi

cmake_version="$(cmake --version | head -1 | awk '{print $3}')"
if [[ "$(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -1)" != "3.25" ]]; then
  die "cmake $cmake_version is older than 3.25 (try: python3 -m pip install 'cmake>=3.25')"
fi

# ---- pip, only when something has to come from PyPI ----
pip_ready() {
  python3 -m pip --version >/dev/null 2>&1 && return 0
  apt_install python3-pip && python3 -m pip --version >/dev/null 2>&1 && return 0
  log "pip is not available for $(command -v python3): install it (python3 -m ensurepip --user, or your package manager's python3-pip)"
  return 1
}

# pip_install <requirement>...: into python3's environment, quietly (pip's output goes to <build-dir>/.tools/pip.log);
# retried with --break-system-packages for an externally managed Python (PEP 668) and with --user when
# site-packages is not writable. On failure prints pip's error lines and returns 1.
PIP_LOG="$TOOLS_DIR/pip.log"
pip_install() {
  local extra=()
  for _ in 1 2 3; do  # at most: plain, then with one or both of the two options
    if python3 -m pip install --quiet --progress-bar off "${PIP_NET_OPTS[@]}" ${extra[@]+"${extra[@]}"} "$@" \
         >"$PIP_LOG" 2>&1; then
      return 0
    fi
    if grep -q "externally-managed-environment" "$PIP_LOG" && [[ " ${extra[*]-} " != *" --break-system-packages "* ]]; then
      extra+=(--break-system-packages)
    elif grep -qE "Permission denied|\[Errno 13\]" "$PIP_LOG" && [[ " ${extra[*]-} " != *" --user "* ]]; then
      extra+=(--user)
    else
      break
    fi
  done
  grep -E "^ERROR|[Ee]rror:" "$PIP_LOG" | head -4 | sed 's/^/[setup_deps]   pip: /' || true
  log "  (pip's full output: $PIP_LOG)"
  return 1
}

# ---- pytest ----
if ! python3 -c "import pytest" >/dev/null 2>&1; then
  log "installing pytest"
  if ! { pip_ready && pip_install pytest; } && ! apt_install python3-pytest; then
    die "pytest is missing and could not be installed (PyPI unreachable?): install it with 'python3 -m pip install pytest' or your package manager (python3-pytest)"
  fi
fi

# ---- the Python tests' torch, numpy, transformers (--python-tests; FLASHCORE_NO_TORCH=1 skips them) ----
# Pinned: what gets installed when missing (an installed copy is kept, whatever its version). numpy 2.4 needs
# Python 3.11+; on 3.10 its 2.2 series.
PY_TEST_PINS=("torch==2.11.0" "numpy==2.4.6" "transformers==5.17.0")
if python3 -c 'import sys; sys.exit(sys.version_info >= (3, 11))'; then PY_TEST_PINS[1]="numpy==2.2.6"; fi
py_missing() {  # the names among torch, numpy, transformers that python3 cannot import (without importing them)
  python3 -c 'import importlib.util as u
print(" ".join(n for n in ("torch", "numpy", "transformers") if u.find_spec(n) is None))'
}
py_versions() {
  python3 -c 'from importlib import metadata as m
def v(n):
    try:
        return m.version(n)
    except m.PackageNotFoundError:
        return "missing"
print(", ".join(f"{n} {v(n)}" for n in ("torch", "numpy", "transformers")))'
}
PY_TEST_DEPS="not requested"
if [[ $PYTHON_TESTS -eq 1 ]]; then
  if [[ -n "${FLASHCORE_NO_TORCH:-}" && "$FLASHCORE_NO_TORCH" != "0" ]]; then
    PY_TEST_DEPS="$(py_versions) (FLASHCORE_NO_TORCH=$FLASHCORE_NO_TORCH: nothing installed)"
  else
    read -r -a missing <<<"$(py_missing)"
    if [[ ${#missing[@]} -gt 0 ]]; then
      reqs=()
      for name in "${missing[@]}"; do
        for pin in "${PY_TEST_PINS[@]}"; do
          if [[ "$pin" == "$name=="* ]]; then reqs+=("$pin"); fi
        done
      done
      log "installing ${missing[*]} for the Python tests from PyPI (${reqs[*]}; FLASHCORE_NO_TORCH=1 skips this)"
      start=$SECONDS
      if ! { pip_ready && pip_install "${reqs[@]}"; }; then
        die "could not install ${missing[*]} for the Python tests (PyPI unreachable? torch 2.11.0 needs Python 3.10+, this is $(python3 --version 2>&1)): install them yourself (python3 -m pip install ${reqs[*]}), or set FLASHCORE_NO_TORCH=1 to run without them (those tests skip)"
      fi
      still="$(py_missing)"
      [[ -z "$still" ]] || die "pip installed ${missing[*]}, but python3 still cannot find: $still (see $PIP_LOG)"
      python3 -c "import torch" >/dev/null 2>&1 || die "torch was installed but does not import: python3 -c 'import torch' says: $(python3 -c 'import torch' 2>&1 | tail -1)"
      log "installed ${missing[*]} in $((SECONDS - start)) s"
    fi
    PY_TEST_DEPS="$(py_versions)"
  fi
fi

# ---- cuobjdump / nvdisasm for tools/check_sass.sh ----
tool_version() { "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1; }
SASS_BIN=""
for dir in "$NVCC_DIR" /usr/local/cuda/bin \
           "$(dirname "$(command -v cuobjdump 2>/dev/null || echo /nonexistent/x)")"; do
  if [[ -x "$dir/cuobjdump" && -x "$dir/nvdisasm" ]]; then SASS_BIN="$dir"; break; fi
done
if [[ -z "$SASS_BIN" ]]; then  # an earlier PyPI install into the build dir, if of nvcc's major version
  found="$(find "$TOOLS_DIR/nvidia" -path '*/bin/cuobjdump' -type f 2>/dev/null | head -1 || true)"
  if [[ -n "$found" && -x "$(dirname "$found")/nvdisasm" ]]; then
    v="$(tool_version "$found")"
    if [[ "${v%%.*}" == "$NVCC_MAJOR" ]]; then SASS_BIN="$(dirname "$found")"; fi
  fi
fi
if [[ -z "$SASS_BIN" ]]; then
  # PyPI's copies are named by CUDA version: nvcc's major.minor first, else the newest of its major.
  SAME_MAJOR=">=$NVCC_VERSION,<$((NVCC_MAJOR + 1))"
  for spec in "==$NVCC_VERSION.*" "$SAME_MAJOR"; do
    if [[ $spec == "$SAME_MAJOR" ]]; then log "none for $NVCC_VERSION on PyPI (or PyPI unreachable); trying the newest $NVCC_MAJOR.x"; fi
    log "installing nvidia-cuda-cuobjdump/nvidia-cuda-nvdisasm $spec (nvcc is $NVCC_VERSION) into $TOOLS_DIR"
    if pip_ready && python3 -m pip install --quiet "${PIP_NET_OPTS[@]}" --upgrade --target "$TOOLS_DIR" \
         "nvidia-cuda-cuobjdump$spec" "nvidia-cuda-nvdisasm$spec" >"$PIP_LOG" 2>&1; then
      found="$(find "$TOOLS_DIR/nvidia" -path '*/bin/cuobjdump' -type f 2>/dev/null | head -1 || true)"
      if [[ -n "$found" ]]; then
        SASS_BIN="$(dirname "$found")"
        chmod +x "$SASS_BIN"/* 2>/dev/null || true
        break
      fi
    fi
  done
  if [[ -z "$SASS_BIN" ]]; then
    log "WARNING: cuobjdump/nvdisasm not found and not installable from PyPI (pip's output: $PIP_LOG); tools/check_sass.sh will fail."
    log "         Install the toolkit's cuobjdump and nvdisasm (e.g. apt-get install cuda-cuobjdump-${NVCC_VERSION/./-} cuda-nvdisasm-${NVCC_VERSION/./-}),"
    log "         or, with PyPI reachable: python3 -m pip install --target $TOOLS_DIR 'nvidia-cuda-cuobjdump$SAME_MAJOR' 'nvidia-cuda-nvdisasm$SAME_MAJOR'"
  fi
fi

# ---- env.sh for later steps ----
{
  echo "# Generated by tools/setup_deps.sh: puts nvcc and the SASS tools on PATH."
  echo "export PATH=\"$NVCC_DIR:\$PATH\""
  if [[ -n "$SASS_BIN" && "$SASS_BIN" != "$NVCC_DIR" ]]; then echo "export PATH=\"$SASS_BIN:\$PATH\""; fi
} >"$TOOLS_DIR/env.sh"

log "cmake $cmake_version, $(ninja --version | sed 's/^/ninja /'), $(g++ -dumpfullversion | sed 's/^/g++ /'), nvcc $NVCC_VERSION, $(python3 --version 2>&1)"
if [[ $PYTHON_TESTS -eq 1 ]]; then log "Python tests: $PY_TEST_DEPS"; fi
if [[ -n "$SASS_BIN" ]]; then
  log "SASS tools: $SASS_BIN (cuobjdump $(tool_version "$SASS_BIN/cuobjdump")); environment: $TOOLS_DIR/env.sh"
else
  log "SASS tools: missing; environment: $TOOLS_DIR/env.sh"
fi

#!/usr/bin/env bash
# `pip wheel .` at the repository root (scikit-build-core, small kernel set) must give a platform wheel holding
# libflashcore.so exactly once, at flashcore/lib/, and the flashcore program as a small flashcore/bin/flashcore linked
# to it (rpath $ORIGIN/../lib; no second copy of the kernels); installed into a fresh venv, `import flashcore` must
# find that copy and report the build's capabilities (and no device on a machine without a GPU), and the `flashcore`
# console script and `python -m flashcore` must run the program.
#   wheel.sh SOURCE_DIR WORK_DIR     (needs nvcc and PyPI for pip's build isolation; about a minute on 2 cores)
set -uo pipefail
src=$(cd "$1" && pwd) work=$2
fail() { echo "wheel: FAIL: $*"; exit 1; }
rm -rf "$work/venv" "$work/dist" && mkdir -p "$work/dist" && work=$(cd "$work" && pwd)
version=$(sed -n 's/^#define FLASHCORE_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$src/include/flashcore/flashcore.h" | paste -sd.)

# A fresh venv (without ensurepip, e.g. Debian without python3-venv: a pip-less venv, filled by the outer pip).
if python3 -m venv "$work/venv" >"$work/venv.log" 2>&1; then
  pip=("$work/venv/bin/python" -m pip)
else
  echo "wheel: python3 -m venv failed ($(tail -1 "$work/venv.log")); using a venv without pip"
  rm -rf "$work/venv" && python3 -m venv --without-pip "$work/venv" || fail "python3 -m venv --without-pip"
  pip=(python3 -m pip)
fi
py="$work/venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

echo "wheel: pip wheel $src (FLASHCORE_CUDA_ARCHS=90a FLASHCORE_SM80_ARCHS=86 FLASHCORE_HEAD_DIMS=64 FLASHCORE_DTYPES=bf16; log: $work/wheel.log)"
"${pip[@]}" wheel "$src" --no-deps -w "$work/dist" \
  --config-settings=cmake.define.FLASHCORE_CUDA_ARCHS=90a \
  --config-settings=cmake.define.FLASHCORE_SM80_ARCHS=86 \
  --config-settings=cmake.define.FLASHCORE_HEAD_DIMS=64 \
  --config-settings=cmake.define.FLASHCORE_DTYPES=bf16 \
  --config-settings=build-dir="$work/skbuild" >"$work/wheel.log" 2>&1 || { tail -30 "$work/wheel.log"; fail "pip wheel"; }
whl=$(ls "$work"/dist/*.whl 2>/dev/null)
[[ $(wc -w <<<"$whl") -eq 1 ]] || fail "expected one wheel in $work/dist, found: ${whl:-none}"
echo "wheel: built $(basename "$whl")"

# Tag, metadata, and the library: one regular file, flashcore/lib/libflashcore.so.
"$py" - "$whl" "$version" <<'PY' || fail "wheel contents"
import stat, sys, zipfile
path, version = sys.argv[1], sys.argv[2]
name = path.rsplit("/", 1)[-1]
tag = name[:-4].split("-")[-3:]
assert name.startswith(f"flashcore_attn-{version}-"), f"name/version: {name}, expected flashcore_attn-{version}"
assert tag[2].startswith("linux_") or tag[2].startswith("manylinux"), f"not a platform wheel: {'-'.join(tag)}"
with zipfile.ZipFile(path) as z:
    infos = z.infolist()
    libs = [i.filename for i in infos if i.filename.rsplit("/", 1)[-1].startswith("libflashcore")]
    links = [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)]
    meta = z.read(f"flashcore_attn-{version}.dist-info/METADATA").decode()
    files = {i.filename for i in infos}
    entry_points = z.read(f"flashcore_attn-{version}.dist-info/entry_points.txt").decode() \
        if f"flashcore_attn-{version}.dist-info/entry_points.txt" in files else ""
assert libs == ["flashcore/lib/libflashcore.so"], f"library copies in the wheel: {libs}"
assert not links, f"symlinks in the wheel: {links}"
assert "Name: flashcore-attn\n" in meta and f"Version: {version}\n" in meta, "METADATA name/version"
assert {"flashcore/__init__.py", "flashcore/_lib.py"} <= files, "the python package is missing"
cli = [i for i in infos if i.filename == "flashcore/bin/flashcore"]
assert cli and (cli[0].external_attr >> 16) & 0o111, "flashcore/bin/flashcore (executable) is missing"
lib = [i for i in infos if i.filename == "flashcore/lib/libflashcore.so"][0]
assert cli[0].file_size < 1 << 20, f"flashcore/bin/flashcore is {cli[0].file_size} bytes: the kernels linked in again?"
assert "flashcore = flashcore._cli:main" in entry_points, f"no flashcore console script: {entry_points!r}"
assert {"flashcore/_cli.py", "flashcore/__main__.py"} <= files, "the launcher modules are missing"
total = sum(i.file_size for i in infos)
print("wheel: files (bytes unpacked):")
for i in sorted(infos, key=lambda i: -i.file_size)[:6]:
    print(f"  {i.file_size:>10}  {i.compress_size:>10} packed  {i.filename}")
print(f"wheel: {len(infos)} files, {total} bytes unpacked, {sum(i.compress_size for i in infos)} packed")
assert any(f.endswith(".dist-info/licenses/LICENSE") for f in files), "LICENSE is missing"
print(f"wheel: tag {'-'.join(tag)}; {len(infos)} files; library: {libs[0]} (once, no symlinks); "
      f"METADATA flashcore-attn {version}")
PY

if [[ ${pip[0]} == python3 ]]; then
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  python3 -m pip install --quiet --no-deps --target "$site" "$whl" || fail "pip install --target the venv"
else
  "${pip[@]}" install --quiet --no-deps "$whl" || fail "pip install into the venv"
fi

# The program: main() linked to the one library, found through its rpath (no LD_LIBRARY_PATH).
pkgdir=$("$py" -I -c 'import os, flashcore; print(os.path.dirname(flashcore.__file__))' 2>/dev/null) ||
  pkgdir=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/flashcore
if command -v readelf >/dev/null 2>&1; then
  dyn=$(readelf -d "$pkgdir/bin/flashcore")
  grep -q 'NEEDED.*\[libflashcore.so\]' <<<"$dyn" || fail "flashcore/bin/flashcore does not link libflashcore.so"
  grep -q 'R\(UN\)\?PATH.*\[\$ORIGIN/../lib\]' <<<"$dyn" || fail "flashcore/bin/flashcore has no rpath \$ORIGIN/../lib"
  echo "wheel: flashcore/bin/flashcore: NEEDED libflashcore.so, rpath \$ORIGIN/../lib"
fi
# The console script: in the venv's bin/, or, installed with the outer pip's --target, in <site>/bin.
# (its shebang is then the outer Python's: run it with the venv's).
script=$work/venv/bin/flashcore
[[ -x $script ]] || script="$py $("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bin/flashcore"
for cmd in "$pkgdir/bin/flashcore" "$script" "$py -m flashcore"; do
  out=$(cd "$work" && env -u LD_LIBRARY_PATH -u FLASHCORE_CLI -u PYTHONPATH $cmd --version 2>&1) ||
    fail "$cmd --version: $out"
  grep -q "^flashcore $version (library $version, check: yes)$" <<<"$out" || fail "$cmd --version said: $out"
  echo "wheel: $cmd --version: $out"
done
out=$(cd "$work" && env -u FLASHCORE_CLI -u PYTHONPATH CUDA_VISIBLE_DEVICES= $script bench --dtype bf16 2>&1)
rc=$?
[[ $rc -eq 3 && $out == *"no supported GPU found"* ]] || fail "flashcore bench with no visible GPU: exit $rc: $out"
echo "wheel: flashcore bench with no visible GPU: exit 3, $out"

# The installed copy, not the checkout: isolated mode (-I: no PYTHONPATH, no cwd), run outside the repository.
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then gpu=1; fi
cd "$work" && env -u FLASHCORE_LIBRARY "$py" -I - "$gpu" <<'PY' || fail "import flashcore from the venv"
import os, sys, sysconfig
import flashcore
gpu = sys.argv[1] == "1"
site = os.path.realpath(sysconfig.get_paths()["purelib"])
pkg = os.path.realpath(os.path.dirname(flashcore.__file__))
lib = os.path.realpath(flashcore.library_path())
caps = flashcore.capabilities()
print(f"wheel: import flashcore {flashcore.__version__} from {pkg}")
print(f"wheel: library {lib} ({flashcore.library_version()})")
print(f"wheel: capabilities {caps}")
assert pkg == os.path.join(site, "flashcore"), f"imported from {pkg}, not the venv ({site})"
assert lib == os.path.join(pkg, "lib", "libflashcore.so"), f"loaded {lib}, not the wheel's copy"
assert caps.head_dims == (64,) and caps.dtypes == ("bfloat16",) and caps.archs == (86, 90), \
    "capabilities do not match the build options (FLASHCORE_HEAD_DIMS=64 FLASHCORE_DTYPES=bf16 FLASHCORE_CUDA_ARCHS=90a " \
    "FLASHCORE_SM80_ARCHS=86)"
if not gpu:
    assert caps.device_arch == 0 and not caps.device_supported, "no GPU here, but a device is reported"
    print("wheel: no GPU on this machine, and none reported")
PY
echo "wheel: ok"

"""Shared fixtures. The suite runs anywhere: tests that need torch, a GPU, the native library or transformers
skip with the reason; the ctypes/ABI tests need only Python (and a C compiler for the layout/stub tests)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = PYTHON_DIR.parent
HEADER = REPO_ROOT / "include" / "flashcore" / "flashcore.h"

# Test the package in this checkout (python/flashcore), installed or not.
if str(PYTHON_DIR) not in sys.path:
    sys.path.insert(0, str(PYTHON_DIR))


@pytest.fixture(scope="session")
def header_text():
    if not HEADER.is_file():
        pytest.skip(f"C header not found at {HEADER}")
    return HEADER.read_text()


@pytest.fixture(scope="session")
def c_compiler():
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no C compiler (cc/gcc/clang) on PATH")


def build_stub(compiler, out_dir, name, *defines):
    source = Path(__file__).resolve().parent / "stub" / "flashcore_stub.c"
    target = Path(out_dir) / name
    cmd = [compiler, "-shared", "-fPIC", "-O0", f"-I{REPO_ROOT / 'include'}", *defines, str(source), "-o", str(target)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return str(target)


@pytest.fixture(scope="session")
def stub_builder(c_compiler, header_text):
    """build_stub with the compiler bound: stub_builder(out_dir, name, *defines). A fixture, so that a test needs no
    `from conftest import build_stub`, which finds another folder's conftest when pytest collects tests/fa3_compat
    (its own conftest.py) in the same run."""
    return lambda out_dir, name, *defines: build_stub(c_compiler, out_dir, name, *defines)


@pytest.fixture(scope="session")
def stub_library(c_compiler, header_text, tmp_path_factory):
    """Path of a host-only libflashcore stand-in (tests/stub/flashcore_stub.c)."""
    return build_stub(c_compiler, tmp_path_factory.mktemp("stub"), "libflashcore_stub.so")


@pytest.fixture(scope="session")
def cuda():
    """The current CUDA device as a torch.device; skips without torch or a GPU visible to it."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    return torch.device("cuda", torch.cuda.current_device())


@pytest.fixture
def use_library(monkeypatch):
    """use_library(path): point FLASHCORE_LIBRARY at `path` for one test, then forget the loaded library."""
    from flashcore import _lib

    def use(path):
        monkeypatch.setenv(_lib.LIBRARY_ENV, str(path))
        _lib.reset()

    yield use
    _lib.reset()

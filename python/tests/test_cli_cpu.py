"""The `flashcore` console script and `python -m flashcore` (flashcore._cli) without a GPU: they run the program
that find_cli finds with the arguments given, and its exit status is theirs."""

import os
import stat
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR
from flashcore import _cli, _tune


def fake_program(tmp_path, body="echo \"program: $*\"\nexit 3\n"):
    path = tmp_path / "flashcore"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_main_execs_the_program_with_the_arguments(tmp_path, monkeypatch):
    program = fake_program(tmp_path)
    monkeypatch.setenv(_tune.CLI_ENV, str(program))
    calls = []
    assert _cli.main(["bench", "--help"], execv=lambda path, argv: calls.append((path, argv))) == 0
    assert calls == [(str(program), [str(program), "bench", "--help"])]


def test_main_without_a_program_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(_tune.CLI_ENV, str(tmp_path / "missing"))
    assert _cli.main(["info"], execv=lambda *a: pytest.fail("nothing to run")) == 1
    err = capsys.readouterr().err
    assert err.startswith("flashcore: the flashcore program was not found") and str(tmp_path / "missing") in err


def test_python_m_flashcore_runs_the_program(tmp_path):
    """`python -m flashcore ...` replaces itself with the program: its output and exit status come through."""
    program = fake_program(tmp_path)
    env = dict(os.environ, FLASHCORE_CLI=str(program), PYTHONPATH=str(PYTHON_DIR))
    proc = subprocess.run([sys.executable, "-m", "flashcore", "check", "--quick"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "program: check --quick\n"


def test_console_script_entry_point_is_declared():
    """Both pyproject files name flashcore._cli:main as the `flashcore` script."""
    for pyproject in (PYTHON_DIR.parent / "pyproject.toml", PYTHON_DIR / "pyproject.toml"):
        text = pyproject.read_text()
        assert "[project.scripts]" in text and 'flashcore = "flashcore._cli:main"' in text, pyproject

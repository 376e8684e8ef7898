"""flashcore.tune without a GPU: the command line it builds, where it finds the program, and its errors."""

import stat

import pytest

from flashcore import _tune


def test_command_defaults():
    args = _tune.tune_command()
    assert args[:5] == ["tune", "--dtype", "both", "--causal", "both"]
    assert "--build" not in args
    assert "--quiet" in args


def test_command_options():
    args = _tune.tune_command(dtypes=["bf16"], causal=[True], head_dims=[128, 64], seqlens=[1024],
                              build=True, generations=2, population=4, out="/tmp/t.json", quiet=False)
    assert args[args.index("--dtype") + 1] == "bf16"
    assert args[args.index("--causal") + 1] == "1"
    assert args[args.index("--head-dims") + 1] == "128,64"
    assert args[args.index("--generations") + 1] == "2"
    assert args[args.index("--out") + 1] == "/tmp/t.json"
    assert "--quiet" not in args


@pytest.mark.parametrize("bad", [dict(dtypes=[]), dict(dtypes=["fp8"]), dict(causal=[])])
def test_command_rejects(bad):
    with pytest.raises(ValueError):
        _tune.tune_command(**bad)


def test_explicit_cli_never_falls_through(tmp_path, monkeypatch):
    monkeypatch.delenv(_tune.CLI_ENV, raising=False)
    with pytest.raises(RuntimeError, match="not found"):
        _tune.find_cli(str(tmp_path / "missing"))


def test_tune_reads_the_table_the_program_wrote(tmp_path, monkeypatch):
    table = tmp_path / "table.json"
    fake = tmp_path / "flashcore"
    fake.write_text("#!/bin/sh\n"
                    f"echo '{{\"format\": \"flashcore-tuning\", \"entries\": []}}' > {table}\n"
                    f"echo 'table: {table}'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(_tune.CLI_ENV, str(fake))
    got = _tune.tune(dtypes=["bf16"])
    assert got["format"] == "flashcore-tuning"
    assert got["path"] == str(table)


def test_tune_failure_carries_the_message(tmp_path, monkeypatch):
    fake = tmp_path / "flashcore"
    fake.write_text("#!/bin/sh\necho 'flashcore tune: no Hopper GPU found: no GPU' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(_tune.CLI_ENV, str(fake))
    with pytest.raises(RuntimeError, match="no Hopper GPU"):
        _tune.tune()


def test_command_cli_options():
    """The options of `flashcore tune --help` that tune() used to lack (issue #75): each maps onto its flag."""
    args = _tune.tune_command(build=True, variants=["128x160x2-pp-dynamic-vote", "128x128x2-pp-static"],
                              no_decode=True, compile_only=True, jobs=3, max_minutes=20)
    assert args[args.index("--variants") + 1] == "128x160x2-pp-dynamic-vote,128x128x2-pp-static"
    assert "--no-decode" in args and "--compile-only" in args
    assert args[args.index("--jobs") + 1] == "3"
    assert args[args.index("--max-minutes") + 1] == "20"
    plain = _tune.tune_command()
    for flag in ("--variants", "--no-decode", "--compile-only", "--jobs", "--max-minutes", "--seqlens"):
        assert flag not in plain
    only_decode = _tune.tune_command(seqlens=[])
    assert only_decode[only_decode.index("--seqlens") + 1] == "none"


@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
def test_command_8bit_dtypes(dtype):
    args = _tune.tune_command(dtypes=[dtype], head_dims=[128])
    assert args[args.index("--dtype") + 1] == dtype
    assert "--build" not in args


@pytest.mark.parametrize("bad, match", [
    (dict(dtypes=["bf16", "e4m3"]), "single 8-bit dtype"),
    (dict(dtypes=["e4m3", "e5m2"]), "single 8-bit dtype"),
    (dict(dtypes=["e4m3"], build=True), "16-bit variants only"),
    (dict(variants=["128x128x2-pp-static"]), "needs build"),
    (dict(compile_only=True), "needs build"),
    (dict(build=True, variants=["a,b"]), "config names"),
    (dict(seqlens=[], no_decode=True), "no bucket"),
])
def test_command_rejects_what_the_program_refuses(bad, match):
    with pytest.raises(ValueError, match=match):
        _tune.tune_command(**bad)


def test_tune_passes_the_new_options_to_the_program(tmp_path, monkeypatch):
    """tune(compile_only=True): the program gets the flags, no table is read, the built cubins are listed."""
    log = tmp_path / "argv"
    fake = tmp_path / "flashcore"
    fake.write_text("#!/bin/sh\n"
                    f"echo \"$@\" > {log}\n"
                    "echo 'built bf16 d128 causal 128x160x2-pp-static: /tmp/cubins/a.cubin'\n"
                    "echo '1 variant(s) in /tmp/cubins'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(_tune.CLI_ENV, str(fake))
    got = _tune.tune(dtypes=["bf16"], build=True, compile_only=True, jobs=2, no_decode=True,
                     variants=["128x160x2-pp-static"])
    assert got["path"] is None and got["built"] == ["/tmp/cubins/a.cubin"]
    argv = log.read_text().split()
    assert argv[0] == "tune" and "--compile-only" in argv and "--no-decode" in argv
    assert argv[argv.index("--jobs") + 1] == "2"
    assert argv[argv.index("--variants") + 1] == "128x160x2-pp-static"


def test_path_lookup_skips_the_console_script(tmp_path, monkeypatch):
    """A `flashcore` on PATH that is a script (this package's console-script launcher) is not the program: running
    it would search again. A compiled one (ELF) is taken."""
    monkeypatch.delenv(_tune.CLI_ENV, raising=False)
    monkeypatch.setattr(_tune, "Path", _NoPackagePath)  # no wheel copy, no checkout build
    script = tmp_path / "scripts" / "flashcore"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env python3\nimport sys\nfrom flashcore._cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(script.parent))
    with pytest.raises(RuntimeError, match="not found"):
        _tune.find_cli()
    elf = tmp_path / "bin" / "flashcore"
    elf.parent.mkdir()
    elf.write_bytes(b"\x7fELF" + b"\0" * 60)
    elf.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{elf.parent}")
    assert _tune.find_cli() == str(elf)


class _NoPackagePath(type(__import__("pathlib").Path())):
    """Path whose resolve() puts the package in a folder with no bin/ and no checkout around it."""

    def resolve(self, strict=False):
        return type(self)("/nonexistent/site-packages/flashcore/_tune.py")

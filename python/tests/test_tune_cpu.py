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

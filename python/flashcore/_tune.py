"""The autotuner from Python: runs the ``flashcore tune`` program and returns the tuning table it wrote.

The table is what the library's dispatch reads at first use in a process (docs/tuning.md): tune once per
machine, then every later process picks the tuned configs up. The program is looked for in this order:
the ``cli`` argument, ``$FLASHCORE_CLI``, the copy inside the package (``flashcore/bin/flashcore``, in the
wheel), ``<repo>/build/bin/flashcore`` in a source checkout, then ``flashcore`` on ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

CLI_ENV = "FLASHCORE_CLI"


def find_cli(cli: Optional[str] = None) -> str:
    """Path of the ``flashcore`` program; RuntimeError naming every place tried when there is none."""
    tried: List[str] = []
    candidates: List[Optional[str]] = [cli, os.environ.get(CLI_ENV)]
    package = Path(__file__).resolve().parent
    candidates.append(str(package / "bin" / "flashcore"))
    repo = package.parents[1]
    if (repo / "include" / "flashcore" / "flashcore.h").is_file():
        candidates.append(str(repo / "build" / "bin" / "flashcore"))
    candidates.append(shutil.which("flashcore"))
    for path in candidates:
        if not path:
            continue
        tried.append(path)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        if path in (cli, os.environ.get(CLI_ENV)):
            break  # an explicit choice never silently falls through
    raise RuntimeError("the flashcore program was not found (tried: " + ", ".join(tried or ["PATH"]) + "); set "
                       + CLI_ENV + " to its path")


def _join(values: Iterable) -> str:
    return ",".join(str(int(v)) for v in values)


def tune_command(*, dtypes: Sequence[str] = ("bf16", "fp16"), head_dims: Optional[Sequence[int]] = None,
                 causal: Sequence[bool] = (False, True), seqlens: Optional[Sequence[int]] = None,
                 tokens: int = 16384, hidden: int = 2048, top_k: int = 3, build: bool = False,
                 generations: int = 1, population: int = 6, cubin_dir: Optional[str] = None, rounds: int = 5,
                 iters: int = 8, seed: int = 1, out: Optional[str] = None, report: Optional[str] = None,
                 device: int = 0, quiet: bool = True) -> List[str]:
    """The ``flashcore tune`` arguments for these options (without the program)."""
    dts = sorted(set(dtypes))
    if not dts or any(d not in ("fp16", "bf16") for d in dts):
        raise ValueError(f"dtypes must be a non-empty subset of ('fp16', 'bf16'), got {tuple(dtypes)!r}")
    cs = sorted(set(bool(c) for c in causal))
    if not cs:
        raise ValueError("causal must name at least one of False, True")
    args = ["tune", "--dtype", dts[0] if len(dts) == 1 else "both",
            "--causal", str(int(cs[0])) if len(cs) == 1 else "both",
            "--tokens", str(int(tokens)), "--hidden", str(int(hidden)), "--top-k", str(int(top_k)),
            "--rounds", str(int(rounds)), "--iters", str(int(iters)), "--seed", str(int(seed)),
            "--device", str(int(device))]
    if head_dims:
        args += ["--head-dims", _join(head_dims)]
    if seqlens:
        args += ["--seqlens", _join(seqlens)]
    if build:
        args += ["--build", "--generations", str(int(generations)), "--population", str(int(population))]
    if cubin_dir:
        args += ["--cubin-dir", str(cubin_dir)]
    if out:
        args += ["--out", str(out)]
    if report:
        args += ["--report", str(report)]
    if quiet:
        args.append("--quiet")
    return args


def tune(*, cli: Optional[str] = None, **options) -> dict:
    """Run the autotuner and return the tuning table it wrote (the JSON as a dict; its path under ``"path"``
    and the printed report under ``"report"``).

    Options mirror ``flashcore tune --help``: ``dtypes``, ``head_dims``, ``causal``, ``seqlens``, ``tokens``,
    ``hidden``, ``top_k``, ``build``, ``generations``, ``population``, ``cubin_dir``, ``rounds``, ``iters``,
    ``seed``, ``out``, ``report``, ``device``, ``quiet``. Raises RuntimeError (with the program's message) when
    the run fails. Calls made by this process before the run keep the table they loaded; new processes read
    the new one."""
    program = find_cli(cli)
    proc = subprocess.run([program] + tune_command(**options), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"flashcore tune failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    path = None
    for line in proc.stdout.splitlines():
        if line.startswith("table: "):
            path = line[len("table: "):].strip()
    if path is None:
        raise RuntimeError("flashcore tune did not say where it wrote the table:\n" + proc.stdout)
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    table["path"] = path
    table["report"] = proc.stdout
    return table

"""The autotuner from Python: runs the ``flashcore tune`` program and returns the tuning table it wrote.

The table is what the library's dispatch reads at first use in a process (docs/tuning.md): tune once per
machine, then every later process picks the tuned configs up. The program is looked for in this order:
the ``cli`` argument, ``$FLASHCORE_CLI``, the copy inside the package (``flashcore/bin/flashcore``, in the
wheel), ``<repo>/build/bin/flashcore`` in a source checkout, then a ``flashcore`` program on ``PATH`` (a
compiled one: the ``flashcore`` console script of this package, a Python launcher, is passed over).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterable, List, Optional, Sequence

CLI_ENV = "FLASHCORE_CLI"
# --dtype of `flashcore tune`: fp16 / bf16 (one run may take both) or one 8-bit input dtype per run.
_DTYPES_16 = ("fp16", "bf16")
_DTYPES_8 = ("e4m3", "e5m2")


def _is_compiled_program(path: str) -> bool:
    """An ELF executable: the flashcore program, not a script (such as this package's console-script launcher)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def _program_on_path() -> Optional[str]:
    """The first compiled ``flashcore`` on PATH. Scripts are passed over: this package's console script (flashcore._cli)
    is one, and running it would search again."""
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        path = shutil.which("flashcore", path=folder) if folder else None
        if path and _is_compiled_program(path):
            return path
    return None


def find_cli(cli: Optional[str] = None) -> str:
    """Path of the ``flashcore`` program; RuntimeError naming every place tried when there is none."""
    tried: List[str] = []
    candidates: List[Optional[str]] = [cli, os.environ.get(CLI_ENV)]
    package = Path(__file__).resolve().parent
    candidates.append(str(package / "bin" / "flashcore"))
    repo = package.parents[1]
    if (repo / "include" / "flashcore" / "flashcore.h").is_file():
        candidates.append(str(repo / "build" / "bin" / "flashcore"))
    on_path = _program_on_path()
    candidates.append(on_path)
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
                 no_decode: bool = False, tokens: int = 16384, hidden: int = 2048, top_k: int = 3,
                 build: bool = False, generations: int = 1, population: int = 6,
                 variants: Optional[Sequence[str]] = None, cubin_dir: Optional[str] = None,
                 compile_only: bool = False, jobs: Optional[int] = None, rounds: int = 5, iters: int = 8,
                 seed: int = 1, max_minutes: Optional[int] = None, out: Optional[str] = None,
                 report: Optional[str] = None, device: int = 0, quiet: bool = True) -> List[str]:
    """The ``flashcore tune`` arguments for these options (without the program).

    ``dtypes``: a non-empty subset of ('fp16', 'bf16'), or one 8-bit input dtype, ('e4m3',) or ('e5m2',) (the
    program's --dtype takes one of fp16, bf16, both, e4m3, e5m2). ``seqlens=[]`` tunes no prefill bucket (--seqlens
    none: the decode ones only); ``no_decode`` leaves the decode buckets out. ``variants`` (config names),
    ``compile_only`` and ``jobs`` are for ``build``; 8-bit dtypes tune among the compiled configs (no ``build``).
    ValueError for a combination the program would refuse."""
    dts = sorted(set(dtypes))
    if not dts or any(d not in _DTYPES_16 + _DTYPES_8 for d in dts):
        raise ValueError(f"dtypes must be a non-empty subset of {_DTYPES_16} or one of {_DTYPES_8}, got "
                         f"{tuple(dtypes)!r}")
    eight_bit = [d for d in dts if d in _DTYPES_8]
    if eight_bit and len(dts) > 1:
        raise ValueError(f"one run tunes fp16/bf16 or a single 8-bit dtype, got {tuple(dtypes)!r}: call tune() once "
                         "per 8-bit dtype")
    if eight_bit and build:
        raise ValueError(f"build makes 16-bit variants only; dtypes {tuple(dtypes)!r} tune among the compiled 8-bit "
                         "configs (leave build out)")
    cs = sorted(set(bool(c) for c in causal))
    if not cs:
        raise ValueError("causal must name at least one of False, True")
    for name, value in (("variants", variants), ("compile_only", compile_only)):
        if value and not build:
            raise ValueError(f"{name} needs build=True")
    if seqlens is not None and len(seqlens) == 0 and no_decode:
        raise ValueError("seqlens=[] with no_decode=True leaves no bucket to tune")
    args = ["tune", "--dtype", dts[0] if len(dts) == 1 else "both",
            "--causal", str(int(cs[0])) if len(cs) == 1 else "both",
            "--tokens", str(int(tokens)), "--hidden", str(int(hidden)), "--top-k", str(int(top_k)),
            "--rounds", str(int(rounds)), "--iters", str(int(iters)), "--seed", str(int(seed)),
            "--device", str(int(device))]
    if head_dims:
        args += ["--head-dims", _join(head_dims)]
    if seqlens is not None:
        args += ["--seqlens", _join(seqlens) if len(seqlens) else "none"]
    if no_decode:
        args.append("--no-decode")
    if build:
        args += ["--build", "--generations", str(int(generations)), "--population", str(int(population))]
    if variants:
        names = [str(v) for v in variants]
        if any(not n or "," in n for n in names):
            raise ValueError(f"variants must be config names (e.g. '128x160x2-pp-dynamic-vote'), got {tuple(variants)!r}")
        args += ["--variants", ",".join(names)]
    if compile_only:
        args.append("--compile-only")
    if jobs is not None:
        args += ["--jobs", str(int(jobs))]
    if max_minutes is not None:
        args += ["--max-minutes", str(int(max_minutes))]
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

    Options mirror ``flashcore tune --help`` (see :func:`tune_command`): ``dtypes`` (fp16 / bf16, or one of e4m3,
    e5m2), ``head_dims``, ``causal``, ``seqlens``, ``no_decode``, ``tokens``, ``hidden``, ``top_k``, ``build``,
    ``generations``, ``population``, ``variants``, ``cubin_dir``, ``compile_only``, ``jobs``, ``rounds``, ``iters``,
    ``seed``, ``max_minutes``, ``out``, ``report``, ``device``, ``quiet``. With ``compile_only`` (no GPU needed) no
    table is written: the result is ``{"path": None, "report": ..., "built": [cubin paths]}``. Raises RuntimeError
    (with the program's message) when the run fails. Calls made by this process before the run keep the table they
    loaded; new processes read the new one."""
    program = find_cli(cli)
    proc = subprocess.run([program] + tune_command(**options), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"flashcore tune failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    if options.get("compile_only"):
        # "built <key> <config>: <cubin path>" per variant (tools/flashcore/tune_cmd.cpp)
        built = [line.rsplit(": ", 1)[1].strip() for line in proc.stdout.splitlines()
                 if line.startswith("built ") and ": " in line]
        return {"path": None, "report": proc.stdout, "built": built}
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

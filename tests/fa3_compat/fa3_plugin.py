"""pytest plugin for running FlashAttention-3's own tests (.carry/fa3tests/test_flash_attn.py) against FlashCore:
`python3 -m pytest -p fa3_plugin ...` with tests/fa3_compat/ and python/ on PYTHONPATH (tools/run_fa3_tests.sh does
all of it).

- Makes `flash_attn_interface` this directory's shim (flash_attn_interface.py), whatever else is on the path, and
  stops the run if another module of that name was imported first.
- Without a CUDA device (collection on a CPU machine): FA3's module calls torch.cuda.get_device_capability() at
  import, so that one function answers FLASHCORE_FA3_ASSUME_CAPABILITY (default 9.0, an H100's) for the
  parametrization to come out as on a Hopper GPU, and every FA3 test is marked skip ("no CUDA device"): nothing
  can pass without a GPU. With a device, a FlashCore library that cannot be loaded stops the run.
- Selection, applied after -k / -m, to FA3's items only:
    FLASHCORE_FA3_SELECT="dtype=bfloat16|float16,d=128"  keeps the items whose parameters match every clause
        (name=value[|value...]; values as printed, dtypes without "torch."); a clause naming a parameter that a
        test does not have leaves that test's items alone.
    FLASHCORE_FA3_SAMPLE=N or "test_a=N,test_b=M[,N]" [FLASHCORE_FA3_SAMPLE_SEED=s]  keeps about one item in N (per
        test function where named): those whose crc32("s:" + the item's name, e.g. test_flash_attn_output[...]) is
        0 mod N. Deterministic, the same on every machine for the same FA3 file and FLASH_ATTENTION_DISABLE_* flags,
        and free of the aliasing a stride would have with the parameter grid.
  The rest are deselected (pytest reports them so); the summary counts what ran as "of the sampled set".
- FLASHCORE_FA3_INTERLEAVE=1: the kept items run in a fixed shuffled order, the test functions taking turns;
  FLASHCORE_FA3_BUDGET_S=S: no test starts after S seconds (from the plugin's import), and the summary counts the
  items that did not run. Together: a run cut by the budget has run an even part of each function's sample. The
  exit status then says whether what ran failed (not pytest's "interrupted").
- FLASHCORE_FA3_SUMMARY=PATH: at the end, a text summary at PATH and the same as JSON at PATH.json: per test
  function the items collected / selected / sampled and passed / failed / errors / skipped, skips grouped by reason
  (the shim's "flashcore: ..." ones, FA3's own, this plugin's), how many skips came after at least one FlashCore
  call had passed its checks, the first line of each failure, the run's settings.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import sys
import time
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FA3_FILE = "test_flash_attn.py"
NO_CUDA_REASON = "no CUDA device here: collected only (FA3's tests need a GPU)"
ENV_FLAGS_PREFIX = "FLASH_ATTENTION_"
NO_REASON = "(a bare pytest.skip() of the FA3 test, no reason given)"

# ---------------------------------------------------------------------------------------------------------------
# Pure helpers (tested on the CPU by test_fa3_shim_cpu.py).


def param_str(value) -> str:
    """A parameter value as FLASHCORE_FA3_SELECT spells it: str(), dtypes without "torch."."""
    return str(value).replace("torch.", "")


def parse_select(text: str):
    """"a=1|2,b=x" -> [("a", {"1", "2"}), ("b", {"x"})]. Raises ValueError on a clause without '='."""
    clauses = []
    for clause in (text or "").split(","):
        clause = clause.strip()
        if not clause:
            continue
        if "=" not in clause:
            raise ValueError(f"FLASHCORE_FA3_SELECT: clause {clause!r} is not name=value[|value...]")
        name, values = clause.split("=", 1)
        clauses.append((name.strip(), {v.strip() for v in values.split("|")}))
    return clauses


def matches(params: dict, clauses) -> bool:
    return all(name not in params or param_str(params[name]) in values for name, values in clauses)


def _crc(name: str, seed: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode())


def sampled(name: str, n: int, seed: str = "0") -> bool:
    return n <= 1 or _crc(name, seed) % n == 0


def parse_sample(text: str) -> dict:
    """FLASHCORE_FA3_SAMPLE: "N" (every test function) or "test_a=N,test_b=M[,N]" (a bare N: the others).
    Returns {function name or "*": N}."""
    rates = {"*": 1}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, _, value = part.rpartition("=")
        n = int(value)
        if n < 1:
            raise ValueError(f"FLASHCORE_FA3_SAMPLE: {part!r}: N must be >= 1")
        rates[name.strip() or "*"] = n
    return rates


def interleave(items, seed: str = "0"):
    """FA3's items in a fixed pseudo-random order (crc32 of seed and name), the test functions taking turns, so
    that a run cut short by the time budget has run a uniform part of each function's sample."""
    per_fn = {}
    for item in items:
        per_fn.setdefault(function_of(item.nodeid), []).append(item)
    queues = [sorted(per_fn[fn], key=lambda it: _crc(it.name, seed + "/order")) for fn in sorted(per_fn)]
    out = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def function_of(nodeid: str) -> str:
    """"path::test_x[ids]" -> "test_x"."""
    return nodeid.split("::")[-1].split("[")[0]


def skip_reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
    else:
        reason = str(longrepr)
    reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return NO_REASON if reason in ("", "Skipped") else reason


def skip_source(reason: str) -> str:
    if reason.startswith("flashcore:"):
        return "shim"
    if reason == NO_CUDA_REASON:
        return "plugin"
    return "fa3"


# ---------------------------------------------------------------------------------------------------------------
# The plugin's state.


class _State:
    def __init__(self):
        self.no_cuda = False
        self.shim = None
        self.collected = collections.Counter()  # per test function, in the file (before -k)
        self.after_k = collections.Counter()  # after -k / -m
        self.selected = collections.Counter()  # after FLASHCORE_FA3_SELECT
        self.sampled = collections.Counter()  # after FLASHCORE_FA3_SAMPLE: what runs
        self.outcomes = {}  # nodeid -> dict(outcome, reason, calls, message)
        self.durations = collections.Counter()
        self.started = time.time()
        self.settings = {}
        self.session = None
        self.stopped = ""


_STATE = _State()


def _is_fa3(item) -> bool:
    return Path(str(item.fspath)).name == FA3_FILE


def _load_shim():
    existing = sys.modules.get("flash_attn_interface")
    if existing is not None:
        if not getattr(existing, "SHIM", False):
            pytest.exit(f"fa3_plugin: `flash_attn_interface` is already {getattr(existing, '__file__', existing)}, "
                        "not FlashCore's shim (tests/fa3_compat/flash_attn_interface.py)", returncode=4)
        return existing
    spec = importlib.util.spec_from_file_location("flash_attn_interface", HERE / "flash_attn_interface.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["flash_attn_interface"] = module
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        del sys.modules["flash_attn_interface"]
        pytest.exit(f"fa3_plugin: the shim needs {exc.name!r} (put the repository's python/ on PYTHONPATH for "
                    "flashcore)", returncode=4)
    return module


def pytest_configure(config):
    import torch

    _STATE.shim = _load_shim()
    _STATE.no_cuda = not torch.cuda.is_available()
    if _STATE.no_cuda:
        major, minor = (int(x) for x in os.environ.get("FLASHCORE_FA3_ASSUME_CAPABILITY", "9.0").split("."))
        torch.cuda.get_device_capability = lambda device=None: (major, minor)
    _STATE.settings = {
        "keyword (-k)": config.option.keyword or "",
        "FLASHCORE_FA3_HINTS": _STATE.shim.hint_mode(),
        "FLASHCORE_FA3_SELECT": os.environ.get("FLASHCORE_FA3_SELECT", ""),
        "FLASHCORE_FA3_SAMPLE": os.environ.get("FLASHCORE_FA3_SAMPLE", "1"),
        "FLASHCORE_FA3_SAMPLE_SEED": os.environ.get("FLASHCORE_FA3_SAMPLE_SEED", "0"),
        "FA3 flags": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_FLAGS_PREFIX)},
        "shim": str(Path(_STATE.shim.__file__).resolve()),
    }


def pytest_sessionstart(session):
    _STATE.session = session
    if _STATE.no_cuda:
        _STATE.settings["device"] = "none (collection only)"
        return
    import torch

    import flashcore

    try:
        caps = flashcore.capabilities()
        _STATE.settings["flashcore"] = f"{flashcore.library_version()} at {flashcore.library_path()}"
    except Exception as exc:  # no library: every test would fail the same way
        pytest.exit(f"fa3_plugin: the FlashCore library cannot be loaded ({type(exc).__name__}: {exc}); set "
                    "FLASHCORE_LIBRARY", returncode=4)
    if not caps.device_supported:
        pytest.exit(f"fa3_plugin: FlashCore does not support this device (sm_{caps.device_arch}; library archs "
                    f"{caps.archs})", returncode=4)
    _STATE.settings["device"] = f"{torch.cuda.get_device_name()} (sm_{caps.device_arch}, {caps.device_backend})"
    _STATE.settings["compiled"] = f"dtypes {list(caps.dtypes)}, head dims {list(caps.head_dims)}"
    _STATE.settings["torch"] = torch.__version__


@pytest.hookimpl(hookwrapper=True)  # (the old-style wrapper: any pytest the GPU machines may have)
def pytest_collection_modifyitems(session, config, items):
    """Counts FA3's items as collected, lets every other implementation run (pytest's -k / -m deselection among
    them), then applies FLASHCORE_FA3_SELECT and FLASHCORE_FA3_SAMPLE."""
    for item in items:
        if _is_fa3(item):
            _STATE.collected[function_of(item.nodeid)] += 1
            if "FA3 source" not in _STATE.settings:
                source = Path(str(item.fspath)).parent / "SOURCE.txt"
                commit = [line.split(":", 1)[1].strip() for line in
                          (source.read_text().splitlines() if source.is_file() else []) if line.startswith("commit:")]
                _STATE.settings["FA3 source"] = f"{item.fspath} (commit {commit[0] if commit else 'unknown: no SOURCE.txt'})"
    yield
    _filter(config, items)


def _filter(config, items):
    clauses = parse_select(os.environ.get("FLASHCORE_FA3_SELECT", ""))
    rates = parse_sample(os.environ.get("FLASHCORE_FA3_SAMPLE", ""))
    seed = os.environ.get("FLASHCORE_FA3_SAMPLE_SEED", "0")
    keep, drop = [], []
    for item in items:
        if not _is_fa3(item):
            keep.append(item)
            continue
        fn = function_of(item.nodeid)
        _STATE.after_k[fn] += 1
        params = getattr(getattr(item, "callspec", None), "params", {})
        if not matches(params, clauses):
            drop.append(item)
            continue
        _STATE.selected[fn] += 1
        if not sampled(item.name, rates.get(fn, rates["*"]), seed):
            drop.append(item)
            continue
        _STATE.sampled[fn] += 1
        if _STATE.no_cuda:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    if os.environ.get("FLASHCORE_FA3_INTERLEAVE", "0") == "1":
        others = [item for item in keep if not _is_fa3(item)]
        keep = others + interleave([item for item in keep if _is_fa3(item)], seed)
    items[:] = keep


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _STATE.shim is not None:
        _STATE.shim.calls = 0


def pytest_runtest_logreport(report):
    if function_of(report.nodeid) not in _STATE.collected:
        return
    record = _STATE.outcomes.setdefault(report.nodeid, {"outcome": None})
    if report.when == "call":
        _STATE.durations[function_of(report.nodeid)] += report.duration
    if report.skipped:
        record.update(outcome="skipped", reason=skip_reason(report.longrepr),
                      calls=getattr(_STATE.shim, "calls", 0) if report.when == "call" else 0)
    elif report.failed and record["outcome"] not in ("failed", "error"):
        crash = getattr(report.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else str(report.longrepr)
        record.update(outcome="failed" if report.when == "call" else "error",
                      message=(message.strip().splitlines() or [""])[0][:300], when=report.when)
    elif report.when == "call" and record["outcome"] is None:
        record["outcome"] = "passed"


def pytest_runtest_logfinish(nodeid, location):
    budget = float(os.environ.get("FLASHCORE_FA3_BUDGET_S", "0") or 0)
    if budget > 0 and not _STATE.stopped and time.time() - _STATE.started > budget and _STATE.session is not None:
        _STATE.stopped = f"stopped at the time budget (FLASHCORE_FA3_BUDGET_S={budget:g} s)"
        _STATE.session.shouldstop = f"fa3_plugin: {_STATE.stopped}"


def summarize() -> dict:
    tests = {}
    for fn in sorted(set(_STATE.collected)):
        tests[fn] = {
            "collected in file": _STATE.collected[fn],
            "after -k": _STATE.after_k[fn],
            "selected": _STATE.selected[fn],
            "sampled": _STATE.sampled[fn],
            "ran": 0,
            "passed": 0, "failed": 0, "errors": 0, "skipped": 0,
            "call seconds": round(_STATE.durations[fn], 1),
            "skips": {},
            "failures": [],
        }
    for nodeid, record in sorted(_STATE.outcomes.items()):
        entry = tests[function_of(nodeid)]
        outcome = record["outcome"]
        entry["ran"] += outcome is not None
        if outcome == "passed":
            entry["passed"] += 1
        elif outcome == "skipped":
            entry["skipped"] += 1
            reason = record["reason"] or NO_REASON
            group = entry["skips"].setdefault(reason, {"count": 0, "after checked calls": 0,
                                                       "source": skip_source(record["reason"])})
            group["count"] += 1
            if record.get("calls", 0) > 0:
                group["after checked calls"] += 1
        elif outcome in ("failed", "error"):
            entry["failed" if outcome == "failed" else "errors"] += 1
            entry["failures"].append({"test": nodeid.split("::")[-1], "when": record.get("when"),
                                      "message": record.get("message", "")})
    probes = dict(getattr(_STATE.shim, "_PROBES", {}) or {})
    return {"settings": _STATE.settings, "wall seconds": round(time.time() - _STATE.started, 1),
            "stopped": _STATE.stopped, "tests": tests,
            "probes": {"ok": sum(v is None for v in probes.values()),
                       "failed": {repr(k): v for k, v in probes.items() if v is not None}}}


def format_summary(data: dict) -> str:
    lines = ["FlashAttention-3's own tests against FlashCore (tests/fa3_compat/flash_attn_interface.py)", ""]
    for key, value in data["settings"].items():
        if isinstance(value, dict):
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
        lines.append(f"  {key}: {value}")
    lines.append(f"  wall: {data['wall seconds']} s{'; ' + data['stopped'] if data['stopped'] else ''}")
    settings = data["settings"]
    subset = settings.get("FLASHCORE_FA3_SAMPLE", "") not in ("", "1") or settings.get("FLASHCORE_FA3_SELECT") \
        or data["stopped"]
    of = "of the sampled set" if subset else "of the whole set after -k"
    if data["stopped"]:
        of = "of those that ran (the first part of the sampled set, in its shuffled order)"
    lines.append("")
    unselected = [fn for fn, t in data["tests"].items() if not t["after -k"]]
    for fn, t in data["tests"].items():
        if not t["after -k"]:
            continue
        not_run = t["sampled"] - t["ran"]
        cut = f" ({not_run} not run: {data['stopped']})" if not_run and data["stopped"] else ""
        lines.append(f"{fn}: {t['collected in file']} parametrizations in the file, {t['after -k']} after -k, "
                     f"{t['selected']} selected, {t['sampled']} sampled, {t['ran']} ran{cut}")
        lines.append(f"    {of}: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} "
                     f"skipped [{t['call seconds']} s in test calls]")
        groups = sorted(t["skips"].items(), key=lambda kv: (-kv[1]["count"], kv[0]))
        for reason, g in groups:
            after = f"; {g['after checked calls']} of them after >= 1 FlashCore call had passed its checks" \
                if g["after checked calls"] else ""
            lines.append(f"    skipped {g['count']:>6} [{g['source']}] {reason}{after}")
        for f in t["failures"][:50]:
            lines.append(f"    FAILED {f['test']} ({f['when']}): {f['message']}")
        if len(t["failures"]) > 50:
            lines.append(f"    ... and {len(t['failures']) - 50} more failures (see the JSON)")
        lines.append("")
    if unselected:
        lines.append(f"Not selected by -k: {', '.join(unselected)}")
    probes = data.get("probes", {})
    if probes.get("ok") or probes.get("failed"):
        failed = collections.Counter(probes.get("failed", {}).values())
        lines.append(f"Probes (one tiny FlashCore call per kind of call): {probes.get('ok', 0)} ran, "
                     f"{sum(failed.values())} failed (the skips quote them; keys in the JSON):")
        for message, count in failed.most_common():
            lines.append(f"    {count:>4} x {message}")
    lines.append("Sources of skips: [shim] FlashCore lacks what the call asks for (tests/fa3_compat/"
                 "flash_attn_interface.py); [fa3] the FA3 test's own skip; [plugin] no GPU here.")
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session, exitstatus):
    if _STATE.stopped and exitstatus == pytest.ExitCode.INTERRUPTED:
        # The budget's stop is not an interruption: the exit status says whether what ran failed.
        failed = any(r["outcome"] in ("failed", "error") for r in _STATE.outcomes.values())
        session.exitstatus = pytest.ExitCode.TESTS_FAILED if failed else pytest.ExitCode.OK
    path = os.environ.get("FLASHCORE_FA3_SUMMARY")
    if not path or session.config.option.collectonly and not _STATE.collected:
        return
    data = summarize()
    data["pytest exit status"] = int(exitstatus)
    if session.config.option.collectonly:
        data["collect only"] = True
    Path(path).write_text(format_summary(data))
    Path(path + ".json").write_text(json.dumps(data, indent=1, sort_keys=False, default=str))

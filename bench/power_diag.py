#!/usr/bin/env python3
"""Sustained speed, board power and SM clock per system on the same tensors: is a system slower because it issues
worse, or because it spends more energy per FLOP and the 700 W cap lowers its clock?

Each (cell, system) runs a CUDA graph of --calls calls, replayed back to back for --seconds, while a thread samples
NVML (board power, SM clock, clock-event reasons) every 10 ms. Reported per (cell, system), over the samples of the
last half of the run (the clock has settled there): TFLOPS (median replay), mean power (W), mean SM clock (MHz), the
energy per PFLOP (J) and whether NVML reported the software power cap. The systems take turns --passes times, in
reverse order every other pass. Systems: bench/report.py's (flashcore, fa3, cudnn, fa2, flashcore_b with --lib-b,
flashcore@CONFIG for a named kernel config; a system that cannot run a cell prints its error there and is skipped).

    PYTHONPATH=python:bench:../shared/fa3/prefill python3 bench/power_diag.py --cells 128:0:2048,128:0:8192 \
        --systems flashcore,fa3 [--dtype bf16] [--seconds 3] [--passes 2]

--burst N instead times the report's way (bench/report.py run_system: capture, then replays right away) but N
replays, one at a time, and prints each replay's TFLOPS with the SM clock NVML reads right after it: does a system
slow down within the first replays of a cell, as the power controller catches up, and another not?

A cell is D:causal:S with batch = 16384 / S and heads = 2048 / D (the report's grid). NVML is loaded at run time
(libnvidia-ml.so.1); without it the script stops with a message.
"""
import argparse
import ctypes
import math
import statistics
import sys
import threading
import time
from types import SimpleNamespace

import report  # bench/ (this script's folder) on sys.path: the report's systems, tensors and graph capture


class Nvml:
    """The three NVML queries this script needs, through ctypes."""
    SM_CLOCK = 1  # NVML_CLOCK_SM
    POWER_CAP_REASON = 0x4  # nvmlClocksEventReasonSwPowerCap

    def __init__(self, index: int = 0):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as e:
            raise RuntimeError(f"NVML not loadable (libnvidia-ml.so.1): {e}") from e
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)),
                    "nvmlDeviceGetHandleByIndex_v2")
        reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what} failed: NVML status {status}")

    def sample(self):
        """(power W, SM clock MHz, clock-event reason bits)."""
        mw, mhz, bits = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check(self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)), "nvmlDeviceGetPowerUsage")
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, self.SM_CLOCK, ctypes.byref(mhz)),
                    "nvmlDeviceGetClockInfo")
        self._check(self._reasons(self.handle, ctypes.byref(bits)), "nvmlDeviceGetCurrentClocksEventReasons")
        return mw.value / 1000.0, mhz.value, bits.value


def sustained(torch, nvml, fn, nsets, calls, seconds):
    """Replays a graph of `calls` calls for `seconds`; returns (per-call ms of each replay, [(t, W, MHz, bits)])."""
    g = report.capture_graph(torch, fn, nsets, calls)
    samples, stop = [], threading.Event()

    def sampler():
        while not stop.is_set():
            samples.append((time.perf_counter(),) + nvml.sample())
            time.sleep(0.01)
    thread = threading.Thread(target=sampler, daemon=True)
    t0 = time.perf_counter()
    thread.start()
    times = []
    while time.perf_counter() - t0 < seconds:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(8)]
        for s, e in events:
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        times += [(time.perf_counter(), s.elapsed_time(e) / calls) for s, e in events]
    stop.set()
    thread.join()
    del g
    half = t0 + seconds / 2
    return [ms for t, ms in times if t >= half] or [ms for _, ms in times], [s for s in samples if s[0] >= half]


def burst(torch, nvml, fn, nsets, calls, replays):
    """The report's timing with per-replay detail: [(per-call ms, SM MHz after the replay)] for `replays` replays."""
    g = report.capture_graph(torch, fn, nsets, calls)
    out = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        out.append((s.elapsed_time(e) / calls, nvml.sample()[1]))
    del g
    return out


def each_run(torch, runner, cells, systems, passes, dtype, columns):
    """Every (cell, pass, system) in the report's turn order (reversed every other pass), on the cell's tensors:
    yields (D, causal, S, B, H, pass index, system, fn, buffer sets) with fn built and the system's SDPA backend
    selected while the caller measures. A system that cannot run a cell (a named config not compiled for it) gets a
    row with its error, padded to `columns` table columns, and is skipped."""
    for D, causal, S in cells:
        B, H = 16384 // S, 2048 // D
        sets = runner.make_sets(B, H, S, D, dtype, seed=1234)
        for p in range(passes):
            for sys_name in (systems if p % 2 == 0 else systems[::-1]):
                try:
                    fn, backend = runner.build(sys_name, sets, causal)
                except Exception as e:  # noqa: BLE001
                    cells_out = [str(D), "causal" if causal else "none", str(S), sys_name, str(p + 1),
                                 f"error: {report.short_error(e)}"]
                    print("| " + " | ".join(cells_out + [""] * (columns - len(cells_out))) + " |", flush=True)
                    continue
                with runner.context(backend), torch.no_grad():
                    yield D, causal, S, B, H, p, sys_name, fn, sets
                del fn
        del sets
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="128:0:2048,128:0:8192",
                    help="comma list of D:causal:S, or 'grid' (the report's 36 cells of the dtype)")
    ap.add_argument("--systems", default="flashcore,fa3")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--seconds", type=float, default=3.0, help="sustained run per (cell, system, pass)")
    ap.add_argument("--calls", type=int, default=10, help="calls per CUDA graph")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--burst", type=int, default=0, help="N: per-replay times of N report-style replays instead")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--lib-b", default=None)
    a = ap.parse_args()
    cells = []
    if a.cells == "grid":
        a.cells = ",".join(f"{D}:{c}:{S}" for D in (64, 128, 256) for S in (512, 1024, 2048, 4096, 8192, 16384)
                           for c in (0, 1))
    for c in a.cells.split(","):
        try:
            D, causal, S = (int(x) for x in c.split(":"))
        except ValueError:
            ap.error(f"--cells: expected D:causal:S, got {c!r}")
        if D <= 0 or S <= 0 or 16384 % S or 2048 % D:
            ap.error(f"--cells: {c!r} is not a grid cell (S divides 16384, D divides 2048)")
        cells.append((D, bool(causal), S))
    systems = [s for s in a.systems.split(",") if s]

    import torch
    from flashcore_ctypes import FlashCoreLib
    try:
        nvml = Nvml()
    except RuntimeError as e:
        print(f"power_diag: {e}", file=sys.stderr)
        return 3
    fc = FlashCoreLib(a.lib) if "flashcore" in systems else None
    fc_b = FlashCoreLib(a.lib_b) if "flashcore_b" in systems else None
    fa3 = None
    if "fa3" in systems:
        import flash_attn_interface as fa3  # type: ignore
    args = SimpleNamespace(no_rotate=False, timing="graph", no_lse=False, verify=False)
    runner = report.Runner(args, torch, fc, fa3, fc_b)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    name = torch.cuda.get_device_name(0)
    if a.burst:
        print(f"{name}, {a.dtype}, bursts of {a.burst} replays of {a.calls}-call graphs, {a.passes} passes")
        print("| D | mask | S | system | pass | TFLOPS per replay | SM MHz after each |")
        print("|---|---|---|---|---|---|---|")
        for D, causal, S, B, H, p, sys_name, fn, sets in each_run(torch, runner, cells, systems, a.passes, dtype, 7):
            res = burst(torch, nvml, fn, len(sets), max(a.calls, len(sets)), a.burst)
            tf = " ".join(f"{report.tflops_of(B, H, S, D, causal, ms):.0f}" for ms, _ in res)
            mhz = " ".join(str(m) for _, m in res)
            print(f"| {D} | {'causal' if causal else 'none'} | {S} | {sys_name} | {p + 1} | {tf} | {mhz} |", flush=True)
        return 0
    print(f"{name}, {a.dtype}, {a.seconds} s per run (last half sampled), graphs of {a.calls} calls, "
          f"{a.passes} passes")
    print("| D | mask | S | system | pass | TFLOPS | W | SM MHz | J / PFLOP | power cap seen |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = {}
    for D, causal, S, B, H, p, sys_name, fn, sets in each_run(torch, runner, cells, systems, a.passes, dtype, 10):
        times, samples = sustained(torch, nvml, fn, len(sets), max(a.calls, len(sets)), a.seconds)
        ms = statistics.median(times)
        tflops = report.tflops_of(B, H, S, D, causal, ms)
        watts = statistics.fmean(s[1] for s in samples) if samples else float("nan")
        mhz = statistics.fmean(s[2] for s in samples) if samples else float("nan")
        capped = any(s[3] & Nvml.POWER_CAP_REASON for s in samples)
        joules = watts / tflops * 1e3 if tflops else float("nan")  # W / (TFLOP/s) = J per TFLOP
        print(f"| {D} | {'causal' if causal else 'none'} | {S} | {sys_name} | {p + 1} | {tflops:.0f} | "
              f"{watts:.0f} | {mhz:.0f} | {joules:.0f} | {'yes' if capped else 'no'} |", flush=True)
        results.setdefault((D, causal, S), {}).setdefault(sys_name, []).append((tflops, mhz))
    summarize(results, systems)
    return 0


def summarize(results, systems) -> None:
    """Per cell, each system's TFLOPS (mean over the passes); with flashcore and others, its ratio to FA3 and to the
    best other system (FA3, cuDNN, FA2: not flashcore_b or flashcore@CONFIG), the same ratio to FA3 per clock cycle
    (TFLOPS / mean SM MHz: work per cycle, with the clock each system's own power allowed taken out), and their
    geometric means over the cells. results: {(D, causal, S): {system: [(TFLOPS, MHz) per pass]}}."""
    others = [s for s in systems if not s.startswith("flashcore")]  # flashcore@CONFIG and flashcore_b are ours
    if "flashcore" not in systems or not others:
        return
    print("\n| D | mask | S | " + " | ".join(systems) + " | FC / FA3 | FC / FA3 per cycle | FC / best other |")
    print("|---|---|---|" + "---|" * (len(systems) + 3))
    ratios_fa3, ratios_cycle, ratios_best = [], [], []
    for (D, causal, S), per in results.items():
        mean = {n: statistics.fmean(t for t, _ in v) for n, v in per.items()}
        mhz = {n: statistics.fmean(m for _, m in v) for n, v in per.items()}
        if "flashcore" not in mean or not any(n in mean for n in others):
            continue
        best = max(mean[n] for n in others if n in mean)
        r_best = mean["flashcore"] / best
        r_fa3 = r_cycle = float("nan")
        if "fa3" in mean:
            r_fa3 = mean["flashcore"] / mean["fa3"]
            r_cycle = r_fa3 * mhz["fa3"] / mhz["flashcore"]
            ratios_fa3.append(r_fa3)
            ratios_cycle.append(r_cycle)
        ratios_best.append(r_best)
        print(f"| {D} | {'causal' if causal else 'none'} | {S} | " + " | ".join(f"{mean.get(n, float('nan')):.0f}"
              for n in systems) + f" | {r_fa3:.3f} | {r_cycle:.3f} | {r_best:.3f} |")

    def geo(xs):
        return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else float("nan")
    print(f"\nGeometric means over {len(ratios_best)} cells: FC / FA3 {geo(ratios_fa3):.3f} "
          f"({geo(ratios_cycle):.3f} per cycle); FC / best other {geo(ratios_best):.3f}; cells below 0.93 of the best "
          f"other: {sum(r < 0.93 for r in ratios_best)}")

if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""FlashCore vs cuDNN, FlashAttention-2 (both through PyTorch SDPA) and FlashAttention-3, on the anchor grid.

Runs on the GPU machine (Python 3.12, PyTorch with CUDA, matplotlib). FlashCore is called through its C ABI
with ctypes (bench/flashcore_ctypes.py; no Python package needed). FA3 is measured when
`flash_attn_interface` imports; otherwise the report shows the FA3 numbers of the anchor file as
"FA3 (anchor)" (it always shows them, as the level to beat).

Method (the anchors'): forward pass; batch = 16384 // S, heads = 2048 // D; random normal inputs, the same
tensors for every system in one process; median of --iters CUDA-event-timed calls after --warmup calls;
inputs rotated among enough buffer sets that one cycle touches more than 2x the L2 cache;
TFLOPS = 4*B*H*S*S*D / t, halved for causal.

    python3 bench/report.py --out report            # grid, bf16 and fp16
    python3 bench/report.py --quick --dtype bf16    # a few cells, a smoke run
    python3 bench/report.py --serving               # and bench/serving.py's decode and varlen tables
    python3 bench/report.py --fp8 --no-grid         # only the FP8 section: FlashCore e4m3 vs FA3 FP8, accuracy

Writes OUT/performance_report.md, OUT/metrics.json and OUT/tflops_<dtype>_d<D>_<mask>.png; with --serving also
a Serving section, metrics.json "serving" and OUT/serving_decode_gbps.png, OUT/serving_varlen_tflops.png; with
--fp8 an FP8 section (speed on the grid's shapes and an accuracy table) and metrics.json "fp8".
A system that fails on a cell records null there (with the error in metrics.json), never a crash.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

# flashcore: the library's dispatch (a tuning table's choice when one is installed); flashcore_default: the built-in
# default config of each cell, named explicitly (kernel_config), to measure a tuning table against the defaults.
SYSTEMS = ["flashcore", "cudnn", "fa2", "fa3", "flashcore_default", "flashcore_b"]
LABELS = {"flashcore": "FlashCore", "cudnn": "cuDNN (SDPA)", "fa2": "FA2 (SDPA)", "fa3": "FA3",
          "fa3_anchor": "FA3 (anchor)"}
GRID_D = [64, 128, 256]
GRID_S = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_S = [1024, 4096]
# The small shapes of the anchor file (CUDA graph of 20 calls, microseconds per call).
SMALL_SHAPES = [("mission", 1, 8, 512, 64), ("small", 2, 8, 512, 64), ("long", 2, 8, 2048, 64),
                ("medium", 4, 16, 1024, 64), ("hd128", 2, 8, 512, 128), ("large", 8, 16, 2048, 64)]


def small_shapes(spec: Optional[str]):
    """The small-shape table's (tag, B, H, S, D): the anchor file's, or --small-shapes "B,H,S,D;..." (tag "custom")."""
    if not spec:
        return SMALL_SHAPES
    shapes = []
    for item in spec.split(";"):
        dims = [int(x) for x in item.split(",")]
        if len(dims) != 4 or min(dims) <= 0:
            raise SystemExit(f"report.py: --small-shapes wants B,H,S,D with positive sizes, got {item!r}")
        shapes.append(("custom", *dims))
    return shapes


# --serving: bench/serving.py's tables (imported only then: it needs PyTorch and the flashcore package).
SERVING_TABLES = ("decode", "varlen")
# Decode columns (serving.DECODE_SYSTEMS keys, in its order): header, (color, hatch) of the bar chart. "FlashCore" is
# flashcore.attention as the library's dispatch runs it (split-KV and GQA packing where it picks them).
SERVING_LABELS = {"flashcore": "FlashCore", "flashcore_nosplit": "FlashCore no split", "fa3_dense": "FA3 dense",
                  "flashcore_paged64": "FlashCore paged64", "fa3_paged64": "FA3 paged64",
                  "cudnn_dense": "cuDNN dense"}
# --fp8: the 8-bit systems, measured on the grid's shapes (bshd inputs, quantized per (batch, KV head)).
# fc_int8: precision="int8" (the high-accuracy mode); fc_e5m2: e5m2 inputs (the bf16 tensors over the e4m3 descales)
# fc_e4m3_vt: the e4m3 tensors with V transposed once before timing (FLASHCORE_FLAG_V_TRANSPOSED: no pass per call)
FP8_SYSTEMS = ("fc_e4m3", "fc_fp8", "fa3_fp8", "fc_int8", "fc_e5m2", "fc_e4m3_vt")
FP8_LABELS = {"fc_e4m3": "FlashCore e4m3", "fc_fp8": "FlashCore precision=fp8 (bf16 in)", "fa3_fp8": "FA3 FP8",
              "fc_e5m2": "FlashCore e5m2", "fc_e4m3_vt": "FlashCore e4m3, V transposed once",
              "fc_int8": "FlashCore precision=int8 (bf16 in)",
              "sdpa_bf16": "bf16 SDPA (no quantization)"}
FP8_ACC_S = 8192  # the accuracy table: seqlen 8k, batch = 16384 / 8k, heads = 2048 / D, no mask
FP8_OUTLIER_FRACTION = 1e-3  # "outliers" inputs: 0.1% of the entries replaced by N(0, 10^2) samples
FP8_OUTLIER_STD = 10.0
SERVING_STYLES = {"flashcore": ("tab:red", None), "flashcore_nosplit": ("tab:orange", None),
                  "fa3_dense": ("tab:purple", None), "flashcore_paged64": ("tab:red", "//"),
                  "fa3_paged64": ("tab:purple", "//"), "cudnn_dense": ("tab:blue", None)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def short_error(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    s = s.replace("\n", " ")
    return s if len(s) <= 300 else s[:297] + "..."


# ------------------------------------------------------------------------------------------------------
# Anchors

def find_anchors(path: Optional[str]) -> Optional[str]:
    candidates = [path] if path else []
    candidates += [os.environ.get("FLASHCORE_ANCHORS", ""),
                   os.path.join(ROOT, "..", "shared", "anchors", "h200-anchors.json"),
                   os.path.join(ROOT, "shared", "anchors", "h200-anchors.json")]
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    return None


def load_anchors(path: Optional[str]) -> dict:
    """{"grid": {(dtype, D, S, causal): {"fa3":..,"cudnn":..,"fa2":..}}, "small": {(B,H,S,D,causal): {...}}}"""
    out: dict = {"path": path, "grid": {}, "small": {}, "machine": None}
    if not path:
        return out
    with open(path) as f:
        data = json.load(f)
    out["machine"] = data.get("machine")
    for r in data.get("grid", []):
        out["grid"][(r["dtype"], int(r["D"]), int(r["S"]), bool(r["causal"]))] = {
            k: r.get(k) for k in ("fa3", "cudnn", "fa2")}
    for r in data.get("small_shapes_us", []):
        out["small"][(int(r["B"]), int(r["H"]), int(r["S"]), int(r["D"]), bool(r["causal"]))] = {
            "fa3": r.get("fa3_us"), "cudnn": r.get("cudnn_us"), "fa2": r.get("flash2_us")}
    return out


# ------------------------------------------------------------------------------------------------------
# Timing

def tflops_of(B: int, H: int, S: int, D: int, causal: bool, ms: Optional[float]) -> Optional[float]:
    if ms is None or ms <= 0:
        return None
    flops = 4.0 * B * H * S * S * D
    if causal:
        flops /= 2
    return flops / (ms * 1e-3) / 1e12


def time_calls(torch, fn: Callable[[int], None], nsets: int, iters: int, warmup: int) -> List[float]:
    """fn(i) runs one call on buffer set i % nsets. Returns per-call milliseconds (CUDA events)."""
    for i in range(warmup):
        fn(i % nsets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn((warmup + i) % nsets)
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def capture_graph(torch, fn: Callable[[int], None], nsets: int, calls: int):
    """A CUDA graph of `calls` calls (call i on buffer set i % nsets), after 3 warm-up calls on a side stream, replayed
    once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(3):
            fn(i % nsets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(i % nsets)
    g.replay()
    torch.cuda.synchronize()
    return g


def time_graph(torch, fn: Callable[[int], None], nsets: int, iters: int, calls: int) -> List[float]:
    """Kernel time per call: a CUDA graph of `calls` calls, replayed `iters` times."""
    g = capture_graph(torch, fn, nsets, calls)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        g.replay()
        ends[i].record()
    torch.cuda.synchronize()
    del g
    return [s.elapsed_time(e) / calls for s, e in zip(starts, ends)]


class Runner:
    """All systems on one problem, sharing the same input tensors."""

    def __init__(self, args, torch, fc_lib, fa3_mod, fc_lib_b=None):
        self.args = args
        self.torch = torch
        self.fc = fc_lib
        self.fc_b = fc_lib_b  # --lib-b: a second FlashCore library, system "flashcore_b" (A/B in one process)
        self.fa3 = fa3_mod
        # --timing graph: grid and FP8 cells timed as CUDA-graph replays. Eager timing measured FA3's Python call
        # (93-207 us of host time per call on an H100) instead of its kernel on the short cells
        # (docs/decisions.md#graph-timing).
        self.grid_graph = getattr(args, "timing", "eager") == "graph"
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
        self.SDPBackend = SDPBackend
        self.sdpa_kernel = sdpa_kernel
        self.F = F
        self.last_config: Dict[str, Optional[str]] = {}
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)

    def make_sets(self, B, H, S, D, dtype, seed):
        torch = self.torch
        elem = torch.tensor([], dtype=dtype).element_size()
        touched = 4 * B * H * S * D * elem  # Q, K, V read + O written
        nsets = 1 if self.args.no_rotate else (2 * self.l2) // touched + 1
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        sets = []
        for _ in range(nsets):
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
            sets.append((q, k, v))
        return sets

    # Each system: fn(i) runs one forward on buffer set i and returns the output, indexed (B, H, S, D).
    def build(self, name, sets, causal):
        """(fn, sdpa_backend or None) for system `name`; raises when the system is unavailable."""
        torch = self.torch
        if name in FP8_SYSTEMS:
            return self.build_fp8(name, sets, causal), None
        if name in ("cudnn", "fa2"):
            F = self.F

            def sdpa(i):
                q, k, v = sets[i]
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            be = self.SDPBackend.CUDNN_ATTENTION if name == "cudnn" else self.SDPBackend.FLASH_ATTENTION
            return sdpa, be
        if name == "fa3":
            if self.fa3 is None:
                raise RuntimeError("flash_attn_interface not importable")
            bshd = [tuple(t.transpose(1, 2).contiguous() for t in s) for s in sets]
            fa3 = self.fa3

            def fa3_call(i):
                q, k, v = bshd[i]
                out = fa3.flash_attn_func(q, k, v, causal=causal)
                out = out[0] if isinstance(out, tuple) else out
                return out.transpose(1, 2)
            return fa3_call, None
        if name in ("flashcore", "flashcore_default", "flashcore_b") or name.startswith("flashcore@"):
            lib = self.fc_b if name == "flashcore_b" else self.fc
            if lib is None:
                raise RuntimeError(f"the library of {name} is not loaded")
            params, outs = [], []
            config = None
            if name == "flashcore_default" or name.startswith("flashcore@"):
                # A named kernel config (flashcore list-configs): the built-in default (listed first) or the one asked
                # for, where it is compiled for this dtype, head dim and mask.
                q0 = sets[0][0]
                from flashcore_ctypes import DTYPE_BF16, DTYPE_FP16  # bench/ is on sys.path (main)
                lib_dtype = {torch.float16: DTYPE_FP16, torch.bfloat16: DTYPE_BF16}[q0.dtype]
                names = lib.library.kernel_configs(lib_dtype, q0.shape[3], causal)
                if name == "flashcore_default":
                    if not names:
                        raise RuntimeError("the library lists no kernel configs")
                    wanted = names[0]
                else:
                    wanted = name.split("@", 1)[1]
                    if wanted not in names:
                        raise RuntimeError(f"config {wanted} is not compiled for this dtype, head dim and mask")
                import ctypes  # params.kernel_config is a const char*: keep the buffer alive in this closure
                config = ctypes.create_string_buffer(wanted.encode())
            for q, k, v in sets:
                # Poisoned: an output the kernel does not write cannot pass the comparison by accident.
                o = torch.full_like(q, float("nan"))
                B, H, S, _ = q.shape
                lse = None if self.args.no_lse else torch.empty(B, H, S, device="cuda", dtype=torch.float32)
                params.append(lib.params_for(q, k, v, o, lse=lse, causal=causal, bhsd=True))
                if config is not None:
                    params[-1].kernel_config = ctypes.addressof(config)
                outs.append((o, lse))
            fc = lib
            self.last_config[name] = fc.library.selected_config(params[0])

            def fc_call(i):
                fc.forward(params[i], torch.cuda.current_stream().cuda_stream)
                return outs[i][0]
            fc_call.kernel_config = config  # params point at this buffer: it lives as long as the closure
            return fc_call, None
        raise ValueError(name)

    def system_record(self, name, times, err, shape) -> dict:
        """A cell's record for one system: its error (None when it ran), the median, mean and minimum ms and TFLOPS
        of `times` (None without times), and the kernel config the library ran, when it said. shape: B, H, S, D,
        causal."""
        rec: dict = {"error": err}
        if times:
            med = statistics.median(times)
            rec.update({"median_ms": med, "mean_ms": statistics.fmean(times), "min_ms": min(times),
                        "tflops": tflops_of(*shape, med)})
        else:
            rec.update({"median_ms": None, "tflops": None})
        if name in self.last_config:
            rec["config"] = self.last_config[name]
        return rec

    def context(self, backend):
        """The SDPA backend selection of a system (build's second value), or nothing for the others."""
        return self.sdpa_kernel([backend]) if backend is not None else _nullcontext()

    def first_call(self, name, sets, causal):
        """build, then one call on set 0 (module loading, plans): (fn, backend, float copy of its output or None)."""
        torch = self.torch
        fn, backend = self.build(name, sets, causal)
        with self.context(backend), torch.no_grad():
            out0 = fn(0)
            torch.cuda.synchronize()
            ref = out0.float() if self.args.verify else None
        return fn, backend, ref

    def failed(self, e: BaseException) -> str:
        """A failing backend records null: drain what it left on the GPU (if the error allows) and shorten the error."""
        try:
            self.torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return short_error(e)

    def grid_graph_shape(self, nsets: int):
        """(calls per graph, replays) of a graph-timed grid or FP8 cell: --grid-graph-calls calls, at least one per
        buffer set, replayed until --iters calls have run, at least 3 times."""
        calls = max(self.args.grid_graph_calls, nsets)
        return calls, max(3, -(-self.args.iters // calls))

    def run_system(self, name, sets, causal, graph: bool, grid: bool = False):
        """Returns (times_ms or None, float copy of the output of set 0 or None, error or None). graph: each time is
        one replay of a CUDA graph of calls divided by its calls; grid (--timing graph on the grid and FP8 cells): a
        graph of --grid-graph-calls calls (at least one per buffer set), replayed until --iters calls have run (at
        least 3 replays), so that a grid cell costs about as much GPU time as an eager one."""
        torch = self.torch
        try:
            fn, backend, ref = self.first_call(name, sets, causal)
            with self.context(backend), torch.no_grad():
                if graph:
                    calls, replays = (self.grid_graph_shape(len(sets)) if grid else
                                      (max(self.args.graph_calls, len(sets)), self.args.iters))
                    times = time_graph(torch, fn, len(sets), replays, calls)
                else:
                    times = time_calls(torch, fn, len(sets), self.args.iters, self.args.warmup)
            return times, ref, None
        except Exception as e:  # noqa: BLE001 - a failing backend records null
            return None, None, self.failed(e)

    def run_interleaved(self, names, sets, causal):
        """--interleave (grid and FP8 cells with graph timing): every system's graph is captured first, then the
        systems take turns replay by replay, in reverse order every other replay, --rounds x the replays of
        run_system each. Under the 700 W cap the SM clock moves by 15-25% within tens of milliseconds
        (docs/decisions.md#interleave); timed one after the other, two systems can each see a different clock. Returns ({name: per-call ms},
        {name: float copy of set 0's output}, {name: error or None})."""
        torch = self.torch
        calls, replays = self.grid_graph_shape(len(sets))
        graphs, refs, errors, times = {}, {}, {n: None for n in names}, {n: [] for n in names}
        fns = {}  # a graph reads and writes the buffers its fn's closure owns: they live as long as the graphs
        for name in names:
            try:
                fns[name], backend, ref = self.first_call(name, sets, causal)
                if ref is not None:
                    refs[name] = ref
                with self.context(backend), torch.no_grad():
                    graphs[name] = capture_graph(torch, fns[name], len(sets), calls)
            except Exception as e:  # noqa: BLE001 - a failing backend records null
                errors[name] = self.failed(e)
        order = [n for n in names if n in graphs]
        for turn in range(max(1, self.args.rounds) * replays):
            events = []
            for name in (order if turn % 2 == 0 else order[::-1]):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graphs[name].replay()
                end.record()
                events.append((name, start, end))
            torch.cuda.synchronize()
            for name, start, end in events:
                times[name].append(start.elapsed_time(end) / calls)
        del graphs, fns
        return times, refs, errors

    def run_cell(self, B, H, S, D, dtype_name, causal, graph=False, seed=0):
        torch = self.torch
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        cell = {"B": B, "H": H, "S": S, "D": D, "dtype": dtype_name, "causal": causal, "systems": {}}
        try:
            sets = self.make_sets(B, H, S, D, dtype, seed)
        except Exception as e:  # noqa: BLE001
            cell["error"] = short_error(e)
            return cell
        cell["rotate_sets"] = len(sets)
        refs: Dict[str, object] = {}
        self.last_config = {}
        names = [n for n in ("cudnn", "fa2", "fa3", "flashcore", "flashcore_default", "flashcore_b")
                 if n in self.args.systems and not (n == "fa3" and self.fa3 is None)]
        names += [n for n in self.args.systems if n.startswith("flashcore@")]
        # --rounds R: the systems take turns R times on the same tensors; a system's median is over all its calls,
        # so that a clock or temperature drift during the cell falls on every system alike. Odd rounds take the
        # systems in reverse order: whichever system ran first in every round was measured up to 3% faster on
        # long compute-bound cells (docs/decisions.md#turn-order).
        all_times: Dict[str, List[float]] = {n: [] for n in names}
        errors: Dict[str, Optional[str]] = {n: None for n in names}
        interleave = self.grid_graph and not graph and self.args.interleave
        if interleave:
            all_times, refs, errors = self.run_interleaved(names, sets, causal)
        for round_idx in range(0 if interleave else max(1, self.args.rounds)):
            for name in (names if round_idx % 2 == 0 else names[::-1]):
                if errors[name] is not None:
                    continue
                times, out, err = self.run_system(name, sets, causal, graph or self.grid_graph,
                                                  grid=not graph and self.grid_graph)
                if err is not None:
                    errors[name], all_times[name] = err, []
                    continue
                all_times[name] += times
                if out is not None and name not in refs:
                    refs[name] = out
        for name in names:
            cell["systems"][name] = self.system_record(name, all_times[name] or None, errors[name],
                                                       (B, H, S, D, causal))
        # FlashCore against SDPA on set 0 (the first SDPA backend that ran).
        if "flashcore" in refs:
            for ref_name in ("fa2", "cudnn", "fa3"):
                if ref_name in refs:
                    diff = (refs["flashcore"] - refs[ref_name]).abs()
                    finite = bool(torch.isfinite(refs["flashcore"]).all().item())
                    cell["flashcore_finite"] = finite
                    # NaN/Inf (e.g. the poison left in place) is reported as an infinite error.
                    cell["flashcore_max_err"] = float(diff.max().item()) if finite else float("inf")
                    cell["flashcore_mean_err"] = float(diff.mean().item()) if finite else float("inf")
                    cell["flashcore_err_vs"] = ref_name
                    break
            if "flashcore_max_err" not in cell and self.args.verify:
                cell["flashcore_err_vs"] = None
        del refs, sets
        torch.cuda.empty_cache()
        return cell


    # -- FP8 (--fp8) ------------------------------------------------------------------------------------------------

    def make_fp8_sets(self, B, H, S, D, seed):
        """Buffer sets of bshd inputs for the 8-bit systems: {"bf16": (q, k, v), "e4m3": (q8, k8, v8), "e5m2": ...,
        "descale": (qd, kd, vd)}, the e4m3 tensors quantized from the bf16 ones per (batch, KV head) with the
        largest magnitude mapped to 448 (flashcore.quantize_fp8, as FA3's FP8 users do), the e5m2 ones rounded from
        the bf16 ones over the same descales (e5m2_like). Rotated like make_sets, counting what an e4m3 call touches
        (Q, K, V e4m3 read, O bf16 written)."""
        torch = self.torch
        from flashcore import quantize_fp8  # python/ is on sys.path (flashcore_ctypes)
        touched = 5 * B * H * S * D
        nsets = 1 if self.args.no_rotate else (2 * self.l2) // touched + 1
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        sets = []
        for _ in range(nsets):
            bf16 = tuple(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for _ in range(3))
            quantized = [quantize_fp8(t) for t in bf16]
            sets.append({"bf16": bf16, "e4m3": tuple(x for x, _ in quantized),
                         "e5m2": tuple(e5m2_like(torch, t, d) for t, (_, d) in zip(bf16, quantized)),
                         "descale": tuple(d for _, d in quantized)})
        return sets

    def build_fp8(self, name, sets, causal):
        """fn(i) for an 8-bit system on buffer set i, returning O (B, S, H, D) bf16."""
        torch = self.torch
        if name == "fa3_fp8":
            if self.fa3 is None:
                raise RuntimeError("flash_attn_interface not importable")
            fa3 = self.fa3

            def fa3_call(i):
                (q8, k8, v8), (qd, kd, vd) = sets[i]["e4m3"], sets[i]["descale"]
                out = fa3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
                return out[0] if isinstance(out, tuple) else out
            return fa3_call
        if self.fc is None:
            raise RuntimeError("libflashcore.so not loaded")
        from flashcore_ctypes import PRECISION_FP8, PRECISION_INT8
        params, outs, lses = [], [], []
        for st in sets:
            q, k, v = st["bf16"]
            o = torch.full_like(q, float("nan"))  # poisoned, as in the grid
            B, S, H, _ = q.shape
            lse = None if self.args.no_lse else torch.empty(B, H, S, device="cuda", dtype=torch.float32)
            lses.append(lse)  # the params point at it: it lives as long as fc_call
            if name in ("fc_e4m3", "fc_e5m2", "fc_e4m3_vt"):
                params.append(self.fc.params_for(*st[name[3:7]], o, lse=lse, causal=causal, bhsd=False,
                                                 descales=st["descale"], v_transposed=name == "fc_e4m3_vt"))
            else:  # fc_fp8 / fc_int8: the bf16 tensors, quantized by the library inside the call (timed)
                params.append(self.fc.params_for(q, k, v, o, lse=lse, causal=causal, bhsd=False,
                                                 precision=PRECISION_INT8 if name == "fc_int8" else PRECISION_FP8))
            outs.append(o)
        fc = self.fc
        self.last_config[name] = fc.library.selected_config(params[0])

        def fc_call(i):
            fc.forward(params[i], torch.cuda.current_stream().cuda_stream)
            return outs[i]
        fc_call.lses = lses
        return fc_call

    def run_fp8_cell(self, B, H, S, D, causal, seed=0):
        """The 8-bit systems on one grid shape, sharing inputs: times, TFLOPS, and how far FlashCore's outputs are
        from FA3 FP8's (relative RMS difference on set 0)."""
        torch = self.torch
        cell = {"B": B, "H": H, "S": S, "D": D, "causal": causal, "systems": {}}
        try:
            sets = self.make_fp8_sets(B, H, S, D, seed)
        except Exception as e:  # noqa: BLE001
            cell["error"] = short_error(e)
            return cell
        cell["rotate_sets"] = len(sets)
        outs: Dict[str, object] = {}
        self.last_config = {}
        names = [n for n in FP8_SYSTEMS if not (
            (n == "fa3_fp8" and self.fa3 is None) or (n == "fc_int8" and not self.int8_kernels(D, causal))
            or (n == "fc_e5m2" and not self.e5m2_kernels(D, causal))
            or (n == "fc_e4m3_vt" and not self.v_transposed_api()))]
        interleaved = None
        if self.grid_graph and self.args.interleave:
            interleaved = self.run_interleaved(names, sets, causal)
        for name in names:
            if interleaved is not None:
                times, out, err = (interleaved[0][name] or None, interleaved[1].get(name), interleaved[2][name])
            else:
                times, out, err = self.run_system(name, sets, causal, graph=self.grid_graph, grid=self.grid_graph)
            rec = self.system_record(name, times, err, (B, H, S, D, causal))
            if out is not None:
                rec["finite"] = bool(torch.isfinite(out).all().item())
                outs[name] = out
            cell["systems"][name] = rec
        if "fa3_fp8" in outs:
            for name in ("fc_e4m3", "fc_fp8", "fc_int8", "fc_e5m2", "fc_e4m3_vt"):
                if name in outs:
                    cell["systems"][name]["rel_diff_vs_fa3"] = rel_rmse(outs[name], outs["fa3_fp8"])
        del outs, sets
        if self.fc is not None:
            self.fc.release_workspaces()
        torch.cuda.empty_cache()
        return cell

    def v_transposed_api(self) -> bool:
        """Whether the library takes V transposed once (flashcore_fp8_transpose_v); False for older libraries."""
        return self.fc is not None and hasattr(self.fc.library._cdll, "flashcore_fp8_transpose_v")

    def int8_kernels(self, D, causal) -> bool:
        """Whether the library has an int8 Q K^T kernel (precision="int8") for (D, causal); False for a 0.3 library."""
        from flashcore_ctypes import DTYPE_INT8
        try:
            return bool(self.fc.library.kernel_configs(DTYPE_INT8, D, causal))
        except Exception:  # noqa: BLE001 - an older library rejects the dtype
            return False

    def e5m2_kernels(self, D, causal) -> bool:
        """Whether the library has an e5m2 kernel for (D, causal); False for a library without them."""
        from flashcore_ctypes import DTYPE_FP8_E5M2
        try:
            return bool(self.fc.library.kernel_configs(DTYPE_FP8_E5M2, D, causal))
        except Exception:  # noqa: BLE001 - an older library rejects the dtype
            return False

    def fp8_accuracy(self, D, outliers: bool, seed: int) -> dict:
        """Relative RMSE of O against the float64 attention of the unquantized (bf16) inputs, for FA3 FP8 and
        FlashCore e4m3 (both on the inputs quantized per (batch, KV head), absmax -> 448), FlashCore precision="fp8"
        (bf16 in) and bf16 SDPA, at seqlen FP8_ACC_S, no mask."""
        torch = self.torch
        from flashcore import quantize_fp8
        from flashcore_ctypes import DTYPE_FP8_E4M3, PRECISION_FP8
        S, B, H = FP8_ACC_S, 16384 // FP8_ACC_S, 2048 // D
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        bf16 = []
        for _ in range(3):
            x = torch.randn(B, S, H, D, device="cuda", generator=gen)
            if outliers:
                mask = torch.rand(x.shape, device="cuda", generator=gen) < FP8_OUTLIER_FRACTION
                x = torch.where(mask, FP8_OUTLIER_STD * torch.randn(x.shape, device="cuda", generator=gen), x)
            bf16.append(x.to(torch.bfloat16))
        q, k, v = bf16
        ref = attention_fp64(torch, q, k, v)
        quantized = [quantize_fp8(t) for t in bf16]
        (q8, k8, v8), descales = tuple(x for x, _ in quantized), tuple(d for _, d in quantized)
        row: dict = {"D": D, "inputs": "outliers" if outliers else "normal", "B": B, "H": H, "S": S, "errors": {}}
        runs = {"sdpa_bf16": lambda: self.F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)}
        if self.fa3 is not None:
            def fa3_run():
                out = self.fa3.flash_attn_func(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                               v_descale=descales[2])
                return out[0] if isinstance(out, tuple) else out
            runs["fa3_fp8"] = fa3_run
        if self.fc is not None and self.fc.library.kernel_configs(DTYPE_FP8_E4M3, D, False):
            def fc_run(precision):
                o = torch.full_like(q, float("nan"))
                if precision:
                    params = self.fc.params_for(q, k, v, o, bhsd=False, precision=PRECISION_FP8)
                else:
                    params = self.fc.params_for(q8, k8, v8, o, bhsd=False, descales=descales)
                self.fc.forward(params, torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                self.fc.release_workspaces()
                return o
            runs["fc_e4m3"] = lambda: fc_run(False)
            runs["fc_fp8"] = lambda: fc_run(True)
        if self.fc is not None and self.e5m2_kernels(D, False):
            e5m2 = tuple(e5m2_like(torch, t, d) for t, d in zip(bf16, descales))

            def e5m2_run():
                o = torch.full_like(q, float("nan"))
                params = self.fc.params_for(*e5m2, o, bhsd=False, descales=descales)
                self.fc.forward(params, torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                self.fc.release_workspaces()
                return o
            runs["fc_e5m2"] = e5m2_run
        if self.fc is not None and self.int8_kernels(D, False):
            from flashcore_ctypes import PRECISION_INT8

            def int8_run():
                o = torch.full_like(q, float("nan"))
                params = self.fc.params_for(q, k, v, o, bhsd=False, precision=PRECISION_INT8)
                self.fc.forward(params, torch.cuda.current_stream().cuda_stream)
                torch.cuda.synchronize()
                self.fc.release_workspaces()
                return o
            runs["fc_int8"] = int8_run
        for name, run in runs.items():
            try:
                with torch.no_grad():
                    out = run()
                row[name] = rel_rmse(out, ref)
            except Exception as e:  # noqa: BLE001 - a failing system records null
                row[name] = None
                row["errors"][name] = short_error(e)
        del ref, bf16, quantized
        torch.cuda.empty_cache()
        return row


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


# ------------------------------------------------------------------------------------------------------
# Serving (--serving): bench/serving.py's decode and varlen tables, in this process, on this GPU

def run_serving(args, torch, fc) -> tuple:
    """Measures the --serving-tables with bench/serving.py. Returns (result, exit status): result holds the rows
    as serving.py records them ("decode", "varlen"), "missing" ({table: {system: reason}} for the columns with no
    figure), the setup, and "skipped" / "error" when the tables were not (fully) measured. FA3 and cuDNN follow
    --systems; a failing system or row is recorded in the rows (keep_going), never a crash."""
    res: dict = {"tables": list(args.serving_tables), "head_dim": args.serving_head_dim,
                 "heads": list(args.serving_heads), "varlen_heads": "anchor", "decode": [], "varlen": [],
                 "missing": {}}
    if fc is None:
        res["skipped"] = "FlashCore not loaded (the serving tables measure FlashCore; see the FlashCore line)"
        return res, 0
    # serving.py calls the flashcore package: make it load the library the grid measured.
    from flashcore import _lib
    os.environ[_lib.LIBRARY_ENV] = os.path.abspath(fc.path)
    _lib.reset()
    try:
        import serving  # bench/serving.py (bench/ is on sys.path)
    except Exception as e:  # noqa: BLE001
        res["skipped"] = f"bench/serving.py not importable: {short_error(e)}"
        log(f"report: serving tables skipped: {res['skipped']}")
        return res, 0
    name = torch.cuda.get_device_name(0)
    res["device"], res["peak_GBps"] = name, serving.peak_gbps(name)
    fa3_on, cudnn_on = "fa3" in args.systems, "cudnn" in args.systems
    status, t0 = 0, time.time()

    def row_log(line: str) -> None:
        log("    " + line)
    try:
        if "decode" in args.serving_tables:
            log(f"[serving] decode: d{args.serving_head_dim}, heads {args.serving_heads[0]}/{args.serving_heads[1]}, "
                f"{len(serving.DECODE_ROWS)} rows")
            for row in serving.iter_decode(args.serving_head_dim, tuple(args.serving_heads), fa3=fa3_on,
                                           cudnn=cudnn_on, keep_going=True, log=row_log):
                res["decode"].append(row)
        if "varlen" in args.serving_tables:
            log(f"[serving] varlen: {len(serving.VARLEN_CASES)} cases")
            for row in serving.iter_varlen("anchor", fa3=fa3_on, keep_going=True, log=row_log):
                res["varlen"].append(row)
    except KeyboardInterrupt:
        log("report: serving tables interrupted; writing what was measured")
        res["error"] = "interrupted"
        status = 130
    except Exception as e:  # noqa: BLE001 - keep what was measured
        log(f"report: serving tables stopped early: {short_error(e)}")
        traceback.print_exc()
        res["error"] = short_error(e)
        status = 1

    def why(missing: dict) -> dict:
        return {k: ("not in --systems" if v == "not selected" else str(v)) for k, v in missing.items()}
    if "decode" in args.serving_tables:
        res["missing"]["decode"] = why(serving.decode_missing(res["decode"], fa3_on, cudnn_on))
    if "varlen" in args.serving_tables:
        res["missing"]["varlen"] = why(serving.varlen_missing(res["varlen"], fa3_on))
    res["elapsed_s"] = time.time() - t0
    return res, status


def _serving_errors(labelled_rows: List[tuple]) -> List[str]:
    """A collapsed list of the errors recorded in serving rows (keys error / <system>_err), as the grid's."""
    errs = [f"- {label}: {k[:-4] if k.endswith('_err') else 'row'}: {r[k]}" for label, r in labelled_rows
            for k in r if k == "error" or (k.endswith("_err") and not k.endswith("max_err"))]
    if not errs:
        return []
    return ["<details><summary>errors (- cells)</summary>\n"] + errs[:40] + ["\n</details>\n"]


def serving_markdown(res: dict) -> List[str]:
    """The report's Serving section (markdown lines) from run_serving's result."""
    L = ["## Serving: decode and variable-length prefill (bench/serving.py, same process and GPU)\n"]
    if res.get("skipped"):
        L.append(f"Not measured: {res['skipped']}.\n")
        return L
    import serving  # imported by run_serving
    if res.get("error"):
        L.append(f"Stopped early ({res['error']}): the rows below are those measured.\n")
    missing = res.get("missing", {})
    if "decode" in res["tables"]:
        rows = res["decode"]
        if rows:
            L.append(serving.decode_markdown(rows, res["device"], res["peak_GBps"], res["head_dim"],
                                             tuple(res["heads"]), missing=missing.get("decode"),
                                             labels=SERVING_LABELS) + "\n")
            errs = {label: max((r[f"{s}_max_err"] for r in rows if f"{s}_max_err" in r), default=None)
                    for s, label in (("flashcore", "FlashCore"), ("flashcore_nosplit", "no split"),
                                     ("flashcore_paged64", "paged64"))}
            L.append("FlashCore max |O - SDPA float32| over the decode rows: "
                     + "; ".join(f"{k} {fmt(v, '{:.1e}')}" for k, v in errs.items()) + ".\n")
            L += _serving_errors([(f"{r['B']} x {r['Sk'] // 1024}k", r) for r in rows])
        else:
            L.append("Decode: no row measured.\n")
    if "varlen" in res["tables"]:
        rows = res["varlen"]
        if rows:
            L.append(serving.varlen_markdown(rows, res["device"], res["varlen_heads"], missing=missing.get("varlen"),
                                             errors_in="metrics.json") + "\n")
            L += _serving_errors([(f"d{r['D']} {'causal' if r['causal'] else 'full'}", r) for r in rows])
        else:
            L.append("Variable-length prefill: no case measured.\n")
    return L


# ------------------------------------------------------------------------------------------------------
# FP8 (--fp8): FlashCore's 8-bit path against FlashAttention-3's FP8, speed and accuracy

def rel_rmse(out, ref) -> float:
    """RMS(out - ref) / RMS(ref), accumulated in float64; inf when out is not finite (e.g. the NaN poison)."""
    if not bool(out.isfinite().all().item()):
        return float("inf")
    ref = ref.double()
    num = (out.double() - ref).pow(2).mean().sqrt().item()
    den = ref.pow(2).mean().sqrt().item()
    return num / den if den > 0 else float("inf")


def attention_fp64(torch, q, k, v, max_scores: int = 2**27):
    """Non-causal attention in float64 of bshd q (B, Sq, H, D), k, v (B, Sk, H, D): (B, Sq, H, D), computed one
    batch entry and block of query rows at a time (at most max_scores float64 scores at once)."""
    B, Sq, H, D = q.shape
    Sk = k.shape[1]
    out = torch.empty(B, Sq, H, D, device=q.device, dtype=torch.float64)
    rows = max(1, max_scores // (H * Sk))
    for b in range(B):
        kb, vb = (t[b].double().transpose(0, 1) for t in (k, v))  # (H, Sk, D)
        for start in range(0, Sq, rows):
            qb = q[b, start:start + rows].double().transpose(0, 1)  # (H, rows, D)
            probs = torch.softmax((qb @ kb.transpose(1, 2)) / math.sqrt(D), dim=-1)
            out[b, start:start + rows] = (probs @ vb).transpose(0, 1)
            del probs
    return out


def e5m2_like(torch, x, descale):
    """x (B, S, H, D) rounded to e5m2 over the per-(batch, KV head) descale (B, Hkv) of its e4m3 quantization:
    stored = x / descale (at most 448 in magnitude, well inside e5m2's range)."""
    per_head = descale.repeat_interleave(x.shape[2] // descale.shape[1], dim=1)[:, None, :, None]
    return (x.float() / per_head).to(torch.float8_e5m2)


def run_fp8(args, runner) -> tuple:
    """Measures the FP8 section: on the grid's shapes (head dims GRID_D, seqlens of --quick or the full grid, both
    masks) FlashCore e4m3 on pre-quantized inputs, FlashCore precision="fp8" from bf16 (quantization included in the
    time) and FA3 FP8 (when imported) on the same tensors; then the accuracy table. Returns (result, status)."""
    fc = runner.fc
    res: dict = {"cells": [], "accuracy": [], "notes": [], "fa3": runner.fa3 is not None}
    if fc is None:
        res["skipped"] = "FlashCore not loaded (see the FlashCore line)"
        return res, 0
    from flashcore_ctypes import DTYPE_FP8_E4M3
    caps = fc.library.capabilities()
    if "float8_e4m3fn" not in caps.dtypes:
        res["skipped"] = f"the library has no e4m3 kernels (compiled dtypes: {', '.join(caps.dtypes)})"
        return res, 0
    if caps.device_backend != "sm90":
        res["skipped"] = (f"the 8-bit path needs the sm90 backend; this GPU (sm_{caps.device_arch}) is served by "
                          f"{caps.device_backend or 'none'!r}")
        return res, 0
    if runner.fa3 is None:
        res["notes"].append("FA3 FP8 not measured: flash_attn_interface is not importable here or fa3 is not in "
                            "--systems")
    seqs = QUICK_S if args.quick else GRID_S
    kernels = {(D, c): bool(fc.library.kernel_configs(DTYPE_FP8_E4M3, D, c)) for D in GRID_D for c in (False, True)}
    res["head_dims"] = [D for D in GRID_D if kernels[(D, False)] or kernels[(D, True)]]
    for D in GRID_D:
        for causal in (False, True):
            if not kernels[(D, causal)]:
                res["notes"].append(f"head dim {D}{' causal' if causal else ''}: FlashCore has no 8-bit kernel "
                                    "(flashcore_list_kernel_configs lists none); not measured")
    todo = [(D, S, c) for D in GRID_D for S in seqs for c in (False, True) if kernels[(D, c)]]
    status, t0 = 0, time.time()
    try:
        for n, (D, S, causal) in enumerate(todo):
            B, H = 16384 // S, 2048 // D
            log(f"[fp8 {n + 1}/{len(todo)}] D={D} S={S} B={B} H={H} causal={int(causal)}")
            cell = runner.run_fp8_cell(B, H, S, D, causal, seed=5000 + n)
            res["cells"].append(cell)
            log("    " + " ".join(f"{s}={fmt(r.get('tflops'))}" for s, r in cell["systems"].items()))
        for n, D in enumerate(GRID_D):
            for outliers in (False, True):
                log(f"[fp8 accuracy] D={D} S={FP8_ACC_S} inputs={'outliers' if outliers else 'normal'}")
                row = runner.fp8_accuracy(D, outliers, seed=6000 + 2 * n + int(outliers))
                res["accuracy"].append(row)
                log("    " + " ".join(f"{s}={fmt(row.get(s), '{:.4f}')}" for s in FP8_LABELS if s in row))
    except KeyboardInterrupt:
        log("report: FP8 section interrupted; writing what was measured")
        res["error"] = "interrupted"
        status = 130
    except Exception as e:  # noqa: BLE001 - e.g. a sticky CUDA error: keep what was measured
        log(f"report: FP8 section stopped early: {short_error(e)}")
        traceback.print_exc()
        res["error"] = short_error(e)
        status = 1
    res["elapsed_s"] = time.time() - t0
    return res, status


def fp8_markdown(res: dict) -> List[str]:
    """The report's FP8 section (markdown lines) from run_fp8's result."""
    L = ["## FP8 (e4m3): FlashCore vs FlashAttention-3 FP8\n"]
    if res.get("skipped"):
        L.append(f"Not measured: {res['skipped']}.\n")
        return L
    if res.get("error"):
        L.append(f"Stopped early ({res['error']}): the rows below are those measured.\n")
    L.append("Method: the grid's shapes (batch = 16384/S, heads = 2048/D, MHA), bshd inputs. FA3 FP8 and FlashCore "
             "e4m3 get the same e4m3 tensors and descales: torch.randn bf16 inputs quantized per (batch, KV head) "
             "with the absolute maximum mapped to 448 (flashcore.quantize_fp8), as FA3's FP8 users do. FlashCore "
             "precision=\"fp8\" gets the bf16 tensors and its time includes the library's quantization. "
             "\"V transposed once\": the same e4m3 tensors with V transposed by flashcore_fp8_transpose_v before the "
             "timing and passed with FLASHCORE_FLAG_V_TRANSPOSED (a K/V that several calls attend to); the plain e4m3 "
             "call transposes V in every call. O in bf16. "
             "Median of the CUDA-event-timed calls after the warm-up, as in the grid; TFLOPS = 4*B*H*S*S*D/t, halved "
             "for causal.\n")
    for note in res.get("notes", []):
        L.append(f"- {note}")
    if res.get("notes"):
        L.append("")
    cells = res.get("cells", [])
    have_fa3 = any(cell_tflops(c, "fa3_fp8") is not None for c in cells)
    if cells:
        hdr = ["D", "mask", "S", "B×H", "FC e4m3", "FC fp8 (bf16 in)", "FC int8 (bf16 in)", "FC e5m2",
               "FC e4m3, V transposed once"]
        if have_fa3:
            hdr += ["FA3 FP8", "FC e4m3 / FA3", "FC fp8 / FA3", "FC int8 / FA3", "FC e5m2 / FA3",
                    "FC e4m3 (V transposed once) / FA3", "FC e4m3 vs FA3 (rel. diff)"]
        hdr.append("FC e4m3 config")
        L.append("TFLOPS:\n")
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---|" * len(hdr))
        for c in cells:
            e4m3, auto, fa3, int8, e5m2, e4m3_vt = (cell_tflops(c, s) for s in FP8_SYSTEMS)
            vals = [str(c["D"]), "causal" if c["causal"] else "none", str(c["S"]), f"{c['B']}×{c['H']}",
                    fmt(e4m3), fmt(auto), fmt(int8), fmt(e5m2), fmt(e4m3_vt)]
            if have_fa3:
                diff = (c["systems"].get("fc_e4m3") or {}).get("rel_diff_vs_fa3")
                vals += [fmt(fa3), fmt(ratio(e4m3, fa3), "{:.2f}"), fmt(ratio(auto, fa3), "{:.2f}"),
                         fmt(ratio(int8, fa3), "{:.2f}"), fmt(ratio(e5m2, fa3), "{:.2f}"),
                         fmt(ratio(e4m3_vt, fa3), "{:.2f}"),
                         "non-finite" if diff == float("inf") else fmt(diff, "{:.3f}")]
            vals.append((c["systems"].get("fc_e4m3") or {}).get("config") or "")
            L.append("| " + " | ".join(vals) + " |")
        L.append("")
        if have_fa3:
            parts = []
            for D in sorted({c["D"] for c in cells}):
                rows = [c for c in cells if c["D"] == D]
                e4m3 = geomean([ratio(cell_tflops(c, "fc_e4m3"), cell_tflops(c, "fa3_fp8")) for c in rows])
                auto = geomean([ratio(cell_tflops(c, "fc_fp8"), cell_tflops(c, "fa3_fp8")) for c in rows])
                int8 = geomean([ratio(cell_tflops(c, "fc_int8"), cell_tflops(c, "fa3_fp8")) for c in rows])
                e5m2 = geomean([ratio(cell_tflops(c, "fc_e5m2"), cell_tflops(c, "fa3_fp8")) for c in rows])
                e4m3_vt = geomean([ratio(cell_tflops(c, "fc_e4m3_vt"), cell_tflops(c, "fa3_fp8")) for c in rows])
                parts.append(f"d{D}: FC e4m3 / FA3 FP8 {fmt(e4m3, '{:.2f}')}, FC fp8 (bf16 in) / FA3 FP8 "
                             f"{fmt(auto, '{:.2f}')}, FC int8 (bf16 in) / FA3 FP8 {fmt(int8, '{:.2f}')}, "
                             f"FC e5m2 / FA3 FP8 {fmt(e5m2, '{:.2f}')}, FC e4m3 (V transposed once) / FA3 FP8 "
                             f"{fmt(e4m3_vt, '{:.2f}')}")
            L.append("Geometric means per head dim: " + "; ".join(parts) + ".\n")
        nonfinite = [f"{s} d{c['D']} S={c['S']} {'causal' if c['causal'] else 'none'}" for c in cells
                     for s, r in c["systems"].items() if r.get("finite") is False]
        if nonfinite:
            L.append("Non-finite outputs: " + ", ".join(nonfinite) + ".\n")
        errs = sorted({f"{s}: {r['error']}" for c in cells for s, r in c["systems"].items() if r.get("error")}
                      | {f"cell d{c['D']} S={c['S']}: {c['error']}" for c in cells if c.get("error")})
        if errs:
            L.append("<details><summary>errors (- cells)</summary>\n")
            L += [f"- {e}" for e in errs[:40]]
            L.append("\n</details>\n")
    else:
        L.append("No FP8 cell measured.\n")

    acc = res.get("accuracy", [])
    if acc:
        L.append("### FP8 accuracy: relative RMSE of O against float64 attention of the unquantized inputs\n")
        L.append(f"Seqlen {FP8_ACC_S}, batch {16384 // FP8_ACC_S}, heads 2048/D, no mask; bf16 inputs: N(0, 1), or "
                 f"N(0, 1) with {FP8_OUTLIER_FRACTION:.1%} of the entries of q, k and v replaced by N(0, "
                 f"{FP8_OUTLIER_STD:g}²) outliers. Metric: RMS(O - ref) / RMS(ref), ref in float64 from the bf16 "
                 "inputs. FA3 FP8 and FlashCore e4m3 run on the inputs quantized per (batch, KV head) (absmax -> "
                 "448); FlashCore precision=\"fp8\" quantizes the bf16 inputs itself (the same scaling); FlashCore "
                 "precision=\"int8\" quantizes q per token and k (less its mean) per 128 keys to int8 and runs P V in "
                 "bf16; FlashCore e5m2 runs on the bf16 inputs rounded to e5m2 over the same per-(batch, KV head) "
                 "descales; bf16 SDPA is PyTorch's default backend on the bf16 inputs.\n")
        cols = [(r["D"], r["inputs"]) for r in acc]
        L.append("| system | " + " | ".join(f"d{D} {'outliers' if i == 'outliers' else 'N(0,1)'}" for D, i in cols)
                 + " |")
        L.append("|---|" + "---|" * len(cols))
        for name in ("fa3_fp8", "fc_e4m3", "fc_e5m2", "fc_fp8", "fc_int8", "sdpa_bf16"):
            if not any(name in r for r in acc):
                continue
            vals = ["non-finite" if r.get(name) == float("inf") else fmt(r.get(name), "{:.4f}") for r in acc]
            L.append(f"| {FP8_LABELS[name]} | " + " | ".join(vals) + " |")
        L.append("")
        errs = sorted({f"{s} d{r['D']} {r['inputs']}: {e}" for r in acc for s, e in r.get("errors", {}).items()})
        if errs:
            L.append("<details><summary>errors (- entries)</summary>\n")
            L += [f"- {e}" for e in errs[:40]]
            L.append("\n</details>\n")
    return L


# ------------------------------------------------------------------------------------------------------
# Report

def fmt(v: Optional[float], spec: str = "{:.0f}") -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else spec.format(v)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or b == 0:
        return None
    return a / b


def geomean(values: List[Optional[float]]) -> Optional[float]:
    vs = [v for v in values if v is not None and v > 0]
    if not vs:
        return None
    return math.exp(sum(math.log(v) for v in vs) / len(vs))


def json_safe(x):
    """NaN/Inf -> None (strict JSON), recursively."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def cell_tflops(cell: dict, system: str) -> Optional[float]:
    return (cell["systems"].get(system) or {}).get("tflops")


def write_markdown(path: str, meta: dict, cells: List[dict], small: List[dict], anchors: dict,
                   plots: List[str], serving_lines: Optional[List[str]] = None,
                   fp8_lines: Optional[List[str]] = None) -> None:
    have_fa3 = any(cell_tflops(c, "fa3") is not None for c in cells)
    L = []
    L.append("# FlashCore performance report\n")
    L.append(f"- GPU: {meta['gpu']} ({meta['sms']} SMs, L2 {meta['l2_mib']:.0f} MiB)")
    L.append(f"- PyTorch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}; FlashCore {meta['flashcore']}")
    if cells:
        L.append(f"- FA3: {'measured (flash_attn_interface)' if have_fa3 else 'not importable here; column FA3 (anchor) is from the anchor file'}")
    L.append(f"- Anchors: {anchors.get('path') or 'not found'} ({anchors.get('machine') or ''})")
    L.append(f"- Method: {meta['method']}")
    if not meta.get("interleave"):
        L.append("- Clocks are not locked: under the 700 W cap the SM clock moves by up to 25% within tens of "
                 "milliseconds, and each system's block of replays runs at a clock set partly by the system before it, "
                 "so a single cell's ratio can carry a clock difference of several percent (docs/decisions.md#interleave). "
                 "`--interleave` times the systems at one clock; `bench/power_diag.py --cells grid` at each one's own "
                 "sustained power.")
    L.append(f"- Run time: {meta['elapsed_s']:.0f} s; date {meta['date']}\n")

    for dt in meta["dtypes"]:
        rows = [c for c in cells if c["dtype"] == dt]
        if not rows:
            continue
        L.append(f"## {dt}: TFLOPS per system\n")
        hdr = ["D", "mask", "S", "B×H", "FlashCore", "cuDNN", "FA2"]
        if have_fa3:
            hdr.append("FA3")
        hdr += ["FA3 (anchor)", "FC / FA3 (anchor)", "FC / cuDNN", "FC / FA2", "FC max err", "cuDNN / anchor cuDNN"]
        have_default = any(cell_tflops(c, "flashcore_default") is not None for c in rows)
        if have_fa3:
            hdr.append("FC / FA3")
        if have_default:
            hdr += ["FC default", "FC / default"]
        hdr.append("FC config")
        L.append("| " + " | ".join(hdr) + " |")
        L.append("|" + "---|" * len(hdr))
        for c in rows:
            fc = cell_tflops(c, "flashcore")
            a = anchors["grid"].get((dt, c["D"], c["S"], c["causal"]), {})
            vals = [str(c["D"]), "causal" if c["causal"] else "none", str(c["S"]), f"{c['B']}×{c['H']}",
                    fmt(fc), fmt(cell_tflops(c, "cudnn")), fmt(cell_tflops(c, "fa2"))]
            if have_fa3:
                vals.append(fmt(cell_tflops(c, "fa3")))
            vals += [fmt(a.get("fa3")), fmt(ratio(fc, a.get("fa3")), "{:.2f}"),
                     fmt(ratio(fc, cell_tflops(c, "cudnn")), "{:.2f}"), fmt(ratio(fc, cell_tflops(c, "fa2")), "{:.2f}"),
                     ("non-finite" if c.get("flashcore_finite") is False else fmt(c.get("flashcore_max_err"), "{:.1e}")),
                     fmt(ratio(cell_tflops(c, "cudnn"), a.get("cudnn")), "{:.2f}")]
            if have_fa3:
                vals.append(fmt(ratio(fc, cell_tflops(c, "fa3")), "{:.2f}"))
            if have_default:
                dflt = cell_tflops(c, "flashcore_default")
                vals += [fmt(dflt), fmt(ratio(fc, dflt), "{:.3f}")]
            vals.append((c["systems"].get("flashcore") or {}).get("config") or "")
            L.append("| " + " | ".join(vals) + " |")
        L.append("")
        gm = {
            "FC / FA3 (anchor)": geomean([ratio(cell_tflops(c, "flashcore"),
                                                anchors["grid"].get((dt, c["D"], c["S"], c["causal"]), {}).get("fa3"))
                                          for c in rows]),
            "FC / cuDNN": geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, "cudnn")) for c in rows]),
            "FC / FA2": geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, "fa2")) for c in rows]),
            "FC / FA3 (same run)": geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, "fa3")) for c in rows]),
            "FC / best of FA3 and cuDNN (same run)": geomean(
                [ratio(cell_tflops(c, "flashcore"), max([t for t in (cell_tflops(c, "fa3"), cell_tflops(c, "cudnn"))
                                                         if t is not None], default=None)) for c in rows]),
            "FC tuned / FC default": geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, "flashcore_default"))
                                              for c in rows]),
            "cuDNN here / cuDNN anchor (machine factor)": geomean(
                [ratio(cell_tflops(c, "cudnn"), anchors["grid"].get((dt, c["D"], c["S"], c["causal"]), {}).get("cudnn"))
                 for c in rows]),
        }
        L.append("Geometric means over the cells: " + "; ".join(f"{k} {fmt(v, '{:.2f}')}" for k, v in gm.items()) + "\n")
        errs = sorted({f"{s}: {r['error']}" for c in rows for s, r in c["systems"].items() if r.get("error")})
        if errs:
            L.append("<details><summary>errors (null cells)</summary>\n")
            for e in errs[:40]:
                L.append(f"- {e}")
            L.append("\n</details>\n")

        named = [n for n in meta.get("systems", []) if n.startswith("flashcore@")]
        if named:  # --systems flashcore@CONFIG: each named config beside the library's own choice
            L.append(f"### {dt}: named kernel configs, TFLOPS (and / FlashCore's own choice)\n")
            L.append("| D | mask | S | FlashCore (config) | " + " | ".join(n.split("@", 1)[1] for n in named) + " |")
            L.append("|---|---|---|---|" + "---|" * len(named))
            for c in rows:
                fc = cell_tflops(c, "flashcore")
                own = (c["systems"].get("flashcore") or {}).get("config") or ""
                L.append(f"| {c['D']} | {'causal' if c['causal'] else 'none'} | {c['S']} | {fmt(fc)} ({own}) | " +
                         " | ".join(f"{fmt(cell_tflops(c, n))} ({fmt(ratio(cell_tflops(c, n), fc), '{:.3f}')})"
                                    for n in named) + " |")
            L.append("")

        # Compact matrix like the anchor README: FlashCore TFLOPS / FA3 anchor.
        L.append(f"### {dt}: FlashCore / FA3 (anchor), TFLOPS by seqlen\n")
        seqs = sorted({c["S"] for c in rows})
        L.append("| head dim | mask | " + " | ".join(str(s) for s in seqs) + " |")
        L.append("|---|---|" + "---|" * len(seqs))
        for D in sorted({c["D"] for c in rows}):
            for causal in (False, True):
                line = [str(D), "causal" if causal else "none"]
                for s in seqs:
                    c = next((x for x in rows if x["D"] == D and x["S"] == s and x["causal"] == causal), None)
                    a = anchors["grid"].get((dt, D, s, causal), {}).get("fa3")
                    line.append(f"{fmt(cell_tflops(c, 'flashcore') if c else None)}/{fmt(a)}")
                L.append("| " + " | ".join(line) + " |")
        L.append("")

    if small:
        # Every system measured in this run (FA3 and a --lib-b library included), then the anchor file's figures.
        measured = [n for n in ("flashcore", "flashcore_b", "cudnn", "fa2", "fa3")
                    if any(n in c["systems"] for c in small)]
        labels = {"flashcore": "FlashCore", "flashcore_b": "FlashCore B", "cudnn": "cuDNN", "fa2": "FA2", "fa3": "FA3"}
        L.append("## Small shapes: kernel time per call (CUDA graph), microseconds\n")
        L.append("| shape (B,H,S,D) | dtype | mask | " + " | ".join(labels[n] for n in measured) +
                 " | FlashCore / best other | FA3 (anchor) | cuDNN (anchor) | FA2 (anchor) | FC config |")
        L.append("|---|---|---|" + "---|" * (len(measured) + 5))
        for c in small:
            a = anchors["small"].get((c["B"], c["H"], c["S"], c["D"], c["causal"]), {})
            us = {s: (r.get("median_ms") * 1e3 if r.get("median_ms") else None) for s, r in c["systems"].items()}
            others = [us[n] for n in ("cudnn", "fa2", "fa3") if us.get(n)]
            lead = min(others) / us["flashcore"] if others and us.get("flashcore") else None
            L.append(f"| {c['B']},{c['H']},{c['S']},{c['D']} | {c['dtype']} | {'causal' if c['causal'] else 'none'} | " +
                     " | ".join(fmt(us.get(n), '{:.1f}') for n in measured) + f" | {fmt(lead, '{:.2f}')} | "
                     f"{fmt(a.get('fa3'), '{:.1f}')} | {fmt(a.get('cudnn'), '{:.1f}')} | {fmt(a.get('fa2'), '{:.1f}')} | "
                     f"{c['systems'].get('flashcore', {}).get('config') or '—'} |")
        L.append("\n(anchor small shapes were measured in fp16.)\n")

    if serving_lines:
        L += serving_lines

    if fp8_lines:
        L += fp8_lines

    if plots:
        L.append("## Plots\n")
        for p in plots:
            L.append(f"![{p}]({p})")
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def make_plots(out_dir: str, cells: List[dict], anchors: dict, dtypes: List[str]) -> List[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        log(f"report: no plots ({short_error(e)})")
        return []
    files = []
    styles = {"flashcore": ("tab:red", "o"), "cudnn": ("tab:blue", "s"), "fa2": ("tab:green", "^"),
              "fa3": ("tab:purple", "D")}
    for dt in dtypes:
        for D in GRID_D:
            for causal in (False, True):
                rows = sorted([c for c in cells if c["dtype"] == dt and c["D"] == D and c["causal"] == causal],
                              key=lambda c: c["S"])
                if not rows:
                    continue
                fig, ax = plt.subplots(figsize=(6.4, 4.2))
                xs = [c["S"] for c in rows]
                for sysname, (color, marker) in styles.items():
                    ys = [cell_tflops(c, sysname) for c in rows]
                    if all(y is None for y in ys):
                        continue
                    ax.plot(xs, [y if y is not None else float("nan") for y in ys], color=color, marker=marker,
                            label=LABELS[sysname], linewidth=2.2 if sysname == "flashcore" else 1.4)
                ya = [anchors["grid"].get((dt, D, s, causal), {}).get("fa3") for s in xs]
                if any(y is not None for y in ya):
                    ax.plot(xs, [y if y is not None else float("nan") for y in ya], color="black", linestyle="--",
                            label=LABELS["fa3_anchor"], linewidth=1.2)
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs)
                ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in xs])
                ax.set_xlabel("sequence length (batch = 16384/S)")
                ax.set_ylabel("TFLOPS")
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.set_title(f"{dt}, head dim {D}, {'causal' if causal else 'no mask'}")
                ax.legend(loc="lower right", fontsize=8)
                name = f"tflops_{dt}_d{D}_{'causal' if causal else 'none'}.png"
                fig.tight_layout()
                fig.savefig(os.path.join(out_dir, name), dpi=110)
                plt.close(fig)
                files.append(name)
    return files


def make_serving_plots(out_dir: str, res: Optional[dict]) -> List[str]:
    """--serving: decode GB/s per row and system (dashed line: the HBM peak) and varlen TFLOPS per (head dim,
    mask) and system, as grouped bars."""
    if not res or not (res.get("decode") or res.get("varlen")):
        return []
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import to_rgba
    except Exception as e:  # noqa: BLE001
        log(f"report: no serving plots ({short_error(e)})")
        return []
    files = []
    missing = res.get("missing", {})

    def bars(ax, groups, series):
        """series: [(label, values per group (None: no bar), color, hatch)], side by side in each group."""
        width = 0.8 / max(len(series), 1)
        for j, (label, values, color, hatch) in enumerate(series):
            xs = [i + (j - (len(series) - 1) / 2) * width for i, v in enumerate(values) if v is not None]
            ax.bar(xs, [v for v in values if v is not None], width, label=label, edgecolor=color, linewidth=0.8,
                   facecolor=to_rgba(color, 0.35) if hatch else color, hatch=hatch)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups)

    rows = res.get("decode") or []
    systems = [s for s in SERVING_LABELS if any(r.get(f"{s}_GBps") for r in rows)]
    if systems:
        fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(rows) + 2.0), 4.2))
        bars(ax, [f"{r['B']}×{r['Sk'] // 1024}k" for r in rows],
             [(SERVING_LABELS[s], [r.get(f"{s}_GBps") for r in rows]) + SERVING_STYLES[s] for s in systems])
        top = max(r[f"{s}_GBps"] for r in rows for s in systems if r.get(f"{s}_GBps"))
        peak = res.get("peak_GBps")
        if peak is not None and math.isfinite(peak):
            ax.axhline(peak, color="black", linestyle="--", linewidth=1.2, label=f"HBM peak ({peak:.0f} GB/s)")
            top = max(top, peak)
        absent = [SERVING_LABELS.get(s, s) for s in missing.get("decode", {})]
        ax.set_xlabel("batch × cache length" + (f"\n(no figure: {', '.join(absent)})" if absent else ""))
        ax.set_ylabel("GB/s of K and V read")
        ax.set_ylim(0, top * 1.3)  # room for the legend
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"decode, bf16, head dim {res['head_dim']}, {res['heads'][0]}/{res['heads'][1]} heads, "
                     "one new token")
        ax.legend(loc="upper left", fontsize=8, ncol=3)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "serving_decode_gbps.png"), dpi=110)
        plt.close(fig)
        files.append("serving_decode_gbps.png")

    rows = res.get("varlen") or []
    series = [(label, [r.get(f"{s}_tflops") for r in rows], color, None)
              for s, label, color in (("flashcore", "FlashCore", "tab:red"), ("fa3", "FA3 (varlen)", "tab:purple"))
              if any(r.get(f"{s}_tflops") for r in rows)]
    if series:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        bars(ax, [f"d{r['D']} {'causal' if r['causal'] else 'full'}" for r in rows], series)
        absent = [{"flashcore": "FlashCore", "fa3": "FA3"}.get(s, s) for s in missing.get("varlen", {})]
        ax.set_xlabel("head dim, mask" + (f"\n(no figure: {', '.join(absent)})" if absent else ""))
        ax.set_ylabel("TFLOPS")
        ax.set_ylim(0, max(v for _, values, _, _ in series for v in values if v) * 1.25)  # room for the legend
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"variable-length prefill, bf16, batch {rows[0]['batch']} (anchor_serving.py lengths)")
        ax.legend(loc="upper left", fontsize=8, ncol=2)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "serving_varlen_tflops.png"), dpi=110)
        plt.close(fig)
        files.append("serving_varlen_tflops.png")
    return files


# ------------------------------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out"), help="output directory")
    ap.add_argument("--quick", action="store_true", help=f"subset: seqlens {QUICK_S}, every head dim and mask")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="both")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1,
                    help="the systems of a cell take turns this many times; medians over all their calls")
    ap.add_argument("--lib", default=None, help="libflashcore.so (default build/lib/libflashcore.so or $FLASHCORE_LIBRARY)")
    ap.add_argument("--lib-b", default=None, help="a second libflashcore.so, measured as system flashcore_b on the "
                    "same tensors, taking turns with the others (an A/B of two builds in one process)")
    ap.add_argument("--head-dims", default=None, help="comma list: only these head dims of the grid")
    ap.add_argument("--seqlens", default=None, help="comma list: only these sequence lengths of the grid")
    ap.add_argument("--masks", choices=["both", "none", "causal"], default="both", help="grid cells of this mask")
    ap.add_argument("--anchors", default=None, help="h200-anchors.json (default ../shared/anchors/)")
    ap.add_argument("--systems", default="flashcore,cudnn,fa2,fa3",
                    help="comma list of flashcore,cudnn,fa2,fa3,flashcore_default (the built-in default configs, "
                         "to measure a tuning table),flashcore_b (--lib-b), flashcore@CONFIG (a named kernel config of "
                         "`flashcore list-configs`, where it is compiled for the cell; null elsewhere)")
    ap.add_argument("--no-rotate", action="store_true", help="one buffer set (L2-warm)")
    ap.add_argument("--no-lse", action="store_true", help="FlashCore without the LSE output")
    ap.add_argument("--no-verify", dest="verify", action="store_false", help="skip the FlashCore error check")
    ap.add_argument("--no-small", dest="small", action="store_false",
                    help="skip the small-shape CUDA-graph table")
    ap.add_argument("--graph-calls", type=int, default=20, help="calls per CUDA graph (small shapes)")
    ap.add_argument("--small-shapes", default=None,
                    help="the small-shape table's shapes instead of the anchor file's: B,H,S,D[;B,H,S,D...] "
                         "(e.g. to time a dispatch rule's cells with every system, graph-timed)")
    ap.add_argument("--timing", choices=["graph", "eager"], default="graph",
                    help="grid and FP8 cells: graph (default) times CUDA-graph replays of --grid-graph-calls calls, "
                         "so that no system's host time per call counts; eager times back-to-back calls with CUDA "
                         "events (a Python wrapper slower than its kernel is then measured instead of the kernel)")
    ap.add_argument("--grid-graph-calls", type=int, default=10, help="calls per CUDA graph on grid and FP8 cells")
    ap.add_argument("--interleave", action="store_true",
                    help="graph-timed grid and FP8 cells: capture every system's graph first, then let the systems "
                         "take turns replay by replay, so that all see the same SM clock (kernel efficiency at one "
                         "clock). The default times each system's replays in one block per round; under the 700 W cap "
                         "each block then runs at a clock set partly by its own power (docs/decisions.md#interleave)")
    ap.add_argument("--no-plots", dest="plots", action="store_false")
    ap.add_argument("--serving", action="store_true",
                    help="after the grid, also measure bench/serving.py's tables in this process (needs its imports: "
                         "PyTorch and python/flashcore; FA3 columns when flash_attn_interface has "
                         "flash_attn_with_kvcache / flash_attn_varlen_func) and add a Serving section, plots and "
                         "metrics.json 'serving'; FA3 and cuDNN follow --systems")
    ap.add_argument("--serving-tables", default=",".join(SERVING_TABLES),
                    help=f"with --serving: comma list of {', '.join(SERVING_TABLES)}")
    ap.add_argument("--serving-head-dim", type=int, default=128, help="with --serving: decode head dim")
    ap.add_argument("--serving-heads", default="32,8", help="with --serving: decode query heads, KV heads")
    ap.add_argument("--fp8", action="store_true",
                    help="also measure the FP8 section: FlashCore e4m3 (pre-quantized inputs, descales per (batch, KV "
                         "head)), FlashCore precision=fp8 from bf16 (quantization timed) and FA3 FP8 (when "
                         "flash_attn_interface imports and fa3 is in --systems) on the grid's head dims and seqlens "
                         "(--quick: its seqlens), both masks; then an accuracy table (seqlen 8k, N(0,1) and outlier "
                         "inputs, against float64 attention of the unquantized inputs). Needs the sm90 backend and a "
                         "library with e4m3 kernels; metrics.json 'fp8'")
    ap.add_argument("--no-grid", dest="grid", action="store_false",
                    help="skip the bf16/fp16 grid and the small shapes (to run --fp8 or --serving alone)")
    args = ap.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.systems if s not in SYSTEMS and not s.startswith("flashcore@")]
    if bad:
        ap.error(f"unknown system(s) {bad}; expected {SYSTEMS}")
    if args.iters < 1 or args.warmup < 0:
        ap.error("--iters >= 1 and --warmup >= 0")
    args.serving_tables = [t.strip() for t in args.serving_tables.split(",") if t.strip()]
    bad = [t for t in args.serving_tables if t not in SERVING_TABLES]
    if bad or not args.serving_tables:
        ap.error(f"--serving-tables: unknown {bad} (choose from {', '.join(SERVING_TABLES)})")
    try:
        heads = [int(x) for x in args.serving_heads.split(",")]
        if len(heads) != 2 or min(heads) < 1:
            raise ValueError
    except ValueError:
        ap.error(f"--serving-heads: expected HQ,HKV (positive integers), got {args.serving_heads!r}")
    args.serving_heads = heads

    t_start = time.time()
    import torch
    if not torch.cuda.is_available():
        log("report: no CUDA device")
        return 3
    os.makedirs(args.out, exist_ok=True)

    anchors = load_anchors(find_anchors(args.anchors))
    if not anchors["path"]:
        log("report: anchor file not found (use --anchors): the FA3 (anchor) column will be empty")

    fc = None
    fc_version = "not loaded"
    if "flashcore" in args.systems or "flashcore_default" in args.systems:
        try:
            from flashcore_ctypes import FlashCoreLib
            fc = FlashCoreLib(args.lib)
            fc_version = f"{fc.version()} ({fc.path})"
        except Exception as e:  # noqa: BLE001
            log(f"report: FlashCore not loaded: {short_error(e)}")
            fc_version = f"not loaded: {short_error(e)}"
    fa3 = None
    if "fa3" in args.systems:
        try:
            import flash_attn_interface as fa3  # type: ignore
        except Exception as e:  # noqa: BLE001
            log(f"report: FA3 not importable ({short_error(e)}); showing FA3 (anchor)")
            fa3 = None

    props = torch.cuda.get_device_properties(0)
    fc_b = None
    if "flashcore_b" in args.systems:
        from flashcore_ctypes import FlashCoreLib
        if not args.lib_b:
            ap.error("system flashcore_b needs --lib-b")
        fc_b = FlashCoreLib(args.lib_b)
        fc_version += f"; B: {fc_b.version()} ({fc_b.path})"
    runner = Runner(args, torch, fc, fa3, fc_b)
    dtypes = ["bf16", "fp16"] if args.dtype == "both" else [args.dtype]
    seqs = QUICK_S if args.quick else GRID_S
    head_dims = [int(x) for x in args.head_dims.split(",")] if args.head_dims else GRID_D
    if args.seqlens:
        seqs = [int(x) for x in args.seqlens.split(",")]
    masks = {"both": (False, True), "none": (False,), "causal": (True,)}[args.masks]
    todo = [(dt, D, S, causal) for dt in dtypes for D in head_dims for S in seqs for causal in masks]
    timing = (f"CUDA graphs of {args.grid_graph_calls} calls (at least one per buffer set), replayed until "
              f"{args.iters} calls ran (at least 3 replays), median of the per-call times of the replays"
              if args.timing == "graph" else
              f"median of {args.iters} CUDA-event-timed calls after {args.warmup} warm-up calls")
    turns = (f", systems taking turns {args.rounds} times per cell, in reverse order every other turn (median over "
             "all calls)") if args.rounds > 1 else ""
    if args.timing == "graph" and args.interleave:
        turns = (f", every system's graph captured first, then the systems taking turns replay by replay "
                 f"({args.rounds} x the replays), in reverse order every other replay (median over all calls)")
    meta = {
        "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
        "l2_mib": runner.l2 / 2**20, "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "flashcore": fc_version, "python": platform.python_version(),
        "dtypes": dtypes, "iters": args.iters, "warmup": args.warmup, "rounds": args.rounds, "timing": args.timing,
        "interleave": args.interleave, "systems": args.systems,
        "rotate": not args.no_rotate,
        "method": (f"forward; batch = 16384/S, heads = 2048/D; torch.randn inputs (B,H,S,D), same tensors for all "
                   f"systems; {timing}"
                   f"{turns}; "
                   f"{'one buffer set' if args.no_rotate else 'buffer sets rotated, > 2x L2 per cycle'}; "
                   "TFLOPS = 4*B*H*S*S*D/t, halved for causal"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }

    cells: List[dict] = []
    small: List[dict] = []
    status = 0
    if not args.grid:
        todo, args.small = [], False
    try:
        for n, (dt, D, S, causal) in enumerate(todo):
            B, H = 16384 // S, 2048 // D
            log(f"[{n + 1}/{len(todo)}] {dt} D={D} S={S} B={B} H={H} causal={int(causal)}")
            cell = runner.run_cell(B, H, S, D, dt, causal, seed=n)
            cells.append(cell)
            parts = [f"{s}={fmt(r.get('tflops'))}" for s, r in cell["systems"].items()]
            if "flashcore_max_err" in cell:
                parts.append(f"fc_err={cell['flashcore_max_err']:.1e}")
            log("    " + " ".join(parts))
        if args.small:
            for tag, B, H, S, D in small_shapes(args.small_shapes):
                for causal in (False, True):
                    log(f"[small] {tag} {B},{H},{S},{D} causal={int(causal)} (graph of {args.graph_calls})")
                    cell = runner.run_cell(B, H, S, D, "fp16", causal, graph=True, seed=1000 + len(small))
                    cell["tag"] = tag
                    small.append(cell)
    except KeyboardInterrupt:
        log("report: interrupted; writing what was measured")
        status = 130
    except Exception as e:  # noqa: BLE001 - e.g. a sticky CUDA error: keep what was measured
        log(f"report: stopped early: {short_error(e)}")
        traceback.print_exc()
        status = 1
    serving_res = None
    if args.serving:
        if status == 0:
            serving_res, status = run_serving(args, torch, fc)
        else:
            serving_res = {"tables": args.serving_tables, "decode": [], "varlen": [],
                           "skipped": "the grid stopped early"}
    fp8_res = None
    if args.fp8:
        if status == 0:
            fp8_res, status = run_fp8(args, runner)
        else:
            fp8_res = {"cells": [], "accuracy": [], "skipped": "the measurements before it stopped early"}
    meta["elapsed_s"] = time.time() - t_start

    plots = make_plots(args.out, cells, anchors, dtypes) if args.plots else []
    if args.plots:
        plots += make_serving_plots(args.out, serving_res)
    metrics = {"meta": meta, "anchors_file": anchors["path"], "cells": [], "small_shapes": small}
    if serving_res is not None:
        metrics["serving"] = serving_res
    if fp8_res is not None:
        metrics["fp8"] = fp8_res
    for c in cells:
        a = anchors["grid"].get((c["dtype"], c["D"], c["S"], c["causal"]), {})
        fc_t = cell_tflops(c, "flashcore")
        c = dict(c)
        c["anchor"] = a
        c["ratios"] = {"fc_over_fa3_anchor": ratio(fc_t, a.get("fa3")),
                       "fc_over_cudnn": ratio(fc_t, cell_tflops(c, "cudnn")),
                       "fc_over_fa2": ratio(fc_t, cell_tflops(c, "fa2")),
                       "fc_over_fa3": ratio(fc_t, cell_tflops(c, "fa3"))}
        metrics["cells"].append(c)
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(json_safe(metrics), f, indent=1, allow_nan=False, default=str)
    write_markdown(os.path.join(args.out, "performance_report.md"), meta, cells, small, anchors, plots,
                   serving_markdown(serving_res) if serving_res is not None else None,
                   fp8_markdown(fp8_res) if fp8_res is not None else None)
    log(f"report: wrote {args.out}/performance_report.md, metrics.json, {len(plots)} plot(s) "
        f"in {meta['elapsed_s']:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())

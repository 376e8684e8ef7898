#!/usr/bin/env python3
"""FlashCore's backward pass against cuDNN and FlashAttention-2 (both through PyTorch SDPA) and FlashAttention-3 (the
`train/` build), on the forward report's 72-cell grid, every system in this process on the same tensors.

Runs on the GPU machine (Python 3.12, PyTorch with CUDA). FlashCore is called through its C ABI with ctypes
(bench/flashcore_ctypes.py: flashcore_attention_forward once, then flashcore_attention_backward), no Python package
needed. FA3 is measured when `flash_attn_interface` imports and has the backward (../shared/fa3/train: bf16, head dims
64 and 128 only; its other cells say so); put it on PYTHONPATH:

    echo /.fa3/ >> .git/info/exclude; rm -rf .fa3 && cp -r ../shared/fa3/train .fa3    # once, then carry .fa3
    PYTHONPATH=$PWD/.fa3 python3 bench/backward.py --out bench/out/backward           # the grid, bf16 and fp16
    PYTHONPATH=$PWD/.fa3 python3 bench/backward.py --quick --dtype bf16               # a few cells, a smoke run
    python3 bench/backward.py --head-dims 128 --seqlens 4096 --masks causal --rounds 5 --deterministic

Grid (report.py's): dtype bf16 / fp16 x head dim 64 / 128 / 256 x causal or not x seqlen 512..16k, batch = 16384 / S,
heads = 2048 / D (hidden 2048), (B, H, S, D) tensors for SDPA and FlashCore (the same tensors), (B, S, H, D) copies for
FA3. Cells a system cannot run (a head dim its backward lacks: the portable backend above 128, FA2 with --head-dim-v)
are listed with the library's message, not dropped. --head-dims takes 96 and 192 too, and --head-dim-v gives V (and
O, dO, dV) a head dim of its own (--head-dims 192 --head-dim-v 128: MLA).

Method: each system runs its forward once with the autograd graph kept (FlashCore: the forward once, O and LSE kept),
then only the backward is timed: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) for SDPA and FA3, the
raw flashcore_attention_backward call for FlashCore (gradients and workspace allocated once). After --warmup calls
each, the systems take turns call by call, each call between two CUDA events, --rounds rounds in reverse order every
other round, --iters calls per system in all; before each round the GPU is held by a --sleep-ms kernel while the host
enqueues the round, so that the host's time per call (autograd, Python, ctypes) stays off the GPU's timeline. Median
per system. Inputs: one buffer set per cell is more than 2x the L2 cache at every grid cell (Q, K, V, O, dO, dQ, dK,
dV are 64 MiB each); smaller cells get more sets, rotated. TFLOPS as FlashAttention counts them: the backward does
2.5x the forward's FLOPs, 2.5 * 4*B*H*S*S*D / t, halved for causal. FlashCore's dQ, dK, dV are compared with the first
anchor's that ran (FA2, cuDNN, FA3): max |FC - anchor| / max |anchor|, the larger of the three.

Peak extra memory (--memory DTYPE:D:S:CAUSAL, default bf16:128:8192:1, "none" to skip): for each system alone, after its
forward, torch.cuda.max_memory_allocated() during one backward minus memory_allocated() before it: the gradients,
workspaces and temporaries the backward adds (FlashCore: dQ, dK, dV and its workspace, allocated through PyTorch).

Writes OUT/backward_report.md and OUT/backward_metrics.json. A system that fails on a cell records null there (with
the error in the JSON and the report), never a crash.

The backward of the attention variants (issue #72: a sliding window of 4096 keys at S = 8k and 16k, softcap 50; bf16,
d128, 32 query / 8 KV heads, batch x S = 32k; FlashCore with ABI 0.6, FA3's train build, FlexAttention compiled) is
measured by bench/variants.py --backward, with this file's method (the backward alone after one forward, the systems
interleaved call by call, CUDA events, medians) and FLOP factor (BWD_FLOP_FACTOR) on each call's visible pairs:

    PYTHONPATH=$PWD/.fa3 python3 bench/variants.py --backward --json bench/out/variants_backward.json
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
from typing import Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from report import GRID_D, GRID_S, QUICK_S, fmt, geomean, json_safe, log, ratio, short_error  # noqa: E402

SYSTEMS = ["flashcore", "cudnn", "fa2", "fa3", "flashcore_b"]
ANCHORS = ["cudnn", "fa2", "fa3"]
LABELS = {"flashcore": "FlashCore", "cudnn": "cuDNN (SDPA)", "fa2": "FA2 (SDPA)", "fa3": "FA3", "flashcore_b": "FlashCore B"}
BWD_FLOP_FACTOR = 2.5     # backward FLOPs per forward FLOP (FlashAttention's count: 5 GEMMs against the forward's 2)
FWDBWD_FLOP_FACTOR = 3.5  # forward + backward
FA3_TRAIN_DTYPES = ("bf16",)
FA3_TRAIN_HEAD_DIMS = (64, 128)


# ------------------------------------------------------------------------------------------------------
# FLOPs (pure)

def visible_pairs(sq: int, sk: int, causal: bool) -> float:
    """(query, key) pairs computed, as `flashcore bench` counts them: Sq*Sk; causal with Sq == Sk: S*S/2 (the anchors'
    rule); causal with Sq != Sk: the exact count of the bottom-right aligned mask."""
    if not causal:
        return float(sq) * sk
    if sq == sk:
        return float(sq) * sk / 2
    off = sk - sq
    return float(sum(min(max(i + off + 1, 0), sk) for i in range(sq)))


def forward_flops(B: int, H: int, S: int, D: int, causal: bool, Sk: Optional[int] = None) -> float:
    """4 * B * H * D * visible pairs (H: query heads)."""
    return 4.0 * B * H * D * visible_pairs(S, S if Sk is None else Sk, causal)


def backward_flops(B: int, H: int, S: int, D: int, causal: bool, Sk: Optional[int] = None) -> float:
    return BWD_FLOP_FACTOR * forward_flops(B, H, S, D, causal, Sk)


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    if ms is None or not ms > 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def grid_cells(dtypes: List[str], head_dims: List[int], seqlens: List[int], masks: Tuple[bool, ...]) -> List[tuple]:
    """(dtype, D, S, causal, B, H) of the grid: batch = 16384 // S, heads = 2048 // D."""
    return [(dt, D, S, c, 16384 // S, 2048 // D) for dt in dtypes for D in head_dims for S in seqlens for c in masks]


def fa3_lacks(dtype: str, D: int) -> Optional[str]:
    """Why the FA3 train build has no backward for the cell, or None."""
    if dtype not in FA3_TRAIN_DTYPES or D not in FA3_TRAIN_HEAD_DIMS:
        return "not in the FA3 train build (bf16, head dims 64 / 128)"
    return None


def cell_tflops(cell: dict, system: str) -> Optional[float]:
    return (cell.get("systems", {}).get(system) or {}).get("tflops")


def best_anchor(cell: dict) -> Tuple[Optional[str], Optional[float]]:
    """The fastest anchor (cuDNN, FA2, FA3) that ran on the cell: (name, TFLOPS), or (None, None)."""
    ran = [(cell_tflops(cell, s), s) for s in ANCHORS if cell_tflops(cell, s) is not None]
    if not ran:
        return None, None
    t, s = max(ran)
    return s, t


def fc_cannot_run(cell: dict) -> Optional[str]:
    """The reason FlashCore could not run the cell (the library refused it), or None."""
    return cell.get("fc_unsupported")


# ------------------------------------------------------------------------------------------------------
# Markdown (pure)

def mask_word(causal: bool) -> str:
    return "causal" if causal else "none"


def cell_table(cells: List[dict], dtype: str) -> List[str]:
    """The per-cell TFLOPS table of one dtype (markdown lines)."""
    rows = [c for c in cells if c["dtype"] == dtype]
    if not rows:
        return []
    have_fa3 = any(cell_tflops(c, "fa3") is not None for c in rows)
    hdr = ["D", "mask", "S", "B×H", "FlashCore", "cuDNN", "FA2"] + (["FA3"] if have_fa3 else []) + \
          ["best anchor", "FC / best", "FC / cuDNN", "FC / FA2"] + (["FC / FA3"] if have_fa3 else []) + \
          ["FC grad err"]
    L = [f"## {dtype}: backward TFLOPS per system\n", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for c in rows:
        fc = cell_tflops(c, "flashcore")
        best_name, best = best_anchor(c)
        fc_text = "cannot run" if fc_cannot_run(c) else fmt(fc)
        d_text = str(c["D"]) + (f" / {c['Dv']}" if c.get("Dv") else "")  # (head_dim, head_dim_v)
        vals = [d_text, mask_word(c["causal"]), str(c["S"]), f"{c['B']}×{c['H']}", fc_text,
                fmt(cell_tflops(c, "cudnn")), fmt(cell_tflops(c, "fa2"))]
        if have_fa3:
            vals.append(fmt(cell_tflops(c, "fa3")))
        vals += [f"{fmt(best)} ({LABELS[best_name].split(' ')[0]})" if best_name else "—",
                 fmt(ratio(fc, best), "{:.2f}"), fmt(ratio(fc, cell_tflops(c, "cudnn")), "{:.2f}"),
                 fmt(ratio(fc, cell_tflops(c, "fa2")), "{:.2f}")]
        if have_fa3:
            vals.append(fmt(ratio(fc, cell_tflops(c, "fa3")), "{:.2f}"))
        err = c.get("fc_grad_err")
        vals.append("non-finite" if c.get("fc_finite") is False else fmt(err, "{:.1e}"))
        L.append("| " + " | ".join(vals) + " |")
    L.append("")
    return L


def geomean_table(cells: List[dict]) -> List[str]:
    """Geometric means of FlashCore's ratios per (dtype, head dim, mask), over the cells where both ran."""
    groups = sorted({(c["dtype"], c["D"], c["causal"]) for c in cells}, key=lambda g: (g[0], g[1], g[2]))
    L = ["## Geometric means per dtype, head dim and mask\n",
         "Over the cells where FlashCore and the system both ran (cells: FlashCore's cells of the group).\n",
         "| dtype | D | mask | cells | FC / best anchor | FC / cuDNN | FC / FA2 | FC / FA3 | cells FC ≥ best |",
         "|---|---|---|---|---|---|---|---|---|"]
    for dt, D, causal in groups:
        rows = [c for c in cells if (c["dtype"], c["D"], c["causal"]) == (dt, D, causal)]
        ran = [c for c in rows if cell_tflops(c, "flashcore") is not None]
        if not ran:
            why = next((fc_cannot_run(c) for c in rows if fc_cannot_run(c)), None)
            L.append(f"| {dt} | {D} | {mask_word(causal)} | 0 | " + ("FlashCore cannot run these cells" if why else "—")
                     + " | — | — | — | — |")
            continue
        best = [ratio(cell_tflops(c, "flashcore"), best_anchor(c)[1]) for c in ran]
        ahead = sum(1 for r in best if r is not None and r >= 1.0)
        vals = [geomean(best)] + [geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, s)) for c in ran])
                                  for s in ANCHORS]
        L.append(f"| {dt} | {D} | {mask_word(causal)} | {len(ran)} | " + " | ".join(fmt(v, "{:.2f}") for v in vals)
                 + f" | {ahead} of {sum(1 for r in best if r is not None)} |")
    L.append("")
    overall = geomean([ratio(cell_tflops(c, "flashcore"), best_anchor(c)[1]) for c in cells])
    L.append(f"Over every cell FlashCore ran: FC / best anchor {fmt(overall, '{:.2f}')}.\n")
    return L


def unsupported_lines(cells: List[dict]) -> List[str]:
    """The cells FlashCore cannot run, grouped by (dtype, D, mask), with the library's reason."""
    bad = [c for c in cells if fc_cannot_run(c)]
    if not bad:
        return []
    L = ["## Cells FlashCore cannot run\n",
         "The library refused these cells (FlashCore's v1 backward: head dims 64 and 128); the anchors ran them.\n"]
    groups: Dict[tuple, List[dict]] = {}
    for c in bad:
        groups.setdefault((c["dtype"], c["D"], c["causal"]), []).append(c)
    for (dt, D, causal), rows in sorted(groups.items()):
        seqs = ", ".join(str(c["S"]) for c in sorted(rows, key=lambda c: c["S"]))
        L.append(f"- {dt} d{D} {mask_word(causal)}, S = {seqs}: {rows[0]['fc_unsupported']}")
    L.append("")
    return L


def memory_lines(mem: Optional[dict]) -> List[str]:
    if not mem:
        return []
    L = [f"## Peak extra memory of one backward ({mem['dtype']}, B={mem['B']} H={mem['H']} S={mem['S']} D={mem['D']}, "
         f"{mask_word(mem['causal'])})\n",
         "torch.cuda.max_memory_allocated() during one backward minus memory_allocated() before it, each system alone "
         "after its forward: gradients, workspaces and temporaries. dQ, dK, dV alone are "
         f"{mem['gradients_mib']:.0f} MiB.\n",
         "| system | peak extra MiB | / gradients | note |", "|---|---|---|---|"]
    for name in SYSTEMS:
        rec = mem.get("systems", {}).get(name)
        if rec is None:
            continue
        extra = rec.get("extra_mib")
        note = rec.get("error") or rec.get("note") or ""
        L.append(f"| {LABELS[name]} | {fmt(extra, '{:.0f}')} | {fmt(ratio(extra, mem['gradients_mib']), '{:.2f}')} | "
                 f"{note} |")
    L.append("")
    return L


def errors_lines(cells: List[dict]) -> List[str]:
    errs = sorted({f"{LABELS.get(s, s)}: {r['error']}" for c in cells for s, r in c.get("systems", {}).items()
                   if r.get("error") and not r.get("not_applicable")}
                  | {f"cell {c['dtype']} d{c['D']} S={c['S']}: {c['error']}" for c in cells if c.get("error")})
    if not errs:
        return []
    return ["<details><summary>errors (— cells)</summary>\n"] + [f"- {e}" for e in errs[:40]] + ["\n</details>\n"]


def markdown(meta: dict, cells: List[dict], mem: Optional[dict]) -> str:
    L = ["# FlashCore backward pass report\n",
         f"- GPU: {meta['gpu']} ({meta['sms']} SMs, L2 {meta['l2_mib']:.0f} MiB)",
         f"- PyTorch {meta['torch']}, CUDA {meta['cuda']}, cuDNN {meta['cudnn']}; FlashCore {meta['flashcore']}",
         f"- FA3: {meta['fa3']}",
         f"- Method: {meta['method']}",
         f"- Run time: {meta['elapsed_s']:.0f} s; date {meta['date']}\n"]
    for dt in meta["dtypes"]:
        L += cell_table(cells, dt)
    if cells:
        L += geomean_table(cells)
    L += unsupported_lines(cells)
    L += memory_lines(mem)
    L += errors_lines(cells)
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------------
# Measurement (GPU)

def rel_max_err(a, b) -> float:
    """max |a - b| / max |b| in float64; inf when a is not finite."""
    if not bool(a.isfinite().all().item()):
        return float("inf")
    b = b.double()
    den = b.abs().max().item()
    return (a.double() - b).abs().max().item() / (den if den > 0 else 1.0)


class Backward:
    """One system's backward on one buffer set: call() runs it once; grads() the last dQ, dK, dV as (B, H, S, D)."""

    def __init__(self, call: Callable[[], None], grads: Callable[[], tuple], keep: tuple = ()):
        self.call, self.grads, self.keep = call, grads, keep


class Runner:
    def __init__(self, args, torch, fc, fa3, fc_b=None):
        self.args, self.torch, self.fc, self.fa3 = args, torch, fc, fa3
        self.fc_b = fc_b  # --lib-b: a second FlashCore library, system "flashcore_b" (A/B in one process)
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.F, self.SDPBackend, self.sdpa_kernel = F, SDPBackend, sdpa_kernel
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)

    def make_sets(self, B, H, S, D, dtype, seed):
        """Sets of (q, k, v, dout), (B, H, S, D) with v and dout of --head-dim-v columns where it is set."""
        torch = self.torch
        Dv = self.args.head_dim_v or D
        elem = torch.tensor([], dtype=dtype).element_size()
        touched = 4 * B * H * S * (D + Dv) * elem  # Q, K, V, O, dO read; dQ, dK, dV written
        nsets = 1 if self.args.no_rotate else (2 * self.l2) // touched + 1
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        return [tuple(torch.randn(B, H, S, d, device="cuda", dtype=dtype, generator=gen) for d in (D, D, Dv, Dv))
                for _ in range(nsets)]

    def build(self, name, qkvd, causal) -> Backward:
        """The forward of `name` on one set (q, k, v, dout: (B, H, S, D)), graph kept; raises when unavailable."""
        torch = self.torch
        q, k, v, dout = qkvd
        if name in ("cudnn", "fa2"):
            be = self.SDPBackend.CUDNN_ATTENTION if name == "cudnn" else self.SDPBackend.FLASH_ATTENTION
            leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))  # the same storage: the same tensors
            with self.sdpa_kernel([be]):
                out = self.F.scaled_dot_product_attention(*leaves, is_causal=causal)
            box = {}

            def sdpa_call():
                with self.sdpa_kernel([be]):
                    box["g"] = torch.autograd.grad(out, leaves, dout, retain_graph=True)
            return Backward(sdpa_call, lambda: box["g"], (out, leaves))
        if name == "fa3":
            if self.fa3 is None:
                raise RuntimeError("flash_attn_interface not importable")
            leaves = tuple(t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
            dout_b = dout.transpose(1, 2).contiguous()
            out = self.fa3.flash_attn_func(*leaves, causal=causal, deterministic=self.args.deterministic)
            out = out[0] if isinstance(out, tuple) else out
            box = {}

            def fa3_call():
                box["g"] = torch.autograd.grad(out, leaves, dout_b, retain_graph=True)
            return Backward(fa3_call, lambda: tuple(g.transpose(1, 2) for g in box["g"]), (out, leaves, dout_b))
        if name in ("flashcore", "flashcore_b"):
            fc = self.fc_b if name == "flashcore_b" else self.fc
            if fc is None:
                raise RuntimeError("libflashcore.so not loaded" if name == "flashcore" else "no --lib-b library")
            B, H, S, _ = q.shape
            o = torch.full_like(dout, float("nan"))  # (v's head dim)
            lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
            stream = torch.cuda.current_stream().cuda_stream
            fc.forward(fc.params_for(q, k, v, o, lse=lse, causal=causal, bhsd=True), stream)
            grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))  # poisoned: unwritten shows as NaN
            params = fc.backward_params_for(q, k, v, o, lse, dout, *grads, causal=causal, bhsd=True,
                                            deterministic=self.args.deterministic)

            def fc_call():
                fc.backward(params, torch.cuda.current_stream().cuda_stream)
            return Backward(fc_call, lambda: grads, (o, lse, params))
        raise ValueError(name)

    def sleep(self):
        """Hold the GPU for --sleep-ms while the host enqueues a round (no-op where torch has no _sleep)."""
        if self.args.sleep_ms > 0 and hasattr(self.torch.cuda, "_sleep"):
            self.torch.cuda._sleep(int(self.args.sleep_ms * 2e6))  # cycles at ~2 GHz

    def run_cell(self, dtype_name, D, S, causal, B, H, seed) -> dict:
        torch = self.torch
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        cell = {"dtype": dtype_name, "D": D, "S": S, "causal": causal, "B": B, "H": H, "systems": {}}
        # (--head-dim-v: S = Q K^T over D, O = P V over Dv, as FlashAttention counts them: the mean head dim)
        Dv = self.args.head_dim_v or D
        if Dv != D:
            cell["Dv"] = Dv
        flops = backward_flops(B, H, S, (D + Dv) / 2, causal)
        try:
            sets = self.make_sets(B, H, S, D, dtype, seed)
        except Exception as e:  # noqa: BLE001
            cell["error"] = short_error(e)
            return cell
        cell["rotate_sets"] = len(sets)
        built: Dict[str, List[Backward]] = {}
        for name in self.args.systems:
            if name == "fa3" and fa3_lacks(dtype_name, D):
                cell["systems"][name] = {"error": fa3_lacks(dtype_name, D), "not_applicable": True, "tflops": None}
                continue
            try:
                built[name] = [self.build(name, st, causal) for st in sets]
                built[name][0].call()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a failing system records null
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    pass
                built.pop(name, None)
                msg = short_error(e)
                cell["systems"][name] = {"error": msg, "tflops": None}
                if name == "flashcore" and "UNSUPPORTED" in msg:  # the library refused the cell (head dim, dtype)
                    cell["fc_unsupported"] = msg
        # FlashCore's gradients against the first anchor that ran, on set 0.
        if self.args.verify and "flashcore" in built:
            ref = next((n for n in ("fa2", "cudnn", "fa3") if n in built), None)
            if ref is not None:
                fc_g, ref_g = built["flashcore"][0].grads(), built[ref][0].grads()
                errs = [rel_max_err(a, b) for a, b in zip(fc_g, ref_g)]
                cell["fc_finite"] = all(math.isfinite(e) for e in errs)
                cell["fc_grad_err"] = max(errs)
                cell["fc_grad_err_each"] = dict(zip(("dq", "dk", "dv"), errs))
                cell["fc_grad_err_vs"] = ref
        names = [n for n in self.args.systems if n in built]
        times: Dict[str, List[float]] = {n: [] for n in names}
        try:
            for i in range(self.args.warmup):
                for n in names:
                    built[n][i % len(sets)].call()
            torch.cuda.synchronize()
            rounds = max(1, self.args.rounds)
            per_round = max(1, -(-self.args.iters // rounds))
            calls = 0
            for r in range(rounds):
                order = names if r % 2 == 0 else names[::-1]
                events = []
                self.sleep()
                for i in range(per_round):
                    for n in order:
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        built[n][(calls + i) % len(sets)].call()
                        end.record()
                        events.append((n, start, end))
                calls += per_round
                torch.cuda.synchronize()
                for n, start, end in events:
                    times[n].append(start.elapsed_time(end))
        except Exception as e:  # noqa: BLE001 - e.g. a system failing mid-run: keep what the others measured
            cell["error"] = short_error(e)
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
        for n in names:
            med = statistics.median(times[n]) if times[n] else None
            cell["systems"][n] = {"error": None if med else cell.get("error"), "median_ms": med,
                                  "min_ms": min(times[n]) if times[n] else None, "calls": len(times[n]),
                                  "tflops": tflops(flops, med)}
        del built, sets
        if self.fc is not None:
            self.fc.release_workspaces()
        torch.cuda.empty_cache()
        return cell

    def memory(self, dtype_name, D, S, causal) -> dict:
        """Peak extra memory of one backward per system (module docstring)."""
        torch = self.torch
        B, H = 16384 // S, 2048 // D
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
        elem = torch.tensor([], dtype=dtype).element_size()
        res = {"dtype": dtype_name, "D": D, "S": S, "causal": causal, "B": B, "H": H,
               "gradients_mib": 3 * B * H * S * D * elem / 2**20, "systems": {}}
        for name in self.args.systems:
            if name == "fa3" and fa3_lacks(dtype_name, D):
                res["systems"][name] = {"extra_mib": None, "error": fa3_lacks(dtype_name, D)}
                continue
            rec: dict = {}
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                qkvd = self.make_sets(B, H, S, D, dtype, 9000)[0]
                if name == "flashcore":
                    # The forward outside the measurement; dQ, dK, dV and the workspace inside it.
                    fc = self.fc
                    if fc is None:
                        raise RuntimeError("libflashcore.so not loaded")
                    q, k, v, dout = qkvd
                    o = torch.empty_like(q)
                    lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
                    fc.forward(fc.params_for(q, k, v, o, lse=lse, causal=causal, bhsd=True),
                               torch.cuda.current_stream().cuda_stream)
                    torch.cuda.synchronize()
                    fc.release_workspaces()  # the forward's workspace (if any) is not the backward's
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    grads = tuple(torch.empty_like(t) for t in (q, k, v))
                    params = fc.backward_params_for(q, k, v, o, lse, dout, *grads, causal=causal, bhsd=True,
                                                    deterministic=self.args.deterministic)
                    fc.backward(params, torch.cuda.current_stream().cuda_stream)
                    rec["workspace_mib"] = params.workspace_size / 2**20
                    rec["note"] = f"workspace {params.workspace_size / 2**20:.0f} MiB"
                else:
                    bw = self.build(name, qkvd, causal)
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    bw.call()
                torch.cuda.synchronize()
                rec["extra_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            except Exception as e:  # noqa: BLE001
                rec = {"extra_mib": None, "error": short_error(e)}
            res["systems"][name] = rec
            if self.fc is not None:
                self.fc.release_workspaces()
            torch.cuda.empty_cache()
        return res


# ------------------------------------------------------------------------------------------------------

def parse_memory(spec: str) -> Optional[tuple]:
    """"DTYPE:D:S:CAUSAL" (e.g. bf16:128:8192:1) -> (dtype, D, S, causal); "none" -> None."""
    if spec == "none":
        return None
    parts = spec.split(":")
    if len(parts) != 4 or parts[0] not in ("bf16", "fp16") or parts[3] not in ("0", "1"):
        raise ValueError(f"--memory wants DTYPE:D:S:CAUSAL (bf16|fp16, 0|1) or none, got {spec!r}")
    D, S = int(parts[1]), int(parts[2])
    if D <= 0 or S <= 0 or 16384 % S or 2048 % D:
        raise ValueError(f"--memory: S must divide 16384 and D 2048 (a grid cell), got {spec!r}")
    return parts[0], D, S, parts[3] == "1"


def load_flashcore(lib: Optional[str], tag: str, wanted: bool):
    """(FlashCoreLib or None, a line for the report's header): the library at `lib` (or the default one) when wanted."""
    if not wanted:
        return None, "not loaded"
    try:
        from flashcore_ctypes import FlashCoreLib
        fc = FlashCoreLib(lib)
        return fc, f"{fc.version()} ({fc.path})"
    except Exception as e:  # noqa: BLE001
        log(f"{tag}: FlashCore not loaded: {short_error(e)}")
        return None, f"not loaded: {short_error(e)}"


def load_fa3(tag: str, wanted: bool, what: str = ""):
    """(FA3's flash_attn_interface module or None, a line for the report's header): FA3's train build, when wanted and
    on PYTHONPATH. what: appended to the header line after the module's folder."""
    if not wanted:
        return None, "not in --systems"
    try:
        import flash_attn_interface as fa3  # type: ignore
        return fa3, f"measured ({os.path.dirname(os.path.abspath(fa3.__file__))}{what})"
    except Exception as e:  # noqa: BLE001
        note = f"not importable ({short_error(e)}): put ../shared/fa3/train on PYTHONPATH"
        log(f"{tag}: FA3 {note}")
        return None, note


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "out", "backward"), help="output directory")
    ap.add_argument("--quick", action="store_true", help=f"subset: seqlens {QUICK_S}")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="both")
    ap.add_argument("--head-dims", default=None, help="comma list (default 64,128,256)")
    ap.add_argument("--head-dim-v", type=int, default=0,
                    help="V's (and O's) head dim for every cell where it differs from Q's and K's (e.g. --head-dims "
                         "192 --head-dim-v 128: MLA); 0: the head dim")
    ap.add_argument("--seqlens", default=None, help="comma list (default 512..16384)")
    ap.add_argument("--masks", choices=["both", "none", "causal"], default="both")
    ap.add_argument("--systems", default=",".join(SYSTEMS[:4]), help=f"comma list of {','.join(SYSTEMS)}")
    ap.add_argument("--lib", default=None, help="libflashcore.so (default build/lib/libflashcore.so or $FLASHCORE_LIBRARY)")
    ap.add_argument("--lib-b", default=None, help="a second libflashcore.so, measured as system flashcore_b (an A/B in "
                                                  "one process; not in the default --systems)")
    ap.add_argument("--iters", type=int, default=30, help="timed backward calls per system and cell")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per system first")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of turns (reverse order every other round)")
    ap.add_argument("--sleep-ms", type=float, default=20.0,
                    help="GPU sleep before each round while the host enqueues it (0: none)")
    ap.add_argument("--deterministic", action="store_true",
                    help="FlashCore and FA3 with their deterministic backward (SDPA has no such switch)")
    ap.add_argument("--memory", default="bf16:128:8192:1",
                    help="DTYPE:D:S:CAUSAL: the grid cell of the peak-memory table, or none")
    ap.add_argument("--no-rotate", action="store_true", help="one buffer set per cell")
    ap.add_argument("--no-verify", dest="verify", action="store_false",
                    help="skip the comparison of FlashCore's gradients with an anchor's")
    a = ap.parse_args(argv)
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in a.systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {bad}; expected {SYSTEMS}")
    if a.iters < 1 or a.warmup < 0 or a.rounds < 1:
        ap.error("--iters >= 1, --warmup >= 0, --rounds >= 1")
    try:
        mem_cell = parse_memory(a.memory)
    except ValueError as e:
        ap.error(str(e))

    t0 = time.time()
    import torch
    if not torch.cuda.is_available():
        log("backward: no CUDA device")
        return 3
    os.makedirs(a.out, exist_ok=True)
    fc, fc_version = load_flashcore(a.lib, "backward", "flashcore" in a.systems)
    if fc is not None and not fc.has_backward():
        fc_version += "; no backward in this library"
    fa3, fa3_note = load_fa3("backward", "fa3" in a.systems, "; bf16, head dims 64 / 128")
    fc_b = None
    if "flashcore_b" in a.systems:
        if not a.lib_b:
            ap.error("system flashcore_b needs --lib-b")
        fc_b, fc_b_version = load_flashcore(a.lib_b, "backward", True)
        fc_version += f"; B: {fc_b_version}"
    runner = Runner(a, torch, fc, fa3, fc_b)
    dtypes = ["bf16", "fp16"] if a.dtype == "both" else [a.dtype]
    head_dims = [int(x) for x in a.head_dims.split(",")] if a.head_dims else GRID_D
    seqs = [int(x) for x in a.seqlens.split(",")] if a.seqlens else (QUICK_S if a.quick else GRID_S)
    masks = {"both": (False, True), "none": (False,), "causal": (True,)}[a.masks]
    todo = grid_cells(dtypes, head_dims, seqs, masks)
    props = torch.cuda.get_device_properties(0)
    meta = {
        "gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count, "l2_mib": runner.l2 / 2**20,
        "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
        "flashcore": fc_version, "fa3": fa3_note, "python": platform.python_version(), "dtypes": dtypes,
        "systems": a.systems, "iters": a.iters, "warmup": a.warmup, "rounds": a.rounds, "sleep_ms": a.sleep_ms,
        "deterministic": a.deterministic, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "head_dim_v": a.head_dim_v or None,
        "method": (f"backward alone after one forward (autograd.grad with retain_graph for SDPA and FA3, "
                   f"flashcore_attention_backward for FlashCore{'; deterministic backward for FlashCore and FA3' if a.deterministic else ''}); "
                   f"batch = 16384/S, heads = 2048/D, torch.randn (B,H,S,D), the same tensors for all systems; "
                   f"{a.warmup} warm-up calls each, then the systems taking turns call by call, {a.rounds} rounds "
                   f"(reverse order every other round) behind a {a.sleep_ms:g} ms GPU sleep, {a.iters} CUDA-event-timed "
                   f"calls per system, median; TFLOPS = 2.5 x 4*B*H*S*S*D/t, halved for causal"
                   f"{'; D = (head_dim + head_dim_v) / 2 with head_dim_v ' + str(a.head_dim_v) if a.head_dim_v else ''}"),
    }
    cells: List[dict] = []
    mem = None
    status = 0
    try:
        for n, (dt, D, S, causal, B, H) in enumerate(todo):
            log(f"[{n + 1}/{len(todo)}] {dt} D={D} S={S} B={B} H={H} causal={int(causal)}")
            cell = runner.run_cell(dt, D, S, causal, B, H, seed=n)
            cells.append(cell)
            parts = [f"{s}={fmt(r.get('tflops'))}" for s, r in cell["systems"].items()]
            if "fc_grad_err" in cell:
                parts.append(f"fc_grad_err={cell['fc_grad_err']:.1e} vs {cell['fc_grad_err_vs']}")
            log("    " + " ".join(parts))
        if mem_cell is not None:
            log(f"[memory] {mem_cell}")
            mem = runner.memory(*mem_cell)
            log("    " + " ".join(f"{s}={fmt(r.get('extra_mib'))} MiB" for s, r in mem["systems"].items()))
    except KeyboardInterrupt:
        log("backward: interrupted; writing what was measured")
        status = 130
    except Exception as e:  # noqa: BLE001 - e.g. a sticky CUDA error: keep what was measured
        log(f"backward: stopped early: {short_error(e)}")
        traceback.print_exc()
        status = 1
    meta["elapsed_s"] = time.time() - t0
    with open(os.path.join(a.out, "backward_metrics.json"), "w") as f:
        json.dump(json_safe({"meta": meta, "cells": cells, "memory": mem}), f, indent=1, allow_nan=False, default=str)
    with open(os.path.join(a.out, "backward_report.md"), "w") as f:
        f.write(markdown(meta, cells, mem))
    log(f"backward: wrote {a.out}/backward_report.md and backward_metrics.json in {meta['elapsed_s']:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())

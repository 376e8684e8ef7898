#!/usr/bin/env python3
"""FlashCore's attention variants (issue #72: sliding window, softcap, attention sinks, chunked attention) against
FlashCore's own plain attention, FlexAttention and FlashAttention-3, forward pass (or, with --backward, the backward
pass), every system in this process on the same values.

Runs on the GPU machine (Python 3.12, PyTorch with CUDA). FlashCore is called through its C ABI with ctypes
(bench/flashcore_ctypes.py, ABI 0.5 for the variants), no Python package needed. FlexAttention is
torch.compile(flex_attention) with a block mask. FA3 is measured when `flash_attn_interface` imports (the `train/` build
of ../shared/fa3 has local windows, attention_chunk (forward only) and softcap, bf16, head dims 64 / 128; no sinks):

    echo /.fa3/ >> .git/info/exclude; rm -rf .fa3 && cp -r ../shared/fa3/train .fa3    # once, then carry .fa3
    PYTHONPATH=$PWD/.fa3 python3 bench/variants.py --json bench/out/variants.json
    python3 bench/variants.py --groups window --seqlens 8192 --rounds 3 --systems flashcore,flashcore_base
    PYTHONPATH=$PWD/.fa3 python3 bench/variants.py --backward --json bench/out/variants_backward.json

Cells (bf16, head dim 128, 32 query heads and 8 KV heads, batch = --tokens // S so that every cell holds the same
number of tokens, causal):
  window   a sliding window of --window keys (the query's own included: FlashAttention's window_size =
           (window - 1, 0), transformers' sliding_window = window) at S = 8k, 16k, 32k. Baseline: FlashCore's causal
           attention at the same S (flashcore_base). FlexAttention: a causal sliding-window block mask. FA3:
           window_size=(window - 1, 0).
  softcap  causal attention with softcap --softcap (Gemma 2's 50) at S = 8k. Baseline: FlashCore without softcap.
           FlexAttention: a score_mod (softcap * tanh(score / softcap)). FA3: softcap=.
  sinks    causal attention with per-head sinks (gpt-oss) at S = 8k, and with gpt-oss's window of 128 keys. Baseline:
           FlashCore without sinks. FlexAttention has no sink: it runs the attention with return_lse and folds the sink
           in afterwards, out * sigmoid(lse - sink) (exact: sum_j e^s_j / (sum_j e^s_j + e^sink) =
           sigmoid(lse - sink)), compiled together. FA3 (this build): no sinks, not applicable.
  chunk    Llama 4's chunked layers: causal attention with attention_chunk c (query i sees the keys of its own chunk,
           j // c == i // c) at (S, c) = (8k, 2048), (16k, 8192), (32k, 8192). Baseline: FlashCore's causal attention at
           the same S. FlexAttention: a causal block mask with q_idx // c == kv_idx // c. FA3: attention_chunk= (its
           forward takes it; its backward refuses it, so the --backward chunk cells are n/a for FA3; a forward that
           FA3 refuses is reported n/a with its error).

Backward (--backward; FlashCore needs ABI 0.6, whose flashcore_attention_backward takes the variants): the same cells
(default groups window and softcap, window cells at S = 8k and 16k: the issue's backward cells; --groups chunk for the
chunked cells), each system's backward alone after one forward kept with its graph, as bench/backward.py measures it:
FlashCore's raw flashcore_attention_backward call on the forward's O and LSE (with the variants, and dsinks with sinks;
gradients and workspace allocated once), torch.autograd.grad(out, (q, k, v[, sinks]), dout, retain_graph=True) for
FlexAttention (torch.compile(flex_attention): score_mod for the softcap, mask_mod for the window and the chunk, the
block mask created before the timed region) and FA3's train build (flash_attn_func(..., window_size=(left, right),
softcap=...)). TFLOPS = 2.5 x the forward's FLOPs on the same visible pairs (FlashAttention's backward count: 5 GEMMs
against 2). FlashCore's dQ, dK, dV are compared with each other system's (max |x - FlashCore| / max |FlashCore|, the
largest of the three).

Method: after --warmup calls each, the systems take turns call by call, each call between two CUDA events, --rounds
rounds in reverse order every other round, --iters calls per system in all; before each round the GPU is held by a
--sleep-ms kernel while the host enqueues the round, so the host's time per call (Python, ctypes, dispatch) stays off
the GPU's timeline. Median per system. TFLOPS = 4 * B * Hq * D * (visible (i, j) pairs) / t, the pairs counted exactly
for each system's own mask (visible_pairs): a windowed call is credited with its window's pairs, a chunked one with
its chunks' (S / c causal triangles of c (c + 1) / 2 pairs), the causal baseline with S (S + 1) / 2 per head. The
speedup of a variant over its baseline is the ratio of their times. Outputs are compared with FlashCore's
(max |x - FlashCore| / max |FlashCore|, set 0), so a system computing something else shows.

Prints a markdown table; --json PATH also writes the measurements. A system that fails on a cell records null there
(with the error), never a crash; a cell a system cannot run (FA3: sinks, a chunk in the backward, a chunk its forward
refuses) is n/a, its reason printed under the table.
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
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from backward import BWD_FLOP_FACTOR, load_fa3, load_flashcore, rel_max_err, tflops  # noqa: E402
from report import fmt, geomean, json_safe, log, ratio, short_error  # noqa: E402

SYSTEMS = ["flashcore", "flashcore_base", "flex", "fa3"]
LABELS = {"flashcore": "FlashCore", "flashcore_base": "FlashCore baseline", "flex": "FlexAttention", "fa3": "FA3"}
GROUPS = ("window", "softcap", "sinks", "chunk")
DEFAULT_SEQLENS = (8192, 16384, 32768)
# The backward's cells (issue #72): the sliding window at 8k and 16k, and the softcap (sinks on request).
BACKWARD_GROUPS = ("window", "softcap")
BACKWARD_SEQLENS = (8192, 16384)
GPT_OSS_WINDOW = 128
# The chunk cells, (S, attention_chunk): Llama 4's chunk of 8192 at 16k and 32k, and a chunk of 2048 at 8k.
CHUNK_CELLS = ((8192, 2048), (16384, 8192), (32768, 8192))


# ------------------------------------------------------------------------------------------------------
# Cells and FLOPs (pure: tested without a GPU)

def visible_pairs(sq: int, sk: int, causal: bool, window_size=(-1, -1), attention_chunk: int = 0) -> int:
    """The (query, key) pairs a call computes, exactly: per row i, the keys j allowed by FlashAttention's rules
    (bottom-right aligned, d = sk - sq): causal j <= i + d; window i + d - left <= j <= i + d + right (-1 unbounded,
    right 0 with causal); chunk floor(j / c) == floor((i + d) / c). One pass over the rows (no mask in memory)."""
    left, right = window_size
    if causal:
        right = 0
    total = 0
    for i in range(sq):
        diag = i + sk - sq
        lo, hi = 0, sk - 1
        if right != -1:
            hi = min(hi, diag + right)
        if left != -1:
            lo = max(lo, diag - left)
        if attention_chunk > 0:
            start = (diag // attention_chunk) * attention_chunk  # Python's // floors, as the definition does
            lo, hi = max(lo, start), min(hi, start + attention_chunk - 1)
        total += max(0, hi - lo + 1)
    return total


def make_cells(groups, seqlens, tokens: int, window: int, softcap: float) -> List[dict]:
    """The cells of the requested groups (module docstring). Each has the variant's arguments (FlashAttention's
    names) and those of its baseline (the same call without the variant)."""
    cells = []
    for S in (seqlens if "window" in groups else ()):
        cells.append({"group": "window", "name": f"window {window}", "S": S, "B": max(1, tokens // S),
                      "variant": {"window_size": (window - 1, 0)}, "base": {}, "base_name": "causal"})
    S = 8192
    if "softcap" in groups:
        cells.append({"group": "softcap", "name": f"softcap {softcap:g}", "S": S, "B": max(1, tokens // S),
                      "variant": {"softcap": softcap}, "base": {}, "base_name": "no softcap"})
    if "sinks" in groups:
        cells.append({"group": "sinks", "name": "sinks", "S": S, "B": max(1, tokens // S),
                      "variant": {"sinks": True}, "base": {}, "base_name": "no sinks"})
        gpt_oss = {"window_size": (GPT_OSS_WINDOW - 1, 0)}
        cells.append({"group": "sinks", "name": f"sinks + window {GPT_OSS_WINDOW}", "S": S, "B": max(1, tokens // S),
                      "variant": dict(gpt_oss, sinks=True), "base": gpt_oss,
                      "base_name": f"window {GPT_OSS_WINDOW}, no sinks"})
    for S, chunk in (CHUNK_CELLS if "chunk" in groups else ()):
        cells.append({"group": "chunk", "name": f"chunk {chunk}", "S": S, "B": max(1, tokens // S),
                      "variant": {"attention_chunk": chunk}, "base": {}, "base_name": "causal"})
    return cells


def flops_of(cell: dict, variant: dict, heads_q: int, head_dim: int) -> float:
    """4 * B * Hq * D * the exact visible pairs of a causal call with `variant`'s window and chunk (softcap and sinks:
    none)."""
    pairs = visible_pairs(cell["S"], cell["S"], True, variant.get("window_size", (-1, -1)),
                          variant.get("attention_chunk", 0))
    return 4.0 * cell["B"] * heads_q * head_dim * pairs


def backward_flops_of(cell: dict, variant: dict, heads_q: int, head_dim: int) -> float:
    """The backward's FLOPs of a causal call with `variant`'s window and chunk: BWD_FLOP_FACTOR (2.5) x flops_of, on the
    same exact visible pairs."""
    return BWD_FLOP_FACTOR * flops_of(cell, variant, heads_q, head_dim)


def fa3_lacks(variant: dict, backward: bool = False) -> Optional[str]:
    """Why FA3's train build cannot run a variant (backward: its backward), or None."""
    if variant.get("sinks"):
        return "FA3 (this build) has no attention sinks"
    if backward and variant.get("attention_chunk"):
        return "FA3's backward does not take attention_chunk (its flash_attn_func refuses it in the backward)"
    return None


def fa3_refusal(variant: dict, error: BaseException) -> dict:
    """The cell's FA3 record when FA3 raised while the cell was set up (or at its first call): not applicable, with
    FA3's error, for a chunked variant (FA3 refusing attention_chunk); otherwise a failure (null, with the error)."""
    if variant.get("attention_chunk"):
        return {"error": f"FA3 refused attention_chunk={variant['attention_chunk']}: {short_error(error)}",
                "not_applicable": True, "tflops": None}
    return {"error": short_error(error), "tflops": None}


def resolve_defaults(groups: Optional[str], seqlens: Optional[str], backward: bool):
    """(groups, seqlens) of a run: the given comma lists, else the forward's (every group; window cells at 8k, 16k,
    32k) or, with --backward, the backward's (window and softcap; window cells at 8k and 16k). Raises ValueError for a
    --seqlens that is not a comma list of ints."""
    group_list = [g.strip() for g in groups.split(",") if g.strip()] if groups is not None else \
        list(BACKWARD_GROUPS if backward else GROUPS)
    if seqlens is None:
        return group_list, list(BACKWARD_SEQLENS if backward else DEFAULT_SEQLENS)
    try:
        return group_list, [int(x) for x in seqlens.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--seqlens wants a comma list of ints, got {seqlens!r}") from None


# ------------------------------------------------------------------------------------------------------
# FlexAttention's side of the variants (pure functions of torch: tested on the CPU with eager flex_attention)

def window_mask_mod(left: int, chunk: int = 0):
    """FlexAttention mask_mod of a causal call with FlashAttention's window (left, 0), left = -1 unbounded (plain
    causal), and attention_chunk `chunk` (0: none; else q_idx // chunk == kv_idx // chunk); Sq == Sk, so bottom-right
    and top-left alignment agree (and the indices are >= 0: floor and truncating division agree)."""
    def visible(b, h, q_idx, kv_idx):
        sees = q_idx >= kv_idx
        if left >= 0:
            sees = sees & (q_idx - kv_idx <= left)
        if chunk > 0:
            sees = sees & (q_idx // chunk == kv_idx // chunk)
        return sees
    return visible


def softcap_score_mod(torch, cap: float):
    """FlexAttention score_mod of FlashAttention's softcap: the score it gets is already scale * q.k."""
    def capped(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)
    return capped


def fold_sinks(torch, out, lse, sinks):
    """Attention with per-head sinks from attention without them: out (B, H, S, D) and its natural-log lse (B, H, S);
    the sink adds e^sink to each row's denominator, so every row scales by e^lse / (e^lse + e^sink) =
    sigmoid(lse - sink). In out's dtype."""
    return (out * torch.sigmoid(lse - sinks[None, :, None])[..., None]).to(out.dtype)


# ------------------------------------------------------------------------------------------------------
# FlashCore's backward params with the variants (bench/flashcore_ctypes.py underneath: tested with the stub library)

def flashcore_backward_params(fc, q, k, v, o, lse, dout, grads, causal: bool, window_size=(-1, -1),
                              softcap: float = 0.0, sinks=None, dsinks=None, attention_chunk: int = 0):
    """(params, buffers to keep alive): flashcore_ctypes' backward_params_for on (B, H, S, D) tensors (the forward's q,
    k, v, o and lse, dout, the outputs grads = (dq, dk, dv)), then the variants of the forward it differentiates
    (window_size, softcap, sinks: a contiguous float32 (Hq,) tensor, attention_chunk; ABI 0.5 fields, which a 0.6
    backward reads) and dsinks (a float32 (Hq,) output, or None; ABI 0.6: _lib.Library.set_dsinks raises RuntimeError
    for an older library), and a workspace sized for the params with them."""
    import torch  # only needed here

    params = fc.backward_params_for(q, k, v, o, lse, dout, *grads, causal=causal, bhsd=True)
    fc.library.set_variants(params, causal=causal, window_size=window_size, softcap=softcap,
                            sinks=0 if sinks is None else sinks.data_ptr(), attention_chunk=attention_chunk)
    wanted = [name for name, used in (("window_size", params.local), ("softcap", params.softcap),
                                      ("sinks", params.sinks), ("attention_chunk", params.attention_chunk)) if used]
    if wanted and not fc.library.has_variant_backward():  # a 0.5 library's backward refuses them
        raise RuntimeError(f"the backward with {', '.join(wanted)} needs a 0.6 library or newer; {fc.path} is "
                           f"{fc.version()}")
    if dsinks is not None:
        fc.library.set_dsinks(params, dsinks.data_ptr())
    keep = []
    size = fc.backward_workspace_size(params)  # the variants may need more than the plain call's
    if size > params.workspace_size:
        buf = torch.empty(size, dtype=torch.uint8, device=q.device)
        keep.append(buf)
        params.workspace, params.workspace_size = buf.data_ptr(), size
    return params, keep


# ------------------------------------------------------------------------------------------------------
# Timing: the systems interleaved call by call (pure Python over a torch-like module: tested with a fake one)

def interleaved_times(torch, calls: Dict[str, Callable[[int], None]], nsets: int, warmup: int, iters: int,
                      rounds: int, sleep: Callable[[], None] = lambda: None) -> Dict[str, List[float]]:
    """Per-call milliseconds of each system: `calls[name](i)` runs one call on buffer set i % nsets. After `warmup`
    calls each, `rounds` rounds (the order reversed every other round, so no system always follows the same one);
    in each, every system runs once per turn, each call between two CUDA events, ceil(iters / rounds) turns.
    sleep() runs before each round (a GPU sleep: the host enqueues the round meanwhile)."""
    names = list(calls)
    for i in range(warmup):
        for n in names:
            calls[n](i % nsets)
    torch.cuda.synchronize()
    times: Dict[str, List[float]] = {n: [] for n in names}
    per_round = max(1, -(-iters // max(1, rounds)))
    done = 0
    for r in range(max(1, rounds)):
        order = names if r % 2 == 0 else names[::-1]
        events = []
        sleep()
        for i in range(per_round):
            for n in order:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                calls[n]((done + i) % nsets)
                end.record()
                events.append((n, start, end))
        done += per_round
        torch.cuda.synchronize()
        for n, start, end in events:
            times[n].append(start.elapsed_time(end))
    return times


# ------------------------------------------------------------------------------------------------------
# Report (pure)

def cell_tflops(cell: dict, system: str) -> Optional[float]:
    return (cell.get("systems", {}).get(system) or {}).get("tflops")


def cell_ms(cell: dict, system: str) -> Optional[float]:
    return (cell.get("systems", {}).get(system) or {}).get("median_ms")


def table(cells: List[dict]) -> List[str]:
    """One markdown row per cell: TFLOPS of each system on its own visible area, and FlashCore's ratios."""
    hdr = ["variant", "S", "B", "FlashCore", "FC baseline", "FlexAttention", "FA3", "speedup vs baseline",
           "FC / baseline TFLOPS", "FC / Flex", "FC / FA3", "max diff vs FC"]
    L = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for c in cells:
        fc = cell_tflops(c, "flashcore")
        diffs = [f"{s}: {c['diff'][s]:.1e}" for s in ("flex", "fa3") if c.get("diff", {}).get(s) is not None]
        fa3 = c.get("systems", {}).get("fa3") or {}
        vals = [c["name"], str(c["S"]), str(c["B"]), fmt(fc),
                f"{fmt(cell_tflops(c, 'flashcore_base'))} ({c['base_name']})", fmt(cell_tflops(c, "flex")),
                "n/a" if fa3.get("not_applicable") else fmt(cell_tflops(c, "fa3")),
                fmt(ratio(cell_ms(c, "flashcore_base"), cell_ms(c, "flashcore")), "{:.2f}x"),
                fmt(ratio(fc, cell_tflops(c, "flashcore_base")), "{:.2f}"),
                fmt(ratio(fc, cell_tflops(c, "flex")), "{:.2f}"), fmt(ratio(fc, cell_tflops(c, "fa3")), "{:.2f}"),
                ", ".join(diffs) or "—"]
        L.append("| " + " | ".join(vals) + " |")
    return L


def markdown(meta: dict, cells: List[dict]) -> str:
    which = meta.get("pass", "forward")
    L = [f"# FlashCore attention variants ({which})\n",
         f"- GPU: {meta['gpu']}; PyTorch {meta['torch']}, CUDA {meta['cuda']}; FlashCore {meta['flashcore']}",
         f"- FA3: {meta['fa3']}",
         f"- Shapes: bf16, {meta['heads_q']} query / {meta['heads_kv']} KV heads, head dim {meta['head_dim']}, "
         f"batch x S = {meta['tokens']} tokens, causal",
         f"- Method: {meta['method']}\n",
         "TFLOPS on each system's visible (i, j) pairs, counted exactly"
         + (" (the backward: 2.5x the forward's FLOPs on them)" if which == "backward" else "")
         + "; speedup = baseline time / FlashCore time.\n"]
    L += table(cells)
    not_applicable: Dict[str, List[str]] = {}
    for c in cells:
        for s, r in c.get("systems", {}).items():
            if r.get("not_applicable"):
                not_applicable.setdefault(f"{LABELS.get(s, s)}: {r['error']}", []).append(f"{c['name']} S={c['S']}")
    for reason, where in not_applicable.items():
        L.append(f"\nn/a: {reason} ({', '.join(where)})")
    for group in GROUPS:
        ran = [c for c in cells if c["group"] == group]
        if ran:
            means = [geomean([ratio(cell_tflops(c, "flashcore"), cell_tflops(c, other)) for c in ran])
                     for other in ("flashcore_base", "flex", "fa3")]
            L.append(f"\n{group}: geometric means of FlashCore's TFLOPS over its baseline's {fmt(means[0], '{:.2f}')}, "
                     f"over FlexAttention's {fmt(means[1], '{:.2f}')}, over FA3's {fmt(means[2], '{:.2f}')}")
    errors = sorted({f"{c['name']} S={c['S']} {LABELS.get(s, s)}: {r['error']}" for c in cells
                     for s, r in c.get("systems", {}).items() if r.get("error") and not r.get("not_applicable")})
    if errors:
        L += ["\n<details><summary>errors</summary>\n"] + [f"- {e}" for e in errors[:40]] + ["\n</details>"]
    return "\n".join(L) + "\n"


# ------------------------------------------------------------------------------------------------------
# Measurement (GPU)

class Runner:
    def __init__(self, args, torch, fc, fa3):
        self.args, self.torch, self.fc, self.fa3 = args, torch, fc, fa3
        props = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        self._flex = None

    def flex_functions(self):
        """flex_attention compiled, plain and with the sink folded in (module docstring); imported on first use."""
        if self._flex is None:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            torch = self.torch

            def with_sinks(q, k, v, block_mask, sinks):
                out, lse = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)
                return fold_sinks(torch, out, lse, sinks)

            # Every cell is a new shape or mask function, each a recompilation: allow more than dynamo's default 8.
            for limit in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
            # The backward cells call autograd.grad(..., retain_graph=True) on one forward many times, which a compiled
            # backward with donated buffers refuses (the H100 run lost its 16k window and softcap cells to that).
            functorch_config = getattr(getattr(torch, "_functorch", None), "config", None)
            if functorch_config is not None and hasattr(functorch_config, "donated_buffer"):
                functorch_config.donated_buffer = False
            # Compiled, create_block_mask never materialises the S x S mask (8 GiB of int64 indices at S = 32k).
            self._flex = (torch.compile(flex_attention, dynamic=False), torch.compile(with_sinks, dynamic=False),
                          torch.compile(create_block_mask))
        return self._flex

    def make_sets(self, B, S, seed):
        """Buffer sets of (q, k, v) in (B, H, S, D) (with --backward (q, k, v, dout)), enough that one cycle touches
        more than 2x the L2 cache."""
        torch, a = self.torch, self.args
        if a.backward:  # bf16 Q, O, dO, dQ and K, V, dK, dV
            touched = 2 * B * S * a.head_dim * (4 * a.heads_q + 4 * a.heads_kv)
            heads = (a.heads_q, a.heads_kv, a.heads_kv, a.heads_q)
        else:  # bf16 Q, O, K, V
            touched = 2 * B * S * a.head_dim * (2 * a.heads_q + 2 * a.heads_kv)
            heads = (a.heads_q, a.heads_kv, a.heads_kv)
        nsets = 1 if a.no_rotate else (2 * self.l2) // touched + 1
        gen = torch.Generator(device="cuda")
        gen.manual_seed(seed)
        return [tuple(torch.randn(B, h, S, a.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                      for h in heads) for _ in range(nsets)]

    def build(self, name, cell, sets, sinks):
        """(call(i), output of set 0 as (B, H, S, D)) of system `name` on the cell; raises when it cannot run."""
        torch, a = self.torch, self.args
        variant = cell["base"] if name == "flashcore_base" else cell["variant"]
        window = variant.get("window_size", (-1, -1))
        cap = variant.get("softcap", 0.0)
        chunk = variant.get("attention_chunk", 0)
        use_sinks = sinks if variant.get("sinks") else None
        outs = [torch.empty_like(q) for q, _, _ in sets]
        if name in ("flashcore", "flashcore_base"):
            if self.fc is None:
                raise RuntimeError("libflashcore.so not loaded")
            params = [self.fc.params_for(q, k, v, o, causal=True, bhsd=True, window_size=window, softcap=cap,
                                         sinks=use_sinks, attention_chunk=chunk) for (q, k, v), o in zip(sets, outs)]
            fc = self.fc

            def call(i):
                fc.forward(params[i], torch.cuda.current_stream().cuda_stream)
            return call, lambda: outs[0]
        if name == "flex":
            flex, flex_sinks, create_block_mask = self.flex_functions()
            block_mask = create_block_mask(window_mask_mod(window[0], chunk), None, None, cell["S"], cell["S"],
                                           device="cuda")
            softcap_mod = softcap_score_mod(torch, cap) if cap else None

            def call(i):
                q, k, v = sets[i]
                if use_sinks is not None:
                    outs[i] = flex_sinks(q, k, v, block_mask, use_sinks)
                else:
                    outs[i] = flex(q, k, v, score_mod=softcap_mod, block_mask=block_mask, enable_gqa=True)
            return call, lambda: outs[0]
        if name == "fa3":
            if self.fa3 is None:
                raise RuntimeError("flash_attn_interface not importable")
            why = fa3_lacks(variant)
            if why:
                raise NotImplementedError(why)
            bshd = [tuple(t.transpose(1, 2).contiguous() for t in st) for st in sets]
            box = {}
            extra = {"attention_chunk": chunk} if chunk else {}

            def call(i):
                out = self.fa3.flash_attn_func(*bshd[i], causal=True, window_size=window, softcap=cap, **extra)
                box[i] = out[0] if isinstance(out, tuple) else out
            return call, lambda: box[0].transpose(1, 2)
        raise ValueError(name)

    def build_backward(self, name, cell, sets, sinks):
        """(call(i), (dQ, dK, dV) of set 0 as (B, H, S, D)) of system `name`'s backward on the cell (--backward): each
        set's forward runs here, once, with its graph (FlashCore: O and LSE) kept; call(i) runs only the backward of
        set i. Raises when the system cannot run the cell."""
        torch, a = self.torch, self.args
        variant = cell["base"] if name == "flashcore_base" else cell["variant"]
        window = variant.get("window_size", (-1, -1))
        cap = variant.get("softcap", 0.0)
        chunk = variant.get("attention_chunk", 0)
        use_sinks = sinks if variant.get("sinks") else None
        if name in ("flashcore", "flashcore_base"):
            if self.fc is None:
                raise RuntimeError("libflashcore.so not loaded")
            fc = self.fc
            if not fc.has_backward():
                raise RuntimeError(f"{fc.path} has no flashcore_attention_backward (0.4 needed)")
            stream = torch.cuda.current_stream().cuda_stream
            states = []
            for q, k, v, dout in sets:
                B, Hq, S, _ = q.shape
                o = torch.full_like(q, float("nan"))
                lse = torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
                fc.forward(fc.params_for(q, k, v, o, lse=lse, causal=True, bhsd=True, window_size=window, softcap=cap,
                                         sinks=use_sinks, attention_chunk=chunk), stream)
                grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))  # poisoned: unwritten shows
                dsinks = None if use_sinks is None else torch.full((Hq,), float("nan"), device="cuda")
                params, keep = flashcore_backward_params(fc, q, k, v, o, lse, dout, grads, True, window, cap,
                                                         use_sinks, dsinks, chunk)
                states.append((params, grads, (o, lse, dsinks, keep)))

            def call(i):
                fc.backward(states[i][0], torch.cuda.current_stream().cuda_stream)
            return call, lambda: states[0][1]
        box = {}
        if name == "flex":
            flex, flex_sinks, create_block_mask = self.flex_functions()
            # The block mask before the timed region (as the forward does).
            block_mask = create_block_mask(window_mask_mod(window[0], chunk), None, None, cell["S"], cell["S"],
                                           device="cuda")
            softcap_mod = softcap_score_mod(torch, cap) if cap else None
            states = []
            for q, k, v, dout in sets:
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]  # the same storage: the same tensors
                if use_sinks is not None:
                    sink_leaf = use_sinks.detach().clone().requires_grad_()
                    out = flex_sinks(*leaves, block_mask, sink_leaf)
                    leaves.append(sink_leaf)
                else:
                    out = flex(*leaves, score_mod=softcap_mod, block_mask=block_mask, enable_gqa=True)
                states.append((out, leaves, dout))

            def call(i):
                out, leaves, dout = states[i]
                box[i] = torch.autograd.grad(out, leaves, dout, retain_graph=True)
            return call, lambda: box[0][:3]
        if name == "fa3":
            if self.fa3 is None:
                raise RuntimeError("flash_attn_interface not importable")
            why = fa3_lacks(variant, backward=True)
            if why:
                raise NotImplementedError(why)
            states = []
            for st in sets:
                q, k, v, dout = (t.transpose(1, 2).contiguous() for t in st)  # (B, S, H, D) copies
                leaves = [t.requires_grad_() for t in (q, k, v)]
                out = self.fa3.flash_attn_func(*leaves, causal=True, window_size=window, softcap=cap)
                states.append((out[0] if isinstance(out, tuple) else out, leaves, dout))

            def call(i):
                out, leaves, dout = states[i]
                box[i] = torch.autograd.grad(out, leaves, dout, retain_graph=True)
            return call, lambda: tuple(g.transpose(1, 2) for g in box[0])
        raise ValueError(name)

    def sleep(self):
        if self.args.sleep_ms > 0 and hasattr(self.torch.cuda, "_sleep"):
            self.torch.cuda._sleep(int(self.args.sleep_ms * 2e6))  # cycles at ~2 GHz

    def run_cell(self, cell: dict, seed: int) -> dict:
        torch, a = self.torch, self.args
        cell = dict(cell, systems={}, diff={})
        try:
            sets = self.make_sets(cell["B"], cell["S"], seed)
            gen = torch.Generator(device="cuda")
            gen.manual_seed(seed + 1)
            sinks = torch.randn(a.heads_q, device="cuda", generator=gen) * 2.0
        except Exception as e:  # noqa: BLE001
            cell["error"] = short_error(e)
            return cell
        cell["rotate_sets"] = len(sets)
        built: Dict[str, tuple] = {}
        for name in a.systems:
            variant = cell["base"] if name == "flashcore_base" else cell["variant"]
            if name == "fa3" and fa3_lacks(variant, a.backward):
                cell["systems"][name] = {"error": fa3_lacks(variant, a.backward), "not_applicable": True,
                                         "tflops": None}
                continue
            try:
                built[name] = (self.build_backward if a.backward else self.build)(name, cell, sets, sinks)
                built[name][0](0)
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a failing system records null
                try:
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    pass
                built.pop(name, None)
                cell["systems"][name] = fa3_refusal(variant, e) if name == "fa3" else \
                    {"error": short_error(e), "tflops": None}
        if a.verify and "flashcore" in built:
            want = built["flashcore"][1]()
            for name in ("flex", "fa3"):
                if name in built:
                    if a.backward:  # dQ, dK, dV: the largest of the three
                        cell["diff"][name] = max(rel_max_err(g, w) for g, w in zip(built[name][1](), want))
                    else:
                        cell["diff"][name] = rel_max_err(built[name][1](), want)
        names = [n for n in a.systems if n in built]
        try:
            times = interleaved_times(torch, {n: built[n][0] for n in names}, len(sets), a.warmup, a.iters, a.rounds,
                                      self.sleep)
        except Exception as e:  # noqa: BLE001 - e.g. a system failing mid-run
            cell["error"] = short_error(e)
            times = {n: [] for n in names}
        count = backward_flops_of if a.backward else flops_of
        for n in names:
            variant = cell["base"] if n == "flashcore_base" else cell["variant"]
            med = statistics.median(times[n]) if times[n] else None
            cell["systems"][n] = {"error": None if med else cell.get("error"), "median_ms": med,
                                  "min_ms": min(times[n]) if times[n] else None, "calls": len(times[n]),
                                  "tflops": tflops(count(cell, variant, a.heads_q, a.head_dim), med)}
        del built, sets
        if self.fc is not None:
            self.fc.release_workspaces()
        torch.cuda.empty_cache()
        return cell


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backward", action="store_true",
                    help="time the backward pass (each system's backward after one forward; FlashCore: ABI 0.6)")
    ap.add_argument("--groups", default=None,
                    help=f"comma list of {','.join(GROUPS)} (default: all; with --backward "
                         f"{','.join(BACKWARD_GROUPS)})")
    ap.add_argument("--seqlens", default=None,
                    help=f"window cells' sequence lengths (default {','.join(map(str, DEFAULT_SEQLENS))}; with "
                         f"--backward {','.join(map(str, BACKWARD_SEQLENS))})")
    ap.add_argument("--tokens", type=int, default=32768, help="batch x seqlen of every cell")
    ap.add_argument("--window", type=int, default=4096, help="keys per query in the window cells (own included)")
    ap.add_argument("--softcap", type=float, default=50.0, help="the softcap cell's cap (Gemma 2: 50)")
    ap.add_argument("--heads-q", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list of {','.join(SYSTEMS)}")
    ap.add_argument("--lib", default=None,
                    help="libflashcore.so (default build/lib/libflashcore.so or $FLASHCORE_LIBRARY)")
    ap.add_argument("--iters", type=int, default=30, help="timed calls per system and cell")
    ap.add_argument("--warmup", type=int, default=5, help="untimed calls per system first")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of turns (reverse order every other round)")
    ap.add_argument("--sleep-ms", type=float, default=20.0, help="GPU sleep before each round (0: none)")
    ap.add_argument("--no-rotate", action="store_true", help="one buffer set per cell")
    ap.add_argument("--no-verify", dest="verify", action="store_false", help="skip comparing outputs with FlashCore's")
    ap.add_argument("--json", default=None, help="also write the measurements to this JSON file")
    a = ap.parse_args(argv)
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    try:
        groups, seqlens = resolve_defaults(a.groups, a.seqlens, a.backward)
    except ValueError as e:
        ap.error(str(e))
    bad = [s for s in a.systems if s not in SYSTEMS] + [g for g in groups if g not in GROUPS]
    if bad:
        ap.error(f"unknown system(s) or group(s) {bad}; systems {SYSTEMS}, groups {list(GROUPS)}")
    if a.iters < 1 or a.warmup < 0 or a.rounds < 1 or a.window < 1 or a.tokens < 1 or not a.softcap > 0:
        ap.error("--iters >= 1, --warmup >= 0, --rounds >= 1, --window >= 1, --tokens >= 1, --softcap > 0")
    if a.heads_q % a.heads_kv:
        ap.error("--heads-q must be a multiple of --heads-kv")
    cells = make_cells(groups, seqlens, a.tokens, a.window, a.softcap)

    t0 = time.time()
    import torch
    if not torch.cuda.is_available():
        log("variants: no CUDA device")
        return 3
    fc, fc_version = load_flashcore(a.lib, "variants", any(s.startswith("flashcore") for s in a.systems))
    if fc is not None and not fc.library.has_variants():
        fc_version += "; predates the variants (0.5): its variant cells fail"
    elif fc is not None and a.backward and not fc.library.has_variant_backward():
        fc_version += "; its backward predates the variants (0.6): its variant cells fail"
    fa3, fa3_note = load_fa3("variants", "fa3" in a.systems)
    runner = Runner(a, torch, fc, fa3)
    meta = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
        "flashcore": fc_version, "fa3": fa3_note, "python": platform.python_version(), "systems": a.systems,
        "heads_q": a.heads_q, "heads_kv": a.heads_kv, "head_dim": a.head_dim, "tokens": a.tokens,
        "window": a.window, "softcap": a.softcap, "iters": a.iters, "warmup": a.warmup, "rounds": a.rounds,
        "sleep_ms": a.sleep_ms, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "pass": "backward" if a.backward else "forward",
        "method": ((f"the backward alone after one forward (FlashCore: flashcore_attention_backward on the forward's O "
                    f"and LSE, with the variants; FlexAttention and FA3: autograd.grad with retain_graph); "
                    if a.backward else "") +
                   f"{a.warmup} warm-up calls each, then the systems taking turns call by call, {a.rounds} rounds "
                   f"(reverse order every other round) behind a {a.sleep_ms:g} ms GPU sleep, {a.iters} "
                   f"CUDA-event-timed calls per system, median; torch.randn (B, H, S, D) inputs, the same for all "
                   f"systems ((B, S, H, D) copies for FA3)"),
    }
    results: List[dict] = []
    status = 0
    try:
        for n, cell in enumerate(cells):
            log(f"[{n + 1}/{len(cells)}] {cell['name']} S={cell['S']} B={cell['B']}")
            done = runner.run_cell(cell, seed=n)
            results.append(done)
            log("    " + " ".join(f"{s}={fmt(r.get('tflops'))}" for s, r in done["systems"].items()))
    except KeyboardInterrupt:
        log("variants: interrupted; reporting what was measured")
        status = 130
    meta["elapsed_s"] = time.time() - t0
    print(markdown(meta, results))
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(json_safe({"meta": meta, "cells": results}), f, indent=1, allow_nan=False, default=str)
        log(f"variants: wrote {a.json}")
    return status


if __name__ == "__main__":
    sys.exit(main())

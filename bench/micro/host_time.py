#!/usr/bin/env python3
"""Host time per call against kernel time, for FA3 (flash_attn_interface on PYTHONPATH, e.g. a copy of
../shared/fa3/prefill in .fa3) and cuDNN through SDPA, on the grid's 512-key shapes (bf16, (B, S, H, D) tensors).

For each system: 30 back-to-back calls between CUDA events (eager time per call), the host time those calls took
(perf_counter), and the time per call of a CUDA graph of 20 calls (median of 5 replays; bench/report.py's
time_graph). Where the host time reaches the eager time, an eagerly timed benchmark measures the Python wrapper, not
the kernel: this is why bench/report.py times the grid as graph replays (--timing graph, docs/decisions.md#graph-timing).

    PYTHONPATH=.fa3 python3 bench/micro/host_time.py
"""
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from flash_attn_interface import flash_attn_func

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from report import time_graph  # noqa: E402  (bench/report.py's graph timing: the grid's own method)


def time_eager(fn, calls=30):
    """(kernel time per call, host time per call) in us, of `calls` back-to-back calls after 5 warm-up calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host1 = time.perf_counter()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3, (host1 - host0) / calls * 1e6


def run(B, H, S, D, causal):
    q, k, v = [torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    flop = 4 * B * H * S * S * D / (2 if causal else 1)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    systems = (("fa3", lambda: flash_attn_func(q, k, v, causal=causal)), ("cudnn", cudnn))
    with torch.no_grad():
        for name, fn in systems:
            eager, host = time_eager(fn)
            graph = statistics.median(time_graph(torch, lambda i: fn(), 1, 5, 20)) * 1e3  # us, 5 replays of 20
            print(f"{name:6s} B={B} H={H} S={S} D={D} causal={int(causal)}: eager {eager:7.1f} us "
                  f"({flop / eager / 1e6:5.0f} TF), host {host:6.1f} us/call, graph {graph:7.1f} us "
                  f"({flop / graph / 1e6:5.0f} TF)")


if __name__ == "__main__":
    torch.manual_seed(0)
    for D in (64, 128, 256):
        for causal in (True, False):
            run(16384 // 512, 2048 // D, 512, D, causal)
    run(16, 16, 1024, 128, True)

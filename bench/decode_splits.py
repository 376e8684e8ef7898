#!/usr/bin/env python3
"""Decode time against the number of split-KV parts (num_splits: 0 = the library's choice, 1 = none, n = at most n),
dense and paged (page 64) caches, bf16, CUDA-graph medians (bench/serving.py's timer). Rows: batch x cache length.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python python3 bench/decode_splits.py [--head-dim 128]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashcore  # noqa: E402
from serving import decode_inputs, graph_time_us, paged_cache  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--rows", default="1x8192,8x8192,32x4096,128x2048")
ap.add_argument("--splits", default="0,1,4,8,13,16,24,32,48,64")
a = ap.parse_args()
D, Hq, Hkv = a.head_dim, 32, 8
splits = [int(s) for s in a.splits.split(",")]
print(f"{'row':>10} {'layout':>6} " + " ".join(f"{s:>7}" for s in splits) + "   (GB/s of K and V; column = num_splits)")
for row in a.rows.split(","):
    B, Sk = (int(x) for x in row.split("x"))
    q, kc, vc, lens = decode_inputs(B, Sk, Hq, Hkv, D)
    table, kp, vp = paged_cache(kc, vc)  # page 64, as bench/serving.py
    gb = 2 * kc.numel() * kc.element_size() / 1e9
    for name, args in (("dense", (q, kc, vc)), ("paged", (q, kp, vp))):
        kw = {"cache_seqlens": lens} | ({"block_table": table} if name == "paged" else {})
        cells = []
        for s in splits:
            us = graph_time_us(lambda: flashcore.attention_with_kvcache(*args, num_splits=s, **kw))
            cells.append(f"{gb / (us * 1e-6):7.0f}")
        print(f"{row:>10} {name:>6} " + " ".join(cells), flush=True)
    del q, kc, vc, kp, vp
    torch.cuda.empty_cache()

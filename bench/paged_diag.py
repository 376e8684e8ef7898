#!/usr/bin/env python3
"""Where paged decode loses against dense: one decode call (bf16, one new token, GQA) timed as

    plain       flashcore.attention(q, k_cache, v_cache)   (no cache lengths: the decode table's dense column)
    cache_lens  flashcore.attention_with_kvcache(..., cache_seqlens)   (a dense cache with per-sequence lengths)
    pagedP_shuf the same cache in pages of P keys, pages shuffled over the whole pool (the decode table's paged column)
    pagedP_ident the same pages in order (page i of sequence b at pool index b * pages_per_seq + i)

for page sizes 64, 128 and 256, each in a CUDA graph of 20 calls (bench/serving.py graph_time_us), best of --passes.
Every paged output is checked against the dense cache's. Prints one line per (batch, cache length) with microseconds
and GB/s of K and V.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:bench python3 bench/paged_diag.py
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashcore  # noqa: E402
from serving import decode_inputs, graph_time_us, paged_cache  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x8192,8x8192,32x4096", help="comma list of BATCHxCACHE_LEN")
    ap.add_argument("--heads", default="32,8", help="query heads, KV heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--pages", default="64,128,256")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--orders", default="shuf,ident", help="page orders to time: shuf (shuffled pool), ident (in order)")
    args = ap.parse_args()
    orders = args.orders.split(",")
    if not orders or any(o not in ("shuf", "ident") for o in orders):
        ap.error(f"--orders takes shuf and/or ident, not {args.orders!r}")
    hq, hkv = (int(x) for x in args.heads.split(","))
    D = args.head_dim
    torch.manual_seed(0)
    for shape in args.shapes.split(","):
        B, Sk = (int(x) for x in shape.split("x"))
        q, kc, vc, lens = decode_inputs(B, Sk, hq, hkv, D)
        kbytes = 2 * B * Sk * hkv * D * kc.element_size() / 1e3  # GB/s = kB / us
        ref = flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
        times = {}
        for _ in range(args.passes):
            times.setdefault("plain", []).append(graph_time_us(lambda: flashcore.attention(q, kc, vc)))
            times.setdefault("cache_lens", []).append(graph_time_us(
                lambda: flashcore.attention_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)))
            for page in (int(x) for x in args.pages.split(",")):
                for shuffled in [o == "shuf" for o in orders]:
                    table, kp, vp = paged_cache(kc, vc, page, shuffled)

                    def call():
                        return flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                                causal=True)
                    err = (call().float() - ref.float()).abs().max().item()
                    if err > 1e-2:
                        raise SystemExit(f"B={B} Sk={Sk} page {page}: paged output differs from dense by {err}")
                    key = f"paged{page}_{'shuf' if shuffled else 'ident'}"
                    times.setdefault(key, []).append(graph_time_us(call))
                    del kp, vp
        print(f"B={B} Sk={Sk}: " + "  ".join(f"{k} {min(v):.2f}us/{kbytes / min(v):.0f}GBps" for k, v in times.items()),
              flush=True)


if __name__ == "__main__":
    main()

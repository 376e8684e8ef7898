#!/usr/bin/env python3
"""Does the cache's address layout change decode bandwidth? One decode call (bf16, one new token, GQA 32/8, d128),
dense cache, timed with the same values in three layouts:

    contiguous  k, v (B, Sk, Hkv, D) as allocated: a token's heads in one 2 KB row, sequences 2^k rows apart
    padded      the same values in a (B, Sk, Hkv + 1, D) buffer, viewed as (B, Sk, Hkv, D): a 2304-byte token stride,
                so that split ranges and sequences no longer start at power-of-two offsets
    head_major  a (B, Hkv, Sk, D) buffer viewed as (B, Sk, Hkv, D): each head's keys contiguous

CUDA-graph medians (bench/serving.py graph_time_us), best of --passes; every output is checked against the
contiguous one. Prints us and GB/s of K and V per layout.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:bench python3 bench/decode_layout.py
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flashcore  # noqa: E402
from serving import decode_inputs, graph_time_us  # noqa: E402


def layouts(kc):
    B, Sk, H, D = kc.shape
    padded = torch.empty(B, Sk, H + 1, D, device=kc.device, dtype=kc.dtype)[:, :, :H, :]
    padded.copy_(kc)
    head_major = kc.transpose(1, 2).contiguous().transpose(1, 2)
    return {"contiguous": kc, "padded": padded, "head_major": head_major}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x8192,1x16384,1x32768,8x8192,16x65536", help="comma list of BATCHxCACHE_LEN")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        B, Sk = (int(x) for x in shape.split("x"))
        torch.manual_seed(B * 100003 + Sk)
        q, kc, vc, _ = decode_inputs(B, Sk)
        ks, vs = layouts(kc), layouts(vc)
        gb = 2 * kc.numel() * kc.element_size() / 1e9
        ref = flashcore.attention(q, kc, vc)
        parts = []
        for name in ks:
            k, v = ks[name], vs[name]
            out = flashcore.attention(q, k, v)
            err = (out.float() - ref.float()).abs().max().item()
            assert err == 0.0, f"{shape} {name}: output differs from the contiguous cache's by {err}"
            us = min(graph_time_us(lambda k=k, v=v: flashcore.attention(q, k, v)) for _ in range(args.passes))
            parts.append(f"{name} {us:.2f}us/{gb / us * 1e6:.0f}GBps")
        print(f"B={B} Sk={Sk}: " + "  ".join(parts), flush=True)
        del q, kc, vc, ks, vs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

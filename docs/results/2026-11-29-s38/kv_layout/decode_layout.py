#!/usr/bin/env python3
"""Decode GB/s with the KV cache's heads interleaved per token (B, S, H, D) or one head after another (B, H, S, D, as
a strided (B, S, H, D) view): the same values, the same library call, only where each head's keys lie. Session 38's
test of perf-notes v51's reading (the CTAs running at once read all heads of the same tokens).

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:bench python3 <this file>
"""
import torch

import flashcore
from serving import decode_inputs, graph_time_us

print("| row | layout | FlashCore GB/s | cuDNN GB/s |")
print("|---|---|---|---|")
for B, Sk in ((32, 4096), (33, 4096), (128, 2048), (132, 2048), (64, 16384)):
    torch.manual_seed(0)
    q, kc, vc, _ = decode_inputs(B, Sk)
    gb = 2 * kc.numel() * kc.element_size() / 1e9
    for name in ("BSHD", "BHSD"):
        k, v = (kc, vc) if name == "BSHD" else (kc.transpose(1, 2).contiguous().transpose(1, 2),
                                                 vc.transpose(1, 2).contiguous().transpose(1, 2))
        out = flashcore.attention(q, k, v)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2).float(), kc.transpose(1, 2).float(), vc.transpose(1, 2).float(), enable_gqa=True)
        err = (out.float() - ref.transpose(1, 2)).abs().max().item()
        assert err < 2e-2, f"{B}x{Sk} {name}: max error {err}"
        us = graph_time_us(lambda: flashcore.attention(q, k, v))
        qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            cu = graph_time_us(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True))
        print(f"| {B} x {Sk} | {name} | {gb / (us * 1e-6):.0f} | {gb / (cu * 1e-6):.0f} |", flush=True)
    del q, kc, vc
    torch.cuda.empty_cache()

#!/usr/bin/env python3
"""Decode with a KV cache, measured side by side in one process: FlashCore (torch op; split-KV and GQA packing
as the library's dispatch picks them), FlashAttention-3 (a build with flash_attn_with_kvcache on PYTHONPATH,
e.g. ../shared/fa3/serving: dense and paged cache) and cuDNN through PyTorch SDPA, on the same tensors.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:.fa3s python3 bench/serving.py --out serving

The figure is GB/s of K and V read (the cache bytes the batch attends to / kernel time in a CUDA graph), with
the fraction of the HBM peak (H200 4.8 TB/s, H100 3.35 TB/s). Each FlashCore output is checked against SDPA
in float32 before it is timed. Writes OUT/serving.json and OUT/serving.md.
"""
import argparse
import ctypes
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore

try:
    from flash_attn_interface import flash_attn_with_kvcache
except Exception:  # no FA3 serving build on the path
    flash_attn_with_kvcache = None

DECODE_ROWS = [(1, 8192), (8, 8192), (32, 4096), (64, 16384), (128, 2048), (16, 65536)]
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}


def graph_time_us(fn, reps=20, iters=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="serving_out")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", default="32,8", help="query heads, KV heads")
    ap.add_argument("--configs", default="", help="comma-separated kernel configs to time as well (explicitly named)")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    os.makedirs(args.out, exist_ok=True)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), float("nan"))
    dt, D = torch.bfloat16, args.head_dim
    Hq, Hkv = (int(x) for x in args.heads.split(","))
    rows = []
    torch.manual_seed(0)
    for B, Sk in DECODE_ROWS:
        q = torch.randn(B, 1, Hq, D, device="cuda", dtype=dt)
        kc = torch.randn(B, Sk, Hkv, D, device="cuda", dtype=dt)
        vc = torch.randn_like(kc)
        kv_bytes = 2 * B * Sk * Hkv * D * kc.element_size()
        row = {"B": B, "Sk": Sk, "Hq": Hq, "Hkv": Hkv, "D": D, "kv_MB": kv_bytes / 1e6}
        qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
        ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), enable_gqa=True).transpose(1, 2)
        out = flashcore.attention(q, kc, vc)
        row["flashcore_max_err"] = (out.float() - ref).abs().max().item()
        row["flashcore_config"] = _selected_config(q, kc, vc)
        row["flashcore_us"] = graph_time_us(lambda: flashcore.attention(q, kc, vc))
        # The same call without a workspace: the whole-tile kernel that dispatch runs when no split is possible.
        dense_out = torch.empty_like(q)
        params = _params(q, kc, vc, dense_out)
        lib = flashcore._lib.load()
        row["flashcore_nosplit_config"] = lib.selected_config(params)
        lib.forward(params, torch.cuda.current_stream().cuda_stream)
        row["flashcore_nosplit_max_err"] = (dense_out.float() - ref).abs().max().item()
        row["flashcore_nosplit_us"] = graph_time_us(
            lambda: lib.forward(params, torch.cuda.current_stream().cuda_stream))
        for config in args.configs:  # named kernel configs, each with the workspace it asks for
            config_name = ctypes.c_char_p(config.encode())  # alive until the next config
            cp = _params(q, kc, vc, dense_out)
            cp.kernel_config = ctypes.cast(config_name, ctypes.c_void_p)
            ws = torch.zeros(max(lib.workspace_size(cp), 256), dtype=torch.uint8, device="cuda")
            cp.workspace, cp.workspace_size = ws.data_ptr(), ws.numel()
            dense_out.fill_(float("nan"))
            lib.forward(cp, torch.cuda.current_stream().cuda_stream)
            row[f"cfg {config} max_err"] = (dense_out.float() - ref).abs().max().item()
            row[f"cfg {config}_us"] = graph_time_us(lambda: lib.forward(cp, torch.cuda.current_stream().cuda_stream))
        if flash_attn_with_kvcache is not None:
            lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
            row["fa3_dense_us"] = graph_time_us(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                                causal=True))
            page, nblk = 64, Sk // 64
            table = torch.randperm(B * nblk, device="cuda", dtype=torch.int32).reshape(B, nblk)
            kp = torch.empty(B * nblk, page, Hkv, D, device="cuda", dtype=dt)
            vp = torch.empty_like(kp)
            kp[table.flatten().long()] = kc.reshape(B * nblk, page, Hkv, D)
            vp[table.flatten().long()] = vc.reshape(B * nblk, page, Hkv, D)
            row["fa3_paged64_us"] = graph_time_us(lambda: flash_attn_with_kvcache(
                q, kp, vp, cache_seqlens=lens, page_table=table, causal=True))
            del kp, vp

        def cud():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        try:
            row["cudnn_dense_us"] = graph_time_us(cud)
        except Exception as e:  # cuDNN missing or refusing the shape
            row["cudnn_err"] = repr(e)[:120]
        for k in [k for k in row if k.endswith("_us")]:
            row[k.replace("_us", "_GBps")] = kv_bytes / (row[k] * 1e-6) / 1e9
        rows.append(row)
        print("decode " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
        del q, kc, vc, qt, kt, vt, ref, out, dense_out
        torch.cuda.empty_cache()

    systems = [s for s in ("flashcore", "flashcore_nosplit", "fa3_dense", "fa3_paged64", "cudnn_dense") if f"{s}_GBps" in rows[0]]
    lines = [f"Decode, {name}, bf16, d{D}, {Hq} query heads / {Hkv} KV heads, one new token; GB/s of K and V "
             f"read (fraction of the {peak:.0f} GB/s HBM peak); CUDA-graph median", "",
             "| batch x cache | " + " | ".join(systems) + " | FlashCore / best other | FlashCore config |",
             "|---|" + "---|" * (len(systems) + 2)]
    for r in rows:
        others = [r[f"{s}_GBps"] for s in systems if not s.startswith("flashcore")]
        best = max(others) if others else float("nan")
        cells = [f"{r[f'{s}_GBps']:.0f} ({r[f'{s}_GBps'] / peak:.0%})" for s in systems]
        lines.append(f"| {r['B']} x {r['Sk'] // 1024}k | " + " | ".join(cells)
                     + f" | {r['flashcore_GBps'] / best:.2f} | {r.get('flashcore_config')} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "serving.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "serving.json"), "w") as f:
        json.dump({"device": name, "peak_GBps": peak, "decode": rows}, f, indent=1, default=str)


def _params(q, k, v, out):
    """C params of attention(q, k, v) -> out without LSE and without a workspace."""
    from flashcore import _lib, _ops
    return _ops.kernel_params(_lib.load(), q, k, v, out, None, False, q.shape[3] ** -0.5)


def _selected_config(q, k, v):
    """The kernel config flashcore.attention(q, k, v) runs (the op passes a workspace when one is needed)."""
    from flashcore import _lib
    lib = _lib.load()
    out = torch.empty_like(q)
    params = _params(q, k, v, out)
    size = lib.workspace_size(params)
    if size:
        ws = torch.zeros(size, dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_size = ws.data_ptr(), size
    return lib.selected_config(params)


if __name__ == "__main__":
    main()

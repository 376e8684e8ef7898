#!/usr/bin/env python3
"""Serving shapes measured side by side in one process, on the same tensors: FlashCore (torch ops), FlashAttention-3
(a build with flash_attn_with_kvcache / flash_attn_varlen_func on PYTHONPATH, e.g. ../shared/fa3/serving) and cuDNN
through PyTorch SDPA.

    FLASHCORE_LIBRARY=build/lib/libflashcore.so PYTHONPATH=python:.fa3s python3 bench/serving.py --out serving

Tables (--tables, comma-separated; default both):

  decode  one new token against a KV cache: FlashCore dense (split-KV and GQA packing as the library's dispatch
          picks them), FlashCore dense without a workspace (no split), FA3 dense, FlashCore paged (page 64,
          flashcore.attention_with_kvcache with block_table), FA3 paged (page 64, page_table), cuDNN dense. The
          figure is GB/s of K and V read (the cache bytes the batch attends to / kernel time in a CUDA graph), with
          the fraction of the HBM peak (H200 4.8 TB/s, H100 3.35 TB/s). Each FlashCore output (dense and paged) is
          checked against SDPA in float32 before it is timed.
  varlen  variable-length prefill as ../shared/fa3/anchor_serving.py measures it (so the FA3 numbers compare with
          its anchors): batch 32, lengths drawn uniformly from [64, 4096) by torch.randint after
          torch.manual_seed(0), one draw per (head dim, causal) case in the order d64 full, d64 causal, d128 full,
          d128 causal; bf16; 2048 / D heads for q, k and v (32 at d64, 16 at d128; --varlen-heads HQ,HKV for GQA);
          FlashCore varlen_attention against FA3 flash_attn_varlen_func. TFLOPS counts sum over sequences of
          4 * H * L^2 * D, halved when causal (anchor_serving.py's formula); CUDA-graph median. Both outputs are
          checked against SDPA in float32, per sequence.

Writes OUT/serving.json and OUT/serving.md (one markdown table per selected table).
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
try:
    from flash_attn_interface import flash_attn_varlen_func
except Exception:
    flash_attn_varlen_func = None

DECODE_ROWS = [(1, 8192), (8, 8192), (32, 4096), (64, 16384), (128, 2048), (16, 65536)]
PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0}
TABLES = ("decode", "varlen")
PAGE = 64  # page size of the paged columns (FA3's and FlashCore's)
# Variable-length prefill, as ../shared/fa3/anchor_serving.py: (head dim, causal) in its order, batch 32, lengths
# in [64, 4096) from the CPU generator seeded 0.
VARLEN_CASES = [(64, False), (64, True), (128, False), (128, True)]
VARLEN_BATCH, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED = 32, 64, 4096, 0


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
    ap.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated tables to measure: {', '.join(TABLES)}")
    ap.add_argument("--head-dim", type=int, default=128, help="decode table: head dim")
    ap.add_argument("--heads", default="32,8", help="decode table: query heads, KV heads")
    ap.add_argument("--configs", default="", help="decode table: comma-separated kernel configs to time as well "
                    "(explicitly named)")
    ap.add_argument("--varlen-heads", default="anchor",
                    help="varlen table: 'anchor' (2048 / D heads for q, k and v, as anchor_serving.py) or HQ,HKV")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    args.tables = [t for t in args.tables.split(",") if t]
    unknown = [t for t in args.tables if t not in TABLES]
    if unknown or not args.tables:
        ap.error(f"--tables: unknown {unknown} (choose from {', '.join(TABLES)})")
    os.makedirs(args.out, exist_ok=True)
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), float("nan"))
    result = {"device": name, "peak_GBps": peak}
    sections = []
    if "decode" in args.tables:
        rows = decode_rows(args)
        result["decode"] = rows
        sections.append(decode_table(rows, name, peak, args))
    if "varlen" in args.tables:
        rows = varlen_rows(args)
        result["varlen"] = rows
        sections.append(varlen_table(rows, name, args))
    text = "\n\n".join(sections)
    print(text)
    with open(os.path.join(args.out, "serving.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "serving.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)


def decode_rows(args):
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
        # Paged caches (page 64): the same K/V, pages shuffled through a block table; FlashCore's and FA3's columns
        # read the same pages.
        lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
        nblk = Sk // PAGE
        table = torch.randperm(B * nblk, device="cuda", dtype=torch.int32).reshape(B, nblk)
        kp = torch.empty(B * nblk, PAGE, Hkv, D, device="cuda", dtype=dt)
        vp = torch.empty_like(kp)
        kp[table.flatten().long()] = kc.reshape(B * nblk, PAGE, Hkv, D)
        vp[table.flatten().long()] = vc.reshape(B * nblk, PAGE, Hkv, D)

        def fc_paged():
            return flashcore.attention_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table, causal=True)
        try:
            row["flashcore_paged64_max_err"] = (fc_paged().float() - ref).abs().max().item()
            row["flashcore_paged64_us"] = graph_time_us(fc_paged)
        except Exception as e:  # a library without the paged path
            row["flashcore_paged64_err"] = repr(e)[:160]
        if flash_attn_with_kvcache is not None:
            row["fa3_dense_us"] = graph_time_us(lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                                causal=True))
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
    return rows


DECODE_SYSTEMS = ("flashcore", "flashcore_nosplit", "fa3_dense", "flashcore_paged64", "fa3_paged64", "cudnn_dense")


def decode_table(rows, name, peak, args):
    Hq, Hkv = (int(x) for x in args.heads.split(","))
    systems = [s for s in DECODE_SYSTEMS if any(f"{s}_GBps" in r for r in rows)]
    paged_ratio = "flashcore_paged64" in systems and "fa3_paged64" in systems
    lines = [f"Decode, {name}, bf16, d{args.head_dim}, {Hq} query heads / {Hkv} KV heads, one new token; GB/s of K "
             f"and V read (fraction of the {peak:.0f} GB/s HBM peak); CUDA-graph median; paged columns: page "
             f"{PAGE}, pages shuffled", "",
             "| batch x cache | " + " | ".join(systems) + " | FlashCore / best other |"
             + (" FlashCore paged / FA3 paged |" if paged_ratio else "") + " FlashCore config |",
             "|---|" + "---|" * (len(systems) + 2 + paged_ratio)]

    def cell(r, s):
        return f"{r[f'{s}_GBps']:.0f} ({r[f'{s}_GBps'] / peak:.0%})" if f"{s}_GBps" in r else "-"

    for r in rows:
        others = [r[f"{s}_GBps"] for s in systems if not s.startswith("flashcore") and f"{s}_GBps" in r]
        best = max(others) if others else float("nan")
        line = (f"| {r['B']} x {r['Sk'] // 1024}k | " + " | ".join(cell(r, s) for s in systems)
                + f" | {r['flashcore_GBps'] / best:.2f} |")
        if paged_ratio:
            ratio = r.get("flashcore_paged64_GBps", float("nan")) / r.get("fa3_paged64_GBps", float("nan"))
            line += f" {ratio:.2f} |"
        lines.append(line + f" {r.get('flashcore_config')} |")
    return "\n".join(lines)


def varlen_lengths():
    """The four length lists of anchor_serving.py's varlen anchor, in VARLEN_CASES order (drawn in that order from
    the CPU generator seeded VARLEN_SEED, whatever subset is measured)."""
    gen = torch.Generator().manual_seed(VARLEN_SEED)
    return [torch.randint(VARLEN_MIN, VARLEN_MAX, (VARLEN_BATCH,), generator=gen).tolist() for _ in VARLEN_CASES]


def _varlen_heads(args, D):
    if args.varlen_heads == "anchor":
        return 2048 // D, 2048 // D
    Hq, Hkv = (int(x) for x in args.varlen_heads.split(","))
    return Hq, Hkv


def _varlen_max_err(out, q, k, v, lens, causal):
    """Largest |out - SDPA in float32| over the sequences of a packed batch (out: (total, Hq, D))."""
    worst, start = 0.0, 0
    for L in lens:
        qs, ks, vs = (t[start:start + L].transpose(0, 1).float() for t in (q, k, v))  # (H, L, D)
        ref = F.scaled_dot_product_attention(qs[None], ks[None], vs[None], is_causal=causal,
                                             enable_gqa=True)[0].transpose(0, 1)
        worst = max(worst, (out[start:start + L].float() - ref).abs().max().item())
        start += L
    return worst


def varlen_rows(args):
    dt = torch.bfloat16
    rows = []
    for (D, causal), lens in zip(VARLEN_CASES, varlen_lengths()):
        Hq, Hkv = _varlen_heads(args, D)
        total = sum(lens)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
        q = torch.randn(total, Hq, D, device="cuda", dtype=dt)
        k = torch.randn(total, Hkv, D, device="cuda", dtype=dt)
        v = torch.randn_like(k)
        max_len = max(lens)
        flops = sum(4 * Hq * L * L * D for L in lens) / (2 if causal else 1)
        row = {"D": D, "causal": causal, "batch": len(lens), "tokens": total, "max_len": max_len, "Hq": Hq,
               "Hkv": Hkv, "GFLOP": flops / 1e9}

        def fc():
            return flashcore.varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=causal)
        try:
            row["flashcore_max_err"] = _varlen_max_err(fc(), q, k, v, lens, causal)
            row["flashcore_config"] = _varlen_selected_config(q, k, v, cu, max_len, causal)
            row["flashcore_us"] = graph_time_us(fc)
        except Exception as e:  # a library without the varlen path
            row["flashcore_err"] = repr(e)[:160]
        if flash_attn_varlen_func is not None:
            def fa3():
                return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=causal)
            row["fa3_max_err"] = _varlen_max_err(fa3(), q, k, v, lens, causal)
            row["fa3_us"] = graph_time_us(fa3)
        for key in [key for key in row if key.endswith("_us")]:
            row[key.replace("_us", "_tflops")] = flops / (row[key] * 1e-6) / 1e12
        rows.append(row)
        print("varlen " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
        del q, k, v, cu
        torch.cuda.empty_cache()
    return rows


def varlen_table(rows, name, args):
    heads = ("2048 / D heads for q, k and v (MHA)" if args.varlen_heads == "anchor"
             else f"{args.varlen_heads.replace(',', ' query heads / ')} KV heads")
    lines = [f"Variable-length prefill, {name}, bf16, batch {VARLEN_BATCH}, lengths uniform in [{VARLEN_MIN}, "
             f"{VARLEN_MAX}) (seed {VARLEN_SEED}, as shared/fa3/anchor_serving.py), {heads}; TFLOPS (4 H L^2 D per "
             f"sequence, halved for causal); CUDA-graph median", "",
             "| head dim | mask | heads | tokens | FlashCore | FA3 | FlashCore / FA3 | max err FlashCore / FA3 | "
             "FlashCore config |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fc, fa = r.get("flashcore_tflops"), r.get("fa3_tflops")
        ratio = f"{fc / fa:.2f}" if fc and fa else "-"
        err_fc = (f"{r['flashcore_max_err']:.2g}" if "flashcore_max_err" in r
                  else "failed (serving.json)" if "flashcore_err" in r else "-")
        err_fa = f"{r['fa3_max_err']:.2g}" if "fa3_max_err" in r else "-"
        lines.append(f"| {r['D']} | {'causal' if r['causal'] else 'full'} | {r['Hq']}/{r['Hkv']} | {r['tokens']} | "
                     f"{f'{fc:.0f}' if fc else '-'} | {f'{fa:.0f}' if fa else '-'} | {ratio} | {err_fc} / {err_fa} | "
                     f"{r.get('flashcore_config', '-')} |")
    return "\n".join(lines)


def _params(q, k, v, out):
    """C params of attention(q, k, v) -> out without LSE and without a workspace."""
    from flashcore import _lib, _ops
    return _ops.kernel_params(_lib.load(), q, k, v, out, None, False, q.shape[3] ** -0.5)


def _varlen_selected_config(q, k, v, cu, max_len, causal):
    """The kernel config flashcore.varlen_attention runs for this packed batch."""
    from flashcore import _lib, _ops
    lib = _lib.load()
    out = torch.empty_like(q)
    params = _ops.kernel_params(lib, q, k, v, out, None, causal, q.shape[2] ** -0.5, cu_seqlens_q=cu,
                                cu_seqlens_k=cu, max_seqlen_q=max_len, max_seqlen_k=max_len)
    size = lib.workspace_size(params)
    if size:
        ws = torch.zeros(size, dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_size = ws.data_ptr(), size
    return lib.selected_config(params)


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

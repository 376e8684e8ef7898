"""Decode on an e4m3 KV cache (FLASHCORE_FLAG_KV_FP8_E4M3, library 0.9) against the 16-bit cache, FA3 and cuDNN.

One new token per sequence (bf16 Q, d128, 32 query / 8 KV heads by default) against a full cache of Sk keys, CUDA-graph
medians, the systems interleaved row by row and --rounds times over. Columns:
  fc_bf16      flashcore.attention on the bf16 cache (the library's own dispatch: split-KV, GQA packing)
  fc_e4m3      the same call on the e4m3 cache (bf16 Q, K/V e4m3 with per-(batch, KV head) descales)
  fa3_bf16     FA3 on the bf16 cache: flash_attn_with_kvcache (--fa3 kvcache, ../shared/fa3/serving on the path) or
               flash_attn_func on the full cache as a dense K/V (--fa3 func, ../shared/fa3/prefill: no split-KV)
  fa3_e4m3     FA3's FP8 path on the e4m3 cache (it takes Q in e4m3 too: Q quantized per tensor, outside the timing);
               only FA3's prefill build has FP8 (--fa3 func)
  cudnn_bf16   PyTorch SDPA's cuDNN backend on the bf16 cache
  fc_e4m3_b    with --lib-b: fc_e4m3's call through a second libflashcore.so (an A/B in one process), and
  fc_bf16_b    fc_bf16's as a C call through it; a second library after a comma: fc_e4m3_c, fc_bf16_c
GB/s counts the K/V bytes each system reads (1 byte per element in e4m3, 2 in bf16); "speed-up" is fc_bf16's time
over fc_e4m3's (the token rate, since both read the same keys). Errors: max |O - O_ref| against float32 SDPA on the
dequantized e4m3 cache (e4m3 columns) or on the bf16 cache (bf16 columns).

  python3 bench/kv_fp8.py [--rows 1x8192,8x8192] [--dtype bf16|fp16] [--rounds 3] [--fa3 kvcache|func] [--lib-b LIB] [--out DIR]
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashcore
from flashcore import _lib, _ops
from serving import graph_time_us  # bench/serving.py's CUDA-graph median (this script runs from bench/)

try:
    from flash_attn_interface import flash_attn_func, flash_attn_with_kvcache
except Exception:  # no FA3 build on the path
    flash_attn_func = flash_attn_with_kvcache = None

ROWS = [(1, 8192), (8, 8192), (32, 4096), (64, 16384), (16, 65536)]
FLAG_KV_FP8_E4M3 = 2


def quantize(x):
    """x (B, S, H, D) -> (e4m3 copy, descale (B, H) float32): per (batch, head) scale amax / 448."""
    amax = x.float().abs().amax(dim=(1, 3)).clamp(min=1e-6)
    descale = (amax / 448.0).contiguous()
    q8 = (x.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q8, descale


def dequantize(x8, descale):
    return x8.float() * descale[:, None, :, None]


def sdpa_ref(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                          v.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)


def e4m3_call(lib, q, k8, v8, kd, vd, out):
    """The C call on the e4m3 cache: the bf16 call's params with K/V swapped for the e4m3 tensors (same shape and
    element strides), the flag and the descales; a zero-filled workspace where the plan asks for one. Returns the
    call and what must stay alive with it."""
    params = _ops.kernel_params(lib, q, torch.empty_like(k8, dtype=q.dtype), torch.empty_like(v8, dtype=q.dtype), out,
                                None, False, q.shape[3] ** -0.5)
    params.k, params.v = k8.data_ptr(), v8.data_ptr()
    params.flags = params.flags | FLAG_KV_FP8_E4M3
    params.k_descale, params.v_descale = kd.data_ptr(), vd.data_ptr()
    return c_call(lib, params, out)


def bf16_call(lib, q, k16, v16, out):
    """The C call on the 16-bit cache (flashcore.attention's call, through `lib`)."""
    return c_call(lib, _ops.kernel_params(lib, q, k16, v16, out, None, False, q.shape[3] ** -0.5), out)


def c_call(lib, params, out):
    size = lib.workspace_size(params)
    ws = torch.zeros(max(size, 256), dtype=torch.uint8, device=out.device)
    params.workspace, params.workspace_size = ws.data_ptr(), ws.numel()
    def call():  # on the caller's current stream (a graph capture's)
        lib.forward(params, torch.cuda.current_stream().cuda_stream)
        return out
    return call, (params, ws), lib.selected_config(params)


def row(B, Sk, hq, hkv, D, rounds, fa3, libs_b=(), dtype=torch.bfloat16):
    q = torch.randn(B, 1, hq, D, device="cuda", dtype=dtype)
    k16 = torch.randn(B, Sk, hkv, D, device="cuda", dtype=dtype)
    v16 = torch.randn_like(k16)
    k8, kd = quantize(k16)
    v8, vd = quantize(v16)
    lens = torch.full((B,), Sk, device="cuda", dtype=torch.int32)
    lib = _lib.load()
    out8 = torch.empty_like(q)
    fc8, keep, config8 = e4m3_call(lib, q, k8, v8, kd, vd, out8)  # noqa: F841 (keep: alive while timed)
    ref8 = sdpa_ref(q, dequantize(k8, kd), dequantize(v8, vd))
    ref16 = sdpa_ref(q, k16, v16)
    r = {"B": B, "Sk": Sk, "Hq": hq, "Hkv": hkv, "D": D, "fc_e4m3_config": config8}
    r["fc_e4m3_err"] = (fc8().float() - ref8).abs().max().item()
    r["fc_bf16_err"] = (flashcore.attention(q, k16, v16).float() - ref16).abs().max().item()
    systems = {"fc_bf16": (lambda: flashcore.attention(q, k16, v16), 2), "fc_e4m3": (fc8, 1)}
    keep_b = []  # alive while timed
    for tag, lib_b in zip("bc", libs_b):
        fc8b, keep, r[f"fc_e4m3_{tag}_config"] = e4m3_call(lib_b, q, k8, v8, kd, vd, torch.empty_like(q))
        keep_b.append(keep)
        r[f"fc_e4m3_{tag}_err"] = (fc8b().float() - ref8).abs().max().item()
        systems[f"fc_e4m3_{tag}"] = (fc8b, 1)
        fc16b, keep, r[f"fc_bf16_{tag}_config"] = bf16_call(lib_b, q, k16, v16, torch.empty_like(q))
        keep_b.append(keep)
        systems[f"fc_bf16_{tag}"] = (fc16b, 2)
    if flash_attn_func is not None:
        q8 = (q.float() / (q.float().abs().amax() / 448.0)).to(torch.float8_e4m3fn)
        qd = (q.float().abs().amax() / 448.0).reshape(1, 1).expand(B, hkv).contiguous()
        if fa3 == "kvcache":
            systems["fa3_bf16"] = (lambda: flash_attn_with_kvcache(q, k16, v16, cache_seqlens=lens, causal=True), 2)

            def fa3_8():
                return flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, causal=True, q_descale=qd,
                                               k_descale=kd, v_descale=vd)
        else:  # the full cache as a dense K/V (causal: the one query row sees every key)
            systems["fa3_bf16"] = (lambda: flash_attn_func(q, k16, v16, causal=True), 2)

            def fa3_8():
                return flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
        try:
            o = fa3_8()
            o = o[0] if isinstance(o, tuple) else o
            r["fa3_e4m3_err"] = (o.float() - ref8).abs().max().item()
            systems["fa3_e4m3"] = (fa3_8, 1)
        except Exception as e:
            r["fa3_e4m3_error"] = repr(e)[:160]
    qt, kt, vt = q.transpose(1, 2), k16.transpose(1, 2), v16.transpose(1, 2)

    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
    try:
        cud()
        systems["cudnn_bf16"] = (cud, 2)
    except Exception as e:
        r["cudnn_error"] = repr(e)[:160]
    times = {s: [] for s in systems}
    for _ in range(rounds):  # interleaved: every system once per round
        for s, (fn, _) in systems.items():
            times[s].append(graph_time_us(fn))
    for s, (fn, elem) in systems.items():
        us = statistics.median(times[s])
        r[f"{s}_us"] = us
        r[f"{s}_rounds_us"] = times[s]
        r[f"{s}_GBps"] = 2 * B * Sk * hkv * D * elem / (us * 1e-6) / 1e9
    r["speedup_e4m3_over_bf16"] = r["fc_bf16_us"] / r["fc_e4m3_us"]
    del q, k16, v16, k8, v8
    torch.cuda.empty_cache()
    return r


def markdown(rows, name):
    cols = ["fc_bf16", "fc_e4m3"] + [c for c in ("fc_bf16_b", "fc_e4m3_b", "fc_bf16_c", "fc_e4m3_c")
                                     if any(c + "_us" in r for r in rows)] + ["fa3_bf16", "fa3_e4m3", "cudnn_bf16"]
    lines = [f"Decode on an e4m3 KV cache, {name}: us (GB/s of K/V bytes read), CUDA-graph medians of the rounds",
             "", "| B x Sk | " + " | ".join(cols) + " | e4m3 / bf16 speed-up | e4m3 err (fc / fa3) |",
             "|---|" + "---|" * (len(cols) + 2)]
    for r in rows:
        cells = [f"{r[c + '_us']:.1f} ({r[c + '_GBps']:.0f})" if c + "_us" in r else "-" for c in cols]
        errs = f"{r['fc_e4m3_err']:.2e} / " + (f"{r['fa3_e4m3_err']:.2e}" if "fa3_e4m3_err" in r else "-")
        lines.append(f"| {r['B']} x {r['Sk']} | " + " | ".join(cells) +
                     f" | {r['speedup_e4m3_over_bf16']:.2f} | {errs} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="", help="comma-separated BATCHxCACHE_LEN rows")
    ap.add_argument("--heads", default="32,8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fa3", choices=["kvcache", "func"], default="kvcache",
                    help="FA3's entry: flash_attn_with_kvcache (serving build) or flash_attn_func (prefill build, FP8)")
    ap.add_argument("--lib-b", default="", help="a second libflashcore.so (its e4m3 and 16-bit calls: columns "
                    "fc_e4m3_b, fc_bf16_b), or two separated by a comma (and fc_e4m3_c, fc_bf16_c)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                    help="Q and the 16-bit cache (the fc_bf16, fa3_bf16 and cudnn_bf16 columns are then fp16)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lib_b_paths = [p for p in args.lib_b.split(",") if p]
    libs_b = [_lib.Library(p) for p in lib_b_paths]
    hq, hkv = (int(x) for x in args.heads.split(","))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.rows.split(",") if s] or ROWS
    torch.manual_seed(0)
    name = torch.cuda.get_device_name()
    rows = []
    for B, Sk in shapes:
        rows.append(row(B, Sk, hq, hkv, args.head_dim, args.rounds, args.fa3, libs_b,
                        torch.float16 if args.dtype == "fp16" else torch.bfloat16))
        print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_rounds_us")}), flush=True)
    md = markdown(rows, f"{name}, {args.dtype} Q (16-bit columns: {args.dtype} caches), library "
                  f"{_lib.load().version_string()}, FA3 through --fa3 {args.fa3}" +
                  "".join(f", fc_*_{t}: {p}" for t, p in zip("bc", lib_b_paths)))
    print(md)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "kv_fp8.json"), "w") as f:
            json.dump({"device": name, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "kv_fp8.md"), "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()

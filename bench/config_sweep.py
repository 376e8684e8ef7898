#!/usr/bin/env python3
"""Every compiled kernel config of one backend against a baseline system, cell by cell, on the same tensors.

For tile-config work (which rows of a configs.txt to keep, which to make the default): on each cell of the grid
(batch = 16384/S, heads = 2048/D, bf16 or fp16, (B, H, S, D) randn inputs, rotated sets > 2x L2) every config the
library lists for (dtype, head dim, mask) runs by name (kernel_config), next to the baseline (FA2 or cuDNN through
PyTorch SDPA, or the library's own default dispatch). Each config's output is compared with the baseline's
(max |diff|; a config more than --tol away is marked BAD). Timing: CUDA events, median of --iters calls after
--warmup, --passes alternating passes over the systems (the median over all passes is reported), so that clock
drift does not favour whoever runs first.

    FLASHCORE_BACKEND=sm80 python3 bench/config_sweep.py --baseline fa2 --out sweep.md   # the portable backend
    python3 bench/config_sweep.py --head-dims 128 --seqlens 4096,8192 --baseline cudnn
    python3 bench/config_sweep.py --precision int8 --baseline default --causal 0   # the int8 Q K^T rows
    PYTHONPATH=../shared/fa3/prefill python3 bench/config_sweep.py --precision e4m3 --baseline fa3   # vs FA3's FP8

--precision fp8 / int8: the 16-bit inputs go through the library's quantization (timed with the call, the same for
every config) and the rows listed under the e4m3 / int8 key run by name; the baseline is then the library's default.
--precision e4m3: the inputs are quantized once, before timing (per (batch, KV head), flashcore.quantize_fp8, as
bench/report.py --fp8 does), and the e4m3 rows run on them (bshd layout, bf16 O); the baseline is the library's
default or FA3's FP8 (--baseline fa3: flash_attn_interface on the same e4m3 tensors and descales).

Writes a markdown table (TFLOPS per config and the baseline, the best config's ratio) and a JSON file beside it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from report import tflops_of, time_calls  # noqa: E402  (same timing rule as the report)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="config_sweep.md", help="markdown output (JSON beside it)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--causal", choices=["0", "1", "both"], default="both")
    ap.add_argument("--baseline", choices=["fa2", "cudnn", "default", "fa3"], default="fa2",
                    help="fa3: FA3's FP8 (with --precision e4m3 only)")
    ap.add_argument("--precision", choices=["native", "fp8", "int8", "e4m3"], default="native",
                    help="fp8 / int8: the library quantizes the inputs and runs its 8-bit rows (baseline: default); "
                         "e4m3: inputs quantized before timing, the e4m3 rows (baseline: default or fa3)")
    ap.add_argument("--configs", default="", help="comma-separated config names (default: all the library lists)")
    ap.add_argument("--v-transposed", action="store_true",
                    help="--precision e4m3: V transposed once per input set before timing (FLAG_V_TRANSPOSED), so "
                         "that the configs run without their V transposition (the baseline still reads V as stored)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--tol", type=float, default=0.03, help="max |config - baseline| before a config is marked BAD")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--bh", default="", help="BATCH,HEADS for every cell instead of 16384/S, 2048/D (small grids: the "
                    "wave quantization of sm90::wave_row)")
    args = ap.parse_args(argv)
    bh = tuple(int(x) for x in args.bh.split(",")) if args.bh else None
    if bh is not None and (len(bh) != 2 or min(bh) < 1):
        ap.error(f"--bh takes BATCH,HEADS (positive), not {args.bh!r}")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashcore_ctypes import (DTYPE_BF16, DTYPE_FP8_E4M3, DTYPE_FP16, DTYPE_INT8, PRECISION_FP8, PRECISION_INT8,
                                  PRECISION_NATIVE, FlashCoreLib)

    fc = FlashCoreLib(args.lib)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    lib_dtype = {"bf16": DTYPE_BF16, "fp16": DTYPE_FP16}[args.dtype]
    e4m3 = args.precision == "e4m3"
    precision = {"native": PRECISION_NATIVE, "fp8": PRECISION_FP8, "int8": PRECISION_INT8,
                 "e4m3": PRECISION_NATIVE}[args.precision]
    key_dtype = {"native": lib_dtype, "fp8": DTYPE_FP8_E4M3, "int8": DTYPE_INT8,
                 "e4m3": DTYPE_FP8_E4M3}[args.precision]  # the rows' key
    if args.precision in ("fp8", "int8") and args.baseline != "default":
        ap.error("--precision fp8 / int8 compares the library's own rows: use --baseline default")
    if args.v_transposed and not e4m3:
        ap.error("--v-transposed goes with --precision e4m3")
    if (args.baseline == "fa3" and not e4m3) or (e4m3 and args.baseline not in ("default", "fa3")):
        ap.error("--baseline fa3 goes with --precision e4m3, whose baseline is default or fa3")
    fa3 = None
    if args.baseline == "fa3":
        import flash_attn_interface as fa3  # ../shared/fa3/prefill on PYTHONPATH
    if e4m3:
        from flashcore import quantize_fp8
    l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 50 * 2**20)
    causals = [False, True] if args.causal == "both" else [args.causal == "1"]
    wanted = [c for c in args.configs.split(",") if c]
    rows = []
    for D in (int(x) for x in args.head_dims.split(",")):
        for causal in causals:
            configs = list(fc.library.kernel_configs(key_dtype, D, causal))
            if wanted:
                configs = [c for c in configs if c in wanted]
            for S in (int(x) for x in args.seqlens.split(",")):
                B, H = bh if bh is not None else (max(1, 16384 // S), max(1, 2048 // D))
                nsets = (2 * l2) // (4 * B * H * S * D * 2) + 1
                gen = torch.Generator(device="cuda")
                gen.manual_seed(1234 + S + D)
                descales = []
                if e4m3:  # bshd e4m3 Q, K, V and their (batch, KV head) descales; O is bf16 (B, S, H, D)
                    sets = []
                    for _ in range(nsets):
                        quantized = [quantize_fp8(torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16,
                                                              generator=gen)) for _ in range(3)]
                        sets.append(tuple(x for x, _ in quantized))
                        descales.append(tuple(d for _, d in quantized))
                else:
                    sets = [tuple(torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=gen)
                                  for _ in range(3)) for _ in range(nsets)]
                systems = {}
                if args.baseline in ("fa2", "cudnn"):
                    be = SDPBackend.FLASH_ATTENTION if args.baseline == "fa2" else SDPBackend.CUDNN_ATTENTION

                    def sdpa(i, be=be):
                        with sdpa_kernel([be]):
                            return F.scaled_dot_product_attention(*sets[i], is_causal=causal)
                    systems[args.baseline] = sdpa
                if args.baseline == "fa3":
                    def fa3_fp8(i):
                        (q8, k8, v8), (qd, kd, vd) = sets[i], descales[i]
                        out = fa3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
                        return out[0] if isinstance(out, tuple) else out
                    systems["fa3"] = fa3_fp8
                keep = []  # params point at these buffers
                for name in ([None] if args.baseline == "default" else []) + configs:
                    plist, outs = [], []
                    cname = ctypes.create_string_buffer(name.encode()) if name else None
                    for i, (q, k, v) in enumerate(sets):
                        cfg = ctypes.addressof(cname) if cname is not None else 0
                        if e4m3:
                            o = torch.full(q.shape, float("nan"), device="cuda", dtype=torch.bfloat16)
                            prm = fc.params_for(q, k, v, o, causal=causal, bhsd=False, descales=descales[i],
                                                kernel_config=cfg, v_transposed=args.v_transposed)
                        else:
                            o = torch.full_like(q, float("nan"))
                            prm = fc.params_for(q, k, v, o, causal=causal, bhsd=True, precision=precision,
                                                kernel_config=cfg)
                        plist.append(prm)
                        outs.append(o)
                    keep.append((cname, plist, outs))

                    def call(i, plist=plist, outs=outs):
                        fc.forward(plist[i], torch.cuda.current_stream().cuda_stream)
                        return outs[i]
                    systems[name or "default"] = call
                base_name = args.baseline
                ref = systems[base_name](0).float()
                times = {n: [] for n in systems}
                errors = {}
                for n, fn in systems.items():
                    if n != base_name:
                        errors[n] = (fn(0).float() - ref).abs().max().item()
                for p in range(args.passes):
                    order = list(systems) if p % 2 == 0 else list(reversed(systems))
                    for n in order:
                        times[n] += time_calls(torch, systems[n], nsets, args.iters, args.warmup)
                row = {"D": D, "causal": causal, "S": S, "B": B, "H": H,
                       "tflops": {n: tflops_of(B, H, S, D, causal, statistics.median(t)) for n, t in times.items()},
                       "max_err": errors}
                ok = {n: v for n, v in row["tflops"].items() if n != base_name and errors.get(n, 1) <= args.tol}
                row["best"] = max(ok, key=ok.get) if ok else None
                rows.append(row)
                print(f"D={D} causal={int(causal)} S={S}: " +
                      ", ".join(f"{n} {v:.0f}" + ("" if n == base_name or errors[n] <= args.tol else " BAD")
                                for n, v in row["tflops"].items()), flush=True)
                del sets, systems, keep
                torch.cuda.empty_cache()
                fc.release_workspaces()

    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "dtype": args.dtype, "precision": args.precision,
                   "baseline": args.baseline,
                   "backend_env": os.environ.get("FLASHCORE_BACKEND", ""), "rows": rows}, f, indent=1)
    lines = [f"# Config sweep: {torch.cuda.get_device_name(0)}, {args.dtype}, precision {args.precision}, "
             f"baseline {args.baseline}, " + ("V transposed once, " if args.v_transposed else "") +
             f"FLASHCORE_FP8_V_TRANSPOSE={os.environ.get('FLASHCORE_FP8_V_TRANSPOSE', '') or '(unset)'}, "
             f"FLASHCORE_BACKEND={os.environ.get('FLASHCORE_BACKEND', '') or '(unset)'}", "",
             f"TFLOPS, median of {args.passes} x {args.iters} CUDA-event-timed calls; BAD = max |diff| from the "
             f"baseline above {args.tol}.", ""]
    for D in sorted({r["D"] for r in rows}):
        for causal in sorted({r["causal"] for r in rows if r["D"] == D}):
            part = [r for r in rows if r["D"] == D and r["causal"] == causal]
            names = list(part[0]["tflops"])
            lines += [f"## d{D} {'causal' if causal else 'non-causal'}", "",
                      "| S | " + " | ".join(names) + " | best / " + args.baseline + " |",
                      "|---" * (len(names) + 2) + "|"]
            for r in part:
                cells = []
                for n in names:
                    v = r["tflops"][n]
                    bad = n != args.baseline and r["max_err"].get(n, 0) > args.tol
                    cells.append(f"{v:.0f}" + (" BAD" if bad else ""))
                best = r["best"]
                ratio = r["tflops"][best] / r["tflops"][args.baseline] if best else float("nan")
                lines.append(f"| {r['S']} | " + " | ".join(cells) + f" | {ratio:.2f} ({best}) |")
            lines.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

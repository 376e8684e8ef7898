#!/usr/bin/env python3
"""A/B of two FlashCore builds on the anchor grid: `flashcore bench grid` of build A and build B run in
alternating passes (A, B, A, B, ...) on the same GPU, then the median TFLOPS of each cell over the passes,
the ratio B/A per cell and the geometric mean. Used to show that a refactor costs nothing.

    python3 bench/ab.py --a OLD/flashcore --b build/bin/flashcore --passes 3 --dtype both --out ab

Each pass is a separate process of the same CLI command line (same shapes, seed, rotation, warm-up, iters); the
order of A and B alternates between passes (A B, B A, ...), so neither build always meets the hotter card.
Writes OUT/ab.md and OUT/ab.json and prints the table.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys


def run_pass(cli, dtype, out_json, extra, shapes):
    which = [a for s in shapes for a in ("--shape", s)] if shapes else ["grid"]
    cmd = [cli, "bench"] + which + ["--dtype", dtype, "--causal", "both", "--quiet", "--json", out_json] + extra
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"ab: {' '.join(cmd)} failed ({r.returncode}): {r.stderr[-500:]}")
    with open(out_json) as f:
        return json.load(f)


def key(row):
    return (row["dtype"], row["head_dim"], row["seqlen_q"], row["causal"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="CLI of build A (the reference)")
    ap.add_argument("--b", required=True, help="CLI of build B (the change)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "both"])
    ap.add_argument("--out", default="ab_out")
    ap.add_argument("--power-ms", default="0", help="passed to bench (0: no power sampling, faster)")
    ap.add_argument("--graph", action="store_true", help="bench --graph: kernel time without launch overhead")
    ap.add_argument("--shape", action="append", default=[],
                    help="B,H,S,D: time these shapes (causal and not) instead of the grid; repeatable")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    extra = ["--power-ms", args.power_ms] + (["--graph"] if args.graph else [])
    dtypes = ["bf16", "fp16"] if args.dtype == "both" else [args.dtype]
    tf = {"a": {}, "b": {}}
    version = {}
    for p in range(args.passes):
        # ABBA order: a build that always ran second would always meet a hotter card (power-capped cells).
        for side in (("a", "b") if p % 2 == 0 else ("b", "a")):
            for dt in dtypes:
                data = run_pass(getattr(args, side), dt, os.path.join(args.out, f"{side}_{dt}_{p}.json"), extra, args.shape)
                version[side] = data.get("library_version")
                for row in data["rows"]:
                    if row.get("status") == "ok":
                        tf[side].setdefault(key(row), []).append(row["tflops"])
            print(f"ab: pass {p + 1}/{args.passes} {side} done", file=sys.stderr, flush=True)
    rows, logs = [], []
    for k in sorted(tf["a"], key=lambda k: (k[0], k[1], k[3], k[2])):
        if k not in tf["b"]:
            continue
        a, b = statistics.median(tf["a"][k]), statistics.median(tf["b"][k])
        rows.append({"dtype": k[0], "D": k[1], "S": k[2], "causal": k[3], "a": a, "b": b, "ratio": b / a,
                     "a_passes": tf["a"][k], "b_passes": tf["b"][k]})
        logs.append(math.log(b / a))
    gm = math.exp(sum(logs) / len(logs)) if logs else float("nan")
    worst = min(rows, key=lambda r: r["ratio"]) if rows else None
    lines = [f"A = {args.a} (library {version.get('a')}), B = {args.b} (library {version.get('b')}); "
             f"{args.passes} passes in ABBA order, median TFLOPS per cell", "",
             "| dtype | D | causal | S | A | B | B/A |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        flag = " **<0.98**" if r["ratio"] < 0.98 else ""
        lines.append(f"| {r['dtype']} | {r['D']} | {int(r['causal'])} | {r['S']} | {r['a']:.0f} | {r['b']:.0f} | "
                     f"{r['ratio']:.3f}{flag} |")
    lines += ["", f"geometric mean B/A over {len(rows)} cells: {gm:.3f}; cells below 0.98: "
              f"{sum(r['ratio'] < 0.98 for r in rows)}; worst: "
              + (f"{worst['dtype']} D={worst['D']} S={worst['S']} causal={int(worst['causal'])} {worst['ratio']:.3f}"
                 if worst else "-")]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "ab.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "ab.json"), "w") as f:
        json.dump({"geomean": gm, "rows": rows}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()

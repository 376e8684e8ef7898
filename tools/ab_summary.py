#!/usr/bin/env python3
"""B / A per cell and the geometric mean from a bench/report.py metrics.json with systems flashcore (A) and
flashcore_b (B), as tools/ab_lib.sh writes it. Prints one line per cell (dtype, head dim, mask, seqlen: A and B
TFLOPS, B / A) and the geometric mean over the cells where both ran.

    python3 tools/ab_summary.py OUT/ab/metrics.json
"""
import json
import math
import sys


def summarize(metrics: dict) -> float:
    logs = []
    for c in metrics.get("cells", []):
        sys_ = c.get("systems", {})
        a = (sys_.get("flashcore") or {}).get("tflops")
        b = (sys_.get("flashcore_b") or {}).get("tflops")
        name = f"{c.get('dtype')} d{c['D']} {'causal' if c['causal'] else 'none'} {c['S']}"
        if not a or not b:
            print(f"lib A/B {name}: missing ({'A' if not a else 'B'} did not run)")
            continue
        logs.append(math.log(b / a))
        print(f"lib A/B {name}: {a:.0f} -> {b:.0f}  {b / a:.3f}")
    if not logs:
        raise SystemExit("ab_summary: no cell where both libraries ran")
    geo = math.exp(sum(logs) / len(logs))
    print(f"lib A/B geomean {geo:.3f} over {len(logs)} cells")
    return geo


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        summarize(json.load(f))

"""Per-cell TFLOPS of every system in a bench/report.py run (its metrics.json), with each system's ratio to one of
them: the table of an A/B in one process (report.py --lib-b, system flashcore_b) or of any run.

  python3 bench/cells.py OUT/metrics.json [--vs fa2] [--systems flashcore,flashcore_b,fa2]
"""
import argparse
import json
import math


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--vs", default="fa2", help="the system the ratios are to")
    ap.add_argument("--systems", default=None, help="comma list (default: every system of the run)")
    a = ap.parse_args()
    cells = json.load(open(a.metrics))["cells"]
    systems = a.systems.split(",") if a.systems else sorted({s for c in cells for s in c.get("systems", {})})
    others = [s for s in systems if s != a.vs]
    print("| dtype | D | mask | S | " + " | ".join(systems) + " | " + " | ".join(f"{s} / {a.vs}" for s in others) + " |")
    print("|" + "---|" * (4 + len(systems) + len(others)))
    logs = {s: [] for s in others}
    for c in cells:
        t = {s: c.get("systems", {}).get(s, {}).get("tflops") for s in systems}
        ratios = []
        for s in others:
            if t[s] and t.get(a.vs):
                r = t[s] / t[a.vs]
                logs[s].append(math.log(r))
                ratios.append(f"{r:.3f}")
            else:
                ratios.append("-")
        vals = [f"{t[s]:.0f}" if t[s] else "-" for s in systems]
        mask = "causal" if c["causal"] else "none"
        print(f"| {c['dtype']} | {c['D']} | {mask} | {c['S']} | " + " | ".join(vals) + " | " + " | ".join(ratios) + " |")
    for s in others:
        if logs[s]:
            below = sum(1 for x in logs[s] if x < 0)
            print(f"geomean {s} / {a.vs}: {math.exp(sum(logs[s]) / len(logs[s])):.3f} over {len(logs[s])} cells, "
                  f"{below} below 1")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Warp-stall samples of one kernel by reason and by opcode, from Nsight Compute's source page as CSV:

    ncu --section SourceCounters --page source --print-source sass --csv -k regex:NAME --launch-count 1 \\
        python3 bench/ncu_call.py SYSTEM SHAPE > kernel.csv
    python3 tools/ncu_stalls.py kernel.csv [other.csv ...] [--ex2]

Prints, per file, the share of all samples in each stall reason and in each opcode (the SASS mnemonic before the
first dot), the two views perf-notes v28 compares between FlashCore and FlashAttention-3. --ex2 adds the stall
reasons of the MUFU.EX2 instructions alone. Files may be .xz-compressed.
"""
import argparse
import collections
import csv
import lzma


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        lines = f.readlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    rows = list(csv.reader(lines[start:]))
    return rows[0], rows[1:]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--ex2", action="store_true", help="also the stall reasons of MUFU.EX2 alone")
    args = ap.parse_args()
    for path in args.csv:
        hdr, data = load(path)
        col = {h: i for i, h in enumerate(hdr)}
        reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
        by_reason, by_op, ex2 = collections.Counter(), collections.Counter(), collections.Counter()
        total = 0.0
        for r in data:
            samples = num(r[col["Warp Stall Sampling (All Samples)"]])
            total += samples
            words = [w for w in r[col["Source"]].split() if not w.startswith("@")]
            by_op[words[0].split(".")[0] if words else "?"] += samples
            for s in reasons:
                by_reason[s] += num(r[col[s]])
                if "MUFU.EX2" in r[col["Source"]]:
                    ex2[s] += num(r[col[s]])
        total = total or 1.0
        print(f"== {path}: {total:.0f} samples")
        print("  reasons:", ", ".join(f"{s[6:]} {v / total:.1%}" for s, v in by_reason.most_common(10)))
        print("  opcodes:", ", ".join(f"{o} {v / total:.1%}" for o, v in by_op.most_common(14)))
        if args.ex2:
            print("  MUFU.EX2:", ", ".join(f"{s[6:]} {v:.0f}" for s, v in ex2.most_common(6)))


if __name__ == "__main__":
    main()

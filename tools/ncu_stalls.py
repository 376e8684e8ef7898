#!/usr/bin/env python3
"""Warp-stall samples of one kernel by reason, by opcode and by code region, from Nsight Compute's source page as CSV:

    ncu --section SourceCounters --page source --print-source sass --csv -k regex:NAME --launch-count 1 \\
        python3 bench/ncu_call.py SYSTEM SHAPE > kernel.csv
    (or: ncu -o rep ...; ncu -i rep.ncu-rep --page source --csv --print-source sass > kernel.csv)
    python3 tools/ncu_stalls.py kernel.csv [other.csv ...] [--ex2] [--regions]

Prints, per file, the share of all samples in each stall reason and in each opcode (the SASS mnemonic before the
first dot), the two views the notebook (git show fbb0859:docs/perf-notes.md, v28) compares between FlashCore and
FlashAttention-3. --ex2 adds the stall
reasons of the MUFU.EX2 instructions alone. Files may be .xz-compressed. A file that holds several kernels (a
report of a whole call: FA3's call launches a fill kernel before its attention kernel) is read at its largest
kernel, the one with the most SASS lines.

--regions groups the instructions by how often they ran (warp-level executions): in an attention kernel the main
loop's body runs once per (key block, consumer warp), the tile's prologue and epilogue once per (tile, consumer
warp), the producer's wait loops some other number. Per region: instructions, executions, samples and samples per
execution of the region's body. Two kernels of the same attention call have regions of the same execution counts
(an unrolled loop is two regions whose counts add up), so the view says whether a time difference lies in the loop
(git show fbb0859:docs/perf-notes.md v50: the same 460 instructions per key block, 6.6% more samples) or at the
tile edges.
"""
import argparse
import collections
import csv
import lzma


def load(path):
    """(header, rows) of the largest kernel in an ncu source-page CSV."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    kernels, current = [], None
    for r in rows:
        if r and r[0] == "Address":
            current = [r, []]
            kernels.append(current)
        elif r and r[0] == "Kernel Name":
            current = None
        elif current is not None and r:
            current[1].append(r)
    if not kernels:
        raise SystemExit(f"ncu_stalls.py: {path}: no source table (a row starting with \"Address\")")
    hdr, data = max(kernels, key=lambda k: len(k[1]))
    return hdr, data


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def regions(hdr, data, min_share=0.005):
    """[(executions per instruction, instructions, samples)] of the code regions (instructions that ran equally
    often), most samples first; regions below min_share of all samples are left out."""
    col = {h: i for i, h in enumerate(hdr)}
    by_count = collections.defaultdict(lambda: [0, 0.0])
    total = 0.0
    for r in data:
        samples = num(r[col["Warp Stall Sampling (All Samples)"]])
        total += samples
        count = int(num(r[col["Instructions Executed"]]))
        if count == 0:
            continue
        by_count[count][0] += 1
        by_count[count][1] += samples
    out = [(c, n, s) for c, (n, s) in by_count.items() if s >= min_share * total]
    return sorted(out, key=lambda x: -x[2]), total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--ex2", action="store_true", help="also the stall reasons of MUFU.EX2 alone")
    ap.add_argument("--regions", action="store_true", help="samples per code region (instructions that ran equally "
                    "often): loop body, tile edges, waits")
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
        if args.regions:
            print("  regions (executions per instruction: instructions, samples, share, samples per 1000 executions "
                  "of the region):")
            found, _ = regions(hdr, data)
            for count, n, s in found:
                print(f"    {count:>9}: {n:>5} instr, {s:>8.0f} samples, {s / total:6.1%}, {1000 * s / count:8.2f}")


if __name__ == "__main__":
    main()

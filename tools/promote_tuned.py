#!/usr/bin/env python3
"""Turn tuning tables (flashcore tune) into the library's built-in tables.

A table made with --build may name variants that exist only as cubins on the tuning machine. This script
compiles the useful ones into the library instead: every variant that wins at least --min-buckets buckets of
one key in any of the given tables becomes a row of src/kernels/sm90/configs.txt (a tuning option, "-"), and
each table is written to src/api/tuned/<gpu>-<sms>sm.json (tables of one GPU merged, later entries first) with its
elites restricted to configs compiled in
(after the promotion) and no cubin paths. An entry's winner is then its fastest remaining elite; its speedup is
recomputed from the recorded times (the default's time is winner time x speedup in the input).

usage: tools/promote_tuned.py [--min-buckets N] [--dry-run] TABLE.json...
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "src", "kernels", "sm90", "configs.txt")
TUNED = os.path.join(ROOT, "src", "api", "tuned")
NAME = re.compile(r"^(\d+)x(\d+)x(\d+)(-pp)?-(onecta|static|dynamic)(-vote)?(-packed)?$")


def row_name(fields):
    hd, causal, bm, bn, st, pp, sched, rescale, marker = fields
    return (f"{bm}x{bn}x{st}{'-pp' if pp == 'pp' else ''}-{sched}{'-vote' if rescale == 'vote' else ''}"
            f"{'-packed' if marker == 'packed-only' else ''}")


def read_rows():
    rows = []
    with open(CONFIGS) as f:
        for line in f:
            if line[:1].isdigit():
                rows.append(line.split())
    return rows


def compiled(rows):
    """{(head_dim, causal): set of config names}"""
    out = collections.defaultdict(set)
    for r in rows:
        out[(int(r[0]), int(r[1]))].add(row_name(r))
    return out


def config_row(hd, causal, name):
    m = NAME.match(name)
    if not m:
        raise ValueError(f"malformed config name {name!r}")
    bm, bn, st, pp, sched, vote, packed = m.groups()
    if packed:  # its configs.txt marker also makes it the packed choice: a decision for a person, not this script
        raise ValueError(f"{name!r} is a packed flavour: add it to configs.txt by hand (marker packed-only)")
    return (f"{hd:<4} {int(causal)}  {bm:<4} {bn:<4} {st}  {'pp' if pp else '-':<2}  {sched:<8} "
            f"{'vote' if vote else 'always':<7} -")


def slug(gpu, sms):
    return re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") + f"-{sms}sm"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="+")
    ap.add_argument("--min-buckets", type=int, default=2)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    tables = [json.load(open(p)) for p in args.tables]
    rows = read_rows()
    have = compiled(rows)

    wins = collections.Counter()
    for t in tables:
        for e in t["entries"]:
            if e["config"] not in have[(e["head_dim"], int(e["causal"]))]:
                wins[(e["head_dim"], int(e["causal"]), e["config"])] += 1
    promote = sorted(k for k, n in wins.items() if n >= args.min_buckets)
    for hd, causal, name in promote:
        have[(hd, causal)].add(name)
        print(f"promote d{hd} causal={causal} {name} (wins {wins[(hd, causal, name)]} buckets)")

    outputs = {}
    for t in tables:
        out = dict(t)
        out["entries"] = []
        for e in t["entries"]:
            default_ms = e["elites"][0]["ms"] * e.get("speedup", 1.0)
            keep = [{"config": c["config"], "ms": c["ms"]} for c in e["elites"]
                    if c["config"] in have[(e["head_dim"], int(e["causal"]))]]
            if not keep:
                continue
            ne = {k: v for k, v in e.items() if k not in ("cubin", "cubin_hash", "elites")}
            ne["config"] = keep[0]["config"]
            ne["speedup"] = round(default_ms / keep[0]["ms"], 4)
            ne["elites"] = keep
            out["entries"].append(ne)
        d = t["device"]
        path = os.path.join(TUNED, slug(d["gpu_name"], d["sm_count"]) + ".json")
        if path in outputs:  # another run on the same GPU (e.g. the decode buckets): one table, its entries merged
            key = lambda e: (e["dtype"], e["head_dim"], e["causal"], e["seqlen_q"], e["seqlen_k"])  # noqa: E731
            later = {key(e) for e in out["entries"]}
            out["entries"] = [e for e in outputs[path]["entries"] if key(e) not in later] + out["entries"]
        outputs[path] = out
    if args.dry_run:
        return 0
    if promote:
        with open(CONFIGS, "a") as f:
            f.write("# Promoted from the H100/H200 tuning runs (tools/promote_tuned.py; docs/tuning.md)\n")
            for hd, causal, name in promote:
                f.write(config_row(hd, causal, name) + "\n")
    for path, table in outputs.items():
        with open(path, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
        print(f"wrote {os.path.relpath(path, ROOT)}: {len(table['entries'])} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())

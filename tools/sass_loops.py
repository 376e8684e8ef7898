#!/usr/bin/env python3
"""Static instruction audit of attention main loops in SASS (no GPU needed).

For every kernel in a binary (a FlashCore object or library, FlashAttention-3's _C.abi3.so, a cubin, or a
saved `cuobjdump -sass` text), find the loops that hold tensor-core MMAs (HGMMA/QGMMA/IGMMA on sm90, HMMA on
sm80), and count their instructions by class. A key block's work per thread is known from the tile: a
consumer thread computes BN/2 exponentials per key block (64 x BN scores over a 128-thread warpgroup on sm90),
so "per exp" (instructions / MUFU.EX2) compares kernels with different tiles. Static counts: a branch inside
the loop counts both ways (what is skipped at run time is counted too), so compare like with like.

  python3 tools/sass_loops.py build/lib/libflashcore.so --function 'bf16.*d128'
  python3 tools/sass_loops.py ../shared/fa3/prefill/flash_attn_3/_C.abi3.so --function hdim128_bf16
  python3 tools/sass_loops.py OBJ --markdown     (a table per kernel, for docs/decisions.md#sass-check)

--function matches a regex against the (mangled) kernel name. Needs cuobjdump (PATH, or
tools/setup_deps.sh's <build>/.tools/env.sh).
"""
import argparse
import collections
import math
import re
import shutil
import signal
import subprocess
import sys

# Instruction classes (name, short name for --blocks, opcode pattern); first match wins.
CLASSES = [
    ("mma", "mma", re.compile(r"^(HGMMA|QGMMA|IGMMA|BGMMA|HMMA|IMMA)")),
    ("wgmma sync", "wg", re.compile(r"^WARPGROUP\.")),
    ("exp2 (MUFU.EX2)", "ex2", re.compile(r"^MUFU\.EX2")),
    ("other MUFU", "mufu", re.compile(r"^MUFU")),
    ("fp32 mul/fma/add", "fp", re.compile(r"^(FMUL|FFMA|FADD|FMUL2|FFMA2|FADD2)")),
    ("max/min", "max", re.compile(r"^(FMNMX|FSEL|FSETP)")),
    ("convert/pack", "cvt", re.compile(r"^(F2FP|F2F|I2F|F2I|PRMT)")),
    ("shuffle/vote", "shfl", re.compile(r"^(SHFL|VOTE|REDUX|MATCH)")),
    ("barrier/mbarrier", "bar", re.compile(r"^(BAR|SYNCS|MEMBAR|FENCE|ARRIVES|WARPSYNC|NANOSLEEP)")),
    ("uniform", "uni", re.compile(r"^(U[A-Z0-9]+|R2UR|S2UR|VOTEU)")),
    ("integer/predicate", "int", re.compile(r"^(IADD3|IMAD|LEA|LOP3|SHF|ISETP|SEL|PLOP3|IABS|IMNMX|P2R|R2P|VIMNMX)")),
    ("move", "mov", re.compile(r"^(MOV|S2R|CS2R)")),
    ("memory", "mem", re.compile(r"^(LD|ST|LDS|STS|LDG|STG|LDSM|STSM|UTMA|UBLKCP|ATOM|RED|LDGSTS)")),
    ("branch", "bra", re.compile(r"^(BRA|BSSY|BSYNC|EXIT|RET|CALL|JMP|YIELD)")),
]
NAMES = [name for name, _short, _rx in CLASSES] + ["other"]
SHORT = {name: short for name, short, _rx in CLASSES} | {"other": "oth"}
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
FUNC = re.compile(r"Function : (\S+)")


def classify(op):
    for name, _short, rx in CLASSES:
        if rx.match(op):
            return name
    return "other"


def branch_target(op, operands):
    """The target address of a BRA, or None."""
    m = re.search(r"0x([0-9a-f]+)", operands) if op.startswith("BRA") else None
    return int(m.group(1), 16) if m else None


def read_sass(path):
    if path.endswith(".sass") or path.endswith(".txt"):
        with open(path) as f:
            return f.read()
    tool = shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_loops: cuobjdump not found (source <build>/.tools/env.sh after tools/setup_deps.sh)")
    return subprocess.run([tool, "-sass", path], check=True, capture_output=True, text=True).stdout


def functions(text):
    """Yields (name, [(addr, pred, op, operands)]) per kernel."""
    name, body = None, []
    for line in text.splitlines():
        m = FUNC.search(line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
            continue
        m = INSN.search(line)
        if m and name:
            body.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    if name:
        yield name, body


def mma_loops(body, need_exp2=True):
    """Innermost backward-branch ranges that hold an MMA (and an exp2): (start, end, instructions)."""
    index = {addr: i for i, (addr, *_rest) in enumerate(body)}
    loops = []
    for i, (addr, _pred, op, operands) in enumerate(body):
        target = branch_target(op, operands)
        if target is None or target >= addr or target not in index:
            continue
        insns = body[index[target]:i + 1]
        classes = {classify(o) for _a, _p, o, _x in insns}
        if "mma" in classes and (not need_exp2 or "exp2 (MUFU.EX2)" in classes):
            loops.append((target, addr, insns))
    # Innermost only: drop a loop whose range overlaps a shorter MMA loop (a tile loop around or into the
    # key-block loop).
    def overlaps(a, b):
        return a[0] <= b[1] and b[0] <= a[1]
    return [l for l in loops
            if not any(o is not l and o[1] - o[0] < l[1] - l[0] and overlaps(o, l) for o in loops)]


def display_name(fname):
    """FlashCore kernels by their config row (sm90 r_<dtype>_d<D>[v<DV>]_c<causal>_<tile>_..., sm80 r80_...), others
    shortened."""
    m = re.search(r"(r(?:80)?_[a-z0-9_]+?_d\d+(?:v\d+)?_c\d_[0-9a-z_]+?)E", fname)
    if m:
        return m.group(1)
    return fname if len(fname) <= 90 else fname[:60] + "..." + fname[-27:]


def summarize(insns):
    counts = collections.Counter(classify(op) for _a, _p, op, _x in insns)
    return counts, counts.get("exp2 (MUFU.EX2)", 0)


def basic_blocks(body, insns):
    """Splits a loop's instructions at branch targets and after branches."""
    targets = {branch_target(op, operands) for _a, _p, op, operands in body} - {None}
    blocks, cur = [], []
    for ins in insns:
        if ins[0] in targets and cur:
            blocks.append(cur)
            cur = []
        cur.append(ins)
        if ins[2].startswith("BRA") or ins[2] == "EXIT":
            blocks.append(cur)
            cur = []
    return blocks + ([cur] if cur else [])


def main_loops(path, rx, all_loops=False):
    """{kernel: [(start, end, instructions, body)]} for the kernels whose name matches rx."""
    out, seen = {}, collections.Counter()
    for fname, body in functions(read_sass(path)):
        if not rx.search(fname):
            continue
        name = display_name(fname)
        seen[name] += 1
        if seen[name] > 1:  # two kernels that shorten alike (FA3's cluster and bool variants): numbered
            name += f" [{seen[name]}]"
        for start, end, insns in mma_loops(body, need_exp2=not all_loops):
            out.setdefault(name, []).append((start, end, insns, body))
    return out


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # (piped into head)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--function", default=".", help="regex on the kernel name")
    ap.add_argument("--markdown", action="store_true", help="one markdown table row per loop")
    ap.add_argument("--blocks", action="store_true",
                    help="the loop's basic blocks, each with its classes and closing branch (to follow a path)")
    ap.add_argument("--compare", metavar="BASE", help="another build of the same kernels: loop sizes before/after")
    ap.add_argument("--all-loops", action="store_true", help="also loops without exponentials")
    args = ap.parse_args()
    rx = re.compile(args.function)
    loops = main_loops(args.binary, rx, args.all_loops)
    if not loops:
        print("sass_loops: no main loop found (no kernel matched, or none has a loop with MMAs and exp2)")
        return 1
    if args.compare:
        base = main_loops(args.compare, rx, args.all_loops)
        ratios = []
        print("| kernel | main-loop instructions, BASE | this binary | ratio |\n|---|---|---|---|")
        for k in sorted(loops):
            if k not in base:
                continue
            a, b = sum(len(l[2]) for l in base[k]), sum(len(l[2]) for l in loops[k])
            ratios.append(b / a)
            print(f"| {k} | {a} | {b} | {b / a:.3f} |")
        if ratios:
            g = math.exp(sum(map(math.log, ratios)) / len(ratios))
            print(f"\n{len(ratios)} kernels: geomean {g:.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
        return 0
    if args.markdown:
        print("| kernel | loop | instructions | instr / exp2 | " + " | ".join(NAMES) + " |")
        print("|" + "---|" * (4 + len(NAMES)))
    for k, ls in loops.items():
        for start, end, insns, body in ls:
            counts, ex2 = summarize(insns)
            per = f"{len(insns) / ex2:.2f}" if ex2 else "-"
            if args.markdown:
                print(f"| {k} | {start:#x}-{end:#x} | {len(insns)} | {per} | "
                      + " | ".join(str(counts.get(n, 0)) for n in NAMES) + " |")
                continue
            print(f"{k}\n  loop {start:#x}-{end:#x}: {len(insns)} instructions, "
                  f"{counts.get('mma', 0)} mma, {ex2} exp2, {per} per exp2")
            print("  " + ", ".join(f"{n} {counts[n]}" for n in NAMES if counts.get(n)))
            if args.blocks:
                for blk in basic_blocks(body, insns):
                    c = summarize(blk)[0]
                    last = blk[-1]
                    print(f"    {blk[0][0]:#07x} {len(blk):4d}: "
                          + " ".join(f"{SHORT[n]}={v}" for n, v in c.most_common())
                          + f"  | {last[1]} {last[2]} {last[3][:40]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

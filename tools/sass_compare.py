"""Which kernels two builds compiled differently: the SASS of every function of two `cuobjdump --dump-sass` dumps,
compared instruction by instruction (addresses and encodings left out, so a function moved in the image compares
equal). Prints the counts (identical, different, only in one dump) and, per differing function, the instruction counts
and the number of differing lines (a renaming of registers shows as a few lines at an equal count).

  cuobjdump --dump-sass old/libflashcore.so > old.sass; cuobjdump --dump-sass build/lib/libflashcore.so > new.sass
  python3 tools/sass_compare.py old.sass new.sass [--list N]

A change that should leave the defaults alone is checked this way without a GPU: the kernels it did not mean to touch
must come out identical.
"""
import argparse
import difflib
import re

FUNC = re.compile(r"Function : (\S+)")
ARCH = re.compile(r"arch = (sm_\w+)")
INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?);")


def functions(path):
    """{(arch, mangled name): [instruction text without addresses]} of one dump."""
    out, arch, name, body = {}, None, None, []
    with open(path) as f:
        for line in f:
            m = ARCH.search(line)
            if m:  # a new image: the previous image's last function ends here, under its own arch
                if name:
                    out[(arch, name)] = body
                arch, name, body = m.group(1), None, []
                continue
            m = FUNC.search(line)
            if m:
                if name:
                    out[(arch, name)] = body
                name, body = m.group(1), []
                continue
            m = INSN.search(line) if name else None
            if m:
                body.append(re.sub(r"0x[0-9a-f]+", "X", m.group(1).strip()))
    if name:
        out[(arch, name)] = body
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--list", type=int, default=20, help="functions listed per group (default 20)")
    args = ap.parse_args()
    a, b = functions(args.old), functions(args.new)
    same = [k for k in a if k in b and a[k] == b[k]]
    diff = [k for k in a if k in b and a[k] != b[k]]
    only_a, only_b = [k for k in a if k not in b], [k for k in b if k not in a]
    print(f"functions: old {len(a)}, new {len(b)}; identical {len(same)}, different {len(diff)}, only old "
          f"{len(only_a)}, only new {len(only_b)}")
    for k in diff[:args.list]:
        lines = [x for x in difflib.unified_diff(a[k], b[k], lineterm="", n=0)
                 if not x.startswith(("---", "+++", "@@"))]
        print(f"  different: {k[0]} {k[1]}: {len(a[k])} -> {len(b[k])} instructions, {len(lines)} lines differ")
    for k in only_a[:args.list]:
        print(f"  only old: {k[0]} {k[1]}")
    for k in only_b[:args.list]:
        print(f"  only new: {k[0]} {k[1]}")


if __name__ == "__main__":
    main()

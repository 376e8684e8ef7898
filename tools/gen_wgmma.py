#!/usr/bin/env python3
"""Generate src/kernels/sm90/wgmma_ops.inc: inline-asm wrappers for the wgmma.mma_async shapes FlashCore uses.

The operand lists of wgmma are long (N/2 accumulator registers for m64nNk16), so they are generated
rather than written by hand. Run: python3 tools/gen_wgmma.py > src/kernels/sm90/wgmma_ops.inc
The backward's shapes (both operands transposed: dQ = dS K) go to their own file, so that the forward's units do not
depend on them: python3 tools/gen_wgmma.py --bwd > src/kernels/sm90/wgmma_bwd_ops.inc

Besides the shapes of configs.txt, every shape a runtime variant may take (src/kernels/sm90/variant.h: block_n
a multiple of 16 in [16, 256], head dim a multiple of 64 in [64, 256]) is covered, so that a tile config the
library was not compiled with builds from the same sources.
"""
import os
import sys

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "kernels", "sm90", "configs.txt")
CONFIGS_8BIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "kernels", "sm90",
                            "configs_fp8.txt")


def shapes_from_configs(path=CONFIGS):
    """(block_n values, head dims) of the rows of configs.txt: S = Q K^T needs N = block_n, O += P V needs
    N = head_dim. A new row in configs.txt needs at most a re-run of this script (check_sass.sh checks it)."""
    block_n, head_dims = set(), set()
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields and fields[0][0].isdigit():
                head_dims.update(int(d) for d in fields[0].split("/"))  # "192/128": Q/K's and V's
                block_n.add(int(fields[3]))
    return sorted(block_n), sorted(head_dims)


VARIANT_BLOCK_N = range(16, 257, 16)  # S = Q K^T of any runtime variant (variant.h: feasible)
VARIANT_HEAD_DIMS = range(64, 257, 64)  # O += P V of any runtime variant
_CONFIG_BLOCK_N, _CONFIG_HEAD_DIMS = shapes_from_configs()
# N = 8: the split-KV decode rows with the GEMMs transposed (block_m 8, decode_swap.cuh): S^T = K Q^T (SS) and
# O^T = V^T P^T (SSTransA: A MN-major, V as stored).
SWAP_N = [8]
# The e4m3 KV-cache decode rows with the GEMMs transposed (decode_swap_kv8.cuh): K and V^T widened from e4m3 into
# registers (A), Q^T and P^T K-major in shared memory (B: imm-trans-b = 0), fp16 only (kHalfCompute).
SWAP_RS_K_N = [8]
SS_N = sorted(set(_CONFIG_BLOCK_N) | set(VARIANT_BLOCK_N) | set(SWAP_N))
RS_N = sorted(set(_CONFIG_HEAD_DIMS) | set(VARIANT_HEAD_DIMS))
TYPES = [("bf16", "__nv_bfloat16"), ("f16", "__half")]
# 8-bit: k32 per MMA, both operands K-major (no transpose immediates); only the shapes of configs_fp8.txt.
_8BIT_BLOCK_N, _8BIT_HEAD_DIMS = shapes_from_configs(CONFIGS_8BIT)
# (PTX type, C++ type, PTX type of the RS form's A operand): the RS form is P V, and P is e4m3 for either input type
# (three mantissa bits against e5m2's two: config.h), so e5m2 kernels run e4m3 x e5m2 there.
TYPES_8BIT = [("e4m3", "__nv_fp8_e4m3", "e4m3"), ("e5m2", "__nv_fp8_e5m2", "e4m3")]
# int8 Q K^T (precision = INT8, configs_i8.txt): s32 accumulators, SS form only (P V runs in 16 bits).
CONFIGS_I8 = os.path.join(os.path.dirname(CONFIGS), "configs_i8.txt")
_I8_BLOCK_N, _ = shapes_from_configs(CONFIGS_I8)


def acc_list(n_regs, first=0):
    return ", ".join(f"%{first + i}" for i in range(n_regs))


def acc_constraints(n_regs, kind="f"):
    return ", ".join(f'"+{kind}"(d[{i}])' for i in range(n_regs))


def emit_int8(out, n):
    """S(64xN, s32) (+)= A(64x32 s8, smem desc, K-major) * B(32xN s8, smem desc, K-major): integer wgmma has no
    scale or transpose immediates."""
    r = n // 2
    out.append(f"template <> struct WgmmaSS<int8_t, {n}> {{")
    out.append(f"  static constexpr int kAccRegs = {r};")
    out.append(f"  __device__ __forceinline__ static void mma(uint32_t (&d)[{r}], uint64_t desc_a, uint64_t desc_b, "
               "int scale_d) {")
    out.append("    asm volatile(")
    out.append('        "{\\n.reg .pred p;\\n"')
    out.append(f'        "setp.ne.b32 p, %{r + 2}, 0;\\n"')
    out.append(f'        "wgmma.mma_async.sync.aligned.m64n{n}k32.s32.s8.s8 "')
    out.append(f'        "{{{acc_list(r)}}}, "')
    out.append(f'        "%{r}, %{r + 1}, p;\\n}}\\n"')
    out.append(f"        : {acc_constraints(r, 'r')}")
    out.append('        : "l"(desc_a), "l"(desc_b), "r"(scale_d));')
    out.append("  }")
    out.append("};")


def emit(out, kind, n, ptx_t, ctype, k=16, ptx_a=None):
    """One specialization. kind "SS": A and B from shared memory (K-major both); "RS": A from registers,
    B from shared memory, N-major (imm-trans-b = 1) for 16-bit types, K-major for 8-bit ones (k = 32: no
    transpose immediates); "RSKMajorB": as RS, B K-major (imm-trans-b = 0). ptx_a: A's PTX type where it differs from B's (8-bit P V)."""
    r = n // 2
    ptx_a = ptx_a or ptx_t
    eight_bit = k == 32
    if kind in ("SS", "SSTransA", "SSTransB", "SSTransAB"):
        args = f"float (&d)[{r}], uint64_t desc_a, uint64_t desc_b, int scale_d"
        operands, scale_reg = f"%{r}, %{r + 1}", r + 2
        imms = "1, 1" if eight_bit else {"SS": "1, 1, 0, 0", "SSTransA": "1, 1, 1, 0", "SSTransB": "1, 1, 0, 1",
                                         "SSTransAB": "1, 1, 1, 1"}[kind]
        inputs = '"l"(desc_a), "l"(desc_b), "r"(scale_d)'
    else:
        args = f"float (&d)[{r}], const uint32_t (&a)[4], uint64_t desc_b, int scale_d"
        operands, scale_reg = f"{{%{r}, %{r + 1}, %{r + 2}, %{r + 3}}}, %{r + 4}", r + 5
        imms = "1, 1" if eight_bit else ("1, 1, 0" if kind == "RSKMajorB" else "1, 1, 1")
        inputs = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d)'
    out.append(f"template <> struct Wgmma{kind}<{ctype}, {n}> {{")
    out.append(f"  static constexpr int kAccRegs = {r};")
    out.append(f"  __device__ __forceinline__ static void mma({args}) {{")
    out.append("    asm volatile(")
    out.append('        "{\\n.reg .pred p;\\n"')
    out.append(f'        "setp.ne.b32 p, %{scale_reg}, 0;\\n"')
    out.append(f'        "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{ptx_a}.{ptx_t} "')
    out.append(f'        "{{{acc_list(r)}}}, "')
    out.append(f'        "{operands}, p, {imms};\\n}}\\n"')
    out.append(f"        : {acc_constraints(r)}")
    out.append(f"        : {inputs});")
    out.append("  }")
    out.append("};")


# The backward (bwd_mainloop.cuh): dQ (64 x 64 per warpgroup) = dS (M-major: stored as dS^T) * K (N-major: as stored).
# The wide head dims' kernel (bwd_mainloop_wide.cuh), 96 or 128 columns per warpgroup (dV of (192, 128): 64):
# dV += P^T dO and dK += dS^T Q (A M-major: P and dS stored query-major, B N-major) and dQ = dS K (A K-major,
# B N-major).
BWD_TRANS_AB_N = [64, 96, 128]
BWD_TRANS_B_N = [96, 128]


def main_bwd():
    out = ["// Generated by tools/gen_wgmma.py --bwd: do not edit.",
           "// WgmmaSSTransAB<T, N>: D(64xN, f32) (+)= A(64x16, smem desc, M-major) * B(16xN, smem desc, N-major)",
           "// (imm-trans-a = imm-trans-b = 1); WgmmaSSTransB<T, N>: A K-major, B N-major (imm-trans-b = 1).",
           "// scale_d = 0 overwrites D, 1 accumulates.", ""]
    for ptx_t, ctype in TYPES:
        for kind, shapes in (("SSTransAB", BWD_TRANS_AB_N), ("SSTransB", BWD_TRANS_B_N)):
            for n in shapes:
                emit(out, kind, n, ptx_t, ctype)
                out.append("")
    sys.stdout.write("\n".join(out))


def main():
    if "--bwd" in sys.argv[1:]:
        main_bwd()
        return
    out = ["// Generated by tools/gen_wgmma.py: do not edit.",
           "// WgmmaSS<T, N>: D(64xN, f32) (+)= A(64x16, smem desc, K-major) * B(16xN, smem desc, K-major)",
           "// WgmmaRS<T, N>: D(64xN, f32) (+)= A(64x16, registers)          * B(16xN, smem desc, N-major)",
           "// WgmmaSSTransA<T, N>: as WgmmaSS, A M-major (imm-trans-a = 1).",
           "// WgmmaRSKMajorB<T, N>: as WgmmaRS, B K-major (imm-trans-b = 0).",
           "// 8-bit T (e4m3, e5m2): k = 32 instead of 16, and B is K-major in both forms; the RS form's A (P) is e4m3.",
           "// int8_t: WgmmaSS only, s32 accumulators (uint32_t registers), k = 32.",
           "// scale_d = 0 overwrites D, 1 accumulates.", ""]
    for ptx_t, ctype in TYPES:
        for kind, shapes in (("SS", SS_N), ("RS", RS_N), ("SSTransA", SWAP_N)):
            for n in shapes:
                emit(out, kind, n, ptx_t, ctype)
                out.append("")
    for n in SWAP_RS_K_N:
        emit(out, "RSKMajorB", n, "f16", "__half")
        out.append("")
    for ptx_t, ctype, ptx_p in TYPES_8BIT:
        for kind, shapes in (("SS", _8BIT_BLOCK_N), ("RS", _8BIT_HEAD_DIMS)):
            for n in shapes:
                emit(out, kind, n, ptx_t, ctype, k=32, ptx_a=ptx_p if kind == "RS" else None)
                out.append("")
    for n in _I8_BLOCK_N:
        emit_int8(out, n)
        out.append("")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()

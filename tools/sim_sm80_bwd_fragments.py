#!/usr/bin/env python3
"""The portable backward's fragment arithmetic, emulated on the CPU (no GPU needed): ldmatrix (x4, .trans), mma.sync
m16n8k16's fragments, smem.cuh's XOR swizzle, and the addresses that src/kernels/sm80/bwd_gemm.cuh and
bwd_mainloop.cuh form (lane_swizzle_key, the dQ column offset folded into the key, the dS^T stores), for one step of
every tile (head dim 64 / 128, 128 / 64 keys) and every warp: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
dK += dS^T Q, dQ = dS K against numpy, and dQ's additions against kernels/common/bwd_layout.h's block order (each
element written once, read back by bwd_dq_position). The formulas are transcribed from the kernel: keep them in step.

    python3 tools/sim_sm80_bwd_fragments.py
"""
import numpy as np
rng = np.random.default_rng(0)

def swz(RB, row, unit): return row*RB + ((unit ^ (row & 7)) << 4)
def key(row, c): return ((row & 7) ^ c) << 4
def swz_even(RB, row_bytes, k, u2): return row_bytes + ((u2 & ~7) << 4) + (k ^ ((u2 & 7) << 4))

class Tile:
    def __init__(self, M, RB):  # M: rows x cols, stored swizzled
        self.RB = RB; self.mem = {}
        for r in range(M.shape[0]):
            for c in range(M.shape[1]):
                self.mem[swz(RB, r, c // 8) + (c % 8) * 2] = M[r, c]
    def row16(self, addr):  # 8 elements at a 16-byte address
        assert addr % 16 == 0
        return [self.mem[addr + 2*i] for i in range(8)]

def ldmatrix_x4(tile, addrs, trans=False):
    mats = [[tile.row16(addrs[8*m + i]) for i in range(8)] for m in range(4)]
    out = []
    for lane in range(32):
        regs = []
        for m in range(4):
            M = np.array(mats[m])
            if trans: M = M.T
            g, t = lane // 4, lane % 4
            regs.append((M[g, 2*t], M[g, 2*t+1]))
        out.append(regs)
    return out  # out[lane][m] = (lo, hi)

def mma(acc, a, b0, b1):  # acc[lane] list of 4 floats; a[lane] 4 pairs; b0/b1[lane] pairs
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        A[g, 2*t:2*t+2] = a[lane][0]; A[g+8, 2*t:2*t+2] = a[lane][1]
        A[g, 2*t+8:2*t+10] = a[lane][2]; A[g+8, 2*t+8:2*t+10] = a[lane][3]
        B[2*t:2*t+2, g] = b0[lane]; B[2*t+8:2*t+10, g] = b1[lane]
    C = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(2):
            for e in range(2): acc[lane][2*i+e] += C[g+8*i, 2*t+e]

def acc_index(j, i, e): return 4*j + 2*i + e
def frag_to_mat(acc, ncols):  # per-lane C fragments (16 x ncols) -> matrix
    M = np.zeros((16, ncols))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j in range(ncols // 8):
            for i in range(2):
                for e in range(2): M[g+8*i, 8*j+2*t+e] = acc[lane][acc_index(j, i, e)]
    return M
def mat_to_frag(M):
    ncols = M.shape[1]; acc = [[0.0]*(ncols//2) for _ in range(32)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for j in range(ncols // 8):
            for i in range(2):
                for e in range(2): acc[lane][acc_index(j, i, e)] = M[g+8*i, 8*j+2*t+e]
    return acc
def pack_p(p, kcols):  # pack_p_fragments: a[t][4] pairs
    out = []
    for lane in range(32):
        pl = p[lane]; a = []
        for t in range(kcols // 16):
            a.append([(pl[acc_index(2*t,0,0)], pl[acc_index(2*t,0,1)]), (pl[acc_index(2*t,1,0)], pl[acc_index(2*t,1,1)]),
                      (pl[acc_index(2*t+1,0,0)], pl[acc_index(2*t+1,0,1)]), (pl[acc_index(2*t+1,1,0)], pl[acc_index(2*t+1,1,1)])])
        out.append(a)
    return out

def gemm_rows(D, kCols, a_tile, a_base, b_tile, b_base, row0):
    RB = D*2; acc = [[0.0]*(kCols//2) for _ in range(32)]
    a_row = [row0 + (l % 8) + 8*((l//8) % 2) for l in range(32)]
    b_row = [8*(l//16) + (l % 8) for l in range(32)]
    a_key = [key(a_row[l], l//16) for l in range(32)]; b_key = [key(b_row[l], (l//8) % 2) for l in range(32)]
    for kk in range(D // 16):
        a = ldmatrix_x4(a_tile, [a_base + a_row[l]*RB + swz_even(RB, 0, a_key[l], 2*kk) for l in range(32)])
        for np_ in range(kCols // 16):
            b = ldmatrix_x4(b_tile, [b_base + b_row[l]*RB + swz_even(RB, 16*np_*RB, b_key[l], 2*kk) for l in range(32)])
            sub0 = [[0.0]*4 for _ in range(32)]; sub1 = [[0.0]*4 for _ in range(32)]
            mma(sub0, a, [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
            mma(sub1, a, [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])
            for l in range(32):
                for r in range(4):
                    acc[l][acc_index(2*np_, 0, 0) + r] += sub0[l][r]; acc[l][acc_index(2*np_+1, 0, 0) + r] += sub1[l][r]
    return acc

def gemm_acc(RB, kCols, kSteps, acc, a, b_tile, b_base, col0):
    b_row = [8*((l//8) % 2) + (l % 8) for l in range(32)]
    b_key = [key(b_row[l], l//16) ^ (((col0//8) & 7) << 4) for l in range(32)]
    base = [b_base + b_row[l]*RB + (col0//64)*128 for l in range(32)]
    for t in range(kSteps):
        for dp in range(kCols // 16):
            b = ldmatrix_x4(b_tile, [base[l] + swz_even(RB, 16*t*RB, b_key[l], 2*dp) for l in range(32)], trans=True)
            sub0 = [[0.0]*4 for _ in range(32)]; sub1 = [[0.0]*4 for _ in range(32)]
            at = [a[l][t] for l in range(32)]
            mma(sub0, at, [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
            mma(sub1, at, [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])
            for l in range(32):
                for r in range(4):
                    acc[l][acc_index(2*dp, 0, 0) + r] += sub0[l][r]; acc[l][acc_index(2*dp+1, 0, 0) + r] += sub1[l][r]

def bwd_dq_index(region, reg, thread): return region*64*64 + (reg//4)*512 + thread*4 + reg % 4
def bwd_dq_position(e):
    region, rest = e // 4096, e % 4096
    group, thread = rest // 512, (rest % 512) // 4; reg = group*4 + rest % 4
    warp, lane = thread // 32, thread % 32
    return 16*warp + lane//4 + 8*((reg//2) % 2), 64*region + 8*group + 2*(lane % 4) + reg % 2

def check(D, N):
    RB = D*2; kBlockM = 64; kSubM = 32 if D == 128 else 64; warps = N // 16
    K = rng.standard_normal((N, D)); V = rng.standard_normal((N, D))
    Q = rng.standard_normal((kBlockM, D)); dO = rng.standard_normal((kBlockM, D))
    kv = Tile(np.vstack([K, V]), RB); vbase = N*RB
    qd = Tile(np.vstack([Q, dO]), RB); dobase = kBlockM*RB
    dS_T_full = np.zeros((N, kBlockM))
    ds_mem = {}
    for w in range(warps):
        dk = [[0.0]*(D//2) for _ in range(32)]; dv = [[0.0]*(D//2) for _ in range(32)]
        dk_ref = np.zeros((16, D)); dv_ref = np.zeros((16, D))
        for h in range(kBlockM // kSubM):
            rows = h*kSubM*RB
            s = gemm_rows(D, kSubM, kv, 0, qd, rows, 16*w)
            S_ref = K[16*w:16*w+16] @ Q[h*kSubM:(h+1)*kSubM].T
            assert np.allclose(frag_to_mat(s, kSubM), S_ref), "S"
            dp = gemm_rows(D, kSubM, kv, vbase, qd, dobase + rows, 16*w)
            assert np.allclose(frag_to_mat(dp, kSubM), V[16*w:16*w+16] @ dO[h*kSubM:(h+1)*kSubM].T), "dP"
            # use random P and dS in place of the softmax
            P = rng.standard_normal((16, kSubM)); dS = rng.standard_normal((16, kSubM))
            pa = pack_p(mat_to_frag(P), kSubM); dsa = pack_p(mat_to_frag(dS), kSubM)
            # dS^T to shared memory, as the kernel writes it
            for lane in range(32):
                for j in range(kSubM // 8):
                    for i in range(2):
                        row = 16*w + lane//4 + 8*i
                        addr = swz(128, row, h*(kSubM//8) + j) + 4*(lane % 4)
                        pair = dsa[lane][j//2][(j % 2)*2 + i]
                        ds_mem[addr] = pair[0]; ds_mem[addr+2] = pair[1]
            dS_T_full[16*w:16*w+16, h*kSubM:(h+1)*kSubM] = dS
            gemm_acc(RB, D, kSubM//16, dv, pa, qd, dobase + rows, 0)
            gemm_acc(RB, D, kSubM//16, dk, dsa, qd, rows, 0)
            dv_ref += P @ dO[h*kSubM:(h+1)*kSubM]; dk_ref += dS @ Q[h*kSubM:(h+1)*kSubM]
        assert np.allclose(frag_to_mat(dv, D), dv_ref), "dV"
        assert np.allclose(frag_to_mat(dk, D), dk_ref), "dK"
    # dQ
    dst = Tile(np.zeros((1, 1)), 128); dst.mem = ds_mem
    dQ_ref = dS_T_full.T @ K   # 64 x D
    parts = warps // 4; dq_cols = D // parts; chunk = min(64, dq_cols)
    block = np.full(64*D, np.nan)
    for w in range(warps):
        rt = w % 4; c0w = (w // 4)*dq_cols
        for c in range(dq_cols // chunk):
            col0 = c0w + c*chunk
            acc = [[0.0]*(chunk//2) for _ in range(32)]
            for kk in range(N // 16):
                a = ldmatrix_x4(dst, [swz(128, 16*kk + (l % 8) + 8*(l//16), 2*rt + (l//8) % 2) for l in range(32)], trans=True)
                gemm_acc(RB, chunk, 1, acc, [[a[l]] for l in range(32)], kv, 16*kk*RB, col0)
            M = frag_to_mat(acc, chunk)
            assert np.allclose(M, dQ_ref[16*rt:16*rt+16, col0:col0+chunk]), "dQ"
            for lane in range(32):
                thread = 32*rt + lane
                for jj in range(chunk // 8):
                    j = col0//8 + jj
                    for r in range(4):
                        idx = bwd_dq_index(j//8, 4*(j % 8), thread) + r
                        assert np.isnan(block[idx]); block[idx] = acc[lane][4*jj + r]
    out = np.zeros((64, D))
    for e in range(64*D):
        r, c = bwd_dq_position(e); out[r, c] = block[e]
    assert np.allclose(out, dQ_ref), "dQ block layout"
    print("ok D", D, "N", N)

for D, N in [(64, 128), (128, 128), (128, 64)]: check(D, N)

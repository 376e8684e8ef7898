#!/usr/bin/env python3
"""Index checks of the prepared patches in this folder (no GPU). They check the arithmetic of the patches against
the layouts the kernels already use, not the hardware: the patches still need the device's tests.
  python3 docs/experiments/check_patches.py
"""
# 1) VTail (diet patch) against the old zero_v_rows_past_end arithmetic, exhaustively on small ranges.
for BN in (64, 80, 128, 176, 192):
    for seqlen_k in range(0, 5 * BN + 3):
        block, valid_t = seqlen_k // BN, seqlen_k % BN
        for v_block in range(0, 6):
            left = seqlen_k - v_block * BN
            old = None if left >= BN else max(left, 0)          # None: nothing zeroed
            new = None if v_block < block else (valid_t if v_block == block else 0)
            assert old == new, (BN, seqlen_k, v_block, old, new)
print("VTail: same rows zeroed as before for every (block_n, seqlen_k, v_block) tried")

# 2) store_p (p-smem patch): stmatrix x4 of convert_p's registers lands every P element where the K-major
#    128B-swizzled A operand (the layout TMA gives Q, and the epilogue's O staging) expects it.
def layout_addr(m, col, chunk_bytes):          # K-major, 128-byte rows, 64 16-bit elements per chunk
    chunk, unit, e = col // 64, (col % 64) // 8, col % 8
    return chunk * chunk_bytes + m * 128 + ((unit ^ (m % 8)) * 16) + 2 * e
for BN in (64, 128, 192, 256):
    chunk_bytes = 192 * 128
    mem = {}
    # convert_p / pack_p_fragments: a[t][i] holds (row, col), (row, col+1) with
    # i=0: (r, 16t+2c), 1: (r+8, 16t+2c), 2: (r, 16t+8+2c), 3: (r+8, 16t+8+2c); r = lane/4, c = lane%4
    for warp in range(4):
        for t in range(BN // 16):
            # stmatrix: matrix i (register i of every lane); lane L supplies the address of row L%8 of matrix L/8;
            # within matrix i, lane holds row lane/4, elements 2*(lane%4), +1.
            addrs = {}
            for L in range(32):
                r = warp * 16 + ((L // 8) % 2) * 8 + L % 8
                col = 16 * t + (L // 16) * 8
                chunk, unit = col // 64, (col % 64) // 8
                addrs[L // 8, L % 8] = chunk * chunk_bytes + r * 128 + ((unit ^ (r % 8)) * 16)
            for lane in range(32):
                r0, c = lane // 4, lane % 4
                frag = {0: (r0, 16 * t + 2 * c), 1: (r0 + 8, 16 * t + 2 * c),
                        2: (r0, 16 * t + 8 + 2 * c), 3: (r0 + 8, 16 * t + 8 + 2 * c)}
                for i in range(4):
                    row_in_mat, elem = lane // 4, 2 * (lane % 4)
                    base = addrs[i, row_in_mat]
                    m, col = frag[i]
                    m += warp * 16
                    for e in range(2):
                        a = base + 2 * (elem + e)
                        assert a == layout_addr(m, col + e, chunk_bytes), (BN, warp, t, lane, i, e)
                        assert a not in mem
                        mem[a] = (m, col + e)
    assert len(mem) == 64 * BN, (len(mem), 64 * BN)
print("store_p: stmatrix addresses match the K-major 128B-swizzled layout for every element, no overlaps")

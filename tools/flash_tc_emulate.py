#!/usr/bin/env python3
"""Lane-level emulation of the flash_tc kernels' index math, for a machine without a GPU.

kernels/cuda/attention.cu's flash_tc kernels are transliterated here warp by warp: every
ldmatrix.x4 (with and without .trans) and every mma.m16n8k16 is emulated with the fragment
layouts the PTX ISA states (and the kernel's comment repeats), on fp64 values without bf16
rounding, and the results are compared with a direct causal-attention reference (forward out and
logsumexp; backward dQ, dK, dV). With exact arithmetic the two agree to ~1e-15: any error in a
shared-memory address, a fragment-to-operand mapping, the causal masking (the skipped tiles, the
forward's skipped 16-key groups, the masked diagonal tiles), the padding of a partial last tile or
the online softmax shows up as an O(1) difference.

What it cannot check: the hardware's own semantics (it assumes the PTX ISA's layouts), bf16
rounding, cp.async / barrier ordering, and anything the transliteration does not mirror: it must
be kept in step with the kernels by hand. The GPU tests (tests/cuda/test_cuda_attention_tc.cpp)
are the real check.

    python3 tools/flash_tc_emulate.py 64:17 64:100 128:70 128:130     # HS:T pairs, ~30 s
"""
import math, random, sys

def ldm_x4(tile, addr_of_lane, trans):
    # addr_of_lane(l) -> (row, col) start of an 8-element row; matrix i from lanes 8i..8i+7
    mats = []
    for i in range(4):
        rows = []
        for r in range(8):
            row, col = addr_of_lane(8 * i + r)
            rows.append([tile[row][col + c] for c in range(8)])
        mats.append(rows)
    out = []
    for l in range(32):
        regs = []
        for i in range(4):
            M = mats[i]
            if not trans:
                regs.append((M[l // 4][2 * (l % 4)], M[l // 4][2 * (l % 4) + 1]))
            else:
                regs.append((M[2 * (l % 4)][l // 4], M[2 * (l % 4) + 1][l // 4]))
        out.append(regs)
    return out  # out[lane][reg] = (lo, hi)

def mma(d, a, b0, b1):
    # d[lane] = [4 floats]; a[lane] = 4 pairs; b0[lane], b1[lane] pairs
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for l in range(32):
        g, t = l // 4, l % 4
        A[g][2 * t], A[g][2 * t + 1] = a[l][0]
        A[g + 8][2 * t], A[g + 8][2 * t + 1] = a[l][1]
        A[g][2 * t + 8], A[g][2 * t + 9] = a[l][2]
        A[g + 8][2 * t + 8], A[g + 8][2 * t + 9] = a[l][3]
        B[2 * t][g], B[2 * t + 1][g] = b0[l]
        B[2 * t + 8][g], B[2 * t + 9][g] = b1[l]
    for l in range(32):
        g, t = l // 4, l % 4
        for e in range(4):
            r = g + 8 * (e // 2)
            c = 2 * t + (e & 1)
            d[l][e] += sum(A[r][k] * B[k][c] for k in range(16))

def frag_rows(r0, c0):
    return lambda l: (r0 + l % 16, c0 + (l // 16) * 8)
def frag_nk(n0, k0):
    return lambda l: (n0 + l % 8 + (l // 16) * 8, k0 + ((l // 8) % 2) * 8)

def warp_scores(N, HS, A, a_r0, Bt, groups=None):
    if groups is None: groups = N // 16
    s = [[[0.0] * 4 for _ in range(N // 8)] for _ in range(32)]  # s[lane][j][e]
    for kk in range(HS // 16):
        a = [[x for x in regs] for regs in ldm_x4(A, frag_rows(a_r0, kk * 16), False)]
        for nn in range(N // 16):
            if nn >= groups: break
            b = ldm_x4(Bt, frag_nk(nn * 16, kk * 16), False)
            for half in range(2):
                d = [s[l][2 * nn + half] for l in range(32)]
                mma(d, a, [b[l][2 * half] for l in range(32)], [b[l][2 * half + 1] for l in range(32)])
    return s

def warp_accumulate(acc, p, K, HS, X, groups=None):
    if groups is None: groups = K // 16
    for kk in range(K // 16):
        if kk >= groups: break
        a = []
        for l in range(32):
            c0, c1 = p[l][2 * kk], p[l][2 * kk + 1]
            a.append([(c0[0], c0[1]), (c0[2], c0[3]), (c1[0], c1[1]), (c1[2], c1[3])])
        for nn in range(HS // 16):
            b = ldm_x4(X, frag_rows(kk * 16, nn * 16), True)
            for half in range(2):
                d = [acc[l][2 * nn + half] for l in range(32)]
                mma(d, a, [b[l][2 * half] for l in range(32)], [b[l][2 * half + 1] for l in range(32)])

def load_tile(mat, r0, rows, T, HS):
    pad = 8
    return [[(mat[r0 + r][c] if r0 + r < T else 0.0) for c in range(HS)] + [None] * pad for r in range(rows)]

LOG2E = 1.4426950408889634
def exp2(x): return 0.0 if x == -math.inf else 2.0 ** x

def forward(Q, K, V, T, HS):
    scale = 1 / math.sqrt(HS); sl2 = scale * LOG2E
    out = [[None] * HS for _ in range(T)]; lse = [None] * T
    nblk = (T + 63) // 64
    for bx in range(nblk):
        q0 = (nblk - 1 - bx) * 64
        Qs = load_tile(Q, q0, 64, T, HS)
        for warp in range(4):
            o = [[[0.0] * 4 for _ in range(HS // 8)] for _ in range(32)]
            m = [[-math.inf] * 2 for _ in range(32)]; lsum = [[0.0] * 2 for _ in range(32)]
            row0 = q0 + 16 * warp
            for k0 in range(0, q0 + 1, 64):
                Ks = load_tile(K, k0, 64, T, HS); Vs = load_tile(V, k0, 64, T, HS)
                diag = k0 == q0
                groups = warp + 1 if diag else 4
                s = warp_scores(64, HS, Qs, 16 * warp, Ks, groups)
                for l in range(32):
                    g, t = l // 4, l % 4
                    for j in range(8):
                        for e in range(4):
                            key = k0 + 8 * j + 2 * t + (e & 1); row = row0 + g + 8 * (e // 2)
                            s[l][j][e] = -math.inf if (diag and key > row) else s[l][j][e] * sl2
                for r in range(2):
                    mx = [max([m[l][r]] + [max(s[l][j][2 * r], s[l][j][2 * r + 1]) for j in range(8)]) for l in range(32)]
                    mx = [max(mx[l], mx[l ^ 1]) for l in range(32)]
                    mx = [max(mx[l], mx[l ^ 2]) for l in range(32)]
                    for l in range(32):
                        alpha = exp2(m[l][r] - mx[l]) if m[l][r] != -math.inf else 0.0
                        m[l][r] = mx[l]
                        sm = 0.0
                        for j in range(8):
                            for e in (2 * r, 2 * r + 1):
                                s[l][j][e] = exp2(s[l][j][e] - mx[l]); sm += s[l][j][e]
                        lsum[l][r] = lsum[l][r] * alpha + sm
                        for j in range(HS // 8):
                            o[l][j][2 * r] *= alpha; o[l][j][2 * r + 1] *= alpha
                warp_accumulate(o, s, 64, HS, Vs, groups)
            for r in range(2):
                ls = [lsum[l][r] + lsum[l ^ 1][r] for l in range(32)]
                ls = [ls[l] + ls[l ^ 2] for l in range(32)]
                for l in range(32):
                    g, t = l // 4, l % 4
                    row = row0 + g + 8 * r
                    if row >= T: continue
                    if t == 0: lse[row] = m[l][r] / LOG2E + math.log(ls[l])
                    for j in range(HS // 8):
                        out[row][8 * j + 2 * t] = o[l][j][2 * r] / ls[l]
                        out[row][8 * j + 2 * t + 1] = o[l][j][2 * r + 1] / ls[l]
    return out, lse

def backward(Q, K, V, dO, O, lse, T, HS):
    kIn = 32 if HS == 128 else 64
    scale = 1 / math.sqrt(HS); sl2 = scale * LOG2E
    D = [sum(dO[i][d] * O[i][d] for d in range(HS)) for i in range(T)]
    dQ = [[0.0] * HS for _ in range(T)]; dK = [[0.0] * HS for _ in range(T)]; dV = [[0.0] * HS for _ in range(T)]
    nblk = (T + 63) // 64
    for bx in range(nblk):  # dkdv
        j0 = bx * 64
        Ks = load_tile(K, j0, 64, T, HS); Vs = load_tile(V, j0, 64, T, HS)
        for warp in range(4):
            key0 = j0 + 16 * warp
            dk = [[[0.0] * 4 for _ in range(HS // 8)] for _ in range(32)]
            dv = [[[0.0] * 4 for _ in range(HS // 8)] for _ in range(32)]
            for i0 in range(j0, T, kIn):
                Qs = load_tile(Q, i0, kIn, T, HS); dOs = load_tile(dO, i0, kIn, T, HS)
                lse2 = [lse[i0 + i] * LOG2E if i0 + i < T else math.inf for i in range(kIn)]
                Ds = [D[i0 + i] if i0 + i < T else 0.0 for i in range(kIn)]
                masked = i0 < j0 + 63
                pt = warp_scores(kIn, HS, Ks, 16 * warp, Qs)
                dpt = warp_scores(kIn, HS, Vs, 16 * warp, dOs)
                for l in range(32):
                    g, t = l // 4, l % 4
                    for j in range(kIn // 8):
                        for e in range(4):
                            qi = 8 * j + 2 * t + (e & 1); key = key0 + g + 8 * (e // 2)
                            p = 0.0 if (masked and key > i0 + qi) else (0.0 if lse2[qi] == math.inf else exp2(pt[l][j][e] * sl2 - lse2[qi]))
                            pt[l][j][e] = p
                            dpt[l][j][e] = p * (dpt[l][j][e] - Ds[qi])
                warp_accumulate(dv, pt, kIn, HS, dOs)
                warp_accumulate(dk, dpt, kIn, HS, Qs)
            for l in range(32):
                g, t = l // 4, l % 4
                for half in range(2):
                    row = key0 + g + 8 * half
                    if row >= T: continue
                    for j in range(HS // 8):
                        for c in range(2):
                            dK[row][8 * j + 2 * t + c] += scale * dk[l][j][2 * half + c]
                            dV[row][8 * j + 2 * t + c] += dv[l][j][2 * half + c]
    for bx in range(nblk):  # dq
        i0 = (nblk - 1 - bx) * 64
        Qs = load_tile(Q, i0, 64, T, HS); dOs = load_tile(dO, i0, 64, T, HS)
        for warp in range(4):
            row0 = i0 + 16 * warp
            dq = [[[0.0] * 4 for _ in range(HS // 8)] for _ in range(32)]
            for j0 in range(0, min(i0 + 64, T), kIn):
                Ks = load_tile(K, j0, kIn, T, HS); Vs = load_tile(V, j0, kIn, T, HS)
                masked = j0 + kIn - 1 > i0
                s = warp_scores(kIn, HS, Qs, 16 * warp, Ks)
                dp = warp_scores(kIn, HS, dOs, 16 * warp, Vs)
                for l in range(32):
                    g, t = l // 4, l % 4
                    for j in range(kIn // 8):
                        for e in range(4):
                            r = e // 2; key = j0 + 8 * j + 2 * t + (e & 1); row = row0 + g + 8 * r
                            l2 = lse[row] * LOG2E if row < T else math.inf
                            Dr = D[row] if row < T else 0.0
                            p = 0.0 if (masked and key > row) or l2 == math.inf else exp2(s[l][j][e] * sl2 - l2)
                            s[l][j][e] = p * (dp[l][j][e] - Dr)
                warp_accumulate(dq, s, kIn, HS, Ks)
            for l in range(32):
                g, t = l // 4, l % 4
                for half in range(2):
                    row = row0 + g + 8 * half
                    if row >= T: continue
                    for j in range(HS // 8):
                        for c in range(2):
                            dQ[row][8 * j + 2 * t + c] += scale * dq[l][j][2 * half + c]
    return dQ, dK, dV

def reference(Q, K, V, dO, T, HS):
    scale = 1 / math.sqrt(HS)
    P = []; lse = []; O = []
    for i in range(T):
        s = [scale * sum(Q[i][d] * K[j][d] for d in range(HS)) for j in range(i + 1)]
        mx = max(s); z = sum(math.exp(x - mx) for x in s)
        lse.append(mx + math.log(z))
        p = [math.exp(x - mx) / z for x in s]; P.append(p)
        O.append([sum(p[j] * V[j][d] for j in range(i + 1)) for d in range(HS)])
    dQ = [[0.0] * HS for _ in range(T)]; dK = [[0.0] * HS for _ in range(T)]; dV = [[0.0] * HS for _ in range(T)]
    for i in range(T):
        dp = [sum(dO[i][d] * V[j][d] for d in range(HS)) for j in range(i + 1)]
        Di = sum(P[i][j] * dp[j] for j in range(i + 1))
        for j in range(i + 1):
            ds = P[i][j] * (dp[j] - Di)
            for d in range(HS):
                dV[j][d] += P[i][j] * dO[i][d]
                dQ[i][d] += scale * ds * K[j][d]
                dK[j][d] += scale * ds * Q[i][d]
    return O, lse, dQ, dK, dV

def maxdiff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

def main(argv):
    pairs = [tuple(int(v) for v in a.split(":")) for a in argv] or [(64, 17), (64, 100), (128, 130)]
    worst = 0.0
    for HS, T in pairs:
        rnd = random.Random(HS * 1000 + T)
        mk = lambda: [[rnd.gauss(0, 1) for _ in range(HS)] for _ in range(T)]
        Q, K, V, dO = mk(), mk(), mk(), mk()
        O, lse = forward(Q, K, V, T, HS)
        Or, lser, dQr, dKr, dVr = reference(Q, K, V, dO, T, HS)
        dQ, dK, dV = backward(Q, K, V, dO, Or, lser, T, HS)
        diffs = {"out": maxdiff(O, Or), "lse": max(abs(a - b) for a, b in zip(lse, lser)),
                 "dQ": maxdiff(dQ, dQr), "dK": maxdiff(dK, dKr), "dV": maxdiff(dV, dVr)}
        print(f"HS {HS} T {T}: " + " ".join(f"{k} {v:.1e}" for k, v in diffs.items()), flush=True)
        worst = max(worst, *diffs.values())
    ok = worst < 1e-9
    print("ok: the emulated kernels match the reference" if ok else f"MISMATCH: max diff {worst:.3e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

// Matmul: the PyTorch Linear layer, out = inp W^T + b, where almost all of GPT-2's FLOPs are.
//
// The GEMMs are Eigen's (cache-blocked, packed, SIMD kernels). Eigen::Map views our row-major
// buffers without copying: inp (N,C) and out (N,OC) as RowMajor matrices and the weight (OC,C)
// as a RowMajor matrix whose .transpose() is the (C,OC) operand. `noalias()` tells Eigen the
// destination does not overlap the operands, so it writes the product straight into our buffer
// (no temporary), and `noalias() +=` is a GEMM with beta = 1: exactly the accumulate convention
// of the backward.
//
// Threads: we split the output ourselves (parallel_gemm below) into up to 8 pieces along its
// longer side and let each thread run a single-threaded Eigen GEMM on whole pieces (Eigen runs
// sequentially inside an OpenMP region). Eigen's own parallel GEMM makes the threads share
// packed panels and wait for each other at every panel (spinning), which on 2 cores measured
// 1.3-1.7x slower for the LM-head shapes (N1024 C256 OC50304) and far worse when the cores are
// shared with other work; independent pieces with a dynamic schedule need no synchronisation and
// let a thread that got ahead take the next piece. The pieces depend only on the shape, never on
// the thread count, so the result is bitwise the same for any number of threads. The cost is
// that each piece packs its own copy of the shared operand (at most 8 reads of it).
// Eigen packs operand panels into small buffers of its own (on the stack below 128 KiB, else the
// heap); that is the only memory any CPU op obtains itself.
//
// Bias, the GELU epilogue and dbias are memory-bound loops of our own, parallel over rows
// (forward) or over column blocks (dbias, a reduction over rows: each thread owns a block of
// columns and walks all rows in order, deterministic without partial buffers).
// GCC 12 reports a false -Wmaybe-uninitialized inside its own avx512fintrin.h when Eigen's
// AVX-512 panel packing is inlined here; the warning is about the intrinsic's unused lane
// operand, not our code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#include <algorithm>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/ops.h"

namespace mt::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapRow = Eigen::Map<RowMat>;
using CMapRow = Eigen::Map<const RowMat>;

// Runs block(r0, nr, c0, nc) over a partition of the (rows, cols) output into pieces along its
// longer side: up to 8 pieces, each a multiple of 16 long (column pieces start on a 64-byte
// boundary) and at least 64, fewer when the side is short. Dynamic schedule: a thread that
// finishes early takes the next piece.
template <class Block>
void parallel_gemm(int rows, int cols, Block block) {
    constexpr int kMaxPieces = 8, kMinPiece = 64, kAlign = 16;
    const bool by_rows = rows >= cols;
    const int n = by_rows ? rows : cols;
    int step = (n + kMaxPieces - 1) / kMaxPieces;
    step = std::max(kMinPiece, (step + kAlign - 1) / kAlign * kAlign);
    const int pieces = (n + step - 1) / step;
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pieces; p++) {
        const int a = p * step, len = std::min(n, a + step) - a;
        if (by_rows) {
            block(a, len, 0, cols);
        } else {
            block(0, rows, a, len);
        }
    }
}

// out (N,OC) = inp (N,C) W(OC,C)^T   (overwrites)
inline void gemm_xwt(float* out, const float* inp, const float* weight, int N, int C, int OC) {
    MapRow o(out, N, OC);
    CMapRow x(inp, N, C);
    CMapRow w(weight, OC, C);
    parallel_gemm(N, OC, [&](int r0, int nr, int c0, int nc) {
        o.block(r0, c0, nr, nc).noalias() = x.middleRows(r0, nr) * w.middleRows(c0, nc).transpose();
    });
}

}  // namespace

// GEMM, then the bias added row by row.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
    gemm_xwt(out, inp, weight, N, C, OC);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* o = out + static_cast<long long>(n) * OC;
#pragma omp simd
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

// GELU epilogue: the bias add and the GELU share one pass over the GEMM result (the unfused
// path reads and writes the (N,OC) tensor once more for the GELU).
void matmul_forward_gelu(float* out, float* pre_act, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC) {
    gemm_xwt(pre_act, inp, weight, N, C, OC);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* p = pre_act + static_cast<long long>(n) * OC;
        float* o = out + static_cast<long long>(n) * OC;
        if (bias) {
#pragma omp simd
            for (int j = 0; j < OC; j++) p[j] += bias[j];
        }
        fast::gelu_span(o, p, static_cast<size_t>(OC));  // the row is in L1: no extra traffic
    }
}

// Three accumulating products: dinp += dout W, dW += dout^T inp, db += column sums of dout.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
    CMapRow d(dout, N, OC);
    if (dinp) {
        MapRow dx(dinp, N, C);
        CMapRow w(weight, OC, C);
        parallel_gemm(N, C, [&](int r0, int nr, int c0, int nc) {  // (N,OC)(OC,C)
            dx.block(r0, c0, nr, nc).noalias() += d.middleRows(r0, nr) * w.middleCols(c0, nc);
        });
    }
    {
        MapRow dw(dweight, OC, C);
        CMapRow x(inp, N, C);
        parallel_gemm(OC, C, [&](int r0, int nr, int c0, int nc) {  // (OC,N)(N,C)
            dw.block(r0, c0, nr, nc).noalias() +=
                d.middleCols(r0, nr).transpose() * x.middleCols(c0, nc);
        });
    }
    if (dbias) {
        constexpr int kBlock = 64;
        const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
        for (int blk = 0; blk < nblocks; blk++) {
            const int j0 = blk * kBlock, j1 = std::min(OC, j0 + kBlock);
            float acc[kBlock] = {};
            for (int n = 0; n < N; n++) {
                const float* row = dout + static_cast<long long>(n) * OC;
#pragma omp simd
                for (int j = j0; j < j1; j++) acc[j - j0] += row[j];
            }
            for (int j = j0; j < j1; j++) dbias[j] += acc[j - j0];
        }
    }
}

}  // namespace mt::cpu

#pragma GCC diagnostic pop

// Matmul: the PyTorch Linear layer, out = inp W^T + b, where almost all of GPT-2's FLOPs are.
//
// The three products are GEMMs of gemm.h (our packed AVX-512 GEMM where compiled, else Eigen's),
// reading our row-major buffers in place: the forward reads the weight (OC,C) as W^T, dW reads
// dout (N,OC) as dout^T; the GEMM's packing absorbs both transposes. The backward GEMMs
// accumulate (beta = 1), exactly the += convention of the backward.
//
// Bias, the GELU epilogue and dbias are memory-bound loops of our own, parallel over rows
// (forward) or over column blocks (dbias, a reduction over rows: each thread owns a block of
// columns and walks all rows in order, deterministic without partial buffers).
#include <algorithm>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

namespace mt::cpu {
namespace {

// out (N,OC) = inp (N,C) W(OC,C)^T   (overwrites)
inline void gemm_xwt(float* out, const float* inp, const float* weight, int N, int C, int OC) {
    gemm(N, OC, C, {inp, C, false}, {weight, C, true}, out, OC, /*accumulate=*/false);
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
    if (dinp)  // dinp (N,C) += dout (N,OC) W (OC,C)
        gemm(N, C, OC, {dout, OC, false}, {weight, C, false}, dinp, C, /*accumulate=*/true);
    // dweight (OC,C) += dout^T (OC,N) inp (N,C)
    gemm(OC, C, N, {dout, OC, true}, {inp, C, false}, dweight, C, /*accumulate=*/true);
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

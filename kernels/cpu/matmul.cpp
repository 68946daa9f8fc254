// Matmul: the PyTorch Linear layer, out = inp W^T + b, where almost all of GPT-2's FLOPs are.
//
// The GEMMs are Eigen's (cache-blocked, packed, SIMD, OpenMP-parallel over output blocks when
// called outside a parallel region). Eigen::Map views our row-major buffers without copying:
// inp (N,C) and out (N,OC) as RowMajor matrices and the weight (OC,C) as a RowMajor matrix
// whose .transpose() is the (C,OC) operand. `noalias()` tells Eigen the destination does not
// overlap the operands, so it writes the product straight into our buffer (no temporary), and
// `noalias() +=` is a GEMM with beta = 1: exactly the accumulate convention of the backward.
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

// out (N,OC) = inp (N,C) W(OC,C)^T   (overwrites)
inline void gemm_xwt(float* out, const float* inp, const float* weight, int N, int C, int OC) {
    MapRow o(out, N, OC);
    CMapRow x(inp, N, C);
    CMapRow w(weight, OC, C);
    o.noalias() = x * w.transpose();
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
        dx.noalias() += d * w;  // (N,OC)(OC,C)
    }
    {
        MapRow dw(dweight, OC, C);
        CMapRow x(inp, N, C);
        dw.noalias() += d.transpose() * x;  // (OC,N)(N,C)
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

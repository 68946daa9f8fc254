// Matmul: the PyTorch Linear layer, out = inp W^T + b, where almost all of GPT-2's FLOPs are.
//
// The three products are GEMMs of gemm.h: the kernels.matmul ladder step the backend passes
// (naive, blocked, packed, blas; auto = our packed GEMM on the avx512/avx2 levels, else Eigen's),
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

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

// out (N,OC) = inp (N,C) W(OC,C)^T   (overwrites)
inline void gemm_xwt(float* out, const float* inp, const float* weight, int N, int C, int OC,
                     MatmulImpl impl) {
    gemm(impl, N, OC, C, {inp, C, false}, {weight, C, true}, out, OC, /*accumulate=*/false);
}

}  // namespace

// GEMM, then the bias added row by row.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, MatmulImpl impl) {
    gemm_xwt(out, inp, weight, N, C, OC, impl);
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
                         const float* bias, int N, int C, int OC, MatmulImpl impl) {
    gemm_xwt(pre_act, inp, weight, N, C, OC, impl);
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

// dbias (OC) += column sums of dout (N,OC): each thread owns a block of columns and walks all
// rows in order (deterministic, no partial buffers).
static void bias_backward(float* dbias, const float* dout, int N, int OC) {
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

// Up to three accumulating products: dinp += dout W, dW += dout^T inp, db += column sums of
// dout; a null output is not computed (a frozen weight skips the dW GEMM).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulImpl impl) {
    if (dinp)  // dinp (N,C) += dout (N,OC) W (OC,C)
        gemm(impl, N, C, OC, {dout, OC, false}, {weight, C, false}, dinp, C, /*accumulate=*/true);
    if (dweight)  // dweight (OC,C) += dout^T (OC,N) inp (N,C)
        gemm(impl, OC, C, N, {dout, OC, true}, {inp, C, false}, dweight, C, /*accumulate=*/true);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

// ---- int8 weights -------------------------------------------------------------------------
// The same GEMMs as the fp32 path with the weight as an int8 operand (gemm.h GemmInt8Operand):
// the packed GEMM converts and scales the weight while packing its panels, so what it teaches
// is that the weight crosses main memory at 1 byte per element instead of 4, is never
// materialised in fp32, and the register micro-kernel is unchanged.

// out (N,OC) = inp (N,C) (scale * q)^T + bias
void matmul_int8_forward(float* out, const float* inp, const int8_t* weight, const float* scale,
                         const float* bias, int N, int C, int OC) {
    gemm_int8(N, OC, C, {inp, C, false}, {weight, scale, C, true}, out, OC, /*accumulate=*/false);
    if (!bias) return;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* o = out + static_cast<long long>(n) * OC;
#pragma omp simd
        for (int j = 0; j < OC; j++) o[j] += bias[j];
    }
}

// dinp (N,C) += dout (N,OC) (scale * q) (OC,C); dbias += column sums of dout. No dW: frozen.
void matmul_int8_backward(float* dinp, float* dbias, const float* dout, const int8_t* weight,
                          const float* scale, int N, int C, int OC) {
    if (dinp)
        gemm_int8(N, C, OC, {dout, OC, false}, {weight, scale, C, false}, dinp, C,
                  /*accumulate=*/true);
    if (dbias) bias_backward(dbias, dout, N, OC);
}

// ---- LoRA ---------------------------------------------------------------------------------
// Two thin GEMMs through the rank-R bottleneck: u = scale inp A^T (N,R), out += u B^T. The
// (N,R) intermediate is tiny (R << C), so the adapter costs 2NR(C+OC) flops beside the base's
// 2NC OC, and the merged W + scale B A is never formed.
namespace {
void scale_in_place(float* x, long long n, float s) {
#pragma omp parallel for simd schedule(static)
    for (long long i = 0; i < n; i++) x[i] *= s;
}
}  // namespace

void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B, int N,
                  int C, int OC, int R, float scale) {
    gemm(N, R, C, {inp, C, false}, {A, C, true}, u, R, /*accumulate=*/false);  // inp A^T
    scale_in_place(u, static_cast<long long>(N) * R, scale);
    gemm(N, OC, R, {u, R, false}, {B, R, true}, out, OC, /*accumulate=*/true);  // out += u B^T
}

void lora_backward(float* dinp, float* dA, float* dB, float* du, const float* dout,
                   const float* inp, const float* u, const float* A, const float* B, int N, int C,
                   int OC, int R, float scale) {
    gemm(OC, R, N, {dout, OC, true}, {u, R, false}, dB, R, /*accumulate=*/true);    // dout^T u
    gemm(N, R, OC, {dout, OC, false}, {B, R, false}, du, R, /*accumulate=*/false);  // dout B
    scale_in_place(du, static_cast<long long>(N) * R, scale);
    gemm(R, C, N, {du, R, true}, {inp, C, false}, dA, C, /*accumulate=*/true);  // du^T inp
    if (dinp) gemm(N, C, R, {du, R, false}, {A, C, false}, dinp, C, /*accumulate=*/true);  // du A
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

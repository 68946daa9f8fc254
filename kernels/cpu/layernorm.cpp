// LayerNorm over the channel dimension (eps = math::kLayerNormEps), as GPT-2 uses it.
//
// Forward, per row x (C):  mean = sum x / C,  var = sum (x - mean)^2 / C (two passes over the
// row: the row is in L1, and the two-pass variance does not cancel catastrophically the way
// E[x^2] - mean^2 does),  rstd = 1/sqrt(var + eps),  out = (x - mean) rstd w + b.
// mean and rstd are saved so the backward need not recompute them.
//
// Backward, with xhat = (x - mean) rstd and dxhat = dout * w:
//   dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
//   dw = sum_rows dout xhat,   db = sum_rows dout
// dx is row-local (parallel over rows). dw/db reduce over rows: rather than per-thread partial
// buffers (scratch the op would have to allocate) the second loop gives each thread a block of
// channels and walks all rows, recomputing xhat: race-free, deterministic, and it costs one more
// read of inp and dout.
//
// kernels.layernorm_forward picks how a row's statistics are computed: two_pass (above) or
// welford, one read of the row with running (count, mean, M2) per SIMD lane, merged with Chan's
// formula. On a CPU the row (C floats, 3 KiB at C = 768) is in L1 after the first read, so the
// second pass is nearly free and Welford's longer dependency chain (the mean update feeds M2)
// and per-element division do not pay: the lesson is that "fewer passes" only wins when the
// passes go to memory (see the CUDA ladder, where they go to L2/HBM).
//
// The fused residual variant adds the two residual inputs, writes the sum (the next block needs
// it) and normalises it in the same pass over the row, saving one full read of the residual.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

// Two passes: the mean, then the variance around it (no cancellation).
inline void two_pass_stats(const float* x, int C, float* mean, float* var) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    const float m = sum / C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
        const float d = x[c] - m;
        v += d * d;
    }
    *mean = m;
    *var = v / C;
}

// One pass: lane l runs Welford's update over x[l], x[l + L], x[l + 2L], ... (the lane loop
// vectorises), then the lanes are merged pairwise in a fixed tree with Chan's formula:
//   n = na + nb, d = mb - ma, mean = ma + d nb / n, M2 = M2a + M2b + d^2 na nb / n.
inline void welford_stats(const float* x, int C, float* mean, float* var) {
    constexpr int L = 16;
    float n[L] = {}, m[L] = {}, m2[L] = {};
    for (int c0 = 0; c0 < C; c0 += L) {
        const int lanes = std::min(L, C - c0);
#pragma omp simd
        for (int l = 0; l < lanes; l++) {
            const float v = x[c0 + l];
            n[l] += 1.0f;
            const float d = v - m[l];
            m[l] += d / n[l];
            m2[l] += d * (v - m[l]);
        }
    }
    for (int width = L / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; l++) {
            const float na = n[l], nb = n[l + width], nt = na + nb;
            if (nb == 0.0f) continue;
            const float d = m[l + width] - m[l];
            m[l] += d * nb / nt;
            m2[l] += m2[l + width] + d * d * na * nb / nt;
            n[l] = nt;
        }
    *mean = m[0];
    *var = m2[0] / C;
}

// Normalises one row x (C) into out, saving its mean and rstd.
inline void layernorm_row(float* out, float* mean_out, float* rstd_out, const float* x,
                          const float* w, const float* b, int C, LayerNormForwardImpl impl) {
    float m = 0.0f, var = 0.0f;
    if (impl == LayerNormForwardImpl::welford)
        welford_stats(x, C, &m, &var);
    else
        two_pass_stats(x, C, &m, &var);
    const float s = 1.0f / std::sqrt(var + math::kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * w[c] + b[c];
    *mean_out = m;
    *rstd_out = s;
}

}  // namespace

// Row-parallel forward; each row independent.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, LayerNormForwardImpl impl) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const long long off = static_cast<long long>(n) * C;
        layernorm_row(out + off, mean + n, rstd + n, inp + off, w, b, C, impl);
    }
}

// Residual add fused into the normalisation pass: residual = inp1 + inp2 is written once and
// normalised while it is still in cache.
void fused_residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                      const float* inp1, const float* inp2, const float* w,
                                      const float* b, int N, int C, LayerNormForwardImpl impl) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const long long off = static_cast<long long>(n) * C;
        float* r = residual + off;
        const float* a = inp1 + off;
        const float* bb = inp2 + off;
        for (int c = 0; c < C; c++) r[c] = a[c] + bb[c];
        layernorm_row(out + off, mean + n, rstd + n, r, w, b, C, impl);
    }
}

// Two loops: dw/db channel-block-parallel over all rows, then dinp row-parallel (in this order
// so that dinp may alias dout: each dinp element is written after its last read).
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
    // dw, db: reductions over rows, each thread owning a block of channels. A null one is a
    // frozen parameter (both null: no reduction).
    constexpr int kBlock = 64;
    const int nblocks = dw || db ? (C + kBlock - 1) / kBlock : 0;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
        float accw[kBlock] = {}, accb[kBlock] = {};
        for (int n = 0; n < N; n++) {
            const long long off = static_cast<long long>(n) * C;
            const float* x = inp + off;
            const float* d = dout + off;
            const float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int c = c0; c < c1; c++) {
                accw[c - c0] += d[c] * ((x[c] - m) * s);
                accb[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            if (dw) dw[c] += accw[c - c0];
            if (db) db[c] += accb[c - c0];
        }
    }
    // dinp: per row, the two means of the chain rule, then the update.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const long long off = static_cast<long long>(n) * C;
        const float* x = inp + off;
        const float* d = dout + off;
        float* dx = dinp + off;
        const float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s;
            const float dxhat = d[c] * w[c];
            dnorm_mean += dxhat;
            dnorm_norm_mean += dxhat * xhat;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            const float xhat = (x[c] - m) * s;
            const float dxhat = d[c] * w[c];
            dx[c] += (dxhat - dnorm_mean - xhat * dnorm_norm_mean) * s;
        }
    }
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

// Encoder: token + position embedding, the first op of GPT-2.
//
// Forward is a gather: row (b,t) of the output is row inp[b,t] of wte plus row t of wpe; each row
// is independent, so the loop over rows is parallel. Traffic: read 2 rows, write 1 row per token.
//
// Backward is a scatter-add: dwte[inp[b,t]] += dout[b,t]. Two tokens with the same id write the
// same dwte row, so parallelising over rows would race. Instead each thread owns a block of
// channels [c0, c1) of every row and walks all tokens in order: no races, no atomics, and the
// sum for each element is taken in token order, so the result is deterministic.
#include <algorithm>

#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {

// Plain gather, parallel over tokens.
void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C) {
    const long long N = static_cast<long long>(B) * T;
#pragma omp parallel for schedule(static)
    for (long long n = 0; n < N; n++) {
        const int t = static_cast<int>(n % T);
        float* o = out + n * C;
        const float* we = wte + static_cast<long long>(inp[n]) * C;
        const float* pe = wpe + static_cast<long long>(t) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

// Scatter-add without races: threads split the channels, not the tokens.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C) {
    constexpr int kBlock = 64;  // channels per work item (256 bytes of every row)
    const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const long long n = static_cast<long long>(b) * T + t;
                const float* d = dout + n * C;
                // A null gradient is a frozen embedding.
                if (dwte) {
                    float* dw = dwte + static_cast<long long>(inp[n]) * C;
                    for (int c = c0; c < c1; c++) dw[c] += d[c];
                }
                if (dwpe) {
                    float* dp = dwpe + static_cast<long long>(t) * C;
                    for (int c = c0; c < c1; c++) dp[c] += d[c];
                }
            }
        }
    }
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

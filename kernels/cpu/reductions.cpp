// Reductions over the flat fp32 buffers: sum_scaled (the mean loss), global_norm_squared (for
// gradient clipping) and clip_scale.
//
// Determinism: a parallel sum whose order depends on thread scheduling changes in the last bits
// from run to run, and with it every later step. Here the input is cut into kChunks fixed
// contiguous chunks (boundaries depend only on n), each chunk is summed in double by one thread
// in a fixed (compile-time vectorised) order, and the chunk sums are added in chunk order by one
// thread. The result is bitwise the same for any thread count, and the double accumulator keeps
// the ~1e8-term gradient norm accurate. The partial sums live on the stack (kChunks doubles).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

constexpr int kChunks = 256;  // enough work items to balance 16 threads

// sum_i f(x[i]) in the fixed chunked order described above.
template <class F>
double chunked_sum(const float* x, size_t n, F f) {
    double partial[kChunks];
    const long long N = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < kChunks; c++) {
        const long long i0 = N * c / kChunks, i1 = N * (c + 1) / kChunks;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (long long i = i0; i < i1; i++) acc += f(x[i]);
        partial[c] = acc;
    }
    double total = 0.0;
    for (int c = 0; c < kChunks; c++) total += partial[c];
    return total;
}

}  // namespace

// out[0] = scale * sum inp (the scale applied once, to the double sum)
void sum_scaled(float* out, const float* inp, size_t n, float scale) {
    const double s = chunked_sum(inp, n, [](float x) { return static_cast<double>(x); });
    out[0] = static_cast<float>(s * static_cast<double>(scale));
}

// out[0] = sum g^2
void global_norm_squared(float* out, const float* g, size_t n) {
    const double s = chunked_sum(g, n, [](float x) {
        const double d = x;
        return d * d;
    });
    out[0] = static_cast<float>(s);
}

// The clip factor: 1 when the norm is within max_norm, else max_norm / norm (1e-6 guards 0).
void clip_scale(float* scale_out, const float* norm_sq, float max_norm) {
    const float norm = std::sqrt(norm_sq[0]);
    scale_out[0] = std::min(1.0f, max_norm / (norm + 1e-6f));
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

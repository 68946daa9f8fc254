// Pointwise ops: GELU (tanh approximation, computed as x sigmoid(2u) with a vectorised exp in
// fast_math.h; mt::math::gelu / gelu_grad, which the CUDA kernels use, are its reference) and
// the residual add. Purely memory-bound: the cost is
// the bytes moved (gelu: read x, write y; residual: read a, b, write y), so the loops are flat,
// parallel and vectorisable. In-place use (out == inp, dinp == dout) is allowed: every element
// is read before it is written and no two elements interact.
#include <algorithm>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {
constexpr long long kChunk = 4096;  // elements per work item (16 KiB of each operand)
}

// out = gelu(inp), chunks of kChunk in parallel, each a vectorised span.
void gelu_forward(float* out, const float* inp, size_t n) {
    const long long N = static_cast<long long>(n);
    const long long chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (long long c = 0; c < chunks; c++) {
        const long long i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
        fast::gelu_span(out + i0, inp + i0, static_cast<size_t>(i1 - i0));
    }
}

// dinp += dout * gelu'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    const long long N = static_cast<long long>(n);
    const long long chunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (long long c = 0; c < chunks; c++) {
        const long long i0 = c * kChunk, i1 = std::min(N, i0 + kChunk);
        fast::gelu_backward_span(dinp + i0, inp + i0, dout + i0, static_cast<size_t>(i1 - i0));
    }
}

// out = inp1 + inp2
void residual_forward(float* out, const float* inp1, const float* inp2, size_t n) {
    const long long N = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

// dinp1 += dout; dinp2 += dout (the gradient of a sum flows unchanged to both inputs)
void residual_backward(float* dinp1, float* dinp2, const float* dout, size_t n) {
    const long long N = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < N; i++) {
        const float d = dout[i];
        dinp1[i] += d;
        dinp2[i] += d;
    }
}

// fast_math.h's softmax sums, as this level compiles them, for tests/test_cpu_fast_math.cpp.
float exp_shift_sum(const float* x, size_t n, float shift) {
    return fast::exp_shift_sum(x, n, shift);
}
float exp_shift_sum_inplace(float* x, size_t n, float shift) {
    return fast::exp_shift_sum_inplace(x, n, shift);
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

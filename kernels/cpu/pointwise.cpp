// Pointwise ops: GELU (tanh approximation, the shared mt::math::gelu / gelu_grad so the CUDA
// kernels compute the same function) and the residual add. Purely memory-bound: the cost is
// the bytes moved (gelu: read x, write y; residual: read a, b, write y), so the loops are flat,
// parallel and vectorisable. In-place use (out == inp, dinp == dout) is allowed: every element
// is read before it is written and no two elements interact.
#include "kernels/cpu/ops.h"

namespace mt::cpu {

// out = gelu(inp)
void gelu_forward(float* out, const float* inp, size_t n) {
    const long long N = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < N; i++) out[i] = math::gelu(inp[i]);
}

// dinp += dout * gelu'(inp)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    const long long N = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < N; i++) dinp[i] += dout[i] * math::gelu_grad(inp[i]);
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

}  // namespace mt::cpu

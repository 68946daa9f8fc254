// Vectorised elementwise math for the CPU kernels: GELU forward/backward and exp over spans,
// built on Eigen's packet math (pexp: Cody-Waite range reduction + polynomial, ~1 ulp; AVX-512,
// AVX2 or SSE2 packets by the ISA level's flags), so no element goes through scalar libm.
//
// GELU without tanhf. With u = sqrt(2/pi) (x + 0.044715 x^3) and s = sigmoid(2u):
//   0.5 (1 + tanh u) = s                     (tanh u = 2 sigmoid(2u) - 1)
//   gelu(x)  = x s = x / (1 + e),            e = exp(-2u)
//   gelu'(x) = s + 0.5 x sech^2(u) du/dx = s + 2 x s (1 - s) du/dx,   1 - s = e s
// No subtraction cancels (1 - s is formed as e s), so the result is accurate to a few ulp
// relative everywhere; math::gelu / math::gelu_grad (tanhf, shared with CUDA) stay the
// reference, and tests/test_cpu_fast_math.cpp pins this path to them.
//
// Elements are processed in fixed blocks of kLanes (one AVX-512 register, two AVX2 ones); the
// tail is padded into a block on the stack, so every element runs the exact same instruction
// sequence whatever its position or the buffer's alignment: gelu_forward and the matmul's GELU
// epilogue give bitwise identical results.
#pragma once

// Inline code compiled into each ISA level with that level's instructions: it must live in the
// level's namespace (see kernel_table.h), so only the level's own translation units include it.
#if !defined(MT_CPU_LEVEL_NS)
#error "fast_math.h belongs to the CPU kernels of one ISA level (MT_CPU_LEVEL_NS)"
#endif

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/cpu/eigen_core.h"
#include "kernels/math.h"

namespace mt::cpu::MT_CPU_LEVEL_NS::fast {

inline constexpr int kLanes = 16;
using Block = Eigen::Array<float, kLanes, 1>;
using MapB = Eigen::Map<Block>;
using CMapB = Eigen::Map<const Block>;

// e = exp(-2u) for the block, the argument clamped to +-80 so e, 1 + e and e s stay finite
// (s = 1/(1+e) is then 1.8e-35 at worst, and gelu there is ~0 in float anyway).
inline Block gelu_e(const Block& x) {
    const Block u = math::kGeluScale * (x + math::kGeluCubic * x * x * x);
    return (-2.0f * u).max(-80.0f).min(80.0f).exp();
}

// out[0..kLanes) = gelu(in)
inline void gelu_block(float* out, const float* in) {
    const Block x = CMapB(in);
    MapB o(out);
    o = x / (1.0f + gelu_e(x));
}

// dinp[0..kLanes) += dout * gelu'(x)
inline void gelu_backward_block(float* dinp, const float* in, const float* dout) {
    const Block x = CMapB(in);
    const Block e = gelu_e(x);
    const Block s = 1.0f / (1.0f + e);
    const Block du = math::kGeluScale * (1.0f + 3.0f * math::kGeluCubic * x * x);
    MapB g(dinp);
    g += CMapB(dout) * (s + 2.0f * x * s * (e * s) * du);
}

// out[0..n) = gelu(in[0..n)); in-place allowed.
inline void gelu_span(float* out, const float* in, size_t n) {
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) gelu_block(out + i, in + i);
    if (i < n) {
        alignas(64) float a[kLanes] = {}, b[kLanes];
        std::copy(in + i, in + n, a);
        gelu_block(b, a);
        std::copy(b, b + (n - i), out + i);
    }
}

// dinp[0..n) += dout * gelu'(in); in-place (dinp == dout) allowed.
inline void gelu_backward_span(float* dinp, const float* in, const float* dout, size_t n) {
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) gelu_backward_block(dinp + i, in + i, dout + i);
    if (i < n) {
        alignas(64) float a[kLanes] = {}, d[kLanes] = {}, g[kLanes] = {};
        std::copy(in + i, in + n, a);
        std::copy(dout + i, dout + n, d);
        std::copy(dinp + i, dinp + n, g);
        gelu_backward_block(g, a, d);
        std::copy(g, g + (n - i), dinp + i);
    }
}

// x[0..n) = exp(x - shift) in place; returns the sum of the results. Summed per block of
// kLanes lanes, blocks added in order: a fixed order for a given n.
inline float exp_shift_sum_inplace(float* x, size_t n, float shift) {
    Block acc = Block::Zero();
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        MapB xb(x + i);
        xb = (xb - shift).exp();
        acc += xb;
    }
    float sum = acc.sum();
    if (i < n) {
        alignas(64) float a[kLanes];
        std::fill(a, a + kLanes, -INFINITY);
        std::copy(x + i, x + n, a);
        MapB ab(a);
        ab = (ab - shift)
                 .exp();  // padding: pexp clamps -inf to exp(-88.4) < 1e-38, below any sum's ulp
        sum += ab.sum();
        std::copy(a, a + (n - i), x + i);
    }
    return sum;
}

// x[0..n) = exp(x - shift) in place.
inline void exp_shift_inplace(float* x, size_t n, float shift) {
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
        MapB xb(x + i);
        xb = (xb - shift).exp();
    }
    if (i < n) {
        alignas(64) float a[kLanes] = {};
        std::copy(x + i, x + n, a);
        MapB ab(a);
        ab = (ab - shift).exp();
        std::copy(a, a + (n - i), x + i);
    }
}

// sum of exp(x - shift) over x[0..n), x untouched.
inline float exp_shift_sum(const float* x, size_t n, float shift) {
    Block acc = Block::Zero();
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) acc += (CMapB(x + i) - shift).exp();
    float sum = acc.sum();
    if (i < n) {
        alignas(64) float a[kLanes];
        std::fill(a, a + kLanes, -INFINITY);
        std::copy(x + i, x + n, a);
        sum += (CMapB(a) - shift).exp().sum();  // padding adds < 1e-38 each (see above)
    }
    return sum;
}

// max of x[0..n) (n >= 1)
inline float max_of(const float* x, size_t n) {
    return Eigen::Map<const Eigen::ArrayXf>(x, static_cast<Eigen::Index>(n)).maxCoeff();
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS::fast

// Vectorised elementwise math for the CPU kernels: GELU forward/backward and exp over spans,
// built on Eigen's packet math (pexp: Cody-Waite range reduction + polynomial, ~1 ulp; AVX-512,
// AVX2 or SSE2 packets by the ISA level's flags; on AVX2 our exp8, the AVX-512 algorithm on
// 256-bit registers), so no element goes through scalar libm.
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

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
// exp of 8 lanes, the algorithm of Eigen's AVX-512 pexp on 256-bit registers: x = m ln2 + r with
// m = floor(x log2(e) + 1/2), exp(r) by Cephes' degree-6 polynomial in r (|r| <= ln2 / 2), and
// 2^m built directly in the exponent field ((m + 127) << 23; x is clamped to +-88.38, so m + 127
// stays in [0, 255]). Eigen's own AVX2 pexp takes its generic path, whose ldexp splits m in four
// parts for arguments this clamp never lets through: measured 1.5x slower on the classifier's
// 51M exponentials per gpt2-mini step. The operations, constants and order are those of the
// AVX-512 kernel, so both levels give bitwise the same exponentials.
inline __m256 exp8(__m256 in) {
    using namespace Eigen::internal;
    using P = Packet8f;
    const P x = pmax(pmin(in, pset1<P>(88.3762626647950f)), pset1<P>(-88.3762626647949f));
    const P m = pfloor(pmadd(x, pset1<P>(1.44269504088896341f), pset1<P>(0.5f)));
    const P r = _mm256_fmadd_ps(m, pset1<P>(-0.6931471805599453f), x);
    const P r2 = pmul(r, r), r3 = pmul(r2, r);
    P y = pmadd(pset1<P>(1.9875691500E-4f), r, pset1<P>(1.3981999507E-3f));
    P y1 = pmadd(pset1<P>(4.1665795894E-2f), r, pset1<P>(1.6666665459E-1f));
    const P y2 = padd(r, pset1<P>(1.0f));
    y = pmadd(y, r, pset1<P>(8.3334519073E-3f));
    y1 = pmadd(y1, r, pset1<P>(5.0000001201E-1f));
    y = pmadd(y, r3, y1);
    y = pmadd(y, r2, y2);
    const __m256i two_m = _mm256_slli_epi32(_mm256_cvttps_epi32(padd(m, pset1<P>(127.0f))), 23);
    return pmax(pmul(y, _mm256_castsi256_ps(two_m)), in);
}

// exp of a block: exp8 twice on the avx2 level.
inline Block exp_block(const Block& x) {
    Block out;
    _mm256_storeu_ps(out.data(), exp8(_mm256_loadu_ps(x.data())));
    _mm256_storeu_ps(out.data() + 8, exp8(_mm256_loadu_ps(x.data() + 8)));
    return out;
}
#else
// exp of a block: Eigen's pexp (its AVX-512 kernel on that level, SSE2's generic one on the
// baseline).
inline Block exp_block(const Block& x) {
    return x.exp();
}
#endif

// e = exp(-2u) for the block, the argument clamped to +-80 so e, 1 + e and e s stay finite
// (s = 1/(1+e) is then 1.8e-35 at worst, and gelu there is ~0 in float anyway).
inline Block gelu_e(const Block& x) {
    const Block u = math::kGeluScale * (x + math::kGeluCubic * x * x * x);
    return exp_block((-2.0f * u).max(-80.0f).min(80.0f));
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
        xb = exp_block(xb - shift);
        acc += xb;
    }
    float sum = acc.sum();
    if (i < n) {
        alignas(64) float a[kLanes];
        std::fill(a, a + kLanes, -INFINITY);
        std::copy(x + i, x + n, a);
        MapB ab(a);
        ab = exp_block(ab - shift);  // padding: exp(-inf) is 0 (the argument is clamped first)
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
        xb = exp_block(xb - shift);
    }
    if (i < n) {
        alignas(64) float a[kLanes] = {};
        std::copy(x + i, x + n, a);
        MapB ab(a);
        ab = exp_block(ab - shift);
        std::copy(a, a + (n - i), x + i);
    }
}

// sum of exp(x - shift) over x[0..n), x untouched.
inline float exp_shift_sum(const float* x, size_t n, float shift) {
    Block acc = Block::Zero();
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) acc += exp_block(CMapB(x + i) - shift);
    float sum = acc.sum();
    if (i < n) {
        alignas(64) float a[kLanes];
        std::fill(a, a + kLanes, -INFINITY);
        std::copy(x + i, x + n, a);
        sum += exp_block(CMapB(a) - shift).sum();  // padding adds 0 (see above)
    }
    return sum;
}

// max of x[0..n) (n >= 1)
inline float max_of(const float* x, size_t n) {
    return Eigen::Map<const Eigen::ArrayXf>(x, static_cast<Eigen::Index>(n)).maxCoeff();
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS::fast

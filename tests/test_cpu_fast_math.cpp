// The CPU backend's vectorised elementwise math (kernels/cpu/fast_math.h) against the shared
// scalar reference (kernels/math.h, tanhf; what the CUDA kernels compute) and against double
// precision, on a dense grid that covers the tails, every lane position and the padded tail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/math.h"
#include "tests/cpu_isa_environment.h"

namespace {

double gelu_ref(double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
    const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = std::tanh(u);
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

// x from -12 to 12 in steps of 1/1024, plus a length that is not a multiple of the block.
std::vector<float> grid() {
    std::vector<float> x;
    for (int i = -12 * 1024; i <= 12 * 1024; i++) x.push_back(static_cast<float>(i) / 1024.0f);
    x.push_back(-30.0f);
    x.push_back(30.0f);
    x.push_back(-1e-6f);
    return x;
}

TEST(CpuFastMath, GeluMatchesSharedTanhReferenceAndDouble) {
    const std::vector<float> x = grid();
    std::vector<float> y(x.size());
    mt::cpu::gelu_forward(y.data(), x.data(), x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double ref = gelu_ref(x[i]);
        ASSERT_NEAR(y[i], ref, 1e-6 * (1 + std::abs(ref))) << "x = " << x[i];
        ASSERT_NEAR(y[i], mt::math::gelu(x[i]), 1e-6 * (1 + std::abs(ref))) << "x = " << x[i];
    }
}

TEST(CpuFastMath, GeluGradMatchesSharedTanhReferenceAndDouble) {
    const std::vector<float> x = grid();
    const std::vector<float> ones(x.size(), 1.0f);
    std::vector<float> g(x.size(), 0.0f);
    mt::cpu::gelu_backward(g.data(), x.data(), ones.data(), x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double ref = gelu_grad_ref(x[i]);
        ASSERT_TRUE(std::isfinite(g[i])) << "x = " << x[i];
        ASSERT_NEAR(g[i], ref, 2e-6 * (1 + std::abs(ref))) << "x = " << x[i];
        ASSERT_NEAR(g[i], mt::math::gelu_grad(x[i]), 2e-6 * (1 + std::abs(ref))) << "x = " << x[i];
    }
}

TEST(CpuFastMath, GeluResultDoesNotDependOnPositionInBuffer) {
    // The same values at every offset 0..16 of a buffer: the padded tail and the full blocks
    // must give bitwise the same numbers (what makes the matmul GELU epilogue equal gelu_forward).
    const std::vector<float> x = {-3.1f, -0.7f, 0.0f, 0.3f, 1.9f, 4.2f, -5.5f};
    std::vector<float> first;
    for (size_t off = 0; off <= 16; off++) {
        std::vector<float> in(off + x.size() + 5, 0.5f), out(in.size());
        std::copy(x.begin(), x.end(), in.begin() + off);
        mt::cpu::gelu_forward(out.data(), in.data(), in.size());
        std::vector<float> got(out.begin() + off, out.begin() + off + x.size());
        if (first.empty()) first = got;
        EXPECT_EQ(got, first) << "offset " << off;
    }
}

TEST(CpuFastMath, ExpShiftSumMatchesDoubleAndWritesExponentials) {
    for (size_t n : {1u, 15u, 16u, 17u, 1000u}) {
        std::vector<float> x(n);
        for (size_t i = 0; i < n; i++) x[i] = -20.0f + 25.0f * static_cast<float>(i) / n;
        const float shift = 3.0f;
        double ref = 0;
        for (float v : x) ref += std::exp(static_cast<double>(v) - shift);
        EXPECT_NEAR(mt::cpu::exp_shift_sum(x.data(), n, shift), ref, 1e-6 * ref) << n;
        std::vector<float> e = x;
        EXPECT_NEAR(mt::cpu::exp_shift_sum_inplace(e.data(), n, shift), ref, 1e-6 * ref);
        for (size_t i = 0; i < n; i++) {
            // the argument is rounded to float first (x - shift in float), as the kernel does
            const double r = std::exp(static_cast<double>(x[i] - shift));
            ASSERT_NEAR(e[i], r, 3e-7 * r) << "n " << n << " i " << i;
        }
    }
}

}  // namespace

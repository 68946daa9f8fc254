// Helpers for the GPU tests: the same random inputs on the CPU backend (the oracle, fp32) and
// the CUDA backend (compute precision), and element-wise comparison with a stated tolerance.
// No CUDA header: everything goes through the Backend interface.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace mt::test {

inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
    return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float round_bf16(float f) {
    return bf16_to_f32(f32_to_bf16(f));
}

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng);
    return v;
}
inline std::vector<int> randint(size_t n, int hi, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> v(n);
    for (auto& x : v) x = static_cast<int>(rng() % static_cast<uint32_t>(hi));
    return v;
}

// Tolerances: |gpu - cpu| <= atol + rtol |cpu| element-wise.
struct Tol {
    double rtol, atol;
};
// fp32: different summation orders (cuBLAS vs Eigen, warp trees vs loops) only.
inline constexpr Tol kFp32Tol{1e-4, 1e-5};
// bf16: inputs are rounded to bf16 on both sides; the GPU additionally rounds every stored
// activation to bf16 (8 bits of mantissa, relative step 2^-8 = 0.4%), accumulating in fp32.
inline constexpr Tol kBf16Tol{2e-2, 2e-2};

inline ::testing::AssertionResult close(const std::vector<float>& gpu,
                                        const std::vector<float>& cpu, Tol tol,
                                        const std::string& what) {
    if (gpu.size() != cpu.size())
        return ::testing::AssertionFailure()
               << what << ": size " << gpu.size() << " vs " << cpu.size();
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
        const double d = std::fabs(double(gpu[i]) - double(cpu[i]));
        const double lim = tol.atol + tol.rtol * std::fabs(double(cpu[i]));
        if (!(d <= lim)) {  // also catches NaN
            if (bad++ == 0) first = i;
        }
        if (d > worst || std::isnan(d)) worst = d;
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << gpu.size() << " elements differ beyond rtol "
           << tol.rtol << " atol " << tol.atol << "; first at " << first << " (gpu " << gpu[first]
           << ", cpu " << cpu[first] << "), max abs diff " << worst;
}

// Norm-wise: ||gpu - cpu||_2 <= bound ||cpu||_2. An element-wise tolerance wide enough for
// bf16's worst elements (kBf16Tol: ~10 % of a unit-size signal) lets a small error that is
// everywhere pass (a scale a few percent off, a dropped term with a small share); the norm of
// the whole difference does not.
inline ::testing::AssertionResult close_in_norm(const std::vector<float>& gpu,
                                                const std::vector<float>& cpu, double bound,
                                                const std::string& what) {
    if (gpu.size() != cpu.size())
        return ::testing::AssertionFailure()
               << what << ": size " << gpu.size() << " vs " << cpu.size();
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
        const double d = double(gpu[i]) - double(cpu[i]);
        diff2 += d * d;
        ref2 += double(cpu[i]) * double(cpu[i]);
    }
    // A zero reference (a gradient that vanishes, e.g. dQ at T = 1) must be matched exactly.
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 == 0 ? 0.0 : INFINITY);
    if (rel <= bound) return ::testing::AssertionSuccess();  // NaN fails here
    return ::testing::AssertionFailure() << what << ": relative L2 difference " << rel << " above "
                                         << bound << " (||ref|| " << std::sqrt(ref2) << ")";
}

// A CPU oracle and a CUDA backend at `precision`, with mirrored buffers.
class Mirror {
  public:
    Mirror(Precision precision, KernelChoice kernels = {}) {
        BackendOptions co;
        co.kernels = kernels;
        // The CUDA-only variants: the CPU oracle is built with one it has (tests run the CPU's
        // ops with naive or flash explicitly).
        if (kernels.attention == AttentionImpl::cudnn) co.kernels.attention = AttentionImpl::naive;
        if (kernels.attention == AttentionImpl::flash_tc)
            co.kernels.attention = AttentionImpl::flash;
        cpu = create_backend(BackendKind::cpu, co);
        BackendOptions go;
        go.precision = precision;
        go.kernels = kernels;
        gpu = create_backend(BackendKind::cuda, go);
    }
    bool bf16() const { return gpu->precision() == Precision::bf16; }
    Tol tol() const { return bf16() ? kBf16Tol : kFp32Tol; }

    struct Buf {
        DeviceBuffer c, g;  // cpu fp32, gpu compute precision (or fp32 for f32 buffers)
        size_t n = 0;
        bool act = false;
        float* cf() const { return c.as<float>(); }
        float* gf() const { return g.as<float>(); }
    };
    // An activation / weight-copy buffer: compute precision on the GPU. Under bf16 the CPU gets
    // the same bf16-rounded values.
    Buf act(const std::vector<float>& host) {
        Buf b;
        b.n = host.size();
        b.act = true;
        std::vector<float> h = host;
        if (bf16())
            for (auto& x : h) x = round_bf16(x);
        b.c = DeviceBuffer(*cpu, h.size() * 4, MemoryCategory::activations);
        cpu->copy_to_device(b.c.get(), h.data(), h.size() * 4);
        b.g = DeviceBuffer(*gpu, h.size() * gpu->compute_elem_bytes(), MemoryCategory::activations);
        upload_act(b, h);
        return b;
    }
    Buf act_zeros(size_t n) { return act(std::vector<float>(n, 0.0f)); }
    // An fp32 buffer on both sides (grads, mean/rstd, losses...).
    Buf f32(const std::vector<float>& host) {
        Buf b;
        b.n = host.size();
        b.c = DeviceBuffer(*cpu, host.size() * 4, MemoryCategory::grads);
        b.g = DeviceBuffer(*gpu, host.size() * 4, MemoryCategory::grads);
        cpu->copy_to_device(b.c.get(), host.data(), host.size() * 4);
        gpu->copy_to_device(b.g.get(), host.data(), host.size() * 4);
        return b;
    }
    Buf f32_zeros(size_t n) { return f32(std::vector<float>(n, 0.0f)); }
    Buf ints(const std::vector<int>& host) {
        Buf b;
        b.n = host.size();
        b.c = DeviceBuffer(*cpu, host.size() * 4, MemoryCategory::data);
        b.g = DeviceBuffer(*gpu, host.size() * 4, MemoryCategory::data);
        cpu->copy_to_device(b.c.get(), host.data(), host.size() * 4);
        gpu->copy_to_device(b.g.get(), host.data(), host.size() * 4);
        return b;
    }
    void upload_act(Buf& b, const std::vector<float>& h) {
        if (bf16()) {
            std::vector<uint16_t> s(h.size());
            for (size_t i = 0; i < h.size(); ++i) s[i] = f32_to_bf16(h[i]);
            gpu->copy_to_device(b.g.get(), s.data(), s.size() * 2);
        } else {
            gpu->copy_to_device(b.g.get(), h.data(), h.size() * 4);
        }
    }
    std::vector<float> cpu_values(const Buf& b) {
        std::vector<float> h(b.n);
        cpu->copy_to_host(h.data(), b.c.get(), b.n * 4);
        return h;
    }
    std::vector<float> gpu_values(const Buf& b) {
        gpu->synchronize();
        std::vector<float> h(b.n);
        if (b.act && bf16()) {
            std::vector<uint16_t> s(b.n);
            gpu->copy_to_host(s.data(), b.g.get(), b.n * 2);
            for (size_t i = 0; i < b.n; ++i) h[i] = bf16_to_f32(s[i]);
        } else {
            gpu->copy_to_host(h.data(), b.g.get(), b.n * 4);
        }
        return h;
    }
    ::testing::AssertionResult same(const Buf& b, const std::string& what) {
        return close(gpu_values(b), cpu_values(b), tol(), what);
    }
    ::testing::AssertionResult same(const Buf& b, const std::string& what, Tol t) {
        return close(gpu_values(b), cpu_values(b), t, what);
    }

    std::unique_ptr<Backend> cpu, gpu;
};

inline const char* precision_name(const ::testing::TestParamInfo<Precision>& info) {
    return to_string(info.param);
}

}  // namespace mt::test

// Every GPU fixture starts with this: skip cleanly (never fail) without a usable device.
#define MT_SKIP_WITHOUT_CUDA()                                        \
    do {                                                              \
        std::string mt_why_;                                          \
        if (!::mt::cuda_available(&mt_why_)) GTEST_SKIP() << mt_why_; \
    } while (0)

// The CUDA kernel ladders (issue #15) against the CPU backend, through Backend::run:
//
//   CudaMatmulLadder/<step>_<precision>   every CUDA step of kernels.matmul (naive, tiled,
//       cublas, cublaslt) at fp32, tf32 and bf16: the forward with and without bias and with
//       the GELU epilogue (pre_act and out), the backward accumulating into all three gradients
//       and with null dinp / null dweight+dbias (frozen weight). Two shapes: one that is no
//       multiple of any tile (N=37, C=70, OC=129) and a GPT-2-sized one (N=256, C=768, OC=3072).
//   CudaLayerNormLadder/<step>_<precision>   every kernels.layernorm_forward step, plain and with
//       the fused residual add, against the CPU (C=70 and 768).
//   CudaLayerNormLargeMean/<step>   rows with mean 1000 and std 1 against a float64 reference:
//       the steps that do not form E[x^2] - E[x]^2 keep the variance.
//   CudaKernelLadder.*   the backend's own rules: CPU steps refused naming the key, auto
//       resolved to cublaslt.
// Without a usable CUDA device every test that needs one skips, saying why.
//
// Tolerances compare |gpu - cpu| <= rtol |cpu| + atol * rms(cpu), i.e. relative to the output's
// own scale (a dW summed over N rows is larger than an out summed over C channels); an indexing
// bug gives errors of order rms, far above any of them:
//   fp32 math (fp32; naive and tiled under tf32 too: they ignore it)  1e-4: summation order only
//   tf32 tensor cores (cublas, cublaslt)   5e-3: inputs rounded to a 10-bit mantissa (2^-11
//       relative each), i.e. ~4e-4 rms(out) of error per output, 5e-3 is > 10 of its sigmas
//   bf16 activations                       2e-2: the GPU stores every activation in bf16 (8-bit
//       mantissa, half-step 2^-9 ~ 0.2%, twice where the bias is a separate pass)
//   bf16 parameter gradients (fp32)        1e-3: identical bf16 inputs on both sides, products
//       exact in fp32, fp32 accumulation in another order
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::Mirror;
using test::randn;
using test::Tol;
using Buf = Mirror::Buf;

// A Mirror whose CUDA side runs `kernels`; the CPU side keeps its defaults (the CPU backend has
// its own ladder steps and refuses the CUDA ones).
std::unique_ptr<Mirror> mirror_with(Precision precision, const KernelChoice& kernels) {
    auto m = std::make_unique<Mirror>(precision);
    BackendOptions go;
    go.precision = precision;
    go.kernels = kernels;
    m->gpu = create_backend(BackendKind::cuda, go);
    return m;
}

void* at(const Buf& b, bool gpu) {
    return gpu ? b.g.get() : b.c.get();
}
float* f32_at(const Buf& b, bool gpu) {
    return static_cast<float*>(at(b, gpu));
}

// Runs the op made by make(gpu) on both backends.
template <class Make>
void run_both(Mirror& m, Make make) {
    m.cpu->run(make(false));
    m.gpu->run(make(true));
}

double rms(const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += double(x) * x;
    return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

// gpu vs cpu within `t`, atol taken relative to the CPU values' rms (see the top of the file).
::testing::AssertionResult same_scaled(Mirror& m, const Buf& b, Tol t, const std::string& what) {
    const std::vector<float> cpu = m.cpu_values(b);
    return test::close(m.gpu_values(b), cpu, Tol{t.rtol, t.atol * rms(cpu)}, what);
}

// ---- kernels.matmul ---------------------------------------------------------------------------

struct Shape {
    int N, C, OC;
};
// No multiple of a tile (64), a warp (32) or a vector width; and GPT-2 small's c_fc at T=256.
constexpr Shape kShapes[] = {{37, 70, 129}, {256, 768, 3072}};

struct MatmulCase {
    MatmulImpl impl;
    Precision precision;
};

class CudaMatmulLadder : public ::testing::TestWithParam<MatmulCase> {
  protected:
    void SetUp() override {
        MT_SKIP_WITHOUT_CUDA();
        KernelChoice k;
        k.matmul = GetParam().impl;
        m_ = mirror_with(GetParam().precision, k);
    }
    MatmulImpl impl() const { return GetParam().impl; }
    Precision precision() const { return GetParam().precision; }
    bool tensor_core_tf32() const {
        return precision() == Precision::tf32 &&
               (impl() == MatmulImpl::cublas || impl() == MatmulImpl::cublaslt);
    }
    // Activations (out, dinp, pre_act) in compute precision.
    Tol act_tol() const {
        if (precision() == Precision::bf16) return {2e-2, 2e-2};
        return tensor_core_tf32() ? Tol{5e-3, 5e-3} : Tol{1e-4, 1e-4};
    }
    // fp32 parameter gradients (dweight, dbias).
    Tol grad_tol() const {
        if (precision() == Precision::bf16) return {1e-3, 1e-3};
        return tensor_core_tf32() ? Tol{5e-3, 5e-3} : Tol{1e-4, 1e-4};
    }
    // gelu(out): cuBLASLt's GELU epilogue evaluates GELU its own way (its docs do not pin the tanh
    // form), 1e-3; the other steps run our epilogue kernel, the CPU's formula.
    Tol gelu_tol() const {
        const Tol a = act_tol();
        if (impl() != MatmulImpl::cublaslt) return a;
        return {std::max(a.rtol, 1e-3), std::max(a.atol, 1e-3)};
    }

    void forward(const Shape& s, bool with_bias, bool gelu) {
        Mirror& m = *m_;
        const float wscale = 1.0f / std::sqrt(float(s.C));  // outputs of order 1
        Buf inp = m.act(randn(size_t(s.N) * s.C, 11));
        Buf w = m.act(randn(size_t(s.OC) * s.C, 12, wscale));
        Buf b = m.act(randn(s.OC, 13));
        Buf out = m.act(randn(size_t(s.N) * s.OC, 14));  // garbage: forward overwrites
        Buf pre = m.act(randn(size_t(s.N) * s.OC, 15));
        run_both(m, [&](bool g) {
            return op::MatmulForward{.out = at(out, g),
                                     .inp = at(inp, g),
                                     .weight = at(w, g),
                                     .bias = with_bias ? at(b, g) : nullptr,
                                     .N = s.N,
                                     .C = s.C,
                                     .OC = s.OC,
                                     .epilogue = gelu ? MatmulEpilogue::gelu : MatmulEpilogue::none,
                                     .pre_act = gelu ? at(pre, g) : nullptr};
        });
        if (gelu) {
            EXPECT_TRUE(same_scaled(m, pre, act_tol(), "pre_act"));
            EXPECT_TRUE(same_scaled(m, out, gelu_tol(), "gelu(out)"));
        } else {
            EXPECT_TRUE(same_scaled(m, out, act_tol(), "out"));
        }
    }

    // Every gradient starts non-zero: the backward must add (+=), not overwrite.
    void backward(const Shape& s, bool want_dinp, bool want_dweight) {
        Mirror& m = *m_;
        Buf inp = m.act(randn(size_t(s.N) * s.C, 21));
        Buf w = m.act(randn(size_t(s.OC) * s.C, 22, 1.0f / std::sqrt(float(s.C))));
        Buf dout = m.act(randn(size_t(s.N) * s.OC, 23, 1.0f / std::sqrt(float(s.OC))));
        Buf dinp = m.act(randn(size_t(s.N) * s.C, 24));
        Buf dw = m.f32(randn(size_t(s.OC) * s.C, 25));
        Buf db = m.f32(randn(s.OC, 26));
        run_both(m, [&](bool g) {
            return op::MatmulBackward{.dinp = want_dinp ? at(dinp, g) : nullptr,
                                      .dweight = want_dweight ? f32_at(dw, g) : nullptr,
                                      .dbias = want_dweight ? f32_at(db, g) : nullptr,
                                      .dout = at(dout, g),
                                      .inp = at(inp, g),
                                      .weight = at(w, g),
                                      .N = s.N,
                                      .C = s.C,
                                      .OC = s.OC};
        });
        // A null gradient is untouched: the CPU's copy holds the same starting values.
        EXPECT_TRUE(same_scaled(m, dinp, act_tol(), "dinp"));
        EXPECT_TRUE(same_scaled(m, dw, grad_tol(), "dweight"));
        EXPECT_TRUE(same_scaled(m, db, grad_tol(), "dbias"));
    }

    std::unique_ptr<Mirror> m_;
};

std::string shape_name(const Shape& s) {
    return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " OC=" + std::to_string(s.OC);
}

TEST_P(CudaMatmulLadder, ForwardWithBiasMatchesCpu) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        forward(s, true, false);
    }
}

TEST_P(CudaMatmulLadder, ForwardWithoutBiasMatchesCpu) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        forward(s, false, false);
    }
}

TEST_P(CudaMatmulLadder, ForwardWithGeluEpilogueWritesPreActivationAndGelu) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        forward(s, true, true);
    }
}

TEST_P(CudaMatmulLadder, BackwardAccumulatesIntoAllThreeGradients) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        backward(s, true, true);
    }
}

TEST_P(CudaMatmulLadder, BackwardWithNullDinpLeavesItAndComputesTheWeightGradients) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        backward(s, false, true);
    }
}

TEST_P(CudaMatmulLadder, BackwardOfAFrozenWeightComputesOnlyDinp) {
    for (const Shape& s : kShapes) {
        SCOPED_TRACE(shape_name(s));
        backward(s, true, false);
    }
}

std::vector<MatmulCase> matmul_cases() {
    std::vector<MatmulCase> v;
    for (MatmulImpl i :
         {MatmulImpl::naive, MatmulImpl::tiled, MatmulImpl::cublas, MatmulImpl::cublaslt})
        for (Precision p : {Precision::fp32, Precision::tf32, Precision::bf16}) v.push_back({i, p});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Steps, CudaMatmulLadder, ::testing::ValuesIn(matmul_cases()),
                         [](const ::testing::TestParamInfo<MatmulCase>& info) {
                             return std::string(to_string(info.param.impl)) + "_" +
                                    to_string(info.param.precision);
                         });

// ---- kernels.layernorm_forward ----------------------------------------------------------------

struct LayerNormCase {
    LayerNormForwardImpl impl;
    Precision precision;
};

class CudaLayerNormLadder : public ::testing::TestWithParam<LayerNormCase> {
  protected:
    void SetUp() override {
        MT_SKIP_WITHOUT_CUDA();
        KernelChoice k;
        k.layernorm_forward = GetParam().impl;
        m_ = mirror_with(GetParam().precision, k);
    }
    // Activations at the precision's tolerance; mean and rstd are fp32 statistics of the same
    // (bf16-rounded) inputs, so fp32-like under both precisions.
    Tol act_tol() const { return m_->bf16() ? test::kBf16Tol : Tol{1e-4, 1e-5}; }
    static constexpr Tol kStatTol{1e-4, 1e-5};
    std::unique_ptr<Mirror> m_;
};

constexpr int kLnRows = 37;  // not a multiple of the 8 rows per block or 128 threads per block

TEST_P(CudaLayerNormLadder, ForwardMatchesCpu) {
    Mirror& m = *m_;
    for (const int C : {70, 768}) {
        SCOPED_TRACE("C=" + std::to_string(C));
        const int N = kLnRows;
        Buf inp = m.act(randn(size_t(N) * C, 31, 2.0f));
        Buf w = m.act(randn(C, 32)), b = m.act(randn(C, 33));
        Buf out = m.act_zeros(size_t(N) * C);
        Buf mean = m.f32_zeros(N), rstd = m.f32_zeros(N);
        run_both(m, [&](bool g) {
            return op::LayerNormForward{.out = at(out, g),
                                        .mean = f32_at(mean, g),
                                        .rstd = f32_at(rstd, g),
                                        .inp = at(inp, g),
                                        .weight = at(w, g),
                                        .bias = at(b, g),
                                        .N = N,
                                        .C = C};
        });
        EXPECT_TRUE(m.same(out, "out", act_tol()));
        EXPECT_TRUE(m.same(mean, "mean", kStatTol));
        EXPECT_TRUE(m.same(rstd, "rstd", kStatTol));
    }
}

TEST_P(CudaLayerNormLadder, FusedResidualForwardMatchesCpu) {
    Mirror& m = *m_;
    for (const int C : {70, 768}) {
        SCOPED_TRACE("C=" + std::to_string(C));
        const int N = kLnRows;
        Buf a = m.act(randn(size_t(N) * C, 41)), b = m.act(randn(size_t(N) * C, 42));
        Buf w = m.act(randn(C, 43)), bias = m.act(randn(C, 44));
        Buf residual = m.act_zeros(size_t(N) * C), out = m.act_zeros(size_t(N) * C);
        Buf mean = m.f32_zeros(N), rstd = m.f32_zeros(N);
        run_both(m, [&](bool g) {
            return op::FusedResidualLayerNormForward{.residual = at(residual, g),
                                                     .out = at(out, g),
                                                     .mean = f32_at(mean, g),
                                                     .rstd = f32_at(rstd, g),
                                                     .inp1 = at(a, g),
                                                     .inp2 = at(b, g),
                                                     .weight = at(w, g),
                                                     .bias = at(bias, g),
                                                     .N = N,
                                                     .C = C};
        });
        EXPECT_TRUE(m.same(residual, "residual", act_tol()));
        // Under bf16 the GPU normalises the bf16-rounded residual, the CPU the fp32 sum: the
        // statistics then differ by the rounding of the residual (2^-9 relative per element).
        const Tol stat = m.bf16() ? Tol{5e-3, 5e-3} : kStatTol;
        EXPECT_TRUE(m.same(out, "out", act_tol()));
        EXPECT_TRUE(m.same(mean, "mean", stat));
        EXPECT_TRUE(m.same(rstd, "rstd", stat));
    }
}

std::vector<LayerNormCase> layernorm_cases() {
    std::vector<LayerNormCase> v;
    for (LayerNormForwardImpl i : {LayerNormForwardImpl::two_pass, LayerNormForwardImpl::welford,
                                   LayerNormForwardImpl::thread_per_row})
        for (Precision p : {Precision::fp32, Precision::bf16}) v.push_back({i, p});
    return v;
}
INSTANTIATE_TEST_SUITE_P(Steps, CudaLayerNormLadder, ::testing::ValuesIn(layernorm_cases()),
                         [](const ::testing::TestParamInfo<LayerNormCase>& info) {
                             return std::string(to_string(info.param.impl)) + "_" +
                                    to_string(info.param.precision);
                         });

// Rows with mean 1000 and std 1 (C = 768) against float64 statistics of the same fp32 inputs.
// E[x^2] - E[x]^2 would subtract two numbers near 1e6 whose fp32 step is 0.06: the variance (1)
// would keep about one digit. two_pass (deviations from the mean) and welford (running squared
// deviations) keep it to fp32 rounding: rstd within 1e-4 relative, mean within 1e-3 (a mean of
// 1000 summed in fp32 partial sums per lane), out within 1e-3 (the mean's error, times rstd ~1).
// thread_per_row sums the 768 values in one fp32 running sum that grows to 768000 (step 0.06),
// so its mean drifts by up to ~1e-2: it gets 2e-2 on mean and out, and the same 1e-4 on rstd.
class CudaLayerNormLargeMean : public ::testing::TestWithParam<LayerNormForwardImpl> {};

TEST_P(CudaLayerNormLargeMean, StatisticsOfAMean1000RowMatchFloat64) {
    MT_SKIP_WITHOUT_CUDA();
    BackendOptions o;
    o.kernels.layernorm_forward = GetParam();
    auto gpu = create_backend(BackendKind::cuda, o);
    const int N = 16, C = 768;
    std::vector<float> x = randn(size_t(N) * C, 51);
    for (float& v : x) v += 1000.0f;
    const std::vector<float> w = randn(C, 52), b = randn(C, 53);
    DeviceBuffer dx(*gpu, x.size() * 4, MemoryCategory::activations),
        dw(*gpu, C * 4, MemoryCategory::params), db(*gpu, C * 4, MemoryCategory::params),
        dout(*gpu, x.size() * 4, MemoryCategory::activations),
        dmean(*gpu, N * 4, MemoryCategory::activations),
        drstd(*gpu, N * 4, MemoryCategory::activations);
    gpu->copy_to_device(dx.get(), x.data(), x.size() * 4);
    gpu->copy_to_device(dw.get(), w.data(), C * 4);
    gpu->copy_to_device(db.get(), b.data(), C * 4);
    gpu->run(op::LayerNormForward{.out = dout.get(),
                                  .mean = dmean.as<float>(),
                                  .rstd = drstd.as<float>(),
                                  .inp = dx.get(),
                                  .weight = dw.get(),
                                  .bias = db.get(),
                                  .N = N,
                                  .C = C});
    std::vector<float> out(x.size()), mean(N), rstd(N);
    gpu->copy_to_host(out.data(), dout.get(), out.size() * 4);
    gpu->copy_to_host(mean.data(), dmean.get(), N * 4);
    gpu->copy_to_host(rstd.data(), drstd.get(), N * 4);

    std::vector<float> want_out(x.size()), want_mean(N), want_rstd(N);
    for (int n = 0; n < N; ++n) {
        const float* row = x.data() + size_t(n) * C;
        double s = 0, ss = 0;
        for (int c = 0; c < C; ++c) s += row[c];
        const double m = s / C;
        for (int c = 0; c < C; ++c) ss += (row[c] - m) * (row[c] - m);
        const double r = 1.0 / std::sqrt(ss / C + 1e-5);
        want_mean[n] = float(m);
        want_rstd[n] = float(r);
        for (int c = 0; c < C; ++c)
            want_out[size_t(n) * C + c] = float((row[c] - m) * r * w[c] + b[c]);
    }
    const bool one_running_sum = GetParam() == LayerNormForwardImpl::thread_per_row;
    const double mean_atol = one_running_sum ? 2e-2 : 1e-3;
    EXPECT_TRUE(test::close(mean, want_mean, Tol{0, mean_atol}, "mean"));
    EXPECT_TRUE(test::close(rstd, want_rstd, Tol{1e-4, 0}, "rstd"));
    // out = xhat w + b: the mean's error scaled by rstd (~1) and |w| (~1, up to ~3.5).
    EXPECT_TRUE(test::close(out, want_out, Tol{1e-4, 4 * mean_atol}, "out"));
}

INSTANTIATE_TEST_SUITE_P(Steps, CudaLayerNormLargeMean,
                         ::testing::Values(LayerNormForwardImpl::two_pass,
                                           LayerNormForwardImpl::welford,
                                           LayerNormForwardImpl::thread_per_row),
                         [](const ::testing::TestParamInfo<LayerNormForwardImpl>& info) {
                             return std::string(to_string(info.param));
                         });

// ---- the backend's rules ----------------------------------------------------------------------

// The CPU steps are refused when the backend is created, naming the key and the CUDA steps; a
// config error, so it is reported whether or not this machine has a device.
TEST(CudaKernelLadder, RefusesCpuMatmulStepsNamingTheKeyAndTheCudaSteps) {
    for (MatmulImpl cpu_step : {MatmulImpl::blocked, MatmulImpl::packed, MatmulImpl::blas}) {
        SCOPED_TRACE(to_string(cpu_step));
        BackendOptions o;
        o.kernels.matmul = cpu_step;
        try {
            create_backend(BackendKind::cuda, o);
            ADD_FAILURE() << "the CUDA backend accepted kernels.matmul: " << to_string(cpu_step);
        } catch (const BackendError& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("kernels.matmul"), std::string::npos) << msg;
            EXPECT_NE(msg.find(to_string(cpu_step)), std::string::npos) << msg;
            EXPECT_NE(msg.find("naive, tiled, cublas and cublaslt"), std::string::npos) << msg;
        }
    }
}

TEST(CudaKernelLadder, AutoResolvesToCublasLtAndTheOpTableNamesTheStep) {
    MT_SKIP_WITHOUT_CUDA();
    auto gpu = create_backend(BackendKind::cuda);
    EXPECT_EQ(gpu->matmul_impl(), MatmulImpl::cublaslt);
    EXPECT_EQ(gpu->implementation(op::MatmulForward{}), "cublaslt");
    BackendOptions o;
    o.kernels.matmul = MatmulImpl::tiled;
    o.kernels.layernorm_forward = LayerNormForwardImpl::welford;
    auto tiled = create_backend(BackendKind::cuda, o);
    EXPECT_EQ(tiled->matmul_impl(), MatmulImpl::tiled);
    EXPECT_EQ(tiled->implementation(op::MatmulBackward{}), "tiled");
    EXPECT_EQ(tiled->implementation(op::LayerNormForward{}), "welford");
}

}  // namespace
}  // namespace mt

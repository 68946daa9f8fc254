// The CPU kernel ladders (kernels.matmul: naive | blocked | packed | blas,
// kernels.layernorm_forward: two_pass | welford) through the CPU backend, as the model calls them:
// every step gives the forward and both backward products of a Linear layer within the stated
// tolerance of blas (Eigen), the LayerNorm steps agree with a double-precision reference even on
// rows whose mean dwarfs their spread, each backend refuses the other's steps by name, the spec
// says so at the key, and the per-op profile names the implementation each op ran.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/profile.h"
#include "experiment/spec.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

namespace mt {
namespace {

using Vec = std::vector<float>;

Vec random_vec(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (float& x : v) x = u(rng);
    return v;
}

std::unique_ptr<Backend> cpu_backend(MatmulImpl m,
                                     LayerNormForwardImpl ln = LayerNormForwardImpl::two_pass) {
    BackendOptions o;
    o.kernels.matmul = m;
    o.kernels.layernorm_forward = ln;
    return create_backend(BackendKind::cpu, o);
}

// A host buffer of the CPU backend holding `v` (the CPU backend's device memory is host memory).
DeviceBuffer upload(Backend& b, const Vec& v) {
    DeviceBuffer d(b, v.size() * sizeof(float), MemoryCategory::activations);
    std::memcpy(d.get(), v.data(), v.size() * sizeof(float));
    return d;
}
Vec download(const DeviceBuffer& d, size_t n) {
    Vec v(n);
    std::memcpy(v.data(), d.get(), n * sizeof(float));
    return v;
}

// One Linear layer's forward (with bias, with and without the GELU epilogue) and backward (dinp,
// dweight, dbias accumulated into non-zero buffers) on one backend.
struct LinearResults {
    Vec out, gelu_out, pre_act, dinp, dweight, dbias;
};
LinearResults run_linear(MatmulImpl m, int N, int C, int OC) {
    std::mt19937 rng(11);
    const Vec x = random_vec(size_t(N) * C, rng), w = random_vec(size_t(OC) * C, rng);
    const Vec bias = random_vec(OC, rng), dout = random_vec(size_t(N) * OC, rng);
    const Vec dx0 = random_vec(size_t(N) * C, rng), dw0 = random_vec(size_t(OC) * C, rng);
    const Vec db0 = random_vec(OC, rng);
    auto be = cpu_backend(m);
    DeviceBuffer X = upload(*be, x), W = upload(*be, w), Bb = upload(*be, bias);
    DeviceBuffer D = upload(*be, dout), DX = upload(*be, dx0), DW = upload(*be, dw0);
    DeviceBuffer DB = upload(*be, db0), O = upload(*be, Vec(size_t(N) * OC));
    DeviceBuffer G = upload(*be, Vec(size_t(N) * OC)), P = upload(*be, Vec(size_t(N) * OC));
    be->run(op::MatmulForward{.out = O.get(),
                              .inp = X.get(),
                              .weight = W.get(),
                              .bias = Bb.get(),
                              .N = N,
                              .C = C,
                              .OC = OC});
    be->run(op::MatmulForward{.out = G.get(),
                              .inp = X.get(),
                              .weight = W.get(),
                              .bias = Bb.get(),
                              .N = N,
                              .C = C,
                              .OC = OC,
                              .epilogue = MatmulEpilogue::gelu,
                              .pre_act = P.get()});
    be->run(op::MatmulBackward{.dinp = DX.get(),
                               .dweight = DW.as<float>(),
                               .dbias = DB.as<float>(),
                               .dout = D.get(),
                               .inp = X.get(),
                               .weight = W.get(),
                               .N = N,
                               .C = C,
                               .OC = OC});
    return {download(O, size_t(N) * OC), download(G, size_t(N) * OC),  download(P, size_t(N) * OC),
            download(DX, size_t(N) * C), download(DW, size_t(OC) * C), download(DB, OC)};
}

// |a - b| <= tol * (1 + |b|) elementwise; reports the worst element.
void expect_close(const Vec& a, const Vec& b, double tol, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double e = std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(double(b[i])));
        if (!(e <= worst)) worst = e, at = i;
    }
    EXPECT_LE(worst, tol) << what << ": element " << at << " is " << a[at] << ", blas gives "
                          << b[at];
}

// The tolerance: each output is a float sum of K products of values in [-1, 1] (K = 70 in the
// forward and dinp, N = 37..300 in dweight); the steps add them in different orders, so they
// differ by a few ulps of the sum's magnitude (~sqrt(K) terms of size ~1): 1e-5 relative to
// 1 + |value| is ~100x that and ~1000x below any wrong index.
TEST(KernelLadderCpu, EveryMatmulStepGivesForwardAndBothBackwardProductsOfBlas) {
    for (const auto& [N, C, OC] : {std::tuple{37, 70, 129}, std::tuple{300, 96, 260}}) {
        const LinearResults ref = run_linear(MatmulImpl::blas, N, C, OC);
        std::vector<MatmulImpl> steps = {MatmulImpl::naive, MatmulImpl::blocked, MatmulImpl::auto_};
        if (cpu_backend(MatmulImpl::auto_)->matmul_impl() == MatmulImpl::packed)
            steps.push_back(MatmulImpl::packed);
        for (MatmulImpl m : steps) {
            const LinearResults r = run_linear(m, N, C, OC);
            const std::string s = std::string(to_string(m)) + " N" + std::to_string(N);
            expect_close(r.out, ref.out, 1e-5, s + " forward");
            expect_close(r.gelu_out, ref.gelu_out, 1e-5, s + " forward with the GELU epilogue");
            expect_close(r.pre_act, ref.pre_act, 1e-5, s + " pre-activation");
            expect_close(r.dinp, ref.dinp, 1e-5, s + " dinp");
            expect_close(r.dweight, ref.dweight, 1e-5, s + " dweight");
            expect_close(r.dbias, ref.dbias, 1e-5, s + " dbias");
        }
    }
}

// A frozen weight (dweight null) skips its GEMM on every step, and dinp is unchanged by it.
TEST(KernelLadderCpu, EveryMatmulStepSkipsTheProductsItIsNotGiven) {
    const int N = 20, C = 40, OC = 50;
    std::mt19937 rng(3);
    const Vec x = random_vec(size_t(N) * C, rng), w = random_vec(size_t(OC) * C, rng);
    const Vec dout = random_vec(size_t(N) * OC, rng);
    for (MatmulImpl m : {MatmulImpl::naive, MatmulImpl::blocked, MatmulImpl::blas}) {
        auto be = cpu_backend(m);
        DeviceBuffer X = upload(*be, x), W = upload(*be, w), D = upload(*be, dout);
        DeviceBuffer DX = upload(*be, Vec(size_t(N) * C, 0.0f));
        be->run(op::MatmulBackward{.dinp = DX.get(),
                                   .dout = D.get(),
                                   .inp = X.get(),
                                   .weight = W.get(),
                                   .N = N,
                                   .C = C,
                                   .OC = OC});
        const Vec dx = download(DX, size_t(N) * C);
        double want = 0;  // dinp[0,0] = sum_o dout[0,o] w[o,0]
        for (int o = 0; o < OC; ++o) want += double(dout[o]) * w[size_t(o) * C];
        EXPECT_NEAR(dx[0], want, 1e-5) << to_string(m);
    }
}

// LayerNorm forward: two_pass and welford against a double reference. The second case is a
// row of mean 1000 and spread 1, where E[x^2] - mean^2 would lose every digit in fp32 (1e6 - 1e6);
// both steps keep the normalised output to ~1e-3 (fp32 holds 1000 +- 1 to ~6e-5 absolute).
TEST(KernelLadderCpu, LayerNormForwardStepsMatchDoubleReferenceEvenForLargeMeans) {
    const int N = 7, C = 770;
    for (const float offset : {0.0f, 1000.0f}) {
        std::mt19937 rng(21);
        Vec x = random_vec(size_t(N) * C, rng, offset - 1.7f, offset + 1.7f);
        const Vec w = random_vec(C, rng), b = random_vec(C, rng);
        std::vector<double> want(x.size()), want_mean(N), want_rstd(N);
        for (int n = 0; n < N; ++n) {
            double m = 0, v = 0;
            for (int c = 0; c < C; ++c) m += x[size_t(n) * C + c];
            m /= C;
            for (int c = 0; c < C; ++c) v += std::pow(x[size_t(n) * C + c] - m, 2);
            const double r = 1.0 / std::sqrt(v / C + 1e-5);
            want_mean[n] = m, want_rstd[n] = r;
            for (int c = 0; c < C; ++c)
                want[size_t(n) * C + c] = (x[size_t(n) * C + c] - m) * r * w[c] + b[c];
        }
        const double tol = offset > 0 ? 1e-3 : 1e-5;
        for (LayerNormForwardImpl ln :
             {LayerNormForwardImpl::two_pass, LayerNormForwardImpl::welford}) {
            auto be = cpu_backend(MatmulImpl::auto_, ln);
            DeviceBuffer X = upload(*be, x), W = upload(*be, w), B = upload(*be, b);
            DeviceBuffer O = upload(*be, Vec(x.size())), M = upload(*be, Vec(N)),
                         R = upload(*be, Vec(N));
            be->run(op::LayerNormForward{.out = O.get(),
                                         .mean = M.as<float>(),
                                         .rstd = R.as<float>(),
                                         .inp = X.get(),
                                         .weight = W.get(),
                                         .bias = B.get(),
                                         .N = N,
                                         .C = C});
            const Vec out = download(O, x.size()), mean = download(M, N), rstd = download(R, N);
            const std::string s = std::string(to_string(ln)) + " offset " + std::to_string(offset);
            double worst = 0;
            for (size_t i = 0; i < out.size(); ++i)
                worst = std::max(worst, std::fabs(out[i] - want[i]));
            EXPECT_LE(worst, tol) << s;
            for (int n = 0; n < N; ++n) {
                EXPECT_NEAR(mean[n], want_mean[n], 1e-6 * (1 + offset)) << s;
                EXPECT_NEAR(rstd[n], want_rstd[n], tol * want_rstd[n]) << s;
            }
        }
    }
}

TEST(KernelLadderCpu, CpuBackendRefusesCudaStepsNamingTheKeyAndItsOwnLadder) {
    for (MatmulImpl m : {MatmulImpl::tiled, MatmulImpl::cublas, MatmulImpl::cublaslt}) {
        try {
            cpu_backend(m);
            ADD_FAILURE() << to_string(m) << " was accepted";
        } catch (const BackendError& e) {
            EXPECT_CONTAINS(e.what(), "kernels.matmul");
            EXPECT_CONTAINS(e.what(), "naive, blocked, packed, blas");
        }
    }
    try {
        cpu_backend(MatmulImpl::auto_, LayerNormForwardImpl::thread_per_row);
        ADD_FAILURE() << "thread_per_row was accepted";
    } catch (const BackendError& e) {
        EXPECT_CONTAINS(e.what(), "kernels.layernorm_forward");
        EXPECT_CONTAINS(e.what(), "two_pass and welford");
    }
}

// The per-op table names what each op ran: auto resolved to the build's fastest GEMM.
TEST(KernelLadderCpu, ProfilerNamesTheImplementationEachOpRan) {
    auto be = cpu_backend(MatmulImpl::naive, LayerNormForwardImpl::welford);
    EXPECT_EQ(be->implementation(op::MatmulForward{}), "naive");
    EXPECT_EQ(be->implementation(op::MatmulBackward{}), "naive");
    EXPECT_EQ(be->implementation(op::LayerNormForward{}), "welford");
    EXPECT_EQ(be->implementation(op::AttentionForward{}), "naive");
    EXPECT_EQ(be->implementation(op::GeluForward{}), "");
    const std::string fastest = to_string(cpu_backend(MatmulImpl::auto_)->matmul_impl());
    EXPECT_TRUE(fastest == "packed" || fastest == "blas") << fastest;

    KernelProfiler prof(*be);
    be->set_op_observer(&prof);
    const int N = 4, C = 8, OC = 16;
    DeviceBuffer X = upload(*be, Vec(N * C, 1.0f)), W = upload(*be, Vec(OC * C, 1.0f));
    DeviceBuffer O = upload(*be, Vec(N * OC));
    auto start = be->create_event();
    start->record();
    be->run(op::MatmulForward{
        .out = O.get(), .inp = X.get(), .weight = W.get(), .N = N, .C = C, .OC = OC});
    prof.finish_step(true, *start);
    be->set_op_observer(nullptr);
    const std::vector<KernelStat> t = prof.table(1.0, 1, MachinePeaks{});
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].name, "matmul_forward");
    EXPECT_EQ(t[0].impl, "naive");
    EXPECT_EQ(download(O, 1)[0], 8.0f);
}

// The peak probe measures the machine with the fastest GEMM whatever step the run teaches, and
// leaves the backend on that step.
TEST(KernelLadderCpu, PeakProbeUsesTheFastestGemmAndRestoresTheStep) {
    auto be = cpu_backend(MatmulImpl::naive);
    int reps = 0;
    EXPECT_GT(probe_gemm_flops_per_s(*be, 64, 64, 64, &reps), 0);
    EXPECT_EQ(be->matmul_impl(), MatmulImpl::naive);
    EXPECT_EQ(be->options().kernels.matmul, MatmulImpl::naive);
}

// ---- the spec ----

class KernelLadderSpec : public ::testing::Test {
  protected:
    std::string error_of(const std::string& text) {
        const std::string p = dir_.file("exp.yaml");
        std::ofstream(p) << text;
        try {
            load_experiment(p, {});
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    TempDir dir_{"mt_ladder_spec"};
};

TEST_F(KernelLadderSpec, ACudaMatmulStepOnTheCpuBackendIsRefusedAtTheKey) {
    const std::string e = error_of("name: x\nbackend: cpu\nkernels: { matmul: tiled }\n");
    EXPECT_CONTAINS(e, "kernels.matmul");
    EXPECT_CONTAINS(e, "naive, blocked, packed, blas");
    EXPECT_CONTAINS(e, "got kernels.matmul: tiled");
}

TEST_F(KernelLadderSpec, ACpuMatmulStepOnTheCudaBackendIsRefusedAtTheKey) {
    const std::string e = error_of("name: x\nbackend: cuda\nkernels: { matmul: blocked }\n");
    EXPECT_CONTAINS(e, "naive, tiled, cublas, cublaslt");
    EXPECT_CONTAINS(e, "got kernels.matmul: blocked");
}

TEST_F(KernelLadderSpec, ThreadPerRowOnTheCpuBackendIsRefusedAndAnUnknownStepListsTheSpellings) {
    EXPECT_CONTAINS(
        error_of("name: x\nbackend: cpu\nkernels: { layernorm_forward: thread_per_row }\n"),
        "thread_per_row, a CUDA thread layout");
    const std::string e = error_of("name: x\nkernels: { matmul: fastest }\n");
    EXPECT_CONTAINS(e, "kernels.matmul");
    EXPECT_CONTAINS(e, "naive");
    EXPECT_CONTAINS(e, "cublaslt");
}

// kernels.memory_access: scalar (the default) | packed128, the CUDA kernels' 128-bit loads.
TEST_F(KernelLadderSpec, MemoryAccessParsesDefaultsToScalarAndIsRefusedOnTheCpuAtTheKey) {
    const std::string p = dir_.file("ok.yaml");
    std::ofstream(p) << "name: x\nbackend: cuda\n";
    EXPECT_EQ(load_experiment(p, {}).base.kernels.memory_access, MemoryAccess::scalar);
    std::ofstream(p) << "name: x\nbackend: cuda\nkernels: { memory_access: packed128 }\n";
    EXPECT_EQ(load_experiment(p, {}).base.kernels.memory_access, MemoryAccess::packed128);
    // scalar is every backend's; packed128 on the CPU is refused at the key, with the fix.
    EXPECT_EQ(error_of("name: x\nbackend: cpu\nkernels: { memory_access: scalar }\n"), "");
    const std::string e =
        error_of("name: x\nbackend: cpu\nkernels: { memory_access: packed128 }\n");
    EXPECT_CONTAINS(e, "exp.yaml:3:");  // file:line:col of the key
    EXPECT_CONTAINS(e, "kernels.memory_access");
    EXPECT_CONTAINS(e, "expected scalar with backend: cpu");
    EXPECT_CONTAINS(e, "use backend: cuda");
    const std::string u = error_of("name: x\nkernels: { memory_access: vector }\n");
    EXPECT_CONTAINS(u, "kernels.memory_access");
    EXPECT_CONTAINS(u, "packed128");
}

TEST(KernelLadderCpu, CpuBackendRefusesPacked128NamingTheKey) {
    BackendOptions o;
    o.kernels.memory_access = MemoryAccess::packed128;
    try {
        create_backend(BackendKind::cpu, o);
        ADD_FAILURE() << "packed128 was accepted";
    } catch (const BackendError& e) {
        EXPECT_CONTAINS(e.what(), "kernels.memory_access");
        EXPECT_CONTAINS(e.what(), "ISA level");
    }
}

TEST_F(KernelLadderSpec, CudaStepsAreCudaOnlyFeaturesAndCpuStepsAreNot) {
    RunConfig c;
    c.kernels.matmul = MatmulImpl::cublas;
    EXPECT_EQ(cuda_only_features(c), std::vector<std::string>{"kernels.matmul cublas"});
    c.kernels.matmul = MatmulImpl::naive;  // both backends have a naive step
    EXPECT_TRUE(cuda_only_features(c).empty());
    c.kernels.matmul = MatmulImpl::blocked;
    c.kernels.layernorm_forward = LayerNormForwardImpl::thread_per_row;
    EXPECT_EQ(cuda_only_features(c),
              std::vector<std::string>{"kernels.layernorm_forward thread_per_row"});
    c.kernels.layernorm_forward = LayerNormForwardImpl::two_pass;
    c.kernels.memory_access = MemoryAccess::packed128;
    EXPECT_EQ(cuda_only_features(c), std::vector<std::string>{"kernels.memory_access packed128"});
}

}  // namespace
}  // namespace mt

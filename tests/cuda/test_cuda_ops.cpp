// Every CUDA kernel, forward and backward, against the CPU backend on the same inputs.
// fp32: kFp32Tol (rtol 1e-4, atol 1e-5). bf16: kBf16Tol (rtol 2e-2, atol 2e-2) with the CPU fed
// the same bf16-rounded inputs. tf32 (matmul only): rtol/atol 5e-3 (10-bit mantissa inputs).
// Gradients start from non-zero values so the += (accumulate) convention is checked too.
// Without a usable device every test skips in SetUp.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::close;
using test::Mirror;
using test::randint;
using test::randn;

class CudaOps : public ::testing::TestWithParam<Precision> {
  protected:
    void SetUp() override {
        MT_SKIP_WITHOUT_CUDA();
        m = std::make_unique<Mirror>(GetParam());
    }
    std::unique_ptr<Mirror> m;
};

INSTANTIATE_TEST_SUITE_P(Precisions, CudaOps, ::testing::Values(Precision::fp32, Precision::bf16),
                         test::precision_name);

TEST_P(CudaOps, EncoderForwardAndBackwardMatchCpu) {
    const int B = 3, T = 17, C = 48, V = 40;
    auto inp = m->ints(randint(size_t(B) * T, V, 1));
    auto wte = m->act(randn(size_t(V) * C, 2));
    auto wpe = m->act(randn(size_t(T) * C, 3));
    auto out = m->act_zeros(size_t(B) * T * C);
    m->cpu->encoder_forward(out.cf(), inp.c.as<int>(), wte.c.get(), wpe.c.get(), B, T, C);
    m->gpu->encoder_forward(out.g.get(), inp.g.as<int>(), wte.g.get(), wpe.g.get(), B, T, C);
    EXPECT_TRUE(m->same(out, "encoder out"));

    auto dout = m->act(randn(size_t(B) * T * C, 4));
    auto dwte = m->f32(randn(size_t(V) * C, 5));
    auto dwpe = m->f32(randn(size_t(T) * C, 6));
    m->cpu->encoder_backward(dwte.cf(), dwpe.cf(), dout.c.get(), inp.c.as<int>(), B, T, C);
    m->gpu->encoder_backward(dwte.gf(), dwpe.gf(), dout.g.get(), inp.g.as<int>(), B, T, C);
    EXPECT_TRUE(m->same(dwte, "dwte", test::kFp32Tol));  // fp32 grads from the same inputs
    EXPECT_TRUE(m->same(dwpe, "dwpe", test::kFp32Tol));
}

TEST_P(CudaOps, LayerNormForwardAndBackwardMatchCpu) {
    const int N = 45, C = 80;  // C not a multiple of 32: tail lanes
    auto inp = m->act(randn(size_t(N) * C, 10, 2.0f));
    auto w = m->act(randn(C, 11));
    auto b = m->act(randn(C, 12));
    auto out = m->act_zeros(size_t(N) * C);
    auto mean = m->f32_zeros(N), rstd = m->f32_zeros(N);
    m->cpu->layernorm_forward(out.cf(), mean.cf(), rstd.cf(), inp.c.get(), w.c.get(), b.c.get(), N,
                              C);
    m->gpu->layernorm_forward(out.g.get(), mean.gf(), rstd.gf(), inp.g.get(), w.g.get(), b.g.get(),
                              N, C);
    EXPECT_TRUE(m->same(out, "ln out"));
    EXPECT_TRUE(m->same(mean, "ln mean", test::kFp32Tol));
    EXPECT_TRUE(m->same(rstd, "ln rstd", test::kFp32Tol));

    auto dout = m->act(randn(size_t(N) * C, 13));
    auto dinp = m->act(randn(size_t(N) * C, 14));
    auto dw = m->f32(randn(C, 15)), db = m->f32(randn(C, 16));
    m->cpu->layernorm_backward(dinp.cf(), dw.cf(), db.cf(), dout.c.get(), inp.c.get(), w.c.get(),
                               mean.cf(), rstd.cf(), N, C);
    // Same mean/rstd on both sides (the CPU's), so only the backward is compared.
    m->gpu->copy_to_device(mean.g.get(), m->cpu_values(mean).data(), N * 4);
    m->gpu->copy_to_device(rstd.g.get(), m->cpu_values(rstd).data(), N * 4);
    m->gpu->layernorm_backward(dinp.g.get(), dw.gf(), db.gf(), dout.g.get(), inp.g.get(), w.g.get(),
                               mean.gf(), rstd.gf(), N, C);
    EXPECT_TRUE(m->same(dinp, "ln dinp"));
    EXPECT_TRUE(m->same(dw, "ln dweight", m->bf16() ? test::Tol{2e-2, 5e-2} : test::kFp32Tol));
    EXPECT_TRUE(m->same(db, "ln dbias", test::kFp32Tol));
}

TEST_P(CudaOps, FusedResidualLayerNormMatchesCpu) {
    const int N = 33, C = 64;
    auto a = m->act(randn(size_t(N) * C, 20)), b = m->act(randn(size_t(N) * C, 21));
    auto w = m->act(randn(C, 22)), bias = m->act(randn(C, 23));
    auto res = m->act_zeros(size_t(N) * C), out = m->act_zeros(size_t(N) * C);
    auto mean = m->f32_zeros(N), rstd = m->f32_zeros(N);
    m->cpu->fused_residual_layernorm_forward(res.cf(), out.cf(), mean.cf(), rstd.cf(), a.c.get(),
                                             b.c.get(), w.c.get(), bias.c.get(), N, C);
    m->gpu->fused_residual_layernorm_forward(res.g.get(), out.g.get(), mean.gf(), rstd.gf(),
                                             a.g.get(), b.g.get(), w.g.get(), bias.g.get(), N, C);
    EXPECT_TRUE(m->same(res, "residual"));
    EXPECT_TRUE(m->same(out, "ln out"));
    EXPECT_TRUE(m->same(mean, "mean", m->tol()));
    EXPECT_TRUE(m->same(rstd, "rstd", m->tol()));
}

TEST_P(CudaOps, MatmulForwardAndBackwardMatchCpu) {
    const int N = 74, C = 64, OC = 96;
    auto inp = m->act(randn(size_t(N) * C, 30));
    auto w = m->act(randn(size_t(OC) * C, 31, 0.2f));
    auto b = m->act(randn(OC, 32));
    auto out = m->act_zeros(size_t(N) * OC);
    m->cpu->matmul_forward(out.cf(), inp.c.get(), w.c.get(), b.c.get(), N, C, OC);
    m->gpu->matmul_forward(out.g.get(), inp.g.get(), w.g.get(), b.g.get(), N, C, OC);
    EXPECT_TRUE(m->same(out, "matmul out"));

    auto dout = m->act(randn(size_t(N) * OC, 33));
    auto dinp = m->act(randn(size_t(N) * C, 34));
    auto dw = m->f32(randn(size_t(OC) * C, 35)), db = m->f32(randn(OC, 36));
    m->cpu->matmul_backward(dinp.cf(), dw.cf(), db.cf(), dout.c.get(), inp.c.get(), w.c.get(), N, C,
                            OC);
    m->gpu->matmul_backward(dinp.g.get(), dw.gf(), db.gf(), dout.g.get(), inp.g.get(), w.g.get(), N,
                            C, OC);
    EXPECT_TRUE(m->same(dinp, "matmul dinp"));
    EXPECT_TRUE(m->same(dw, "matmul dweight", m->bf16() ? test::Tol{2e-2, 5e-2} : test::kFp32Tol));
    EXPECT_TRUE(m->same(db, "matmul dbias", m->bf16() ? m->tol() : test::kFp32Tol));
}

TEST_P(CudaOps, MatmulWithoutBiasAndNullGradsMatchCpu) {
    const int N = 40, C = 32, OC = 128;
    auto inp = m->act(randn(size_t(N) * C, 37));
    auto w = m->act(randn(size_t(OC) * C, 38, 0.2f));
    auto out = m->act_zeros(size_t(N) * OC);
    m->cpu->matmul_forward(out.cf(), inp.c.get(), w.c.get(), nullptr, N, C, OC);
    m->gpu->matmul_forward(out.g.get(), inp.g.get(), w.g.get(), nullptr, N, C, OC);
    EXPECT_TRUE(m->same(out, "matmul out (no bias)"));
    auto dout = m->act(randn(size_t(N) * OC, 39));
    auto dw = m->f32(randn(size_t(OC) * C, 40));
    m->cpu->matmul_backward(nullptr, dw.cf(), nullptr, dout.c.get(), inp.c.get(), w.c.get(), N, C,
                            OC);
    m->gpu->matmul_backward(nullptr, dw.gf(), nullptr, dout.g.get(), inp.g.get(), w.g.get(), N, C,
                            OC);
    EXPECT_TRUE(m->same(dw, "dweight", m->bf16() ? test::Tol{2e-2, 5e-2} : test::kFp32Tol));
}

// The bias at an odd float offset cannot go to cuBLASLt's epilogue: the fallback kernel must
// give the same numbers.
TEST_P(CudaOps, MatmulWithMisalignedBiasFallsBackToTheSameResult) {
    const int N = 20, C = 32, OC = 64;
    auto inp = m->act(randn(size_t(N) * C, 41));
    auto w = m->act(randn(size_t(OC) * C, 42, 0.2f));
    auto b = m->act(randn(OC + 1, 43));
    auto out = m->act_zeros(size_t(N) * OC);
    const size_t e = m->gpu->compute_elem_bytes();
    m->cpu->matmul_forward(out.cf(), inp.c.get(), w.c.get(), b.cf() + 1, N, C, OC);
    m->gpu->matmul_forward(out.g.get(), inp.g.get(), w.g.get(), b.g.as<char>() + e, N, C, OC);
    EXPECT_TRUE(m->same(out, "matmul out (misaligned bias)"));
}

TEST_P(CudaOps, MatmulGeluEpilogueMatchesCpu) {
    const int N = 64, C = 64, OC = 256;
    auto inp = m->act(randn(size_t(N) * C, 44));
    auto w = m->act(randn(size_t(OC) * C, 45, 0.2f));
    auto b = m->act(randn(OC, 46));
    auto out = m->act_zeros(size_t(N) * OC), pre = m->act_zeros(size_t(N) * OC);
    m->cpu->matmul_forward(out.cf(), inp.c.get(), w.c.get(), b.c.get(), N, C, OC,
                           MatmulEpilogue::gelu, pre.cf());
    m->gpu->matmul_forward(out.g.get(), inp.g.get(), w.g.get(), b.g.get(), N, C, OC,
                           MatmulEpilogue::gelu, pre.g.get());
    // cuBLASLt's GELU epilogue evaluates its GELU its own way (its docs do not pin the tanh
    // form): 1e-3 relative + 5e-4 absolute under fp32, which also bounds erf-vs-tanh GELU.
    const test::Tol t = m->bf16() ? test::kBf16Tol : test::Tol{1e-3, 5e-4};
    EXPECT_TRUE(m->same(pre, "pre-activation", m->tol()));
    EXPECT_TRUE(m->same(out, "gelu(out)", t));
}

TEST(CudaMatmulTf32, MatmulForwardMatchesCpuWithinTf32Rounding) {
    MT_SKIP_WITHOUT_CUDA();
    Mirror m(Precision::tf32);
    const int N = 64, C = 128, OC = 64;
    auto inp = m.act(randn(size_t(N) * C, 47));
    auto w = m.act(randn(size_t(OC) * C, 48, 0.1f));
    auto b = m.act(randn(OC, 49));
    auto out = m.act_zeros(size_t(N) * OC);
    m.cpu->matmul_forward(out.cf(), inp.c.get(), w.c.get(), b.c.get(), N, C, OC);
    m.gpu->matmul_forward(out.g.get(), inp.g.get(), w.g.get(), b.g.get(), N, C, OC);
    EXPECT_TRUE(m.same(out, "tf32 matmul", test::Tol{5e-3, 5e-3}));
}

TEST_P(CudaOps, GeluAndResidualMatchCpu) {
    const size_t n = 1000;
    auto x = m->act(randn(n, 50, 2.0f)), y = m->act(randn(n, 51));
    auto out = m->act_zeros(n);
    m->cpu->gelu_forward(out.cf(), x.c.get(), n);
    m->gpu->gelu_forward(out.g.get(), x.g.get(), n);
    EXPECT_TRUE(m->same(out, "gelu"));
    auto dout = m->act(randn(n, 52)), dinp = m->act(randn(n, 53));
    m->cpu->gelu_backward(dinp.cf(), x.c.get(), dout.c.get(), n);
    m->gpu->gelu_backward(dinp.g.get(), x.g.get(), dout.g.get(), n);
    EXPECT_TRUE(m->same(dinp, "gelu backward"));
    auto r = m->act_zeros(n);
    m->cpu->residual_forward(r.cf(), x.c.get(), y.c.get(), n);
    m->gpu->residual_forward(r.g.get(), x.g.get(), y.g.get(), n);
    EXPECT_TRUE(m->same(r, "residual"));
    auto d1 = m->act(randn(n, 54)), d2 = m->act(randn(n, 55));
    m->cpu->residual_backward(d1.cf(), d2.cf(), dout.c.get(), n);
    m->gpu->residual_backward(d1.g.get(), d2.g.get(), dout.g.get(), n);
    EXPECT_TRUE(m->same(d1, "residual d1"));
    EXPECT_TRUE(m->same(d2, "residual d2"));
}

TEST_P(CudaOps, FusedClassifierMatchesCpu) {
    const int N = 23, V = 300, Vp = 384;
    const float dloss = 1.0f / N;
    auto logits = m->act(randn(size_t(N) * Vp, 60, 3.0f));
    auto tg = m->ints(randint(N, V, 61));
    auto losses = m->f32_zeros(N);
    m->cpu->classifier_fused(losses.cf(), logits.c.get(), tg.c.as<int>(), N, V, Vp, dloss);
    m->gpu->classifier_fused(losses.gf(), logits.g.get(), tg.g.as<int>(), N, V, Vp, dloss);
    EXPECT_TRUE(m->same(losses, "losses", m->tol()));
    EXPECT_TRUE(
        m->same(logits, "dlogits (in place)", m->bf16() ? m->tol() : test::Tol{1e-4, 1e-7}));
}

TEST_P(CudaOps, FusedClassifierWithoutGradientLeavesLogitsUntouched) {
    const int N = 5, V = 100, Vp = 128;
    auto logits = m->act(randn(size_t(N) * Vp, 62));
    const auto before = m->gpu_values(logits);
    auto tg = m->ints(randint(N, V, 63));
    auto losses = m->f32_zeros(N);
    m->gpu->classifier_fused(losses.gf(), logits.g.get(), tg.g.as<int>(), N, V, Vp, 0.0f);
    const auto after = m->gpu_values(logits);
    EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
}

TEST_P(CudaOps, UnfusedClassifierMatchesCpuAndFused) {
    const int N = 19, V = 250, Vp = 256;
    const float dloss = 0.5f;
    const auto host = randn(size_t(N) * Vp, 64, 2.0f);
    auto logits = m->act(host);
    auto tg = m->ints(randint(N, V, 65));
    auto probs = m->f32_zeros(size_t(N) * Vp);
    auto losses = m->f32_zeros(N);
    m->cpu->softmax_forward(probs.cf(), logits.c.get(), N, V, Vp);
    m->gpu->softmax_forward(probs.gf(), logits.g.get(), N, V, Vp);
    EXPECT_TRUE(m->same(probs, "probs", test::Tol{1e-4, 1e-7}));
    m->cpu->crossentropy_forward(losses.cf(), probs.cf(), tg.c.as<int>(), N, Vp);
    m->gpu->crossentropy_forward(losses.gf(), probs.gf(), tg.g.as<int>(), N, Vp);
    EXPECT_TRUE(m->same(losses, "losses", test::kFp32Tol));
    auto dlogits = m->act_zeros(size_t(N) * Vp);
    m->cpu->crossentropy_softmax_backward(dlogits.cf(), probs.cf(), tg.c.as<int>(), N, V, Vp,
                                          dloss);
    m->gpu->crossentropy_softmax_backward(dlogits.g.get(), probs.gf(), tg.g.as<int>(), N, V, Vp,
                                          dloss);
    EXPECT_TRUE(m->same(dlogits, "dlogits", m->bf16() ? m->tol() : test::Tol{1e-4, 1e-7}));

    // The fused kernel computes the same thing on the GPU.
    auto fused_logits = m->act(host);
    auto fused_losses = m->f32_zeros(N);
    m->gpu->classifier_fused(fused_losses.gf(), fused_logits.g.get(), tg.g.as<int>(), N, V, Vp,
                             dloss);
    EXPECT_TRUE(close(m->gpu_values(fused_losses), m->gpu_values(losses), m->tol(),
                      "fused vs unfused loss"));
    EXPECT_TRUE(close(m->gpu_values(fused_logits), m->gpu_values(dlogits), m->tol(),
                      "fused vs unfused grad"));
}

TEST_P(CudaOps, ReductionsMatchCpuAndAreDeterministic) {
    const size_t n = 1'000'003;  // several partial blocks + a ragged tail
    auto xs = randn(n, 70);
    for (auto& v : xs) v = std::fabs(v);  // no cancellation: a sum of O(1e6), rounding ~1e-6 rel
    auto x = m->f32(xs);
    auto out = m->f32_zeros(2), out2 = m->f32_zeros(2);
    m->cpu->sum_scaled(out.cf(), x.cf(), n, 0.25f);
    m->gpu->sum_scaled(out.gf(), x.gf(), n, 0.25f);
    m->cpu->global_norm_squared(out.cf() + 1, x.cf(), n);
    m->gpu->global_norm_squared(out.gf() + 1, x.gf(), n);
    // Sums of 1e6 positive terms in fp32 on different trees: within 1e-4 relative.
    EXPECT_TRUE(m->same(out, "sum / norm^2", test::Tol{1e-4, 0.0}));
    m->gpu->sum_scaled(out2.gf(), x.gf(), n, 0.25f);
    m->gpu->global_norm_squared(out2.gf() + 1, x.gf(), n);
    const auto a = m->gpu_values(out), b = m->gpu_values(out2);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 8)) << "two runs differ: not deterministic";
}

TEST_P(CudaOps, ClipScaleMatchesCpu) {
    auto norm_sq = m->f32({4.0f, 0.25f});
    auto scale = m->f32_zeros(2);
    for (int i = 0; i < 2; ++i) {
        m->cpu->clip_scale(scale.cf() + i, norm_sq.cf() + i, 1.0f);
        m->gpu->clip_scale(scale.gf() + i, norm_sq.gf() + i, 1.0f);
    }
    const auto g = m->gpu_values(scale);
    EXPECT_NEAR(g[0], 1.0f / (2.0f + 1e-6f), 1e-7);  // norm 2 > 1: scaled
    EXPECT_EQ(g[1], 1.0f);                           // norm 0.5 < 1: untouched
    EXPECT_TRUE(m->same(scale, "clip scale", test::kFp32Tol));
}

TEST_P(CudaOps, CastParamsMatchesRoundToNearestEven) {
    const auto host = randn(777, 80, 3.0f);
    auto src = m->f32(host);
    DeviceBuffer dst(*m->gpu, host.size() * m->gpu->compute_elem_bytes(), MemoryCategory::params);
    m->gpu->cast_params(dst.get(), src.gf(), host.size());
    m->gpu->synchronize();
    if (m->bf16()) {
        std::vector<uint16_t> got(host.size());
        m->gpu->copy_to_host(got.data(), dst.get(), got.size() * 2);
        for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(got[i], test::f32_to_bf16(host[i])) << i;
    } else {
        std::vector<float> got(host.size());
        m->gpu->copy_to_host(got.data(), dst.get(), got.size() * 4);
        EXPECT_EQ(0, std::memcmp(got.data(), host.data(), got.size() * 4));
    }
}

}  // namespace
}  // namespace mt

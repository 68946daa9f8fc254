// Attention on the GPU: naive (cuBLAS + causal softmax, probabilities saved) and flash (fused
// tiled kernels, logsumexp saved), forward and backward, each against the CPU backend, and
// against each other. Shapes include T that is not a multiple of any tile (16/32) and head
// sizes 16 and 64 (GPT-2's). Tolerances: see cuda_test_util.h.
#include <gtest/gtest.h>

#include <tuple>

#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::close;
using test::Mirror;
using test::randn;

struct Shape {
    int B, T, C, NH;
};

using Param = std::tuple<Precision, AttentionImpl, int>;  // precision, impl, shape index
const Shape kShapes[] = {{2, 37, 64, 4}, {1, 70, 128, 2}, {2, 8, 32, 1}};

class CudaAttention : public ::testing::TestWithParam<Param> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
    return std::string(to_string(std::get<0>(info.param))) + "_" +
           to_string(std::get<1>(info.param)) + "_shape" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, CudaAttention,
                         ::testing::Combine(::testing::Values(Precision::fp32, Precision::bf16),
                                            ::testing::Values(AttentionImpl::naive,
                                                              AttentionImpl::flash),
                                            ::testing::Values(0, 1, 2)),
                         param_name);

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
    const auto [precision, impl, si] = GetParam();
    const Shape s = kShapes[si];
    KernelChoice k;
    k.attention = impl;
    Mirror m(precision, k);
    const size_t BTC = size_t(s.B) * s.T * s.C;
    auto qkv = m.act(randn(3 * BTC, 100 + si));
    auto out = m.act_zeros(BTC);
    const size_t sg = attention_saved_elems(impl, s.B, s.T, s.NH);
    m.gpu->reserve_attention_workspace(impl, s.B, s.T, s.C, s.NH);
    auto saved = m.f32_zeros(sg);
    const op::AttentionForward fwd{.impl = impl, .B = s.B, .T = s.T, .C = s.C, .NH = s.NH};
    auto on = [&](op::AttentionForward a, void* o, float* sv, const void* x) {
        a.out = o, a.saved = sv, a.qkv = x;
        return a;
    };
    m.cpu->run(on(fwd, out.cf(), saved.cf(), qkv.c.get()));
    m.gpu->run(on(fwd, out.g.get(), saved.gf(), qkv.g.get()));
    EXPECT_TRUE(m.same(out, "attention out"));
    EXPECT_TRUE(m.same(saved, impl == AttentionImpl::flash ? "logsumexp" : "probs", m.tol()));

    auto dout = m.act(randn(BTC, 200 + si));
    auto dqkv = m.act(randn(3 * BTC, 300 + si));  // non-zero: backward accumulates
    // Feed the GPU's backward the CPU's forward results, so only the backward is compared.
    m.upload_act(out, m.cpu_values(out));
    m.gpu->copy_to_device(saved.g.get(), m.cpu_values(saved).data(), sg * 4);
    const op::AttentionBackward bwd{.impl = impl, .B = s.B, .T = s.T, .C = s.C, .NH = s.NH};
    auto back = [&](op::AttentionBackward a, void* dx, const void* dy, const void* x, const void* y,
                    const float* sv) {
        a.dqkv = dx, a.dout = dy, a.qkv = x, a.out = y, a.saved = sv;
        return a;
    };
    m.cpu->run(back(bwd, dqkv.cf(), dout.c.get(), qkv.c.get(), out.cf(), saved.cf()));
    m.gpu->run(back(bwd, dqkv.g.get(), dout.g.get(), qkv.g.get(), out.g.get(), saved.gf()));
    EXPECT_TRUE(m.same(dqkv, "dqkv"));
}

class CudaAttentionImpls : public ::testing::TestWithParam<Precision> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};
INSTANTIATE_TEST_SUITE_P(Precisions, CudaAttentionImpls,
                         ::testing::Values(Precision::fp32, Precision::bf16), test::precision_name);

// Naive and flash on the GPU give the same output and gradients (flash never materialises P).
TEST_P(CudaAttentionImpls, NaiveAndFlashAgree) {
    const int B = 2, T = 100, C = 128, NH = 2;
    const size_t BTC = size_t(B) * T * C;
    KernelChoice kn, kf;
    kn.attention = AttentionImpl::naive;
    kf.attention = AttentionImpl::flash;
    Mirror naive(GetParam(), kn), flash(GetParam(), kf);
    const auto qkv_h = randn(3 * BTC, 7), dout_h = randn(BTC, 8);
    auto run = [&](Mirror& m, AttentionImpl impl) {
        auto qkv = m.act(qkv_h), dout = m.act(dout_h);
        auto out = m.act_zeros(BTC), dqkv = m.act_zeros(3 * BTC);
        auto saved = m.f32_zeros(attention_saved_elems(impl, B, T, NH));
        m.gpu->reserve_attention_workspace(impl, B, T, C, NH);
        m.gpu->run(op::AttentionForward{.impl = impl,
                                        .out = out.g.get(),
                                        .saved = saved.gf(),
                                        .qkv = qkv.g.get(),
                                        .B = B,
                                        .T = T,
                                        .C = C,
                                        .NH = NH});
        m.gpu->run(op::AttentionBackward{.impl = impl,
                                         .dqkv = dqkv.g.get(),
                                         .dout = dout.g.get(),
                                         .qkv = qkv.g.get(),
                                         .out = out.g.get(),
                                         .saved = saved.gf(),
                                         .B = B,
                                         .T = T,
                                         .C = C,
                                         .NH = NH});
        return std::make_pair(m.gpu_values(out), m.gpu_values(dqkv));
    };
    const auto [on, dn] = run(naive, AttentionImpl::naive);
    const auto [of, df] = run(flash, AttentionImpl::flash);
    EXPECT_TRUE(close(of, on, naive.tol(), "flash vs naive out"));
    EXPECT_TRUE(close(df, dn, naive.tol(), "flash vs naive dqkv"));
    // Flash keeps O(T) state per head, naive O(T^2).
    EXPECT_EQ(attention_saved_elems(AttentionImpl::flash, B, T, NH), size_t(B) * NH * T);
    EXPECT_EQ(attention_saved_elems(AttentionImpl::naive, B, T, NH), size_t(B) * NH * T * T);
}

TEST(CudaAttentionWorkspace, OpWithUnreservedShapeThrowsInsteadOfAllocating) {
    MT_SKIP_WITHOUT_CUDA();
    auto gpu = create_backend(BackendKind::cuda);  // naive
    const int B = 1, T = 16, C = 32, NH = 2;
    gpu->reserve_attention_workspace(AttentionImpl::naive, B, T, C, NH);  // for T=16 only
    DeviceBuffer qkv(*gpu, 3 * 2 * 64 * C * 4, MemoryCategory::activations);
    DeviceBuffer out(*gpu, 2 * 64 * C * 4, MemoryCategory::activations);
    DeviceBuffer saved(*gpu, 2 * NH * 64 * 64 * 4, MemoryCategory::activations);
    const size_t before = gpu->memory_stats().current[int(MemoryCategory::workspace)];
    EXPECT_THROW(gpu->run(op::AttentionForward{.impl = AttentionImpl::naive,
                                               .out = out.get(),
                                               .saved = saved.as<float>(),
                                               .qkv = qkv.get(),
                                               .B = 2,
                                               .T = 64,
                                               .C = C,
                                               .NH = NH}),
                 BackendError);
    EXPECT_EQ(before, gpu->memory_stats().current[int(MemoryCategory::workspace)]);
}

TEST(CudaAttentionFlash, HeadSizeAboveTheLimitIsAClearError) {
    MT_SKIP_WITHOUT_CUDA();
    BackendOptions o;
    o.kernels.attention = AttentionImpl::flash;
    auto gpu = create_backend(BackendKind::cuda, o);
    const int B = 1, T = 4, C = 256, NH = 1;  // head size 256 > 128
    gpu->reserve_attention_workspace(AttentionImpl::flash, B, T, C, NH);
    DeviceBuffer qkv(*gpu, 3 * T * C * 4, MemoryCategory::activations);
    DeviceBuffer out(*gpu, T * C * 4, MemoryCategory::activations);
    DeviceBuffer saved(*gpu, T * 4, MemoryCategory::activations);
    try {
        gpu->run(op::AttentionForward{.impl = AttentionImpl::flash,
                                      .out = out.get(),
                                      .saved = saved.as<float>(),
                                      .qkv = qkv.get(),
                                      .B = B,
                                      .T = T,
                                      .C = C,
                                      .NH = NH});
        FAIL() << "expected BackendError";
    } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("naive"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace mt

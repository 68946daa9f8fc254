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
    const size_t sc = m.cpu->attention_saved_elems(s.B, s.T, s.C, s.NH);
    const size_t sg = m.gpu->attention_saved_elems(s.B, s.T, s.C, s.NH);  // reserves workspace
    EXPECT_EQ(sc, sg);
    auto saved = m.f32_zeros(sg);
    m.cpu->attention_forward(out.cf(), saved.cf(), qkv.c.get(), s.B, s.T, s.C, s.NH);
    m.gpu->attention_forward(out.g.get(), saved.gf(), qkv.g.get(), s.B, s.T, s.C, s.NH);
    EXPECT_TRUE(m.same(out, "attention out"));
    EXPECT_TRUE(m.same(saved, impl == AttentionImpl::flash ? "logsumexp" : "probs", m.tol()));

    auto dout = m.act(randn(BTC, 200 + si));
    auto dqkv = m.act(randn(3 * BTC, 300 + si));  // non-zero: backward accumulates
    // Feed the GPU's backward the CPU's forward results, so only the backward is compared.
    m.upload_act(out, m.cpu_values(out));
    m.gpu->copy_to_device(saved.g.get(), m.cpu_values(saved).data(), sg * 4);
    m.cpu->attention_backward(dqkv.cf(), dout.c.get(), qkv.c.get(), out.cf(), saved.cf(), s.B, s.T,
                              s.C, s.NH);
    m.gpu->attention_backward(dqkv.g.get(), dout.g.get(), qkv.g.get(), out.g.get(), saved.gf(), s.B,
                              s.T, s.C, s.NH);
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
    auto run = [&](Mirror& m) {
        auto qkv = m.act(qkv_h), dout = m.act(dout_h);
        auto out = m.act_zeros(BTC), dqkv = m.act_zeros(3 * BTC);
        auto saved = m.f32_zeros(m.gpu->attention_saved_elems(B, T, C, NH));
        m.gpu->attention_forward(out.g.get(), saved.gf(), qkv.g.get(), B, T, C, NH);
        m.gpu->attention_backward(dqkv.g.get(), dout.g.get(), qkv.g.get(), out.g.get(), saved.gf(),
                                  B, T, C, NH);
        return std::make_pair(m.gpu_values(out), m.gpu_values(dqkv));
    };
    const auto [on, dn] = run(naive);
    const auto [of, df] = run(flash);
    EXPECT_TRUE(close(of, on, naive.tol(), "flash vs naive out"));
    EXPECT_TRUE(close(df, dn, naive.tol(), "flash vs naive dqkv"));
    // Flash keeps O(T) state per head, naive O(T^2).
    EXPECT_EQ(flash.gpu->attention_saved_elems(B, T, C, NH), size_t(B) * NH * T);
    EXPECT_EQ(naive.gpu->attention_saved_elems(B, T, C, NH), size_t(B) * NH * T * T);
}

TEST(CudaAttentionWorkspace, OpWithUnreservedShapeThrowsInsteadOfAllocating) {
    MT_SKIP_WITHOUT_CUDA();
    auto gpu = create_backend(BackendKind::cuda);  // naive
    const int B = 1, T = 16, C = 32, NH = 2;
    gpu->attention_saved_elems(B, T, C, NH);  // reserves for T=16 only
    DeviceBuffer qkv(*gpu, 3 * 2 * 64 * C * 4, MemoryCategory::activations);
    DeviceBuffer out(*gpu, 2 * 64 * C * 4, MemoryCategory::activations);
    DeviceBuffer saved(*gpu, 2 * NH * 64 * 64 * 4, MemoryCategory::activations);
    const size_t before = gpu->memory_stats().current[int(MemoryCategory::workspace)];
    EXPECT_THROW(gpu->attention_forward(out.get(), saved.as<float>(), qkv.get(), 2, 64, C, NH),
                 BackendError);
    EXPECT_EQ(before, gpu->memory_stats().current[int(MemoryCategory::workspace)]);
}

TEST(CudaAttentionFlash, HeadSizeAboveTheLimitIsAClearError) {
    MT_SKIP_WITHOUT_CUDA();
    BackendOptions o;
    o.kernels.attention = AttentionImpl::flash;
    auto gpu = create_backend(BackendKind::cuda, o);
    const int B = 1, T = 4, C = 256, NH = 1;  // head size 256 > 128
    gpu->attention_saved_elems(B, T, C, NH);
    DeviceBuffer qkv(*gpu, 3 * T * C * 4, MemoryCategory::activations);
    DeviceBuffer out(*gpu, T * C * 4, MemoryCategory::activations);
    DeviceBuffer saved(*gpu, T * 4, MemoryCategory::activations);
    try {
        gpu->attention_forward(out.get(), saved.as<float>(), qkv.get(), B, T, C, NH);
        FAIL() << "expected BackendError";
    } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("naive"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace mt

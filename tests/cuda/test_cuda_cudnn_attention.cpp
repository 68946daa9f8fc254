// kernels.attention: cudnn (cuDNN 9's fused SDPA, kernels/cuda/attention_cudnn.cpp) against our
// flash kernels on the same GPU, bf16: forward output, the saved logsumexp, the accumulated
// input gradient (bitwise the same on a second run), for shapes with T not a multiple of any tile
// and head sizes 64 (GPT-2's) and 32; the same against our tensor-core flash_tc (head sizes 64
// and 128); and a short training run whose losses track flash's. Built in
// every CUDA build; the GPU cases need a device AND a build configured with MT_ENABLE_CUDNN=ON (the
// `cudnn` preset), and skip naming which one is missing. The build/config checks run without a
// device: the backend refuses cudnn before it looks for one.
//
// Tolerance (bf16): both sides read the same bf16 q, k, v and round their outputs to bf16
// (relative step 2^-8 = 0.4%); they differ in tiling and summation order (and cuDNN rounds P to
// bf16 before the PV product, as our flash does), so out and dqkv agree to 2e-2 relative +
// 2e-2 absolute (test::kBf16Tol, the same bound as naive vs flash), and the fp32 logsumexp to
// 1e-2 absolute.
#include <gtest/gtest.h>

#include <string>

#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::close;
using test::Mirror;
using test::randn;

std::string construction_error(Precision precision) {
    BackendOptions o;
    o.precision = precision;
    o.kernels.attention = AttentionImpl::cudnn;
    try {
        create_backend(BackendKind::cuda, o);
    } catch (const BackendError& e) {
        return e.what();
    }
    return "";
}

#if !defined(MT_HAVE_CUDNN)
// The default build has no cuDNN: asking for it says how to get a build that has it.
TEST(CudnnAttentionBuild, WithoutMtEnableCudnnTheBackendSaysHowToBuildIt) {
    const std::string msg = construction_error(Precision::bf16);
    EXPECT_NE(msg.find("not available in this build"), std::string::npos) << msg;
    EXPECT_NE(msg.find("MT_ENABLE_CUDNN"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tools/fetch-cudnn-frontend.sh"), std::string::npos) << msg;
}
#else
// cuDNN's SDPA is 16-bit only: fp32 and tf32 runs are refused by name, before any device work.
TEST(CudnnAttentionBuild, Fp32AndTf32AreRefusedNamingBf16) {
    for (Precision p : {Precision::fp32, Precision::tf32}) {
        const std::string msg = construction_error(p);
        EXPECT_NE(msg.find("cudnn needs run.precision bf16"), std::string::npos) << msg;
        EXPECT_NE(msg.find(to_string(p)), std::string::npos) << msg;
    }
}
#endif

#define MT_SKIP_WITHOUT_CUDNN()                                                                \
    do {                                                                                       \
        MT_SKIP_WITHOUT_CUDA();                                                                \
        if (!kHaveCudnn)                                                                       \
            GTEST_SKIP() << "built without cuDNN attention (configure with the cudnn preset, " \
                            "-DMT_ENABLE_CUDNN=ON)";                                           \
    } while (0)

#if defined(MT_HAVE_CUDNN)
constexpr bool kHaveCudnn = true;
#else
constexpr bool kHaveCudnn = false;
#endif

struct Shape {
    int B, T, C, NH;
};
// head size 64 (GPT-2's) and 32; T = 100 and 37 are not multiples of cuDNN's or flash's tiles.
const Shape kShapes[] = {{2, 100, 256, 4}, {1, 37, 128, 4}, {3, 64, 128, 2}};

struct Result {
    std::vector<float> out, saved, dqkv;
};

// Forward then backward on the GPU with `impl`, bf16, from the same host inputs. dqkv starts
// non-zero so the accumulate (+=) of the op contract is exercised.
Result run_attention(AttentionImpl impl, const Shape& s, uint32_t seed) {
    KernelChoice k;
    k.attention = impl;
    Mirror m(Precision::bf16, k);
    const size_t BTC = size_t(s.B) * s.T * s.C;
    auto qkv = m.act(randn(3 * BTC, seed));
    auto dout = m.act(randn(BTC, seed + 1));
    auto dqkv = m.act(randn(3 * BTC, seed + 2));
    auto out = m.act_zeros(BTC);
    auto saved = m.f32_zeros(attention_saved_elems(impl, s.B, s.T, s.NH));
    m.gpu->reserve_attention_workspace(impl, s.B, s.T, s.C, s.NH);
    m.gpu->run(op::AttentionForward{.impl = impl,
                                    .out = out.g.get(),
                                    .saved = saved.gf(),
                                    .qkv = qkv.g.get(),
                                    .B = s.B,
                                    .T = s.T,
                                    .C = s.C,
                                    .NH = s.NH});
    m.gpu->run(op::AttentionBackward{.impl = impl,
                                     .dqkv = dqkv.g.get(),
                                     .dout = dout.g.get(),
                                     .qkv = qkv.g.get(),
                                     .out = out.g.get(),
                                     .saved = saved.gf(),
                                     .B = s.B,
                                     .T = s.T,
                                     .C = s.C,
                                     .NH = s.NH});
    return {m.gpu_values(out), m.gpu_values(saved), m.gpu_values(dqkv)};
}

class CudnnAttention : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDNN(); }
};
INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttention, ::testing::Values(0, 1, 2));

TEST_P(CudnnAttention, ForwardStatsAndAccumulatedBackwardMatchFlashAndRepeatBitwise) {
    const Shape s = kShapes[GetParam()];
    const uint32_t seed = 40 + 10 * static_cast<uint32_t>(GetParam());
    const Result f = run_attention(AttentionImpl::flash, s, seed);
    const Result c = run_attention(AttentionImpl::cudnn, s, seed);
    EXPECT_EQ(attention_saved_elems(AttentionImpl::cudnn, s.B, s.T, s.NH),
              size_t(s.B) * s.NH * s.T);
    EXPECT_TRUE(close(c.out, f.out, test::kBf16Tol, "cudnn vs flash out"));
    EXPECT_TRUE(close(c.saved, f.saved, test::Tol{0, 1e-2}, "cudnn stats vs flash logsumexp"));
    EXPECT_TRUE(close(c.dqkv, f.dqkv, test::kBf16Tol, "cudnn vs flash dqkv (accumulated)"));
    // The deterministic backward (no atomics): a second run gives bitwise the same numbers.
    const Result again = run_attention(AttentionImpl::cudnn, s, seed);
    EXPECT_EQ(again.out, c.out);
    EXPECT_EQ(again.dqkv, c.dqkv);
}

// Our tensor-core flash (kernels.attention: flash_tc) against cuDNN's fused attention, for the
// head sizes flash_tc has kernels for (64 and 128), T not a multiple of either's tiles. Same
// tolerances as against flash (see the top of this file).
class CudnnAttentionVsFlashTc : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDNN(); }
};
const Shape kTcShapes[] = {{2, 100, 256, 4}, {1, 130, 256, 2}};  // head size 64, 128
INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionVsFlashTc, ::testing::Values(0, 1));

TEST_P(CudnnAttentionVsFlashTc, ForwardStatsAndAccumulatedBackwardMatch) {
    const Shape s = kTcShapes[GetParam()];
    const uint32_t seed = 70 + 10 * static_cast<uint32_t>(GetParam());
    const Result tc = run_attention(AttentionImpl::flash_tc, s, seed);
    const Result c = run_attention(AttentionImpl::cudnn, s, seed);
    EXPECT_TRUE(close(c.out, tc.out, test::kBf16Tol, "cudnn vs flash_tc out"));
    EXPECT_TRUE(close(c.saved, tc.saved, test::Tol{0, 1e-2}, "cudnn stats vs flash_tc logsumexp"));
    EXPECT_TRUE(close(c.dqkv, tc.dqkv, test::kBf16Tol, "cudnn vs flash_tc dqkv (accumulated)"));
}

// A head size cuDNN cannot load (not a multiple of 8) is a clear error naming the other
// variants, raised when the workspace is reserved, before any step.
TEST(CudnnAttentionShapes, HeadSizeNotAMultipleOf8IsAClearError) {
    MT_SKIP_WITHOUT_CUDNN();
    BackendOptions o;
    o.precision = Precision::bf16;
    o.kernels.attention = AttentionImpl::cudnn;
    auto gpu = create_backend(BackendKind::cuda, o);
    try {
        gpu->reserve_attention_workspace(AttentionImpl::cudnn, 1, 16, 12 * 2, 2);  // hs 12
        FAIL() << "expected BackendError";
    } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("multiple of 8"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("flash"), std::string::npos) << e.what();
    }
}

// Five AdamW steps of a small GPT with cuDNN attention and with flash, from the same weights
// and batch: the losses stay within bf16 noise of each other, and both go down.
std::vector<float> train_losses(AttentionImpl impl, const std::vector<float>& params,
                                const GPTConfig& cfg, const std::vector<int>& tokens, int B,
                                int T) {
    BackendOptions bo;
    bo.precision = Precision::bf16;
    bo.kernels.attention = impl;
    auto backend = create_backend(BackendKind::cuda, bo);
    ModelOptions mo;
    GPT model(*backend, cfg, mo);
    model.set_params(params);
    model.allocate_activations(B, T);
    AdamW opt(model, AdamWConfig{});
    const size_t bytes = size_t(B) * T * sizeof(int);
    DeviceBuffer in(*backend, bytes, MemoryCategory::data),
        tg(*backend, bytes, MemoryCategory::data);
    backend->copy_to_device(in.get(), tokens.data(), bytes);
    backend->copy_to_device(tg.get(), tokens.data() + 1, bytes);
    std::vector<float> losses;
    for (int step = 0; step < 5; ++step) {
        model.zero_grad();
        model.forward(in.as<int>(), tg.as<int>(), B, T);
        losses.push_back(model.loss());
        model.backward();
        opt.step();
    }
    return losses;
}

TEST(CudnnAttentionTraining, FiveStepLossesTrackFlash) {
    MT_SKIP_WITHOUT_CUDNN();
    GPTConfig cfg;
    cfg.n_layer = 2;
    cfg.n_head = 4;
    cfg.n_embd = 128;  // head size 32
    cfg.max_seq_len = 64;
    cfg.vocab_size = 200;
    const int B = 2, T = 48;
    std::vector<float> params;
    {
        auto cpu = create_backend(BackendKind::cpu);
        GPT init(*cpu, cfg, ModelOptions{});
        init.init_weights(1337);
        params = init.get_params();
    }
    const auto tokens = test::randint(size_t(B) * T + 1, cfg.vocab_size, 11);
    const auto flash = train_losses(AttentionImpl::flash, params, cfg, tokens, B, T);
    const auto cudnn = train_losses(AttentionImpl::cudnn, params, cfg, tokens, B, T);
    for (size_t i = 0; i < flash.size(); ++i)
        EXPECT_NEAR(cudnn[i], flash[i], 2e-2 * flash[i]) << "step " << i;
    EXPECT_LT(cudnn.back(), cudnn.front());
}

}  // namespace
}  // namespace mt

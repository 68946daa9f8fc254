// kernels.attention: flash_tc, the tensor-core flash attention (kernels/cuda/attention.cu), bf16:
//   - forward out, the saved logsumexp and the accumulated backward dqkv against the CPU
//     backend's flash attention (fp32, on the same bf16-rounded inputs), for head sizes 64 and
//     128, T a multiple of the 64-row tile (64, 256) and not (1, 17, 100, 130, 300: five key
//     tiles, GPT-2's head size), B > 1, NH > 1;
//   - against our SIMT flash on the same GPU;
//   - the backward bitwise identical across two runs (no atomics: fixed summation order);
//   - the refusals (fp32, head size) before any device work, and a short training run whose
//     losses track flash's.
// Skips without a device; the construction checks run everywhere.
//
// Tolerances (bf16). Both sides read the same bf16-rounded q, k, v, dout. The GPU rounds P to
// bf16 before the P V product (relative step 2^-8 = 0.4% per element, averaging out over a
// row), rounds the output and every gradient to bf16 when it stores them (2^-9 relative), and
// sums in a different order (fp32 MMA accumulators vs the CPU's loops). So out and dqkv agree
// to 2e-2 relative + 2e-2 absolute (test::kBf16Tol, the bound naive and flash meet). The
// logsumexp comes from fp32 scores of identical bf16 inputs (bf16 x bf16 products are exact in
// fp32) and an fp32 running sum: only the summation order and exp2/log differ, so it agrees to
// 1e-3 relative + 1e-3 absolute. Element-wise bounds that wide pass an error of a few percent
// that is everywhere (a scale slightly off, a small term dropped), so out and each of the Q, K, V
// parts of the gradient (what the backward added: after minus before) are also held to a
// relative L2 difference: 2e-2 for out, 3e-2 for the gradient, whose stored sum is rounded to
// bf16 at the size of the values it was added to (~1, against a gradient of ~0.3: ~0.4 % of it).
// tools/flash_tc_bf16_error.py simulates the kernels' roundings on these shapes: out 0.2 %, the
// gradient's parts 0.3-1.0 %.
#include <gtest/gtest.h>

#include <tuple>

#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::close;
using test::Mirror;
using test::randn;

constexpr test::Tol kLseTol{1e-3, 1e-3};
constexpr double kOutNorm = 2e-2, kGradNorm = 3e-2;

// What a backward added to dqkv (B,T,3C), split into its Q, K and V parts: after - before.
std::vector<std::vector<float>> added_qkv_parts(const std::vector<float>& after,
                                                const std::vector<float>& before, int C) {
    std::vector<std::vector<float>> parts(3);
    for (size_t i = 0; i < after.size(); ++i)
        parts[(i % (3 * size_t(C))) / C].push_back(after[i] - before[i]);
    return parts;
}

// The relative-L2 check of each part of what two backwards added.
void expect_added_close_in_norm(const std::vector<float>& gpu_after,
                                const std::vector<float>& ref_after,
                                const std::vector<float>& before, int C, const std::string& what) {
    const auto g = added_qkv_parts(gpu_after, before, C), r = added_qkv_parts(ref_after, before, C);
    const char* names[] = {"dq", "dk", "dv"};
    for (int p = 0; p < 3; ++p)
        EXPECT_TRUE(test::close_in_norm(g[p], r[p], kGradNorm, what + " " + names[p]));
}

struct Shape {
    int B, T, C, NH;
};
// head size C / NH: 64, 64, 64, 128, 128, 128, 64, 64
const Shape kShapes[] = {{2, 1, 128, 2},   {2, 17, 256, 4},  {3, 100, 128, 2}, {2, 100, 256, 2},
                         {1, 256, 384, 3}, {2, 130, 256, 2}, {2, 64, 192, 3},  {1, 300, 128, 2}};

class CudaAttentionTc : public ::testing::TestWithParam<int> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};
INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionTc, ::testing::Range(0, int(std::size(kShapes))),
                         [](const ::testing::TestParamInfo<int>& i) {
                             const Shape s = kShapes[i.param];
                             return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_hs" +
                                    std::to_string(s.C / s.NH) + "_NH" + std::to_string(s.NH);
                         });

op::AttentionForward forward_op(AttentionImpl impl, const Shape& s, void* out, float* saved,
                                const void* qkv) {
    return {.impl = impl,
            .out = out,
            .saved = saved,
            .qkv = qkv,
            .B = s.B,
            .T = s.T,
            .C = s.C,
            .NH = s.NH};
}
op::AttentionBackward backward_op(AttentionImpl impl, const Shape& s, void* dqkv, const void* dout,
                                  const void* qkv, const void* out, const float* saved) {
    return {.impl = impl,
            .dqkv = dqkv,
            .dout = dout,
            .qkv = qkv,
            .out = out,
            .saved = saved,
            .B = s.B,
            .T = s.T,
            .C = s.C,
            .NH = s.NH};
}

TEST_P(CudaAttentionTc, ForwardLogsumexpAndBackwardMatchCpuFlash) {
    const Shape s = kShapes[GetParam()];
    const uint32_t seed = 500 + 10 * static_cast<uint32_t>(GetParam());
    KernelChoice k;
    k.attention = AttentionImpl::flash_tc;  // the CPU side runs flash (Mirror)
    Mirror m(Precision::bf16, k);
    const size_t BTC = size_t(s.B) * s.T * s.C;
    auto qkv = m.act(randn(3 * BTC, seed));
    auto out = m.act_zeros(BTC);
    const size_t sn = attention_saved_elems(AttentionImpl::flash_tc, s.B, s.T, s.NH);
    ASSERT_EQ(sn, attention_saved_elems(AttentionImpl::flash, s.B, s.T, s.NH));
    auto saved = m.f32_zeros(sn);
    m.gpu->reserve_attention_workspace(AttentionImpl::flash_tc, s.B, s.T, s.C, s.NH);
    m.cpu->run(forward_op(AttentionImpl::flash, s, out.cf(), saved.cf(), qkv.c.get()));
    m.gpu->run(forward_op(AttentionImpl::flash_tc, s, out.g.get(), saved.gf(), qkv.g.get()));
    EXPECT_TRUE(m.same(out, "flash_tc out vs cpu"));
    EXPECT_TRUE(
        test::close_in_norm(m.gpu_values(out), m.cpu_values(out), kOutNorm, "flash_tc out vs cpu"));
    EXPECT_TRUE(m.same(saved, "flash_tc logsumexp vs cpu", kLseTol));

    auto dout = m.act(randn(BTC, seed + 1));
    auto dqkv = m.act(randn(3 * BTC, seed + 2));  // non-zero: the backward accumulates
    // The GPU's backward gets the CPU's forward results, so only the backward is compared.
    m.upload_act(out, m.cpu_values(out));
    m.gpu->copy_to_device(saved.g.get(), m.cpu_values(saved).data(), sn * 4);
    const std::vector<float> before = m.gpu_values(dqkv);
    ASSERT_EQ(before, m.cpu_values(dqkv));  // both sides start from the same bf16 values
    m.cpu->run(backward_op(AttentionImpl::flash, s, dqkv.cf(), dout.c.get(), qkv.c.get(), out.cf(),
                           saved.cf()));
    m.gpu->run(backward_op(AttentionImpl::flash_tc, s, dqkv.g.get(), dout.g.get(), qkv.g.get(),
                           out.g.get(), saved.gf()));
    EXPECT_TRUE(m.same(dqkv, "flash_tc dqkv (accumulated) vs cpu"));
    expect_added_close_in_norm(m.gpu_values(dqkv), m.cpu_values(dqkv), before, s.C,
                               "flash_tc added gradient vs cpu");
}

// Forward then backward on the GPU with `impl`, bf16, from the same host inputs.
struct Result {
    std::vector<float> out, saved, dqkv, dqkv_before;
};
Result run_gpu(AttentionImpl impl, const Shape& s, uint32_t seed) {
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
    m.gpu->run(forward_op(impl, s, out.g.get(), saved.gf(), qkv.g.get()));
    const std::vector<float> before = m.gpu_values(dqkv);
    m.gpu->run(
        backward_op(impl, s, dqkv.g.get(), dout.g.get(), qkv.g.get(), out.g.get(), saved.gf()));
    return {m.gpu_values(out), m.gpu_values(saved), m.gpu_values(dqkv), before};
}

TEST_P(CudaAttentionTc, MatchesSimtFlashAndRepeatsBitwise) {
    const Shape s = kShapes[GetParam()];
    const uint32_t seed = 900 + 10 * static_cast<uint32_t>(GetParam());
    const Result f = run_gpu(AttentionImpl::flash, s, seed);
    const Result tc = run_gpu(AttentionImpl::flash_tc, s, seed);
    EXPECT_TRUE(close(tc.out, f.out, test::kBf16Tol, "flash_tc vs flash out"));
    EXPECT_TRUE(close(tc.saved, f.saved, kLseTol, "flash_tc vs flash logsumexp"));
    EXPECT_TRUE(close(tc.dqkv, f.dqkv, test::kBf16Tol, "flash_tc vs flash dqkv"));
    EXPECT_TRUE(test::close_in_norm(tc.out, f.out, kOutNorm, "flash_tc vs flash out"));
    ASSERT_EQ(tc.dqkv_before, f.dqkv_before);
    expect_added_close_in_norm(tc.dqkv, f.dqkv, f.dqkv_before, s.C,
                               "flash_tc vs flash added gradient");
    // Deterministic: each output element is owned by one thread and summed in a fixed order.
    const Result again = run_gpu(AttentionImpl::flash_tc, s, seed);
    EXPECT_EQ(again.out, tc.out);
    EXPECT_EQ(again.saved, tc.saved);
    EXPECT_EQ(again.dqkv, tc.dqkv);
}

// The bf16 requirement is a configuration question: refused at construction, before the
// backend looks for a device (so this runs on any machine).
TEST(CudaAttentionTcBuild, Fp32AndTf32AreRefusedNamingBf16) {
    for (Precision p : {Precision::fp32, Precision::tf32}) {
        BackendOptions o;
        o.precision = p;
        o.kernels.attention = AttentionImpl::flash_tc;
        std::string msg;
        try {
            create_backend(BackendKind::cuda, o);
        } catch (const BackendError& e) {
            msg = e.what();
        }
        EXPECT_NE(msg.find("flash_tc needs run.precision bf16"), std::string::npos) << msg;
        EXPECT_NE(msg.find(to_string(p)), std::string::npos) << msg;
        EXPECT_NE(msg.find("kernels.attention: flash"), std::string::npos) << msg;
    }
}

TEST(CudaAttentionTcBuild, TheCpuBackendRefusesIt) {
    BackendOptions o;
    o.kernels.attention = AttentionImpl::flash_tc;
    std::string msg;
    try {
        create_backend(BackendKind::cpu, o);
    } catch (const BackendError& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("kernels.attention: flash_tc needs backend: cuda"), std::string::npos)
        << msg;
}

// A head size without kernels, or heads that do not split n_embd evenly, are refused when the
// workspace is reserved, before any step.
TEST(CudaAttentionTcShapes, UnsupportedHeadSizeIsAClearError) {
    MT_SKIP_WITHOUT_CUDA();
    BackendOptions o;
    o.precision = Precision::bf16;
    o.kernels.attention = AttentionImpl::flash_tc;
    auto gpu = create_backend(BackendKind::cuda, o);
    for (const int hs : {16, 32, 96, 256}) {
        try {
            gpu->reserve_attention_workspace(AttentionImpl::flash_tc, 1, 16, 2 * hs, 2);
            ADD_FAILURE() << "head size " << hs << ": expected BackendError";
        } catch (const BackendError& e) {
            EXPECT_NE(std::string(e.what()).find("64 or 128"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("kernels.attention: flash"), std::string::npos)
                << e.what();
        }
    }
    // n_embd 129 over 2 heads would truncate to head size 64 and misalign every row.
    try {
        gpu->reserve_attention_workspace(AttentionImpl::flash_tc, 1, 16, 129, 2);
        ADD_FAILURE() << "n_embd 129, n_head 2: expected BackendError";
    } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("not a multiple of n_head 2"), std::string::npos)
            << e.what();
    }
}

// Five AdamW steps of a small GPT (head size 64, T not a multiple of the tile) with flash_tc and
// with flash, bf16, from the same weights and batch: the losses stay within bf16 noise of each
// other and go down.
std::vector<float> train_losses(AttentionImpl impl, const std::vector<float>& params,
                                const GPTConfig& cfg, const std::vector<int>& tokens, int B,
                                int T) {
    BackendOptions bo;
    bo.precision = Precision::bf16;
    bo.kernels.attention = impl;
    auto backend = create_backend(BackendKind::cuda, bo);
    GPT model(*backend, cfg, ModelOptions{});
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

TEST(CudaAttentionTcTraining, FiveStepLossesTrackFlash) {
    MT_SKIP_WITHOUT_CUDA();
    GPTConfig cfg;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 128;  // head size 64
    cfg.max_seq_len = 128;
    cfg.vocab_size = 200;
    const int B = 2, T = 80;
    std::vector<float> params;
    {
        auto cpu = create_backend(BackendKind::cpu);
        GPT init(*cpu, cfg, ModelOptions{});
        init.init_weights(1337);
        params = init.get_params();
    }
    const auto tokens = test::randint(size_t(B) * T + 1, cfg.vocab_size, 11);
    const auto flash = train_losses(AttentionImpl::flash, params, cfg, tokens, B, T);
    const auto tc = train_losses(AttentionImpl::flash_tc, params, cfg, tokens, B, T);
    for (size_t i = 0; i < flash.size(); ++i)
        EXPECT_NEAR(tc[i], flash[i], 2e-2 * flash[i]) << "step " << i;
    EXPECT_LT(tc.back(), tc.front());
}

}  // namespace
}  // namespace mt

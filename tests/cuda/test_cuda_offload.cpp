// Offload on the GPU, where the copies run on the copy stream concurrently with compute, ordered
// only by events: a missing or misplaced wait shows up here as corrupted activations or weights.
//   run.offload activations: losses, gradient norms, gradients and weights after 4 steps are
//     bitwise those of the plain run (the copies move bits; the kernels are deterministic and see
//     the same alignments), and the activation category's peak is lower.
//   optim.offload: one update equals the device AdamW within the CPU-vs-CUDA AdamW tolerance of
//     test_cuda_backend (both evaluate math::adamw_update without contraction, so it is expected
//     to be bitwise; the test prints whether it is), the loss over 4 steps tracks the plain run,
//     and the device holds no optimizer memory.
// Skips without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/training_session.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

struct Case {
    const char* name;
    Precision precision;
    AttentionImpl attention;
    LayerNormImpl layernorm;
    int grad_accum = 1;
    Recompute recompute = Recompute::none;
};

// 8 layers with 3 device slots: 5 layers travel. B*T = 2048 rows of C = 256 make each layer's
// copy take long enough (several MiB) to overlap the next layer's kernels.
RunConfig offload_config(const Case& c) {
    RunConfig r;
    r.variant = c.name;
    r.backend = BackendChoice::cuda;
    r.model.n_layer = 8;
    r.model.n_embd = 256;
    r.model.n_head = 4;
    r.model.max_seq_len = 256;
    r.model.vocab_size = 512;
    r.data.batch_size = 8;
    r.data.seq_len = 256;
    r.optim.lr = 1e-3f;
    r.optim.grad_clip = 1.0f;
    r.run.seed = 1234;
    r.run.precision = c.precision;
    r.kernels.attention = c.attention;
    r.kernels.layernorm = c.layernorm;
    r.run.grad_accum = c.grad_accum;
    r.run.recompute = c.recompute;
    r.profile.trace = false;
    return r;
}

class CudaActivationOffload : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaActivationOffload,
    ::testing::Values(Case{"fp32_naive", Precision::fp32, AttentionImpl::naive,
                           LayerNormImpl::separate},
                      // the fused residual+LayerNorm writes the next layer's ln_1 across slots
                      Case{"fp32_flash_fused_ln", Precision::fp32, AttentionImpl::flash,
                           LayerNormImpl::fused_residual},
                      Case{"bf16_flash_fused_ln", Precision::bf16, AttentionImpl::flash,
                           LayerNormImpl::fused_residual},
                      // two forward/backward pairs per step: the second forward's copy-outs
                      // follow the first backward's prefetches on the copy stream
                      Case{"fp32_flash_accum2_recompute", Precision::fp32, AttentionImpl::flash,
                           LayerNormImpl::fused_residual, 2, Recompute::layernorm_gelu}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

size_t peak(TrainingSession& s, MemoryCategory c) {
    return s.backend().memory_stats().peak[static_cast<int>(c)];
}

TEST_P(CudaActivationOffload, TrainingIsBitwiseThePlainRunWithALowerActivationPeak) {
    const RunConfig plain_cfg = offload_config(GetParam());
    RunConfig off_cfg = plain_cfg;
    off_cfg.run.offload = OffloadMode::activations;
    TrainingInputs qa, qb;
    qa.track_memory = qb.track_memory = false;
    TrainingSession plain(create_training_backend(plain_cfg, BackendKind::cuda), plain_cfg,
                          std::move(qa));
    TrainingSession off(create_training_backend(off_cfg, BackendKind::cuda), off_cfg,
                        std::move(qb));
    ASSERT_EQ(plain.model().get_params(), off.model().get_params()) << "the seeded init differs";
    for (int s = 0; s < 4; ++s) {
        const StepRecord a = plain.step(s, false), b = off.step(s, false);
        EXPECT_EQ(a.loss, b.loss) << "step " << s;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    }
    EXPECT_TRUE(plain.model().get_grads() == off.model().get_grads()) << "gradients differ";
    EXPECT_TRUE(plain.model().get_params() == off.model().get_params()) << "weights differ";
    const size_t a = peak(plain, MemoryCategory::activations);
    const size_t b = peak(off, MemoryCategory::activations);
    std::printf("activation peak: plain %.1f MiB, offload %.1f MiB\n", to_mib(double(a)),
                to_mib(double(b)));
    EXPECT_LT(b, a);
}

class CudaOptimizerOffload : public ::testing::Test {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TEST_F(CudaOptimizerOffload, TracksTheDeviceAdamWAndHoldsNoDeviceOptimizerMemory) {
    const RunConfig plain_cfg =
        offload_config({"fp32", Precision::fp32, AttentionImpl::flash, LayerNormImpl::separate});
    RunConfig off_cfg = plain_cfg;
    off_cfg.optim.offload = true;
    TrainingInputs qa, qb;
    qa.track_memory = qb.track_memory = false;
    TrainingSession plain(create_training_backend(plain_cfg, BackendKind::cuda), plain_cfg,
                          std::move(qa));
    TrainingSession off(create_training_backend(off_cfg, BackendKind::cuda), off_cfg,
                        std::move(qb));
    EXPECT_GT(peak(plain, MemoryCategory::optimizer), 0u);
    EXPECT_EQ(peak(off, MemoryCategory::optimizer), 0u);

    // Step 0: the same gradients (same weights, same batch), one update each.
    const StepRecord a0 = plain.step(0, false), b0 = off.step(0, false);
    EXPECT_EQ(a0.loss, b0.loss);
    EXPECT_EQ(a0.grad_norm, b0.grad_norm);
    const std::vector<float> pa = plain.model().get_params(), pb = off.model().get_params();
    EXPECT_TRUE(test::close(pb, pa, {1e-6, 1e-7}, "weights after one update"));
    EXPECT_TRUE(test::close(off.optimizer().get_m(), plain.optimizer().get_m(), {1e-6, 1e-9}, "m"));
    EXPECT_TRUE(
        test::close(off.optimizer().get_v(), plain.optimizer().get_v(), {1e-6, 1e-12}, "v"));
    std::printf("one update: host AdamW %s the device AdamW\n",
                pa == pb ? "is bitwise" : "is NOT bitwise (within tolerance)");

    // Steps 1-3: the loss tracks the plain run's.
    for (int s = 1; s < 4; ++s) {
        const StepRecord a = plain.step(s, false), b = off.step(s, false);
        EXPECT_NEAR(a.loss, b.loss, 1e-4 * std::fabs(a.loss)) << "step " << s;
    }
    EXPECT_EQ(peak(off, MemoryCategory::optimizer), 0u);
}

}  // namespace
}  // namespace mt

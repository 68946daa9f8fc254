// A GPU run with a fixed seed is bitwise reproducible: two TrainingSessions built from the same
// RunConfig (each with its own CUDA backend: seeded init, synthetic batches) give the same loss
// and gradient norm at every step and the same parameters after it, bit for bit, for fp32 and
// bf16 and our attention kernels (naive, flash, flash_tc). What makes it so: every CUDA reduction
// has a fixed order and the wte gradient sorts its positions by token instead of adding with
// atomics (kernels/cuda/encoder.cu). The batches repeat tokens (vocabulary 64, 256 positions per
// step), so the scatter-add has collisions. Skips without a device.
#include <gtest/gtest.h>

#include <cstring>
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
};

class CudaDeterminism : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

RunConfig gpu_config(const Case& c) {
    RunConfig r;
    r.variant = c.name;
    r.backend = BackendChoice::cuda;
    r.model.n_layer = 2;
    r.model.n_embd = 64;
    r.model.n_head = 4;
    r.model.max_seq_len = 64;
    r.model.vocab_size = 64;  // 256 positions per batch: every token repeats
    r.data.batch_size = 4;
    r.data.seq_len = 64;
    r.optim.lr = 1e-3f;
    r.optim.grad_clip = 1.0f;  // the grad norm is read back every step
    r.run.seed = 1234;
    r.run.precision = c.precision;
    r.kernels.attention = c.attention;
    if (c.attention == AttentionImpl::flash_tc) r.model.n_head = 1;  // its head size 64
    r.profile.trace = false;
    return r;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaDeterminism,
    ::testing::Values(Case{"fp32_naive", Precision::fp32, AttentionImpl::naive},
                      Case{"fp32_flash", Precision::fp32, AttentionImpl::flash},
                      Case{"bf16_flash", Precision::bf16, AttentionImpl::flash},
                      Case{"bf16_flash_tc", Precision::bf16, AttentionImpl::flash_tc}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST_P(CudaDeterminism, TwoRunsWithTheSameSeedAreBitwiseIdentical) {
    const RunConfig cfg = gpu_config(GetParam());
    TrainingInputs quiet_a, quiet_b;
    quiet_a.track_memory = quiet_b.track_memory = false;
    TrainingSession a(create_training_backend(cfg, BackendKind::cuda), cfg, std::move(quiet_a));
    TrainingSession b(create_training_backend(cfg, BackendKind::cuda), cfg, std::move(quiet_b));
    ASSERT_EQ(a.model().get_params(), b.model().get_params()) << "the seeded init differs";
    constexpr int kSteps = 4;
    for (int s = 0; s < kSteps; ++s) {
        const StepRecord ra = a.step(s, false), rb = b.step(s, false);
        // EXPECT_EQ on doubles: exact equality, not within ulps.
        EXPECT_EQ(ra.loss, rb.loss) << "step " << s;
        EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << s;
    }
    const std::vector<float> ga = a.model().get_grads(), gb = b.model().get_grads();
    const std::vector<float> pa = a.model().get_params(), pb = b.model().get_params();
    ASSERT_EQ(ga.size(), gb.size());
    ASSERT_EQ(pa.size(), pb.size());
    // Name the first tensor that differs, if any.
    for (const auto& t : a.model().parameter_table().tensors()) {
        EXPECT_EQ(0, std::memcmp(ga.data() + t.offset, gb.data() + t.offset, t.count * 4))
            << "gradient of " << t.name;
        EXPECT_EQ(0, std::memcmp(pa.data() + t.offset, pb.data() + t.offset, t.count * 4))
            << "parameter " << t.name;
    }
}

}  // namespace
}  // namespace mt

// run.host_sync on the CUDA backend (engine/training_session.h), where a host wait is a real
// cudaStreamSynchronize: the waits per step each setting makes (the same counts as on the CPU,
// tests/test_host_sync.cpp), every step's loss and grad norm bitwise the same under all four
// settings, and `none`'s deferred events read back into complete records. No timing is asserted
// beyond a deferred step having a positive device time. Skips without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/training_session.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

RunConfig small_config(HostSync mode, int grad_accum) {
    RunConfig c;
    c.variant = std::string(enum_name(mode));
    c.backend = BackendChoice::cuda;
    c.model.n_layer = 2;
    c.model.n_embd = 64;
    c.model.n_head = 4;
    c.model.max_seq_len = 32;
    c.model.vocab_size = 200;
    c.data.batch_size = 4;
    c.data.seq_len = 32;
    c.optim.grad_clip = 1.0f;
    c.run.seed = 11;
    c.run.warmup_steps = 1;
    c.run.measure_steps = 4;
    c.run.grad_accum = grad_accum;
    c.run.host_sync = mode;
    return c;
}

TrainingSession cuda_session(const RunConfig& c) {
    TrainingInputs in;
    in.track_memory = false;
    return TrainingSession(create_training_backend(c, BackendKind::cuda), c, std::move(in));
}

struct OpCounter final : OpObserver {
    int ops = 0;
    void op_begin(const OpRecord&) override { ++ops; }
    void op_end(const OpRecord&) override {}
};

// Five steps of `mode`, through the windowed API for none (one window), step() otherwise.
std::vector<StepRecord> five_steps(HostSync mode, int grad_accum) {
    TrainingSession s = cuda_session(small_config(mode, grad_accum));
    std::vector<StepRecord> out;
    if (mode == HostSync::none) {
        for (int i = 0; i < 5; ++i) s.enqueue_step(i, false);
        for (auto& d : s.drain()) out.push_back(d.record);
    } else {
        for (int i = 0; i < 5; ++i) out.push_back(s.step(i, false));
    }
    return out;
}

class CudaHostSync : public ::testing::Test {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TEST_F(CudaHostSync, LossAndGradNormAreBitwiseTheSameUnderEverySetting) {
    for (int accum : {1, 2}) {
        const std::vector<StepRecord> base = five_steps(HostSync::step, accum);
        for (HostSync m : {HostSync::loss_every_step, HostSync::every_op, HostSync::none}) {
            const std::vector<StepRecord> got = five_steps(m, accum);
            ASSERT_EQ(got.size(), base.size());
            for (size_t i = 0; i < base.size(); ++i) {
                EXPECT_EQ(got[i].loss, base[i].loss) << enum_name(m) << " step " << i;
                EXPECT_EQ(got[i].grad_norm, base[i].grad_norm) << enum_name(m) << " step " << i;
            }
        }
    }
}

TEST_F(CudaHostSync, WaitsPerStepFollowTheSetting) {
    const int accum = 2;
    EXPECT_EQ(five_steps(HostSync::step, accum)[1].host_syncs, 3);
    EXPECT_EQ(five_steps(HostSync::loss_every_step, accum)[1].host_syncs, accum + 2);
    const std::vector<StepRecord> none = five_steps(HostSync::none, accum);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(none[i].host_syncs, 0) << "step " << i;
    EXPECT_EQ(none[4].host_syncs, 2);

    TrainingSession s = cuda_session(small_config(HostSync::every_op, accum));
    s.step(0, false);
    OpCounter counter;
    s.backend().set_op_observer(&counter);
    const StepRecord rec = s.step(1, false);
    s.backend().set_op_observer(nullptr);
    EXPECT_EQ(rec.host_syncs, counter.ops + 3);
}

TEST_F(CudaHostSync, NoneReadsEveryStepsEventsAfterTheWindow) {
    const std::vector<StepRecord> none = five_steps(HostSync::none, 1);
    for (const StepRecord& r : none) {
        EXPECT_GT(r.times.wall_ms, 0.0) << "step " << r.step;
        EXPECT_GT(r.times[Phase::forward], 0.0) << "step " << r.step;
        EXPECT_GT(r.times[Phase::backward], 0.0) << "step " << r.step;
    }
}

}  // namespace
}  // namespace mt

// The one training-step core (engine/training_session.h): a TrainingSession step gives the runner's
// losses bit for bit (with and without gradient accumulation), the gradients hook sees complete
// gradients before the optimizer update, given weights replace the seeded init, a batch of the
// wrong shape is refused, and the per-op profiler labels matmuls by layer when asked. Also the
// RepeatedBatch source that `train`, `step` and the bench share.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/training_session.h"
#include "experiment/runner.h"
#include "experiment/spec.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// The tiny model of tests/test_runner.cpp, on synthetic data, one thread, seed 7.
RunConfig tiny_config() {
    RunConfig c;
    c.variant = "tiny";
    c.backend = BackendChoice::cpu;
    c.model.n_layer = 2;
    c.model.n_embd = 32;
    c.model.n_head = 2;
    c.model.max_seq_len = 16;
    c.model.vocab_size = 128;
    c.data.batch_size = 2;
    c.data.seq_len = 16;
    c.optim.lr = 1e-3f;
    c.optim.impl = AdamWImpl::unfused;
    c.run.seed = 7;
    c.run.warmup_steps = 1;
    c.run.measure_steps = 3;
    c.run.threads = 1;
    c.profile.trace = false;
    return c;
}

TrainingSession tiny_session(const RunConfig& c, TrainingInputs inputs = {}) {
    return TrainingSession(create_training_backend(c, BackendKind::cpu), c, std::move(inputs));
}

class TrainingTest : public ::testing::Test {
  protected:
    void SetUp() override {
        // The runner probes the machine's peaks once per process, never in the user's ~/.cache.
        const fs::path cache =
            fs::temp_directory_path() / ("mt_test_training_cache_" + std::to_string(::getpid()));
        ::setenv("MICROTRAIN_CACHE_DIR", cache.c_str(), 1);
    }
};

// Runs `c` through run_experiment and through a TrainingSession; the losses must be identical.
void expect_session_matches_runner(const RunConfig& c) {
    ExperimentSpec spec;
    spec.name = "tiny";
    spec.variants = {c};
    spec.baseline = c.variant;
    RunnerOptions quiet;
    quiet.out = nullptr;
    quiet.handle_sigint = false;
    const ExperimentRun ex = run_experiment(spec, quiet);
    ASSERT_EQ(ex.results.variants.size(), 1u);
    ASSERT_EQ(ex.results.variants[0].status, RunStatus::ok) << ex.results.variants[0].message;
    const std::vector<StepRow>& runner_steps = ex.results.variants[0].steps;

    TrainingSession session = tiny_session(c);
    const int total = c.run.warmup_steps + c.run.measure_steps;
    ASSERT_EQ(static_cast<int>(runner_steps.size()), total);
    for (int s = 0; s < total; ++s) {
        const StepRecord rec = session.step(s, s < c.run.warmup_steps);
        EXPECT_EQ(rec.loss, runner_steps[s].loss) << "step " << s;
        EXPECT_EQ(rec.grad_norm, runner_steps[s].grad_norm) << "step " << s;
        EXPECT_EQ(rec.lr, runner_steps[s].lr) << "step " << s;
        EXPECT_EQ(rec.warmup, runner_steps[s].warmup);
    }
}

TEST_F(TrainingTest, TrainingSessionStepMatchesTheRunnersLoss) {
    expect_session_matches_runner(tiny_config());
}

TEST_F(TrainingTest, TrainingSessionStepMatchesTheRunnersLossWithGradAccumulation) {
    RunConfig c = tiny_config();
    c.run.grad_accum = 3;
    c.optim.grad_clip = 0.5f;  // the grad norm is read back too
    expect_session_matches_runner(c);
}

TEST_F(TrainingTest, StepTimesEveryPhaseOncePerMicroStep) {
    RunConfig c = tiny_config();
    c.run.grad_accum = 2;
    TrainingSession session = tiny_session(c);
    const StepRecord rec = session.step(0, false);
    ASSERT_EQ(session.timer().last_intervals().size(), 2u * 4 + 2);  // 4 per micro-step + 2
    for (Phase p : kAllPhases) EXPECT_GE(rec.times[p], 0.0) << to_string(p);
    EXPECT_GE(rec.times.wall_ms, rec.times[Phase::forward] + rec.times[Phase::backward]);
    EXPECT_TRUE(std::isfinite(rec.loss));
    EXPECT_STREQ(session.current_phase(), "sync");
}

TEST_F(TrainingTest, GradientsReadySeesCompleteGradientsBeforeTheUpdate) {
    const RunConfig c = tiny_config();
    TrainingSession session = tiny_session(c);
    const std::vector<float> before = session.model().get_params();
    std::vector<float> params_in_hook, grads_in_hook;
    session.step(0, false, [&](GPT& model) {
        params_in_hook = model.get_params();
        grads_in_hook = model.get_grads();
    });
    EXPECT_EQ(params_in_hook, before) << "the hook ran after the optimizer update";
    double grad_sq = 0;
    for (float g : grads_in_hook) grad_sq += double(g) * g;
    EXPECT_GT(grad_sq, 0.0) << "the hook ran before backward";
    EXPECT_NE(session.model().get_params(), before) << "the optimizer did not run";
}

TEST_F(TrainingTest, LoadWeightsReplacesTheSeededInit) {
    const RunConfig c = tiny_config();
    TrainingSession seeded = tiny_session(c);
    std::vector<float> weights = seeded.model().get_params();
    for (float& w : weights) w *= 0.5f;
    TrainingInputs inputs;
    inputs.load_weights = [&](GPT& model) { model.set_params(weights); };
    TrainingSession loaded = tiny_session(c, std::move(inputs));
    EXPECT_EQ(loaded.model().get_params(), weights);
}

TEST_F(TrainingTest, RepeatedBatchIsTrainedOnEveryStep) {
    RunConfig c = tiny_config();
    c.optim.lr = 1e-2f;
    TrainingInputs inputs;
    inputs.batches = std::make_unique<RepeatedBatch>(
        RepeatedBatch::uniform_random(c.data.batch_size, c.data.seq_len, c.model.vocab_size, 1));
    inputs.track_memory = false;
    TrainingSession session = tiny_session(c, std::move(inputs));
    const double first = session.step(0, false).loss;
    double last = first;
    for (int s = 1; s < 10; ++s) last = session.step(s, false).loss;
    EXPECT_LT(last, first - 0.5) << "memorising one batch must lower its loss";
    EXPECT_TRUE(session.finish().phases[0].tracked_peak_total == 0) << "memory was tracked";
}

TEST_F(TrainingTest, BatchOfTheWrongShapeIsRefusedAtTheStep) {
    const RunConfig c = tiny_config();
    TrainingInputs inputs;
    inputs.batches = std::make_unique<RepeatedBatch>(RepeatedBatch::uniform_random(
        c.data.batch_size + 1, c.data.seq_len, c.model.vocab_size, 1));
    TrainingSession session = tiny_session(c, std::move(inputs));
    try {
        session.step(0, false);
        FAIL() << "a (3, 16) batch was accepted by a session built for (2, 16)";
    } catch (const std::logic_error& e) {
        EXPECT_NE(std::string(e.what()).find("data.batch_size 2"), std::string::npos) << e.what();
    }
}

TEST_F(TrainingTest, ProfilerLabelsMatmulsByLayerWhenAsked) {
    RunConfig c = tiny_config();
    c.profile.kernels = true;
    TrainingSession session = tiny_session(c);
    ASSERT_NE(session.profiler(), nullptr);
    session.profiler()->set_op_labels(MatmulLayerLabels(c.model, 2, 16));
    session.step(0, false);
    const std::vector<KernelStat> table = session.profiler()->table(1.0, 1, MachinePeaks{});
    // With V=128 the LM head (32 -> Vp) may have the MLP's c_fc shape (32 -> 128): one label.
    const int Vp = c.model.padded_vocab_size();
    const std::string lm_head_label = std::string("matmul_backward ") +
                                      (Vp == 128 ? "fc+lm_head" : "lm_head") + " (N32 32->" +
                                      std::to_string(Vp) + ")";
    bool qkv = false, lm_head = false;
    for (const KernelStat& k : table) {
        qkv |= k.name == "matmul_forward qkv (N32 32->96)";
        lm_head |= k.name == lm_head_label;
        EXPECT_NE(k.name, "matmul_forward") << "an unlabelled matmul";
    }
    EXPECT_TRUE(qkv);
    EXPECT_TRUE(lm_head) << lm_head_label;
}

TEST(RepeatedBatch, HandsOutTheSameBatchOnEveryCall) {
    RepeatedBatch source(1, 3, {1, 2, 3}, {2, 3, 4});
    const Batch& a = source.next();
    const Batch& b = source.next();
    EXPECT_EQ(&a, &b);
    EXPECT_EQ(a.B, 1);
    EXPECT_EQ(a.T, 3);
    EXPECT_EQ(std::vector<int>(a.inputs, a.inputs + 3), (std::vector<int>{1, 2, 3}));
    EXPECT_EQ(std::vector<int>(a.targets, a.targets + 3), (std::vector<int>{2, 3, 4}));
}

TEST(RepeatedBatch, UniformRandomShiftsTargetsByOne) {
    const RepeatedBatch source = RepeatedBatch::uniform_random(2, 5, 50, 3);
    const Batch& b = source.batch();
    for (int i = 0; i + 1 < 10; ++i) EXPECT_EQ(b.targets[i], b.inputs[i + 1]);
    for (int i = 0; i < 10; ++i) EXPECT_LT(b.inputs[i], 50);
}

TEST(RepeatedBatch, RejectsTokensThatAreNotBTimesT) {
    EXPECT_THROW(RepeatedBatch(2, 3, {1, 2, 3}, {1, 2, 3}), DataError);
}

TEST(CpuModelOf, StripsThePrefixAndTheBackendsSuffixButKeepsTheModelsOwnParentheses) {
    EXPECT_EQ(cpu_model_of("CPU: AMD EPYC (2 threads, eigen GEMM)"), "AMD EPYC");
    EXPECT_EQ(cpu_model_of("CPU: Intel(R) Xeon(R) Gold 6338 (1 thread, packed GEMM)"),
              "Intel(R) Xeon(R) Gold 6338");
    EXPECT_EQ(cpu_model_of("NVIDIA H200"), "unknown");
}

}  // namespace
}  // namespace mt

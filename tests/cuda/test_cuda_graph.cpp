// run.cuda_graph on the CUDA backend (engine/training_session.h): the step's device work
// captured into a CUDA graph at the session's second step and replayed after. Pinned here: N
// steps with the graph are bitwise N eager steps — losses, grad norms, learning rates, weights
// and AdamW moments — under a warm-up + cosine schedule (a replay with the captured step's lr
// frozen in would fail), with grad_accum 1 and 3, fp32 and bf16, every AdamW impl, run.host_sync
// none, and an untimed rewarm forward between replays (bf16: the weights' compute copy);
// a replayed step's phases (the replay is `forward`, backward and optimizer do not run); and a
// host wait inside a capture refused by name. Skips without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/training_session.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

RunConfig graph_config(bool graph, Precision precision, int grad_accum) {
    RunConfig c;
    c.variant = graph ? "graph" : "eager";
    c.backend = BackendChoice::cuda;
    c.model.n_layer = 2;
    c.model.n_embd = 64;
    c.model.n_head = 4;
    c.model.max_seq_len = 32;
    c.model.vocab_size = 200;
    c.data.batch_size = 4;
    c.data.seq_len = 32;
    c.optim.lr = 1e-3f;
    c.optim.grad_clip = 1.0f;
    c.optim.schedule.kind = LRSchedule::Kind::cosine;
    c.optim.schedule.warmup_steps = 3;
    c.optim.schedule.decay_steps = 4;
    c.run.seed = 11;
    c.run.precision = precision;
    c.run.grad_accum = grad_accum;
    c.run.cuda_graph = graph;
    return c;
}

TrainingSession cuda_session(const RunConfig& c) {
    TrainingInputs in;
    in.track_memory = false;
    return TrainingSession(create_training_backend(c, BackendKind::cuda), c, std::move(in));
}

struct RunResult {
    std::vector<StepRecord> steps;
    std::vector<float> params, m, v;
};

// `n` steps (step() for every setting but none, which goes through one window); `rewarm_at`:
// an untimed forward before that step, as the rounds do between slices.
RunResult run_steps(const RunConfig& c, int n, int rewarm_at = -1) {
    TrainingSession s = cuda_session(c);
    RunResult r;
    if (c.run.host_sync == HostSync::none) {
        for (int i = 0; i < n; ++i) s.enqueue_step(i, false);
        for (auto& d : s.drain()) r.steps.push_back(d.record);
    } else {
        for (int i = 0; i < n; ++i) {
            if (i == rewarm_at) s.rewarm();
            r.steps.push_back(s.step(i, false));
        }
    }
    r.params = s.model().get_params();
    r.m = s.optimizer().get_m();
    r.v = s.optimizer().get_v();
    return r;
}

void expect_bitwise(const RunResult& eager, const RunResult& graph, const std::string& what) {
    ASSERT_EQ(eager.steps.size(), graph.steps.size()) << what;
    for (size_t i = 0; i < eager.steps.size(); ++i) {
        EXPECT_EQ(eager.steps[i].lr, graph.steps[i].lr) << what << " step " << i;
        EXPECT_EQ(eager.steps[i].loss, graph.steps[i].loss) << what << " step " << i;
        EXPECT_EQ(eager.steps[i].grad_norm, graph.steps[i].grad_norm) << what << " step " << i;
    }
    EXPECT_EQ(eager.params, graph.params) << what << ": weights";
    EXPECT_EQ(eager.m, graph.m) << what << ": AdamW m";
    EXPECT_EQ(eager.v, graph.v) << what << ": AdamW v";
}

class CudaGraph : public ::testing::Test {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

constexpr int kSteps = 8;  // eager, capture, 6 replays: warm-up, decay and the floor

TEST_F(CudaGraph, ReplaysAreBitwiseEagerStepsUnderAnLrSchedule) {
    for (Precision p : {Precision::fp32, Precision::bf16})
        for (int accum : {1, 3}) {
            const std::string what =
                std::string(enum_name(p)) + " grad_accum " + std::to_string(accum);
            expect_bitwise(run_steps(graph_config(false, p, accum), kSteps),
                           run_steps(graph_config(true, p, accum), kSteps), what);
        }
}

TEST_F(CudaGraph, EveryAdamWImplReplaysBitwise) {
    for (AdamWImpl impl : {AdamWImpl::unfused, AdamWImpl::multi_tensor}) {
        RunConfig eager = graph_config(false, Precision::fp32, 2), graph = eager;
        eager.optim.impl = graph.optim.impl = impl;
        graph.run.cuda_graph = true;
        expect_bitwise(run_steps(eager, kSteps), run_steps(graph, kSteps),
                       std::string(enum_name(impl)));
    }
}

TEST_F(CudaGraph, HostSyncNoneReplaysBitwise) {
    RunConfig eager = graph_config(false, Precision::fp32, 2);
    eager.run.host_sync = HostSync::none;
    RunConfig graph = eager;
    graph.run.cuda_graph = true;
    expect_bitwise(run_steps(eager, kSteps), run_steps(graph, kSteps), "host_sync none");
}

TEST_F(CudaGraph, ARewarmForwardBetweenReplaysChangesNothing) {
    for (Precision p : {Precision::fp32, Precision::bf16})
        expect_bitwise(run_steps(graph_config(false, p, 2), kSteps),
                       run_steps(graph_config(true, p, 2), kSteps, /*rewarm_at=*/4),
                       std::string("rewarm, ") + std::string(enum_name(p)));
}

TEST_F(CudaGraph, AReplayedStepIsOnePhaseAndWaitsAsAnEagerStep) {
    const RunResult eager = run_steps(graph_config(false, Precision::fp32, 2), 4);
    const RunResult graph = run_steps(graph_config(true, Precision::fp32, 2), 4);
    for (int i = 2; i < 4; ++i) {
        const PhaseTimes& t = graph.steps[i].times;
        EXPECT_GT(t[Phase::forward], 0.0) << "the replay";
        EXPECT_EQ(t[Phase::backward], 0.0) << "inside the graph";
        EXPECT_EQ(t[Phase::optimizer], 0.0) << "inside the graph";
        EXPECT_GT(t[Phase::h2d], 0.0) << "the batches are still copied outside the graph";
        EXPECT_EQ(graph.steps[i].host_syncs, eager.steps[i].host_syncs);
    }
}

TEST_F(CudaGraph, AHostWaitInsideACaptureIsRefusedByName) {
    TrainingSession s = cuda_session(graph_config(true, Precision::fp32, 1));
    s.step(0, false);
    Backend& b = s.backend();
    b.begin_capture("a test's work");
    try {
        b.synchronize();
        ADD_FAILURE() << "synchronize() inside a capture must throw";
    } catch (const BackendError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("synchronize() was called while a test's work was being captured"),
                  std::string::npos)
            << msg;
    }
    EXPECT_THROW(b.allocate(256, MemoryCategory::workspace), BackendError);
    b.abort_capture();
    EXPECT_FALSE(b.capturing());
    // The backend works on after the aborted capture, and the session captures its own.
    EXPECT_NO_THROW(s.step(1, false));
    EXPECT_NO_THROW(s.step(2, false));
}

}  // namespace
}  // namespace mt

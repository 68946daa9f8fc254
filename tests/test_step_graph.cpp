// run.cuda_graph's engine logic, on the CPU backend (tests/cuda/test_cuda_graph.cpp replays real
// graphs): AdamW reading its lr and bias corrections from device memory gives bitwise the
// by-value update over a schedule (the mechanism that keeps a replayed graph's lr from being
// frozen); a cuda_graph session's eager first step — each micro-batch in its own slot, the
// losses through fixed slots, the staged scalars — is bitwise a plain session's; its second step
// asks the backend for a capture, which the CPU backend refuses as a BackendError naming
// run.cuda_graph (never a silent eager fallback); and the session refuses what the spec refuses
// for a RunConfig built in code.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "engine/training_session.h"

namespace mt {
namespace {

RunConfig tiny_config(bool graph, int grad_accum) {
    RunConfig c;
    c.variant = graph ? "graph" : "eager";
    c.backend = BackendChoice::cpu;
    c.model.n_layer = 2;
    c.model.n_embd = 32;
    c.model.n_head = 2;
    c.model.max_seq_len = 16;
    c.model.vocab_size = 128;
    c.data.batch_size = 2;
    c.data.seq_len = 16;
    c.optim.lr = 1e-3f;
    c.optim.grad_clip = 1.0f;
    // A schedule, so a step that used another step's lr would differ.
    c.optim.schedule.kind = LRSchedule::Kind::cosine;
    c.optim.schedule.warmup_steps = 2;
    c.optim.schedule.decay_steps = 4;
    c.run.seed = 7;
    c.run.threads = 1;
    c.run.grad_accum = grad_accum;
    c.run.cuda_graph = graph;
    return c;
}

TrainingSession session_for(const RunConfig& c) {
    TrainingInputs in;
    in.track_memory = false;
    return TrainingSession(create_training_backend(c, BackendKind::cpu), c, std::move(in));
}

TEST(StepGraph, AdamWWithScalarsOnTheDeviceIsBitwiseTheByValueUpdate) {
    for (AdamWImpl impl : {AdamWImpl::unfused, AdamWImpl::multi_tensor, AdamWImpl::fused}) {
        RunConfig c = tiny_config(false, 1);
        c.optim.impl = impl;
        TrainingSession by_value = session_for(c);
        TrainingSession on_device = session_for(c);
        on_device.optimizer().keep_scalars_on_device();
        for (int i = 0; i < 7; ++i) {  // warm-up, decay and the floor
            const StepRecord a = by_value.step(i, false), b = on_device.step(i, false);
            EXPECT_EQ(a.lr, b.lr) << "step " << i;
            EXPECT_EQ(a.loss, b.loss) << enum_name(impl) << " step " << i;
        }
        EXPECT_EQ(by_value.model().get_params(), on_device.model().get_params()) << enum_name(impl);
        EXPECT_EQ(by_value.optimizer().get_m(), on_device.optimizer().get_m());
        EXPECT_EQ(by_value.optimizer().get_v(), on_device.optimizer().get_v());
        EXPECT_EQ(on_device.optimizer().steps_taken(), 7);
    }
}

TEST(StepGraph, TheEagerFirstStepIsBitwiseAPlainSessionsStep) {
    for (int accum : {1, 3}) {
        TrainingSession plain = session_for(tiny_config(false, accum));
        TrainingSession graph = session_for(tiny_config(true, accum));
        const StepRecord a = plain.step(0, true), b = graph.step(0, true);
        EXPECT_EQ(a.loss, b.loss) << "accum " << accum;
        EXPECT_EQ(a.grad_norm, b.grad_norm) << "accum " << accum;
        EXPECT_EQ(a.lr, b.lr);
        EXPECT_EQ(a.host_syncs, b.host_syncs) << "the same waits: the losses' one read-back";
        EXPECT_EQ(plain.model().get_params(), graph.model().get_params()) << "accum " << accum;
        EXPECT_GT(b.times[Phase::backward], 0.0) << "the eager step has every phase";
        EXPECT_GT(b.times[Phase::optimizer], 0.0);
    }
}

TEST(StepGraph, TheCaptureOnTheCpuBackendIsAnErrorNamingTheKnob) {
    TrainingSession s = session_for(tiny_config(true, 2));
    s.step(0, true);
    try {
        s.step(1, true);
        FAIL() << "the CPU backend has no graphs: the capture must fail, not run eagerly";
    } catch (const BackendError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("run.cuda_graph: capturing the training step failed"), std::string::npos)
            << msg;
        EXPECT_NE(msg.find("the cpu backend cannot capture a graph"), std::string::npos) << msg;
        EXPECT_NE(msg.find("run.cuda_graph needs backend: cuda"), std::string::npos) << msg;
    }
    EXPECT_FALSE(s.backend().capturing());
    // The optimizer did not count the failed step.
    EXPECT_EQ(s.optimizer().steps_taken(), 1);
}

TEST(StepGraph, TheSessionRefusesWhatMakesTheStepUncapturable) {
    auto refused = [](RunConfig c, const std::string& part) {
        try {
            session_for(c);
        } catch (const std::invalid_argument& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("run.cuda_graph: true"), std::string::npos) << msg;
            EXPECT_NE(msg.find(part), std::string::npos) << msg;
            return;
        }
        ADD_FAILURE() << "not refused: " << part;
    };
    RunConfig c = tiny_config(true, 1);
    c.run.host_sync = HostSync::every_op;
    refused(c, "run.host_sync: every_op");
    c = tiny_config(true, 1);
    c.run.host_sync = HostSync::loss_every_step;
    refused(c, "run.host_sync: loss_every_step");
    c = tiny_config(true, 1);
    c.data.seq_len_jitter = 0.5f;
    refused(c, "data.seq_len_jitter");
    c = tiny_config(true, 1);
    c.profile.kernels = true;
    refused(c, "profile.kernels");
}

}  // namespace
}  // namespace mt

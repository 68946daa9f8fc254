// The loop around the training step (engine/step_loop.h): its callbacks see every step in order
// with the losses a bare TrainingSession gives bit for bit; a non-finite loss or gradient norm
// stops the loop at that step with the message naming the step, warm-up and phase; a stop
// signal (the test hook, or a real SIGTERM) ends it after the step that saw it; under
// run.host_sync none the windows are read back in order, at the end of the warm-up, of a full
// window, of the steps and on a stop signal. On the tiny CPU model of tests/test_training.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "engine/signals.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// 2 layers, 32 channels, one thread, clipping on (so every step has a gradient norm).
RunConfig tiny_config(HostSync host_sync = HostSync::step) {
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
    c.optim.grad_clip = 1.0f;
    c.run.seed = 7;
    c.run.threads = 1;
    c.run.host_sync = host_sync;
    c.profile.trace = false;
    return c;
}

TrainingSession tiny_session(const RunConfig& c) {
    TrainingInputs in;
    in.track_memory = false;
    return TrainingSession(create_training_backend(c, BackendKind::cpu), c, std::move(in));
}

// What a loop's callbacks saw.
struct Seen {
    std::vector<int> before, gradients, on_step, after_step;
    std::vector<bool> warmup;
    std::vector<double> losses;
    std::vector<int> host_syncs;  // per on_step
    std::vector<int> signals;     // per after_step
    // Begun and read-back steps in the order they happened: "b0" (before_step 0), "s0" (on_step).
    std::vector<std::string> order;
};

StepLoopOptions recording(Seen& seen, int warmup_steps = 0) {
    StepLoopOptions o;
    o.warmup_steps = warmup_steps;
    o.before_step = [&seen](int s) {
        seen.before.push_back(s);
        seen.order.push_back("b" + std::to_string(s));
    };
    o.gradients_ready = [&seen](int s, GPT&) { seen.gradients.push_back(s); };
    o.on_step = [&seen](const TrainingSession::CompletedStep& done) {
        seen.on_step.push_back(done.record.step);
        seen.order.push_back("s" + std::to_string(done.record.step));
        seen.warmup.push_back(done.record.warmup);
        seen.losses.push_back(done.record.loss);
        seen.host_syncs.push_back(done.record.host_syncs);
    };
    o.after_step = [&seen](const StepRecord& rec, int sig) {
        seen.after_step.push_back(rec.step);
        seen.signals.push_back(sig);
    };
    return o;
}

class StepLoopTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const fs::path cache =
            fs::temp_directory_path() / ("mt_test_step_loop_cache_" + std::to_string(::getpid()));
        ::setenv("MICROTRAIN_CACHE_DIR", cache.c_str(), 1);
        StopSignals clear(false);  // no stop request left over from an earlier test
    }
};

TEST_F(StepLoopTest, CallbacksSeeEveryStepInOrderWithTheSessionsLossesBitwise) {
    const RunConfig c = tiny_config();
    TrainingSession session = tiny_session(c);
    Seen seen;
    StepLoop loop(session, recording(seen, /*warmup_steps=*/2));
    const LoopOutcome outcome = loop.run(0, 5);
    EXPECT_EQ(outcome.end, LoopOutcome::End::completed);
    EXPECT_EQ(outcome.step, 4);
    EXPECT_EQ(loop.step(), 5);
    const std::vector<int> all = {0, 1, 2, 3, 4};
    EXPECT_EQ(seen.before, all);
    EXPECT_EQ(seen.gradients, all);
    EXPECT_EQ(seen.on_step, all);
    EXPECT_EQ(seen.after_step, all);
    EXPECT_EQ(seen.warmup, (std::vector<bool>{true, true, false, false, false}));
    EXPECT_EQ(seen.signals, (std::vector<int>(5, 0)));
    // Each step is read back before the next one begins.
    EXPECT_EQ(seen.order, (std::vector<std::string>{"b0", "s0", "b1", "s1", "b2", "s2", "b3", "s3",
                                                    "b4", "s4"}));

    TrainingSession bare = tiny_session(c);
    for (int s = 0; s < 5; ++s) EXPECT_EQ(bare.step(s, s < 2).loss, seen.losses[s]) << s;
}

TEST_F(StepLoopTest, RunsTheStepsFromFirstToLastAsAResumedRunDoes) {
    TrainingSession session = tiny_session(tiny_config());
    Seen seen;
    const LoopOutcome outcome = StepLoop(session, recording(seen)).run(3, 6);
    EXPECT_EQ(outcome.end, LoopOutcome::End::completed);
    EXPECT_EQ(seen.on_step, (std::vector<int>{3, 4, 5}));
    Seen none;
    EXPECT_EQ(StepLoop(session, recording(none)).run(6, 6).end, LoopOutcome::End::completed);
    EXPECT_TRUE(none.before.empty());
}

TEST_F(StepLoopTest, ANonFiniteLossStopsAtThatStepNamingStepWarmUpAndPhase) {
    TrainingSession session = tiny_session(tiny_config());
    Seen seen;
    StepLoopOptions o = recording(seen, /*warmup_steps=*/3);
    o.inject_nan_at_step = 2;
    const LoopOutcome outcome = StepLoop(session, std::move(o)).run(0, 6);
    ASSERT_EQ(outcome.end, LoopOutcome::End::non_finite);
    EXPECT_EQ(outcome.step, 2);
    EXPECT_TRUE(outcome.non_finite.in_loss);
    EXPECT_TRUE(outcome.non_finite.warmup);
    EXPECT_EQ(outcome.non_finite.phase, "forward");
    EXPECT_EQ(
        outcome.non_finite.message,
        "variant 'tiny': non-finite loss (nan) at step 2 (warm-up; steps[2] in results.json), "
        "produced in the forward "
        "phase and detected at the sync read-back; this variant stopped there (lower "
        "optim.lr or check the data)");
    // The step that stopped the loop was seen (recorded), never passed as a good step.
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(seen.after_step, (std::vector<int>{0, 1}));
    EXPECT_EQ(seen.before, (std::vector<int>{0, 1, 2}));
}

// Issue #25 item 14: the message numbers the step as the progress line does (from 0: the
// progress line's "step 3 (4 of 6)" is step 3 here too, and steps[3] in results.json), and a
// NaN from weight_decay 1e30 is not hinted as "lower optim.lr".
TEST_F(StepLoopTest, ANonFiniteMessageCountsLikeTheProgressLineAndBlamesTheWeightDecay) {
    RunConfig c = tiny_config();
    c.optim.weight_decay = 1e30f;
    TrainingSession session = tiny_session(c);
    Seen seen;
    const LoopOutcome outcome = StepLoop(session, recording(seen)).run(0, 6);
    ASSERT_EQ(outcome.end, LoopOutcome::End::non_finite);
    const std::string m = outcome.non_finite.message;
    const std::string n = std::to_string(outcome.step);
    EXPECT_NE(m.find("at step " + n + " (steps[" + n + "] in results.json)"), std::string::npos)
        << m;
    EXPECT_NE(m.find("lower optim.weight_decay: lr x weight_decay = "), std::string::npos) << m;
    EXPECT_EQ(m.find("lower optim.lr"), std::string::npos) << m;
}

TEST_F(StepLoopTest, ANonFiniteGradientNormStopsInTheBackwardPhase) {
    TrainingSession session = tiny_session(tiny_config());
    Seen seen;
    StepLoopOptions o = recording(seen);
    // A NaN in the complete gradients of step 1: its loss is finite, its norm is not.
    o.gradients_ready = [&session](int s, GPT& model) {
        if (s != 1) return;
        const float nan = std::numeric_limits<float>::quiet_NaN();
        session.backend().copy_to_device(model.grads(), &nan, sizeof nan);
    };
    const LoopOutcome outcome = StepLoop(session, std::move(o)).run(0, 4);
    ASSERT_EQ(outcome.end, LoopOutcome::End::non_finite);
    EXPECT_EQ(outcome.step, 1);
    EXPECT_FALSE(outcome.non_finite.in_loss);
    EXPECT_FALSE(outcome.non_finite.warmup);
    EXPECT_EQ(outcome.non_finite.phase, "backward");
    EXPECT_EQ(
        outcome.non_finite.message,
        "variant 'tiny': non-finite gradient norm (nan) at step 1 (steps[1] in results.json), "
        "produced in the backward "
        "phase and detected at the sync read-back; this variant stopped there (enable "
        "optim.grad_clip or lower optim.lr)");
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1}));
    EXPECT_EQ(seen.after_step, (std::vector<int>{0}));
}

TEST_F(StepLoopTest, TheInterruptHookStopsAfterThatStep) {
    TrainingSession session = tiny_session(tiny_config());
    Seen seen;
    StepLoopOptions o = recording(seen);
    o.interrupt_at_step = 1;
    StepLoop loop(session, std::move(o));
    const LoopOutcome outcome = loop.run(0, 5);
    ASSERT_EQ(outcome.end, LoopOutcome::End::interrupted);
    EXPECT_EQ(outcome.step, 1);
    EXPECT_EQ(outcome.signal, SIGINT);
    EXPECT_EQ(loop.step(), 1);
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1}));
    // after_step sees the signal with the step it ends the loop after (train checkpoints there).
    EXPECT_EQ(seen.after_step, (std::vector<int>{0, 1}));
    EXPECT_EQ(seen.signals, (std::vector<int>{0, SIGINT}));
}

TEST_F(StepLoopTest, ARealStopSignalEndsTheLoopAfterTheStepThatSawIt) {
    TrainingSession session = tiny_session(tiny_config());
    Seen seen;
    StepLoopOptions o = recording(seen);
    o.before_step = [&seen](int s) {
        seen.before.push_back(s);
        if (s == 2) std::raise(SIGTERM);  // arrives while step 2 runs
    };
    LoopOutcome outcome;
    {
        StopSignals signals;
        outcome = StepLoop(session, std::move(o)).run(0, 6);
    }
    StopSignals clear(false);
    ASSERT_EQ(outcome.end, LoopOutcome::End::interrupted);
    EXPECT_EQ(outcome.step, 2);
    EXPECT_EQ(outcome.signal, SIGTERM);
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(seen.signals, (std::vector<int>{0, 0, SIGTERM}));
}

// none: a window is read back with one wait (2 host syncs: synchronize + copy), counted in its
// last step; the windows end at the end of the warm-up and of the steps.
TEST_F(StepLoopTest, HostSyncNoneReadsTheWindowsBackInOrder) {
    TrainingSession session = tiny_session(tiny_config(HostSync::none));
    Seen seen;
    const LoopOutcome outcome = StepLoop(session, recording(seen, /*warmup_steps=*/2)).run(0, 5);
    EXPECT_EQ(outcome.end, LoopOutcome::End::completed);
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1, 2, 3, 4}));
    EXPECT_EQ(seen.host_syncs, (std::vector<int>{0, 2, 0, 0, 2}));
    // The warm-up's window (steps 0-1) is read back before step 2 begins; the measured window's
    // steps all run before it is read back.
    EXPECT_EQ(seen.order, (std::vector<std::string>{"b0", "b1", "s0", "s1", "b2", "b3", "b4", "s2",
                                                    "s3", "s4"}));

    // The losses are the ones a session that waits every step gives, bit for bit.
    TrainingSession waits = tiny_session(tiny_config(HostSync::step));
    for (int s = 0; s < 5; ++s) EXPECT_EQ(waits.step(s, s < 2).loss, seen.losses[s]) << s;
}

TEST_F(StepLoopTest, HostSyncNoneEndsAWindowWhenItIsFull) {
    TrainingSession session = tiny_session(tiny_config(HostSync::none));
    Seen seen;
    const int n = static_cast<int>(TrainingSession::kHostSyncWindow) + 3;
    ASSERT_EQ(StepLoop(session, recording(seen)).run(0, n).end, LoopOutcome::End::completed);
    ASSERT_EQ(static_cast<int>(seen.on_step.size()), n);
    for (int s = 0; s < n; ++s) {
        EXPECT_EQ(seen.on_step[s], s);
        const bool last_of_window =
            s + 1 == static_cast<int>(TrainingSession::kHostSyncWindow) || s + 1 == n;
        EXPECT_EQ(seen.host_syncs[s], last_of_window ? 2 : 0) << "step " << s;
    }
}

TEST_F(StepLoopTest, HostSyncNoneEndsTheWindowAtAStopSignal) {
    TrainingSession session = tiny_session(tiny_config(HostSync::none));
    Seen seen;
    StepLoopOptions o = recording(seen);
    o.interrupt_at_step = 3;
    const LoopOutcome outcome = StepLoop(session, std::move(o)).run(0, 8);
    ASSERT_EQ(outcome.end, LoopOutcome::End::interrupted);
    EXPECT_EQ(outcome.step, 3);
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(seen.host_syncs, (std::vector<int>{0, 0, 0, 2}));
    EXPECT_EQ(seen.signals, (std::vector<int>{0, 0, 0, SIGINT}));
}

// none: a NaN in the middle of a window stops the loop there; the window's later steps ran on
// the device but are never handed to the callbacks.
TEST_F(StepLoopTest, HostSyncNoneDropsTheStepsAfterANonFiniteOneInItsWindow) {
    TrainingSession session = tiny_session(tiny_config(HostSync::none));
    Seen seen;
    StepLoopOptions o = recording(seen);
    o.inject_nan_at_step = 1;
    const LoopOutcome outcome = StepLoop(session, std::move(o)).run(0, 4);
    ASSERT_EQ(outcome.end, LoopOutcome::End::non_finite);
    EXPECT_EQ(outcome.step, 1);
    EXPECT_EQ(seen.before, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(seen.on_step, (std::vector<int>{0, 1}));
    EXPECT_EQ(seen.after_step, (std::vector<int>{0}));
}

}  // namespace
}  // namespace mt

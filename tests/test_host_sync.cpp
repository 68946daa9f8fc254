// run.host_sync (engine/training_session.h): where a training step makes the host wait for the
// device. Pinned here without any timing: the number of host synchronisation points each setting
// makes per step (counted by the backend's fronts, Backend::host_sync_stats), the loss and grad
// norm bitwise the same under all four settings, `none`'s windowed read-back through the runner
// (every step's record, a stop signal and a non-finite loss), and the refusals of what `none`
// cannot live with.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/training_session.h"
#include "experiment/runner.h"
#include "experiment/spec.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

constexpr HostSync kAllSettings[] = {HostSync::step, HostSync::loss_every_step, HostSync::every_op,
                                     HostSync::none};

// The tiny model of tests/test_training.cpp: 2 layers, 32 channels, one thread, clipping on.
RunConfig tiny_config(HostSync mode, int grad_accum) {
    RunConfig c;
    c.variant = std::string("sync-") + std::string(enum_name(mode));
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
    c.run.warmup_steps = 2;
    c.run.measure_steps = 3;
    c.run.threads = 1;
    c.run.grad_accum = grad_accum;
    c.run.host_sync = mode;
    c.profile.trace = true;
    c.profile.trace_steps = 2;
    return c;
}

TrainingSession session_for(const RunConfig& c) {
    TrainingInputs in;
    in.track_memory = false;
    return TrainingSession(create_training_backend(c, BackendKind::cpu), c, std::move(in));
}

// Counts the ops the backend runs (Backend::run reports each to its observer).
struct OpCounter final : OpObserver {
    int ops = 0;
    void op_begin(const OpRecord&) override { ++ops; }
    void op_end(const OpRecord&) override {}
};

class HostSyncTest : public ::testing::Test {
  protected:
    void SetUp() override {
        // The runner probes the machine's peaks once per process, never in the user's ~/.cache.
        const fs::path cache =
            fs::temp_directory_path() / ("mt_test_host_sync_cache_" + std::to_string(::getpid()));
        ::setenv("MICROTRAIN_CACHE_DIR", cache.c_str(), 1);
    }
};

ExperimentRun run_all_settings(int grad_accum, RunnerOptions opt = {}, int rounds = 5) {
    ExperimentSpec spec;
    spec.name = "host-sync";
    for (HostSync m : kAllSettings) spec.variants.push_back(tiny_config(m, grad_accum));
    for (RunConfig& c : spec.variants) c.run.rounds = rounds;
    spec.baseline = spec.variants.front().variant;
    opt.out = nullptr;
    opt.handle_sigint = false;
    return run_experiment(spec, opt);
}

TEST(BackendHostSync, CopyToHostAndSynchronizeAreEachCountedOnce) {
    auto backend = create_backend(BackendKind::cpu);
    const Backend::HostSyncStats before = backend->host_sync_stats();
    DeviceBuffer buf(*backend, sizeof(float), MemoryCategory::workspace);
    float x = 0;
    backend->copy_to_host(&x, buf.get(), sizeof x);
    backend->synchronize();
    backend->memset_zero(buf.get(), sizeof(float));  // not a host wait
    EXPECT_EQ(backend->host_sync_stats().count - before.count, 2);
}

TEST(BackendHostSync, SyncAfterEveryOpAddsOneHostSyncPerOp) {
    auto backend = create_backend(BackendKind::cpu);
    DeviceBuffer buf(*backend, 64, MemoryCategory::workspace);
    backend->set_sync_after_every_op(true);
    const long long before = backend->host_sync_stats().count;
    for (int i = 0; i < 5; ++i) backend->run(op::FillZero{.dst = buf.get(), .bytes = 64});
    EXPECT_EQ(backend->host_sync_stats().count - before, 5);
    backend->set_sync_after_every_op(false);
    backend->run(op::FillZero{.dst = buf.get(), .bytes = 64});
    EXPECT_EQ(backend->host_sync_stats().count - before, 5);
}

// step: the loss read-back (one for all micro-steps), the grad norm's, the synchronize.
// loss_every_step: one loss read per micro-step instead of the one, plus the same two.
TEST_F(HostSyncTest, StepAndLossEveryStepWaitAsOftenAsDocumented) {
    for (int accum : {1, 3}) {
        TrainingSession step = session_for(tiny_config(HostSync::step, accum));
        TrainingSession loss = session_for(tiny_config(HostSync::loss_every_step, accum));
        for (int s = 0; s < 2; ++s) {
            EXPECT_EQ(step.step(s, false).host_syncs, 3) << "accum " << accum;
            EXPECT_EQ(loss.step(s, false).host_syncs, accum + 2) << "accum " << accum;
        }
    }
}

TEST_F(HostSyncTest, LossEveryStepTimesOneSyncIntervalPerMicroStepAndOneAtTheEnd) {
    TrainingSession session = session_for(tiny_config(HostSync::loss_every_step, 2));
    session.step(0, false);
    int sync_intervals = 0;
    for (const PhaseInterval& iv : session.timer().last_intervals())
        sync_intervals += iv.phase == Phase::sync ? 1 : 0;
    EXPECT_EQ(sync_intervals, 3);
}

TEST_F(HostSyncTest, EveryOpWaitsOncePerOpOnTopOfTheStepsOwnWaits) {
    TrainingSession session = session_for(tiny_config(HostSync::every_op, 2));
    OpCounter counter;
    session.backend().set_op_observer(&counter);
    const StepRecord rec = session.step(0, false);
    session.backend().set_op_observer(nullptr);
    ASSERT_GT(counter.ops, 50);  // 2 micro-steps of a 2-layer model, and AdamW
    EXPECT_EQ(rec.host_syncs, counter.ops + 3);
}

// none: no wait inside a step; the window's read-back (synchronize + one copy) is counted in
// its last step. step() under none is a window of one step.
TEST_F(HostSyncTest, NoneWaitsOnlyWhenTheWindowIsDrained) {
    TrainingSession session = session_for(tiny_config(HostSync::none, 2));
    for (int s = 0; s < 4; ++s) session.enqueue_step(s, false);
    const std::vector<TrainingSession::CompletedStep> done = session.drain();
    ASSERT_EQ(done.size(), 4u);
    for (int s = 0; s < 3; ++s) EXPECT_EQ(done[s].record.host_syncs, 0) << "step " << s;
    EXPECT_EQ(done[3].record.host_syncs, 2);
    for (int s = 0; s < 4; ++s) {
        EXPECT_EQ(done[s].record.step, s);
        EXPECT_FALSE(done[s].intervals.empty());  // every step keeps its phases for the trace
    }
    EXPECT_TRUE(session.drain().empty());
    EXPECT_EQ(session.step(4, false).host_syncs, 2);
}

TEST_F(HostSyncTest, NoneRefusesMoreThanOneWindowOfEnqueuedSteps) {
    TrainingSession session = session_for(tiny_config(HostSync::none, 1));
    for (size_t s = 0; s < TrainingSession::kHostSyncWindow; ++s)
        session.enqueue_step(static_cast<int>(s), false);
    EXPECT_TRUE(session.drain_due());
    EXPECT_THROW(session.enqueue_step(99, false), std::logic_error);
    EXPECT_EQ(session.drain().size(), TrainingSession::kHostSyncWindow);
}

// The same kernels on the same data whatever the host does: every step's loss and grad norm are
// bitwise equal under all four settings, with and without accumulation (through the runner, so
// `none` goes through its windows: warm-up, measured steps).
TEST_F(HostSyncTest, LossAndGradNormAreBitwiseTheSameUnderEverySetting) {
    for (int accum : {1, 2}) {
        const ExperimentRun ex = run_all_settings(accum);
        ASSERT_EQ(ex.results.variants.size(), 4u);
        const std::vector<StepRow>& base = ex.results.variants[0].steps;
        ASSERT_EQ(base.size(), 5u);
        for (const VariantResult& r : ex.results.variants) {
            ASSERT_EQ(r.status, RunStatus::ok) << r.name << ": " << r.message;
            ASSERT_EQ(r.steps.size(), base.size()) << r.name;
            for (size_t s = 0; s < base.size(); ++s) {
                EXPECT_EQ(r.steps[s].step, static_cast<int>(s));
                EXPECT_EQ(r.steps[s].loss, base[s].loss) << r.name << " step " << s;
                EXPECT_EQ(r.steps[s].grad_norm, base[s].grad_norm) << r.name << " step " << s;
                EXPECT_GT(r.steps[s].grad_norm, 0.0);
            }
            EXPECT_EQ(r.trace.size(), 2u) << r.name;
        }
    }
}

TEST_F(HostSyncTest, NoneCountsItsReadBacksInTheLastStepOfEachWindow) {
    // One round: the measured steps are one window (under rounds each slice is its own).
    const ExperimentRun ex = run_all_settings(1, {}, /*rounds=*/1);
    const VariantResult& none = ex.results.variants[3];
    ASSERT_EQ(none.config_value("run.host_sync"), "none");
    // Warm-up window: steps 0-1, measured window: steps 2-4.
    const std::vector<int> expected = {0, 2, 0, 0, 2};
    for (size_t s = 0; s < expected.size(); ++s)
        EXPECT_EQ(none.steps[s].host_syncs, expected[s]) << "step " << s;
}

TEST_F(HostSyncTest, NoneStopsAtAStopSignalWithEveryStepItRan) {
    RunnerOptions opt;
    opt.inject_variant = "sync-none";
    opt.interrupt_at_step = 3;
    const ExperimentRun ex = run_all_settings(1, opt);
    const VariantResult& none = ex.results.variants[3];
    EXPECT_EQ(none.status, RunStatus::interrupted);
    ASSERT_EQ(none.steps.size(), 4u);
    EXPECT_EQ(none.steps.back().step, 3);
    for (const StepRow& s : none.steps) EXPECT_TRUE(std::isfinite(s.loss));
}

TEST_F(HostSyncTest, NoneFailsAtTheFirstNonFiniteLossOfAWindowAndDropsTheRest) {
    RunnerOptions opt;
    opt.inject_variant = "sync-none";
    opt.inject_nan_at_step = 3;
    const ExperimentRun ex = run_all_settings(1, opt);
    const VariantResult& none = ex.results.variants[3];
    EXPECT_EQ(none.status, RunStatus::failed);
    EXPECT_EQ(none.failed_step, 3);
    EXPECT_EQ(none.steps.size(), 4u);
}

TEST_F(HostSyncTest, NoneRefusesTheProfilerAndPinnedBatchesInASessionBuiltInCode) {
    for (bool pinned : {false, true}) {
        RunConfig c = tiny_config(HostSync::none, 1);
        c.profile.kernels = !pinned;
        c.data.pin_memory = pinned;
        try {
            session_for(c);
            FAIL() << "accepted run.host_sync none with " << (pinned ? "pinned" : "profile");
        } catch (const std::invalid_argument& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("run.host_sync: none"), std::string::npos) << m;
            EXPECT_NE(m.find(pinned ? "data.pin_memory" : "profile.kernels"), std::string::npos)
                << m;
        }
    }
}

// ---- the spec: the key, its values, and what none cannot be combined with ----

class HostSyncSpecTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() / ("mt_host_sync_spec_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    // Loads `text` and returns the SpecError message ("" when it loaded).
    std::string error_of(const std::string& text) {
        const fs::path p = dir_ / "exp.yaml";
        std::ofstream(p) << text;
        try {
            load_experiment(p.string(), {});
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    fs::path dir_;
};

TEST_F(HostSyncSpecTest, EverySettingLoadsAndStepIsTheDefault) {
    const fs::path p = dir_ / "ok.yaml";
    std::ofstream(p) << "name: x\nvariants:\n  - name: a\n  - name: b\n"
                        "    set: { run.host_sync: loss_every_step }\n"
                        "  - name: c\n    set: { run.host_sync: every_op }\n"
                        "  - name: d\n    set: { run.host_sync: none }\n";
    const ExperimentSpec spec = load_experiment(p.string(), {});
    ASSERT_EQ(spec.variants.size(), 4u);
    EXPECT_EQ(spec.variants[0].run.host_sync, HostSync::step);
    EXPECT_EQ(spec.variants[1].run.host_sync, HostSync::loss_every_step);
    EXPECT_EQ(spec.variants[2].run.host_sync, HostSync::every_op);
    EXPECT_EQ(spec.variants[3].run.host_sync, HostSync::none);
    EXPECT_EQ(spec.variants[3].changed.at("run.host_sync"), "none");
}

TEST_F(HostSyncSpecTest, AnUnknownSettingIsRefusedWithTheChoices) {
    const std::string e = error_of("name: x\nrun: { host_sync: sometimes }\n");
    EXPECT_NE(e.find("run.host_sync"), std::string::npos) << e;
    EXPECT_NE(e.find("sometimes"), std::string::npos) << e;
    for (const char* choice : {"step", "every_op", "loss_every_step", "none"})
        EXPECT_NE(e.find(choice), std::string::npos) << choice << " in: " << e;
}

TEST_F(HostSyncSpecTest, NoneWithTheProfilerOrPinnedBatchesIsRefusedNamingBothKeys) {
    const std::string prof = error_of(
        "name: x\nrun: { host_sync: none }\nprofile: { kernels: true }\nvariants:\n  - name: a\n");
    EXPECT_NE(prof.find("run.host_sync"), std::string::npos) << prof;
    EXPECT_NE(prof.find("profile.kernels"), std::string::npos) << prof;
    const std::string pin = error_of(
        "name: x\ndata: { pin_memory: true }\nvariants:\n  - name: a\n"
        "  - name: b\n    set: { run.host_sync: none }\n");
    EXPECT_NE(pin.find("data.pin_memory"), std::string::npos) << pin;
    EXPECT_NE(pin.find("exp.yaml:6:"), std::string::npos) << pin;  // the variant's line
    EXPECT_EQ(error_of("name: x\nrun: { host_sync: none }\nprofile: { kernels: false }\n"), "");
}

}  // namespace
}  // namespace mt

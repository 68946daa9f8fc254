// run.cuda_graph's engine logic, on the CPU backend (tests/cuda/test_cuda_graph.cpp replays real
// graphs): a RecordingBackend (the CPU backend with recorded op lists for graphs) replays the
// captured step bitwise like eager steps under an LR schedule, grad_accum 1 and 3, host_sync none
// and a rewarm between replays; AdamW reading its lr and bias corrections from device memory gives
// bitwise the by-value update over a schedule (the mechanism that keeps a replayed graph's lr from
// being frozen); a cuda_graph session's eager first step — each micro-batch in its own slot, the
// losses through fixed slots, the staged scalars — is bitwise a plain session's; its second step
// asks the backend for a capture, which the CPU backend refuses as a BackendError naming
// run.cuda_graph (never a silent eager fallback); and the session refuses what the spec refuses
// for a RunConfig built in code.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
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

// A CPU backend with graphs, standing in for CUDA's capture and replay: between begin_capture and
// end_capture every op, copy_device and memset_zero is recorded (a copy of the op struct: its
// pointers and by-value arguments frozen, as a captured kernel's are) instead of run, and a
// replay runs the recorded list. Like stream capture it refuses an h2d copy inside a capture
// (the Backend fronts already refuse the host waits). Everything else is the wrapped CPU
// backend's. So the engine's replay path — slots, staged scalars, fixed loss slots, the host
// bookkeeping after a replay — runs here; a frozen per-step value would show as a difference.
class RecordingBackend final : public Backend {
  public:
    explicit RecordingBackend(std::unique_ptr<Backend> inner)
        : Backend(inner->options()), inner_(std::move(inner)) {
#define MT_BIND_RECORDING(table_name, Op)                                                     \
    kernels_.table_name = [](Backend& b, const op::Op& a) {                                   \
        auto& self = static_cast<RecordingBackend&>(b);                                       \
        self.run_or_record([&self, a] { self.inner_kernels().table_name(*self.inner_, a); }); \
    };
        MT_OPS(MT_BIND_RECORDING)
#undef MT_BIND_RECORDING
    }
    int replays = 0, recorded_ops = 0;

    BackendKind kind() const override {
        return inner_->kind();
    }
    std::string device_name() const override {
        return "recording " + inner_->device_name();
    }
    void* allocate(size_t bytes, MemoryCategory c) override {
        if (capturing()) throw BackendError("allocate inside a capture");
        return inner_->allocate(bytes, c);
    }
    void deallocate(void* p) override {
        inner_->deallocate(p);
    }
    void* allocate_host(size_t bytes, bool pinned) override {
        return inner_->allocate_host(bytes, pinned);
    }
    void deallocate_host(void* p) override {
        inner_->deallocate_host(p);
    }
    DeviceMemoryInfo device_memory_info() const override {
        return inner_->device_memory_info();
    }
    void copy_to_device(void* dst, const void* src, size_t bytes) override {
        if (capturing()) throw BackendError("copy_to_device inside a capture");
        inner_->copy_to_device(dst, src, bytes);
    }
    void copy_device(void* dst, const void* src, size_t bytes) override {
        run_or_record([=, this] { inner_->copy_device(dst, src, bytes); });
    }
    void memset_zero(void* dst, size_t bytes) override {
        run_or_record([=, this] { inner_->memset_zero(dst, bytes); });
    }
    std::unique_ptr<TimingEvent> create_event() override {
        return inner_->create_event();
    }
    std::unique_ptr<StreamEvent> create_stream_event() override {
        return inner_->create_stream_event();
    }
    void record_event(StreamEvent& e, Stream s) override {
        inner_->record_event(e, s);
    }
    void wait_event(Stream s, const StreamEvent& e) override {
        inner_->wait_event(s, e);
    }
    void wait_event_on_host(const StreamEvent& e) override {
        inner_->wait_event_on_host(e);
    }
    void copy_async(void* dst, const void* src, size_t bytes, CopyDirection d, Stream s) override {
        inner_->copy_async(dst, src, bytes, d, s);
    }
    MatmulImpl matmul_impl() const override {
        return inner_->matmul_impl();
    }
    void reserve_attention_workspace(AttentionImpl impl, int B, int T, int C, int NH) override {
        inner_->reserve_attention_workspace(impl, B, T, C, NH);
    }

  protected:
    void copy_to_host_blocking(void* dst, const void* src, size_t bytes) override {
        inner_->copy_to_host(dst, src, bytes);
    }
    void synchronize_device() override {
        inner_->synchronize();
    }
    void begin_capture_device() override {
        recording_.emplace();
    }
    std::unique_ptr<StepGraph> end_capture_device() override {
        auto graph = std::make_unique<Graph>(*this, std::move(*recording_));
        recording_.reset();
        return graph;
    }
    void abort_capture_device() noexcept override {
        recording_.reset();
    }

  private:
    struct Graph final : StepGraph {
        Graph(RecordingBackend& b, std::vector<std::function<void()>> w)
            : b(b), work(std::move(w)) {}
        void replay() override {
            ++b.replays;
            for (const auto& f : work) f();
        }
        RecordingBackend& b;
        std::vector<std::function<void()>> work;
    };
    KernelTable& inner_kernels() {
        return inner_->kernels();
    }
    void run_or_record(std::function<void()> work) {
        if (recording_) {
            ++recorded_ops;
            recording_->push_back(std::move(work));
        } else {
            work();
        }
    }
    std::unique_ptr<Backend> inner_;
    std::optional<std::vector<std::function<void()>>> recording_;
};

struct Recorded {
    std::vector<StepRecord> steps;
    std::vector<float> params, m, v;
    int replays = 0, recorded_ops = 0;
};

// `n` steps of `c` on a RecordingBackend (none: one window); `rewarm_at`: an untimed forward
// before that step, as the rounds do between slices.
Recorded run_recorded(const RunConfig& c, int n, int rewarm_at = -1) {
    TrainingInputs in;
    in.track_memory = false;
    auto backend = std::make_unique<RecordingBackend>(create_training_backend(c, BackendKind::cpu));
    RecordingBackend* rb = backend.get();
    TrainingSession s(std::move(backend), c, std::move(in));
    Recorded r;
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
    r.replays = rb->replays;
    r.recorded_ops = rb->recorded_ops;
    return r;
}

void expect_bitwise(const Recorded& eager, const Recorded& graph, const std::string& what) {
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

// The engine's replay path on a backend with (recorded) graphs: 7 steps — eager, capture, 5
// replays through a cosine schedule's warm-up, decay and floor — bitwise 7 eager steps.
TEST(StepGraph, ReplaysOfARecordedStepAreBitwiseEagerSteps) {
    constexpr int kSteps = 7;
    for (int accum : {1, 3}) {
        const std::string what = "grad_accum " + std::to_string(accum);
        const Recorded eager = run_recorded(tiny_config(false, accum), kSteps);
        const Recorded graph = run_recorded(tiny_config(true, accum), kSteps);
        expect_bitwise(eager, graph, what);
        EXPECT_EQ(eager.replays, 0);
        EXPECT_EQ(graph.replays, kSteps - 1) << "captured at step 1, replayed from step 1 on";
        EXPECT_GT(graph.recorded_ops, 10) << "forward, backward and optimizer were recorded";
        for (int i = 2; i < kSteps; ++i) {
            EXPECT_GT(graph.steps[i].times[Phase::forward], 0.0) << "the replay";
            EXPECT_EQ(graph.steps[i].times[Phase::backward], 0.0) << "inside the replay";
            EXPECT_EQ(graph.steps[i].times[Phase::optimizer], 0.0) << "inside the replay";
            EXPECT_EQ(graph.steps[i].host_syncs, eager.steps[i].host_syncs) << what;
        }
    }
}

TEST(StepGraph, ARecordedStepReplaysBitwiseUnderHostSyncNoneAndAfterARewarm) {
    RunConfig eager = tiny_config(false, 2), graph = tiny_config(true, 2);
    expect_bitwise(run_recorded(eager, 6), run_recorded(graph, 6, /*rewarm_at=*/3), "rewarm");
    eager.run.host_sync = graph.run.host_sync = HostSync::none;
    expect_bitwise(run_recorded(eager, 6), run_recorded(graph, 6), "host_sync none");
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

// The experiment runner (see runner.h).
//
// One step, as DESIGN.md fixes it (per micro-step m = 0 .. grad_accum-1 the first four repeat):
//   data      loader.next()                            host clock: the host waits for a batch
//   h2d       copy_to_device(inputs), (targets)         device events
//   forward   model.forward(.., grad_scale 1/accum)     device events
//   backward  (m == 0: zero_grad) model.backward()      device events
//   optimizer AdamW::step (global norm, clip, update)   device events
//   sync      loss (+ grad norm) read-back, synchronize device events around the host wait
// Each phase boundary also resets/reads the allocator peaks and samples device memory.
#include "harness/runner.h"

#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <exception>
#include <limits>
#include <sstream>

#include "harness/data.h"
#include "optim/adamw.h"

namespace mt {
namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
    g_interrupted.store(true);
    // A second Ctrl-C kills the process the ordinary way.
    std::signal(SIGINT, SIG_DFL);
}

// Installs the SIGINT handler for the scope of a run and restores the previous one.
class SigintScope {
  public:
    explicit SigintScope(bool enable) : enabled_(enable) {
        g_interrupted.store(false);
        if (!enabled_) return;
        struct sigaction sa {};
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &previous_);
    }
    ~SigintScope() {
        if (enabled_) sigaction(SIGINT, &previous_, nullptr);
    }
    SigintScope(const SigintScope&) = delete;
    SigintScope& operator=(const SigintScope&) = delete;

  private:
    bool enabled_;
    struct sigaction previous_ {};
};

std::string utc_now_iso() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
    return s;
}

std::string fmt_mib(double bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f MiB", to_mib(bytes));
    return b;
}

void print_estimate(std::FILE* out, const RunConfig& c, const MemoryEstimate& e) {
    if (!out) return;
    std::fprintf(out,
                 "  memory estimate: params %s, grads %s, optimizer %s, activations %s, "
                 "workspace %s, data %s = %s\n",
                 fmt_mib(e.params).c_str(), fmt_mib(e.grads).c_str(), fmt_mib(e.optimizer).c_str(),
                 fmt_mib(e.activations).c_str(), fmt_mib(e.workspace).c_str(),
                 fmt_mib(e.data).c_str(), fmt_mib(e.total()).c_str());
    (void)c;
}

// Progress: one line per step, or a single \r-updated bar on a terminal.
class Progress {
  public:
    Progress(std::FILE* out, bool bar, std::string variant, int total, int warmup)
        : out_(out), bar_(bar), variant_(std::move(variant)), total_(total), warmup_(warmup) {}
    void step(int s, double loss, double ms) {
        if (!out_) return;
        done_ms_ += ms;
        const int done = s + 1;
        const double eta_s = done_ms_ / done * (total_ - done) / 1000.0;
        const char* tag = s < warmup_ ? " (warm-up)" : "";
        if (bar_) {
            const int width = 24;
            const int filled = total_ > 0 ? done * width / total_ : width;
            std::string b(static_cast<size_t>(filled), '#');
            b.resize(width, '.');
            std::fprintf(out_, "\r  [%s] [%s] step %d/%d  loss %.4f  %.2f ms/step  ETA %.1f s%s   ",
                         variant_.c_str(), b.c_str(), done, total_, loss, ms, eta_s, tag);
        } else {
            std::fprintf(out_, "  [%s] step %d/%d  loss %.4f  %.2f ms/step  ETA %.1f s%s\n",
                         variant_.c_str(), done, total_, loss, ms, eta_s, tag);
        }
        std::fflush(out_);
    }
    void end() {
        if (out_ && bar_) std::fprintf(out_, "\n");
    }

  private:
    std::FILE* out_;
    bool bar_;
    std::string variant_;
    int total_, warmup_;
    double done_ms_ = 0;
};

// Resolves the backend a variant runs on, or returns the reason it cannot run here.
std::optional<BackendKind> resolve_backend(const RunConfig& c, std::string* skip_reason) {
    std::string why_not;
    const bool have_cuda = cuda_available(&why_not);
    BackendKind kind = BackendKind::cpu;
    if (c.backend == BackendChoice::cuda || (c.backend == BackendChoice::auto_ && have_cuda))
        kind = BackendKind::cuda;
    if (kind == BackendKind::cuda && !have_cuda) {
        *skip_reason = "needs a GPU (backend cuda), but none can be used here: " + why_not;
        return std::nullopt;
    }
    if (kind == BackendKind::cpu) {
        // pin_memory only means something with a device; the CPU backend ignores it.
        std::vector<std::string> needs;
        for (const auto& f : cuda_only_features(c))
            if (f.rfind("data.pin_memory", 0) != 0) needs.push_back(f);
        if (!needs.empty()) {
            *skip_reason = "needs a GPU (" + join(needs, ", ") + ")" +
                           (have_cuda ? std::string(" but runs on backend cpu as configured")
                                      : ", and this machine has none: " + why_not);
            return std::nullopt;
        }
    }
    return kind;
}

RunResult run_variant(const RunConfig& cfg, const RunnerOptions& opt, bool inject,
                      bool* interrupted) {
    RunResult r;
    r.config = cfg;
    std::string skip;
    const auto kind = resolve_backend(cfg, &skip);
    std::FILE* out = opt.out;
    if (out) std::fprintf(out, "\nvariant '%s'\n", cfg.variant.c_str());
    if (!kind) {
        r.status = RunStatus::skipped;
        r.message = skip;
        r.backend = cfg.backend == BackendChoice::cpu ? "cpu" : "cuda";
        if (out) std::fprintf(out, "  skipped: %s\n", skip.c_str());
        return r;
    }
    r.backend = to_string(*kind);

    const int B = cfg.data.batch_size, T = cfg.data.seq_len, accum = cfg.run.grad_accum;
    const int total_steps = cfg.run.warmup_steps + cfg.run.measure_steps;
    const char* phase_name = "setup";
    int step = -1;
    try {
        const auto t_setup = std::chrono::steady_clock::now();
        BackendOptions bo;
        bo.precision = cfg.run.precision;
        bo.kernels = cfg.kernels;
        bo.num_threads = cfg.run.threads;
        std::unique_ptr<Backend> backend = create_backend(*kind, bo);
        r.device_name = backend->device_name();
        r.threads = *kind == BackendKind::cpu ? omp_get_max_threads() : 0;
        if (out) std::fprintf(out, "  device: %s\n", r.device_name.c_str());

        // Peaks first, so the probe's buffers are gone (and its peaks reset) before the model.
        r.peaks = measure_peaks(*backend);
        r.peak_flops = peak_flops(r.device_name, cfg.run.precision);
        r.peak_flops_source = peak_flops_source(r.device_name, cfg.run.precision);

        ModelOptions mo;
        mo.kernels = cfg.kernels;
        mo.recompute = cfg.run.recompute;
        r.estimate = GPT::estimate_memory(cfg.model, mo, B, T, *backend);
        print_estimate(out, cfg, r.estimate);

        MemoryTracker mem(*backend);
        GPT model(*backend, cfg.model, mo);
        model.init_weights(cfg.run.seed);
        model.allocate_activations(B, T);
        r.n_params = model.parameter_table().total_count();
        r.flops_per_step = model.training_flops_per_step(B, T) * accum;
        AdamW optim(model, cfg.optim);
        DataLoader loader(cfg.data, cfg.model.vocab_size, cfg.run.seed, backend.get());
        const size_t n = static_cast<size_t>(B) * T;
        DeviceBuffer d_in(*backend, n * sizeof(int), MemoryCategory::data);
        DeviceBuffer d_tg(*backend, n * sizeof(int), MemoryCategory::data);
        // With accumulation, each micro-step's mean loss is reduced on the device into its own
        // slot, so the step's loss needs one read-back, not one sync per micro-step.
        DeviceBuffer d_losses;
        if (accum > 1)
            d_losses = DeviceBuffer(*backend, accum * sizeof(float), MemoryCategory::workspace);
        std::vector<float> h_losses(static_cast<size_t>(accum));

        std::unique_ptr<KernelProfiler> profiler;
        if (cfg.profile.kernels) {
            profiler = std::make_unique<KernelProfiler>(*backend);
            model.backend().set_op_observer(profiler.get());
        }
        backend->synchronize();
        mem.setup_done();
        r.setup_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_setup)
                .count();

        PhaseTimer timer(*backend);
        auto enter = [&](Phase p) {
            phase_name = to_string(p);
            mem.phase_begin(p);
            timer.begin(p);
        };
        auto leave = [&](Phase p) {
            timer.end(p);
            mem.phase_end(p);
        };
        Progress progress(out, opt.progress_bar.value_or(out && isatty(fileno(out))), cfg.variant,
                          total_steps, cfg.run.warmup_steps);
        std::optional<std::chrono::steady_clock::time_point> trace_t0;
        const bool clipping = cfg.optim.grad_clip > 0;

        for (step = 0; step < total_steps; ++step) {
            const bool warm = step < cfg.run.warmup_steps;
            StepRecord rec;
            rec.step = step;
            rec.warmup = warm;
            timer.begin_step();
            for (int m = 0; m < accum; ++m) {
                enter(Phase::data);
                const Batch& batch = loader.next();
                leave(Phase::data);

                enter(Phase::h2d);
                backend->copy_to_device(d_in.get(), batch.inputs, n * sizeof(int));
                backend->copy_to_device(d_tg.get(), batch.targets, n * sizeof(int));
                leave(Phase::h2d);

                enter(Phase::forward);
                model.forward(d_in.as<int>(), d_tg.as<int>(), B, T, 1.0f / accum);
                if (accum > 1)
                    backend->run(op::LossMean{.loss = d_losses.as<float>() + m,
                                              .losses = model.losses_device(),
                                              .N = static_cast<int>(n)});
                leave(Phase::forward);

                enter(Phase::backward);
                if (m == 0) model.zero_grad();
                model.backward();
                leave(Phase::backward);
            }
            enter(Phase::optimizer);
            rec.lr = optim.current_lr();
            optim.step();
            leave(Phase::optimizer);

            enter(Phase::sync);
            if (accum == 1) {
                rec.loss = model.loss();
            } else {
                backend->copy_to_host(h_losses.data(), d_losses.get(), accum * sizeof(float));
                double s = 0;
                for (float x : h_losses) s += x;
                rec.loss = s / accum;
            }
            rec.grad_norm = clipping ? optim.last_grad_norm() : 0.0;
            backend->synchronize();
            leave(Phase::sync);
            phase_name = "sync";
            rec.times = timer.finish_step();
            if (profiler) profiler->finish_step(!warm, timer.step_start_event());

            if (inject && step == opt.inject_nan_at_step)
                rec.loss = std::numeric_limits<double>::quiet_NaN();

            if (!warm && cfg.profile.trace &&
                static_cast<int>(r.trace.size()) < cfg.profile.trace_steps) {
                if (!trace_t0) trace_t0 = timer.last_step_start();
                TraceStep ts;
                ts.step = step;
                ts.start_ms =
                    std::chrono::duration<double, std::milli>(timer.last_step_start() - *trace_t0)
                        .count();
                ts.wall_ms = rec.times.wall_ms;
                ts.phases = timer.last_intervals();
                if (profiler) ts.ops = profiler->last_step_ops();
                r.trace.push_back(std::move(ts));
            }
            r.steps.push_back(rec);
            progress.step(step, rec.loss, rec.times.wall_ms);

            if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
                const bool loss_bad = !std::isfinite(rec.loss);
                r.status = RunStatus::failed;
                r.failed_step = step;
                r.failed_phase = loss_bad ? "forward" : "backward";
                std::ostringstream msg;
                msg << "variant '" << cfg.variant << "': non-finite "
                    << (loss_bad ? "loss (" + std::to_string(rec.loss) + ")"
                                 : "gradient norm (" + std::to_string(rec.grad_norm) + ")")
                    << " at step " << step << (warm ? " (warm-up)" : "") << ", produced in the "
                    << r.failed_phase << " phase and detected at the sync read-back; this variant "
                    << "stopped there ("
                    << (loss_bad ? "lower optim.lr or check the data"
                                 : "enable optim.grad_clip or lower optim.lr")
                    << ")";
                r.message = msg.str();
                break;
            }
            if (g_interrupted.load() || (inject && step == opt.interrupt_at_step)) {
                r.status = RunStatus::interrupted;
                *interrupted = true;
                int measured = 0;
                for (const auto& s : r.steps) measured += s.warmup ? 0 : 1;
                r.message = "interrupted (Ctrl-C) after step " + std::to_string(step) + "; " +
                            std::to_string(measured) + " measured step(s) kept";
                break;
            }
        }
        progress.end();
        mem.finish();
        r.memory = mem.summary();
        // A CPU peak probe disturbed by a busy machine makes MFU exceed 100%: the model just ran
        // faster than the "peak". Re-probe once now (the cache keeps the best figure ever
        // measured) so the report uses an honest denominator.
        if (*kind == BackendKind::cpu && r.peak_flops && *r.peak_flops > 0) {
            const RunStats st = compute_run_stats(r);
            if (st.achieved_flops_per_s > *r.peak_flops) {
                r.peaks = measure_peaks(*backend, /*force=*/true);
                r.peak_flops = peak_flops(r.device_name, cfg.run.precision);
                r.peak_flops_source = peak_flops_source(r.device_name, cfg.run.precision);
            }
        }
        if (profiler) {
            const RunStats st = compute_run_stats(r);
            r.kernels = profiler->table(st.step_ms.mean, st.measured, r.peaks);
            model.backend().set_op_observer(nullptr);
        }
    } catch (const std::exception& e) {
        r.status = RunStatus::failed;
        r.failed_step = step;
        r.failed_phase = phase_name;
        r.message =
            "variant '" + cfg.variant + "' failed " +
            (step < 0 ? std::string("during setup")
                      : "at step " + std::to_string(step) + " in the " + phase_name + " phase") +
            ": " + e.what();
    }
    if (out && r.status != RunStatus::ok) std::fprintf(out, "  %s\n", r.message.c_str());
    return r;
}

}  // namespace

const char* to_string(RunStatus s) {
    switch (s) {
        case RunStatus::ok:
            return "ok";
        case RunStatus::failed:
            return "failed";
        case RunStatus::interrupted:
            return "interrupted";
        case RunStatus::skipped:
            return "skipped";
    }
    return "?";
}

ExperimentResult run_experiment(const ExperimentSpec& spec, const RunnerOptions& options) {
    SigintScope sigint(options.handle_sigint);
    ExperimentResult ex;
    ex.name = spec.name;
    ex.source_path = spec.source_path;
    ex.baseline = spec.baseline;
    ex.loss_tolerance = spec.loss_tolerance;
    ex.started_utc = utc_now_iso();
    for (const RunConfig& cfg : spec.variants) {
        if (ex.interrupted) {
            RunResult r;
            r.config = cfg;
            r.status = RunStatus::skipped;
            r.message = "not run: the experiment was interrupted (Ctrl-C)";
            ex.runs.push_back(std::move(r));
            continue;
        }
        const bool inject = options.inject_variant.empty() || options.inject_variant == cfg.variant;
        ex.runs.push_back(run_variant(cfg, options, inject, &ex.interrupted));
    }
    return ex;
}

RunStats compute_run_stats(const RunResult& r) {
    RunStats st;
    std::vector<double> wall, other, loss;
    std::array<std::vector<double>, kPhaseCount> ph;
    for (const StepRecord& s : r.steps) {
        if (s.warmup) continue;
        wall.push_back(s.times.wall_ms);
        other.push_back(s.times.other_ms());
        for (int i = 0; i < kPhaseCount; ++i) ph[i].push_back(s.times.ms[i]);
        if (std::isfinite(s.loss)) loss.push_back(s.loss);
    }
    st.measured = static_cast<int>(wall.size());
    st.step_ms = compute_stats(wall);
    st.other_ms = compute_stats(other);
    st.loss = compute_stats(loss);
    for (int i = 0; i < kPhaseCount; ++i) st.phase[i] = compute_stats(ph[i]);
    if (!r.steps.empty()) st.final_loss = r.steps.back().loss;
    if (st.measured > 0 && st.step_ms.median > 0) {
        const double step_s = st.step_ms.median / 1000.0;
        const double samples =
            static_cast<double>(r.config.data.batch_size) * r.config.run.grad_accum;
        st.samples_per_s = samples / step_s;
        st.tokens_per_s = samples * r.config.data.seq_len / step_s;
        st.achieved_flops_per_s = r.flops_per_step / step_s;
        if (r.peak_flops && *r.peak_flops > 0) st.mfu = st.achieved_flops_per_s / *r.peak_flops;
    }
    return st;
}

}  // namespace mt

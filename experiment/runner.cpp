// The experiment runner (see runner.h). One step's phases are engine/training_session.h's
// TrainingSession and the loop around them is engine/step_loop.h's StepLoop (the host_sync none
// windows, what a non-finite loss or a stop signal does); this file configures the loop for a
// variant, records what its steps measured in the variant's VariantResult (report/recording.h
// converts the engine's records) and prints their progress.
#include "experiment/runner.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <exception>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/comm_probe.h"
#include "engine/signals.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"
#include "report/recording.h"

namespace mt {
namespace {

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

void print_estimate(std::FILE* out, const MemoryEstimate& e) {
    if (!out) return;
    std::fprintf(out,
                 "  memory estimate: params %s, grads %s, optimizer %s, activations %s, "
                 "workspace %s, data %s = %s\n",
                 fmt_mib(e.params).c_str(), fmt_mib(e.grads).c_str(), fmt_mib(e.optimizer).c_str(),
                 fmt_mib(e.activations).c_str(), fmt_mib(e.workspace).c_str(),
                 fmt_mib(e.data).c_str(), fmt_mib(e.total()).c_str());
    if (e.host_pinned)
        std::fprintf(out,
                     "  of which pinned host memory (offload, under data): %s; on the device: "
                     "%s\n",
                     fmt_mib(e.host_pinned).c_str(), fmt_mib(e.device_total()).c_str());
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
            // A terminal needs no more than ~10 updates a second (and under mpirun every byte
            // goes through mpirun's pty): skip the rest, never the last step.
            const auto now = std::chrono::steady_clock::now();
            if (done < total_ && now - last_bar_ < std::chrono::milliseconds(100)) return;
            last_bar_ = now;
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
    std::chrono::steady_clock::time_point last_bar_{};
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

// What the engine measured of a variant in its own types, until the variant's record takes it
// (memory_record, roofline_record): the estimate, the tracked memory and the machine's peaks
// (which the MFU re-probe and the per-op table use too).
struct EngineMeasures {
    MemoryEstimate estimate;
    MemorySummary memory;
    MachinePeaks peaks;
};

// The variant's backend, the memory estimate (checked against the device), the machine's peaks
// and the TrainingSession, in that order: the peak probe's buffers are gone (and its peaks
// reset) before the model exists.
std::unique_ptr<TrainingSession> set_up_session(const RunConfig& cfg, BackendKind kind,
                                                std::FILE* out, VariantResult& v, EngineMeasures& m,
                                                const std::function<void(Backend&)>& modify,
                                                World* world) {
    const auto t_setup = std::chrono::steady_clock::now();
    std::unique_ptr<Backend> backend = create_training_backend(cfg, kind);
    if (modify) modify(*backend);
    v.device_name = backend->device_name();
    v.threads = kind == BackendKind::cpu ? omp_get_max_threads() : 0;
    if (out) std::fprintf(out, "  device: %s\n", v.device_name.c_str());

    // The estimate against the device's memory before anything (the peak probe included) is
    // allocated: a variant that cannot fit is refused here (ResourceError), not OOM-killed later.
    try {
        check_memory_fits(cfg, *backend, &m.estimate);
    } catch (const ResourceError&) {
        print_estimate(out, m.estimate);
        throw;
    }
    print_estimate(out, m.estimate);

    m.peaks = measure_peaks(*backend);
    v.flops.peak_per_s = peak_flops(v.device_name, cfg.run.precision);
    v.flops.peak_source = peak_flops_source(v.device_name, cfg.run.precision);

    TrainingInputs inputs;
    inputs.world = world;
    auto session = std::make_unique<TrainingSession>(std::move(backend), cfg, std::move(inputs));
    v.n_params = session->n_params();
    v.flops.per_step = session->flops_per_step();
    v.setup_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_setup)
            .count();
    return session;
}

// Keeps the step's phase (and, when profiling, op) timeline while fewer than profile.trace_steps
// measured steps are kept. `t0` is the first kept step's start: the trace's time origin.
void record_trace(const TrainingSession& session, const TrainingSession::CompletedStep& done,
                  const RunConfig& cfg, std::optional<std::chrono::steady_clock::time_point>& t0,
                  VariantResult& v) {
    const StepRecord& rec = done.record;
    if (rec.warmup || !cfg.profile.trace ||
        static_cast<int>(v.trace.size()) >= cfg.profile.trace_steps)
        return;
    if (!t0) t0 = done.host_start;
    TraceStep ts;
    ts.step = rec.step;
    ts.start_ms = std::chrono::duration<double, std::milli>(done.host_start - *t0).count();
    ts.wall_ms = rec.times.wall_ms;
    ts.phases = done.intervals;
    if (session.profiler()) ts.ops = session.profiler()->last_step_ops();
    v.trace.push_back(std::move(ts));
}

// The test hook of RunnerOptions::fault: a rank that dies, hangs or fails.
void inject_fault(const std::string& fault) {
    if (fault == "kill") std::raise(SIGKILL);
    if (fault == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (fault == "throw") throw std::runtime_error("an injected failure (test hook)");
    throw std::invalid_argument("unknown fault '" + fault + "' (kill, hang or throw)");
}

// Marks the variant failed at the step whose loss or gradient norm is not finite (the StepLoop
// stopped there and says which step, the phase that produced it and what to try).
void fail_on_non_finite(const LoopOutcome& outcome, VariantResult& v) {
    v.status = RunStatus::failed;
    v.failed_step = outcome.step;
    v.failed_phase = outcome.non_finite.phase;
    v.message = outcome.non_finite.message;
}

void mark_interrupted(int step, int sig, VariantResult& v) {
    v.status = RunStatus::interrupted;
    int measured = 0;
    for (const StepRow& s : v.steps) measured += s.warmup ? 0 : 1;
    v.message = "interrupted by " + signal_description(sig) + " after step " +
                std::to_string(step) + "; " + std::to_string(measured) + " measured step(s) kept";
}

// Warm-up + measured steps through a StepLoop (engine/step_loop.h: the windows of run.host_sync
// none, the non-finite and stop-signal policy), each step recorded with its trace and a progress
// line. `step` is the step running now (for an exception's message). Returns the stop signal's
// number when interrupted, 0 otherwise.
int run_steps(TrainingSession& session, const RunConfig& cfg, const RunnerOptions& opt, bool inject,
              VariantResult& v, int& step) {
    const int total_steps = cfg.run.warmup_steps + cfg.run.measure_steps;
    Progress progress(opt.out, opt.progress_bar.value_or(opt.out && isatty(fileno(opt.out))),
                      cfg.variant, total_steps, cfg.run.warmup_steps);
    if (opt.out && session.defers_read_back())
        std::fprintf(opt.out,
                     "  run.host_sync none: no step waits for the device; losses and times are "
                     "read back after each window (warm-up, measured steps, or %zu steps)\n",
                     TrainingSession::kHostSyncWindow);
    std::optional<std::chrono::steady_clock::time_point> trace_t0;
    StepLoopOptions loop;
    loop.warmup_steps = cfg.run.warmup_steps;
    loop.before_step = [&](int s) {
        step = s;
        if (!opt.fault.empty() && s == opt.fault_step && opt.world &&
            opt.world->rank() == opt.fault_rank)
            inject_fault(opt.fault);
    };
    loop.on_step = [&](const TrainingSession::CompletedStep& done) {
        const StepRecord& rec = done.record;
        record_trace(session, done, cfg, trace_t0, v);
        v.steps.push_back(step_row(rec));
        v.steps.back().round = rec.warmup ? -1 : 0;  // one round: every variant in turn
        // Data parallel: once a stop signal arrived, mpirun stops reading the ranks' output
        // while it ends the job; a progress line could then block rank 0 before the report
        // is written, so none is printed.
        if (!(session.world_size() > 1 && rec.stop_signal))
            progress.step(rec.step, rec.loss, rec.times.wall_ms);
    };
    if (inject) {
        loop.inject_nan_at_step = opt.inject_nan_at_step;
        loop.interrupt_at_step = opt.interrupt_at_step;
    }
    StepLoop steps(session, std::move(loop));
    const LoopOutcome outcome = steps.run(0, total_steps);
    step = steps.step();
    progress.end();
    switch (outcome.end) {
        case LoopOutcome::End::completed:
            return 0;
        case LoopOutcome::End::non_finite:
            fail_on_non_finite(outcome, v);  // the window's later steps are dropped
            return 0;
        case LoopOutcome::End::interrupted:
            mark_interrupted(outcome.step, outcome.signal, v);
            return outcome.signal;
    }
    return 0;
}

// After the steps: the memory summary, an honest MFU denominator and the per-op table.
void finish_variant(TrainingSession& session, const RunConfig& cfg, BackendKind kind,
                    VariantResult& v, EngineMeasures& m) {
    m.memory = session.finish();
    // A CPU peak probe disturbed by a busy machine makes MFU exceed 100%: the model just ran
    // faster than the "peak". Re-probe once now (the cache keeps the best figure ever
    // measured) so the report uses an honest denominator.
    const Precision precision = cfg.run.precision;
    if (kind == BackendKind::cpu && v.flops.peak_per_s && *v.flops.peak_per_s > 0) {
        derive_statistics(v);
        if (v.flops.achieved_per_s > *v.flops.peak_per_s) {
            m.peaks = measure_peaks(session.backend(), /*force=*/true);
            v.flops.peak_per_s = peak_flops(v.device_name, precision);
            v.flops.peak_source = peak_flops_source(v.device_name, precision);
        }
    }
    if (session.profiler()) {
        derive_statistics(v);
        for (const KernelStat& k :
             session.profiler()->table(v.stats.step_ms.mean, v.measured_steps, m.peaks))
            v.kernels.push_back(kernel_record(k));
    }
}

// Data parallel: how the variant communicates, and the bus bandwidth the transport reaches for
// an all-reduce of the gradients' size (engine/comm_probe.h: cached, or measured on the model's
// gradient buffer before the first step zeroes it). The SIMULATED link is not applied to it.
void probe_collectives(TrainingSession& session, const RunConfig& cfg, World& world, std::FILE* out,
                       VariantResult& v) {
    const GradientSync& sync = *session.gradient_sync();
    DataParallelRecord d;
    d.world_size = session.world_size();
    d.transport = session.collectives()->describe();
    d.zero = cfg.dist.zero;
    d.overlap = cfg.dist.overlap;
    d.bucket_mb = cfg.dist.bucket_mb;
    d.buckets = static_cast<int>(sync.buckets().size());
    d.simulated_link_gbps = cfg.dist.simulate_link_gbps;
    d.simulated_latency_us = cfg.dist.simulate_latency_us;
    const CommProbe probe = all_reduce_probe(session, world, cfg.dist.timeout_s);
    const double gbps = probe.busbw_gbps;
    if (gbps > 0) {
        d.probe_busbw_gbps = gbps;
        d.probe_source = probe.source;
    }
    if (out)
        std::fprintf(out,
                     "  data parallel: %d ranks over %s, %d bucket(s) of %.3g MiB, overlap %s, "
                     "ZeRO-%d; all-reduce probe %.2f GB/s%s\n",
                     d.world_size, d.transport.c_str(), d.buckets, d.bucket_mb,
                     d.overlap ? "on" : "off", d.zero, gbps,
                     d.simulated_link_gbps > 0 || d.simulated_latency_us > 0
                         ? "; SIMULATED link in the steps"
                         : "");
    v.data_parallel = std::move(d);
}

// One rank's medians and trace as text (JSON), so rank 0 can gather them.
std::string rank_summary_json(const VariantResult& v, int rank) {
    nlohmann::json j;
    std::vector<double> wall, busy, over;
    std::array<std::vector<double>, kPhaseCount> ph;
    std::vector<double> bytes;
    for (const StepRow& s : v.steps) {
        if (s.warmup) continue;
        wall.push_back(s.wall_ms);
        for (int i = 0; i < kPhaseCount; ++i) ph[i].push_back(s.phases_ms[i]);
        busy.push_back(s.comm_busy_ms);
        over.push_back(std::max(0.0, s.comm_busy_ms - s.phases_ms[static_cast<int>(Phase::comm)]));
        bytes.push_back(s.comm_bytes);
    }
    j["rank"] = rank;
    j["step_ms"] = compute_stats(wall).median;
    j["busy"] = compute_stats(busy).median;
    j["overlapped"] = compute_stats(over).median;
    j["bytes"] = compute_stats(bytes).median;
    std::vector<double> phases;
    for (int i = 0; i < kPhaseCount; ++i) phases.push_back(compute_stats(ph[i]).median);
    j["phases"] = phases;
    nlohmann::json trace = nlohmann::json::array();
    for (const TraceStep& t : v.trace) {
        nlohmann::json ts = {{"step", t.step}, {"start", t.start_ms}, {"wall", t.wall_ms}};
        nlohmann::json iv = nlohmann::json::array();
        for (const PhaseInterval& p : t.phases)
            iv.push_back({static_cast<int>(p.phase), p.micro_step, p.start_ms, p.duration_ms});
        ts["phases"] = iv;
        trace.push_back(ts);
    }
    j["trace"] = trace;
    return j.dump();
}

RankRecord rank_record_from_json(const std::string& text, double* bytes) {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankRecord s;
    s.rank = j.at("rank").get<int>();
    s.step_ms = j.at("step_ms").get<double>();
    s.comm_busy_ms = j.at("busy").get<double>();
    s.comm_overlapped_ms = j.at("overlapped").get<double>();
    *bytes = j.at("bytes").get<double>();
    const auto phases = j.at("phases").get<std::vector<double>>();
    for (int i = 0; i < kPhaseCount && i < static_cast<int>(phases.size()); ++i)
        s.phases_ms[i] = phases[i];
    for (const auto& ts : j.at("trace")) {
        TraceStep t;
        t.step = ts.at("step").get<int>();
        t.start_ms = ts.at("start").get<double>();
        t.wall_ms = ts.at("wall").get<double>();
        for (const auto& iv : ts.at("phases"))
            t.phases.push_back({static_cast<Phase>(iv[0].get<int>()), iv[1].get<int>(),
                                iv[2].get<double>(), iv[3].get<double>()});
        s.trace.push_back(std::move(t));
    }
    return s;
}

// Every rank's medians and trace into rank 0's result: the per-rank table, the stragglers, one
// trace track per rank. Bytes and bus bandwidth are rank 0's (every rank sends the same).
void gather_ranks(const TrainingSession& session, const RunConfig& cfg, World& world,
                  VariantResult& v) {
    const std::vector<std::string> all =
        world.gather(rank_summary_json(v, world.rank()), cfg.dist.timeout_s,
                     "the gathering of every rank's phase times");
    (void)session;
    if (world.rank() != 0 || !v.data_parallel) return;
    DataParallelRecord& d = *v.data_parallel;
    for (const std::string& text : all) {
        double bytes = 0;
        RankRecord s = rank_record_from_json(text, &bytes);
        if (s.rank == 0) {
            d.bytes_per_step = bytes;
            if (s.comm_busy_ms > 0) d.achieved_busbw_gbps = bytes / (s.comm_busy_ms * 1e-3) / 1e9;
        }
        d.ranks.push_back(std::move(s));
    }
}

VariantResult skipped_variant(const RunConfig& cfg, const std::string& reason, std::FILE* out) {
    VariantResult v = variant_result_for(cfg);
    v.status = RunStatus::skipped;
    v.message = reason;
    v.backend = cfg.backend == BackendChoice::cpu ? "cpu" : "cuda";
    if (out) std::fprintf(out, "  skipped: %s\n", reason.c_str());
    return v;
}

VariantResult run_variant(const RunConfig& cfg, const RunnerOptions& opt, bool inject,
                          int* interrupted, bool* job_failed) {
    std::FILE* out = opt.out;
    if (out) std::fprintf(out, "\nvariant '%s'\n", cfg.variant.c_str());
    std::string skip;
    const auto kind = resolve_backend(cfg, &skip);
    if (!kind) return skipped_variant(cfg, skip, out);
    // The same decision on every rank (it follows from the config and the world size).
    if (cfg.run.host_sync == HostSync::none && opt.world && opt.world->distributed())
        return skipped_variant(cfg,
                               "run.host_sync none needs one process: under data parallel every "
                               "step all-reduces the loss and agrees on a stop signal on the host",
                               out);

    VariantResult v = variant_result_for(cfg);
    v.backend = to_string(*kind);
    EngineMeasures m;
    std::unique_ptr<TrainingSession> session;
    int step = -1;
    try {
        session = set_up_session(cfg, *kind, out, v, m,
                                 inject ? opt.modify_backend : std::function<void(Backend&)>(),
                                 opt.world);
        if (session->world_size() > 1) probe_collectives(*session, cfg, *opt.world, out, v);
        if (const int sig = run_steps(*session, cfg, opt, inject, v, step)) *interrupted = sig;
        finish_variant(*session, cfg, *kind, v, m);
        if (session->world_size() > 1) gather_ranks(*session, cfg, *opt.world, v);
    } catch (const ResourceError& e) {
        // The machine lacks what the variant needs (like a GPU): skipped, with the estimate.
        session.reset();
        VariantResult skipped = skipped_variant(cfg, e.what(), nullptr);
        skipped.backend = v.backend;
        skipped.device_name = v.device_name;
        skipped.memory = memory_record(m.estimate, MemorySummary{});
        if (out) std::fprintf(out, "  skipped: %s\n", skipped.message.c_str());
        return skipped;
    } catch (const std::exception& e) {
        const std::string phase = session ? session->current_phase() : "setup";
        // Data parallel: the other ranks are waiting for this one in a collective; they cannot
        // go on. Rank 0 records the failure (the report of what was measured is written before
        // the caller ends the job); another rank's caller ends the job at once.
        if (opt.world && opt.world->distributed() && opt.world->rank() == 0) *job_failed = true;
        if (opt.world && opt.world->distributed() && opt.world->rank() != 0)
            throw std::runtime_error(
                "rank " + std::to_string(opt.world->rank()) + " of " +
                std::to_string(opt.world->size()) + ": variant '" + cfg.variant + "' failed " +
                (step < 0 ? std::string("during setup")
                          : "at step " + std::to_string(step) + " in the " + phase + " phase") +
                ": " + e.what());
        v.status = RunStatus::failed;
        if (step >= 0) v.failed_step = step;
        v.failed_phase = phase;
        v.message =
            std::string(*job_failed ? "rank 0 of " + std::to_string(opt.world->size()) + ": "
                                    : "") +
            "variant '" + cfg.variant + "' failed " +
            (step < 0 ? std::string("during setup")
                      : "at step " + std::to_string(step) + " in the " + phase + " phase") +
            ": " + e.what();
    }
    // (Data parallel, interrupted: nothing more is printed before the report; see run_steps.)
    const bool quiet = v.status == RunStatus::interrupted && opt.world && opt.world->distributed();
    if (out && v.status != RunStatus::ok && !quiet) std::fprintf(out, "  %s\n", v.message.c_str());
    // What the engine measured, in whatever state the variant ended (a failure keeps the
    // estimate and the peaks; the tracked memory only once the steps finished).
    v.memory = memory_record(m.estimate, m.memory);
    v.roofline = roofline_record(m.peaks);
    return v;
}

}  // namespace

VariantResult variant_result_for(const RunConfig& cfg) {
    VariantResult v;
    v.name = cfg.variant;
    for (const auto& [k, val] : flatten(cfg)) v.config[k] = val;
    v.changed = cfg.changed;
    v.knobs_changed = static_cast<int>(cfg.changed.size());
    v.model_describe = cfg.model.describe();
    v.batch.batch_size = cfg.data.batch_size;
    v.batch.seq_len = cfg.data.seq_len;
    v.batch.grad_accum = cfg.run.grad_accum;
    v.warmup_steps = cfg.run.warmup_steps;
    v.measure_steps = cfg.run.measure_steps;
    v.profiled = cfg.profile.kernels;
    v.memory = memory_record(MemoryEstimate{}, MemorySummary{});
    v.roofline = roofline_record(MachinePeaks{});
    return v;
}

ExperimentRun run_experiment(const ExperimentSpec& spec, const RunnerOptions& options) {
    std::optional<StopSignals> signals;
    if (options.handle_sigint) signals.emplace();
    ExperimentRun run;
    Results& res = run.results;
    res.experiment = {spec.name, spec.source_path, spec.baseline, spec.loss_tolerance,
                      spec.min_effect};
    res.started_utc = utc_now_iso();
    // Every variant's record is complete (its statistics derived) once it is added.
    auto add = [&res](VariantResult v) {
        derive_statistics(v);
        res.variants.push_back(std::move(v));
    };
    World* world = options.world && options.world->distributed() ? options.world : nullptr;
    for (const RunConfig& cfg : spec.variants) {
        // A signal that arrived between two variants' steps (on any rank: all stop together).
        double sig = stop_signal();
        if (world && !res.interrupted && run.job_failure.empty())
            world->allreduce_max(&sig, 1, cfg.dist.timeout_s, "the stop flag between variants");
        if (!res.interrupted && sig > 0) {
            run.stop_signal = static_cast<int>(sig);
            res.interrupted = true;
        }
        if (res.interrupted) {
            VariantResult v = variant_result_for(cfg);
            v.status = RunStatus::skipped;
            v.message = "the experiment was interrupted by " + signal_description(run.stop_signal) +
                        " before this variant";
            add(std::move(v));
            continue;
        }
        if (!run.job_failure.empty()) {  // data parallel: the job ends after this report
            VariantResult v = variant_result_for(cfg);
            v.status = RunStatus::skipped;
            v.message =
                "not run: the data-parallel job ended after a failure (" + run.job_failure + ")";
            add(std::move(v));
            continue;
        }
        const bool inject = options.inject_variant.empty() || options.inject_variant == cfg.variant;
        bool job_failed = false;
        add(run_variant(cfg, options, inject, &run.stop_signal, &job_failed));
        if (job_failed) run.job_failure = res.variants.back().message;
        res.interrupted = run.stop_signal != 0;
    }
    // The environment and the comparison: on the rank that writes the report (one process: it).
    if (!options.world || options.world->rank() == 0) complete_results(res);
    return run;
}

}  // namespace mt

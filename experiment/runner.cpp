// The experiment runner (see runner.h). One step's phases are engine/training_session.h's
// TrainingSession; this file runs a variant's steps through it and records what they measured.
#include "experiment/runner.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "engine/comm_probe.h"
#include "engine/signals.h"
#include "engine/training_session.h"
#include "io/text.h"

namespace mt {
namespace {

void print_estimate(std::FILE* out, const MemoryEstimate& e) {
    if (!out) return;
    std::fprintf(out,
                 "  memory estimate: params %s, grads %s, optimizer %s, activations %s, "
                 "workspace %s, data %s = %s\n",
                 format_mib(e.params).c_str(), format_mib(e.grads).c_str(),
                 format_mib(e.optimizer).c_str(), format_mib(e.activations).c_str(),
                 format_mib(e.workspace).c_str(), format_mib(e.data).c_str(),
                 format_mib(e.total()).c_str());
    if (e.host_pinned)
        std::fprintf(out,
                     "  of which pinned host memory (offload, under data): %s; on the device: "
                     "%s\n",
                     format_mib(e.host_pinned).c_str(), format_mib(e.device_total()).c_str());
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

// The variant's backend, the memory estimate (checked against the device), the machine's peaks
// and the TrainingSession, in that order: the peak probe's buffers are gone (and its peaks
// reset) before the model exists.
std::unique_ptr<TrainingSession> set_up_session(const RunConfig& cfg, BackendKind kind,
                                                std::FILE* out, RunResult& r,
                                                const std::function<void(Backend&)>& modify,
                                                World* world) {
    const auto t_setup = std::chrono::steady_clock::now();
    std::unique_ptr<Backend> backend = create_training_backend(cfg, kind);
    if (modify) modify(*backend);
    r.device_name = backend->device_name();
    r.threads = kind == BackendKind::cpu ? omp_get_max_threads() : 0;
    if (out) std::fprintf(out, "  device: %s\n", r.device_name.c_str());

    // The estimate against the device's memory before anything (the peak probe included) is
    // allocated: a variant that cannot fit is refused here (ResourceError), not OOM-killed later.
    try {
        check_memory_fits(cfg, *backend, &r.estimate);
    } catch (const ResourceError&) {
        print_estimate(out, r.estimate);
        throw;
    }
    print_estimate(out, r.estimate);

    r.peaks = measure_peaks(*backend);
    r.peak_flops = peak_flops(r.device_name, cfg.run.precision);
    r.peak_flops_source = peak_flops_source(r.device_name, cfg.run.precision);

    TrainingInputs inputs;
    inputs.world = world;
    auto session = std::make_unique<TrainingSession>(std::move(backend), cfg, std::move(inputs));
    r.n_params = session->n_params();
    r.flops_per_step = session->flops_per_step();
    r.setup_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_setup)
            .count();
    return session;
}

// Keeps the step's phase (and, when profiling, op) timeline while fewer than profile.trace_steps
// measured steps are kept. `t0` is the first kept step's start: the trace's time origin.
void record_trace(const TrainingSession& session, const TrainingSession::CompletedStep& done,
                  const RunConfig& cfg, std::optional<std::chrono::steady_clock::time_point>& t0,
                  RunResult& r) {
    const StepRecord& rec = done.record;
    if (rec.warmup || !cfg.profile.trace ||
        static_cast<int>(r.trace.size()) >= cfg.profile.trace_steps)
        return;
    if (!t0) t0 = done.host_start;
    TraceStep ts;
    ts.step = rec.step;
    ts.start_ms = std::chrono::duration<double, std::milli>(done.host_start - *t0).count();
    ts.wall_ms = rec.times.wall_ms;
    ts.phases = done.intervals;
    if (session.profiler()) ts.ops = session.profiler()->last_step_ops();
    r.trace.push_back(std::move(ts));
}

// The test hook of RunnerOptions::fault: a rank that dies, hangs or fails.
void inject_fault(const std::string& fault) {
    if (fault == "kill") std::raise(SIGKILL);
    if (fault == "hang")
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (fault == "throw") throw std::runtime_error("an injected failure (test hook)");
    throw std::invalid_argument("unknown fault '" + fault + "' (kill, hang or throw)");
}

// Marks the variant failed at a step whose loss or gradient norm is not finite, with what to try.
void fail_on_non_finite(const RunConfig& cfg, const StepRecord& rec, RunResult& r) {
    const bool loss_bad = !std::isfinite(rec.loss);
    r.status = RunStatus::failed;
    r.failed_step = rec.step;
    r.failed_phase = loss_bad ? "forward" : "backward";
    std::ostringstream msg;
    msg << "variant '" << cfg.variant << "': non-finite "
        << (loss_bad ? "loss (" + std::to_string(rec.loss) + ")"
                     : "gradient norm (" + std::to_string(rec.grad_norm) + ")")
        << " at step " << rec.step << (rec.warmup ? " (warm-up)" : "") << ", produced in the "
        << r.failed_phase << " phase and detected at the sync read-back; this variant "
        << "stopped there ("
        << (loss_bad ? "lower optim.lr or check the data"
                     : "enable optim.grad_clip or lower optim.lr")
        << ")";
    r.message = msg.str();
}

void mark_interrupted(int step, int sig, RunResult& r) {
    r.status = RunStatus::interrupted;
    int measured = 0;
    for (const auto& s : r.steps) measured += s.warmup ? 0 : 1;
    r.message = "interrupted by " + signal_description(sig) + " after step " +
                std::to_string(step) + "; " + std::to_string(measured) + " measured step(s) kept";
}

// run.host_sync none: the steps of a window run without a host wait and are read back together
// (TrainingSession::drain): at the end of the warm-up, of the measured steps, of a full window,
// and as soon as a stop signal arrives. Every other setting reads each step back as it ends.
bool window_ends(const TrainingSession& session, const RunConfig& cfg, const RunnerOptions& opt,
                 bool inject, int step) {
    const int total_steps = cfg.run.warmup_steps + cfg.run.measure_steps;
    return !session.defers_read_back() || session.drain_due() || step + 1 == cfg.run.warmup_steps ||
           step + 1 == total_steps || stop_signal() != 0 ||
           (inject && step == opt.interrupt_at_step);
}

// Warm-up + measured steps until the end, a non-finite loss or an interrupt. `step` is the step
// running now (for an exception's message). Returns the stop signal's number when interrupted,
// 0 otherwise.
int run_steps(TrainingSession& session, const RunConfig& cfg, const RunnerOptions& opt, bool inject,
              RunResult& r, int& step) {
    const int total_steps = cfg.run.warmup_steps + cfg.run.measure_steps;
    Progress progress(opt.out, opt.progress_bar.value_or(opt.out && isatty(fileno(opt.out))),
                      cfg.variant, total_steps, cfg.run.warmup_steps);
    if (opt.out && session.defers_read_back())
        std::fprintf(opt.out,
                     "  run.host_sync none: no step waits for the device; losses and times are "
                     "read back after each window (warm-up, measured steps, or %zu steps)\n",
                     TrainingSession::kHostSyncWindow);
    std::optional<std::chrono::steady_clock::time_point> trace_t0;
    for (step = 0; step < total_steps; ++step) {
        if (!opt.fault.empty() && step == opt.fault_step && opt.world &&
            opt.world->rank() == opt.fault_rank)
            inject_fault(opt.fault);
        session.enqueue_step(step, step < cfg.run.warmup_steps);
        if (!window_ends(session, cfg, opt, inject, step)) continue;
        for (TrainingSession::CompletedStep& done : session.drain()) {
            StepRecord& rec = done.record;
            if (inject && rec.step == opt.inject_nan_at_step)
                rec.loss = std::numeric_limits<double>::quiet_NaN();
            record_trace(session, done, cfg, trace_t0, r);
            r.steps.push_back(rec);
            // Data parallel: once a stop signal arrived, mpirun stops reading the ranks' output
            // while it ends the job; a progress line could then block rank 0 before the report
            // is written, so none is printed.
            if (!(session.world_size() > 1 && rec.stop_signal))
                progress.step(rec.step, rec.loss, rec.times.wall_ms);
            if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
                fail_on_non_finite(cfg, rec, r);  // the window's later steps are dropped
                progress.end();
                return 0;
            }
        }
        // Data parallel: the stop signal every rank agreed on in the step (all stop together).
        int sig = session.world_size() > 1 ? r.steps.back().stop_signal : stop_signal();
        if (!sig && inject && step == opt.interrupt_at_step) sig = SIGINT;  // the test hook
        if (sig) {
            mark_interrupted(step, sig, r);
            progress.end();
            return sig;
        }
    }
    progress.end();
    return 0;
}

// After the steps: the memory summary, an honest MFU denominator and the per-op table.
void finish_variant(TrainingSession& session, BackendKind kind, RunResult& r) {
    r.memory = session.finish();
    // A CPU peak probe disturbed by a busy machine makes MFU exceed 100%: the model just ran
    // faster than the "peak". Re-probe once now (the cache keeps the best figure ever
    // measured) so the report uses an honest denominator.
    const Precision precision = r.config.run.precision;
    if (kind == BackendKind::cpu && r.peak_flops && *r.peak_flops > 0) {
        const RunStats st = compute_run_stats(r);
        if (st.achieved_flops_per_s > *r.peak_flops) {
            r.peaks = measure_peaks(session.backend(), /*force=*/true);
            r.peak_flops = peak_flops(r.device_name, precision);
            r.peak_flops_source = peak_flops_source(r.device_name, precision);
        }
    }
    if (session.profiler()) {
        const RunStats st = compute_run_stats(r);
        r.kernels = session.profiler()->table(st.step_ms.mean, st.measured, r.peaks);
    }
}

// Data parallel: how the variant communicates, and the bus bandwidth the transport reaches for
// an all-reduce of the gradients' size (engine/comm_probe.h: cached, or measured on the model's
// gradient buffer before the first step zeroes it). The SIMULATED link is not applied to it.
void probe_collectives(TrainingSession& session, const RunConfig& cfg, World& world, std::FILE* out,
                       RunResult& r) {
    const GradientSync& sync = *session.gradient_sync();
    DataParallelRun d;
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
    r.dist = std::move(d);
}

// One rank's medians and trace as text (JSON), so rank 0 can gather them.
std::string rank_summary_json(const RunResult& r, int rank) {
    nlohmann::json j;
    std::vector<double> wall, busy, over;
    std::array<std::vector<double>, kPhaseCount> ph;
    std::vector<double> bytes;
    for (const StepRecord& s : r.steps) {
        if (s.warmup) continue;
        wall.push_back(s.times.wall_ms);
        for (int i = 0; i < kPhaseCount; ++i) ph[i].push_back(s.times.ms[i]);
        busy.push_back(s.comm_busy_ms);
        over.push_back(std::max(0.0, s.comm_busy_ms - s.times[Phase::comm]));
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
    for (const TraceStep& t : r.trace) {
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

RankSummary rank_summary_from_json(const std::string& text, double* bytes) {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankSummary s;
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
                  RunResult& r) {
    const std::vector<std::string> all =
        world.gather(rank_summary_json(r, world.rank()), cfg.dist.timeout_s,
                     "the gathering of every rank's phase times");
    (void)session;
    if (world.rank() != 0 || !r.dist) return;
    for (const std::string& text : all) {
        double bytes = 0;
        RankSummary s = rank_summary_from_json(text, &bytes);
        if (s.rank == 0) {
            r.dist->bytes_per_step = bytes;
            if (s.comm_busy_ms > 0)
                r.dist->achieved_busbw_gbps = bytes / (s.comm_busy_ms * 1e-3) / 1e9;
        }
        r.dist->ranks.push_back(std::move(s));
    }
}

RunResult skipped_variant(const RunConfig& cfg, const std::string& reason, std::FILE* out) {
    RunResult r;
    r.config = cfg;
    r.status = RunStatus::skipped;
    r.message = reason;
    r.backend = cfg.backend == BackendChoice::cpu ? "cpu" : "cuda";
    if (out) std::fprintf(out, "  skipped: %s\n", reason.c_str());
    return r;
}

RunResult run_variant(const RunConfig& cfg, const RunnerOptions& opt, bool inject, int* interrupted,
                      bool* job_failed) {
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

    RunResult r;
    r.config = cfg;
    r.backend = to_string(*kind);
    std::unique_ptr<TrainingSession> session;
    int step = -1;
    try {
        session = set_up_session(cfg, *kind, out, r,
                                 inject ? opt.modify_backend : std::function<void(Backend&)>(),
                                 opt.world);
        if (session->world_size() > 1) probe_collectives(*session, cfg, *opt.world, out, r);
        if (const int sig = run_steps(*session, cfg, opt, inject, r, step)) *interrupted = sig;
        finish_variant(*session, *kind, r);
        if (session->world_size() > 1) gather_ranks(*session, cfg, *opt.world, r);
    } catch (const ResourceError& e) {
        // The machine lacks what the variant needs (like a GPU): skipped, with the estimate.
        session.reset();
        RunResult skipped = skipped_variant(cfg, e.what(), nullptr);
        skipped.backend = r.backend;
        skipped.device_name = r.device_name;
        skipped.estimate = r.estimate;
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
        r.status = RunStatus::failed;
        r.failed_step = step;
        r.failed_phase = phase;
        r.message =
            std::string(*job_failed ? "rank 0 of " + std::to_string(opt.world->size()) + ": "
                                    : "") +
            "variant '" + cfg.variant + "' failed " +
            (step < 0 ? std::string("during setup")
                      : "at step " + std::to_string(step) + " in the " + phase + " phase") +
            ": " + e.what();
    }
    // (Data parallel, interrupted: nothing more is printed before the report; see run_steps.)
    const bool quiet = r.status == RunStatus::interrupted && opt.world && opt.world->distributed();
    if (out && r.status != RunStatus::ok && !quiet) std::fprintf(out, "  %s\n", r.message.c_str());
    return r;
}

}  // namespace

ExperimentResult run_experiment(const ExperimentSpec& spec, const RunnerOptions& options) {
    std::optional<StopSignals> signals;
    if (options.handle_sigint) signals.emplace();
    ExperimentResult ex;
    ex.name = spec.name;
    ex.source_path = spec.source_path;
    ex.baseline = spec.baseline;
    ex.loss_tolerance = spec.loss_tolerance;
    ex.started_utc = utc_now_iso();
    World* world = options.world && options.world->distributed() ? options.world : nullptr;
    for (const RunConfig& cfg : spec.variants) {
        // A signal that arrived between two variants' steps (on any rank: all stop together).
        double sig = stop_signal();
        if (world && !ex.interrupted && ex.job_failure.empty())
            world->allreduce_max(&sig, 1, cfg.dist.timeout_s, "the stop flag between variants");
        if (!ex.interrupted && sig > 0) {
            ex.stop_signal = static_cast<int>(sig);
            ex.interrupted = true;
        }
        if (ex.interrupted) {
            RunResult r;
            r.config = cfg;
            r.status = RunStatus::skipped;
            r.message = "the experiment was interrupted by " + signal_description(ex.stop_signal) +
                        " before this variant";
            ex.runs.push_back(std::move(r));
            continue;
        }
        if (!ex.job_failure.empty()) {  // data parallel: the job ends after this report
            RunResult r;
            r.config = cfg;
            r.status = RunStatus::skipped;
            r.message =
                "not run: the data-parallel job ended after a failure (" + ex.job_failure + ")";
            ex.runs.push_back(std::move(r));
            continue;
        }
        const bool inject = options.inject_variant.empty() || options.inject_variant == cfg.variant;
        bool job_failed = false;
        ex.runs.push_back(run_variant(cfg, options, inject, &ex.stop_signal, &job_failed));
        if (job_failed) ex.job_failure = ex.runs.back().message;
        ex.interrupted = ex.stop_signal != 0;
    }
    return ex;
}

MeasuredWork measured_work(const RunResult& r) {
    MeasuredWork w;
    int n = 0;
    for (const StepRecord& s : r.steps) {
        if (s.warmup) continue;
        w.tokens_per_step += s.tokens;
        w.model_flops_per_step += s.model_flops;
        ++n;
    }
    if (n > 0) w.tokens_per_step /= n, w.model_flops_per_step /= n;
    return w;
}

RunStats compute_run_stats(const RunResult& r) {
    RunStats st;
    std::vector<double> wall, other, loss, syncs, waits;
    std::array<std::vector<double>, kPhaseCount> ph;
    for (const StepRecord& s : r.steps) {
        if (s.warmup) continue;
        wall.push_back(s.times.wall_ms);
        syncs.push_back(s.host_syncs);
        waits.push_back(s.host_wait_ms);
        other.push_back(s.times.other_ms());
        for (int i = 0; i < kPhaseCount; ++i) ph[i].push_back(s.times.ms[i]);
        if (std::isfinite(s.loss)) loss.push_back(s.loss);
    }
    st.measured = static_cast<int>(wall.size());
    st.step_ms = compute_stats(wall);
    st.other_ms = compute_stats(other);
    st.loss = compute_stats(loss);
    st.host_syncs = compute_stats(syncs);
    st.host_wait_ms = compute_stats(waits);
    for (int i = 0; i < kPhaseCount; ++i) st.phase[i] = compute_stats(ph[i]);
    if (!r.steps.empty()) st.final_loss = r.steps.back().loss;
    if (st.measured > 0 && st.step_ms.median > 0) {
        const double step_s = st.step_ms.median / 1000.0;
        // The global batch: every rank's (data parallel) micro-batches of every micro-step.
        const double world = r.dist ? r.dist->world_size : 1;
        const double samples =
            static_cast<double>(r.config.data.batch_size) * r.config.run.grad_accum * world;
        st.samples_per_s = samples / step_s;
        st.tokens_per_s = samples * r.config.data.seq_len / step_s;
        st.achieved_flops_per_s = r.flops_per_step / step_s;
        if (r.config.data.seq_len_jitter > 0) {
            // Jittered batches are shorter than data.seq_len: count the tokens and FLOPs the
            // measured steps really trained (their mean per step) over the median step.
            const MeasuredWork work = measured_work(r);
            st.tokens_per_s = work.tokens_per_step / step_s;
            st.achieved_flops_per_s = work.model_flops_per_step / step_s;
        }
        if (r.peak_flops && *r.peak_flops > 0) st.mfu = st.achieved_flops_per_s / *r.peak_flops;
    }
    return st;
}

}  // namespace mt

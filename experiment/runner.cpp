// The experiment runner (see runner.h). One step's phases are engine/training_session.h's
// TrainingSession and the loop around them is engine/step_loop.h's StepLoop (the host_sync none
// windows, what a non-finite loss or a stop signal does); this file configures the loop for a
// variant, records what its steps measured in the variant's VariantResult (report/recording.h
// converts the engine's records) and prints their progress.
#include "experiment/runner.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/comm_probe.h"
#include "engine/divergence.h"
#include "engine/signals.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"
#include "experiment/rounds.h"
#include "experiment/worker_process.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/text.h"
#include "report/json_fields.h"
#include "report/recording.h"

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

// Progress: one line per step, or a single \r-updated bar on a terminal. A step is named by its
// number from 0, as the messages (a non-finite value, a divergence) and results.json's `steps`
// and `failed_step` name it, followed by how many of the variant's steps are done:
// "step 3 (4 of 5)".
class Progress {
  public:
    Progress(std::FILE* out, bool bar, std::string variant, int total, int warmup)
        : out_(out), bar_(bar), variant_(std::move(variant)), total_(total), warmup_(warmup) {}
    // `diverged`: the variant was flagged (engine/divergence.h) at this step or before.
    void step(int s, double loss, double ms, bool diverged) {
        if (!out_) return;
        done_ms_ += ms;
        const int done = s + 1;
        const double eta_s = done_ms_ / done * (total_ - done) / 1000.0;
        const std::string tag =
            std::string(s < warmup_ ? " (warm-up)" : "") + (diverged ? " DIVERGED" : "");
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
            std::fprintf(
                out_, "\r  [%s] [%s] step %d (%d of %d)  loss %.4f  %.2f ms/step  ETA %.1f s%s   ",
                variant_.c_str(), b.c_str(), s, done, total_, loss, ms, eta_s, tag.c_str());
        } else {
            std::fprintf(out_, "  [%s] step %d (%d of %d)  loss %.4f  %.2f ms/step  ETA %.1f s%s\n",
                         variant_.c_str(), s, done, total_, loss, ms, eta_s, tag.c_str());
        }
        std::fflush(out_);
    }
    void end() {
        if (out_ && bar_) std::fprintf(out_, "\n");
    }
    // A warning on a line of its own (after the bar's line on a terminal).
    void warn(const std::string& text) {
        if (!out_) return;
        std::fprintf(out_, "%s  warning: [%s] %s\n", bar_ ? "\n" : "", variant_.c_str(),
                     text.c_str());
        std::fflush(out_);
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
    // The CPU kernel set the backend runs (kernels/cpu/cpu_isa.h: one per process, as the
    // backend chose it at construction above).
    if (kind == BackendKind::cpu) v.cpu_isa = cpu::to_string(cpu::cpu_isa_from_environment());
    if (out) std::fprintf(out, "  device: %s\n", v.device_name.c_str());
    if (const auto w = threads_beyond_cores(*backend); w && out)
        std::fprintf(out, "  warning: '%s' %s: %s\n", v.name.c_str(), w->what.c_str(),
                     w->fix.c_str());

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
    // The probe's buffers are freed; whether this variant ran it (the first on a machine
    // without a cached peak) must not show in its peak RSS.
    if (kind == BackendKind::cpu) reset_peak_rss();
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
    d.finest_buckets = static_cast<int>(sync.ready_ranges());
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

// dist.simulate_link_ratio: a simulated link scaled to this machine. The first variant that
// runs with it measures the compute it scales to: its last warm-up step's forward + backward,
// the slowest rank's, so every rank sets the same link. Every later variant reuses that figure:
// the variants of one experiment share one link (a variant that did 4x the work per step, like
// run.grad_accum: 4, must meet the same link, not one 4x slower), as they would share a real
// one; keep the baseline first. Each variant's bandwidth is then the one at which its step's
// gradient traffic (the bytes this rank sent in its last warm-up step) takes `ratio` times that
// compute, so a lab's "comm-bound" means the same on a laptop and on a server.
struct LinkCalibration {
    std::optional<double> compute_ms;  // set by the first variant that scales its link
};

void scale_simulated_link(TrainingSession& session, const RunConfig& cfg, World& world,
                          std::FILE* out, VariantResult& v, LinkCalibration& calibration) {
    const StepRow& last = v.steps.back();
    if (!calibration.compute_ms) {
        double ms = last.phases_ms[static_cast<int>(Phase::forward)] +
                    last.phases_ms[static_cast<int>(Phase::backward)];
        world.allreduce_max(&ms, 1, cfg.dist.timeout_s, "the simulated link's calibration");
        calibration.compute_ms = ms;
    }
    const double compute_ms = *calibration.compute_ms;
    const double seconds = cfg.dist.simulate_link_ratio * compute_ms * 1e-3;
    if (!(seconds > 0) || !(last.comm_bytes > 0)) return;  // nothing to scale to: no link
    const double gbps = last.comm_bytes * 8.0 / seconds / 1e9;
    session.set_simulated_link_gbps(gbps);
    if (v.data_parallel) {
        v.data_parallel->simulated_link_gbps = gbps;
        v.data_parallel->simulated_link_ratio = cfg.dist.simulate_link_ratio;
        v.data_parallel->calibration_compute_ms = compute_ms;
    }
    if (out)
        std::fprintf(out,
                     "  SIMULATED link scaled to this machine: %.4g Gbit/s, so the %.1f MiB of "
                     "gradients a step sends take %.3g x the first variant's warm-up forward + "
                     "backward (%.1f ms)\n",
                     gbps, last.comm_bytes / kMiB, cfg.dist.simulate_link_ratio, compute_ms);
}

}  // namespace

// The trace steps as JSON (what a rank sends rank 0, what a variant's worker sends the runner).
template <>
struct JsonFields<PhaseInterval> {
    using S = PhaseInterval;
    static inline const auto list = std::tuple{
        json_field("phase", &S::phase), json_field("micro_step", &S::micro_step),
        json_field("start_ms", &S::start_ms), json_field("duration_ms", &S::duration_ms)};
};
template <>
struct JsonFields<OpInterval> {
    using S = OpInterval;
    static inline const auto list =
        std::tuple{json_field("name", &S::name), json_field("start_ms", &S::start_ms),
                   json_field("duration_ms", &S::duration_ms)};
};
template <>
struct JsonFields<TraceStep> {
    using S = TraceStep;
    static inline const auto list =
        std::tuple{json_field("step", &S::step), json_field("start_ms", &S::start_ms),
                   json_field("wall_ms", &S::wall_ms), json_field("phases", &S::phases),
                   json_field("ops", &S::ops)};
};
namespace {

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
    std::vector<TraceStep> trace = v.trace;
    for (TraceStep& t : trace) t.ops.clear();  // rank tracks show phases only
    j["trace"] = to_json_value(trace);
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
    read_json_value(JsonNode(j.at("trace"), "a rank's phase times", "trace"), s.trace);
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

// One variant's run, in the three parts a schedule calls: set_up (backend, estimate, peaks,
// session, warm-up steps), run_steps (a range of its measured steps: all of them one after
// another, or one round's slice), finish (memory summary, MFU re-probe, per-op table, the ranks'
// gather). A failure in any part is recorded in the variant's record (failed with the step and
// phase, or skipped when the machine lacks what it needs), never thrown, except on a rank other
// than 0 of a data-parallel job, which cannot go on without that rank.
class VariantRun {
  public:
    // `link`: data parallel, the simulated link's calibration the variants of one experiment
    // share (see LinkCalibration); null where no link is scaled (a worker process of rounds).
    VariantRun(const RunConfig& cfg, const RunnerOptions& opt, bool inject,
               LinkCalibration* link = nullptr)
        : cfg_(cfg),
          opt_(opt),
          inject_(inject),
          v_(variant_result_for(cfg)),
          divergence_(cfg.model.vocab_size),
          link_(link),
          progress_(opt.out, opt.progress_bar.value_or(opt.out && isatty(fileno(opt.out))),
                    cfg.variant, cfg.run.warmup_steps + cfg.run.measure_steps,
                    cfg.run.warmup_steps) {}

    // The variant's header, its backend and session, then its warm-up steps (steps [0, W)).
    // False when it cannot go on (skipped or failed: the record says why).
    bool set_up() {
        std::FILE* out = opt_.out;
        if (out) std::fprintf(out, "\nvariant '%s'\n", cfg_.variant.c_str());
        std::string skip;
        kind_ = resolve_backend(cfg_, &skip);
        if (!kind_) return skip_with(skip, out);
        // The same decision on every rank (it follows from the config and the world size).
        if (cfg_.run.host_sync == HostSync::none && opt_.world && opt_.world->distributed())
            return skip_with(
                "run.host_sync none needs one process: under data parallel every step "
                "all-reduces the loss and agrees on a stop signal on the host",
                out);
        if (cfg_.run.cuda_graph && opt_.world && opt_.world->distributed())
            return skip_with(
                "run.cuda_graph needs one process: under data parallel a host thread reduces the "
                "gradient buckets mid-backward, which a replayed graph cannot wait for",
                out);
        v_.backend = to_string(*kind_);
        return guarded([&] {
            session_ = set_up_session(
                cfg_, *kind_, out, v_, m_,
                inject_ ? opt_.modify_backend : std::function<void(Backend&)>(), opt_.world);
            if (session_->world_size() > 1)
                probe_collectives(*session_, cfg_, *opt_.world, out, v_);
            if (out && session_->defers_read_back())
                std::fprintf(out,
                             "  run.host_sync none: no step waits for the device; losses and times "
                             "are read back after each window (warm-up, measured steps, or %zu "
                             "steps)\n",
                             TrainingSession::kHostSyncWindow);
            run_range(0, cfg_.run.warmup_steps, -1);
            if (session_->world_size() > 1 && cfg_.dist.simulate_link_ratio > 0 && active() &&
                link_)
                scale_simulated_link(*session_, cfg_, *opt_.world, out, v_, *link_);
        });
    }

    // Steps [first, last) as round `round` (its measured steps record it; -1 for the warm-up).
    // `rewarm`: a forward pass first, untimed (TrainingSession::rewarm), so that the slice's
    // first timed step does not pay for the caches and threads another variant's slice left
    // cold. False when the variant cannot go on (failed, interrupted).
    bool run_steps(int first, int last, int round, bool rewarm) {
        if (!active()) return false;
        return guarded([&] {
            if (rewarm) {
                // Other variants' workers ran since this one's last step: their device memory
                // is not this variant's (kernels/own_device_memory.h), their caches are cold.
                session_->backend().rebase_device_memory();
                session_->rewarm();
            }
            run_range(first, last, round);
        });
    }

    // After its steps (or a non-finite value, or an interruption): what the engine measured,
    // into the record. A variant whose session failed keeps the estimate and the peaks.
    VariantResult finish() {
        if (session_)
            guarded([&] {
                if (inject_ && opt_.inspect_model)
                    opt_.inspect_model(cfg_.variant, session_->model());
                finish_variant(*session_, cfg_, *kind_, v_, m_);
                if (session_->world_size() > 1) gather_ranks(*session_, cfg_, *opt_.world, v_);
            });
        session_.reset();
        if (v_.status != RunStatus::skipped || kind_)
            v_.memory = memory_record(m_.estimate, m_.memory);
        v_.roofline = roofline_record(m_.peaks);
        return v_;
    }

    // Whether it can run more steps.
    bool active() const { return session_ && v_.status == RunStatus::ok; }
    int stop_signal_seen() const { return signal_; }
    const VariantResult& record() const { return v_; }
    VariantResult& record() { return v_; }

  private:
    bool skip_with(const std::string& reason, std::FILE* out) {
        v_.status = RunStatus::skipped;
        v_.message = reason;
        v_.backend = cfg_.backend == BackendChoice::cpu ? "cpu" : "cuda";
        if (out) std::fprintf(out, "  skipped: %s\n", reason.c_str());
        return false;
    }

    // Steps [first, last) through a StepLoop (engine/step_loop.h: the windows of run.host_sync
    // none, the non-finite and stop-signal policy), each step recorded with its round and trace,
    // and a progress line.
    void run_range(int first, int last, int round) {
        if (first >= last) return;
        StepLoopOptions loop;
        loop.warmup_steps = cfg_.run.warmup_steps;
        loop.before_step = [&](int s) {
            step_ = s;
            if (inject_ && !opt_.fault.empty() && s == opt_.fault_step && opt_.world &&
                opt_.world->rank() == opt_.fault_rank)
                inject_fault(opt_.fault);
        };
        loop.on_step = [&](const TrainingSession::CompletedStep& done) {
            const StepRecord& rec = done.record;
            record_trace(*session_, done, cfg_, trace_t0_, v_);
            v_.steps.push_back(step_row(rec));
            v_.steps.back().round = rec.warmup ? -1 : round;
            if (std::optional<Divergence> d =
                    divergence_.observe(rec.step, rec.loss, rec.grad_norm)) {
                v_.diverged = d;
                progress_.warn(divergence_warning(*d));
            }
            // Data parallel: once a stop signal arrived, mpirun stops reading the ranks' output
            // while it ends the job; a progress line could then block rank 0 before the report
            // is written, so none is printed.
            if (!(session_->world_size() > 1 && rec.stop_signal))
                progress_.step(rec.step, rec.loss, rec.times.wall_ms, v_.diverged.has_value());
        };
        if (inject_) {
            loop.inject_nan_at_step = opt_.inject_nan_at_step;
            loop.interrupt_at_step = opt_.interrupt_at_step;
        }
        StepLoop steps(*session_, std::move(loop));
        const LoopOutcome outcome = steps.run(first, last);
        step_ = steps.step();
        progress_.end();
        switch (outcome.end) {
            case LoopOutcome::End::completed:
                break;
            case LoopOutcome::End::non_finite:
                fail_on_non_finite(outcome, v_);  // the window's later steps are dropped
                if (opt_.out) std::fprintf(opt_.out, "  %s\n", v_.message.c_str());
                break;
            case LoopOutcome::End::interrupted:
                mark_interrupted(outcome.step, outcome.signal, v_);
                signal_ = outcome.signal;
                // Data parallel: nothing more is printed before the report (see on_step).
                if (opt_.out && !(opt_.world && opt_.world->distributed()))
                    std::fprintf(opt_.out, "  %s\n", v_.message.c_str());
                break;
        }
    }

    // Runs `part`; a failure marks the variant (skipped: the machine lacks what it needs, like
    // a GPU; failed: with the step and phase it happened in). Returns whether it can go on.
    template <class Part>
    bool guarded(Part&& part) {
        try {
            part();
            return active();
        } catch (const ResourceError& e) {
            session_.reset();
            skip_with(e.what(), nullptr);
            v_.backend = kind_ ? to_string(*kind_) : v_.backend;
            v_.memory = memory_record(m_.estimate, MemorySummary{});
            if (opt_.out) std::fprintf(opt_.out, "  skipped: %s\n", v_.message.c_str());
            return false;
        } catch (const std::exception& e) {
            record_failure(e);
            return false;
        }
    }

    void record_failure(const std::exception& e) {
        const std::string phase = session_ ? session_->current_phase() : "setup";
        const World* world = opt_.world;
        const bool distributed = world && world->distributed();
        const std::string where =
            step_ < 0 ? std::string("during setup")
                      : "at step " + std::to_string(step_) + " in the " + phase + " phase";
        // Data parallel: the other ranks are waiting for this one in a collective; they cannot
        // go on. Rank 0 records the failure (the report of what was measured is written before
        // the caller ends the job); another rank's caller ends the job at once.
        if (distributed && world->rank() != 0)
            throw std::runtime_error("rank " + std::to_string(world->rank()) + " of " +
                                     std::to_string(world->size()) + ": variant '" + cfg_.variant +
                                     "' failed " + where + ": " + e.what());
        job_failed_ = distributed;
        v_.status = RunStatus::failed;
        if (step_ >= 0) v_.failed_step = step_;
        v_.failed_phase = phase;
        v_.message =
            std::string(distributed ? "rank 0 of " + std::to_string(world->size()) + ": " : "") +
            "variant '" + cfg_.variant + "' failed " + where + ": " + e.what();
        if (opt_.out) std::fprintf(opt_.out, "  %s\n", v_.message.c_str());
        session_.reset();
    }

  public:
    // Data parallel: this variant failed on rank 0, which ends the job after the report.
    bool job_failed() const { return job_failed_; }

  private:
    const RunConfig& cfg_;
    const RunnerOptions& opt_;
    bool inject_;
    VariantResult v_;
    EngineMeasures m_;
    DivergenceWatch divergence_;  // fed every step, across the variant's slices
    std::optional<BackendKind> kind_;
    std::unique_ptr<TrainingSession> session_;
    LinkCalibration* link_;
    Progress progress_;
    std::optional<std::chrono::steady_clock::time_point> trace_t0_;
    int step_ = -1;
    int signal_ = 0;
    bool job_failed_ = false;
};

// ---- the worker of a variant (interleaved rounds) ----------------------------------------------

// A variant's record travels from its worker process to the runner as one line of JSON: the
// record as results.json holds it, plus what results.json leaves out but the run folder needs
// (each step's tokens and FLOPs, the trace steps).
struct WorkerRecord {
    std::vector<double> tokens, model_flops;  // per step, in the order of VariantResult::steps
    std::vector<TraceStep> trace;
};

}  // namespace

template <>
struct JsonFields<WorkerRecord> {
    using S = WorkerRecord;
    static inline const auto list =
        std::tuple{json_field("tokens", &S::tokens), json_field("model_flops", &S::model_flops),
                   json_field("trace", &S::trace)};
};

namespace {

std::string worker_reply(const VariantRun& run) {
    const VariantResult& v = run.record();
    WorkerRecord extras;
    for (const StepRow& s : v.steps) {
        extras.tokens.push_back(s.tokens);
        extras.model_flops.push_back(s.model_flops);
    }
    extras.trace = v.trace;
    nlohmann::json j;
    j["signal"] = run.stop_signal_seen();
    j["variant"] = variant_to_json(v);
    j["extras"] = to_json_value(extras);
    return j.dump();
}

VariantResult record_from_worker(const std::string& reply, int* signal) {
    const std::string label = "a variant's worker process";
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(reply);
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(label + " sent what is not JSON: " + e.what());
    }
    VariantResult v = variant_from_json(j.at("variant"), label);
    WorkerRecord extras;
    read_json_value(JsonNode(j.at("extras"), label, "extras"), extras);
    if (extras.tokens.size() != v.steps.size() || extras.model_flops.size() != v.steps.size())
        throw std::runtime_error(label + " sent " + std::to_string(extras.tokens.size()) +
                                 " step extras for " + std::to_string(v.steps.size()) + " steps");
    for (size_t i = 0; i < v.steps.size(); ++i) {
        v.steps[i].tokens = extras.tokens[i];
        v.steps[i].model_flops = extras.model_flops[i];
    }
    v.trace = std::move(extras.trace);
    *signal = j.at("signal").get<int>();
    return v;
}

// The runner's side of a variant's worker: requests "setup", "slice FIRST LAST ROUND" and
// "finish", each answered with the variant's record so far (so a worker that dies loses only the
// slice it was running).
class VariantWorker {
  public:
    VariantWorker(const RunConfig& cfg, const RunnerOptions& opt, bool inject)
        : cfg_(cfg),
          record_(variant_result_for(cfg)),
          process_([&cfg, &opt, inject, run = std::make_shared<std::unique_ptr<VariantRun>>()](
                       const std::string& request) -> std::string {
              // In the child: the variant's run lives here from the first request to the last.
              if (!*run) *run = std::make_unique<VariantRun>(cfg, opt, inject);
              VariantRun& r = **run;
              if (request == "setup") {
                  r.set_up();
              } else if (request.rfind("slice ", 0) == 0) {
                  int first = 0, last = 0, round = 0;
                  if (std::sscanf(request.c_str(), "slice %d %d %d", &first, &last, &round) != 3)
                      throw std::invalid_argument("a bad request '" + request + "'");
                  r.run_steps(first, last, round, /*rewarm=*/true);
              } else if (request == "finish") {
                  r.finish();
              } else {
                  throw std::invalid_argument("an unknown request '" + request + "'");
              }
              return worker_reply(r);
          }) {}

    // Sends the request; false when the variant cannot go on (its record says why).
    bool ask(const std::string& request) {
        if (done_) return false;
        const std::optional<std::string> reply = process_.request(request);
        if (!reply) {
            record_.status = RunStatus::failed;
            record_.message = "variant '" + cfg_.variant + "': its worker process " +
                              process_.death() + " during '" + request + "'; the steps it " +
                              "measured before are kept";
            done_ = true;
            return false;
        }
        int signal = 0;
        record_ = record_from_worker(*reply, &signal);
        signal_ = signal;
        if (record_.status != RunStatus::ok) done_ = true;
        return !done_;
    }

    // Ends the worker: the final record (memory summary, per-op table) when it is alive.
    VariantResult finish() {
        if (!process_dead()) {
            int signal = 0;
            if (const std::optional<std::string> reply = process_.request("finish"))
                record_ = record_from_worker(*reply, &signal);
        }
        return record_;
    }

    bool can_run() const { return !done_; }
    int signal() const { return signal_; }
    VariantResult& record() { return record_; }

  private:
    bool process_dead() const { return !process_.death().empty(); }

    const RunConfig& cfg_;
    VariantResult record_;
    WorkerProcess process_;
    bool done_ = false;
    int signal_ = 0;
};

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

namespace {

// The message of a variant that was waiting for its next slice when a stop signal ended the
// experiment: what it measured is kept.
void mark_interrupted_between_slices(VariantResult& v, int sig, int round, int rounds) {
    if (v.status != RunStatus::ok) return;
    const int measured = static_cast<int>(
        std::count_if(v.steps.begin(), v.steps.end(), [](const StepRow& s) { return !s.warmup; }));
    if (measured >= v.measure_steps) return;  // it had run every slice
    v.status = RunStatus::interrupted;
    v.message = "interrupted by " + signal_description(sig) + " in round " +
                std::to_string(round + 1) + " of " + std::to_string(rounds) + "; " +
                std::to_string(measured) + " measured step(s) kept";
}

VariantResult not_run(const RunConfig& cfg, const std::string& why) {
    VariantResult v = variant_result_for(cfg);
    v.status = RunStatus::skipped;
    v.message = why;
    return v;
}

// One variant after another, each in this process (one round; data parallel, or nothing to
// interleave).
void run_one_after_another(const ExperimentSpec& spec, const RunnerOptions& options,
                           ExperimentRun& run, const std::function<void(VariantResult)>& add) {
    Results& res = run.results;
    World* world = options.world && options.world->distributed() ? options.world : nullptr;
    LinkCalibration link;  // one simulated link for every variant (dist.simulate_link_ratio)
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
            add(not_run(cfg, "the experiment was interrupted by " +
                                 signal_description(run.stop_signal) + " before this variant"));
            continue;
        }
        if (!run.job_failure.empty()) {  // data parallel: the job ends after this report
            add(not_run(cfg, "not run: the data-parallel job ended after a failure (" +
                                 run.job_failure + ")"));
            continue;
        }
        const bool inject = options.inject_variant.empty() || options.inject_variant == cfg.variant;
        VariantRun variant(cfg, options, inject, &link);
        if (variant.set_up())
            variant.run_steps(cfg.run.warmup_steps, cfg.run.warmup_steps + cfg.run.measure_steps, 0,
                              /*rewarm=*/false);
        if (variant.stop_signal_seen()) run.stop_signal = variant.stop_signal_seen();
        add(variant.finish());
        if (variant.job_failed()) run.job_failure = res.variants.back().message;
        res.interrupted = run.stop_signal != 0;
    }
}

// The machine's peaks (engine/profile.h) measured once, in a process of their own, before any
// variant's worker starts: the probe's GEMM and copy buffers (and the GEMM workspace its
// 1024^3 shape grows) then stay out of every variant's memory, and the workers read the peaks
// from the cache. A config whose probe fails here is left to its worker, which reports it.
void fill_peak_cache(const ExperimentSpec& spec) {
    WorkerProcess probe([&spec](const std::string&) -> std::string {
        for (const RunConfig& cfg : spec.variants) {
            std::string skip;
            const std::optional<BackendKind> kind = resolve_backend(cfg, &skip);
            if (!kind || *kind != BackendKind::cpu) continue;  // the CPU peaks are cached
            try {
                std::unique_ptr<Backend> backend = create_training_backend(cfg, *kind);
                measure_peaks(*backend);
            } catch (const std::exception&) {
            }
        }
        return "done";
    });
    probe.request("probe");
}

// Interleaved rounds (experiment/rounds.h), each variant in its own worker process
// (experiment/worker_process.h): every worker is set up (its warm-up steps included) in file
// order, then each round runs one slice of every variant in the round's shuffled order, then
// every worker hands back its record.
void run_in_rounds(const ExperimentSpec& spec, const RunnerOptions& options, int rounds,
                   ExperimentRun& run, const std::function<void(VariantResult)>& add) {
    std::FILE* out = options.out;
    const size_t n = spec.variants.size();
    std::vector<std::unique_ptr<VariantWorker>> workers(n);
    int stopped_in_round = -1;
    auto check_signal = [&](int round) {
        if (!run.stop_signal && stop_signal()) run.stop_signal = stop_signal();
        if (run.stop_signal && stopped_in_round < 0) stopped_in_round = round;
        return run.stop_signal != 0;
    };
    fill_peak_cache(spec);
    // Every worker is forked before any is set up: each starts from the same parent (a child's
    // resident memory begins as the parent's), whatever place its variant has in the file.
    for (size_t i = 0; i < n; ++i) {
        const RunConfig& cfg = spec.variants[i];
        const bool inject = options.inject_variant.empty() || options.inject_variant == cfg.variant;
        workers[i] = std::make_unique<VariantWorker>(cfg, options, inject);
    }
    for (size_t i = 0; i < n; ++i) {
        if (check_signal(0)) {
            workers[i].reset();  // never set up: "interrupted before this variant"
            continue;
        }
        workers[i]->ask("setup");
        if (workers[i]->signal()) run.stop_signal = workers[i]->signal();
    }
    const uint64_t seed = spec.variants.front().run.seed;
    for (int r = 0; r < rounds && !check_signal(r); ++r) {
        const std::vector<int> order = round_order(static_cast<int>(n), seed, r);
        if (out) {
            std::fprintf(out, "\nround %d/%d:", r + 1, rounds);
            for (int i : order) std::fprintf(out, " '%s'", spec.variants[i].variant.c_str());
            std::fprintf(out, "\n");
            std::fflush(out);
        }
        for (int i : order) {
            if (!workers[i] || !workers[i]->can_run()) continue;
            const RunConfig& cfg = spec.variants[i];
            const std::vector<RoundSlice> slices =
                round_slices(cfg.run.warmup_steps, cfg.run.measure_steps, rounds);
            if (r >= static_cast<int>(slices.size())) continue;
            if (check_signal(r)) break;
            const RoundSlice s = slices[static_cast<size_t>(r)];
            workers[i]->ask("slice " + std::to_string(s.first) + " " + std::to_string(s.last) +
                            " " + std::to_string(r));
            if (workers[i]->signal() && !run.stop_signal) {
                run.stop_signal = workers[i]->signal();
                stopped_in_round = r;
            }
        }
    }
    for (size_t i = 0; i < n; ++i) {
        const RunConfig& cfg = spec.variants[i];
        if (!workers[i]) {
            add(not_run(cfg, "the experiment was interrupted by " +
                                 signal_description(run.stop_signal) + " before this variant"));
            continue;
        }
        VariantResult v = workers[i]->finish();
        workers[i].reset();  // the worker quits: its memory is the machine's again
        if (run.stop_signal)
            mark_interrupted_between_slices(v, run.stop_signal, std::max(stopped_in_round, 0),
                                            rounds);
        add(std::move(v));
    }
    run.results.interrupted = run.stop_signal != 0;
}

}  // namespace

ExperimentRun run_experiment(const ExperimentSpec& spec, const RunnerOptions& options) {
    std::optional<StopSignals> signals;
    if (options.handle_sigint) signals.emplace();
    ExperimentRun run;
    Results& res = run.results;
    res.experiment = {spec.name, spec.source_path, spec.baseline, spec.loss_tolerance,
                      spec.min_effect};
    res.started_utc = utc_now_iso();
    // Every variant's record is complete (its statistics derived) once it is added.
    const std::function<void(VariantResult)> add = [&res, &options, &spec](VariantResult v) {
        v.aa_control = v.name != spec.baseline && v.changed.empty();
        derive_statistics(v);
        res.variants.push_back(std::move(v));
        if (options.variant_finished) options.variant_finished(res);
    };
    // Rounds interleave the variants; they need more than one variant, more than one measured
    // step per variant, and one process (a data-parallel job's ranks run each variant in
    // lockstep, one after another: its report says the variants were not interleaved).
    int rounds = 1;
    for (const RunConfig& cfg : spec.variants)
        rounds = std::max(rounds, effective_rounds(cfg.run.rounds, cfg.run.measure_steps));
    const bool distributed = options.world && options.world->distributed();
    if (distributed || spec.variants.size() < 2) rounds = 1;
    res.experiment.rounds = rounds;
    if (rounds > 1)
        run_in_rounds(spec, options, rounds, run, add);
    else
        run_one_after_another(spec, options, run, add);
    // The environment and the comparison: on the rank that writes the report (one process: it).
    if (!options.world || options.world->rank() == 0) complete_results(res);
    return run;
}

}  // namespace mt

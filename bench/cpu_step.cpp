// cpu_step: times microtrain's training step on the CPU backend, phase by phase, the way
// bench/torch_cpu_step.py times PyTorch eager, so bench/run_cpu_bench.sh can put them side by
// side. A benchmark, not a test: it prints numbers and asserts nothing about them.
//
//   cpu_step --preset gpt2-mini -B 4 -T 256 --threads 2 --warmup 2 --steps 5 [--json out.json]
//            [--probe] [--profile]
//   cpu_step --list-cpu-isa        the CPU ISA levels this CPU runs, best first, one a line
//   cpu_step ... --turn-in FIFO --turn-out FIFO [--turn-settle-ms 100]
//                                  take turns with a peer process step by step
//                                  (bench/cpu_lockstep.py; bench/turns.py states the protocol)
//
// The ISA level (kernels/cpu/cpu_isa.h) is the backend's: MT_CPU_ISA, else the best this CPU runs.
// The JSON names it ("cpu_isa", and the GEMM it brings, "gemm_impl") so a row of
// bench/run_cpu_bench.sh proves which level it measured.
//
// One step is engine/training_session.h's TrainingSession step, run through engine/step_loop.h's
// StepLoop — the same code `microtrain run` times and the same loop — on one repeated synthetic
// batch (B*T+1 uniform tokens from the seed, targets shifted by one), with global-norm clipping and
// fused AdamW. Its phases are timed by the harness's PhaseTimer (steady_clock on the CPU backend;
// CPU ops are synchronous, so a clock read after a call is when its work is done). The JSON's
// phases:
//   forward   = the forward phase (model.forward, to the per-token losses and their mean)
//   backward  = the backward phase: zero_grad + backward   (PyTorch: zero_grad + loss.backward())
//   optimizer = the optimizer + sync phases: AdamW::step, then the loss and grad-norm read-back
//               and synchronize                       (PyTorch: clip_grad_norm_ + opt.step())
// step = the step's wall time end to end (it also holds the data and h2d phases: handing out the
// batch and copying its B*T ids, microseconds).
//
// Model FLOPs per step are GPT::training_flops_per_step ((6 N + 6 L C T) B T, N every parameter:
// llm.c's count); achieved GFLOP/s = that / median step time. The same formula is evaluated
// independently by the PyTorch script, so both sides are divided by the same work.
//
// --probe measures, in this process, after the steps and with the same thread count, with the
// harness's probes (engine/profile.h; the same ones `microtrain run` uses for MFU and its
// roofline, and this measurement goes into their cache when it beats the cached figure):
//   sgemm: the backend's own matmul_forward (kernels/cpu/gemm.h — the packed AVX-512 GEMM, or
//          Eigen's where that is not compiled — exactly the GEMM the model runs) on
//          1024x1024x1024 and on the model's largest GEMM (the LM head, (B*T, C) x (C, Vp)),
//          best of at least 5 runs after 1 warm-up. 2 M K N flops per run. The roofline's
//          compute peak is the faster of the two (the best GEMM rate seen here).
//   copy:  a 64 MiB memcpy split across the threads (each copies its contiguous slice), best of
//          the same; bandwidth counts bytes read + written (2 x 64 MiB), the same convention as
//          the analytic bytes in the op table (kernels/ops.h).
// Peak RSS (getrusage ru_maxrss) is read before the probes, so their buffers never count.
//
// --profile (implies --probe) attaches the harness's KernelProfiler to the model: each op the
// model scopes (the op table (kernels/ops.h) gives its analytic flops and bytes) is timed over the
// measured steps and aggregated per op and, for matmuls, per layer shape (MatmulLayerLabels). The
// table gives ms/step, % of step, GFLOP/s, GB/s, the arithmetic intensity and the roofline verdict
// against the probes: ridge = sgemm probe FLOP/s / copy GB/s; an op below the ridge is memory-bound
// and its attainable rate is intensity x bandwidth, above it compute-bound (attainable = sgemm
// probe). "% roof" = achieved / attainable. Two bandwidths are measured: DRAM (256 MiB copy)
// and in-cache (a copy of a quarter of the L3 size, from sysfs); an op whose analytic bytes per
// call fit in the L3 is judged against the in-cache rate (mem-LLC), otherwise DRAM (mem-DRAM). Time
// not inside any op (memsets of gradient scratch, the clip-scale scalar, loss read-back) is listed
// as "(outside ops)".
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/step_loop.h"
#include "engine/timing.h"
#include "engine/training_session.h"
#include "io/atomic_file.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/enum_names.h"
#include "kernels/huge_pages.h"

namespace {

using json = nlohmann::json;

// The harness's statistics (engine/timing.h), the ones `microtrain run` reports.
double median(const std::vector<double>& v) {
    return mt::compute_stats(v).median;
}

json series_json(const std::vector<double>& v) {
    const mt::SeriesStats s = mt::compute_stats(v);
    return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"all", v}};
}

struct Args {
    std::string preset;
    int B = 4, T = 0, threads = 2, warmup = 2, steps = 5;
    std::string turn_in, turn_out;  // both or neither: lockstep with a peer
    int turn_settle_ms = 100;
    uint64_t seed = 1337;
    std::string json_path;
    bool probe = false, profile = false;
    std::string attention = "naive", classifier = "fused", layernorm = "separate";
    bool fuse_gelu = false;
};

template <class E>
E parse_kernel(const std::string& flag, const std::string& value) {
    if (auto e = mt::parse_enum<E>(value)) return *e;
    throw std::invalid_argument(flag + " '" + value + "': expected one of " +
                                mt::enum_choices<E>());
}

// The run: the preset at (B, T), fp32, the kernel flags, and the AdamW the PyTorch side uses.
mt::RunConfig bench_config(const Args& a, const mt::GPTConfig& model, int T) {
    mt::RunConfig c;
    c.variant = "cpu_step";
    c.backend = mt::BackendChoice::cpu;
    c.model_preset = a.preset;
    c.model = model;
    c.data.batch_size = a.B;
    c.data.seq_len = T;
    c.run.seed = a.seed;
    c.run.threads = a.threads;
    c.run.precision = mt::Precision::fp32;
    c.kernels.attention = parse_kernel<mt::AttentionImpl>("--attention", a.attention);
    c.kernels.classifier = parse_kernel<mt::ClassifierImpl>("--classifier", a.classifier);
    c.kernels.layernorm = parse_kernel<mt::LayerNormImpl>("--layernorm", a.layernorm);
    c.kernels.fuse_gelu = a.fuse_gelu;
    c.optim.lr = 3e-4f;
    c.optim.beta1 = 0.9f;
    c.optim.beta2 = 0.95f;
    c.optim.eps = 1e-8f;
    c.optim.weight_decay = 0.1f;
    c.optim.grad_clip = 1.0f;
    c.optim.impl = mt::AdamWImpl::fused;
    c.profile.kernels = a.profile;
    c.profile.trace = false;
    return c;
}

// Per measured step, in ms; the losses of every step (warm-up included).
struct StepSeries {
    std::vector<double> forward, backward, optimizer, step, losses;
    // Every step's start and end (warm-up included) in ms on CLOCK_MONOTONIC (libstdc++'s
    // steady_clock, which Python's time.monotonic reads too): the session's own record of the
    // step, its host start plus its wall time. bench/cpu_lockstep.py checks that no two steps of
    // the pair overlapped.
    std::vector<std::pair<double, double>> spans;
};

// Lockstep with a peer process, the protocol bench/turns.py states (its Python side): one byte
// read from `turn_in` before each step, a pause of `settle_ms` for the peer's threads to go to
// sleep, one byte written to `turn_out` after the step; both FIFOs opened read-write, so no open
// or last write waits for the peer.
class Turns {
  public:
    Turns(const std::string& in, const std::string& out, int settle_ms)
        : in_(open_fifo(in, "--turn-in")),
          out_(open_fifo(out, "--turn-out")),
          settle_ms_(settle_ms) {}
    Turns(const Turns&) = delete;
    Turns& operator=(const Turns&) = delete;
    ~Turns() {
        ::close(in_);
        ::close(out_);
    }
    void wait_for_turn() {
        char token;
        ssize_t n;
        while ((n = ::read(in_, &token, 1)) != 1)
            if (n == 0 || errno != EINTR)
                throw std::runtime_error(std::string("--turn-in: reading the turn failed: ") +
                                         (n == 0 ? "end of file" : std::strerror(errno)));
        std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms_));
    }
    void pass_turn() {
        const char token = 't';
        while (::write(out_, &token, 1) != 1)
            if (errno != EINTR)
                throw std::runtime_error(std::string("--turn-out: passing the turn failed: ") +
                                         std::strerror(errno));
    }

  private:
    static int open_fifo(const std::string& path, const char* flag) {
        const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0)
            throw std::runtime_error(std::string(flag) + " '" + path +
                                     "': " + std::strerror(errno) + " (a FIFO made with mkfifo)");
        return fd;
    }
    int in_, out_, settle_ms_;
};

// Warm-up + measured steps through a StepLoop (engine/step_loop.h), one line each. Returns false
// (after saying so) at a non-finite loss or gradient norm, where the loop stops.
bool run_steps(mt::TrainingSession& session, const Args& a, StepSeries& series) {
    using mt::Phase;
    std::unique_ptr<Turns> turns;
    if (!a.turn_in.empty())
        turns = std::make_unique<Turns>(a.turn_in, a.turn_out, a.turn_settle_ms);
    mt::StepLoopOptions loop;
    loop.warmup_steps = a.warmup;
    if (turns) loop.before_step = [&](int) { turns->wait_for_turn(); };
    loop.on_step = [&](const mt::TrainingSession::CompletedStep& done) {
        const double start =
            std::chrono::duration<double, std::milli>(done.host_start.time_since_epoch()).count();
        series.spans.emplace_back(start, start + done.record.times.wall_ms);
        if (turns) turns->pass_turn();
    };
    loop.after_step = [&](const mt::StepRecord& rec, int) {
        const bool measured = !rec.warmup;
        const double fwd = rec.times[Phase::forward], bwd = rec.times[Phase::backward];
        const double opt = rec.times[Phase::optimizer] + rec.times[Phase::sync];
        std::printf("  step %2d %-7s loss %.4f  %9.1f ms (fwd %.1f bwd %.1f opt %.1f)\n",
                    rec.step + 1, measured ? "" : "warmup", rec.loss, rec.times.wall_ms, fwd, bwd,
                    opt);
        std::fflush(stdout);
        series.losses.push_back(rec.loss);
        if (!measured) return;
        series.forward.push_back(fwd);
        series.backward.push_back(bwd);
        series.optimizer.push_back(opt);
        series.step.push_back(rec.times.wall_ms);
    };
    const mt::LoopOutcome outcome =
        mt::StepLoop(session, std::move(loop)).run(0, a.warmup + a.steps);
    if (outcome.end == mt::LoopOutcome::End::non_finite) {
        std::fprintf(stderr, "cpu_step: %s is not finite (%f) at step %d\n",
                     outcome.non_finite.in_loss ? "loss" : "gradient norm",
                     outcome.non_finite.value, outcome.step + 1);
        return false;
    }
    // (No stop signal is handled here: Ctrl-C ends the bench the ordinary way.)
    return true;
}

// The step's numbers as bench/run_cpu_bench.sh reads them.
json step_json(const Args& a, const mt::RunConfig& cfg, mt::TrainingSession& session,
               const StepSeries& series, double rss) {
    const mt::GPTConfig& m = cfg.model;
    const double step_ms = median(series.step);
    const double tokens = static_cast<double>(cfg.data.batch_size) * cfg.data.seq_len;
    const std::string device = session.backend().device_name();
    json out;
    out["impl"] = "microtrain";
    out["preset"] = a.preset;
    out["model"] = {{"n_layer", m.n_layer},
                    {"n_head", m.n_head},
                    {"n_embd", m.n_embd},
                    {"vocab_size", m.vocab_size},
                    {"padded_vocab_size", m.padded_vocab_size()},
                    {"max_seq_len", m.max_seq_len},
                    {"params", session.n_params()}};
    out["B"] = cfg.data.batch_size;
    out["T"] = cfg.data.seq_len;
    out["threads"] = a.threads;
    out["warmup"] = a.warmup;
    out["steps"] = a.steps;
    out["device"] = device;
    // The level the backend chose at construction: the same call, on the same environment.
    out["cpu_isa"] = mt::cpu::to_string(mt::cpu::cpu_isa_from_environment());
    out["gemm_impl"] = mt::cpu::gemm_impl_name();
    out["cpu_model"] = mt::cpu_model_of(device);
    out["kernels"] = {{"attention", a.attention},
                      {"classifier", a.classifier},
                      {"layernorm", a.layernorm},
                      {"fuse_gelu", a.fuse_gelu}};
    out["profiled"] = a.profile;
    out["step_ms"] = series_json(series.step);
    out["forward_ms"] = series_json(series.forward);
    out["backward_ms"] = series_json(series.backward);
    out["optimizer_ms"] = series_json(series.optimizer);
    out["tokens_per_s"] = tokens / (step_ms * 1e-3);
    out["flops_per_step"] = session.flops_per_step();
    out["gflops"] = session.flops_per_step() / (step_ms * 1e-3) / 1e9;
    out["peak_rss_mib"] = rss;
    out["huge_pages"] = mt::huge_page_policy().text;
    const long long huge_bytes = mt::huge_page_resident_bytes();  // -1: the kernel does not say
    out["huge_pages_mib"] =
        huge_bytes < 0 ? json(nullptr) : json(static_cast<double>(huge_bytes) / (1 << 20));
    out["losses"] = series.losses;
    out["step_spans_ms"] = series.spans;  // [start, end] of every step, warm-up included
    out["lockstep"] = a.turn_in.empty() ? json(nullptr)
                                        : json{{"turn_in", a.turn_in},
                                               {"turn_out", a.turn_out},
                                               {"settle_ms", a.turn_settle_ms}};
    return out;
}

// The probes of this process: the harness's peaks (1024^3 sgemm, DRAM copy), the LM head's GEMM
// shape and an in-cache copy of a quarter of the LLC (source + destination = half of it).
struct Probes {
    mt::MachinePeaks peaks;
    int lm_M = 0, lm_K = 0, lm_N = 0;
    double lm_flops_per_s = 0;
    size_t llc_bytes = 0;
    double llc_bytes_per_s = 0;
    // The roofline's peaks: the compute roof is the faster GEMM probe.
    mt::MachinePeaks roof() const {
        mt::MachinePeaks r = peaks;
        r.flops_per_s = std::max(peaks.flops_per_s, lm_flops_per_s);
        return r;
    }
};

Probes run_probes(mt::Backend& backend, const mt::RunConfig& cfg) {
    Probes p;
    p.peaks = mt::probe_peaks_now(backend);
    p.lm_M = cfg.data.batch_size * cfg.data.seq_len;
    p.lm_K = cfg.model.n_embd;
    p.lm_N = cfg.model.padded_vocab_size();
    int reps = 0;
    p.lm_flops_per_s = mt::probe_gemm_flops_per_s(backend, p.lm_M, p.lm_K, p.lm_N, &reps);
    p.llc_bytes = mt::last_level_cache_bytes();
    if (p.llc_bytes >= (size_t(1) << 20))
        p.llc_bytes_per_s = mt::probe_copy_bytes_per_s(backend, p.llc_bytes / 4, &reps);
    backend.reset_peaks();
    return p;
}

json probe_json(const Probes& p) {
    const double mib = 1 << 20;
    return {
        {"sgemm_impl", std::string(mt::cpu::gemm_impl_name()) + " via CpuBackend::matmul_forward"},
        {"sgemm_1024_gflops", p.peaks.flops_per_s / 1e9},
        {"sgemm_model_gflops", p.lm_flops_per_s / 1e9},
        {"sgemm_model_shape", {p.lm_M, p.lm_K, p.lm_N}},
        {"copy_gbps", p.peaks.bytes_per_s / 1e9},
        {"copy_mib", static_cast<double>(mt::peak_probe_copy_bytes(mt::BackendKind::cpu)) / mib},
        {"copy_llc_gbps", p.llc_bytes_per_s / 1e9},
        {"copy_llc_mib", static_cast<double>(p.llc_bytes / 4) / mib},
        {"llc_mib", static_cast<double>(p.llc_bytes) / mib}};
}

// "compute", "mem-LLC" (judged against the in-cache copy rate) or "mem-DRAM".
const char* bound_label(const mt::KernelStat& k) {
    if (k.bound == mt::Bound::compute) return "compute";
    if (k.bound == mt::Bound::memory) return k.in_cache ? "mem-LLC" : "mem-DRAM";
    return "unknown";
}

// Prints the per-op roofline table and returns it as JSON.
json profile_json(const mt::KernelProfiler& profiler, const Probes& p, const Args& a,
                  const StepSeries& series) {
    const mt::MachinePeaks roof = p.roof();
    const double mean_step = mt::compute_stats(series.step).mean;
    const std::vector<mt::KernelStat> rows =
        profiler.table(mean_step, a.steps, roof, {p.llc_bytes, p.llc_bytes_per_s});
    std::printf(
        "\n  per-op profile: mean over %d measured steps, step %.1f ms (mean); "
        "sgemm probe (best of the two) %.1f GFLOP/s, copy %.1f GB/s DRAM (ridge %.1f flop/B), "
        "%.1f GB/s in the %.0f MiB LLC\n",
        a.steps, mean_step, roof.flops_per_s / 1e9, roof.bytes_per_s / 1e9, roof.ridge(),
        p.llc_bytes_per_s / 1e9, static_cast<double>(p.llc_bytes) / (1 << 20));
    std::printf("  %-44s %6s %9s %6s %8s %7s %7s %-8s %6s\n", "op", "calls", "ms/step", "%step",
                "GFLOP/s", "GB/s", "flop/B", "bound", "%roof");
    json table = json::array();
    double op_ms = 0;
    for (const mt::KernelStat& k : rows) {
        const double calls = static_cast<double>(k.calls) / a.steps;
        op_ms += k.ms_per_step;
        std::printf("  %-44s %6.0f %9.2f %5.1f%% %8.1f %7.1f %7.1f %-8s %5.0f%%\n", k.name.c_str(),
                    calls, k.ms_per_step, k.pct_of_step, k.gflops_per_s(), k.gb_per_s(),
                    k.intensity(), bound_label(k), k.pct_of_roofline);
        table.push_back({{"op", k.name},
                         {"calls_per_step", calls},
                         {"ms_per_step", k.ms_per_step},
                         {"pct_of_step", k.pct_of_step},
                         {"gflops", k.gflops_per_s()},
                         {"gbps", k.gb_per_s()},
                         {"flops_per_byte", k.intensity()},
                         {"bound", bound_label(k)},
                         {"pct_of_roofline", k.pct_of_roofline}});
    }
    const double outside = mean_step - op_ms;
    std::printf("  %-44s %6s %9.2f %5.1f%%\n", "(outside ops: memsets, clip scale, loss read)", "",
                outside, 100.0 * outside / mean_step);
    return {{"ops", table},
            {"outside_ops_ms_per_step", outside},
            {"mean_step_ms", mean_step},
            {"ridge_flops_per_byte", roof.ridge()}};
}

// The preset and T, or nullopt after printing why not.
std::optional<mt::GPTConfig> checked_preset(const Args& a, int* T) {
    auto cfg = mt::gpt_preset(a.preset);
    if (!cfg) {
        std::string names;
        for (const auto& n : mt::gpt_preset_names()) names += (names.empty() ? "" : ", ") + n;
        std::fprintf(stderr, "cpu_step: unknown --preset '%s'; expected one of: %s\n",
                     a.preset.c_str(), names.c_str());
        return std::nullopt;
    }
    *T = a.T > 0 ? a.T : cfg->max_seq_len;
    if (*T > cfg->max_seq_len) {
        std::fprintf(stderr,
                     "cpu_step: -T %d exceeds max_seq_len %d of preset '%s'; use -T <= %d\n", *T,
                     cfg->max_seq_len, a.preset.c_str(), cfg->max_seq_len);
        return std::nullopt;
    }
    return cfg;
}

int run(const Args& a) {
    int T = 0;
    const auto model = checked_preset(a, &T);
    if (!model) return 2;
    const mt::RunConfig cfg = bench_config(a, *model, T);
    mt::TrainingInputs inputs;
    inputs.batches = std::make_unique<mt::RepeatedBatch>(
        mt::RepeatedBatch::uniform_random(a.B, T, model->vocab_size, a.seed));
    inputs.track_memory = false;  // the bench reports the process's peak RSS instead
    mt::TrainingSession session(mt::create_training_backend(cfg, mt::BackendKind::cpu), cfg,
                                std::move(inputs));
    if (session.profiler())
        session.profiler()->set_op_labels(mt::MatmulLayerLabels(*model, a.B, T));

    std::printf("cpu_step: microtrain %s (%s), %zu params, B=%d T=%d, %s\n", a.preset.c_str(),
                model->describe().c_str(), session.n_params(), a.B, T,
                session.backend().device_name().c_str());
    std::printf("  kernels: attention=%s classifier=%s layernorm=%s fuse_gelu=%s%s\n",
                a.attention.c_str(), a.classifier.c_str(), a.layernorm.c_str(),
                a.fuse_gelu ? "on" : "off", a.profile ? "  [profiling: per-op clocks on]" : "");

    StepSeries series;
    if (!run_steps(session, a, series)) return 1;
    session.finish();  // detaches the profiler
    // Peak RSS in MiB, before the probes allocate anything.
    const double rss = static_cast<double>(mt::process_peak_rss_bytes()) / (1 << 20);
    json out = step_json(a, cfg, session, series, rss);
    const double step_ms = median(series.step), gflops = out["gflops"].get<double>();
    std::printf("  median step %.1f ms  (forward %.1f, backward %.1f, optimizer %.1f)\n", step_ms,
                median(series.forward), median(series.backward), median(series.optimizer));
    std::printf("  %.0f tokens/s, %.3f GFLOP/step, %.1f GFLOP/s, peak RSS %.0f MiB\n",
                out["tokens_per_s"].get<double>(), session.flops_per_step() / 1e9, gflops, rss);
    const json& huge_mib = out["huge_pages_mib"];
    std::printf("  huge pages: %s; %s of this process's memory on them\n",
                out["huge_pages"].get<std::string>().c_str(),
                huge_mib.is_null()
                    ? "unknown (no AnonHugePages in /proc/self/smaps_rollup)"
                    : (std::to_string(std::lround(huge_mib.get<double>())) + " MiB").c_str());

    if (a.probe || a.profile) {
        const Probes p = run_probes(session.backend(), cfg);
        out["probe"] = probe_json(p);
        std::printf(
            "  probe: sgemm 1024^3 %.1f GFLOP/s, sgemm %dx%dx%d (LM head) %.1f GFLOP/s, "
            "copy %.1f GB/s DRAM, %.1f GB/s in LLC (read+write); step reaches %.0f%% of the "
            "1024^3 probe\n",
            p.peaks.flops_per_s / 1e9, p.lm_M, p.lm_K, p.lm_N, p.lm_flops_per_s / 1e9,
            p.peaks.bytes_per_s / 1e9, p.llc_bytes_per_s / 1e9,
            100.0 * gflops * 1e9 / p.peaks.flops_per_s);
        if (session.profiler()) out["profile"] = profile_json(*session.profiler(), p, a, series);
    }

    if (!a.json_path.empty()) {
        mt::write_file_atomic(a.json_path, out.dump(2) + "\n");
        std::printf("  wrote %s\n", a.json_path.c_str());
    }
    return 0;
}

// Prints the levels this CPU runs, best first (what MT_CPU_ISA accepts here).
void print_cpu_isa_levels() {
    for (mt::cpu::CpuIsa isa : mt::cpu::runnable_cpu_isa_levels(mt::cpu::detect_cpu_features()))
        std::printf("%s\n", mt::cpu::to_string(isa));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "cpu_step: times microtrain's CPU training step (forward, backward, optimizer) "
        "for bench/run_cpu_bench.sh"};
    Args a;
    // Answered before the other options are checked (--preset is not needed for it).
    app.add_flag_callback(
        "--list-cpu-isa",
        [] {
            print_cpu_isa_levels();
            throw CLI::Success();
        },
        "Print the CPU ISA levels this CPU runs (values of MT_CPU_ISA), best first, and exit");
    app.add_option("--preset", a.preset, "Model preset (tiny, gpt2-mini, gpt2-124M, ...)")
        ->required();
    app.add_option("-B,--batch", a.B, "Batch size")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("-T,--seq-len", a.T, "Sequence length (default: the preset's max_seq_len)")
        ->check(CLI::PositiveNumber);
    app.add_option("--threads", a.threads, "OpenMP threads")
        ->capture_default_str()
        ->check(CLI::Range(1, mt::kMaxThreads));
    app.add_option("--warmup", a.warmup, "Warm-up steps (not measured)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--steps", a.steps, "Measured steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--seed", a.seed, "Seed for weights and the synthetic batch")
        ->capture_default_str();
    app.add_option("--json", a.json_path, "Write the results as JSON to this file (atomically)");
    app.add_flag("--probe", a.probe, "Measure the sgemm and copy-bandwidth probes after the steps");
    app.add_flag("--profile", a.profile,
                 "Time every op and print the per-op roofline table (implies --probe)");
    app.add_option("--attention", a.attention, "Attention kernel")
        ->capture_default_str()
        ->check(CLI::IsMember({"naive", "flash"}));
    app.add_option("--classifier", a.classifier, "Classifier kernel")
        ->capture_default_str()
        ->check(CLI::IsMember({"fused", "unfused"}));
    app.add_option("--layernorm", a.layernorm, "LayerNorm variant")
        ->capture_default_str()
        ->check(CLI::IsMember({"separate", "fused_residual"}));
    app.add_flag("--fuse-gelu", a.fuse_gelu, "c_fc matmul with the GELU epilogue");
    auto* turn_in = app.add_option("--turn-in", a.turn_in,
                                   "FIFO to read this process's turn from before each step "
                                   "(lockstep with a peer: bench/cpu_lockstep.py)");
    auto* turn_out = app.add_option("--turn-out", a.turn_out,
                                    "FIFO to pass the turn to the peer through after each step");
    turn_in->needs(turn_out);
    turn_out->needs(turn_in);
    app.add_option("--turn-settle-ms", a.turn_settle_ms,
                   "Wait after getting the turn, before the step (the peer's threads go idle)")
        ->capture_default_str()
        ->check(CLI::Range(0, 10000));
    CLI11_PARSE(app, argc, argv);
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cpu_step: error: %s\n", e.what());
        return 1;
    }
}

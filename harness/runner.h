// The experiment runner: every variant of an ExperimentSpec gets a fresh backend, model,
// optimizer and data loader from the same seed (so the same initial weights and the same
// batches), runs warm-up + measured steps with every phase timed and memory sampled, and yields
// a RunResult per variant. Non-finite losses stop the variant (named variant, step and phase);
// Ctrl-C stops the experiment after the current step. Either way what was measured is kept and
// the report is still written.
#pragma once

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/memory.h"
#include "harness/profile.h"
#include "harness/spec.h"
#include "harness/timing.h"
#include "model/gpt.h"

namespace mt {

struct StepRecord {
    int step = 0;  // 0-based over warm-up + measured steps
    bool warmup = false;
    PhaseTimes times;
    double loss = 0;       // mean over the step's micro-batches
    double grad_norm = 0;  // global L2 norm before clipping (0 when clipping is off)
    double lr = 0;         // learning rate used by this step
};

// One step's timeline for trace.json (only profile.trace_steps measured steps are kept).
struct TraceStep {
    int step = 0;
    double start_ms = 0;  // host offset of the step start from the variant's first step
    double wall_ms = 0;
    std::vector<PhaseInterval> phases;
    std::vector<OpInterval> ops;  // when profile.kernels
};

enum class RunStatus { ok, failed, interrupted, skipped };
template <>
struct EnumSpelling<RunStatus> {
    static constexpr std::array<std::string_view, 4> names{"ok", "failed", "interrupted",
                                                           "skipped"};
};

struct RunResult {
    RunConfig config;
    RunStatus status = RunStatus::ok;
    std::string message;       // why failed / skipped / interrupted (empty when ok)
    int failed_step = -1;      // step of a non-finite loss
    std::string failed_phase;  // phase that produced it
    std::string backend;       // "cpu" / "cuda" (resolved)
    std::string device_name;
    int threads = 0;  // CPU threads in use
    size_t n_params = 0;
    double flops_per_step = 0;         // analytic model FLOPs (forward + backward, all micro-steps)
    std::optional<double> peak_flops;  // for MFU (nullopt: unknown, MFU n/a)
    std::string peak_flops_source;
    MachinePeaks peaks;  // roofline
    MemoryEstimate estimate;
    MemorySummary memory;
    std::vector<StepRecord> steps;
    std::vector<KernelStat> kernels;  // empty unless profile.kernels
    std::vector<TraceStep> trace;
    double setup_ms = 0;
};

struct ExperimentResult {
    std::string name;
    std::string source_path;
    std::string baseline;
    std::optional<double> loss_tolerance;  // compare.loss_tolerance; nullopt: derived
    std::vector<RunResult> runs;           // in spec order (skipped/unrun variants included)
    bool interrupted = false;
    std::string started_utc;  // ISO 8601
};

struct RunnerOptions {
    // Where progress goes; nullptr = silent.
    std::FILE* out = stdout;
    // Progress bar (\r updates) instead of one line per step; default: isatty(out).
    std::optional<bool> progress_bar;
    // Test hooks. Applied to the variant named `inject_variant` (empty: every variant).
    std::string inject_variant;
    int inject_nan_at_step = -1;  // the loss read back at this step is replaced by NaN
    int interrupt_at_step = -1;   // behave as if SIGINT arrived during this step
    // Called on the variant's backend before the model is built: a test swaps in a kernel here
    // (Backend::kernels()), e.g. a deliberately wrong one that the loss check must catch.
    std::function<void(Backend&)> modify_backend;
    // Install a SIGINT handler for the duration of the run (off in tests).
    bool handle_sigint = true;
};

// Runs every variant. Never throws for a variant's failure (it is recorded in its RunResult);
// throws only for programming errors.
ExperimentResult run_experiment(const ExperimentSpec& spec, const RunnerOptions& options = {});

// Per-run derived numbers, shared by the report writers.
struct RunStats {
    SeriesStats step_ms;                         // measured steps' wall time
    std::array<SeriesStats, kPhaseCount> phase;  // per phase
    SeriesStats other_ms;
    SeriesStats loss;
    int measured = 0;
    double samples_per_s = 0;  // B * grad_accum / median step
    double tokens_per_s = 0;   // B * T * grad_accum / median step
    double achieved_flops_per_s = 0;
    std::optional<double> mfu;
    double final_loss = 0;
};
RunStats compute_run_stats(const RunResult& r);

}  // namespace mt

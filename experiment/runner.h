// The experiment runner: every variant of an ExperimentSpec gets a fresh backend, model,
// optimizer and data loader from the same seed (so the same initial weights and the same
// batches), runs warm-up + measured steps with every phase timed and memory sampled, and yields
// a RunResult per variant. Non-finite losses stop the variant (named variant, step and phase);
// a stop signal (Ctrl-C, SIGTERM, SIGHUP, ...: engine/signals.h) stops the experiment after the
// current step. Either way what was measured is kept and the report is still written. A variant
// whose memory estimate exceeds the device's memory is skipped before anything is allocated.
#pragma once

#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "distributed/world.h"
#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/step_record.h"
#include "engine/timing.h"
#include "experiment/spec.h"
#include "model/gpt.h"

namespace mt {

// One step's timeline for trace.json (only profile.trace_steps measured steps are kept).
struct TraceStep {
    int step = 0;
    double start_ms = 0;  // host offset of the step start from the variant's first step
    double wall_ms = 0;
    std::vector<PhaseInterval> phases;
    std::vector<OpInterval> ops;  // when profile.kernels
};

// One rank of a data-parallel variant: medians over its measured steps.
struct RankSummary {
    int rank = 0;
    double step_ms = 0;                           // median wall time of a step
    std::array<double, kPhaseCount> phases_ms{};  // median per phase (comm = exposed wait)
    double comm_busy_ms = 0;                      // median link-busy time per step
    // Communication hidden under backward: median of max(0, busy - exposed) per step.
    double comm_overlapped_ms = 0;
    std::vector<TraceStep> trace;  // this rank's kept steps, for one trace track per rank
};

// How a data-parallel variant communicated, and what each rank measured (distributed/, DESIGN.md).
struct DataParallelRun {
    int world_size = 1;
    std::string transport;  // "MPI (Open MPI 4.1.4)", "NCCL 2.27.3"
    int zero = 0;           // ZeRO stage (0 or 1)
    bool overlap = true;
    double bucket_mb = 0;
    int buckets = 0;  // gradient buckets per step
    // dist.simulate_link_gbps / simulate_latency_us: a SIMULATED slow link stretched the
    // collectives to what it would take (0 = the real transport only).
    double simulated_link_gbps = 0, simulated_latency_us = 0;
    double bytes_per_step = 0;               // bytes each rank sends per step (median)
    double achieved_busbw_gbps = 0;          // bytes_per_step / median busy time, in GB/s
    std::optional<double> probe_busbw_gbps;  // a measured all-reduce of the same transport
    std::string probe_source;                // "measured now (...)" / "cache (...)"
    std::vector<RankSummary> ranks;          // every rank, in rank order
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
    std::optional<DataParallelRun> dist;  // nullopt: one rank
};

struct ExperimentResult {
    std::string name;
    std::string source_path;
    std::string baseline;
    std::optional<double> loss_tolerance;  // compare.loss_tolerance; nullopt: derived
    std::vector<RunResult> runs;           // in spec order (skipped/unrun variants included)
    bool interrupted = false;
    // Data parallel: a variant failed on rank 0 (its own error, or a timeout waiting for a rank
    // that died or hangs). The other ranks cannot go on, so the experiment stops there; the
    // caller writes the report of what was measured, then ends the job. Empty: no such failure.
    std::string job_failure;
    int stop_signal = 0;      // the signal that interrupted it (0: none)
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
    // Data-parallel fault injection (tests): on rank `fault_rank`, before step `fault_step`,
    // "kill" (SIGKILL itself), "hang" (sleep without end) or "throw" (an exception). Empty: none.
    std::string fault;
    int fault_rank = -1, fault_step = -1;
    // Called on the variant's backend before the model is built: a test swaps in a kernel here
    // (Backend::kernels()), e.g. a deliberately wrong one that the loss check must catch.
    std::function<void(Backend&)> modify_backend;
    // Install the stop-signal handlers (engine/signals.h) for the duration of the run. Off in
    // tests, and where the caller holds a StopSignals of its own (`microtrain run`, whose scope
    // also covers writing the report).
    bool handle_sigint = true;  // (the name predates the other signals)
    // Data parallel: the job's world (distributed/world.h); null or one rank = one process. With
    // several ranks every rank runs every variant in lockstep and rank 0's result holds what
    // every rank measured (RunResult::dist). A variant that throws on rank 0 is recorded and
    // ends the experiment (ExperimentResult::job_failure); on another rank it is rethrown: the
    // caller ends the job (the others cannot go on without that rank).
    World* world = nullptr;
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
    SeriesStats host_syncs, host_wait_ms;  // per measured step (StepRecord, run.host_sync)
    int measured = 0;
    double samples_per_s = 0;  // B * grad_accum / median step
    double tokens_per_s = 0;   // B * T * grad_accum / median step (jitter: real tokens)
    double achieved_flops_per_s = 0;
    std::optional<double> mfu;
    double final_loss = 0;
};
RunStats compute_run_stats(const RunResult& r);

// The mean over the measured steps of StepRecord::tokens and ::model_flops: what a step really
// trained when data.seq_len_jitter shortens its batches.
struct MeasuredWork {
    double tokens_per_step = 0, model_flops_per_step = 0;
};
MeasuredWork measured_work(const RunResult& r);

}  // namespace mt

// The experiment runner: every variant of an ExperimentSpec gets a fresh backend, model,
// optimizer and data loader from the same seed (so the same initial weights and the same
// batches), runs warm-up + measured steps with every phase timed and memory sampled, and records
// what it measured straight into the run's Results (report/results.h, through
// report/recording.h): one VariantResult per variant. Non-finite losses stop the variant (named
// variant, step and phase); a stop signal (Ctrl-C, SIGTERM, SIGHUP, ...: engine/signals.h) stops
// the experiment after the current step. Either way what was measured is kept and the report is
// still written. A variant whose memory estimate exceeds the device's memory is skipped before
// anything is allocated.
#pragma once

#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "distributed/world.h"
#include "experiment/spec.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "report/results.h"

namespace mt {

// What run_experiment returns: the run's results, and how the experiment ended, which the caller
// (`microtrain run`) needs beyond them for its exit code and for ending a data-parallel job.
struct ExperimentRun {
    // Complete: every variant in spec order (skipped and unrun ones included), their statistics,
    // and (one process, or rank 0) the environment and the comparison (complete_results).
    Results results;
    int stop_signal = 0;  // the signal that interrupted it (0: none)
    // Data parallel: a variant failed on rank 0 (its own error, or a timeout waiting for a rank
    // that died or hangs). The other ranks cannot go on, so the experiment stops there; the
    // caller writes the report of what was measured, then ends the job. Empty: no such failure.
    std::string job_failure;
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
    // Called with the variant's model once its steps are done, before its memory summary: a
    // test reads the final weights here (under run.rounds it runs in the variant's worker
    // process, so it must leave its findings outside the process, e.g. in a file).
    std::function<void(const std::string& variant, GPT& model)> inspect_model;
    // Install the stop-signal handlers (engine/signals.h) for the duration of the run. Off in
    // tests, and where the caller holds a StopSignals of its own (`microtrain run`, whose scope
    // also covers writing the report).
    bool handle_sigint = true;  // (the name predates the other signals)
    // Data parallel: the job's world (distributed/world.h); null or one rank = one process. With
    // several ranks every rank runs every variant in lockstep and rank 0's result holds what
    // every rank measured (VariantResult::data_parallel). A variant that throws on rank 0 is
    // recorded and ends the experiment (ExperimentRun::job_failure); on another rank it is
    // rethrown: the caller ends the job (the others cannot go on without that rank).
    World* world = nullptr;
    // Called after each variant's record is complete, with every variant finished so far (in
    // file order; the environment and comparison not yet built): `run` writes them to the run
    // folder (report/run_folder.h write_finished_variants), so a later fault loses at most the
    // variant in progress. Under data parallel only rank 0's is set. Null: nothing is called.
    std::function<void(const Results& so_far)> variant_finished;
};

// Runs every variant. Never throws for a variant's failure (it is recorded in its
// VariantResult); throws only for programming errors.
ExperimentRun run_experiment(const ExperimentSpec& spec, const RunnerOptions& options = {});

// The record of variant `cfg` before it runs: its name, its configuration (every dotted key,
// flatten), what it changed, its model and batch shape and step counts; every measurement at its
// "nothing measured" value (memory_record / roofline_record of nothing). The runner fills the
// rest as the variant runs; a test fills it by hand. derive_statistics (report/recording.h)
// completes it.
VariantResult variant_result_for(const RunConfig& cfg);

}  // namespace mt

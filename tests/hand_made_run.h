// Hand-made results for the report tests: what a variant measured, written in the engine's own
// types (StepRecord, MemorySummary, MachinePeaks, ...) as a test states it, and turned into the
// run's record (report/results.h) by the functions the runner itself records with
// (variant_result_for, report/recording.h, derive_statistics, complete_results). So the files a
// test writes are the files a run with those measurements would write.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/step_record.h"
#include "experiment/rounds.h"
#include "experiment/runner.h"
#include "report/recording.h"
#include "report/results.h"

namespace mt {

// The rounds (run.rounds) a hand-made experiment's measured steps are taken in: enough for the
// time calls (report/paired_stats.h) to be made.
inline constexpr int kHandMadeRounds = 5;

struct HandMadeRun {
    RunConfig config;
    RunStatus status = RunStatus::ok;
    std::string message;
    std::string backend, device_name;
    int threads = 0;
    double flops_per_step = 0;         // analytic
    std::optional<double> peak_flops;  // for MFU
    std::string peak_flops_source;
    MachinePeaks peaks;
    MemoryEstimate estimate;
    MemorySummary memory;
    std::vector<StepRecord> steps;
    std::vector<TraceStep> trace;
    std::optional<DataParallelRecord> dist;  // as measured (its derived numbers are derived)

    // `rounds`: its measured steps, in order, are split into that many consecutive slices, one per
    // round (as if each round ran every variant's slice in turn).
    VariantResult record(int rounds = kHandMadeRounds) const {
        VariantResult v = variant_result_for(config);
        v.status = status;
        v.message = message;
        v.backend = backend;
        v.device_name = device_name;
        v.threads = threads;
        v.flops.per_step = flops_per_step;
        v.flops.peak_per_s = peak_flops;
        v.flops.peak_source = peak_flops_source;
        v.roofline = roofline_record(peaks);
        v.memory = memory_record(estimate, memory);
        for (const StepRecord& s : steps) v.steps.push_back(step_row(s));
        // The runner's own schedule (experiment/rounds.h): consecutive slices of the measured
        // steps, min(rounds, measured) of them.
        int measured = 0;
        for (const StepRow& s : v.steps) measured += !s.warmup;
        const std::vector<RoundSlice> slices = round_slices(0, measured, rounds);
        size_t slice = 0;
        int k = 0;  // the measured step's index among the measured steps
        for (StepRow& s : v.steps) {
            if (s.warmup) continue;
            while (k >= slices[slice].last) ++slice;
            s.round = static_cast<int>(slice);
            ++k;
        }
        v.trace = trace;
        v.data_parallel = dist;
        derive_statistics(v);
        return v;
    }
};

struct HandMadeExperiment {
    std::string name, source_path, baseline;
    std::optional<double> loss_tolerance;
    std::string started_utc;
    bool interrupted = false;
    std::vector<HandMadeRun> runs;
    int rounds = kHandMadeRounds;

    // The complete results: every variant's record, the environment and the comparison.
    Results results() const {
        Results r;
        r.experiment = {name, source_path, baseline, loss_tolerance};
        r.experiment.rounds = rounds;
        r.started_utc = started_utc;
        r.interrupted = interrupted;
        for (const HandMadeRun& run : runs) r.variants.push_back(run.record(rounds));
        complete_results(r);
        return r;
    }
};

}  // namespace mt

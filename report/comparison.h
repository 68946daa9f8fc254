// The comparison of every variant against the baseline, and the loss check.
//
// Conventions (docs/design.md): delta = baseline - variant, so positive = the variant is
// faster / leaner; speedup = baseline median / variant median. A time delta no larger than the
// measured spread (the larger of the two IQRs) is "within noise". The loss check compares the
// mean and the last loss over the measured steps both ran against a tolerance in nats (the
// baseline's step-to-step spread unless compare.loss_tolerance is given). `microtrain compare`
// renders the same table from two earlier results.json files, so a table means the same thing
// wherever it is printed; the verdicts are stored in results.json's `comparison` block too.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report/results.h"

namespace mt {

struct ComparisonRow {
    std::string name;     // variant (prefixed with the file label in `compare`)
    std::string changed;  // "run.precision=bf16" or "(baseline)"
    int knobs_changed = 0;
    RunStatus status = RunStatus::ok;
    std::string message;
    bool is_baseline = false;
    bool has_stats = false;  // at least one measured step
    double median_ms = 0, p90_ms = 0, iqr_ms = 0, jitter = 0;
    // A knob of the variant that varies its step times by design ("data.seq_len_jitter=0.5":
    // every batch has its own length), named by the jitter notes as the cause; "" when none.
    std::string jitter_cause;
    double samples_per_s = 0, tokens_per_s = 0;
    std::optional<double> mfu;
    double tracked_peak = 0;  // bytes
    double device_peak = 0;   // bytes (cudaMemGetInfo used, or RSS)
    std::string device_kind;
    std::optional<double> final_loss, mean_loss;
    std::vector<std::pair<int, double>> measured_losses;  // (step, loss): measured, finite
    // vs baseline (set when both have stats)
    std::optional<double> dtime_ms, speedup, dmem_bytes;
    bool within_noise = false;
    // The loss check over the measured steps both ran: deltas baseline - variant of the mean and
    // of the last common step's loss, and whether both are within the tolerance.
    std::optional<double> dmean_loss, dfinal_loss;
    std::optional<bool> loss_ok;
    Decision decision = Decision::not_applicable;  // the class of `verdict`
    std::string verdict;
};

struct Comparison {
    std::string baseline;
    std::optional<double> loss_tolerance;  // compare.loss_tolerance (relative); nullopt: derive
    std::optional<double> tolerance_nats;  // the |delta loss| applied; nullopt: none known
    std::string tolerance_basis;           // how tolerance_nats was obtained, in words
    std::vector<ComparisonRow> rows;       // baseline first
    std::vector<std::string> notes;        // warnings (jitter, missing baseline, config mismatch)
};

// The comparison of every variant of one results file against its baseline.
Comparison build_comparison(const Results& results);
// `microtrain compare`: the baseline variant of `a` (its experiment baseline, or `a_variant`)
// against every measured variant of `b` (or only `b_variant`). "What it changed" is the config
// difference between the two. Throws ReportError for unusable or incompatible inputs.
Comparison compare_results(const Results& a, const std::string& a_label, const Results& b,
                           const std::string& b_label, const std::string& a_variant = "",
                           const std::string& b_variant = "");
// Reads and checks a results.json (read_results) and returns the document. Throws ReportError.
nlohmann::json load_results(const std::string& path);

// The comparison table (markdown) with its legend.
std::string render_comparison_md(const Comparison& c);

}  // namespace mt

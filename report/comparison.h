// The comparison of every variant against the baseline, and the loss check.
//
// Conventions (docs/design.md): delta = baseline - variant, so positive = the variant is
// faster / leaner; speedup = baseline median / variant median. Time enters a verdict only through
// the time call (report/paired_stats.h): a 95 % interval of the speedup from the per-round pairs
// of the run's interleaved rounds, called faster / slower / no difference / inconclusive against
// compare.min_effect; `compare` (two runs) makes an unpaired interval and says so. (A time delta
// no larger than the larger of the two IQRs is still flagged "within noise" in results.json for
// readers; it no longer decides anything.) Memory deltas are exact. The loss check compares the
// mean and the last loss over the measured steps both ran against a tolerance in nats (the
// baseline's step-to-step spread unless compare.loss_tolerance is given); a variant whose step
// trains another number of tokens is compared at equal tokens, and its loss difference is a
// price or a gain, not a defect. `microtrain compare`
// renders the same table from two earlier results.json files, so a table means the same thing
// wherever it is printed; the verdicts are stored in results.json's `comparison` block too.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "report/results.h"

namespace mt {

// ComparisonRow and Comparison, the one record of a comparison, are part of the results schema
// (report/results.h): results.json stores the verdicts of the run's own comparison.

// The comparison of every variant of one results file against its baseline (the loss check's
// tolerance from results.experiment.loss_tolerance, or derived).
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

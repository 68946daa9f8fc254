// What to try next: suggestions derived from one variant's measurements (the phase that
// dominates its median step, memory, communication), shared by report.md and report.html.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "report/results.h"

namespace mt {

// The median step's ms per phase column (the phases, then other) and of the step: shares and
// "X-bound" describe the typical step, not a mean that a few slow steps (a first epoch) drive.
struct Shares {
    std::array<double, kPhaseColumnCount> ms{};
    double step_ms = 0;
    double share(int column) const { return step_ms > 0 ? ms[column] / step_ms : 0; }
};

Shares shares_of(const VariantResult& v);
// The same over the mean step (every measured step counted: a first epoch's slow steps too).
Shares mean_shares_of(const VariantResult& v);
// The phase column with the largest median time.
int dominant(const Shares& s);
// The phase column of a phase.
inline int column(Phase p) {
    return static_cast<int>(p);
}
inline size_t category_bytes(const CategoryBytes& b, MemoryCategory c) {
    return b[static_cast<int>(c)];
}

// Communication is the bottleneck when the step's exposed wait for it is the largest phase or more
// than this share of the median step: beyond a quarter, hiding or shrinking it is the biggest
// lever left, whichever phase is largest.
inline constexpr double kCommBottleneckShare = 0.25;
// A rank whose median step is this much slower than the fastest one holds every collective up.
inline constexpr double kRankSpreadWarn = 0.10;

// The largest phase of the median step (phases only: `other` is not a phase).
Phase largest_phase(const VariantResult& v);
bool comm_is_bottleneck(const VariantResult& v);

// ---- the rule set ------------------------------------------------------------------------------
//
// A suggestion is made by one rule of a fixed table (kRules in suggestions.cpp, in the order the
// report prints them; docs/report.md lists them); each rule reads one variant's measurements and
// adds zero or more suggestions. What a suggestion proposes is named (its config key and the values
// it means) so that the run's own measurements can refute it: a variant of the same run that
// changed that key alone, to such a value, and was called slower than the baseline, removes it
// (run_suggestions). A line that does not depend on the variant (a knob to try, a fine-tune hint)
// is printed once per report, under the first variant it applies to.

struct Suggestion {
    std::string rule;  // the name of the rule that made it (docs/report.md)
    std::string text;
    std::string key;  // the config key it proposes to change; "" when it proposes none
    // Whether a value of `key` is what it proposes (e.g. "a larger bucket": above the current).
    std::function<bool(const std::string& value)> proposes;
    // Variant-independent text: printed once per report, where it first applies.
    bool generic = false;
};

// What a variant's top op's measured fraction of its roofline says limits it. Below
// kFarBelowRoofline the implementation does (latency: loop order, cache misses, launches), not
// the machine; at or above kNearRoofline the hardware does, so only less work or cheaper work
// helps. Between them the analytic bound (intensity vs the ridge) names the resource.
inline constexpr double kFarBelowRoofline = 0.25;
inline constexpr double kNearRoofline = 0.60;
// With simulated latency, a larger bucket helps only when the per-collective latency (buckets x
// latency) is at least this share of the exposed communication; below it the link's bandwidth,
// not the number of collectives, is what the step waits for.
inline constexpr double kLatencyShareForLargerBuckets = 0.10;
// Overlap hides at most the backward's duration (a bucket's reduction runs under the backward of
// the layers below it): hiding this share of the backward or more, no bucket size hides more.
inline constexpr double kHiddenNearBackward = 0.80;

// What limits a profiled op, from its intensity and its measured fraction of its roofline:
// "latency-limited" below kFarBelowRoofline (whatever its intensity says), else "compute-bound"
// or "memory-bound" (the intensity against the ridge).
std::string limit_of(const KernelRecord& k);

// Every rule's suggestions for one variant, unchecked (in rule order; empty when unmeasured).
std::vector<Suggestion> suggestions_of(const VariantResult& variant);
// Their texts.
std::vector<std::string> suggestions_for(const VariantResult& variant);
// What to change when communication is the bottleneck, from what was measured.
std::vector<Suggestion> comm_suggestion_list(const VariantResult& v);

// The suggestions the report prints under each of run.variants (same order): each checked against
// what the run measured, the generic ones only under the first variant they apply to.
std::vector<std::vector<std::string>> run_suggestions(const Results& run);
// The same for the Communication section: comm_suggestion_list of each variant whose
// communication is the bottleneck (none for the others).
std::vector<std::vector<std::string>> run_comm_suggestions(const Results& run);

}  // namespace mt

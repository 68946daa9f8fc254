// What to try next: suggestions derived from one variant's measurements (the phase that
// dominates its median step, memory, communication), shared by report.md and report.html.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "report/results.h"

namespace mt {

// Mean ms per phase column (the phases, then other) and of the step.
struct Shares {
    std::array<double, kPhaseColumnCount> ms{};
    double step_ms = 0;
    double share(int column) const { return step_ms > 0 ? ms[column] / step_ms : 0; }
};

Shares shares_of(const VariantResult& v);
// The phase column with the largest mean time.
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
// What to change when communication is the bottleneck, from what was measured.
std::vector<std::string> comm_suggestions(const VariantResult& v);

// Next-step suggestions for one variant, derived from its measurements.
std::vector<std::string> suggestions_for(const VariantResult& variant);

}  // namespace mt

// The per-step files of the run folder: steps.csv (one row per step of every variant) and
// trace.json (Chrome Trace Event format, for https://ui.perfetto.dev).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "report/results.h"

namespace mt {

// steps.csv: one row per step of every variant (warm-up rows flagged), per-phase columns, then
// comm_busy_ms and comm_bytes (0 on one rank), tokens, other_cpu_ms and steal_ms.
std::string steps_csv(const Results& results);
// trace.json: Chrome Trace Event format; one process per variant, tracks for steps, phases and
// (when profiled) ops, profile.trace_steps measured steps each. A data-parallel variant has one
// "rank R phases" track per rank (RankRecord::trace) instead of `phases`.
nlohmann::json trace_json(const Results& results);

}  // namespace mt

// Filling a run's Results (report/results.h) from what the engine measured: the one conversion of
// each engine record into its row of the schema, and the one function that derives every
// statistic from the step rows. The runner (experiment/runner.cpp) calls them as the variants
// run; tests that hand-make results go through the same functions, so their files are the
// runner's.
#pragma once

#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/step_record.h"
#include "report/results.h"

namespace mt {

StepRow step_row(const StepRecord& s);
// The estimate beside what the tracker measured (a default MemorySummary: nothing ran).
MemoryRecord memory_record(const MemoryEstimate& estimate, const MemorySummary& measured);
RooflineRecord roofline_record(const MachinePeaks& peaks);
KernelRecord kernel_record(const KernelStat& k);

// Derives, from v.steps and what the record states of the run (the batch shape, the analytic and
// peak FLOPs, the data-parallel ranks): stats, measured_steps, the global batch per step, the
// achieved FLOP/s and MFU, the loss summary, and the data-parallel record's derived numbers.
// Under data.seq_len_jitter (v.config) tokens and FLOPs are the measured steps' means (StepRow's
// tokens, model_flops). Every derived field is recomputed, so calling it again after an input
// changed (a re-probed peak, the gathered ranks) gives what one call at the end would.
void derive_statistics(VariantResult& v);

// The parts of Results that come from the whole run: the environment of this machine and
// checkout (capture_environment) and the comparison of the variants (build_comparison).
void complete_results(Results& results);

}  // namespace mt

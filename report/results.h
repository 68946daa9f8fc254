// The typed schema of results.json: every report (report.md, report.html, `microtrain compare`)
// renders from these structs, and results.json is written from and read back into them, so a
// key exists in one place only.
//
// Data flow:
//   ExperimentResult (runner) --to_results--> Results --results_to_json--> results.json
//   results.json --results_from_json--> Results --> render_report_md / compare_results / ...
// to_results also runs the comparison (build_comparison, report.cpp) once and stores its
// verdicts in Results::comparison, so results.json and report.md state the same verdicts.
//
// Layout (schema_version 4): v2 (the v1 keys plus the top-level `comparison` block) with the
// loss check of v3: `experiment.loss_tolerance` may be null (derived), and the comparison block
// states the tolerance it applied (`loss_tolerance_nats`, `loss_tolerance_basis`) and each
// variant's `delta_mean_loss` / `delta_final_loss`. v4 adds data parallelism: the phase `comm`
// in every phases object (stats, memory, steps), `comm_busy_ms` / `comm_bytes` per step, and per
// variant `data_parallel` (null for one rank): how it communicated, every rank's medians
// (`ranks`; their trace steps go to trace.json only) and the derived fields of
// DataParallelRecord. samples/tokens per step and per second count the GLOBAL batch (all ranks).
// v5 adds the host synchronisation points (run.host_sync): `host_syncs` / `host_wait_ms` per
// step and their statistics in `stats`.
// JSON objects are written with sorted keys (nlohmann's default), so writing a Results read from
// a file gives the same text back. Reading checks the type and presence of every key and throws
// ReportError naming the file and the key path, e.g.
//   "results.json: variants[2].stats.step_ms.median: expected a number, got "fast"".
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "experiment/runner.h"

namespace mt {

inline constexpr int kResultsSchemaVersion = 6;

// Thrown for a results.json that cannot be used; the message names the file and the key.
struct ReportError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Bytes per MemoryCategory, indexed by the category's value.
using CategoryBytes = std::array<size_t, kMemoryCategoryCount>;

// A SeriesStats as results.json holds it: the derived spread (iqr, iqr_over_median) is stored
// beside the quantiles it comes from.
struct SeriesSummary {
    size_t n = 0;
    double mean = 0, median = 0, p10 = 0, p90 = 0, q1 = 0, q3 = 0, iqr = 0, iqr_over_median = 0;
    double std = 0, min = 0, max = 0;
    static SeriesSummary of(const SeriesStats& s);
};

struct BatchShape {
    int batch_size = 0, seq_len = 0, grad_accum = 0;  // per rank
    // Of one optimizer step over every rank (the global batch): world_size * B * grad_accum
    // samples, times T tokens. world_size is 1 without data parallelism. With
    // data.seq_len_jitter, tokens_per_step is the mean over the measured steps (rounded).
    long long samples_per_step = 0, tokens_per_step = 0;
};

// Statistics over the measured steps (warm-up excluded).
struct StepStatistics {
    SeriesSummary step_ms;
    std::array<SeriesSummary, kPhaseCount> phases_ms;  // indexed by Phase
    SeriesSummary other_ms;                            // wall - sum of the phases
    SeriesSummary loss;
    // Host synchronisation points per measured step (run.host_sync): how many, and the host
    // time spent waiting in them (ms).
    SeriesSummary host_syncs, host_wait_ms;
    double samples_per_s = 0, tokens_per_s = 0;  // global batch / median step (all ranks)
    double jitter = 0;                           // step_ms IQR / median
    bool jitter_warning = false;                 // jitter > kJitterWarnThreshold
};

struct FlopsRecord {
    double per_step = 0;  // analytic model FLOPs of one optimizer step (jitter: measured mean)
    double achieved_per_s = 0;
    std::optional<double> peak_per_s;  // nullopt: unknown device, MFU n/a
    std::string peak_source;           // where the peak comes from, in words
    std::optional<double> mfu;
};

struct RooflineRecord {
    double peak_flops_per_s = 0, bandwidth_bytes_per_s = 0, ridge_flops_per_byte = 0;
    std::string flops_source, bytes_source;
    bool from_cache = false;
};

// nullopt where the loss was not finite (JSON null) or there were no steps.
struct LossRecord {
    std::optional<double> first, final, mean_measured;
};

struct PhaseMemoryRecord {
    size_t tracked_peak_total = 0;
    CategoryBytes tracked_peak{};
    size_t device_used_peak = 0, transient_peak = 0;
};

struct DeviceMemoryRecord {
    bool available = false;
    std::string kind;  // "cudaMemGetInfo" or "RSS"
    size_t total_bytes = 0, peak_used_bytes = 0;
};

struct MemoryRecord {
    CategoryBytes estimate{};  // the analytic estimate per category
    size_t estimate_total = 0;
    CategoryBytes tracked_peak{};
    size_t tracked_peak_total = 0, at_setup_total = 0;
    std::array<std::optional<PhaseMemoryRecord>, kPhaseCount> phases;  // nullopt: phase never ran
    std::optional<Phase> peak_phase;  // nullopt: the peak is setup's, held through every phase
    MemoryCategory largest_category = MemoryCategory::params;
    DeviceMemoryRecord device;
    size_t process_peak_rss_bytes = 0;
};

// One row of the per-op table (KernelStat with its derived rates).
struct KernelRecord {
    std::string name;
    std::string impl;  // the implementation the op ran (Backend::implementation; "" if one)
    long long calls = 0;
    double total_ms = 0, ms_per_step = 0, pct_of_step = 0, flops = 0, bytes = 0;
    double gflops_per_s = 0, gb_per_s = 0, intensity = 0;
    Bound bound = Bound::unknown;
    double pct_of_roofline = 0;
};

struct StepRow {
    int step = 0;
    bool warmup = false;
    double wall_ms = 0;
    std::array<double, kPhaseCount> phases_ms{};  // indexed by Phase
    double other_ms = 0;
    std::optional<double> loss, grad_norm;  // nullopt: not finite
    double lr = 0;
    double comm_busy_ms = 0;  // link-busy time of the step's collectives (0 on one rank)
    double comm_bytes = 0;    // bytes this rank sent for them
    int host_syncs = 0;       // host synchronisation points in the step (run.host_sync)
    double host_wait_ms = 0;  // host time spent waiting in them
};

// One rank of a data-parallel variant (RankSummary without its trace steps, which go to
// trace.json only): medians over that rank's measured steps.
struct RankRecord {
    int rank = 0;
    double step_ms = 0;
    std::array<double, kPhaseCount> phases_ms{};  // indexed by Phase; comm = exposed wait
    double comm_busy_ms = 0, comm_overlapped_ms = 0;
};

// How a data-parallel variant communicated (DataParallelRun), plus the numbers the report
// judges it by, derived once in to_variant_result so results.json and report.md agree.
struct DataParallelRecord {
    int world_size = 1;
    std::string transport;
    int zero = 0;
    bool overlap = true;
    double bucket_mb = 0;
    int buckets = 0;
    double simulated_link_gbps = 0, simulated_latency_us = 0;  // 0: the real transport only
    double bytes_per_step = 0, achieved_busbw_gbps = 0;
    std::optional<double> probe_busbw_gbps;
    std::string probe_source;
    std::vector<RankRecord> ranks;  // in rank order
    // Derived.
    int slowest_rank = 0;           // the highest median step_ms
    double rank_spread_ms = 0;      // max - min median step_ms over the ranks
    double rank_spread_pct = 0;     // rank_spread_ms / the fastest rank's median (a fraction)
    double comm_exposed_ms = 0;     // median comm phase of rank 0 (= the variant's stats)
    double comm_overlapped_ms = 0;  // rank 0's median communication hidden under backward
    double comm_share = 0;          // comm_exposed_ms / the median step
    std::optional<double> busbw_fraction_of_probe;  // achieved / probe; nullopt: no probe
};

struct VariantResult {
    std::string name;
    RunStatus status = RunStatus::ok;
    std::string message;
    std::optional<int> failed_step;
    std::optional<std::string> failed_phase;
    std::string backend, device_name;
    int threads = 0;
    std::map<std::string, std::string> config;   // every dotted key -> its value as text
    std::map<std::string, std::string> changed;  // the keys this variant set
    int knobs_changed = 0;
    std::string model_describe;
    size_t n_params = 0;
    BatchShape batch;
    int warmup_steps = 0, measure_steps = 0, measured_steps = 0;
    double setup_ms = 0;
    StepStatistics stats;
    FlopsRecord flops;
    RooflineRecord roofline;
    LossRecord loss;
    MemoryRecord memory;
    std::vector<KernelRecord> kernels;  // heaviest first; empty unless profiled
    bool profiled = false;
    std::vector<StepRow> steps;                       // warm-up and measured
    std::optional<DataParallelRecord> data_parallel;  // nullopt (JSON null): one rank

    bool measured() const { return stats.step_ms.n > 0; }
    // The config value of a dotted key, "" when absent.
    std::string config_value(const std::string& key) const;
};

// The phase columns of the reports: every Phase in kAllPhases order, then "other" (step wall
// time - the sum of the phases), the one column that is not a Phase.
inline constexpr int kPhaseColumnCount = kPhaseCount + 1;
std::string phase_column_name(int column);
const SeriesSummary& phase_column_stats(const StepStatistics& stats, int column);

struct ExperimentHeader {
    std::string name, source, baseline;
    std::optional<double> loss_tolerance;  // compare.loss_tolerance; nullopt: derived (null)
};

// The machine and checkout the run came from; optional entries are absent when unknown.
struct Environment {
    std::optional<std::string> hostname;
    unsigned hardware_threads = 0;
    bool cuda_available = false;
    std::optional<std::string> cuda_note;   // why CUDA is unavailable
    std::optional<std::string> git_commit;  // written as null when not in a git checkout
    std::optional<bool> git_dirty;          // present with git_commit
    std::optional<std::string> compiler;
    std::string peaks_cache;
};

struct Units {
    std::string time = "ms";
    std::string memory = "bytes (reports print MiB = 2^20 bytes)";
    std::string delta = "baseline - variant (positive = variant better)";
};

// The class of a comparison verdict: the verdict text's first word(s).
enum class Decision { baseline, keep, trade_off, reject, not_run, not_applicable };
template <>
struct EnumSpelling<Decision> {
    static constexpr std::array<std::string_view, 6> names{"baseline", "keep",    "trade-off",
                                                           "reject",   "not run", "n/a"};
};

// One variant against the baseline, as report.md's comparison table states it.
struct ComparisonVerdict {
    std::string variant;
    bool is_baseline = false;
    // Set when both the variant and the baseline have measured steps.
    std::optional<double> delta_time_ms;        // baseline median - variant median
    std::optional<double> speedup;              // baseline median / variant median
    std::optional<double> delta_memory_bytes;   // baseline tracked peak - variant tracked peak
    bool within_noise = false;                  // |delta_time_ms| <= the larger IQR
    std::optional<bool> loss_within_tolerance;  // nullopt: no common measured step to compare
    // Baseline - variant over the measured steps both ran (positive = the variant's loss is lower)
    std::optional<double> delta_mean_loss, delta_final_loss;
    Decision decision = Decision::not_applicable;
    std::string verdict;  // the full sentence of the report's Verdict column
};

struct ComparisonRecord {
    std::string baseline;                       // the variant used as baseline (after any fallback)
    std::optional<double> loss_tolerance_nats;  // the |delta loss| allowed; nullopt: none known
    std::string loss_tolerance_basis;           // where it comes from, in words
    std::vector<std::string> notes;             // warnings printed under the table
    std::vector<ComparisonVerdict> rows;        // baseline first, then the variants in file order
};

struct Results {
    int schema_version = kResultsSchemaVersion;
    std::string tool = "microtrain";
    ExperimentHeader experiment;
    std::string started_utc;
    bool interrupted = false;
    Environment environment;
    Units units;
    std::vector<VariantResult> variants;
    ComparisonRecord comparison;
};

// The one conversion from what the runner measured: statistics, the environment of this
// machine and checkout, and the comparison (build_comparison) filled in.
Results to_results(const ExperimentResult& ex);
// The variant part of that conversion (no comparison, no environment).
VariantResult to_variant_result(const RunResult& r);
// The environment of this process: host, threads, CUDA, the git commit of the experiment file.
Environment capture_environment(const std::string& experiment_source_path);

nlohmann::json results_to_json(const Results& results);
// The `environment` object of results.json (also listed key by key in report.md).
nlohmann::json environment_to_json(const Environment& environment);
// Everything the run measured, as results.json holds it (to_results then results_to_json).
nlohmann::json results_to_json(const ExperimentResult& ex);
// Reads a results.json document. `label` (the file name) starts every error message. Refuses a
// schema_version other than kResultsSchemaVersion. Throws ReportError.
Results results_from_json(const nlohmann::json& j, const std::string& label);
// The JSON document in the file at `path`, unchecked. Throws ReportError (unreadable, not JSON).
nlohmann::json read_json_file(const std::string& path);
// Reads and checks the file at `path` (results_from_json). Throws ReportError.
Results read_results(const std::string& path);

}  // namespace mt

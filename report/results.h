// The typed schema of results.json, and the one record of a run's results: the runner
// (experiment/runner.cpp) fills these structs as the variants run, and every output renders from
// them — results.json, steps.csv and trace.json (the run folder), report.md, report.html and
// `microtrain compare` (which reads them back from results.json).
//
// Data flow:
//   runner --(report/recording.h: step_row, memory_record, ..., derive_statistics)--> Results
//   Results --results_to_json--> results.json --results_from_json--> Results
//   Results --> steps.csv / trace.json / render_report_md / render_report_html
//   Results --build_comparison--> Comparison (report/comparison.h) --> the comparison table
// Statistics are derived once, by derive_statistics, from the step rows (report/recording.h).
// The comparison is computed once (build_comparison, when the run completes its Results) and
// stored in Results::comparison, so results.json and report.md state the same verdicts.
//
// Not everything in memory is written: members marked "not in results.json" are the run's
// in-memory extras: StepRow::tokens / model_flops (steps.csv has tokens; results.json their
// measured means), the trace steps (trace.json), ComparisonRow's table cells (rebuilt by
// build_comparison wherever a table is printed). A Results read back from results.json has them
// at their defaults, so derive_statistics is for a run's own Results only: a file's statistics
// are read, never derived again.
//
// JSON: each struct's keys are listed once, in results.cpp (report/json_fields.h), and that list
// drives both the writer and the checked reader. Objects are written with sorted keys
// (nlohmann's default), so writing a Results read from a file gives the same text back. Reading
// checks the type and presence of every key and throws ReportError naming the file and the key
// path, e.g.
//   "results.json: variants[2].stats.step_ms.median: expected a number, got "fast"".
//
// Layout (schema_version 7): the v1 keys plus the top-level `comparison` block (v2) with the
// loss check (v3: `experiment.loss_tolerance` may be null (derived), the block states the
// tolerance it applied, `loss_tolerance_nats` / `loss_tolerance_basis`, and each variant's
// `delta_mean_loss` / `delta_final_loss`). v4 adds data parallelism: the phase `comm` in every
// phases object (stats, memory, steps), `comm_busy_ms` / `comm_bytes` per step, and per variant
// `data_parallel` (null for one rank): how it communicated, every rank's medians (`ranks`; their
// trace steps go to trace.json only) and the derived fields of DataParallelRecord. samples/tokens
// per step and per second count the GLOBAL batch (all ranks). v5 adds the host synchronisation
// points (run.host_sync): `host_syncs` / `host_wait_ms` per step and their statistics in `stats`.
// v6 adds `impl` per op of `kernels`. v7 adds `other_cpu_ms` per step (the CPU time other
// processes took during the step, engine/cpu_load.h) and its statistics in `stats`. v8 adds the
// interleaved rounds (run.rounds): `experiment.rounds` and `round` per step (-1: warm-up).
// v9 adds the time call (report/paired_stats.h): `experiment.min_effect` (compare.min_effect) and
// per row of `comparison.variants` `speedup_ci95` ([low, high] or null) and `time_call`.
// v10 adds what else the machine did (report/noise.h): `steal_ms` per step and in
// `stats`, and per step `sm_clock_mhz` / `throttle_reasons` (null without a device clock),
// and per variant `diverged` ({step, reason} from engine/divergence.h, or null).
#pragma once

#include <array>
#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/divergence.h"
#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/timing.h"
#include "report/json_fields.h"
#include "report/paired_stats.h"

namespace mt {

inline constexpr int kResultsSchemaVersion = 10;

// How a variant ended. skipped: never run (needs a GPU, does not fit, the experiment stopped
// before it); the message says why.
enum class RunStatus { ok, failed, interrupted, skipped };
template <>
struct EnumSpelling<RunStatus> {
    static constexpr std::array<std::string_view, 4> names{"ok", "failed", "interrupted",
                                                           "skipped"};
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
    SeriesSummary other_cpu_ms;  // CPU time other processes took per measured step (StepRow)
    SeriesSummary steal_ms;      // of it, the hypervisor's steal time per measured step
    // The measured steps' samples and tokens (all ranks) over their total time (mean step).
    double samples_per_s = 0, tokens_per_s = 0;
    double jitter = 0;            // step_ms IQR / median
    bool jitter_warning = false;  // jitter > kJitterWarnThreshold
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
    // Of the process's memory, the bytes on 2 MiB pages at the end (engine/memory.h); absent on
    // CUDA and where the kernel does not say.
    std::optional<size_t> process_huge_page_bytes;
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

// One step as the engine measured it (StepRecord, engine/step_record.h; step_row converts).
struct StepRow {
    int step = 0;
    bool warmup = false;
    double wall_ms = 0;
    std::array<double, kPhaseCount> phases_ms{};  // indexed by Phase
    double other_ms = 0;
    // As measured: NaN or inf when not finite (results.json writes null, read back as NaN).
    double loss = 0, grad_norm = 0;
    double lr = 0;
    double comm_busy_ms = 0;  // link-busy time of the step's collectives (0 on one rank)
    double comm_bytes = 0;    // bytes this rank sent for them
    int host_syncs = 0;       // host synchronisation points in the step (run.host_sync)
    double host_wait_ms = 0;  // host time spent waiting in them
    double other_cpu_ms = 0;  // CPU time other processes took during the step (engine/cpu_load.h)
    double steal_ms = 0;      // of it, steal time: the hypervisor ran another machine on our CPUs
    // The device's lowest SM clock over the step (MHz) and the names of the throttle reasons NVML
    // reported at its start or end (kernels/device_clock.h: throttle_reason_names); nullopt (JSON
    // null) without a device clock (CPU, no driver).
    std::optional<double> sm_clock_mhz;
    std::optional<std::vector<std::string>> throttle_reasons;
    // The round (run.rounds) whose slice held this measured step, 0-based; -1 for a warm-up step.
    // The comparison pairs a variant's round-r steps with the baseline's round-r steps.
    int round = -1;
    // What the step trained over every rank, at the batches' real lengths (StepRecord::tokens):
    // in results.json (added within schema 10; 0 when read from an older file), so a report
    // rebuilt from it still draws step time against tokens.
    double tokens = 0;
    // Not in results.json (flops.per_step holds the measured mean): the step's model FLOPs
    // (StepRecord::model_flops).
    double model_flops = 0;
};

// One measured step's timeline, for trace.json only (profile.trace_steps measured steps kept).
struct TraceStep {
    int step = 0;
    double start_ms = 0;  // host offset of the step start from the variant's first kept step
    double wall_ms = 0;
    std::vector<PhaseInterval> phases;
    std::vector<OpInterval> ops;  // when profile.kernels
};

// One rank of a data-parallel variant: medians over that rank's measured steps.
struct RankRecord {
    int rank = 0;
    double step_ms = 0;
    std::array<double, kPhaseCount> phases_ms{};  // indexed by Phase; comm = exposed wait
    double comm_busy_ms = 0;
    // Communication hidden under backward: median of max(0, busy - exposed) per step.
    double comm_overlapped_ms = 0;
    std::vector<TraceStep> trace;  // not in results.json: this rank's track of trace.json
};

// How a data-parallel variant communicated, plus the numbers the report judges it by, derived
// once (derive_statistics) so results.json and report.md agree.
struct DataParallelRecord {
    int world_size = 1;
    std::string transport;  // "MPI (Open MPI 4.1.4)", "NCCL 2.27.3"
    int zero = 0;           // ZeRO stage (0 or 1)
    bool overlap = true;
    double bucket_mb = 0;
    int buckets = 0;  // gradient buckets per step
    // The most buckets any bucket size gives: the ranges backward completes gradients in (a
    // bucket never splits one). 0: unknown (a file written before it, within schema 10).
    int finest_buckets = 0;
    // dist.simulate_link_gbps / simulate_latency_us: a SIMULATED slow link stretched the
    // collectives to what it would take (0 = the real transport only).
    double simulated_link_gbps = 0, simulated_latency_us = 0;
    // dist.simulate_link_ratio: the bandwidth above was set from the measured compute (its
    // forward + backward ms, the slowest rank's) so that the gradients take this ratio of it.
    std::optional<double> simulated_link_ratio, calibration_compute_ms;  // null: a fixed link
    double bytes_per_step = 0;               // bytes each rank sends per step (rank 0's median)
    double achieved_busbw_gbps = 0;          // bytes_per_step / median busy time, in GB/s
    std::optional<double> probe_busbw_gbps;  // a measured all-reduce of the same transport
    std::string probe_source;                // "measured now (...)" / "cache (...)"
    std::vector<RankRecord> ranks;           // every rank, in rank order
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
    // The first step the divergence rule (engine/divergence.h) flagged, with its reason; nullopt
    // (JSON null): the loss and gradient norm stayed within bounds. A diverged variant may still
    // be `ok` (every value finite); its verdict is never "keep".
    std::optional<Divergence> diverged;
    std::string backend, device_name;
    // The CPU backend's kernel set (kernels/cpu/cpu_isa.h: "avx512", "avx2", "baseline"); nullopt
    // on CUDA, and in files written before it (added within schema 10).
    std::optional<std::string> cpu_isa;
    int threads = 0;
    std::map<std::string, std::string> config;   // every dotted key -> its value as text
    std::map<std::string, std::string> changed;  // what it changes against the baseline
    int knobs_changed = 0;
    // Set by the runner: not the baseline, yet it runs the baseline's config (no knob changed):
    // an A/A control, whose every difference is the machine's. nullopt in files written before
    // it (added within schema 10): read as not a control.
    std::optional<bool> aa_control;
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
    // Not in results.json: the kept steps' timelines (of rank 0 under data parallel), for
    // trace.json.
    std::vector<TraceStep> trace;

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
    // compare.min_effect: the smallest speedup (a fraction) the time call counts as one.
    double min_effect = kDefaultMinEffect;
    // run.rounds: the measured steps of every variant were taken in this many interleaved rounds.
    int rounds = 1;
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
    // How the CPU backend's OpenMP threads wait at a barrier (kernels/openmp_wait.h): a busy
    // machine costs a spinning policy several times what it costs a sleeping one.
    std::optional<std::string> openmp_wait;
    // The cores this process may use (kernels/cpu_cores.h: affinity mask, cgroup quota), the
    // CPU backend's default thread count, and where the number comes from. Absent in files
    // written before it (added within schema 10).
    std::optional<int> usable_cores;
    std::optional<std::string> usable_cores_source;
    // Whether the CPU backend's large buffers ask for 2 MiB pages (kernels/huge_pages.h) and
    // what the kernel's THP mode lets that do. Absent in files written before it (schema 10).
    std::optional<std::string> huge_pages;
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

// One variant against the baseline: a row of the comparison table (build_comparison,
// report/comparison.h). results.json's `comparison.variants` stores the verdict part (the keys
// listed in results.cpp); the table's cells are rebuilt from the variants by build_comparison
// wherever a table is printed.
struct ComparisonRow {
    std::string variant;  // the variant's name (prefixed with the file label in `compare`)
    bool is_baseline = false;
    // Set when both the variant and the baseline have measured steps.
    std::optional<double> delta_time_ms;       // baseline median - variant median
    std::optional<double> speedup;             // baseline median / variant median
    std::optional<double> delta_memory_bytes;  // baseline tracked peak - variant tracked peak
    // |delta_time_ms| <= the larger IQR: kept for readers; the verdict comes from time_call.
    bool within_noise = false;
    // The 95 % interval of the speedup (report/paired_stats.h: paired over the rounds in a run,
    // unpaired in `compare`) and the call made from it; nullopt: no interval (fewer than 2
    // rounds) / no call (the baseline row, or nothing measured to compare).
    std::optional<std::pair<double, double>> speedup_ci95;
    std::optional<TimeCall> time_call;
    std::optional<bool> loss_within_tolerance;  // nullopt: no common measured step to compare
    // The loss check over the measured steps both ran: baseline - variant of the mean and of the
    // last common step's loss (positive = the variant's loss is lower).
    std::optional<double> delta_mean_loss, delta_final_loss;
    // Where the two loss curves were compared: "equal steps" (the same batches on the same
    // steps), or "equal tokens" when the variant's step trains another number of tokens
    // (data.batch_size, run.grad_accum, data.seq_len(_jitter), the ranks): its loss at step s is
    // then set beside the baseline's after as many tokens. nullopt: no comparison (added in
    // schema 10; null or absent in older files).
    std::optional<std::string> loss_compared_at;
    Decision decision = Decision::not_applicable;  // the class of `verdict`
    std::string verdict;  // the full sentence of the report's Verdict column

    // Not in results.json: the table's cells, from the variant's record.
    std::string changed;  // "run.precision=bf16" or "(baseline)"
    int knobs_changed = 0;
    // VariantResult::aa_control, as the runner marked it: the baseline's config, whose every
    // difference is the machine's. Never set in `compare`, whose two runs may differ by code or
    // data.
    bool aa_control = false;
    RunStatus status = RunStatus::ok;
    std::string message;
    std::optional<Divergence> diverged;  // VariantResult::diverged
    bool has_stats = false;              // at least one measured step
    double median_ms = 0, p90_ms = 0, iqr_ms = 0, jitter = 0;
    // A knob of the variant that varies its step times by design ("data.seq_len_jitter=0.5":
    // every batch has its own length), named by the jitter notes as the cause; "" when none.
    std::string jitter_cause;
    double samples_per_s = 0, tokens_per_s = 0;
    // The work of one step: every rank's tokens (under data.seq_len_jitter, the measured mean),
    // and the samples of one optimizer update (world_size x batch_size x grad_accum).
    double tokens_per_step = 0, samples_per_step = 0;
    std::map<int, double> tokens_before;  // step -> the tokens its earlier steps trained
    std::string init_from;                // model.init_from: "" = random initial weights
    std::optional<double> mfu;
    double tracked_peak = 0;  // bytes
    double device_peak = 0;   // bytes (cudaMemGetInfo used, or RSS)
    std::string device_kind;
    std::optional<double> final_loss, mean_loss;
    std::vector<std::pair<int, double>> measured_losses;  // (step, loss): measured, finite
    RoundMedians round_ms;  // the median step time of each round's slice (measured steps)
    RoundLoads round_load;  // the load (other processes' cores busy) each round's slice met
    // The call as printed ("1.23x faster [1.18–1.27]"), and for `inconclusive` the rounds it
    // estimates would decide it.
    std::string time_call_text;
    std::optional<int> more_rounds;
};

// Every variant against the baseline, and the loss check's tolerance.
struct Comparison {
    std::string baseline;                       // the variant used as baseline (after any fallback)
    std::optional<double> loss_tolerance_nats;  // the |delta loss| allowed; nullopt: none known
    std::string loss_tolerance_basis;           // where it comes from, in words
    std::vector<std::string> notes;             // warnings printed under the table (jitter, missing
                                                // baseline, config mismatch)
    std::vector<ComparisonRow> rows;            // baseline first, then the variants in file order
    // Not in results.json: how the time calls were made (experiment.min_effect, experiment.rounds
    // say it for a run's own comparison). paired: rounds of one run; false in `compare`.
    double min_effect = kDefaultMinEffect;
    bool paired = true;
    int rounds = 0;  // the baseline's rounds with measured steps
    // compare.loss_tolerance was given: the tolerance is the user's loss budget, so a variant
    // whose loss costs more than it is rejected, not weighed as a trade-off.
    bool loss_budget_given = false;
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
    Comparison comparison;
};

// The environment of this process: host, threads, CUDA, the git commit of the experiment file.
Environment capture_environment(const std::string& experiment_source_path);

nlohmann::json results_to_json(const Results& results);
// The `environment` object of results.json (also listed key by key in report.md).
nlohmann::json environment_to_json(const Environment& environment);
// One variant's record as results.json's `variants[i]` holds it, and read back with every key
// checked (`label` starts the error messages). How a variant's worker process hands its record
// to the runner (experiment/runner.cpp).
nlohmann::json variant_to_json(const VariantResult& variant);
VariantResult variant_from_json(const nlohmann::json& j, const std::string& label);
// Reads a results.json document. `label` (the file name) starts every error message. Refuses a
// schema_version other than kResultsSchemaVersion. Throws ReportError.
Results results_from_json(const nlohmann::json& j, const std::string& label);
// The JSON document in the file at `path`, unchecked. Throws ReportError (unreadable, not JSON).
nlohmann::json read_json_file(const std::string& path);
// Reads and checks the file at `path` (results_from_json). Throws ReportError.
Results read_results(const std::string& path);

}  // namespace mt

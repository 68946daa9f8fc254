// results.json <-> Results (see results.h): each struct's keys, listed once and visited by both
// the writer and the checked reader (report/json_fields.h); the environment of this process.
#include "report/results.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/regular_file.h"
#include "kernels/cpu_cores.h"
#include "kernels/huge_pages.h"
#include "kernels/openmp_wait.h"

namespace mt {

using nlohmann::json;
namespace fs = std::filesystem;

// The largest results.json read back (compare, the report's re-render): a run of many variants
// with per-step series is a few MB; a file of a GiB is not one, and is refused before it is read.
constexpr size_t kMaxResultsFileBytes = size_t{1} << 30;

SeriesSummary SeriesSummary::of(const SeriesStats& s) {
    SeriesSummary o;
    o.n = s.n;
    o.mean = s.mean;
    o.median = s.median;
    o.p10 = s.p10;
    o.p90 = s.p90;
    o.q1 = s.q1;
    o.q3 = s.q3;
    o.iqr = s.iqr();
    o.iqr_over_median = s.iqr_over_median();
    o.std = s.std;
    o.min = s.min;
    o.max = s.max;
    return o;
}

std::string phase_column_name(int column) {
    return column < kPhaseCount ? std::string(enum_name(kAllPhases[column])) : "other";
}

const SeriesSummary& phase_column_stats(const StepStatistics& stats, int column) {
    return column < kPhaseCount ? stats.phases_ms[column] : stats.other_ms;
}

std::string VariantResult::config_value(const std::string& key) const {
    const auto it = config.find(key);
    return it == config.end() ? std::string() : it->second;
}

// ---- the keys of results.json, one list per struct ---------------------------------------------
//
// A key is its member's name unless the list says otherwise; see docs/report.md for what each
// means. Reading visits the entries in list order (the first bad key is the one reported).

template <>
struct JsonFields<SeriesSummary> {
    using S = SeriesSummary;
    static inline const auto list = std::tuple{
        json_field("n", &S::n),
        json_field("mean", &S::mean),
        json_field("median", &S::median),
        json_field("p10", &S::p10),
        json_field("p90", &S::p90),
        json_field("q1", &S::q1),
        json_field("q3", &S::q3),
        json_field("iqr", &S::iqr),
        json_field("iqr_over_median", &S::iqr_over_median),
        json_field("std", &S::std),
        json_field("min", &S::min),
        json_field("max", &S::max),
    };
};

template <>
struct JsonFields<BatchShape> {
    using S = BatchShape;
    static inline const auto list = std::tuple{
        json_field("batch_size", &S::batch_size),
        json_field("seq_len", &S::seq_len),
        json_field("grad_accum", &S::grad_accum),
        json_field("samples_per_step", &S::samples_per_step),
        json_field("tokens_per_step", &S::tokens_per_step),
    };
};

template <>
struct JsonFields<StepStatistics> {
    using S = StepStatistics;
    static inline const auto list = std::tuple{
        json_field("step_ms", &S::step_ms),
        // Every phase, then "other" (wall - the sum of the phases) in the same object.
        json_group<S>("phases_ms", json_each_key<Phase>(&S::phases_ms),
                      json_field("other", &S::other_ms)),
        json_field("loss", &S::loss),
        json_field("samples_per_s", &S::samples_per_s),
        json_field("tokens_per_s", &S::tokens_per_s),
        json_field("jitter", &S::jitter),
        json_field("jitter_warning", &S::jitter_warning),
        json_field("host_syncs", &S::host_syncs),
        json_field("host_wait_ms", &S::host_wait_ms),
        json_field("other_cpu_ms", &S::other_cpu_ms),
        json_field("steal_ms", &S::steal_ms),
    };
};

template <>
struct JsonFields<FlopsRecord> {
    using S = FlopsRecord;
    static inline const auto list = std::tuple{
        json_field("per_step", &S::per_step),
        json_field("achieved_per_s", &S::achieved_per_s),
        json_field("peak_per_s", &S::peak_per_s),
        json_field("peak_source", &S::peak_source),
        json_field("mfu", &S::mfu),
    };
};

template <>
struct JsonFields<RooflineRecord> {
    using S = RooflineRecord;
    static inline const auto list = std::tuple{
        json_field("peak_flops_per_s", &S::peak_flops_per_s),
        json_field("bandwidth_bytes_per_s", &S::bandwidth_bytes_per_s),
        json_field("ridge_flops_per_byte", &S::ridge_flops_per_byte),
        json_field("flops_source", &S::flops_source),
        json_field("bytes_source", &S::bytes_source),
        json_field("from_cache", &S::from_cache),
    };
};

template <>
struct JsonFields<LossRecord> {
    using S = LossRecord;
    static inline const auto list = std::tuple{
        json_field("first", &S::first),
        json_field("final", &S::final),
        json_field("mean_measured", &S::mean_measured),
    };
};

template <>
struct JsonFields<PhaseMemoryRecord> {
    using S = PhaseMemoryRecord;
    static inline const auto list = std::tuple{
        json_field("tracked_peak_total", &S::tracked_peak_total),
        json_group<S>("tracked_peak", json_each_key<MemoryCategory>(&S::tracked_peak)),
        json_field("device_used_peak", &S::device_used_peak),
        json_field("transient_peak", &S::transient_peak),
    };
};

template <>
struct JsonFields<DeviceMemoryRecord> {
    using S = DeviceMemoryRecord;
    static inline const auto list = std::tuple{
        json_field("available", &S::available),
        json_field("kind", &S::kind),
        json_field("total_bytes", &S::total_bytes),
        json_field("peak_used_bytes", &S::peak_used_bytes),
    };
};

template <>
struct JsonFields<MemoryRecord> {
    using S = MemoryRecord;
    static inline const auto list = std::tuple{
        // The estimate per category, and its total in the same object.
        json_group<S>("estimate", json_each_key<MemoryCategory>(&S::estimate),
                      json_field("total", &S::estimate_total)),
        json_group<S>("tracked_peak", json_each_key<MemoryCategory>(&S::tracked_peak)),
        json_field("tracked_peak_total", &S::tracked_peak_total),
        json_field("at_setup_total", &S::at_setup_total),
        // Only the phases that ran.
        json_group<S>("phases", json_each_present_key<Phase>(&S::phases, "phase")),
        json_field("peak_phase", &S::peak_phase),
        json_field("largest_category", &S::largest_category),
        json_field("device", &S::device),
        json_field("process_peak_rss_bytes", &S::process_peak_rss_bytes),
        json_key_if_present("process_huge_page_bytes", &S::process_huge_page_bytes),
    };
};

template <>
struct JsonFields<KernelRecord> {
    using S = KernelRecord;
    static inline const auto list = std::tuple{
        json_field("name", &S::name),
        json_field("impl", &S::impl),
        json_field("calls", &S::calls),
        json_field("total_ms", &S::total_ms),
        json_field("ms_per_step", &S::ms_per_step),
        json_field("pct_of_step", &S::pct_of_step),
        json_field("flops", &S::flops),
        json_field("bytes", &S::bytes),
        json_field("gflops_per_s", &S::gflops_per_s),
        json_field("gb_per_s", &S::gb_per_s),
        json_field("intensity", &S::intensity),
        json_field("bound", &S::bound),
        json_field("pct_of_roofline", &S::pct_of_roofline),
    };
};

template <>
struct JsonFields<StepRow> {
    using S = StepRow;
    static inline const auto list = std::tuple{
        json_field("step", &S::step),
        json_field("warmup", &S::warmup),
        json_field("wall_ms", &S::wall_ms),
        json_group<S>("phases_ms", json_each_key<Phase>(&S::phases_ms)),
        json_field("other_ms", &S::other_ms),
        json_field_as<FiniteOrNull>("loss", &S::loss),
        json_field_as<FiniteOrNull>("grad_norm", &S::grad_norm),
        json_field("lr", &S::lr),
        json_field("comm_busy_ms", &S::comm_busy_ms),
        json_field("comm_bytes", &S::comm_bytes),
        json_field("host_syncs", &S::host_syncs),
        json_field("host_wait_ms", &S::host_wait_ms),
        json_field("other_cpu_ms", &S::other_cpu_ms),
        json_field("steal_ms", &S::steal_ms),
        json_field("round", &S::round),
        json_added_field("tokens", &S::tokens),
        json_field("sm_clock_mhz", &S::sm_clock_mhz),
        json_field("throttle_reasons", &S::throttle_reasons),
    };
};

template <>
struct JsonFields<RankRecord> {
    using S = RankRecord;
    static inline const auto list = std::tuple{
        json_field("rank", &S::rank),
        json_field("step_ms", &S::step_ms),
        json_group<S>("phases_ms", json_each_key<Phase>(&S::phases_ms)),
        json_field("comm_busy_ms", &S::comm_busy_ms),
        json_field("comm_overlapped_ms", &S::comm_overlapped_ms),
    };
};

template <>
struct JsonFields<DataParallelRecord> {
    using S = DataParallelRecord;
    static inline const auto list = std::tuple{
        json_field("world_size", &S::world_size),
        json_field("transport", &S::transport),
        json_field("zero", &S::zero),
        json_field("overlap", &S::overlap),
        json_field("bucket_mb", &S::bucket_mb),
        json_field("buckets", &S::buckets),
        json_added_field("finest_buckets", &S::finest_buckets),
        json_field("simulated_link_gbps", &S::simulated_link_gbps),
        json_field("simulated_latency_us", &S::simulated_latency_us),
        json_added_optional("simulated_link_ratio", &S::simulated_link_ratio),
        json_added_optional("calibration_compute_ms", &S::calibration_compute_ms),
        json_field("bytes_per_step", &S::bytes_per_step),
        json_field("achieved_busbw_gbps", &S::achieved_busbw_gbps),
        json_field("probe_busbw_gbps", &S::probe_busbw_gbps),
        json_field("probe_source", &S::probe_source),
        json_field("ranks", &S::ranks),
        json_field("slowest_rank", &S::slowest_rank),
        json_field("rank_spread_ms", &S::rank_spread_ms),
        json_field("rank_spread_pct", &S::rank_spread_pct),
        json_field("comm_exposed_ms", &S::comm_exposed_ms),
        json_field("comm_overlapped_ms", &S::comm_overlapped_ms),
        json_field("comm_share", &S::comm_share),
        json_field("busbw_fraction_of_probe", &S::busbw_fraction_of_probe),
    };
};

template <>
struct JsonFields<Divergence> {
    using S = Divergence;
    static inline const auto list =
        std::tuple{json_field("step", &S::step), json_field("reason", &S::reason)};
};

template <>
struct JsonFields<VariantResult> {
    using S = VariantResult;
    static inline const auto list = std::tuple{
        json_field("name", &S::name),
        json_field("status", &S::status),
        json_field("message", &S::message),
        json_field("failed_step", &S::failed_step),
        json_field("failed_phase", &S::failed_phase),
        // Added within v10: a file written before it has no key (read as not diverged).
        json_added_optional("diverged", &S::diverged),
        json_field("backend", &S::backend),
        json_field("device_name", &S::device_name),
        json_added_optional("cpu_isa", &S::cpu_isa),
        json_field("threads", &S::threads),
        json_field("config", &S::config),
        json_field("changed", &S::changed),
        json_field("knobs_changed", &S::knobs_changed),
        json_added_optional("aa_control", &S::aa_control),
        json_group<S>("model", json_field("describe", &S::model_describe),
                      json_field("n_params", &S::n_params)),
        json_field("batch", &S::batch),
        json_field("warmup_steps", &S::warmup_steps),
        json_field("measure_steps", &S::measure_steps),
        json_field("measured_steps", &S::measured_steps),
        json_field("setup_ms", &S::setup_ms),
        json_field("profiled", &S::profiled),
        json_field("stats", &S::stats),
        json_field("flops", &S::flops),
        json_field("roofline", &S::roofline),
        json_field("loss", &S::loss),
        json_field("memory", &S::memory),
        json_field("kernels", &S::kernels),
        json_field("steps", &S::steps),
        json_field("data_parallel", &S::data_parallel),
    };
};

// Keys absent when unknown (hostname, cuda_note, git_dirty, compiler, openmp_wait, huge_pages);
// git_commit is null.
template <>
struct JsonFields<Environment> {
    using S = Environment;
    static inline const auto list = std::tuple{
        json_key_if_present("hostname", &S::hostname),
        json_field("hardware_threads", &S::hardware_threads),
        json_field("cuda_available", &S::cuda_available),
        json_key_if_present("cuda_note", &S::cuda_note),
        json_field("git_commit", &S::git_commit),
        json_key_if_present("git_dirty", &S::git_dirty),
        json_key_if_present("compiler", &S::compiler),
        json_field("peaks_cache", &S::peaks_cache),
        json_key_if_present("openmp_wait", &S::openmp_wait),
        json_key_if_present("usable_cores", &S::usable_cores),
        json_key_if_present("usable_cores_source", &S::usable_cores_source),
        json_key_if_present("huge_pages", &S::huge_pages),
    };
};

// [low, high] of an interval, or null (speedup_ci95).
struct LowHighOrNull {
    static json write(const std::optional<std::pair<double, double>>& x) {
        return x ? json::array({x->first, x->second}) : json(nullptr);
    }
    static void read(const JsonNode& n, std::optional<std::pair<double, double>>& out) {
        out.reset();
        if (n.is_null()) return;
        const std::vector<JsonNode> e = n.elements();
        if (e.size() != 2) n.expected("[low, high] or null");
        const double low = e[0].number(), high = e[1].number();
        if (!(low <= high)) n.expected("[low, high] with low <= high");
        out = std::make_pair(low, high);
    }
};

// The verdict part of a row (results.h: the table's cells are not stored).
template <>
struct JsonFields<ComparisonRow> {
    using S = ComparisonRow;
    static inline const auto list = std::tuple{
        json_field("variant", &S::variant),
        json_field("is_baseline", &S::is_baseline),
        json_field("delta_time_ms", &S::delta_time_ms),
        json_field("speedup", &S::speedup),
        json_field("delta_memory_bytes", &S::delta_memory_bytes),
        json_field("within_noise", &S::within_noise),
        json_field_as<LowHighOrNull>("speedup_ci95", &S::speedup_ci95),
        json_field("time_call", &S::time_call),
        json_field("loss_within_tolerance", &S::loss_within_tolerance),
        json_field("delta_mean_loss", &S::delta_mean_loss),
        json_field("delta_final_loss", &S::delta_final_loss),
        json_added_optional("loss_compared_at", &S::loss_compared_at),
        json_field("decision", &S::decision),
        json_field("verdict", &S::verdict),
    };
};

template <>
struct JsonFields<Comparison> {
    using S = Comparison;
    static inline const auto list = std::tuple{
        json_field("baseline", &S::baseline),
        json_field("loss_tolerance_nats", &S::loss_tolerance_nats),
        json_field("loss_tolerance_basis", &S::loss_tolerance_basis),
        json_field("notes", &S::notes),
        json_field("variants", &S::rows),
    };
};

template <>
struct JsonFields<ExperimentHeader> {
    using S = ExperimentHeader;
    static inline const auto list = std::tuple{
        json_field("name", &S::name),         json_field("source", &S::source),
        json_field("baseline", &S::baseline), json_field("loss_tolerance", &S::loss_tolerance),
        json_field("rounds", &S::rounds),     json_field("min_effect", &S::min_effect),
    };
};

template <>
struct JsonFields<Units> {
    using S = Units;
    static inline const auto list = std::tuple{
        json_field("time", &S::time),
        json_field("memory", &S::memory),
        json_field("delta", &S::delta),
    };
};

// schema_version is checked (check_schema_version) before this list is read.
template <>
struct JsonFields<Results> {
    using S = Results;
    static inline const auto list = std::tuple{
        json_field("schema_version", &S::schema_version),
        json_field("tool", &S::tool),
        json_field("experiment", &S::experiment),
        json_field("started_utc", &S::started_utc),
        json_field("interrupted", &S::interrupted),
        json_field("environment", &S::environment),
        json_field("units", &S::units),
        json_field("variants", &S::variants),
        json_field("comparison", &S::comparison),
    };
};

// ---- Results <-> JSON -------------------------------------------------------------------------

json results_to_json(const Results& results) {
    return to_json_value(results);
}

json variant_to_json(const VariantResult& variant) {
    return to_json_value(variant);
}

VariantResult variant_from_json(const json& j, const std::string& label) {
    VariantResult v;
    read_json_value(JsonNode(j, label, "variant"), v);
    return v;
}

json environment_to_json(const Environment& environment) {
    return to_json_value(environment);
}

namespace {

// schema_version first: a file of another version is refused before any other key is read.
void check_schema_version(const JsonNode& top, const std::string& label) {
    if (!top.has("schema_version"))
        throw ReportError("'" + label +
                          "' is not a microtrain results.json (no schema_version key); pass the "
                          "results.json of a run folder");
    const JsonNode v = top["schema_version"];
    if (v.is_null() || v.integer() != kResultsSchemaVersion)
        throw ReportError("'" + label + "' has schema_version " +
                          (v.is_null() ? std::string("null") : std::to_string(v.integer())) +
                          ", this microtrain reads schema_version " +
                          std::to_string(kResultsSchemaVersion) +
                          "; re-run the experiment with this version");
}

}  // namespace

Results results_from_json(const json& j, const std::string& label) {
    const JsonNode top(j, label, "");
    if (!j.is_object())
        throw ReportError("'" + label + "' is not a microtrain results.json (not a JSON object)");
    check_schema_version(top, label);
    if (top["variants"].elements().empty()) throw ReportError("'" + label + "' has no variants");
    Results res;
    read_json_value(top, res);
    return res;
}

namespace {

std::string read_first_line(const std::string& cmd) {
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return "";
    char buf[256] = {0};
    std::string s;
    if (std::fgets(buf, sizeof buf, p)) s = buf;
    ::pclose(p);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
}

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

}  // namespace

Environment capture_environment(const std::string& experiment_source_path) {
    Environment env;
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) == 0) env.hostname = host;
    env.hardware_threads = std::thread::hardware_concurrency();
    std::string why;
    env.cuda_available = cuda_available(&why);
    if (!why.empty()) env.cuda_note = why;
    // The commit of the repository the experiment file lives in (or the working directory).
    std::string dir = ".";
    if (!experiment_source_path.empty()) {
        const fs::path p = fs::absolute(experiment_source_path).parent_path();
        if (fs::is_directory(p)) dir = p.string();
    }
    const std::string git = "git -C " + shell_quote(dir);
    const std::string commit = read_first_line(git + " rev-parse HEAD 2>/dev/null");
    if (!commit.empty()) {
        env.git_commit = commit;
        env.git_dirty =
            !read_first_line(git + " status --porcelain --untracked-files=no 2>/dev/null").empty();
    }
#if defined(__VERSION__)
    env.compiler = __VERSION__;
#endif
    env.peaks_cache = peaks_cache_dir();
    env.openmp_wait = openmp_wait_policy();
    const UsableCores cores = usable_cpu_cores();
    env.usable_cores = cores.count;
    env.usable_cores_source = cores.source;
    try {
        env.huge_pages = huge_page_policy().text;
    } catch (const BackendError&) {
        // A bad MT_CPU_HUGE_PAGES: the CPU backend refuses it with this message; a CUDA-only
        // run never reads it, and its record simply lacks the key.
    }
    return env;
}

json read_json_file(const std::string& path) {
    std::string text;
    try {
        // A FIFO or a device is refused before it is opened for reading (it would block).
        text = read_regular_file(path, kMaxResultsFileBytes);
    } catch (const FileKindError& e) {
        throw ReportError(std::string("cannot read ") + e.what() +
                          " (expected a results.json written by `microtrain run`)");
    }
    json j;
    try {
        j = json::parse(text);
    } catch (const std::exception& e) {
        throw ReportError("'" + path + "' is not valid JSON: " + e.what());
    }
    return j;
}

Results read_results(const std::string& path) {
    return results_from_json(read_json_file(path), path);
}

}  // namespace mt

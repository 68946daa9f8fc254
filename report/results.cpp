// results.json <-> Results (see results.h): the conversion from the runner's ExperimentResult,
// the writer, and the checked reader.
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

#include "report/comparison.h"

namespace mt {

using nlohmann::json;
namespace fs = std::filesystem;

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

// ---- ExperimentResult -> Results ----------------------------------------------------------------

namespace {

// A finite number, or nullopt (written as JSON null: JSON has no NaN).
std::optional<double> finite(double x) {
    return std::isfinite(x) ? std::optional<double>(x) : std::nullopt;
}

CategoryBytes estimate_bytes(const MemoryEstimate& e) {
    CategoryBytes b{};
    b[static_cast<int>(MemoryCategory::params)] = e.params;
    b[static_cast<int>(MemoryCategory::grads)] = e.grads;
    b[static_cast<int>(MemoryCategory::optimizer)] = e.optimizer;
    b[static_cast<int>(MemoryCategory::activations)] = e.activations;
    b[static_cast<int>(MemoryCategory::workspace)] = e.workspace;
    b[static_cast<int>(MemoryCategory::data)] = e.data;
    return b;
}

MemoryRecord memory_record(const RunResult& r) {
    const MemorySummary& m = r.memory;
    MemoryRecord o;
    o.estimate = estimate_bytes(r.estimate);
    o.estimate_total = r.estimate.total();
    o.tracked_peak = m.tracked_peak;
    o.tracked_peak_total = m.tracked_peak_total;
    o.at_setup_total = m.at_setup.current_total;
    for (Phase p : kAllPhases) {
        const PhaseMemory& pm = m.phases[static_cast<int>(p)];
        if (!pm.seen) continue;
        o.phases[static_cast<int>(p)] = PhaseMemoryRecord{pm.tracked_peak_total, pm.tracked_peak,
                                                          pm.device_used_peak, pm.transient_peak};
    }
    o.peak_phase = m.peak_phase();
    o.largest_category = m.largest_category();
    o.device = {m.device_available, m.device_kind, m.device_total, m.device_used_peak};
    o.process_peak_rss_bytes = m.process_peak_rss;
    return o;
}

KernelRecord kernel_record(const KernelStat& k) {
    KernelRecord r;
    r.name = k.name;
    r.impl = k.impl;
    r.calls = k.calls;
    r.total_ms = k.total_ms;
    r.ms_per_step = k.ms_per_step;
    r.pct_of_step = k.pct_of_step;
    r.flops = k.flops;
    r.bytes = k.bytes;
    r.gflops_per_s = k.gflops_per_s();
    r.gb_per_s = k.gb_per_s();
    r.intensity = k.intensity();
    r.bound = k.bound;
    r.pct_of_roofline = k.pct_of_roofline;
    return r;
}

StepRow step_row(const StepRecord& s) {
    StepRow o;
    o.step = s.step;
    o.warmup = s.warmup;
    o.wall_ms = s.times.wall_ms;
    o.phases_ms = s.times.ms;
    o.other_ms = s.times.other_ms();
    o.loss = finite(s.loss);
    o.grad_norm = finite(s.grad_norm);
    o.lr = s.lr;
    o.comm_busy_ms = s.comm_busy_ms;
    o.comm_bytes = s.comm_bytes;
    o.host_syncs = s.host_syncs;
    o.host_wait_ms = s.host_wait_ms;
    return o;
}

// The data-parallel record with its derived numbers. `st` is rank 0's statistics (the variant's):
// the exposed comm time and the step it is a share of come from the same median steps.
DataParallelRecord data_parallel_record(const DataParallelRun& d, const RunStats& st) {
    DataParallelRecord o;
    o.world_size = d.world_size;
    o.transport = d.transport;
    o.zero = d.zero;
    o.overlap = d.overlap;
    o.bucket_mb = d.bucket_mb;
    o.buckets = d.buckets;
    o.simulated_link_gbps = d.simulated_link_gbps;
    o.simulated_latency_us = d.simulated_latency_us;
    o.bytes_per_step = d.bytes_per_step;
    o.achieved_busbw_gbps = d.achieved_busbw_gbps;
    o.probe_busbw_gbps = d.probe_busbw_gbps;
    o.probe_source = d.probe_source;
    for (const RankSummary& r : d.ranks)
        o.ranks.push_back({r.rank, r.step_ms, r.phases_ms, r.comm_busy_ms, r.comm_overlapped_ms});
    if (!o.ranks.empty()) {
        const auto [lo, hi] = std::minmax_element(
            o.ranks.begin(), o.ranks.end(),
            [](const RankRecord& a, const RankRecord& b) { return a.step_ms < b.step_ms; });
        o.slowest_rank = hi->rank;
        o.rank_spread_ms = hi->step_ms - lo->step_ms;
        o.rank_spread_pct = lo->step_ms > 0 ? o.rank_spread_ms / lo->step_ms : 0;
        for (const RankRecord& r : o.ranks)
            if (r.rank == 0) o.comm_overlapped_ms = r.comm_overlapped_ms;
    }
    o.comm_exposed_ms = st.phase[static_cast<int>(Phase::comm)].median;
    o.comm_share = st.step_ms.median > 0 ? o.comm_exposed_ms / st.step_ms.median : 0;
    if (d.probe_busbw_gbps && *d.probe_busbw_gbps > 0)
        o.busbw_fraction_of_probe = d.achieved_busbw_gbps / *d.probe_busbw_gbps;
    return o;
}

StepStatistics step_statistics(const RunStats& st) {
    StepStatistics o;
    o.step_ms = SeriesSummary::of(st.step_ms);
    for (Phase p : kAllPhases)
        o.phases_ms[static_cast<int>(p)] = SeriesSummary::of(st.phase[static_cast<int>(p)]);
    o.other_ms = SeriesSummary::of(st.other_ms);
    o.loss = SeriesSummary::of(st.loss);
    o.host_syncs = SeriesSummary::of(st.host_syncs);
    o.host_wait_ms = SeriesSummary::of(st.host_wait_ms);
    o.samples_per_s = st.samples_per_s;
    o.tokens_per_s = st.tokens_per_s;
    o.jitter = st.step_ms.iqr_over_median();
    o.jitter_warning = st.measured > 0 && o.jitter > kJitterWarnThreshold;
    return o;
}

// The run's configuration part: names, config keys, batch shape, step counts.
void fill_config(VariantResult& v, const RunResult& r) {
    const RunConfig& c = r.config;
    v.name = c.variant;
    for (const auto& [k, val] : flatten(c)) v.config[k] = val;
    v.changed = c.changed;
    v.knobs_changed = static_cast<int>(c.changed.size());
    v.model_describe = c.model.describe();
    v.n_params = r.n_params;
    const int B = c.data.batch_size, T = c.data.seq_len, A = c.run.grad_accum;
    // The global batch: every rank trains B * A samples of its own per optimizer step.
    const long long W = r.dist ? r.dist->world_size : 1;
    v.batch = {B, T, A, W * B * A, W * B * T * A};
    // Shape jitter: the mean tokens the measured steps really trained (seq_len is their maximum).
    if (c.data.seq_len_jitter > 0 && !r.steps.empty())
        v.batch.tokens_per_step = std::llround(measured_work(r).tokens_per_step);
    v.warmup_steps = c.run.warmup_steps;
    v.measure_steps = c.run.measure_steps;
    v.profiled = c.profile.kernels;
}

}  // namespace

VariantResult to_variant_result(const RunResult& r) {
    const RunStats st = compute_run_stats(r);
    VariantResult v;
    fill_config(v, r);
    v.status = r.status;
    v.message = r.message;
    if (r.failed_step >= 0) v.failed_step = r.failed_step;
    if (!r.failed_phase.empty()) v.failed_phase = r.failed_phase;
    v.backend = r.backend;
    v.device_name = r.device_name;
    v.threads = r.threads;
    v.measured_steps = st.measured;
    v.setup_ms = r.setup_ms;
    v.stats = step_statistics(st);
    v.flops = {r.flops_per_step, st.achieved_flops_per_s, r.peak_flops, r.peak_flops_source,
               st.mfu};
    // Shape jitter: the FLOPs the measured steps really did, per step (their mean).
    if (r.config.data.seq_len_jitter > 0 && st.measured > 0)
        v.flops.per_step = measured_work(r).model_flops_per_step;
    v.roofline = {r.peaks.flops_per_s,  r.peaks.bytes_per_s,  r.peaks.ridge(),
                  r.peaks.flops_source, r.peaks.bytes_source, r.peaks.from_cache};
    v.loss.first = r.steps.empty() ? std::nullopt : finite(r.steps.front().loss);
    v.loss.final = r.steps.empty() ? std::nullopt : finite(st.final_loss);
    v.loss.mean_measured = st.loss.n ? finite(st.loss.mean) : std::nullopt;
    v.memory = memory_record(r);
    for (const KernelStat& k : r.kernels) v.kernels.push_back(kernel_record(k));
    for (const StepRecord& s : r.steps) v.steps.push_back(step_row(s));
    if (r.dist) v.data_parallel = data_parallel_record(*r.dist, st);
    return v;
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
    return env;
}

namespace {

// The stored part of the comparison: what report.md's table says per variant.
ComparisonRecord comparison_record(const Comparison& c) {
    ComparisonRecord o;
    o.baseline = c.baseline;
    o.loss_tolerance_nats = c.tolerance_nats;
    o.loss_tolerance_basis = c.tolerance_basis;
    o.notes = c.notes;
    for (const ComparisonRow& r : c.rows)
        o.rows.push_back({r.name, r.is_baseline, r.dtime_ms, r.speedup, r.dmem_bytes,
                          r.within_noise, r.loss_ok, r.dmean_loss, r.dfinal_loss, r.decision,
                          r.verdict});
    return o;
}

}  // namespace

Results to_results(const ExperimentResult& ex) {
    Results res;
    res.experiment = {ex.name, ex.source_path, ex.baseline, ex.loss_tolerance};
    res.started_utc = ex.started_utc;
    res.interrupted = ex.interrupted;
    res.environment = capture_environment(ex.source_path);
    for (const RunResult& r : ex.runs) res.variants.push_back(to_variant_result(r));
    res.comparison = comparison_record(build_comparison(res));
    return res;
}

// ---- Results -> JSON ----------------------------------------------------------------------------

namespace {

template <class T>
json opt_json(const std::optional<T>& x) {
    return x ? json(*x) : json(nullptr);
}

json series_json(const SeriesSummary& s) {
    return {{"n", s.n},     {"mean", s.mean}, {"median", s.median},
            {"p10", s.p10}, {"p90", s.p90},   {"q1", s.q1},
            {"q3", s.q3},   {"iqr", s.iqr},   {"iqr_over_median", s.iqr_over_median},
            {"std", s.std}, {"min", s.min},   {"max", s.max}};
}

json categories_json(const CategoryBytes& a) {
    json j = json::object();
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        j[to_string(static_cast<MemoryCategory>(c))] = a[c];
    return j;
}

json stats_json(const StepStatistics& st) {
    json phases = json::object();
    for (Phase p : kAllPhases)
        phases[to_string(p)] = series_json(st.phases_ms[static_cast<int>(p)]);
    phases["other"] = series_json(st.other_ms);
    return {{"step_ms", series_json(st.step_ms)},
            {"phases_ms", phases},
            {"loss", series_json(st.loss)},
            {"samples_per_s", st.samples_per_s},
            {"tokens_per_s", st.tokens_per_s},
            {"jitter", st.jitter},
            {"jitter_warning", st.jitter_warning},
            {"host_syncs", series_json(st.host_syncs)},
            {"host_wait_ms", series_json(st.host_wait_ms)}};
}

json memory_json(const MemoryRecord& m) {
    json est = categories_json(m.estimate);
    est["total"] = m.estimate_total;
    json phases = json::object();
    for (Phase p : kAllPhases) {
        const auto& pm = m.phases[static_cast<int>(p)];
        if (!pm) continue;
        phases[to_string(p)] = {{"tracked_peak_total", pm->tracked_peak_total},
                                {"tracked_peak", categories_json(pm->tracked_peak)},
                                {"device_used_peak", pm->device_used_peak},
                                {"transient_peak", pm->transient_peak}};
    }
    return {{"estimate", est},
            {"tracked_peak", categories_json(m.tracked_peak)},
            {"tracked_peak_total", m.tracked_peak_total},
            {"at_setup_total", m.at_setup_total},
            {"phases", phases},
            {"peak_phase", m.peak_phase ? json(to_string(*m.peak_phase)) : json(nullptr)},
            {"largest_category", to_string(m.largest_category)},
            {"device",
             {{"available", m.device.available},
              {"kind", m.device.kind},
              {"total_bytes", m.device.total_bytes},
              {"peak_used_bytes", m.device.peak_used_bytes}}},
            {"process_peak_rss_bytes", m.process_peak_rss_bytes}};
}

json kernel_json(const KernelRecord& k) {
    return {{"name", k.name},
            {"impl", k.impl},
            {"calls", k.calls},
            {"total_ms", k.total_ms},
            {"ms_per_step", k.ms_per_step},
            {"pct_of_step", k.pct_of_step},
            {"flops", k.flops},
            {"bytes", k.bytes},
            {"gflops_per_s", k.gflops_per_s},
            {"gb_per_s", k.gb_per_s},
            {"intensity", k.intensity},
            {"bound", to_string(k.bound)},
            {"pct_of_roofline", k.pct_of_roofline}};
}

json step_json(const StepRow& s) {
    json pm = json::object();
    for (Phase p : kAllPhases) pm[to_string(p)] = s.phases_ms[static_cast<int>(p)];
    return {{"step", s.step},
            {"warmup", s.warmup},
            {"wall_ms", s.wall_ms},
            {"phases_ms", pm},
            {"other_ms", s.other_ms},
            {"loss", opt_json(s.loss)},
            {"grad_norm", opt_json(s.grad_norm)},
            {"lr", s.lr},
            {"comm_busy_ms", s.comm_busy_ms},
            {"comm_bytes", s.comm_bytes},
            {"host_syncs", s.host_syncs},
            {"host_wait_ms", s.host_wait_ms}};
}

json phase_values_json(const std::array<double, kPhaseCount>& ms) {
    json j = json::object();
    for (Phase p : kAllPhases) j[to_string(p)] = ms[static_cast<int>(p)];
    return j;
}

json data_parallel_json(const std::optional<DataParallelRecord>& dp) {
    if (!dp) return nullptr;
    const DataParallelRecord& d = *dp;
    json ranks = json::array();
    for (const RankRecord& r : d.ranks)
        ranks.push_back({{"rank", r.rank},
                         {"step_ms", r.step_ms},
                         {"phases_ms", phase_values_json(r.phases_ms)},
                         {"comm_busy_ms", r.comm_busy_ms},
                         {"comm_overlapped_ms", r.comm_overlapped_ms}});
    return {{"world_size", d.world_size},
            {"transport", d.transport},
            {"zero", d.zero},
            {"overlap", d.overlap},
            {"bucket_mb", d.bucket_mb},
            {"buckets", d.buckets},
            {"simulated_link_gbps", d.simulated_link_gbps},
            {"simulated_latency_us", d.simulated_latency_us},
            {"bytes_per_step", d.bytes_per_step},
            {"achieved_busbw_gbps", d.achieved_busbw_gbps},
            {"probe_busbw_gbps", opt_json(d.probe_busbw_gbps)},
            {"probe_source", d.probe_source},
            {"ranks", ranks},
            {"slowest_rank", d.slowest_rank},
            {"rank_spread_ms", d.rank_spread_ms},
            {"rank_spread_pct", d.rank_spread_pct},
            {"comm_exposed_ms", d.comm_exposed_ms},
            {"comm_overlapped_ms", d.comm_overlapped_ms},
            {"comm_share", d.comm_share},
            {"busbw_fraction_of_probe", opt_json(d.busbw_fraction_of_probe)}};
}

// The measurements of one variant: statistics, FLOPs, roofline, loss, memory, ops, steps, and
// how it communicated (data_parallel).
void write_measurements(json& v, const VariantResult& r) {
    v["stats"] = stats_json(r.stats);
    v["flops"] = {{"per_step", r.flops.per_step},
                  {"achieved_per_s", r.flops.achieved_per_s},
                  {"peak_per_s", opt_json(r.flops.peak_per_s)},
                  {"peak_source", r.flops.peak_source},
                  {"mfu", opt_json(r.flops.mfu)}};
    const RooflineRecord& rf = r.roofline;
    v["roofline"] = {{"peak_flops_per_s", rf.peak_flops_per_s},
                     {"bandwidth_bytes_per_s", rf.bandwidth_bytes_per_s},
                     {"ridge_flops_per_byte", rf.ridge_flops_per_byte},
                     {"flops_source", rf.flops_source},
                     {"bytes_source", rf.bytes_source},
                     {"from_cache", rf.from_cache}};
    v["loss"] = {{"first", opt_json(r.loss.first)},
                 {"final", opt_json(r.loss.final)},
                 {"mean_measured", opt_json(r.loss.mean_measured)}};
    v["memory"] = memory_json(r.memory);
    v["kernels"] = json::array();
    for (const KernelRecord& k : r.kernels) v["kernels"].push_back(kernel_json(k));
    v["steps"] = json::array();
    for (const StepRow& s : r.steps) v["steps"].push_back(step_json(s));
    v["data_parallel"] = data_parallel_json(r.data_parallel);
}

json variant_json(const VariantResult& r) {
    json v;
    v["name"] = r.name;
    v["status"] = to_string(r.status);
    v["message"] = r.message;
    v["failed_step"] = opt_json(r.failed_step);
    v["failed_phase"] = opt_json(r.failed_phase);
    v["backend"] = r.backend;
    v["device_name"] = r.device_name;
    v["threads"] = r.threads;
    v["config"] = r.config;
    v["changed"] = r.changed;
    v["knobs_changed"] = r.knobs_changed;
    v["model"] = {{"describe", r.model_describe}, {"n_params", r.n_params}};
    v["batch"] = {{"batch_size", r.batch.batch_size},
                  {"seq_len", r.batch.seq_len},
                  {"grad_accum", r.batch.grad_accum},
                  {"samples_per_step", r.batch.samples_per_step},
                  {"tokens_per_step", r.batch.tokens_per_step}};
    v["warmup_steps"] = r.warmup_steps;
    v["measure_steps"] = r.measure_steps;
    v["measured_steps"] = r.measured_steps;
    v["setup_ms"] = r.setup_ms;
    v["profiled"] = r.profiled;
    write_measurements(v, r);
    return v;
}

}  // namespace

json environment_to_json(const Environment& e) {
    json env;
    if (e.hostname) env["hostname"] = *e.hostname;
    env["hardware_threads"] = e.hardware_threads;
    env["cuda_available"] = e.cuda_available;
    if (e.cuda_note) env["cuda_note"] = *e.cuda_note;
    env["git_commit"] = opt_json(e.git_commit);
    if (e.git_dirty) env["git_dirty"] = *e.git_dirty;
    if (e.compiler) env["compiler"] = *e.compiler;
    env["peaks_cache"] = e.peaks_cache;
    return env;
}

namespace {

json comparison_json(const ComparisonRecord& c) {
    json rows = json::array();
    for (const ComparisonVerdict& r : c.rows)
        rows.push_back({{"variant", r.variant},
                        {"is_baseline", r.is_baseline},
                        {"delta_time_ms", opt_json(r.delta_time_ms)},
                        {"speedup", opt_json(r.speedup)},
                        {"delta_memory_bytes", opt_json(r.delta_memory_bytes)},
                        {"within_noise", r.within_noise},
                        {"loss_within_tolerance", opt_json(r.loss_within_tolerance)},
                        {"delta_mean_loss", opt_json(r.delta_mean_loss)},
                        {"delta_final_loss", opt_json(r.delta_final_loss)},
                        {"decision", enum_name(r.decision)},
                        {"verdict", r.verdict}});
    return {{"baseline", c.baseline},
            {"loss_tolerance_nats", opt_json(c.loss_tolerance_nats)},
            {"loss_tolerance_basis", c.loss_tolerance_basis},
            {"notes", c.notes},
            {"variants", rows}};
}

}  // namespace

json results_to_json(const Results& res) {
    json j;
    j["schema_version"] = res.schema_version;
    j["tool"] = res.tool;
    j["experiment"] = {{"name", res.experiment.name},
                       {"source", res.experiment.source},
                       {"baseline", res.experiment.baseline},
                       {"loss_tolerance", opt_json(res.experiment.loss_tolerance)}};
    j["started_utc"] = res.started_utc;
    j["interrupted"] = res.interrupted;
    j["environment"] = environment_to_json(res.environment);
    j["units"] = {
        {"time", res.units.time}, {"memory", res.units.memory}, {"delta", res.units.delta}};
    j["variants"] = json::array();
    for (const VariantResult& v : res.variants) j["variants"].push_back(variant_json(v));
    j["comparison"] = comparison_json(res.comparison);
    return j;
}

json results_to_json(const ExperimentResult& ex) {
    return results_to_json(to_results(ex));
}

// ---- JSON -> Results: every key checked ---------------------------------------------------------

namespace {

// A value of the document being read, with its key path ("variants[2].stats") for errors.
class Node {
  public:
    Node(const json& value, const std::string& file, std::string path)
        : v_(value), file_(file), path_(std::move(path)) {}

    [[noreturn]] void fail(const std::string& what) const {
        throw ReportError(file_ + ": " + (path_.empty() ? "(top level)" : path_) + ": " + what);
    }
    [[noreturn]] void expected(const std::string& what) const {
        std::string got = v_.dump();
        if (got.size() > 60) got = got.substr(0, 57) + "...";
        fail("expected " + what + ", got " + got);
    }

    bool has(const std::string& key) const { return v_.is_object() && v_.contains(key); }
    Node operator[](const std::string& key) const {
        if (!v_.is_object()) expected("an object");
        if (!v_.contains(key)) fail("missing key '" + key + "'");
        return Node(v_[key], file_, path_.empty() ? key : path_ + "." + key);
    }
    // The elements of an array, each with its index in the path.
    std::vector<Node> elements() const {
        if (!v_.is_array()) expected("an array");
        std::vector<Node> out;
        for (size_t i = 0; i < v_.size(); ++i)
            out.emplace_back(v_[i], file_, path_ + "[" + std::to_string(i) + "]");
        return out;
    }
    // The keys of an object, in order.
    std::vector<std::string> keys() const {
        if (!v_.is_object()) expected("an object");
        std::vector<std::string> out;
        for (auto it = v_.begin(); it != v_.end(); ++it) out.push_back(it.key());
        return out;
    }

    bool is_null() const { return v_.is_null(); }
    double number() const {
        if (!v_.is_number()) expected("a number");
        return v_.get<double>();
    }
    long long integer() const {
        if (!v_.is_number_integer()) expected("an integer");
        return v_.get<long long>();
    }
    int int_value() const { return static_cast<int>(integer()); }
    size_t count() const {
        if (!v_.is_number_unsigned() && !(v_.is_number_integer() && v_.get<long long>() >= 0))
            expected("a non-negative integer");
        return v_.get<size_t>();
    }
    bool boolean() const {
        if (!v_.is_boolean()) expected("true or false");
        return v_.get<bool>();
    }
    std::string string() const {
        if (!v_.is_string()) expected("a string");
        return v_.get<std::string>();
    }
    std::optional<double> number_or_null() const {
        return is_null() ? std::nullopt : std::optional<double>(number());
    }
    std::optional<std::string> string_or_null() const {
        return is_null() ? std::nullopt : std::optional<std::string>(string());
    }
    // An enum spelled as in EnumSpelling<E>.
    template <class E>
    E enum_value() const {
        const auto e = parse_enum<E>(string());
        if (!e) expected("one of " + enum_choices<E>());
        return *e;
    }
    // An enum without an EnumSpelling, spelled by its to_string over `values`.
    template <class E, size_t N>
    E listed_value(const std::array<E, N>& values) const {
        const std::string s = string();
        std::string choices;
        for (E e : values) {
            if (s == to_string(e)) return e;
            choices += (choices.empty() ? "" : ", ") + std::string(to_string(e));
        }
        expected("one of " + choices);
    }

  private:
    const json& v_;
    const std::string& file_;
    std::string path_;
};

SeriesSummary read_series(const Node& n) {
    SeriesSummary s;
    s.n = n["n"].count();
    s.mean = n["mean"].number();
    s.median = n["median"].number();
    s.p10 = n["p10"].number();
    s.p90 = n["p90"].number();
    s.q1 = n["q1"].number();
    s.q3 = n["q3"].number();
    s.iqr = n["iqr"].number();
    s.iqr_over_median = n["iqr_over_median"].number();
    s.std = n["std"].number();
    s.min = n["min"].number();
    s.max = n["max"].number();
    return s;
}

CategoryBytes read_categories(const Node& n) {
    CategoryBytes b{};
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        b[c] = n[to_string(static_cast<MemoryCategory>(c))].count();
    return b;
}

std::map<std::string, std::string> read_string_map(const Node& n) {
    std::map<std::string, std::string> m;
    for (const std::string& k : n.keys()) m[k] = n[k].string();
    return m;
}

StepStatistics read_stats(const Node& n) {
    StepStatistics st;
    st.step_ms = read_series(n["step_ms"]);
    const Node phases = n["phases_ms"];
    for (Phase p : kAllPhases)
        st.phases_ms[static_cast<int>(p)] = read_series(phases[to_string(p)]);
    st.other_ms = read_series(phases["other"]);
    st.loss = read_series(n["loss"]);
    st.samples_per_s = n["samples_per_s"].number();
    st.tokens_per_s = n["tokens_per_s"].number();
    st.jitter = n["jitter"].number();
    st.jitter_warning = n["jitter_warning"].boolean();
    st.host_syncs = read_series(n["host_syncs"]);
    st.host_wait_ms = read_series(n["host_wait_ms"]);
    return st;
}

PhaseMemoryRecord read_phase_memory(const Node& n) {
    return {n["tracked_peak_total"].count(), read_categories(n["tracked_peak"]),
            n["device_used_peak"].count(), n["transient_peak"].count()};
}

MemoryRecord read_memory(const Node& n) {
    MemoryRecord m;
    m.estimate = read_categories(n["estimate"]);
    m.estimate_total = n["estimate"]["total"].count();
    m.tracked_peak = read_categories(n["tracked_peak"]);
    m.tracked_peak_total = n["tracked_peak_total"].count();
    m.at_setup_total = n["at_setup_total"].count();
    const Node phases = n["phases"];
    for (const std::string& k : phases.keys()) {
        const auto p = parse_enum<Phase>(k);
        if (!p) phases[k].fail("not a phase (expected one of " + enum_choices<Phase>() + ")");
        m.phases[static_cast<int>(*p)] = read_phase_memory(phases[k]);
    }
    if (!n["peak_phase"].is_null()) m.peak_phase = n["peak_phase"].enum_value<Phase>();
    m.largest_category = n["largest_category"].enum_value<MemoryCategory>();
    const Node d = n["device"];
    m.device = {d["available"].boolean(), d["kind"].string(), d["total_bytes"].count(),
                d["peak_used_bytes"].count()};
    m.process_peak_rss_bytes = n["process_peak_rss_bytes"].count();
    return m;
}

KernelRecord read_kernel(const Node& n) {
    KernelRecord k;
    k.name = n["name"].string();
    k.impl = n["impl"].string();
    k.calls = n["calls"].integer();
    k.total_ms = n["total_ms"].number();
    k.ms_per_step = n["ms_per_step"].number();
    k.pct_of_step = n["pct_of_step"].number();
    k.flops = n["flops"].number();
    k.bytes = n["bytes"].number();
    k.gflops_per_s = n["gflops_per_s"].number();
    k.gb_per_s = n["gb_per_s"].number();
    k.intensity = n["intensity"].number();
    k.bound = n["bound"].listed_value(std::array{Bound::compute, Bound::memory, Bound::unknown});
    k.pct_of_roofline = n["pct_of_roofline"].number();
    return k;
}

StepRow read_step(const Node& n) {
    StepRow s;
    s.step = n["step"].int_value();
    s.warmup = n["warmup"].boolean();
    s.wall_ms = n["wall_ms"].number();
    for (Phase p : kAllPhases)
        s.phases_ms[static_cast<int>(p)] = n["phases_ms"][to_string(p)].number();
    s.other_ms = n["other_ms"].number();
    s.loss = n["loss"].number_or_null();
    s.grad_norm = n["grad_norm"].number_or_null();
    s.lr = n["lr"].number();
    s.comm_busy_ms = n["comm_busy_ms"].number();
    s.comm_bytes = n["comm_bytes"].number();
    s.host_syncs = n["host_syncs"].int_value();
    s.host_wait_ms = n["host_wait_ms"].number();
    return s;
}

std::array<double, kPhaseCount> read_phase_values(const Node& n) {
    std::array<double, kPhaseCount> ms{};
    for (Phase p : kAllPhases) ms[static_cast<int>(p)] = n[to_string(p)].number();
    return ms;
}

std::optional<DataParallelRecord> read_data_parallel(const Node& n) {
    if (n.is_null()) return std::nullopt;
    DataParallelRecord d;
    d.world_size = n["world_size"].int_value();
    d.transport = n["transport"].string();
    d.zero = n["zero"].int_value();
    d.overlap = n["overlap"].boolean();
    d.bucket_mb = n["bucket_mb"].number();
    d.buckets = n["buckets"].int_value();
    d.simulated_link_gbps = n["simulated_link_gbps"].number();
    d.simulated_latency_us = n["simulated_latency_us"].number();
    d.bytes_per_step = n["bytes_per_step"].number();
    d.achieved_busbw_gbps = n["achieved_busbw_gbps"].number();
    d.probe_busbw_gbps = n["probe_busbw_gbps"].number_or_null();
    d.probe_source = n["probe_source"].string();
    for (const Node& r : n["ranks"].elements())
        d.ranks.push_back({r["rank"].int_value(), r["step_ms"].number(),
                           read_phase_values(r["phases_ms"]), r["comm_busy_ms"].number(),
                           r["comm_overlapped_ms"].number()});
    d.slowest_rank = n["slowest_rank"].int_value();
    d.rank_spread_ms = n["rank_spread_ms"].number();
    d.rank_spread_pct = n["rank_spread_pct"].number();
    d.comm_exposed_ms = n["comm_exposed_ms"].number();
    d.comm_overlapped_ms = n["comm_overlapped_ms"].number();
    d.comm_share = n["comm_share"].number();
    d.busbw_fraction_of_probe = n["busbw_fraction_of_probe"].number_or_null();
    return d;
}

// Statistics, FLOPs, roofline, loss, memory, ops, steps and data_parallel (the counterpart of
// write_measurements).
void read_measurements(VariantResult& v, const Node& n) {
    v.stats = read_stats(n["stats"]);
    const Node fl = n["flops"];
    v.flops = {fl["per_step"].number(), fl["achieved_per_s"].number(),
               fl["peak_per_s"].number_or_null(), fl["peak_source"].string(),
               fl["mfu"].number_or_null()};
    const Node rf = n["roofline"];
    v.roofline = {rf["peak_flops_per_s"].number(),     rf["bandwidth_bytes_per_s"].number(),
                  rf["ridge_flops_per_byte"].number(), rf["flops_source"].string(),
                  rf["bytes_source"].string(),         rf["from_cache"].boolean()};
    const Node loss = n["loss"];
    v.loss = {loss["first"].number_or_null(), loss["final"].number_or_null(),
              loss["mean_measured"].number_or_null()};
    v.memory = read_memory(n["memory"]);
    for (const Node& k : n["kernels"].elements()) v.kernels.push_back(read_kernel(k));
    for (const Node& s : n["steps"].elements()) v.steps.push_back(read_step(s));
    v.data_parallel = read_data_parallel(n["data_parallel"]);
}

VariantResult read_variant(const Node& n) {
    VariantResult v;
    v.name = n["name"].string();
    v.status = n["status"].listed_value(
        std::array{RunStatus::ok, RunStatus::failed, RunStatus::interrupted, RunStatus::skipped});
    v.message = n["message"].string();
    if (!n["failed_step"].is_null()) v.failed_step = n["failed_step"].int_value();
    v.failed_phase = n["failed_phase"].string_or_null();
    v.backend = n["backend"].string();
    v.device_name = n["device_name"].string();
    v.threads = n["threads"].int_value();
    v.config = read_string_map(n["config"]);
    v.changed = read_string_map(n["changed"]);
    v.knobs_changed = n["knobs_changed"].int_value();
    v.model_describe = n["model"]["describe"].string();
    v.n_params = n["model"]["n_params"].count();
    const Node b = n["batch"];
    v.batch = {b["batch_size"].int_value(), b["seq_len"].int_value(), b["grad_accum"].int_value(),
               b["samples_per_step"].integer(), b["tokens_per_step"].integer()};
    v.warmup_steps = n["warmup_steps"].int_value();
    v.measure_steps = n["measure_steps"].int_value();
    v.measured_steps = n["measured_steps"].int_value();
    v.setup_ms = n["setup_ms"].number();
    v.profiled = n["profiled"].boolean();
    read_measurements(v, n);
    return v;
}

Environment read_environment(const Node& n) {
    Environment e;
    if (n.has("hostname")) e.hostname = n["hostname"].string();
    e.hardware_threads = static_cast<unsigned>(n["hardware_threads"].count());
    e.cuda_available = n["cuda_available"].boolean();
    if (n.has("cuda_note")) e.cuda_note = n["cuda_note"].string();
    e.git_commit = n["git_commit"].string_or_null();
    if (n.has("git_dirty")) e.git_dirty = n["git_dirty"].boolean();
    if (n.has("compiler")) e.compiler = n["compiler"].string();
    e.peaks_cache = n["peaks_cache"].string();
    return e;
}

ComparisonRecord read_comparison(const Node& n) {
    ComparisonRecord c;
    c.baseline = n["baseline"].string();
    c.loss_tolerance_nats = n["loss_tolerance_nats"].number_or_null();
    c.loss_tolerance_basis = n["loss_tolerance_basis"].string();
    for (const Node& note : n["notes"].elements()) c.notes.push_back(note.string());
    for (const Node& r : n["variants"].elements()) {
        ComparisonVerdict v;
        v.variant = r["variant"].string();
        v.is_baseline = r["is_baseline"].boolean();
        v.delta_time_ms = r["delta_time_ms"].number_or_null();
        v.speedup = r["speedup"].number_or_null();
        v.delta_memory_bytes = r["delta_memory_bytes"].number_or_null();
        v.within_noise = r["within_noise"].boolean();
        if (!r["loss_within_tolerance"].is_null())
            v.loss_within_tolerance = r["loss_within_tolerance"].boolean();
        v.delta_mean_loss = r["delta_mean_loss"].number_or_null();
        v.delta_final_loss = r["delta_final_loss"].number_or_null();
        v.decision = r["decision"].enum_value<Decision>();
        v.verdict = r["verdict"].string();
        c.rows.push_back(std::move(v));
    }
    return c;
}

// schema_version first: a file of another version is refused before any other key is read.
void check_schema_version(const Node& top, const std::string& label) {
    if (!top.has("schema_version"))
        throw ReportError("'" + label +
                          "' is not a microtrain results.json (no schema_version key); pass the "
                          "results.json of a run folder");
    const Node v = top["schema_version"];
    if (v.is_null() || v.integer() != kResultsSchemaVersion)
        throw ReportError("'" + label + "' has schema_version " +
                          (v.is_null() ? std::string("null") : std::to_string(v.integer())) +
                          ", this microtrain reads schema_version " +
                          std::to_string(kResultsSchemaVersion) +
                          "; re-run the experiment with this version");
}

}  // namespace

Results results_from_json(const json& j, const std::string& label) {
    const Node top(j, label, "");
    if (!j.is_object())
        throw ReportError("'" + label + "' is not a microtrain results.json (not a JSON object)");
    check_schema_version(top, label);
    Results res;
    res.schema_version = kResultsSchemaVersion;
    res.tool = top["tool"].string();
    const Node ex = top["experiment"];
    res.experiment = {ex["name"].string(), ex["source"].string(), ex["baseline"].string(),
                      ex["loss_tolerance"].number_or_null()};
    res.started_utc = top["started_utc"].string();
    res.interrupted = top["interrupted"].boolean();
    res.environment = read_environment(top["environment"]);
    const Node u = top["units"];
    res.units = {u["time"].string(), u["memory"].string(), u["delta"].string()};
    const std::vector<Node> variants = top["variants"].elements();
    if (variants.empty()) throw ReportError("'" + label + "' has no variants");
    for (const Node& v : variants) res.variants.push_back(read_variant(v));
    res.comparison = read_comparison(top["comparison"]);
    return res;
}

json read_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in)
        throw ReportError("cannot read '" + path + "': " + std::strerror(errno) +
                          " (expected a results.json written by `microtrain run`)");
    json j;
    try {
        j = json::parse(in);
    } catch (const std::exception& e) {
        throw ReportError("'" + path + "' is not valid JSON: " + e.what());
    }
    return j;
}

Results read_results(const std::string& path) {
    return results_from_json(read_json_file(path), path);
}

}  // namespace mt

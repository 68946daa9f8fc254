// Run folder writers, the comparison and the markdown report (see report.h).
#include "harness/report.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

namespace mt {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// ---- small formatting helpers -------------------------------------------------------------------

std::string f(const char* spec, double x) {
    char b[64];
    std::snprintf(b, sizeof b, spec, x);
    return b;
}
std::string mib(double bytes) {
    return f("%.1f", to_mib(bytes));
}
std::string signed_f(const char* spec, double x) {
    std::string s;
    if (x >= 0) s.push_back('+');
    s += f(spec, x);
    return s;
}
std::string pct(double frac) {
    return f("%.1f%%", 100.0 * frac);
}

json stats_json(const SeriesStats& s) {
    return {{"n", s.n},     {"mean", s.mean}, {"median", s.median},
            {"p10", s.p10}, {"p90", s.p90},   {"q1", s.q1},
            {"q3", s.q3},   {"iqr", s.iqr()}, {"iqr_over_median", s.iqr_over_median()},
            {"std", s.std}, {"min", s.min},   {"max", s.max}};
}

json opt_json(const std::optional<double>& x) {
    return x ? json(*x) : json(nullptr);
}

// A finite number or null (JSON has no NaN).
json finite_or_null(double x) {
    return std::isfinite(x) ? json(x) : json(nullptr);
}

json categories_json(const std::array<size_t, kMemoryCategoryCount>& a) {
    json j = json::object();
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        j[to_string(static_cast<MemoryCategory>(c))] = a[c];
    return j;
}

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

json environment_json(const ExperimentResult& ex) {
    json env;
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) == 0) env["hostname"] = host;
    env["hardware_threads"] = std::thread::hardware_concurrency();
    std::string why;
    env["cuda_available"] = cuda_available(&why);
    if (!why.empty()) env["cuda_note"] = why;
    // The commit of the repository the experiment file lives in (or the working directory).
    std::string dir = ".";
    if (!ex.source_path.empty()) {
        const fs::path p = fs::absolute(ex.source_path).parent_path();
        if (fs::is_directory(p)) dir = p.string();
    }
    const std::string commit =
        read_first_line("git -C " + shell_quote(dir) + " rev-parse HEAD 2>/dev/null");
    if (!commit.empty()) {
        env["git_commit"] = commit;
        env["git_dirty"] = !read_first_line("git -C " + shell_quote(dir) +
                                            " status --porcelain --untracked-files=no 2>/dev/null")
                                .empty();
    } else {
        env["git_commit"] = nullptr;
    }
#if defined(__VERSION__)
    env["compiler"] = __VERSION__;
#endif
    env["peaks_cache"] = peaks_cache_dir();
    return env;
}

json variant_json(const RunResult& r) {
    const RunStats st = compute_run_stats(r);
    const RunConfig& c = r.config;
    json v;
    v["name"] = c.variant;
    v["status"] = to_string(r.status);
    v["message"] = r.message;
    v["failed_step"] = r.failed_step >= 0 ? json(r.failed_step) : json(nullptr);
    v["failed_phase"] = r.failed_phase.empty() ? json(nullptr) : json(r.failed_phase);
    v["backend"] = r.backend;
    v["device_name"] = r.device_name;
    v["threads"] = r.threads;
    json cfg = json::object();
    for (const auto& [k, val] : flatten(c)) cfg[k] = val;
    v["config"] = cfg;
    json changed = json::object();
    for (const auto& [k, val] : c.changed) changed[k] = val;
    v["changed"] = changed;
    v["knobs_changed"] = c.changed.size();
    v["model"] = {{"describe", c.model.describe()}, {"n_params", r.n_params}};
    const int B = c.data.batch_size, T = c.data.seq_len, A = c.run.grad_accum;
    v["batch"] = {{"batch_size", B},
                  {"seq_len", T},
                  {"grad_accum", A},
                  {"samples_per_step", B * A},
                  {"tokens_per_step", static_cast<long long>(B) * T * A}};
    v["warmup_steps"] = c.run.warmup_steps;
    v["measure_steps"] = c.run.measure_steps;
    v["measured_steps"] = st.measured;
    v["setup_ms"] = r.setup_ms;

    json phases = json::object();
    for (Phase p : kAllPhases) phases[to_string(p)] = stats_json(st.phase[static_cast<int>(p)]);
    phases["other"] = stats_json(st.other_ms);
    const double jitter = st.step_ms.iqr_over_median();
    v["stats"] = {{"step_ms", stats_json(st.step_ms)},
                  {"phases_ms", phases},
                  {"loss", stats_json(st.loss)},
                  {"samples_per_s", st.samples_per_s},
                  {"tokens_per_s", st.tokens_per_s},
                  {"jitter", jitter},
                  {"jitter_warning", st.measured > 0 && jitter > kJitterWarnThreshold}};
    v["flops"] = {{"per_step", r.flops_per_step},
                  {"achieved_per_s", st.achieved_flops_per_s},
                  {"peak_per_s", opt_json(r.peak_flops)},
                  {"peak_source", r.peak_flops_source},
                  {"mfu", opt_json(st.mfu)}};
    v["roofline"] = {
        {"peak_flops_per_s", r.peaks.flops_per_s}, {"bandwidth_bytes_per_s", r.peaks.bytes_per_s},
        {"ridge_flops_per_byte", r.peaks.ridge()}, {"flops_source", r.peaks.flops_source},
        {"bytes_source", r.peaks.bytes_source},    {"from_cache", r.peaks.from_cache}};
    double first = r.steps.empty() ? NAN : r.steps.front().loss;
    v["loss"] = {{"first", finite_or_null(first)},
                 {"final", r.steps.empty() ? json(nullptr) : finite_or_null(st.final_loss)},
                 {"mean_measured", st.loss.n ? json(st.loss.mean) : json(nullptr)}};

    const MemorySummary& m = r.memory;
    json est = {{"params", r.estimate.params},       {"grads", r.estimate.grads},
                {"optimizer", r.estimate.optimizer}, {"activations", r.estimate.activations},
                {"workspace", r.estimate.workspace}, {"data", r.estimate.data},
                {"total", r.estimate.total()}};
    json ph = json::object();
    for (Phase p : kAllPhases) {
        const PhaseMemory& pm = m.phases[static_cast<int>(p)];
        if (!pm.seen) continue;
        ph[to_string(p)] = {{"tracked_peak_total", pm.tracked_peak_total},
                            {"tracked_peak", categories_json(pm.tracked_peak)},
                            {"device_used_peak", pm.device_used_peak},
                            {"transient_peak", pm.transient_peak}};
    }
    const auto peak_phase = m.peak_phase();
    v["memory"] = {{"estimate", est},
                   {"tracked_peak", categories_json(m.tracked_peak)},
                   {"tracked_peak_total", m.tracked_peak_total},
                   {"at_setup_total", m.at_setup.current_total},
                   {"phases", ph},
                   {"peak_phase", peak_phase ? json(to_string(*peak_phase)) : json(nullptr)},
                   {"largest_category", to_string(m.largest_category())},
                   {"device",
                    {{"available", m.device_available},
                     {"kind", m.device_kind},
                     {"total_bytes", m.device_total},
                     {"peak_used_bytes", m.device_used_peak}}},
                   {"process_peak_rss_bytes", m.process_peak_rss}};

    json kernels = json::array();
    for (const KernelStat& k : r.kernels)
        kernels.push_back({{"name", k.name},
                           {"calls", k.calls},
                           {"total_ms", k.total_ms},
                           {"ms_per_step", k.ms_per_step},
                           {"pct_of_step", k.pct_of_step},
                           {"flops", k.flops},
                           {"bytes", k.bytes},
                           {"gflops_per_s", k.gflops_per_s()},
                           {"gb_per_s", k.gb_per_s()},
                           {"intensity", k.intensity()},
                           {"bound", to_string(k.bound)},
                           {"pct_of_roofline", k.pct_of_roofline}});
    v["kernels"] = kernels;
    v["profiled"] = c.profile.kernels;

    json steps = json::array();
    for (const StepRecord& s : r.steps) {
        json pm = json::object();
        for (Phase p : kAllPhases) pm[to_string(p)] = s.times[p];
        steps.push_back({{"step", s.step},
                         {"warmup", s.warmup},
                         {"wall_ms", s.times.wall_ms},
                         {"phases_ms", pm},
                         {"other_ms", s.times.other_ms()},
                         {"loss", finite_or_null(s.loss)},
                         {"grad_norm", finite_or_null(s.grad_norm)},
                         {"lr", s.lr}});
    }
    v["steps"] = steps;
    return v;
}

}  // namespace

json results_to_json(const ExperimentResult& ex) {
    json j;
    j["schema_version"] = kResultsSchemaVersion;
    j["tool"] = "microtrain";
    j["experiment"] = {{"name", ex.name},
                       {"source", ex.source_path},
                       {"baseline", ex.baseline},
                       {"loss_tolerance", ex.loss_tolerance}};
    j["started_utc"] = ex.started_utc;
    j["interrupted"] = ex.interrupted;
    j["environment"] = environment_json(ex);
    j["units"] = {{"time", "ms"},
                  {"memory", "bytes (reports print MiB = 2^20 bytes)"},
                  {"delta", "baseline - variant (positive = variant better)"}};
    json vs = json::array();
    for (const RunResult& r : ex.runs) vs.push_back(variant_json(r));
    j["variants"] = vs;
    return j;
}

std::string steps_csv(const ExperimentResult& ex) {
    std::ostringstream o;
    o << "variant,step,warmup,wall_ms";
    for (Phase p : kAllPhases) o << "," << to_string(p) << "_ms";
    o << ",other_ms,loss,grad_norm,lr\n";
    auto num = [](double x) {
        if (!std::isfinite(x)) return std::string(std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
        char b[48];
        std::snprintf(b, sizeof b, "%.6f", x);
        return std::string(b);
    };
    for (const RunResult& r : ex.runs) {
        // Variant names are identifiers validated by the spec; quote anyway if a comma sneaks in.
        std::string name = r.config.variant;
        if (name.find_first_of(",\"\n") != std::string::npos) {
            std::string q = "\"";
            for (char c : name) q += c == '"' ? std::string("\"\"") : std::string(1, c);
            name = q + "\"";
        }
        for (const StepRecord& s : r.steps) {
            o << name << "," << s.step << "," << (s.warmup ? 1 : 0) << "," << num(s.times.wall_ms);
            for (Phase p : kAllPhases) o << "," << num(s.times[p]);
            o << "," << num(s.times.other_ms()) << "," << num(s.loss) << "," << num(s.grad_norm)
              << "," << f("%.6g", s.lr) << "\n";
        }
    }
    return o.str();
}

json trace_json(const ExperimentResult& ex) {
    json events = json::array();
    int pid = 0;
    for (const RunResult& r : ex.runs) {
        ++pid;
        if (r.trace.empty()) continue;
        events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"args", {{"name", "variant " + r.config.variant}}}});
        const char* tracks[] = {"steps", "phases", "ops"};
        for (int t = 0; t < 3; ++t)
            events.push_back({{"name", "thread_name"},
                              {"ph", "M"},
                              {"pid", pid},
                              {"tid", t + 1},
                              {"args", {{"name", tracks[t]}}}});
        for (const TraceStep& s : r.trace) {
            const double base_us = s.start_ms * 1000.0;
            events.push_back({{"name", "step " + std::to_string(s.step)},
                              {"cat", "step"},
                              {"ph", "X"},
                              {"pid", pid},
                              {"tid", 1},
                              {"ts", base_us},
                              {"dur", s.wall_ms * 1000.0},
                              {"args", {{"step", s.step}}}});
            for (const PhaseInterval& iv : s.phases)
                events.push_back({{"name", to_string(iv.phase)},
                                  {"cat", "phase"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", 2},
                                  {"ts", base_us + iv.start_ms * 1000.0},
                                  {"dur", iv.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}, {"micro_step", iv.micro_step}}}});
            for (const OpInterval& op : s.ops)
                events.push_back({{"name", op.name},
                                  {"cat", "op"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", 3},
                                  {"ts", base_us + op.start_ms * 1000.0},
                                  {"dur", op.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}}}});
        }
    }
    return {{"traceEvents", events},
            {"displayTimeUnit", "ms"},
            {"otherData",
             {{"experiment", ex.name},
              {"note",
               "measured steps only (profile.trace_steps per variant); device phases are "
               "timed on the device clock and placed relative to the step start"}}}};
}

// ---- reading results.json -----------------------------------------------------------------------

namespace {

const json& at(const json& j, const std::string& key, const std::string& where) {
    if (!j.is_object() || !j.contains(key))
        throw ReportError(where + ": missing key '" + key + "'");
    return j[key];
}

double num_at(const json& j, const std::string& key, const std::string& where) {
    const json& x = at(j, key, where);
    if (!x.is_number())
        throw ReportError(where + ": key '" + key + "' should be a number, got " + x.dump());
    return x.get<double>();
}

std::optional<double> opt_num(const json& j, const std::string& key) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
    return j[key].get<double>();
}

std::string str_or(const json& j, const std::string& key, const std::string& dflt = "") {
    if (j.is_object() && j.contains(key) && j[key].is_string()) return j[key].get<std::string>();
    return dflt;
}

std::string cfg(const json& v, const std::string& key) {
    if (v.contains("config") && v["config"].contains(key) && v["config"][key].is_string())
        return v["config"][key].get<std::string>();
    return "";
}

std::string changed_text(const json& changed) {
    if (!changed.is_object() || changed.empty()) return "(nothing: baseline config)";
    std::string s;
    for (auto it = changed.begin(); it != changed.end(); ++it) {
        if (!s.empty()) s += ", ";
        s += it.key() + "=" +
             (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
    }
    return s;
}

ComparisonRow row_from(const json& v, const std::string& where) {
    ComparisonRow r;
    r.name = at(v, "name", where).get<std::string>();
    r.status = at(v, "status", where).get<std::string>();
    r.message = str_or(v, "message");
    r.changed = changed_text(v.value("changed", json::object()));
    r.knobs_changed = v.value("knobs_changed", 0);
    const json& stats = at(v, "stats", where);
    const json& step = at(stats, "step_ms", where + ".stats");
    r.has_stats = num_at(step, "n", where + ".stats.step_ms") > 0;
    r.median_ms = num_at(step, "median", where + ".stats.step_ms");
    r.p90_ms = num_at(step, "p90", where + ".stats.step_ms");
    r.iqr_ms = num_at(step, "iqr", where + ".stats.step_ms");
    r.jitter = num_at(step, "iqr_over_median", where + ".stats.step_ms");
    r.samples_per_s = num_at(stats, "samples_per_s", where + ".stats");
    r.tokens_per_s = num_at(stats, "tokens_per_s", where + ".stats");
    r.mfu = opt_num(v.value("flops", json::object()), "mfu");
    const json& mem = at(v, "memory", where);
    r.tracked_peak = num_at(mem, "tracked_peak_total", where + ".memory");
    const json& dev = at(mem, "device", where + ".memory");
    r.device_peak = num_at(dev, "peak_used_bytes", where + ".memory.device");
    r.device_kind = str_or(dev, "kind", "device");
    const json& loss = at(v, "loss", where);
    r.final_loss = opt_num(loss, "final");
    r.mean_loss = opt_num(loss, "mean_measured");
    return r;
}

std::string failure_short(const ComparisonRow& r) {
    // The first clause of the runner's message is enough for a table cell.
    std::string m = r.message;
    if (auto p = m.find(';'); p != std::string::npos) m = m.substr(0, p);
    if (m.size() > 140) m = m.substr(0, 137) + "...";
    return m;
}

void judge(ComparisonRow& r, const ComparisonRow& b, double tol, bool baseline_present) {
    if (r.is_baseline) {
        r.verdict = r.status == "ok" ? "baseline" : "baseline (" + r.status + ")";
        if (r.status == "failed" || r.status == "skipped") r.verdict += ": " + failure_short(r);
        return;
    }
    if (r.status == "skipped") {
        r.verdict = "not run: " + failure_short(r);
        return;
    }
    if (r.status == "failed") {
        r.verdict = "reject: " + failure_short(r);
        return;
    }
    if (!r.has_stats) {
        r.verdict = "n/a: no measured steps";
        return;
    }
    if (!baseline_present || !b.has_stats) {
        r.verdict = "n/a: the baseline has no measured steps to compare with";
        return;
    }
    r.dtime_ms = b.median_ms - r.median_ms;
    r.speedup = r.median_ms > 0 ? b.median_ms / r.median_ms : 0;
    r.dmem_bytes = b.tracked_peak - r.tracked_peak;
    const double noise = std::max(b.iqr_ms, r.iqr_ms);
    r.within_noise = std::fabs(*r.dtime_ms) <= noise;
    if (r.mean_loss && b.mean_loss && *b.mean_loss != 0)
        r.loss_ok = std::fabs(*r.mean_loss - *b.mean_loss) / std::fabs(*b.mean_loss) <= tol;

    const bool faster = !r.within_noise && *r.dtime_ms > 0;
    const bool slower = !r.within_noise && *r.dtime_ms < 0;
    // Tracked bytes are deterministic; count a change only above 1% of the baseline or 64 KiB.
    const double mem_eps = std::max(0.01 * b.tracked_peak, 64.0 * 1024.0);
    const bool leaner = *r.dmem_bytes > mem_eps;
    const bool fatter = *r.dmem_bytes < -mem_eps;
    const std::string speed = f("%.2f", *r.speedup) + "x " + (faster ? "faster" : "slower");
    const std::string mem_gain = mib(*r.dmem_bytes) + " MiB less tracked memory";
    const std::string mem_cost = "costs +" + mib(-*r.dmem_bytes) + " MiB tracked memory";
    const std::string time_cost =
        "costs +" + f("%.2f", -*r.dtime_ms) + " ms/step (" + f("%.2f", 1.0 / *r.speedup) + "x)";

    std::string v;
    if (r.loss_ok && !*r.loss_ok) {
        v = "reject: mean loss differs " +
            pct(std::fabs(*r.mean_loss - *b.mean_loss) / std::fabs(*b.mean_loss)) +
            " from the baseline (tolerance " + pct(tol) + ")";
        if (faster) v += ", although " + speed;
    } else if (faster && !fatter) {
        v = "keep: " + speed + (leaner ? ", and " + mem_gain : "");
    } else if (faster && fatter) {
        v = "trade-off: " + speed + ", " + mem_cost;
    } else if (leaner && !slower) {
        v = "keep: " + mem_gain + ", time within noise";
    } else if (leaner && slower) {
        v = "trade-off: " + mem_gain + ", " + time_cost;
    } else if (slower) {
        v = "reject: " + speed + (fatter ? " and " + mem_cost : "");
    } else {
        v = "reject: no measurable gain (time within noise" +
            std::string(fatter ? ", " + mem_cost : ", memory unchanged") + ")";
    }
    if (!r.loss_ok) v += " (loss not comparable)";
    if (r.status == "interrupted") v += " [interrupted: partial measurement]";
    if (r.knobs_changed > 1)
        v += "; changes " + std::to_string(r.knobs_changed) + " knobs: not attributable";
    r.verdict = v;
}

void add_notes(Comparison& c) {
    for (const ComparisonRow& r : c.rows) {
        if (r.has_stats && r.jitter > kJitterWarnThreshold)
            c.notes.push_back("warning: '" + r.name + "' step times jitter " + pct(r.jitter) +
                              " (IQR/median > " + pct(kJitterWarnThreshold) +
                              "): deltas smaller than its spread are noise; more warm-up or "
                              "measured steps, and a quiet machine, help");
    }
    bool jittery = false;
    for (const ComparisonRow& r : c.rows) jittery |= r.has_stats && r.jitter > kJitterWarnThreshold;
    if (jittery)
        c.notes.push_back(
            "caution: variants run one after another, so a change in machine load between them "
            "(other processes) looks like a difference between variants that no within-variant "
            "spread can reveal; with jitter this high, re-run on a quiet machine before keeping a "
            "variant");
}

}  // namespace

nlohmann::json load_results(const std::string& path) {
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
    if (!j.is_object() || !j.contains("schema_version"))
        throw ReportError("'" + path +
                          "' is not a microtrain results.json (no schema_version key); pass the "
                          "results.json of a run folder");
    if (!j["schema_version"].is_number_integer() ||
        j["schema_version"].get<int>() != kResultsSchemaVersion)
        throw ReportError("'" + path + "' has schema_version " + j["schema_version"].dump() +
                          ", this microtrain reads schema_version " +
                          std::to_string(kResultsSchemaVersion) +
                          "; re-run the experiment with this version");
    if (!j.contains("variants") || !j["variants"].is_array() || j["variants"].empty())
        throw ReportError("'" + path + "' has no variants");
    for (size_t i = 0; i < j["variants"].size(); ++i)
        row_from(j["variants"][i], path + ": variants[" + std::to_string(i) + "]");  // validates
    return j;
}

Comparison build_comparison(const json& results, const std::string& label) {
    Comparison c;
    const json& exp = at(results, "experiment", label);
    c.baseline = str_or(exp, "baseline");
    c.loss_tolerance = exp.value("loss_tolerance", 0.02);
    const json& vs = at(results, "variants", label);
    std::vector<ComparisonRow> rows;
    int base = -1;
    for (size_t i = 0; i < vs.size(); ++i) {
        rows.push_back(row_from(vs[i], label + ": variants[" + std::to_string(i) + "]"));
        if (rows.back().name == c.baseline) base = static_cast<int>(i);
    }
    if (base < 0 && !rows.empty()) {
        c.notes.push_back("note: compare.baseline '" + c.baseline +
                          "' is not among the variants; the first variant is the baseline");
        base = 0;
        c.baseline = rows[0].name;
    }
    if (base >= 0) {
        rows[base].is_baseline = true;
        std::rotate(rows.begin(), rows.begin() + base, rows.begin() + base + 1);
    }
    for (ComparisonRow& r : rows) judge(r, rows.front(), c.loss_tolerance, base >= 0);
    c.rows = std::move(rows);
    add_notes(c);
    return c;
}

Comparison compare_results(const json& a, const std::string& a_label, const json& b,
                           const std::string& b_label, const std::string& a_variant,
                           const std::string& b_variant) {
    Comparison c;
    const json& ea = at(a, "experiment", a_label);
    c.loss_tolerance = ea.value("loss_tolerance", 0.02);
    const std::string want_a = a_variant.empty() ? str_or(ea, "baseline") : a_variant;
    const json* va = nullptr;
    std::vector<std::string> names_a;
    for (const json& v : at(a, "variants", a_label)) {
        names_a.push_back(str_or(v, "name"));
        if (str_or(v, "name") == want_a) va = &v;
    }
    if (!va) {
        std::string list;
        for (auto& n : names_a) list += (list.empty() ? "" : ", ") + n;
        throw ReportError(a_label + ": no variant named '" + want_a + "' (it has: " + list + ")");
    }
    ComparisonRow base = row_from(*va, a_label + ": variant '" + want_a + "'");
    if (!base.has_stats)
        throw ReportError(a_label + ": the baseline variant '" + want_a +
                          "' has no measured steps (status " + base.status + ")");
    base.is_baseline = true;
    base.name = "A:" + base.name;
    base.changed = "(baseline: " + a_label + ")";
    c.baseline = base.name;
    c.rows.push_back(base);
    bool any = false;
    for (const json& v : at(b, "variants", b_label)) {
        const std::string name = str_or(v, "name");
        if (!b_variant.empty() && name != b_variant) continue;
        any = true;
        ComparisonRow r = row_from(v, b_label + ": variant '" + name + "'");
        r.name = "B:" + name;
        // What it changed = the config difference to the baseline run, plus a device change.
        std::vector<std::string> diff;
        const json ca = va->value("config", json::object());
        const json cb = v.value("config", json::object());
        std::set<std::string> keys;
        for (auto it = ca.begin(); it != ca.end(); ++it) keys.insert(it.key());
        for (auto it = cb.begin(); it != cb.end(); ++it) keys.insert(it.key());
        for (const auto& k : keys) {
            const std::string x = ca.contains(k) ? ca[k].dump() : "(unset)";
            const std::string y = cb.contains(k) ? cb[k].dump() : "(unset)";
            if (x != y)
                diff.push_back(
                    k + "=" + (cb.contains(k) && cb[k].is_string() ? cb[k].get<std::string>() : y));
        }
        const std::string da = str_or(*va, "device_name"), db = str_or(v, "device_name");
        std::string changed;
        for (auto& d : diff) changed += (changed.empty() ? "" : ", ") + d;
        if (da != db) changed += (changed.empty() ? "" : "; ") + std::string("device ") + db;
        r.changed = changed.empty() ? "(same config)" : changed;
        r.knobs_changed = static_cast<int>(diff.size());
        for (const std::string& k : {std::string("model.n_layer"), std::string("model.n_embd"),
                                     std::string("model.n_head"), std::string("model.vocab_size"),
                                     std::string("data.batch_size"), std::string("data.seq_len")})
            if (ca.contains(k) && cb.contains(k) && ca[k] != cb[k])
                c.notes.push_back("note: '" + r.name + "' runs a different " + k + " (" +
                                  ca[k].get<std::string>() + " vs " + cb[k].get<std::string>() +
                                  "): time, memory and loss are not like for like");
        c.rows.push_back(r);
    }
    if (!any)
        throw ReportError(b_label + (b_variant.empty() ? ": has no variants"
                                                       : ": no variant named '" + b_variant + "'"));
    for (ComparisonRow& r : c.rows) judge(r, c.rows.front(), c.loss_tolerance, true);
    add_notes(c);
    return c;
}

std::string render_comparison_md(const Comparison& c) {
    std::ostringstream o;
    o << "| Variant | Changed | Step ms (median) | p90 ms | Samples/s | Tokens/s | MFU | "
         "Peak tracked MiB | Peak device/RSS MiB | Loss final | Loss mean | Δtime ms (speedup) | "
         "Δmem MiB | Loss within tol. | Verdict |\n";
    o << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";
    auto cell = [](const std::string& s) {
        std::string out;
        for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
        return out;
    };
    for (const ComparisonRow& r : c.rows) {
        o << "| " << cell(r.name) << (r.status != "ok" ? " (" + r.status + ")" : "") << " | "
          << cell(r.changed) << " | ";
        if (r.has_stats) {
            o << f("%.2f", r.median_ms) << " | " << f("%.2f", r.p90_ms) << " | "
              << f("%.1f", r.samples_per_s) << " | " << f("%.0f", r.tokens_per_s) << " | "
              << (r.mfu ? pct(*r.mfu) : "n/a") << " | " << mib(r.tracked_peak) << " | "
              << (r.device_peak > 0 ? mib(r.device_peak) + " (" + r.device_kind + ")" : "n/a")
              << " | " << (r.final_loss ? f("%.4f", *r.final_loss) : "n/a") << " | "
              << (r.mean_loss ? f("%.4f", *r.mean_loss) : "n/a") << " | ";
        } else {
            o << "– | – | – | – | – | – | – | – | – | ";
        }
        if (r.is_baseline) {
            o << "0 (1.00x) | 0 | – | ";
        } else if (r.dtime_ms) {
            o << signed_f("%.2f", *r.dtime_ms) << " (" << f("%.2f", *r.speedup) << "x"
              << (r.within_noise ? ", within noise" : "") << ") | "
              << (std::fabs(*r.dmem_bytes) < 0.05 * kMiB ? std::string("0")
                                                         : signed_f("%.1f", to_mib(*r.dmem_bytes)))
              << " | " << (r.loss_ok ? (*r.loss_ok ? "yes" : "no") : "n/a") << " | ";
        } else {
            o << "– | – | – | ";
        }
        o << cell(r.verdict) << " |\n";
    }
    o << "\nΔ = baseline − variant: positive Δtime = the variant is faster, positive Δmem = it "
         "uses less tracked memory. Speedup = baseline median / variant median. A Δtime no larger "
         "than the larger IQR of the two is *within noise*. Loss within tolerance: |mean loss − "
         "baseline mean loss| / baseline ≤ "
      << pct(c.loss_tolerance) << ". Throughput from the median step.\n";
    for (const std::string& n : c.notes) o << "\n- " << n;
    if (!c.notes.empty()) o << "\n";
    return o.str();
}

// ---- the full markdown report -------------------------------------------------------------------

namespace {

struct Shares {
    std::array<double, kPhaseCount + 1> ms{};  // mean ms per phase + other (last)
    double step_ms = 0;
    double share(int i) const { return step_ms > 0 ? ms[i] / step_ms : 0; }
};
const char* kPhaseNames[kPhaseCount + 1] = {"data",      "h2d",  "forward", "backward",
                                            "optimizer", "sync", "other"};

Shares shares_of(const json& v) {
    Shares s;
    const json& st = v["stats"];
    s.step_ms = st["step_ms"]["mean"].get<double>();
    for (int i = 0; i <= kPhaseCount; ++i)
        s.ms[i] = st["phases_ms"][kPhaseNames[i]]["mean"].get<double>();
    return s;
}

int dominant(const Shares& s) {
    int best = 0;
    for (int i = 1; i <= kPhaseCount; ++i)
        if (s.ms[i] > s.ms[best]) best = i;
    return best;
}

bool measured(const json& v) {
    return v["stats"]["step_ms"]["n"].get<double>() > 0;
}

std::string memory_peak_text(const json& v) {
    const json& m = v["memory"];
    std::string s = mib(m["tracked_peak_total"].get<double>()) + " MiB tracked";
    if (m["peak_phase"].is_string()) {
        const std::string p = m["peak_phase"].get<std::string>();
        s += " during " + p;
        if (m["phases"].contains(p))
            s += " (+" + mib(m["phases"][p]["transient_peak"].get<double>()) +
                 " MiB allocated in it)";
    } else {
        s += ", held through every phase (allocated at setup; no phase allocates on top)";
    }
    const std::string cat = m["largest_category"].get<std::string>();
    s += "; largest category " + cat + " (" + mib(m["tracked_peak"][cat].get<double>()) + " MiB)";
    const json& d = m["device"];
    if (d["available"].get<bool>())
        s += "; " + d["kind"].get<std::string>() + " peak " +
             mib(d["peak_used_bytes"].get<double>()) + " MiB" +
             (d["total_bytes"].get<double>() > 0
                  ? " of " + mib(d["total_bytes"].get<double>()) + " MiB"
                  : std::string());
    return s;
}

std::string top_kernels_text(const json& v, size_t n) {
    std::string s;
    const json& ks = v["kernels"];
    for (size_t i = 0; i < ks.size() && i < n; ++i) {
        if (!s.empty()) s += ", ";
        s += ks[i]["name"].get<std::string>() + " " +
             f("%.1f%%", ks[i]["pct_of_step"].get<double>()) + " (" +
             ks[i]["bound"].get<std::string>() + "-bound)";
    }
    return s;
}

// Which phases moved against the baseline (mean ms, variant - baseline), largest first, and a
// hint when background loader threads took cores from the compute.
std::string phase_moves_text(const json& v, const json& base) {
    if (!measured(v) || !measured(base)) return "";
    const Shares a = shares_of(base), b = shares_of(v);
    std::vector<std::pair<double, int>> moves;
    for (int i = 0; i <= kPhaseCount; ++i) moves.emplace_back(b.ms[i] - a.ms[i], i);
    std::sort(moves.begin(), moves.end(),
              [](const auto& x, const auto& y) { return std::fabs(x.first) > std::fabs(y.first); });
    const double step_delta = b.step_ms - a.step_ms;
    std::string s =
        "- vs the baseline (mean ms, variant − baseline): step " + signed_f("%.2f", step_delta);
    int shown = 0;
    for (const auto& [d, i] : moves) {
        if (shown == 3 || std::fabs(d) < 0.02 * a.step_ms) break;
        s += std::string(shown++ ? ", " : "; ") + kPhaseNames[i] + " " + signed_f("%.2f", d);
    }
    s += "\n";
    const double data_d = b.ms[0] - a.ms[0], compute_d = (b.ms[2] + b.ms[3]) - (a.ms[2] + a.ms[3]);
    if (v.value("backend", "") == "cpu" && data_d < -0.05 * a.step_ms &&
        compute_d > 0.5 * -data_d && cfg(v, "data.workers") != cfg(base, "data.workers"))
        s += "- note: the data phase shrank but forward/backward grew by " + f("%.2f", compute_d) +
             " ms: on the CPU the loader's worker threads compete with the compute threads for "
             "the same cores, so the saved wait is spent again; the gain needs spare cores "
             "(run.threads + data.workers <= the machine's hardware threads)\n";
    return s;
}

}  // namespace

std::vector<std::string> suggestions_for(const json& v) {
    std::vector<std::string> out;
    if (!measured(v)) return out;
    const Shares s = shares_of(v);
    const std::string backend = v.value("backend", "");
    const bool cuda = backend == "cuda";
    auto ival = [&](const std::string& k) {
        try {
            return std::stoi(cfg(v, k));
        } catch (...) {
            return 0;
        }
    };
    const double data = s.share(0), h2d = s.share(1), fwd = s.share(2), bwd = s.share(3),
                 opt = s.share(4), sync = s.share(5), other = s.share(6);
    if (data >= 0.20) {
        const int workers = ival("data.workers");
        std::string t = "data-bound: the data phase takes " + pct(data) + " of the step. ";
        if (workers == 0)
            t += "Load batches in the background: `data.workers: 2` with `data.prefetch: 2` or "
                 "more (now workers 0: every batch is prepared inside the step)";
        else
            t += "With " + std::to_string(workers) +
                 " workers the loader still cannot keep up: raise `data.workers` and "
                 "`data.prefetch`, or make per-sample preprocessing cheaper";
        if (cuda && cfg(v, "data.pin_memory") != "true")
            t += "; `data.pin_memory: true` makes the h2d copy asynchronous";
        if (ival("data.preprocess_us") > 0)
            t += " (data.preprocess_us=" + cfg(v, "data.preprocess_us") +
                 " is simulated per-sample work)";
        out.push_back(t + ".");
    }
    if (h2d >= 0.10)
        out.push_back("h2d takes " + pct(h2d) + " of the step: " +
                      (cuda ? std::string("`data.pin_memory: true` and prefetching overlap the "
                                          "copy; larger batches amortise it.")
                            : std::string("larger batches amortise the copy.")));
    if (fwd + bwd >= 0.50) {
        std::string t = "compute in the model dominates (forward " + pct(fwd) + ", backward " +
                        pct(bwd) + "). ";
        std::vector<std::string> opts;
        if (cuda && cfg(v, "run.precision") == "fp32")
            opts.push_back("`run.precision: tf32` or `bf16` (tensor cores)");
        if (cuda && cfg(v, "kernels.attention") == "naive")
            opts.push_back("`kernels.attention: flash`");
        if (cfg(v, "kernels.classifier") == "unfused")
            opts.push_back("`kernels.classifier: fused` (no probability tensor)");
        if (cfg(v, "kernels.layernorm") == "separate")
            opts.push_back("`kernels.layernorm: fused_residual`");
        if (cfg(v, "kernels.matmul_gelu") == "false") opts.push_back("`kernels.matmul_gelu: true`");
        if (cfg(v, "run.recompute") != "none" && !cfg(v, "run.recompute").empty())
            opts.push_back(
                "`run.recompute: none` if memory allows (recompute costs backward "
                "FLOPs)");
        if (opts.empty()) opts.push_back("a larger batch per step (fewer, bigger GEMMs)");
        t += "Try: ";
        for (size_t i = 0; i < opts.size(); ++i) t += (i ? "; " : "") + opts[i];
        t += ".";
        if (!cuda) t += " (The CPU backend is fp32-only: precision variants need a GPU.)";
        const json& ks = v["kernels"];
        if (!ks.empty()) {
            const json& k = ks[0];
            t += " Top op: " + k["name"].get<std::string>() + " (" +
                 f("%.1f%%", k["pct_of_step"].get<double>()) + " of the step, " +
                 k["bound"].get<std::string>() + "-bound, " +
                 f("%.0f%%", k["pct_of_roofline"].get<double>()) + " of its roofline)";
            t += k["bound"] == "memory"
                     ? ": fusing it with its neighbours saves the memory traffic."
                     : ": it is arithmetic-limited; precision or a better GEMM path helps.";
        } else if (v.value("profiled", false) == false) {
            t += " Set `profile.kernels: true` to see which op dominates.";
        }
        out.push_back(t);
    }
    if (opt >= 0.15) {
        if (cfg(v, "optim.impl") != "fused")
            out.push_back("optimizer-bound: the optimizer takes " + pct(opt) +
                          " of the step with `optim.impl: " + cfg(v, "optim.impl") +
                          "`; `optim.impl: fused` updates the flat buffer in one pass.");
        else
            out.push_back("the fused optimizer still takes " + pct(opt) +
                          " of the step: it costs a fixed time per step, so `run.grad_accum` "
                          "(more samples per update) amortises it.");
    }
    if (sync + std::max(0.0, other) >= 0.15)
        out.push_back("host waits and overhead take " + pct(sync + std::max(0.0, other)) +
                      " of the step (sync " + pct(sync) + ", other " + pct(other) +
                      "): fewer synchronisations (read the loss less often), fewer and larger "
                      "launches (bigger batch, fused kernels).");
    const json& d = v["memory"]["device"];
    if (d["available"].get<bool>() && d["total_bytes"].get<double>() > 0) {
        const double frac = d["peak_used_bytes"].get<double>() / d["total_bytes"].get<double>();
        if (frac >= 0.80)
            out.push_back("memory is near the limit (" + pct(frac) + " of " +
                          mib(d["total_bytes"].get<double>()) +
                          " MiB): `run.recompute: gelu` or `layernorm_gelu` trades FLOPs for "
                          "activations; a smaller `data.batch_size` with `run.grad_accum` keeps "
                          "the samples per update.");
    }
    const double jitter = v["stats"]["jitter"].get<double>();
    if (jitter > kJitterWarnThreshold)
        out.push_back("high jitter (IQR/median " + pct(jitter) +
                      "): more `run.warmup_steps`, fixed shapes, and check the data loader and "
                      "host syncs; other programs on the machine add noise too.");
    if (out.empty())
        out.push_back("no single phase dominates: the step is balanced; the largest is " +
                      std::string(kPhaseNames[dominant(s)]) + " (" + pct(s.share(dominant(s))) +
                      ").");
    return out;
}

std::string render_report_md(const json& results) {
    const Comparison cmp = build_comparison(results, "results.json");
    const json& exp = results["experiment"];
    const json& env = results["environment"];
    const json& vs = results["variants"];
    std::ostringstream o;
    o << "# " << exp["name"].get<std::string>() << " — microtrain report\n\n";
    o << "Experiment `" << exp["source"].get<std::string>() << "`, started "
      << results["started_utc"].get<std::string>() << ", baseline `" << cmp.baseline << "`";
    if (env.contains("git_commit") && env["git_commit"].is_string())
        o << ", commit `" << env["git_commit"].get<std::string>().substr(0, 12) << "`"
          << (env.value("git_dirty", false) ? " (with uncommitted changes)" : "");
    o << ".\n";
    if (results.value("interrupted", false))
        o << "\n**Interrupted (Ctrl-C): the numbers below cover only the steps measured before "
             "the interruption.**\n";
    for (const json& v : vs)
        if (v["status"] == "failed")
            o << "\n**Failed: " << v["message"].get<std::string>() << "** (its measured steps are "
              << "kept below)\n";

    // -- the three questions, answered for the baseline (or the first measured variant)
    const json* ref = nullptr;
    for (const json& v : vs)
        if (v["name"] == cmp.baseline && measured(v)) ref = &v;
    if (!ref)
        for (const json& v : vs)
            if (measured(v)) {
                ref = &v;
                break;
            }
    o << "\n## Answers\n\n";
    if (ref) {
        const Shares s = shares_of(*ref);
        const int d = dominant(s);
        o << "- **Where is the step slow?** In `" << (*ref)["name"].get<std::string>() << "`, "
          << kPhaseNames[d] << " takes " << pct(s.share(d)) << " of the mean step ("
          << f("%.2f", s.ms[d]) << " of " << f("%.2f", s.step_ms) << " ms)";
        if (!(*ref)["kernels"].empty()) o << "; top ops: " << top_kernels_text(*ref, 3);
        o << ".\n";
        o << "- **Where does memory peak?** " << memory_peak_text(*ref) << ".\n";
    } else {
        o << "- No variant has measured steps, so there is nothing to answer with.\n";
    }
    o << "- **Is the change worth keeping?**";
    bool any_variant = false;
    for (const ComparisonRow& r : cmp.rows) {
        if (r.is_baseline) continue;
        any_variant = true;
        o << "\n  - `" << r.name << "` (" << r.changed << "): " << r.verdict;
    }
    if (!any_variant) o << " There is only the baseline: add variants to compare.";
    o << "\n";

    o << "\n## Comparison\n\n" << render_comparison_md(cmp);
    o << "\n<!-- charts -->\n";

    // -- phases
    o << "\n## Phase breakdown\n\nMean ms per measured step (share of the mean step). `other` = "
         "step wall time − the sum of the phases (launch overhead, idle time; negative when host "
         "and device work overlapped).\n\n| Variant | steps |";
    for (const char* p : kPhaseNames) o << " " << p << " |";
    o << " step (mean) | step p10–p90 | jitter |\n|---|---:|";
    for (int i = 0; i <= kPhaseCount; ++i) o << "---:|";
    o << "---:|---:|---:|\n";
    for (const json& v : vs) {
        if (!measured(v)) {
            o << "| " << v["name"].get<std::string>() << " | 0 | "
              << "– |" << std::string("") << " " << v["status"].get<std::string>()
              << ": no measured steps |";
            for (int i = 0; i < kPhaseCount + 2; ++i) o << " |";
            o << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const json& st = v["stats"]["step_ms"];
        o << "| " << v["name"].get<std::string>() << " | " << v["measured_steps"].get<int>()
          << " |";
        for (int i = 0; i <= kPhaseCount; ++i)
            o << " " << f("%.2f", s.ms[i]) << " (" << f("%.0f%%", 100 * s.share(i)) << ") |";
        const double jit = v["stats"]["jitter"].get<double>();
        o << " " << f("%.2f", s.step_ms) << " | " << f("%.2f", st["p10"].get<double>()) << "–"
          << f("%.2f", st["p90"].get<double>()) << " | " << pct(jit)
          << (jit > kJitterWarnThreshold ? " ⚠" : "") << " |\n";
    }

    // -- throughput and FLOPs
    o << "\n## Throughput and FLOPs\n\n| Variant | device | samples/step | tokens/step | model "
         "GFLOP/step | achieved GFLOP/s | peak GFLOP/s used for MFU | MFU |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|\n";
    for (const json& v : vs) {
        if (!measured(v)) continue;
        const json& fl = v["flops"];
        o << "| " << v["name"].get<std::string>() << " | " << v["device_name"].get<std::string>()
          << " | " << v["batch"]["samples_per_step"] << " | " << v["batch"]["tokens_per_step"]
          << " | " << f("%.3f", fl["per_step"].get<double>() / 1e9) << " | "
          << f("%.2f", fl["achieved_per_s"].get<double>() / 1e9) << " | "
          << (fl["peak_per_s"].is_number() ? f("%.1f", fl["peak_per_s"].get<double>() / 1e9)
                                           : std::string("n/a"))
          << " | " << (fl["mfu"].is_number() ? pct(fl["mfu"].get<double>()) : "n/a") << " |\n";
    }
    std::map<std::string, std::string> sources;  // by device: the first variant's figures
    bool mfu_over = false;
    for (const json& v : vs)
        if (measured(v)) {
            const json& rf = v["roofline"];
            if (v["flops"]["mfu"].is_number() && v["flops"]["mfu"].get<double>() > 1.0)
                mfu_over = true;
            if (sources.count(v["device_name"].get<std::string>())) continue;
            sources[v["device_name"].get<std::string>()] =
                ("`" + v["device_name"].get<std::string>() + "`: peak " +
                 f("%.1f", rf["peak_flops_per_s"].get<double>() / 1e9) + " GFLOP/s (" +
                 rf["flops_source"].get<std::string>() + "), bandwidth " +
                 f("%.1f", rf["bandwidth_bytes_per_s"].get<double>() / 1e9) + " GB/s (" +
                 rf["bytes_source"].get<std::string>() + "), ridge " +
                 f("%.2f", rf["ridge_flops_per_byte"].get<double>()) + " FLOP/byte. " +
                 "MFU: " + v["flops"]["peak_source"].get<std::string>());
        }
    if (!sources.empty()) {
        o << "\nPeaks used:\n";
        for (const auto& [dev, s] : sources) o << "\n- " << s;
        o << "\n";
    }
    if (mfu_over)
        o << "\n**MFU above 100%: the training step ran faster than the measured peak, so the "
             "peak probe was disturbed (a busy machine when it ran). Delete `"
          << env.value("peaks_cache", std::string("the peaks cache"))
          << "/cpu_peaks.json` to re-measure on a quiet machine.**\n";

    // -- memory
    o << "\n## Memory\n\nAnalytic estimate (printed before the run) beside the allocator's "
         "tracked peak per category, in MiB.\n\n| Variant | category | estimate | tracked peak | "
         "Δ (tracked − estimate) |\n|---|---|---:|---:|---:|\n";
    for (const json& v : vs) {
        if (v["status"] == "skipped") continue;
        const json& m = v["memory"];
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const std::string cat = to_string(static_cast<MemoryCategory>(c));
            const double e = m["estimate"][cat].get<double>(),
                         t = m["tracked_peak"][cat].get<double>();
            o << "| " << v["name"].get<std::string>() << " | " << cat << " | " << mib(e) << " | "
              << mib(t) << " | " << signed_f("%.1f", to_mib(t - e)) << " |\n";
        }
        const double e = m["estimate"]["total"].get<double>(),
                     t = m["tracked_peak_total"].get<double>();
        o << "| " << v["name"].get<std::string>() << " | **total (peak of the sum)** | " << mib(e)
          << " | " << mib(t) << " | " << signed_f("%.1f", to_mib(t - e)) << " |\n";
    }
    o << "\nWhere memory peaks:\n";
    for (const json& v : vs) {
        if (v["status"] == "skipped") continue;
        o << "\n- `" << v["name"].get<std::string>() << "`: " << memory_peak_text(v);
        const double rss = v["memory"]["process_peak_rss_bytes"].get<double>();
        if (rss > 0)
            o << "; process peak RSS (getrusage, whole process so far) " << mib(rss) << " MiB";
    }
    o << "\n\nPer-phase peaks (tracked MiB / device-or-RSS MiB):\n\n| Variant |";
    for (Phase p : kAllPhases) o << " " << to_string(p) << " |";
    o << "\n|---|";
    for (int i = 0; i < kPhaseCount; ++i) o << "---:|";
    o << "\n";
    for (const json& v : vs) {
        if (v["status"] == "skipped") continue;
        o << "| " << v["name"].get<std::string>() << " |";
        const json& ph = v["memory"]["phases"];
        for (Phase p : kAllPhases) {
            if (!ph.contains(to_string(p))) {
                o << " – |";
                continue;
            }
            const json& x = ph[to_string(p)];
            o << " " << mib(x["tracked_peak_total"].get<double>()) << " / "
              << mib(x["device_used_peak"].get<double>()) << " |";
        }
        o << "\n";
    }

    // -- kernels
    for (const json& v : vs) {
        if (v["kernels"].empty()) continue;
        o << "\n## Kernels: " << v["name"].get<std::string>()
          << "\n\nPer op over the measured steps (analytic FLOPs and bytes / measured time); "
             "bound = arithmetic intensity vs the ridge point ("
          << f("%.2f", v["roofline"]["ridge_flops_per_byte"].get<double>())
          << " FLOP/byte).\n\n| op | calls | total ms | ms/step | % of step | GFLOP/s | GB/s | "
             "FLOP/byte | bound | % of roofline "
             "|\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
        size_t shown = 0;
        for (const json& k : v["kernels"]) {
            if (shown++ == 12) break;
            o << "| " << k["name"].get<std::string>() << " | " << k["calls"] << " | "
              << f("%.2f", k["total_ms"].get<double>()) << " | "
              << f("%.3f", k["ms_per_step"].get<double>()) << " | "
              << f("%.1f", k["pct_of_step"].get<double>()) << " | "
              << f("%.2f", k["gflops_per_s"].get<double>()) << " | "
              << f("%.2f", k["gb_per_s"].get<double>()) << " | "
              << f("%.2f", k["intensity"].get<double>()) << " | " << k["bound"].get<std::string>()
              << " | " << f("%.0f", k["pct_of_roofline"].get<double>()) << " |\n";
        }
    }

    // -- bottleneck and next steps
    o << "\n## Bottleneck and next steps\n";
    for (const json& v : vs) {
        o << "\n### " << v["name"].get<std::string>() << "\n\n";
        if (!measured(v)) {
            o << v["status"].get<std::string>() << ": "
              << (v["message"].get<std::string>().empty() ? "no measured steps"
                                                          : v["message"].get<std::string>())
              << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const int d = dominant(s);
        o << "- dominant phase: **" << kPhaseNames[d] << "** (" << pct(s.share(d))
          << " of the step)\n";
        if (!v["kernels"].empty()) o << "- top ops: " << top_kernels_text(v, 5) << "\n";
        o << "- memory: " << memory_peak_text(v) << "\n";
        if (v["name"] != cmp.baseline && ref && (*ref)["name"] == cmp.baseline)
            o << phase_moves_text(v, *ref);
        for (const std::string& sug : suggestions_for(v)) o << "- next: " << sug << "\n";
    }

    // -- effective configuration
    o << "\n## Effective configuration\n\nEvery key of every variant (the base plus the variant's "
         "`set:`); a key a variant changed is in bold.\n\n| key |";
    for (const json& v : vs) o << " " << v["name"].get<std::string>() << " |";
    o << "\n|---|";
    for (size_t i = 0; i < vs.size(); ++i) o << "---|";
    o << "\n";
    std::set<std::string> keys;
    for (const json& v : vs)
        for (auto it = v["config"].begin(); it != v["config"].end(); ++it) keys.insert(it.key());
    for (const std::string& k : keys) {
        o << "| " << k << " |";
        for (const json& v : vs) {
            const std::string val =
                v["config"].contains(k) ? v["config"][k].get<std::string>() : "–";
            const bool ch = v["changed"].contains(k);
            o << " " << (ch ? "**" + val + "**" : val) << " |";
        }
        o << "\n";
    }
    for (const json& v : vs)
        if (v["knobs_changed"].get<int>() > 1)
            o << "\n- `" << v["name"].get<std::string>() << "` changes "
              << v["knobs_changed"].get<int>()
              << " knobs at once: its effect cannot be attributed to one of them.";
    o << "\n\n## Environment\n\n";
    for (auto it = env.begin(); it != env.end(); ++it)
        o << "- " << it.key() << ": "
          << (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()) << "\n";
    o << "\nFiles: results.json (everything), steps.csv (per step, per phase), trace.json (open in "
         "https://ui.perfetto.dev or chrome://tracing), report.html (this report with charts).\n";
    return o.str();
}

std::string write_run_folder(const ExperimentResult& ex, const std::string& out_dir) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    std::string name = ex.name.empty() ? std::string("experiment") : ex.name;
    for (char& c : name)
        if (c == '/' || c == '\\' || c == ' ') c = '_';
    fs::path dir = fs::path(out_dir) / (name + "-" + stamp);
    for (int i = 2; fs::exists(dir); ++i)
        dir = fs::path(out_dir) / (name + "-" + stamp + "-" + std::to_string(i));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw std::runtime_error("cannot create the run folder '" + dir.string() +
                                 "': " + ec.message() + " (check report.out_dir / --out-dir)");
    const json results = results_to_json(ex);
    write_file_atomic((dir / "results.json").string(), results.dump(2) + "\n");
    write_file_atomic((dir / "steps.csv").string(), steps_csv(ex));
    write_file_atomic((dir / "trace.json").string(), trace_json(ex).dump() + "\n");
    write_file_atomic((dir / "report.md").string(), render_report_md(results));
    write_file_atomic((dir / "report.html").string(), render_report_html(results));
    return dir.string();
}

}  // namespace mt

// Run folder writers (steps.csv, trace.json, the folder itself), the comparison and the
// markdown report (see report.h); the HTML page is in report_html.cpp.
#include "harness/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "harness/run_folder.h"

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

}  // namespace

std::string steps_csv(const ExperimentResult& ex) {
    std::ostringstream o;
    o << "variant,step,warmup,wall_ms";
    for (Phase p : kAllPhases) o << "," << to_string(p) << "_ms";
    o << ",other_ms,loss,grad_norm,lr,comm_busy_ms,comm_bytes,tokens\n";
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
              << "," << f("%.6g", s.lr) << "," << num(s.comm_busy_ms) << ","
              << f("%.0f", s.comm_bytes) << "," << f("%.0f", s.tokens) << "\n";
        }
    }
    return o.str();
}

namespace {

// The trace events of one track (pid, tid) of kept steps: a step's phases, or its ops, or the
// step itself, each placed at the step's host offset plus its own offset.
enum class TraceTrack { steps, phases, ops };

void add_track(json& events, int pid, int tid, const std::vector<TraceStep>& trace,
               TraceTrack what) {
    for (const TraceStep& s : trace) {
        const double base_us = s.start_ms * 1000.0;
        if (what == TraceTrack::steps)
            events.push_back({{"name", "step " + std::to_string(s.step)},
                              {"cat", "step"},
                              {"ph", "X"},
                              {"pid", pid},
                              {"tid", tid},
                              {"ts", base_us},
                              {"dur", s.wall_ms * 1000.0},
                              {"args", {{"step", s.step}}}});
        if (what == TraceTrack::phases)
            for (const PhaseInterval& iv : s.phases)
                events.push_back({{"name", to_string(iv.phase)},
                                  {"cat", "phase"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", tid},
                                  {"ts", base_us + iv.start_ms * 1000.0},
                                  {"dur", iv.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}, {"micro_step", iv.micro_step}}}});
        if (what == TraceTrack::ops)
            for (const OpInterval& op : s.ops)
                events.push_back({{"name", op.name},
                                  {"cat", "op"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", tid},
                                  {"ts", base_us + op.start_ms * 1000.0},
                                  {"dur", op.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}}}});
    }
}

json thread_name(int pid, int tid, const std::string& name) {
    return {{"name", "thread_name"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", tid},
            {"args", {{"name", name}}}};
}

bool has_trace(const RunResult& r) {
    if (!r.trace.empty()) return true;
    if (r.dist)
        for (const RankSummary& rank : r.dist->ranks)
            if (!rank.trace.empty()) return true;
    return false;
}

}  // namespace

json trace_json(const ExperimentResult& ex) {
    json events = json::array();
    int pid = 0;
    for (const RunResult& r : ex.runs) {
        ++pid;
        if (!has_trace(r)) continue;
        events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"args", {{"name", "variant " + r.config.variant}}}});
        events.push_back(thread_name(pid, 1, "steps"));
        add_track(events, pid, 1, r.trace, TraceTrack::steps);
        if (!r.dist) {
            events.push_back(thread_name(pid, 2, "phases"));
            add_track(events, pid, 2, r.trace, TraceTrack::phases);
            events.push_back(thread_name(pid, 3, "ops"));
            add_track(events, pid, 3, r.trace, TraceTrack::ops);
            continue;
        }
        // Data parallel: one phases track per rank (rank 0's is the variant's own trace), so a
        // straggler or a rank waiting in comm shows beside the others; the steps and ops tracks
        // stay rank 0's, which keeps the file as small as one rank's.
        const std::vector<RankSummary>& ranks = r.dist->ranks;
        for (size_t i = 0; i < ranks.size(); ++i) {
            const int tid = 2 + static_cast<int>(i);
            events.push_back(
                thread_name(pid, tid, "rank " + std::to_string(ranks[i].rank) + " phases"));
            add_track(events, pid, tid, ranks[i].trace, TraceTrack::phases);
        }
        const int ops_tid = 2 + static_cast<int>(ranks.size());
        events.push_back(thread_name(pid, ops_tid, "ops"));
        add_track(events, pid, ops_tid, r.trace, TraceTrack::ops);
    }
    return {{"traceEvents", events},
            {"displayTimeUnit", "ms"},
            {"otherData",
             {{"experiment", ex.name},
              {"note",
               "measured steps only (profile.trace_steps per variant); device phases are "
               "timed on the device clock and placed relative to the step start"}}}};
}

// ---- the comparison -----------------------------------------------------------------------------

namespace {

std::string changed_text(const std::map<std::string, std::string>& changed) {
    if (changed.empty()) return "(nothing: baseline config)";
    std::string s;
    for (const auto& [key, value] : changed) s += (s.empty() ? "" : ", ") + key + "=" + value;
    return s;
}

// The measurements of one variant that the comparison table shows.
ComparisonRow row_from(const VariantResult& v) {
    ComparisonRow r;
    r.name = v.name;
    r.status = v.status;
    r.message = v.message;
    r.changed = changed_text(v.changed);
    r.knobs_changed = v.knobs_changed;
    const SeriesSummary& step = v.stats.step_ms;
    r.has_stats = step.n > 0;
    r.median_ms = step.median;
    r.p90_ms = step.p90;
    r.iqr_ms = step.iqr;
    r.jitter = step.iqr_over_median;
    if (const std::string j = v.config_value("data.seq_len_jitter"); !j.empty() && j != "0")
        r.jitter_cause = "data.seq_len_jitter=" + j;
    r.samples_per_s = v.stats.samples_per_s;
    r.tokens_per_s = v.stats.tokens_per_s;
    r.mfu = v.flops.mfu;
    r.tracked_peak = static_cast<double>(v.memory.tracked_peak_total);
    r.device_peak = static_cast<double>(v.memory.device.peak_used_bytes);
    r.device_kind = v.memory.device.kind;
    r.final_loss = v.loss.final;
    r.mean_loss = v.loss.mean_measured;
    for (const StepRow& s : v.steps)
        if (!s.warmup && s.loss) r.measured_losses.emplace_back(s.step, *s.loss);
    return r;
}

// ---- the loss check ---------------------------------------------------------------------------
//
// A variant keeps the baseline's loss when, over the measured steps both ran (same seed, so the
// same batches on the same steps), neither the mean loss nor the last common step's loss differs
// from the baseline's by more than a tolerance in nats. A variant that computes the same thing
// another way differs by rounding only; one whose math is wrong learns differently and drifts.

constexpr double kFallbackRelativeTolerance = 0.02;  // too few steps to measure a spread
constexpr double kSpreadFloorRelative = 1e-4;        // a derived tolerance is never below this

// The robust standard deviation (1.4826 x median absolute deviation) of xs around their median.
double robust_std(std::vector<double> xs) {
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        const size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    };
    const double m = median(xs);
    for (double& x : xs) x = std::fabs(x - m);
    return 1.4826 * median(xs);
}

// The tolerance of the loss check. Given compare.loss_tolerance: that fraction of the baseline's
// mean measured loss. Otherwise the baseline's own step-to-step spread: the robust std of its
// successive loss changes around their median change (the median removes the downward trend),
// over sqrt(2), since a change between two steps carries the noise of both: the noise of one
// step's loss from one batch to the next.
void set_loss_tolerance(Comparison& c, const ComparisonRow& b) {
    c.tolerance_nats.reset();
    if (!b.mean_loss || b.measured_losses.empty()) {
        c.tolerance_basis = "no measured baseline loss";
        return;
    }
    const double scale = std::fabs(*b.mean_loss);
    if (c.loss_tolerance) {
        c.tolerance_nats = *c.loss_tolerance * scale;
        c.tolerance_basis =
            "compare.loss_tolerance " + pct(*c.loss_tolerance) + " of the baseline's mean loss";
        return;
    }
    const auto& L = b.measured_losses;
    if (L.size() < 4) {
        c.tolerance_nats = kFallbackRelativeTolerance * scale;
        c.tolerance_basis = pct(kFallbackRelativeTolerance) +
                            " of the baseline's mean loss (fewer than 4 measured steps: too few "
                            "to measure its spread; set compare.loss_tolerance)";
        return;
    }
    std::vector<double> changes;
    for (size_t i = 1; i < L.size(); ++i) changes.push_back(L[i].second - L[i - 1].second);
    const double spread = robust_std(changes) / std::sqrt(2.0);
    const double floor = kSpreadFloorRelative * scale;
    c.tolerance_nats = std::max(spread, floor);
    c.tolerance_basis = spread >= floor
                            ? "the baseline's step-to-step loss spread (robust std over " +
                                  std::to_string(L.size()) + " measured steps)"
                            : "the floor " + f("%g", kSpreadFloorRelative) +
                                  " x the baseline's mean loss (its step-to-step spread is "
                                  "smaller)";
}

// dmean_loss, dfinal_loss and loss_ok of r against b over the steps both measured.
void check_loss(ComparisonRow& r, const ComparisonRow& b, std::optional<double> tol_nats) {
    std::map<int, double> base(b.measured_losses.begin(), b.measured_losses.end());
    double sum_b = 0, sum_r = 0;
    size_t n = 0;
    for (const auto& [step, loss] : r.measured_losses) {
        const auto it = base.find(step);
        if (it == base.end()) continue;
        sum_b += it->second, sum_r += loss, ++n;
        r.dfinal_loss = it->second - loss;
    }
    if (n == 0) return;
    r.dmean_loss = (sum_b - sum_r) / static_cast<double>(n);
    if (tol_nats)
        r.loss_ok = std::fabs(*r.dmean_loss) <= *tol_nats && std::fabs(*r.dfinal_loss) <= *tol_nats;
}

std::string loss_deltas_text(const ComparisonRow& r, std::optional<double> tol_nats) {
    return "mean loss " + signed_f("%.4f", -*r.dmean_loss) + ", final " +
           signed_f("%.4f", -*r.dfinal_loss) + " nats vs the baseline; tolerance ±" +
           f("%.4f", tol_nats.value_or(0)) + " nats";
}

std::string failure_short(const ComparisonRow& r) {
    // The first clause of the runner's message is enough for a table cell.
    std::string m = r.message;
    if (auto p = m.find(';'); p != std::string::npos) m = m.substr(0, p);
    if (m.size() > 140) m = m.substr(0, 137) + "...";
    return m;
}

void set_verdict(ComparisonRow& r, Decision d, std::string text) {
    r.decision = d;
    r.verdict = std::move(text);
}

// The verdict of a row that has nothing to measure against: the baseline itself, a skipped or
// failed variant, or no measured steps on either side. Returns false when the row is measurable.
bool judge_unmeasurable(ComparisonRow& r, const ComparisonRow& b, bool baseline_present) {
    const std::string status = to_string(r.status);
    if (r.is_baseline) {
        std::string v = r.status == RunStatus::ok ? "baseline" : "baseline (" + status + ")";
        if (r.status == RunStatus::failed || r.status == RunStatus::skipped)
            v += ": " + failure_short(r);
        set_verdict(r, Decision::baseline, v);
    } else if (r.status == RunStatus::skipped) {
        // Results written before the runner's message lost its own "not run: " say it already.
        const std::string why = failure_short(r);
        set_verdict(r, Decision::not_run, why.rfind("not run", 0) == 0 ? why : "not run: " + why);
    } else if (r.status == RunStatus::failed) {
        set_verdict(r, Decision::reject, "reject: " + failure_short(r));
    } else if (!r.has_stats) {
        set_verdict(r, Decision::not_applicable, "n/a: no measured steps");
    } else if (!baseline_present || !b.has_stats) {
        set_verdict(r, Decision::not_applicable,
                    "n/a: the baseline has no measured steps to compare with");
    } else {
        return false;
    }
    return true;
}

// Deltas against the baseline: time (median), memory (tracked peak), noise and loss.
void measure_against(ComparisonRow& r, const ComparisonRow& b, std::optional<double> tol) {
    r.dtime_ms = b.median_ms - r.median_ms;
    r.speedup = r.median_ms > 0 ? b.median_ms / r.median_ms : 0;
    r.dmem_bytes = b.tracked_peak - r.tracked_peak;
    const double noise = std::max(b.iqr_ms, r.iqr_ms);
    r.within_noise = std::fabs(*r.dtime_ms) <= noise;
    check_loss(r, b, tol);
}

// keep / trade-off / reject from the measured deltas (measure_against ran).
void judge_measured(ComparisonRow& r, const ComparisonRow& b, std::optional<double> tol) {
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

    Decision d = Decision::reject;
    std::string v;
    if (r.loss_ok && !*r.loss_ok) {
        v = "reject: loss not within tolerance: do not keep (" + loss_deltas_text(r, tol) + ")";
        if (faster) v += ", although " + speed;
    } else if (faster && !fatter) {
        d = Decision::keep;
        v = "keep: " + speed + (leaner ? ", and " + mem_gain : "");
    } else if (faster && fatter) {
        d = Decision::trade_off;
        v = "trade-off: " + speed + ", " + mem_cost;
    } else if (leaner && !slower) {
        d = Decision::keep;
        v = "keep: " + mem_gain + ", time within noise";
    } else if (leaner && slower) {
        d = Decision::trade_off;
        v = "trade-off: " + mem_gain + ", " + time_cost;
    } else if (slower) {
        v = "reject: " + speed + (fatter ? " and " + mem_cost : "");
    } else {
        v = "reject: no measurable gain (time within noise" +
            std::string(fatter ? ", " + mem_cost : ", memory unchanged") + ")";
    }
    if (!r.loss_ok) v += " (loss not comparable)";
    // Shape jitter shortens the variant's batches, so its steps are shorter by construction: the
    // work-normalised comparison is tokens/s.
    if (!r.jitter_cause.empty() && b.tokens_per_s > 0)
        v += "; its batches are shorter (" + r.jitter_cause + "): per token it runs at " +
             f("%.2f", r.tokens_per_s / b.tokens_per_s) + "x the baseline's tokens/s";
    if (r.status == RunStatus::interrupted) v += " [interrupted: partial measurement]";
    if (r.knobs_changed > 1)
        v += "; changes " + std::to_string(r.knobs_changed) + " knobs: not attributable";
    set_verdict(r, d, v);
}

void judge(ComparisonRow& r, const ComparisonRow& b, std::optional<double> tol,
           bool baseline_present) {
    if (judge_unmeasurable(r, b, baseline_present)) return;
    measure_against(r, b, tol);
    judge_measured(r, b, tol);
}

// The notes on step-time spread. A variant whose own config varies its shapes
// (data.seq_len_jitter) is named as the cause of its spread, measured against the baseline's;
// any other high spread is blamed on the run (warm-up, machine load).
void add_notes(Comparison& c) {
    bool jittery = false;
    const ComparisonRow* base = nullptr;
    for (const ComparisonRow& r : c.rows)
        if (r.is_baseline && r.has_stats) base = &r;
    for (const ComparisonRow& r : c.rows) {
        if (!r.has_stats) continue;
        if (!r.jitter_cause.empty()) {
            c.notes.push_back(
                "shape jitter: '" + r.name + "' sets " + r.jitter_cause +
                " (each batch's length drawn between (1 - j) x data.seq_len and data.seq_len), "
                "so its step times vary by design: step-time spread (IQR/median) " +
                pct(r.jitter) +
                (base && base != &r ? " against the baseline's " + pct(base->jitter) : "") + "; " +
                (r.jitter > kJitterWarnThreshold
                     ? "the cause of its jitter is variable shapes, not the machine; its "
                       "tokens/s counts the tokens of the shorter batches"
                     : "variable shapes did not raise it above " + pct(kJitterWarnThreshold)));
            continue;
        }
        if (r.jitter <= kJitterWarnThreshold) continue;
        jittery = true;
        c.notes.push_back("warning: '" + r.name + "' step times jitter " + pct(r.jitter) +
                          " (IQR/median > " + pct(kJitterWarnThreshold) +
                          "): deltas smaller than its spread are noise; more warm-up or "
                          "measured steps, and a quiet machine, help");
    }
    if (jittery)
        c.notes.push_back(
            "caution: variants run one after another, so a change in machine load between them "
            "(other processes) looks like a difference between variants that no within-variant "
            "spread can reveal; with jitter this high, re-run on a quiet machine before keeping a "
            "variant");
}

const VariantResult& find_variant(const Results& r, const std::string& name,
                                  const std::string& label) {
    std::string list;
    for (const VariantResult& v : r.variants) {
        if (v.name == name) return v;
        list += (list.empty() ? "" : ", ") + v.name;
    }
    throw ReportError(label + ": no variant named '" + name + "' (it has: " + list + ")");
}

// "What it changed" between two runs: every config key whose value differs (or is set on one
// side only), plus a device change.
void describe_config_difference(ComparisonRow& r, const VariantResult& a, const VariantResult& b) {
    std::set<std::string> keys;
    for (const auto& kv : a.config) keys.insert(kv.first);
    for (const auto& kv : b.config) keys.insert(kv.first);
    std::vector<std::string> diff;
    for (const std::string& k : keys) {
        const auto ia = a.config.find(k), ib = b.config.find(k);
        const bool in_a = ia != a.config.end(), in_b = ib != b.config.end();
        if (in_a != in_b || (in_a && ia->second != ib->second))
            diff.push_back(k + "=" + (in_b ? ib->second : std::string("(unset)")));
    }
    std::string changed;
    for (const std::string& d : diff) changed += (changed.empty() ? "" : ", ") + d;
    if (a.device_name != b.device_name)
        changed += (changed.empty() ? "" : "; ") + std::string("device ") + b.device_name;
    r.changed = changed.empty() ? "(same config)" : changed;
    r.knobs_changed = static_cast<int>(diff.size());
}

// A note for every shape key that differs: such rows are not like for like.
void note_shape_differences(Comparison& c, const std::string& row_name, const VariantResult& a,
                            const VariantResult& b) {
    for (const char* k : {"model.n_layer", "model.n_embd", "model.n_head", "model.vocab_size",
                          "data.batch_size", "data.seq_len"}) {
        const auto ia = a.config.find(k), ib = b.config.find(k);
        if (ia != a.config.end() && ib != b.config.end() && ia->second != ib->second)
            c.notes.push_back("note: '" + row_name + "' runs a different " + k + " (" + ia->second +
                              " vs " + ib->second +
                              "): time, memory and loss are not like for like");
    }
}

}  // namespace

Comparison build_comparison(const Results& results) {
    Comparison c;
    c.baseline = results.experiment.baseline;
    c.loss_tolerance = results.experiment.loss_tolerance;
    std::vector<ComparisonRow> rows;
    int base = -1;
    for (size_t i = 0; i < results.variants.size(); ++i) {
        rows.push_back(row_from(results.variants[i]));
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
    if (!rows.empty()) set_loss_tolerance(c, rows.front());
    for (ComparisonRow& r : rows) judge(r, rows.front(), c.tolerance_nats, base >= 0);
    c.rows = std::move(rows);
    add_notes(c);
    return c;
}

Comparison compare_results(const Results& a, const std::string& a_label, const Results& b,
                           const std::string& b_label, const std::string& a_variant,
                           const std::string& b_variant) {
    Comparison c;
    c.loss_tolerance = a.experiment.loss_tolerance;
    const std::string want_a = a_variant.empty() ? a.experiment.baseline : a_variant;
    const VariantResult& va = find_variant(a, want_a, a_label);
    ComparisonRow base = row_from(va);
    if (!base.has_stats)
        throw ReportError(a_label + ": the baseline variant '" + want_a +
                          "' has no measured steps (status " + to_string(base.status) + ")");
    base.is_baseline = true;
    base.name = "A:" + base.name;
    base.changed = "(baseline: " + a_label + ")";
    c.baseline = base.name;
    c.rows.push_back(base);
    for (const VariantResult& vb : b.variants) {
        if (!b_variant.empty() && vb.name != b_variant) continue;
        ComparisonRow r = row_from(vb);
        r.name = "B:" + vb.name;
        describe_config_difference(r, va, vb);
        note_shape_differences(c, r.name, va, vb);
        c.rows.push_back(r);
    }
    if (c.rows.size() == 1)
        throw ReportError(b_label + (b_variant.empty() ? ": has no variants"
                                                       : ": no variant named '" + b_variant + "'"));
    set_loss_tolerance(c, c.rows.front());
    for (ComparisonRow& r : c.rows) judge(r, c.rows.front(), c.tolerance_nats, true);
    add_notes(c);
    return c;
}

json load_results(const std::string& path) {
    json j = read_json_file(path);
    results_from_json(j, path);  // checks every key, throws ReportError naming it
    return j;
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
        o << "| " << cell(r.name)
          << (r.status != RunStatus::ok ? " (" + std::string(to_string(r.status)) + ")" : "")
          << " | " << cell(r.changed) << " | ";
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
         "than the larger IQR of the two is *within noise*. Loss within tolerance: over the "
         "measured steps both ran, |Δ mean loss| and |Δ loss of the last common step| ≤ "
      << (c.tolerance_nats ? f("%.4f", *c.tolerance_nats) + " nats (" + c.tolerance_basis + ")"
                           : std::string("n/a (") + c.tolerance_basis + ")")
      << ". Throughput from the median step.\n";
    for (const std::string& n : c.notes) o << "\n- " << n;
    if (!c.notes.empty()) o << "\n";
    return o.str();
}

// ---- the full markdown report -------------------------------------------------------------------

namespace {

// Mean ms per phase column (the phases, then other) and of the step.
struct Shares {
    std::array<double, kPhaseColumnCount> ms{};
    double step_ms = 0;
    double share(int column) const { return step_ms > 0 ? ms[column] / step_ms : 0; }
};

Shares shares_of(const VariantResult& v) {
    Shares s;
    s.step_ms = v.stats.step_ms.mean;
    for (int i = 0; i < kPhaseColumnCount; ++i) s.ms[i] = phase_column_stats(v.stats, i).mean;
    return s;
}

int dominant(const Shares& s) {
    int best = 0;
    for (int i = 1; i < kPhaseColumnCount; ++i)
        if (s.ms[i] > s.ms[best]) best = i;
    return best;
}

int column(Phase p) {
    return static_cast<int>(p);
}

size_t category_bytes(const CategoryBytes& b, MemoryCategory c) {
    return b[static_cast<int>(c)];
}

std::string memory_peak_text(const VariantResult& v) {
    const MemoryRecord& m = v.memory;
    std::string s = mib(m.tracked_peak_total) + " MiB tracked";
    if (m.peak_phase) {
        s += " during " + std::string(enum_name(*m.peak_phase));
        if (const auto& pm = m.phases[column(*m.peak_phase)])
            s += " (+" + mib(pm->transient_peak) + " MiB allocated in it)";
    } else {
        s += ", held through every phase (allocated at setup; no phase allocates on top)";
    }
    s += "; largest category " + std::string(enum_name(m.largest_category)) + " (" +
         mib(category_bytes(m.tracked_peak, m.largest_category)) + " MiB)";
    const DeviceMemoryRecord& d = m.device;
    if (d.available)
        s += "; " + d.kind + " peak " + mib(d.peak_used_bytes) + " MiB" +
             (d.total_bytes > 0 ? " of " + mib(d.total_bytes) + " MiB" : std::string());
    return s;
}

std::string top_kernels_text(const VariantResult& v, size_t n) {
    std::string s;
    for (size_t i = 0; i < v.kernels.size() && i < n; ++i) {
        const KernelRecord& k = v.kernels[i];
        if (!s.empty()) s += ", ";
        s += k.name + " " + f("%.1f%%", k.pct_of_step) + " (" + to_string(k.bound) + "-bound)";
    }
    return s;
}

// Which phases moved against the baseline (mean ms, variant - baseline), largest first, and a
// hint when background loader threads took cores from the compute.
std::string phase_moves_text(const VariantResult& v, const VariantResult& base) {
    if (!v.measured() || !base.measured()) return "";
    const Shares a = shares_of(base), b = shares_of(v);
    std::vector<std::pair<double, int>> moves;
    for (int i = 0; i < kPhaseColumnCount; ++i) moves.emplace_back(b.ms[i] - a.ms[i], i);
    std::sort(moves.begin(), moves.end(),
              [](const auto& x, const auto& y) { return std::fabs(x.first) > std::fabs(y.first); });
    std::string s = "- vs the baseline (mean ms, variant − baseline): step " +
                    signed_f("%.2f", b.step_ms - a.step_ms);
    int shown = 0;
    for (const auto& [d, i] : moves) {
        if (shown == 3 || std::fabs(d) < 0.02 * a.step_ms) break;
        s += std::string(shown++ ? ", " : "; ") + phase_column_name(i) + " " + signed_f("%.2f", d);
    }
    s += "\n";
    const int data = column(Phase::data), fwd = column(Phase::forward),
              bwd = column(Phase::backward);
    const double data_d = b.ms[data] - a.ms[data];
    const double compute_d = (b.ms[fwd] + b.ms[bwd]) - (a.ms[fwd] + a.ms[bwd]);
    if (v.backend == "cpu" && data_d < -0.05 * a.step_ms && compute_d > 0.5 * -data_d &&
        v.config_value("data.workers") != base.config_value("data.workers"))
        s += "- note: the data phase shrank but forward/backward grew by " + f("%.2f", compute_d) +
             " ms: on the CPU the loader's worker threads compete with the compute threads for "
             "the same cores, so the saved wait is spent again; the gain needs spare cores "
             "(run.threads + data.workers <= the machine's hardware threads)\n";
    return s;
}

// run.host_sync: how often the variant's step made the host wait for the device, and how long.
std::string host_syncs_text(const VariantResult& v) {
    const std::string mode = v.config_value("run.host_sync");
    return "- host syncs: " + f("%.0f", v.stats.host_syncs.median) +
           " per step (median), the host waited " + f("%.2f", v.stats.host_wait_ms.median) +
           " ms in them" + (mode.empty() ? std::string() : " (`run.host_sync: " + mode + "`)") +
           (v.backend == "cpu" ? "; CPU ops are synchronous, so a sync waits for nothing here"
                               : std::string()) +
           "\n";
}

// What one setting of run.host_sync does to the step, for the line below.
std::string host_sync_cause(const std::string& mode) {
    if (mode == "every_op")
        return "`run.host_sync: every_op` synchronises after every kernel, as naive debug code "
               "does: the device idles while the host wakes up and launches the next kernel, so "
               "the cost lands inside forward, backward and optimizer rather than in sync";
    if (mode == "loss_every_step")
        return "`run.host_sync: loss_every_step` reads the loss after every micro-step's forward "
               "(`loss.item()`): the host stalls in sync until the forward is done, and the "
               "backward then starts from an idle device";
    return "the step waits for the device more often than the baseline's";
}

// The sync line of "Bottleneck and next steps": when the variant synchronises more often than
// the baseline, or its sync phase grew beyond the noise (the larger IQR, and 1% of the
// baseline's step), it names the sync phase, the setting and where the cost landed.
std::string host_sync_growth_text(const VariantResult& v, const VariantResult& base) {
    if (!v.measured() || !base.measured()) return "";
    const SeriesSummary& vs = v.stats.phases_ms[column(Phase::sync)];
    const SeriesSummary& bs = base.stats.phases_ms[column(Phase::sync)];
    const double grew = vs.mean - bs.mean;
    const bool more_syncs = v.stats.host_syncs.median > base.stats.host_syncs.median;
    const bool sync_grew =
        grew > std::max({vs.iqr, bs.iqr, 0.01 * base.stats.step_ms.mean}) && grew > 0;
    if (!more_syncs && !sync_grew) return "";
    const Shares a = shares_of(base), b = shares_of(v);
    auto moved = [&](Phase p) { return b.ms[column(p)] - a.ms[column(p)]; };
    const double compute = moved(Phase::forward) + moved(Phase::backward) + moved(Phase::optimizer);
    const std::string syncs = f("%.0f", base.stats.host_syncs.median) + " → " +
                              f("%.0f", v.stats.host_syncs.median) + " per step";
    const std::string phase = f("%.2f", bs.mean) + " to " + f("%.2f", vs.mean) + " ms per step";
    const std::string waits = "host waits " + f("%.2f", base.stats.host_wait_ms.median) + " → " +
                              f("%.2f", v.stats.host_wait_ms.median) + " ms";
    std::string t = "- next: ";
    t += sync_grew
             ? "sync grew from " + phase + " (host syncs " + syncs + ", " + waits + ")"
             : "host syncs grew " + syncs + " (the sync phase from " + phase + ", " + waits + ")";
    t += ": " + host_sync_cause(v.config_value("run.host_sync")) +
         "; forward+backward+optimizer moved " + signed_f("%.2f", compute) + " ms, other " +
         signed_f("%.2f", b.ms[kPhaseCount] - a.ms[kPhaseCount]) + " ms, the step " +
         signed_f("%.2f", b.step_ms - a.step_ms) + " ms";
    if (v.backend == "cpu")
        t += " (CPU backend: ops are synchronous, so a sync waits for nothing; a move within the "
             "spread of the comparison is noise)";
    return t +
           ". Read the step's scalars back once at its end (`run.host_sync: step`) or keep them "
           "on the device (`run.host_sync: none`).\n";
}

// The variant the three questions are answered for: the baseline, else the first measured one.
const VariantResult* reference_variant(const Results& res, const std::string& baseline) {
    const VariantResult* ref = nullptr;
    for (const VariantResult& v : res.variants)
        if (v.name == baseline && v.measured()) ref = &v;
    if (!ref)
        for (const VariantResult& v : res.variants)
            if (v.measured()) return &v;
    return ref;
}

void write_header(std::ostringstream& o, const Results& res, const Comparison& cmp) {
    const Environment& env = res.environment;
    o << "# " << res.experiment.name << " — microtrain report\n\n";
    o << "Experiment `" << res.experiment.source << "`, started " << res.started_utc
      << ", baseline `" << cmp.baseline << "`";
    if (env.git_commit)
        o << ", commit `" << env.git_commit->substr(0, 12) << "`"
          << (env.git_dirty.value_or(false) ? " (with uncommitted changes)" : "");
    o << ".\n";
    if (res.interrupted)
        o << "\n**Interrupted (Ctrl-C): the numbers below cover only the steps measured before "
             "the interruption.**\n";
    for (const VariantResult& v : res.variants)
        if (v.status == RunStatus::failed)
            o << "\n**Failed: " << v.message << "** (its measured steps are kept below)\n";
}

void write_answers(std::ostringstream& o, const VariantResult* ref, const Comparison& cmp) {
    o << "\n## Answers\n\n";
    if (ref) {
        const Shares s = shares_of(*ref);
        const int d = dominant(s);
        o << "- **Where is the step slow?** In `" << ref->name << "`, " << phase_column_name(d)
          << " takes " << pct(s.share(d)) << " of the mean step (" << f("%.2f", s.ms[d]) << " of "
          << f("%.2f", s.step_ms) << " ms)";
        if (!ref->kernels.empty()) o << "; top ops: " << top_kernels_text(*ref, 3);
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
}

void write_phase_table(std::ostringstream& o, const Results& res) {
    o << "\n## Phase breakdown\n\nMean ms per measured step (share of the mean step). `other` = "
         "step wall time − the sum of the phases (launch overhead, idle time; negative when host "
         "and device work overlapped).\n\n| Variant | steps |";
    for (int i = 0; i < kPhaseColumnCount; ++i) o << " " << phase_column_name(i) << " |";
    o << " step (mean) | step p10–p90 | jitter |\n|---|---:|";
    for (int i = 0; i < kPhaseColumnCount; ++i) o << "---:|";
    o << "---:|---:|---:|\n";
    for (const VariantResult& v : res.variants) {
        if (!v.measured()) {
            o << "| " << v.name << " | 0 | – | " << to_string(v.status) << ": no measured steps |";
            for (int i = 0; i < kPhaseCount + 2; ++i) o << " |";
            o << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const SeriesSummary& st = v.stats.step_ms;
        o << "| " << v.name << " | " << v.measured_steps << " |";
        for (int i = 0; i < kPhaseColumnCount; ++i)
            o << " " << f("%.2f", s.ms[i]) << " (" << f("%.0f%%", 100 * s.share(i)) << ") |";
        const double jit = v.stats.jitter;
        o << " " << f("%.2f", s.step_ms) << " | " << f("%.2f", st.p10) << "–" << f("%.2f", st.p90)
          << " | " << pct(jit) << (jit > kJitterWarnThreshold ? " ⚠" : "") << " |\n";
    }
}

// The peaks each device's MFU and roofline use, in words (the first variant per device).
std::string peaks_text(const VariantResult& v) {
    const RooflineRecord& rf = v.roofline;
    return "`" + v.device_name + "`: peak " + f("%.1f", rf.peak_flops_per_s / 1e9) + " GFLOP/s (" +
           rf.flops_source + "), bandwidth " + f("%.1f", rf.bandwidth_bytes_per_s / 1e9) +
           " GB/s (" + rf.bytes_source + "), ridge " + f("%.2f", rf.ridge_flops_per_byte) +
           " FLOP/byte. " + "MFU: " + v.flops.peak_source;
}

void write_throughput(std::ostringstream& o, const Results& res) {
    o << "\n## Throughput and FLOPs\n\n| Variant | device | samples/step | tokens/step | model "
         "GFLOP/step | achieved GFLOP/s | peak GFLOP/s used for MFU | MFU |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|\n";
    std::map<std::string, std::string> sources;  // by device: the first variant's figures
    bool mfu_over = false;
    for (const VariantResult& v : res.variants) {
        if (!v.measured()) continue;
        const FlopsRecord& fl = v.flops;
        o << "| " << v.name << " | " << v.device_name << " | " << v.batch.samples_per_step << " | "
          << v.batch.tokens_per_step << " | " << f("%.3f", fl.per_step / 1e9) << " | "
          << f("%.2f", fl.achieved_per_s / 1e9) << " | "
          << (fl.peak_per_s ? f("%.1f", *fl.peak_per_s / 1e9) : std::string("n/a")) << " | "
          << (fl.mfu ? pct(*fl.mfu) : "n/a") << " |\n";
        if (fl.mfu && *fl.mfu > 1.0) mfu_over = true;
        if (!sources.count(v.device_name)) sources[v.device_name] = peaks_text(v);
    }
    if (!sources.empty()) {
        o << "\nPeaks used:\n";
        for (const auto& [dev, s] : sources) o << "\n- " << s;
        o << "\n";
    }
    if (mfu_over)
        o << "\n**MFU above 100%: the training step ran faster than the measured peak, so the "
             "peak probe was disturbed (a busy machine when it ran). Delete `"
          << res.environment.peaks_cache
          << "/cpu_peaks.json` to re-measure on a quiet machine.**\n";
}

void write_memory_estimate_table(std::ostringstream& o, const Results& res) {
    o << "\n## Memory\n\nAnalytic estimate (printed before the run) beside the allocator's "
         "tracked peak per category, in MiB.\n\n| Variant | category | estimate | tracked peak | "
         "Δ (tracked − estimate) |\n|---|---|---:|---:|---:|\n";
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        const MemoryRecord& m = v.memory;
        for (int c = 0; c < kMemoryCategoryCount; ++c) {
            const double e = static_cast<double>(m.estimate[c]);
            const double t = static_cast<double>(m.tracked_peak[c]);
            o << "| " << v.name << " | " << to_string(static_cast<MemoryCategory>(c)) << " | "
              << mib(e) << " | " << mib(t) << " | " << signed_f("%.1f", to_mib(t - e)) << " |\n";
        }
        const double e = static_cast<double>(m.estimate_total);
        const double t = static_cast<double>(m.tracked_peak_total);
        o << "| " << v.name << " | **total (peak of the sum)** | " << mib(e) << " | " << mib(t)
          << " | " << signed_f("%.1f", to_mib(t - e)) << " |\n";
    }
}

void write_memory_peaks(std::ostringstream& o, const Results& res) {
    o << "\nWhere memory peaks:\n";
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        o << "\n- `" << v.name << "`: " << memory_peak_text(v);
        if (const size_t rss = v.memory.process_peak_rss_bytes; rss > 0)
            o << "; process peak RSS (getrusage, whole process so far) " << mib(rss) << " MiB";
    }
    o << "\n\nPer-phase peaks (tracked MiB / device-or-RSS MiB):\n\n| Variant |";
    for (Phase p : kAllPhases) o << " " << enum_name(p) << " |";
    o << "\n|---|";
    for (int i = 0; i < kPhaseCount; ++i) o << "---:|";
    o << "\n";
    for (const VariantResult& v : res.variants) {
        if (v.status == RunStatus::skipped) continue;
        o << "| " << v.name << " |";
        for (Phase p : kAllPhases) {
            if (const auto& pm = v.memory.phases[column(p)])
                o << " " << mib(pm->tracked_peak_total) << " / " << mib(pm->device_used_peak)
                  << " |";
            else
                o << " – |";
        }
        o << "\n";
    }
}

void write_kernels(std::ostringstream& o, const Results& res) {
    for (const VariantResult& v : res.variants) {
        if (v.kernels.empty()) continue;
        o << "\n## Kernels: " << v.name
          << "\n\nPer op over the measured steps (analytic FLOPs and bytes / measured time); "
             "bound = arithmetic intensity vs the ridge point ("
          << f("%.2f", v.roofline.ridge_flops_per_byte)
          << " FLOP/byte); implementation = what the op ran (kernels.*); % of peak = achieved "
             "GFLOP/s / the measured peak ("
          << f("%.1f", v.roofline.peak_flops_per_s / 1e9)
          << " GFLOP/s).\n\n| op | implementation | calls | total ms | ms/step | % of step | "
             "GFLOP/s | % of peak | GB/s | FLOP/byte | bound | % of roofline "
             "|\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
        for (size_t i = 0; i < v.kernels.size() && i < 12; ++i) {
            const KernelRecord& k = v.kernels[i];
            const double peak = v.roofline.peak_flops_per_s;
            o << "| " << k.name << " | " << (k.impl.empty() ? "–" : k.impl) << " | " << k.calls
              << " | " << f("%.2f", k.total_ms) << " | " << f("%.3f", k.ms_per_step) << " | "
              << f("%.1f", k.pct_of_step) << " | " << f("%.2f", k.gflops_per_s) << " | "
              << (peak > 0 && k.flops > 0 ? f("%.1f", 100.0 * k.gflops_per_s * 1e9 / peak)
                                          : std::string("–"))
              << " | " << f("%.2f", k.gb_per_s) << " | " << f("%.2f", k.intensity) << " | "
              << to_string(k.bound) << " | " << f("%.0f", k.pct_of_roofline) << " |\n";
        }
    }
}

// ---- data parallel ------------------------------------------------------------------------------

// Communication is the bottleneck when the step's exposed wait for it is the largest phase or more
// than this share of the median step: beyond a quarter, hiding or shrinking it is the biggest
// lever left, whichever phase is largest.
constexpr double kCommBottleneckShare = 0.25;
// A rank whose median step is this much slower than the fastest one holds every collective up.
constexpr double kRankSpreadWarn = 0.10;
// More buckets than this per step: the per-collective latency adds up.
constexpr int kManyBuckets = 8;

// The largest phase of the median step (phases only: `other` is not a phase).
Phase largest_phase(const VariantResult& v) {
    Phase best = kAllPhases[0];
    for (Phase p : kAllPhases)
        if (v.stats.phases_ms[column(p)].median > v.stats.phases_ms[column(best)].median) best = p;
    return best;
}

bool comm_is_bottleneck(const VariantResult& v) {
    if (!v.data_parallel || !v.measured()) return false;
    const DataParallelRecord& d = *v.data_parallel;
    return d.comm_exposed_ms > 0 &&
           (d.comm_share > kCommBottleneckShare || largest_phase(v) == Phase::comm);
}

const RankRecord* rank_zero(const DataParallelRecord& d) {
    for (const RankRecord& r : d.ranks)
        if (r.rank == 0) return &r;
    return nullptr;
}

std::string simulated_link_text(const DataParallelRecord& d) {
    return "simulated: " + f("%g", d.simulated_link_gbps) + " Gbit/s, " +
           f("%g", d.simulated_latency_us) + " µs — not a real interconnect";
}

// What to change when communication is the bottleneck, from what was measured.
std::vector<std::string> comm_suggestions(const VariantResult& v) {
    const DataParallelRecord& d = *v.data_parallel;
    std::vector<std::string> out;
    const std::string buckets = "now " + f("%g", d.bucket_mb) + " MiB, " +
                                std::to_string(d.buckets) + " bucket" +
                                (d.buckets == 1 ? "" : "s") + " per step";
    if (!d.overlap) {
        out.push_back(
            "set `dist.overlap: true`: each bucket's reduction then starts as soon as "
            "backward has produced it and runs under the rest of backward (overlap is "
            "off: the step waits for every byte).");
    } else if (d.comm_overlapped_ms < d.comm_exposed_ms) {
        // Overlap is on but most of the communication is still waited for.
        if (d.simulated_latency_us > 0 || d.buckets > kManyBuckets)
            out.push_back("a larger `dist.bucket_mb` (" + buckets +
                          "): fewer collectives, each paying the per-collective latency once" +
                          (d.simulated_latency_us > 0
                               ? " (" + f("%g", d.simulated_latency_us) + " µs simulated)"
                               : std::string()) +
                          "; little of the communication is hidden (" +
                          f("%.2f", d.comm_overlapped_ms) + " ms overlapped vs " +
                          f("%.2f", d.comm_exposed_ms) + " ms exposed).");
        else
            out.push_back("a smaller `dist.bucket_mb` (" + buckets +
                          "): the first reduction starts earlier in backward, so more of it "
                          "hides; little is hidden now (" +
                          f("%.2f", d.comm_overlapped_ms) + " ms overlapped vs " +
                          f("%.2f", d.comm_exposed_ms) + " ms exposed).");
    }
    out.push_back("more gradient accumulation (`run.grad_accum`, now " +
                  std::to_string(v.batch.grad_accum) +
                  "): one reduction per optimizer step is amortised over more samples.");
    out.push_back(d.zero == 0
                      ? std::string("`dist.zero: 1` (ZeRO-1) only when memory is the issue: it "
                                    "shards the optimizer state across the ranks but does not "
                                    "reduce the traffic.")
                      : std::string("ZeRO-1 is on: it saves optimizer memory, not traffic (it "
                                    "adds a parameter all-gather after the optimizer); "
                                    "`dist.zero: 0` if memory allows."));
    return out;
}

void write_rank_table(std::ostringstream& o, const DataParallelRecord& d) {
    o << "\n| rank | step ms | comm exposed ms | comm overlapped ms | data ms | forward ms | "
         "backward ms | optimizer ms |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const RankRecord& r : d.ranks) {
        const bool slow = d.ranks.size() > 1 && r.rank == d.slowest_rank;
        o << "| "
          << (slow ? "**" + std::to_string(r.rank) + "** (slowest)" : std::to_string(r.rank))
          << " | " << f("%.2f", r.step_ms);
        for (double x :
             {r.phases_ms[column(Phase::comm)], r.comm_overlapped_ms,
              r.phases_ms[column(Phase::data)], r.phases_ms[column(Phase::forward)],
              r.phases_ms[column(Phase::backward)], r.phases_ms[column(Phase::optimizer)]})
            o << " | " << f("%.2f", x);
        o << " |\n";
    }
    o << "\nMedians per rank over its measured steps. Rank spread: " << f("%.2f", d.rank_spread_ms)
      << " ms (" << pct(d.rank_spread_pct) << " of the fastest rank's median step); slowest rank "
      << d.slowest_rank << ".\n";
}

void write_comm_verdict(std::ostringstream& o, const VariantResult& v) {
    const DataParallelRecord& d = *v.data_parallel;
    const bool bottleneck = comm_is_bottleneck(v);
    o << "\n**Is communication the bottleneck?** " << (bottleneck ? "Yes" : "No")
      << ": the exposed communication wait is " << pct(d.comm_share) << " of the median step ("
      << f("%.2f", d.comm_exposed_ms) << " of " << f("%.2f", v.stats.step_ms.median)
      << " ms); the largest phase is " << enum_name(largest_phase(v))
      << " (threshold: communication is the bottleneck when it is the largest phase or more than "
      << pct(kCommBottleneckShare) << " of the step).\n\n";
    if (bottleneck)
        for (const std::string& s : comm_suggestions(v)) o << "- next: " << s << "\n";
    if (d.ranks.size() > 1 && d.rank_spread_pct > kRankSpreadWarn)
        o << "- straggler / load imbalance: rank " << d.slowest_rank << " is the slowest, "
          << f("%.2f", d.rank_spread_ms) << " ms (" << pct(d.rank_spread_pct)
          << ") slower per step than the fastest rank (more than " << pct(kRankSpreadWarn)
          << "); every collective waits for it, so the other ranks' comm wait includes its lag. "
             "Check what differs on that rank (its data phase, other processes on its cores, "
             "`run.threads` × ranks against the machine's cores).\n";
    if (d.simulated_link_gbps > 0)
        o << "- the link is simulated: these communication times are what the simulated link "
             "would take, not what this machine's interconnect does.\n";
}

void write_communication(std::ostringstream& o, const Results& res) {
    bool any = false;
    for (const VariantResult& v : res.variants) any = any || (v.data_parallel && v.measured());
    if (!any) return;
    o << "\n## Communication (data parallel)\n\nThe comm phase is the time a step *waits* for "
         "communication (exposed); communication hidden under backward (overlapped) is measured "
         "beside the phases. Per step, rank 0's medians unless stated.\n";
    for (const VariantResult& v : res.variants) {
        if (!v.data_parallel || !v.measured()) continue;
        const DataParallelRecord& d = *v.data_parallel;
        o << "\n### " << v.name << "\n\n";
        o << "- world size **" << d.world_size << "**, transport " << d.transport << ", ZeRO stage "
          << d.zero << ", overlap " << (d.overlap ? "on" : "off") << ", " << d.buckets << " bucket"
          << (d.buckets == 1 ? "" : "s") << " of " << f("%g", d.bucket_mb) << " MiB\n";
        if (d.simulated_link_gbps > 0)
            o << "- link: **" << simulated_link_text(d) << "**\n";
        else
            o << "- link: the real transport (no simulated link)\n";
        o << "- sent per step (each rank): " << mib(d.bytes_per_step) << " MiB ("
          << f("%.0f", d.bytes_per_step) << " bytes)\n";
        o << "- achieved bus bandwidth: " << f("%.3f", d.achieved_busbw_gbps) << " GB/s";
        if (d.probe_busbw_gbps)
            o << " vs the probe's " << f("%.3f", *d.probe_busbw_gbps) << " GB/s"
              << (d.busbw_fraction_of_probe ? ", " + pct(*d.busbw_fraction_of_probe) + " of it"
                                            : std::string())
              << " (probe: " << d.probe_source << ")";
        else
            o << " (no probe of this transport)";
        o << "\n";
        const RankRecord* r0 = rank_zero(d);
        o << "- communication per step: exposed " << f("%.2f", d.comm_exposed_ms) << " ms ("
          << pct(d.comm_share) << " of the step), overlapped " << f("%.2f", d.comm_overlapped_ms)
          << " ms" << (r0 ? ", link busy " + f("%.2f", r0->comm_busy_ms) + " ms" : std::string())
          << "\n";
        write_rank_table(o, d);
        write_comm_verdict(o, v);
    }
}

void write_bottlenecks(std::ostringstream& o, const Results& res, const VariantResult* ref,
                       const std::string& baseline) {
    o << "\n## Bottleneck and next steps\n";
    for (const VariantResult& v : res.variants) {
        o << "\n### " << v.name << "\n\n";
        if (!v.measured()) {
            o << to_string(v.status) << ": "
              << (v.message.empty() ? std::string("no measured steps") : v.message) << "\n";
            continue;
        }
        const Shares s = shares_of(v);
        const int d = dominant(s);
        o << "- dominant phase: **" << phase_column_name(d) << "** (" << pct(s.share(d))
          << " of the step)\n";
        if (!v.kernels.empty()) o << "- top ops: " << top_kernels_text(v, 5) << "\n";
        o << "- memory: " << memory_peak_text(v) << "\n";
        o << host_syncs_text(v);
        if (v.name != baseline && ref && ref->name == baseline) o << phase_moves_text(v, *ref);
        if (v.name != baseline && ref && ref->name == baseline) o << host_sync_growth_text(v, *ref);
        for (const std::string& sug : suggestions_for(v)) o << "- next: " << sug << "\n";
    }
}

void write_configuration(std::ostringstream& o, const Results& res) {
    const std::vector<VariantResult>& vs = res.variants;
    o << "\n## Effective configuration\n\nEvery key of every variant (the base plus the variant's "
         "`set:`); a key a variant changed is in bold.\n\n| key |";
    for (const VariantResult& v : vs) o << " " << v.name << " |";
    o << "\n|---|";
    for (size_t i = 0; i < vs.size(); ++i) o << "---|";
    o << "\n";
    std::set<std::string> keys;
    for (const VariantResult& v : vs)
        for (const auto& kv : v.config) keys.insert(kv.first);
    for (const std::string& k : keys) {
        o << "| " << k << " |";
        for (const VariantResult& v : vs) {
            const auto it = v.config.find(k);
            const std::string val = it != v.config.end() ? it->second : "–";
            o << " " << (v.changed.count(k) ? "**" + val + "**" : val) << " |";
        }
        o << "\n";
    }
    for (const VariantResult& v : vs)
        if (v.knobs_changed > 1)
            o << "\n- `" << v.name << "` changes " << v.knobs_changed
              << " knobs at once: its effect cannot be attributed to one of them.";
}

void write_environment(std::ostringstream& o, const Results& res) {
    o << "\n\n## Environment\n\n";
    const json env = environment_to_json(res.environment);
    for (auto it = env.begin(); it != env.end(); ++it)
        o << "- " << it.key() << ": "
          << (it.value().is_string() ? it.value().get<std::string>() : it.value().dump()) << "\n";
    o << "\nFiles: results.json (everything), steps.csv (per step, per phase), trace.json (open in "
         "https://ui.perfetto.dev or chrome://tracing), report.html (this report with charts).\n";
}

}  // namespace

namespace {

// The compute-dominated suggestion: the knobs of this variant that trade for model speed.
std::string compute_suggestion(const VariantResult& v, double fwd, double bwd) {
    const bool cuda = v.backend == "cuda";
    auto cfg = [&](const char* k) { return v.config_value(k); };
    std::string t =
        "compute in the model dominates (forward " + pct(fwd) + ", backward " + pct(bwd) + "). ";
    std::vector<std::string> opts;
    if (cuda && cfg("run.precision") == "fp32")
        opts.push_back("`run.precision: tf32` or `bf16` (tensor cores)");
    if (cuda && cfg("kernels.attention") == "naive") opts.push_back("`kernels.attention: flash`");
    if (cfg("kernels.classifier") == "unfused")
        opts.push_back("`kernels.classifier: fused` (no probability tensor)");
    if (cfg("kernels.layernorm") == "separate")
        opts.push_back("`kernels.layernorm: fused_residual`");
    if (cfg("kernels.matmul_gelu") == "false") opts.push_back("`kernels.matmul_gelu: true`");
    if (cfg("run.recompute") != "none" && !cfg("run.recompute").empty())
        opts.push_back("`run.recompute: none` if memory allows (recompute costs backward FLOPs)");
    if (cfg("run.offload") == "activations")
        opts.push_back(
            "`run.offload: none` if memory allows (the activation copies that do not hide "
            "behind compute wait in forward and backward)");
    if (opts.empty()) opts.push_back("a larger batch per step (fewer, bigger GEMMs)");
    t += "Try: ";
    for (size_t i = 0; i < opts.size(); ++i) t += (i ? "; " : "") + opts[i];
    t += ".";
    if (!cuda) t += " (The CPU backend is fp32-only: precision variants need a GPU.)";
    if (!v.kernels.empty()) {
        const KernelRecord& k = v.kernels[0];
        t += " Top op: " + k.name + " (" + f("%.1f%%", k.pct_of_step) + " of the step, " +
             to_string(k.bound) + "-bound, " + f("%.0f%%", k.pct_of_roofline) + " of its roofline)";
        t += k.bound == Bound::memory
                 ? ": fusing it with its neighbours saves the memory traffic."
                 : ": it is arithmetic-limited; precision or a better GEMM path helps.";
    } else if (!v.profiled) {
        t += " Set `profile.kernels: true` to see which op dominates.";
    }
    return t;
}

// The data-bound suggestion: background loading, or more of it.
std::string data_suggestion(const VariantResult& v, double data) {
    auto ival = [&](const char* k) {
        try {
            return std::stoi(v.config_value(k));
        } catch (...) {
            return 0;
        }
    };
    const int workers = ival("data.workers");
    std::string t = "data-bound: the data phase takes " + pct(data) + " of the step. ";
    if (workers == 0)
        t += "Load batches in the background: `data.workers: 2` with `data.prefetch: 2` or "
             "more (now workers 0: every batch is prepared inside the step)";
    else
        t += "With " + std::to_string(workers) +
             " workers the loader still cannot keep up: raise `data.workers` and "
             "`data.prefetch`, or make per-sample preprocessing cheaper";
    if (v.backend == "cuda" && v.config_value("data.pin_memory") != "true")
        t += "; `data.pin_memory: true` makes the h2d copy asynchronous";
    if (v.config_value("data.cache") == "false")
        t += "; if the run sees its data more than once, `data.cache: true` prepares each sample "
             "once (after the first epoch the data phase is a copy)";
    if (ival("data.preprocess_us") > 0)
        t += " (data.preprocess_us=" + v.config_value("data.preprocess_us") +
             " is simulated per-sample work)";
    return t + ".";
}

// Fewer parameters to update (optimizer slow; memory high): LoRA or frozen layers when the
// variant trains everything, int8 storage when something is frozen but kept in fp32. "" when
// the variant already uses every one of them.
std::string fewer_trainable_hint(const VariantResult& v) {
    const bool lora = v.config_value("model.lora").rfind("{rank: 0,", 0) != 0 &&
                      !v.config_value("model.lora").empty();
    const bool freeze =
        !v.config_value("optim.freeze").empty() && v.config_value("optim.freeze") != "[]";
    if (!lora && !freeze)
        return " If this is a fine-tune, update fewer parameters: `model.lora: {rank: 8, alpha: "
               "16}` trains adapters only, `optim.freeze: [wte, wpe, h.0]` freezes layers (no "
               "gradients, no AdamW state for them).";
    if (v.config_value("model.quantize_frozen") != "int8")
        return " The frozen weights can be stored as int8: `model.quantize_frozen: int8`.";
    return "";
}

// The optimizer, host-overhead, memory-limit and jitter suggestions.
void add_step_overhead_suggestions(std::vector<std::string>& out, const VariantResult& v,
                                   const Shares& s) {
    const double opt = s.share(column(Phase::optimizer)), sync = s.share(column(Phase::sync)),
                 other = s.share(kPhaseCount);
    if (opt >= 0.15) {
        if (v.config_value("optim.offload") == "true")
            out.push_back("the optimizer takes " + pct(opt) +
                          " of the step with `optim.offload: true`: AdamW runs on the host and "
                          "the gradients and weights cross the host link every step; "
                          "`optim.offload: false` if the moments fit on the device, else "
                          "`run.grad_accum` (more samples per update) amortises it.");
        else if (v.config_value("optim.impl") != "fused")
            out.push_back("optimizer-bound: the optimizer takes " + pct(opt) +
                          " of the step with `optim.impl: " + v.config_value("optim.impl") +
                          "`; `optim.impl: fused` updates the flat buffer in one pass." +
                          fewer_trainable_hint(v));
        else
            out.push_back("the fused optimizer still takes " + pct(opt) +
                          " of the step: it costs a fixed time per step, so `run.grad_accum` "
                          "(more samples per update) amortises it." +
                          fewer_trainable_hint(v));
    }
    if (sync + std::max(0.0, other) >= 0.15)
        out.push_back("host waits and overhead take " + pct(sync + std::max(0.0, other)) +
                      " of the step (sync " + pct(sync) + ", other " + pct(other) +
                      "): fewer synchronisations (read the loss less often: `run.host_sync: step` "
                      "reads it once per step, `none` keeps it on the device), fewer and larger "
                      "launches (bigger batch, fused kernels).");
    const DeviceMemoryRecord& d = v.memory.device;
    if (d.available && d.total_bytes > 0) {
        const double frac = static_cast<double>(d.peak_used_bytes) / d.total_bytes;
        if (frac >= 0.80)
            out.push_back("memory is near the limit (" + pct(frac) + " of " + mib(d.total_bytes) +
                          " MiB): `run.recompute: gelu` or `layernorm_gelu` trades FLOPs for "
                          "activations; a smaller `data.batch_size` with `run.grad_accum` keeps "
                          "the samples per update" +
                          (v.backend == "cuda" ? "; `run.offload: activations` and "
                                                 "`optim.offload: true` move activations and "
                                                 "AdamW moments to host memory."
                                               : ".") +
                          fewer_trainable_hint(v));
    }
    const MemoryRecord& m = v.memory;
    const size_t state = category_bytes(m.tracked_peak, MemoryCategory::grads) +
                         category_bytes(m.tracked_peak, MemoryCategory::optimizer);
    const std::string fewer = fewer_trainable_hint(v);
    if (m.tracked_peak_total > 0 && state * 2 >= m.tracked_peak_total && !fewer.empty())
        out.push_back("gradients and AdamW state hold " + mib(state) + " of the " +
                      mib(m.tracked_peak_total) + " MiB tracked (" +
                      pct(static_cast<double>(state) / m.tracked_peak_total) +
                      "): they scale with the parameters that train." + fewer);
    const std::string shape_jitter = v.config_value("data.seq_len_jitter");
    if (v.stats.jitter > kJitterWarnThreshold && !shape_jitter.empty() && shape_jitter != "0")
        out.push_back("high jitter (IQR/median " + pct(v.stats.jitter) +
                      ") caused by variable shapes: `data.seq_len_jitter: " + shape_jitter +
                      "` gives every batch its own length, and the step time follows it; fixed "
                      "shapes (`data.seq_len_jitter: 0`), or lengths bucketed to a few values, "
                      "make it steady.");
    else if (v.stats.jitter > kJitterWarnThreshold)
        out.push_back("high jitter (IQR/median " + pct(v.stats.jitter) +
                      "): more `run.warmup_steps`, fixed shapes, and check the data loader and "
                      "host syncs; other programs on the machine add noise too.");
}

}  // namespace

std::vector<std::string> suggestions_for(const VariantResult& v) {
    std::vector<std::string> out;
    if (!v.measured()) return out;
    const Shares s = shares_of(v);
    const double data = s.share(column(Phase::data)), h2d = s.share(column(Phase::h2d)),
                 fwd = s.share(column(Phase::forward)), bwd = s.share(column(Phase::backward));
    if (comm_is_bottleneck(v))
        out.push_back("communication-bound: the step waits " + pct(v.data_parallel->comm_share) +
                      " of its median time for communication; see *Communication (data "
                      "parallel)* above for what to change (overlap, bucket size, grad "
                      "accumulation).");
    if (data >= 0.20) out.push_back(data_suggestion(v, data));
    if (h2d >= 0.10)
        out.push_back("h2d takes " + pct(h2d) + " of the step: " +
                      (v.backend == "cuda"
                           ? std::string("`data.pin_memory: true` and prefetching overlap the "
                                         "copy; larger batches amortise it.")
                           : std::string("larger batches amortise the copy.")));
    if (fwd + bwd >= 0.50) out.push_back(compute_suggestion(v, fwd, bwd));
    add_step_overhead_suggestions(out, v, s);
    if (out.empty())
        out.push_back("no single phase dominates: the step is balanced; the largest is " +
                      phase_column_name(dominant(s)) + " (" + pct(s.share(dominant(s))) + ").");
    return out;
}

std::string render_report_md(const Results& results) {
    const Comparison cmp = build_comparison(results);
    const VariantResult* ref = reference_variant(results, cmp.baseline);
    std::ostringstream o;
    write_header(o, results, cmp);
    write_answers(o, ref, cmp);
    o << "\n## Comparison\n\n" << render_comparison_md(cmp);
    o << "\n<!-- charts -->\n";
    write_phase_table(o, results);
    write_throughput(o, results);
    write_memory_estimate_table(o, results);
    write_memory_peaks(o, results);
    write_kernels(o, results);
    write_communication(o, results);
    write_bottlenecks(o, results, ref, cmp.baseline);
    write_configuration(o, results);
    write_environment(o, results);
    return o.str();
}

std::string write_run_folder(const ExperimentResult& ex, const std::string& out_dir) {
    // Created exclusively and marked PARTIAL until every file is written (harness/run_folder.h).
    const std::string dir = create_run_folder(ex.name, out_dir);
    write_run_files(ex, dir);
    return dir;
}

}  // namespace mt

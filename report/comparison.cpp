// The comparison, the loss check and the comparison table (see comparison.h).
#include "report/comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "report/format.h"

namespace mt {

using nlohmann::json;
using namespace report_text;

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
    r.variant = v.name;
    r.status = v.status;
    r.message = v.message;
    r.diverged = v.diverged;
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
    r.tokens_per_step = static_cast<double>(v.batch.tokens_per_step);
    r.samples_per_step = static_cast<double>(v.batch.samples_per_step);
    r.init_from = v.config_value("model.init_from");
    r.mfu = v.flops.mfu;
    r.tracked_peak = static_cast<double>(v.memory.tracked_peak_total);
    r.device_peak = static_cast<double>(v.memory.device.peak_used_bytes);
    r.device_kind = v.memory.device.kind;
    r.final_loss = v.loss.final;
    r.mean_loss = v.loss.mean_measured;
    std::vector<std::pair<int, double>> round_and_ms;
    std::vector<std::array<double, 3>> round_wall_other;
    for (const StepRow& s : v.steps) {
        if (s.warmup) continue;
        if (std::isfinite(s.loss)) r.measured_losses.emplace_back(s.step, s.loss);
        round_and_ms.emplace_back(s.round, s.wall_ms);
        round_wall_other.push_back({double(s.round), s.wall_ms, s.other_cpu_ms});
    }
    // The tokens trained before each step (warm-up included), at the batches' real lengths;
    // step x the tokens per step where the steps' tokens are unknown (an older results.json).
    bool known = !v.steps.empty();
    for (const StepRow& s : v.steps) known = known && s.tokens > 0;
    double before = 0;
    for (const StepRow& s : v.steps) {
        r.tokens_before[s.step] = known ? before : s.step * r.tokens_per_step;
        before += s.tokens;
    }
    r.round_ms = round_medians(round_and_ms);
    r.round_load = round_loads(round_wall_other);
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
// `relative`: compare.loss_tolerance (nullopt: derive it).
void set_loss_tolerance(Comparison& c, const ComparisonRow& b, std::optional<double> relative) {
    c.loss_tolerance_nats.reset();
    c.loss_budget_given = false;
    if (!b.mean_loss || b.measured_losses.empty()) {
        c.loss_tolerance_basis = "no measured baseline loss";
        return;
    }
    const double scale = std::fabs(*b.mean_loss);
    if (relative) {
        c.loss_tolerance_nats = *relative * scale;
        c.loss_budget_given = true;
        c.loss_tolerance_basis =
            "compare.loss_tolerance " + pct(*relative) + " of the baseline's mean loss";
        return;
    }
    const auto& L = b.measured_losses;
    if (L.size() < 4) {
        c.loss_tolerance_nats = kFallbackRelativeTolerance * scale;
        c.loss_tolerance_basis =
            pct(kFallbackRelativeTolerance) +
            " of the baseline's mean loss (fewer than 4 measured steps: too few "
            "to measure its spread; set compare.loss_tolerance)";
        return;
    }
    std::vector<double> changes;
    for (size_t i = 1; i < L.size(); ++i) changes.push_back(L[i].second - L[i - 1].second);
    const double spread = robust_std(changes) / std::sqrt(2.0);
    const double floor = kSpreadFloorRelative * scale;
    c.loss_tolerance_nats = std::max(spread, floor);
    c.loss_tolerance_basis = spread >= floor
                                 ? "the baseline's step-to-step loss spread (robust std over " +
                                       std::to_string(L.size()) + " measured steps)"
                                 : "the floor " + f("%g", kSpreadFloorRelative) +
                                       " x the baseline's mean loss (its step-to-step spread is "
                                       "smaller)";
}

// Whether r's step does a different amount of work than b's (data.batch_size, run.grad_accum,
// data.seq_len, data.seq_len_jitter, the ranks): its steps are then not comparable one for one,
// only its tokens are (the time per token, the loss after as many tokens).
bool work_differs(const ComparisonRow& r, const ComparisonRow& b) {
    return r.tokens_per_step > 0 && b.tokens_per_step > 0 && r.tokens_per_step != b.tokens_per_step;
}

// The pairs (baseline loss, variant loss) the check compares. Equal steps: the same step number
// (same seed: the same batches). Equal tokens, for a variant whose step trains another number of
// tokens: its loss at step s, measured after the tokens of its steps before s, beside the
// baseline's loss after as many tokens, interpolated linearly between the baseline's two
// measured steps around it; variant steps outside the baseline's measured range have no partner.
std::vector<std::pair<double, double>> loss_pairs(const ComparisonRow& r, const ComparisonRow& b,
                                                  bool equal_tokens) {
    std::vector<std::pair<double, double>> pairs;
    if (!equal_tokens) {
        std::map<int, double> base(b.measured_losses.begin(), b.measured_losses.end());
        for (const auto& [step, loss] : r.measured_losses)
            if (const auto it = base.find(step); it != base.end())
                pairs.emplace_back(it->second, loss);
        return pairs;
    }
    std::vector<std::pair<double, double>> base;  // (tokens before, loss), in token order
    for (const auto& [step, loss] : b.measured_losses)
        base.emplace_back(b.tokens_before.at(step), loss);
    std::sort(base.begin(), base.end());
    for (const auto& [step, loss] : r.measured_losses) {
        const double x = r.tokens_before.at(step);
        for (size_t i = 0; i < base.size(); ++i) {
            const auto [x1, l1] = base[i];
            if (x1 < x) continue;
            if (x1 == x) {
                pairs.emplace_back(l1, loss);
            } else if (i > 0) {
                const auto [x0, l0] = base[i - 1];
                pairs.emplace_back(l0 + (x - x0) / (x1 - x0) * (l1 - l0), loss);
            }
            break;
        }
    }
    return pairs;
}

// delta_mean_loss, delta_final_loss, loss_within_tolerance and loss_compared_at of r against b,
// over the pairs loss_pairs() finds.
void check_loss(ComparisonRow& r, const ComparisonRow& b, std::optional<double> tol_nats) {
    const bool equal_tokens = work_differs(r, b);
    const auto pairs = loss_pairs(r, b, equal_tokens);
    if (pairs.empty()) return;
    double sum_b = 0, sum_r = 0;
    for (const auto& [base, mine] : pairs) sum_b += base, sum_r += mine;
    r.delta_final_loss = pairs.back().first - pairs.back().second;
    r.delta_mean_loss = (sum_b - sum_r) / static_cast<double>(pairs.size());
    r.loss_compared_at = equal_tokens ? "equal tokens" : "equal steps";
    if (tol_nats)
        r.loss_within_tolerance = std::fabs(*r.delta_mean_loss) <= *tol_nats &&
                                  std::fabs(*r.delta_final_loss) <= *tol_nats;
}

std::string loss_deltas_text(const ComparisonRow& r, std::optional<double> tol_nats) {
    const bool tokens = r.loss_compared_at == "equal tokens";
    return "mean loss " + signed_f("%.4f", -*r.delta_mean_loss) + ", final " +
           signed_f("%.4f", -*r.delta_final_loss) + " nats vs the baseline" +
           (tokens ? " at equal tokens" : "") + "; tolerance ±" + f("%.4f", tol_nats.value_or(0)) +
           " nats";
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
        if (r.diverged) v += " (diverged at step " + std::to_string(r.diverged->step) + ")";
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

// Each round's median step time over the tokens of a step: the round's time per token.
RoundMedians per_token(const RoundMedians& round_ms, double tokens_per_step) {
    RoundMedians out;
    for (const auto& [round, ms] : round_ms) out[round] = ms / tokens_per_step;
    return out;
}

// The time call of r against b (report/paired_stats.h): paired over the rounds of one run, or
// unpaired (`compare`: two runs). A variant that changes the work per step is called on its
// throughput: each side's round times per token (a per-variant constant scales every round, so
// the pairs and the load checks are unchanged), and the call says "per token".
void call_time(ComparisonRow& r, const ComparisonRow& b, const Comparison& c) {
    const bool per_work = work_differs(r, b);
    const RoundMedians base = per_work ? per_token(b.round_ms, b.tokens_per_step) : b.round_ms;
    const RoundMedians mine = per_work ? per_token(r.round_ms, r.tokens_per_step) : r.round_ms;
    const SpeedupInterval s =
        c.paired ? paired_speedup_interval(base, mine, &b.round_load, &r.round_load)
                 : unpaired_speedup_interval(base, mine);
    const TimeCallResult call = make_time_call(s, c.min_effect);
    r.time_call = call.call;
    r.speedup_ci95 = call.ci95;
    r.time_call_text = (per_work ? "per token " : "") + call.text;
    r.more_rounds = call.more_rounds;
}

// The knobs that change the model a variant trains (fewer trainable parameters, int8 storage):
// its speed or memory gain is bought with a different model, whose loss difference is the price.
constexpr const char* kModelChangingKnobs[] = {"model.lora", "optim.freeze",
                                               "model.quantize_frozen"};

// The model-changing knobs r sets, "model.lora, optim.freeze"; "" when none.
std::string model_knobs(const ComparisonRow& r) {
    std::string knobs;
    for (const char* k : kModelChangingKnobs)
        if (r.changed.find(std::string(k) + "=") != std::string::npos)
            knobs += (knobs.empty() ? "" : ", ") + std::string(k);
    return knobs;
}

// Appends to a measured row's verdict that it trains a different model, when it does and the
// verdict has not priced its loss already (a loss within tolerance, or none to compare): the
// loss difference is the price, and from random weights it says little.
void name_the_price(ComparisonRow& r, std::optional<double> tol) {
    const std::string knobs = model_knobs(r);
    if (knobs.empty() || (r.loss_within_tolerance && !*r.loss_within_tolerance)) return;
    r.verdict += "; it trains a different model (" + knobs +
                 "): the loss difference is the price of its gain" +
                 (r.loss_within_tolerance.value_or(false) ? " (" + loss_deltas_text(r, tol) + ")"
                                                          : std::string());
    if (r.init_from.empty())
        r.verdict +=
            ", and from random weights (no `model.init_from`) the loss says little about a "
            "fine-tune's quality";
}

// Deltas against the baseline: time (median, and the call), memory (tracked peak), noise, loss.
void measure_against(ComparisonRow& r, const ComparisonRow& b, const Comparison& c) {
    r.delta_time_ms = b.median_ms - r.median_ms;
    r.speedup = r.median_ms > 0 ? b.median_ms / r.median_ms : 0;
    r.delta_memory_bytes = b.tracked_peak - r.tracked_peak;
    const double noise = std::max(b.iqr_ms, r.iqr_ms);
    r.within_noise = std::fabs(*r.delta_time_ms) <= noise;
    call_time(r, b, c);
    check_loss(r, b, c.loss_tolerance_nats);
}

// keep / trade-off / reject from the time call and the memory and loss deltas (measure_against
// ran). Time counts only as called: `faster` / `slower` when the whole 95 % interval is beyond
// the minimal effect; `no difference` and `inconclusive` are no gain and no cost, never a point
// estimate inside the noise.
void judge_measured(ComparisonRow& r, const ComparisonRow& b, const Comparison& c) {
    const std::optional<double> tol = c.loss_tolerance_nats;
    const bool faster = r.time_call == TimeCall::faster;
    const bool slower = r.time_call == TimeCall::slower;
    // Tracked bytes are deterministic; count a change only above 1% of the baseline or 64 KiB.
    const double mem_eps = std::max(0.01 * b.tracked_peak, 64.0 * 1024.0);
    const bool leaner = *r.delta_memory_bytes > mem_eps;
    const bool fatter = *r.delta_memory_bytes < -mem_eps;
    const std::string& speed = r.time_call_text;  // "1.23x faster [1.18–1.27]"
    const std::string mem_gain = mib(*r.delta_memory_bytes) + " MiB less tracked memory";
    const std::string mem_cost = "costs +" + mib(-*r.delta_memory_bytes) + " MiB tracked memory";
    const std::string time_cost = "costs +" + f("%.2f", -*r.delta_time_ms) + " ms/step: " + speed;

    // The loss outside tolerance is a defect when the variant computes the same training another
    // way. When its step trains other work (another effective batch, shorter sequences) or it
    // trains another model (model_knobs), it is what the knob chose: a higher loss (at equal
    // tokens) is the price of its gain, a lower one a gain too.
    const bool loss_off = r.loss_within_tolerance && !*r.loss_within_tolerance;
    const std::string knobs = model_knobs(r);
    const bool other_curve = work_differs(r, b) || !knobs.empty();
    const bool loss_price = loss_off && other_curve && *r.delta_mean_loss < 0;
    const std::string loss_cost =
        "costs " + loss_deltas_text(r, tol) + " (" +
        (!knobs.empty() ? "it trains a different model: " + knobs + ")"
         : r.samples_per_step != b.samples_per_step
             ? f("%g", r.samples_per_step / b.samples_per_step) +
                   "x the samples per optimizer update)"
             : f("%.2f", r.tokens_per_step / b.tokens_per_step) + "x the tokens per step)");

    Decision d = Decision::reject;
    std::string v;
    if (r.diverged) {
        // engine/divergence.h: whatever its speed, a run that blows up is no candidate.
        v = "reject: diverged at step " + std::to_string(r.diverged->step) +
            " (engine/divergence.h: loss far above ln V and rising, or an exploding gradient "
            "norm)";
    } else if (loss_off && !other_curve) {
        v = "reject: loss not within tolerance: do not keep (" + loss_deltas_text(r, tol) + ")";
        if (faster) v += ", although " + speed;
    } else if (loss_price && c.loss_budget_given) {
        v = "reject: " + loss_cost + ", beyond the loss budget (compare.loss_tolerance)";
        if (faster) v += ", although " + speed;
    } else if (loss_price) {
        // Bought with loss: worth weighing only against a gain in time or memory.
        const bool gain = faster || (leaner && !slower);
        d = gain ? Decision::trade_off : Decision::reject;
        v = gain ? "trade-off: " +
                       (faster ? speed + (leaner ? ", and " + mem_gain : "")
                               : mem_gain + ", time: " + speed) +
                       (fatter ? ", " + mem_cost : "") + ", " + loss_cost
                 : "reject: " + (slower ? speed : "no measurable gain (time: " + speed + ")") +
                       ", and " + loss_cost;
    } else if (faster && !fatter) {
        d = Decision::keep;
        v = "keep: " + speed + (leaner ? ", and " + mem_gain : "");
    } else if (faster && fatter) {
        d = Decision::trade_off;
        v = "trade-off: " + speed + ", " + mem_cost;
    } else if (leaner && !slower) {
        d = Decision::keep;
        v = "keep: " + mem_gain + ", time: " + speed;
    } else if (leaner && slower) {
        d = Decision::trade_off;
        v = "trade-off: " + mem_gain + ", " + time_cost;
    } else if (slower) {
        v = "reject: " + speed + (fatter ? " and " + mem_cost : "");
    } else {
        v = "reject: no measurable gain (time: " + speed +
            std::string(fatter ? "; " + mem_cost : "; memory unchanged") + ")";
    }
    if (loss_off && other_curve && !loss_price)
        v += "; and a lower loss (" + loss_deltas_text(r, tol) + ")";
    if (!r.loss_within_tolerance)
        v += other_curve ? " (loss not comparable: at equal tokens its measured steps and the "
                           "baseline's do not overlap; measure more steps)"
                         : " (loss not comparable)";
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

// The time call says faster or slower (beyond compare.min_effect), not no difference or
// inconclusive.
bool called_a_difference(const ComparisonRow& r) {
    return r.time_call == TimeCall::faster || r.time_call == TimeCall::slower;
}

// The verdict of an A/A control (measure_against ran): nothing to keep or reject, only what the
// machine alone made of the same config. A time call of `faster` or `slower` is then the
// machine's, and it casts doubt on every call of that size in the run; a loss outside tolerance
// means the same config trained differently (the steps are deterministic for a seed).
void judge_aa_control(ComparisonRow& r, const Comparison& c) {
    std::string v = "n/a: an A/A control (the baseline's config), ";
    v += called_a_difference(r)
             ? "yet called " + r.time_call_text + ": the machine, not a knob, made this difference"
             : "so its time call is the machine's alone: " + r.time_call_text;
    if (r.loss_within_tolerance && !*r.loss_within_tolerance)
        v += "; its loss differs (" + loss_deltas_text(r, c.loss_tolerance_nats) +
             "): the same config trained differently";
    if (r.status == RunStatus::interrupted) v += " [interrupted: partial measurement]";
    set_verdict(r, Decision::not_applicable, v);
}

void judge(ComparisonRow& r, const ComparisonRow& b, const Comparison& c, bool baseline_present) {
    if (judge_unmeasurable(r, b, baseline_present)) return;
    measure_against(r, b, c);
    if (r.aa_control) return judge_aa_control(r, c);
    judge_measured(r, b, c);
    name_the_price(r, c.loss_tolerance_nats);
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
        if (r.aa_control && called_a_difference(r))
            c.notes.push_back("warning: the A/A control '" + r.variant + "' (the baseline's " +
                              "config) was called " + r.time_call_text +
                              ": the machine made that difference, so a call of that size on "
                              "another variant of this run may be the machine's too; rerun on a "
                              "quieter machine or with more rounds (run.rounds)");
        if (!r.jitter_cause.empty()) {
            c.notes.push_back(
                "shape jitter: '" + r.variant + "' sets " + r.jitter_cause +
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
        c.notes.push_back("warning: '" + r.variant + "' step times jitter " + pct(r.jitter) +
                          " (IQR/median > " + pct(kJitterWarnThreshold) +
                          "): its time call's interval is wider for it; more rounds "
                          "(run.rounds), more warm-up or measured steps, and a quiet machine, "
                          "help");
    }
    // Without two rounds there is no interval: every time call is inconclusive, so the verdicts
    // rest on memory and the loss check alone, and load changes between variants go unseen.
    if (c.rounds > 0 && c.rounds < kMinRoundsForInterval)
        c.notes.push_back("note: the measured steps were taken in " + std::to_string(c.rounds) +
                          " round: a time call needs at least " +
                          std::to_string(kMinRoundsForInterval) +
                          " (run.rounds; a data-parallel job always takes one: its ranks run "
                          "the variants one after another), so every time call is inconclusive "
                          "and no verdict rests on time");
    if (jittery && c.rounds < kMinRoundsForInterval)
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
    // Never an A/A control: two runs with one config may run different code (another commit)
    // or data, which is often the point of comparing them.
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
    std::vector<ComparisonRow> rows;
    int base = -1;
    for (size_t i = 0; i < results.variants.size(); ++i) {
        rows.push_back(row_from(results.variants[i]));
        if (rows.back().variant == c.baseline) base = static_cast<int>(i);
    }
    if (base < 0 && !rows.empty()) {
        c.notes.push_back("note: compare.baseline '" + c.baseline +
                          "' is not among the variants; the first variant is the baseline");
        base = 0;
        c.baseline = rows[0].variant;
    }
    if (base >= 0) {
        rows[base].is_baseline = true;
        // A/A controls, as the runner marked them against compare.baseline (not after a
        // fallback to another baseline).
        for (size_t i = 0; i < rows.size(); ++i)
            rows[i].aa_control = static_cast<int>(i) != base &&
                                 c.baseline == results.experiment.baseline &&
                                 results.variants[i].aa_control.value_or(false);
        std::rotate(rows.begin(), rows.begin() + base, rows.begin() + base + 1);
    }
    if (!rows.empty()) set_loss_tolerance(c, rows.front(), results.experiment.loss_tolerance);
    c.min_effect = results.experiment.min_effect;
    c.paired = true;
    c.rounds = rows.empty() ? 0 : static_cast<int>(rows.front().round_ms.size());
    for (ComparisonRow& r : rows) judge(r, rows.front(), c, base >= 0);
    c.rows = std::move(rows);
    add_notes(c);
    return c;
}

namespace {

// A results.json read back may have been edited: a step time <= 0 or a negative loss is no
// measurement (the trainer writes neither) and would make a speedup of 0x or infinity, so
// compare refuses it, naming the file, the variant and the step.
void check_measurements(const VariantResult& v, const std::string& label) {
    const std::string who = label + ": variant '" + v.name + "': ";
    const auto bad_time = [](double ms) { return !std::isfinite(ms) || ms <= 0; };
    for (const StepRow& s : v.steps) {
        const std::string step = "step " + std::to_string(s.step);
        if (bad_time(s.wall_ms))
            throw ReportError(who + step + ": wall_ms " + f("%g", s.wall_ms) +
                              ": expected a step time > 0 ms; the file was not written by a run "
                              "(or was edited): measure again");
        if (std::isfinite(s.loss) && s.loss < 0)
            throw ReportError(who + step + ": loss " + f("%g", s.loss) +
                              ": expected a cross-entropy loss >= 0; the file was not written by "
                              "a run (or was edited): measure again");
    }
    if (v.stats.step_ms.n > 0 && bad_time(v.stats.step_ms.median))
        throw ReportError(who + "stats.step_ms.median " + f("%g", v.stats.step_ms.median) +
                          ": expected a step time > 0 ms; measure again");
}

}  // namespace

Comparison compare_results(const Results& a, const std::string& a_label, const Results& b,
                           const std::string& b_label, const std::string& a_variant,
                           const std::string& b_variant) {
    Comparison c;
    const std::string want_a = a_variant.empty() ? a.experiment.baseline : a_variant;
    const VariantResult& va = find_variant(a, want_a, a_label);
    check_measurements(va, a_label);
    ComparisonRow base = row_from(va);
    if (!base.has_stats)
        throw ReportError(a_label + ": the baseline variant '" + want_a +
                          "' has no measured steps (status " + to_string(base.status) + ")");
    base.is_baseline = true;
    base.variant = "A:" + base.variant;
    base.changed = "(baseline: " + a_label + ")";
    c.baseline = base.variant;
    c.rows.push_back(base);
    for (const VariantResult& vb : b.variants) {
        if (!b_variant.empty() && vb.name != b_variant) continue;
        check_measurements(vb, b_label);
        ComparisonRow r = row_from(vb);
        r.variant = "B:" + vb.name;
        describe_config_difference(r, va, vb);
        note_shape_differences(c, r.variant, va, vb);
        c.rows.push_back(r);
    }
    if (c.rows.size() == 1)
        throw ReportError(b_label + (b_variant.empty() ? ": has no variants"
                                                       : ": no variant named '" + b_variant + "'"));
    set_loss_tolerance(c, c.rows.front(), a.experiment.loss_tolerance);
    c.min_effect = a.experiment.min_effect;
    c.paired = false;
    c.rounds = static_cast<int>(c.rows.front().round_ms.size());
    for (ComparisonRow& r : c.rows) judge(r, c.rows.front(), c, true);
    c.notes.push_back(
        "unpaired: A and B are two runs made at different times, so their rounds are not pairs; "
        "each time call is a Welch 95 % interval over the two runs' per-round median step times "
        "(log scale). It covers the noise within each run, not a change of the machine between "
        "the runs: compare variants of one run (paired rounds) where you can");
    add_notes(c);
    return c;
}

json load_results(const std::string& path) {
    json j = read_json_file(path);
    results_from_json(j, path);  // checks every key, throws ReportError naming it
    return j;
}

namespace {

// What the time call column means, for the legend under the table.
std::string time_call_legend(const Comparison& c) {
    const std::string m = f("%g", 100 * c.min_effect) + " %";
    std::string how;
    if (c.paired)
        how = "from the " + std::to_string(c.rounds) + " interleaved round" +
              (c.rounds == 1 ? "" : "s") +
              " of this run: per round, the log of the baseline's median step over the "
              "variant's; a t-interval on those paired log ratios; the point estimate is its "
              "centre";
    else
        how =
            "UNPAIRED (two runs, whose rounds are not pairs): a Welch t-interval on the two "
            "runs' log per-round median steps";
    return "Time call: the 95 % confidence interval of the speedup, " + how + ". *faster* / " +
           "*slower* when the whole interval is beyond ±" + m + " (compare.min_effect), *no " +
           "difference* when it lies within ±" + m + ", *inconclusive* when it straddles a " +
           "boundary; only a call counts in the verdict.";
}

}  // namespace

std::string render_comparison_md(const Comparison& c) {
    std::ostringstream o;
    o << "| Variant | Changed | Step ms (median) | p90 ms | Samples/s | Tokens/s | MFU | "
         "Peak tracked MiB | Peak device/RSS MiB | Loss final | Loss mean | Δtime ms (speedup) | "
         "Time call [95% CI] | Δmem MiB | Loss within tol. | Verdict |\n";
    o << "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|\n";
    auto cell = [](const std::string& s) {
        std::string out;
        for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
        return out;
    };
    for (const ComparisonRow& r : c.rows) {
        o << "| " << cell(r.variant)
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
            o << "0 (1.00x) | – | 0 | – | ";
        } else if (r.delta_time_ms) {
            o << signed_f("%.2f", *r.delta_time_ms) << " (" << f("%.2f", *r.speedup) << "x) | "
              << cell(r.time_call_text) << " | "
              << (*r.delta_memory_bytes == 0 ? std::string("0")
                                             : mib_or_bytes(*r.delta_memory_bytes, true))
              << " | "
              << (r.loss_within_tolerance ? (*r.loss_within_tolerance ? "yes" : "no") : "n/a")
              << " | ";
        } else {
            o << "– | – | – | – | ";
        }
        o << cell(r.verdict) << " |\n";
    }
    o << "\nΔ = baseline − variant: positive Δtime = the variant is faster, positive Δmem = it "
         "uses less tracked memory. Speedup = baseline median / variant median. "
      << time_call_legend(c)
      << " Loss within tolerance: over the measured steps both ran (at equal tokens for a "
         "variant whose step trains another number of tokens), |Δ mean loss| and |Δ loss of "
         "the last common step| ≤ "
      << (c.loss_tolerance_nats
              ? f("%.4f", *c.loss_tolerance_nats) + " nats (" + c.loss_tolerance_basis + ")"
              : std::string("n/a (") + c.loss_tolerance_basis + ")")
      << ". Samples/s, tokens/s and MFU: the measured steps' samples, tokens and FLOPs over their "
         "total "
         "time.\n";
    for (const std::string& n : c.notes) o << "\n- " << n;
    if (!c.notes.empty()) o << "\n";
    return o.str();
}

}  // namespace mt

// Report writers and the comparison, on hand-built results (no training): results.json fields
// and its typed schema (round trip, key-path errors, the stored comparison), steps.csv
// consistency, trace.json structure, report.md table and delta signs, verdicts, compare on two
// results files, error messages for bad files, atomic writes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "report/comparison.h"
#include "report/render.h"
#include "report/run_folder.h"
#include "report/step_files.h"
#include "report/suggestions.h"
#include "tests/hand_made_run.h"
#include "tests/test_util.h"

namespace mt {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& tag) {
    const fs::path d =
        fs::temp_directory_path() / ("mt_test_report_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// A measured run with the given step wall times (ms), constant loss and tracked peak (bytes).
HandMadeRun make_run(const std::string& name, const std::vector<double>& walls, double loss,
                     size_t peak, std::map<std::string, std::string> changed = {}) {
    HandMadeRun r;
    r.config.variant = name;
    r.config.changed = std::move(changed);
    r.config.data.batch_size = 4;
    r.config.data.seq_len = 64;
    r.config.run.warmup_steps = 2;
    r.config.run.measure_steps = static_cast<int>(walls.size());
    r.backend = "cpu";
    r.device_name = "CPU: Test (2 threads)";
    r.threads = 2;
    r.flops_per_step = 1e9;
    r.peak_flops = 100e9;
    r.peak_flops_source = "test";
    r.peaks.flops_per_s = 100e9;
    r.peaks.bytes_per_s = 10e9;
    r.peaks.flops_source = "test flops";
    r.peaks.bytes_source = "test bytes";
    r.estimate.params = peak / 4;
    r.estimate.activations = peak / 2;
    r.memory.tracked_peak_total = peak;
    r.memory.tracked_peak[static_cast<int>(MemoryCategory::params)] = peak / 4;
    r.memory.tracked_peak[static_cast<int>(MemoryCategory::activations)] = peak - peak / 4;
    r.memory.device_available = true;
    r.memory.device_kind = "RSS";
    r.memory.device_used_peak = peak * 2;
    r.memory.device_total = peak * 100;
    auto& fwd = r.memory.phases[static_cast<int>(Phase::forward)];
    fwd.seen = true;
    fwd.tracked_peak_total = peak;
    fwd.transient_peak = peak / 2;
    int step = 0;
    auto add = [&](double wall, bool warm) {
        StepRecord s;
        s.step = step++;
        s.warmup = warm;
        s.times.wall_ms = wall;
        s.times[Phase::data] = 0.1 * wall;
        s.times[Phase::h2d] = 0.01 * wall;
        s.times[Phase::forward] = 0.3 * wall;
        s.times[Phase::backward] = 0.45 * wall;
        s.times[Phase::optimizer] = 0.1 * wall;
        s.times[Phase::sync] = 0.02 * wall;
        s.loss = loss + 0.001 * s.step;
        s.grad_norm = 1.5;
        s.lr = 3e-4;
        r.steps.push_back(s);
    };
    add(walls.front() * 3, true);  // warm-up steps are slow and must not count
    add(walls.front() * 2, true);
    for (double w : walls) add(w, false);
    TraceStep ts;
    ts.step = 2;
    ts.wall_ms = walls.front();
    double t = 0;
    for (Phase p : kAllPhases) {
        ts.phases.push_back({p, 0, t, 0.1});
        t += 0.1;
    }
    ts.ops.push_back({"matmul_forward", 0.2, 0.05});
    r.trace.push_back(ts);
    return r;
}

HandMadeExperiment make_experiment() {
    HandMadeExperiment ex;
    ex.name = "unit";
    ex.source_path = "unit.yaml";
    ex.baseline = "baseline";
    ex.loss_tolerance = 0.02;
    ex.started_utc = "2026-01-01T00:00:00Z";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    // 2x faster, same memory: keep.
    ex.runs.push_back(
        make_run("fast", {5, 5.05, 4.95, 5, 5.02}, 5.0, 100 << 20, {{"optim.impl", "fused"}}));
    // Leaner but slower: trade-off.
    ex.runs.push_back(
        make_run("lean", {12, 12.1, 11.9, 12, 12.05}, 5.0, 60 << 20, {{"run.recompute", "gelu"}}));
    // Same speed within noise, loss off by 10%: reject.
    ex.runs.push_back(
        make_run("lossy", {10, 10.1, 9.9, 10, 10.05}, 5.5, 100 << 20, {{"optim.lr", "0.01"}}));
    // Two knobs at once.
    ex.runs.push_back(make_run("combo", {5, 5.05, 4.95, 5, 5.02}, 5.0, 100 << 20,
                               {{"optim.impl", "fused"}, {"kernels.classifier", "fused"}}));
    HandMadeRun skipped;
    skipped.config.variant = "gpu-only";
    skipped.status = RunStatus::skipped;
    skipped.message = "needs a GPU (run.precision bf16), and this machine has none";
    ex.runs.push_back(skipped);
    return ex;
}

// The lines of report.md's section that starts with `heading`, up to the next "## ".
std::string md_section(const std::string& md, const std::string& heading) {
    const size_t a = md.find(heading);
    if (a == std::string::npos) return "";
    const size_t b = md.find("\n## ", a + heading.size());
    return md.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

size_t occurrences(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
    return n;
}

const ComparisonRow& row(const Comparison& c, const std::string& name) {
    for (const auto& r : c.rows)
        if (r.variant == name) return r;
    throw std::runtime_error("no row " + name);
}

TEST(ResultsJson, HoldsSchemaEnvironmentAndEveryVariant) {
    const json j = results_to_json(make_experiment().results());
    EXPECT_EQ(j["schema_version"], kResultsSchemaVersion);
    EXPECT_EQ(j["experiment"]["name"], "unit");
    EXPECT_EQ(j["experiment"]["baseline"], "baseline");
    EXPECT_TRUE(j["environment"].contains("hardware_threads"));
    EXPECT_TRUE(j["environment"].contains("git_commit"));
    ASSERT_EQ(j["variants"].size(), 6u);
    const json& b = j["variants"][0];
    for (const char* key :
         {"name", "status", "config", "changed", "knobs_changed", "stats", "flops", "roofline",
          "loss", "memory", "kernels", "steps", "batch", "device_name", "threads"})
        EXPECT_TRUE(b.contains(key)) << key;
    EXPECT_EQ(b["measured_steps"], 5);
    EXPECT_EQ(b["steps"].size(), 7u);
    EXPECT_TRUE(b["steps"][0]["warmup"].get<bool>());
    EXPECT_FALSE(b["steps"][2]["warmup"].get<bool>());
    // Statistics cover measured steps only (warm-up steps are 20-30 ms).
    EXPECT_NEAR(b["stats"]["step_ms"]["median"].get<double>(), 10.0, 1e-9);
    EXPECT_NEAR(b["stats"]["step_ms"]["max"].get<double>(), 10.1, 1e-9);
    for (const char* p :
         {"data", "h2d", "forward", "backward", "comm", "optimizer", "sync", "other"})
        EXPECT_TRUE(b["stats"]["phases_ms"].contains(p)) << p;
    EXPECT_NEAR(b["stats"]["phases_ms"]["other"]["mean"].get<double>(),
                0.02 * b["stats"]["step_ms"]["mean"].get<double>(), 1e-9);
    // samples/s = B * grad_accum / mean step s (the samples over the total measured time, 50.05
    // ms for 5 steps); tokens/s = that * T.
    EXPECT_NEAR(b["stats"]["samples_per_s"].get<double>(), 4 / 0.01001, 1e-6);
    EXPECT_NEAR(b["stats"]["tokens_per_s"].get<double>(), 4 * 64 / 0.01001, 1e-6);
    EXPECT_NEAR(b["flops"]["mfu"].get<double>(), (1e9 / 0.01001) / 100e9, 1e-12);
    EXPECT_EQ(b["memory"]["tracked_peak_total"], 100 << 20);
    EXPECT_EQ(b["memory"]["peak_phase"], "forward");
    EXPECT_TRUE(b["config"].contains("optim.impl"));
    EXPECT_EQ(j["variants"][1]["changed"]["optim.impl"], "fused");
    EXPECT_EQ(j["variants"][4]["knobs_changed"], 2);
    EXPECT_EQ(j["variants"][5]["status"], "skipped");
    EXPECT_EQ(j["variants"][5]["measured_steps"], 0);
}

TEST(ResultsJson, NonFiniteLossIsNullNotInvalidJson) {
    HandMadeExperiment ex = make_experiment();
    ex.runs[0].steps.back().loss = std::nan("");
    const std::string text = results_to_json(ex.results()).dump();
    const json back = json::parse(text);  // must parse
    EXPECT_TRUE(back["variants"][0]["steps"].back()["loss"].is_null());
    EXPECT_TRUE(back["variants"][0]["loss"]["final"].is_null());
}

TEST(StepsCsv, IsConsistentWithResultsJson) {
    const HandMadeExperiment ex = make_experiment();
    const json j = results_to_json(ex.results());
    std::istringstream in(steps_csv(ex.results()));
    std::string header;
    std::getline(in, header);
    EXPECT_EQ(header,
              "variant,step,warmup,wall_ms,data_ms,h2d_ms,forward_ms,backward_ms,comm_ms,"
              "optimizer_ms,sync_ms,other_ms,loss,grad_norm,lr,comm_busy_ms,comm_bytes,tokens,"
              "other_cpu_ms,steal_ms");
    std::map<std::string, std::vector<std::vector<std::string>>> rows;
    for (std::string line; std::getline(in, line);) {
        std::vector<std::string> cells;
        std::stringstream ls(line);
        for (std::string c; std::getline(ls, c, ',');) cells.push_back(c);
        ASSERT_EQ(cells.size(), 20u) << line;
        rows[cells[0]].push_back(cells);
    }
    for (const json& v : j["variants"]) {
        const auto& rs = rows[v["name"].get<std::string>()];
        ASSERT_EQ(rs.size(), v["steps"].size()) << v["name"];
        for (size_t i = 0; i < rs.size(); ++i) {
            const json& s = v["steps"][i];
            EXPECT_EQ(std::stoi(rs[i][1]), s["step"].get<int>());
            EXPECT_EQ(rs[i][2] == "1", s["warmup"].get<bool>());
            EXPECT_NEAR(std::stod(rs[i][3]), s["wall_ms"].get<double>(), 1e-5);
            EXPECT_NEAR(std::stod(rs[i][6]), s["phases_ms"]["forward"].get<double>(), 1e-5);
            EXPECT_NEAR(std::stod(rs[i][11]), s["other_ms"].get<double>(), 1e-5);
            EXPECT_NEAR(std::stod(rs[i][12]), s["loss"].get<double>(), 1e-5);
        }
    }
}

TEST(TraceJson, IsChromeTraceFormatWithEveryPhase) {
    const json t = json::parse(trace_json(make_experiment().results()).dump());
    ASSERT_TRUE(t["traceEvents"].is_array());
    std::set<std::string> phases;
    bool has_op = false, has_step = false, has_meta = false;
    for (const json& e : t["traceEvents"]) {
        ASSERT_TRUE(e.contains("ph"));
        ASSERT_TRUE(e.contains("pid"));
        if (e["ph"] == "M") {
            has_meta = true;
            continue;
        }
        EXPECT_EQ(e["ph"], "X");
        EXPECT_TRUE(e["ts"].is_number());
        EXPECT_TRUE(e["dur"].is_number());
        EXPECT_GE(e["dur"].get<double>(), 0);
        if (e["cat"] == "phase") phases.insert(e["name"].get<std::string>());
        if (e["cat"] == "op") has_op = true;
        if (e["cat"] == "step") has_step = true;
    }
    for (Phase p : kAllPhases) EXPECT_TRUE(phases.count(to_string(p))) << to_string(p);
    EXPECT_TRUE(has_op);
    EXPECT_TRUE(has_step);
    EXPECT_TRUE(has_meta);
}

TEST(Comparison, DeltasAreBaselineMinusVariantAndVerdictsFollow) {
    const Comparison c = build_comparison(
        results_from_json(results_to_json(make_experiment().results()), "results"));
    ASSERT_EQ(c.rows.front().variant, "baseline");
    EXPECT_TRUE(c.rows.front().is_baseline);
    EXPECT_EQ(c.rows.front().verdict, "baseline");

    const ComparisonRow& fast = row(c, "fast");
    ASSERT_TRUE(fast.delta_time_ms.has_value());
    EXPECT_NEAR(*fast.delta_time_ms, 5.0, 1e-9);  // positive = variant faster
    EXPECT_NEAR(*fast.speedup, 2.0, 1e-9);
    EXPECT_FALSE(fast.within_noise);
    EXPECT_EQ(fast.loss_within_tolerance, true);
    EXPECT_EQ(fast.verdict.rfind("keep", 0), 0u) << fast.verdict;
    // Five rounds of one step each, every one twice as fast: called faster, the interval tight.
    EXPECT_EQ(fast.time_call, TimeCall::faster);
    ASSERT_TRUE(fast.speedup_ci95.has_value());
    EXPECT_LT(fast.speedup_ci95->first, 2.0);
    EXPECT_GT(fast.speedup_ci95->second, 2.0);
    EXPECT_EQ(fast.verdict.rfind("keep: 2.00x faster [", 0), 0u) << fast.verdict;

    const ComparisonRow& lean = row(c, "lean");
    EXPECT_LT(*lean.delta_time_ms, 0);                             // slower
    EXPECT_NEAR(*lean.delta_memory_bytes, 40.0 * (1 << 20), 1.0);  // positive = less memory
    EXPECT_EQ(lean.verdict.rfind("trade-off", 0), 0u) << lean.verdict;
    EXPECT_NE(lean.verdict.find("costs"), std::string::npos) << lean.verdict;
    EXPECT_EQ(lean.time_call, TimeCall::slower);
    EXPECT_NE(lean.verdict.find("0.83x slower ["), std::string::npos) << lean.verdict;
    EXPECT_FALSE(c.rows.front().time_call.has_value());  // the baseline has no call
    EXPECT_FALSE(c.rows.front().speedup_ci95.has_value());

    const ComparisonRow& lossy = row(c, "lossy");
    EXPECT_TRUE(lossy.within_noise);
    EXPECT_EQ(lossy.loss_within_tolerance, false);
    EXPECT_EQ(lossy.verdict.rfind("reject", 0), 0u) << lossy.verdict;
    EXPECT_NE(lossy.verdict.find("loss"), std::string::npos);

    const ComparisonRow& combo = row(c, "combo");
    EXPECT_NE(combo.verdict.find("changes 2 knobs: not attributable"), std::string::npos)
        << combo.verdict;

    const ComparisonRow& gpu = row(c, "gpu-only");
    EXPECT_FALSE(gpu.has_stats);
    EXPECT_NE(gpu.verdict.find("needs a GPU"), std::string::npos) << gpu.verdict;
}

// A variant the runner marked an A/A control (aa_control: the baseline's config) is neither kept
// nor rejected: its time call is the machine's. Called faster, it is named as the machine's
// doing, with a warning under the table; within noise it is shown as what the machine gives.
// The mark survives results.json.
TEST(Comparison, AnAAControlIsJudgedAsTheMachineNotAKnob) {
    HandMadeExperiment ex;
    ex.name = "aa";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 1 << 20));
    ex.runs.push_back(make_run("steady", {10.02, 10.08, 9.92, 10.01, 10.04}, 5.0, 1 << 20));
    ex.runs.push_back(make_run("drifted", {5, 5.05, 4.95, 5, 5.02}, 5.0, 1 << 20));
    ex.runs.push_back(
        make_run("knob", {5, 5.05, 4.95, 5, 5.02}, 5.0, 1 << 20, {{"optim.impl", "fused"}}));
    Results res = ex.results();
    res.variants[1].aa_control = true;
    res.variants[2].aa_control = true;
    res.variants[3].aa_control = false;
    const Comparison c = build_comparison(results_from_json(results_to_json(res), "results"));

    const ComparisonRow& steady = row(c, "steady");
    EXPECT_EQ(steady.decision, Decision::not_applicable);
    EXPECT_EQ(steady.verdict.rfind("n/a: an A/A control (the baseline's config), so its time call "
                                   "is the machine's alone: ",
                                   0),
              0u)
        << steady.verdict;

    const ComparisonRow& drifted = row(c, "drifted");
    EXPECT_EQ(drifted.decision, Decision::not_applicable);
    EXPECT_EQ(drifted.time_call, TimeCall::faster);
    EXPECT_NE(drifted.verdict.find("yet called 2.00x faster ["), std::string::npos)
        << drifted.verdict;
    EXPECT_NE(drifted.verdict.find("the machine, not a knob, made this difference"),
              std::string::npos)
        << drifted.verdict;
    int warnings = 0;
    for (const std::string& n : c.notes)
        warnings += n.rfind(
                        "warning: the A/A control 'drifted' (the baseline's config) was called "
                        "2.00x faster [",
                        0) == 0;
    EXPECT_EQ(warnings, 1);

    // The same measurements with a knob changed: kept, as before.
    EXPECT_EQ(row(c, "knob").verdict.rfind("keep: 2.00x faster [", 0), 0u)
        << row(c, "knob").verdict;
}

TEST(Comparison, SmallDeltaInsideTheSpreadIsWithinNoise) {
    HandMadeExperiment ex;
    ex.name = "noise";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {9, 10, 11, 10, 12, 8}, 5.0, 1 << 20));
    ex.runs.push_back(make_run("tiny-gain", {8.8, 9.8, 10.8, 9.8, 11.8, 7.8}, 5.0, 1 << 20));
    const Comparison c =
        build_comparison(results_from_json(results_to_json(ex.results()), "results"));
    const ComparisonRow& r = row(c, "tiny-gain");
    EXPECT_GT(*r.delta_time_ms, 0);
    EXPECT_TRUE(r.within_noise);
    EXPECT_EQ(r.verdict.find("keep"), std::string::npos) << r.verdict;  // not called a win
    // The verdict comes from the time call: a consistent 2 % gain per round sits on the
    // compare.min_effect boundary (2 %), so the interval straddles it.
    EXPECT_EQ(r.time_call, TimeCall::inconclusive);
    EXPECT_NE(r.verdict.find("time: inconclusive ["), std::string::npos) << r.verdict;
}

// Time enters a verdict only through the call: a leaner variant whose time shows no difference
// is kept, and says so.
TEST(Comparison, LeanerWithNoTimeDifferenceIsKeptOnItsCall) {
    HandMadeExperiment ex;
    ex.name = "lean";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("lean", {10.01, 10.09, 9.91, 10.02, 10.04}, 5.0, 60 << 20,
                               {{"run.recompute", "gelu"}}));
    const Comparison c = build_comparison(ex.results());
    const ComparisonRow& r = row(c, "lean");
    EXPECT_EQ(r.time_call, TimeCall::no_difference);
    EXPECT_EQ(r.decision, Decision::keep);
    EXPECT_EQ(r.verdict.rfind("keep: 40.0 MiB less tracked memory, time: 1.00x no difference [", 0),
              0u)
        << r.verdict;
}

// With one round (today's runner without run.rounds) there is no interval: every time call is
// inconclusive and says so, speedup_ci95 is null, and a note says no verdict rests on time;
// memory and the loss check still decide.
TEST(Comparison, OneRoundGivesNoIntervalAndNoVerdictOnTime) {
    HandMadeExperiment ex = make_experiment();
    ex.rounds = 1;
    const Results res = ex.results();
    const Comparison& c = res.comparison;
    const ComparisonRow& fast = row(c, "fast");
    EXPECT_EQ(fast.time_call, TimeCall::inconclusive);
    EXPECT_FALSE(fast.speedup_ci95.has_value());
    EXPECT_EQ(fast.decision, Decision::reject);  // 2x by its medians, but no call: no gain shown
    EXPECT_NE(fast.verdict.find("inconclusive: 1 paired round, an interval needs at least 2"),
              std::string::npos)
        << fast.verdict;
    const ComparisonRow& lean = row(c, "lean");
    EXPECT_EQ(lean.decision, Decision::keep);  // its memory is exact: 40 MiB less
    EXPECT_EQ(row(c, "lossy").decision, Decision::reject);
    bool noted = false;
    for (const std::string& n : c.notes) noted |= n.find("taken in 1 round") != std::string::npos;
    EXPECT_TRUE(noted);
    EXPECT_TRUE(results_to_json(res)["comparison"]["variants"][1]["speedup_ci95"].is_null());
}

// run.grad_accum: 4 does four times the work per step: its steps are 35 % longer, its tokens
// 2.96x faster. The call is made on the time per token, and says so.
TEST(Comparison, AKnobThatChangesTheWorkPerStepIsCalledOnItsTimePerToken) {
    HandMadeExperiment ex;
    ex.name = "accum";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    HandMadeRun accum = make_run("accum-4", {13.5, 13.6, 13.4, 13.5, 13.55}, 5.0, 100 << 20,
                                 {{"run.grad_accum", "4"}});
    accum.config.run.grad_accum = 4;
    ex.runs.push_back(accum);
    const Results res = ex.results();
    const ComparisonRow& r = row(res.comparison, "accum-4");
    EXPECT_LT(*r.speedup, 1);  // per step it is slower
    EXPECT_EQ(r.time_call, TimeCall::faster);
    EXPECT_EQ(r.decision, Decision::keep);
    EXPECT_EQ(r.verdict.rfind("keep: per token 2.96x faster [", 0), 0u) << r.verdict;
}

// The loss curves of run.grad_accum: 4 against the baseline, per step s (2 warm-up steps, 20
// measured): the baseline loses 0.05 nats per optimizer update, the accumulating variant 0.06
// (four times the samples per update). At equal steps the variant's loss is lower; at equal
// samples (its step s beside the baseline's step 4s) it is 0.14 s nats higher: fewer updates.
HandMadeExperiment accumulation_experiment(double variant_slope) {
    HandMadeExperiment ex;
    ex.name = "accum";
    ex.baseline = "baseline";
    const std::vector<double> base_walls(20, 10.0), accum_walls(20, 13.5);
    ex.runs.push_back(make_run("baseline", base_walls, 5.0, 100 << 20));
    HandMadeRun accum = make_run("accum-4", accum_walls, 5.0, 100 << 20, {{"run.grad_accum", "4"}});
    accum.config.run.grad_accum = 4;
    ex.runs.push_back(accum);
    for (StepRecord& s : ex.runs[0].steps) s.loss = 5.0 - 0.05 * s.step;
    for (StepRecord& s : ex.runs[1].steps) s.loss = 5.0 - variant_slope * s.step;
    return ex;
}

// Another effective batch follows another loss curve by design: compared step for step, a
// correct run.grad_accum: 4 was rejected for a loss "not within tolerance" although its loss is
// the LOWER one. Its loss is compared at equal tokens (here: equal samples), where it is higher:
// the price of its throughput, named in a trade-off.
TEST(Comparison, AccumulationIsJudgedOnItsLossAtEqualTokensAsThePriceOfItsThroughput) {
    const Results res = accumulation_experiment(0.06).results();
    const ComparisonRow& r = row(res.comparison, "accum-4");
    EXPECT_EQ(r.loss_compared_at, "equal tokens");
    // Variant steps 2..5 (8..20 samples x 4) lie within the baseline's measured 2..21.
    EXPECT_NEAR(*r.delta_final_loss, -0.14 * 5, 1e-9);
    EXPECT_NEAR(*r.delta_mean_loss, -0.14 * 3.5, 1e-9);
    EXPECT_EQ(r.loss_within_tolerance, false);
    EXPECT_EQ(r.decision, Decision::trade_off);
    EXPECT_EQ(r.verdict.rfind("trade-off: per token 2.96x faster [", 0), 0u) << r.verdict;
    EXPECT_NE(r.verdict.find("costs mean loss +0.4900, final +0.7000 nats vs the baseline at equal "
                             "tokens; tolerance"),
              std::string::npos)
        << r.verdict;
    EXPECT_NE(r.verdict.find("(4x the samples per optimizer update)"), std::string::npos)
        << r.verdict;
    EXPECT_EQ(results_to_json(res)["comparison"]["variants"][1]["loss_compared_at"],
              "equal tokens");
}

// An accumulating variant whose loss is lower even at equal tokens pays nothing in loss: it is
// kept on its throughput, the lower loss named.
TEST(Comparison, AccumulationWithALowerLossAtEqualTokensIsKept) {
    const ComparisonRow r = row(accumulation_experiment(0.25).results().comparison, "accum-4");
    EXPECT_GT(*r.delta_mean_loss, 0);
    EXPECT_EQ(r.decision, Decision::keep);
    EXPECT_NE(r.verdict.find("; and a lower loss (mean loss -"), std::string::npos) << r.verdict;
}

// data.seq_len_jitter trains half the tokens per step (the same samples, shorter): its loss was
// judged step for step and rejected as "not within tolerance: do not keep". Compared at equal
// tokens (its step s beside the baseline's step s/2) it is 0.005 s nats higher: a price, named
// with the work ratio, beside a time call made per token.
TEST(Comparison, AShorterSequenceVariantIsComparedAtEqualTokens) {
    HandMadeExperiment ex = accumulation_experiment(0.02);
    HandMadeRun& jitter = ex.runs[1];
    jitter.config.variant = "jitter-50";
    jitter.config.changed = {{"data.seq_len_jitter", "0.5"}};
    jitter.config.run.grad_accum = 1;
    jitter.config.data.seq_len_jitter = 0.5;
    for (StepRecord& st : jitter.steps) st.tokens = 128, st.times.wall_ms = 6;
    for (StepRecord& st : ex.runs[0].steps) st.loss = 5.0 - 0.05 * st.step;
    const ComparisonRow r = row(ex.results().comparison, "jitter-50");
    EXPECT_EQ(r.loss_compared_at, "equal tokens");
    // Variant steps 4..21 (512..2688 tokens before them) lie within the baseline's 512..5376.
    EXPECT_NEAR(*r.delta_mean_loss, -0.005 * 12.5, 1e-9);
    EXPECT_EQ(r.verdict.find("loss not within tolerance"), std::string::npos) << r.verdict;
    EXPECT_EQ(r.verdict.rfind("reject: per token 0.83x slower [", 0), 0u) << r.verdict;
    EXPECT_NE(r.verdict.find("at equal tokens; tolerance"), std::string::npos) << r.verdict;
    EXPECT_NE(r.verdict.find("(0.50x the tokens per step)"), std::string::npos) << r.verdict;
}

// A variant that computes the same training (same samples per update) is still compared step
// for step, and a loss off the baseline's is still a defect.
TEST(Comparison, AVariantWithTheSameBatchIsComparedAtEqualSteps) {
    HandMadeExperiment ex = accumulation_experiment(0.06);
    ex.runs[1].config.run.grad_accum = 1;
    const ComparisonRow r = row(ex.results().comparison, "accum-4");
    EXPECT_EQ(r.loss_compared_at, "equal steps");
    EXPECT_EQ(r.decision, Decision::reject);
    EXPECT_EQ(r.verdict.rfind("reject: loss not within tolerance: do not keep", 0), 0u)
        << r.verdict;
}

// LoRA trains a different model: whatever its time, the verdict names the loss as the price.
TEST(Comparison, AKnobThatChangesTheModelNamesTheLossAsThePrice) {
    HandMadeExperiment ex;
    ex.name = "lora";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("lora", {5, 5.05, 4.95, 5, 5.02}, 5.0, 100 << 20,
                               {{"model.lora", "{rank: 8, alpha: 16}"}}));
    const Results res = ex.results();
    const ComparisonRow& r = row(res.comparison, "lora");
    EXPECT_EQ(r.decision, Decision::keep);
    EXPECT_NE(r.verdict.find("; it trains a different model (model.lora): the loss difference is "
                             "the price of its gain (mean loss "),
              std::string::npos)
        << r.verdict;
    EXPECT_EQ(row(res.comparison, "baseline").verdict.find("different model"), std::string::npos);
}

// LoRA faster but with a loss beyond the tolerance: its loss is the price of its speed, so a
// trade-off naming the cost, not "reject: loss not within tolerance: do not keep ..., although
// 1.40x faster; it trains a different model" (a verdict against itself). Started from trained
// weights (model.init_from), the random-start caveat is left out.
TEST(Comparison, AModelChangingKnobWhoseLossRisesIsATradeOffNamingTheCost) {
    HandMadeExperiment ex;
    ex.name = "lora";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("lora", {5, 5.05, 4.95, 5, 5.02}, 5.3, 100 << 20,
                               {{"model.lora", "{rank: 8, alpha: 16}"}}));
    Results res = ex.results();
    ComparisonRow r = row(res.comparison, "lora");
    EXPECT_EQ(r.decision, Decision::trade_off);
    EXPECT_EQ(r.verdict.rfind("trade-off: 2.00x faster [", 0), 0u) << r.verdict;
    EXPECT_NE(r.verdict.find(", costs mean loss +0.3000, final +0.3000 nats vs the baseline; "
                             "tolerance"),
              std::string::npos)
        << r.verdict;
    EXPECT_NE(r.verdict.find("(it trains a different model: model.lora)"), std::string::npos)
        << r.verdict;
    EXPECT_EQ(r.verdict.find("loss not within tolerance"), std::string::npos) << r.verdict;

    // Within tolerance, from trained weights: the price is named, the random-start caveat not.
    res.variants[1] = ex.runs[1].record();
    for (StepRow& st : res.variants[1].steps) st.loss -= 0.3;
    for (VariantResult& v : res.variants) v.config["model.init_from"] = "runs/base/checkpoints";
    r = row(build_comparison(res), "lora");
    EXPECT_NE(r.verdict.find("the loss difference is the price of its gain (mean loss"),
              std::string::npos)
        << r.verdict;
    EXPECT_EQ(r.verdict.find("random weights"), std::string::npos) << r.verdict;
    res.variants[1].config["model.init_from"] = "";
    EXPECT_NE(row(build_comparison(res), "lora").verdict.find("from random weights"),
              std::string::npos);
}

// compare.loss_tolerance given is the user's loss budget: a LoRA variant whose loss costs more
// than the budget is rejected, however fast, and the verdict says it is the budget.
TEST(Comparison, ALossBeyondAGivenBudgetIsRejectedHoweverFast) {
    HandMadeExperiment ex;
    ex.name = "lora";
    ex.baseline = "baseline";
    ex.loss_tolerance = 0.05;  // 5 % of the baseline's mean loss: 0.25 nats
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("lora", {5, 5.05, 4.95, 5, 5.02}, 5.3, 100 << 20,
                               {{"model.lora", "{rank: 8, alpha: 16}"}}));
    const ComparisonRow r = row(ex.results().comparison, "lora");
    EXPECT_EQ(r.decision, Decision::reject);
    EXPECT_EQ(r.verdict.rfind("reject: costs mean loss +0.3000, final +0.3000 nats vs the "
                              "baseline; tolerance ±0.2502 nats (it trains a different model: "
                              "model.lora), beyond the loss budget (compare.loss_tolerance), "
                              "although 2.00x faster [",
                              0),
              0u)
        << r.verdict;
}

// A sample cache adds 14,094 tracked bytes: the table shows them, not "0.0" MiB and a Δ of 0.
TEST(ReportMd, ASmallMemoryChangeIsShownInBytesNotRoundedToZero) {
    HandMadeExperiment ex;
    ex.name = "cache";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    HandMadeRun cache = make_run("cache", {10, 10.1, 9.9, 10, 10.05}, 5.0, (100 << 20) + 14094,
                                 {{"data.cache", "true"}});
    cache.memory.tracked_peak[static_cast<int>(MemoryCategory::data)] = 14094;
    ex.runs.push_back(cache);
    const std::string md = render_report_md(ex.results());
    // The memory table's block of `cache` (its later rows leave the variant column empty).
    const size_t block = md.find("| cache | params |");
    ASSERT_NE(block, std::string::npos) << md;
    EXPECT_NE(md.find("| data | 0.0 | 14094 B | +14094 B |", block), std::string::npos) << md;
    const std::string table = md_section(md, "## Comparison");
    EXPECT_NE(table.find(" | -14094 B | "), std::string::npos) << table;
}

// A CPU variant's process peak RSS says how much of it sat on 2 MiB pages: the kernel grants them
// as free memory allows, so the same config may peak lower on another run, by at most that.
TEST(ReportMd, APeakRssPartlyOnHugePagesSaysAnotherRunMayPeakLowerByAtMostThat) {
    HandMadeExperiment ex;
    ex.name = "rss";
    ex.baseline = "baseline";
    HandMadeRun base = make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20);
    base.memory.process_peak_rss = size_t{103} << 20;
    base.memory.process_huge_page_bytes = size_t{2} << 20;
    HandMadeRun none =
        make_run("none", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20, {{"optim.impl", "fused"}});
    none.memory.process_peak_rss = size_t{101} << 20;
    none.memory.process_huge_page_bytes = 0;
    ex.runs.push_back(base);
    ex.runs.push_back(none);
    const std::string md = render_report_md(ex.results());
    const size_t b = md.find("- `baseline`: ");
    const size_t n = md.find("- `none`: ");
    ASSERT_NE(b, std::string::npos) << md;
    ASSERT_NE(n, std::string::npos) << md;
    const std::string base_line = md.substr(b, md.find('\n', b) - b);
    const std::string none_line = md.substr(n, md.find('\n', n) - n);
    EXPECT_CONTAINS(base_line,
                    "process peak RSS (since its setup) 103.0 MiB, 2.0 MiB of it on "
                    "2 MiB pages at the end");
    EXPECT_CONTAINS(base_line,
                    "where it grants fewer, the same config peaks lower, by at most that)");
    EXPECT_CONTAINS(none_line, "process peak RSS (since its setup) 101.0 MiB");
    EXPECT_EQ(none_line.find("2 MiB pages"), std::string::npos) << none_line;
    // results.json keeps the figure, and leaves the key out where the kernel did not say.
    ex.runs[1].memory.process_huge_page_bytes.reset();
    const json j = results_to_json(ex.results());
    EXPECT_EQ(j["variants"][0]["memory"]["process_huge_page_bytes"], 2 << 20);
    EXPECT_FALSE(j["variants"][1]["memory"].contains("process_huge_page_bytes"));
    const Results back = results_from_json(j, "results.json");
    EXPECT_EQ(back.variants[0].memory.process_huge_page_bytes, size_t{2} << 20);
    EXPECT_FALSE(back.variants[1].memory.process_huge_page_bytes.has_value());
}

// run.cuda_graph: a replayed step's device work is one phase, its forward; the knob is in the
// variant's config (results.json and the report) and the phase table and the bottleneck section
// say what the phases mean under it.
TEST(ReportMd, ACudaGraphVariantSaysItsForwardIsTheWholeReplay) {
    HandMadeExperiment ex;
    ex.name = "graph";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    HandMadeRun graph =
        make_run("graph", {8, 8.1, 7.9, 8, 8.05}, 5.0, 100 << 20, {{"run.cuda_graph", "true"}});
    graph.config.run.cuda_graph = true;
    ex.runs.push_back(graph);
    const Results res = ex.results();
    const json j = results_to_json(res);
    EXPECT_EQ(j["variants"][0]["config"]["run.cuda_graph"], "false");
    EXPECT_EQ(j["variants"][1]["config"]["run.cuda_graph"], "true");
    EXPECT_EQ(j["variants"][1]["changed"]["run.cuda_graph"], "true");
    const std::string md = render_report_md(res);
    const std::string phases = md_section(md, "## Phase breakdown");
    EXPECT_NE(phases.find("`graph` (`run.cuda_graph: true`): its `forward` is the whole graph "
                          "replay — forward, backward and optimizer of every micro-step"),
              std::string::npos)
        << phases;
    EXPECT_EQ(phases.find("`baseline` (`run.cuda_graph"), std::string::npos) << phases;
    const std::string next = md_section(md, "## Bottleneck and next steps");
    EXPECT_NE(next.find("- `run.cuda_graph: true`: its `forward` is the whole graph replay"),
              std::string::npos)
        << next;
    EXPECT_NE(md.find("| run.cuda_graph |"), std::string::npos);
}

TEST(ReportMd, HasTheTableDeltasWithSignsAndTheAnswers) {
    const std::string md = render_report_md(make_experiment().results());
    for (const char* s :
         {"| Variant | Changed | Step ms (median) | p90 ms | Samples/s | Tokens/s | MFU |",
          "## Answers", "Where is the step slow?", "Where does memory peak?",
          "Is the change worth keeping?", "## Phase breakdown", "## Memory",
          "## Bottleneck and next steps", "## Effective configuration",
          "| fast | optim.impl=fused | 5.00 |", "+5.00 (2.00x)", "-2.00 (0.83x)", "+40.0",
          "changes 2 knobs", "needs a GPU",
          "Model FLOPs per token: 6 N + 6 L C T, as llm.c counts them"})
        EXPECT_NE(md.find(s), std::string::npos) << "missing: " << s << "\n" << md;
    EXPECT_NE(md.find("dominant phase: **backward**"), std::string::npos);
}

TEST(Suggestions, FollowTheDominantPhase) {
    HandMadeExperiment ex;
    ex.name = "s";
    ex.baseline = "b";
    HandMadeRun r = make_run("b", {10, 10, 10}, 5.0, 1 << 20);
    for (auto& s : r.steps) {  // make it data-bound
        s.times[Phase::data] = 0.6 * s.times.wall_ms;
        s.times[Phase::forward] = 0.1 * s.times.wall_ms;
        s.times[Phase::backward] = 0.1 * s.times.wall_ms;
    }
    r.config.optim.impl = AdamWImpl::unfused;
    ex.runs.push_back(r);
    const auto sug = suggestions_for(ex.results().variants[0]);
    std::string all;
    for (const auto& s : sug) all += s + "\n";
    EXPECT_NE(all.find("data-bound"), std::string::npos) << all;
    EXPECT_NE(all.find("data.workers"), std::string::npos) << all;
    EXPECT_EQ(all.find("compute in the model dominates"), std::string::npos) << all;
}

// An optimizer-bound step whose gradients and AdamW state hold most of the memory: the report
// suggests training fewer parameters (LoRA, freeze), then int8 storage once they are frozen.
TEST(Suggestions, OptimizerBoundFullTrainingSuggestsLoraOrFreezeThenInt8) {
    auto suggestions = [](const std::function<void(RunConfig&)>& set) {
        HandMadeExperiment ex;
        ex.name = "s";
        ex.baseline = "b";
        HandMadeRun r = make_run("b", {10, 10, 10}, 5.0, 1 << 20);
        for (auto& s : r.steps) {
            s.times[Phase::optimizer] = 0.4 * s.times.wall_ms;
            s.times[Phase::backward] = 0.25 * s.times.wall_ms;
        }
        r.memory.tracked_peak[static_cast<int>(MemoryCategory::optimizer)] = 600000;
        r.memory.tracked_peak[static_cast<int>(MemoryCategory::activations)] = 0;
        set(r.config);
        ex.runs.push_back(r);
        std::string all;
        for (const auto& s : suggestions_for(ex.results().variants[0])) all += s + "\n";
        return all;
    };
    const std::string full = suggestions([](RunConfig& c) { c.optim.impl = AdamWImpl::fused; });
    EXPECT_NE(full.find("the fused optimizer still takes 40.0%"), std::string::npos) << full;
    EXPECT_NE(full.find("`model.lora: {rank: 8, alpha: 16}` trains adapters only"),
              std::string::npos)
        << full;
    EXPECT_NE(full.find("gradients and AdamW state hold"), std::string::npos) << full;
    const std::string frozen = suggestions([](RunConfig& c) {
        c.optim.impl = AdamWImpl::fused;
        c.trainable.freeze = {"h.0"};
    });
    EXPECT_EQ(frozen.find("model.lora: {rank"), std::string::npos) << frozen;
    EXPECT_NE(frozen.find("`model.quantize_frozen: int8`"), std::string::npos) << frozen;
}

TEST(Suggestions, NameTheOffloadKnobsTheirCost) {
    HandMadeExperiment ex;
    ex.name = "s";
    ex.baseline = "b";
    HandMadeRun r = make_run("b", {10, 10, 10}, 5.0, 1 << 20);
    for (auto& s : r.steps) {  // optimizer-bound, as a host AdamW makes a step
        s.times[Phase::optimizer] = 0.4 * s.times.wall_ms;
        s.times[Phase::forward] = 0.25 * s.times.wall_ms;
        s.times[Phase::backward] = 0.25 * s.times.wall_ms;
    }
    r.backend = "cuda";
    r.config.optim.offload = true;
    r.config.run.offload = OffloadMode::activations;
    ex.runs.push_back(r);
    std::string all;
    for (const auto& s : suggestions_for(ex.results().variants[0])) all += s + "\n";
    EXPECT_NE(all.find("with `optim.offload: true`: AdamW runs on the host"), std::string::npos)
        << all;
    EXPECT_NE(all.find("`run.offload: none` if memory allows"), std::string::npos) << all;
}

// ---- the suggestion rules (report/suggestions.h) ----------------------------------------------

// The rules that fire for one hand-made variant: `edit` shapes its measurements, `after` its
// record (the per-op table the profiler would have filled).
std::set<std::string> rules_fired(const std::function<void(HandMadeRun&)>& edit,
                                  const std::function<void(VariantResult&)>& after = {}) {
    HandMadeExperiment ex;
    ex.name = "s";
    ex.baseline = "b";
    HandMadeRun r = make_run("b", {10, 10, 10}, 5.0, 1 << 20);
    edit(r);
    ex.runs.push_back(r);
    VariantResult v = ex.results().variants[0];
    if (after) after(v);
    std::set<std::string> out;
    for (const Suggestion& s : suggestions_of(v)) out.insert(s.rule);
    return out;
}

// Every measured step's phases as these fractions of its wall time.
void set_shares(HandMadeRun& r, std::map<Phase, double> shares) {
    for (StepRecord& s : r.steps) {
        for (Phase p : kAllPhases) s.times[p] = 0;
        for (const auto& [p, share] : shares) s.times[p] = share * s.times.wall_ms;
    }
}

// A host-bound step on CUDA is pointed at run.cuda_graph (one launch for the step), unless it
// already replays a graph; a CPU step is not (it has no graphs).
TEST(Suggestions, AHostBoundCudaStepSuggestsACudaGraph) {
    auto suggestions_for = [](const std::string& backend, bool graph) {
        HandMadeExperiment ex;
        ex.name = "host";
        ex.baseline = "baseline";
        HandMadeRun r = make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20);
        r.backend = backend;
        r.config.run.cuda_graph = graph;
        set_shares(r, {{Phase::sync, 0.3}, {Phase::forward, 0.7}});
        ex.runs.push_back(r);
        const VariantResult v = ex.results().variants[0];
        for (const Suggestion& s : suggestions_of(v))
            if (s.rule == "host-overhead") return s.text;
        return std::string("(no host-overhead suggestion)");
    };
    const std::string hint = "`run.cuda_graph: true`";
    const std::string cuda = suggestions_for("cuda", false);
    EXPECT_NE(cuda.find("host waits and overhead take"), std::string::npos) << cuda;
    EXPECT_NE(cuda.find(hint), std::string::npos) << cuda;
    const std::string replayed = suggestions_for("cuda", true), cpu = suggestions_for("cpu", false);
    EXPECT_NE(replayed.find("host waits and overhead take"), std::string::npos) << replayed;
    EXPECT_EQ(replayed.find(hint), std::string::npos) << replayed;
    EXPECT_NE(cpu.find("host waits and overhead take"), std::string::npos) << cpu;
    EXPECT_EQ(cpu.find(hint), std::string::npos) << cpu;
}

KernelRecord top_op(const char* name, const char* impl, Bound bound, double pct_of_roofline) {
    KernelRecord k;
    k.name = name;
    k.impl = impl;
    k.calls = 4;
    k.pct_of_step = 40;
    k.bound = bound;
    k.pct_of_roofline = pct_of_roofline;
    return k;
}

// The per-op table's "limited by" reads the measured fraction of the roofline as well as the
// intensity: the naive matmul at 1 % of its compute roofline is latency-limited (it said
// "compute", the same as a GEMM at 80 %).
TEST(ReportMd, TheKernelTableSaysWhatTheMeasuredRooflineFractionSays) {
    Results res = make_experiment().results();
    res.variants[0].kernels = {top_op("matmul_backward", "naive", Bound::compute, 1),
                               top_op("matmul_forward", "packed", Bound::compute, 80)};
    const std::string md = render_report_md(res);
    EXPECT_NE(md.find("| FLOP/byte | limited by | % of roofline |"), std::string::npos);
    EXPECT_NE(md.find("| matmul_backward | naive |"), std::string::npos) << md;
    EXPECT_NE(md.find("| 0.00 | latency-limited | 1 |"), std::string::npos) << md;
    EXPECT_NE(md.find("| 0.00 | compute-bound | 80 |"), std::string::npos) << md;
}

// run.threads above the cores this process may use (affinity mask, cgroup quota) is named at
// the top of the report, with the fix; a variant within them is not.
TEST(ReportMd, ThreadsBeyondTheUsableCoresAreWarnedAbout) {
    Results res = make_experiment().results();
    res.environment.usable_cores = 2;
    res.environment.usable_cores_source = "cgroup cpu.max 2 CPUs (affinity mask: 8 CPUs)";
    res.variants[1].threads = 8;
    const std::string md = render_report_md(res);
    EXPECT_NE(md.find("**Warning: '" + res.variants[1].name +
                      "' runs 8 threads on 2 usable cores (cgroup cpu.max 2 CPUs (affinity mask: "
                      "8 CPUs))**"),
              std::string::npos)
        << md.substr(0, 2000);
    EXPECT_EQ(md.find("**Warning: '" + res.variants[0].name + "' runs"), std::string::npos);
    EXPECT_NE(md.find("- usable_cores: 2"), std::string::npos);  // the Environment section
}

// One case per rule: the measurements that make it fire. make_run's own variant (compute 75 %
// of the step, layernorm separate) fires only `compute` and `compute-knobs`.
TEST(SuggestionRules, EachRuleFiresOnTheMeasurementsItReads) {
    struct Case {
        const char* rule;
        std::function<void(HandMadeRun&)> edit;
        std::function<void(VariantResult&)> after;
    };
    const std::vector<Case> cases = {
        {"data",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::data, 0.6}});
         },
         {}},
        {"data-warm-phase",
         [](HandMadeRun& r) {
             // The first measured step prepares the data (a cache's first epoch); the others
             // copy it.
             r.config.data.cache = true;
             StepRecord& first = r.steps[2];
             first.times.wall_ms = 100;
             first.times[Phase::data] = 90;
         },
         {}},
        {"h2d",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::h2d, 0.15}, {Phase::forward, 0.8}});
         },
         {}},
        {"compute", [](HandMadeRun&) {}, {}},
        {"top-op", [](HandMadeRun&) {},
         [](VariantResult& v) {
             v.kernels = {top_op("matmul_backward", "naive", Bound::compute, 1)};
         }},
        {"compute-knobs", [](HandMadeRun&) {}, {}},
        {"optimizer",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::optimizer, 0.4}});
         },
         {}},
        {"fine-tune",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::optimizer, 0.4}});
         },
         {}},
        {"host-overhead",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::sync, 0.3}, {Phase::forward, 0.7}});
         },
         {}},
        {"memory-limit",
         [](HandMadeRun& r) { r.memory.device_used_peak = r.memory.device_total * 9 / 10; },
         {}},
        {"trainable-state",
         [](HandMadeRun& r) {
             r.memory.tracked_peak[static_cast<int>(MemoryCategory::grads)] = 1 << 20;
         },
         {}},
        {"jitter",
         [](HandMadeRun& r) {
             r.steps[3].times.wall_ms = 15;
             r.steps[4].times.wall_ms = 20;
         },
         {}},
        {"balanced",
         [](HandMadeRun& r) {
             set_shares(r, {{Phase::data, 0.18},
                            {Phase::h2d, 0.09},
                            {Phase::forward, 0.24},
                            {Phase::backward, 0.25},
                            {Phase::optimizer, 0.14},
                            {Phase::sync, 0.02}});
         },
         {}},
    };
    const std::set<std::string> plain = rules_fired([](HandMadeRun&) {});
    EXPECT_EQ(plain, (std::set<std::string>{"compute", "compute-knobs"}));
    for (const Case& c : cases) EXPECT_EQ(rules_fired(c.edit, c.after).count(c.rule), 1u) << c.rule;
    // The communication rule and the bucket rule read a data-parallel record: test_report_dist.
}

std::string top_op_text(const KernelRecord& k, const std::string& backend = "cpu",
                        std::optional<std::string> cpu_isa = std::nullopt) {
    HandMadeExperiment ex;
    ex.name = "s";
    ex.baseline = "b";
    HandMadeRun r = make_run("b", {10, 10, 10}, 5.0, 1 << 20);
    r.backend = backend;
    ex.runs.push_back(r);
    VariantResult v = ex.results().variants[0];
    v.kernels = {k};
    v.cpu_isa = std::move(cpu_isa);
    for (const Suggestion& s : suggestions_of(v))
        if (s.rule == "top-op") return s.text;
    return "";
}

// The naive GEMM at 1 % of its roofline is not "arithmetic-limited": the implementation limits
// it, and the report names the next rung of the backend's ladder.
TEST(SuggestionRules, AnOpFarBelowItsRooflineIsInefficientAndGetsTheNextRung) {
    const std::string t = top_op_text(top_op("matmul_backward", "naive", Bound::compute, 1));
    EXPECT_NE(t.find("this implementation is inefficient"), std::string::npos) << t;
    EXPECT_NE(t.find("`kernels.matmul: naive → blocked`"), std::string::npos) << t;
    EXPECT_NE(t.find("the cpu ladder: naive → blocked → packed → blas"), std::string::npos) << t;
    EXPECT_EQ(t.find("arithmetic-limited"), std::string::npos) << t;
    EXPECT_EQ(t.find("fp32-only"), std::string::npos) << t;
    const std::string cuda =
        top_op_text(top_op("matmul_forward", "tiled", Bound::compute, 5), "cuda");
    EXPECT_NE(cuda.find("`kernels.matmul: tiled → cublas`"), std::string::npos) << cuda;
    // The top rung has no next one.
    const std::string blas = top_op_text(top_op("matmul_backward", "blas", Bound::compute, 10));
    EXPECT_EQ(blas.find("next rung"), std::string::npos) << blas;
}

// On the CPU's baseline ISA level there is no packed GEMM (kernels.matmul: packed is refused
// there): the next rung after blocked is blas, and the ladder shown leaves packed out.
TEST(SuggestionRules, TheBaselineIsaLevelsLadderHasNoPackedRung) {
    const std::string t =
        top_op_text(top_op("matmul_backward", "blocked", Bound::compute, 5), "cpu", "baseline");
    EXPECT_NE(t.find("`kernels.matmul: blocked → blas`"), std::string::npos) << t;
    EXPECT_NE(t.find("the cpu ladder: naive → blocked → blas)"), std::string::npos) << t;
    const std::string avx2 =
        top_op_text(top_op("matmul_backward", "blocked", Bound::compute, 5), "cpu", "avx2");
    EXPECT_NE(avx2.find("`kernels.matmul: blocked → packed`"), std::string::npos) << avx2;
}

// The "top ops" line says what limits each op from its measured roofline fraction: the naive
// GEMM at 1 % is latency-limited, not "compute-bound" as its intensity alone would say.
TEST(SuggestionRules, TheTopOpsLineNamesAnOpFarBelowItsRooflineLatencyLimited) {
    EXPECT_EQ(limit_of(top_op("matmul_backward", "naive", Bound::compute, 1)), "latency-limited");
    EXPECT_EQ(limit_of(top_op("matmul_backward", "blas", Bound::compute, 70)), "compute-bound");
    EXPECT_EQ(limit_of(top_op("layernorm_forward", "", Bound::memory, 40)), "memory-bound");
    HandMadeExperiment ex = make_experiment();
    Results res = ex.results();
    res.variants[0].kernels = {top_op("matmul_backward", "naive", Bound::compute, 1)};
    const std::string next = md_section(render_report_md(res), "## Bottleneck and next steps");
    EXPECT_NE(next.find("- top ops: matmul_backward 40.0% (latency-limited, 1.0% of its roofline)"),
              std::string::npos)
        << next;
}

// The int8 GEMM at 98 % of its roofline: only less or cheaper work helps, never a better GEMM.
TEST(SuggestionRules, AnOpNearItsRooflineNeedsFewerFlopsLowerPrecisionOrFusion) {
    const std::string t = top_op_text(top_op("matmul_forward", "packed", Bound::compute, 98));
    EXPECT_NE(t.find("near its roofline, the hardware limits it: only fewer FLOPs"),
              std::string::npos)
        << t;
    EXPECT_EQ(t.find("next rung"), std::string::npos) << t;
    const std::string mem = top_op_text(top_op("layernorm_forward", "", Bound::memory, 80));
    EXPECT_NE(mem.find("only fewer bytes help: fusion"), std::string::npos) << mem;
}

// A knob to try that does not depend on the variant is printed once, under the first variant it
// applies to; the others point there.
TEST(SuggestionRules, AVariantIndependentKnobIsSuggestedOncePerReport) {
    const std::string next =
        md_section(render_report_md(make_experiment().results()), "## Bottleneck and next steps");
    EXPECT_EQ(occurrences(next, "`kernels.layernorm: fused_residual`"), 1u) << next;
    EXPECT_NE(next.find("the knobs suggested under *baseline* above apply here too"),
              std::string::npos)
        << next;
}

// The run measured `kernels.layernorm: fused_residual` slower than the baseline: no variant is
// told to try it.
TEST(SuggestionRules, AKnobTheRunMeasuredSlowerIsNotSuggested) {
    HandMadeExperiment ex;
    ex.name = "ln";
    ex.baseline = "baseline";
    ex.runs.push_back(make_run("baseline", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("ln-fused", {12, 12.1, 11.9, 12, 12.05}, 5.0, 100 << 20,
                               {{"kernels.layernorm", "fused_residual"}}));
    const Results res = ex.results();
    ASSERT_EQ(row(res.comparison, "ln-fused").time_call, TimeCall::slower);
    const std::string next = md_section(render_report_md(res), "## Bottleneck and next steps");
    EXPECT_EQ(next.find("`kernels.layernorm: fused_residual`"), std::string::npos) << next;
    EXPECT_NE(next.find("compute in the model dominates"), std::string::npos) << next;
}

// ---- throughput ---------------------------------------------------------------------------------

// Under shape jitter, short batches take short steps: tokens/s and MFU are the measured steps'
// tokens and FLOPs over their total time, not the mean batch over the median step.
TEST(Throughput, TokensAndFlopsPerSecondAreTotalsOverTheTotalMeasuredTime) {
    HandMadeExperiment ex;
    ex.name = "jitter";
    ex.baseline = "b";
    HandMadeRun r = make_run("b", {10, 10, 10, 30, 30}, 5.0, 1 << 20);
    r.config.data.seq_len_jitter = 0.5f;
    for (StepRecord& s : r.steps) {  // tokens and FLOPs in proportion to the step's time
        s.tokens = 10 * s.times.wall_ms;
        s.model_flops = 1e7 * s.times.wall_ms;
    }
    ex.runs.push_back(r);
    const VariantResult v = ex.results().variants[0];
    // 900 tokens in 90 ms; the mean batch over the median step would say 180 / 10 ms.
    EXPECT_NEAR(v.stats.tokens_per_s, 10000, 1e-6);
    EXPECT_NEAR(v.flops.achieved_per_s, 1e10, 1e-3);
    ASSERT_TRUE(v.flops.mfu.has_value());
    EXPECT_NEAR(*v.flops.mfu, 0.1, 1e-9);
    EXPECT_NEAR(v.stats.samples_per_s, 4 * 5 / 0.090, 1e-6);  // 5 steps of 4 samples in 90 ms
}

TEST(ReportHtml, IsSelfContainedWithCharts) {
    const std::string html = render_report_html(make_experiment().results());
    EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
    size_t svgs = 0;
    for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
    EXPECT_EQ(svgs, 5u);  // phases, phases per step, distribution, loss, memory
    EXPECT_EQ(html.find("<script src"), std::string::npos);
    EXPECT_EQ(html.find("<link"), std::string::npos);
    EXPECT_EQ(html.find("<img"), std::string::npos);
    EXPECT_NE(html.find("<table>"), std::string::npos);
    for (const char* name : {"baseline", "fast", "lean", "lossy", "combo"})
        EXPECT_NE(html.find(name), std::string::npos) << name;
}

TEST(RunFolder, WritesAllFilesAtomically) {
    const fs::path dir = temp_dir("folder");
    const std::string run = write_run_folder(make_experiment().results(), dir.string());
    EXPECT_EQ(fs::path(run).parent_path(), dir);
    EXPECT_EQ(fs::path(run).filename().string().rfind("unit-", 0), 0u);
    for (const char* f : {"report.md", "report.html", "results.json", "steps.csv", "trace.json"})
        EXPECT_GT(fs::file_size(fs::path(run) / f), 0u) << f;
    for (const auto& e : fs::directory_iterator(run))  // no temporary files left behind
        EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
    // A second run in the same second gets its own folder.
    const std::string run2 = write_run_folder(make_experiment().results(), dir.string());
    EXPECT_NE(run, run2);
    EXPECT_NO_THROW(load_results(run + "/results.json"));
    fs::remove_all(dir);
}

TEST(AtomicFile, ReplacesContentAndReportsErrors) {
    const fs::path dir = temp_dir("atomic");
    const std::string p = (dir / "x.txt").string();
    write_file_atomic(p, "one");
    write_file_atomic(p, "two");
    EXPECT_EQ(slurp(p), "two");
    try {
        write_file_atomic((dir / "missing" / "y.txt").string(), "z");
        FAIL() << "expected an error";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("missing/y.txt"), std::string::npos) << e.what();
    }
    fs::remove_all(dir);
}

TEST(Compare, TwoResultsFilesGiveTheSameTable) {
    const fs::path dir = temp_dir("compare");
    HandMadeExperiment a = make_experiment();
    HandMadeExperiment b;
    b.name = "other";
    b.baseline = "baseline";
    HandMadeRun tuned = make_run("baseline", {8, 8.05, 7.95, 8, 8.02}, 5.0, 90 << 20);
    tuned.config.optim.impl = AdamWImpl::unfused;  // differs from a's baseline (default fused)
    b.runs.push_back(tuned);
    const std::string ra = write_run_folder(a.results(), (dir / "a").string());
    const std::string rb = write_run_folder(b.results(), (dir / "b").string());
    const Results ja = read_results(ra + "/results.json");
    const Results jb = read_results(rb + "/results.json");
    const Comparison c = compare_results(ja, "A", jb, "B");
    ASSERT_EQ(c.rows.size(), 2u);
    EXPECT_EQ(c.rows[0].variant, "A:baseline");
    EXPECT_TRUE(c.rows[0].is_baseline);
    EXPECT_EQ(c.rows[1].variant, "B:baseline");
    EXPECT_NEAR(*c.rows[1].delta_time_ms, 2.0, 1e-9);
    EXPECT_NEAR(*c.rows[1].speedup, 1.25, 1e-9);
    EXPECT_NE(c.rows[1].changed.find("optim.impl=unfused"), std::string::npos) << c.rows[1].changed;
    const std::string md = render_comparison_md(c);
    EXPECT_NE(md.find("| B:baseline |"), std::string::npos) << md;
    EXPECT_NE(md.find("+2.00 (1.25x)"), std::string::npos) << md;
    // Two runs: their rounds are not pairs, and the output says the interval is unpaired.
    EXPECT_EQ(c.rows[1].time_call, TimeCall::faster);
    EXPECT_NE(c.rows[1].verdict.find("1.25x faster ["), std::string::npos) << c.rows[1].verdict;
    EXPECT_NE(c.rows[1].verdict.find("(unpaired)"), std::string::npos) << c.rows[1].verdict;
    EXPECT_NE(md.find("UNPAIRED"), std::string::npos) << md;
    EXPECT_NE(md.find("- unpaired: A and B are two runs"), std::string::npos) << md;
    EXPECT_THROW(compare_results(ja, "A", jb, "B", "nope"), ReportError);
    EXPECT_THROW(compare_results(ja, "A", jb, "B", "", "nope"), ReportError);
    fs::remove_all(dir);
}

// Issue #25 item 14: compare took zero or negative step times and losses from an edited
// results.json and called them "keep: 0.00x faster". They are refused, naming file, variant, step.
TEST(Compare, RefusesStepTimesAndLossesNoRunCanMeasure) {
    const HandMadeExperiment a = make_experiment();
    const Results good = a.results();
    auto error_of = [&](const Results& b) -> std::string {
        try {
            compare_results(good, "A.json", b, "B.json");
        } catch (const ReportError& e) {
            return e.what();
        }
        return "";
    };
    ASSERT_EQ(error_of(good), "");
    for (const double ms : {0.0, -5.0}) {
        Results b = good;
        b.variants[0].steps.back().wall_ms = ms;
        const std::string e = error_of(b);
        EXPECT_NE(e.find("B.json: variant '" + b.variants[0].name + "'"), std::string::npos) << e;
        EXPECT_NE(e.find("wall_ms"), std::string::npos) << e;
        EXPECT_NE(e.find("expected a step time > 0"), std::string::npos) << e;
    }
    Results b = good;
    b.variants[0].steps.back().loss = -1;
    EXPECT_NE(error_of(b).find("expected a cross-entropy loss >= 0"), std::string::npos);
    b = good;
    b.variants[0].stats.step_ms.median = 0;
    EXPECT_NE(error_of(b).find("stats.step_ms"), std::string::npos);
    // The baseline side (A) is checked too.
    Results bad_a = good;
    bad_a.variants[0].steps.back().wall_ms = -1;
    EXPECT_THROW(compare_results(bad_a, "A.json", good, "B.json"), ReportError);
}

TEST(LoadResults, BadFilesGiveClearErrors) {
    const fs::path dir = temp_dir("bad");
    auto expect_error = [](const std::string& path, const std::string& needle) {
        try {
            load_results(path);
            ADD_FAILURE() << "no error for " << path;
        } catch (const ReportError& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error((dir / "absent.json").string(), "cannot read");
    { std::ofstream(dir / "garbage.json") << "{ nope"; }
    expect_error((dir / "garbage.json").string(), "not valid JSON");
    { std::ofstream(dir / "other.json") << R"({"hello": 1})"; }
    expect_error((dir / "other.json").string(), "not a microtrain results.json");
    { std::ofstream(dir / "v1.json") << R"({"schema_version": 1, "variants": []})"; }
    expect_error((dir / "v1.json").string(),
                 "has schema_version 1, this microtrain reads schema_version 10");
    json j = results_to_json(make_experiment().results());
    j["variants"][1].erase("stats");
    { std::ofstream(dir / "nostats.json") << j.dump(); }
    expect_error((dir / "nostats.json").string(), "variants[1]: missing key 'stats'");
    fs::remove_all(dir);
}

// ---- the typed schema --------------------------------------------------------------------------

// make_experiment plus a variant whose time delta is within noise and whose loss is within
// tolerance, and a non-finite loss (written as null).
HandMadeExperiment make_experiment_with_noise() {
    HandMadeExperiment ex = make_experiment();
    ex.runs.push_back(make_run("same", {10.02, 10.08, 9.92, 10.01, 10.04}, 5.01, 100 << 20,
                               {{"data.workers", "2"}}));
    ex.runs[3].steps.back().grad_norm = std::nan("");
    return ex;
}

TEST(ResultsSchema, ResultsJsonRoundTripsThroughTheSchema) {
    const HandMadeExperiment ex = make_experiment_with_noise();
    const Results typed = ex.results();
    const json written = json::parse(results_to_json(typed).dump());  // as the file holds it
    const Results read = results_from_json(written, "results.json");
    const json rewritten = json::parse(results_to_json(read).dump());
    EXPECT_EQ(written, rewritten);
    EXPECT_EQ(written.dump(2), rewritten.dump(2));
    EXPECT_TRUE(written["variants"][3]["steps"].back()["grad_norm"].is_null());
    EXPECT_TRUE(std::isnan(read.variants[3].steps.back().grad_norm));  // null: not finite
    // Everything the reports need came back: the same report from the file as from the run.
    EXPECT_EQ(render_report_md(read), render_report_md(typed));
    EXPECT_EQ(render_report_html(read), render_report_html(typed));
}

TEST(ResultsSchema, KeepsTheVersionOneLayoutAndAddsTheComparison) {
    const json j = results_to_json(make_experiment().results());
    EXPECT_EQ(j["schema_version"], 10);
    for (const char* key : {"tool", "experiment", "started_utc", "interrupted", "environment",
                            "units", "variants", "comparison"})
        EXPECT_TRUE(j.contains(key)) << key;
    const json& v = j["variants"][0];
    for (const char* key :
         {"name",           "status",      "message", "failed_step",  "failed_phase",
          "backend",        "device_name", "threads", "config",       "changed",
          "knobs_changed",  "model",       "batch",   "warmup_steps", "measure_steps",
          "measured_steps", "setup_ms",    "stats",   "flops",        "roofline",
          "loss",           "memory",      "kernels", "profiled",     "steps",
          "data_parallel",  "diverged",    "cpu_isa", "aa_control"})
        EXPECT_TRUE(v.contains(key)) << key;
    EXPECT_EQ(v.size(), 29u);  // nothing else: the comparison lives in its own block
    EXPECT_EQ(v["memory"]["phases"].size(), 1u);  // only the phases that ran
    EXPECT_TRUE(v["memory"]["phases"].contains("forward"));
    EXPECT_EQ(v["stats"]["phases_ms"].size(), static_cast<size_t>(kPhaseCount + 1));
    EXPECT_EQ(j["comparison"]["baseline"], "baseline");
    EXPECT_EQ(j["comparison"]["variants"].size(), j["variants"].size());
}

// The rows of report.md's comparison table, by variant name: the cells after the name.
std::map<std::string, std::vector<std::string>> comparison_table(const std::string& md) {
    std::map<std::string, std::vector<std::string>> rows;
    std::istringstream in(md.substr(md.find("## Comparison")));
    std::string line;
    std::getline(in, line);  // heading
    std::getline(in, line);  // blank
    std::getline(in, line);  // header row
    std::getline(in, line);  // |---|
    while (std::getline(in, line) && !line.empty()) {
        std::vector<std::string> cells;
        size_t start = 2;  // after "| "
        for (size_t p; (p = line.find(" | ", start)) != std::string::npos; start = p + 3)
            cells.push_back(line.substr(start, p - start));
        cells.push_back(line.substr(start, line.size() - start - 2));  // before " |"
        std::string name = cells[0].substr(0, cells[0].find(" ("));
        rows[name] = cells;
    }
    return rows;
}

TEST(ResultsSchema, StoredComparisonEqualsTheVerdictsOfReportMd) {
    const Results res = make_experiment_with_noise().results();
    const json j = results_to_json(res);
    const auto table = comparison_table(render_report_md(res));
    ASSERT_EQ(table.size(), res.variants.size());
    bool saw_noise = false, saw_loss_out = false;
    for (const json& c : j["comparison"]["variants"]) {
        const std::string name = c["variant"].get<std::string>();
        ASSERT_TRUE(table.count(name)) << name;
        const std::vector<std::string>& cells = table.at(name);
        ASSERT_EQ(cells.size(), 16u) << name;
        const std::string& dtime = cells[11];
        const std::string& call = cells[12];
        EXPECT_EQ(cells[15], c["verdict"].get<std::string>()) << name;
        EXPECT_EQ(c["verdict"].get<std::string>().rfind(c["decision"].get<std::string>(), 0), 0u)
            << name;
        // The time call column states the stored call and interval, and the verdict is built
        // on it: it quotes the call (a variant whose loss is out of tolerance is rejected on
        // that alone).
        if (c["time_call"].is_null()) {
            EXPECT_EQ(call, "–") << name;
        } else {
            EXPECT_NE(call.find(c["time_call"].get<std::string>()), std::string::npos) << call;
            if (c["loss_within_tolerance"] != false) {
                EXPECT_NE(c["verdict"].get<std::string>().find(call), std::string::npos) << name;
            }
            ASSERT_TRUE(c["speedup_ci95"].is_array()) << name;
            char bounds[64];
            std::snprintf(bounds, sizeof bounds, "[%.2f–%.2f]", c["speedup_ci95"][0].get<double>(),
                          c["speedup_ci95"][1].get<double>());
            EXPECT_NE(call.find(bounds), std::string::npos) << call << " vs " << bounds;
        }
        const json& loss_ok = c["loss_within_tolerance"];
        const bool has_delta = !c["is_baseline"].get<bool>() && c["delta_time_ms"].is_number();
        EXPECT_EQ(cells[14], !has_delta          ? "–"
                             : loss_ok.is_null() ? "n/a"
                                                 : (loss_ok.get<bool>() ? "yes" : "no"))
            << name;
        if (c["is_baseline"].get<bool>()) {
            EXPECT_EQ(dtime, "0 (1.00x)");
        } else if (c["delta_time_ms"].is_number()) {
            char want[64];
            std::snprintf(want, sizeof want, "%+.2f (%.2fx", c["delta_time_ms"].get<double>(),
                          c["speedup"].get<double>());
            EXPECT_EQ(dtime.rfind(want, 0), 0u) << name << ": " << dtime << " vs " << want;
            EXPECT_TRUE(c["delta_memory_bytes"].is_number()) << name;
        } else {
            EXPECT_EQ(dtime, "–") << name;
        }
        saw_noise |= c["within_noise"].get<bool>() && loss_ok == true;
        saw_loss_out |= loss_ok == false;
    }
    EXPECT_TRUE(saw_noise);     // "same": within noise, loss within tolerance
    EXPECT_TRUE(saw_loss_out);  // "lossy": loss out of tolerance
    const json& same = j["comparison"]["variants"][6];
    EXPECT_EQ(same["variant"], "same");
    EXPECT_EQ(same["decision"], "reject");
    EXPECT_EQ(j["comparison"]["variants"][5]["decision"], "not run");  // gpu-only, skipped
    // schema 9: every row has speedup_ci95 and time_call (null for the baseline and a skipped
    // variant); experiment.min_effect states the minimal effect the calls used.
    EXPECT_EQ(same["time_call"], "no difference");
    EXPECT_TRUE(same["speedup_ci95"].is_array());
    EXPECT_EQ(j["comparison"]["variants"][1]["time_call"], "faster");
    EXPECT_EQ(j["comparison"]["variants"][2]["time_call"], "slower");
    EXPECT_TRUE(j["comparison"]["variants"][0]["time_call"].is_null());
    EXPECT_TRUE(j["comparison"]["variants"][0]["speedup_ci95"].is_null());
    EXPECT_TRUE(j["comparison"]["variants"][5]["time_call"].is_null());
    EXPECT_DOUBLE_EQ(j["experiment"]["min_effect"].get<double>(), 0.02);
    EXPECT_EQ(j["experiment"]["rounds"], 5);
}

TEST(ResultsSchema, SpeedupIntervalIsReadBackCheckedAndTheSame) {
    const json good = json::parse(results_to_json(make_experiment().results()).dump());
    const Results read = results_from_json(good, "results.json");
    ASSERT_TRUE(read.comparison.rows[1].speedup_ci95.has_value());
    EXPECT_EQ(read.comparison.rows[1].time_call, TimeCall::faster);
    EXPECT_DOUBLE_EQ(read.comparison.rows[1].speedup_ci95->first,
                     good["comparison"]["variants"][1]["speedup_ci95"][0].get<double>());
    auto error_of = [](json j) {
        try {
            results_from_json(j, "results.json");
        } catch (const ReportError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    json bad = good;
    bad["comparison"]["variants"][1]["speedup_ci95"] = json::array({1.2});
    EXPECT_NE(error_of(bad).find("comparison.variants[1].speedup_ci95: expected [low, high]"),
              std::string::npos)
        << error_of(bad);
    bad["comparison"]["variants"][1]["speedup_ci95"] = json::array({1.3, 1.2});
    EXPECT_NE(error_of(bad).find("low <= high"), std::string::npos) << error_of(bad);
    bad = good;
    bad["comparison"]["variants"][1]["time_call"] = "quicker";
    EXPECT_NE(error_of(bad).find("expected one of"), std::string::npos) << error_of(bad);
}

// `diverged` (engine/divergence.h) is written as {step, reason} or null and read back; a v10
// file written before the key existed reads as "not diverged", not as an error.
TEST(ResultsSchema, DivergedIsReadBackAndAbsentInAnOlderFileMeansNotDiverged) {
    Results r = make_experiment().results();
    r.variants[1].diverged = Divergence{4, "loss 320 is above 2 x 5.5"};
    json j = results_to_json(r);
    EXPECT_TRUE(j["variants"][0]["diverged"].is_null());
    const Results back = results_from_json(j, "results.json");
    ASSERT_TRUE(back.variants[1].diverged);
    EXPECT_EQ(back.variants[1].diverged->step, 4);
    EXPECT_EQ(back.variants[1].diverged->reason, "loss 320 is above 2 x 5.5");
    for (json& v : j["variants"]) v.erase("diverged");
    const Results older = results_from_json(j, "results.json");
    for (const VariantResult& v : older.variants) EXPECT_FALSE(v.diverged) << v.name;
}

TEST(ResultsSchema, ReadingNamesTheKeyPathOfAMissingOrMistypedKey) {
    const json good = json::parse(results_to_json(make_experiment().results()).dump());
    auto error_of = [](const json& j) {
        try {
            results_from_json(j, "results.json");
        } catch (const ReportError& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    json wrong_type = good;
    wrong_type["variants"][2]["stats"]["step_ms"]["median"] = "fast";
    EXPECT_EQ(error_of(wrong_type)
                  .rfind("results.json: variants[2].stats.step_ms.median: "
                         "expected a number, got \"fast\"",
                         0),
              0u)
        << error_of(wrong_type);
    json missing = good;
    missing["variants"][0]["memory"]["device"].erase("kind");
    EXPECT_EQ(error_of(missing), "results.json: variants[0].memory.device: missing key 'kind'");
    json bad_enum = good;
    bad_enum["variants"][1]["status"] = "fine";
    EXPECT_NE(error_of(bad_enum).find("variants[1].status: expected one of ok, failed, "
                                      "interrupted, skipped"),
              std::string::npos)
        << error_of(bad_enum);
    json bad_step = good;
    bad_step["variants"][0]["steps"][3]["warmup"] = 0;
    EXPECT_NE(error_of(bad_step).find("variants[0].steps[3].warmup: expected true or false"),
              std::string::npos)
        << error_of(bad_step);
    json no_comparison = good;
    no_comparison.erase("comparison");
    EXPECT_EQ(error_of(no_comparison), "results.json: (top level): missing key 'comparison'");
}

TEST(ResultsSchema, VersionOneIsRefusedNamingBothVersions) {
    json v1 = json::parse(results_to_json(make_experiment().results()).dump());
    v1["schema_version"] = 1;
    v1.erase("comparison");
    try {
        results_from_json(v1, "old/results.json");
        FAIL() << "a schema_version 1 file was read";
    } catch (const ReportError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "'old/results.json' has schema_version 1, this microtrain reads schema_version "
                  "10; re-run the experiment with this version");
    }
}

// run.host_sync: a variant that waits for the device more often (every_op: one sync per kernel)
// gets a "sync grew" line naming the setting and where the cost landed; the baseline and a
// variant that syncs no more than it get none, but every variant states its host syncs.
TEST(Report, NamesTheSyncPhaseWhenAVariantSynchronisesMoreThanTheBaseline) {
    HandMadeExperiment ex;
    ex.name = "sync";
    ex.baseline = "sync-step";
    ex.started_utc = "2026-01-01T00:00:00Z";
    ex.runs.push_back(make_run("sync-step", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20));
    ex.runs.push_back(make_run("sync-every-op", {14, 14.1, 13.9, 14, 14.05}, 5.0, 100 << 20,
                               {{"run.host_sync", "every_op"}}));
    ex.runs.push_back(make_run("sync-none", {10, 10.1, 9.9, 10, 10.05}, 5.0, 100 << 20,
                               {{"run.host_sync", "none"}}));
    ex.runs[1].config.run.host_sync = HostSync::every_op;
    ex.runs[2].config.run.host_sync = HostSync::none;
    for (StepRecord& s : ex.runs[0].steps) s.host_syncs = 3;
    for (StepRecord& s : ex.runs[1].steps) {
        s.host_syncs = 412;
        s.host_wait_ms = 6.5;
        s.times[Phase::sync] = 2.0;  // grown from 0.2 ms (2% of the 10 ms step)
    }
    const std::string md = render_report_md(ex.results());
    const size_t at = md.find("### sync-every-op");
    ASSERT_NE(at, std::string::npos) << md;
    const std::string section = md.substr(at, md.find("### sync-none") - at);
    EXPECT_NE(section.find("- host syncs: 412 per step (median), the host waited 6.50 ms"),
              std::string::npos)
        << section;
    EXPECT_NE(section.find("- next: sync grew from 0.20 to 2.00 ms per step (host syncs 3 → 412"),
              std::string::npos)
        << section;
    EXPECT_NE(section.find("`run.host_sync: every_op` synchronises after every kernel"),
              std::string::npos)
        << section;
    EXPECT_EQ(md.find("sync grew from", md.find("### sync-none")), std::string::npos) << md;
    EXPECT_EQ(md.substr(0, at).find("sync grew from"), std::string::npos);
}

}  // namespace
}  // namespace mt

// report.html on hand-made results (tests/hand_made_run.h): every tag it opens is closed (inline
// markdown included), the comparison's verdicts sit on lines of their own, tables do not repeat
// themselves, and each chart is drawn where its data exists, with labelled axes and units, and
// nowhere else. The page in a real browser: tests/test_report_browser.cpp.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "report/format.h"
#include "report/render.h"
#include "report/results.h"
#include "tests/hand_made_run.h"
#include "tests/html_tags.h"

namespace mt {
namespace {

// A measured run: `walls` ms per measured step (after one slower warm-up step), the phases a fixed
// share of each step, `tokens` per step (cycled), and `peak` bytes tracked.
HandMadeRun run_of(const std::string& name, const std::vector<double>& walls,
                   std::map<std::string, std::string> changed = {},
                   const std::vector<double>& tokens = {256}, size_t peak = 8 << 20) {
    HandMadeRun r;
    r.config.variant = name;
    r.config.changed = std::move(changed);
    r.config.data.batch_size = 2;
    r.config.data.seq_len = 128;
    r.config.run.warmup_steps = 1;
    r.config.run.measure_steps = static_cast<int>(walls.size());
    r.backend = "cpu";
    r.device_name = "CPU: Test (2 threads)";
    r.threads = 2;
    r.flops_per_step = 1e9;
    r.peaks.flops_per_s = 100e9;
    r.peaks.bytes_per_s = 10e9;
    r.peaks.flops_source = "test flops";
    r.peaks.bytes_source = "test bytes";
    r.estimate.params = peak / 4;
    r.memory.tracked_peak_total = peak;
    r.memory.tracked_peak[static_cast<int>(MemoryCategory::params)] = peak / 4;
    r.memory.tracked_peak[static_cast<int>(MemoryCategory::activations)] = peak - peak / 4;
    int step = 0;
    auto add = [&](double wall, bool warm) {
        StepRecord s;
        s.step = step;
        s.warmup = warm;
        s.times.wall_ms = wall;
        s.times[Phase::data] = 0.1 * wall;
        s.times[Phase::forward] = 0.3 * wall;
        s.times[Phase::backward] = 0.5 * wall;
        s.times[Phase::optimizer] = 0.1 * wall;
        s.loss = 5.0;
        s.tokens = tokens[static_cast<size_t>(step) % tokens.size()];
        ++step;
        r.steps.push_back(s);
    };
    add(walls.front() * 2, true);
    for (double w : walls) add(w, false);
    return r;
}

HandMadeExperiment experiment_of(std::vector<HandMadeRun> runs) {
    HandMadeExperiment ex;
    ex.name = "html";
    ex.source_path = "html.yaml";
    ex.baseline = runs.front().config.variant;
    ex.loss_tolerance = 0.02;
    ex.started_utc = "2026-01-01T00:00:00Z";
    ex.runs = std::move(runs);
    return ex;
}

const std::vector<double> kTenMs = {10, 10.1, 9.9, 10, 10.05};
const std::vector<double> kFiveMs = {5, 5.05, 4.95, 5, 5.02};

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& l : v) s += "  " + l + "\n";
    return s;
}

// The <figure> whose caption starts with `caption`, "" when the page has none.
std::string figure(const std::string& html, const std::string& caption) {
    const size_t a = html.find("<figure><figcaption>" + caption);
    if (a == std::string::npos) return "";
    return html.substr(a, html.find("</figure>", a) + 9 - a);
}

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
    return n;
}

TEST(TagChecker, FindsAnUnclosedAndAMisnestedTag) {
    EXPECT_EQ(joined(tag_problems("<p><em>a</p>")),
              "  </p> at 8 closes <em>\n  <p> never closed\n  <em> never closed\n");
    EXPECT_EQ(joined(tag_problems("<p><svg><rect x=\"1\"/></svg><br></p>")), "");
}

TEST(ReportHtml, TheAsteriskOfAKeyPatternIsTextNotAnEmphasisLeftOpen) {
    Results res = experiment_of({run_of("base", kTenMs)}).results();
    // A profiled variant: its per-op table's caption names the knobs `kernels.*`.
    KernelRecord op;
    op.name = "matmul_forward";
    op.calls = 4;
    op.total_ms = 8;
    op.ms_per_step = 2;
    op.flops = 4e9;
    op.bytes = 1e8;
    op.gflops_per_s = 500;
    op.intensity = 40;
    res.variants[0].kernels = {op};
    res.variants[0].profiled = true;
    const std::string html = render_report_html(res);
    EXPECT_NE(html.find("(kernels.*);"), std::string::npos);
    EXPECT_EQ(tag_problems(html), std::vector<std::string>{}) << joined(tag_problems(html));
}

TEST(ReportHtml, InlineMarkdownStillEmphasisesAPairOfAsterisks) {
    // The comparison's legend writes *faster* / *slower*: a pair around a word is emphasis.
    const std::string html = render_report_html(
        experiment_of({run_of("base", kTenMs), run_of("fast", kFiveMs)}).results());
    EXPECT_NE(html.find("<em>faster</em>"), std::string::npos);
    EXPECT_EQ(tag_problems(html), std::vector<std::string>{}) << joined(tag_problems(html));
}

TEST(ReportHtml, EachVerdictHasALineOfItsOwnUnderANarrowSummary) {
    const std::string html = render_report_html(
        experiment_of({run_of("base", kTenMs), run_of("fast", kFiveMs, {{"optim.impl", "fused"}})})
            .results());
    const size_t summary = html.find("<table class=\"cmp\">");
    ASSERT_NE(summary, std::string::npos);
    const std::string table = html.substr(summary, html.find("</table>", summary) - summary);
    // The summary: what changed, the time call, memory, loss; no column of numbers or verdicts.
    EXPECT_NE(table.find("<th>Time call [95% CI]</th>"), std::string::npos) << table;
    EXPECT_EQ(table.find("<th>Verdict</th>"), std::string::npos) << table;
    EXPECT_EQ(table.find("Step ms (median)"), std::string::npos) << table;
    // One verdict row per variant, across the summary's five columns.
    EXPECT_EQ(count(table, "<tr class=\"verdict\"><td colspan=\"5\"><strong>Verdict:</strong>"), 2u)
        << table;
    EXPECT_NE(table.find("<strong>Verdict:</strong> keep: "), std::string::npos) << table;
    // The numbers follow in a table of their own.
    const size_t numbers = html.find("<table class=\"cmp\">", summary + 1);
    ASSERT_NE(numbers, std::string::npos);
    EXPECT_NE(html.find("<th>Step ms (median)</th>", numbers), std::string::npos);
}

TEST(ReportMd, VariantsWithTheSameMemoryShareOneBlockOfTheMemoryTable) {
    const Results res = experiment_of({run_of("naive", kTenMs), run_of("blocked", kFiveMs),
                                       run_of("lean", kTenMs, {}, {256}, 4 << 20)})
                            .results();
    const std::string md = render_report_md(res);
    const size_t a = md.find("## Memory");
    const std::string table = md.substr(a, md.find("Where memory peaks", a) - a);
    EXPECT_EQ(count(table, "| naive, blocked | params |"), 1u) << table;
    EXPECT_EQ(count(table, "| lean | params |"), 1u) << table;
    EXPECT_EQ(count(table, "| blocked | params |"), 0u) << table;
    EXPECT_EQ(count(table, "**total (peak of the sum)**"), 2u) << table;
}

TEST(ReportMd, VariantsWithTheSamePerPhasePeaksShareOneRow) {
    HandMadeRun naive = run_of("naive", kTenMs), blocked = run_of("blocked", kFiveMs);
    HandMadeRun lean = run_of("lean", kTenMs, {}, {256}, 4 << 20);
    for (HandMadeRun* r : {&naive, &blocked, &lean}) {
        auto& fwd = r->memory.phases[static_cast<int>(Phase::forward)];
        fwd.seen = true;
        fwd.tracked_peak_total = r->memory.tracked_peak_total;
    }
    const std::string md = render_report_md(experiment_of({naive, blocked, lean}).results());
    const size_t a = md.find("Per-phase peaks");
    const std::string table = md.substr(a, md.find("\n\n", md.find("|---", a)) - a);
    EXPECT_EQ(count(table, "| naive, blocked | – | – | 8.0 / 0.0 |"), 1u) << table;
    EXPECT_EQ(count(table, "| lean | – | – | 4.0 / 0.0 |"), 1u) << table;
    EXPECT_EQ(count(table, "\n| "), 3u) << table;  // the header and two rows
}

TEST(ReportText, ADeltaThatRoundsToZeroHasNoMinusSign) {
    EXPECT_EQ(report_text::signed_f("%.1f", -0.04), "+0.0");
    EXPECT_EQ(report_text::signed_f("%.1f", -0.06), "-0.1");
    EXPECT_EQ(report_text::signed_f("%.2f", 1.5), "+1.50");
}

// ---- the charts ---------------------------------------------------------------------------------

TEST(ReportCharts, RooflinePlotsEachOpUnderTheMeasuredRoofOnLogAxes) {
    Results res = experiment_of({run_of("base", kTenMs), run_of("other", kTenMs)}).results();
    KernelRecord mm, ln;
    mm.name = "matmul_forward";
    mm.gflops_per_s = 50, mm.intensity = 40;  // compute-bound: right of the ridge (10 FLOP/byte)
    ln.name = "layernorm_forward";
    ln.gflops_per_s = 2, ln.intensity = 0.5;  // memory-bound
    res.variants[0].kernels = {mm, ln};
    const std::string html = render_report_html(res);
    const std::string chart = figure(html, "Roofline of base");
    ASSERT_FALSE(chart.empty()) << html;
    EXPECT_EQ(figure(html, "Roofline of other"), "");  // not profiled: no roofline
    EXPECT_EQ(count(chart, "<circle"), 2u);
    EXPECT_NE(chart.find("<title>matmul_forward: 50.00 GFLOP/s at 40.00 FLOP/byte</title>"),
              std::string::npos);
    // The roof from the peaks: 10 GB/s x intensity up to the ridge, 100 GFLOP/s after.
    EXPECT_NE(chart.find("peak 100.0 GFLOP/s"), std::string::npos);
    EXPECT_NE(chart.find("ridge 10.00 FLOP/byte"), std::string::npos);
    EXPECT_NE(chart.find("arithmetic intensity (FLOP/byte)"), std::string::npos);
    EXPECT_NE(chart.find(">GFLOP/s</text>"), std::string::npos);
    // Log axes: decades from 0.1 to 100 FLOP/byte.
    for (const char* tick : {">0.1</text>", ">1</text>", ">10</text>", ">100</text>"})
        EXPECT_NE(chart.find(tick), std::string::npos) << tick;
    EXPECT_EQ(tag_problems(html), std::vector<std::string>{}) << joined(tag_problems(html));
}

TEST(ReportCharts, StepPhaseBarsDrawEveryStepOfEveryVariantWarmUpShaded) {
    const std::string html = render_report_html(
        experiment_of({run_of("cold", {40, 10, 10, 10}), run_of("warm", kTenMs)}).results());
    const std::string chart = figure(html, "Phases of every step");
    ASSERT_FALSE(chart.empty()) << html;
    // 5 + 6 steps (one warm-up each), four phases drawn per step.
    EXPECT_EQ(count(chart, "<title>step "), 4u * (5 + 6));
    EXPECT_EQ(count(chart, "fill=\"#f0f0f0\""), 2u);  // the warm-up steps
    EXPECT_NE(chart.find("<title>step 1 backward: 20.000 ms</title>"), std::string::npos);
    EXPECT_NE(chart.find(" ms</text>"), std::string::npos);        // the panels' scale
    EXPECT_NE(chart.find(">step (5)</text>"), std::string::npos);  // the x axis
}

TEST(ReportCharts, LadderIsOnALogAxisOnlyWhereTheMediansSpanAFactor) {
    const std::string ladder = figure(
        render_report_html(
            experiment_of({run_of("naive", {100, 101, 99, 100, 100.5}), run_of("packed", kFiveMs)})
                .results()),
        "Median step time per variant, log axis");
    ASSERT_FALSE(ladder.empty());
    EXPECT_NE(ladder.find("ms per step (median, log scale)"), std::string::npos);
    for (const char* tick : {">1</text>", ">10</text>", ">100</text>"})
        EXPECT_NE(ladder.find(tick), std::string::npos) << tick;
    EXPECT_NE(ladder.find("5.00 ms (20.0x faster than the slowest)"), std::string::npos) << ladder;
    // Within a factor kLadderSpan the linear phase chart reads fine: no ladder.
    EXPECT_EQ(figure(render_report_html(
                         experiment_of({run_of("a", kTenMs), run_of("b", kFiveMs)}).results()),
                     "Median step time per variant"),
              "");
}

TEST(ReportCharts, CommunicationChartOnlyUnderDataParallel) {
    HandMadeRun dp = run_of("dp", kTenMs);
    DataParallelRecord d;
    d.world_size = 2;
    d.transport = "MPI (test)";
    RankRecord r0;
    r0.rank = 0;
    r0.step_ms = 10;
    r0.comm_overlapped_ms = 1.5;
    d.ranks = {r0};
    dp.dist = d;
    for (StepRecord& s : dp.steps) s.times[Phase::comm] = 2.0;
    const std::string html =
        render_report_html(experiment_of({run_of("one", kTenMs), dp}).results());
    const std::string chart = figure(html, "Communication per step");
    ASSERT_FALSE(chart.empty()) << html;
    EXPECT_NE(chart.find(">dp</text>"), std::string::npos);
    EXPECT_EQ(chart.find(">one</text>"), std::string::npos);  // one rank: nothing to draw
    EXPECT_NE(chart.find("<title>exposed 2.000 ms</title>"), std::string::npos) << chart;
    EXPECT_NE(chart.find("<title>overlapped 1.500 ms</title>"), std::string::npos) << chart;
    EXPECT_NE(chart.find(">ms per step</text>"), std::string::npos);
    EXPECT_EQ(figure(render_report_html(experiment_of({run_of("one", kTenMs)}).results()),
                     "Communication per step"),
              "");
}

TEST(ReportCharts, StepTimeAgainstTokensOnlyWhereBatchLengthsVary) {
    const std::string html = render_report_html(
        experiment_of({run_of("fixed", kTenMs),
                       run_of("jitter", {6, 10, 14, 8, 12}, {{"data.seq_len_jitter", "0.5"}},
                              {128, 192, 256, 320, 160, 224})})
            .results());
    const std::string chart = figure(html, "Step time against the tokens");
    ASSERT_FALSE(chart.empty()) << html;
    EXPECT_EQ(count(chart, "<circle"), 10u);  // every measured step of both variants
    EXPECT_NE(chart.find("<title>jitter step 1: 192 tokens, 6.00 ms</title>"), std::string::npos)
        << chart;
    EXPECT_NE(chart.find(">tokens per step</text>"), std::string::npos);
    EXPECT_NE(chart.find(">ms per step</text>"), std::string::npos);
    EXPECT_EQ(figure(render_report_html(experiment_of({run_of("fixed", kTenMs)}).results()),
                     "Step time against the tokens"),
              "");
}

// A report rebuilt from results.json (a saved run, `compare`) still has the per-step tokens, so
// the jitter chart is drawn there too (they were left out of results.json: the chart vanished).
TEST(ReportCharts, StepTimeAgainstTokensSurvivesAResultsJsonRoundTrip) {
    const Results live =
        experiment_of({run_of("fixed", kTenMs),
                       run_of("jitter", {6, 10, 14, 8, 12}, {{"data.seq_len_jitter", "0.5"}},
                              {128, 192, 256, 320, 160, 224})})
            .results();
    const Results read_back = results_from_json(results_to_json(live), "results.json");
    const std::string chart = figure(render_report_html(read_back), "Step time against the tokens");
    EXPECT_EQ(count(chart, "<circle"), 10u) << chart;
    EXPECT_NE(chart.find("<title>jitter step 1: 192 tokens, 6.00 ms</title>"), std::string::npos)
        << chart;
    // A file written before the field: read back with 0 tokens, and the chart is left out.
    nlohmann::json old = results_to_json(live);
    for (auto& v : old["variants"])
        for (auto& st : v["steps"]) st.erase("tokens");
    EXPECT_EQ(figure(render_report_html(results_from_json(old, "old.json")),
                     "Step time against the tokens"),
              "");
}

}  // namespace
}  // namespace mt

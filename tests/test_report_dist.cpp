// The results and report side of data parallelism, on hand-built results (no ranks are run):
// results.json's `data_parallel` (null for one rank, every field for two, round trip, key-path
// errors), the global batch in samples/tokens, report.md's Communication section and its verdict
// and suggestions, steps.csv's comm columns, trace.json's per-rank tracks and report.html.
#include <gtest/gtest.h>

#include <set>
#include <sstream>

#include "report/comparison.h"
#include "report/render.h"
#include "report/run_folder.h"
#include "report/step_files.h"
#include "report/suggestions.h"
#include "tests/hand_made_run.h"

namespace mt {
namespace {

using nlohmann::json;

// The shares of a step's wall time per phase: the rest of the step is `other`.
struct PhaseShares {
    double data, h2d, forward, backward, comm, optimizer, sync;
};
constexpr PhaseShares kCommHeavy{0.05, 0.01, 0.2, 0.25, 0.4, 0.05, 0.02};  // comm 40%
constexpr PhaseShares kCommLight{0.05, 0.01, 0.3, 0.5, 0.02, 0.08, 0.02};  // comm 2%

void set_phases(PhaseTimes& t, double wall, const PhaseShares& s) {
    t.wall_ms = wall;
    t[Phase::data] = s.data * wall;
    t[Phase::h2d] = s.h2d * wall;
    t[Phase::forward] = s.forward * wall;
    t[Phase::backward] = s.backward * wall;
    t[Phase::comm] = s.comm * wall;
    t[Phase::optimizer] = s.optimizer * wall;
    t[Phase::sync] = s.sync * wall;
}

RankRecord rank_record(int rank, double wall, const PhaseShares& s) {
    RankRecord r;
    r.rank = rank;
    r.step_ms = wall;
    PhaseTimes t;
    set_phases(t, wall, s);
    r.phases_ms = t.ms;
    r.comm_busy_ms = t[Phase::comm] + 0.5;
    r.comm_overlapped_ms = 0.5;
    TraceStep ts;
    ts.step = 1;
    ts.wall_ms = wall;
    double at = 0;
    for (Phase p : kAllPhases) {
        ts.phases.push_back({p, 0, at, t[p]});
        at += t[p];
    }
    r.trace.push_back(ts);
    return r;
}

// A measured variant of 10 ms steps (rank 0) with the given phase shares; with `world` > 1 it is
// data parallel, rank r taking 10 * (1 + r * rank_slowdown) ms per step.
HandMadeRun make_run(const std::string& name, const PhaseShares& s, int world, bool overlap = true,
                     double rank_slowdown = 0.2) {
    HandMadeRun r;
    r.config.variant = name;
    r.config.data.batch_size = 4;
    r.config.data.seq_len = 64;
    r.config.run.grad_accum = 2;
    r.config.run.warmup_steps = 1;
    r.config.run.measure_steps = 4;
    r.backend = "cpu";
    r.device_name = "CPU: Test (2 threads)";
    r.threads = 2;
    r.flops_per_step = 1e9;
    r.peak_flops = 100e9;
    r.peak_flops_source = "test";
    r.memory.tracked_peak_total = 1 << 20;
    const double wall = 10;
    for (int i = 0; i < 5; ++i) {
        StepRecord st;
        st.step = i;
        st.warmup = i == 0;
        set_phases(st.times, i == 0 ? 3 * wall : wall, s);
        st.loss = 5.0 - 0.01 * i;
        st.grad_norm = 1.0;
        st.lr = 1e-3;
        if (world > 1) {
            st.comm_busy_ms = st.times[Phase::comm] + 0.5;
            st.comm_bytes = 3.0e6;
        }
        r.steps.push_back(st);
    }
    r.trace = rank_record(0, wall, s).trace;
    if (world > 1) {
        DataParallelRecord d;
        d.world_size = world;
        d.transport = "MPI (Test MPI 1.0)";
        d.zero = 0;
        d.overlap = overlap;
        d.bucket_mb = 25;
        d.buckets = 2;
        d.simulated_link_gbps = 1;
        d.simulated_latency_us = 50;
        d.bytes_per_step = 3.0e6;
        d.achieved_busbw_gbps = 0.1;
        d.probe_busbw_gbps = 0.125;
        d.probe_source = "measured now (test)";
        for (int k = 0; k < world; ++k)
            d.ranks.push_back(rank_record(k, wall * (1 + k * rank_slowdown), s));
        r.dist = d;
    }
    return r;
}

HandMadeExperiment make_experiment(const PhaseShares& s, bool overlap = true,
                                   double rank_slowdown = 0.2) {
    HandMadeExperiment ex;
    ex.name = "dist";
    ex.source_path = "dist.yaml";
    ex.baseline = "one";
    ex.started_utc = "2026-01-01T00:00:00Z";
    ex.runs.push_back(make_run("one", s, 1));
    ex.runs.push_back(make_run("two", s, 2, overlap, rank_slowdown));
    return ex;
}

// The text of report.md from its first line starting `heading` up to the next "## " heading.
std::string section(const std::string& md, const std::string& heading) {
    const size_t at = md.find("\n" + heading);
    if (at == std::string::npos) return "";
    const size_t end = md.find("\n## ", at + 1);
    return md.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

TEST(ReportDistResults, DataParallelIsNullForOneRankAndFullForTwo) {
    const json j = results_to_json(make_experiment(kCommHeavy).results());
    EXPECT_EQ(j["schema_version"], 10);
    EXPECT_TRUE(j["variants"][0]["data_parallel"].is_null());
    const json& d = j["variants"][1]["data_parallel"];
    ASSERT_TRUE(d.is_object());
    for (const char* key : {"world_size",
                            "transport",
                            "zero",
                            "overlap",
                            "bucket_mb",
                            "buckets",
                            "finest_buckets",
                            "simulated_link_gbps",
                            "simulated_latency_us",
                            "simulated_link_ratio",
                            "calibration_compute_ms",
                            "bytes_per_step",
                            "achieved_busbw_gbps",
                            "probe_busbw_gbps",
                            "probe_source",
                            "ranks",
                            "slowest_rank",
                            "rank_spread_ms",
                            "rank_spread_pct",
                            "comm_exposed_ms",
                            "comm_overlapped_ms",
                            "comm_share",
                            "busbw_fraction_of_probe"})
        EXPECT_TRUE(d.contains(key)) << key;
    EXPECT_EQ(d.size(), 23u);
    EXPECT_EQ(d["world_size"], 2);
    ASSERT_EQ(d["ranks"].size(), 2u);
    EXPECT_EQ(d["ranks"][1]["rank"], 1);
    EXPECT_NEAR(d["ranks"][1]["step_ms"].get<double>(), 12.0, 1e-9);
    EXPECT_NEAR(d["ranks"][1]["phases_ms"]["comm"].get<double>(), 4.8, 1e-9);
    EXPECT_FALSE(d["ranks"][1].contains("trace"));  // trace steps go to trace.json only
    // Derived once: the slowest rank, the spread, rank 0's comm against its median step.
    EXPECT_EQ(d["slowest_rank"], 1);
    EXPECT_NEAR(d["rank_spread_ms"].get<double>(), 2.0, 1e-9);
    EXPECT_NEAR(d["rank_spread_pct"].get<double>(), 0.2, 1e-9);
    EXPECT_NEAR(d["comm_exposed_ms"].get<double>(), 4.0, 1e-9);
    EXPECT_NEAR(d["comm_overlapped_ms"].get<double>(), 0.5, 1e-9);
    EXPECT_NEAR(d["comm_share"].get<double>(), 0.4, 1e-9);
    EXPECT_NEAR(d["busbw_fraction_of_probe"].get<double>(), 0.8, 1e-9);
    // Every phases object has comm.
    EXPECT_TRUE(j["variants"][0]["stats"]["phases_ms"].contains("comm"));
    EXPECT_TRUE(j["variants"][1]["steps"][2]["phases_ms"].contains("comm"));
    EXPECT_EQ(j["variants"][1]["steps"][2]["comm_bytes"], 3.0e6);
}

TEST(ReportDistResults, AMissingProbeIsNullAndSoIsItsFraction) {
    HandMadeExperiment ex = make_experiment(kCommHeavy);
    ex.runs[1].dist->probe_busbw_gbps.reset();
    const json d = results_to_json(ex.results())["variants"][1]["data_parallel"];
    EXPECT_TRUE(d["probe_busbw_gbps"].is_null());
    EXPECT_TRUE(d["busbw_fraction_of_probe"].is_null());
    EXPECT_NE(render_report_md(ex.results()).find("(no probe of this transport)"),
              std::string::npos);
}

TEST(ReportDistResults, BatchShapeCountsTheGlobalBatchOfEveryRank) {
    const json j = results_to_json(make_experiment(kCommHeavy).results());
    // B 4 x grad_accum 2, times 2 ranks for the data-parallel variant.
    EXPECT_EQ(j["variants"][0]["batch"]["samples_per_step"], 8);
    EXPECT_EQ(j["variants"][0]["batch"]["tokens_per_step"], 8 * 64);
    EXPECT_EQ(j["variants"][1]["batch"]["samples_per_step"], 16);
    EXPECT_EQ(j["variants"][1]["batch"]["tokens_per_step"], 16 * 64);
}

TEST(ReportDistResults, RoundTripGivesTheSameText) {
    const std::string text = results_to_json(make_experiment(kCommHeavy).results()).dump(2);
    const Results back = results_from_json(json::parse(text), "results.json");
    ASSERT_TRUE(back.variants[1].data_parallel);
    EXPECT_FALSE(back.variants[0].data_parallel);
    EXPECT_EQ(back.variants[1].data_parallel->ranks.size(), 2u);
    EXPECT_EQ(results_to_json(back).dump(2), text);
}

TEST(ReportDistResults, ATypeErrorInARankIsNamedByItsKeyPath) {
    json j = json::parse(results_to_json(make_experiment(kCommHeavy).results()).dump());
    j["variants"][1]["data_parallel"]["ranks"][1]["step_ms"] = "slow";
    try {
        results_from_json(j, "results.json");
        FAIL() << "a mistyped step_ms was read";
    } catch (const ReportError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "results.json: variants[1].data_parallel.ranks[1].step_ms: expected a number, "
                  "got \"slow\"");
    }
    json missing = json::parse(results_to_json(make_experiment(kCommHeavy).results()).dump());
    missing["variants"][1]["data_parallel"]["ranks"][0]["phases_ms"].erase("comm");
    try {
        results_from_json(missing, "results.json");
        FAIL() << "a rank without its comm phase was read";
    } catch (const ReportError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "results.json: variants[1].data_parallel.ranks[0].phases_ms: missing key "
                  "'comm'");
    }
}

TEST(ReportDistMarkdown, CommunicationSectionLabelsTheSimulatedLinkAndTablesEveryRank) {
    const std::string md = render_report_md(make_experiment(kCommHeavy).results());
    const std::string comm = section(md, "## Communication (data parallel)");
    ASSERT_FALSE(comm.empty()) << md;
    EXPECT_NE(comm.find("### two"), std::string::npos);
    EXPECT_EQ(comm.find("### one"), std::string::npos);  // one rank: no communication
    EXPECT_NE(comm.find("world size **2**"), std::string::npos) << comm;
    EXPECT_NE(comm.find("MPI (Test MPI 1.0)"), std::string::npos);
    EXPECT_NE(comm.find("simulated: 1 Gbit/s, 50 µs — not a real interconnect"), std::string::npos)
        << comm;
    EXPECT_NE(comm.find("80.0% of it"), std::string::npos) << comm;  // achieved vs probe
    EXPECT_NE(comm.find("| rank | step ms | comm exposed ms | comm overlapped ms | data ms | "
                        "forward ms | backward ms | optimizer ms |"),
              std::string::npos)
        << comm;
    EXPECT_NE(comm.find("| 0 | 10.00 | 4.00 | 0.50 |"), std::string::npos) << comm;
    EXPECT_NE(comm.find("| **1** (slowest) | 12.00 | 4.80 |"), std::string::npos) << comm;
    EXPECT_NE(comm.find("Rank spread: 2.00 ms (20.0%"), std::string::npos) << comm;
    // 20% spread: the straggler line names rank 1.
    EXPECT_NE(comm.find("straggler / load imbalance: rank 1 is the slowest"), std::string::npos)
        << comm;
}

TEST(ReportDistMarkdown, CommAtFortyPercentIsTheBottleneckAndOverlapOffIsSuggested) {
    const std::string md =
        render_report_md(make_experiment(kCommHeavy, /*overlap=*/false).results());
    const std::string comm = section(md, "## Communication (data parallel)");
    EXPECT_NE(comm.find("**Is communication the bottleneck?** Yes: the exposed communication "
                        "wait is 40.0% of the median step"),
              std::string::npos)
        << comm;
    EXPECT_NE(comm.find("more than 25.0% of the step"), std::string::npos);  // the threshold
    EXPECT_NE(comm.find("set `dist.overlap: true`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("`run.grad_accum`, now 2"), std::string::npos) << comm;
    EXPECT_NE(comm.find("does not reduce the traffic"), std::string::npos) << comm;
    // The bottleneck section names comm and points to the Communication section.
    const std::string next = section(md, "## Bottleneck and next steps");
    const std::string two = next.substr(next.find("### two"));
    EXPECT_NE(two.find("dominant phase: **comm**"), std::string::npos) << two;
    EXPECT_NE(two.find("see *Communication (data parallel)* above"), std::string::npos) << two;
    // The phase table and the comparison keep working with the extra phase.
    EXPECT_NE(section(md, "## Phase breakdown").find(" comm |"), std::string::npos);
    EXPECT_NE(section(md, "## Comparison").find("| two |"), std::string::npos);
}

// 2 buckets x 1 ms of simulated latency is half of the 4 ms exposed: fewer collectives help.
TEST(ReportDistMarkdown, OverlapOnWithLittleHiddenUnderCostlyLatencySuggestsLargerBuckets) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    ex.runs[1].dist->simulated_latency_us = 1000;
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("set `dist.overlap: true`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("a larger `dist.bucket_mb` (now 25 MiB, 2 buckets per step): fewer "
                        "collectives, each paying the per-collective latency once (1000 µs "
                        "simulated: 2.00 ms per step)"),
              std::string::npos)
        << comm;
}

// The lab's single 64 MiB bucket: 3 buckets x 50 µs is 0.15 ms of 4 ms exposed, so latency is
// not what the step waits for and a larger bucket is never the advice.
TEST(ReportDistMarkdown, ASixtyFourMiBBucketWithNegligibleLatencyIsNotToldToGrow) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    DataParallelRecord& d = *ex.runs[1].dist;
    d.bucket_mb = 64;
    d.buckets = 3;
    d.simulated_latency_us = 50;
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("a larger `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("a smaller `dist.bucket_mb` (now 64 MiB, 3 buckets per step)"),
              std::string::npos)
        << comm;
    EXPECT_NE(comm.find("the per-collective latency, 0.15 ms per step, is not what the step "
                        "waits for"),
              std::string::npos)
        << comm;
}

// Overlap already hides 2.2 ms under a 2.5 ms backward: hidden comm <= backward time, so no
// bucket size hides more of the 4 ms still exposed. The advice names the bound and the bytes.
TEST(ReportDistMarkdown, ABucketHidingNearlyTheWholeBackwardIsToldBytesNotBucketsRemain) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    ex.runs[1].dist->ranks[0].comm_overlapped_ms = 2.2;
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("a smaller `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_EQ(comm.find("a larger `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("the bucket size cannot hide more (now 25 MiB, 2 buckets per step): "
                        "overlap already hides 2.20 ms under 2.50 ms of backward, and hidden "
                        "comm ≤ backward time"),
              std::string::npos)
        << comm;
}

// The lab's 1 MiB bucket: 17 buckets per step already start early in backward, and their latency
// (17 x 10 µs here) is not what the step waits for: it is not told to shrink further (it was: no
// lower bound).
TEST(ReportDistMarkdown, ManySmallBucketsAreNotToldToShrinkFurther) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    DataParallelRecord& d = *ex.runs[1].dist;
    d.bucket_mb = 1;
    d.buckets = 17;
    d.simulated_latency_us = 10;
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("a smaller `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_EQ(comm.find("a larger `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("smaller buckets would not start the reductions much earlier (now 1 MiB, "
                        "17 buckets per step"),
              std::string::npos)
        << comm;
}

// The lab's 1 MiB bucket gave 5 buckets: one per range backward completes (4 layers and the
// embeddings), the finest any size gives. It was told to shrink further.
TEST(ReportDistMarkdown, BucketsAlreadyOnePerReadyRangeAreNotToldToShrink) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    DataParallelRecord& d = *ex.runs[1].dist;
    d.bucket_mb = 1;
    d.buckets = 5;
    d.finest_buckets = 5;
    const Results res = ex.results();
    const std::string comm = section(render_report_md(res), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("a smaller `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("a smaller bucket gives no more buckets (now 1 MiB, 5 buckets per step: "
                        "already one per range backward completes, 5 ranges"),
              std::string::npos)
        << comm;
    EXPECT_EQ(results_to_json(res)["variants"][1]["data_parallel"]["finest_buckets"], 5);
}

// The run measured a larger bucket slower than the baseline: the report does not propose it.
TEST(ReportDistMarkdown, ABucketSizeTheRunMeasuredSlowerIsNotSuggested) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    ex.runs[1].dist->simulated_latency_us = 1000;  // a larger bucket would be the advice
    HandMadeRun big = ex.runs[1];
    big.config.variant = "bucket-64";
    big.config.changed = {{"dist.bucket_mb", "64"}};
    for (StepRecord& s : big.steps) s.times.wall_ms *= 3;  // slower, per token too
    ex.runs.push_back(big);
    const Results res = ex.results();
    const std::string comm = section(render_report_md(res), "## Communication (data parallel)");
    EXPECT_EQ(comm.find("a larger `dist.bucket_mb`"), std::string::npos) << comm;
    EXPECT_NE(comm.find("more gradient accumulation"), std::string::npos) << comm;
}

TEST(ReportDistMarkdown,
     OverlapOnWithFewBucketsOnARealLinkSuggestsSmallerBucketsAndZeroOneIsNoFix) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/true);
    DataParallelRecord& d = *ex.runs[1].dist;
    d.simulated_link_gbps = 0;
    d.simulated_latency_us = 0;
    d.zero = 1;
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    EXPECT_NE(comm.find("link: the real transport (no simulated link)"), std::string::npos);
    EXPECT_EQ(comm.find("not a real interconnect"), std::string::npos);
    EXPECT_NE(comm.find("a smaller `dist.bucket_mb` (now 25 MiB, 2 buckets per step)"),
              std::string::npos)
        << comm;
    EXPECT_NE(comm.find("ZeRO-1 is on: it saves optimizer memory, not traffic"), std::string::npos)
        << comm;
}

// Two data-parallel variants bottlenecked on communication: the ZeRO line, which names nothing
// measured, is printed once; the second variant points to the first.
TEST(ReportDistMarkdown, TheZeroLineIsPrintedOncePerReport) {
    HandMadeExperiment ex = make_experiment(kCommHeavy, /*overlap=*/false);
    HandMadeRun three = ex.runs[1];
    three.config.variant = "three";
    ex.runs.push_back(three);
    const std::string comm =
        section(render_report_md(ex.results()), "## Communication (data parallel)");
    size_t n = 0;
    for (size_t p = comm.find("`dist.zero: 1` (ZeRO-1)"); p != std::string::npos;
         p = comm.find("`dist.zero: 1` (ZeRO-1)", p + 1))
        ++n;
    EXPECT_EQ(n, 1u) << comm;
    EXPECT_NE(comm.find("the knobs suggested under *two* above apply here too"), std::string::npos)
        << comm;
    // The overlap line states this variant's own setting: it stays under each.
    EXPECT_NE(comm.substr(comm.find("### three")).find("set `dist.overlap: true`"),
              std::string::npos)
        << comm;
}

TEST(ReportDistMarkdown, CommAtTwoPercentIsNotTheBottleneck) {
    const std::string md =
        render_report_md(make_experiment(kCommLight, true, /*rank_slowdown=*/0.01).results());
    const std::string comm = section(md, "## Communication (data parallel)");
    EXPECT_NE(comm.find("**Is communication the bottleneck?** No: the exposed communication wait "
                        "is 2.0% of the median step"),
              std::string::npos)
        << comm;
    EXPECT_NE(comm.find("the largest phase is backward"), std::string::npos) << comm;
    EXPECT_EQ(comm.find("- next:"), std::string::npos) << comm;
    EXPECT_EQ(comm.find("straggler"), std::string::npos) << comm;  // 1% spread
    EXPECT_EQ(md.find("communication-bound"), std::string::npos);
}

TEST(ReportDistMarkdown, OneRankOnlyHasNoCommunicationSection) {
    HandMadeExperiment ex = make_experiment(kCommLight);
    ex.runs.pop_back();
    EXPECT_EQ(render_report_md(ex.results()).find("## Communication"), std::string::npos);
}

TEST(ReportDistFiles, StepsCsvHasTheCommColumns) {
    std::istringstream in(steps_csv(make_experiment(kCommHeavy).results()));
    std::string header, line;
    std::getline(in, header);
    EXPECT_NE(header.find(",backward_ms,comm_ms,optimizer_ms,"), std::string::npos) << header;
    EXPECT_EQ(header.substr(header.size() - 53),
              ",comm_busy_ms,comm_bytes,tokens,other_cpu_ms,steal_ms");
    std::string last;
    while (std::getline(in, line)) last = line;  // variant two's last step
    EXPECT_EQ(last.rfind("two,4,0,", 0), 0u) << last;
    EXPECT_EQ(last.substr(last.size() - 37), ",4.500000,3000000,0,0.000000,0.000000") << last;
}

TEST(ReportDistFiles, TraceJsonHasOnePhasesTrackPerRank) {
    const json t = json::parse(trace_json(make_experiment(kCommHeavy).results()).dump());
    std::map<int, std::set<std::string>> tracks;  // pid -> track names
    std::map<std::pair<int, int>, int> events;    // (pid, tid) -> events
    std::map<int, std::map<std::string, int>> tid_of;
    for (const json& e : t["traceEvents"]) {
        if (e["name"] == "thread_name") {
            tracks[e["pid"]].insert(e["args"]["name"].get<std::string>());
            tid_of[e["pid"]][e["args"]["name"].get<std::string>()] = e["tid"];
        } else if (e["ph"] == "X") {
            ++events[{e["pid"].get<int>(), e["tid"].get<int>()}];
        }
    }
    // One rank: the old tracks.
    EXPECT_EQ(tracks[1], (std::set<std::string>{"steps", "phases", "ops"}));
    // Two ranks: a phases track per rank, each with every phase of its one kept step.
    EXPECT_EQ(tracks[2], (std::set<std::string>{"steps", "rank 0 phases", "rank 1 phases", "ops"}));
    EXPECT_EQ((events[{2, tid_of[2]["rank 1 phases"]}]), kPhaseCount);
    EXPECT_EQ((events[{2, tid_of[2]["rank 0 phases"]}]), kPhaseCount);
}

TEST(ReportDistFiles, HtmlHasTheRankTableAndTheVerdict) {
    const std::string html =
        render_report_html(make_experiment(kCommHeavy, /*overlap=*/false).results());
    EXPECT_NE(html.find("<h2>Communication (data parallel)</h2>"), std::string::npos);
    EXPECT_NE(html.find("<th>comm overlapped ms</th>"), std::string::npos);
    EXPECT_NE(html.find("<td><strong>1</strong> (slowest)</td>"), std::string::npos);
    EXPECT_NE(html.find("<strong>Is communication the bottleneck?</strong> Yes"),
              std::string::npos);
    EXPECT_NE(html.find(">comm: "), std::string::npos);  // the phase chart has a comm bar
}

}  // namespace
}  // namespace mt

// The runner end to end on a tiny experiment (tiny model, 2 warm-up + 3 measured steps): a
// complete run folder; the injected NaN and interrupt paths (report still written, marked); a
// variant needing a GPU skipped with a reason; the `run` and `compare` commands' exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "experiment/runner.h"
#include "experiment/spec.h"
#include "report/comparison.h"
#include "report/render.h"
#include "report/run_folder.h"
#include "report/step_files.h"
#include "report/suggestions.h"
#include "tests/test_util.h"

namespace mt {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class RunnerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("mt_test_runner_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        // One peak probe per test process, never in the user's ~/.cache.
        const fs::path cache =
            fs::temp_directory_path() / ("mt_test_runner_cache_" + std::to_string(::getpid()));
        ::setenv("MICROTRAIN_CACHE_DIR", cache.c_str(), 1);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string write_yaml(const std::string& variants, const std::string& extra = "") {
        const std::string path = (dir_ / "tiny.yaml").string();
        std::ofstream(path) << "name: tiny\n"
                               "backend: cpu\n"
                               "model: { n_layer: 2, n_embd: 32, n_head: 2, max_seq_len: 16, "
                               "vocab_size: 128 }\n"
                               "data: { source: synthetic, batch_size: 2, seq_len: 16 }\n"
                               "optim: { lr: 1.0e-3, impl: unfused }\n"
                               "run: { seed: 7, warmup_steps: 2, measure_steps: 3, threads: 1 }\n"
                            << extra << "variants:\n"
                            << variants
                            << "compare: { baseline: baseline, loss_tolerance: 0.02 }\n"
                               "report: { out_dir: "
                            << (dir_ / "runs").string() << " }\n";
        return path;
    }

    static RunnerOptions quiet() {
        RunnerOptions o;
        o.out = nullptr;
        o.handle_sigint = false;
        return o;
    }

    fs::path dir_;
};

const char* kTwoVariants =
    "  - name: baseline\n"
    "  - name: fused\n"
    "    set: { optim.impl: fused }\n";

TEST_F(RunnerTest, EndToEndTinyExperimentWritesACompleteRunFolder) {
    const ExperimentSpec spec =
        load_experiment(write_yaml(kTwoVariants, "profile: { kernels: true, trace_steps: 2 }\n"));
    const ExperimentRun ex = run_experiment(spec, quiet());
    ASSERT_EQ(ex.results.variants.size(), 2u);
    EXPECT_FALSE(ex.results.interrupted);
    for (const VariantResult& r : ex.results.variants) {
        EXPECT_EQ(r.status, RunStatus::ok) << r.message;
        ASSERT_EQ(r.steps.size(), 5u);
        EXPECT_TRUE(r.steps[1].warmup);
        EXPECT_FALSE(r.steps[2].warmup);
        for (const StepRow& s : r.steps) {
            EXPECT_TRUE(std::isfinite(s.loss));
            EXPECT_GT(s.wall_ms, 0);
            EXPECT_GT(s.phases_ms[static_cast<int>(Phase::forward)], 0);
            EXPECT_GT(s.phases_ms[static_cast<int>(Phase::backward)], 0);
        }
        EXPECT_EQ(r.trace.size(), 2u);
        EXPECT_FALSE(r.kernels.empty());
        EXPECT_GT(r.flops.per_step, 0);
        EXPECT_GT(r.memory.tracked_peak_total, 0u);
        EXPECT_GT(r.memory.estimate_total, 0u);
        EXPECT_EQ(r.backend, "cpu");
        // The CPU kernel set it ran, as the device line names it.
        ASSERT_TRUE(r.cpu_isa.has_value());
        EXPECT_NE(r.device_name.find(*r.cpu_isa + " kernels"), std::string::npos) << r.device_name;
    }
    // Same seed, same batches, same initial weights: both AdamW implementations are bitwise
    // identical, so the losses must match exactly.
    for (size_t i = 0; i < ex.results.variants[0].steps.size(); ++i)
        EXPECT_EQ(ex.results.variants[0].steps[i].loss, ex.results.variants[1].steps[i].loss)
            << "step " << i;

    const std::string run = write_run_folder(ex.results, spec.out_dir);
    for (const char* f : {"report.md", "report.html", "results.json", "steps.csv", "trace.json"})
        EXPECT_TRUE(fs::exists(fs::path(run) / f)) << f;
    const json j = load_results(run + "/results.json");
    EXPECT_EQ(j["variants"][0]["measured_steps"], 3);
    EXPECT_EQ(j["variants"][1]["changed"]["optim.impl"], "fused");
    EXPECT_FALSE(j["variants"][0]["kernels"].empty());
    std::ifstream tin(fs::path(run) / "trace.json");
    const json trace = json::parse(tin);
    std::set<std::string> phases;
    bool ops = false;
    for (const json& e : trace["traceEvents"]) {
        if (e.value("cat", "") == "phase") phases.insert(e["name"].get<std::string>());
        if (e.value("cat", "") == "op") ops = true;
    }
    // Every phase but comm, which runs only with data parallelism (one rank here).
    EXPECT_EQ(phases.size(), static_cast<size_t>(kPhaseCount - 1));
    EXPECT_FALSE(phases.count("comm"));
    EXPECT_TRUE(ops);
    std::ifstream min(fs::path(run) / "report.md");
    std::stringstream md;
    md << min.rdbuf();
    EXPECT_NE(md.str().find("| fused |"), std::string::npos);
    EXPECT_NE(md.str().find("## Kernels: baseline"), std::string::npos);
}

TEST_F(RunnerTest, GradAccumulationRepeatsTheMicroStepPhases) {
    const ExperimentSpec spec = load_experiment(
        write_yaml("  - name: baseline\n", "profile: { trace_steps: 1 }\n"), {"run.grad_accum=3"});
    const ExperimentRun ex = run_experiment(spec, quiet());
    const VariantResult& r = ex.results.variants.at(0);
    ASSERT_EQ(r.status, RunStatus::ok) << r.message;
    ASSERT_EQ(r.trace.size(), 1u);
    int data = 0, fwd = 0, opt = 0;
    for (const PhaseInterval& iv : r.trace[0].phases) {
        data += iv.phase == Phase::data;
        fwd += iv.phase == Phase::forward;
        opt += iv.phase == Phase::optimizer;
    }
    EXPECT_EQ(data, 3);
    EXPECT_EQ(fwd, 3);
    EXPECT_EQ(opt, 1);
    for (const StepRow& s : r.steps) EXPECT_TRUE(std::isfinite(s.loss));
    // The step's loss is the mean over its micro-batches: near ln(128) for a fresh model.
    EXPECT_NEAR(r.steps[0].loss, std::log(128.0), 0.5);
    const StepStatistics& st = r.stats;
    EXPECT_NEAR(st.samples_per_s, 2 * 3 / (st.step_ms.mean / 1000.0), 1e-6);  // total / total time
}

TEST_F(RunnerTest, InjectedNaNStopsTheVariantAndTheReportIsStillWritten) {
    const ExperimentSpec spec = load_experiment(write_yaml(kTwoVariants));
    RunnerOptions o = quiet();
    o.inject_variant = "fused";
    o.inject_nan_at_step = 3;
    const ExperimentRun ex = run_experiment(spec, o);
    ASSERT_EQ(ex.results.variants.size(), 2u);
    EXPECT_EQ(ex.results.variants[0].status, RunStatus::ok);
    const VariantResult& bad = ex.results.variants[1];
    EXPECT_EQ(bad.status, RunStatus::failed);
    EXPECT_EQ(bad.failed_step, 3);
    EXPECT_EQ(bad.failed_phase, "forward");
    EXPECT_EQ(bad.steps.size(), 4u);  // steps 0..3 kept, nothing after
    EXPECT_NE(bad.message.find("'fused'"), std::string::npos) << bad.message;
    // Numbered from 0, as the progress line and the step files number it.
    EXPECT_NE(bad.message.find("at step 3 (steps[3] in results.json)"), std::string::npos)
        << bad.message;
    EXPECT_NE(bad.message.find("forward"), std::string::npos) << bad.message;

    const std::string run = write_run_folder(ex.results, spec.out_dir);
    const json j = load_results(run + "/results.json");
    EXPECT_EQ(j["variants"][1]["status"], "failed");
    EXPECT_EQ(j["variants"][1]["failed_step"], 3);
    EXPECT_TRUE(j["variants"][1]["steps"][3]["loss"].is_null());
    std::ifstream in(fs::path(run) / "report.md");
    std::stringstream md;
    md << in.rdbuf();
    EXPECT_NE(md.str().find("**Failed:"), std::string::npos);
    EXPECT_NE(md.str().find("| fused (failed) |"), std::string::npos);
}

// A finite loss that blows up (optim.lr 50: 4.7 -> 7e4 in one step) is named: the step in the
// record and results.json
// (`diverged`, null for the healthy baseline), a warning in report.md, and a verdict that rejects
// it. Interleaved rounds: the rule sees the variant's steps across its worker's slices.
TEST_F(RunnerTest, ADivergedVariantIsNamedAndNeverKept) {
    const ExperimentSpec spec =
        load_experiment(write_yaml(kTwoVariants + std::string("  - name: wild\n"
                                                              "    set: { optim.lr: 50 }\n")));
    const ExperimentRun ex = run_experiment(spec, quiet());
    ASSERT_EQ(ex.results.variants.size(), 3u);
    EXPECT_FALSE(ex.results.variants[0].diverged);
    const VariantResult& wild = ex.results.variants[2];
    EXPECT_EQ(wild.status, RunStatus::ok);  // finite all along: it ran every step
    ASSERT_TRUE(wild.diverged);
    EXPECT_GT(wild.diverged->step, 0);
    EXPECT_NE(wild.diverged->reason.find("ln V"), std::string::npos) << wild.diverged->reason;

    const std::string run = write_run_folder(ex.results, spec.out_dir);
    const json j = load_results(run + "/results.json");
    EXPECT_TRUE(j["variants"][0]["diverged"].is_null());
    EXPECT_EQ(j["variants"][2]["diverged"]["step"], wild.diverged->step);
    const json& row = j["comparison"]["variants"][2];
    EXPECT_EQ(row["variant"], "wild");
    EXPECT_NE(row["decision"], "keep");
    EXPECT_NE(row["verdict"].get<std::string>().find("diverged at step"), std::string::npos)
        << row["verdict"];
    std::ifstream in(fs::path(run) / "report.md");
    std::stringstream md;
    md << in.rdbuf();
    EXPECT_NE(md.str().find("'wild' diverged at step " + std::to_string(wild.diverged->step)),
              std::string::npos)
        << md.str();
}

// A variant that changes no knob against the baseline is marked an A/A control in results.json
// and judged as the machine's (n/a), never kept or rejected; the baseline and a variant with a
// knob are not marked. Its losses are the baseline's, bit for bit (same seed, same config).
TEST_F(RunnerTest, AVariantWithoutAChangeIsMarkedAnAAControl) {
    const ExperimentSpec spec = load_experiment(
        write_yaml(kTwoVariants + std::string("  - name: control\n"
                                              "    set: { optim.impl: unfused }\n")));
    const ExperimentRun ex = run_experiment(spec, quiet());
    ASSERT_EQ(ex.results.variants.size(), 3u);
    EXPECT_EQ(ex.results.variants[0].aa_control, false);
    EXPECT_EQ(ex.results.variants[1].aa_control, false);
    EXPECT_EQ(ex.results.variants[2].aa_control, true);
    const std::string run = write_run_folder(ex.results, spec.out_dir);
    const json j = load_results(run + "/results.json");
    EXPECT_EQ(j["variants"][2]["aa_control"], true);
    const json& row = j["comparison"]["variants"][2];
    EXPECT_EQ(row["variant"], "control");
    EXPECT_EQ(row["decision"], "n/a");
    EXPECT_EQ(row["verdict"].get<std::string>().rfind("n/a: an A/A control", 0), 0u)
        << row["verdict"];
    EXPECT_EQ(ex.results.variants[2].loss.final, ex.results.variants[0].loss.final);
}

// The progress line and the non-finite message number a step alike (from 0, as results.json's
// `steps` and `failed_step` do): the line of the NaN step says "step 3", so does the message.
TEST_F(RunnerTest, ProgressLineAndNonFiniteMessageNameTheSameStep) {
    const ExperimentSpec spec = load_experiment(write_yaml(kTwoVariants));
    RunnerOptions o = quiet();
    // A file, not a memory stream: the variants' worker processes write to it too.
    const fs::path log = dir_ / "progress.txt";
    o.out = std::fopen(log.c_str(), "w");
    ASSERT_NE(o.out, nullptr);
    o.progress_bar = false;
    o.inject_variant = "fused";
    o.inject_nan_at_step = 3;
    run_experiment(spec, o);
    std::fclose(o.out);
    std::stringstream text;
    text << std::ifstream(log).rdbuf();
    const std::string out = text.str();
    EXPECT_NE(out.find("[fused] step 3 (4 of 5)  loss "), std::string::npos) << out;
    EXPECT_NE(out.find("non-finite loss (nan) at step 3"), std::string::npos) << out;
}

// One variant after another (run.rounds 1): the variants after the interrupted one never start.
TEST_F(RunnerTest, InterruptStopsAfterTheCurrentStepAndMarksTheRun) {
    const ExperimentSpec spec = load_experiment(write_yaml(kTwoVariants), {"run.rounds=1"});
    RunnerOptions o = quiet();
    o.inject_variant = "baseline";
    o.interrupt_at_step = 2;
    const ExperimentRun ex = run_experiment(spec, o);
    EXPECT_TRUE(ex.results.interrupted);
    EXPECT_EQ(ex.results.variants[0].status, RunStatus::interrupted);
    EXPECT_EQ(ex.results.variants[0].steps.size(), 3u);  // 2 warm-up + the step that was running
    EXPECT_EQ(ex.results.variants[1].status, RunStatus::skipped);
    EXPECT_NE(ex.results.variants[1].message.find("interrupted"), std::string::npos);
    const std::string run = write_run_folder(ex.results, spec.out_dir);
    const json j = load_results(run + "/results.json");
    EXPECT_TRUE(j["interrupted"].get<bool>());
    EXPECT_EQ(j["variants"][0]["status"], "interrupted");
    EXPECT_EQ(j["variants"][0]["measured_steps"], 1);
}

// The CPU time other processes took during each step (engine/cpu_load.h): a real step's figure
// is finite and >= 0, and it reaches results.json (per step and its statistics) and steps.csv.
TEST_F(RunnerTest, EveryStepRecordsTheCpuTimeOfOtherProcesses) {
    const ExperimentSpec spec = load_experiment(write_yaml("  - name: baseline\n"));
    const ExperimentRun ex = run_experiment(spec, quiet());
    const VariantResult& r = ex.results.variants.at(0);
    ASSERT_EQ(r.status, RunStatus::ok) << r.message;
    for (const StepRow& s : r.steps) {
        EXPECT_TRUE(std::isfinite(s.other_cpu_ms)) << "step " << s.step;
        EXPECT_GE(s.other_cpu_ms, 0.0) << "step " << s.step;
        EXPECT_GE(s.steal_ms, 0.0) << "step " << s.step;
        EXPECT_FALSE(s.sm_clock_mhz.has_value()) << "the CPU backend has no device clock";
        EXPECT_FALSE(s.throttle_reasons.has_value());
    }
    EXPECT_EQ(r.stats.other_cpu_ms.n, 3u);
    EXPECT_EQ(r.stats.steal_ms.n, 3u);
    const std::string run = write_run_folder(ex.results, spec.out_dir);
    const json j = load_results(run + "/results.json");
    for (const json& s : j["variants"][0]["steps"]) {
        EXPECT_GE(s["other_cpu_ms"].get<double>(), 0);
        EXPECT_GE(s["steal_ms"].get<double>(), 0);
        EXPECT_TRUE(s["sm_clock_mhz"].is_null());
        EXPECT_TRUE(s["throttle_reasons"].is_null());
    }
    EXPECT_EQ(j["variants"][0]["stats"]["other_cpu_ms"]["n"], 3);
    std::ifstream csv(fs::path(run) / "steps.csv");
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    EXPECT_EQ(header.substr(header.size() - 22), ",other_cpu_ms,steal_ms");
    EXPECT_GE(std::stod(row.substr(row.rfind(',') + 1)), 0.0) << row;
}

TEST_F(RunnerTest, VariantNeedingAGpuIsSkippedWithAReason) {
    std::string why;
    if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present: nothing to skip";
    const ExperimentSpec spec = load_experiment(
        write_yaml("  - name: baseline\n  - name: on-gpu\n    set: { backend: cuda }\n"));
    const ExperimentRun ex = run_experiment(spec, quiet());
    EXPECT_EQ(ex.results.variants[0].status, RunStatus::ok);
    EXPECT_EQ(ex.results.variants[1].status, RunStatus::skipped);
    EXPECT_NE(ex.results.variants[1].message.find("needs a GPU"), std::string::npos)
        << ex.results.variants[1].message;
    const Comparison c = build_comparison(ex.results);
    EXPECT_NE(c.rows[1].verdict.find("needs a GPU"), std::string::npos) << c.rows[1].verdict;
}

// ---- the CLI ----------------------------------------------------------------------------------

struct Proc {
    int code = -1;
    std::string out;
};

// `microtrain <args>` through tests/test_util.h's run_microtrain.
Proc run_cli(const std::string& args) {
    const CliResult r = run_microtrain(args);
    Proc p;
    p.code = r.rc;
    p.out = r.output;
    return p;
}

std::string run_folder_of(const std::string& out) {
    const auto pos = out.find("run folder: ");
    if (pos == std::string::npos) return "";
    const auto end = out.find('\n', pos);
    return out.substr(pos + 12, end - pos - 12);
}

TEST_F(RunnerTest, RunAndCompareCommandsExitCodes) {
    const std::string yaml = write_yaml(kTwoVariants);
    const Proc ok = run_cli("run " + yaml + " --quiet");
    ASSERT_EQ(ok.code, 0) << ok.out;
    EXPECT_NE(ok.out.find("| Variant | Changed |"), std::string::npos) << ok.out;
    const std::string a = run_folder_of(ok.out);
    ASSERT_FALSE(a.empty()) << ok.out;
    EXPECT_TRUE(fs::exists(a + "/report.html"));

    const Proc intr = run_cli("run " + yaml + " --quiet --interrupt-at-step 1");
    EXPECT_EQ(intr.code, 130) << intr.out;
    const std::string b = run_folder_of(intr.out);
    ASSERT_FALSE(b.empty()) << intr.out;
    EXPECT_TRUE(fs::exists(b + "/results.json"));

    const Proc nan = run_cli("run " + yaml + " --quiet --inject-nan-at-step 2");
    EXPECT_EQ(nan.code, 1) << nan.out;
    EXPECT_NE(nan.out.find("non-finite loss"), std::string::npos) << nan.out;

    const Proc cmp = run_cli("compare " + a + "/results.json " + a + "/results.json");
    EXPECT_EQ(cmp.code, 0) << cmp.out;
    EXPECT_NE(cmp.out.find("| B:fused |"), std::string::npos) << cmp.out;

    const Proc bad = run_cli("compare " + a + "/results.json " + (dir_ / "nope.json").string());
    EXPECT_EQ(bad.code, 2) << bad.out;
    EXPECT_NE(bad.out.find("nope.json"), std::string::npos) << bad.out;
}

TEST_F(RunnerTest, RealSigintWritesTheReportAndExits130) {
    const std::string yaml = write_yaml("  - name: baseline\n");
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::dup2(fds[1], 2);
        ::close(fds[0]);
        ::execl(MT_BINARY, MT_BINARY, "run", yaml.c_str(), "--set", "run.measure_steps=100000",
                static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(fds[1]);
    std::string out;
    char buf[1024];
    bool sent = false;
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) {
        out.append(buf, static_cast<size_t>(n));
        // Once measured steps are running, press Ctrl-C.
        if (!sent && out.find("(4 of ") != std::string::npos) {
            ::kill(pid, SIGINT);
            sent = true;
        }
    }
    ::close(fds[0]);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ASSERT_TRUE(sent) << out;
    ASSERT_TRUE(WIFEXITED(st)) << out;
    EXPECT_EQ(WEXITSTATUS(st), 130) << out;
    const std::string run = run_folder_of(out);
    ASSERT_FALSE(run.empty()) << out;
    const json j = load_results(run + "/results.json");
    EXPECT_TRUE(j["interrupted"].get<bool>());
    EXPECT_GE(j["variants"][0]["measured_steps"].get<int>(), 1);
}

}  // namespace
}  // namespace mt

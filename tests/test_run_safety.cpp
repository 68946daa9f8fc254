// Resources checked before work starts, and nothing measured lost (issue #12, item 5): thread
// and loader-worker bounds, a memory estimate beyond the device refused before any allocation,
// the run folder created first and exclusively, an unusable or full output directory, every stop
// signal ending a run with its report (exit 128+n), a signal during the report write, a corrupt
// peak cache, the backend's vocabulary and target checks, and the "not run" verdict text.
// The disk-full tests use a real tmpfs of a few pages (they need root; skipped otherwise).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/profile.h"
#include "engine/signals.h"
#include "engine/training_session.h"
#include "experiment/runner.h"
#include "experiment/spec.h"
#include "kernels/cpu/cpu_backend.h"
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

class RunSafetyTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("mt_test_safety_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        cache_ = fs::temp_directory_path() / ("mt_test_safety_cache_" + std::to_string(::getpid()));
        ::setenv("MICROTRAIN_CACHE_DIR", cache_.c_str(), 1);
    }
    void TearDown() override {
        for (const fs::path& m : mounts_) ::umount2(m.c_str(), MNT_DETACH);
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    std::string write_yaml(const std::string& variants, const std::string& out_dir = "") {
        const std::string path = (dir_ / "tiny.yaml").string();
        std::ofstream(path) << "name: tiny\n"
                               "backend: cpu\n"
                               "model: { n_layer: 1, n_embd: 32, n_head: 2, max_seq_len: 16, "
                               "vocab_size: 128 }\n"
                               "data: { source: synthetic, batch_size: 2, seq_len: 16 }\n"
                               "run: { seed: 7, warmup_steps: 1, measure_steps: 2, threads: 1 }\n"
                               "variants:\n"
                            << variants
                            << "compare: { baseline: baseline }\n"
                               "report: { out_dir: "
                            << (out_dir.empty() ? (dir_ / "runs").string() : out_dir) << " }\n";
        return path;
    }

    // A tmpfs of `bytes` at dir_/name; empty path when it cannot be mounted (not root).
    fs::path mount_tmpfs(const std::string& name, size_t bytes, bool read_only = false) {
        const fs::path m = dir_ / name;
        fs::create_directories(m);
        const std::string opts = "size=" + std::to_string(bytes);
        if (::mount("tmpfs", m.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opts.c_str()) != 0)
            return {};
        mounts_.push_back(m);
        return m;
    }

    static RunnerOptions quiet() {
        RunnerOptions o;
        o.out = nullptr;
        o.handle_sigint = false;
        return o;
    }

    fs::path dir_, cache_;
    std::vector<fs::path> mounts_;
};

const char* kOneVariant = "  - name: baseline\n";

struct Proc {
    int code = -1;      // exit status, or -1 when killed by a signal
    int killed_by = 0;  // the signal that killed it
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

// Starts `microtrain run <yaml> <extra>` with stdout+stderr on a pipe; `on_output(out, pid)` is
// called after each read until the process ends.
template <class F>
Proc run_with_signals(const std::vector<std::string>& args, F on_output) {
    int fds[2];
    Proc p;
    if (::pipe(fds) != 0) return p;
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(fds[1], 1);
        ::dup2(fds[1], 2);
        ::close(fds[0]);
        std::vector<char*> argv{const_cast<char*>(MT_BINARY)};
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        ::execv(MT_BINARY, argv.data());
        ::_exit(127);
    }
    ::close(fds[1]);
    char buf[1024];
    ssize_t n;
    while ((n = ::read(fds[0], buf, sizeof buf)) > 0) {
        p.out.append(buf, static_cast<size_t>(n));
        on_output(p.out, pid);
    }
    ::close(fds[0]);
    int st = 0;
    ::waitpid(pid, &st, 0);
    p.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    p.killed_by = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    return p;
}

std::string run_folder_of(const std::string& out) {
    const auto pos = out.find("run folder: ");
    if (pos == std::string::npos) return "";
    const auto end = out.find('\n', pos);
    return out.substr(pos + 12, end - pos - 12);
}

std::vector<std::string> temporaries_under(const fs::path& root) {
    std::vector<std::string> t;
    std::error_code ec;
    for (const auto& e : fs::recursive_directory_iterator(root, ec))
        if (e.path().filename().string().find(".tmp.") != std::string::npos)
            t.push_back(e.path().string());
    return t;
}

std::vector<fs::path> folders_under(const fs::path& root) {
    std::vector<fs::path> v;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root, ec))
        if (e.is_directory()) v.push_back(e.path());
    return v;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

RunConfig tiny_config() {
    RunConfig c;
    c.variant = "tiny";
    c.model =
        GPTConfig{.n_layer = 1, .n_head = 2, .n_embd = 32, .max_seq_len = 16, .vocab_size = 128};
    c.data.batch_size = 2;
    c.data.seq_len = 16;
    c.run.threads = 1;
    c.profile.trace = false;
    return c;
}

// gpt2-xl at B512 T1024: terabytes, beyond any machine this runs on.
RunConfig huge_config() {
    RunConfig c = tiny_config();
    c.model = GPTConfig{
        .n_layer = 48, .n_head = 25, .n_embd = 1600, .max_seq_len = 1024, .vocab_size = 50257};
    c.data.batch_size = 512;
    c.data.seq_len = 1024;
    return c;
}

// ---- resources --------------------------------------------------------------------------------

TEST_F(RunSafetyTest, ThreadCountsAboveTheBoundAreRefusedWithAClearError) {
    RunConfig c = tiny_config();
    c.run.threads = 100000;
    try {
        create_training_backend(c, BackendKind::cpu);
        FAIL() << "run.threads 100000 accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_CONTAINS(e.what(),
                        "(run.threads, --threads) must be in 0.." + std::to_string(kMaxThreads));
        EXPECT_CONTAINS(e.what(), "100000");
    }
    BackendOptions bo;
    bo.num_threads = kMaxThreads + 1;
    EXPECT_THROW(create_cpu_backend(bo), BackendError);
    bo.num_threads = -1;
    EXPECT_THROW(create_cpu_backend(bo), BackendError);
}

// run.threads above the cores this process may use (here an affinity mask of one CPU, set with
// taskset) is said as each variant starts, and again at the top of report.md.
TEST_F(RunSafetyTest, ThreadsBeyondTheUsableCoresAreWarnedAboutAsTheVariantStarts) {
    const CliResult r =
        run_microtrain_on_one_cpu("run '" + write_yaml(kOneVariant) + "' --set run.threads=2");
    ASSERT_EQ(r.rc, 0) << r.output;
    const std::string what = "runs 2 threads on 1 usable core (affinity mask: 1 CPU)";
    EXPECT_CONTAINS(r.output, "warning: 'baseline' " + what);
    EXPECT_CONTAINS(r.output, "set it to 1 or fewer");
    std::string report;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "runs"))
        if (e.path().filename() == "report.md") report = slurp(e.path().string());
    EXPECT_CONTAINS(report, "**Warning: 'baseline' " + what + "**");
}

TEST_F(RunSafetyTest, DataWorkersAboveTheBoundAreRefusedBeforeAnyThreadStarts) {
    RunConfig c = tiny_config();
    c.data.workers = 100000;
    try {
        TrainingSession s(create_training_backend(c, BackendKind::cpu), c);
        FAIL() << "data.workers 100000 accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_CONTAINS(e.what(), "data.workers must be in 0.." + std::to_string(kMaxDataWorkers));
    }
}

TEST_F(RunSafetyTest, AnEstimateBeyondTheDeviceMemoryIsRefusedBeforeAnyAllocation) {
    const RunConfig c = huge_config();
    std::unique_ptr<Backend> backend = create_training_backend(c, BackendKind::cpu);
    MemoryEstimate e;
    try {
        check_memory_fits(c, *backend, &e);
        FAIL() << "a terabyte estimate fits?";
    } catch (const ResourceError& err) {
        const std::string m = err.what();
        EXPECT_CONTAINS(m, "does not fit in memory");
        EXPECT_CONTAINS(m, "TiB needed");
        EXPECT_CONTAINS(m, "MemAvailable");
        for (const char* cat : {"params", "grads", "optimizer", "activations", "workspace", "data"})
            EXPECT_CONTAINS(m, cat);
        EXPECT_CONTAINS(m, "lower data.batch_size (512)");
        EXPECT_CONTAINS(m, "refused before allocating anything");
    }
    EXPECT_GT(e.total(), size_t{1} << 40);
    EXPECT_EQ(backend->memory_stats().peak_total, 0u) << "something was allocated first";
    // The session refuses it the same way (train, step) before its first allocation: a
    // ResourceError, not the allocator's OutOfMemoryError.
    EXPECT_THROW(TrainingSession(std::move(backend), c), ResourceError);
}

TEST_F(RunSafetyTest, RunSkipsAVariantThatDoesNotFitAndRunsTheOthers) {
    const std::string yaml = write_yaml(
        "  - name: baseline\n"
        "  - name: huge\n"
        "    set: { model.n_layer: 48, model.n_head: 25, model.n_embd: 1600, "
        "model.max_seq_len: 1024, model.vocab_size: 50257, data.batch_size: 512, "
        "data.seq_len: 1024 }\n");
    const auto t0 = std::chrono::steady_clock::now();
    const ExperimentRun ex = run_experiment(load_experiment(yaml), quiet());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(ex.results.variants.size(), 2u);
    EXPECT_EQ(ex.results.variants[0].status, RunStatus::ok) << ex.results.variants[0].message;
    EXPECT_EQ(ex.results.variants[1].status, RunStatus::skipped);
    EXPECT_CONTAINS(ex.results.variants[1].message, "does not fit in memory");
    EXPECT_TRUE(ex.results.variants[1].steps.empty());
    EXPECT_GT(ex.results.variants[1].memory.estimate_total, size_t{1} << 40);
    EXPECT_LT(s, 60) << "the refusal must come before any work";
    const Comparison c = build_comparison(ex.results);
    EXPECT_CONTAINS(c.rows[1].verdict, "not run: does not fit in memory");
}

// ---- the run folder ---------------------------------------------------------------------------

TEST_F(RunSafetyTest, RunFoldersStartingInTheSameSecondAreDistinct) {
    const std::string out = (dir_ / "runs").string();
    std::vector<std::string> made(8);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < made.size(); ++i)
        threads.emplace_back([&, i] { made[i] = create_run_folder("same", out); });
    for (auto& t : threads) t.join();
    const std::set<std::string> distinct(made.begin(), made.end());
    EXPECT_EQ(distinct.size(), made.size());
    for (const std::string& d : made) {
        EXPECT_TRUE(fs::is_directory(d)) << d;
        EXPECT_TRUE(fs::exists(fs::path(d) / kPartialMarker)) << d;  // marked until written
    }
    // A written folder loses its marker and holds every file.
    Results results;
    results.experiment.name = "same";
    write_run_files(results, made[0]);
    EXPECT_FALSE(fs::exists(fs::path(made[0]) / kPartialMarker));
    for (const char* f : {"results.json", "steps.csv", "trace.json", "report.md", "report.html"})
        EXPECT_TRUE(fs::exists(fs::path(made[0]) / f)) << f;
}

TEST_F(RunSafetyTest, AnUnusableOutDirFailsAtOnceBeforeAnyVariantRuns) {
    const fs::path file = dir_ / "a_file";
    std::ofstream(file) << "x";
    for (const std::string& bad : {file.string(), (file / "below").string()}) {
        const Proc p = run_cli("run " + write_yaml(kOneVariant) + " --out-dir " + bad);
        EXPECT_EQ(p.code, 2) << p.out;
        EXPECT_CONTAINS(p.out, bad);
        EXPECT_CONTAINS(p.out, "Not a directory");
        EXPECT_EQ(p.out.find("variant 'baseline'"), std::string::npos) << "ran first: " << p.out;
    }
    const fs::path ro = mount_tmpfs("ro", 1 << 20, /*read_only=*/true);
    if (ro.empty()) GTEST_SKIP() << "cannot mount a read-only tmpfs here (needs root)";
    const Proc p = run_cli("run " + write_yaml(kOneVariant) + " --out-dir " + ro.string());
    EXPECT_EQ(p.code, 2) << p.out;
    EXPECT_CONTAINS(p.out, "Read-only file system");
    EXPECT_EQ(p.out.find("variant 'baseline'"), std::string::npos) << p.out;
}

TEST_F(RunSafetyTest, AFullDiskAtTheStartFailsAtOnceAndLeavesNoFolder) {
    const fs::path full = mount_tmpfs("full", 64 * 1024);
    if (full.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    {
        std::ofstream fill(full / "filler", std::ios::binary);
        const std::string page(4096, 'x');
        while (fill.write(page.data(), page.size())) {
        }
    }
    const Proc p = run_cli("run " + write_yaml(kOneVariant) + " --out-dir " + full.string());
    EXPECT_EQ(p.code, 2) << p.out;
    EXPECT_CONTAINS(p.out, "No space left on device");
    EXPECT_EQ(p.out.find("variant 'baseline'"), std::string::npos) << p.out;
    EXPECT_TRUE(folders_under(full).empty());
    EXPECT_TRUE(temporaries_under(full).empty());
}

TEST_F(RunSafetyTest, ADiskFullingUpDuringTheReportLeavesAFolderMarkedPartial) {
    // Room for the folder, its marker and results.json, not for every file: report.html (the
    // largest, with its charts) is written last and cannot fit.
    const fs::path small = mount_tmpfs("small", 48 * 1024);
    if (small.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    const Proc p = run_cli("run " + write_yaml(kOneVariant) + " --out-dir " + small.string());
    EXPECT_EQ(p.code, 1) << p.out;
    EXPECT_CONTAINS(p.out, "PARTIAL");
    EXPECT_CONTAINS(p.out, "No space left on device");
    const std::vector<fs::path> folders = folders_under(small);
    ASSERT_EQ(folders.size(), 1u) << p.out;
    const std::string marker = slurp(folders[0] / kPartialMarker);
    EXPECT_CONTAINS(marker, "PARTIAL");
    EXPECT_CONTAINS(marker, "Missing:");
    EXPECT_CONTAINS(marker, "report.html");
    EXPECT_TRUE(temporaries_under(small).empty());
    if (marker.find("results.json:") == std::string::npos) {  // results.json was written: whole
        EXPECT_NO_THROW(load_results((folders[0] / "results.json").string()));
    }
}

// A disk so full that not even the PARTIAL marker can be written: the in-progress marker said
// "still going" of a run that had ended; it is overwritten in place (no new block needed).
TEST_F(RunSafetyTest, ADiskTooFullForThePartialMarkerStillMarksTheFolderPartial) {
    const fs::path full = mount_tmpfs("full", 64 * 1024);
    if (full.empty()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    const std::string dir = create_run_folder("x", full.string());
    {
        std::ofstream fill(full / "filler", std::ios::binary);
        const std::string byte(1, 'x');
        while (fill.write(byte.data(), 1) && fill.flush()) {
        }
    }
    EXPECT_THROW(write_run_files(Results{}, dir), RunFolderError);
    const std::string marker = slurp(fs::path(dir) / kPartialMarker);
    EXPECT_CONTAINS(marker, "PARTIAL");
    EXPECT_EQ(marker.find("still going"), std::string::npos) << marker;
    EXPECT_TRUE(temporaries_under(full).empty());
}

// ---- signals ----------------------------------------------------------------------------------

class StopSignalTest : public RunSafetyTest, public ::testing::WithParamInterface<int> {};

TEST_P(StopSignalTest, EndsTheRunWithItsReportAndExits128PlusN) {
    const int sig = GetParam();
    const std::string yaml = write_yaml(kOneVariant);
    bool sent = false;
    const Proc p = run_with_signals({"run", yaml, "--set", "run.measure_steps=100000"},
                                    [&](const std::string& out, pid_t pid) {
                                        if (!sent && out.find("(4 of ") != std::string::npos) {
                                            ::kill(pid, sig);
                                            sent = true;
                                        }
                                    });
    ASSERT_TRUE(sent) << p.out;
    ASSERT_EQ(p.killed_by, 0) << "killed by signal " << p.killed_by << ": " << p.out;
    EXPECT_EQ(p.code, 128 + sig) << p.out;
    const std::string run = run_folder_of(p.out);
    ASSERT_FALSE(run.empty()) << p.out;
    const json j = load_results(run + "/results.json");
    EXPECT_TRUE(j["interrupted"].get<bool>());
    EXPECT_EQ(j["variants"][0]["status"], "interrupted");
    EXPECT_GE(j["variants"][0]["measured_steps"].get<int>(), 1);
    EXPECT_CONTAINS(j["variants"][0]["message"].get<std::string>(), signal_description(sig));
    EXPECT_TRUE(fs::exists(fs::path(run) / "report.html"));
    EXPECT_FALSE(fs::exists(fs::path(run) / kPartialMarker));
    EXPECT_TRUE(temporaries_under(dir_ / "runs").empty());
}

INSTANTIATE_TEST_SUITE_P(EverySignalAUserOrASchedulerSends, StopSignalTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP, SIGQUIT),
                         [](const ::testing::TestParamInfo<int>& i) {
                             switch (i.param) {
                                 case SIGINT:
                                     return std::string("SIGINT");
                                 case SIGTERM:
                                     return std::string("SIGTERM");
                                 case SIGHUP:
                                     return std::string("SIGHUP");
                                 default:
                                     return std::string("SIGQUIT");
                             }
                         });

TEST_F(RunSafetyTest, ASchedulersRepeatedSignalsDuringTheStepsStillGetTheReport) {
    const std::string yaml = write_yaml(kOneVariant);
    bool sent = false;
    const Proc p = run_with_signals({"run", yaml, "--set", "run.measure_steps=100000"},
                                    [&](const std::string& out, pid_t pid) {
                                        if (sent || out.find("(4 of ") == std::string::npos) return;
                                        for (int s : {SIGTERM, SIGTERM, SIGHUP, SIGUSR1})
                                            ::kill(pid, s);
                                        sent = true;
                                    });
    ASSERT_TRUE(sent) << p.out;
    ASSERT_EQ(p.killed_by, 0) << "killed by signal " << p.killed_by << ": " << p.out;
    EXPECT_TRUE(p.code == 128 + SIGTERM || p.code == 128 + SIGHUP) << p.code << ": " << p.out;
    const std::string run = run_folder_of(p.out);
    ASSERT_FALSE(run.empty()) << p.out;
    EXPECT_TRUE(load_results(run + "/results.json")["interrupted"].get<bool>());
    EXPECT_FALSE(fs::exists(fs::path(run) / kPartialMarker));
}

TEST_F(RunSafetyTest, SignalsWhileTheReportIsWrittenDoNotCutItOff) {
    // Many measured steps make the report files large enough that the signals land while they
    // are written; each arrives in its own write, between fsyncs.
    const std::string yaml = write_yaml(kOneVariant);
    bool storm = false;
    const int kinds[] = {SIGINT, SIGTERM, SIGHUP};
    const Proc p = run_with_signals(
        {"run", yaml, "--set", "run.measure_steps=400"}, [&](const std::string& out, pid_t pid) {
            if (storm || out.find("writing the report to") == std::string::npos) return;
            storm = true;
            for (int i = 0; i < 300 && ::kill(pid, kinds[i % 3]) == 0; ++i)
                std::this_thread::sleep_for(std::chrono::microseconds(200));
        });
    ASSERT_TRUE(storm) << p.out;
    ASSERT_EQ(p.killed_by, 0) << "killed mid-write by signal " << p.killed_by << ": " << p.out;
    // 0 when the process finished before the first arrived; otherwise 128 + the first delivered
    // (signals pending together are delivered lowest number first, so not always SIGINT).
    EXPECT_TRUE(p.code == 0 || p.code == 128 + SIGINT || p.code == 128 + SIGTERM ||
                p.code == 128 + SIGHUP)
        << p.code << ": " << p.out;
    const std::vector<fs::path> folders = folders_under(dir_ / "runs");
    ASSERT_EQ(folders.size(), 1u);
    EXPECT_NO_THROW(load_results((folders[0] / "results.json").string()));
    EXPECT_TRUE(fs::exists(folders[0] / "report.html"));
    EXPECT_FALSE(fs::exists(folders[0] / kPartialMarker));
    EXPECT_TRUE(temporaries_under(dir_ / "runs").empty());
}

// ---- loading ----------------------------------------------------------------------------------

TEST_F(RunSafetyTest, ACorruptPeakCacheIsNamedIgnoredAndMeasuredAgain) {
    BackendOptions bo;
    bo.num_threads = 1;
    std::unique_ptr<Backend> backend = create_cpu_backend(bo);
    const std::string name = backend->device_name();
    fs::create_directories(cache_);
    const fs::path file = cache_ / "cpu_peaks.json";
    const json corrupt = {{"probe_version", 4},
                          {"devices", {{name, {{"flops_per_s", "fast"}, {"bytes_per_s", 1e9}}}}}};
    std::ofstream(file) << corrupt.dump();
    ::testing::internal::CaptureStderr();
    std::optional<double> peak;
    EXPECT_NO_THROW(peak = peak_flops(name, Precision::fp32));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(peak.has_value());
    EXPECT_CONTAINS(err, file.string());
    EXPECT_CONTAINS(err, "flops_per_s is \"fast\", expected a number");
    // The run measures again and rewrites the cache with numbers.
    MachinePeaks p;
    EXPECT_NO_THROW(p = measure_peaks(*backend));
    EXPECT_GT(p.flops_per_s, 0);
    const json rewritten = json::parse(slurp(file));
    EXPECT_TRUE(rewritten["devices"][name]["flops_per_s"].is_number()) << rewritten.dump();
}

// ---- backend checks ---------------------------------------------------------------------------

TEST_F(RunSafetyTest, CpuBackendRefusesAVocabularyLargerThanThePaddedTable) {
    BackendOptions bo;
    bo.num_threads = 1;
    std::unique_ptr<Backend> b = create_cpu_backend(bo);
    std::vector<float> losses(1), logits(128);
    std::vector<int> targets(1, 0);
    try {
        b->run(op::ClassifierFused{.losses = losses.data(),
                                   .logits = logits.data(),
                                   .targets = targets.data(),
                                   .N = 1,
                                   .V = 129,
                                   .Vp = 128});
        FAIL() << "V > Vp accepted";
    } catch (const BackendError& e) {
        EXPECT_CONTAINS(e.what(), "vocab_size V=129 must be in 1..Vp=128");
    }
}

TEST_F(RunSafetyTest, ATargetInThePaddingIsABadTargetErrorNotAnInfiniteLoss) {
    BackendOptions bo;
    bo.num_threads = 1;
    std::unique_ptr<Backend> b = create_cpu_backend(bo);
    const int V = 100, Vp = 128;
    std::vector<float> losses(1), logits(Vp, 0.0f), probs(Vp, 1.0f / V), dlogits(Vp);
    std::vector<int> targets(1, 110);  // in the padding: inside Vp, outside V
    const auto expect_bad_target = [](auto&& run, const char* op) {
        try {
            run();
            ADD_FAILURE() << op << " accepted a target in the padding";
        } catch (const BackendError& e) {
            EXPECT_CONTAINS(e.what(), "target of row 0 is 110, outside the vocabulary [0, 100)");
        }
    };
    expect_bad_target(
        [&] {
            b->run(op::ClassifierFused{.losses = losses.data(),
                                       .logits = logits.data(),
                                       .targets = targets.data(),
                                       .N = 1,
                                       .V = V,
                                       .Vp = Vp,
                                       .dloss = 1.0f});
        },
        "classifier_fused");
    expect_bad_target(
        [&] {
            b->run(op::CrossEntropyForward{.losses = losses.data(),
                                           .probs = probs.data(),
                                           .targets = targets.data(),
                                           .N = 1,
                                           .V = V,
                                           .Vp = Vp});
        },
        "crossentropy_forward");
    expect_bad_target(
        [&] {
            b->run(op::CrossEntropySoftmaxBackward{.dlogits = dlogits.data(),
                                                   .probs = probs.data(),
                                                   .targets = targets.data(),
                                                   .N = 1,
                                                   .V = V,
                                                   .Vp = Vp,
                                                   .dloss = 1.0f});
        },
        "crossentropy_softmax_backward");
}

// ---- messages ---------------------------------------------------------------------------------

TEST_F(RunSafetyTest, TheNotRunVerdictSaysNotRunOnce) {
    const ExperimentSpec spec =
        load_experiment(write_yaml(kOneVariant + std::string("  - name: other\n"
                                                             "    set: { "
                                                             "run.seed: 8 }\n")),
                        {"run.rounds=1"});  // one after another: the second never starts
    RunnerOptions o = quiet();
    o.interrupt_at_step = 1;
    o.inject_variant = "baseline";
    ExperimentRun ex = run_experiment(spec, o);
    ASSERT_EQ(ex.results.variants.at(1).status, RunStatus::skipped);
    Comparison c = build_comparison(ex.results);
    EXPECT_EQ(c.rows[1].verdict.find("not run: not run"), std::string::npos) << c.rows[1].verdict;
    EXPECT_CONTAINS(c.rows[1].verdict, "not run: the experiment was interrupted by SIGINT");
    // A results.json written before the fix holds the old message: still said once.
    ex.results.variants[1].message = "not run: the experiment was interrupted (Ctrl-C)";
    c = build_comparison(ex.results);
    EXPECT_EQ(c.rows[1].verdict, "not run: the experiment was interrupted (Ctrl-C)");
}

}  // namespace
}  // namespace mt

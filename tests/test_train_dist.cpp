// `mpirun -np N microtrain train FILE.yaml` end to end (cli/training_run.cpp): 2 ranks of 1
// thread on a tiny synthetic config, a few seconds each. Pins the semantics (2 ranks x B train
// like one process of 2B, validation included), that rank 0 alone writes the run directory,
// that a ZeRO-1 checkpoint holds the full AdamW moments (bitwise those of ZeRO-0) and resumes in
// one process, that a 2-rank resume is a bitwise continuation, that a signal to one rank stops
// every rank after the same step, and that ranks with different configs are refused. Without MPI
// in the build the tests skip.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/safetensors.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

bool have_mpi() {
    return std::string(MT_MPIEXEC).size() > 0;
}

#define REQUIRE_MPI() \
    if (!have_mpi()) GTEST_SKIP() << "this build has no MPI (install libopenmpi-dev)"

// mpirun with the environment of mpi_test_env() (tests/test_util.h), without binding.
std::string mpirun(int np) {
    return mpi_test_env() + "timeout 300 '" + std::string(MT_MPIEXEC) + "' -np " +
           std::to_string(np) + " --bind-to none ";
}

// The tiny config of tests/test_train_cli.cpp at `batch` rows per rank: L2 C64, T16, a 10%
// validation split, a cosine schedule and clipping (so the global grad norm matters), 8 steps
// with validation and a checkpoint every 4. Small buckets, so ZeRO-1 cuts the parameters into
// several ranges per rank.
std::string tiny_yaml(const TempDir& d, const std::string& name, int batch) {
    const std::string path = d.file(name);
    std::ofstream(path) << "name: tiny\n"
                           "backend: cpu\n"
                           "model:\n  preset: tiny\n"
                           "data:\n  source: synthetic\n  batch_size: "
                        << batch
                        << "\n  seq_len: 16\n  val_fraction: 0.1\n"
                           "optim:\n  lr: 1.0e-3\n  schedule: cosine\n  warmup_steps: 3\n"
                           "  decay_steps: 20\n  grad_clip: 1.0\n"
                           "run:\n  seed: 7\n  threads: 1\n"
                           "dist:\n  bucket_mb: 0.05\n"
                           "train:\n  steps: 8\n  eval_every: 4\n  eval_batches: 2\n"
                           "  checkpoint_every: 4\n  keep_checkpoints: 3\n";
    return path;
}

// `microtrain train ARGS` under mpirun with `np` ranks (0: a plain process).
CliResult train(int np, const std::string& args) {
    std::string cmd = np > 0 ? mpirun(np) : std::string();
    cmd += "'";
    cmd += MT_BINARY;
    cmd += "' train ";
    cmd += args;
    return run_shell(cmd);
}

std::string q(const std::string& s) {
    return "'" + s + "'";
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
    std::vector<std::vector<std::string>> rows;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        std::vector<std::string> cells;
        std::stringstream ss(line);
        std::string cell;
        while (std::getline(ss, cell, ',')) cells.push_back(cell);
        if (!line.empty() && line.back() == ',') cells.push_back("");
        rows.push_back(cells);
    }
    return rows;
}

std::string ckpt(const std::string& dir, int step) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "step-%08d.safetensors", step);
    return dir + "/checkpoints/" + buf;
}

std::vector<float> floats(const SafeTensorsFile& f, const TensorEntry& t) {
    std::vector<float> x(static_cast<size_t>(t.numel()));
    f.read_f32_into(t, x.data());
    return x;
}

size_t count(const std::string& s, const std::string& what) {
    size_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
}

TEST(TrainDist, TwoRanksOfBTrainLikeOneProcessOf2B) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const CliResult two =
        train(2, q(tiny_yaml(d, "b2.yaml", 2)) + " --out-dir " + q(d.file("two")));
    ASSERT_EQ(two.rc, 0) << two.output;
    const CliResult one =
        train(0, q(tiny_yaml(d, "b4.yaml", 4)) + " --out-dir " + q(d.file("one")));
    ASSERT_EQ(one.rc, 0) << one.output;
    EXPECT_CONTAINS(two.output, "data parallel: 2 ranks");
    EXPECT_CONTAINS(two.output, "the global batch is 4");

    // The global-batch mean loss and the validation loss (each rank evaluates its rows of the
    // same validation batches) agree up to the order of fp32 sums.
    const auto a = read_csv(d.file("two/train.csv")), b = read_csv(d.file("one/train.csv"));
    ASSERT_EQ(a.size(), 9u);
    ASSERT_EQ(b.size(), 9u);
    double worst = 0;
    int vals = 0;
    for (size_t i = 1; i < a.size(); ++i) {
        ASSERT_EQ(a[i][0], b[i][0]);
        for (size_t c : {1u, 2u}) {
            ASSERT_EQ(a[i][c].empty(), b[i][c].empty()) << "row " << i << " column " << c;
            if (a[i][c].empty()) continue;
            const double x = std::stod(a[i][c]), y = std::stod(b[i][c]);
            worst = std::max(worst, std::fabs(x - y) / std::fabs(y));
            vals += c == 2;
        }
    }
    EXPECT_EQ(vals, 2);  // steps 4 and 8 validated
    EXPECT_LT(worst, 1e-5) << "worst relative loss difference";
    std::printf("[ measured ] worst relative loss difference %.3g\n", worst);

    const SafeTensorsFile fa = SafeTensorsFile::open(ckpt(d.file("two"), 8));
    const SafeTensorsFile fb = SafeTensorsFile::open(ckpt(d.file("one"), 8));
    ASSERT_EQ(fa.tensors().size(), fb.tensors().size());
    double max_diff = 0;
    for (const auto& t : fa.tensors()) {
        const TensorEntry* u = fb.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        const auto x = floats(fa, t), y = floats(fb, *u);
        ASSERT_EQ(x.size(), y.size()) << t.name;
        for (size_t i = 0; i < x.size(); ++i)
            max_diff = std::max(max_diff, static_cast<double>(std::fabs(x[i] - y[i])));
    }
    EXPECT_LT(max_diff, 2e-5) << "largest absolute difference of a checkpoint tensor";
    std::printf("[ measured ] largest checkpoint tensor difference %.3g\n", max_diff);
    EXPECT_EQ(*fa.metadata_value("microtrain.data_position"), "8");
    EXPECT_EQ(*fa.metadata_value("microtrain.world_size"), "2");
    EXPECT_EQ(*fa.metadata_value("microtrain.global_batch"), "4");
}

TEST(TrainDist, OnlyRankZeroWritesTheRunDirectoryAndPrints) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const CliResult r = train(2, q(tiny_yaml(d, "t.yaml", 2)) + " --out-dir " + q(d.file("run")));
    ASSERT_EQ(r.rc, 0) << r.output;
    // One header, then steps 1..8 once each: a second rank appending would duplicate rows.
    const auto rows = read_csv(d.file("run/train.csv"));
    ASSERT_EQ(rows.size(), 9u);
    EXPECT_EQ(rows[0][0], "step");
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i][0], std::to_string(i));
    EXPECT_EQ(count(r.output, "microtrain train: tiny"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "step 8/8"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "done: 8 steps"), 1u) << r.output;
    // Checkpoints of steps 4 and 8, nothing else (no temporaries of a second writer).
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d.file("run/checkpoints")))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names,
              (std::vector<std::string>{"step-00000004.safetensors", "step-00000008.safetensors"}));
}

TEST(TrainDist, Zero1CheckpointHoldsTheFullMomentsOfZero0AndResumesInOneProcess) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string f = q(tiny_yaml(d, "t.yaml", 2));
    const CliResult z0 = train(2, f + " --set dist.zero=0 --out-dir " + q(d.file("z0")));
    ASSERT_EQ(z0.rc, 0) << z0.output;
    const CliResult z1 = train(2, f + " --set dist.zero=1 --out-dir " + q(d.file("z1")));
    ASSERT_EQ(z1.rc, 0) << z1.output;
    EXPECT_CONTAINS(z1.output, "ZeRO-1");

    // Same tensors, same full shapes, same bytes: both stages sum in the same order, and the
    // ZeRO-1 ranks' packed moments were placed back by offset.
    const SafeTensorsFile a = SafeTensorsFile::open(ckpt(d.file("z0"), 8));
    const SafeTensorsFile b = SafeTensorsFile::open(ckpt(d.file("z1"), 8));
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    size_t moments = 0;
    for (const auto& t : a.tensors()) {
        const TensorEntry* u = b.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        EXPECT_EQ(t.shape, u->shape) << t.name;
        const auto x = a.read_raw(t), y = b.read_raw(*u);
        ASSERT_EQ(x.size(), y.size()) << t.name;
        EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << t.name << " differs";
        moments += t.name.rfind("optim.", 0) == 0;
    }
    EXPECT_GT(moments, 20u);
    // Not all zero: the moments of 8 steps were gathered, not left at their initial value.
    const auto wte_m = floats(b, *b.find("optim.m.transformer.wte.weight"));
    EXPECT_TRUE(std::any_of(wte_m.begin(), wte_m.end(), [](float x) { return x != 0; }));

    // One process continues it (same config, dist.zero 1 is a no-op on one rank), warning that
    // the global batch changed from 4 rows to 2.
    const CliResult r =
        train(0, f + " --set dist.zero=1 --resume " + q(d.file("z1")) + " --steps 10");
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "resumed from");
    EXPECT_CONTAINS(r.output, "global batch of 4 rows, this run's is 2");
    const auto rows = read_csv(d.file("z1/train.csv"));
    ASSERT_EQ(rows.size(), 11u);
    EXPECT_EQ(rows[10][0], "10");
    EXPECT_TRUE(std::isfinite(std::stod(rows[10][1])));
    EXPECT_LT(std::stod(rows[10][1]), std::log(256.0));  // it keeps training, not restarting
    EXPECT_TRUE(fs::exists(ckpt(d.file("z1"), 10)));
}

TEST(TrainDist, AZero1ResumeOnTwoRanksIsABitwiseContinuation) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string f = q(tiny_yaml(d, "t.yaml", 2)) + " --set dist.zero=1";
    ASSERT_EQ(train(2, f + " --out-dir " + q(d.file("whole"))).rc, 0);
    const CliResult first = train(2, f + " --steps 4 --out-dir " + q(d.file("cut")));
    ASSERT_EQ(first.rc, 0) << first.output;
    const CliResult second = train(2, f + " --resume " + q(d.file("cut")));
    ASSERT_EQ(second.rc, 0) << second.output;
    EXPECT_EQ(count(second.output, "warning"), 0u) << second.output;  // same global batch
    const auto a = read_csv(d.file("whole/train.csv")), b = read_csv(d.file("cut/train.csv"));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        for (size_t c = 0; c < 5 && c < a[i].size(); ++c) EXPECT_EQ(a[i][c], b[i][c]) << i;
    const SafeTensorsFile x = SafeTensorsFile::open(ckpt(d.file("whole"), 8));
    const SafeTensorsFile y = SafeTensorsFile::open(ckpt(d.file("cut"), 8));
    for (const auto& t : x.tensors()) {
        const TensorEntry* u = y.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        const auto p = x.read_raw(t), r = y.read_raw(*u);
        EXPECT_TRUE(p.size() == r.size() && std::equal(p.begin(), p.end(), r.begin())) << t.name;
    }
}

// LoRA (model.lora): the gradient buffer, the ZeRO-1 ranges and the moments cover only the
// adapters (the trainable prefix of the device layout). The ZeRO-1 checkpoint is ZeRO-0's byte
// for byte (moments of the adapters only), and a 2-rank resume continues it bitwise.
TEST(TrainDist, ALoraRunShardsOnlyTheAdaptersAndResumesBitwise) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string path = tiny_yaml(d, "t.yaml", 2);
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    std::string yaml = text.str();
    const std::string preset = "  preset: tiny\n";
    yaml.insert(yaml.find(preset) + preset.size(),
                "  lora: {rank: 4, alpha: 8, targets: [attn.c_attn, mlp.c_fc]}\n");
    std::ofstream(path) << yaml;
    const std::string f = q(path);
    ASSERT_EQ(train(2, f + " --set dist.zero=0 --out-dir " + q(d.file("z0"))).rc, 0);
    const CliResult whole = train(2, f + " --set dist.zero=1 --out-dir " + q(d.file("z1")));
    ASSERT_EQ(whole.rc, 0) << whole.output;
    const CliResult cut = train(2, f + " --set dist.zero=1 --steps 4 --out-dir " + q(d.file("c")));
    ASSERT_EQ(cut.rc, 0) << cut.output;
    const CliResult resumed = train(2, f + " --set dist.zero=1 --resume " + q(d.file("c")));
    ASSERT_EQ(resumed.rc, 0) << resumed.output;
    const SafeTensorsFile z0 = SafeTensorsFile::open(ckpt(d.file("z0"), 8));
    size_t moments = 0;
    for (const std::string& other : {d.file("z1"), d.file("c")}) {
        const SafeTensorsFile z = SafeTensorsFile::open(ckpt(other, 8));
        ASSERT_EQ(z.tensors().size(), z0.tensors().size()) << other;
        for (const auto& t : z0.tensors()) {
            const TensorEntry* u = z.find(t.name);
            ASSERT_NE(u, nullptr) << t.name;
            const auto x = z0.read_raw(t), y = z.read_raw(*u);
            EXPECT_TRUE(x.size() == y.size() && std::equal(x.begin(), x.end(), y.begin()))
                << other << ": " << t.name;
        }
    }
    for (const auto& t : z0.tensors())
        if (t.name.rfind("optim.", 0) == 0) {
            ++moments;
            EXPECT_NE(t.name.find(".lora_"), std::string::npos) << t.name;
        }
    EXPECT_EQ(moments, 2u * 2 * 2 * 2);  // m, v x 2 layers x 2 targets x (A, B)
}

// SIGTERM to rank 1 only: the stop flag is agreed in the step, so both ranks stop after the same
// step, rank 0 writes that step's checkpoint and both exit 143; a 2-rank --resume finishes.
TEST(TrainDist, ASignalToOneRankStopsEveryRankAfterTheSameStepWithACheckpoint) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string f = q(tiny_yaml(d, "t.yaml", 2)), run = d.file("run");
    // Each rank writes its pid (Open MPI names the rank in OMPI_COMM_WORLD_RANK; escaped, so the
    // rank's shell expands it, not the one that starts mpirun) and becomes microtrain; long enough
    // (3000 steps, no periodic checkpoints) to be signalled mid-run.
    const std::string rank_cmd = "echo \\$\\$ > " + d.file("pid.") +
                                 "\\$OMPI_COMM_WORLD_RANK; exec '" + std::string(MT_BINARY) +
                                 "' train " + f + " --out-dir '" + run +
                                 "' --steps 3000 --set train.checkpoint_every=0";
    std::string cmd = mpirun(2) + "sh -c \"" + rank_cmd + "\"";
    std::thread killer([&] {
        // Once rank 0 has written 20 rows, both ranks are in the loop: signal rank 1.
        for (int i = 0; i < 3000; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            std::ifstream csv(run + "/train.csv");
            std::string line;
            int rows = -1;
            while (std::getline(csv, line)) ++rows;
            std::ifstream pid(d.file("pid.1"));
            int p = 0;
            if (rows >= 20 && (pid >> p) && p > 0) {
                ::kill(p, SIGTERM);
                return;
            }
        }
    });
    const CliResult r = run_shell(cmd);
    killer.join();
    EXPECT_EQ(r.rc, 143) << r.output;  // 128 + SIGTERM, from both ranks (mpirun passes it on)
    ASSERT_EQ(count(r.output, "stopped by signal 15 after step"), 1u) << r.output;  // rank 0
    const auto rows = read_csv(run + "/train.csv");
    const int last = static_cast<int>(rows.size()) - 1;
    ASSERT_GT(last, 19);
    ASSERT_LT(last, 3000) << "the run was not stopped";
    EXPECT_CONTAINS(r.output, "after step " + std::to_string(last) + ";");
    EXPECT_TRUE(fs::exists(ckpt(run, last))) << r.output;
    const CliResult again =
        train(2, f + " --resume '" + run + "' --set train.checkpoint_every=0 --steps " +
                     std::to_string(last + 2));
    ASSERT_EQ(again.rc, 0) << again.output;
    EXPECT_EQ(read_csv(run + "/train.csv").size(), static_cast<size_t>(last + 3));
}

// Rank 0 alone checks the directory; its refusal reaches the other ranks (waiting for the resume
// point), so every rank exits 2 with one message instead of the job being aborted.
TEST(TrainDist, ADirectoryRankZeroRefusesEndsEveryRankWithExitCode2) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string f = q(tiny_yaml(d, "t.yaml", 2)), out = q(d.file("run"));
    ASSERT_EQ(train(2, f + " --out-dir " + out).rc, 0);
    const CliResult r = train(2, f + " --out-dir " + out);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_EQ(count(r.output, "already holds a training run"), 1u) << r.output;
    EXPECT_EQ(count(r.output, "MPI_ABORT"), 0u) << r.output;
    EXPECT_EQ(read_csv(d.file("run/train.csv")).size(), 9u);  // untouched
}

TEST(TrainDist, RanksWithDifferentConfigsAreRefusedBeforeAnythingIsWritten) {
    REQUIRE_MPI();
    TempDir d("mt_train_dist");
    const std::string f = q(tiny_yaml(d, "t.yaml", 2)), mt = q(MT_BINARY);
    const std::string out = q(d.file("run"));
    const CliResult r =
        run_shell(mpirun(1) + mt + " train " + f + " --out-dir " + out + " : -np 1 " + mt +
                  " train " + f + " --out-dir " + out + " --set optim.lr=0.002");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "microtrain train: rank 1 of 2");
    EXPECT_CONTAINS(r.output, "optim.lr");
    EXPECT_CONTAINS(r.output, "refused");
    EXPECT_FALSE(fs::exists(d.file("run/train.csv")));
}

}  // namespace
}  // namespace mt

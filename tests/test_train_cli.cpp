// `microtrain train FILE.yaml` end to end: the binary (MT_BINARY) on a tiny synthetic config on
// the CPU with one thread, so each run takes well under a second. Pins the run directory's
// contents (train.csv, checkpoints/), the validation column, bitwise-exact resumption (after a
// clean stop and after SIGKILL at random moments), the resume errors and the train: key checks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/data.h"
#include "io/directory_lock.h"
#include "io/safetensors.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::string q(const std::string& s) {
    return "'" + s + "'";
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
}

// The tiny config: L2 C64, B2 T16, synthetic with a 10% validation split, one thread, a cosine
// schedule (so the resumed LR must come from the restored step count), clipping on.
std::string tiny_yaml(const TempDir& d, const std::string& train_section,
                      const std::string& name = "tiny.yaml") {
    const std::string path = d.file(name);
    write_text(path,
               "name: tiny\n"
               "backend: cpu\n"
               "model:\n  preset: tiny\n"
               "data:\n  source: synthetic\n  batch_size: 2\n  seq_len: 16\n"
               "  val_fraction: 0.1\n"
               "optim:\n  lr: 1.0e-3\n  schedule: cosine\n  warmup_steps: 3\n"
               "  decay_steps: 20\n  grad_clip: 1.0\n"
               "run:\n  seed: 7\n  threads: 1\n" +
                   train_section);
    return path;
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

// The step, loss and val_loss columns as text: what must be identical after a resume (lr and
// grad_norm too; ms is a measurement).
std::vector<std::string> result_columns(const std::string& csv) {
    std::vector<std::string> out;
    for (const auto& r : read_csv(csv)) {
        std::string s;
        for (size_t i = 0; i < 5 && i < r.size(); ++i) s += r[i] + ",";
        out.push_back(s);
    }
    return out;
}

std::string ckpt(const std::string& dir, int step) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "step-%08d.safetensors", step);
    return dir + "/checkpoints/" + buf;
}

std::vector<std::string> checkpoint_names(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir + "/checkpoints"))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// Every tensor of a and b (parameters and AdamW moments), byte for byte.
void expect_same_tensors(const std::string& a, const std::string& b) {
    const SafeTensorsFile fa = SafeTensorsFile::open(a), fb = SafeTensorsFile::open(b);
    ASSERT_EQ(fa.tensors().size(), fb.tensors().size());
    size_t params = 0;
    for (const auto& t : fa.tensors()) {
        const TensorEntry* u = fb.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        const auto x = fa.read_raw(t), y = fb.read_raw(*u);
        ASSERT_EQ(x.size(), y.size()) << t.name;
        EXPECT_TRUE(std::equal(x.begin(), x.end(), y.begin())) << t.name << " differs";
        params += t.name.rfind("optim.", 0) != 0;
    }
    EXPECT_GT(params, 10u);  // the weights were compared, not only the moments
    EXPECT_EQ(*fa.metadata_value("step"), *fb.metadata_value("step"));
}

const char* kSmallTrain =
    "train:\n  steps: 12\n  eval_every: 4\n  eval_batches: 2\n  checkpoint_every: 3\n"
    "  keep_checkpoints: 2\n";

TEST(TrainCli, TrainWritesCsvAndCheckpoints) {
    TempDir d;
    const std::string out = d.file("run");
    const CliResult r =
        run_microtrain("train " + q(tiny_yaml(d, kSmallTrain)) + " --out-dir " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "step 12/12");
    EXPECT_CONTAINS(r.output, "tok/s");
    EXPECT_CONTAINS(r.output, "ETA");
    // The machine-noise summary of the run (report/noise.h), before the last line.
    EXPECT_CONTAINS(r.output, "machine: other processes took ");
    // 12 short steps: shorter than one stretch (2 s), so the whole run is named.
    EXPECT_CONTAINS(r.output, " cores on average over steps 1–12 (");
    const auto rows = read_csv(out + "/train.csv");
    ASSERT_EQ(rows.size(), 13u);
    EXPECT_EQ(rows[0], (std::vector<std::string>{"step", "loss", "val_loss", "lr", "grad_norm",
                                                 "ms", "other_cpu_ms", "steal_ms"}));
    for (size_t i = 1; i < rows.size(); ++i) {
        ASSERT_EQ(rows[i].size(), 8u) << "row " << i;
        // What else the machine did during the step (engine/cpu_load.h): ms, >= 0.
        EXPECT_GE(std::stod(rows[i][6]), 0.0) << "row " << i;
        EXPECT_GE(std::stod(rows[i][7]), 0.0) << "row " << i;
        EXPECT_EQ(rows[i][0], std::to_string(i));
        // Round-trip exact: a double loss is printed with 17 significant digits.
        EXPECT_EQ(std::stod(rows[i][1]), std::strtod(rows[i][1].c_str(), nullptr));
        EXPECT_GT(std::stod(rows[i][1]), 4.0);
        EXPECT_GT(std::stod(rows[i][3]), 0.0);  // lr
        EXPECT_GT(std::stod(rows[i][4]), 0.0);  // grad_norm (clipping on)
    }
    // checkpoint_every 3 writes 3, 6, 9, 12; keep_checkpoints 2 leaves the newest two.
    EXPECT_EQ(checkpoint_names(out),
              (std::vector<std::string>{"step-00000009.safetensors", "step-00000012.safetensors"}));
    const SafeTensorsFile f = SafeTensorsFile::open(ckpt(out, 12));
    EXPECT_NE(f.find("transformer.wte.weight"), nullptr);
    EXPECT_NE(f.find("optim.m.transformer.wte.weight"), nullptr);
    EXPECT_NE(f.find("optim.v.transformer.h.1.mlp.c_proj.weight"), nullptr);
    EXPECT_EQ(*f.metadata_value("step"), "12");
    EXPECT_EQ(*f.metadata_value("microtrain.data_position"), "12");
    EXPECT_EQ(*f.metadata_value("microtrain.csv_rows"), "12");
    EXPECT_EQ(*f.metadata_value("microtrain.config.optim.lr"), "0.001");
    EXPECT_EQ(*f.metadata_value("microtrain.config.data.val_fraction"), "0.1");
    EXPECT_NE(f.metadata_value("microtrain.checksum"), nullptr);
}

TEST(TrainCli, ValidationLossAppearsEveryEvalEverySteps) {
    TempDir d;
    const std::string out = d.file("run");
    const CliResult r =
        run_microtrain("train " + q(tiny_yaml(d, kSmallTrain)) + " --out-dir " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    const auto rows = read_csv(out + "/train.csv");
    ASSERT_EQ(rows.size(), 13u);
    for (int step = 1; step <= 12; ++step) {
        const std::string& val = rows[step][2];
        if (step % 4 == 0) {
            ASSERT_FALSE(val.empty()) << "step " << step;
            EXPECT_GT(std::stod(val), 4.0);
        } else {
            EXPECT_TRUE(val.empty()) << "step " << step << ": " << val;
        }
    }
    // The same fixed validation batches each time, on weights that changed: different losses.
    EXPECT_NE(rows[4][2], rows[8][2]);
    EXPECT_CONTAINS(r.output, "validation the last 0.1 of the windows");
}

TEST(TrainCli, ValPathFileIsTheValidationSplit) {
    TempDir d;
    std::string train, val;
    for (int i = 0; i < 400; ++i) train += "the cat sat on the mat. ";
    for (int i = 0; i < 40; ++i) val += "a dog ran on the mat. ";
    write_text(d.file("train.txt"), train);
    write_text(d.file("val.txt"), val);
    // A relative val_path resolves against the experiment file's directory, like data.path.
    write_text(d.file("text.yaml"),
               "name: text\nbackend: cpu\nmodel: { preset: tiny }\n"
               "data: { source: text, path: train.txt, val_path: val.txt, batch_size: 2, "
               "seq_len: 16 }\nrun: { threads: 1 }\n"
               "train: { steps: 6, eval_every: 3, eval_batches: 2 }\n");
    const std::string out = d.file("run");
    const CliResult r = run_microtrain("train " + q(d.file("text.yaml")) + " --out-dir " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "validation '" + d.file("val.txt") + "'");
    const auto rows = read_csv(out + "/train.csv");
    ASSERT_EQ(rows.size(), 7u);
    EXPECT_FALSE(rows[3][2].empty());
    EXPECT_FALSE(rows[6][2].empty());
    EXPECT_TRUE(rows[5][2].empty());
}

// Issue #25 item 8: a validation file the loader cannot read (a token >= vocab_size) failed
// after the run directory and train.csv existed, naming no key. It is an input error (exit 2)
// naming data.val_path and the file, before anything is created.
TEST(TrainCli, ABadValPathFailsBeforeTheRunDirectoryNamingTheKey) {
    TempDir d;
    write_token_file(d.file("train.bin"), std::vector<uint16_t>(2000, 7));
    std::vector<uint16_t> val(200, 7);
    val[3] = 600;  // the tiny preset's vocabulary is smaller
    write_token_file(d.file("val.bin"), val);
    write_text(d.file("exp.yaml"),
               "name: v\nbackend: cpu\nmodel: { preset: tiny }\n"
               "data: { source: tokens, path: train.bin, val_path: val.bin, batch_size: 2, "
               "seq_len: 16 }\nrun: { threads: 1 }\ntrain: { steps: 2 }\n");
    const std::string out = d.file("run");
    const CliResult r = run_microtrain("train " + q(d.file("exp.yaml")) + " --out-dir " + q(out));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "data.val_path: '" + d.file("val.bin") + "': token 600");
    EXPECT_FALSE(fs::exists(out)) << "nothing is created for a run that cannot start";
}

// Issue #25 item 10, the same class: the smoke test's --lr is read by optim.lr's parser, so a
// value its 32-bit float would turn into 0 is refused naming the flag and the key.
TEST(TrainCli, OneBatchLrIsCheckedLikeItsKey) {
    const CliResult r = run_microtrain("train --one-batch --steps 1 --threads 1 --lr 1e-50");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "--lr 1e-50: key 'optim.lr'");
    EXPECT_CONTAINS(r.output, "smaller would round to 0");
}

TEST(TrainCli, ResumedRunIsBitwiseIdenticalToUninterruptedRun) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain);
    // Loading in the step, and with two loader threads (the resumed loader starts mid-ring);
    // and with shape jitter (batch i's length follows i) over a sample cache the resumed run
    // starts empty.
    for (const std::string set :
         {"", " --set data.workers=2",
          " --set data.seq_len_jitter=0.5 --set data.cache=true --set data.workers=2"}) {
        const std::string full = d.file("full" + std::to_string(set.size()));
        const std::string part = d.file("part" + std::to_string(set.size()));
        ASSERT_EQ(run_microtrain("train " + q(yaml) + set + " --out-dir " + q(full)).rc, 0);
        // 5 steps (the last checkpoint is the final one at 5), then on to 12.
        CliResult r =
            run_microtrain("train " + q(yaml) + set + " --out-dir " + q(part) + " --steps 5");
        ASSERT_EQ(r.rc, 0) << r.output;
        r = run_microtrain("train " + q(yaml) + set + " --resume " + q(part) + " --steps 12");
        ASSERT_EQ(r.rc, 0) << r.output;
        EXPECT_CONTAINS(r.output, "resumed from " + ckpt(part, 5) + " at step 5");
        EXPECT_EQ(result_columns(full + "/train.csv"), result_columns(part + "/train.csv")) << set;
        expect_same_tensors(ckpt(full, 12), ckpt(part, 12));
    }
}

// Starts the run in the background, stdout to /dev/null, stderr to `log` (or /dev/null);
// returns its pid.
pid_t spawn_microtrain(const std::vector<std::string>& args, const std::string& log = "") {
    const pid_t pid = fork();
    if (pid == 0) {
        const int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        const int err = log.empty() ? null : open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(err, 2);
        std::vector<char*> argv{const_cast<char*>(MT_BINARY)};
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        execv(MT_BINARY, argv.data());
        _exit(127);
    }
    return pid;
}

TEST(TrainCli, SigtermStopsAfterTheStepWithACheckpointAndExit143) {
    TempDir d;
    const std::string yaml =
        tiny_yaml(d, "train:\n  steps: 100000\n  eval_every: 0\n  checkpoint_every: 0\n");
    const std::string out = d.file("run"), log = d.file("stderr.txt");
    const pid_t pid = spawn_microtrain({"train", yaml, "--out-dir", out}, log);
    ASSERT_GT(pid, 0);
    // SIGTERM once the run has trained a few steps (checkpoint_every 0: no checkpoint yet).
    while (read_csv(out + "/train.csv").size() < 4)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
    std::ifstream f(log);
    const std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_CONTAINS(err, "stopped by signal 15 after step");
    const auto names = checkpoint_names(out);
    ASSERT_EQ(names.size(), 1u);
    const int step = std::stoi(names[0].substr(5, 8));
    EXPECT_EQ(read_csv(out + "/train.csv").size(), static_cast<size_t>(step) + 1);
    EXPECT_CONTAINS(err, "continue with --resume " + out);
}

TEST(TrainCli, SigkillAtAnyMomentLeavesAResumableDirectory) {
    TempDir d;
    const std::string yaml = tiny_yaml(
        d,
        "train:\n  steps: 150\n  eval_every: 10\n  eval_batches: 2\n  checkpoint_every: 7\n"
        "  keep_checkpoints: 2\n");
    const std::string ref = d.file("ref");
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(ref)).rc, 0);
    const double run_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    // Kill moments uniform over 85% of the reference run's duration (which includes start-up,
    // before the clock below starts), seeded: a failure reproduces.
    std::mt19937 rng(12345);
    std::uniform_real_distribution<double> delay(0.0, 0.85 * run_ms);
    const int trials = 8;
    for (int trial = 0; trial < trials; ++trial) {
        const std::string out = d.file("kill" + std::to_string(trial));
        const double ms = delay(rng);
        const pid_t pid = spawn_microtrain({"train", yaml, "--out-dir", out});
        ASSERT_GT(pid, 0);
        // From the moment the run exists (its train.csv header), so a kill is never "before".
        while (!fs::exists(out + "/train.csv"))
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        const int rows_at_kill = static_cast<int>(read_csv(out + "/train.csv").size()) - 1;
        const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
        ASSERT_EQ(r.rc, 0) << "trial " << trial << " killed after " << ms << " ms (" << rows_at_kill
                           << " rows): " << r.output;
        std::printf("trial %d: SIGKILL after %.1f ms of %.1f, at %d rows (%s); resume ok\n", trial,
                    ms, run_ms, rows_at_kill,
                    WIFSIGNALED(status) ? "killed" : "had already finished");
        EXPECT_EQ(result_columns(ref + "/train.csv"), result_columns(out + "/train.csv"))
            << "trial " << trial;
        expect_same_tensors(ckpt(ref, 150), ckpt(out, 150));
    }
}

// A finite loss that blows up (lr 50, no clipping: 5.6 -> 8.7e3 at step 2) is flagged by the
// divergence rule (engine/divergence.h): a warning naming the step when it happens, the progress
// lines marked from there on, and exit 1 at the end; the checkpoints are still written.
TEST(TrainCli, ADivergingRunIsFlaggedAndExits1) {
    TempDir d;
    const std::string out = d.file("run");
    const CliResult r = run_microtrain("train " + q(tiny_yaml(d, kSmallTrain)) + " --out-dir " +
                                       q(out) + " --set optim.lr=50 --set optim.grad_clip=0");
    EXPECT_EQ(r.rc, 1) << r.output;
    EXPECT_CONTAINS(r.output, "warning: diverged at step 2: loss ");
    EXPECT_CONTAINS(r.output, "DIVERGED");
    EXPECT_CONTAINS(r.output, "the run diverged at step 2");
    EXPECT_TRUE(fs::exists(ckpt(out, 12)));
}

TEST(TrainCli, ResumeWithoutACheckpointIsRejected) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain);
    fs::create_directories(d.file("empty"));
    CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(d.file("empty")));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "nothing to resume");
    EXPECT_CONTAINS(r.output, "start the run without --resume");
    r = run_microtrain("train " + q(yaml) + " --resume " + q(d.file("absent")));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "not a directory");
}

// Builds the reference (12 steps) and a run stopped at 6 with checkpoints 3 and 6.
void two_checkpoints(const TempDir& d, const std::string& yaml, const std::string& out) {
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(d.file("ref"))).rc, 0);
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 6").rc, 0);
    ASSERT_EQ(checkpoint_names(out),
              (std::vector<std::string>{"step-00000003.safetensors", "step-00000006.safetensors"}));
}

// A run directory of an older microtrain (train.csv without other_cpu_ms,steal_ms) resumes, and
// its file keeps its column set: the rows after the checkpoint have the old six columns.
TEST(TrainCli, AnOlderTrainCsvWithoutTheNoiseColumnsResumesWithItsOwnColumns) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    std::string old;
    for (const auto& row : read_csv(out + "/train.csv")) {
        ASSERT_EQ(row.size(), 8u);
        for (size_t i = 0; i < 6; ++i) old += row[i] + (i < 5 ? "," : "\n");
    }
    write_text(out + "/train.csv", old);
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 6) + " at step 6");
    const auto rows = read_csv(out + "/train.csv");
    ASSERT_EQ(rows.size(), 13u);
    EXPECT_EQ(rows[0],
              (std::vector<std::string>{"step", "loss", "val_loss", "lr", "grad_norm", "ms"}));
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i].size(), 6u) << "row " << i;
    EXPECT_EQ(result_columns(d.file("ref") + "/train.csv"), result_columns(out + "/train.csv"));
}

TEST(TrainCli, TruncatedNewestCheckpointFallsBackToThePreviousWithAWarning) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    fs::resize_file(ckpt(out, 6), fs::file_size(ckpt(out, 6)) / 2);
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "warning: skipping checkpoint " + ckpt(out, 6));
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 3) + " at step 3");
    EXPECT_EQ(result_columns(d.file("ref") + "/train.csv"), result_columns(out + "/train.csv"));
    expect_same_tensors(ckpt(d.file("ref"), 12), ckpt(out, 12));
}

TEST(TrainCli, DamagedNewestCheckpointFailsItsChecksumAndFallsBack) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    {  // flip one byte near the end: inside the last tensor's data, the structure stays valid
        std::fstream f(ckpt(out, 6), std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(-9, std::ios::end);
        char c = 0;
        f.read(&c, 1);
        c ^= 0x40;
        f.seekp(-9, std::ios::end);
        f.write(&c, 1);
    }
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "skipping checkpoint " + ckpt(out, 6) +
                                  ": its tensors or its microtrain.* metadata do not match");
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 3));
    expect_same_tensors(ckpt(d.file("ref"), 12), ckpt(out, 12));
}

// A newest checkpoint whose header gives a tensor another shape of the same size (its bytes, so
// its checksum, unchanged) is skipped like a damaged one, naming the tensor: the run resumes from
// the previous checkpoint and ends as an uninterrupted run does.
TEST(TrainCli, ACheckpointWithAMismatchedShapeFallsBackToThePrevious) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    {  // wpe (max_seq_len 32, n_embd 64) -> (64, 32) in the JSON header
        std::fstream f(ckpt(out, 6), std::ios::in | std::ios::out | std::ios::binary);
        std::string head(8192, '\0');
        f.read(head.data(), static_cast<std::streamsize>(head.size()));
        const std::string from = "\"transformer.wpe.weight\":{\"dtype\":\"F32\",\"shape\":[32,64]";
        const size_t at = head.find(from);
        ASSERT_NE(at, std::string::npos) << head.substr(0, 400);
        const std::string to = "\"transformer.wpe.weight\":{\"dtype\":\"F32\",\"shape\":[64,32]";
        f.clear();
        f.seekp(static_cast<std::streamoff>(at));
        f.write(to.data(), static_cast<std::streamsize>(to.size()));
    }
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "skipping checkpoint " + ckpt(out, 6));
    EXPECT_CONTAINS(r.output, "'transformer.wpe.weight' has shape [64, 32]");
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 3));
    expect_same_tensors(ckpt(d.file("ref"), 12), ckpt(out, 12));
}

TEST(TrainCli, ResumeRejectsAConfigMismatchNamingTheKeys) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 3").rc, 0);
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out) +
                                       " --set optim.lr=0.002 --set data.batch_size=3");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "was written by a different config");
    EXPECT_CONTAINS(r.output, "optim.lr '0.001' (checkpoint) vs '0.002' (now)");
    EXPECT_CONTAINS(r.output, "data.batch_size '2' (checkpoint) vs '3' (now)");
    EXPECT_CONTAINS(r.output, "Only train.steps (--steps) may change");
    // A fresh run into a directory that holds one is refused too.
    const CliResult again = run_microtrain("train " + q(yaml) + " --out-dir " + q(out));
    EXPECT_EQ(again.rc, 2) << again.output;
    EXPECT_CONTAINS(again.output, "already holds a training run");
}

TEST(TrainCli, BadTrainKeysAreRejectedWithLineAndColumn) {
    TempDir d;
    struct Case {
        std::string section, where, message;
    };
    const std::vector<Case> cases = {
        {"train:\n  stepz: 5\n", ":20:3", "unknown key 'train.stepz': did you mean 'train.steps'?"},
        {"train:\n  steps: 0\n", ":20:10", "expected an integer >= 1, got 0"},
        {"train:\n  eval_every: often\n", ":20:15", "expected an integer, got 'often'"},
        {"train:\n  keep_checkpoints: 0\n", ":20:21", "expected an integer >= 1, got 0"},
        {"train: 5\n", ":19:8", "expected a mapping of train settings"},
    };
    for (const auto& c : cases) {
        const std::string yaml = tiny_yaml(d, c.section);
        const CliResult r = run_microtrain("train " + q(yaml) + " --out-dir " + q(d.file("x")));
        EXPECT_EQ(r.rc, 2) << c.section << r.output;
        EXPECT_CONTAINS(r.output, yaml + c.where);
        EXPECT_CONTAINS(r.output, c.message);
    }
    // data.val_fraction is range-checked like every knob.
    const std::string yaml = tiny_yaml(d, "");
    const CliResult r = run_microtrain("train " + q(yaml) + " --set data.val_fraction=1");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "expected a number in [0, 1), got 1");
}

// run.host_sync none defers every step's loss to a window's read-back, which `train` (a CSV row
// and a finite-loss check as each step ends) cannot use: refused, naming the key.
TEST(TrainCli, HostSyncNoneIsRefusedNamingTheKey) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, "train:\n  steps: 2\n");
    const CliResult r = run_microtrain("train " + q(yaml) + " --set run.host_sync=none --out-dir " +
                                       q(d.file("x")));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "run.host_sync: none is for `microtrain run` only");
    EXPECT_FALSE(fs::exists(d.file("x")));
}

TEST(TrainCli, OneBatchSmokeTestStaysReachable) {
    for (const char* args :
         {"train --steps 2 --threads 1", "train --one-batch --steps 2 --threads 1"}) {
        const CliResult r = run_microtrain(args);
        EXPECT_EQ(r.rc, 0) << args << r.output;
        EXPECT_CONTAINS(r.output, "step    2  loss");
    }
    TempDir d;
    const CliResult r = run_microtrain("train " + q(tiny_yaml(d, kSmallTrain)) + " --lr 0.1");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "--lr is a flag of the one-batch smoke test");
}

// More threads than the cores this process may use is said when the run starts, with the fix:
// both forms of train, run in an affinity mask of one CPU (taskset), with 2 threads.
TEST(TrainCli, ThreadsBeyondTheUsableCoresAreWarnedAboutAtTheStart) {
    TempDir d;
    const std::string warning =
        "warning: the CPU backend runs 2 threads on 1 usable core (affinity mask: 1 CPU)";
    for (const std::string& args :
         {std::string("train --steps 1 --threads 2"),
          "train " + q(tiny_yaml(d, "train:\n  steps: 1\n")) + " --set run.threads=2 " +
              "--out-dir " + q(d.file("run"))}) {
        const CliResult over = run_microtrain_on_one_cpu(args);
        EXPECT_EQ(over.rc, 0) << args << over.output;
        EXPECT_CONTAINS(over.output, warning);
        EXPECT_CONTAINS(over.output, "set it to 1 or fewer");
    }
    const CliResult within = run_microtrain_on_one_cpu("train --steps 1 --threads 1");
    EXPECT_EQ(within.rc, 0) << within.output;
    EXPECT_EQ(within.output.find("warning: the CPU backend runs"), std::string::npos)
        << within.output;
}

// ---- the loader underneath: the validation split and starting at batch k -------------------

// A token file whose token p is p: a row's first input token names its window (token / T).
DataConfig numbered_tokens(const TempDir& d, int n_tokens) {
    std::vector<uint16_t> tokens(n_tokens);
    for (int p = 0; p < n_tokens; ++p) tokens[p] = static_cast<uint16_t>(p);
    write_token_file(d.file("numbered.bin"), tokens);
    DataConfig c;
    c.source = DataSource::tokens;
    c.path = d.file("numbered.bin");
    c.batch_size = 2;
    c.seq_len = 8;
    return c;
}

TEST(TrainData, ValidationSplitHoldsOutTheLastWindowsAndTrainingNeverSeesThem) {
    TempDir d;
    DataConfig c = numbered_tokens(d, 2000);  // (2000-1)/8 = 249 windows
    c.val_fraction = 0.2f;                    // the last floor(0.2 * 249) = 49 are validation
    std::set<int> train, val;
    DataLoader tl(c, 2048, 1), vl(c, 2048, 1, nullptr, {.split = DataSplit::val});
    EXPECT_EQ(tl.num_windows(), 200u);
    EXPECT_EQ(vl.num_windows(), 49u);
    for (int i = 0; i < 100; ++i) {  // one epoch of each
        const Batch& b = tl.next();
        for (int r = 0; r < 2; ++r) train.insert(b.inputs[r * 8] / 8);
    }
    for (int i = 0; i < 25; ++i) {
        const Batch& b = vl.next();
        for (int r = 0; r < 2; ++r) val.insert(b.inputs[r * 8] / 8);
    }
    EXPECT_EQ(train.size(), 200u);
    EXPECT_EQ(*train.begin(), 0);
    EXPECT_EQ(*train.rbegin(), 199);
    EXPECT_EQ(val.size(), 49u);
    EXPECT_EQ(*val.begin(), 200);
    EXPECT_EQ(*val.rbegin(), 248);
}

TEST(TrainData, StartingAtBatchKGivesTheBatchesASkippingLoaderGives) {
    TempDir d;
    DataConfig c = numbered_tokens(d, 2000);
    c.val_fraction = 0.1f;
    for (int workers : {0, 2}) {
        c.workers = workers;
        DataLoader from0(c, 2048, 3), from7(c, 2048, 3, nullptr, {.first_batch = 7});
        for (int i = 0; i < 7; ++i) from0.next();
        EXPECT_EQ(from7.position(), 7u);
        for (int i = 7; i < 150; ++i) {  // across an epoch boundary (90 batches per epoch)
            const Batch& a = from0.next();
            const Batch& b = from7.next();
            ASSERT_EQ(b.index, static_cast<uint64_t>(i));
            ASSERT_TRUE(std::equal(a.inputs, a.inputs + 16, b.inputs)) << "batch " << i;
            ASSERT_TRUE(std::equal(a.targets, a.targets + 16, b.targets)) << "batch " << i;
        }
        EXPECT_EQ(from7.position(), 150u);
    }
}

// ---- one writer per run directory, and a directory that cannot be misread (issue #25) ---------

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// Another process holds the directory (here: this test process, as a second `train` would): a
// fresh run on it exits 2 naming the holder's PID and writes nothing.
TEST(TrainCli, ASecondTrainOnALockedDirectoryExitsTwoNamingTheHolder) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    fs::create_directories(out);
    {
        const DirectoryLock held(out);
        const CliResult r = run_microtrain("train " + q(yaml) + " --out-dir " + q(out));
        EXPECT_EQ(r.rc, 2) << r.output;
        EXPECT_CONTAINS(r.output, "is in use by another microtrain process (PID " +
                                      std::to_string(::getpid()) + ")");
        EXPECT_FALSE(fs::exists(out + "/train.csv"));
    }
    // Released (as on any exit of the holder): the directory is usable again.
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 3").rc, 0);
}

TEST(TrainCli, ASecondResumeOnALockedDirectoryLeavesItUntouched) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 6").rc, 0);
    const std::string csv = slurp(out + "/train.csv");
    const DirectoryLock held(out);
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "(PID " + std::to_string(::getpid()) + ")");
    EXPECT_EQ(slurp(out + "/train.csv"), csv);
    EXPECT_EQ(checkpoint_names(out),
              (std::vector<std::string>{"step-00000003.safetensors", "step-00000006.safetensors"}));
}

// Two runs started together on one directory: exactly one trains it, and train.csv holds each
// step once.
TEST(TrainCli, TwoTrainsStartedTogetherNeverShareTheDirectory) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    const std::string cmd = "train " + q(yaml) + " --out-dir " + q(out);
    auto second = std::async(std::launch::async, [&] { return run_microtrain(cmd); });
    const CliResult a = run_microtrain(cmd);
    const CliResult b = second.get();
    EXPECT_EQ(std::min(a.rc, b.rc), 0) << a.output << b.output;
    EXPECT_EQ(std::max(a.rc, b.rc), 2) << a.output << b.output;
    const auto rows = read_csv(out + "/train.csv");
    ASSERT_EQ(rows.size(), 13u);
    for (size_t i = 1; i < rows.size(); ++i) EXPECT_EQ(rows[i][0], std::to_string(i));
}

// checkpoints/ replaced by a regular file: read as "no checkpoint yet", --resume would start at
// step 0 and cut train.csv to its header.
TEST(TrainCli, CheckpointsThatIsNotADirectoryIsAnErrorNotARestart) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 6").rc, 0);
    const std::string csv = slurp(out + "/train.csv");
    fs::remove_all(out + "/checkpoints");
    write_text(out + "/checkpoints", "not a directory\n");
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, out +
                                  "/checkpoints: is a regular file, expected the run's "
                                  "checkpoints directory");
    EXPECT_EQ(slurp(out + "/train.csv"), csv);
}

// A symbolic link planted as train.csv would have the resume replace the file it points to
// (outside the run directory): refused, and the file stays as it was.
TEST(TrainCli, ATrainCsvThatIsASymlinkIsNeverWrittenThrough) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(yaml) + " --out-dir " + q(out) + " --steps 6").rc, 0);
    fs::rename(out + "/train.csv", d.file("elsewhere.csv"));
    const std::string csv = slurp(d.file("elsewhere.csv"));
    fs::create_symlink(d.file("elsewhere.csv"), out + "/train.csv");
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, out + "/train.csv: cannot write: it is a symbolic link");
    EXPECT_EQ(slurp(d.file("elsewhere.csv")), csv);
    EXPECT_TRUE(fs::is_symlink(out + "/train.csv"));
}

TEST(TrainCli, TrainCsvThatIsAFifoIsRefusedWithoutBlocking) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    fs::create_directories(out);
    ASSERT_EQ(::mkfifo((out + "/train.csv").c_str(), 0644), 0);
    // timeout: a blocked open would otherwise hang the test.
    const CliResult r =
        run_shell("timeout 20 " + q(MT_BINARY) + " train " + q(yaml) + " --out-dir " + q(out));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "train.csv: is a FIFO (named pipe), not a regular file");
}

// Rewrites one __metadata__ value of a safetensors file, as a careless edit would (the header
// may change length: the tensors' offsets are relative to the data region, so it stays valid).
void edit_metadata(const std::string& path, const std::string& key, const std::string& value) {
    const std::string bytes = slurp(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    header["__metadata__"][key] = value;
    const std::string text = header.dump();
    const uint64_t m = text.size();
    std::string out(reinterpret_cast<const char*>(&m), 8);
    out += text + bytes.substr(8 + n);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
}

// data_position 6 -> 8 in the newest checkpoint would resume on other batches, silently: the
// checksum covers the metadata, so the file is skipped and the previous one resumes, and the
// result is the uninterrupted run's.
TEST(TrainCli, EditedDataPositionFailsTheChecksumAndFallsBack) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    edit_metadata(ckpt(out, 6), "microtrain.data_position", "8");
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "skipping checkpoint " + ckpt(out, 6) +
                                  ": its tensors or its microtrain.* metadata do not match");
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 3));
    EXPECT_EQ(result_columns(d.file("ref") + "/train.csv"), result_columns(out + "/train.csv"));
}

// A 20-digit value printed "microtrain train: stoull" and exited 1.
TEST(TrainCli, AnOutOfRangeMetadataNumberFallsBackToThePreviousCheckpoint) {
    TempDir d;
    const std::string yaml = tiny_yaml(d, kSmallTrain), out = d.file("run");
    two_checkpoints(d, yaml, out);
    edit_metadata(ckpt(out, 6), "microtrain.data_position", "123456789012345678901");
    const CliResult r = run_microtrain("train " + q(yaml) + " --resume " + q(out));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "skipping checkpoint " + ckpt(out, 6) +
                                  ": __metadata__ \"microtrain.data_position\" is "
                                  "\"123456789012345678901\", expected an integer in [0, ");
    EXPECT_CONTAINS(r.output, "resumed from " + ckpt(out, 3));
}

}  // namespace
}  // namespace mt

// `microtrain step` end to end: the binary (MT_BINARY) runs on the PyTorch-written fixtures and
// its output file matches PyTorch's (same tolerances as tests/test_parity.cpp); every bad input
// is rejected with a message saying what is wrong, a non-zero exit code and no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "tests/sanitizers.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::string data(const std::string& name) {
    return std::string(MT_TEST_DATA_DIR) + "/" + name;
}

std::string q(const std::string& s) {
    return "'" + s + "'";
}

// The step arguments for a fixture case, with the hyper-parameters its expected file records.
std::string step_args(const std::string& c, const std::string& out, const std::string& extra) {
    SafeTensorsFile e = SafeTensorsFile::open(data(c + "_expected.safetensors"));
    auto m = [&](const char* k) { return *e.metadata_value(k); };
    return "step --weights " + q(data(c + "_weights.safetensors")) + " --batch " +
           q(data(c + "_batch.safetensors")) + " --out " + q(out) + " --steps " + m("steps") +
           " --lr " + m("lr") + " --beta1 " + m("beta1") + " --beta2 " + m("beta2") + " --eps " +
           m("eps") + " --weight-decay " + m("weight_decay") + " --grad-clip " + m("grad_clip") +
           " " + extra;
}

void expect_matches_reference(const std::string& out_path, const std::string& c) {
    SafeTensorsFile got = SafeTensorsFile::open(out_path);
    SafeTensorsFile ref = SafeTensorsFile::open(data(c + "_expected.safetensors"));
    std::set<std::string> got_names, ref_names;
    for (const auto& t : got.tensors()) got_names.insert(t.name);
    for (const auto& t : ref.tensors()) ref_names.insert(t.name);
    ASSERT_EQ(got_names, ref_names) << "the output holds exactly loss, grad.<name> and <name>";
    for (const auto& t : ref.tensors()) {
        const TensorEntry& g = got.at(t.name);
        EXPECT_EQ(g.dtype, SafeTensorsDType::F32) << t.name;
        ASSERT_EQ(g.shape, t.shape) << t.name;
        const auto a = got.read_f32(t.name), b = ref.read_f32(t.name);
        double max_diff = 0, max_ref = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            max_diff = std::max(max_diff, std::fabs(double(a[i]) - b[i]));
            max_ref = std::max(max_ref, std::fabs(double(b[i])));
        }
        if (t.name == "loss")
            EXPECT_LE(max_diff, 1e-5 * max_ref) << "loss";
        else if (t.name.rfind("grad.", 0) == 0)
            EXPECT_LE(max_diff, 1e-4 * max_ref) << t.name << " max|diff| " << max_diff;
        else
            EXPECT_LE(max_diff, 2e-5) << t.name << " max|diff| " << max_diff;
    }
}

TEST(StepCli, OutputMatchesPyTorchOnTheTinyFixture) {
    TempDir dir("mt_step");
    const std::string out = dir.file("o.safetensors");
    CliResult r = run_microtrain(step_args("tiny", out, "--optim-impl fused"));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "loss before step 3");
    expect_matches_reference(out, "tiny");
}

TEST(StepCli, OutputMatchesPyTorchWithUnpaddedVocabShortSequencesAndClipping) {
    TempDir dir("mt_step");
    const std::string out = dir.file("o.safetensors");
    CliResult r = run_microtrain(step_args("tiny_v200", out, "--optim-impl unfused"));
    ASSERT_EQ(r.rc, 0) << r.output;
    expect_matches_reference(out, "tiny_v200");
    // wte keeps W's 200 rows in the output (not the model's 256 padded rows).
    SafeTensorsFile o = SafeTensorsFile::open(out);
    EXPECT_EQ(o.at("transformer.wte.weight").shape, (std::vector<int64_t>{200, 32}));
    EXPECT_EQ(o.at("grad.transformer.wte.weight").shape, (std::vector<int64_t>{200, 32}));
}

TEST(StepCli, RunsOneStepByDefault) {
    TempDir dir("mt_step");
    const std::string out = dir.file("o.safetensors");
    CliResult r = run_microtrain("step --weights " + q(data("tiny_weights.safetensors")) +
                                 " --batch " + q(data("tiny_batch.safetensors")) + " --out " +
                                 q(out) + " --optim-impl multi_tensor --threads 1");
    ASSERT_EQ(r.rc, 0) << r.output;
    SafeTensorsFile o = SafeTensorsFile::open(out);
    EXPECT_EQ(o.at("loss").shape, (std::vector<int64_t>{1}));
    const float ref = SafeTensorsFile::open(data("tiny_expected.safetensors")).read_f32("loss")[0];
    EXPECT_NEAR(o.read_f32("loss")[0], ref, 1e-5 * ref);
    EXPECT_EQ(*o.metadata_value("optim_impl"), "multi_tensor");
}

// A finite loss that blows up (lr 10 on the tiny fixture: 5.58 -> about 3400 before step 2; the
// exact figure depends on the build's float sums, which an amplification this large magnifies)
// is flagged by the divergence rule (engine/divergence.h), numbered as the loss lines number it;
// the output is still written, and the exit code is 1.
TEST(StepCli, ADivergingRunIsFlaggedAndExits1) {
    TempDir dir("mt_step");
    const std::string out = dir.file("o.safetensors");
    CliResult r = run_microtrain("step --weights " + q(data("tiny_weights.safetensors")) +
                                 " --batch " + q(data("tiny_batch.safetensors")) + " --out " +
                                 q(out) + " --steps 4 --lr 10 --threads 1");
    EXPECT_EQ(r.rc, 1) << r.output;
    EXPECT_CONTAINS(r.output, "microtrain step: warning: diverged at step 2: loss ");
    EXPECT_CONTAINS(r.output,
                    " is above 2 x 5.582 (the larger of ln V = 5.545 and the first "
                    "step's loss 5.582) and rising");
    EXPECT_EQ(SafeTensorsFile::open(out).at("loss").shape, (std::vector<int64_t>{4}));
}

TEST(StepCli, HelpDescribesEveryOption) {
    CliResult r = run_microtrain("step --help");
    EXPECT_EQ(r.rc, 0) << r.output;
    for (const char* opt :
         {"--weights", "--batch", "--out", "--steps", "--lr", "--beta1", "--beta2", "--eps",
          "--weight-decay", "--grad-clip", "--optim-impl", "--threads"})
        EXPECT_CONTAINS(r.output, opt);
}

// ---- rejections -----------------------------------------------------------------------

// Writes a batch file with the given inputs/targets (either may be omitted).
std::string write_batch(const TempDir& dir, const std::string& name, std::vector<int64_t> in_shape,
                        std::vector<int32_t> in, std::vector<int64_t> tg_shape,
                        std::vector<int32_t> tg) {
    SafeTensorsWriter w;
    if (!in_shape.empty()) w.add_i32("inputs", in_shape, std::move(in));
    if (!tg_shape.empty()) w.add_i32("targets", tg_shape, std::move(tg));
    const std::string p = dir.file(name);
    w.write(p);
    return p;
}

// Runs step with W = the tiny fixture and the given batch; expects failure without output.
CliResult expect_rejected(const TempDir& dir, const std::string& weights, const std::string& batch,
                          const std::string& extra = "") {
    const std::string out = dir.file("never.safetensors");
    CliResult r = run_microtrain("step --weights " + q(weights) + " --batch " + q(batch) +
                                 " --out " + q(out) + " " + extra);
    EXPECT_NE(r.rc, 0) << r.output;
    EXPECT_FALSE(fs::exists(out)) << "a rejected run must not write " << out;
    return r;
}

TEST(StepCli, RejectsTokenIdsOutsideTheVocabulary) {
    TempDir dir("mt_step");
    std::vector<int32_t> ids(2 * 8, 5);
    ids[1 * 8 + 3] = 256;  // vocab_size is 256
    const std::string b = write_batch(dir, "x.safetensors", {2, 8}, ids, {2, 8}, ids);
    CliResult r = expect_rejected(dir, data("tiny_weights.safetensors"), b);
    EXPECT_CONTAINS(r.output, b);
    EXPECT_CONTAINS(r.output,
                    "tensor 'inputs' has token id 256 at (b=1, t=3), outside [0, vocab_size=256)");
    std::vector<int32_t> tg(2 * 8, 5);
    tg[0] = -1;
    const std::string b2 =
        write_batch(dir, "x2.safetensors", {2, 8}, std::vector<int32_t>(16, 5), {2, 8}, tg);
    EXPECT_CONTAINS(expect_rejected(dir, data("tiny_weights.safetensors"), b2).output,
                    "tensor 'targets' has token id -1 at (b=0, t=0)");
}

TEST(StepCli, RejectsInputsAndTargetsOfDifferentShapes) {
    TempDir dir("mt_step");
    const std::string b = write_batch(dir, "x.safetensors", {4, 32}, std::vector<int32_t>(128, 1),
                                      {4, 31}, std::vector<int32_t>(124, 1));
    EXPECT_CONTAINS(expect_rejected(dir, data("tiny_weights.safetensors"), b).output,
                    "'inputs' has shape [4, 32] but 'targets' has shape [4, 31]");
    const std::string b1 = write_batch(dir, "x1.safetensors", {64}, std::vector<int32_t>(64, 1),
                                       {64}, std::vector<int32_t>(64, 1));
    EXPECT_CONTAINS(expect_rejected(dir, data("tiny_weights.safetensors"), b1).output,
                    "tensor 'inputs' has shape [64], expected (B, T)");
}

TEST(StepCli, RejectsSequencesLongerThanMaxSeqLen) {
    TempDir dir("mt_step");
    const std::string b = write_batch(dir, "x.safetensors", {1, 33}, std::vector<int32_t>(33, 1),
                                      {1, 33}, std::vector<int32_t>(33, 1));
    CliResult r = expect_rejected(dir, data("tiny_weights.safetensors"), b);
    EXPECT_CONTAINS(r.output, "sequence length T=33");
    EXPECT_CONTAINS(r.output, "exceeds max_seq_len=32");
}

TEST(StepCli, RejectsMissingTensors) {
    TempDir dir("mt_step");
    const std::string b =
        write_batch(dir, "x.safetensors", {1, 4}, std::vector<int32_t>(4, 1), {}, {});
    EXPECT_CONTAINS(expect_rejected(dir, data("tiny_weights.safetensors"), b).output,
                    "missing tensor 'targets'");

    // Weights without transformer.ln_f.bias: copy the fixture's tensors but that one.
    SafeTensorsFile src = SafeTensorsFile::open(data("tiny_weights.safetensors"));
    SafeTensorsWriter w;
    for (const auto& t : src.tensors())
        if (t.name != "transformer.ln_f.bias") w.add_f32(t.name, t.shape, src.read_f32(t.name));
    for (const auto& [k, v] : src.metadata()) w.set_metadata(k, v);
    const std::string weights = dir.file("w.safetensors");
    w.write(weights);
    CliResult r = expect_rejected(dir, weights, data("tiny_batch.safetensors"));
    EXPECT_CONTAINS(r.output, weights);
    EXPECT_CONTAINS(r.output, "missing tensor 'transformer.ln_f.bias' (expected F32 [64])");
}

TEST(StepCli, RejectsBadFlags) {
    TempDir dir("mt_step");
    const std::string w = data("tiny_weights.safetensors"), b = data("tiny_batch.safetensors");
    EXPECT_CONTAINS(expect_rejected(dir, w, b, "--optim-impl turbo").output, "--optim-impl");
    EXPECT_CONTAINS(expect_rejected(dir, w, b, "--bogus 1").output, "--bogus");
    EXPECT_CONTAINS(expect_rejected(dir, w, b, "--beta1 1.0").output, "in [0, 1)");
    EXPECT_CONTAINS(expect_rejected(dir, w, b, "--steps 0").output, "--steps");
    EXPECT_CONTAINS(expect_rejected(dir, w, dir.file("absent.safetensors")).output, "--batch");
}

TEST(StepCli, RejectsAnOutputThatIsTheSameFileAsTheWeights) {
    TempDir dir("mt_step");
    const std::string w = dir.file("w.safetensors");
    fs::copy_file(data("tiny_weights.safetensors"), w);
    const auto size_before = fs::file_size(w);
    const auto time_before = fs::last_write_time(w);
    const std::string b = q(data("tiny_batch.safetensors"));
    fs::create_symlink(w, dir.file("link.safetensors"));
    fs::create_directories(dir.file("sub"));
    // The same string, a relative path from another directory, a symlink.
    const std::string ways[] = {
        "step --weights " + q(w) + " --batch " + b + " --out " + q(w),
        "step --weights " + q(w) + " --batch " + b + " --out sub/../w.safetensors",
        "step --weights " + q(w) + " --batch " + b + " --out " + q(dir.file("link.safetensors")),
    };
    for (const std::string& args : ways) {
        CliResult r = run_microtrain(args, dir.file(""));
        EXPECT_EQ(r.rc, 2) << args << "\n" << r.output;
        EXPECT_CONTAINS(r.output, "is the same file as --weights");
        EXPECT_CONTAINS(r.output, "choose another --out path");
    }
    EXPECT_EQ(fs::file_size(w), size_before);
    EXPECT_EQ(fs::last_write_time(w), time_before);
    EXPECT_TRUE(fs::is_symlink(dir.file("link.safetensors")));
    // The batch is an input too.
    const std::string bx = dir.file("x.safetensors");
    fs::copy_file(data("tiny_batch.safetensors"), bx);
    CliResult r =
        run_microtrain("step --weights " + q(w) + " --batch " + q(bx) + " --out " + q(bx));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "is the same file as --batch");
}

TEST(StepCli, StepsAndThreadsOutOfRangeSayTheRange) {
    TempDir dir("mt_step");
    const std::string w = data("tiny_weights.safetensors"), b = data("tiny_batch.safetensors");
    for (const char* steps : {"0", "-3", "1000001"}) {
        const std::string out = expect_rejected(dir, w, b, std::string("--steps ") + steps).output;
        EXPECT_CONTAINS(out, "--steps");
        EXPECT_CONTAINS(out, "not in range 1 to 1000000");
        EXPECT_EQ(out.find("00000000000"), std::string::npos) << "a huge range: " << out;
    }
    const std::string out = expect_rejected(dir, w, b, "--threads 100000").output;
    EXPECT_CONTAINS(out, "--threads");
    EXPECT_CONTAINS(out, "not in range 0 to 1024");
}

TEST(StepCli, AnUnknownOptimImplIsRejectedNotMappedToFused) {
    TempDir dir("mt_step");
    const std::string out = expect_rejected(dir, data("tiny_weights.safetensors"),
                                            data("tiny_batch.safetensors"), "--optim-impl turbo")
                                .output;
    EXPECT_CONTAINS(out, "--optim-impl");
    EXPECT_CONTAINS(out, "turbo");
    EXPECT_CONTAINS(out, "fused");  // the choices are listed
}

// Issue #25 item 10: the AdamW flags are read by the experiment file's key table (set_knob), so
// a value the float field cannot hold is refused, not stored as inf (every parameter NaN) or 0
// (clipping silently off), and each flag takes exactly what its key takes.
TEST(StepCli, FlagsAreCheckedLikeTheirExperimentKeys) {
    TempDir dir("mt_step");
    const std::string w = data("tiny_weights.safetensors"), b = data("tiny_batch.safetensors");
    std::string out = expect_rejected(dir, w, b, "--lr 1e39").output;
    EXPECT_CONTAINS(out, "--lr 1e39: key 'optim.lr'");
    EXPECT_CONTAINS(out, "larger would become inf");
    out = expect_rejected(dir, w, b, "--grad-clip 1e-50").output;
    EXPECT_CONTAINS(out, "--grad-clip 1e-50: key 'optim.grad_clip'");
    EXPECT_CONTAINS(out, "smaller would round to 0");
    out = expect_rejected(dir, w, b, "--weight-decay 1e300").output;
    EXPECT_CONTAINS(out, "key 'optim.weight_decay'");
    out = expect_rejected(dir, w, b, "--eps 1e-60").output;
    EXPECT_CONTAINS(out, "key 'optim.eps'");
    out = expect_rejected(dir, w, b, "--beta2 0.99999999999").output;
    EXPECT_CONTAINS(out, "key 'optim.betas'");
    EXPECT_CONTAINS(out, "rounds to 1");
    // optim.lr's own range, as docs/commands.md states it (the file's key says > 0 too).
    out = expect_rejected(dir, w, b, "--lr 0").output;
    EXPECT_CONTAINS(out, "--lr 0: key 'optim.lr': expected a number > 0");
    out = expect_rejected(dir, w, b, "--lr abc").output;
    EXPECT_CONTAINS(out, "key 'optim.lr': expected a number");
}

// Issue #25 item 13: 1024 threads under an address-space limit made libgomp print "Thread
// creation failed" and exit(1) with nothing else said. The backend tries the threads first and
// fails with the count that could start and what to change.
TEST(StepCli, ThreadsThatCannotStartAreAClearError) {
#ifdef MT_UNDER_ASAN
    GTEST_SKIP() << "AddressSanitizer reserves terabytes of shadow memory at start, beyond any "
                    "ulimit -v: the release build runs this test";
#endif
    TempDir dir("mt_step");
    const std::string out = dir.file("o.safetensors");
    const CliResult r =
        run_shell("ulimit -v 2000000; '" + std::string(MT_BINARY) + "' step --weights " +
                  q(data("tiny_weights.safetensors")) + " --batch " +
                  q(data("tiny_batch.safetensors")) + " --out " + q(out) + " --threads 1024");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "cannot run 1024 CPU threads (run.threads, --threads) here: only ");
    EXPECT_CONTAINS(r.output, "lower run.threads");
    EXPECT_EQ(r.output.find("libgomp"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mt

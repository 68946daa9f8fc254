// Experiment spec: parsing, validation messages (file:line:col, key, expected, got, fix, nearest
// key), --set overrides, variant diffs, and the `microtrain validate` command.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>

#include "checkpoint/checkpoint.h"
#include "engine/data.h"
#include "experiment/spec.h"
#include "kernels/backend.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

class SpecTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               (std::string("mt_spec_") + info->name() + "_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string write(const std::string& name, const std::string& text) {
        const fs::path p = dir_ / name;
        fs::create_directories(p.parent_path());
        std::ofstream(p) << text;
        return p.string();
    }
    // Loads `text` as exp.yaml and returns the SpecError message ("" when it loaded).
    std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
        const std::string path = write("exp.yaml", text);
        try {
            load_experiment(path, sets);
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    std::string at(int line, int col) const {
        return (dir_ / "exp.yaml").string() + ":" + std::to_string(line) + ":" +
               std::to_string(col);
    }

    fs::path dir_;
};

// A small valid experiment used as the starting point of many tests.
const char* kValid = R"(name: unit
backend: cpu
model: { preset: tiny }
data: { source: synthetic, batch_size: 2, seq_len: 16 }
optim: { lr: 1.0e-3, betas: [0.9, 0.99], impl: unfused }
run: { seed: 7, warmup_steps: 1, measure_steps: 5 }
variants:
  - name: base
  - name: fused
    set: { optim.impl: fused }
  - name: two
    set: { data.workers: 2, kernels.classifier: unfused }
  - name: same
    set: { optim.lr: 0.001 }
compare: { baseline: base, loss_tolerance: 0.05 }
report: { out_dir: out }
)";

// Unknown-key messages end with the keys of the section being written.
const std::string kOptimKeys =
    " (optim keys: lr, betas, eps, weight_decay, grad_clip, impl, schedule, warmup_steps, "
    "decay_steps, min_lr_ratio, offload, freeze)";
const std::string kDataKeys =
    " (data keys: source, synthetic, path, batch_size, seq_len, workers, prefetch, pin_memory, "
    "preprocess_us, val_fraction, val_path, seq_len_jitter, cache)";

}  // namespace

TEST_F(SpecTest, ValidFileResolvesEveryVariantFromTheBase) {
    const ExperimentSpec spec = load_experiment(write("exp.yaml", kValid));
    EXPECT_EQ(spec.name, "unit");
    EXPECT_EQ(spec.baseline, "base");
    EXPECT_DOUBLE_EQ(spec.loss_tolerance.value_or(-1), 0.05);
    EXPECT_DOUBLE_EQ(spec.min_effect, kDefaultMinEffect);  // compare.min_effect unset: 2 %
    EXPECT_EQ(spec.out_dir, "out");
    ASSERT_EQ(spec.variants.size(), 4u);
    const RunConfig& b = spec.variant("base");
    EXPECT_EQ(b.backend, BackendChoice::cpu);
    EXPECT_EQ(b.model_preset, "tiny");
    EXPECT_EQ(b.model, *gpt_preset("tiny"));
    EXPECT_EQ(b.data.batch_size, 2);
    EXPECT_EQ(b.data.seq_len, 16);
    EXPECT_FLOAT_EQ(b.optim.lr, 1e-3f);
    EXPECT_FLOAT_EQ(b.optim.beta2, 0.99f);
    EXPECT_EQ(b.optim.impl, AdamWImpl::unfused);
    EXPECT_EQ(b.run.seed, 7u);
    EXPECT_EQ(b.run.measure_steps, 5);
    // Defaults from run_config.h where the file says nothing.
    EXPECT_EQ(b.data.prefetch, 2);
    EXPECT_EQ(b.run.grad_accum, 1);
    EXPECT_EQ(b.kernels.classifier, ClassifierImpl::fused);
    EXPECT_TRUE(b.changed.empty());

    const RunConfig& f = spec.variant("fused");
    EXPECT_EQ(f.optim.impl, AdamWImpl::fused);
    EXPECT_FLOAT_EQ(f.optim.lr, 1e-3f);  // everything else from the base
    EXPECT_EQ(f.changed, (std::map<std::string, std::string>{{"optim.impl", "fused"}}));
    EXPECT_THROW(spec.variant("nope"), SpecError);
}

TEST_F(SpecTest, VariantDiffsCountEveryChangedKnobAndIgnoreNoOps) {
    const ExperimentSpec spec = load_experiment(write("exp.yaml", kValid));
    const RunConfig& two = spec.variant("two");
    EXPECT_EQ(two.changed, (std::map<std::string, std::string>{{"data.workers", "2"},
                                                               {"kernels.classifier", "unfused"}}));
    // Setting a key to the base's value is no change at all.
    EXPECT_TRUE(spec.variant("same").changed.empty());
}

TEST_F(SpecTest, NoVariantsImpliesOneNamedBaseline) {
    const ExperimentSpec spec = load_experiment(write("exp.yaml", "model: { preset: tiny }\n"));
    ASSERT_EQ(spec.variants.size(), 1u);
    EXPECT_EQ(spec.variants[0].variant, "baseline");
    EXPECT_EQ(spec.baseline, "baseline");
    EXPECT_EQ(spec.name, "exp");            // the file's stem when name is absent
    EXPECT_EQ(spec.base.data.seq_len, 32);  // the default 64, capped at tiny's max_seq_len
}

TEST_F(SpecTest, CompareBaselineDefaultsToTheFirstVariant) {
    const ExperimentSpec spec = load_experiment(
        write("exp.yaml", "variants:\n  - name: a\n  - name: b\n    set: { run.seed: 3 }\n"));
    EXPECT_EQ(spec.baseline, "a");
}

// compare.baseline may name a variant with a `set:` of its own: every other variant's `changed`
// is then what it changes against that baseline (what the report compares it with and credits),
// not against the base config. The baseline's own change from the base is kept apart.
TEST_F(SpecTest, ChangesAreCountedAgainstTheNamedBaselineNotTheBaseConfig) {
    const ExperimentSpec spec = load_experiment(
        write("exp.yaml",
              "model: { preset: tiny }\ndata: { seq_len: 16 }\noptim: { impl: fused }\n"
              "variants:\n  - name: plain\n  - name: unfused\n    set: { optim.impl: unfused }\n"
              "  - name: control\n    set: { optim.impl: unfused }\n"
              "  - name: seed\n    set: { run.seed: 3 }\n"
              "compare: { baseline: unfused }\n"));
    using Changes = std::map<std::string, std::string>;
    EXPECT_EQ(spec.baseline_changes, (Changes{{"optim.impl", "unfused"}}));
    EXPECT_TRUE(spec.variant("unfused").changed.empty());
    // The base config differs from the baseline by the baseline's own knob.
    EXPECT_EQ(spec.variant("plain").changed, (Changes{{"optim.impl", "fused"}}));
    // The baseline's config under another name: an A/A control.
    EXPECT_TRUE(spec.variant("control").changed.empty());
    // One knob against the base is two against the baseline: not attributable.
    EXPECT_EQ(spec.variant("seed").changed, (Changes{{"optim.impl", "fused"}, {"run.seed", "3"}}));
}

// A preset set by the baseline and not by a variant is still one knob (model.preset), named by
// the variant's own model.
TEST_F(SpecTest, APresetSetByTheBaselineIsOneKnobForTheOthers) {
    const ExperimentSpec spec = load_experiment(
        write("exp.yaml",
              "model: { preset: tiny }\ndata: { seq_len: 16 }\nvariants:\n  - name: a\n"
              "  - name: mini\n    set: { model.preset: gpt2-mini }\n"
              "compare: { baseline: mini }\n"));
    EXPECT_EQ(spec.variant("a").changed,
              (std::map<std::string, std::string>{{"model.preset", "tiny"}}));
    EXPECT_EQ(spec.baseline_changes,
              (std::map<std::string, std::string>{{"model.preset", "gpt2-mini"}}));
}

TEST_F(SpecTest, ExplicitDimsOverrideThePresetsFields) {
    ExperimentSpec spec = load_experiment(
        write("exp.yaml", "model: { preset: gpt2-mini, vocab_size: 512 }\ndata: { seq_len: 8 }\n"));
    GPTConfig want = *gpt_preset("gpt2-mini");
    want.vocab_size = 512;
    EXPECT_EQ(spec.base.model, want);
    EXPECT_EQ(spec.base.model_preset, "");  // no longer the preset
    spec =
        load_experiment(write("exp.yaml", "model: { preset: gpt2-mini }\ndata: { seq_len: 8 }\n"));
    EXPECT_EQ(spec.base.model_preset, "gpt2-mini");
    spec = load_experiment(
        write("exp.yaml",
              "model: { n_layer: 3, n_embd: 96, n_head: 3, max_seq_len: 16, vocab_size: 300 }\n"
              "data: { seq_len: 16 }\n"));
    EXPECT_EQ(spec.base.model, (GPTConfig{3, 3, 96, 16, 300}));
}

TEST_F(SpecTest, VariantSettingAPresetIsOneKnob) {
    const ExperimentSpec spec = load_experiment(
        write("exp.yaml",
              "model: { preset: tiny }\ndata: { seq_len: 16 }\nvariants:\n  - name: a\n"
              "  - name: mini\n    set: { model.preset: gpt2-mini }\n"));
    EXPECT_EQ(spec.variant("mini").changed,
              (std::map<std::string, std::string>{{"model.preset", "gpt2-mini"}}));
    EXPECT_EQ(spec.variant("mini").model, *gpt_preset("gpt2-mini"));
}

TEST_F(SpecTest, VariantSetAcceptsNestedSections) {
    const ExperimentSpec spec = load_experiment(write(
        "exp.yaml", "variants:\n  - name: a\n    set:\n      optim: { impl: multi_tensor }\n"));
    EXPECT_EQ(spec.variant("a").optim.impl, AdamWImpl::multi_tensor);
}

TEST_F(SpecTest, UnknownKeyNamesItsPositionAndTheNearestValidKey) {
    const std::string msg = error_of("name: x\noptim:\n  lr: 1.0e-3\n  learning_rate: 3.0e-4\n");
    EXPECT_EQ(msg, at(4, 3) + ": unknown key 'optim.learning_rate': did you mean 'optim.lr'?" +
                       kOptimKeys);
    EXPECT_EQ(
        error_of("data: { batchsize: 4 }\n"),
        at(1, 9) + ": unknown key 'data.batchsize': did you mean 'data.batch_size'?" + kDataKeys);
    EXPECT_EQ(error_of("optimizer: { lr: 1 }\n"),
              at(1, 1) + ": unknown key 'optimizer': did you mean 'optim'?");
    // A key in the wrong section points at the section that has it.
    EXPECT_EQ(error_of("data: { lr: 1 }\n"),
              at(1, 9) + ": unknown key 'data.lr': did you mean 'optim.lr'?" + kDataKeys);
}

TEST_F(SpecTest, WrongTypesSayWhatWasExpectedAndWhatWasGot) {
    EXPECT_EQ(error_of("data:\n  batch_size: abc\n"),
              at(2, 15) +
                  ": key 'data.batch_size': expected an integer, got 'abc'; write a whole "
                  "number without quotes or a decimal point");
    EXPECT_NE(error_of("data: { batch_size: 2.5 }\n").find("expected an integer, got '2.5'"),
              std::string::npos);
    EXPECT_EQ(error_of("run: { precision: fp16 }\n"),
              at(1, 19) +
                  ": key 'run.precision': expected one of fp32 | tf32 | bf16, got 'fp16'; "
                  "did you mean 'fp32'?");
    EXPECT_NE(error_of("profile: { kernels: maybe }\n")
                  .find("key 'profile.kernels': expected true or false, got 'maybe'"),
              std::string::npos);
    EXPECT_NE(
        error_of("optim: { lr: fast }\n").find("key 'optim.lr': expected a number, got 'fast'"),
        std::string::npos);
    EXPECT_NE(error_of("optim: { betas: 0.9 }\n")
                  .find("key 'optim.betas': expected a list of two numbers like [0.9, 0.95], got "
                        "'0.9'"),
              std::string::npos);
    EXPECT_NE(error_of("data: 4\n")
                  .find(at(1, 7) + ": key 'data': expected a mapping of data "
                                   "settings, got '4'"),
              std::string::npos);
    EXPECT_NE(error_of("data: { batch_size: }\n").find("got nothing (an empty value)"),
              std::string::npos);
}

TEST_F(SpecTest, ImpossibleValuesAreRejectedWithTheirFix) {
    struct Case {
        std::string yaml, want;
    };
    const std::vector<Case> cases = {
        {"model: { n_embd: 64, n_head: 5 }\n",
         at(1, 30) + ": key 'model.n_head': expected model.n_embd (64) divisible by model.n_head "
                     "(5), got a remainder of 4; choose n_head among the divisors of n_embd (1, "
                     "2, 4, 8, 16, 32, 64, ...)"},
        {"model: { max_seq_len: 32 }\ndata: { seq_len: 64 }\n",
         at(2, 18) + ": key 'data.seq_len': expected data.seq_len <= model.max_seq_len (32), got "
                     "data.seq_len 64; lower data.seq_len or raise model.max_seq_len"},
        {"data: { batch_size: 0 }\n",
         at(1, 21) + ": key 'data.batch_size': expected an integer >= 1, got 0; a batch holds at "
                     "least one sequence"},
        {"run: { measure_steps: 0 }\n",
         at(1, 23) + ": key 'run.measure_steps': expected an integer >= 1, got 0; statistics "
                     "need at least one measured step (20 or more is better)"},
        {"run: { warmup_steps: -1 }\n",
         at(1, 22) + ": key 'run.warmup_steps': expected an integer >= 0, got -1; use 0 for no "
                     "warm-up steps"},
        {"optim: { betas: [0.9, 1.0] }\n",
         at(1, 17) + ": key 'optim.betas': expected both betas in [0, 1), got [0.9, 1]; typical "
                     "values are [0.9, 0.95]"},
        {"optim: { lr: 0 }\n",
         at(1, 14) + ": key 'optim.lr': expected a number > 0, got 0; typical values are 1e-4 to "
                     "1e-3"},
        {"run: { grad_accum: 0 }\n",
         at(1, 20) + ": key 'run.grad_accum': expected an integer >= 1, got 0; use 1 for no "
                     "gradient accumulation"},
        {"data: { workers: -2 }\n",
         at(1, 18) + ": key 'data.workers': expected an integer >= 0, got -2; use 0 to load "
                     "batches synchronously in the step"},
        {"optim: { schedule: cosine }\n",
         at(1, 20) + ": key 'optim.schedule': expected optim.decay_steps >= 1 with schedule "
                     "cosine, got 0; set how many steps the cosine decay lasts, or use schedule "
                     "constant"},
        {"compare: { loss_tolerance: -1 }\n",
         at(1, 28) + ": key 'compare.loss_tolerance': expected a number >= 0, got -1; it is the "
                     "allowed relative difference of the mean loss"},
        {"compare: { min_effect: 1.5 }\n",
         at(1, 24) + ": key 'compare.min_effect': expected a number >= 0 and < 1, got 1.5; it is "
                     "the smallest speedup that counts as faster or slower (0.02 = 2 %)"},
        {"compare: { min_effect: fast }\n",
         at(1, 24) + ": key 'compare.min_effect': expected a number, got 'fast'; write the "
                     "smallest speedup that counts, as a fraction such as 0.02"},
    };
    for (const auto& c : cases) EXPECT_EQ(error_of(c.yaml), c.want) << c.yaml;
}

// dist.simulate_link_ratio sets the simulated bandwidth from the measured compute: with a fixed
// bandwidth too one of them would be ignored, and without a warm-up step there is nothing to
// measure it on.
TEST_F(SpecTest, ALinkScaledToTheComputeNeedsAWarmUpAndNoFixedBandwidth) {
    EXPECT_CONTAINS(error_of("dist: { simulate_link_ratio: 1.1, simulate_link_gbps: 0.5 }\n"),
                    "expected one simulated bandwidth, got dist.simulate_link_gbps and "
                    "dist.simulate_link_ratio both set");
    EXPECT_CONTAINS(error_of("run: { warmup_steps: 0 }\ndist: { simulate_link_ratio: 1.1 }\n"),
                    "expected run.warmup_steps >= 1 with dist.simulate_link_ratio, got 0");
    EXPECT_CONTAINS(error_of("dist: { simulate_link_ratio: -1 }\n"),
                    "key 'dist.simulate_link_ratio': expected a number in [0, 100], got -1");
}

TEST_F(SpecTest, MinEffectIsReadFromTheFileAndFromSet) {
    std::string text = kValid;
    text.replace(text.find("loss_tolerance: 0.05"), 20, "loss_tolerance: 0.05, min_effect: 0.05");
    EXPECT_DOUBLE_EQ(load_experiment(write("min.yaml", text)).min_effect, 0.05);
    EXPECT_DOUBLE_EQ(
        load_experiment(write("exp.yaml", kValid), {"compare.min_effect=0.01"}).min_effect, 0.01);
}

TEST_F(SpecTest, MissingDataPathIsReportedAtTheDataSectionsMark) {
    // yaml-cpp has no mark for an absent key: the `data` mapping's position (its first key).
    EXPECT_EQ(error_of("name: x\ndata:\n  source: tokens\n  batch_size: 2\n"),
              at(3, 3) +
                  ": key 'data.path': missing; data.source tokens reads an llm.c token "
                  "file (.bin): add `path: <file>` to the data section");
}

TEST_F(SpecTest, VariantWithoutANameIsReportedAtItsMapping) {
    EXPECT_EQ(error_of("variants:\n  - name: a\n  - set: { run.seed: 2 }\n"),
              at(3, 5) +
                  ": key 'variants[1].name': missing; every variant needs a name: add "
                  "`name: <variant name>`");
}

TEST_F(SpecTest, DataFilesAreCheckedForExistenceFormatAndLength) {
    std::string msg = error_of("data: { source: tokens, path: nope.bin }\n");
    EXPECT_EQ(msg, at(1, 31) + ": key 'data.path': expected an llm.c token file (.bin), got '" +
                       (dir_ / "nope.bin").string() +
                       "' which does not exist; check the path (relative paths resolve against "
                       "the experiment file's directory)");

    write_token_file((dir_ / "short.bin").string(), std::vector<uint16_t>(20, 1));
    msg = error_of("data: { source: tokens, path: short.bin, batch_size: 2, seq_len: 16 }\n");
    EXPECT_EQ(msg, at(1, 31) +
                       ": key 'data.path': expected a data file holding at least one "
                       "batch (batch_size 2 x seq_len 16 + 1 = 33 tokens), got '" +
                       (dir_ / "short.bin").string() +
                       "' with 20 tokens; use a longer file or a smaller batch_size / seq_len");

    write("bad.bin", std::string(2000, 'x'));
    msg = error_of("data: { source: tokens, path: bad.bin }\n");
    EXPECT_NE(msg.find(at(1, 31) + ": key 'data.path': expected an llm.c token file, got a bad "
                                   "one: "),
              std::string::npos);
    EXPECT_NE(msg.find("bad magic number"), std::string::npos);

    write("t.txt", std::string(100, 'a'));
    msg = error_of("model: { vocab_size: 100 }\ndata: { source: text, path: t.txt, seq_len: 8 }\n");
    EXPECT_EQ(msg, at(1, 22) +
                       ": key 'model.vocab_size': expected model.vocab_size >= 256 for "
                       "byte-level text, got 100; set model.vocab_size: 256");
}

TEST_F(SpecTest, RelativeDataPathsResolveAgainstTheYamlDirectory) {
    fs::create_directories(dir_ / "d");
    write_token_file((dir_ / "d" / "x.bin").string(), std::vector<uint16_t>(1000, 3));
    const std::string path =
        write("sub/exp.yaml", "data: { source: tokens, path: ../d/x.bin, seq_len: 8 }\n");
    const ExperimentSpec spec = load_experiment(path);
    EXPECT_TRUE(fs::equivalent(spec.base.data.path, dir_ / "d" / "x.bin"));
}

TEST_F(SpecTest, VariantErrorsNameTheVariant) {
    EXPECT_EQ(error_of("variants:\n  - name: a\n    set: { optim.learnin_rate: 1 }\n"),
              at(3, 12) +
                  ": unknown key 'optim.learnin_rate' (variant 'a'): did you mean "
                  "'optim.lr'?" +
                  kOptimKeys);
    EXPECT_EQ(error_of("variants:\n  - name: a\n    set: { data.seq_len: 64 }\n"),
              at(3, 26) +
                  ": key 'data.seq_len' (variant 'a'): expected data.seq_len <= "
                  "model.max_seq_len (32), got data.seq_len 64; lower data.seq_len or "
                  "raise model.max_seq_len");
    EXPECT_EQ(error_of("variants:\n  - name: a\n    set: { report.out_dir: x }\n"),
              at(3, 12) +
                  ": key 'report.out_dir' (variant 'a'): cannot be set per variant, it "
                  "applies to the whole experiment; move it to the top level of the file");
    EXPECT_EQ(error_of("variants:\n  - name: a\n    sets: { run.seed: 1 }\n"),
              at(3, 5) + ": unknown key 'variants[0].sets': did you mean 'variants[0].set'?");
}

TEST_F(SpecTest, DuplicateVariantNamesAndUnknownBaselineAreRejected) {
    EXPECT_EQ(error_of("variants:\n  - name: a\n  - name: a\n"),
              at(3, 5) +
                  ": key 'variants[1].name': expected a unique variant name, got 'a' "
                  "(already used at " +
                  at(2, 5) + "); rename one of them");
    EXPECT_EQ(error_of("variants:\n  - name: base\n  - name: fused\ncompare: { baseline: bas }\n"),
              at(4, 22) +
                  ": key 'compare.baseline': expected the name of a variant (base, "
                  "fused), got 'bas'; did you mean 'base'?");
}

TEST_F(SpecTest, DuplicateKeysAreRejected) {
    EXPECT_EQ(
        error_of("optim:\n  lr: 1\n  lr: 2\n"),
        at(3, 3) + ": key 'optim.lr': given twice (first at " + at(2, 3) + "); remove one of them");
}

TEST_F(SpecTest, YamlSyntaxErrorsBecomeSpecErrorsWithPosition) {
    const std::string msg = error_of("name: x\nvariants: [a, b\nrun: {}\n");
    EXPECT_EQ(msg.rfind(at(3, 4) + ": YAML syntax error: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("fix the YAML syntax at that position"), std::string::npos);
    EXPECT_NE(error_of("- a\n- b\n").find("expected a mapping of experiment settings"),
              std::string::npos);
    const std::string missing = (dir_ / "absent.yaml").string();
    try {
        load_experiment(missing);
        FAIL() << "no error for a missing file";
    } catch (const SpecError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(missing + ": cannot open the experiment file", 0),
                  0u);
    }
}

TEST_F(SpecTest, SetOverridesTheBaseBeforeVariants) {
    const std::string path = write("exp.yaml", kValid);
    const ExperimentSpec spec =
        load_experiment(path, {"optim.lr=3e-4", "optim.betas=[0.8, 0.9]",
                               "report.out_dir=elsewhere", "optim.impl=multi_tensor"});
    EXPECT_FLOAT_EQ(spec.base.optim.lr, 3e-4f);
    EXPECT_FLOAT_EQ(spec.base.optim.beta1, 0.8f);
    EXPECT_EQ(spec.out_dir, "elsewhere");
    // Variants resolve from the overridden base; a variant's own set still wins.
    EXPECT_FLOAT_EQ(spec.variant("two").optim.lr, 3e-4f);
    EXPECT_EQ(spec.variant("base").optim.impl, AdamWImpl::multi_tensor);
    EXPECT_EQ(spec.variant("fused").optim.impl, AdamWImpl::fused);
    // 'same' sets lr back to 0.001, which now differs from the overridden base.
    EXPECT_EQ(spec.variant("same").changed,
              (std::map<std::string, std::string>{{"optim.lr", "0.001"}}));
}

TEST_F(SpecTest, SetErrorsNameTheSetArgument) {
    EXPECT_EQ(error_of(kValid, {"optim.learning_rate=1"}),
              "--set optim.learning_rate=1: unknown key 'optim.learning_rate': did you mean "
              "'optim.lr'?" +
                  kOptimKeys);
    EXPECT_EQ(error_of(kValid, {"data.batch_size=abc"}),
              "--set data.batch_size=abc: key 'data.batch_size': expected an integer, got 'abc'; "
              "write a whole number without quotes or a decimal point");
    EXPECT_EQ(error_of(kValid, {"data.seq_len=64"}),
              "--set data.seq_len=64: key 'data.seq_len': expected data.seq_len <= "
              "model.max_seq_len (32), got data.seq_len 64; lower data.seq_len or raise "
              "model.max_seq_len");
    EXPECT_EQ(error_of(kValid, {"optim.lr"}),
              "--set optim.lr: expected key=value (e.g. --set run.precision=bf16); got no '='");
    EXPECT_EQ(error_of(kValid, {"variants=[]"}),
              "--set variants=[]: key 'variants' cannot be set with --set; edit the file");
}

TEST_F(SpecTest, FlattenListsEveryKnobInAStableOrder) {
    const ExperimentSpec spec = load_experiment(write("exp.yaml", kValid));
    const auto flat = flatten(spec.base);
    std::map<std::string, std::string> m(flat.begin(), flat.end());
    EXPECT_EQ(flat.front().first, "backend");
    EXPECT_EQ(m.at("backend"), "cpu");
    EXPECT_EQ(m.at("model.preset"), "tiny");
    EXPECT_EQ(m.at("model.n_embd"), "64");
    EXPECT_EQ(m.at("optim.betas"), "[0.9, 0.99]");
    EXPECT_EQ(m.at("optim.lr"), "0.001");
    EXPECT_EQ(m.at("run.seed"), "7");
    EXPECT_EQ(m.at("kernels.matmul_gelu"), "false");
    EXPECT_EQ(m.at("profile.trace"), "true");
    EXPECT_EQ(flat.size(), m.size());  // no key twice
    EXPECT_EQ(flatten(spec.base), flat);
}

TEST_F(SpecTest, CudaOnlyFeaturesAreListed) {
    RunConfig c;
    c.backend = BackendChoice::cpu;
    EXPECT_TRUE(cuda_only_features(c).empty());
    c.kernels.attention = AttentionImpl::flash;  // the CPU backend has flash attention too
    c.data.pin_memory = true;                    // a no-op on CPU, not a GPU requirement
    EXPECT_TRUE(cuda_only_features(c).empty());
    c.run.precision = Precision::bf16;
    c.kernels.attention = AttentionImpl::cudnn;
    EXPECT_EQ(cuda_only_features(c),
              (std::vector<std::string>{"run.precision bf16", "kernels.attention cudnn"}));
}

// The fine-tuning lab starts from the base finetune_base.yaml trains (model.init_from), which a
// fresh checkout lacks: weights of the base's dimensions (L4 C128 H4 T64 V256) stand in for it.
std::string finetune_base_stand_in(const TempDir& dir) {
    const GPTConfig c{
        .n_layer = 4, .n_head = 4, .n_embd = 128, .max_seq_len = 64, .vocab_size = 256};
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, c);
    model.init_weights(1);
    save_plain_checkpoint(dir.file("base.safetensors"), c, model.get_params());
    return dir.file("base.safetensors");
}

TEST_F(SpecTest, EveryShippedConfigValidates) {
    // Exceptions to "every variant changes one knob": int8 storage needs a frozen base, which
    // against full fine-tuning comes with LoRA; the GPU ladder's flash_tc rung takes bf16
    // operands only, which against the fp32 baseline comes with run.precision: bf16 (the lab's
    // `bf16` variant is its one-knob comparison), and so does its bf16_packed128 rung (the 128-bit
    // loads at bf16, compared with `bf16`).
    const std::set<std::string> multi_knob = {"lora-r8-int8", "attention_flash_tc",
                                              "bf16_packed128"};
    TempDir base_dir;
    const std::string base = finetune_base_stand_in(base_dir);
    int n = 0;
    for (const auto& e : fs::recursive_directory_iterator(fs::path(MT_SOURCE_DIR) / "configs")) {
        if (e.path().extension() != ".yaml") continue;
        ++n;
        const bool finetune = e.path().filename() == "finetune.yaml";
        EXPECT_NO_THROW({
            try {
                const ExperimentSpec s =
                    load_experiment(e.path().string(),
                                    finetune ? std::vector<std::string>{"model.init_from=" + base}
                                             : std::vector<std::string>{});
                // finetune_base.yaml is a `train` config: one run, no variants.
                if (e.path().filename() != "finetune_base.yaml") {
                    EXPECT_GE(s.variants.size(), 2u) << e.path();
                }
                for (const auto& v : s.variants) {
                    if (!multi_knob.count(v.variant)) {
                        EXPECT_LE(v.changed.size(), 1u) << v.variant;
                    }
                }
            } catch (const SpecError& err) {
                ADD_FAILURE() << err.what();
                throw;
            }
        }) << e.path();
    }
    EXPECT_GE(n, 4);
}

// ---- the validate command -------------------------------------------------------------------

namespace {
struct Proc {
    int rc = -1;
    std::string out;
};
Proc run_cmd(const std::string& cmd) {
    Proc p;
    std::unique_ptr<FILE, int (*)(FILE*)> f(::popen((cmd + " 2>&1").c_str(), "r"), ::pclose);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) p.out.append(buf.data(), n);
    const int status = ::pclose(f.release());
    p.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return p;
}
}  // namespace

TEST_F(SpecTest, ValidateCommandPrintsChangesAndFlagsMultiKnobVariants) {
    const std::string path = write("exp.yaml", kValid);  // variant 'two' changes 2 knobs
    const Proc p = run_cmd(std::string(MT_BINARY) + " validate " + path + " --set run.seed=9");
    EXPECT_EQ(p.rc, 0) << p.out;
    EXPECT_NE(p.out.find("optim.impl = fused"), std::string::npos) << p.out;
    EXPECT_NE(p.out.find("changes 2 knobs: effect cannot be attributed to one"), std::string::npos)
        << p.out;
    EXPECT_TRUE(std::regex_search(p.out, std::regex("run\\.seed +9\n"))) << p.out;  // --set
    EXPECT_NE(p.out.find("OK: "), std::string::npos) << p.out;
}

// validate lists the baseline's change from the base config, and calls a variant that runs the
// baseline's config an A/A check.
TEST_F(SpecTest, ValidateCommandShowsChangesAgainstTheBaselineAndNamesAnAAControl) {
    const std::string path =
        write("exp.yaml",
              "model: { preset: tiny }\ndata: { seq_len: 16 }\noptim: { impl: fused }\n"
              "variants:\n  - name: plain\n  - name: unfused\n    set: { optim.impl: unfused }\n"
              "  - name: control\n    set: { optim.impl: unfused }\n"
              "compare: { baseline: unfused }\n");
    const Proc p = run_cmd(std::string(MT_BINARY) + " validate " + path);
    EXPECT_EQ(p.rc, 0) << p.out;
    EXPECT_NE(p.out.find("  plain\n      optim.impl = fused\n"), std::string::npos) << p.out;
    EXPECT_NE(p.out.find("  unfused (baseline)\n      optim.impl = unfused\n      the base config "
                         "with the above: every other variant is compared with it\n"),
              std::string::npos)
        << p.out;
    EXPECT_NE(p.out.find("  control\n      the baseline's config, unchanged: an A/A check"),
              std::string::npos)
        << p.out;
}

TEST_F(SpecTest, ValidateCommandExitsTwoWithTheErrorMessage) {
    const std::string path = write("exp.yaml", "optim: { learning_rate: 1 }\n");
    const Proc p = run_cmd(std::string(MT_BINARY) + " validate " + path);
    EXPECT_EQ(p.rc, 2) << p.out;
    EXPECT_NE(
        p.out.find(at(1, 10) + ": unknown key 'optim.learning_rate': did you mean 'optim.lr'?"),
        std::string::npos)
        << p.out;
}

TEST_F(SpecTest, ValidateCommandNotesVariantsThatNeedAGpu) {
    const std::string path = write("exp.yaml",
                                   "backend: cpu\nvariants:\n  - name: a\n  - name: b\n"
                                   "    set: { run.precision: bf16 }\n");
    const Proc p = run_cmd(std::string(MT_BINARY) + " validate " + path);
    EXPECT_EQ(p.rc, 0) << p.out;
    EXPECT_NE(p.out.find("note: needs a GPU (run.precision bf16); backend is cpu"),
              std::string::npos)
        << p.out;
}

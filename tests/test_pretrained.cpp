// Starting points (checkpoint/pretrained.h): the Hugging Face GPT-2 fixture made by
// tools/make_hf_fixture.py, microtrain's own checkpoints, model.init_from, `train --init-from`
// and the errors every malformed or mismatched file gets.
//
// Tolerance of our forward against the fixture's reference logits (transformers' GPT2LMHeadModel,
// float32, eager attention): both sides compute in float32 with different summation orders
// (Eigen/our GEMM vs PyTorch's), so each dot product of length K (at most 4C = 256 here) differs by
// about sqrt(K) * 2^-24 * sum|terms|, and two LayerNorms per block rescale those differences by up
// to 1/std of their inputs. 1e-4 absolute on logits of magnitude up to 2.6 (4e-5 relative) is
// about 100x that estimate (measured worst: kLogitTolerance's comment). A transposed Conv1D
// weight, a dropped bias or a swapped q/k/v changes logits by O(0.1-1) (the fixture's weights
// are scaled up and its biases perturbed for that reason).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "checkpoint/pretrained.h"
#include "experiment/spec.h"
#include "kernels/backend.h"
#include "optim/adamw.h"
#include "test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

const std::string kFixtureDir = MT_TEST_DATA_DIR "/hf_gpt2_tiny";
const std::string kFixture = kFixtureDir + "/model.safetensors";
const std::string kLogits = MT_TEST_DATA_DIR "/hf_gpt2_tiny_logits.safetensors";
// Measured worst |diff| 9.5e-7 (release build, CPU, packed GEMM); the derivation is at the top.
constexpr double kLogitTolerance = 1e-4;

std::string q(const std::string& s) {
    std::string quoted = "'";  // appended piecewise: GCC 12's -Wrestrict false positive on "'" + s
    quoted += s;
    quoted += "'";
    return quoted;
}

// Our forward's logits (T, V) for one sequence, the padded columns dropped.
std::vector<float> forward_logits(GPT& model, const std::vector<int32_t>& tokens) {
    Backend& backend = model.backend();
    const int T = static_cast<int>(tokens.size());
    const int V = model.config().vocab_size, Vp = model.config().padded_vocab_size();
    model.allocate_activations(1, T);
    DeviceBuffer in(backend, tokens.size() * sizeof(int32_t), MemoryCategory::data);
    backend.copy_to_device(in.get(), tokens.data(), tokens.size() * sizeof(int32_t));
    model.forward(in.as<int>(), nullptr, 1, T);
    std::vector<float> padded(static_cast<size_t>(T) * Vp), out;
    backend.copy_to_host(padded.data(), model.logits_device(), padded.size() * sizeof(float));
    for (int t = 0; t < T; ++t)
        out.insert(out.end(), padded.begin() + t * Vp, padded.begin() + t * Vp + V);
    return out;
}

// A copy of the fixture's folder in `dir` whose tensors pass through `edit` (return false to
// drop one; it may rename it, reshape it or change its values), with `config_edit` applied to
// its config.json (nullptr: no config.json).
struct EditedTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> values;
};
std::string edited_fixture(const TempDir& dir, const std::function<bool(EditedTensor&)>& edit,
                           const std::function<void(nlohmann::json&)>& config_edit = {},
                           bool with_config = true, std::vector<EditedTensor> extra = {}) {
    const SafeTensorsFile f = SafeTensorsFile::open(kFixture);
    SafeTensorsWriter w;
    w.set_metadata("format", "pt");
    for (const auto& t : f.tensors()) {
        EditedTensor e{t.name, t.shape, f.read_f32(t.name)};
        if (!edit(e)) continue;
        w.add_f32(e.name, e.shape, std::move(e.values));
    }
    for (EditedTensor& e : extra) w.add_f32(e.name, e.shape, std::move(e.values));
    w.write(dir.file("model.safetensors"));
    if (with_config) {
        nlohmann::json j = nlohmann::json::parse(std::ifstream(kFixtureDir + "/config.json"));
        if (config_edit) config_edit(j);
        std::ofstream(dir.file("config.json")) << j.dump(2);
    }
    return dir.file("model.safetensors");
}

std::string load_error(const std::string& path) {
    try {
        const PretrainedInfo info = inspect_pretrained(path);
        (void)read_pretrained_params(info);
    } catch (const CheckpointError& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(Pretrained, HuggingFaceFixtureIsRecognisedWithItsConfig) {
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    EXPECT_EQ(info.format, WeightsFormat::hugging_face);
    EXPECT_EQ(info.weights_path, kFixture);
    EXPECT_EQ(info.config.describe(), "L2 C64 H4 T64 V300");
    EXPECT_EQ(info.config.padded_vocab_size(), 384);  // the padding path is exercised
    EXPECT_CONTAINS(info.describe(), "Hugging Face GPT-2");
    // The file itself names the same weights as its folder.
    EXPECT_EQ(inspect_pretrained(kFixture).config, info.config);
}

TEST(Pretrained, OurForwardOnTheHuggingFaceFixtureMatchesItsReferenceLogits) {
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, info.config);
    load_pretrained(info, model, 1);
    const SafeTensorsFile ref = SafeTensorsFile::open(kLogits);
    const std::vector<float> want = ref.read_f32("logits");
    const std::vector<float> got = forward_logits(model, ref.read_i32("tokens"));
    ASSERT_EQ(got.size(), want.size());
    double worst = 0, largest = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
        largest = std::max(largest, std::fabs(double(want[i])));
    }
    EXPECT_LE(worst, kLogitTolerance) << "largest reference logit " << largest;
    EXPECT_GT(largest, 1.0);  // logits that would show a wrong weight
    std::printf("max |logit diff| %.3g (largest logit %.3g, tolerance %.0e)\n", worst, largest,
                kLogitTolerance);
}

TEST(Pretrained, HuggingFaceExportOfTheFixtureReloadsWithIdenticalTensors) {
    TempDir d;
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    save_hugging_face(d.file("out"), info.config, read_pretrained_params(info));
    const SafeTensorsFile a = SafeTensorsFile::open(kFixture);
    const SafeTensorsFile b = SafeTensorsFile::open(d.file("out/model.safetensors"));
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const auto& t : a.tensors()) {
        const TensorEntry* u = b.find(t.name);
        ASSERT_NE(u, nullptr) << t.name;
        EXPECT_EQ(t.shape, u->shape) << t.name;
        const auto x = a.read_raw(t), y = b.read_raw(*u);
        EXPECT_TRUE(x == y) << t.name << " differs";
    }
    // The exported folder is itself a starting point of the same model.
    EXPECT_EQ(inspect_pretrained(d.file("out")).config, info.config);
    const auto j = nlohmann::json::parse(std::ifstream(d.file("out/config.json")));
    EXPECT_EQ(j["n_positions"], 64);
    EXPECT_EQ(j["vocab_size"], 300);
    EXPECT_EQ(j["activation_function"], "gelu_new");
}

TEST(Pretrained, ATrainCheckpointLoadsItsWeightsAndNotItsOptimizer) {
    TempDir d;
    auto backend = create_backend(BackendKind::cpu);
    GPTConfig c;  // L2 C64 H4 T32 V256
    GPT model(*backend, c);
    model.init_weights(7);
    AdamW opt(model, AdamWConfig{});
    save_checkpoint(d.file("ckpt.safetensors"), model, &opt);
    const PretrainedInfo info = inspect_pretrained(d.file("ckpt.safetensors"));
    EXPECT_EQ(info.format, WeightsFormat::microtrain);
    EXPECT_TRUE(info.has_optimizer_state);
    GPT fresh(*backend, c);
    load_pretrained(info, fresh, 1);
    EXPECT_EQ(fresh.get_params(), model.get_params());
}

// A run with optim.freeze checkpoints moments of the tensors it trained only: its weights are a
// starting point all the same (the moments are not read).
TEST(Pretrained, ACheckpointOfAFreezeRunIsAStartingPoint) {
    TempDir d;
    auto backend = create_backend(BackendKind::cpu);
    ModelOptions frozen;
    frozen.trainable.freeze = {"wte", "h.0"};
    GPT model(*backend, GPTConfig{}, frozen);
    model.init_weights(7);
    AdamW opt(model, AdamWConfig{});
    save_checkpoint(d.file("ckpt.safetensors"), model, &opt);
    const PretrainedInfo info = inspect_pretrained(d.file("ckpt.safetensors"));
    GPT plain(*backend, GPTConfig{});
    load_pretrained(info, plain, 1);
    EXPECT_EQ(plain.get_params(), model.get_params());
}

// A LoRA run's checkpoint starts the next run from the adapted model: adapters merged.
TEST(Pretrained, ACheckpointOfALoraRunStartsFromItsMergedWeights) {
    TempDir d;
    auto backend = create_backend(BackendKind::cpu);
    ModelOptions lora;
    lora.trainable.lora = LoraConfig{2, 4.0f};
    GPT model(*backend, GPTConfig{}, lora);
    model.init_weights(7);
    std::vector<float> p = model.get_params();
    for (const auto& t : model.parameter_table().tensors())  // B != 0: the merge changes W
        if (t.lora) std::fill(p.begin() + t.offset, p.begin() + t.offset + t.count, 0.01f);
    model.set_params(p);
    save_checkpoint(d.file("lora.safetensors"), model, nullptr);
    const PretrainedInfo info = inspect_pretrained(d.file("lora.safetensors"));
    EXPECT_EQ(info.lora.rank, 2);
    GPT plain(*backend, GPTConfig{});
    load_pretrained(info, plain, 1);
    EXPECT_EQ(plain.get_params(), merge_lora(model.parameter_table(), lora.trainable.lora,
                                             model.get_params(), GPTConfig{}));
}

TEST(Pretrained, LoraOnTopStartsAsTheLoadedModel) {
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    auto backend = create_backend(BackendKind::cpu);
    GPT plain(*backend, info.config);
    load_pretrained(info, plain, 1);
    ModelOptions mo;
    mo.trainable.lora = LoraConfig{4, 8.0f};
    GPT adapted(*backend, info.config, mo);
    load_pretrained(info, adapted, 1);
    const std::vector<int32_t> tokens{1, 2, 299, 4};
    // B = 0 at init: the adapters add nothing, so the logits are the plain model's.
    EXPECT_EQ(forward_logits(adapted, tokens), forward_logits(plain, tokens));
}

TEST(Pretrained, AModelOfOtherDimensionsIsRefusedNamingBoth) {
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    auto backend = create_backend(BackendKind::cpu);
    GPT other(*backend, GPTConfig{});
    try {
        load_pretrained(info, other, 1);
        FAIL() << "loaded into a model of other dimensions";
    } catch (const CheckpointError& e) {
        EXPECT_CONTAINS(e.what(), "L2 C64 H4 T64 V300");
        EXPECT_CONTAINS(e.what(), GPTConfig{}.describe());
    }
}

// ---- bad files ----------------------------------------------------------------------------------

TEST(PretrainedErrors, AHuggingFaceFileWithoutConfigJsonNamesTheMissingHeadCount) {
    TempDir d;
    const std::string f = edited_fixture(
        d, [](EditedTensor&) { return true; }, {}, false);
    const std::string e = load_error(f);
    EXPECT_CONTAINS(e, f);
    EXPECT_CONTAINS(e, "config.json");
    EXPECT_CONTAINS(e, "n_head");
}

TEST(PretrainedErrors, AnUntiedLmHeadIsRefused) {
    TempDir d;
    const SafeTensorsFile fx = SafeTensorsFile::open(kFixture);
    std::vector<float> head = fx.read_f32("transformer.wte.weight");
    head[5] += 1.0f;
    const std::string f = edited_fixture(d, [](EditedTensor&) { return true; }, {}, true,
                                         {{"lm_head.weight", {300, 64}, head}});
    const std::string e = load_error(f);
    EXPECT_CONTAINS(e, "lm_head.weight");
    EXPECT_CONTAINS(e, "untied");
}

TEST(PretrainedErrors, AWrongShapeNamesTheTensorExpectedAndFound) {
    TempDir d;
    const std::string f = edited_fixture(d, [](EditedTensor& t) {
        if (t.name == "transformer.h.1.mlp.c_fc.weight") {
            t.shape = {256, 64};  // nanoGPT's (out, in) inside a Conv1D file
        }
        return true;
    });
    const std::string e = load_error(f);
    EXPECT_CONTAINS(e, "transformer.h.1.mlp.c_fc.weight");
    EXPECT_CONTAINS(e, "[256, 64]");
    EXPECT_CONTAINS(e, "[64, 256] (Conv1D: in, out)");
}

TEST(PretrainedErrors, AMissingAndAnUnknownTensorAreNamed) {
    TempDir d;
    std::string e = load_error(
        edited_fixture(d, [](EditedTensor& t) { return t.name != "transformer.h.0.ln_2.bias"; }));
    EXPECT_CONTAINS(e, "missing tensor 'transformer.h.0.ln_2.bias'");
    TempDir d2;
    e = load_error(edited_fixture(d2, [](EditedTensor& t) {
        if (t.name == "transformer.h.0.ln_2.bias") t.name = "transformer.h.0.ln_3.bias";
        return true;
    }));
    EXPECT_CONTAINS(e, "unknown tensor 'transformer.h.0.ln_3.bias'");
}

TEST(PretrainedErrors, AConfigOfAnotherArchitectureNamesTheKey) {
    TempDir d;
    std::string e = load_error(edited_fixture(
        d, [](EditedTensor&) { return true; },
        [](nlohmann::json& j) { j["activation_function"] = "relu"; }));
    EXPECT_CONTAINS(e, "config.json");
    EXPECT_CONTAINS(e, "\"activation_function\" is \"relu\"");
    TempDir d2;
    e = load_error(edited_fixture(
        d2, [](EditedTensor&) { return true; }, [](nlohmann::json& j) { j["n_embd"] = 32; }));
    EXPECT_CONTAINS(e, "transformer.wte.weight");  // the first tensor of another shape
    EXPECT_CONTAINS(e, "[300, 64]");
}

TEST(PretrainedErrors, AMissingPathSaysWhatItTakesAndWhichCommandMakesACheckpoint) {
    const std::string e = load_error("/nonexistent/base");
    EXPECT_CONTAINS(e, "/nonexistent/base: does not exist");
    EXPECT_CONTAINS(e, "microtrain train");
    // A train run directory's name (<name>-train) names the experiment that makes it.
    EXPECT_CONTAINS(load_error("/nonexistent/lab-base-train/"), "`name: lab-base`");
}

// ---- model.init_from in an experiment ----------------------------------------------------------

TEST(InitFrom, TheModelDimensionsComeFromTheFile) {
    TempDir d;
    std::ofstream(d.file("e.yaml"))
        << "name: e\nmodel: { init_from: " << kFixtureDir << " }\nvariants: [{name: a}]\n";
    const ExperimentSpec spec = load_experiment(d.file("e.yaml"));
    EXPECT_EQ(spec.base.model.describe(), "L2 C64 H4 T64 V300");
    EXPECT_EQ(spec.base.init_from, kFixtureDir);
}

TEST(InitFrom, ADimensionThatDisagreesWithTheFileNamesBothValuesAndTheFile) {
    TempDir d;
    std::ofstream(d.file("e.yaml")) << "name: e\nmodel: { n_layer: 3, init_from: " << kFixtureDir
                                    << " }\nvariants: [{name: a}]\n";
    try {
        load_experiment(d.file("e.yaml"));
        FAIL() << "accepted n_layer 3 for a 2-layer file";
    } catch (const SpecError& e) {
        EXPECT_CONTAINS(e.what(), "model.n_layer");
        EXPECT_CONTAINS(e.what(), "expected model.n_layer 2");
        EXPECT_CONTAINS(e.what(), "got 3");
        EXPECT_CONTAINS(e.what(), kFixture);
    }
}

TEST(InitFrom, ValidateReportsWhatWillBeLoaded) {
    TempDir d;
    std::ofstream(d.file("e.yaml")) << "name: e\nmodel: { init_from: " << kFixtureDir
                                    << " }\nvariants: [{name: a}, {name: lora, set: {model.lora: "
                                       "{rank: 4}}}]\n";
    const CliResult r = run_microtrain("validate " + q(d.file("e.yaml")));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "model.init_from " + kFixtureDir + ":\n  Hugging Face GPT-2 " +
                                  kFixture + " (+ config.json): L2 C64 H4 T64 V300, 28 tensors");
}

TEST(InitFrom, ABadFileIsASpecErrorAtTheKey) {
    TempDir d;
    std::ofstream(d.file("e.yaml")) << "name: e\nmodel: { init_from: missing.safetensors }\n"
                                       "variants: [{name: a}]\n";
    try {
        load_experiment(d.file("e.yaml"));
        FAIL() << "accepted a missing file";
    } catch (const SpecError& e) {
        EXPECT_CONTAINS(e.what(), "model.init_from");
        // Relative to the experiment file's folder, like data.path.
        EXPECT_CONTAINS(e.what(), d.file("missing.safetensors") + ": does not exist");
    }
}

// `run` starts every variant from the file: the fixture's (scaled-up) weights give a first loss
// far from a random model's ln 300 = 5.70, the same for a LoRA variant on top (B = 0).
TEST(InitFrom, RunStartsEveryVariantFromTheFile) {
    TempDir d;
    std::ofstream(d.file("e.yaml"))
        << "name: e\nbackend: cpu\nmodel: { init_from: " << kFixtureDir
        << " }\ndata: { batch_size: 2, seq_len: 16 }\nrun: { warmup_steps: 1, measure_steps: 2, "
           "rounds: 1, threads: 1 }\nprofile: { trace: false }\nreport: { out_dir: "
        << d.file("runs")
        << " }\nvariants: [{name: full}, {name: lora, set: {model.lora: {rank: "
           "4}}}]\n";
    const CliResult r = run_microtrain("run " + q(d.file("e.yaml")));
    ASSERT_EQ(r.rc, 0) << r.output;
    std::string results;
    for (const auto& e : fs::directory_iterator(d.file("runs")))
        results = e.path() / "results.json";
    const auto j = nlohmann::json::parse(std::ifstream(results));
    ASSERT_EQ(j["variants"].size(), 2u);
    const double full = j["variants"][0]["loss"]["first"], lora = j["variants"][1]["loss"]["first"];
    EXPECT_GT(std::fabs(full - std::log(300.0)), 0.3) << full;
    EXPECT_EQ(full, lora);
}

// The first loss in a run's train.csv (step 1).
double first_loss(const std::string& run_dir) {
    std::ifstream csv(run_dir + "/train.csv");
    std::string header, row;
    std::getline(csv, header);
    std::getline(csv, row);
    return std::stod(row.substr(row.find(',') + 1));
}

// A run that starts from a train checkpoint starts with what that run learned: its first loss is
// well below a random model's (which is the first run's first loss, near ln 256 = 5.55).
TEST(InitFrom, TrainFromATrainRunDirectoryStartsWithItsLearnedWeights) {
    TempDir d;
    std::ofstream(d.file("t.yaml"))
        << "name: t\nbackend: cpu\nmodel: { preset: tiny }\n"
           "data: { source: synthetic, batch_size: 4, seq_len: 32 }\noptim: { lr: 3.0e-3 }\n"
           "run: { threads: 1 }\ntrain: { steps: 60, eval_every: 0, checkpoint_every: 0 }\n";
    const std::string yaml = q(d.file("t.yaml"));
    CliResult r = run_microtrain("train " + yaml + " --out-dir " + q(d.file("base")));
    ASSERT_EQ(r.rc, 0) << r.output;
    r = run_microtrain("train " + yaml + " --steps 1 --init-from " + q(d.file("base")) +
                       " --out-dir " + q(d.file("next")));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_LT(first_loss(d.file("next")), first_loss(d.file("base")) - 0.5) << r.output;
}

// `train --init-from` on a resumed run: the run keeps its own weights (init_from applies at step
// 0 only), so the resumed run ends bitwise where an uninterrupted one does.
TEST(InitFrom, TrainStartsFromTheFileAndAResumeKeepsItsOwnWeights) {
    TempDir d;
    std::ofstream(d.file("t.yaml"))
        << "name: t\nbackend: cpu\ndata: { source: synthetic, batch_size: 2, seq_len: 16 }\n"
           "run: { threads: 1 }\ntrain: { steps: 4, eval_every: 0, checkpoint_every: 2 }\n";
    const std::string init = " --init-from " + q(kFixtureDir);
    const std::string yaml = q(d.file("t.yaml"));
    CliResult r = run_microtrain("train " + yaml + init + " --out-dir " + q(d.file("full")));
    ASSERT_EQ(r.rc, 0) << r.output;
    r = run_microtrain("train " + yaml + init + " --out-dir " + q(d.file("part")) + " --steps 2");
    ASSERT_EQ(r.rc, 0) << r.output;
    r = run_microtrain("train " + yaml + init + " --resume " + q(d.file("part")) + " --steps 4");
    ASSERT_EQ(r.rc, 0) << r.output;
    const std::string last = "/checkpoints/step-00000004.safetensors";
    const SafeTensorsFile a = SafeTensorsFile::open(d.file("full") + last);
    const SafeTensorsFile b = SafeTensorsFile::open(d.file("part") + last);
    for (const auto& t : a.tensors())
        EXPECT_TRUE(a.read_raw(t) == b.read_raw(b.at(t.name))) << t.name;
    EXPECT_EQ(*a.metadata_value("n_layer"), "2");
    EXPECT_EQ(*a.metadata_value("vocab_size"), "300");
}

}  // namespace
}  // namespace mt

namespace mt {
namespace {

// ---- microtrain sample
// ---------------------------------------------------------------------------

std::string last_line(const std::string& out) {
    const size_t end = out.find_last_not_of('\n');
    const size_t start = out.rfind('\n', end);
    return out.substr(start == std::string::npos ? 0 : start + 1, end - start);
}

TEST(Sample, TheSameSeedGivesTheSameTokensAndAnotherSeedOthers) {
    const std::string base = "sample " + q(kFixtureDir) + " --prompt-tokens 5,6,7 -n 24 ";
    const CliResult a = run_microtrain(base + "--seed 11"), b = run_microtrain(base + "--seed 11");
    const CliResult c = run_microtrain(base + "--seed 12");
    ASSERT_EQ(a.rc, 0) << a.output;
    EXPECT_EQ(last_line(a.output), last_line(b.output));
    EXPECT_NE(last_line(a.output), last_line(c.output));
    std::istringstream ids(last_line(a.output));
    int n = 0;
    for (int id; ids >> id; ++n) EXPECT_TRUE(id >= 0 && id < 300) << id;
    EXPECT_EQ(n, 24);
}

TEST(Sample, TemperatureZeroIsTheArgmaxOfOurForward) {
    const CliResult r = run_microtrain("sample " + q(kFixtureDir) +
                                       " --prompt-tokens 1,2,299 -n 6 --temperature 0");
    ASSERT_EQ(r.rc, 0) << r.output;
    const PretrainedInfo info = inspect_pretrained(kFixtureDir);
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, info.config);
    load_pretrained(info, model, 1);
    std::vector<int32_t> tokens{1, 2, 299};
    std::string want;
    for (int i = 0; i < 6; ++i) {
        const std::vector<float> logits = forward_logits(model, tokens);
        const float* last = logits.data() + (tokens.size() - 1) * 300;
        tokens.push_back(static_cast<int32_t>(std::max_element(last, last + 300) - last));
        if (!want.empty()) want += ' ';
        want += std::to_string(tokens.back());
    }
    EXPECT_EQ(last_line(r.output), want);
}

TEST(Sample, AByteLevelModelContinuesTheTextPrompt) {
    TempDir d;
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, GPTConfig{});  // vocab 256: bytes
    model.init_weights(3);
    save_plain_checkpoint(d.file("bytes.safetensors"), GPTConfig{}, model.get_params());
    // stdout alone (the subshell drops stderr: what was loaded, the speed).
    const CliResult r = run_shell("(" + q(MT_BINARY) + " sample " + q(d.file("bytes.safetensors")) +
                                  " --prompt ab -n 5 2>/dev/null)");
    ASSERT_EQ(r.rc, 0) << r.output;
    ASSERT_EQ(r.output.size(), 2u + 5u + 1u) << r.output;  // the prompt, 5 bytes, a newline
    EXPECT_EQ(r.output.substr(0, 2), "ab");
}

TEST(Sample, BadFlagsAreRefusedNamingTheFlag) {
    const std::string base = "sample " + q(kFixtureDir) + " ";
    struct Case {
        std::string args, message;
    } cases[] = {
        {"--prompt-tokens 1,x", "--prompt-tokens: 'x' is not a token id"},
        {"--prompt-tokens 1,300", "[0, 300)"},
        {"--prompt-tokens ''", "no prompt"},
        {"--prompt hi", "--prompt encodes text as bytes"},
        {"--prompt hi --prompt-tokens 1", "--prompt and --prompt-tokens both given"},
        {"--prompt-tokens 1 --temperature -1", "--temperature"},
        {"--prompt-tokens 1 --top-k -2", "--top-k"},
        {"--prompt-tokens 1 -n 0", "-n"},
    };
    for (const Case& c : cases) {
        const CliResult r = run_microtrain(base + c.args);
        EXPECT_NE(r.rc, 0) << c.args;
        EXPECT_CONTAINS(r.output, c.message) << c.args;
    }
    const CliResult r = run_microtrain("sample /nonexistent --prompt-tokens 1");
    EXPECT_NE(r.rc, 0);
    EXPECT_CONTAINS(r.output, "/nonexistent");
}

// ---- microtrain export --hf
// ----------------------------------------------------------------------

TEST(ExportHf, AStartingPointIsWrittenAsAHuggingFaceFolderThatReloads) {
    TempDir d;
    const CliResult r = run_microtrain("export " + q(kFixtureDir) + " --hf " + q(d.file("hf")));
    ASSERT_EQ(r.rc, 0) << r.output;
    const SafeTensorsFile a = SafeTensorsFile::open(kFixture);
    const SafeTensorsFile b = SafeTensorsFile::open(d.file("hf/model.safetensors"));
    for (const auto& t : a.tensors())
        EXPECT_TRUE(a.read_raw(t) == b.read_raw(b.at(t.name))) << t.name;
    EXPECT_TRUE(fs::exists(d.file("hf/config.json")));
}

TEST(ExportHf, TheOutputFolderMayNotBeTheInput) {
    TempDir d;
    fs::copy(kFixtureDir, d.file("in"));
    const CliResult r = run_microtrain("export " + q(d.file("in")) + " --hf " + q(d.file("in")));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "would replace the input");
}

}  // namespace
}  // namespace mt

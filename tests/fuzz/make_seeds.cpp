// Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/ (the committed
// seeds were made by it; rerun after a format change):
//   build/fuzz/mt_fuzz_seeds tests/fuzz/corpus
// Seeds are small valid (and a few nearly valid) files, so the fuzzer starts from inputs that
// reach deep into each parser. The experiment seeds are the YAML files in configs/ plus the
// ones written here.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/pretrained.h"
#include "engine/data.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "optim/adamw.h"
#include "report/results.h"
#include "tests/fuzz/targets.h"
#include "tests/hand_made_run.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

// A tiny model: L1 H1 C4 T4 V2, small enough that a checkpoint is ~2 KB.
GPTConfig tiny_config() {
    GPTConfig c;
    c.n_layer = 1;
    c.n_head = 1;
    c.n_embd = 4;
    c.max_seq_len = 4;
    c.vocab_size = 2;
    return c;
}

std::vector<float> ramp(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    return v;
}

// nanoGPT's state_dict as PyTorch saves it: unpadded wte, the tied lm_head, the mask buffers,
// config metadata optional (n_head always: it cannot be inferred).
void write_state_dict(const std::string& path, bool with_metadata) {
    const GPTConfig c = tiny_config();
    const ParameterTable table(c);
    SafeTensorsWriter w;
    std::vector<float> wte;
    for (const auto& p : table.tensors()) {
        std::vector<int64_t> shape = p.shape;
        if (p.name == "transformer.wte.weight") shape[0] = c.vocab_size;
        size_t n = 1;
        for (auto d : shape) n *= static_cast<size_t>(d);
        if (p.name == "transformer.wte.weight") wte = ramp(n);
        w.add_f32(p.name, shape, p.name == "transformer.wte.weight" ? wte : ramp(n));
    }
    w.add_f32("lm_head.weight", {c.vocab_size, c.n_embd}, std::vector<float>(wte));
    const int64_t S = c.max_seq_len;
    std::vector<float> mask(S * S);
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j) mask[i * S + j] = j <= i ? 1.0f : 0.0f;
    w.add_f32("transformer.h.0.attn.bias", {1, 1, S, S}, std::move(mask));
    w.set_metadata("n_head", "1");
    if (with_metadata) {
        w.set_metadata("n_layer", "1");
        w.set_metadata("n_embd", "4");
        w.set_metadata("vocab_size", "2");
        w.set_metadata("max_seq_len", "4");
    }
    w.write(path);
}

void safetensors_seeds(const fs::path& dir) {
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, tiny_config());
    model.init_weights(1);
    save_checkpoint((dir / "weights.safetensors").string(), model, nullptr);
    AdamW opt(model, AdamWConfig{});
    save_checkpoint((dir / "with_optimizer.safetensors").string(), model, &opt);
    // A LoRA model's checkpoint: adapters, lora_* metadata, the adapters' moments only.
    ModelOptions lora;
    lora.trainable.lora.rank = 2;
    lora.trainable.lora.alpha = 4.0f;
    lora.trainable.lora.targets = {LoraTarget::attn_c_attn, LoraTarget::mlp_c_proj};
    GPT lora_model(*backend, tiny_config(), lora);
    lora_model.init_weights(1);
    AdamW lora_opt(lora_model, AdamWConfig{});
    save_checkpoint((dir / "lora_with_optimizer.safetensors").string(), lora_model, &lora_opt);
    write_state_dict((dir / "state_dict.safetensors").string(), true);
    write_state_dict((dir / "state_dict_no_config.safetensors").string(), false);
    SafeTensorsWriter w;  // every reader path: scalars, empty tensors, integers
    w.add_f32("f", {2, 3}, ramp(6));
    w.add_f32("scalar", {}, std::vector<float>{1.5f});
    w.add_f32("empty", {0, 4}, std::vector<float>{});
    w.add_i32("i", {3}, std::vector<int32_t>{-1, 0, 7});
    w.set_metadata("note", "hello");
    w.write((dir / "mixed.safetensors").string());
    SafeTensorsWriter().write((dir / "empty.safetensors").string());
}

void batch_seeds(const fs::path& dir) {
    SafeTensorsWriter w;
    w.add_i32("inputs", {2, 3}, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
    w.add_i32("targets", {2, 3}, std::vector<int32_t>{2, 3, 4, 5, 6, 7});
    w.write((dir / "batch.safetensors").string());
    SafeTensorsWriter bad;  // an id outside the vocabulary, and mismatched shapes
    bad.add_i32("inputs", {1, 2}, std::vector<int32_t>{1, 300});
    bad.add_i32("targets", {2, 1}, std::vector<int32_t>{0, 1});
    bad.write((dir / "bad_batch.safetensors").string());
}

void token_seeds(const fs::path& dir) {
    write_token_file((dir / "tokens.bin").string(), {1, 2, 3, 65535, 0, 7});
    write_token_file((dir / "empty.bin").string(), {});
}

void experiment_seeds(const fs::path& dir, const fs::path& configs) {
    for (const auto& e : fs::recursive_directory_iterator(configs))
        if (e.path().extension() == ".yaml")
            fs::copy_file(e.path(), dir / e.path().filename(),
                          fs::copy_options::overwrite_existing);
    std::ofstream(dir / "minimal.yaml") << "name: m\nvariants:\n  - name: a\n";
    std::ofstream(dir / "overrides.yaml")
        << "name: o\nmodel: { preset: tiny }\ndata: { source: synthetic, batch_size: 2, "
           "seq_len: 8 }\nrun: { measure_steps: 1 }\nvariants:\n  - name: base\n  - name: "
           "fused\n    set: { optim.impl: fused, kernels.classifier: fused }\ncompare: "
           "{ baseline: base }\n";
}

// The __metadata__ of a training checkpoint (cli/training_run.h) around one small tensor: whole
// but with a checksum that does not match (so the fuzzer's mutations reach every number), and
// with a number out of range.
void train_checkpoint_seeds(const fs::path& dir) {
    auto write = [&](const std::string& name, const std::string& position) {
        SafeTensorsWriter w;
        w.add_f32("w", {2}, std::vector<float>{1.0f, 2.0f});
        w.set_metadata("microtrain.train_format", "2");
        w.set_metadata("step", "6");
        w.set_metadata("microtrain.data_position", position);
        w.set_metadata("microtrain.csv_rows", "6");
        w.set_metadata("microtrain.global_batch", "2");
        w.set_metadata("microtrain.config.optim.lr", "0.001");
        w.set_metadata("microtrain.checksum", "0123456789abcdef");
        w.write((dir / name).string());
    };
    write("metadata.safetensors", "6");
    write("position_out_of_range.safetensors", "123456789012345678901");
}

// A results.json of two measured variants, as `microtrain run` writes it.
void results_seeds(const fs::path& dir) {
    auto run = [](const std::string& name, double wall) {
        HandMadeRun r;
        r.config.variant = name;
        r.config.run.warmup_steps = 1;
        r.config.run.measure_steps = 5;
        r.backend = "cpu";
        r.device_name = "CPU: seed";
        for (int i = 0; i < 6; ++i) {
            StepRecord s;
            s.step = i;
            s.warmup = i == 0;
            s.times.wall_ms = wall + 0.01 * i;
            s.loss = 5.0 - 0.01 * i;
            r.steps.push_back(s);
        }
        return r;
    };
    HandMadeExperiment ex;
    ex.name = "seed";
    ex.baseline = "baseline";
    ex.runs = {run("baseline", 10), run("fast", 5)};
    ex.runs[1].config.changed = {{"optim.impl", "fused"}};
    std::ofstream(dir / "results.json") << results_to_json(ex.results()).dump(2) << "\n";
    std::ofstream(dir / "not_results.json") << "{\"schema_version\": 1, \"variants\": []}\n";
}

}  // namespace

// A Hugging Face GPT-2 folder as one input (targets.h pretrained): with its config.json, without
// one, and with a config of another architecture.
void pretrained_seeds(const fs::path& dir) {
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, tiny_config());
    model.init_weights(1);
    const fs::path folder = dir / "folder.tmp";
    save_hugging_face(folder.string(), tiny_config(), model.get_params());
    auto slurp = [](const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    const std::string config = slurp(folder / "config.json");
    const std::string weights = slurp(folder / "model.safetensors");
    fs::remove_all(folder);
    std::string relu = config;
    relu.replace(relu.find("gelu_new"), 8, "relu");
    std::ofstream(dir / "folder", std::ios::binary)
        << config << mt::fuzz::kPretrainedSeparator << weights;
    std::ofstream(dir / "no_config", std::ios::binary) << weights;
    std::ofstream(dir / "relu_config", std::ios::binary)
        << relu << mt::fuzz::kPretrainedSeparator << weights;
}

int main(int argc, char** argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR [CONFIGS_DIR]\n", argv[0]);
        return 2;
    }
    const fs::path root = argv[1];
    for (const char* t : {"safetensors", "batch", "tokens", "experiment", "train_checkpoint",
                          "results", "pretrained"})
        fs::create_directories(root / t);
    safetensors_seeds(root / "safetensors");
    batch_seeds(root / "batch");
    token_seeds(root / "tokens");
    experiment_seeds(root / "experiment", argc == 3 ? argv[2] : "configs");
    train_checkpoint_seeds(root / "train_checkpoint");
    results_seeds(root / "results");
    pretrained_seeds(root / "pretrained");
    std::printf("seeds written under %s\n", root.c_str());
    return 0;
}

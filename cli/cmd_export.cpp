// `microtrain export`: what a LoRA run leaves behind, in the two forms a user takes elsewhere.
//
//   microtrain export CKPT --merged OUT.safetensors     the adapters merged into the weights:
//       W + (alpha/rank) B A for every adapted Linear, written as a plain GPT-2 checkpoint with
//       nanoGPT's names and shapes (wte of vocab_size rows, the tied lm_head.weight), no
//       adapters and no optimizer state: it loads into PyTorch's nanoGPT GPT with
//       load_state_dict(strict=True), and into microtrain without model.lora.
//   microtrain export CKPT --adapters OUT.safetensors   the lora_A / lora_B tensors alone, with
//       the base config and lora_rank / lora_alpha / lora_targets in __metadata__.
//   microtrain export ADAPTERS --base BASE --merged OUT  applies an adapters file to its base
//       checkpoint again (the same merge).
//
//   microtrain export CKPT --hf DIR                     a Hugging Face GPT-2 folder:
//   DIR/config.json
//       and DIR/model.safetensors as GPT2LMHeadModel.save_pretrained writes them (Conv1D weights
//       (in, out), wte of vocab_size rows, the head tied), which GPT2LMHeadModel.from_pretrained
//       loads. CKPT is anything model.init_from takes (checkpoint/pretrained.h): a train
//       checkpoint (its LoRA adapters merged) or run directory, nanoGPT weights, a Hugging Face
//       model. With --merged / --adapters / --base, the merged weights of those are written.
//
// For --merged and --adapters, CKPT is any checkpoint of a model with adapters: a `microtrain
// train` checkpoint of a model.lora run (its optimizer state is ignored), or a file with the
// adapters beside the base weights. Under model.quantize_frozen: int8 the checkpoint's base weights
// are the dequantised int8 values the adapters were trained against, and the merge is onto them.
// Every file is written atomically (io/atomic_file); nothing is written when any check fails.
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/pretrained.h"
#include "cli/commands.h"
#include "kernels/backend.h"

namespace mt {
namespace {

// The weights of a model with adapters, in the host layout of its parameter table.
struct LoraWeights {
    GPTConfig config;
    LoraConfig lora;
    std::unique_ptr<ParameterTable> table;  // ParameterTable(config, {lora})
    std::vector<float> params;              // its host layout
};

[[noreturn]] void fail(const std::string& what) {
    throw std::invalid_argument(what);
}

std::string no_adapters_message(const std::string& path) {
    return path +
           ": holds no LoRA adapters (no transformer.h.N.<linear>.lora_A.weight tensors): it is "
           "a plain GPT-2 checkpoint already; --merged and --adapters export the adapters of a "
           "model.lora run (train with model.lora: {rank: 8, alpha: 16})";
}

// CKPT with its adapters: loaded into a model with them (every check of load_checkpoint:
// shapes, the tied head, the LoRA metadata), whose host copy is the weights.
LoraWeights read_checkpoint_weights(const std::string& path) {
    const SafeTensorsFile f = SafeTensorsFile::open(path);
    if (!f.find("transformer.wte.weight") && f.metadata_value("lora_alpha"))
        fail(path +
             ": holds LoRA adapters without base weights (an adapters file); give the base "
             "checkpoint they were trained on with --base BASE.safetensors");
    LoraWeights w;
    w.config = read_checkpoint_config(f);
    w.lora = read_checkpoint_lora(f, w.config);
    if (!w.lora.enabled()) fail(no_adapters_message(path));
    ModelOptions mo;
    mo.trainable.lora = w.lora;
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    GPT model(*backend, w.config, mo);
    load_checkpoint(f, model);  // the weights only: the optimizer state is not exported
    w.table = std::make_unique<ParameterTable>(w.config, mo.trainable);
    w.params = model.get_params();
    return w;
}

// An adapters file (save_lora_adapters) applied to BASE, a plain GPT-2 checkpoint of the
// config the adapters were trained on.
LoraWeights read_adapters_with_base(const std::string& adapters_path,
                                    const std::string& base_path) {
    const SafeTensorsFile base = SafeTensorsFile::open(base_path);
    const SafeTensorsFile ad = SafeTensorsFile::open(adapters_path);
    LoraWeights w;
    w.config = read_checkpoint_config(base);
    const GPTConfig& c = w.config;
    const std::pair<const char*, int> dims[] = {{"n_layer", c.n_layer},
                                                {"n_head", c.n_head},
                                                {"n_embd", c.n_embd},
                                                {"vocab_size", c.vocab_size},
                                                {"max_seq_len", c.max_seq_len}};
    for (const auto& [key, value] : dims)
        if (const std::string* v = ad.metadata_value(key); v && *v != std::to_string(value))
            fail(adapters_path + ": the adapters are for " + key + "=" + *v + " but --base " +
                 base_path + " is " + c.describe() +
                 "; give the base checkpoint they were trained on");
    w.lora = read_checkpoint_lora(ad, w.config);
    if (!w.lora.enabled()) fail(no_adapters_message(adapters_path));
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    GPT plain(*backend, w.config);
    load_checkpoint(base, plain);
    const std::vector<float> base_params = plain.get_params();
    TrainableOptions to;
    to.lora = w.lora;
    w.table = std::make_unique<ParameterTable>(w.config, to);
    for (const auto& t : ad.tensors())
        if (!w.table->find(t.name) || !w.table->find(t.name)->lora)
            fail(adapters_path + ": tensor '" + t.name +
                 "' is not a LoRA adapter of the model; an adapters file (microtrain export "
                 "--adapters) holds only <linear>.lora_A.weight / lora_B.weight tensors");
    w.params.assign(w.table->total_count(), 0.0f);
    const ParameterTable& plain_table = plain.parameter_table();
    for (const auto& p : w.table->tensors()) {
        if (p.lora) {
            ad.read_f32_into(ad.at(p.name), w.params.data() + p.offset);
        } else {
            const float* src = base_params.data() + plain_table.at(p.name).offset;
            std::copy(src, src + p.count, w.params.data() + p.offset);
        }
    }
    return w;
}

struct ExportArgs {
    std::string input, base, merged, adapters, hf;
    // --hf alone: the input is any starting point, not necessarily one with adapters.
    bool hf_only() const {
        return !hf.empty() && merged.empty() && adapters.empty() && base.empty();
    }
};

// An output must not replace an input (same device and inode: a symlink or another spelling
// of the same path counts), nor the other output.
void check_outputs(const ExportArgs& a) {
    if (a.merged.empty() && a.adapters.empty() && a.hf.empty())
        fail(
            "nothing to export: give --merged OUT.safetensors (the adapters merged into the "
            "weights, a plain GPT-2 checkpoint), --adapters OUT.safetensors (the adapters "
            "alone) and/or --hf DIR (a Hugging Face GPT-2 folder)");
    if (!a.merged.empty() && a.merged == a.adapters)
        fail("--merged and --adapters are both '" + a.merged + "'; give two different files");
    auto same_file = [](const std::string& x, const std::string& y) {
        struct stat sx {
        }, sy{};
        return ::stat(x.c_str(), &sx) == 0 && ::stat(y.c_str(), &sy) == 0 &&
               sx.st_dev == sy.st_dev && sx.st_ino == sy.st_ino;
    };
    const std::string hf_weights = a.hf.empty() ? "" : a.hf + "/model.safetensors";
    for (const auto& [flag, out] : {std::pair{"--merged", a.merged},
                                    {"--adapters", a.adapters},
                                    {"--hf", a.hf},
                                    {"--hf", hf_weights}}) {
        if (out.empty()) continue;
        for (const auto& [name, in] : {std::pair{"CHECKPOINT", a.input}, {"--base", a.base}})
            if (!in.empty() && same_file(out, in))
                fail(std::string(flag) + " '" + out + "' is the same file as " + name + " '" + in +
                     "': writing it would replace the input; choose another path");
    }
}

// --hf alone: any starting point (a LoRA checkpoint's adapters merged) as a Hugging Face folder.
int export_hugging_face(const ExportArgs& a) {
    const PretrainedInfo info = inspect_pretrained(a.input);
    save_hugging_face(a.hf, info.config, read_pretrained_params(info));
    std::printf(
        "wrote %s/config.json and %s/model.safetensors: %s as a Hugging Face GPT-2 "
        "(GPT2LMHeadModel.from_pretrained loads it)\n",
        a.hf.c_str(), a.hf.c_str(), info.describe().c_str());
    return 0;
}

int run_export(const ExportArgs& a) {
    check_outputs(a);
    if (a.hf_only()) return export_hugging_face(a);
    const LoraWeights w = a.base.empty() ? read_checkpoint_weights(a.input)
                                         : read_adapters_with_base(a.input, a.base);
    const std::map<std::string, std::string> source = {
        {"source", "microtrain export " + a.input + (a.base.empty() ? "" : " --base " + a.base)}};
    char what[160];
    std::snprintf(what, sizeof what, "LoRA rank %d, alpha %g, scale %g", w.lora.rank,
                  static_cast<double>(w.lora.alpha), static_cast<double>(w.lora.scale()));
    if (!a.adapters.empty()) {
        save_lora_adapters(a.adapters, *w.table, w.lora, w.params, w.config, source);
        std::printf("wrote %s: the adapters (%s) of %s\n", a.adapters.c_str(), what,
                    w.config.describe().c_str());
    }
    if (!a.merged.empty()) {
        save_plain_checkpoint(a.merged, w.config, merge_lora(*w.table, w.lora, w.params, w.config),
                              source);
        std::printf("wrote %s: %s with the adapters (%s) merged into the weights\n",
                    a.merged.c_str(), w.config.describe().c_str(), what);
    }
    if (!a.hf.empty()) {
        save_hugging_face(a.hf, w.config, merge_lora(*w.table, w.lora, w.params, w.config));
        std::printf("wrote %s: %s with the adapters (%s) merged, as a Hugging Face GPT-2\n",
                    a.hf.c_str(), w.config.describe().c_str(), what);
    }
    return 0;
}

}  // namespace

void register_export_command(CLI::App& app, int& exit_code) {
    auto a = std::make_shared<ExportArgs>();
    CLI::App* cmd = app.add_subcommand(
        "export",
        "Export a checkpoint as a Hugging Face GPT-2 folder (--hf), or the LoRA adapters of "
        "one: merged into the weights (a plain GPT-2 checkpoint that loads into PyTorch) and/or "
        "alone");
    cmd->add_option("checkpoint", a->input,
                    "CHECKPOINT.safetensors of a model.lora run (or, with --base, an adapters "
                    "file); with --hf alone anything model.init_from takes")
        ->required()
        ->check(CLI::ExistingPath);
    cmd->add_option("--hf", a->hf,
                    "Write DIR/config.json and DIR/model.safetensors: a Hugging Face GPT-2 that "
                    "GPT2LMHeadModel.from_pretrained(DIR) loads");
    cmd->add_option("--merged", a->merged,
                    "Write OUT.safetensors: the weights with W + (alpha/rank) B A, nanoGPT names, "
                    "no adapters, no optimizer state");
    cmd->add_option("--adapters", a->adapters,
                    "Write OUT.safetensors: the lora_A / lora_B tensors alone with the LoRA "
                    "config and the base model config in __metadata__");
    cmd->add_option("--base", a->base,
                    "BASE.safetensors: the base checkpoint to apply an adapters file to "
                    "(CHECKPOINT is then the adapters file)")
        ->check(CLI::ExistingFile);
    cmd->callback([a, &exit_code] {
        try {
            exit_code = run_export(*a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain export: error: %s\n", e.what());
            exit_code = 2;
        }
    });
}

}  // namespace mt

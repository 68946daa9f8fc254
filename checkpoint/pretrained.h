// Starting points: the trained weights a run begins from (`model.init_from`, `train
// --init-from`), `microtrain sample` reads and `microtrain export --hf` converts. Three kinds of
// file, told apart by their layout, never by their name:
//
//   microtrain checkpoint  what `microtrain train` writes (checkpoint/checkpoint.h): nanoGPT
//                          names, wte padded, AdamW moments and "step" (ignored here: a run that
//                          starts from it starts a fresh optimizer), LoRA adapters (merged into
//                          their weights: the base of the new run is the adapted model)
//   nanoGPT weights        what `step` and `export --merged` write, or PyTorch's nanoGPT
//                          state_dict: the same names, wte of vocab_size rows, lm_head.weight
//   Hugging Face GPT-2     a `model.safetensors` as GPT2LMHeadModel.save_pretrained writes it
//                          (names transformer.h.N.*, or h.N.* without the prefix as GPT2Model
//                          writes them), with its `config.json` beside it. Its Linear layers are
//                          Conv1D modules whose weights are stored (in, out): y = x W + b. Ours
//                          (nanoGPT's nn.Linear) are (out, in): y = x Wᵀ + b, so each is
//                          transposed on the way in and out, as nanoGPT's from_pretrained does.
//                          The LM head is tied to wte (save_pretrained leaves lm_head.weight
//                          out; a file that holds one must hold wte's values: an untied head is
//                          refused, since microtrain's head is always wte).
//
// A PATH may also be a directory: one holding model.safetensors (a Hugging Face folder), or the
// run directory of `microtrain train` (its newest checkpoints/step-N.safetensors).
//
// Every check runs before any value is used, and every error is a CheckpointError naming the
// file, the tensor or key, what was expected and what was found.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "model/gpt.h"

namespace mt {

enum class WeightsFormat { microtrain, nanogpt, hugging_face };
template <>
struct EnumSpelling<WeightsFormat> {
    static constexpr std::array<std::string_view, 3> names{"microtrain checkpoint",
                                                           "nanoGPT weights", "Hugging Face GPT-2"};
};

// What a starting point holds, from its headers (and config.json): enough to build the model
// and to tell a user what will be loaded. Every tensor's name, dtype and shape is checked here.
struct PretrainedInfo {
    std::string path;          // as given
    std::string weights_path;  // the safetensors file read
    std::string config_path;   // Hugging Face: the config.json read (empty: none beside it)
    WeightsFormat format = WeightsFormat::nanogpt;
    GPTConfig config;    // the model the file describes (vocab_size unpadded)
    LoraConfig lora;     // a microtrain checkpoint's adapters (merged when read); rank 0: none
    size_t tensors = 0;  // tensors in the file
    bool has_optimizer_state = false;             // microtrain: AdamW moments (not loaded)
    int step = 0;                                 // microtrain: the step it was written at
    std::map<std::string, std::string> metadata;  // the file's __metadata__
    // "Hugging Face GPT-2 tests/data/hf/model.safetensors (+ config.json): L2 C64 H4 T64 V300,
    // 26 tensors"
    std::string describe() const;
};

// Resolves PATH (a file or a directory, above), reads its headers and checks its layout.
PretrainedInfo inspect_pretrained(const std::string& path);

// The weights in the host layout of the plain GPT-2 ParameterTable(info.config): nanoGPT names
// and shapes, Linear weights (out, in), wte padded with zero rows to padded_vocab_size.
std::vector<float> read_pretrained_params(const PretrainedInfo& info);

// Gives `model` the starting point's weights. The model's config must be info.config (the
// error names both). The model's own extra tensors — LoRA adapters — keep the values
// GPT::init_weights(seed) gives them (B = 0: the adapted model starts as the loaded one); its
// frozen and int8 storage (optim.freeze, model.quantize_frozen) apply as set_params stores them.
void load_pretrained(const PretrainedInfo& info, GPT& model, uint64_t seed);

// Writes DIR/config.json and DIR/model.safetensors as GPT2LMHeadModel.save_pretrained does, from
// `params` (the host layout of the plain ParameterTable(config)): the Hugging Face names
// (transformer.h.N.*), Conv1D weights (in, out), wte cut to vocab_size rows, no lm_head (tied).
// DIR is created if absent; each file is replaced atomically. GPT2LMHeadModel.from_pretrained(DIR)
// loads it.
void save_hugging_face(const std::string& dir, const GPTConfig& config,
                       const std::vector<float>& params);

}  // namespace mt

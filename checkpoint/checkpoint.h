// Model checkpoints: a GPT's parameters, and optionally its AdamW state, in a safetensors file
// (io/safetensors.h: the format). This file holds what is GPT-specific.
//
// Checkpoints use nanoGPT's state_dict names (model/gpt.h ParameterTable) for the weights,
// `optim.m.<name>` / `optim.v.<name>` for the AdamW moments of the tensors that train, and
// __metadata__ keys n_layer, n_head, n_embd, vocab_size, max_seq_len and step (decimal strings).
// A model with LoRA adapters also has the tensors `<linear>.lora_A.weight` (rank, in) and
// `<linear>.lora_B.weight` (out, rank) and the metadata lora_rank, lora_alpha and lora_targets
// ("attn.c_attn,mlp.c_fc"); frozen tensors (model.lora, optim.freeze) have no moments, and
// int8-stored weights (model.quantize_frozen) are written dequantised (fp32), which a load
// quantises back to the same int8 values and scales. A nanoGPT state_dict
// saved from PyTorch loads too: its tied `lm_head.weight`, its causal-mask buffers
// `transformer.h.N.attn.bias` (and HF's `attn.masked_bias`) are accepted, and its wte of exactly
// vocab_size rows is padded with zero rows to padded_vocab_size.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/gpt.h"

namespace mt {

class AdamW;

// Every checkpoint error: the message names the file, the tensor (or key), and what was
// expected. A checkpoint is a safetensors file, so a corrupt file and a wrong-shaped tensor are
// the same kind of error, and one catch clause covers both.
using CheckpointError = SafeTensorsError;

// The model config a checkpoint describes. From __metadata__ (n_layer, n_head, n_embd,
// vocab_size, max_seq_len) where present; a missing key is inferred from tensor shapes where that
// is unambiguous (n_embd and vocab_size from wte: a nanoGPT wte has exactly vocab_size rows;
// max_seq_len from wpe; n_layer from the transformer.h.N indices). n_head cannot be inferred
// from shapes and is required. Metadata and shapes that disagree are an error. The result is
// validated (GPTConfig::validate).
GPTConfig read_checkpoint_config(const SafeTensorsFile& file);
GPTConfig read_checkpoint_config(const std::string& path);

// The LoRA adapters a checkpoint holds (rank 0: none). The targets and the rank come from the
// tensors (every layer must adapt the same Linears with the same rank, A (rank, in) and B
// (out, rank) of the Linear's shape), alpha from __metadata__ "lora_alpha", which is required
// when there are adapters; lora_rank / lora_targets in the metadata, where present, must agree.
// `config` is read_checkpoint_config(file).
LoraConfig read_checkpoint_lora(const SafeTensorsFile& file, const GPTConfig& config);

// One tensor a checkpoint file holds: its name, shape and fp32 values (a view of host memory).
struct CheckpointTensor {
    std::string name;
    std::vector<int64_t> shape;
    std::span<const float> values;
};
// The tensors save_checkpoint writes, in file order: every parameter from `params` (the host
// layout, ParameterTable::total_count floats at ParameterInfo::offset), then, when m and v are
// given, `optim.m.<name>` and `optim.v.<name>` of each trainable tensor from them (the device
// layout's trainable prefix, trainable_count floats at ParameterInfo::device_offset: what
// AdamW::get_m / get_v hold). A caller that checksums a checkpoint sees the same list.
std::vector<CheckpointTensor> checkpoint_tensors(const ParameterTable& table,
                                                 const std::vector<float>& params,
                                                 const std::vector<float>* m = nullptr,
                                                 const std::vector<float>* v = nullptr);

// Writes the model's parameters (nanoGPT names, the model's shapes: wte padded to
// padded_vocab_size rows; LoRA adapters; int8 weights dequantised), the config (and the LoRA
// config) in __metadata__, and when `opt` is given the moments of its trainable tensors as
// optim.m.<name> / optim.v.<name> and its step count as __metadata__ "step". `extra` adds
// metadata (it may not override the config keys or "step"). Atomic (see SafeTensorsWriter).
void save_checkpoint(const std::string& path, GPT& model, AdamW* opt,
                     const std::map<std::string, std::string>& extra = {});

struct CheckpointLoadInfo {
    int64_t wte_rows = 0;              // rows of the file's wte: vocab_size (nanoGPT) or padded
    bool has_optimizer_state = false;  // the file holds optim.m.* / optim.v.*
    int step = 0;                      // __metadata__ "step" (0 if absent)
    std::map<std::string, std::string> metadata;
};

// Loads parameters into `model` (and, when `opt` is given, the AdamW moments of every tensor
// the model trains and the step, which must then all be present; moments of a tensor it does
// not train are then an error). Without `opt` the moments are not looked at: a run that froze
// tensors saved none for them, and the weights alone need none (`step --weights` from such a
// run's checkpoint). Rejects: a
// config (or LoRA config) in the metadata that differs from the model's; a missing tensor (the
// model's LoRA adapters too); a wrong shape or a non-floating dtype; an unknown tensor; an
// lm_head.weight that is not equal to wte (microtrain ties them); a truncated or corrupt file.
// Accepts wte (and its optimizer moments) with vocab_size rows, padding to padded_vocab_size with
// zeros. Either everything loads or the model and optimizer are left untouched.
CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& file, GPT& model, AdamW* opt = nullptr);
CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt = nullptr);

// The weights alone, checked as load_checkpoint checks them (the config and LoRA metadata, every
// tensor known, every parameter present with its shape, the tied head, the causal masks; AdamW
// moments are allowed and not read), in the host layout of ParameterTable(config, trainable):
// what a run that starts from a checkpoint (checkpoint/pretrained.h) takes from it.
std::vector<float> read_checkpoint_weights(const SafeTensorsFile& file, const GPTConfig& config,
                                           const TrainableOptions& trainable);

// Whether load_checkpoint of `file` into a model of `config` with `trainable` and its AdamW
// (`with_optimizer`; without it, whether read_checkpoint_weights would) would pass its checks of
// the file's layout: the config and LoRA metadata, every tensor known, every parameter (and with
// the optimizer every moment) present with its shape, the causal masks. Without the optimizer
// the moments are not looked at: a run that froze tensors has none for them, and a start from
// its weights needs none. Builds no model and reads no value (lm_head's tie to wte, a value
// check, stays with the load). Throws CheckpointError like load_checkpoint: `train --resume` skips
// such a checkpoint for the previous one before it builds anything.
void check_checkpoint_layout(const SafeTensorsFile& file, const GPTConfig& config,
                             const TrainableOptions& trainable, bool with_optimizer);

// ---- LoRA export (`microtrain export`) ---------------------------------------------------------

// The adapters merged into their Linear weights: every adapted W (out, in) becomes
// W + (alpha/rank) B A (B (out, rank), A (rank, in)), the sum over rank in double and rounded
// to fp32 once. `params` is the host layout of `lora_table` (a model with adapters); the
// result is the host layout of the plain GPT-2 ParameterTable(config) (no adapters).
std::vector<float> merge_lora(const ParameterTable& lora_table, const LoraConfig& lora,
                              const std::vector<float>& params, const GPTConfig& config);

// Writes a plain GPT-2 checkpoint as PyTorch's nanoGPT state_dict holds it: every parameter
// of ParameterTable(config) from `params` (its host layout) with wte cut to vocab_size rows
// (the padding microtrain adds is dropped), the tied lm_head.weight (= wte), and the config in
// __metadata__ (plus `extra`). No optimizer state, no adapters. Atomic.
void save_plain_checkpoint(const std::string& path, const GPTConfig& config,
                           const std::vector<float>& params,
                           const std::map<std::string, std::string>& extra = {});

// Writes the LoRA adapters alone (the lora_A / lora_B tensors of `lora_table` from `params`,
// its host layout) with the base model's config and lora_rank, lora_alpha, lora_targets in
// __metadata__ (plus `extra`): what read_checkpoint_lora reads back, to apply them to the base
// again. Atomic.
void save_lora_adapters(const std::string& path, const ParameterTable& lora_table,
                        const LoraConfig& lora, const std::vector<float>& params,
                        const GPTConfig& config,
                        const std::map<std::string, std::string>& extra = {});

}  // namespace mt

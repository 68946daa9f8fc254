// Model checkpoints: a GPT's parameters, and optionally its AdamW state, in a safetensors file
// (io/safetensors.h: the format). This file holds what is GPT-specific.
//
// Checkpoints use nanoGPT's state_dict names (model/gpt.h ParameterTable) for the weights,
// `optim.m.<name>` / `optim.v.<name>` for the AdamW moments, and __metadata__ keys n_layer,
// n_head, n_embd, vocab_size, max_seq_len and step (decimal strings). A nanoGPT state_dict
// saved from PyTorch loads too: its tied `lm_head.weight`, its causal-mask buffers
// `transformer.h.N.attn.bias` (and HF's `attn.masked_bias`) are accepted, and its wte of exactly
// vocab_size rows is padded with zero rows to padded_vocab_size.
#pragma once

#include <cstdint>
#include <map>
#include <string>

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

// Writes the model's parameters (nanoGPT names, the model's shapes: wte padded to
// padded_vocab_size rows), the config in __metadata__, and when `opt` is given its moments as
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

// Loads parameters into `model` (and, when `opt` is given, the AdamW moments and step, which
// must then all be present). Rejects: a config in the metadata that differs from the model's; a
// missing tensor; a wrong shape or a non-floating dtype; an unknown tensor; an lm_head.weight
// that is not equal to wte (microtrain ties them); a truncated or corrupt file. Accepts wte (and
// its optimizer moments) with vocab_size rows, padding to padded_vocab_size with zeros. Either
// everything loads or the model and optimizer are left untouched.
CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& file, GPT& model, AdamW* opt = nullptr);
CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt = nullptr);

}  // namespace mt

// Model checkpoints. See checkpoint.h for the tensor names and metadata keys, and
// io/safetensors.h for the file format.
//
// Loading is check-then-commit: every tensor of the file is checked (known name, dtype, shape,
// the tied LM head, the causal-mask buffers, the optimizer moments) and read into host buffers,
// and only then are the model and the optimizer given the new values. A rejected file leaves
// both untouched.
#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <span>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kernels/enum_names.h"
#include "kernels/text.h"
#include "optim/adamw.h"

namespace mt {
namespace {

const char* const kConfigKeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};

const std::string kWteName = "transformer.wte.weight";

// The LoRA config of a model with adapters (model/gpt.h LoraConfig), in __metadata__.
const char* const kLoraRankKey = "lora_rank";
const char* const kLoraAlphaKey = "lora_alpha";      // %.9g: reads back to the same float
const char* const kLoraTargetsKey = "lora_targets";  // "attn.c_attn,mlp.c_fc"

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw CheckpointError(path + ": " + what);
}

// ---- metadata and names ---------------------------------------------------------------------

// Strict decimal parse of a metadata value: the whole string, in [lo, INT_MAX].
bool parse_int(const std::string& s, int lo, int* out) {
    int v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || v < lo) return false;
    *out = v;
    return true;
}

int& config_field(GPTConfig& c, const std::string& key) {
    if (key == "n_layer") return c.n_layer;
    if (key == "n_head") return c.n_head;
    if (key == "n_embd") return c.n_embd;
    if (key == "vocab_size") return c.vocab_size;
    return c.max_seq_len;
}

int config_value(const GPTConfig& c, const std::string& key) {
    return config_field(const_cast<GPTConfig&>(c), key);
}

// The metadata value `key` (which must be present) as an integer >= lo.
int metadata_int(const SafeTensorsFile& f, const std::string& key, int lo) {
    const std::string* v = f.metadata_value(key);
    int out = 0;
    if (!parse_int(*v, lo, &out))
        fail(f.path(), "__metadata__ \"" + key + "\" is \"" + *v + "\", expected an integer >= " +
                           std::to_string(lo) + " written as a decimal string");
    return out;
}

// "transformer.h.<N>.<rest>" -> N (and rest), or -1.
int layer_index(const std::string& name, std::string* rest = nullptr) {
    static const std::string prefix = "transformer.h.";
    if (name.compare(0, prefix.size(), prefix) != 0) return -1;
    size_t i = prefix.size(), j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j == i || j - i > 6 || j >= name.size() || name[j] != '.') return -1;
    if (rest) *rest = name.substr(j + 1);
    return std::stoi(name.substr(i, j - i));
}

constexpr LoraTarget kLoraTargets[] = {LoraTarget::attn_c_attn, LoraTarget::attn_c_proj,
                                       LoraTarget::mlp_c_fc, LoraTarget::mlp_c_proj};

// The targets in the table's order (a block's Linears in forward order), comma-separated.
std::string lora_targets_text(const LoraConfig& l) {
    std::string t;
    for (LoraTarget x : kLoraTargets)
        if (l.adapts(x)) t += (t.empty() ? "" : ",") + std::string(enum_name(x));
    return t;
}

// The LoRA tensor name suffix "<target>.lora_A.weight" -> target and whether it is A, or false.
bool parse_lora_suffix(const std::string& rest, LoraTarget* target, bool* is_a) {
    for (LoraTarget t : kLoraTargets)
        for (bool a : {true, false})
            if (rest == std::string(enum_name(t)) + (a ? ".lora_A.weight" : ".lora_B.weight")) {
                *target = t;
                *is_a = a;
                return true;
            }
    return false;
}

// ---- the config a file describes ------------------------------------------------------------

// Dimension i of tensor t as a config value; one that does not fit in int is an error.
int dim_as_int(const SafeTensorsFile& f, const TensorEntry& t, size_t i, const char* key) {
    if (t.shape[i] > INT_MAX)
        fail(f.path(), "tensor '" + t.name + "' has shape " + shape_string(t.shape) +
                           ": dimension " + std::to_string(i) + " (" + key +
                           ") does not fit in a 32-bit int (corrupt file?)");
    return static_cast<int>(t.shape[i]);
}

// What the tensor shapes imply (nanoGPT: wte (V, C) with exactly V rows, wpe (T, C), layers
// transformer.h.0 ... h.<n_layer-1>), by config key. n_head is never among them.
std::map<std::string, int> infer_config_from_shapes(const SafeTensorsFile& f) {
    std::map<std::string, int> inferred;
    if (const TensorEntry* wte = f.find(kWteName); wte && wte->shape.size() == 2) {
        inferred["vocab_size"] = dim_as_int(f, *wte, 0, "vocab_size");
        inferred["n_embd"] = dim_as_int(f, *wte, 1, "n_embd");
    }
    if (const TensorEntry* wpe = f.find("transformer.wpe.weight"); wpe && wpe->shape.size() == 2)
        inferred["max_seq_len"] = dim_as_int(f, *wpe, 0, "max_seq_len");
    int max_layer = -1;
    for (const auto& t : f.tensors()) max_layer = std::max(max_layer, layer_index(t.name));
    if (max_layer >= 0) inferred["n_layer"] = max_layer + 1;
    return inferred;
}

// The file's layers must be exactly transformer.h.0 ... h.<n_layer-1>. Checked before the
// parameter table of c is built, whose size is proportional to n_layer: a file of a few tensors
// claiming n_layer 10^6 must not make anything allocate 10^6 layers.
void check_layer_count(const SafeTensorsFile& f, const GPTConfig& c) {
    std::set<int> layers;
    for (const auto& t : f.tensors())
        if (const int l = layer_index(t.name); l >= 0) layers.insert(l);
    const int max_layer = layers.empty() ? -1 : *layers.rbegin();
    if (static_cast<int>(layers.size()) != c.n_layer || max_layer + 1 != c.n_layer)
        fail(f.path(),
             "the config says n_layer=" + std::to_string(c.n_layer) +
                 " but the file holds tensors of " + std::to_string(layers.size()) + " layers" +
                 (layers.empty()
                      ? std::string(" (no transformer.h.N.* tensor)")
                      : " (transformer.h.N with N from " + std::to_string(*layers.begin()) +
                            " to " + std::to_string(max_layer) + ")") +
                 "; expected transformer.h.0 ... transformer.h." + std::to_string(c.n_layer - 1) +
                 " (fix __metadata__ \"n_layer\" or the tensors)");
}

// ---- the steps of load_checkpoint -----------------------------------------------------------

// 1. The config in the metadata (where present) must be the model's.
void check_config_matches_model(const SafeTensorsFile& f, const GPTConfig& c) {
    for (const char* key : kConfigKeys) {
        if (!f.metadata_value(key)) continue;
        const int have = metadata_int(f, key, 1);
        const int want = config_value(c, key);
        if (have != want)
            fail(f.path(), std::string("the checkpoint is for ") + key + "=" +
                               std::to_string(have) + " but the model has " + key + "=" +
                               std::to_string(want) +
                               " (build the model from read_checkpoint_config(file))");
    }
}

// 2. Every tensor must be known: a parameter, its optimizer moments, or a nanoGPT extra (the
// tied lm_head.weight, a layer's attn.bias / attn.masked_bias buffer). Returns whether the file
// holds optimizer moments.
bool check_every_tensor_is_known(const SafeTensorsFile& f, const ParameterTable& table,
                                 const GPTConfig& c) {
    // A hash set of the names: ParameterTable::find is a linear scan, and a file may hold many
    // tensors (a loop of finds would be quadratic in the layer count).
    std::unordered_set<std::string_view> names;
    for (const auto& p : table.tensors()) names.insert(p.name);
    bool any_optim = false;
    for (const auto& t : f.tensors()) {
        const std::string& n = t.name;
        if (names.count(n) || n == "lm_head.weight") continue;
        if ((n.rfind("optim.m.", 0) == 0 || n.rfind("optim.v.", 0) == 0) &&
            names.count(std::string_view(n).substr(8))) {
            any_optim = true;
            continue;
        }
        std::string rest;
        const int l = layer_index(n, &rest);
        if (l >= 0 && l < c.n_layer && (rest == "attn.bias" || rest == "attn.masked_bias"))
            continue;
        LoraTarget target{};
        bool is_a = false;
        if (l >= 0 && parse_lora_suffix(rest, &target, &is_a)) {
            const bool model_has_lora = std::any_of(table.tensors().begin(), table.tensors().end(),
                                                    [](const ParameterInfo& p) { return p.lora; });
            fail(f.path(), "tensor '" + n + "' is a LoRA adapter, but the model has " +
                               (model_has_lora ? "none on layer " + std::to_string(l) + "'s " +
                                                     std::string(enum_name(target))
                                               : std::string("no LoRA adapters")) +
                               ": build it with the checkpoint's model.lora (rank, alpha and "
                               "targets: read_checkpoint_lora), or merge the adapters into the "
                               "weights first (`microtrain export CKPT --merged OUT`)");
        }
        fail(f.path(), "unknown tensor '" + n + "' " + to_string(t.dtype) + " " +
                           shape_string(t.shape) + ": a " + c.describe() +
                           " checkpoint holds only the nanoGPT parameters (transformer.wte.weight, "
                           "transformer.h.0..." +
                           std::to_string(c.n_layer - 1) +
                           ".*, transformer.ln_f.*), optim.m.<name> / optim.v.<name>, "
                           "lm_head.weight and the transformer.h.N.attn.bias mask buffers");
    }
    return any_optim;
}

// The tensor `name`, which holds parameter p or one of its moments, checked: present, floating,
// and of p's shape, except that wte (and its moments) may have exactly vocab_size rows (nanoGPT
// does not pad) instead of padded_vocab_size.
const TensorEntry& check_parameter_shaped(const SafeTensorsFile& f, const std::string& name,
                                          const ParameterInfo& p, int64_t vocab_size) {
    const std::string& path = f.path();
    const TensorEntry* t = f.find(name);
    std::vector<int64_t> unpadded = p.shape;
    if (p.name == kWteName) unpadded[0] = vocab_size;
    const std::string expect =
        "F32 " + shape_string(p.shape) +
        (unpadded != p.shape ? " or " + shape_string(unpadded) + " (unpadded)" : "");
    if (!t) fail(path, "missing tensor '" + name + "' (expected " + expect + ")");
    if (!is_floating(t->dtype))
        fail(path, "tensor '" + name + "' has dtype " + to_string(t->dtype) + ", expected " +
                       expect + " (F16, BF16 and F64 are also accepted and converted)");
    if (t->shape != p.shape && t->shape != unpadded) {
        std::string hint;
        if (t->shape.size() == 2 && p.shape.size() == 2 && t->shape[0] == p.shape[1] &&
            t->shape[1] == p.shape[0])
            hint =
                "; it looks transposed: Hugging Face GPT-2 stores Conv1D weights as (in, out), "
                "and a file whose every Linear weight is so is read as one by model.init_from, "
                "`microtrain sample` and `export --hf` (checkpoint/pretrained.h), but a "
                "checkpoint holds PyTorch Linear's (out, in)";
        fail(path, "tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " +
                       expect + hint);
    }
    return *t;
}

// Reads a parameter-shaped tensor into flat[offset, offset + p.count); the rows of an unpadded
// wte beyond vocab_size stay 0.
void read_parameter_into(const SafeTensorsFile& f, const TensorEntry& t, const ParameterInfo& p,
                         size_t offset, std::vector<float>& flat) {
    std::fill(flat.begin() + offset, flat.begin() + offset + p.count, 0.0f);
    f.read_f32_into(t, flat.data() + offset);
}

// 3. Every parameter, into a flat buffer in the table's layout. Sets *wte_rows to the rows of
// the file's wte.
std::vector<float> read_parameters(const SafeTensorsFile& f, const ParameterTable& table,
                                   int64_t vocab_size, int64_t* wte_rows) {
    std::vector<float> params(table.total_count(), 0.0f);
    for (const auto& p : table.tensors()) {
        const TensorEntry& t = check_parameter_shaped(f, p.name, p, vocab_size);
        if (p.name == kWteName) *wte_rows = t.shape[0];
        read_parameter_into(f, t, p, p.offset, params);
    }
    return params;
}

// 4. The tied LM head nanoGPT's state_dict repeats must equal wte, bit for bit (`wte` is the
// file's wte as read into the parameter buffer).
void check_lm_head_is_tied(const SafeTensorsFile& f, const float* wte, int n_embd) {
    const TensorEntry* head = f.find("lm_head.weight");
    if (!head) return;
    const std::string& path = f.path();
    const TensorEntry& file_wte = f.at(kWteName);
    if (head->shape != file_wte.shape)
        fail(path, "tensor 'lm_head.weight' has shape " + shape_string(head->shape) +
                       ", expected " + shape_string(file_wte.shape) +
                       " like transformer.wte.weight (microtrain ties the LM head to wte)");
    if (!is_floating(head->dtype))
        fail(path, std::string("tensor 'lm_head.weight' has dtype ") + to_string(head->dtype) +
                       ", expected a floating-point dtype like transformer.wte.weight");
    std::vector<float> h(head->numel());
    f.read_f32_into(*head, h.data());
    for (size_t i = 0; i < h.size(); ++i)
        if (std::bit_cast<uint32_t>(h[i]) != std::bit_cast<uint32_t>(wte[i]))
            fail(path,
                 "tensor 'lm_head.weight' differs from transformer.wte.weight (first at row " +
                     std::to_string(i / n_embd) + ", column " + std::to_string(i % n_embd) + ": " +
                     std::to_string(h[i]) + " vs " + std::to_string(wte[i]) +
                     "); microtrain ties the LM head to the token embedding, so an untied "
                     "checkpoint cannot be loaded");
}

// nanoGPT's attn.bias buffer b must be tril(ones(S, S)) of shape (1, 1, S, S).
void check_causal_mask(const SafeTensorsFile& f, const TensorEntry& b, int64_t S) {
    const std::string& path = f.path();
    const std::vector<int64_t> want{1, 1, S, S};
    if (b.shape != want)
        fail(path, "tensor '" + b.name + "' has shape " + shape_string(b.shape) + ", expected " +
                       shape_string(want) + " (nanoGPT's causal mask for max_seq_len " +
                       std::to_string(S) + ")");
    const std::vector<double> mask = f.read_f64(b);
    for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < S; ++j)
            if ((mask[i * S + j] != 0) != (j <= i))
                fail(path, "tensor '" + b.name + "' is not the causal mask tril(ones(" +
                               std::to_string(S) + ", " + std::to_string(S) + ")): element (" +
                               std::to_string(i) + ", " + std::to_string(j) + ") is " +
                               std::to_string(mask[i * S + j]) +
                               "; microtrain's attention is always causal");
}

// 5. nanoGPT's causal-mask buffers: accepted if they are what the model computes anyway.
void check_causal_mask_buffers(const SafeTensorsFile& f, const GPTConfig& c) {
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        if (const TensorEntry* b = f.find(h + "attn.bias")) check_causal_mask(f, *b, c.max_seq_len);
        if (const TensorEntry* mb = f.find(h + "attn.masked_bias"); mb && mb->numel() != 1)
            fail(f.path(), "tensor '" + mb->name + "' has shape " + shape_string(mb->shape) +
                               ", expected a scalar (Hugging Face's masked_bias)");
    }
}

// The AdamW moments of the trainable tensors, in the device layout's trainable prefix (what
// AdamW::set_state takes).
struct OptimizerMoments {
    std::vector<float> m, v;
};

// A checkpoint without moments, given an optimizer to restore.
[[noreturn]] void refuse_missing_moments(const SafeTensorsFile& f) {
    fail(f.path(),
         "has no optimizer state (no optim.m.<name> / optim.v.<name> tensors) but an "
         "optimizer was given to restore; load without one to restore the weights only");
}

// 6. Optimizer state: all or nothing (optim.m.* and optim.v.* of every tensor the model trains,
// and the step count); required when `read_values` (an optimizer is to be restored), which also
// refuses moments of a tensor the model does not train (the file was written with another
// optim.freeze / model.lora: resuming from it would drop state silently). Without `read_values`
// the moments are checked but not read, and the result is empty.
OptimizerMoments read_optimizer_state(const SafeTensorsFile& f, const ParameterTable& table,
                                      int64_t vocab_size, bool has_moments, bool read_values) {
    OptimizerMoments moments;
    if (!has_moments) {
        if (read_values) refuse_missing_moments(f);
        return moments;
    }
    if (read_values) {
        moments.m.assign(table.trainable_count(), 0.0f);
        moments.v.assign(table.trainable_count(), 0.0f);
    }
    for (const auto& p : table.tensors()) {
        if (!p.trainable) {
            if (read_values && (f.find("optim.m." + p.name) || f.find("optim.v." + p.name)))
                fail(f.path(), "holds AdamW moments of '" + p.name +
                                   "', which this model does not train (it is frozen by "
                                   "model.lora or optim.freeze); the checkpoint was written with "
                                   "other trainable parameters, so its optimizer state cannot be "
                                   "restored (load the weights only, without an optimizer)");
            continue;
        }
        const TensorEntry& tm = check_parameter_shaped(f, "optim.m." + p.name, p, vocab_size);
        const TensorEntry& tv = check_parameter_shaped(f, "optim.v." + p.name, p, vocab_size);
        if (read_values) {
            read_parameter_into(f, tm, p, p.device_offset, moments.m);
            read_parameter_into(f, tv, p, p.device_offset, moments.v);
        }
    }
    if (!f.metadata_value("step"))
        fail(f.path(),
             "has optimizer state (optim.m.* / optim.v.*) but no __metadata__ \"step\" "
             "(the AdamW step count, needed for bias correction)");
    return moments;
}

// lora_alpha of the metadata: a finite number > 0 written as text.
float metadata_alpha(const SafeTensorsFile& f) {
    const std::string* v = f.metadata_value(kLoraAlphaKey);
    char* end = nullptr;
    const float a = v ? std::strtof(v->c_str(), &end) : 0.0f;
    if (!v || v->empty() || *end != '\0' || !(a > 0) || !std::isfinite(a))
        fail(f.path(), std::string("__metadata__ \"") + kLoraAlphaKey + "\" is " +
                           (v ? "\"" + *v + "\"" : std::string("absent")) +
                           ", expected the LoRA alpha (a number > 0; the adapters' update is "
                           "scaled by alpha/rank) written as a decimal string");
    return a;
}

// 1b. The LoRA config in the metadata (where present) must be the model's: adapters trained
// at one alpha/rank mean something else at another.
void check_lora_matches_model(const SafeTensorsFile& f, const LoraConfig& lora) {
    const bool file_has = f.metadata_value(kLoraRankKey) || f.metadata_value(kLoraAlphaKey);
    if (!file_has || !lora.enabled()) return;  // the tensors decide (missing / unknown tensor)
    if (f.metadata_value(kLoraRankKey) && metadata_int(f, kLoraRankKey, 1) != lora.rank)
        fail(f.path(), "the checkpoint's LoRA rank is " + *f.metadata_value(kLoraRankKey) +
                           " but the model's model.lora.rank is " + std::to_string(lora.rank));
    if (f.metadata_value(kLoraAlphaKey) && metadata_alpha(f) != lora.alpha)
        fail(f.path(), "the checkpoint's LoRA alpha is " + *f.metadata_value(kLoraAlphaKey) +
                           " but the model's model.lora.alpha is " + format_float(lora.alpha) +
                           " (the adapters' update is scaled by alpha/rank)");
}

}  // namespace

// ---- model checkpoints ----------------------------------------------------------------------

GPTConfig read_checkpoint_config(const SafeTensorsFile& f) {
    const std::map<std::string, int> inferred = infer_config_from_shapes(f);
    GPTConfig c;
    for (const char* key : kConfigKeys) {
        if (f.metadata_value(key)) {
            config_field(c, key) = metadata_int(f, key, 1);
        } else if (auto it = inferred.find(key); it != inferred.end()) {
            config_field(c, key) = it->second;
        } else if (std::string(key) == "n_head") {
            fail(f.path(),
                 "no __metadata__ \"n_head\": the number of attention heads cannot be inferred "
                 "from tensor shapes; add it to the file's metadata (e.g. \"n_head\": \"12\" for "
                 "GPT-2 124M)");
        } else {
            fail(f.path(), std::string("no __metadata__ \"") + key +
                               "\" and no tensor to infer it from (expected "
                               "transformer.wte.weight, transformer.wpe.weight and "
                               "transformer.h.N.* tensors)");
        }
    }
    try {
        c.validate();
        if (c.vocab_size > INT_MAX - 127)  // padded_vocab_size() must fit in int
            throw std::invalid_argument("vocab_size must be <= " + std::to_string(INT_MAX - 127) +
                                        ", got " + std::to_string(c.vocab_size));
    } catch (const std::exception& e) {
        fail(f.path(), std::string("the model config it describes (") + c.describe() +
                           ") is invalid: " + e.what());
    }
    // The config must be the one the tensors have (every parameter present with its shape), so
    // a model built from it allocates no more than the file holds.
    check_layer_count(f, c);
    const ParameterTable table(c);
    for (const auto& p : table.tensors()) check_parameter_shaped(f, p.name, p, c.vocab_size);
    return c;
}

GPTConfig read_checkpoint_config(const std::string& path) {
    return read_checkpoint_config(SafeTensorsFile::open(path));
}

LoraConfig read_checkpoint_lora(const SafeTensorsFile& f, const GPTConfig& c) {
    // Which (layer, target) pairs hold A and B, and the rank of the first A.
    std::map<LoraTarget, std::set<int>> a_layers, b_layers;
    LoraConfig lora;
    lora.targets.clear();
    const TensorEntry* first_a = nullptr;
    for (const auto& t : f.tensors()) {
        std::string rest;
        LoraTarget target{};
        bool is_a = false;
        const int l = layer_index(t.name, &rest);
        if (l < 0 || !parse_lora_suffix(rest, &target, &is_a)) continue;
        (is_a ? a_layers : b_layers)[target].insert(l);
        if (is_a && !first_a) first_a = &t;
    }
    if (!first_a && b_layers.empty()) {
        if (f.metadata_value(kLoraRankKey))
            fail(f.path(), std::string("__metadata__ \"") + kLoraRankKey + "\" is " +
                               *f.metadata_value(kLoraRankKey) +
                               " but the file holds no LoRA tensors (<linear>.lora_A.weight)");
        lora.rank = 0;
        return lora;
    }
    std::set<int> every_layer;
    for (int l = 0; l < c.n_layer; ++l) every_layer.insert(l);
    for (const auto& [target, layers] : b_layers)
        if (!a_layers.count(target)) a_layers[target];  // reported below: B without A
    for (const auto& [target, layers] : a_layers) {
        if (layers != every_layer || b_layers[target] != every_layer)
            fail(f.path(), "the LoRA adapters of " + std::string(enum_name(target)) +
                               " are not in every layer with both lora_A and lora_B (layers with "
                               "A: " +
                               std::to_string(layers.size()) +
                               ", with B: " + std::to_string(b_layers[target].size()) +
                               ", the model has " + std::to_string(c.n_layer) +
                               "); microtrain adapts the same Linears in every layer");
        lora.targets.push_back(target);
    }
    if (!first_a || first_a->shape.size() != 2 || first_a->shape[0] < 1 ||
        first_a->shape[0] > GPTConfig::kMaxEmbd)
        fail(f.path(), "tensor '" + (first_a ? first_a->name : std::string("lora_A")) +
                           "' should be 2-D (rank, in) with rank in [1, " +
                           std::to_string(GPTConfig::kMaxEmbd) + "]");
    lora.rank = static_cast<int>(first_a->shape[0]);
    lora.alpha = metadata_alpha(f);
    check_lora_matches_model(f, lora);
    if (const std::string* t = f.metadata_value(kLoraTargetsKey);
        t && *t != lora_targets_text(lora))
        fail(f.path(), std::string("__metadata__ \"") + kLoraTargetsKey + "\" is \"" + *t +
                           "\" but the file's LoRA tensors adapt \"" + lora_targets_text(lora) +
                           "\"");
    // Every adapter of the shape the model's table gives it (A (rank, in), B (out, rank)).
    TrainableOptions opt;
    opt.lora = lora;
    std::unique_ptr<ParameterTable> table;
    try {
        table = std::make_unique<ParameterTable>(c, opt);
    } catch (const std::invalid_argument& e) {  // e.g. a rank the model cannot have
        fail(f.path(), std::string("its LoRA adapters do not fit the model: ") + e.what());
    }
    for (const auto& p : table->tensors())
        if (p.lora) check_parameter_shaped(f, p.name, p, c.vocab_size);
    return lora;
}

std::vector<CheckpointTensor> checkpoint_tensors(const ParameterTable& table,
                                                 const std::vector<float>& params,
                                                 const std::vector<float>* m,
                                                 const std::vector<float>* v) {
    std::vector<CheckpointTensor> out;
    for (const auto& p : table.tensors())
        out.push_back({p.name, p.shape, std::span(params.data() + p.offset, p.count)});
    if (!m || !v) return out;
    for (const auto* moments : {m, v})
        for (const auto& p : table.tensors())
            if (p.trainable)
                out.push_back({(moments == m ? "optim.m." : "optim.v.") + p.name, p.shape,
                               std::span(moments->data() + p.device_offset, p.count)});
    return out;
}

void save_checkpoint(const std::string& path, GPT& model, AdamW* opt,
                     const std::map<std::string, std::string>& extra) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    SafeTensorsWriter w;
    for (const auto& [k, v] : extra) {
        for (const char* key : kConfigKeys)
            if (k == key)
                throw CheckpointError(path + ": extra metadata may not override \"" + k + "\"");
        for (const char* key : {"step", kLoraRankKey, kLoraAlphaKey, kLoraTargetsKey})
            if (k == key)
                throw CheckpointError(path + ": extra metadata may not override \"" + k + "\"");
        w.set_metadata(k, v);
    }
    for (const char* key : kConfigKeys) w.set_metadata(key, std::to_string(config_value(c, key)));
    w.set_metadata("format", "pt");  // what Hugging Face tooling expects of a PyTorch file
    // The LoRA config: the rank and targets are in the tensors too, alpha only here.
    if (const LoraConfig& l = model.options().trainable.lora; l.enabled()) {
        w.set_metadata(kLoraRankKey, std::to_string(l.rank));
        w.set_metadata(kLoraAlphaKey, format_float(l.alpha));
        w.set_metadata(kLoraTargetsKey, lora_targets_text(l));
    }

    // Host copies; the writer references them, so they live until write() returns.
    const std::vector<float> params = model.get_params();
    std::vector<float> m, v;
    if (opt) {
        m = opt->get_m();
        v = opt->get_v();
        if (m.size() != table.trainable_count())
            throw CheckpointError(path +
                                  ": the optimizer holds a share of the moments (ZeRO-1); "
                                  "gather them into an unsharded AdamW to checkpoint them");
        w.set_metadata("step", std::to_string(opt->steps_taken()));
    }
    for (const CheckpointTensor& t :
         checkpoint_tensors(table, params, opt ? &m : nullptr, opt ? &v : nullptr))
        w.add_f32(t.name, t.shape, t.values);
    w.write(path);
}

CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& f, GPT& model, AdamW* opt) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    const int64_t vocab_size = c.vocab_size;

    check_config_matches_model(f, c);
    check_lora_matches_model(f, model.options().trainable.lora);
    const bool has_moments = check_every_tensor_is_known(f, table, c);

    CheckpointLoadInfo info;
    info.metadata = f.metadata();
    const std::vector<float> params = read_parameters(f, table, vocab_size, &info.wte_rows);
    check_lm_head_is_tied(f, params.data() + table.at(kWteName).offset, c.n_embd);
    check_causal_mask_buffers(f, c);

    info.has_optimizer_state = has_moments;
    if (f.metadata_value("step")) info.step = metadata_int(f, "step", 0);
    const OptimizerMoments moments =
        opt ? read_optimizer_state(f, table, vocab_size, has_moments, /*read_values=*/true)
            : OptimizerMoments{};

    // 7. Commit (nothing was changed before every check passed).
    model.set_params(params);
    if (opt) opt->set_state(moments.m, moments.v, info.step);
    return info;
}

std::vector<float> read_checkpoint_weights(const SafeTensorsFile& f, const GPTConfig& c,
                                           const TrainableOptions& trainable) {
    const ParameterTable table(c, trainable);
    check_config_matches_model(f, c);
    check_lora_matches_model(f, trainable.lora);
    check_every_tensor_is_known(f, table, c);
    int64_t wte_rows = 0;
    std::vector<float> params = read_parameters(f, table, c.vocab_size, &wte_rows);
    check_lm_head_is_tied(f, params.data() + table.at(kWteName).offset, c.n_embd);
    check_causal_mask_buffers(f, c);
    return params;
}

void check_checkpoint_layout(const SafeTensorsFile& f, const GPTConfig& c,
                             const TrainableOptions& trainable, bool with_optimizer) {
    const ParameterTable table(c, trainable);
    check_config_matches_model(f, c);
    check_lora_matches_model(f, trainable.lora);
    const bool has_moments = check_every_tensor_is_known(f, table, c);
    for (const auto& p : table.tensors()) check_parameter_shaped(f, p.name, p, c.vocab_size);
    check_causal_mask_buffers(f, c);
    if (!with_optimizer) return;
    if (!has_moments) refuse_missing_moments(f);
    read_optimizer_state(f, table, c.vocab_size, has_moments, /*read_values=*/false);
}

CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt) {
    return load_checkpoint(SafeTensorsFile::open(path), model, opt);
}

// ---- LoRA export ----------------------------------------------------------------------------

std::vector<float> merge_lora(const ParameterTable& lora_table, const LoraConfig& lora,
                              const std::vector<float>& params, const GPTConfig& config) {
    const ParameterTable plain(config);
    std::vector<float> out(plain.total_count());
    const double scale = static_cast<double>(lora.alpha) / lora.rank;
    for (const auto& p : plain.tensors()) {
        const ParameterInfo& src = lora_table.at(p.name);
        const float* w = params.data() + src.offset;
        float* dst = out.data() + p.offset;
        // "<linear>.weight" -> its adapters "<linear>.lora_A.weight", "<linear>.lora_B.weight".
        const std::string suffix = ".weight";
        const bool is_weight =
            p.shape.size() == 2 && p.name.size() > suffix.size() &&
            p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) == 0;
        const std::string linear =
            is_weight ? p.name.substr(0, p.name.size() - suffix.size()) : std::string();
        const ParameterInfo* a = is_weight ? lora_table.find(linear + ".lora_A.weight") : nullptr;
        if (!a) {
            std::copy(w, w + p.count, dst);
            continue;
        }
        const ParameterInfo& b = lora_table.at(linear + ".lora_B.weight");
        const float* A = params.data() + a->offset;  // (rank, in)
        const float* B = params.data() + b.offset;   // (out, rank)
        const size_t out_f = static_cast<size_t>(p.shape[0]),
                     in_f = static_cast<size_t>(p.shape[1]);
        const size_t r = static_cast<size_t>(lora.rank);
        for (size_t o = 0; o < out_f; ++o)
            for (size_t i = 0; i < in_f; ++i) {
                double ba = 0;
                for (size_t k = 0; k < r; ++k) ba += double(B[o * r + k]) * double(A[k * in_f + i]);
                dst[o * in_f + i] = static_cast<float>(double(w[o * in_f + i]) + scale * ba);
            }
    }
    return out;
}

namespace {
SafeTensorsWriter writer_with_config(const std::string& path, const GPTConfig& c,
                                     const std::map<std::string, std::string>& extra) {
    SafeTensorsWriter w;
    for (const auto& [k, v] : extra) {
        for (const char* key : kConfigKeys)
            if (k == key)
                throw CheckpointError(path + ": extra metadata may not override \"" + k + "\"");
        w.set_metadata(k, v);
    }
    for (const char* key : kConfigKeys) w.set_metadata(key, std::to_string(config_value(c, key)));
    w.set_metadata("format", "pt");
    return w;
}
}  // namespace

void save_plain_checkpoint(const std::string& path, const GPTConfig& config,
                           const std::vector<float>& params,
                           const std::map<std::string, std::string>& extra) {
    const ParameterTable table(config);
    if (params.size() != table.total_count())
        throw CheckpointError(path + ": expected " + std::to_string(table.total_count()) +
                              " parameters of a plain " + config.describe() + " model, got " +
                              std::to_string(params.size()));
    SafeTensorsWriter w = writer_with_config(path, config, extra);
    for (const auto& p : table.tensors()) {
        std::vector<int64_t> shape = p.shape;
        size_t count = p.count;
        if (p.name == kWteName) {  // nanoGPT's wte: exactly vocab_size rows
            shape[0] = config.vocab_size;
            count = static_cast<size_t>(config.vocab_size) * static_cast<size_t>(shape[1]);
        }
        w.add_f32(p.name, shape, std::span(params.data() + p.offset, count));
        if (p.name == kWteName)
            w.add_f32("lm_head.weight", shape, std::span(params.data() + p.offset, count));
    }
    w.write(path);
}

void save_lora_adapters(const std::string& path, const ParameterTable& lora_table,
                        const LoraConfig& lora, const std::vector<float>& params,
                        const GPTConfig& config, const std::map<std::string, std::string>& extra) {
    if (!lora.enabled()) throw CheckpointError(path + ": the model has no LoRA adapters to write");
    SafeTensorsWriter w = writer_with_config(path, config, extra);
    w.set_metadata(kLoraRankKey, std::to_string(lora.rank));
    w.set_metadata(kLoraAlphaKey, format_float(lora.alpha));
    w.set_metadata(kLoraTargetsKey, lora_targets_text(lora));
    for (const auto& p : lora_table.tensors())
        if (p.lora) w.add_f32(p.name, p.shape, std::span(params.data() + p.offset, p.count));
    w.write(path);
}

}  // namespace mt

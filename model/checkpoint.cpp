// Model checkpoints. See checkpoint.h for the tensor names and metadata keys, and
// io/safetensors.h for the file format.
//
// Loading is check-then-commit: every tensor of the file is checked (known name, dtype, shape,
// the tied LM head, the causal-mask buffers, the optimizer moments) and read into host buffers,
// and only then are the model and the optimizer given the new values. A rejected file leaves
// both untouched.
#include "model/checkpoint.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <climits>
#include <cstring>
#include <set>
#include <span>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "optim/adamw.h"

namespace mt {
namespace {

const char* const kConfigKeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};

const std::string kWteName = "transformer.wte.weight";

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
                "; it looks transposed (Hugging Face GPT-2 stores Conv1D weights as "
                "(in, out): transpose them to PyTorch Linear's (out, in))";
        fail(path, "tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " +
                       expect + hint);
    }
    return *t;
}

// Reads a parameter-shaped tensor into flat[p.offset, p.offset + p.count); the rows of an
// unpadded wte beyond vocab_size stay 0.
void read_parameter_into(const SafeTensorsFile& f, const TensorEntry& t, const ParameterInfo& p,
                         std::vector<float>& flat) {
    std::fill(flat.begin() + p.offset, flat.begin() + p.offset + p.count, 0.0f);
    f.read_f32_into(t, flat.data() + p.offset);
}

// 3. Every parameter, into a flat buffer in the table's layout. Sets *wte_rows to the rows of
// the file's wte.
std::vector<float> read_parameters(const SafeTensorsFile& f, const ParameterTable& table,
                                   int64_t vocab_size, int64_t* wte_rows) {
    std::vector<float> params(table.total_count(), 0.0f);
    for (const auto& p : table.tensors()) {
        const TensorEntry& t = check_parameter_shaped(f, p.name, p, vocab_size);
        if (p.name == kWteName) *wte_rows = t.shape[0];
        read_parameter_into(f, t, p, params);
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

// The AdamW moments in the table's layout.
struct OptimizerMoments {
    std::vector<float> m, v;
};

// 6. Optimizer state: all or nothing (every parameter's optim.m.* and optim.v.*, and the step
// count); required when `read_values` (an optimizer is to be restored). Without `read_values`
// the moments are checked but not read, and the result is empty.
OptimizerMoments read_optimizer_state(const SafeTensorsFile& f, const ParameterTable& table,
                                      int64_t vocab_size, bool has_moments, bool read_values) {
    OptimizerMoments moments;
    if (!has_moments) {
        if (read_values)
            fail(f.path(),
                 "has no optimizer state (no optim.m.<name> / optim.v.<name> tensors) but an "
                 "optimizer was given to restore; load without one to restore the weights only");
        return moments;
    }
    if (read_values) {
        moments.m.assign(table.total_count(), 0.0f);
        moments.v.assign(table.total_count(), 0.0f);
    }
    for (const auto& p : table.tensors()) {
        const TensorEntry& tm = check_parameter_shaped(f, "optim.m." + p.name, p, vocab_size);
        const TensorEntry& tv = check_parameter_shaped(f, "optim.v." + p.name, p, vocab_size);
        if (read_values) {
            read_parameter_into(f, tm, p, moments.m);
            read_parameter_into(f, tv, p, moments.v);
        }
    }
    if (!f.metadata_value("step"))
        fail(f.path(),
             "has optimizer state (optim.m.* / optim.v.*) but no __metadata__ \"step\" "
             "(the AdamW step count, needed for bias correction)");
    return moments;
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

void save_checkpoint(const std::string& path, GPT& model, AdamW* opt,
                     const std::map<std::string, std::string>& extra) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    SafeTensorsWriter w;
    for (const auto& [k, v] : extra) {
        for (const char* key : kConfigKeys)
            if (k == key)
                throw CheckpointError(path + ": extra metadata may not override \"" + k + "\"");
        if (k == "step") throw CheckpointError(path + ": extra metadata may not override \"step\"");
        w.set_metadata(k, v);
    }
    for (const char* key : kConfigKeys) w.set_metadata(key, std::to_string(config_value(c, key)));
    w.set_metadata("format", "pt");  // what Hugging Face tooling expects of a PyTorch file

    // Host copies; the writer references them, so they live until write() returns.
    const std::vector<float> params = model.get_params();
    std::vector<float> m, v;
    for (const auto& p : table.tensors())
        w.add_f32(p.name, p.shape, std::span<const float>(params.data() + p.offset, p.count));
    if (opt) {
        m = opt->get_m();
        v = opt->get_v();
        for (const auto& p : table.tensors())
            w.add_f32("optim.m." + p.name, p.shape,
                      std::span<const float>(m.data() + p.offset, p.count));
        for (const auto& p : table.tensors())
            w.add_f32("optim.v." + p.name, p.shape,
                      std::span<const float>(v.data() + p.offset, p.count));
        w.set_metadata("step", std::to_string(opt->steps_taken()));
    }
    w.write(path);
}

CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& f, GPT& model, AdamW* opt) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    const int64_t vocab_size = c.vocab_size;

    check_config_matches_model(f, c);
    const bool has_moments = check_every_tensor_is_known(f, table, c);

    CheckpointLoadInfo info;
    info.metadata = f.metadata();
    const std::vector<float> params = read_parameters(f, table, vocab_size, &info.wte_rows);
    check_lm_head_is_tied(f, params.data() + table.at(kWteName).offset, c.n_embd);
    check_causal_mask_buffers(f, c);

    info.has_optimizer_state = has_moments;
    if (f.metadata_value("step")) info.step = metadata_int(f, "step", 0);
    const OptimizerMoments moments =
        read_optimizer_state(f, table, vocab_size, has_moments, opt != nullptr);

    // 7. Commit (nothing was changed before every check passed).
    model.set_params(params);
    if (opt) opt->set_state(moments.m, moments.v, info.step);
    return info;
}

CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt) {
    return load_checkpoint(SafeTensorsFile::open(path), model, opt);
}

}  // namespace mt

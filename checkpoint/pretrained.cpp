// Starting points: see pretrained.h for the three formats and how each is read.
#include "checkpoint/pretrained.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw CheckpointError(path + ": " + what);
}

const std::string kPrefix = "transformer.";
const std::string kHfWeightsName = "model.safetensors";
const std::string kHfConfigName = "config.json";
// config.json of GPT-2 124M is under 1 KiB; anything near this bound is not a config.
constexpr size_t kMaxConfigBytes = 1 << 20;

const std::string kWhatInitFromTakes =
    "expected a `microtrain train` checkpoint or its run directory, a nanoGPT weights file (what "
    "`step` / `export --merged` write), or a Hugging Face GPT-2 model.safetensors or its folder";

bool starts_with(const std::string& s, std::string_view p) {
    return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

// ---- where the weights are --------------------------------------------------------------------

// A train run directory's newest checkpoint: checkpoints/step-NNNNNNNN.safetensors, whose
// zero-padded names sort by step.
std::string newest_train_checkpoint(const fs::path& dir) {
    std::error_code ec;
    std::string newest;
    for (const auto& e : fs::directory_iterator(dir / "checkpoints", ec)) {
        const std::string n = e.path().filename().string();
        if (starts_with(n, "step-") && n.size() > 12 &&
            n.compare(n.size() - 12, 12, ".safetensors") == 0 &&
            (newest.empty() || n > fs::path(newest).filename().string()))
            newest = e.path().string();
    }
    return newest;
}

// How a missing checkpoint of one's own is made. `train FILE.yaml` writes its run directory at
// <report.out_dir>/<name>-train: a missing directory of that form names the experiment to train.
std::string make_it_hint(const std::string& path) {
    std::string trimmed = path;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const std::string dir = fs::path(trimmed).filename().string();
    const std::string suffix = "-train";
    std::string hint =
        ". A checkpoint of your own is made first by `microtrain train FILE.yaml` (its run "
        "directory: --out-dir, or <report.out_dir>/<name>-train)";
    if (dir.size() > suffix.size() &&
        dir.compare(dir.size() - suffix.size(), suffix.size(), suffix) == 0)
        hint += ": here, run `microtrain train` on the experiment file with `name: " +
                dir.substr(0, dir.size() - suffix.size()) +
                "` (from the folder its report.out_dir is relative to) and try again";
    return hint;
}

// PATH as a weights file and, for a Hugging Face file, its config.json (empty when absent).
void resolve_path(const std::string& path, PretrainedInfo& info) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    if (!fs::exists(st)) fail(path, "does not exist; " + kWhatInitFromTakes + make_it_hint(path));
    if (fs::is_directory(st)) {
        const fs::path dir(path);
        if (fs::exists(dir / kHfWeightsName, ec)) {
            info.weights_path = (dir / kHfWeightsName).string();
        } else if (fs::is_directory(dir / "checkpoints", ec)) {
            info.weights_path = newest_train_checkpoint(dir);
            if (info.weights_path.empty())
                fail(path,
                     "is a `microtrain train` run directory without a checkpoint yet "
                     "(checkpoints/step-N.safetensors); let the run reach its first checkpoint, "
                     "or resume it with `microtrain train FILE --resume " +
                         path + "`");
        } else {
            fail(path, "is a directory without " + kHfWeightsName +
                           " (a Hugging Face folder) or checkpoints/ (a `microtrain train` run "
                           "directory); " +
                           kWhatInitFromTakes);
        }
    } else {
        info.weights_path = path;
    }
    const fs::path config = fs::path(info.weights_path).parent_path() / kHfConfigName;
    if (fs::exists(config, ec)) info.config_path = config.string();
}

// A Hugging Face layout: GPT2Model's names (no transformer. prefix), or layer 0's attention
// input weight stored (in, out) = (C, 3C), where nanoGPT stores (3C, C). One tensor decides
// because the two shapes never coincide; the others are then checked against that layout.
bool is_hugging_face_layout(const SafeTensorsFile& f) {
    if (f.find("h.0.attn.c_attn.weight") || f.find("wte.weight")) return true;
    const TensorEntry* w = f.find(kPrefix + "h.0.attn.c_attn.weight");
    return w && w->shape.size() == 2 && w->shape[1] == 3 * w->shape[0];
}

// ---- Hugging Face: config.json ----------------------------------------------------------------

// The integer config key `key` (or `alias`, an older spelling) of config.json.
int config_int(const json& j, const std::string& path, const char* key, const char* alias = "") {
    const char* found = j.contains(key) ? key : (*alias && j.contains(alias) ? alias : nullptr);
    if (!found)
        fail(path, std::string("has no \"") + key +
                       "\"; a GPT-2 config.json gives n_layer, n_head, n_embd, vocab_size and "
                       "n_positions");
    const json& v = j.at(found);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > INT_MAX)
        fail(path,
             std::string("\"") + found + "\" is " + v.dump() + ", expected a positive integer");
    return static_cast<int>(v.get<int64_t>());
}

// A key microtrain's GPT-2 has one value of: absent (the default) or that value.
void require_value(const json& j, const std::string& path, const char* key,
                   const std::vector<json>& allowed, const std::string& why) {
    if (!j.contains(key) || j.at(key).is_null()) return;
    for (const json& a : allowed)
        if (j.at(key) == a) return;
    std::string want;
    for (const json& a : allowed) want += (want.empty() ? "" : " or ") + a.dump();
    fail(path,
         std::string("\"") + key + "\" is " + j.at(key).dump() + ", expected " + want + ": " + why);
}

// What config.json says, checked against what microtrain's GPT-2 computes.
GPTConfig read_hf_config(const std::string& path) {
    json j;
    try {
        j = json::parse(read_regular_file(path, kMaxConfigBytes));
    } catch (const json::exception& e) {
        fail(path, std::string("is not valid JSON (") + e.what() + ")");
    } catch (const std::exception& e) {
        throw CheckpointError(e.what());
    }
    if (!j.is_object()) fail(path, "expected a JSON object (a GPT-2 config.json)");
    require_value(j, path, "model_type", {"gpt2"}, "microtrain reads GPT-2 models only");
    require_value(j, path, "activation_function", {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"},
                  "microtrain's MLP uses the tanh approximation of GELU");
    require_value(j, path, "scale_attn_weights", {true},
                  "microtrain scales attention scores by 1/sqrt(head size)");
    require_value(j, path, "scale_attn_by_inverse_layer_idx", {false},
                  "microtrain does not scale attention by layer");
    require_value(j, path, "tie_word_embeddings", {true},
                  "microtrain's LM head is the token embedding (tied)");
    require_value(j, path, "add_cross_attention", {false}, "GPT-2 has no cross-attention");
    if (j.contains("layer_norm_epsilon") &&
        (!j["layer_norm_epsilon"].is_number() ||
         std::fabs(j["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
        fail(path, "\"layer_norm_epsilon\" is " + j["layer_norm_epsilon"].dump() +
                       ", expected 1e-05 (microtrain's LayerNorm eps)");
    GPTConfig c;
    c.n_layer = config_int(j, path, "n_layer");
    c.n_head = config_int(j, path, "n_head");
    c.n_embd = config_int(j, path, "n_embd");
    c.vocab_size = config_int(j, path, "vocab_size");
    c.max_seq_len = config_int(j, path, "n_positions", "n_ctx");
    if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * int64_t{c.n_embd})
        fail(path, "\"n_inner\" is " + j["n_inner"].dump() + ", expected null or " +
                       std::to_string(4 * int64_t{c.n_embd}) + " (4 x n_embd: GPT-2's MLP)");
    return c;
}

// Without config.json: what the shapes say. n_head is nowhere in them.
[[noreturn]] void refuse_missing_hf_config(const SafeTensorsFile& f) {
    fail(f.path(), "is a Hugging Face GPT-2 file (Conv1D weights (in, out)) without " +
                       kHfConfigName +
                       " beside it: the number of attention heads (n_head) is in no tensor's "
                       "shape; put the model's config.json in the same folder");
}

// ---- Hugging Face: tensors --------------------------------------------------------------------

// A nanoGPT Linear weight: 2-D and inside a block (wte and wpe are the other 2-D tensors).
bool is_conv1d_weight(const ParameterInfo& p) {
    return p.shape.size() == 2 && starts_with(p.name, kPrefix + "h.");
}

// The shape the Hugging Face file stores parameter p with.
std::vector<int64_t> hf_shape(const ParameterInfo& p, const GPTConfig& c) {
    if (is_conv1d_weight(p)) return {p.shape[1], p.shape[0]};
    if (p.name == kPrefix + "wte.weight") return {c.vocab_size, c.n_embd};
    return p.shape;
}

// The file's name for our `name` (transformer.X): transformer.X or X; nullptr when absent.
const TensorEntry* find_hf(const SafeTensorsFile& f, const std::string& name) {
    if (const TensorEntry* t = f.find(name)) return t;
    return f.find(name.substr(kPrefix.size()));
}

// "h.<N>.<rest>" (prefix stripped) -> N < n_layer and rest, or false.
bool block_tensor(const std::string& stripped, int n_layer, std::string* rest) {
    if (!starts_with(stripped, "h.")) return false;
    size_t j = 2;
    while (j < stripped.size() && j < 9 && std::isdigit(static_cast<unsigned char>(stripped[j])))
        ++j;
    if (j == 2 || j >= stripped.size() || stripped[j] != '.') return false;
    if (std::stoi(stripped.substr(2, j - 2)) >= n_layer) return false;
    *rest = stripped.substr(j + 1);
    return true;
}

// Every tensor of the file is a GPT-2 parameter (under one name only), the tied lm_head or a
// causal-mask buffer of its shape; every parameter is there, floating, of its Hugging Face shape.
void check_hf_tensors(const SafeTensorsFile& f, const GPTConfig& c) {
    const ParameterTable table(c);
    std::set<std::string> ours;
    for (const auto& p : table.tensors()) ours.insert(p.name);
    std::set<std::string> seen;
    for (const auto& t : f.tensors()) {
        const std::string stripped =
            starts_with(t.name, kPrefix) ? t.name.substr(kPrefix.size()) : t.name;
        std::string rest;
        if (ours.count(kPrefix + stripped)) {
            if (!seen.insert(stripped).second)
                fail(f.path(), "holds '" + stripped + "' twice (with and without the '" + kPrefix +
                                   "' prefix); keep one");
        } else if (t.name == "lm_head.weight") {
            if (t.shape != std::vector<int64_t>{c.vocab_size, c.n_embd})
                fail(f.path(), "tensor 'lm_head.weight' has shape " + shape_string(t.shape) +
                                   ", expected " + shape_string({c.vocab_size, c.n_embd}) +
                                   " (the tied LM head: wte's shape)");
        } else if (block_tensor(stripped, c.n_layer, &rest) && rest == "attn.bias") {
            const std::vector<int64_t> mask{1, 1, c.max_seq_len, c.max_seq_len};
            if (t.shape != mask)
                fail(f.path(), "tensor '" + t.name + "' has shape " + shape_string(t.shape) +
                                   ", expected " + shape_string(mask) +
                                   " (GPT-2's causal-mask buffer for n_positions " +
                                   std::to_string(c.max_seq_len) + ")");
        } else if (block_tensor(stripped, c.n_layer, &rest) && rest == "attn.masked_bias") {
            if (t.numel() != 1)
                fail(f.path(), "tensor '" + t.name + "' has shape " + shape_string(t.shape) +
                                   ", expected a scalar (Hugging Face's masked_bias)");
        } else {
            fail(f.path(), "unknown tensor '" + t.name + "' " + to_string(t.dtype) + " " +
                               shape_string(t.shape) + ": a Hugging Face GPT-2 (" + c.describe() +
                               ") holds wte, wpe, h.0..." + std::to_string(c.n_layer - 1) +
                               ".{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}, "
                               "ln_f (optionally prefixed '" +
                               kPrefix + "'), the tied lm_head.weight and attn.bias buffers");
        }
    }
    for (const auto& p : table.tensors()) {
        const std::vector<int64_t> want = hf_shape(p, c);
        const std::string expect =
            "F32 " + shape_string(want) + (is_conv1d_weight(p) ? " (Conv1D: in, out)" : "");
        const TensorEntry* t = find_hf(f, p.name);
        if (!t) fail(f.path(), "missing tensor '" + p.name + "' (expected " + expect + ")");
        if (!is_floating(t->dtype))
            fail(f.path(), "tensor '" + t->name + "' has dtype " + to_string(t->dtype) +
                               ", expected " + expect);
        if (t->shape != want)
            fail(f.path(), "tensor '" + t->name + "' has shape " + shape_string(t->shape) +
                               ", expected " + expect + " for the " + c.describe() +
                               " model its config.json describes");
    }
}

// The weights of a checked Hugging Face file in nanoGPT's layout (Conv1D weights transposed,
// wte padded with zero rows); the tied lm_head, where present, must hold wte's values.
std::vector<float> read_hf_params(const SafeTensorsFile& f, const GPTConfig& c) {
    const ParameterTable table(c);
    std::vector<float> params(table.total_count(), 0.0f);
    std::vector<float> buf;
    for (const auto& p : table.tensors()) {
        const TensorEntry& t = *find_hf(f, p.name);
        float* dst = params.data() + p.offset;
        if (!is_conv1d_weight(p)) {  // wte's vocab_size rows; the padding rows stay 0
            f.read_f32_into(t, dst);
            continue;
        }
        buf.resize(t.numel());
        f.read_f32_into(t, buf.data());
        const size_t in = static_cast<size_t>(t.shape[0]), out = static_cast<size_t>(t.shape[1]);
        for (size_t i = 0; i < in; ++i)
            for (size_t o = 0; o < out; ++o) dst[o * in + i] = buf[i * out + o];
    }
    if (const TensorEntry* head = f.find("lm_head.weight")) {
        buf.resize(head->numel());
        f.read_f32_into(*head, buf.data());
        const float* wte = params.data() + table.at(kPrefix + "wte.weight").offset;
        for (size_t i = 0; i < buf.size(); ++i)
            if (std::bit_cast<uint32_t>(buf[i]) != std::bit_cast<uint32_t>(wte[i]))
                fail(f.path(), "tensor 'lm_head.weight' differs from wte (first at row " +
                                   std::to_string(i / c.n_embd) + ", column " +
                                   std::to_string(i % c.n_embd) +
                                   "): an untied LM head; microtrain's head is always the token "
                                   "embedding, so this model cannot be loaded");
    }
    return params;
}

void validate_config(const std::string& path, GPTConfig& c) {
    try {
        c.validate();
    } catch (const std::exception& e) {
        fail(path, "the model it describes (" + c.describe() + ") is invalid: " + e.what());
    }
}

}  // namespace

std::string PretrainedInfo::describe() const {
    std::string s = std::string(enum_name(format)) + " " + weights_path;
    if (!config_path.empty() && format == WeightsFormat::hugging_face) s += " (+ config.json)";
    s += ": " + config.describe() + ", " + std::to_string(tensors) + " tensors";
    if (lora.enabled())
        s += ", LoRA rank " + std::to_string(lora.rank) + " adapters (merged into the weights)";
    if (has_optimizer_state) s += ", step " + std::to_string(step) + " (optimizer state not used)";
    return s;
}

PretrainedInfo inspect_pretrained(const std::string& path) {
    PretrainedInfo info;
    info.path = path;
    resolve_path(path, info);
    const SafeTensorsFile f = SafeTensorsFile::open(info.weights_path);
    info.tensors = f.tensors().size();
    info.metadata = f.metadata();
    if (is_hugging_face_layout(f)) {
        info.format = WeightsFormat::hugging_face;
        if (info.config_path.empty()) refuse_missing_hf_config(f);
        info.config = read_hf_config(info.config_path);
        validate_config(info.config_path, info.config);
        check_hf_tensors(f, info.config);
        return info;
    }
    info.config_path.clear();  // a config.json beside a nanoGPT file is not read
    info.config = read_checkpoint_config(f);
    info.lora = read_checkpoint_lora(f, info.config);
    TrainableOptions trainable;
    trainable.lora = info.lora;
    check_checkpoint_layout(f, info.config, trainable, /*with_optimizer=*/false);
    info.has_optimizer_state =
        std::any_of(f.tensors().begin(), f.tensors().end(),
                    [](const TensorEntry& t) { return starts_with(t.name, "optim.m."); });
    const bool written_by_train = info.has_optimizer_state || f.metadata_value("step");
    info.format = written_by_train ? WeightsFormat::microtrain : WeightsFormat::nanogpt;
    if (const std::string* step = f.metadata_value("step"))
        std::from_chars(step->data(), step->data() + step->size(), info.step);
    return info;
}

std::vector<float> read_pretrained_params(const PretrainedInfo& info) {
    const SafeTensorsFile f = SafeTensorsFile::open(info.weights_path);
    if (info.format == WeightsFormat::hugging_face) {
        check_hf_tensors(f, info.config);  // the file may have changed since inspect_pretrained
        return read_hf_params(f, info.config);
    }
    TrainableOptions trainable;
    trainable.lora = info.lora;
    const std::vector<float> params = read_checkpoint_weights(f, info.config, trainable);
    if (!info.lora.enabled()) return params;
    return merge_lora(ParameterTable(info.config, trainable), info.lora, params, info.config);
}

void load_pretrained(const PretrainedInfo& info, GPT& model, uint64_t seed) {
    if (!(model.config() == info.config))
        fail(info.weights_path, "holds a " + info.config.describe() +
                                    " model but the model to load it into is " +
                                    model.config().describe());
    const std::vector<float> plain = read_pretrained_params(info);
    const ParameterTable plain_table(info.config);
    model.init_weights(seed);  // the model's own extra tensors (LoRA adapters) start as usual
    std::vector<float> host = model.get_params();
    const ParameterTable& table = model.parameter_table();
    for (const auto& p : plain_table.tensors()) {
        const float* src = plain.data() + p.offset;
        std::copy(src, src + p.count, host.data() + table.at(p.name).offset);
    }
    model.set_params(host);
}

void save_hugging_face(const std::string& dir, const GPTConfig& c,
                       const std::vector<float>& params) {
    const ParameterTable table(c);
    if (params.size() != table.total_count())
        throw CheckpointError(dir + ": expected " + std::to_string(table.total_count()) +
                              " parameters of a plain " + c.describe() + " model, got " +
                              std::to_string(params.size()));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (!fs::is_directory(dir))
        throw CheckpointError(dir + ": cannot create the output folder" +
                              (ec ? " (" + ec.message() + ")" : std::string(" (not a directory)")));
    SafeTensorsWriter w;
    w.set_metadata("format", "pt");  // what transformers expects of a PyTorch file
    for (const auto& p : table.tensors()) {
        const float* src = params.data() + p.offset;
        if (is_conv1d_weight(p)) {  // (out, in) -> Conv1D (in, out)
            const size_t out = static_cast<size_t>(p.shape[0]),
                         in = static_cast<size_t>(p.shape[1]);
            std::vector<float> t(p.count);
            for (size_t o = 0; o < out; ++o)
                for (size_t i = 0; i < in; ++i) t[i * out + o] = src[o * in + i];
            w.add_f32(p.name, hf_shape(p, c), std::move(t));
        } else {
            const std::vector<int64_t> shape = hf_shape(p, c);  // wte: vocab_size rows
            w.add_f32(p.name, shape,
                      std::span(src, static_cast<size_t>(shape[0]) *
                                         (shape.size() > 1 ? static_cast<size_t>(shape[1]) : 1)));
        }
    }
    // GPT2Config's keys (transformers' configuration_gpt2.py); what is not given takes its default.
    const json config = {{"architectures", {"GPT2LMHeadModel"}},
                         {"model_type", "gpt2"},
                         {"vocab_size", c.vocab_size},
                         {"n_positions", c.max_seq_len},
                         {"n_embd", c.n_embd},
                         {"n_layer", c.n_layer},
                         {"n_head", c.n_head},
                         {"n_inner", nullptr},
                         {"activation_function", "gelu_new"},
                         {"layer_norm_epsilon", 1e-5},
                         {"resid_pdrop", 0.0},
                         {"embd_pdrop", 0.0},
                         {"attn_pdrop", 0.0},
                         {"scale_attn_weights", true},
                         {"tie_word_embeddings", true},
                         {"torch_dtype", "float32"}};
    w.write((fs::path(dir) / kHfWeightsName).string());
    write_file_atomic((fs::path(dir) / kHfConfigName).string(), config.dump(2) + "\n");
}

}  // namespace mt

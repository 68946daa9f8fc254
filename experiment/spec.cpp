// Experiment spec: YAML file -> validated ExperimentSpec (base config + one RunConfig per variant).
//
// How a config is built. Every per-variant knob has a dotted key ("optim.lr") described once in
// the key table below (its type, its allowed range, where it lives in RunConfig, how it prints).
// The file's sections are flattened into a map dotted key -> Setting (the YAML value node plus
// where it came from); --set overrides replace entries of that map; each variant copies the map
// and applies its `set:` entries. resolve() then turns one map into a RunConfig, checking every
// value and the cross-field constraints, and every error names where the offending value came
// from (FILE:LINE:COL, or the --set argument).
#include "experiment/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "checkpoint/pretrained.h"
#include "engine/data.h"
#include "experiment/spec_text.h"
#include "io/regular_file.h"
#include "kernels/text.h"

namespace mt {

namespace {

namespace fs = std::filesystem;

// ---- where a value came from ------------------------------------------------------------------

std::string mark_text(const std::string& file, const YAML::Mark& m) {
    if (m.is_null() || m.line < 0) return file;
    // yaml-cpp marks are 0-based; editors count from 1.
    return file + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

// One dotted-key value: the YAML node, where it was written, and the directory relative paths
// resolve against (the YAML file's directory; empty = the current directory for --set).
struct Setting {
    YAML::Node node;
    std::string where;      // "FILE:L:C" or "--set key=value"
    std::string key_where;  // where the key itself was written (for duplicate reports)
    std::string base_dir;
    bool from_variant = false;
};
using Settings = std::map<std::string, Setting>;

// The name with every byte outside the printable ASCII range shown as \xHH, for messages: a NUL
// in a key would otherwise cut the message short at a valid-looking key.
std::string printable(const std::string& s) {
    std::string out;
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f) {
            out += c;
        } else {
            const char* d = "0123456789ABCDEF";
            out += std::string("\\x") + d[u >> 4] + d[u & 15];
        }
    }
    return out;
}
[[noreturn]] void fail(const std::string& where, const std::string& key, const std::string& context,
                       const std::string& body) {
    std::string msg = where + ": key '" + printable(key) + "'";
    if (!context.empty()) msg += " (" + context + ")";
    msg += ": " + body;
    throw SpecError(msg);
}

// What a YAML node holds, for "got ..." in messages.
std::string got_text(const YAML::Node& n) {
    if (!n.IsDefined() || n.IsNull()) return "nothing (an empty value)";
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    return "'" + n.Scalar() + "'";
}

// ---- nearest-key suggestions ----------------------------------------------------------------

// Levenshtein distance (insert, delete, substitute each cost 1), case-insensitive.
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                              std::tolower(static_cast<unsigned char>(b[j - 1]));
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (same ? 0 : 1)});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string section_of(const std::string& key) {
    auto dot = key.find('.');
    return dot == std::string::npos ? std::string() : key.substr(0, dot);
}
std::string leaf_of(const std::string& key) {
    auto dot = key.find('.');
    return dot == std::string::npos ? key : key.substr(dot + 1);
}

// Names other tools use for the same knob (PyTorch, nanoGPT, llm.c, Hugging Face). Edit distance
// alone cannot see that "learning_rate" means "lr".
const std::map<std::string, std::string>& synonyms() {
    static const std::map<std::string, std::string> s = {
        {"learning_rate", "lr"},
        {"learningrate", "lr"},
        {"beta1", "betas"},
        {"beta2", "betas"},
        {"beta", "betas"},
        {"epsilon", "eps"},
        {"wd", "weight_decay"},
        {"decay", "weight_decay"},
        {"clip", "grad_clip"},
        {"max_grad_norm", "grad_clip"},
        {"grad_norm_clip", "grad_clip"},
        {"clip_grad_norm", "grad_clip"},
        {"lr_schedule", "schedule"},
        {"scheduler", "schedule"},
        {"lr_warmup_steps", "warmup_steps"},
        {"implementation", "impl"},
        {"batch", "batch_size"},
        {"bs", "batch_size"},
        {"micro_batch_size", "batch_size"},
        {"block_size", "max_seq_len"},
        {"n_ctx", "max_seq_len"},
        {"n_positions", "max_seq_len"},
        {"context_length", "max_seq_len"},
        {"sequence_length", "seq_len"},
        {"num_workers", "workers"},
        {"prefetch_factor", "prefetch"},
        {"pinned", "pin_memory"},
        {"file", "path"},
        {"dtype", "precision"},
        {"amp", "precision"},
        {"steps", "measure_steps"},
        {"num_steps", "measure_steps"},
        {"iterations", "measure_steps"},
        {"warmup", "warmup_steps"},
        {"gradient_accumulation_steps", "grad_accum"},
        {"grad_accumulation", "grad_accum"},
        {"activation_checkpointing", "recompute"},
        {"checkpointing", "recompute"},
        {"num_threads", "threads"},
        {"n_embed", "n_embd"},
        {"d_model", "n_embd"},
        {"hidden_size", "n_embd"},
        {"n_layers", "n_layer"},
        {"num_layers", "n_layer"},
        {"n_heads", "n_head"},
        {"num_heads", "n_head"},
        {"vocab", "vocab_size"},
        {"optimizer", "optim"},
        {"optimiser", "optim"},
        {"device", "backend"},
        {"output_dir", "out_dir"},
        {"outdir", "out_dir"},
        {"tolerance", "loss_tolerance"},
        {"attn", "attention"},
    };
    return s;
}

// The valid key nearest to `bad` among `valid`: a key with the same leaf in another section, a
// known synonym, else the smallest edit distance on the full dotted key.
std::string nearest_key(const std::string& bad, const std::vector<std::string>& valid) {
    const std::string leaf = leaf_of(bad), sec = section_of(bad);
    for (const auto& v : valid)
        if (leaf_of(v) == leaf && v != bad && !section_of(v).empty()) return v;
    // Candidates: every valid key under its own name and under each of its synonyms, so a typo
    // of a synonym ("learnin_rate") still finds its key. Smallest edit distance wins; on a tie a
    // key in the same section.
    std::string best;
    size_t best_d = std::numeric_limits<size_t>::max();
    bool best_same_sec = false;
    auto consider = [&](const std::string& text, const std::string& key) {
        const size_t d = edit_distance(bad, text);
        const bool same = section_of(key) == sec;
        if (d < best_d || (d == best_d && same && !best_same_sec))
            best_d = d, best = key, best_same_sec = same;
    };
    for (const auto& v : valid) {
        consider(v, v);
        const std::string vsec = section_of(v);
        for (const auto& [alias, target] : synonyms())
            if (target == leaf_of(v)) consider(vsec.empty() ? alias : vsec + "." + alias, v);
    }
    return best;
}

// ---- value parsing --------------------------------------------------------------------------

std::string format_double(double x) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

// list: a YAML list of names ([wte, h.0]); mapping: a YAML mapping the key's own check reads
// (model.lora: {rank: 8, alpha: 16}).
enum class Kind { integer, uint64, number, boolean, choice, string, pair, list, mapping };

struct Value {
    int64_t i = 0;
    uint64_t u = 0;
    double d = 0;
    bool b = false;
    std::string s;
    std::array<double, 2> pair{};
    std::vector<std::string> list;
    YAML::Node node;   // Kind::mapping: the mapping as written
    std::string text;  // the scalar as written (integers: kept for out-of-range messages)
};

// A whole number; a leading '+' is allowed as YAML allows it (from_chars rejects it).
bool parse_int(const std::string& s, int64_t& out) {
    const char* b = s.data() + (s.size() > 1 && s[0] == '+' && s[1] != '-' ? 1 : 0);
    auto r = std::from_chars(b, s.data() + s.size(), out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty();
}
// A whole number too large for int64 (parse_int failed only on the range): its sign.
int integer_overflow_sign(const std::string& s) {
    size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
    if (i == s.size()) return 0;
    for (size_t j = i; j < s.size(); ++j)
        if (!std::isdigit(static_cast<unsigned char>(s[j]))) return 0;
    return s[0] == '-' ? -1 : 1;
}
bool parse_u64(const std::string& s, uint64_t& out) {
    const size_t sign = !s.empty() && s[0] == '+' ? 1 : 0;  // '+' as in parse_int
    if (s.size() == sign || s[sign] == '-' || s[sign] == '+') return false;
    auto r = std::from_chars(s.data() + sign, s.data() + s.size(), out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size();
}
bool parse_number(const std::string& s, double& out) {
    if (s.empty()) return false;
    const char* b = s.data();
    if (*b == '+') ++b;  // from_chars rejects a leading '+'; YAML allows it
    auto r = std::from_chars(b, s.data() + s.size(), out);
    return r.ec == std::errc() && r.ptr == s.data() + s.size() && std::isfinite(out);
}
// A number whose text is well formed but whose magnitude a double cannot hold (1e400, 1e-400).
bool number_out_of_range(const std::string& s) {
    double d = 0;
    const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
    auto r = std::from_chars(b, s.data() + s.size(), d);
    return r.ec == std::errc::result_out_of_range && r.ptr == s.data() + s.size();
}
bool parse_bool(const std::string& s, bool& out) {
    static const std::array<const char*, 6> t = {"true", "True", "TRUE", "yes", "Yes", "on"};
    static const std::array<const char*, 6> f = {"false", "False", "FALSE", "no", "No", "off"};
    for (auto* x : t)
        if (s == x) return out = true, true;
    for (auto* x : f)
        if (s == x) return out = false, true;
    return false;
}

// ---- the key table --------------------------------------------------------------------------

struct KeyDef {
    std::string key;
    Kind kind;
    std::vector<std::string> choices;                // Kind::choice
    std::function<std::string(const Value&)> check;  // "" = ok, else "expected ..., got ...; fix"
    std::function<void(RunConfig&, const Value&)> set;
    std::function<std::string(const RunConfig&)> get;
};

std::string expected_text(const KeyDef& k) {
    switch (k.kind) {
        case Kind::integer:
            return "an integer";
        case Kind::uint64:
            return "a non-negative integer";
        case Kind::number:
            return "a number";
        case Kind::boolean:
            return "true or false";
        case Kind::choice:
            return "one of " + join(k.choices, " | ");
        case Kind::string:
            return "a string";
        case Kind::pair:
            return "a list of two numbers like [0.9, 0.95]";
        case Kind::list:
            return "a list of names like [wte, h.0]";
        case Kind::mapping:
            return "a mapping like { key: value, ... }";
    }
    return "?";
}

using IntRef = std::function<int&(RunConfig&)>;

// Resource bounds, checked before any work starts (fixed, so a file validates the same on every
// machine): kMaxDataWorkers (engine/run_config.h), kMaxThreads (kernels/types.h) and this one.
constexpr int kMaxPrefetch = 1024;
// The tokens of one optimizer step on one rank (B x T x grad_accum): 2^40, so the report's
// count over the ranks (times the world size) stays far inside 64 bits.
constexpr int64_t kMaxTokensPerStep = int64_t{1} << 40;
using FloatRef = std::function<float&(RunConfig&)>;

// An int field in [lo, hi]; `hi_reason` says where the upper bound comes from.
KeyDef int_key(std::string key, int lo, int hi, std::string hi_reason, IntRef ref,
               std::string fix) {
    KeyDef k{std::move(key), Kind::integer, {}, nullptr, nullptr, nullptr};
    k.check = [lo, hi, hi_reason, fix](const Value& v) -> std::string {
        const std::string got = v.text.empty() ? std::to_string(v.i) : v.text;
        if (v.i < lo)
            return "expected an integer >= " + std::to_string(lo) + ", got " + got + "; " + fix;
        if (v.i > hi)
            return "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                   ", got " + got + ": out of range, at most " + std::to_string(hi) + " (" +
                   hi_reason + ")";
        return "";
    };
    k.set = [ref](RunConfig& c, const Value& v) { ref(c) = static_cast<int>(v.i); };
    k.get = [ref](const RunConfig& c) { return std::to_string(ref(const_cast<RunConfig&>(c))); };
    return k;
}
KeyDef int_key(std::string key, int lo, IntRef ref, std::string fix) {
    return int_key(std::move(key), lo, std::numeric_limits<int>::max(),
                   "the largest 32-bit integer", std::move(ref), std::move(fix));
}

// Why a number that passed its range check cannot be stored in a 32-bit float field: it would
// become inf, or round to 0 (a nonzero value below the smallest normal float). "" when it fits.
std::string float_narrowing(double x) {
    const double mag = std::fabs(x);
    if (mag > std::numeric_limits<float>::max())
        return "out of range for the 32-bit float it is stored in: at most " +
               format_float(std::numeric_limits<float>::max()) + " (larger would become inf)";
    if (x != 0 && mag < std::numeric_limits<float>::min())
        return "too small for the 32-bit float it is stored in: a nonzero value must be at least " +
               format_float(std::numeric_limits<float>::min()) + " (smaller would round to 0)";
    return "";
}

// A float field with a range check written as a predicate plus the text that explains it.
KeyDef float_key(std::string key, std::function<bool(double)> ok, std::string range, FloatRef ref,
                 std::string fix) {
    KeyDef k{std::move(key), Kind::number, {}, nullptr, nullptr, nullptr};
    k.check = [ok, range, fix](const Value& v) -> std::string {
        if (!ok(v.d)) return "expected " + range + ", got " + format_double(v.d) + "; " + fix;
        if (std::string n = float_narrowing(v.d); !n.empty())
            return "expected " + range + ", got " + format_double(v.d) + ": " + n + "; " + fix;
        return "";
    };
    k.set = [ref](RunConfig& c, const Value& v) { ref(c) = static_cast<float>(v.d); };
    k.get = [ref](const RunConfig& c) { return format_float(ref(const_cast<RunConfig&>(c))); };
    return k;
}

KeyDef bool_key(std::string key, std::function<bool&(RunConfig&)> ref) {
    KeyDef k{std::move(key), Kind::boolean, {}, nullptr, nullptr, nullptr};
    k.set = [ref](RunConfig& c, const Value& v) { ref(c) = v.b; };
    k.get = [ref](const RunConfig& c) { return ref(const_cast<RunConfig&>(c)) ? "true" : "false"; };
    return k;
}

// An enum key: its choices are the enum's spellings (EnumSpelling, beside the enum).
template <class E>
KeyDef enum_key(std::string key, std::function<E&(RunConfig&)> ref) {
    KeyDef k{std::move(key), Kind::choice, enum_names<E>(), nullptr, nullptr, nullptr};
    k.set = [ref](RunConfig& c, const Value& v) { ref(c) = *parse_enum<E>(v.s); };
    k.get = [ref](const RunConfig& c) {
        return std::string(enum_name(ref(const_cast<RunConfig&>(c))));
    };
    return k;
}

// backend, model.preset and the model dimensions.
void add_backend_and_model_keys(std::vector<KeyDef>& t) {
    t.push_back(enum_key<BackendChoice>("backend",
                                        [](RunConfig& c) -> BackendChoice& { return c.backend; }));
    // model.preset: applied before the explicit dims (resolve() handles it specially).
    {
        KeyDef k{"model.preset", Kind::choice, gpt_preset_names(), nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) {
            c.model = *gpt_preset(v.s);
            c.model_preset = v.s;
        };
        k.get = [](const RunConfig& c) { return c.model_preset; };
        t.push_back(std::move(k));
    }
    const std::string dim_fix = "model dimensions must be positive";
    // The upper bounds are GPTConfig's (model/gpt.h): far above any real GPT, and what keeps the
    // model's size arithmetic from overflowing.
    const std::string dim_hi =
        "the trainer's bound; GPT-3 175B has 96 layers, 96 heads, 12288 "
        "channels";
    t.push_back(int_key(
        "model.n_layer", 1, GPTConfig::kMaxLayers, dim_hi,
        [](RunConfig& c) -> int& { return c.model.n_layer; }, dim_fix));
    t.push_back(int_key(
        "model.n_head", 1, GPTConfig::kMaxHeads, dim_hi,
        [](RunConfig& c) -> int& { return c.model.n_head; }, dim_fix));
    t.push_back(int_key(
        "model.n_embd", 1, GPTConfig::kMaxEmbd, dim_hi,
        [](RunConfig& c) -> int& { return c.model.n_embd; }, dim_fix));
    t.push_back(int_key(
        "model.max_seq_len", 1, GPTConfig::kMaxSeqLen, "2^20 positions, the trainer's bound",
        [](RunConfig& c) -> int& { return c.model.max_seq_len; }, dim_fix));
    t.push_back(int_key(
        "model.vocab_size", 2, GPTConfig::kMaxVocab,
        "2^24 tokens, the trainer's bound; GPT-2 has 50257",
        [](RunConfig& c) -> int& { return c.model.vocab_size; },
        "a vocabulary needs at least 2 tokens"));
    // model.init_from: the model's dimensions then come from the file (resolve_init_from).
    {
        KeyDef k{"model.init_from", Kind::string, {}, nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) { c.init_from = v.s; };
        k.get = [](const RunConfig& c) { return c.init_from; };
        t.push_back(std::move(k));
    }
}

// data.*: the batch source and the loader.
void add_data_keys(std::vector<KeyDef>& t) {
    t.push_back(enum_key<DataSource>("data.source",
                                     [](RunConfig& c) -> DataSource& { return c.data.source; }));
    t.push_back(enum_key<SyntheticKind>(
        "data.synthetic", [](RunConfig& c) -> SyntheticKind& { return c.data.synthetic; }));
    {
        KeyDef k{"data.path", Kind::string, {}, nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) { c.data.path = v.s; };
        k.get = [](const RunConfig& c) { return c.data.path; };
        t.push_back(std::move(k));
    }
    t.push_back(int_key(
        "data.batch_size", 1, [](RunConfig& c) -> int& { return c.data.batch_size; },
        "a batch holds at least one sequence"));
    t.push_back(int_key(
        "data.seq_len", 1, [](RunConfig& c) -> int& { return c.data.seq_len; },
        "a sequence holds at least one token"));
    t.push_back(int_key(
        "data.workers", 0, kMaxDataWorkers,
        "each worker is a thread; more than a few per core only contend",
        [](RunConfig& c) -> int& { return c.data.workers; },
        "use 0 to load batches synchronously in the step"));
    t.push_back(int_key(
        "data.prefetch", 1, kMaxPrefetch, "each slot of the ring holds one batch in memory",
        [](RunConfig& c) -> int& { return c.data.prefetch; },
        "the ring needs at least one batch slot"));
    t.push_back(
        bool_key("data.pin_memory", [](RunConfig& c) -> bool& { return c.data.pin_memory; }));
    t.push_back(int_key(
        "data.preprocess_us", 0, [](RunConfig& c) -> int& { return c.data.preprocess_us; },
        "use 0 for no simulated preprocessing"));
    t.push_back(float_key(
        "data.val_fraction", [](double x) { return x >= 0 && x < 1; }, "a number in [0, 1)",
        [](RunConfig& c) -> float& { return c.data.val_fraction; },
        "it is the share of the data's windows held out for validation (0 = none)"));
    {
        KeyDef k{"data.val_path", Kind::string, {}, nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) { c.data.val_path = v.s; };
        k.get = [](const RunConfig& c) { return c.data.val_path; };
        t.push_back(std::move(k));
    }
    t.push_back(float_key(
        "data.seq_len_jitter", [](double x) { return x >= 0 && x <= 1; }, "a number in [0, 1]",
        [](RunConfig& c) -> float& { return c.data.seq_len_jitter; },
        "each batch's length is drawn from [(1 - j) * seq_len, seq_len] (0 = fixed length)"));
    t.push_back(bool_key("data.cache", [](RunConfig& c) -> bool& { return c.data.cache; }));
}

// optim.*: AdamW and the LR schedule.
void add_optim_keys(std::vector<KeyDef>& t) {
    t.push_back(float_key(
        "optim.lr", [](double x) { return x > 0; }, "a number > 0",
        [](RunConfig& c) -> float& { return c.optim.lr; }, "typical values are 1e-4 to 1e-3"));
    {
        KeyDef k{"optim.betas", Kind::pair, {}, nullptr, nullptr, nullptr};
        k.check = [](const Value& v) -> std::string {
            const std::string got =
                "[" + format_double(v.pair[0]) + ", " + format_double(v.pair[1]) + "]";
            for (double b : v.pair) {
                if (!(b >= 0 && b < 1))
                    return "expected both betas in [0, 1), got " + got +
                           "; typical values are [0.9, 0.95]";
                if (static_cast<float>(b) == 1.0f)
                    return "expected both betas in [0, 1), got " + got + ": " + format_double(b) +
                           " rounds to 1 in the 32-bit float it is stored in (at most " +
                           format_float(std::nextafter(1.0f, 0.0f)) +
                           "); typical values are [0.9, 0.95]";
                if (std::string n = float_narrowing(b); !n.empty())
                    return "expected both betas in [0, 1), got " + got + ": " + n +
                           "; use 0 or a typical value such as 0.9";
            }
            return "";
        };
        k.set = [](RunConfig& c, const Value& v) {
            c.optim.beta1 = static_cast<float>(v.pair[0]);
            c.optim.beta2 = static_cast<float>(v.pair[1]);
        };
        k.get = [](const RunConfig& c) {
            return "[" + format_float(c.optim.beta1) + ", " + format_float(c.optim.beta2) + "]";
        };
        t.push_back(std::move(k));
    }
    t.push_back(float_key(
        "optim.eps", [](double x) { return x > 0; }, "a number > 0",
        [](RunConfig& c) -> float& { return c.optim.eps; }, "the usual value is 1e-8"));
    t.push_back(float_key(
        "optim.weight_decay", [](double x) { return x >= 0; }, "a number >= 0",
        [](RunConfig& c) -> float& { return c.optim.weight_decay; }, "use 0 to disable it"));
    t.push_back(float_key(
        "optim.grad_clip", [](double x) { return x >= 0; }, "a number >= 0",
        [](RunConfig& c) -> float& { return c.optim.grad_clip; }, "use 0 to disable clipping"));
    t.push_back(
        enum_key<AdamWImpl>("optim.impl", [](RunConfig& c) -> AdamWImpl& { return c.optim.impl; }));
    t.push_back(enum_key<LRSchedule::Kind>(
        "optim.schedule", [](RunConfig& c) -> LRSchedule::Kind& { return c.optim.schedule.kind; }));
    t.push_back(int_key(
        "optim.warmup_steps", 0, [](RunConfig& c) -> int& { return c.optim.schedule.warmup_steps; },
        "use 0 for no LR warm-up"));
    t.push_back(int_key(
        "optim.decay_steps", 0, [](RunConfig& c) -> int& { return c.optim.schedule.decay_steps; },
        "it counts optimizer steps"));
    t.push_back(float_key(
        "optim.min_lr_ratio", [](double x) { return x >= 0 && x <= 1; }, "a number in [0, 1]",
        [](RunConfig& c) -> float& { return c.optim.schedule.min_lr_ratio; },
        "the LR floor is min_lr_ratio * lr"));
    t.push_back(bool_key("optim.offload", [](RunConfig& c) -> bool& { return c.optim.offload; }));
}

// run.*: seed, step counts, precision, recompute, accumulation, threads.
void add_run_keys(std::vector<KeyDef>& t) {
    {
        KeyDef k{"run.seed", Kind::uint64, {}, nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) { c.run.seed = v.u; };
        k.get = [](const RunConfig& c) { return std::to_string(c.run.seed); };
        t.push_back(std::move(k));
    }
    t.push_back(int_key(
        "run.warmup_steps", 0, [](RunConfig& c) -> int& { return c.run.warmup_steps; },
        "use 0 for no warm-up steps"));
    t.push_back(int_key(
        "run.measure_steps", 1, [](RunConfig& c) -> int& { return c.run.measure_steps; },
        "statistics need at least one measured step (20 or more is better)"));
    t.push_back(int_key(
        "run.rounds", 1, kMaxRounds,
        "each round holds at least one measured step of every variant; more rounds than that "
        "only add slice start-ups",
        [](RunConfig& c) -> int& { return c.run.rounds; },
        "use 1 to run the variants one after another (no paired interval then)"));
    t.push_back(enum_key<Precision>("run.precision",
                                    [](RunConfig& c) -> Precision& { return c.run.precision; }));
    t.push_back(enum_key<Recompute>("run.recompute",
                                    [](RunConfig& c) -> Recompute& { return c.run.recompute; }));
    t.push_back(int_key(
        "run.grad_accum", 1, [](RunConfig& c) -> int& { return c.run.grad_accum; },
        "use 1 for no gradient accumulation"));
    t.push_back(int_key(
        "run.threads", 0, kMaxThreads,
        "OpenMP threads; far more than any machine's cores, and the OpenMP runtime fails to "
        "start very many; use 0 for all cores",
        [](RunConfig& c) -> int& { return c.run.threads; }, "use 0 for all cores"));
    t.push_back(enum_key<HostSync>("run.host_sync",
                                   [](RunConfig& c) -> HostSync& { return c.run.host_sync; }));
    t.push_back(enum_key<OffloadMode>("run.offload",
                                      [](RunConfig& c) -> OffloadMode& { return c.run.offload; }));
    t.push_back(bool_key("run.cuda_graph", [](RunConfig& c) -> bool& { return c.run.cuda_graph; }));
}

// kernels.* (the op implementations) and profile.*.
void add_kernel_and_profile_keys(std::vector<KeyDef>& t) {
    t.push_back(enum_key<AttentionImpl>(
        "kernels.attention", [](RunConfig& c) -> AttentionImpl& { return c.kernels.attention; }));
    t.push_back(enum_key<ClassifierImpl>("kernels.classifier", [](RunConfig& c) -> ClassifierImpl& {
        return c.kernels.classifier;
    }));
    t.push_back(enum_key<LayerNormImpl>(
        "kernels.layernorm", [](RunConfig& c) -> LayerNormImpl& { return c.kernels.layernorm; }));
    t.push_back(
        bool_key("kernels.matmul_gelu", [](RunConfig& c) -> bool& { return c.kernels.fuse_gelu; }));
    t.push_back(enum_key<MatmulImpl>("kernels.matmul",
                                     [](RunConfig& c) -> MatmulImpl& { return c.kernels.matmul; }));
    t.push_back(enum_key<LayerNormForwardImpl>(
        "kernels.layernorm_forward",
        [](RunConfig& c) -> LayerNormForwardImpl& { return c.kernels.layernorm_forward; }));
    t.push_back(enum_key<MemoryAccess>("kernels.memory_access", [](RunConfig& c) -> MemoryAccess& {
        return c.kernels.memory_access;
    }));

    t.push_back(
        bool_key("profile.kernels", [](RunConfig& c) -> bool& { return c.profile.kernels; }));
    t.push_back(bool_key("profile.trace", [](RunConfig& c) -> bool& { return c.profile.trace; }));
    t.push_back(int_key(
        "profile.trace_steps", 1, [](RunConfig& c) -> int& { return c.profile.trace_steps; },
        "set profile.trace: false to write no trace"));
}

// dist.* (data parallel over MPI / NCCL): buckets, overlap, ZeRO stage, a simulated link.
// What trains and how the frozen part is stored: model.lora, model.quantize_frozen,
// optim.freeze (TrainableOptions, model/gpt.h). Names in optim.freeze are checked against the
// model's parameter table when the config resolves (they depend on n_layer).
std::string lora_text(const LoraConfig& l) {
    std::string t;
    for (LoraTarget x : l.targets) t += (t.empty() ? "" : ", ") + std::string(enum_name(x));
    return "{rank: " + std::to_string(l.rank) + ", alpha: " + format_float(l.alpha) +
           ", targets: [" + t + "]}";
}
// Reads model.lora's mapping into `out`; returns "" or what is wrong and how to fix it.
std::string parse_lora(const YAML::Node& node, LoraConfig& out) {
    LoraConfig l;
    const std::string fix = "write e.g. {rank: 8, alpha: 16, targets: [attn.c_attn, mlp.c_fc]}";
    for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string k = it->first.IsScalar() ? it->first.Scalar() : "?";
        const YAML::Node v = it->second;
        int64_t i = 0;
        double d = 0;
        if (k == "rank") {
            if (!v.IsScalar() || !parse_int(v.Scalar(), i) || i < 0 || i > GPTConfig::kMaxEmbd)
                return "expected rank an integer from 0 (no adapters) to " +
                       std::to_string(GPTConfig::kMaxEmbd) + ", got " + got_text(v) +
                       "; typical ranks are 4 to 64";
            l.rank = static_cast<int>(i);
        } else if (k == "alpha") {
            if (!v.IsScalar() || !parse_number(v.Scalar(), d) || !(d > 0) || d > 1e6)
                return "expected alpha a number in (0, 1e6], got " + got_text(v) +
                       "; the update is scaled by alpha/rank, alpha = 2 x rank is common";
            l.alpha = static_cast<float>(d);
        } else if (k == "targets") {
            if (!v.IsSequence() || v.size() == 0)
                return "expected targets a non-empty list of " +
                       join(enum_names<LoraTarget>(), ", ") + ", got " + got_text(v);
            l.targets.clear();
            for (size_t j = 0; j < v.size(); ++j) {
                const YAML::Node e = v[j];
                const auto t = e.IsScalar() ? parse_enum<LoraTarget>(e.Scalar()) : std::nullopt;
                if (!t)
                    return "expected targets among " + join(enum_names<LoraTarget>(), ", ") +
                           ", got " + got_text(e) + " (element " + std::to_string(j + 1) + ")";
                if (std::find(l.targets.begin(), l.targets.end(), *t) != l.targets.end())
                    return "target '" + e.Scalar() + "' is listed twice; list each once";
                l.targets.push_back(*t);
            }
        } else {
            return "unknown key '" + k + "' in model.lora; its keys are rank, alpha, targets (" +
                   fix + ")";
        }
    }
    // alpha and targets shape the adapters of rank > 0; without a rank LoRA is off and the
    // whole model would train, the other keys silently ignored.
    if (l.rank == 0 && (node["alpha"] || node["targets"]))
        return std::string("has ") + (node["alpha"] ? "alpha" : "targets") + " but " +
               (node["rank"] ? "rank 0" : "no rank") +
               ", which means no adapters: LoRA would be off and every parameter would train; "
               "add a rank such as `rank: 8`, or remove model.lora";
    out = l;
    return "";
}

void add_trainable_keys(std::vector<KeyDef>& t) {
    {
        KeyDef k{"model.lora", Kind::mapping, {}, nullptr, nullptr, nullptr};
        k.check = [](const Value& v) {
            LoraConfig l;
            return parse_lora(v.node, l);
        };
        k.set = [](RunConfig& c, const Value& v) { parse_lora(v.node, c.trainable.lora); };
        k.get = [](const RunConfig& c) { return lora_text(c.trainable.lora); };
        t.push_back(std::move(k));
    }
    t.push_back(enum_key<QuantizeFrozen>(
        "model.quantize_frozen",
        [](RunConfig& c) -> QuantizeFrozen& { return c.trainable.quantize_frozen; }));
    {
        KeyDef k{"optim.freeze", Kind::list, {}, nullptr, nullptr, nullptr};
        k.set = [](RunConfig& c, const Value& v) { c.trainable.freeze = v.list; };
        // Appended, not "[" + ...: GCC 12 warns falsely (-Wrestrict) on that inlined concatenation.
        k.get = [](const RunConfig& c) {
            std::string text = "[";
            text += join(c.trainable.freeze, ", ");
            return text += "]";
        };
        t.push_back(std::move(k));
    }
}

void add_dist_keys(std::vector<KeyDef>& t) {
    t.push_back(float_key(
        "dist.bucket_mb", [](double x) { return x > 0 && x <= 65536; }, "a number in (0, 65536]",
        [](RunConfig& c) -> float& { return c.dist.bucket_mb; },
        "it is the gradient bucket size in MiB (25 is PyTorch DDP's default)"));
    t.push_back(bool_key("dist.overlap", [](RunConfig& c) -> bool& { return c.dist.overlap; }));
    t.push_back(int_key(
        "dist.zero", 0, 1, "the ZeRO stages microtrain has are 0 and 1",
        [](RunConfig& c) -> int& { return c.dist.zero; },
        "use 0 (replicated AdamW state) or 1 (AdamW state sharded across the ranks)"));
    t.push_back(float_key(
        "dist.simulate_link_gbps",
        [](double x) {
            return x == 0 || (x >= kMinSimulatedLinkGbps && x <= kMaxSimulatedLinkGbps);
        },
        "0 or a number in [" + format_double(kMinSimulatedLinkGbps) + ", " +
            format_double(kMaxSimulatedLinkGbps) + "]",
        [](RunConfig& c) -> float& { return c.dist.simulate_link_gbps; },
        "it is a SIMULATED link bandwidth in Gbit/s (slower than 0.01 would only hang the run); "
        "use 0 for the real transport only"));
    t.push_back(float_key(
        "dist.simulate_latency_us", [](double x) { return x >= 0 && x <= 1e7; },
        "a number in [0, 1e7]", [](RunConfig& c) -> float& { return c.dist.simulate_latency_us; },
        "it is a SIMULATED per-collective latency in microseconds; use 0 for none"));
    t.push_back(float_key(
        "dist.simulate_link_ratio", [](double x) { return x >= 0 && x <= 100; },
        "a number in [0, 100]", [](RunConfig& c) -> float& { return c.dist.simulate_link_ratio; },
        "it is how many times the step's measured compute a SIMULATED link takes for the "
        "gradients (set after the warm-up); use 0 for none"));
    t.push_back(float_key(
        "dist.timeout_s", [](double x) { return x > 0 && x <= 86400; }, "a number in (0, 86400]",
        [](RunConfig& c) -> float& { return c.dist.timeout_s; },
        "it is how long a rank waits for the others before it gives up"));
}

// Every knob (a key that sets a RunConfig field), section by section, in the order all_keys()
// lists them.
const std::vector<KeyDef>& knob_table() {
    static const std::vector<KeyDef> table = [] {
        std::vector<KeyDef> t;
        add_backend_and_model_keys(t);
        add_data_keys(t);
        add_optim_keys(t);
        add_run_keys(t);
        add_kernel_and_profile_keys(t);
        add_dist_keys(t);
        add_trainable_keys(t);
        return t;
    }();
    return table;
}

const KeyDef* find_knob(const std::string& key) {
    for (const auto& k : knob_table())
        if (k.key == key) return &k;
    return nullptr;
}

// Experiment-level keys: they apply to the whole experiment, not per variant.
const std::vector<std::string>& experiment_keys() {
    static const std::vector<std::string> k = {"name",
                                               "compare.baseline",
                                               "compare.loss_tolerance",
                                               "compare.min_effect",
                                               "report.out_dir",
                                               "train.steps",
                                               "train.eval_every",
                                               "train.eval_batches",
                                               "train.checkpoint_every",
                                               "train.keep_checkpoints"};
    return k;
}
bool is_experiment_key(const std::string& key) {
    const auto& e = experiment_keys();
    return std::find(e.begin(), e.end(), key) != e.end();
}

const std::vector<std::string>& knob_sections() {
    static const std::vector<std::string> s = {"model",   "data",    "optim", "run",
                                               "kernels", "profile", "dist"};
    return s;
}

// Every key a user may write, for suggestions.
std::vector<std::string> all_keys(bool include_experiment) {
    std::vector<std::string> keys;
    for (const auto& k : knob_table()) keys.push_back(k.key);
    if (include_experiment)
        for (const auto& k : experiment_keys()) keys.push_back(k);
    return keys;
}

// A "\0" escape in a double-quoted string decodes to a NUL byte, which would silently cut a
// name or path short where it is used.
void reject_nul(const std::string& s, const std::string& where, const std::string& key,
                const std::string& context) {
    if (s.find('\0') != std::string::npos)
        fail(where, key, context,
             "expected text without a NUL character, got one (a \\0 escape) at character " +
                 std::to_string(s.find('\0') + 1) + "; remove it");
}

// Parses node as `def`'s type and checks its range; throws SpecError at `where`.
Value parse_value(const KeyDef& def, const YAML::Node& node, const std::string& where,
                  const std::string& context) {
    Value v;
    const std::string expected = expected_text(def);
    auto bad = [&](const std::string& extra = "") {
        fail(where, def.key, context,
             "expected " + expected + ", got " + got_text(node) + "; " +
                 (extra.empty() ? "write " + expected : extra));
    };
    if (def.kind == Kind::list) {
        if (!node.IsSequence()) bad("write a list, e.g. [wte, h.0], or [] for none");
        for (size_t i = 0; i < node.size(); ++i) {
            const YAML::Node e = node[i];
            if (!e.IsScalar() || e.Scalar().empty())
                fail(where, def.key, context,
                     "expected a name for element " + std::to_string(i + 1) + ", got " +
                         got_text(e) + "; write a list of names, e.g. [wte, h.0]");
            reject_nul(e.Scalar(), where, def.key, context);
            v.list.push_back(e.Scalar());
        }
    } else if (def.kind == Kind::mapping) {
        if (!node.IsMap()) bad();
        v.node = node;
    } else if (def.kind == Kind::pair) {
        if (!node.IsSequence() || node.size() != 2) bad("write two numbers, e.g. [0.9, 0.95]");
        for (size_t i = 0; i < 2; ++i)
            if (!node[i].IsScalar() || !parse_number(node[i].Scalar(), v.pair[i]))
                fail(where, def.key, context,
                     "expected a number for element " + std::to_string(i + 1) + ", got " +
                         got_text(node[i]) + "; write two numbers, e.g. [0.9, 0.95]");
    } else {
        if (!node.IsScalar()) bad();
        const std::string& s = node.Scalar();
        switch (def.kind) {
            case Kind::integer:
                if (!parse_int(s, v.i)) {
                    const int sign = integer_overflow_sign(s);
                    if (sign == 0) bad("write a whole number without quotes or a decimal point");
                    // Too large for int64: the key's own range check reports it with its bound.
                    v.i = sign > 0 ? std::numeric_limits<int64_t>::max()
                                   : std::numeric_limits<int64_t>::min();
                }
                v.text = s;
                break;
            case Kind::uint64:
                if (!parse_u64(s, v.u)) {
                    if (integer_overflow_sign(s) > 0)
                        fail(where, def.key, context,
                             "expected a non-negative integer, got " + got_text(node) +
                                 ": out of range, at most " +
                                 std::to_string(std::numeric_limits<uint64_t>::max()));
                    bad("write a whole number >= 0");
                }
                break;
            case Kind::number:
                if (!parse_number(s, v.d))
                    bad(number_out_of_range(s) ? "it is out of range (a double holds magnitudes "
                                                 "from about 2.2e-308 to 1.8e308)"
                                               : "write a finite number such as 3.0e-4");
                break;
            case Kind::boolean:
                if (!parse_bool(s, v.b)) bad("write true or false");
                break;
            case Kind::choice:
                if (std::find(def.choices.begin(), def.choices.end(), s) == def.choices.end()) {
                    std::string nearest = nearest_key(s, def.choices);
                    bad("did you mean '" + nearest + "'?");
                }
                v.s = s;
                break;
            case Kind::string:
                if (s.empty()) bad("write a non-empty value");
                reject_nul(s, where, def.key, context);
                v.s = s;
                break;
            case Kind::pair:
            case Kind::list:
            case Kind::mapping:
                break;
        }
    }
    if (def.check) {
        std::string err = def.check(v);
        if (!err.empty()) fail(where, def.key, context, err);
    }
    return v;
}

// ---- the file -------------------------------------------------------------------------------

struct VariantSpec {
    std::string name;
    std::string where;  // the variant's mapping
    Settings set;       // its overrides
};

struct ParsedFile {
    std::string file;
    std::string root_where;
    std::map<std::string, std::string> section_where;  // "data" -> where the mapping starts
    Settings settings;
    std::string name;
    std::string baseline, baseline_where;
    std::optional<double> loss_tolerance;
    double min_effect = kDefaultMinEffect;
    std::string out_dir = "runs";
    TrainSpec train;  // the `train:` section (microtrain train)
    bool has_variants = false;
    std::vector<VariantSpec> variants;
    std::map<std::string, std::string> experiment_where;  // experiment key -> where
};

void unknown_key(const std::string& where, const std::string& key, const std::string& context,
                 const std::vector<std::string>& valid) {
    const std::string nearest = nearest_key(key, valid);
    std::string msg = where + ": unknown key '" + printable(key) + "'";
    if (!context.empty()) msg += " (" + context + ")";
    msg += ": did you mean '" + nearest + "'?";
    // List the keys of the section the user was writing in, so the fix is on the screen.
    const std::string sec = section_of(key);
    std::vector<std::string> in_section;
    for (const auto& v : all_keys(true))
        if (!sec.empty() && section_of(v) == sec) in_section.push_back(leaf_of(v));
    if (!in_section.empty()) msg += " (" + sec + " keys: " + join(in_section, ", ") + ")";
    throw SpecError(msg);
}

std::string scalar_string(const YAML::Node& n, const std::string& where, const std::string& key,
                          const std::string& context) {
    if (!n.IsScalar() || n.Scalar().empty())
        fail(where, key, context,
             "expected a non-empty string, got " + got_text(n) + "; write a name such as `" + key +
                 ": my-value`");
    reject_nul(n.Scalar(), where, key, context);
    return n.Scalar();
}

// One key of the `train:` section (microtrain train): an integer with its lower bound.
void set_train_key(TrainSpec& t, const std::string& key, const YAML::Node& value,
                   const std::string& where) {
    struct Field {
        const char* key;
        int TrainSpec::*field;
        int lo;
        const char* fix;
    };
    static const Field fields[] = {
        {"train.steps", &TrainSpec::steps, 1, "a run trains at least one step"},
        {"train.eval_every", &TrainSpec::eval_every, 0, "use 0 for no validation loss"},
        {"train.eval_batches", &TrainSpec::eval_batches, 1,
         "the validation loss is the mean over at least one batch"},
        {"train.checkpoint_every", &TrainSpec::checkpoint_every, 0,
         "use 0 to checkpoint only at the end (and on a signal)"},
        {"train.keep_checkpoints", &TrainSpec::keep_checkpoints, 1,
         "--resume needs at least the newest checkpoint"},
    };
    for (const Field& f : fields) {
        if (key != f.key) continue;
        int64_t v = 0;
        if (!value.IsScalar() || !parse_int(value.Scalar(), v))
            fail(where, key, "",
                 "expected an integer, got " + got_text(value) +
                     "; write a whole number without quotes or a decimal point");
        if (v < f.lo || v > std::numeric_limits<int>::max())
            fail(where, key, "",
                 "expected an integer >= " + std::to_string(f.lo) + ", got " + std::to_string(v) +
                     "; " + f.fix);
        t.*f.field = static_cast<int>(v);
        return;
    }
}

// Experiment and variant names become folder and file names and report anchors: a safe set of
// characters and a length limit, checked here rather than when the report is written.
constexpr size_t kMaxNameLength = 64;
bool name_char_ok(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '+';
}
void check_name(const std::string& name, const std::string& where, const std::string& key,
                const std::string& what) {
    const bool chars_ok = std::all_of(name.begin(), name.end(), name_char_ok);
    if (chars_ok && name.size() <= kMaxNameLength && name[0] != '.') return;
    std::string got = "'" + printable(name.substr(0, kMaxNameLength + 16)) + "'";
    if (name.size() > kMaxNameLength + 16) got.insert(got.size() - 1, "...");
    if (name.size() > kMaxNameLength) got += " (" + std::to_string(name.size()) + " characters)";
    fail(where, key, "",
         "expected a name of 1 to " + std::to_string(kMaxNameLength) +
             " characters from A-Z a-z 0-9 . _ + - (not starting with '.'), got " + got + "; " +
             what + ", so write it like `my-run_2`");
}

// The default experiment name, from the file name: the safe characters kept, others as '-'.
std::string name_from_file(const std::string& path) {
    std::string n = fs::path(path).stem().string();
    for (char& c : n)
        if (!name_char_ok(c)) c = '-';
    if (n.size() > kMaxNameLength) n.resize(kMaxNameLength);
    if (n.empty() || n[0] == '.') n = "experiment" + n;
    return n.substr(0, kMaxNameLength);
}

void set_experiment_key(ParsedFile& pf, const std::string& key, const YAML::Node& value,
                        const std::string& where) {
    if (key == "name") {
        pf.name = scalar_string(value, where, key, "");
        check_name(pf.name, where, key, "the experiment name names the run folder");
    } else if (key == "compare.baseline") {
        pf.baseline = scalar_string(value, where, key, "");
        pf.baseline_where = where;
    } else if (key == "compare.loss_tolerance") {
        double d = 0;
        if (!value.IsScalar() || !parse_number(value.Scalar(), d))
            fail(where, key, "",
                 "expected a number, got " + got_text(value) +
                     "; write a relative tolerance such as 0.02");
        if (d < 0)
            fail(where, key, "",
                 "expected a number >= 0, got " + format_double(d) +
                     "; it is the allowed relative difference of the mean loss");
        pf.loss_tolerance = d;
    } else if (key == "compare.min_effect") {
        double d = 0;
        if (!value.IsScalar() || !parse_number(value.Scalar(), d))
            fail(where, key, "",
                 "expected a number, got " + got_text(value) +
                     "; write the smallest speedup that counts, as a fraction such as 0.02");
        if (!(d >= 0 && d < 1))
            fail(where, key, "",
                 "expected a number >= 0 and < 1, got " + format_double(d) +
                     "; it is the smallest speedup that counts as faster or slower (0.02 = 2 %)");
        pf.min_effect = d;
    } else if (key == "report.out_dir") {
        pf.out_dir = scalar_string(value, where, key, "");
    } else if (key.rfind("train.", 0) == 0) {
        set_train_key(pf.train, key, value, where);
    }
    pf.experiment_where[key] = where;
}

// Adds `dotted` = value to `out`, rejecting unknown keys and keys given twice.
void add_setting(Settings& out, const std::string& dotted, const YAML::Node& key_node,
                 const YAML::Node& value, const std::string& file, const std::string& base_dir,
                 const std::string& context, bool from_variant) {
    const std::string key_where = mark_text(file, key_node.Mark());
    if (from_variant && dotted == "run.rounds")
        throw SpecError(key_where + ": key 'run.rounds' (" + context +
                        "): cannot be set per variant: the rounds are the experiment's schedule "
                        "(every variant runs a slice in each round); set it in the base `run:` "
                        "section");
    if (!find_knob(dotted)) {
        if (is_experiment_key(dotted))
            throw SpecError(key_where + ": key '" + dotted + "' (" + context +
                            "): cannot be set per variant, it applies to the whole experiment; "
                            "move it to the top level of the file");
        unknown_key(key_where, dotted, context, all_keys(false));
    }
    if (auto it = out.find(dotted);
        it != out.end() && it->second.from_variant == from_variant && !it->second.key_where.empty())
        fail(key_where, dotted, context,
             "given twice (first at " + it->second.key_where + "); remove one of them");
    // erase + emplace, never assignment: YAML::Node's operator= writes through to the node it
    // refers to, which would rewrite the base's value in the shared document.
    out.erase(dotted);
    out.emplace(dotted,
                Setting{value, mark_text(file, value.Mark()), key_where, base_dir, from_variant});
}

// A variant's `set:` mapping: dotted keys, or nested section mappings ({optim: {impl: fused}}).
void parse_variant_set(Settings& out, const YAML::Node& set, const std::string& prefix,
                       const ParsedFile& pf, const std::string& base_dir,
                       const std::string& context) {
    for (auto it = set.begin(); it != set.end(); ++it) {
        const std::string k = prefix + it->first.Scalar();
        if (it->second.IsMap() && prefix.empty() &&
            std::find(knob_sections().begin(), knob_sections().end(), k) != knob_sections().end()) {
            parse_variant_set(out, it->second, k + ".", pf, base_dir, context);
            continue;
        }
        add_setting(out, k, it->first, it->second, pf.file, base_dir, context, true);
    }
}

// Rejects a key given twice in any mapping of the document (yaml-cpp keeps both and the
// sections would read the last), naming both positions. `prefix` is the dotted path so far.
// Depth is bounded by check_experiment_text (and anchors/aliases, which could share nodes, are
// refused there), so the walk visits each node once.
void check_duplicate_keys(const YAML::Node& node, const std::string& prefix,
                          const std::string& file) {
    if (node.IsSequence()) {
        for (size_t i = 0; i < node.size(); ++i)
            check_duplicate_keys(node[i], prefix + "[" + std::to_string(i) + "]", file);
        return;
    }
    if (!node.IsMap()) return;
    std::map<std::string, std::string> seen;  // key -> where
    for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string kw = mark_text(file, it->first.Mark());
        const std::string key =
            prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
        if (!it->first.IsScalar())
            throw SpecError(kw + ": expected a key name, got " + got_text(it->first) +
                            " as a key; write `name: value`");
        if (auto [at, fresh] = seen.emplace(it->first.Scalar(), kw); !fresh)
            fail(kw, key, "",
                 "given twice (first at " + at->second + "); " +
                     (it->second.IsMap() ? "merge them into one" : "remove one of them"));
        check_duplicate_keys(it->second, key, file);
    }
}

// The file's YAML document, whose top level must be a mapping. Sets pf.root_where.
YAML::Node load_yaml_root(ParsedFile& pf, const std::string& path) {
    const std::string text = read_experiment_text(path);
    check_experiment_text(text, path);
    // One document: check_experiment_text has refused a second one ('---' / '...'). YAML::Load
    // reads the first document only; YAML::LoadAll is not used, as it loops forever on some
    // malformed input (a leading ',': tests/fuzz/regressions/experiment/).
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
        throw SpecError(mark_text(path, e.mark) + ": YAML syntax error: " + e.msg +
                        "; fix the YAML syntax at that position");
    } catch (const YAML::Exception& e) {
        throw SpecError(mark_text(path, e.mark) + ": cannot read YAML: " + e.msg);
    }
    pf.root_where =
        root.IsDefined() && !root.IsNull() ? mark_text(path, root.Mark()) : path + ":1:1";
    if (!root.IsMap())
        throw SpecError(pf.root_where +
                        ": expected a mapping of experiment settings (name, "
                        "model, data, optim, run, variants, ...) at the top level, got " +
                        got_text(root) + "; see configs/quickstart.yaml for the shape");
    check_duplicate_keys(root, "", path);
    return root;
}

// variants[i]: a mapping with a `name` (no path separators) and an optional `set`.
VariantSpec parse_variant(const ParsedFile& pf, const YAML::Node& v, size_t i,
                          const std::string& base_dir) {
    const std::string& path = pf.file;
    const std::string vwhere = mark_text(path, v.Mark());
    const std::string vkey = "variants[" + std::to_string(i) + "]";
    if (!v.IsMap())
        fail(vwhere, vkey, "",
             "expected a mapping with 'name' and optional 'set', got " + got_text(v) +
                 "; write `- name: my-variant`");
    VariantSpec spec;
    spec.where = vwhere;
    const std::string context = v["name"] && v["name"].IsScalar()
                                    ? "variant '" + v["name"].Scalar() + "'"
                                    : "variant " + std::to_string(i + 1);
    bool have_name = false;
    for (auto vi = v.begin(); vi != v.end(); ++vi) {
        const std::string k = vi->first.Scalar();
        const std::string kw = mark_text(path, vi->first.Mark());
        if (k == "name") {
            spec.name =
                scalar_string(vi->second, mark_text(path, vi->second.Mark()), vkey + ".name", "");
            check_name(spec.name, mark_text(path, vi->second.Mark()), vkey + ".name",
                       "variant names become file names in the run folder");
            have_name = true;
        } else if (k == "set") {
            if (vi->second.IsNull()) continue;
            if (!vi->second.IsMap())
                fail(mark_text(path, vi->second.Mark()), vkey + ".set", "",
                     "expected a mapping of dotted keys to values, got " + got_text(vi->second) +
                         "; write `set: { run.precision: bf16 }`");
            parse_variant_set(spec.set, vi->second, "", pf, base_dir, context);
        } else {
            unknown_key(kw, vkey + "." + k, "", {vkey + ".name", vkey + ".set"});
        }
    }
    if (!have_name)
        fail(vwhere, vkey + ".name", "",
             "missing; every variant needs a name: add `name: <variant name>`");
    return spec;
}

// The top-level `variants:` list (null for none).
void parse_variants(ParsedFile& pf, const YAML::Node& value, const std::string& base_dir) {
    pf.has_variants = true;
    if (value.IsNull()) return;
    if (!value.IsSequence())
        fail(mark_text(pf.file, value.Mark()), "variants", "",
             "expected a list of variants (- name: ... set: {...}), got " + got_text(value) +
                 "; write each variant as a list item starting with '- name:'");
    for (size_t i = 0; i < value.size(); ++i)
        pf.variants.push_back(parse_variant(pf, value[i], i, base_dir));
}

// A section mapping: model, data, optim, run, kernels, profile (knobs), or compare, report
// (experiment keys).
void parse_section(ParsedFile& pf, const std::string& key, const YAML::Node& value,
                   const std::string& base_dir) {
    const std::string& path = pf.file;
    const std::string vwhere = mark_text(path, value.Mark());
    pf.section_where[key] = vwhere;
    if (value.IsNull()) return;
    if (!value.IsMap())
        fail(vwhere, key, "",
             "expected a mapping of " + key + " settings, got " + got_text(value) + "; write `" +
                 key + ": { key: value, ... }` or an indented block");
    for (auto si = value.begin(); si != value.end(); ++si) {
        const std::string dotted = key + "." + si->first.Scalar();
        if (key == "compare" || key == "report" || key == "train") {
            if (!is_experiment_key(dotted))
                unknown_key(mark_text(path, si->first.Mark()), dotted, "", all_keys(true));
            set_experiment_key(pf, dotted, si->second, mark_text(path, si->second.Mark()));
            continue;
        }
        add_setting(pf.settings, dotted, si->first, si->second, path, base_dir, "", false);
    }
}

ParsedFile parse_file(const std::string& path) {
    ParsedFile pf;
    pf.file = path;
    const YAML::Node root = load_yaml_root(pf, path);
    const std::string base_dir = fs::path(path).parent_path().string();

    const std::vector<std::string> top = {"name",    "backend", "model",   "data", "optim",
                                          "run",     "kernels", "profile", "dist", "variants",
                                          "compare", "report",  "train"};
    std::set<std::string> seen;
    for (auto it = root.begin(); it != root.end(); ++it) {
        const std::string key = it->first.Scalar();
        const std::string key_where = mark_text(path, it->first.Mark());
        const YAML::Node value = it->second;
        if (std::find(top.begin(), top.end(), key) == top.end()) {
            std::vector<std::string> valid = top;
            for (const auto& k : all_keys(true)) valid.push_back(k);
            unknown_key(key_where, key, "", valid);
        }
        if (!seen.insert(key).second)
            fail(key_where, key, "", "given twice at the top level; merge them into one");
        if (key == "name")
            set_experiment_key(pf, key, value, mark_text(path, value.Mark()));
        else if (key == "backend")
            add_setting(pf.settings, key, it->first, value, path, base_dir, "", false);
        else if (key == "variants")
            parse_variants(pf, value, base_dir);
        else
            parse_section(pf, key, value, base_dir);
    }
    if (pf.name.empty()) pf.name = name_from_file(path);
    return pf;
}

// The value text of a --set or a flag as a YAML node, read as a file's value would be (the same
// refusals of what yaml-cpp would misread). Throws SpecError at `where`.
YAML::Node load_value_text(const std::string& value_text, const std::string& where,
                           const std::string& key) {
    check_experiment_text(value_text, where, true);
    try {
        return YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
        fail(where, key, "",
             "cannot parse the value '" + value_text + "': " + e.msg +
                 "; quote it for the shell, e.g. --set 'optim.betas=[0.9, 0.99]'");
    }
}

// `--set model=tiny`: a section where a dotted key belongs. The nearest key by spelling would be
// 'name'; the section's key that takes the value (model.preset takes tiny) is what was meant.
void section_as_key(const std::string& where, const std::string& key, const YAML::Node& value) {
    std::vector<std::string> in_section;
    std::string takes_value;
    for (const auto& k : all_keys(true)) {
        if (section_of(k) != key) continue;
        in_section.push_back(leaf_of(k));
        const KeyDef* def = find_knob(k);
        if (def && value.IsScalar() && takes_value.empty() &&
            std::find(def->choices.begin(), def->choices.end(), value.Scalar()) !=
                def->choices.end())
            takes_value = k;
    }
    if (in_section.empty()) return;
    throw SpecError(where + ": '" + key + "' is a section, not a key: --set takes a dotted key" +
                    (takes_value.empty()
                         ? " such as " + key + "." + in_section.front() + "=..."
                         : ": did you mean '" + takes_value + "=" + value.Scalar() + "'?") +
                    " (" + key + " keys: " + join(in_section, ", ") + ")");
}

// Applies one --set key=value to the file's base settings / experiment keys.
void apply_override(ParsedFile& pf, const std::string& text) {
    // A very long argument is shown shortened: the message names it, it need not repeat it.
    const std::string where =
        "--set " + (text.size() > 120 ? text.substr(0, 100) + "...(" + std::to_string(text.size()) +
                                            " characters)"
                                      : text);
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0)
        throw SpecError(where + ": expected key=value (e.g. --set run.precision=bf16); got no '='");
    const std::string key = text.substr(0, eq);
    const std::string value_text = text.substr(eq + 1);
    const YAML::Node value = load_value_text(value_text, where, key);
    if (is_experiment_key(key)) {
        set_experiment_key(pf, key, value, where);
        return;
    }
    if (!find_knob(key)) {
        if (key == "variants")
            throw SpecError(where + ": key 'variants' cannot be set with --set; edit the file");
        section_as_key(where, key, value);
        unknown_key(where, key, "", all_keys(true));
    }
    pf.settings.erase(key);  // not assignment: see add_setting
    pf.settings.emplace(key, Setting{value, where, "", std::string(), false});
}

// ---- keys another key makes meaningless ---------------------------------------------------

// A key that has no effect under another key's value: written anyway, it would be silently
// ignored (data.path under data.source: synthetic trains on synthetic data). Each pair is an
// error naming both keys. model.lora's own keys (alpha, targets without rank) are parse_lora's.
struct IgnoredUnder {
    std::string key;        // the key written
    std::string governing;  // the key whose value makes it meaningless
    std::function<bool(const RunConfig&)> ignored;
    std::string fix;
};
const std::vector<IgnoredUnder>& ignored_under() {
    using S = LRSchedule::Kind;
    auto constant = [](const RunConfig& c) { return c.optim.schedule.kind == S::constant; };
    const std::string cosine = "set optim.schedule: cosine, or remove ";
    static const std::vector<IgnoredUnder> pairs = {
        {"data.path", "data.source",
         [](const RunConfig& c) { return c.data.source == DataSource::synthetic; },
         "set data.source: tokens (an llm.c .bin) or text, or remove data.path"},
        {"data.synthetic", "data.source",
         [](const RunConfig& c) { return c.data.source != DataSource::synthetic; },
         "remove data.synthetic (it picks the generated data of data.source: synthetic)"},
        {"data.prefetch", "data.workers", [](const RunConfig& c) { return c.data.workers == 0; },
         "set data.workers >= 1 (prefetch is the ring the workers fill), or remove "
         "data.prefetch"},
        {"optim.warmup_steps", "optim.schedule", constant, cosine + "optim.warmup_steps"},
        {"optim.decay_steps", "optim.schedule", constant, cosine + "optim.decay_steps"},
        {"optim.min_lr_ratio", "optim.schedule", constant, cosine + "optim.min_lr_ratio"},
        {"profile.trace_steps", "profile.trace",
         [](const RunConfig& c) { return !c.profile.trace; },
         "set profile.trace: true, or remove profile.trace_steps"},
    };
    return pairs;
}

// ---- resolving one config -------------------------------------------------------------------

struct Resolver {
    const ParsedFile& pf;
    const Settings& s;
    std::string context;  // "" for the base, "variant 'x'"

    // Where to report a problem with `key`: its own value; a missing key is reported at its
    // parent section's mapping (yaml-cpp has no position for what is absent), else the file.
    std::string where_of(const std::string& key) const {
        if (auto it = s.find(key); it != s.end()) return it->second.where;
        if (auto it = pf.section_where.find(section_of(key)); it != pf.section_where.end())
            return it->second;
        return pf.root_where;
    }
    // Of several keys involved in a constraint, the one this variant set, else the first present.
    std::string blame(const std::vector<std::string>& keys) const {
        for (const auto& k : keys)
            if (auto it = s.find(k); it != s.end() && it->second.from_variant) return k;
        for (const auto& k : keys)
            if (s.count(k)) return k;
        return keys.front();
    }
    [[noreturn]] void error(const std::string& key, const std::string& body) const {
        fail(where_of(key), key, context, body);
    }

    RunConfig resolve() const {
        RunConfig c;
        // A preset first, so explicit dims override its fields.
        std::optional<GPTConfig> preset;
        if (auto it = s.find("model.preset"); it != s.end()) {
            const KeyDef& def = *find_knob("model.preset");
            def.set(c, parse_value(def, it->second.node, it->second.where, context));
            preset = c.model;
        }
        for (const auto& [key, setting] : s) {
            if (key == "model.preset") continue;
            const KeyDef& def = *find_knob(key);
            Value v = parse_value(def, setting.node, setting.where, context);
            if (key == "data.path" || key == "data.val_path" || key == "model.init_from") {
                fs::path p(v.s);
                if (p.is_relative() && !setting.base_dir.empty())
                    v.s = (fs::path(setting.base_dir) / p).lexically_normal().string();
            }
            def.set(c, v);
        }
        resolve_init_from(c);
        if (preset && !(*preset == c.model)) c.model_preset.clear();
        check_ignored_keys(c);
        check_validation_split(c);
        check_host_sync(c);
        check_kernel_ladders(c);
        // data.seq_len's default (64) follows a shorter model: unless given, it is capped at
        // model.max_seq_len (the tiny preset has 32).
        if (!s.count("data.seq_len"))
            c.data.seq_len = std::min(c.data.seq_len, c.model.max_seq_len);
        check(c);
        return c;
    }

    // model.init_from: the file (checkpoint/pretrained.h) decides the model's dimensions; any the
    // experiment gives (or its model.preset implies) must be the file's.
    void resolve_init_from(RunConfig& c) const {
        if (c.init_from.empty()) return;
        PretrainedInfo info;
        try {
            info = inspect_pretrained(c.init_from);
        } catch (const std::exception& e) {
            error("model.init_from", e.what());
        }
        const GPTConfig& file = info.config;
        const std::pair<const char*, int GPTConfig::*> dims[] = {
            {"model.n_layer", &GPTConfig::n_layer},
            {"model.n_head", &GPTConfig::n_head},
            {"model.n_embd", &GPTConfig::n_embd},
            {"model.max_seq_len", &GPTConfig::max_seq_len},
            {"model.vocab_size", &GPTConfig::vocab_size}};
        for (const auto& [key, field] : dims) {
            const bool given = s.count(key) > 0;
            if ((!given && !s.count("model.preset")) || c.model.*field == file.*field) continue;
            const std::string by = given ? std::string(key) : "model.preset";
            error(by, std::string("expected ") + key + " " + std::to_string(file.*field) +
                          ", the value of model.init_from's " + info.weights_path + " (" +
                          file.describe() + "), got " + std::to_string(c.model.*field) +
                          (given ? "" : " from model.preset") +
                          "; the model's dimensions come from the file: remove " + by +
                          " or make it agree");
        }
        c.model = file;
    }

    // A written key that another key's value makes meaningless (ignored_under). Not when the
    // key comes from the base and a variant sets the governing key: the base's detail is then
    // for the variants that switch the mode on (prefetch in the base, data.workers per variant),
    // or a variant switches the mode off without unsetting it (data.source: synthetic).
    void check_ignored_keys(const RunConfig& c) const {
        for (const IgnoredUnder& p : ignored_under()) {
            const auto written = s.find(p.key);
            if (written == s.end() || !p.ignored(c)) continue;
            if (!written->second.from_variant && some_variant_sets(p.governing)) continue;
            const auto governing = s.find(p.governing);
            const std::string value = find_knob(p.governing)->get(c);
            error(p.key, "has no effect with " + p.governing + ": " + value +
                             (governing == s.end() ? " (the default)"
                                                   : " (at " + governing->second.where + ")") +
                             ", so it would be silently ignored; " + p.fix);
        }
    }
    bool some_variant_sets(const std::string& key) const {
        return std::any_of(pf.variants.begin(), pf.variants.end(),
                           [&](const VariantSpec& v) { return v.set.count(key) > 0; });
    }

    // The validation split: a share of the windows (data.val_fraction) or a file of the same
    // kind as data.path (data.val_path), not both; a file needs a file source to match.
    void check_validation_split(const RunConfig& c) const {
        if (c.data.val_fraction > 0 && !c.data.val_path.empty())
            error(blame({"data.val_path", "data.val_fraction"}),
                  "expected one validation split, got both data.val_fraction (" +
                      format_float(c.data.val_fraction) + ") and data.val_path ('" +
                      c.data.val_path + "'); remove one of them");
        if (c.data.val_path.empty()) return;
        if (c.data.source == DataSource::synthetic)
            error("data.val_path",
                  "expected data.source tokens or text (the validation file is read like "
                  "data.path), got data.source synthetic; use data.val_fraction with synthetic "
                  "data");
        // The file itself is checked with data.path's checks (check_data_file).
    }

    // kernels.matmul / kernels.layernorm_forward: each backend has its own ladder steps. With
    // backend: auto the backend refuses a step it does not have when it is created.
    void check_kernel_ladders(const RunConfig& c) const {
        if (c.backend == BackendChoice::cpu && !is_cpu_matmul(c.kernels.matmul))
            error(blame({"kernels.matmul", "backend"}),
                  std::string("expected a CPU matmul (naive, blocked, packed, blas or auto) with "
                              "backend: cpu, got kernels.matmul: ") +
                      to_string(c.kernels.matmul) +
                      ", a CUDA implementation; use backend: cuda or a CPU step of the ladder");
        if (c.backend == BackendChoice::cuda && !is_cuda_matmul(c.kernels.matmul))
            error(blame({"kernels.matmul", "backend"}),
                  std::string("expected a CUDA matmul (naive, tiled, cublas, cublaslt or auto) "
                              "with backend: cuda, got kernels.matmul: ") +
                      to_string(c.kernels.matmul) +
                      ", a CPU implementation; use backend: cpu or a CUDA step of the ladder");
        if (c.backend == BackendChoice::cpu &&
            c.kernels.layernorm_forward == LayerNormForwardImpl::thread_per_row)
            error(blame({"kernels.layernorm_forward", "backend"}),
                  "expected two_pass or welford with backend: cpu, got "
                  "kernels.layernorm_forward: thread_per_row, a CUDA thread layout (a CPU "
                  "thread already walks whole rows); use backend: cuda");
        if (c.backend == BackendChoice::cpu && c.kernels.memory_access == MemoryAccess::packed128)
            error(blame({"kernels.memory_access", "backend"}),
                  "expected scalar with backend: cpu, got kernels.memory_access: packed128, the "
                  "CUDA kernels' 128-bit loads (the CPU's vector width is its ISA level, "
                  "MT_CPU_ISA); use backend: cuda or drop the key");
    }

    // kernels.attention: flash_tc, our tensor-core flash attention: CUDA tensor-core code with
    // bf16 operands, compiled for head sizes 64 and 128. Each impossible combination is refused
    // here, before any backend exists, naming the key that set it.
    void check_flash_tc(const RunConfig& c) const {
        if (c.backend == BackendChoice::cpu)
            error(blame({"kernels.attention", "backend"}),
                  "expected backend: cuda (or auto) with kernels.attention: flash_tc, got backend: "
                  "cpu; flash_tc runs on the GPU's tensor cores: use backend: cuda, or "
                  "kernels.attention: flash on the CPU");
        if (c.run.precision != Precision::bf16)
            error(
                blame({"kernels.attention", "run.precision"}),
                std::string("expected run.precision: bf16 with kernels.attention: flash_tc, got ") +
                    to_string(c.run.precision) +
                    "; its tensor-core MMAs take bf16 operands: set run.precision: bf16 or use "
                    "kernels.attention: flash");
        const int hs = c.model.n_embd / c.model.n_head;
        if (!flash_tc_supports_head_size(hs))
            error(blame({"kernels.attention", "model.n_embd", "model.n_head", "model.preset"}),
                  "expected a head size (model.n_embd / model.n_head) of 64 or 128 with "
                  "kernels.attention: flash_tc, got " +
                      std::to_string(c.model.n_embd) + " / " + std::to_string(c.model.n_head) +
                      " = " + std::to_string(hs) +
                      "; choose n_head = n_embd / 64 or n_embd / 128, or use kernels.attention: "
                      "flash");
    }

    // run.cuda_graph: the step's device work is captured into a CUDA graph once and replayed
    // (engine/training_session.h). A graph is a fixed list of kernels with fixed arguments that
    // the device runs without the host: every knob that needs the host inside the step, or a
    // shape that changes from step to step, makes the step uncapturable. Refused here, naming
    // the knob; the session refuses what only a run knows (data parallel under mpirun).
    void check_cuda_graph(const RunConfig& c) const {
        const std::string why =
            "run.cuda_graph: true captures the step's device work into a "
            "CUDA graph that the device replays without the host; ";
        auto refuse = [&](const std::vector<std::string>& keys, const std::string& body) {
            error(blame(keys), why + body);
        };
        if (c.backend == BackendChoice::cpu)
            refuse({"run.cuda_graph", "backend"},
                   "expected backend: cuda (or auto), got backend: cpu, which has no graphs (its "
                   "ops run as the host calls them); use backend: cuda, or remove run.cuda_graph");
        if (c.run.host_sync == HostSync::every_op || c.run.host_sync == HostSync::loss_every_step)
            refuse(
                {"run.cuda_graph", "run.host_sync"},
                std::string("expected run.host_sync: step or none, got ") +
                    to_string(c.run.host_sync) + ", which makes the host wait for the device " +
                    (c.run.host_sync == HostSync::every_op ? "after every op"
                                                           : "after every micro-step's forward") +
                    " inside the step, where a graph has no host; use run.host_sync: step");
        if (c.data.seq_len_jitter > 0)
            refuse({"run.cuda_graph", "data.seq_len_jitter"},
                   "expected data.seq_len_jitter: 0, got " + format_float(c.data.seq_len_jitter) +
                       ": every batch would have its own length, and a graph's kernels keep the "
                       "shapes they were captured with; remove one of the two");
        if (c.run.offload != OffloadMode::none)
            refuse({"run.cuda_graph", "run.offload"},
                   "expected run.offload: none, got activations: the offload copies wait for "
                   "events on a second stream and the host between layers; remove one of the two");
        if (c.optim.offload)
            refuse({"run.cuda_graph", "optim.offload"},
                   "expected optim.offload: false, got true: the update runs on the host's CPU "
                   "between the gradients' copy down and the weights' copy up; remove one of the "
                   "two");
        if (c.run.warmup_steps < 2)
            refuse({"run.cuda_graph", "run.warmup_steps"},
                   "expected run.warmup_steps >= 2, got " + std::to_string(c.run.warmup_steps) +
                       ": the first step runs eagerly (shapes, cuBLAS plans and lazily loaded "
                       "kernels settle), the second captures the graph, and neither may be a "
                       "measured step; set run.warmup_steps: 2 or more");
        if (c.profile.kernels)
            refuse({"run.cuda_graph", "profile.kernels"},
                   "expected profile.kernels: false, got true: the per-op profile records two "
                   "events around every op as the host launches it and reads them after the "
                   "step, and a replay launches no op from the host; profile an eager variant "
                   "(run.cuda_graph: false) to see the ops");
    }

    // run.host_sync: none leaves the device running steps ahead of the host, which two other
    // knobs cannot live with (engine/training_session.h).
    void check_host_sync(const RunConfig& c) const {
        if (c.run.host_sync != HostSync::none) return;
        if (c.profile.kernels)
            error(blame({"run.host_sync", "profile.kernels"}),
                  "expected profile.kernels: false with run.host_sync: none, got both: the per-op "
                  "profile reads its events after every step's synchronisation, which none "
                  "removes; profile with run.host_sync: step, or turn profile.kernels off");
        if (c.data.pin_memory)
            error(blame({"run.host_sync", "data.pin_memory"}),
                  "expected data.pin_memory: false with run.host_sync: none, got true: the "
                  "asynchronous copy from a pinned batch would still be pending when the loader "
                  "refills that batch, since no step waits for the device; use pageable batches "
                  "(data.pin_memory: false, copied before the call returns) or "
                  "run.host_sync: step");
    }

    // What GPTConfig::validate bounds beyond the per-key ranges (the parameter count), and the
    // batch's B x T positions, which the step indexes with int.
    void check_sizes(const RunConfig& c) const {
        try {
            c.model.validate();
        } catch (const std::invalid_argument& e) {
            error(blame({"model.n_layer", "model.n_embd", "model.vocab_size", "model.max_seq_len",
                         "model.preset"}),
                  std::string("expected a model this trainer can hold: ") + e.what());
        }
        check_trainable(c);
        const int64_t positions = static_cast<int64_t>(c.data.batch_size) * c.data.seq_len;
        if (positions > std::numeric_limits<int>::max())
            error(blame({"data.batch_size", "data.seq_len"}),
                  "expected data.batch_size x data.seq_len <= " +
                      std::to_string(std::numeric_limits<int>::max()) + ", got " +
                      std::to_string(c.data.batch_size) + " x " + std::to_string(c.data.seq_len) +
                      " = " + std::to_string(positions) +
                      " positions (the step indexes them with a 32-bit int); lower one of them");
    }

    // Counts the trainer adds or multiplies, bounded here so no sum wraps where it is used: the
    // runner's step indices (warm-up then measured steps, an int) and the tokens of one
    // optimizer step (B x T x grad_accum, counted in 64 bits and multiplied by the ranks in the
    // report).
    void check_step_counts(const RunConfig& c) const {
        const int64_t steps = static_cast<int64_t>(c.run.warmup_steps) + c.run.measure_steps;
        if (steps > std::numeric_limits<int>::max())
            error(blame({"run.warmup_steps", "run.measure_steps"}),
                  "expected run.warmup_steps + run.measure_steps <= " +
                      std::to_string(std::numeric_limits<int>::max()) + ", got " +
                      std::to_string(c.run.warmup_steps) + " + " +
                      std::to_string(c.run.measure_steps) + " = " + std::to_string(steps) +
                      " (the runner numbers the steps with a 32-bit int); lower one of them");
        const int64_t tokens = static_cast<int64_t>(c.data.batch_size) * c.data.seq_len *
                               static_cast<int64_t>(c.run.grad_accum);
        if (tokens > kMaxTokensPerStep)
            error(blame({"run.grad_accum", "data.batch_size", "data.seq_len"}),
                  "expected at most 2^40 tokens per optimizer step (data.batch_size x "
                  "data.seq_len x run.grad_accum), got " +
                      std::to_string(c.data.batch_size) + " x " + std::to_string(c.data.seq_len) +
                      " x " + std::to_string(c.run.grad_accum) + " = " + std::to_string(tokens) +
                      " tokens per optimizer step (a trillion tokens is years of steps, and the "
                      "report's counts over every rank must fit 64 bits); lower run.grad_accum");
    }

    // LoRA's rank against the model, optim.freeze's names against its parameter table, and
    // int8 storage against what is frozen: the table's own checks, blamed on the key they name.
    void check_trainable(const RunConfig& c) const {
        try {
            ParameterTable table(c.model, c.trainable);
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            for (const std::string key : {"model.lora", "optim.freeze", "model.quantize_frozen"})
                if (what.rfind(key, 0) == 0)
                    error(key, what.rfind(key + ": ", 0) == 0 ? what.substr(key.size() + 2) : what);
            throw;
        }
    }

    void check(const RunConfig& c) const {
        const GPTConfig& m = c.model;
        if (m.n_embd % m.n_head != 0) {
            std::vector<int> divisors;
            for (int h = 1; h <= m.n_embd && divisors.size() < 8; ++h)
                if (m.n_embd % h == 0) divisors.push_back(h);
            std::string d;
            for (int x : divisors) d += (d.empty() ? "" : ", ") + std::to_string(x);
            const std::string key = blame({"model.n_head", "model.n_embd", "model.preset"});
            error(key, "expected model.n_embd (" + std::to_string(m.n_embd) +
                           ") divisible by model.n_head (" + std::to_string(m.n_head) +
                           "), got a remainder of " + std::to_string(m.n_embd % m.n_head) +
                           "; choose n_head among the divisors of n_embd (" + d + ", ...)");
        }
        if (c.data.seq_len > m.max_seq_len) {
            const std::string key = blame({"data.seq_len", "model.max_seq_len", "model.preset"});
            error(key, "expected data.seq_len <= model.max_seq_len (" +
                           std::to_string(m.max_seq_len) + "), got data.seq_len " +
                           std::to_string(c.data.seq_len) +
                           "; lower data.seq_len or raise model.max_seq_len");
        }
        check_sizes(c);
        check_step_counts(c);
        if (c.optim.schedule.kind == LRSchedule::Kind::cosine && c.optim.schedule.decay_steps < 1)
            error(blame({"optim.decay_steps", "optim.schedule"}),
                  "expected optim.decay_steps >= 1 with schedule cosine, got " +
                      std::to_string(c.optim.schedule.decay_steps) +
                      "; set how many steps the cosine decay lasts, or use schedule constant");
        if (c.optim.offload && c.dist.zero == 1)
            error(blame({"optim.offload", "dist.zero"}),
                  "expected optim.offload: false with dist.zero: 1, got both on; ZeRO-1 shards the "
                  "AdamW state across the ranks' devices and offload keeps all of it in host "
                  "memory: use one or the other");
        if (c.kernels.attention == AttentionImpl::cudnn && c.run.precision != Precision::bf16)
            error(blame({"kernels.attention", "run.precision"}),
                  std::string("expected run.precision: bf16 with kernels.attention: cudnn, got ") +
                      to_string(c.run.precision) +
                      "; cuDNN's fused attention computes in 16-bit: set run.precision: bf16 "
                      "or use kernels.attention: flash");
        if (c.kernels.attention == AttentionImpl::flash_tc) check_flash_tc(c);
        if (c.run.cuda_graph) check_cuda_graph(c);
        if (c.dist.simulate_link_ratio > 0 && c.dist.simulate_link_gbps > 0)
            error(blame({"dist.simulate_link_ratio", "dist.simulate_link_gbps"}),
                  "expected one simulated bandwidth, got dist.simulate_link_gbps and "
                  "dist.simulate_link_ratio both set; the ratio sets the bandwidth from the "
                  "measured compute: keep one of them");
        if (c.dist.simulate_link_ratio > 0 && c.run.warmup_steps < 1)
            error(blame({"dist.simulate_link_ratio", "run.warmup_steps"}),
                  "expected run.warmup_steps >= 1 with dist.simulate_link_ratio, got 0; the "
                  "link is scaled to the last warm-up step's compute: add a warm-up step");
        if (c.data.source == DataSource::synthetic) return;

        if (c.data.source == DataSource::text && m.vocab_size < 256)
            error(blame({"model.vocab_size", "data.source", "model.preset"}),
                  "expected model.vocab_size >= 256 for byte-level text, got " +
                      std::to_string(m.vocab_size) + "; set model.vocab_size: 256");
        if (c.data.path.empty())
            error("data.path", std::string("missing; data.source ") +
                                   (c.data.source == DataSource::tokens ? "tokens" : "text") +
                                   " reads " + data_file_kind(c) +
                                   ": add `path: <file>` to the data section");
        check_data_file(c, "data.path");
        // The validation file is read like the training file, one batch at a time.
        if (!c.data.val_path.empty()) check_data_file(c, "data.val_path");
    }

    static std::string data_file_kind(const RunConfig& c) {
        return c.data.source == DataSource::tokens ? "an llm.c token file (.bin)"
                                                   : "a UTF-8 text file";
    }

    // data.path or data.val_path (`key`): a readable regular file of data.source's kind holding
    // at least one batch. Its tokens against the vocabulary are read by `validate`
    // (check_data_source), not here: that reads the whole file.
    void check_data_file(const RunConfig& c, const std::string& key) const {
        const std::string what = data_file_kind(c);
        const std::string& p = key == "data.path" ? c.data.path : c.data.val_path;
        std::error_code ec;
        if (!fs::exists(p, ec) && !ec)  // ec set (e.g. ELOOP): not_a_regular_file says what
            error(key, "expected " + what + ", got '" + p +
                           "' which does not exist; check the path (relative paths resolve "
                           "against the experiment file's directory)");
        if (fs::is_directory(p, ec))
            error(key,
                  "expected " + what + ", got the directory '" + p + "'; name a file inside it");
        if (auto problem = not_a_regular_file(p))  // a FIFO would block the open below forever
            error(key, "expected " + what + ", got '" + p + "' which " + *problem);
        {
            std::ifstream f(p, std::ios::binary);
            if (!f)
                error(key, "expected a readable file, got '" + p + "' which cannot be opened: " +
                               std::strerror(errno) + "; check its permissions");
        }
        size_t count = 0;
        if (c.data.source == DataSource::tokens) {
            try {
                count = token_file_count(p);
            } catch (const DataError& e) {
                error(key, std::string("expected an llm.c token file, got a bad one: ") + e.what() +
                               "; regenerate it with a tokenizer script");
            }
        } else {
            count = static_cast<size_t>(fs::file_size(p, ec));
        }
        const size_t need = static_cast<size_t>(c.data.batch_size) * c.data.seq_len + 1;
        if (count < need)
            error(blame({key, "data.batch_size", "data.seq_len"}),
                  "expected a data file holding at least one batch (batch_size " +
                      std::to_string(c.data.batch_size) + " x seq_len " +
                      std::to_string(c.data.seq_len) + " + 1 = " + std::to_string(need) +
                      " tokens), got '" + p + "' with " + std::to_string(count) +
                      " tokens; use a longer file or a smaller batch_size / seq_len");
    }
};

// The keys of `v` whose value differs from `from` (the baseline variant: what the report compares
// `v` with), given each one's `set:`. A model.preset set by either counts as one change
// (model.preset), not one per dimension the preset implies; its value is `v`'s preset, or `v`'s
// dimensions when `v` has none of its own.
std::map<std::string, std::string> diff(const RunConfig& from, const RunConfig& v,
                                        const Settings& from_set, const Settings& v_set) {
    std::map<std::string, std::string> ff, out;
    for (auto& [k, val] : flatten(from)) ff[k] = val;
    const bool preset_set = v_set.count("model.preset") > 0 || from_set.count("model.preset") > 0;
    for (auto& [k, val] : flatten(v)) {
        if (k == "model.preset") continue;
        if (preset_set && section_of(k) == "model" && !v_set.count(k) && !from_set.count(k))
            continue;
        if (ff[k] != val) out[k] = val;
    }
    if (preset_set && !(from.model == v.model))
        out["model.preset"] = v_set.count("model.preset") ? v_set.at("model.preset").node.Scalar()
                              : v.model_preset.empty()    ? v.model.describe()
                                                          : v.model_preset;
    return out;
}

// The `train:` keys' pair of ignored_under: the validation batches are never read without
// a validation loss.
void check_train_section(const ParsedFile& pf) {
    const auto batches = pf.experiment_where.find("train.eval_batches");
    if (batches == pf.experiment_where.end() || pf.train.eval_every != 0) return;
    const auto every = pf.experiment_where.find("train.eval_every");
    fail(batches->second, "train.eval_batches", "",
         "has no effect with train.eval_every: 0" +
             (every == pf.experiment_where.end() ? std::string() : " (at " + every->second + ")") +
             " (no validation loss), so it would be silently ignored; set train.eval_every "
             ">= 1, or remove train.eval_batches");
}

}  // namespace

const RunConfig& ExperimentSpec::variant(const std::string& name) const {
    for (const auto& v : variants)
        if (v.variant == name) return v;
    std::vector<std::string> names;
    for (const auto& v : variants) names.push_back(v.variant);
    throw SpecError(source_path + ": no variant named '" + name +
                    "'; the variants are: " + join(names, ", "));
}

ExperimentSpec load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
    ParsedFile pf = parse_file(path);
    for (const auto& o : overrides) apply_override(pf, o);

    ExperimentSpec spec;
    spec.name = pf.name;
    spec.source_path = path;
    spec.loss_tolerance = pf.loss_tolerance;
    spec.min_effect = pf.min_effect;
    spec.out_dir = pf.out_dir;
    spec.train = pf.train;

    check_train_section(pf);
    spec.base = Resolver{pf, pf.settings, ""}.resolve();
    spec.base.variant = "base";
    const RunConfig& base = spec.base;

    if (pf.variants.empty()) {
        RunConfig v = base;
        v.variant = "baseline";
        spec.variants.push_back(std::move(v));
    }
    std::map<std::string, std::string> name_where;
    std::vector<const Settings*> sets;  // each variant's `set:`, for `changed` below
    for (size_t i = 0; i < pf.variants.size(); ++i) {
        const VariantSpec& vs = pf.variants[i];
        if (auto it = name_where.find(vs.name); it != name_where.end())
            fail(vs.where, "variants[" + std::to_string(i) + "].name", "",
                 "expected a unique variant name, got '" + vs.name + "' (already used at " +
                     it->second + "); rename one of them");
        name_where[vs.name] = vs.where;
        Settings merged = pf.settings;
        for (const auto& [k, setting] : vs.set) {
            merged.erase(k);  // not assignment: see add_setting
            merged.emplace(k, setting);
        }
        RunConfig v = Resolver{pf, merged, "variant '" + vs.name + "'"}.resolve();
        v.variant = vs.name;
        spec.variants.push_back(std::move(v));
        sets.push_back(&vs.set);
    }

    spec.baseline = pf.baseline.empty() ? spec.variants.front().variant : pf.baseline;
    if (!pf.baseline.empty()) {
        std::vector<std::string> names;
        for (const auto& v : spec.variants) names.push_back(v.variant);
        if (std::find(names.begin(), names.end(), pf.baseline) == names.end()) {
            const std::string where = pf.baseline_where.empty() ? pf.root_where : pf.baseline_where;
            fail(where, "compare.baseline", "",
                 "expected the name of a variant (" + join(names, ", ") + "), got '" + pf.baseline +
                     "'; did you mean '" + nearest_key(pf.baseline, names) + "'?");
        }
    }
    // What each variant changed, against the baseline (not the base config: compare.baseline may
    // name a variant with a `set:` of its own, and the report credits each difference to
    // `changed`).
    if (!sets.empty()) {
        size_t b = 0;
        while (spec.variants[b].variant != spec.baseline) ++b;
        spec.baseline_changes = diff(base, spec.variants[b], Settings{}, *sets[b]);
        for (size_t i = 0; i < spec.variants.size(); ++i)
            if (i != b)
                spec.variants[i].changed =
                    diff(spec.variants[b], spec.variants[i], *sets[b], *sets[i]);
    }
    return spec;
}

void set_knob(RunConfig& config, const std::string& key, const std::string& text,
              const std::string& where) {
    const KeyDef* def = find_knob(key);
    if (!def) throw std::logic_error("set_knob: '" + key + "' is not a key of the key table");
    def->set(config, parse_value(*def, load_value_text(text, where, key), where, ""));
}

std::vector<std::pair<std::string, std::string>> flatten(const RunConfig& config) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& k : knob_table()) {
        if (k.key == "model.preset" && config.model_preset.empty()) continue;
        out.emplace_back(k.key, k.get(config));
    }
    return out;
}

std::vector<std::string> cuda_only_features(const RunConfig& c) {
    std::vector<std::string> f;
    if (c.backend == BackendChoice::cuda) f.push_back("backend cuda");
    if (c.run.precision != Precision::fp32)
        f.push_back(std::string("run.precision ") + to_string(c.run.precision));
    // flash attention has a CPU implementation too; cuDNN's and flash_tc exist only on CUDA.
    // pin_memory is a no-op on the CPU backend (host memory is already where the compute is), not
    // an error.
    if (c.kernels.attention == AttentionImpl::cudnn) f.push_back("kernels.attention cudnn");
    if (c.kernels.attention == AttentionImpl::flash_tc) f.push_back("kernels.attention flash_tc");
    if (!is_cpu_matmul(c.kernels.matmul))  // naive and auto: both backends have them
        f.push_back(std::string("kernels.matmul ") + to_string(c.kernels.matmul));
    if (c.kernels.layernorm_forward == LayerNormForwardImpl::thread_per_row)
        f.push_back("kernels.layernorm_forward thread_per_row");
    if (c.kernels.memory_access == MemoryAccess::packed128)
        f.push_back("kernels.memory_access packed128");
    // Offload moves state between device memory and pinned host memory over a copy stream: on
    // the CPU backend both sides are the same memory.
    if (c.run.offload != OffloadMode::none)
        f.push_back(std::string("run.offload ") + to_string(c.run.offload));
    if (c.optim.offload) f.push_back("optim.offload");
    if (c.run.cuda_graph) f.push_back("run.cuda_graph true");
    return f;
}

}  // namespace mt

// GPT-2 forward and backward as a sequence of Backend ops.
//
// One block (pre-LayerNorm), N = B*T rows:
//   ln1   = LN(residual)                      (N,C)    + mean/rstd (N)
//   qkv   = ln1 W_attn^T + b                  (N,3C)
//   atty  = causal_attention(qkv)             (N,C)    + per-layer saved state
//   attp  = atty W_proj^T + b                 (N,C)
//   res2  = residual + attp                   (N,C)
//   ln2   = LN(res2)                          (N,C)
//   fch   = ln2 W_fc^T + b                    (N,4C)   pre-activation
//   fchg  = gelu(fch)                         (N,4C)
//   fcp   = fchg W_fcproj^T + b               (N,C)
//   res3  = res2 + fcp                        (N,C)    -> next block's residual
// then lnf = LN(res3_last), logits = lnf wte^T (N,Vp), mean cross-entropy over the first V.
//
// Backward walks the same list in reverse. The gradient of the residual stream lives in ONE
// buffer (dresidual) for the whole pass: a residual add's backward is the identity, so the
// branch reads dresidual as its output gradient and the LayerNorm backward adds the branch's
// contribution into it (backward ops accumulate). All other activation gradients of a block
// live in a scratch region shared by every block and zeroed once per block.
#include "model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "kernels/quantize.h"

namespace mt {

// ---- config -----------------------------------------------------------------------------------

namespace {
// a * b, or -1 when either is negative or the product overflows int64.
int64_t checked_mul(int64_t a, int64_t b) {
    int64_t r = 0;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return -1;
    return r;
}
int64_t checked_add(int64_t a, int64_t b) {
    int64_t r = 0;
    if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) return -1;
    return r;
}
}  // namespace

int64_t GPTConfig::parameter_count() const {
    // wte (Vp, C) + wpe (T, C) + L blocks of 12 C^2 + 13 C (ln_1, c_attn, c_proj, ln_2, c_fc,
    // c_proj weights and biases) + ln_f 2 C; the same tensors as ParameterTable.
    const int64_t C = n_embd, Vp = (static_cast<int64_t>(vocab_size) + 127) / 128 * 128;
    const int64_t block = checked_add(checked_mul(12, checked_mul(C, C)), checked_mul(13, C));
    int64_t n = checked_add(checked_mul(Vp, C), checked_mul(max_seq_len, C));
    n = checked_add(n, checked_mul(n_layer, block));
    return checked_add(n, checked_mul(2, C));
}

void GPTConfig::validate() const {
    auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
    auto in_range = [&](const char* name, int v, int lo, int hi) {
        if (v < lo || v > hi)
            fail(std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + std::to_string(v));
    };
    in_range("n_layer", n_layer, 1, kMaxLayers);
    in_range("n_head", n_head, 1, kMaxHeads);
    in_range("n_embd", n_embd, 1, kMaxEmbd);
    if (n_embd % n_head != 0)
        fail("n_embd (" + std::to_string(n_embd) + ") must be divisible by n_head (" +
             std::to_string(n_head) + ")");
    in_range("max_seq_len", max_seq_len, 1, kMaxSeqLen);
    in_range("vocab_size", vocab_size, 2, kMaxVocab);
    const int64_t n = parameter_count();
    if (n < 0 || n > kMaxParams)
        fail("the model has " + (n < 0 ? std::string("more than 2^63") : std::to_string(n)) +
             " parameters (" + describe() + "), more than the " + std::to_string(kMaxParams) +
             " (2^36) this trainer supports; lower n_layer, n_embd, vocab_size or max_seq_len");
}

std::string GPTConfig::describe() const {
    std::ostringstream s;
    s << "L" << n_layer << " C" << n_embd << " H" << n_head << " T" << max_seq_len << " V"
      << vocab_size;
    return s.str();
}

namespace {
struct Preset {
    const char* name;
    GPTConfig config;
};
const Preset kPresets[] = {
    {"tiny", {2, 4, 64, 32, 256}},
    {"gpt2-mini", {4, 4, 256, 256, 50257}},
    {"gpt2-124M", {12, 12, 768, 1024, 50257}},
    {"gpt2-350M", {24, 16, 1024, 1024, 50257}},
    {"gpt2-774M", {36, 20, 1280, 1024, 50257}},
    {"gpt2-1558M", {48, 25, 1600, 1024, 50257}},
};
}  // namespace

std::optional<GPTConfig> gpt_preset(const std::string& name) {
    for (const auto& p : kPresets)
        if (name == p.name) return p.config;
    return std::nullopt;
}

std::vector<std::string> gpt_preset_names() {
    std::vector<std::string> names;
    for (const auto& p : kPresets) names.emplace_back(p.name);
    return names;
}

// ---- parameter table ------------------------------------------------------------------------

ParamRef ParameterTable::add(std::string name, std::vector<int64_t> shape, bool decay, bool lora) {
    size_t count = 1;
    for (auto d : shape) count *= static_cast<size_t>(d);
    ParameterInfo info{std::move(name), std::move(shape), total_, count, decay};
    info.lora = lora;
    tensors_.push_back(std::move(info));
    total_ += count;
    // Until place() lays the device out, a handle holds its tensor's index.
    return {tensors_.size() - 1};
}

bool LoraConfig::adapts(LoraTarget t) const {
    return enabled() && std::find(targets.begin(), targets.end(), t) != targets.end();
}

ParameterTable::ParameterTable(const GPTConfig& cfg, const TrainableOptions& trainable) {
    cfg.validate();  // before any size is computed from the dimensions (they are bounded there)
    const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab_size(), maxT = cfg.max_seq_len;
    const LoraConfig& lora = trainable.lora;
    if (lora.enabled() && lora.rank > cfg.n_embd)
        throw std::invalid_argument("model.lora: expected rank <= model.n_embd (" +
                                    std::to_string(cfg.n_embd) + "), got rank " +
                                    std::to_string(lora.rank) +
                                    "; a low-rank adapter needs a rank well below n_embd");
    if (lora.enabled() && !(lora.alpha > 0))
        throw std::invalid_argument(
            "model.lora: expected alpha > 0; the update is scaled by "
            "alpha/rank");
    // nanoGPT state_dict order. Decay on 2-D tensors (embeddings, Linear weights) only. A
    // targeted Linear's adapters follow its bias (their names end in lora_A/B.weight).
    auto linear = [&](const std::string& name, int64_t out, int64_t in, LoraTarget target) {
        LinearParams p{add(name + ".weight", {out, in}, true), add(name + ".bias", {out}, false),
                       std::nullopt};
        if (lora.adapts(target))
            p.lora = LoraParams{add(name + ".lora_A.weight", {lora.rank, in}, true, true),
                                add(name + ".lora_B.weight", {out, lora.rank}, true, true)};
        return p;
    };
    auto layernorm = [&](const std::string& name) {
        return LayerNormParams{add(name + ".weight", {C}, false), add(name + ".bias", {C}, false)};
    };
    params_.wte = add("transformer.wte.weight", {Vp, C}, true);
    params_.wpe = add("transformer.wpe.weight", {maxT, C}, true);
    params_.h.resize(static_cast<size_t>(cfg.n_layer));
    for (int l = 0; l < cfg.n_layer; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        BlockParams& block = params_.h[static_cast<size_t>(l)];
        block.ln_1 = layernorm(h + "ln_1");
        block.attn.c_attn = linear(h + "attn.c_attn", 3 * C, C, LoraTarget::attn_c_attn);
        block.attn.c_proj = linear(h + "attn.c_proj", C, C, LoraTarget::attn_c_proj);
        block.ln_2 = layernorm(h + "ln_2");
        block.mlp.c_fc = linear(h + "mlp.c_fc", 4 * C, C, LoraTarget::mlp_c_fc);
        block.mlp.c_proj = linear(h + "mlp.c_proj", C, 4 * C, LoraTarget::mlp_c_proj);
    }
    params_.ln_f = layernorm("transformer.ln_f");
    place(trainable);
}

namespace {
bool is_linear_weight(const ParameterInfo& t) {
    if (t.lora || t.shape.size() != 2) return false;
    for (const char* s : {".c_attn.weight", ".c_proj.weight", ".c_fc.weight"}) {
        const std::string suffix = s;
        if (t.name.size() > suffix.size() &&
            t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
            return true;
    }
    return false;
}
template <class F>
void for_each_ref(GPTParams& p, F&& f) {
    auto linear = [&](LinearParams& l) {
        f(l.weight);
        f(l.bias);
        if (l.lora) {
            f(l.lora->A);
            f(l.lora->B);
        }
    };
    auto layernorm = [&](LayerNormParams& l) {
        f(l.weight);
        f(l.bias);
    };
    f(p.wte);
    f(p.wpe);
    for (BlockParams& b : p.h) {
        layernorm(b.ln_1);
        linear(b.attn.c_attn);
        linear(b.attn.c_proj);
        layernorm(b.ln_2);
        linear(b.mlp.c_fc);
        linear(b.mlp.c_proj);
    }
    layernorm(p.ln_f);
}
}  // namespace

std::vector<const ParameterInfo*> match_parameters(const ParameterTable& table,
                                                   const std::string& entry) {
    const std::string prefix = "transformer.";
    const std::string full = entry.rfind(prefix, 0) == 0 ? entry : prefix + entry;
    std::vector<const ParameterInfo*> out;
    for (const auto& t : table.tensors())
        if (!t.lora && (t.name == full || t.name.rfind(full + ".", 0) == 0)) out.push_back(&t);
    return out;
}

// Marks what trains (LoRA: only the adapters; optim.freeze: all but the named), picks the
// storage of the frozen Linear weights, and lays the device buffers out: trainable tensors
// first, then the frozen fp32 ones; int8 weights in their own buffer.
void ParameterTable::place(const TrainableOptions& opt) {
    auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
    if (opt.lora.enabled()) {
        if (!opt.freeze.empty())
            fail(
                "optim.freeze: model.lora already freezes every base weight (only the adapters "
                "train); remove optim.freeze or model.lora");
        for (auto& t : tensors_) t.trainable = t.lora;
    }
    for (const std::string& entry : opt.freeze) {
        const auto hits = match_parameters(*this, entry);
        if (hits.empty())
            fail("optim.freeze: '" + entry + "' names no parameter; expected a name or prefix " +
                 "from the parameter table such as wte, wpe, h.0, h.0.attn, h.0.mlp.c_fc.weight, " +
                 "ln_f (the model has h.0 .. h." + std::to_string(params_.h.size() - 1) + ")");
        for (const ParameterInfo* t : hits) tensors_[t - tensors_.data()].trainable = false;
    }
    size_t trainable = 0;
    for (const auto& t : tensors_) trainable += t.trainable ? t.count : 0;
    if (trainable == 0) fail("optim.freeze freezes every parameter: nothing would train");
    bool any_int8 = false;
    for (auto& t : tensors_) {
        t.storage =
            !t.trainable && opt.quantize_frozen == QuantizeFrozen::int8 && is_linear_weight(t)
                ? ParamStorage::int8
                : ParamStorage::fp32;
        any_int8 |= t.storage == ParamStorage::int8;
    }
    if (opt.quantize_frozen == QuantizeFrozen::int8 && !any_int8)
        fail(
            "model.quantize_frozen: int8 stores frozen Linear weights as int8, but no Linear "
            "weight is frozen; freeze them with model.lora or optim.freeze (e.g. [h.0, h.1])");
    trainable_count_ = device_count_ = int8_count_ = scale_count_ = 0;
    for (auto& t : tensors_)
        if (t.trainable) t.device_offset = std::exchange(device_count_, device_count_ + t.count);
    trainable_count_ = device_count_;
    for (auto& t : tensors_) {
        if (t.trainable) continue;
        if (t.storage == ParamStorage::fp32) {
            t.device_offset = std::exchange(device_count_, device_count_ + t.count);
        } else {
            t.device_offset = std::exchange(int8_count_, int8_count_ + t.count);
            t.scale_offset = std::exchange(scale_count_, scale_count_ + t.shape[0]);
        }
    }
    for_each_ref(params_, [&](ParamRef& r) {
        const ParameterInfo& t = tensors_[r.offset];
        r = ParamRef{t.device_offset, t.trainable, t.storage == ParamStorage::int8, t.scale_offset};
    });
}

const ParameterInfo* ParameterTable::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

const ParameterInfo& ParameterTable::at(const std::string& name) const {
    const ParameterInfo* p = find(name);
    if (!p) throw std::out_of_range("no parameter named '" + name + "'");
    return *p;
}

// ---- activation plan ------------------------------------------------------------------------

// Offsets (in elements) of every activation tensor. `act` tensors are in compute precision and
// live in the activation arena; `f32` tensors (LayerNorm stats, attention state, losses) live in
// a separate fp32 arena; `grad` tensors (compute precision) in the gradient scratch arena.
struct GPT::Activations {
    struct Layer {
        size_t ln1, qkv, atty, attproj, residual2, ln2, fch, fch_gelu, fcproj, residual3;  // act
        size_t ln1_mean, ln1_rstd, ln2_mean, ln2_rstd, att_saved;                          // f32
        std::array<size_t, 4> lora_u{};  // act: u (N, rank) per LoraTarget it adapts
    };
    int B = 0, T = 0;
    size_t encoded = 0, lnf = 0, logits = 0;                             // act
    size_t lnf_mean = 0, lnf_rstd = 0, probs = 0, losses = 0, loss = 0;  // f32 (probs: unfused)
    size_t dresidual = 0, scratch = 0, scratch_elems = 0;                // grad
    size_t d_fch_gelu = 0, d_fch = 0, d_ln2 = 0, d_atty = 0, d_qkv = 0, d_ln1 = 0;  // grad
    size_t d_lora_u = 0;  // grad: LoRA's du (N, rank), scratch of every adapter
    std::vector<Layer> layers;
    // Each layer's saved activations as one range per arena (activation offload copies them).
    std::vector<LayerActivationRange> layer_ranges;
    OffloadMode mode = OffloadMode::none;
    size_t act_elems = 0, f32_elems = 0, grad_elems = 0;

    DeviceBuffer act, f32, grad;
    std::unique_ptr<ActivationOffload> offload;  // run.offload activations (after the arenas:
                                                 // destroyed first, it waits for its copies)

    // Lays out every tensor for (B, T). Shared (not per-layer) buffers are used for what the
    // recompute policy regenerates in backward.
    void plan(const GPTConfig& cfg, const ModelOptions& opt, const KernelChoice& kernels, int B_,
              int T_) {
        B = B_;
        T = T_;
        const size_t N = static_cast<size_t>(B) * T, C = cfg.n_embd;
        const size_t Vp = cfg.padded_vocab_size();
        const bool recompute_gelu = opt.recompute != Recompute::none;
        const bool recompute_ln = opt.recompute == Recompute::layernorm_gelu;
        act_elems = f32_elems = grad_elems = 0;
        auto a = [&](size_t n) {
            size_t o = act_elems;
            act_elems += n;
            return o;
        };
        auto f = [&](size_t n) {
            size_t o = f32_elems;
            f32_elems += n;
            return o;
        };
        auto g = [&](size_t n) {
            size_t o = grad_elems;
            grad_elems += n;
            return o;
        };

        encoded = a(N * C);
        size_t shared_gelu = recompute_gelu ? a(N * 4 * C) : 0;
        size_t shared_ln1 = recompute_ln ? a(N * C) : 0;
        size_t shared_ln2 = recompute_ln ? a(N * C) : 0;
        const size_t saved = attention_saved_elems(kernels.attention, B, T, cfg.n_head);
        layers.assign(cfg.n_layer, {});
        layer_ranges.clear();
        mode = opt.offload;
        // With activation offload the layers rotate through a few slots: layer l reuses the
        // offsets of layer l % slots (model/activation_offload.h).
        const size_t slots = ActivationOffload::slots_for(cfg.n_layer, opt.offload);
        for (size_t l = 0; l < layers.size(); ++l) {
            if (l >= slots) {
                layers[l] = layers[l % slots];
                layer_ranges.push_back(layer_ranges[l % slots]);
                continue;
            }
            auto& L = layers[l];
            const size_t act_begin = act_elems, f32_begin = f32_elems;
            L.ln1 = recompute_ln ? shared_ln1 : a(N * C);
            L.qkv = a(N * 3 * C);
            L.atty = a(N * C);
            L.attproj = a(N * C);
            L.residual2 = a(N * C);
            L.ln2 = recompute_ln ? shared_ln2 : a(N * C);
            L.fch = a(N * 4 * C);
            L.fch_gelu = recompute_gelu ? shared_gelu : a(N * 4 * C);
            L.fcproj = a(N * C);
            L.residual3 = a(N * C);
            L.ln1_mean = f(N);
            L.ln1_rstd = f(N);
            L.ln2_mean = f(N);
            L.ln2_rstd = f(N);
            L.att_saved = f(saved);
            const LoraConfig& lora = opt.trainable.lora;
            for (size_t t = 0; t < L.lora_u.size(); ++t)
                if (lora.adapts(static_cast<LoraTarget>(t)))
                    L.lora_u[t] = a(N * static_cast<size_t>(lora.rank));
            layer_ranges.push_back(
                {act_begin, act_elems - act_begin, f32_begin, f32_elems - f32_begin});
        }
        lnf = a(N * C);
        logits = a(N * Vp);
        lnf_mean = f(N);
        lnf_rstd = f(N);
        probs = kernels.classifier == ClassifierImpl::unfused ? f(N * Vp) : 0;
        losses = f(N);
        loss = f(1);

        dresidual = g(N * C);
        scratch = grad_elems;
        d_fch_gelu = g(N * 4 * C);
        d_fch = g(N * 4 * C);
        d_ln2 = g(N * C);
        d_atty = g(N * C);
        d_qkv = g(N * 3 * C);
        d_ln1 = g(N * C);
        if (opt.trainable.lora.enabled())
            d_lora_u = g(N * static_cast<size_t>(opt.trainable.lora.rank));
        scratch_elems = grad_elems - scratch;
    }
    size_t bytes(const Backend& backend) const {
        return (act_elems + grad_elems) * backend.compute_elem_bytes() + f32_elems * 4;
    }
    // Pinned host bytes of activation offload (0 without it).
    size_t offload_host_bytes(const Backend& backend) const {
        const int off = ActivationOffload::offloaded_layers(static_cast<int>(layers.size()), mode);
        return off ? ActivationOffload::host_bytes(layer_ranges[0], backend.compute_elem_bytes(),
                                                   off)
                   : 0;
    }
};

// ---- GPT ------------------------------------------------------------------------------------

GPT::GPT(Backend& backend, const GPTConfig& config, ModelOptions options)
    : backend_(backend),
      config_(config),
      options_(options),
      table_(config, options.trainable),
      P_(table_.params()) {
    config_.validate();
    const size_t n = table_.device_count();
    params_ = DeviceBuffer(backend_, n * sizeof(float), MemoryCategory::params);
    if (backend_.precision() == Precision::bf16)
        params_compute_ = DeviceBuffer(backend_, n * 2, MemoryCategory::params);
    grads_ =
        DeviceBuffer(backend_, table_.trainable_count() * sizeof(float), MemoryCategory::grads);
    int8_weights_ = DeviceBuffer(backend_, table_.int8_count(), MemoryCategory::params);
    int8_scales_ =
        DeviceBuffer(backend_, table_.scale_count() * sizeof(float), MemoryCategory::params);
    backend_.memset_zero(params_.get(), params_.bytes());
    backend_.memset_zero(grads_.get(), grads_.bytes());
    if (int8_weights_.get()) backend_.memset_zero(int8_weights_.get(), int8_weights_.bytes());
    if (int8_scales_.get()) backend_.memset_zero(int8_scales_.get(), int8_scales_.bytes());
    // The lowest block with a trainable tensor: backward need not go below it when the
    // embeddings are frozen too.
    embeddings_train_ = P_.wte.trainable || P_.wpe.trainable;
    lowest_trainable_layer_ = config_.n_layer;  // none: only ln_f trains
    for (const auto& t : table_.tensors()) {
        if (!t.trainable) continue;
        const std::string h = "transformer.h.";
        if (t.name.rfind(h, 0) == 0)
            lowest_trainable_layer_ =
                std::min(lowest_trainable_layer_, std::stoi(t.name.substr(h.size())));
    }
    if (embeddings_train_) lowest_trainable_layer_ = 0;
}

GPT::~GPT() = default;

namespace {
// Deterministic N(0,1) from a 64-bit generator (Box-Muller), independent of the standard
// library's distribution implementation, so a seed means the same weights everywhere.
class NormalSampler {
  public:
    explicit NormalSampler(uint64_t seed) : rng_(seed) {}
    float next() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double u1 = (static_cast<double>(rng_() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
        double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;          // [0, 1)
        double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = static_cast<float>(r * std::sin(2.0 * M_PI * u2));
        has_spare_ = true;
        return static_cast<float>(r * std::cos(2.0 * M_PI * u2));
    }

  private:
    std::mt19937_64 rng_;
    bool has_spare_ = false;
    float spare_ = 0;
};
bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

void GPT::init_weights(uint64_t seed) {
    std::vector<float> host(table_.total_count(), 0.0f);
    NormalSampler normal(seed);
    const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_layer));
    for (const auto& t : table_.tensors()) {
        float* p = host.data() + t.offset;
        if (t.lora) continue;  // below, from their own stream: the base is the same with LoRA
        if (ends_with(t.name, "ln_1.weight") || ends_with(t.name, "ln_2.weight") ||
            ends_with(t.name, "ln_f.weight")) {
            std::fill(p, p + t.count, 1.0f);
        } else if (t.shape.size() == 1) {
            std::fill(p, p + t.count, 0.0f);  // biases (LayerNorm biases too)
        } else {
            const bool residual_proj =
                ends_with(t.name, "attn.c_proj.weight") || ends_with(t.name, "mlp.c_proj.weight");
            const float std = residual_proj ? residual_std : 0.02f;
            size_t count = t.count;
            // wte: only the first vocab_size rows are real tokens; padding rows stay zero.
            if (t.name == "transformer.wte.weight")
                count = static_cast<size_t>(config_.vocab_size) * config_.n_embd;
            for (size_t i = 0; i < count; ++i) p[i] = std * normal.next();
        }
    }
    // LoRA as peft initialises it: A ~ kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(in),
    // 1/sqrt(in)), B = 0, so the adapted model starts equal to the base.
    std::mt19937_64 lora_rng(seed ^ 0x4c6f5241'64617074ull);  // "LoRAdapt"
    for (const auto& t : table_.tensors()) {
        if (!t.lora || !ends_with(t.name, "lora_A.weight")) continue;
        const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
        float* p = host.data() + t.offset;
        for (size_t i = 0; i < t.count; ++i) {
            const double u = static_cast<double>(lora_rng() >> 11) * 0x1.0p-53;  // [0, 1)
            p[i] = static_cast<float>((2.0 * u - 1.0) * bound);
        }
    }
    set_params(host);
}

// Host layout -> device layout: the fp32 tensors to their device offsets, the int8 ones
// quantised per row (symmetric, kernels/quantize.h).
void GPT::set_params(const std::vector<float>& host) {
    if (host.size() != table_.total_count())
        throw std::invalid_argument("set_params: expected " + std::to_string(table_.total_count()) +
                                    " floats, got " + std::to_string(host.size()));
    if (table_.layouts_equal()) {
        backend_.copy_to_device(params_.get(), host.data(), params_.bytes());
    } else {
        std::vector<float> dev(table_.device_count());
        std::vector<int8_t> q(table_.int8_count());
        std::vector<float> scales(table_.scale_count());
        for (const auto& t : table_.tensors()) {
            const float* src = host.data() + t.offset;
            if (t.storage == ParamStorage::fp32)
                std::copy(src, src + t.count,
                          dev.begin() + static_cast<ptrdiff_t>(t.device_offset));
            else
                quantize_int8_per_row(src, static_cast<int>(t.shape[0]),
                                      static_cast<int>(t.shape[1]), q.data() + t.device_offset,
                                      scales.data() + t.scale_offset);
        }
        backend_.copy_to_device(params_.get(), dev.data(), params_.bytes());
        if (!q.empty()) {
            backend_.copy_to_device(int8_weights_.get(), q.data(), q.size());
            backend_.copy_to_device(int8_scales_.get(), scales.data(), scales.size() * 4);
        }
    }
    cast_count_ = table_.device_count();
    ++params_version_;
}

std::vector<float> GPT::get_params() {
    std::vector<float> host(table_.total_count());
    if (table_.layouts_equal()) {
        backend_.copy_to_host(host.data(), params_.get(), params_.bytes());
        return host;
    }
    std::vector<float> dev(table_.device_count());
    std::vector<int8_t> q(table_.int8_count());
    std::vector<float> scales(table_.scale_count());
    backend_.copy_to_host(dev.data(), params_.get(), params_.bytes());
    if (!q.empty()) {
        backend_.copy_to_host(q.data(), int8_weights_.get(), q.size());
        backend_.copy_to_host(scales.data(), int8_scales_.get(), scales.size() * 4);
    }
    for (const auto& t : table_.tensors()) {
        float* dst = host.data() + t.offset;
        if (t.storage == ParamStorage::fp32) {
            const float* src = dev.data() + t.device_offset;
            std::copy(src, src + t.count, dst);
            continue;
        }
        const size_t cols = static_cast<size_t>(t.shape[1]);
        for (size_t i = 0; i < t.count; ++i)
            dst[i] = dequantize_int8(q[t.device_offset + i], scales[t.scale_offset + i / cols]);
    }
    return host;
}

std::vector<float> GPT::get_grads() {
    std::vector<float> host(table_.total_count(), 0.0f);
    if (table_.layouts_equal()) {
        backend_.copy_to_host(host.data(), grads_.get(), grads_.bytes());
        return host;
    }
    std::vector<float> dev(table_.trainable_count());
    backend_.copy_to_host(dev.data(), grads_.get(), grads_.bytes());
    for (const auto& t : table_.tensors())
        if (t.trainable)
            std::copy(dev.begin() + static_cast<ptrdiff_t>(t.device_offset),
                      dev.begin() + static_cast<ptrdiff_t>(t.device_offset + t.count),
                      host.begin() + static_cast<ptrdiff_t>(t.offset));
    return host;
}

namespace {
// The step indexes the N = B*T rows with int (op arguments); with N and the dimensions bounded
// (GPTConfig::validate), every size the activation plan multiplies out fits in size_t.
void check_batch_shape(const GPTConfig& config, int B, int T) {
    if (B < 1 || T < 1) throw std::invalid_argument("batch shape must be positive");
    if (T > config.max_seq_len)
        throw std::invalid_argument(
            "sequence length T=" + std::to_string(T) +
            " exceeds the model's max_seq_len=" + std::to_string(config.max_seq_len));
    if (static_cast<int64_t>(B) * T > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch B=" + std::to_string(B) + " x T=" + std::to_string(T) +
                                    " positions is more than " +
                                    std::to_string(std::numeric_limits<int>::max()) +
                                    " (the step indexes them with int); lower B or T");
}
}  // namespace

void GPT::allocate_activations(int B, int T) {
    check_batch_shape(config_, B, T);
    if (acts_ && acts_->B == B && acts_->T == T) return;
    auto acts = std::make_unique<Activations>();
    acts->plan(config_, options_, kernels(), B, T);
    backend_.reserve_attention_workspace(kernels().attention, B, T, config_.n_embd, config_.n_head);
    const size_t e = backend_.compute_elem_bytes();
    // Re-plan into the existing arenas when they are large enough (no allocation).
    if (acts_ && acts_->act.bytes() >= acts->act_elems * e &&
        acts_->f32.bytes() >= acts->f32_elems * 4 && acts_->grad.bytes() >= acts->grad_elems * e) {
        acts->act = std::move(acts_->act);
        acts->f32 = std::move(acts_->f32);
        acts->grad = std::move(acts_->grad);
    } else {
        acts_.reset();  // free first so the peak is not old + new
        acts->act = DeviceBuffer(backend_, acts->act_elems * e, MemoryCategory::activations);
        acts->f32 = DeviceBuffer(backend_, acts->f32_elems * 4, MemoryCategory::activations);
        acts->grad = DeviceBuffer(backend_, acts->grad_elems * e, MemoryCategory::activations);
    }
    if (ActivationOffload::offloaded_layers(config_.n_layer, options_.offload) > 0)
        acts->offload = std::make_unique<ActivationOffload>(
            backend_, acts->act.get(), e, acts->f32.as<float>(), acts->layer_ranges);
    acts_ = std::move(acts);
}

const void* GPT::w(ParamRef p) const {
    if (params_compute_.get()) return params_compute_.as<char>() + p.offset * 2;
    return params_.as<float>() + p.offset;
}

float* GPT::g(ParamRef p) {
    return p.trainable ? grads_.as<float>() + p.offset : nullptr;
}

const int8_t* GPT::wq(ParamRef p) const {
    return int8_weights_.as<int8_t>() + p.offset;
}
const float* GPT::wscale(ParamRef p) const {
    return int8_scales_.as<float>() + p.scale_offset;
}
void* GPT::lora_u(int l, LoraTarget target) const {
    return act(acts_->layers[static_cast<size_t>(l)].lora_u[static_cast<size_t>(target)]);
}

void* GPT::act(size_t offset) const {
    return acts_->act.as<char>() + offset * backend_.compute_elem_bytes();
}
void* GPT::grad(size_t offset) const {
    return acts_->grad.as<char>() + offset * backend_.compute_elem_bytes();
}
float* GPT::f32(size_t offset) const {
    return acts_->f32.as<float>() + offset;
}

// ---- the model's building blocks: one op each, with the block's parameter handles ----------

// out (N,C) = LN(inp) with p's weight and bias; mean/rstd (N) kept for the backward.
void GPT::layernorm(void* out, float* mean, float* rstd, const void* inp, const LayerNormParams& p,
                    int N) {
    backend_.run(op::LayerNormForward{.out = out,
                                      .mean = mean,
                                      .rstd = rstd,
                                      .inp = inp,
                                      .weight = w(p.weight),
                                      .bias = w(p.bias),
                                      .N = N,
                                      .C = config_.n_embd});
}
// dinp += dLN/dinp, p's gradients += ..., from the saved mean/rstd.
void GPT::layernorm_backward(void* dinp, const void* dout, const void* inp,
                             const LayerNormParams& p, const float* mean, const float* rstd,
                             int N) {
    backend_.run(op::LayerNormBackward{.dinp = dinp,
                                       .dweight = g(p.weight),
                                       .dbias = g(p.bias),
                                       .dout = dout,
                                       .inp = inp,
                                       .weight = w(p.weight),
                                       .mean = mean,
                                       .rstd = rstd,
                                       .N = N,
                                       .C = config_.n_embd});
}
// out (N,OC) = inp (N,C) W^T + b with p's weight (OC,C) and bias (OC); with LoRA also
// + scale (inp A^T) B^T, keeping u = inp A^T (N,rank) for the backward. An int8 weight is
// dequantised inside the matmul.
void GPT::linear(void* out, const void* inp, const LinearParams& p, int N, int C, int OC,
                 void* lora_u) {
    if (p.weight.int8)
        backend_.run(op::MatmulInt8Forward{.out = out,
                                           .inp = inp,
                                           .weight = wq(p.weight),
                                           .scale = wscale(p.weight),
                                           .bias = w(p.bias),
                                           .N = N,
                                           .C = C,
                                           .OC = OC});
    else
        backend_.run(op::MatmulForward{.out = out,
                                       .inp = inp,
                                       .weight = w(p.weight),
                                       .bias = w(p.bias),
                                       .N = N,
                                       .C = C,
                                       .OC = OC});
    if (p.lora)
        backend_.run(op::LoraForward{.out = out,
                                     .u = lora_u,
                                     .inp = inp,
                                     .A = w(p.lora->A),
                                     .B = w(p.lora->B),
                                     .N = N,
                                     .C = C,
                                     .OC = OC,
                                     .R = options_.trainable.lora.rank,
                                     .scale = options_.trainable.lora.scale()});
}
// dinp (N,C) += dout W (+ the adapter's du A); the trainable ones of p's weight and bias
// gradients += dout^T inp, sum_n dout; with LoRA dA, dB from u. A frozen weight's dW GEMM is
// not run (MatmulBackward with no dweight). dinp null: the input gradient is not needed.
void GPT::linear_backward(void* dinp, const void* dout, const void* inp, const LinearParams& p,
                          int N, int C, int OC, const void* lora_u) {
    linear_base_backward(dinp, dout, inp, p, N, C, OC);
    if (!p.lora) return;
    backend_.run(op::LoraBackward{.dinp = dinp,
                                  .dA = g(p.lora->A),
                                  .dB = g(p.lora->B),
                                  .du = grad(acts_->d_lora_u),
                                  .dout = dout,
                                  .inp = inp,
                                  .u = lora_u,
                                  .A = w(p.lora->A),
                                  .B = w(p.lora->B),
                                  .N = N,
                                  .C = C,
                                  .OC = OC,
                                  .R = options_.trainable.lora.rank,
                                  .scale = options_.trainable.lora.scale()});
}
void GPT::linear_base_backward(void* dinp, const void* dout, const void* inp, const LinearParams& p,
                               int N, int C, int OC) {
    float* dweight = g(p.weight);
    float* dbias = g(p.bias);
    if (!dinp && !dweight && !dbias) return;  // nothing below needs it
    if (p.weight.int8) {
        backend_.run(op::MatmulInt8Backward{.dinp = dinp,
                                            .dbias = dbias,
                                            .dout = dout,
                                            .weight = wq(p.weight),
                                            .scale = wscale(p.weight),
                                            .N = N,
                                            .C = C,
                                            .OC = OC});
        return;
    }
    backend_.run(op::MatmulBackward{.dinp = dinp,
                                    .dweight = dweight,
                                    .dbias = dbias,
                                    .dout = dout,
                                    .inp = inp,
                                    .weight = w(p.weight),
                                    .N = N,
                                    .C = C,
                                    .OC = OC});
}

// ---- forward --------------------------------------------------------------------------------

void GPT::forward(const int* inputs, const int* targets, int B, int T, float grad_scale) {
    // Offsets are planned for an exact (B, T); a new shape re-plans (allocating only when it
    // needs more memory than the arenas have). Call allocate_activations up front to keep
    // allocation out of the timed step.
    allocate_activations(B, T);
    last_B_ = B;
    last_T_ = T;
    inputs_ = inputs;
    targets_ = targets;
    have_targets_ = targets != nullptr;
    backward_ready_ = targets != nullptr;
    grad_scale_ = grad_scale;

    // bf16: refresh the compute copy of what changed (after set_params everything, after an
    // optimizer step the trainable prefix; a frozen base is cast once).
    if (params_compute_.get() && cast_count_ > 0)
        backend_.run(op::CastParams{
            .dst = params_compute_.get(), .src = params_.as<float>(), .n = cast_count_});
    cast_count_ = 0;

    backend_.run(op::EncoderForward{.out = act(acts_->encoded),
                                    .inp = inputs,
                                    .wte = w(P_.wte),
                                    .wpe = w(P_.wpe),
                                    .B = B,
                                    .T = T,
                                    .C = config_.n_embd});
    ActivationOffload* offload = acts_->offload.get();
    if (offload) offload->begin_forward(targets != nullptr);
    for (int l = 0; l < config_.n_layer; ++l) {
        if (offload) offload->before_forward_layer(l);
        forward_attention(l);
        forward_mlp(l);
        if (offload) offload->after_forward_layer(l);
    }
    forward_head(targets, grad_scale);
}

// residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))), then ln_2(residual2).
void GPT::forward_attention(int l) {
    const Activations& A = *acts_;
    const auto& L = A.layers[l];
    const BlockParams& p = P_.h[l];
    const int B = last_B_, T = last_T_, C = config_.n_embd, NH = config_.n_head, N = B * T;
    const bool fused_ln = kernels().layernorm == LayerNormImpl::fused_residual;
    const void* residual = l == 0 ? act(A.encoded) : act(A.layers[l - 1].residual3);
    // ln_1 of block l>0 was already produced by the previous block's fused residual+LN.
    if (!fused_ln || l == 0)
        layernorm(act(L.ln1), f32(L.ln1_mean), f32(L.ln1_rstd), residual, p.ln_1, N);
    linear(act(L.qkv), act(L.ln1), p.attn.c_attn, N, C, 3 * C, lora_u(l, LoraTarget::attn_c_attn));
    backend_.run(op::AttentionForward{.impl = kernels().attention,
                                      .out = act(L.atty),
                                      .saved = f32(L.att_saved),
                                      .qkv = act(L.qkv),
                                      .B = B,
                                      .T = T,
                                      .C = C,
                                      .NH = NH});
    linear(act(L.attproj), act(L.atty), p.attn.c_proj, N, C, C, lora_u(l, LoraTarget::attn_c_proj));
    if (fused_ln) {
        backend_.run(op::FusedResidualLayerNormForward{.residual = act(L.residual2),
                                                       .out = act(L.ln2),
                                                       .mean = f32(L.ln2_mean),
                                                       .rstd = f32(L.ln2_rstd),
                                                       .inp1 = residual,
                                                       .inp2 = act(L.attproj),
                                                       .weight = w(p.ln_2.weight),
                                                       .bias = w(p.ln_2.bias),
                                                       .N = N,
                                                       .C = C});
        return;
    }
    backend_.run(op::ResidualForward{.out = act(L.residual2),
                                     .inp1 = residual,
                                     .inp2 = act(L.attproj),
                                     .n = static_cast<size_t>(N) * C});
    layernorm(act(L.ln2), f32(L.ln2_mean), f32(L.ln2_rstd), act(L.residual2), p.ln_2, N);
}

// residual3 = residual2 + c_proj(gelu(c_fc(ln2))); with the fused residual+LN this also computes
// the next LayerNorm (ln_1 of block l+1, or ln_f after the last block).
void GPT::forward_mlp(int l) {
    const Activations& A = *acts_;
    const auto& L = A.layers[l];
    const BlockParams& p = P_.h[l];
    const int C = config_.n_embd, N = last_B_ * last_T_;
    const size_t NC = static_cast<size_t>(N) * C;
    // The GELU epilogue needs the whole pre-activation from one matmul: not with an adapter
    // adding to it, nor with an int8 weight.
    if (kernels().fuse_gelu && !p.mlp.c_fc.lora && !p.mlp.c_fc.weight.int8) {
        // c_fc with the GELU in its epilogue: fch keeps the pre-activation for the backward.
        backend_.run(op::MatmulForward{.out = act(L.fch_gelu),
                                       .inp = act(L.ln2),
                                       .weight = w(p.mlp.c_fc.weight),
                                       .bias = w(p.mlp.c_fc.bias),
                                       .N = N,
                                       .C = C,
                                       .OC = 4 * C,
                                       .epilogue = MatmulEpilogue::gelu,
                                       .pre_act = act(L.fch)});
    } else {
        linear(act(L.fch), act(L.ln2), p.mlp.c_fc, N, C, 4 * C, lora_u(l, LoraTarget::mlp_c_fc));
        backend_.run(op::GeluForward{.out = act(L.fch_gelu), .inp = act(L.fch), .n = NC * 4});
    }
    linear(act(L.fcproj), act(L.fch_gelu), p.mlp.c_proj, N, 4 * C, C,
           lora_u(l, LoraTarget::mlp_c_proj));
    if (kernels().layernorm != LayerNormImpl::fused_residual) {
        backend_.run(op::ResidualForward{
            .out = act(L.residual3), .inp1 = act(L.residual2), .inp2 = act(L.fcproj), .n = NC});
        return;
    }
    const bool last = l + 1 == config_.n_layer;
    const LayerNormParams& next = last ? P_.ln_f : P_.h[l + 1].ln_1;
    backend_.run(op::FusedResidualLayerNormForward{
        .residual = act(L.residual3),
        .out = last ? act(A.lnf) : act(A.layers[l + 1].ln1),
        .mean = last ? f32(A.lnf_mean) : f32(A.layers[l + 1].ln1_mean),
        .rstd = last ? f32(A.lnf_rstd) : f32(A.layers[l + 1].ln1_rstd),
        .inp1 = act(L.residual2),
        .inp2 = act(L.fcproj),
        .weight = w(next.weight),
        .bias = w(next.bias),
        .N = N,
        .C = C});
}

// ln_f, the LM head tied to wte (logits (N,Vp) = lnf (N,C) wte (Vp,C)^T, no bias), and with
// targets the mean cross-entropy over the first V columns.
void GPT::forward_head(const int* targets, float grad_scale) {
    const Activations& A = *acts_;
    const int C = config_.n_embd, V = config_.vocab_size, Vp = config_.padded_vocab_size();
    const int N = last_B_ * last_T_;
    if (kernels().layernorm != LayerNormImpl::fused_residual)
        layernorm(act(A.lnf), f32(A.lnf_mean), f32(A.lnf_rstd), act(A.layers.back().residual3),
                  P_.ln_f, N);
    backend_.run(op::MatmulForward{.out = act(A.logits),
                                   .inp = act(A.lnf),
                                   .weight = w(P_.wte),
                                   .bias = nullptr,
                                   .N = N,
                                   .C = C,
                                   .OC = Vp});
    if (!targets) return;
    // d(mean loss)/d(loss_i) = 1/N, times grad_scale (1/grad_accum).
    const float dloss = grad_scale / static_cast<float>(N);
    if (kernels().classifier == ClassifierImpl::fused) {
        backend_.run(op::ClassifierFused{.losses = f32(A.losses),
                                         .logits = act(A.logits),
                                         .targets = targets,
                                         .N = N,
                                         .V = V,
                                         .Vp = Vp,
                                         .dloss = dloss});
    } else {
        backend_.run(op::SoftmaxForward{
            .probs = f32(A.probs), .logits = act(A.logits), .N = N, .V = V, .Vp = Vp});
        backend_.run(op::CrossEntropyForward{.losses = f32(A.losses),
                                             .probs = f32(A.probs),
                                             .targets = targets,
                                             .N = N,
                                             .V = V,
                                             .Vp = Vp});
    }
    backend_.run(op::LossMean{.loss = f32(A.loss), .losses = f32(A.losses), .N = N});
}

float GPT::loss() {
    if (!acts_ || !have_targets_) throw std::logic_error("GPT::loss: no forward with targets yet");
    float value = 0;
    backend_.copy_to_host(&value, f32(acts_->loss), sizeof(float));
    return value;
}

const float* GPT::losses_device() const {
    return acts_ ? f32(acts_->losses) : nullptr;
}
const void* GPT::logits_device() const {
    return acts_ ? act(acts_->logits) : nullptr;
}

void GPT::zero_grad() {
    backend_.run(op::FillZero{.dst = grads_.get(), .bytes = grads_.bytes(), .what = "zero_grad"});
}

// ---- backward -------------------------------------------------------------------------------

// One range of the gradient buffer per stage of backward, in the order it finishes them:
// [0] ln_f, [1 + (L-1-l)] block l, [L+1] wte and wpe. A stage's trainable tensors are adjacent
// in the device layout (trainable tensors keep table order), so each is one range; a frozen
// stage's is empty.
std::vector<GPT::GradientRange> GPT::stage_ranges() const {
    const int L = config_.n_layer;
    std::vector<GradientRange> stages(static_cast<size_t>(L) + 2);
    std::vector<size_t> end(stages.size(), 0);
    const std::string h = "transformer.h.";
    for (const auto& t : table_.tensors()) {
        if (!t.trainable) continue;
        size_t stage = static_cast<size_t>(L) + 1;  // wte, wpe
        if (t.name.rfind("transformer.ln_f.", 0) == 0)
            stage = 0;
        else if (t.name.rfind(h, 0) == 0)
            stage = static_cast<size_t>(L - std::stoi(t.name.substr(h.size())));
        GradientRange& r = stages[stage];
        if (r.count == 0) r.offset = t.device_offset;
        r.offset = std::min(r.offset, t.device_offset);
        end[stage] = std::max(end[stage], t.device_offset + t.count);
        r.count = end[stage] - r.offset;
    }
    return stages;
}

std::vector<GPT::GradientRange> GPT::gradient_ready_order() const {
    std::vector<GradientRange> order;
    for (const GradientRange& r : stage_ranges())
        if (r.count > 0) order.push_back(r);
    return order;
}

void GPT::backward() {
    if (!acts_ || !backward_ready_)
        throw std::logic_error(
            "GPT::backward: needs a forward pass with targets first (one backward per forward)");
    const std::vector<GradientRange> ready =
        gradient_ready_ ? stage_ranges() : std::vector<GradientRange>{};
    backward_head();
    if (gradient_ready_) gradients_ready(ready[0]);
    const Activations& A = *acts_;
    const size_t e = backend_.compute_elem_bytes();
    for (int l = config_.n_layer - 1; l >= 0; --l) {
        if (A.offload) A.offload->before_backward_layer(l);
        // Blocks below the lowest one that trains (with frozen embeddings) need no gradient:
        // not computed. (With offload their hooks still run: every prefetch is waited for.)
        if (l >= lowest_trainable_layer_) {
            backend_.run(op::FillZero{.dst = grad(A.scratch),
                                      .bytes = A.scratch_elems * e,
                                      .what = "zero_activation_grads"});
            backward_mlp(l);
            backward_attention(l);
        }
        if (A.offload) A.offload->after_backward_layer(l);
        if (gradient_ready_) gradients_ready(ready[static_cast<size_t>(config_.n_layer - l)]);
    }
    if (embeddings_train_)
        backend_.run(op::EncoderBackward{.dwte = g(P_.wte),
                                         .dwpe = g(P_.wpe),
                                         .dout = grad(A.dresidual),
                                         .inp = inputs_,
                                         .B = last_B_,
                                         .T = last_T_,
                                         .C = config_.n_embd});
    if (gradient_ready_) gradients_ready(ready.back());
    // The logits buffer now holds dlogits; a second backward without a forward would be wrong.
    backward_ready_ = false;
}

// dlogits (unfused; the fused classifier wrote them in the forward), then the LM head and ln_f
// into dresidual, the gradient of the residual stream for the whole pass.
void GPT::backward_head() {
    const Activations& A = *acts_;
    const int C = config_.n_embd, V = config_.vocab_size, Vp = config_.padded_vocab_size();
    const int N = last_B_ * last_T_;
    const size_t e = backend_.compute_elem_bytes();
    if (kernels().classifier == ClassifierImpl::unfused)
        backend_.run(op::CrossEntropySoftmaxBackward{.dlogits = act(A.logits),
                                                     .probs = f32(A.probs),
                                                     .targets = targets_,
                                                     .N = N,
                                                     .V = V,
                                                     .Vp = Vp,
                                                     .dloss = grad_scale_ / static_cast<float>(N)});
    // dresidual and the per-block scratch are adjacent in the gradient arena: one zeroing.
    backend_.run(op::FillZero{.dst = grad(A.dresidual),
                              .bytes = (static_cast<size_t>(N) * C + A.scratch_elems) * e,
                              .what = "zero_activation_grads"});
    backend_.run(op::MatmulBackward{.dinp = grad(A.d_ln1),
                                    .dweight = g(P_.wte),
                                    .dbias = nullptr,
                                    .dout = act(A.logits),
                                    .inp = act(A.lnf),
                                    .weight = w(P_.wte),
                                    .N = N,
                                    .C = C,
                                    .OC = Vp});
    layernorm_backward(grad(A.dresidual), grad(A.d_ln1), act(A.layers.back().residual3), P_.ln_f,
                       f32(A.lnf_mean), f32(A.lnf_rstd), N);
}

// Through residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2)))): the branch reads
// dresidual as its output gradient (a residual add's backward is the identity) and ln_2's
// backward adds the branch's contribution into it.
void GPT::backward_mlp(int l) {
    const Activations& A = *acts_;
    const auto& L = A.layers[l];
    const BlockParams& p = P_.h[l];
    const int C = config_.n_embd, N = last_B_ * last_T_;
    const size_t NC = static_cast<size_t>(N) * C;
    if (options_.recompute != Recompute::none)
        backend_.run(op::GeluForward{.out = act(L.fch_gelu), .inp = act(L.fch), .n = NC * 4});
    linear_backward(grad(A.d_fch_gelu), grad(A.dresidual), act(L.fch_gelu), p.mlp.c_proj, N, 4 * C,
                    C, lora_u(l, LoraTarget::mlp_c_proj));
    backend_.run(op::GeluBackward{
        .dinp = grad(A.d_fch), .inp = act(L.fch), .dout = grad(A.d_fch_gelu), .n = NC * 4});
    if (options_.recompute == Recompute::layernorm_gelu)
        layernorm(act(L.ln2), f32(L.ln2_mean), f32(L.ln2_rstd), act(L.residual2), p.ln_2, N);
    linear_backward(grad(A.d_ln2), grad(A.d_fch), act(L.ln2), p.mlp.c_fc, N, C, 4 * C,
                    lora_u(l, LoraTarget::mlp_c_fc));
    layernorm_backward(grad(A.dresidual), grad(A.d_ln2), act(L.residual2), p.ln_2, f32(L.ln2_mean),
                       f32(L.ln2_rstd), N);
}

// Through residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))), the same way.
void GPT::backward_attention(int l) {
    const Activations& A = *acts_;
    const auto& L = A.layers[l];
    const BlockParams& p = P_.h[l];
    const int B = last_B_, T = last_T_, C = config_.n_embd, NH = config_.n_head, N = B * T;
    const void* residual = l == 0 ? act(A.encoded) : act(A.layers[l - 1].residual3);
    linear_backward(grad(A.d_atty), grad(A.dresidual), act(L.atty), p.attn.c_proj, N, C, C,
                    lora_u(l, LoraTarget::attn_c_proj));
    backend_.run(op::AttentionBackward{.impl = kernels().attention,
                                       .dqkv = grad(A.d_qkv),
                                       .dout = grad(A.d_atty),
                                       .qkv = act(L.qkv),
                                       .out = act(L.atty),
                                       .saved = f32(L.att_saved),
                                       .B = B,
                                       .T = T,
                                       .C = C,
                                       .NH = NH});
    if (options_.recompute == Recompute::layernorm_gelu)
        layernorm(act(L.ln1), f32(L.ln1_mean), f32(L.ln1_rstd), residual, p.ln_1, N);
    // The lowest block that trains, with frozen embeddings below it: nothing needs the
    // gradient of its input, so ln_1's backward (and c_attn's input gradient) runs only for
    // ln_1's own parameters.
    const bool below_needed = embeddings_train_ || l > lowest_trainable_layer_;
    const bool ln1_needed = below_needed || p.ln_1.weight.trainable || p.ln_1.bias.trainable;
    linear_backward(ln1_needed ? grad(A.d_ln1) : nullptr, grad(A.d_qkv), act(L.ln1), p.attn.c_attn,
                    N, C, 3 * C, lora_u(l, LoraTarget::attn_c_attn));
    if (ln1_needed)
        layernorm_backward(grad(A.dresidual), grad(A.d_ln1), residual, p.ln_1, f32(L.ln1_mean),
                           f32(L.ln1_rstd), N);
}

// ---- analytic costs -------------------------------------------------------------------------

double GPT::training_flops_per_step(int B, int T) const {
    // Model FLOPs (not hardware FLOPs), counted as llm.c counts them (gpt2_estimate_mfu), so MFU
    // compares with its figures: per token 6 N + 6 L C T, where N is every parameter (the
    // padded vocabulary rows, the position embedding, biases and LayerNorms included: small
    // terms llm.c keeps) at 6 FLOPs each (2 forward, 2 for the input gradient, 2 for the weight
    // gradient), and 6 L C T the attention score/value products (2 forward, 4 backward per
    // layer and token; causal masking not discounted). GPT-2 124M at T = 1024: N = 124,475,904,
    // llm.c's num_parameters. What backward does not run is not counted: a frozen tensor's
    // weight gradient (4 instead of 6), and the whole backward (2 instead of 6, 2 C T attention
    // instead of 6 C T) of the blocks below the lowest one that trains when the embeddings are
    // frozen (GPT::backward does not visit them). A LoRA adapter (x A^T, u B^T) is a matmul like
    // any other.
    const double C = config_.n_embd, L = config_.n_layer;
    const std::string h = "transformer.h.";
    double per_token = 0;
    for (const auto& t : table_.tensors()) {
        const bool skipped =
            t.name.rfind(h, 0) == 0 && std::stoi(t.name.substr(h.size())) < lowest_trainable_layer_;
        per_token += static_cast<double>(t.count) * (skipped ? 2.0 : t.trainable ? 6.0 : 4.0);
    }
    const double visited = L - lowest_trainable_layer_;
    per_token += 6.0 * visited * C * T + 2.0 * (L - visited) * C * T;
    return per_token * B * T;
}

MemoryEstimate GPT::estimate_memory(const GPTConfig& config, const ModelOptions& options, int B,
                                    int T, const Backend& backend) {
    MemoryEstimate m;
    ParameterTable table(config, options.trainable);  // validates the config and the options
    check_batch_shape(config, B, T);
    const size_t n = table.device_count(), trainable = table.trainable_count();
    m.params = n * 4 + (backend.precision() == Precision::bf16 ? n * 2 : 0) + table.int8_count() +
               table.scale_count() * 4;
    m.grads = trainable * 4;
    m.optimizer = trainable * 8 + 8;
    Activations plan;
    plan.plan(config, options, backend.kernel_choice(), B, T);
    m.activations = plan.bytes(backend);
    m.data = static_cast<size_t>(B) * T * 4 * 2;
    m.host_pinned = plan.offload_host_bytes(backend);
    m.data += m.host_pinned;
    return m;
}

}  // namespace mt

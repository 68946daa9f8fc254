// GPT-2 (pre-LayerNorm, as nanoGPT / llm.c) on top of the Backend interface.
//
// Memory layout. All parameters live in ONE flat fp32 buffer (grads in another of the same size),
// described by a ParameterTable of (nanoGPT name, shape, offset). Activations live in one
// activation arena sized once from (B, T) in compute precision; their gradients in a second arena
// of the same layout, zeroed before each backward.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/activation_offload.h"

namespace mt {

struct GPTConfig {
    int n_layer = 2;
    int n_head = 4;
    int n_embd = 64;
    int max_seq_len = 32;
    int vocab_size = 256;

    // Upper bounds of the dimensions, far above any real GPT (GPT-3 175B: 96 layers, 96 heads,
    // 12288 channels), chosen so that every derived size (Vp*C, 12*L*C^2, B*T*Vp, the activation
    // arena in bytes) fits comfortably in int64/size_t, and so that Vp, 3C and 4C fit in int.
    static constexpr int kMaxLayers = 1024;
    static constexpr int kMaxHeads = 1024;
    static constexpr int kMaxEmbd = 65536;
    static constexpr int kMaxSeqLen = 1 << 20;
    static constexpr int kMaxVocab = 1 << 24;
    static constexpr int64_t kMaxParams = int64_t(1) << 36;  // 68.7e9 (275 GB of fp32 weights)

    // vocab rounded up to a multiple of 128: wte has padded_vocab_size rows; the logits of the
    // padding columns are excluded from the softmax. Computed in int64: validate() bounds
    // vocab_size so the result fits in int.
    int padded_vocab_size() const {
        return static_cast<int>((static_cast<int64_t>(vocab_size) + 127) / 128 * 128);
    }
    int head_size() const { return n_embd / n_head; }
    // The number of parameters (every tensor of the ParameterTable) in int64; -1 when it would
    // overflow int64 (validate() rejects that).
    int64_t parameter_count() const;
    // Throws std::invalid_argument naming the offending field for an impossible config: a
    // dimension < 1 or above its kMax*, n_embd not divisible by n_head, or more than kMaxParams
    // parameters.
    void validate() const;
    std::string describe() const;  // "L4 C256 H4 T256 V50257"
    bool operator==(const GPTConfig&) const = default;
};

// Presets: tiny, gpt2-mini, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M. nullopt if unknown.
std::optional<GPTConfig> gpt_preset(const std::string& name);
std::vector<std::string> gpt_preset_names();

// ---- what is trained ------------------------------------------------------------------------

// The Linear layers of a block LoRA can adapt (model.lora.targets spells them so).
enum class LoraTarget { attn_c_attn, attn_c_proj, mlp_c_fc, mlp_c_proj };
template <>
struct EnumSpelling<LoraTarget> {
    static constexpr std::array<std::string_view, 4> names{"attn.c_attn", "attn.c_proj", "mlp.c_fc",
                                                           "mlp.c_proj"};
};
// How frozen Linear weights are stored (model.quantize_frozen).
enum class QuantizeFrozen { none, int8 };
template <>
struct EnumSpelling<QuantizeFrozen> {
    static constexpr std::array<std::string_view, 2> names{"none", "int8"};
};

// LoRA (Hu et al. 2021): a targeted Linear y = x W^T + b becomes
//   y = x W^T + b + (alpha/rank) (x A^T) B^T,   A (rank, in), B (out, rank),
// with W and b frozen and only A and B trained. rank 0: no adapters.
struct LoraConfig {
    int rank = 0;
    float alpha = 1.0f;
    std::vector<LoraTarget> targets{LoraTarget::attn_c_attn, LoraTarget::attn_c_proj,
                                    LoraTarget::mlp_c_fc, LoraTarget::mlp_c_proj};
    bool enabled() const { return rank > 0; }
    float scale() const { return alpha / static_cast<float>(rank); }
    bool adapts(LoraTarget t) const;
    bool operator==(const LoraConfig&) const = default;
};

// Which parameters train and how the frozen ones are stored: model.lora, optim.freeze,
// model.quantize_frozen. The default trains everything in fp32, the plain GPT-2 layout.
struct TrainableOptions {
    LoraConfig lora;
    // optim.freeze: parameter names or name prefixes, with or without "transformer." ("wte",
    // "h.0", "h.3.mlp", "ln_f", "transformer.h.1.attn.c_attn.weight"). A prefix matches at a
    // '.' boundary: "h.1" freezes h.1.* but not h.10.*.
    std::vector<std::string> freeze;
    QuantizeFrozen quantize_frozen = QuantizeFrozen::none;
    bool operator==(const TrainableOptions&) const = default;
};

// How a tensor is stored on the device.
enum class ParamStorage { fp32, int8 };

struct ParameterInfo {
    std::string name;  // nanoGPT state_dict name, e.g. "transformer.h.0.attn.c_attn.weight"
    std::vector<int64_t> shape;  // PyTorch shape; Linear weights (out_features, in_features)
    size_t offset = 0;           // element offset into the host (logical) flat vector
    size_t count = 0;            // number of elements
    bool decay = false;          // AdamW weight decay applies (2-D tensors: embeddings, Linear W)
    bool trainable = true;       // has a gradient and AdamW state
    bool lora = false;           // a LoRA adapter (lora_A / lora_B), not part of GPT-2
    ParamStorage storage = ParamStorage::fp32;
    // Where it lives on the device: the element offset into the fp32 parameter buffer (which is
    // also its offset into the gradients and AdamW's m and v when trainable), or for int8
    // storage into the int8 weight buffer; scale_offset: its per-row scales (int8 only).
    size_t device_offset = 0;
    size_t scale_offset = 0;
};

// Typed handles to the parameters: where each tensor lives in the flat buffers (its element
// offset), resolved once when the table is built, so the step never looks a name up and a
// misspelt tensor is a compile error. Field names follow the nanoGPT state_dict names
// (`h[l].attn.c_attn.weight` is "transformer.h.<l>.attn.c_attn.weight").
struct ParamRef {
    size_t offset = 0;  // ParameterInfo::device_offset
    bool trainable = true;
    bool int8 = false;
    size_t scale_offset = 0;  // int8: the offset of its per-row scales
};
struct LoraParams {
    ParamRef A, B;  // A (rank, in), B (out, rank)
};
struct LinearParams {
    ParamRef weight, bias;  // weight (OC, C), bias (OC)
    std::optional<LoraParams> lora;
};
struct LayerNormParams {
    ParamRef weight, bias;  // (C), (C)
};
struct BlockParams {
    LayerNormParams ln_1;
    struct {
        LinearParams c_attn, c_proj;  // (3C, C), (C, C)
    } attn;
    LayerNormParams ln_2;
    struct {
        LinearParams c_fc, c_proj;  // (4C, C), (C, 4C)
    } mlp;
};
struct GPTParams {
    ParamRef wte, wpe;  // (Vp, C), (max_seq_len, C); wte is also the (tied) LM head
    std::vector<BlockParams> h;
    LayerNormParams ln_f;
};

// The parameter table: every tensor of the model in a fixed order with its offset, and the
// typed handles to the same tensors.
//
// Two layouts of the same tensors. The host (logical) layout is every tensor in table order at
// full fp32 size (`offset`): what get_params/set_params exchange, what checkpoints and PyTorch
// see. The device layout (`device_offset`) puts the trainable tensors first, in table order, so
// the gradients, AdamW's m and v and every data-parallel range cover one prefix
// [0, trainable_count()) of the fp32 buffer; the frozen fp32 tensors follow; frozen Linear
// weights under model.quantize_frozen: int8 live in a separate int8 buffer with one fp32 scale
// per row. With nothing frozen the two layouts are the same.
class ParameterTable {
  public:
    explicit ParameterTable(const GPTConfig& config, const TrainableOptions& trainable = {});
    const std::vector<ParameterInfo>& tensors() const { return tensors_; }
    const GPTParams& params() const { return params_; }
    const ParameterInfo* find(const std::string& name) const;    // nullptr if absent
    const ParameterInfo& at(const std::string& name) const;      // throws if absent
    size_t total_count() const { return total_; }                // host layout, every tensor
    size_t device_count() const { return device_count_; }        // the fp32 device buffer
    size_t trainable_count() const { return trainable_count_; }  // its trainable prefix
    size_t int8_count() const { return int8_count_; }            // the int8 weight buffer
    size_t scale_count() const { return scale_count_; }          // the int8 rows' scales
    // The host layout and the device layout are the same (nothing frozen, no int8).
    bool layouts_equal() const { return device_count_ == total_ && trainable_count_ == total_; }

  private:
    ParamRef add(std::string name, std::vector<int64_t> shape, bool decay, bool lora = false);
    void place(const TrainableOptions& trainable);
    std::vector<ParameterInfo> tensors_;
    GPTParams params_;
    size_t total_ = 0, device_count_ = 0, trainable_count_ = 0, int8_count_ = 0, scale_count_ = 0;
};

// The tensors `entry` of optim.freeze names (see TrainableOptions::freeze); empty when none.
std::vector<const ParameterInfo*> match_parameters(const ParameterTable& table,
                                                   const std::string& entry);

// Activation recomputation: trade backward-pass FLOPs for activation memory.
//   gelu: the GELU outputs (N,4C) per layer are not kept; backward recomputes them from fch.
//   layernorm_gelu: additionally ln_1/ln_2 outputs (N,C) per layer are recomputed from the
//   residual stream and the saved mean/rstd.
enum class Recompute { none, gelu, layernorm_gelu };
template <>
struct EnumSpelling<Recompute> {
    static constexpr std::array<std::string_view, 3> names{"none", "gelu", "layernorm_gelu"};
};

// What the model needs to know about how to run (from RunConfig). The kernel choices are not
// here: the model reads them from its backend (Backend::kernel_choice), their one owner.
struct ModelOptions {
    Recompute recompute = Recompute::none;
    TrainableOptions trainable;  // LoRA, frozen parameters, int8 storage of the frozen base
    // run.offload activations: saved activations wait in pinned host memory between forward and
    // backward (model/activation_offload.h); the device keeps ActivationOffload::kSlots layers.
    OffloadMode offload = OffloadMode::none;
};

// Analytic memory estimate (bytes), printed before a run and reported beside the measurement.
struct MemoryEstimate {
    size_t params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, data = 0;
    // Of `data`: pinned host memory (the offload arenas), which the backend tracks under `data`
    // with the host batches but which does not occupy the device.
    size_t host_pinned = 0;
    size_t total() const { return params + grads + optimizer + activations + workspace + data; }
    size_t device_total() const { return total() - host_pinned; }
};

class GPT {
  public:
    GPT(Backend& backend, const GPTConfig& config, ModelOptions options = {});
    ~GPT();
    GPT(const GPT&) = delete;
    GPT& operator=(const GPT&) = delete;

    const GPTConfig& config() const { return config_; }
    const ParameterTable& parameter_table() const { return table_; }
    const ModelOptions& options() const { return options_; }
    Backend& backend() { return backend_; }

    // GPT-2 init from a seed: N(0, 0.02) for embeddings and Linear weights, residual projections
    // (attn.c_proj, mlp.c_proj) scaled by 1/sqrt(2 L), zero biases, unit LayerNorm weights.
    // Deterministic for a seed, independent of thread count.
    void init_weights(uint64_t seed);

    // Flat device buffers (fp32): the parameters in the device layout (device_count()
    // elements; the trainable ones first) and the gradients of the trainable prefix
    // (trainable_count() elements), which AdamW and data parallel work on.
    float* params() { return params_.as<float>(); }
    float* grads() { return grads_.as<float>(); }
    size_t trainable_count() const { return table_.trainable_count(); }
    // Host copies in the host layout (total_count() floats, ParameterInfo::offset): every
    // tensor at fp32, int8 weights dequantised by get_params and quantised by set_params;
    // get_grads holds zeros for the frozen tensors.
    void set_params(const std::vector<float>& host);
    // Counts set_params calls: an optimizer that keeps its own copy of the weights (optim.offload)
    // re-reads them when it changes.
    uint64_t params_version() const { return params_version_; }
    std::vector<float> get_params();
    std::vector<float> get_grads();

    // Sizes the activation arena for batches of (B, T) once; calling again with the same or a
    // smaller shape is free, a larger one reallocates.
    void allocate_activations(int B, int T);

    // Forward to the mean loss. inputs/targets: device int32 (B, T), T <= max_seq_len; they
    // must stay valid until backward() returns. targets may be null (logits only). With targets and
    // the fused classifier, the gradient of the loss w.r.t. the logits is written in the same pass,
    // scaled by grad_scale/(B*T) (grad_scale = 1/grad_accum for accumulation; 0 = no gradient
    // wanted). Asynchronous: loss() reads it back.
    void forward(const int* inputs, const int* targets, int B, int T, float grad_scale = 1.0f);
    // Mean loss of the last forward; synchronises with the device.
    float loss();
    // Per-position losses (B*T) of the last forward (device, fp32).
    const float* losses_device() const;
    // Logits (B, T, Vp) of the last forward, device, compute precision; only valid before
    // backward() (the fused classifier overwrites them with their gradient).
    const void* logits_device() const;

    // Zeroes the parameter gradients (start of a grad-accumulation cycle).
    void zero_grad();
    // Backpropagates the last forward; ACCUMULATES into grads(). Needs targets in forward.
    void backward();

    // Where backward finishes each parameter gradient, for data parallel (distributed/grad_sync.h):
    // ranges [offset, offset + count) of grads() in the order backward completes them: ln_f
    // (after the LM head), blocks n_layer-1 .. 0, then wte and wpe (the encoder backward adds the
    // last term of the tied wte's gradient); a stage with nothing trainable has no range.
    // Adjacent: together they cover the whole gradient buffer (trainable_count()).
    struct GradientRange {
        size_t offset = 0, count = 0;
    };
    std::vector<GradientRange> gradient_ready_order() const;
    // Called by backward() with each range of gradient_ready_order() once its kernels have been
    // issued (CPU: run), so a reduction can start while backward computes the rest. Empty: none.
    using GradientReadyHook = std::function<void(size_t offset, size_t count)>;
    void set_gradient_ready_hook(GradientReadyHook hook) { gradient_ready_ = std::move(hook); }

    // Analytic FLOPs of one training step (forward + backward) for (B, T), as llm.c counts
    // them: (6 N + 6 L C T) B T, with what backward does not run left out.
    double training_flops_per_step(int B, int T) const;
    static MemoryEstimate estimate_memory(const GPTConfig& config, const ModelOptions& options,
                                          int B, int T, const Backend& backend);

  private:
    struct Activations;
    // The forward and backward passes, block by block (gpt.cpp shows the data flow).
    void forward_attention(int l);
    void forward_mlp(int l);
    void forward_head(const int* targets, float grad_scale);
    void backward_head();
    void backward_mlp(int l);
    void backward_attention(int l);
    void layernorm(void* out, float* mean, float* rstd, const void* inp, const LayerNormParams& p,
                   int N);
    void layernorm_backward(void* dinp, const void* dout, const void* inp, const LayerNormParams& p,
                            const float* mean, const float* rstd, int N);
    void linear(void* out, const void* inp, const LinearParams& p, int N, int C, int OC,
                void* lora_u = nullptr);
    void linear_backward(void* dinp, const void* dout, const void* inp, const LinearParams& p,
                         int N, int C, int OC, const void* lora_u = nullptr);
    std::vector<GradientRange> stage_ranges() const;
    void linear_base_backward(void* dinp, const void* dout, const void* inp, const LinearParams& p,
                              int N, int C, int OC);
    const void* w(ParamRef p) const;        // compute-precision weight pointer
    float* g(ParamRef p);                   // fp32 gradient pointer; null for a frozen tensor
    const int8_t* wq(ParamRef p) const;     // int8 weight (int8 storage)
    const float* wscale(ParamRef p) const;  // its per-row scales
    // The u (N, rank) buffer of the LoRA adapter of `target` in layer l.
    void* lora_u(int l, LoraTarget target) const;
    // The run's kernel choices: the backend's (kernels.classifier, .layernorm and .matmul_gelu
    // pick the call sequence; kernels.attention the variant the attention ops name).
    const KernelChoice& kernels() const { return backend_.kernel_choice(); }
    // Pointers into the activation arenas (offsets in elements).
    void* act(size_t offset) const;   // compute precision
    void* grad(size_t offset) const;  // compute precision, the gradient scratch arena
    float* f32(size_t offset) const;  // fp32

    Backend& backend_;
    GPTConfig config_;
    ModelOptions options_;
    ParameterTable table_;
    DeviceBuffer params_;          // fp32 master weights
    DeviceBuffer params_compute_;  // bf16 copy (empty under fp32/tf32: params_ is used)
    DeviceBuffer grads_;           // the trainable prefix only
    DeviceBuffer int8_weights_;    // frozen Linear weights under quantize_frozen: int8
    DeviceBuffer int8_scales_;     // one fp32 scale per row of each
    // Backward stops after this block: the blocks below it and the embeddings are frozen, so
    // no gradient is needed there (0 when wte or wpe trains: the encoder backward runs).
    int lowest_trainable_layer_ = 0;
    bool embeddings_train_ = true;
    size_t cast_count_ = 0;  // bf16: elements of params_ the next forward casts (0: none)
    const GPTParams& P_;     // typed handles, table_.params()
    std::unique_ptr<Activations> acts_;
    int last_B_ = 0, last_T_ = 0;
    const int* inputs_ = nullptr;  // device pointers of the last forward, used by backward
    const int* targets_ = nullptr;
    bool have_targets_ = false;    // the last forward computed a loss
    bool backward_ready_ = false;  // ... and its backward has not run yet
    float grad_scale_ = 1.0f;
    uint64_t params_version_ = 0;  // bumped by set_params (optimizer offload re-reads)
    GradientReadyHook gradient_ready_;
    void gradients_ready(const GradientRange& r) {
        if (gradient_ready_ && r.count > 0) gradient_ready_(r.offset, r.count);
    }

  public:
    // Call after the optimizer changed params() so the compute copy of the trainable prefix is
    // refreshed (set_params refreshes everything).
    void mark_params_updated() { cast_count_ = std::max(cast_count_, table_.trainable_count()); }
};

}  // namespace mt

// The op table: every computation the model and the optimizer ask of a backend, declared once.
//
// An op is a struct of its typed arguments with
//   - `name`          the op's name in the table, the per-op profile and the backend-ops test;
//   - `check()`       the request checks (shapes, ranges, required buffers), identical on every
//                     backend because Backend::run calls them before any kernel sees the op;
//   - `record(e)`     its analytic cost: floating-point operations and the bytes a perfect
//                     implementation moves to/from main memory (each input read once, each
//                     output written once), `e` = bytes of one activation element in compute
//                     precision (4 fp32, 2 bf16). The profiler divides these by the measured
//                     time (achieved FLOP/s and GB/s) and compares flops/bytes with the
//                     machine's ridge point (the roofline verdict).
// and one line in MT_OPS below. A backend provides one kernel per op (a function pointer in its
// KernelTable); Backend::run(op) checks the op, opens its profiler scope and calls the kernel.
// Adding an op: its struct here (+ check/record in ops.cpp), a line in MT_OPS, a kernel in each
// backend, a case in tests/test_backend_ops.cpp (which fails for an op without one), the call.
//
// Conventions every op follows (so the model reads the same on every backend):
// - Pointers are device pointers from Backend::allocate (host pointers on the CPU backend).
// - `void*` activations are in the backend's compute precision (fp32 for fp32/tf32, bf16 for
//   bf16); so are weights (the model keeps fp32 master weights and, under bf16, a bf16 copy made
//   by CastParams). Parameter gradients, Adam state, mean/rstd, attention state, losses and every
//   scalar are fp32 (float*).
// - Shapes: N = B*T rows, C channels, OC output channels, NH heads, V vocab, Vp padded vocab.
//   Row-major, last index fastest. Linear weights are PyTorch's (OC, C) layout.
// - Every backward ACCUMULATES (+=) into the input and parameter gradients it is given, as
//   llm.c does; the model zeroes activation-gradient scratch before use (FillZero).
// - Kernels never allocate: temporary memory is reserved by the backend outside the op (see
//   Backend::reserve_attention_workspace) or passed in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/math.h"
#include "kernels/types.h"

namespace mt {

// ---- profiling ------------------------------------------------------------------------------

// What the profiler receives per op call: the op's name, its analytic cost and the
// implementation it runs.
struct OpRecord {
    OpRecord() = default;
    // What an op's record() gives: the implementation is the backend's to say.
    OpRecord(std::string_view op_name, double op_flops, double op_bytes)
        : name(op_name), flops(op_flops), bytes(op_bytes) {}
    std::string_view name;  // e.g. "matmul_forward"
    double flops = 0;       // analytic floating-point operations
    double bytes = 0;       // analytic bytes read + written from/to main memory
    // Backend::implementation(op), filled by Backend::run: "packed", "flash", "welford"...; ""
    // for an op with one implementation. A string literal, like `name`.
    std::string_view impl;
};

// Receives one record per op when per-kernel profiling is on (profile.kernels). Backend::run
// wraps every kernel call in an OpScope; a CUDA-side observer times ops with
// Backend::create_event().
class OpObserver {
  public:
    virtual ~OpObserver() = default;
    virtual void op_begin(const OpRecord& op) = 0;
    virtual void op_end(const OpRecord& op) = 0;
};

// RAII: tells the observer (if any) that an op starts and ends.
class OpScope {
  public:
    OpScope(OpObserver* obs, OpRecord rec) : obs_(obs), rec_(rec) {
        if (obs_) obs_->op_begin(rec_);
    }
    ~OpScope() {
        if (obs_) obs_->op_end(rec_);
    }
    OpScope(const OpScope&) = delete;
    OpScope& operator=(const OpScope&) = delete;

  private:
    OpObserver* obs_;
    OpRecord rec_;
};

// ---- optimizer arguments ----------------------------------------------------------------------

// One tensor of the flat parameter buffer, as AdamW sees it.
struct TensorSlice {
    size_t offset;
    size_t count;
    bool decay;  // weight decay applies
};
struct AdamWParams {
    float lr, beta1, beta2, eps, weight_decay;
    int step;  // t, 1-based, for bias correction
};
// The per-step scalars of math::adamw_update: bias corrections 1 - beta^t computed in double and
// rounded once to float, on the host, so every backend starts from bitwise-identical values.
math::AdamWScalars adamw_scalars(const AdamWParams& hp);

// Elements of fp32 state the attention forward saves for its backward:
// naive: the softmax probabilities (B,NH,T,T); flash, flash_tc and cudnn: the logsumexp
// (B,NH,T).
size_t attention_saved_elems(AttentionImpl impl, int B, int T, int NH);

namespace op {

// ---- encoder --------------------------------------------------------------------------------

// out (B,T,C) = wte[inp[b,t]] (Vp,C) + wpe[t] (maxT,C)
struct EncoderForward {
    static constexpr std::string_view name = "encoder_forward";
    void* out = nullptr;
    const int* inp = nullptr;
    const void* wte = nullptr;
    const void* wpe = nullptr;
    int B = 0, T = 0, C = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dwte[inp[b,t]] += dout[b,t];  dwpe[t] += sum_b dout[b,t]   (either may be null: frozen)
struct EncoderBackward {
    static constexpr std::string_view name = "encoder_backward";
    float* dwte = nullptr;
    float* dwpe = nullptr;
    const void* dout = nullptr;
    const int* inp = nullptr;
    int B = 0, T = 0, C = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- layernorm (eps = math::kLayerNormEps) --------------------------------------------------

// out (N,C) = (inp - mean) * rstd * weight + bias; saves mean (N), rstd (N) for the backward.
struct LayerNormForward {
    static constexpr std::string_view name = "layernorm_forward";
    void* out = nullptr;
    float* mean = nullptr;
    float* rstd = nullptr;
    const void* inp = nullptr;
    const void* weight = nullptr;
    const void* bias = nullptr;
    int N = 0, C = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dinp (N,C) += ..., dweight (C) += ..., dbias (C) += ...   (from the saved mean/rstd;
// dweight or dbias may be null: a frozen parameter)
struct LayerNormBackward {
    static constexpr std::string_view name = "layernorm_backward";
    void* dinp = nullptr;
    float* dweight = nullptr;
    float* dbias = nullptr;
    const void* dout = nullptr;
    const void* inp = nullptr;
    const void* weight = nullptr;
    const float* mean = nullptr;
    const float* rstd = nullptr;
    int N = 0, C = 0;
    void check() const;
    OpRecord record(double e) const;
};
// residual (N,C) = inp1 + inp2; out = layernorm(residual). Fuses the residual add into the
// LayerNorm's pass over the rows: saves one write and one read of the residual stream.
struct FusedResidualLayerNormForward {
    static constexpr std::string_view name = "fused_residual_layernorm_forward";
    void* residual = nullptr;
    void* out = nullptr;
    float* mean = nullptr;
    float* rstd = nullptr;
    const void* inp1 = nullptr;
    const void* inp2 = nullptr;
    const void* weight = nullptr;
    const void* bias = nullptr;
    int N = 0, C = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- matmul (PyTorch Linear) ----------------------------------------------------------------

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC)   [bias may be null]
// epilogue gelu: pre_act (N,OC) receives the pre-activation and out = gelu(pre_act), in the
// GEMM's epilogue (one write of each instead of a separate GELU pass over pre_act).
struct MatmulForward {
    static constexpr std::string_view name = "matmul_forward";
    void* out = nullptr;
    const void* inp = nullptr;
    const void* weight = nullptr;
    const void* bias = nullptr;
    int N = 0, C = 0, OC = 0;
    MatmulEpilogue epilogue = MatmulEpilogue::none;
    void* pre_act = nullptr;
    void check() const;
    OpRecord record(double e) const;  // named "matmul_gelu_forward" with the GELU epilogue
};
// dinp (N,C) += dout @ weight;  dweight (OC,C) += dout^T @ inp;  dbias (OC) += sum_n dout.
// Any of dinp, dweight, dbias may be null (not needed: a frozen weight has no gradient, so its
// dW GEMM, a third of the layer's backward FLOPs, is not run); inp is needed only for dweight.
struct MatmulBackward {
    static constexpr std::string_view name = "matmul_backward";
    void* dinp = nullptr;
    float* dweight = nullptr;
    float* dbias = nullptr;
    const void* dout = nullptr;
    const void* inp = nullptr;
    const void* weight = nullptr;
    int N = 0, C = 0, OC = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- int8 weights (model.quantize_frozen: int8) ------------------------------------------------

// A frozen Linear weight stored as int8 with one fp32 scale per output row (symmetric):
// W[o,c] = scale[o] * q[o,c], q in [-127, 127] (kernels/quantize.h). The weight is read at a
// quarter of the fp32 bytes and dequantised inside the matmul, never materialised.
// out (N,OC) = inp (N,C) @ (scale * q) (OC,C)^T + bias (OC)   [bias may be null]
struct MatmulInt8Forward {
    static constexpr std::string_view name = "matmul_int8_forward";
    void* out = nullptr;
    const void* inp = nullptr;
    const int8_t* weight = nullptr;  // q (OC,C)
    const float* scale = nullptr;    // (OC)
    const void* bias = nullptr;
    int N = 0, C = 0, OC = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dinp (N,C) += dout (N,OC) @ (scale * q) (OC,C);  dbias (OC) += sum_n dout.  The weight is
// frozen: no dweight. dinp or dbias may be null (not needed), not both.
struct MatmulInt8Backward {
    static constexpr std::string_view name = "matmul_int8_backward";
    void* dinp = nullptr;
    float* dbias = nullptr;
    const void* dout = nullptr;
    const int8_t* weight = nullptr;  // q (OC,C)
    const float* scale = nullptr;    // (OC)
    int N = 0, C = 0, OC = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- LoRA adapters (model.lora) ---------------------------------------------------------------

// The low-rank update of a frozen Linear (Hu et al. 2021), added to the output of its matmul:
//   u (N,R) = scale * inp (N,C) @ A (R,C)^T        kept for the backward (already scaled)
//   out (N,OC) += u @ B (OC,R)^T                    scale = alpha / R
// Two thin GEMMs through the rank-R bottleneck: 2NR(C + OC) flops against the base's 2NC OC.
struct LoraForward {
    static constexpr std::string_view name = "lora_forward";
    void* out = nullptr;  // (N,OC), accumulated into
    void* u = nullptr;    // (N,R), written
    const void* inp = nullptr;
    const void* A = nullptr;  // (R,C)
    const void* B = nullptr;  // (OC,R)
    int N = 0, C = 0, OC = 0, R = 0;
    float scale = 1.0f;
    void check() const;
    OpRecord record(double e) const;
};
// With u = scale inp A^T from the forward and dout = dL/dout (N,OC):
//   dB (OC,R) += dout^T u;   du (N,R) = scale * dout B   (scratch, overwritten)
//   dA (R,C) += du^T inp;    dinp (N,C) += du A          (dinp may be null: not needed)
struct LoraBackward {
    static constexpr std::string_view name = "lora_backward";
    void* dinp = nullptr;
    float* dA = nullptr;
    float* dB = nullptr;
    void* du = nullptr;  // (N,R) scratch
    const void* dout = nullptr;
    const void* inp = nullptr;
    const void* u = nullptr;
    const void* A = nullptr;
    const void* B = nullptr;
    int N = 0, C = 0, OC = 0, R = 0;
    float scale = 1.0f;
    void check() const;
    OpRecord record(double e) const;
};

// ---- attention (causal, multi-head) ---------------------------------------------------------

// out (B,T,C) = softmax(mask(Q K^T / sqrt(hs))) V per head; qkv (B,T,3C) = [Q | K | V], head h
// owns channels [h*hs, (h+1)*hs) of each, hs = C/NH. saved (attention_saved_elems, fp32).
struct AttentionForward {
    static constexpr std::string_view name = "attention_forward";
    AttentionImpl impl = AttentionImpl::naive;
    void* out = nullptr;
    float* saved = nullptr;
    const void* qkv = nullptr;
    int B = 0, T = 0, C = 0, NH = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dqkv (B,T,3C) += d/dqkv given dout (B,T,C), from qkv, out and the saved state.
struct AttentionBackward {
    static constexpr std::string_view name = "attention_backward";
    AttentionImpl impl = AttentionImpl::naive;
    void* dqkv = nullptr;
    const void* dout = nullptr;
    const void* qkv = nullptr;
    const void* out = nullptr;
    const float* saved = nullptr;
    int B = 0, T = 0, C = 0, NH = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- pointwise (n elements) -----------------------------------------------------------------

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluForward {
    static constexpr std::string_view name = "gelu_forward";
    void* out = nullptr;
    const void* inp = nullptr;
    size_t n = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dinp += dout * gelu'(inp)
struct GeluBackward {
    static constexpr std::string_view name = "gelu_backward";
    void* dinp = nullptr;
    const void* inp = nullptr;
    const void* dout = nullptr;
    size_t n = 0;
    void check() const;
    OpRecord record(double e) const;
};
// out = inp1 + inp2
struct ResidualForward {
    static constexpr std::string_view name = "residual_forward";
    void* out = nullptr;
    const void* inp1 = nullptr;
    const void* inp2 = nullptr;
    size_t n = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dinp1 += dout; dinp2 += dout
struct ResidualBackward {
    static constexpr std::string_view name = "residual_backward";
    void* dinp1 = nullptr;
    void* dinp2 = nullptr;
    const void* dout = nullptr;
    size_t n = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- classifier: softmax cross-entropy over the first V of Vp logit columns -----------------
// Targets must lie in [0, V): a kernel that can read them on the host (CPU) throws BackendError
// naming the row; the columns V..Vp-1 are padding and take no part in the softmax.

// fused: losses (N) = -log p[target]; when dloss != 0, logits (N,Vp) are overwritten in place by
// dlogits = (softmax - onehot) * dloss (zero in the padding). One pass, no probability tensor.
struct ClassifierFused {
    static constexpr std::string_view name = "classifier_fused";
    float* losses = nullptr;
    void* logits = nullptr;
    const int* targets = nullptr;
    int N = 0, V = 0, Vp = 0;
    float dloss = 0.0f;
    void check() const;
    OpRecord record(double e) const;
};
// unfused 1/3, as a framework does: probs (N,Vp, fp32) = softmax(logits[:, :V]), padding zero.
struct SoftmaxForward {
    static constexpr std::string_view name = "softmax_forward";
    float* probs = nullptr;
    const void* logits = nullptr;
    int N = 0, V = 0, Vp = 0;
    void check() const;
    OpRecord record(double e) const;
};
// unfused 2/3: losses (N) = -log probs[n, targets[n]]
struct CrossEntropyForward {
    static constexpr std::string_view name = "crossentropy_forward";
    float* losses = nullptr;
    const float* probs = nullptr;
    const int* targets = nullptr;
    int N = 0, V = 0, Vp = 0;
    void check() const;
    OpRecord record(double e) const;
};
// unfused 3/3: dlogits (N,Vp) = (probs - onehot) * dloss (overwrites; zero in the padding)
struct CrossEntropySoftmaxBackward {
    static constexpr std::string_view name = "crossentropy_softmax_backward";
    void* dlogits = nullptr;
    const float* probs = nullptr;
    const int* targets = nullptr;
    int N = 0, V = 0, Vp = 0;
    float dloss = 0.0f;
    void check() const;
    OpRecord record(double e) const;
};
// loss[0] = (1/N) sum_n losses[n], on the device (fixed-order sum: deterministic).
struct LossMean {
    static constexpr std::string_view name = "loss_mean";
    float* loss = nullptr;
    const float* losses = nullptr;
    int N = 0;
    void check() const;
    OpRecord record(double e) const;
};

// ---- optimizer ------------------------------------------------------------------------------

// Gradient clipping without a host round trip: norm_sq[0] = sum_i grads[i]^2 (fixed-order sum)
// and clip_scale[0] = min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6)), both on the device; AdamW
// reads the scale.
struct GlobalNormClip {
    static constexpr std::string_view name = "global_norm";
    float* norm_sq = nullptr;
    float* clip_scale = nullptr;
    const float* grads = nullptr;
    size_t n = 0;
    float max_norm = 0.0f;
    void check() const;
    OpRecord record(double e) const;
};
// One AdamW step over the tensors of the flat buffers [0, total) (kernels/math.h adamw_update):
//   g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd_i * p )
// grad_scale is read on the device from `grad_scale` (GlobalNormClip's clip_scale), or 1 when
// null. The per-step scalars (lr, the bias corrections) come from `hp` through adamw_scalars, or,
// when `scalars` is set, from that device address: adamw_scalars(hp) of the step that runs,
// copied there by the caller before the kernels run (run.cuda_graph: a replayed graph's kernel
// arguments are frozen at capture, so a by-value lr would stay the captured step's forever).
// The three implementations give bitwise-identical results:
//   unfused (a pass per term per tensor), multi_tensor (one pass per tensor), fused (one pass
//   over the flat buffer).
struct AdamWUpdate {
    static constexpr std::string_view name = "adamw";
    AdamWImpl impl = AdamWImpl::fused;
    float* params = nullptr;
    const float* grads = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    std::span<const TensorSlice> tensors{};  // sorted by offset, disjoint, inside [0, total)
    size_t total = 0;
    AdamWParams hp{};
    const float* grad_scale = nullptr;
    const math::AdamWScalars* scalars = nullptr;  // device; null: adamw_scalars(hp)
    void check() const;
    OpRecord record(double e) const;  // named "adamw_<impl>"
};

// ---- precision and memory -------------------------------------------------------------------

// dst (n, compute precision) <- src (n, fp32): the bf16 weight copy; a plain copy under fp32.
struct CastParams {
    static constexpr std::string_view name = "cast_params";
    void* dst = nullptr;
    const float* src = nullptr;
    size_t n = 0;
    void check() const;
    OpRecord record(double e) const;
};
// dst[0, bytes) = 0. `what` names the buffer in the profile ("zero_grad", ...).
struct FillZero {
    static constexpr std::string_view name = "fill_zero";
    void* dst = nullptr;
    size_t bytes = 0;
    std::string_view what = "fill_zero";
    void check() const;
    OpRecord record(double e) const;  // named `what`
};

}  // namespace op

// ---- the table ------------------------------------------------------------------------------

// X(table_name, OpStruct): every op, in the order of this file.
#define MT_OPS(X)                                                      \
    X(encoder_forward, EncoderForward)                                 \
    X(encoder_backward, EncoderBackward)                               \
    X(layernorm_forward, LayerNormForward)                             \
    X(layernorm_backward, LayerNormBackward)                           \
    X(fused_residual_layernorm_forward, FusedResidualLayerNormForward) \
    X(matmul_forward, MatmulForward)                                   \
    X(matmul_backward, MatmulBackward)                                 \
    X(matmul_int8_forward, MatmulInt8Forward)                          \
    X(matmul_int8_backward, MatmulInt8Backward)                        \
    X(lora_forward, LoraForward)                                       \
    X(lora_backward, LoraBackward)                                     \
    X(attention_forward, AttentionForward)                             \
    X(attention_backward, AttentionBackward)                           \
    X(gelu_forward, GeluForward)                                       \
    X(gelu_backward, GeluBackward)                                     \
    X(residual_forward, ResidualForward)                               \
    X(residual_backward, ResidualBackward)                             \
    X(classifier_fused, ClassifierFused)                               \
    X(softmax_forward, SoftmaxForward)                                 \
    X(crossentropy_forward, CrossEntropyForward)                       \
    X(crossentropy_softmax_backward, CrossEntropySoftmaxBackward)      \
    X(loss_mean, LossMean)                                             \
    X(global_norm, GlobalNormClip)                                     \
    X(adamw, AdamWUpdate)                                              \
    X(cast_params, CastParams)                                         \
    X(fill_zero, FillZero)

class Backend;

// One kernel per op: what a backend fills in. A null entry means "this backend has no kernel
// for the op"; Backend::run then throws BackendError naming the op and the backend.
struct KernelTable {
#define MT_KERNEL_ENTRY(table_name, Op) void (*table_name)(Backend&, const op::Op&) = nullptr;
    MT_OPS(MT_KERNEL_ENTRY)
#undef MT_KERNEL_ENTRY
};

// KernelSlot<Op>::entry: the KernelTable member that holds Op's kernel.
template <class Op>
struct KernelSlot;
#define MT_KERNEL_SLOT(table_name, Op)                          \
    template <>                                                 \
    struct KernelSlot<op::Op> {                                 \
        static constexpr auto entry = &KernelTable::table_name; \
    };
MT_OPS(MT_KERNEL_SLOT)
#undef MT_KERNEL_SLOT

// Every op's table name, in table order (the backend-ops test walks it).
inline constexpr std::string_view kOpNames[] = {
#define MT_OP_NAME(table_name, Op) op::Op::name,
    MT_OPS(MT_OP_NAME)
#undef MT_OP_NAME
};

}  // namespace mt

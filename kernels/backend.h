// The Backend interface: everything the model, the optimizer policy and the harness may ask of a
// compute device. Two implementations: kernels/cpu (Eigen + OpenMP, fp32) and kernels/cuda
// (CUDA kernels + cuBLAS/cuBLASLt). Nothing above this header knows which one it talks to.
//
// Conventions every op follows (so the model reads the same on every backend):
// - Pointers are device pointers from Backend::allocate (host pointers on the CPU backend).
// - `act` pointers (void*) hold activations in the backend's *compute precision*: fp32 for
//   fp32/tf32, bf16 for bf16. Weights passed to ops are also in compute precision (the model
//   keeps fp32 master weights and, under bf16, a bf16 copy made by cast_params). Gradients of
//   parameters, Adam state, mean/rstd, losses and every scalar are always fp32 (float*).
// - Shapes: N = B*T rows, C channels, OC output channels, NH heads, V vocab, Vp padded vocab.
//   Row-major, last index fastest. Linear weights are PyTorch's (OC, C) layout.
// - Every backward ACCUMULATES (+=) into the input gradients and the parameter gradients it is
//   given, as llm.c does. The model zeroes its activation-gradient scratch before each use
//   and zeroes parameter grads only at the start of a grad-accumulation cycle.
// - Ops never allocate. Temporary memory comes from a workspace the caller passes (see
//   *_workspace_bytes) or that the backend reserved at construction (category `workspace`).
// - Ops are asynchronous on the CUDA backend (enqueued on the compute stream) and synchronous on
//   the CPU backend. synchronize() waits for all enqueued work.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/enum_names.h"

namespace mt {

// ---- enums shared by config, backend and reports --------------------------------------------

enum class BackendKind { cpu, cuda };
enum class Precision { fp32, tf32, bf16 };
enum class AttentionImpl { naive, flash, cudnn };
enum class ClassifierImpl { unfused, fused };
enum class AdamWImpl { unfused, multi_tensor, fused };
enum class LayerNormImpl { separate, fused_residual };  // fused_residual: residual add + LN
enum class MatmulEpilogue { none, gelu };               // gelu: out = gelu(x W^T + b)

// Every allocation is tagged with one of these; current and peak bytes are tracked per category.
enum class MemoryCategory : int { params, grads, optimizer, activations, workspace, data };
inline constexpr int kMemoryCategoryCount = 6;

// Spellings (kernels/enum_names.h), as the YAML file, the reports and results.json write them.
template <>
struct EnumSpelling<BackendKind> {
    static constexpr std::array<std::string_view, 2> names{"cpu", "cuda"};
};
template <>
struct EnumSpelling<Precision> {
    static constexpr std::array<std::string_view, 3> names{"fp32", "tf32", "bf16"};
};
template <>
struct EnumSpelling<AttentionImpl> {
    static constexpr std::array<std::string_view, 3> names{"naive", "flash", "cudnn"};
};
template <>
struct EnumSpelling<ClassifierImpl> {
    static constexpr std::array<std::string_view, 2> names{"unfused", "fused"};
};
template <>
struct EnumSpelling<AdamWImpl> {
    static constexpr std::array<std::string_view, 3> names{"unfused", "multi_tensor", "fused"};
};
template <>
struct EnumSpelling<LayerNormImpl> {
    static constexpr std::array<std::string_view, 2> names{"separate", "fused_residual"};
};
template <>
struct EnumSpelling<MemoryCategory> {
    static constexpr std::array<std::string_view, kMemoryCategoryCount> names{
        "params", "grads", "optimizer", "activations", "workspace", "data"};
};
// to_string(e): the spelling as a C string (every spelling is a literal, so NUL-terminated).
template <class E>
requires requires {
    EnumSpelling<E>::names;
}
const char* to_string(E e) {
    return enum_name(e).data();
}

// Which implementation each op family uses (the YAML `kernels:` section).
struct KernelChoice {
    AttentionImpl attention = AttentionImpl::naive;
    ClassifierImpl classifier = ClassifierImpl::fused;
    LayerNormImpl layernorm = LayerNormImpl::separate;
    bool fuse_gelu = false;  // matmul with the GELU epilogue for c_fc
};

struct BackendOptions {
    Precision precision = Precision::fp32;
    KernelChoice kernels;
    int num_threads = 0;   // CPU: OpenMP threads (0 = OpenMP's default)
    int device_index = 0;  // CUDA device
};

// ---- errors ---------------------------------------------------------------------------------

// Thrown by a backend for an impossible request (bad shape, unsupported precision...).
struct BackendError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// Thrown by allocate() when a category cannot get its bytes; the message names the category,
// the bytes asked, what is free and total, so the user knows what to shrink.
struct OutOfMemoryError : BackendError {
    using BackendError::BackendError;
};

// ---- memory accounting ----------------------------------------------------------------------

struct MemoryStats {
    std::array<size_t, kMemoryCategoryCount> current{};  // bytes live now, per category
    std::array<size_t, kMemoryCategoryCount> peak{};     // high-water mark since reset_peaks
    size_t current_total = 0;
    size_t peak_total = 0;  // peak of the sum (not the sum of peaks)
};

// Device-level truth where the device offers it (cudaMemGetInfo); CPU: RSS of the process.
struct DeviceMemoryInfo {
    bool available = false;
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    size_t used_bytes = 0;  // total - free on CUDA, current RSS on CPU
};

// ---- timing ---------------------------------------------------------------------------------

// A point in the backend's work stream. CPU: the steady_clock time when record() ran (ops are
// synchronous). CUDA: a cudaEvent recorded on the compute stream. elapsed_ms is only valid after
// the work up to both events is complete (after Backend::synchronize()).
class TimingEvent {
  public:
    virtual ~TimingEvent() = default;
    virtual void record() = 0;
    virtual double elapsed_ms_since(const TimingEvent& start) const = 0;
};

class Backend;

// Receives one record per op when per-kernel profiling is on (profile.kernels). The model wraps
// every backend op call in an OpScope; flops and bytes are the analytic costs from
// kernels/op_costs.h. A CUDA-side observer times ops with Backend::create_event().
struct OpRecord {
    std::string_view name;  // e.g. "matmul_forward"
    double flops = 0;       // analytic floating-point operations
    double bytes = 0;       // analytic bytes read + written from/to main memory
};
class OpObserver {
  public:
    virtual ~OpObserver() = default;
    virtual void op_begin(const OpRecord& op) = 0;
    virtual void op_end(const OpRecord& op) = 0;
};

// RAII: tells the observer (if any) that an op starts and ends. Used by the model around each
// backend call, so op granularity matches what a user reads in the profile.
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

// ---- the interface --------------------------------------------------------------------------

class Backend {
  public:
    virtual ~Backend() = default;

    // -- identity --
    virtual BackendKind kind() const = 0;
    virtual std::string device_name() const = 0;  // "CPU: <model name> (2 threads)", "NVIDIA H200"
    const BackendOptions& options() const { return options_; }
    Precision precision() const { return options_.precision; }
    // Bytes of one activation / weight-copy element in compute precision (4 or 2).
    size_t compute_elem_bytes() const { return options_.precision == Precision::bf16 ? 2 : 4; }

    // -- memory --
    // Allocates `bytes` (256-byte aligned) tagged with `category`. Throws OutOfMemoryError.
    virtual void* allocate(size_t bytes, MemoryCategory category) = 0;
    virtual void deallocate(void* ptr) = 0;
    // Host memory for batches: pinned (page-locked) on CUDA when `pinned`, plain otherwise.
    // Tracked under `data`.
    virtual void* allocate_host(size_t bytes, bool pinned) = 0;
    virtual void deallocate_host(void* ptr) = 0;
    MemoryStats memory_stats() const { return stats_; }
    void reset_peaks();
    virtual DeviceMemoryInfo device_memory_info() const = 0;

    // -- data movement & synchronisation --
    virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;  // h2d, ordered
                                                                                // before later ops
    virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;    // blocking d2h
    virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;     // d2d
    virtual void memset_zero(void* dst, size_t bytes) = 0;
    virtual void synchronize() = 0;
    virtual std::unique_ptr<TimingEvent> create_event() = 0;
    // Named ranges for profilers (NVTX on CUDA; no-op on CPU).
    virtual void range_push(const char* name) { (void)name; }
    virtual void range_pop() {}

    // -- precision --
    // dst (n, compute precision) <- src (n, fp32). A plain copy under fp32/tf32.
    virtual void cast_params(void* dst, const float* src, size_t n) = 0;

    // -- encoder --
    // out (B,T,C) = wte[inp[b,t]] + wpe[t]
    virtual void encoder_forward(void* out, const int* inp, const void* wte, const void* wpe, int B,
                                 int T, int C) = 0;
    // dwte[inp[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t]
    virtual void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* inp, int B,
                                  int T, int C) = 0;

    // -- layernorm (eps 1e-5) --
    // out (N,C) = (inp - mean) * rstd * weight + bias; stores mean (N), rstd (N) for backward.
    virtual void layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                                   const void* weight, const void* bias, int N, int C) = 0;
    // dinp += ..., dweight += ..., dbias += ...
    virtual void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                                    const void* inp, const void* weight, const float* mean,
                                    const float* rstd, int N, int C) = 0;
    // residual (N,C) = inp1 + inp2; out = layernorm(residual). Saves one read of the residual.
    virtual void fused_residual_layernorm_forward(void* residual, void* out, float* mean,
                                                  float* rstd, const void* inp1, const void* inp2,
                                                  const void* weight, const void* bias, int N,
                                                  int C) = 0;

    // -- matmul (PyTorch Linear) --
    // out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC) [bias may be null].
    // epilogue gelu: pre_act (N,OC) receives the pre-activation and out = gelu(pre_act).
    virtual void matmul_forward(void* out, const void* inp, const void* weight, const void* bias,
                                int N, int C, int OC,
                                MatmulEpilogue epilogue = MatmulEpilogue::none,
                                void* pre_act = nullptr) = 0;
    // dinp (N,C) += dout @ weight; dweight (OC,C) += dout^T @ inp; dbias (OC) += sum_n dout.
    // dinp / dbias may be null (not needed).
    virtual void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                                 const void* inp, const void* weight, int N, int C, int OC) = 0;

    // -- attention (causal, multi-head) --
    // Elements of per-layer state the forward saves for the backward, for this backend's
    // attention implementation (naive: softmax probs (B,NH,T,T); flash: logsumexp (B,NH,T)).
    virtual size_t attention_saved_elems(int B, int T, int C, int NH) const = 0;
    // out (B,T,C) = softmax(mask(Q K^T / sqrt(hs))) V per head, qkv (B,T,3C) = [Q|K|V].
    // saved (attention_saved_elems, fp32).
    virtual void attention_forward(void* out, float* saved, const void* qkv, int B, int T, int C,
                                   int NH) = 0;
    // dqkv (B,T,3C) += d/dqkv given dout (B,T,C).
    virtual void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                    const float* saved, int B, int T, int C, int NH) = 0;

    // -- pointwise --
    // out = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))    (n elements)
    virtual void gelu_forward(void* out, const void* inp, size_t n) = 0;
    // dinp += dout * gelu'(inp)
    virtual void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) = 0;
    // out = inp1 + inp2
    virtual void residual_forward(void* out, const void* inp1, const void* inp2, size_t n) = 0;
    // dinp1 += dout; dinp2 += dout
    virtual void residual_backward(void* dinp1, void* dinp2, const void* dout, size_t n) = 0;

    // -- classifier: softmax cross-entropy over the first V of Vp logit columns --
    // fused: logits (N,Vp) are overwritten in place by dlogits = (softmax - onehot) * dloss
    // (zero in the padded columns), losses (N) receive -log p[target]. One pass, no prob tensor.
    // When dloss == 0 (no backward wanted) the logits are left untouched.
    virtual void classifier_fused(float* losses, void* logits, const int* targets, int N, int V,
                                  int Vp, float dloss) = 0;
    // unfused, three ops as a framework would: probs (N,Vp, fp32) = softmax(logits[:, :V]);
    virtual void softmax_forward(float* probs, const void* logits, int N, int V, int Vp) = 0;
    // losses (N) = -log probs[n, targets[n]]
    virtual void crossentropy_forward(float* losses, const float* probs, const int* targets, int N,
                                      int Vp) = 0;
    // dlogits (N,Vp) = (probs - onehot) * dloss  (overwrites; zero in padded columns)
    virtual void crossentropy_softmax_backward(void* dlogits, const float* probs,
                                               const int* targets, int N, int V, int Vp,
                                               float dloss) = 0;

    // -- reductions --
    // out[0] = sum_i inp[i] * scale    (fp32, on the device)
    virtual void sum_scaled(float* out, const float* inp, size_t n, float scale) = 0;
    // out[0] = sum_i g[i]^2 over the flat gradient buffer (fp32, on the device)
    virtual void global_norm_squared(float* out, const float* grads, size_t n) = 0;

    // -- optimizer --
    // One AdamW step over a set of tensors living in the flat buffers. Tensors are described
    // by (offset, count, apply_weight_decay). The update (kernels/math.h adamw_update):
    //   g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    //   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd_i * p )
    // grad_scale folds in the clip factor (computed on device by the caller as
    // min(1, max_norm / (norm + 1e-6)) read from `grad_scale_device`, or 1 when null).
    // All three AdamWImpl give bitwise-identical results.
    struct TensorSlice {
        size_t offset;
        size_t count;
        bool decay;
    };
    struct AdamWParams {
        float lr, beta1, beta2, eps, weight_decay;
        int step;  // t, 1-based, for bias correction
    };
    virtual void adamw_update(AdamWImpl impl, float* params, const float* grads, float* m, float* v,
                              std::span<const TensorSlice> tensors, size_t total,
                              const AdamWParams& hp, const float* grad_scale_device) = 0;
    // scale_out[0] = min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6)) on the device.
    virtual void clip_scale(float* scale_out, const float* norm_sq, float max_norm) = 0;

  protected:
    explicit Backend(BackendOptions options) : options_(options) {}
    // Allocator accounting helpers for implementations.
    void account_alloc(MemoryCategory c, size_t bytes);
    void account_free(MemoryCategory c, size_t bytes);

    BackendOptions options_;
    MemoryStats stats_;
};

// Creates a backend. Throws BackendError when `kind` is unavailable (cuda without a device or
// without CUDA support in this build) with a message saying why.
std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options = {});
// True when this build has the CUDA backend and a device answers.
bool cuda_available(std::string* why_not = nullptr);

// ---- RAII buffers ---------------------------------------------------------------------------

// Move-only ownership of one allocation made by a backend: device memory (kHost = false,
// released with deallocate) or host memory (kHost = true, released with deallocate_host).
template <bool kHost>
class BackendBuffer {
  public:
    BackendBuffer() = default;
    ~BackendBuffer() { reset(); }
    BackendBuffer(BackendBuffer&& o) noexcept { *this = std::move(o); }
    BackendBuffer& operator=(BackendBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            backend_ = o.backend_;
            bytes_ = o.bytes_;
            ptr_ = o.ptr_;
            o.ptr_ = nullptr;
            o.bytes_ = 0;
        }
        return *this;
    }
    BackendBuffer(const BackendBuffer&) = delete;
    BackendBuffer& operator=(const BackendBuffer&) = delete;

    void reset() {
        if (ptr_) {
            if constexpr (kHost)
                backend_->deallocate_host(ptr_);
            else
                backend_->deallocate(ptr_);
        }
        ptr_ = nullptr;
        bytes_ = 0;
    }
    void* get() const { return ptr_; }
    template <class T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }
    size_t bytes() const { return bytes_; }

  protected:
    BackendBuffer(Backend* backend, size_t bytes, void* ptr)
        : backend_(backend), bytes_(bytes), ptr_(ptr) {}

  private:
    Backend* backend_ = nullptr;
    size_t bytes_ = 0;
    void* ptr_ = nullptr;
};

// A device allocation tagged with its memory category.
class DeviceBuffer : public BackendBuffer<false> {
  public:
    DeviceBuffer() = default;
    DeviceBuffer(Backend& backend, size_t bytes, MemoryCategory category)
        : BackendBuffer(&backend, bytes, bytes ? backend.allocate(bytes, category) : nullptr) {}
};

// A host allocation (pinned on CUDA when asked), tracked under `data`.
class HostBuffer : public BackendBuffer<true> {
  public:
    HostBuffer() = default;
    HostBuffer(Backend& backend, size_t bytes, bool pinned)
        : BackendBuffer(&backend, bytes, backend.allocate_host(bytes, pinned)) {}
};

}  // namespace mt

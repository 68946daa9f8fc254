// The CUDA backend: device query, memory (category-tagged cudaMalloc), a compute stream and a
// copy stream, cudaEvent timing, NVTX ranges, and every op routed to its kernel launcher.
//
// Workspace policy (ops never allocate):
//  - reserved at construction: the cuBLASLt workspace (also given to classic cuBLAS; both run
//    on the compute stream, so they never use it concurrently) and the partial-sum buffer of
//    the two-stage reductions;
//  - the attention workspace grows in attention_saved_elems(B,T,C,NH), which the model calls
//    when it plans its activations (GPT::allocate_activations), i.e. outside any op. An
//    attention op called with a shape larger than what was reserved throws BackendError
//    instead of allocating. reserve_attention_workspace() does the same explicitly.
//
// h2d: from pinned memory the copy runs on the copy stream. The copy stream first waits for
// the work already enqueued on the compute stream (the destination may still be read by it),
// and the compute stream waits for the copy (an event) before anything enqueued later. The
// host returns at once, so the copy overlaps host-side work such as preparing the next batch.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/adamw_common.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/matmul.cuh"

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define MT_HAVE_NVTX 1
#endif

namespace mt {

bool cuda_device_available(std::string* why_not) {
    int count = 0;
    const cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess) {
        if (why_not)
            *why_not = std::string("no usable CUDA device: ") + cudaGetErrorString(st) + " (" +
                       cudaGetErrorName(st) + ")";
        cudaGetLastError();  // clear
        return false;
    }
    if (count == 0) {
        if (why_not) *why_not = "no usable CUDA device: the runtime reports 0 devices";
        return false;
    }
    return true;
}

namespace {

using cuda::DType;

class CudaTimingEvent final : public TimingEvent {
  public:
    explicit CudaTimingEvent(cudaStream_t s) : ev_(true), stream_(s) {}
    void record() override { CUDA_CHECK(cudaEventRecord(ev_.get(), stream_)); }
    double elapsed_ms_since(const TimingEvent& start) const override {
        const auto* s = dynamic_cast<const CudaTimingEvent*>(&start);
        if (!s) throw BackendError("elapsed_ms_since: the start event is not a CUDA event");
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, s->ev_.get(), ev_.get()));
        return ms;
    }

  private:
    cuda::CudaEvent ev_;
    cudaStream_t stream_;
};

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const BackendOptions& opt) : Backend(opt) {
        std::string why;
        if (!cuda_device_available(&why)) throw BackendError("backend 'cuda': " + why);
        int count = 0;
        CUDA_CHECK(cudaGetDeviceCount(&count));
        if (opt.device_index < 0 || opt.device_index >= count)
            throw BackendError("backend 'cuda': device_index " + std::to_string(opt.device_index) +
                               " does not exist (this machine has " + std::to_string(count) +
                               " device(s))");
        if (opt.kernels.attention == AttentionImpl::cudnn)
            throw BackendError(
                "kernels.attention: cudnn is not available in this build (the cuDNN variant is "
                "not implemented yet); use naive or flash");
        device_ = opt.device_index;
        CUDA_CHECK(cudaSetDevice(device_));
        CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
        if (opt.precision == Precision::bf16 && prop_.major < 8)
            throw BackendError(std::string("run.precision: bf16 needs compute capability 8.0+; ") +
                               prop_.name + " is " + std::to_string(prop_.major) + "." +
                               std::to_string(prop_.minor));
        compute_ = std::make_unique<cuda::CudaStream>();
        copy_ = std::make_unique<cuda::CudaStream>();
        copy_done_ = std::make_unique<cuda::CudaEvent>(false);
        compute_mark_ = std::make_unique<cuda::CudaEvent>(false);
        blas_ = std::make_unique<cuda::CublasHandle>();
        lt_ = std::make_unique<cuda::CublasLtHandle>();
        lt_ws_bytes_ = 32u << 20;  // 32 MiB: what cuBLAS recommends for Hopper
        lt_ws_ = allocate(lt_ws_bytes_, MemoryCategory::workspace);
        partials_ = static_cast<float*>(
            allocate(cuda::kReducePartials * sizeof(float), MemoryCategory::workspace));
        CUBLAS_CHECK(cublasSetStream(blas_->get(), stream()));
        CUBLAS_CHECK(cublasSetWorkspace(blas_->get(), lt_ws_, lt_ws_bytes_));
        CUBLAS_CHECK(cublasSetMathMode(blas_->get(), opt.precision == Precision::tf32
                                                         ? CUBLAS_TF32_TENSOR_OP_MATH
                                                         : CUBLAS_DEFAULT_MATH));
        ctx_.blas = blas_->get();
        ctx_.lt = lt_->get();
        ctx_.lt_workspace = lt_ws_;
        ctx_.lt_workspace_bytes = lt_ws_bytes_;
        ctx_.precision = opt.precision;
    }

    ~CudaBackend() override {
        cudaStreamSynchronize(stream());
        cudaStreamSynchronize(copy_->get());
        for (auto& [p, a] : device_allocs_) cudaFree(p);
        for (auto& [p, h] : host_allocs_) {
            if (h.pinned)
                cudaFreeHost(p);
            else
                std::free(p);
        }
    }

    // ---- identity ----
    BackendKind kind() const override { return BackendKind::cuda; }
    std::string device_name() const override { return prop_.name; }
    cudaStream_t stream() const { return compute_->get(); }
    DType dt() const { return cuda::dtype_of(options_.precision); }

    // ---- memory ----
    void* allocate(size_t bytes, MemoryCategory category) override {
        if (bytes == 0) return nullptr;
        void* p = nullptr;
        const cudaError_t st = cudaMalloc(&p, bytes);  // 256-byte aligned
        if (st == cudaErrorMemoryAllocation) {
            cudaGetLastError();  // not sticky; clear it
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            std::array<size_t, 6> tracked{};
            for (int i = 0; i < kMemoryCategoryCount; ++i) tracked[i] = stats_.current[i];
            throw OutOfMemoryError(
                format_out_of_memory(to_string(category), bytes, free_b, total_b, tracked));
        }
        if (st != cudaSuccess) cuda::throw_cuda_error(st, "cudaMalloc", __FILE__, __LINE__);
        std::lock_guard<std::mutex> lock(alloc_mutex_);
        device_allocs_[p] = {bytes, category};
        account_alloc(category, bytes);
        return p;
    }
    void deallocate(void* ptr) override {
        if (!ptr) return;
        std::lock_guard<std::mutex> lock(alloc_mutex_);
        auto it = device_allocs_.find(ptr);
        if (it == device_allocs_.end())
            throw BackendError("deallocate: pointer was not allocated by this CUDA backend");
        // cudaFree synchronises the device, so no enqueued kernel still uses the memory.
        CUDA_CHECK(cudaFree(ptr));
        account_free(it->second.category, it->second.bytes);
        device_allocs_.erase(it);
    }
    void* allocate_host(size_t bytes, bool pinned) override {
        void* p = nullptr;
        const size_t rounded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
        if (pinned) {
            CUDA_CHECK(cudaMallocHost(&p, rounded));
        } else {
            p = std::aligned_alloc(256, rounded);
            if (!p)
                throw OutOfMemoryError("allocate_host: could not allocate " + format_mib(bytes) +
                                       " of host memory (category 'data')");
        }
        std::lock_guard<std::mutex> lock(alloc_mutex_);
        host_allocs_[p] = {rounded, pinned};
        account_alloc(MemoryCategory::data, rounded);
        return p;
    }
    void deallocate_host(void* ptr) override {
        if (!ptr) return;
        HostAlloc h;
        {
            std::lock_guard<std::mutex> lock(alloc_mutex_);
            auto it = host_allocs_.find(ptr);
            if (it == host_allocs_.end())
                throw BackendError("deallocate_host: pointer was not allocated by this backend");
            h = it->second;
            host_allocs_.erase(it);
            account_free(MemoryCategory::data, h.bytes);
        }
        if (h.pinned) {
            CUDA_CHECK(cudaFreeHost(ptr));
        } else {
            std::free(ptr);
        }
    }
    DeviceMemoryInfo device_memory_info() const override {
        DeviceMemoryInfo info;
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return info;
        }
        info.available = true;
        info.free_bytes = free_b;
        info.total_bytes = total_b;
        info.used_bytes = total_b - free_b;
        return info;
    }

    // ---- data movement ----
    bool is_pinned(const void* p, size_t bytes) {
        std::lock_guard<std::mutex> lock(alloc_mutex_);
        auto it = host_allocs_.upper_bound(const_cast<void*>(p));
        if (it == host_allocs_.begin()) return false;
        --it;
        const char* base = static_cast<const char*>(it->first);
        const char* q = static_cast<const char*>(p);
        return it->second.pinned && q >= base && q + bytes <= base + it->second.bytes;
    }
    void copy_to_device(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        if (is_pinned(src, bytes)) {
            CUDA_CHECK(cudaEventRecord(compute_mark_->get(), stream()));
            CUDA_CHECK(cudaStreamWaitEvent(copy_->get(), compute_mark_->get(), 0));
            CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_->get()));
            CUDA_CHECK(cudaEventRecord(copy_done_->get(), copy_->get()));
            CUDA_CHECK(cudaStreamWaitEvent(stream(), copy_done_->get(), 0));
        } else {
            // Pageable: the runtime stages the data before returning, so src may be reused.
            CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()));
        }
    }
    void copy_to_host(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0) return;
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()));
        CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    void copy_device(void* dst, const void* src, size_t bytes) override {
        if (bytes == 0 || dst == src) return;
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
    }
    void memset_zero(void* dst, size_t bytes) override {
        if (bytes == 0) return;
        CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
    }
    void synchronize() override {
        CUDA_CHECK(cudaStreamSynchronize(copy_->get()));
        CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    std::unique_ptr<TimingEvent> create_event() override {
        return std::make_unique<CudaTimingEvent>(stream());
    }
    void range_push(const char* name) override {
#if defined(MT_HAVE_NVTX)
        nvtxRangePushA(name);
#else
        (void)name;
#endif
    }
    void range_pop() override {
#if defined(MT_HAVE_NVTX)
        nvtxRangePop();
#endif
    }

    // ---- precision ----
    void cast_params(void* dst, const float* src, size_t n) override {
        if (dt() == DType::bf16)
            cuda::cast_fp32_to_bf16(static_cast<cuda::bf16*>(dst), src, n, stream());
        else
            copy_device(dst, src, n * sizeof(float));
    }

    // ---- ops ----
    void encoder_forward(void* out, const int* inp, const void* wte, const void* wpe, int B, int T,
                         int C) override {
        cuda::encoder_forward(dt(), out, inp, wte, wpe, B, T, C, stream());
    }
    void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* inp, int B, int T,
                          int C) override {
        cuda::encoder_backward(dt(), dwte, dwpe, dout, inp, B, T, C, stream());
    }
    void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                           const void* bias, int N, int C) override {
        cuda::layernorm_forward(dt(), out, mean, rstd, inp, weight, bias, N, C, stream());
    }
    void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                            const void* inp, const void* weight, const float* mean,
                            const float* rstd, int N, int C) override {
        cuda::layernorm_backward(dt(), dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                 stream());
    }
    void fused_residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd,
                                          const void* inp1, const void* inp2, const void* weight,
                                          const void* bias, int N, int C) override {
        cuda::fused_residual_layernorm_forward(dt(), residual, out, mean, rstd, inp1, inp2, weight,
                                               bias, N, C, stream());
    }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N,
                        int C, int OC, MatmulEpilogue epilogue, void* pre_act) override {
        cuda::matmul_forward(ctx_, out, inp, weight, bias, N, C, OC,
                             epilogue == MatmulEpilogue::gelu, pre_act, stream());
    }
    void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                         const void* inp, const void* weight, int N, int C, int OC) override {
        cuda::matmul_backward(ctx_, dinp, dweight, dbias, dout, inp, weight, N, C, OC, stream());
    }

    // -- attention --
    size_t attention_workspace_needed(int B, int T, int C, int NH) const {
        return options_.kernels.attention == AttentionImpl::flash
                   ? cuda::flash_attention_workspace_bytes(B, T, C, NH)
                   : cuda::naive_attention_workspace_bytes(dt(), B, T, C, NH);
    }
    // Grows the attention workspace to fit (B,T,C,NH). Call outside the timed step.
    void reserve_attention_workspace(int B, int T, int C, int NH) {
        const size_t need = attention_workspace_needed(B, T, C, NH);
        if (need <= attn_ws_bytes_) return;
        synchronize();
        deallocate(attn_ws_);
        attn_ws_ = nullptr;
        attn_ws_bytes_ = 0;
        attn_ws_ = allocate(need, MemoryCategory::workspace);
        attn_ws_bytes_ = need;
    }
    size_t attention_saved_elems(int B, int T, int C, int NH) const override {
        check_heads(C, NH);
        // The model calls this when it plans its activations: the moment to reserve the
        // attention workspace too (see the policy at the top of this file).
        const_cast<CudaBackend*>(this)->reserve_attention_workspace(B, T, C, NH);
        const size_t bnh = size_t(B) * NH;
        return options_.kernels.attention == AttentionImpl::flash ? bnh * T : bnh * T * T;
    }
    void* attention_workspace(int B, int T, int C, int NH, const char* op) {
        const size_t need = attention_workspace_needed(B, T, C, NH);
        if (need > attn_ws_bytes_)
            throw BackendError(std::string(op) + ": the attention workspace for B=" +
                               std::to_string(B) + " T=" + std::to_string(T) +
                               " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + " needs " +
                               format_mib(need) + " but " + format_mib(attn_ws_bytes_) +
                               " is reserved; call attention_saved_elems(B, T, C, NH) first "
                               "(GPT::allocate_activations does) so ops never allocate");
        return attn_ws_;
    }
    static void check_heads(int C, int NH) {
        if (NH <= 0 || C % NH != 0)
            throw BackendError("attention: n_embd=" + std::to_string(C) +
                               " is not divisible by n_head=" + std::to_string(NH));
    }
    void attention_forward(void* out, float* saved, const void* qkv, int B, int T, int C,
                           int NH) override {
        check_heads(C, NH);
        if (options_.kernels.attention == AttentionImpl::flash) {
            cuda::flash_attention_forward(dt(), out, saved, qkv, B, T, C, NH, stream());
        } else {
            void* ws = attention_workspace(B, T, C, NH, "attention_forward");
            cuda::naive_attention_forward(ctx_, dt(), out, saved, qkv, B, T, C, NH, ws, stream());
        }
    }
    void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                            const float* saved, int B, int T, int C, int NH) override {
        check_heads(C, NH);
        void* ws = attention_workspace(B, T, C, NH, "attention_backward");
        if (options_.kernels.attention == AttentionImpl::flash)
            cuda::flash_attention_backward(dt(), dqkv, dout, qkv, out, saved, B, T, C, NH, ws,
                                           stream());
        else
            cuda::naive_attention_backward(ctx_, dt(), dqkv, dout, qkv, saved, B, T, C, NH, ws,
                                           stream());
    }

    // -- pointwise --
    void gelu_forward(void* out, const void* inp, size_t n) override {
        cuda::gelu_forward(dt(), out, inp, n, stream());
    }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        cuda::gelu_backward(dt(), dinp, inp, dout, n, stream());
    }
    void residual_forward(void* out, const void* inp1, const void* inp2, size_t n) override {
        cuda::residual_forward(dt(), out, inp1, inp2, n, stream());
    }
    void residual_backward(void* dinp1, void* dinp2, const void* dout, size_t n) override {
        cuda::residual_backward(dt(), dinp1, dinp2, dout, n, stream());
    }

    // -- classifier --
    void classifier_fused(float* losses, void* logits, const int* targets, int N, int V, int Vp,
                          float dloss) override {
        check_vocab(V, Vp);
        cuda::classifier_fused(dt(), losses, logits, targets, N, V, Vp, dloss, stream());
    }
    void softmax_forward(float* probs, const void* logits, int N, int V, int Vp) override {
        check_vocab(V, Vp);
        cuda::softmax_forward(dt(), probs, logits, N, V, Vp, stream());
    }
    void crossentropy_forward(float* losses, const float* probs, const int* targets, int N,
                              int Vp) override {
        cuda::crossentropy_forward(losses, probs, targets, N, Vp, stream());
    }
    void crossentropy_softmax_backward(void* dlogits, const float* probs, const int* targets, int N,
                                       int V, int Vp, float dloss) override {
        check_vocab(V, Vp);
        cuda::crossentropy_softmax_backward(dt(), dlogits, probs, targets, N, V, Vp, dloss,
                                            stream());
    }
    static void check_vocab(int V, int Vp) {
        if (V <= 0 || V > Vp)
            throw BackendError("classifier: vocab_size V=" + std::to_string(V) +
                               " must be in 1..Vp=" + std::to_string(Vp));
    }

    // -- reductions --
    void sum_scaled(float* out, const float* inp, size_t n, float scale) override {
        cuda::sum_scaled(out, inp, n, scale, partials_, stream());
    }
    void global_norm_squared(float* out, const float* grads, size_t n) override {
        cuda::sum_squares(out, grads, n, partials_, stream());
    }

    // -- optimizer --
    void adamw_update(AdamWImpl impl, float* params, const float* grads, float* m, float* v,
                      std::span<const TensorSlice> tensors, size_t total, const AdamWParams& hp,
                      const float* grad_scale_device) override {
        const math::AdamWScalars s = prepare_adamw(tensors, total, hp);
        slices_.clear();
        for (const TensorSlice& t : tensors) slices_.push_back({t.offset, t.count, t.decay});
        const cuda::AdamWVariant var = impl == AdamWImpl::unfused ? cuda::AdamWVariant::unfused
                                       : impl == AdamWImpl::multi_tensor
                                           ? cuda::AdamWVariant::multi_tensor
                                           : cuda::AdamWVariant::fused;
        cuda::adamw(var, params, grads, m, v, slices_, s, grad_scale_device, stream());
    }
    void clip_scale(float* scale_out, const float* norm_sq, float max_norm) override {
        cuda::clip_scale(scale_out, norm_sq, max_norm, stream());
    }

  private:
    struct DeviceAlloc {
        size_t bytes;
        MemoryCategory category;
    };
    struct HostAlloc {
        size_t bytes = 0;
        bool pinned = false;
    };
    int device_ = 0;
    cudaDeviceProp prop_{};
    std::unique_ptr<cuda::CudaStream> compute_, copy_;
    std::unique_ptr<cuda::CudaEvent> copy_done_, compute_mark_;
    std::unique_ptr<cuda::CublasHandle> blas_;
    std::unique_ptr<cuda::CublasLtHandle> lt_;
    cuda::BlasContext ctx_;
    std::unordered_map<void*, DeviceAlloc> device_allocs_;
    std::map<void*, HostAlloc> host_allocs_;  // ordered: pinned-range lookup
    std::mutex alloc_mutex_;  // loader threads may allocate host batches concurrently
    void* lt_ws_ = nullptr;
    size_t lt_ws_bytes_ = 0;
    float* partials_ = nullptr;
    void* attn_ws_ = nullptr;
    size_t attn_ws_bytes_ = 0;
    std::vector<cuda::AdamWSlice> slices_;
};

}  // namespace

std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options) {
    return std::make_unique<CudaBackend>(options);
}

}  // namespace mt

// CpuBackend: the Backend interface on the host, fp32 only. Memory is plain aligned host
// memory (tracked per category), copies are memcpy, ops run synchronously and forward to the
// mt::cpu kernels (ops.h), events read std::chrono::steady_clock.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace mt {
namespace {

constexpr size_t kAlignment = 256;

// steady_clock time of record(); CPU ops are synchronous, so that is when the work got there.
class CpuEvent final : public TimingEvent {
  public:
    void record() override {
        t_ = std::chrono::steady_clock::now();
        recorded_ = true;
    }
    double elapsed_ms_since(const TimingEvent& start) const override {
        const auto* s = dynamic_cast<const CpuEvent*>(&start);
        if (!s)
            throw BackendError("elapsed_ms_since: the start event was not made by the CPU backend");
        if (!recorded_ || !s->recorded_)
            throw BackendError("elapsed_ms_since: both events must be recorded first");
        return std::chrono::duration<double, std::milli>(t_ - s->t_).count();
    }

  private:
    std::chrono::steady_clock::time_point t_{};
    bool recorded_ = false;
};

std::string cpu_model_name() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) {
                auto s = line.substr(colon + 1);
                const auto b = s.find_first_not_of(" \t");
                return b == std::string::npos ? std::string("unknown") : s.substr(b);
            }
        }
    }
    return "unknown";
}

// MemAvailable from /proc/meminfo (kB), or the free physical pages when it is missing.
size_t available_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit) {
        if (key == "MemAvailable:") return kb * 1024;
    }
    return static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) *
           static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t total_bytes() {
    return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) *
           static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

size_t mib(size_t b) {
    return b >> 20;
}

class CpuBackend final : public Backend {
  public:
    explicit CpuBackend(const BackendOptions& o) : Backend(o) {
        if (o.precision == Precision::bf16)
            throw BackendError(
                "the CPU backend runs fp32 only; precision bf16 needs backend: cuda");
        if (o.precision == Precision::tf32)
            throw BackendError(
                "the CPU backend runs fp32 only; precision tf32 (TF32 tensor-core matmuls) needs "
                "backend: cuda, and on the CPU it would silently be fp32; use precision: fp32");
        if (o.kernels.attention == AttentionImpl::cudnn)
            throw BackendError(
                "kernels.attention: cudnn needs backend: cuda; the CPU backend has attention "
                "naive or flash");
        if (o.num_threads < 0)
            throw BackendError("num_threads must be >= 0 (0 = OpenMP's default), got " +
                               std::to_string(o.num_threads));
        if (o.num_threads > 0) omp_set_num_threads(o.num_threads);
        threads_ = omp_get_max_threads();
        // The GEMM implementation is part of the name: it decides the step time and the
        // measured sgemm peak, which harness/profile.cpp caches per device name.
        name_ = "CPU: " + cpu_model_name() + " (" + std::to_string(threads_) +
                (threads_ == 1 ? " thread, " : " threads, ") + cpu::gemm_impl_name() + " GEMM)";
    }
    ~CpuBackend() override {
        // Whatever is still allocated (the unfused AdamW workspace, anything leaked) is freed.
        for (auto& [ptr, info] : allocs_) std::free(ptr);
    }

    BackendKind kind() const override { return BackendKind::cpu; }
    std::string device_name() const override { return name_; }

    // ---- memory ----
    void* allocate(size_t bytes, MemoryCategory category) override {
        const size_t rounded =
            std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
        void* p = std::aligned_alloc(kAlignment, rounded);
        if (!p) {
            throw OutOfMemoryError(std::string("CPU backend: cannot allocate ") +
                                   std::to_string(bytes) + " bytes (" + std::to_string(mib(bytes)) +
                                   " MiB) for " + to_string(category) + "; " +
                                   std::to_string(mib(available_bytes())) + " MiB available of " +
                                   std::to_string(mib(total_bytes())) +
                                   " MiB; shrink the batch size, sequence length or model");
        }
        std::lock_guard<std::mutex> lock(mu_);
        allocs_[p] = {bytes, category};
        account_alloc(category, bytes);
        return p;
    }
    void deallocate(void* ptr) override {
        if (!ptr) return;
        std::lock_guard<std::mutex> lock(mu_);
        auto it = allocs_.find(ptr);
        if (it == allocs_.end())
            throw BackendError(
                "CPU backend: deallocate of a pointer this backend did not allocate");
        account_free(it->second.category, it->second.bytes);
        allocs_.erase(it);
        std::free(ptr);
    }
    void* allocate_host(size_t bytes, bool /*pinned: no such thing on the host*/) override {
        return allocate(bytes, MemoryCategory::data);
    }
    void deallocate_host(void* ptr) override { deallocate(ptr); }
    DeviceMemoryInfo device_memory_info() const override {
        DeviceMemoryInfo info;
        info.available = true;
        info.total_bytes = total_bytes();
        info.free_bytes = available_bytes();
        std::ifstream f("/proc/self/statm");
        size_t size_pages = 0, resident_pages = 0;
        if (f >> size_pages >> resident_pages)
            info.used_bytes = resident_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
        return info;
    }

    // ---- data movement ----
    void copy_to_device(void* dst, const void* src, size_t bytes) override {
        copy(dst, src, bytes);
    }
    void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
    void copy_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
    void memset_zero(void* dst, size_t bytes) override {
        if (bytes) std::memset(dst, 0, bytes);
    }
    void synchronize() override {}
    std::unique_ptr<TimingEvent> create_event() override { return std::make_unique<CpuEvent>(); }

    void cast_params(void* dst, const float* src, size_t n) override {
        copy(dst, src, n * sizeof(float));
    }

    // ---- ops: fp32 forwarding to mt::cpu ----
    void encoder_forward(void* out, const int* inp, const void* wte, const void* wpe, int B, int T,
                         int C) override {
        cpu::encoder_forward(f(out), inp, f(wte), f(wpe), B, T, C);
    }
    void encoder_backward(float* dwte, float* dwpe, const void* dout, const int* inp, int B, int T,
                          int C) override {
        cpu::encoder_backward(dwte, dwpe, f(dout), inp, B, T, C);
    }
    void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* weight,
                           const void* bias, int N, int C) override {
        cpu::layernorm_forward(f(out), mean, rstd, f(inp), f(weight), f(bias), N, C);
    }
    void layernorm_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                            const void* inp, const void* weight, const float* mean,
                            const float* rstd, int N, int C) override {
        cpu::layernorm_backward(f(dinp), dweight, dbias, f(dout), f(inp), f(weight), mean, rstd, N,
                                C);
    }
    void fused_residual_layernorm_forward(void* residual, void* out, float* mean, float* rstd,
                                          const void* inp1, const void* inp2, const void* weight,
                                          const void* bias, int N, int C) override {
        cpu::fused_residual_layernorm_forward(f(residual), f(out), mean, rstd, f(inp1), f(inp2),
                                              f(weight), f(bias), N, C);
    }
    void matmul_forward(void* out, const void* inp, const void* weight, const void* bias, int N,
                        int C, int OC, MatmulEpilogue epilogue, void* pre_act) override {
        if (epilogue == MatmulEpilogue::gelu) {
            if (!pre_act)
                throw BackendError(
                    "matmul_forward with the gelu epilogue needs a pre_act buffer "
                    "(N,OC) for the backward; got null");
            cpu::matmul_forward_gelu(f(out), f(pre_act), f(inp), f(weight), f(bias), N, C, OC);
        } else {
            cpu::matmul_forward(f(out), f(inp), f(weight), f(bias), N, C, OC);
        }
    }
    void matmul_backward(void* dinp, float* dweight, float* dbias, const void* dout,
                         const void* inp, const void* weight, int N, int C, int OC) override {
        cpu::matmul_backward(f(dinp), dweight, dbias, f(dout), f(inp), f(weight), N, C, OC);
    }
    size_t attention_saved_elems(int B, int T, int /*C*/, int NH) const override {
        const size_t bnh = static_cast<size_t>(B) * static_cast<size_t>(NH);
        return options_.kernels.attention == AttentionImpl::flash
                   ? bnh * static_cast<size_t>(T)
                   : bnh * static_cast<size_t>(T) * static_cast<size_t>(T);
    }
    void attention_forward(void* out, float* saved, const void* qkv, int B, int T, int C,
                           int NH) override {
        check_heads(C, NH);
        if (options_.kernels.attention == AttentionImpl::flash)
            cpu::attention_forward_flash(f(out), saved, f(qkv), B, T, C, NH);
        else
            cpu::attention_forward_naive(f(out), saved, f(qkv), B, T, C, NH);
    }
    void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                            const float* saved, int B, int T, int C, int NH) override {
        check_heads(C, NH);
        if (options_.kernels.attention == AttentionImpl::flash)
            cpu::attention_backward_flash(f(dqkv), f(dout), f(qkv), f(out), saved, B, T, C, NH);
        else
            cpu::attention_backward_naive(f(dqkv), f(dout), f(qkv), f(out), saved, B, T, C, NH);
    }
    void gelu_forward(void* out, const void* inp, size_t n) override {
        cpu::gelu_forward(f(out), f(inp), n);
    }
    void gelu_backward(void* dinp, const void* inp, const void* dout, size_t n) override {
        cpu::gelu_backward(f(dinp), f(inp), f(dout), n);
    }
    void residual_forward(void* out, const void* inp1, const void* inp2, size_t n) override {
        cpu::residual_forward(f(out), f(inp1), f(inp2), n);
    }
    void residual_backward(void* dinp1, void* dinp2, const void* dout, size_t n) override {
        cpu::residual_backward(f(dinp1), f(dinp2), f(dout), n);
    }
    void classifier_fused(float* losses, void* logits, const int* targets, int N, int V, int Vp,
                          float dloss) override {
        cpu::classifier_fused(losses, f(logits), targets, N, V, Vp, dloss);
    }
    void softmax_forward(float* probs, const void* logits, int N, int V, int Vp) override {
        cpu::softmax_forward(probs, f(logits), N, V, Vp);
    }
    void crossentropy_forward(float* losses, const float* probs, const int* targets, int N,
                              int Vp) override {
        cpu::crossentropy_forward(losses, probs, targets, N, Vp);
    }
    void crossentropy_softmax_backward(void* dlogits, const float* probs, const int* targets, int N,
                                       int V, int Vp, float dloss) override {
        cpu::crossentropy_softmax_backward(f(dlogits), probs, targets, N, V, Vp, dloss);
    }
    void sum_scaled(float* out, const float* inp, size_t n, float scale) override {
        cpu::sum_scaled(out, inp, n, scale);
    }
    void global_norm_squared(float* out, const float* grads, size_t n) override {
        cpu::global_norm_squared(out, grads, n);
    }
    void clip_scale(float* scale_out, const float* norm_sq, float max_norm) override {
        cpu::clip_scale(scale_out, norm_sq, max_norm);
    }
    void adamw_update(AdamWImpl impl, float* params, const float* grads, float* m, float* v,
                      std::span<const TensorSlice> tensors, size_t total, const AdamWParams& hp,
                      const float* grad_scale_device) override {
        const math::AdamWScalars s = prepare_adamw(tensors, total, hp);
        const float scale = grad_scale_device ? grad_scale_device[0] : 1.0f;
        switch (impl) {
            case AdamWImpl::unfused: {
                // The unfused step's temporary g: reserved on the first unfused step, sized by
                // the largest tensor, tracked as `workspace`, reused by every later step.
                const size_t need = cpu::adamw_unfused_workspace_elems(tensors);
                if (need > adamw_tmp_elems_) {
                    if (adamw_tmp_) deallocate(adamw_tmp_);
                    adamw_tmp_ = nullptr;
                    adamw_tmp_ = static_cast<float*>(
                        allocate(need * sizeof(float), MemoryCategory::workspace));
                    adamw_tmp_elems_ = need;
                }
                cpu::adamw_unfused(params, grads, m, v, adamw_tmp_, tensors, s, scale);
                break;
            }
            case AdamWImpl::multi_tensor:
                cpu::adamw_multi_tensor(params, grads, m, v, tensors, s, scale);
                break;
            case AdamWImpl::fused:
                cpu::adamw_fused(params, grads, m, v, tensors, total, s, scale);
                break;
        }
    }

  private:
    struct AllocInfo {
        size_t bytes;
        MemoryCategory category;
    };
    static float* f(void* p) { return static_cast<float*>(p); }
    static const float* f(const void* p) { return static_cast<const float*>(p); }
    static void copy(void* dst, const void* src, size_t bytes) {
        if (bytes && dst != src) std::memcpy(dst, src, bytes);
    }
    static void check_heads(int C, int NH) {
        if (NH <= 0 || C % NH != 0)
            throw BackendError("attention: n_embd (" + std::to_string(C) +
                               ") must be a multiple of n_head (" + std::to_string(NH) + ")");
    }

    int threads_ = 1;
    std::string name_;
    std::mutex mu_;
    std::unordered_map<void*, AllocInfo> allocs_;
    float* adamw_tmp_ = nullptr;
    size_t adamw_tmp_elems_ = 0;
};

}  // namespace

std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options) {
    return std::make_unique<CpuBackend>(options);
}

}  // namespace mt

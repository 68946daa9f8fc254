// CpuBackend: the Backend interface on the host, fp32 only. Memory is plain aligned host
// memory (tracked per category), copies are memcpy, ops run synchronously and forward to the
// kernels (ops.h) of the CPU ISA level chosen at construction (cpu_isa.h), events read
// std::chrono::steady_clock.
#include "kernels/cpu/cpu_backend.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/huge_pages.h"
#include "kernels/ops.h"
#include "kernels/text.h"

namespace mt {
namespace {

// Whether `threads` threads can run at once in this process, tried before OpenMP is asked for
// them: libgomp cannot report a failed team start (it prints "Thread creation failed" and calls
// exit(1), leaving no report), and a team of 1024 fails under an address-space limit
// (`ulimit -v`: each thread reserves a stack) or a process limit (`ulimit -u`). threads - 1 new
// threads (the caller is the first) with the default stack, as libgomp starts them, wait until
// all exist, then end. "" when they started, else what failed.
std::string thread_start_error(int threads) {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    std::vector<std::thread> team;
    std::string error;
    try {
        for (int i = 1; i < threads; ++i)
            team.emplace_back([&] {
                std::unique_lock<std::mutex> lock(mu);
                cv.wait(lock, [&] { return release; });
            });
    } catch (const std::system_error& e) {
        error = "only " + std::to_string(team.size() + 1) + " of " + std::to_string(threads) +
                " threads could be started (" + e.code().message() + ")";
    }
    {
        const std::lock_guard<std::mutex> lock(mu);
        release = true;
    }
    cv.notify_all();
    for (std::thread& t : team) t.join();
    return error;
}

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

// The CPU backend's stream event: work is synchronous, so every point is reached as soon as it
// is marked; there is nothing to record or wait for.
class CpuStreamEvent final : public StreamEvent {};

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

// A number from a one-line cgroup file ("max" and a missing file: nullopt).
std::optional<size_t> read_cgroup_number(const char* path) {
    std::ifstream f(path);
    unsigned long long v = 0;
    if (!(f >> v)) return std::nullopt;
    return static_cast<size_t>(v);
}

// Bytes of `key` in a cgroup memory.stat file (0 when missing).
size_t cgroup_stat(const char* path, const std::string& key) {
    std::ifstream f(path);
    std::string k;
    unsigned long long v = 0;
    while (f >> k >> v)
        if (k == key) return static_cast<size_t>(v);
    return 0;
}

// What the container's memory limit still allows (cgroup v2, else v1): limit - usage, where
// usage leaves out the inactive page cache the kernel reclaims first. nullopt without a limit.
std::optional<size_t> cgroup_available_bytes() {
    struct Files {
        const char *limit, *usage, *stat, *inactive;
    };
    const Files files[] = {{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current",
                            "/sys/fs/cgroup/memory.stat", "inactive_file"},
                           {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
                            "/sys/fs/cgroup/memory/memory.stat", "total_inactive_file"}};
    for (const Files& c : files) {
        const auto limit = read_cgroup_number(c.limit);
        const auto usage = read_cgroup_number(c.usage);
        if (!limit || !usage || *limit >= (size_t{1} << 60)) continue;  // no limit set
        const size_t inactive = std::min(*usage, cgroup_stat(c.stat, c.inactive));
        const size_t used = *usage - inactive;
        return *limit > used ? *limit - used : 0;
    }
    return std::nullopt;
}

// MemAvailable from /proc/meminfo (kB), or the free physical pages when it is missing; within a
// container with a memory limit, at most what the limit still allows.
size_t available_bytes() {
    size_t avail =
        static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::ifstream f("/proc/meminfo");
    std::string key;
    size_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit) {
        if (key == "MemAvailable:") {
            avail = kb * 1024;
            break;
        }
    }
    if (const auto cg = cgroup_available_bytes()) avail = std::min(avail, *cg);
    return avail;
}

size_t total_bytes() {
    return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) *
           static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

class CpuBackend final : public Backend {
  public:
    // The ISA level first: MT_CPU_ISA, else the best level this CPU has (a level the CPU lacks
    // throws BackendError naming the missing features).
    explicit CpuBackend(const BackendOptions& o)
        : Backend(o), isa_(cpu::cpu_isa_from_environment()), cpu_(cpu::kernel_table(isa_)) {
        if (o.precision == Precision::bf16)
            throw BackendError(
                "the CPU backend runs fp32 only; precision bf16 needs backend: cuda");
        if (o.precision == Precision::tf32)
            throw BackendError(
                "the CPU backend runs fp32 only; precision tf32 (TF32 tensor-core matmuls) needs "
                "backend: cuda, and on the CPU it would silently be fp32; use precision: fp32");
        if (o.kernels.attention == AttentionImpl::cudnn ||
            o.kernels.attention == AttentionImpl::flash_tc)
            throw_cuda_only_attention(o.kernels.attention);
        check_ladder_steps(o.kernels);
        huge_page_policy();  // a bad MT_CPU_HUGE_PAGES is refused here, before any buffer
        if (const std::string e = thread_count_error("num_threads", o.num_threads); !e.empty())
            throw BackendError(e + "; this machine has " + std::to_string(omp_get_num_procs()) +
                               " cores");
        if (o.num_threads > 0) {
            if (const std::string e = thread_start_error(o.num_threads); !e.empty())
                throw BackendError("cannot run " + std::to_string(o.num_threads) +
                                   " CPU threads (run.threads, --threads) here: " + e +
                                   "; the address-space limit (ulimit -v) or the process limit "
                                   "(ulimit -u) allows fewer; lower run.threads (this machine "
                                   "has " +
                                   std::to_string(omp_get_num_procs()) +
                                   " cores; 0 = one per core)");
            omp_set_num_threads(o.num_threads);
        }
        threads_ = omp_get_max_threads();
        // The op table's entries, each calling this class's kernel() for that op.
#define MT_BIND_CPU_KERNEL(table_name, Op)                  \
    kernels_.table_name = [](Backend& b, const op::Op& a) { \
        static_cast<CpuBackend&>(b).kernel(a);              \
    };
        MT_OPS(MT_BIND_CPU_KERNEL)
#undef MT_BIND_CPU_KERNEL
        // The ISA level and the GEMM implementation are part of the name: they decide the step
        // time and the measured sgemm peak, which engine/profile.cpp caches per device name.
        name_ = "CPU: " + cpu_model_name() + " (" + std::to_string(threads_) +
                (threads_ == 1 ? " thread, " : " threads, ") + cpu::to_string(isa_) + " kernels, " +
                cpu_.gemm_impl_name() + " GEMM)";
    }
    ~CpuBackend() override {
        // Whatever is still allocated (the unfused AdamW workspace, anything leaked) is freed.
        for (auto& [ptr, info] : allocs_) std::free(ptr);
    }

    BackendKind kind() const override {
        return BackendKind::cpu;
    }
    MatmulImpl matmul_impl() const override {
        const MatmulImpl m = options_.kernels.matmul;
        return m == MatmulImpl::auto_ ? cpu_.gemm_fastest() : m;
    }
    // kernels.matmul and kernels.layernorm_forward: the CPU steps of each ladder.
    void check_ladder_steps(const KernelChoice& k) const {
        if (!is_cpu_matmul(k.matmul))
            throw BackendError(std::string("kernels.matmul: ") + to_string(k.matmul) +
                               " is a CUDA implementation; the CPU backend's ladder is naive, "
                               "blocked, packed, blas (or auto)");
        if (k.matmul == MatmulImpl::packed && !cpu_.gemm_packed_available())
            throw BackendError(std::string("kernels.matmul: packed needs the CPU ISA level avx2 or "
                                           "avx512 (AVX2+FMA or AVX-512); this run uses ") +
                               cpu::to_string(isa_) +
                               " (MT_CPU_ISA or the CPU), which has naive, blocked and blas");
        if (k.layernorm_forward == LayerNormForwardImpl::thread_per_row)
            throw BackendError(
                "kernels.layernorm_forward: thread_per_row is a CUDA thread layout; the CPU "
                "backend has two_pass and welford");
        if (k.memory_access == MemoryAccess::packed128)
            throw BackendError(
                "kernels.memory_access: packed128 is the CUDA kernels' 128-bit loads; the CPU "
                "backend's vector width is its ISA level (MT_CPU_ISA), use scalar");
    }
    std::string device_name() const override {
        return name_;
    }

    // ---- memory ----
    void* allocate(size_t bytes, MemoryCategory category) override {
        void* p = allocate_host_buffer(bytes, kAlignment);  // 2 MiB pages from 2 MiB up
        if (!p) {
            throw OutOfMemoryError(
                std::string("CPU backend: cannot allocate ") + std::to_string(bytes) + " bytes (" +
                format_mib(bytes) + ") for " + to_string(category) + "; " +
                format_mib(available_bytes()) + " available of " + format_mib(total_bytes()) +
                "; shrink the batch size, sequence length or model");
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
    void deallocate_host(void* ptr) override {
        deallocate(ptr);
    }
    DeviceMemoryInfo device_memory_info() const override {
        DeviceMemoryInfo info;
        info.available = true;
        info.total_bytes = total_bytes();
        info.free_bytes = available_bytes();
        std::ifstream f("/proc/self/statm");
        size_t size_pages = 0, resident_pages = 0;
        if (f >> size_pages >> resident_pages)
            info.used_bytes = resident_pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
        info.own_bytes = info.used_bytes;
        return info;
    }

    // ---- data movement ----
    void copy_to_device(void* dst, const void* src, size_t bytes) override {
        copy(dst, src, bytes);
    }
    void copy_to_host_blocking(void* dst, const void* src, size_t bytes) override {
        copy(dst, src, bytes);
    }
    void copy_device(void* dst, const void* src, size_t bytes) override {
        copy(dst, src, bytes);
    }
    // The activation gradients (15 MB a block for gpt2-mini) are zeroed before each block's
    // backward, into the last-level cache the block's ops then read them from. One memset is one
    // core's store stream: 16 GB/s on a Zen 3, where the second core sat idle (4.2-7.5 ms a
    // step; the team's: 2.8-4.4, alternating runs). The team clears one contiguous share each, a
    // multiple of 64 bytes (whole cache lines of an aligned buffer). Small buffers skip the
    // team's start; buffers past the cache stay one stream, which DRAM already absorbs (the 64 MB
    // parameter gradients: 1.9-2.5 ms alone, 2.4-2.8 with the team).
    void memset_zero(void* dst, size_t bytes) override {
        constexpr size_t kTeamMinBytes = size_t{1} << 20, kTeamMaxBytes = size_t{32} << 20;
        constexpr size_t kLine = 64;
        if (bytes < kTeamMinBytes || bytes > kTeamMaxBytes || threads_ == 1) {
            if (bytes) std::memset(dst, 0, bytes);
            return;
        }
#pragma omp parallel
        {
            const size_t team = static_cast<size_t>(omp_get_num_threads());
            const size_t share = (bytes / team + kLine - 1) / kLine * kLine;
            const size_t begin = std::min(bytes, share * static_cast<size_t>(omp_get_thread_num()));
            const size_t end = std::min(bytes, begin + share);
            if (end > begin) std::memset(static_cast<char*>(dst) + begin, 0, end - begin);
        }
    }
    void synchronize_device() override {}  // ops are synchronous: nothing to wait for
    std::unique_ptr<TimingEvent> create_event() override {
        return std::make_unique<CpuEvent>();
    }
    // One stream in effect: every op and copy completes before its call returns, so the orders
    // the events express already hold. (Host memory is never "pinned" here: any buffer works.)
    std::unique_ptr<StreamEvent> create_stream_event() override {
        return std::make_unique<CpuStreamEvent>();
    }
    void record_event(StreamEvent&, Stream) override {}
    void wait_event(Stream, const StreamEvent&) override {}
    void wait_event_on_host(const StreamEvent&) override {}
    void copy_async(void* dst, const void* src, size_t bytes, CopyDirection, Stream) override {
        copy(dst, src, bytes);
    }

    // ---- kernels: one per op of the op table (kernels/ops.h), fp32 ----
    // Each binds an op's typed arguments to its kernel (kernels.h) in this backend's ISA level
    // (cpu_, the level's KernelTable) or, where the op has variants, to the variant it asks for.
    void kernel(const op::EncoderForward& a) {
        cpu_.encoder_forward(f(a.out), a.inp, f(a.wte), f(a.wpe), a.B, a.T, a.C);
    }
    void kernel(const op::EncoderBackward& a) {
        cpu_.encoder_backward(a.dwte, a.dwpe, f(a.dout), a.inp, a.B, a.T, a.C);
    }
    void kernel(const op::LayerNormForward& a) {
        cpu_.layernorm_forward(f(a.out), a.mean, a.rstd, f(a.inp), f(a.weight), f(a.bias), a.N, a.C,
                               layernorm_forward_impl());
    }
    void kernel(const op::LayerNormBackward& a) {
        cpu_.layernorm_backward(f(a.dinp), a.dweight, a.dbias, f(a.dout), f(a.inp), f(a.weight),
                                a.mean, a.rstd, a.N, a.C);
    }
    void kernel(const op::FusedResidualLayerNormForward& a) {
        cpu_.fused_residual_layernorm_forward(f(a.residual), f(a.out), a.mean, a.rstd, f(a.inp1),
                                              f(a.inp2), f(a.weight), f(a.bias), a.N, a.C,
                                              layernorm_forward_impl());
    }
    void kernel(const op::MatmulForward& a) {
        if (a.epilogue == MatmulEpilogue::gelu)
            cpu_.matmul_forward_gelu(f(a.out), f(a.pre_act), f(a.inp), f(a.weight), f(a.bias), a.N,
                                     a.C, a.OC, matmul_impl());
        else
            cpu_.matmul_forward(f(a.out), f(a.inp), f(a.weight), f(a.bias), a.N, a.C, a.OC,
                                matmul_impl());
    }
    void kernel(const op::MatmulBackward& a) {
        cpu_.matmul_backward(f(a.dinp), a.dweight, a.dbias, f(a.dout), f(a.inp), f(a.weight), a.N,
                             a.C, a.OC, matmul_impl());
    }
    void kernel(const op::MatmulInt8Forward& a) {
        cpu_.matmul_int8_forward(f(a.out), f(a.inp), a.weight, a.scale, f(a.bias), a.N, a.C, a.OC);
    }
    void kernel(const op::MatmulInt8Backward& a) {
        cpu_.matmul_int8_backward(f(a.dinp), a.dbias, f(a.dout), a.weight, a.scale, a.N, a.C, a.OC);
    }
    void kernel(const op::LoraForward& a) {
        cpu_.lora_forward(f(a.out), f(a.u), f(a.inp), f(a.A), f(a.B), a.N, a.C, a.OC, a.R, a.scale);
    }
    void kernel(const op::LoraBackward& a) {
        cpu_.lora_backward(f(a.dinp), a.dA, a.dB, f(a.du), f(a.dout), f(a.inp), f(a.u), f(a.A),
                           f(a.B), a.N, a.C, a.OC, a.R, a.scale);
    }
    void kernel(const op::AttentionForward& a) {
        if (a.impl == AttentionImpl::flash)
            cpu_.attention_forward_flash(f(a.out), a.saved, f(a.qkv), a.B, a.T, a.C, a.NH);
        else if (a.impl == AttentionImpl::naive)
            cpu_.attention_forward_naive(f(a.out), a.saved, f(a.qkv), a.B, a.T, a.C, a.NH);
        else
            throw_cuda_only_attention(a.impl);
    }
    void kernel(const op::AttentionBackward& a) {
        if (a.impl == AttentionImpl::flash)
            cpu_.attention_backward_flash(f(a.dqkv), f(a.dout), f(a.qkv), f(a.out), a.saved, a.B,
                                          a.T, a.C, a.NH);
        else if (a.impl == AttentionImpl::naive)
            cpu_.attention_backward_naive(f(a.dqkv), f(a.dout), f(a.qkv), f(a.out), a.saved, a.B,
                                          a.T, a.C, a.NH);
        else
            throw_cuda_only_attention(a.impl);
    }
    void kernel(const op::GeluForward& a) {
        cpu_.gelu_forward(f(a.out), f(a.inp), a.n);
    }
    void kernel(const op::GeluBackward& a) {
        cpu_.gelu_backward(f(a.dinp), f(a.inp), f(a.dout), a.n);
    }
    void kernel(const op::ResidualForward& a) {
        cpu_.residual_forward(f(a.out), f(a.inp1), f(a.inp2), a.n);
    }
    void kernel(const op::ResidualBackward& a) {
        cpu_.residual_backward(f(a.dinp1), f(a.dinp2), f(a.dout), a.n);
    }
    void kernel(const op::ClassifierFused& a) {
        cpu_.classifier_fused(a.losses, f(a.logits), a.targets, a.N, a.V, a.Vp, a.dloss);
    }
    void kernel(const op::SoftmaxForward& a) {
        cpu_.softmax_forward(a.probs, f(a.logits), a.N, a.V, a.Vp);
    }
    void kernel(const op::CrossEntropyForward& a) {
        cpu_.crossentropy_forward(a.losses, a.probs, a.targets, a.N, a.V, a.Vp);
    }
    void kernel(const op::CrossEntropySoftmaxBackward& a) {
        cpu_.crossentropy_softmax_backward(f(a.dlogits), a.probs, a.targets, a.N, a.V, a.Vp,
                                           a.dloss);
    }
    void kernel(const op::LossMean& a) {
        cpu_.sum_scaled(a.loss, a.losses, static_cast<size_t>(a.N), 1.0f / static_cast<float>(a.N));
    }
    void kernel(const op::GlobalNormClip& a) {
        cpu_.global_norm_squared(a.norm_sq, a.grads, a.n);
        cpu_.clip_scale(a.clip_scale, a.norm_sq, a.max_norm);
    }
    void kernel(const op::AdamWUpdate& a) {
        // The CPU's device memory is host memory: a.scalars is read like the CUDA kernels read it.
        const math::AdamWScalars s = a.scalars ? *a.scalars : adamw_scalars(a.hp);
        const float scale = a.grad_scale ? a.grad_scale[0] : 1.0f;
        switch (a.impl) {
            case AdamWImpl::unfused:
                cpu_.adamw_unfused(a.params, a.grads, a.m, a.v, adamw_unfused_workspace(a.tensors),
                                   a.tensors, s, scale);
                break;
            case AdamWImpl::multi_tensor:
                cpu_.adamw_multi_tensor(a.params, a.grads, a.m, a.v, a.tensors, s, scale);
                break;
            case AdamWImpl::fused:
                cpu_.adamw_fused(a.params, a.grads, a.m, a.v, a.tensors, a.total, s, scale);
                break;
        }
    }
    void kernel(const op::CastParams& a) {
        copy(a.dst, a.src, a.n * sizeof(float));
    }
    void kernel(const op::FillZero& a) {
        memset_zero(a.dst, a.bytes);
    }

  private:
    struct AllocInfo {
        size_t bytes;
        MemoryCategory category;
    };
    static float* f(void* p) {
        return static_cast<float*>(p);
    }
    static const float* f(const void* p) {
        return static_cast<const float*>(p);
    }
    static void copy(void* dst, const void* src, size_t bytes) {
        if (bytes && dst != src) std::memcpy(dst, src, bytes);
    }
    // cudnn (cuDNN's fused attention) and flash_tc (tensor-core MMA) exist only on CUDA.
    [[noreturn]] static void throw_cuda_only_attention(AttentionImpl impl) {
        throw BackendError(std::string("kernels.attention: ") + to_string(impl) +
                           " needs backend: cuda; the CPU backend has attention naive or flash");
    }
    // The unfused AdamW's temporary g: reserved on the first unfused step, sized by the largest
    // tensor, tracked as `workspace`, reused by every later step (the kernel itself never
    // allocates).
    float* adamw_unfused_workspace(std::span<const TensorSlice> tensors) {
        const size_t need = cpu_.adamw_unfused_workspace_elems(tensors);
        if (need > adamw_tmp_elems_) {
            if (adamw_tmp_) deallocate(adamw_tmp_);
            adamw_tmp_ = nullptr;
            adamw_tmp_ =
                static_cast<float*>(allocate(need * sizeof(float), MemoryCategory::workspace));
            adamw_tmp_elems_ = need;
        }
        return adamw_tmp_;
    }

    int threads_ = 1;
    cpu::CpuIsa isa_;              // the ISA level this backend's kernels were compiled for
    const cpu::KernelTable& cpu_;  // that level's kernels: every kernel() below calls them
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

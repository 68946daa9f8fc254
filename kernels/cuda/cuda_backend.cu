// The CUDA backend: device query, memory (category-tagged cudaMalloc), a compute stream and a
// copy stream, cudaEvent timing, NVTX ranges, and one kernel per op of the op table
// (kernels/ops.h), each calling its launcher.
//
// Workspace policy (ops never allocate):
//  - reserved at construction: the cuBLASLt workspace (also given to classic cuBLAS; both run
//    on the compute stream, so they never use it concurrently), the partial-sum buffer of
//    the two-stage reductions and the encoder backward's sort scratch (a fixed chunk of
//    positions, whatever B and T: see encoder.cu);
//  - the attention workspace grows in reserve_attention_workspace(impl, B,T,C,NH), which the
//    model calls when it plans its activations (GPT::allocate_activations), i.e. outside any
//    op. An attention op called with a shape larger than what was reserved throws BackendError
//    instead of allocating.
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
#include <optional>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/nvml_clock.h"
#include "kernels/ops.h"
#include "kernels/own_device_memory.h"

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
        // A just-recorded event may not have been reached yet even on an idle stream
        // (cudaEventElapsedTime then fails with cudaErrorNotReady): wait for both first.
        CUDA_CHECK(cudaEventSynchronize(s->ev_.get()));
        CUDA_CHECK(cudaEventSynchronize(ev_.get()));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, s->ev_.get(), ev_.get()));
        return ms;
    }

  private:
    cuda::CudaEvent ev_;
    cudaStream_t stream_;
};

// A point in the compute or the copy stream, for ordering one against the other.
class CudaStreamEvent final : public StreamEvent {
  public:
    CudaStreamEvent() : ev_(false) {}
    cudaEvent_t get() const { return ev_.get(); }

  private:
    cuda::CudaEvent ev_;
};

const CudaStreamEvent& cuda_event(const StreamEvent& e) {
    const auto* c = dynamic_cast<const CudaStreamEvent*>(&e);
    if (!c) throw BackendError("stream event: not made by the CUDA backend's create_stream_event");
    return *c;
}

// run.cuda_graph: one captured step, instantiated once, replayed on the compute stream. The
// graph keeps the nodes (CudaGraph) and the executable instance (CudaGraphExec) alive together.
class CudaStepGraph final : public StepGraph {
  public:
    CudaStepGraph(cuda::CudaGraph graph, cudaStream_t stream)
        : graph_(std::move(graph)), exec_(graph_), stream_(stream) {}
    void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_.get(), stream_)); }

  private:
    cuda::CudaGraph graph_;
    cuda::CudaGraphExec exec_;
    cudaStream_t stream_;
};

#if !defined(MT_HAVE_CUDNN)
constexpr const char* kCudnnNotBuilt =
    "kernels.attention: cudnn is not available in this build: configure with "
    "-DMT_ENABLE_CUDNN=ON (cmake --preset cudnn, after tools/fetch-cudnn-frontend.sh fetches "
    "the cudnn-frontend headers; needs cuDNN 9); or use naive, flash or flash_tc";
#endif

class CudaBackend final : public Backend {
  public:
    explicit CudaBackend(const BackendOptions& opt) : Backend(opt) {
        // Config and build questions, answered on any machine: before the device.
        check_matmul_impl(opt.kernels.matmul);
        check_attention_impl(opt.kernels.attention);
        std::string why;
        if (!cuda_device_available(&why)) throw BackendError("backend 'cuda': " + why);
        int count = 0;
        CUDA_CHECK(cudaGetDeviceCount(&count));
        if (opt.device_index < 0 || opt.device_index >= count)
            throw BackendError("backend 'cuda': device_index " + std::to_string(opt.device_index) +
                               " does not exist (this machine has " + std::to_string(count) +
                               " device(s))");
#define MT_BIND_CUDA_KERNEL(table_name, Op)                 \
    kernels_.table_name = [](Backend& b, const op::Op& a) { \
        static_cast<CudaBackend&>(b).kernel(a);             \
    };
        MT_OPS(MT_BIND_CUDA_KERNEL)
#undef MT_BIND_CUDA_KERNEL
        device_ = opt.device_index;
        CUDA_CHECK(cudaSetDevice(device_));
        CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
        // The context exists now (cudaFree(0) makes sure), nothing is allocated yet: what the
        // device holds is everyone else's (and our context's), the start of own_bytes.
        CUDA_CHECK(cudaFree(nullptr));
        size_t free_b = 0, total_b = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
        own_memory_.emplace(total_b - free_b);
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
        enc_ws_bytes_ = cuda::encoder_backward_workspace_bytes();
        enc_ws_ = allocate(enc_ws_bytes_, MemoryCategory::workspace);
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
        // The clock reader (NVML, loaded now if the driver's library is there; else off).
        char bus_id[32] = "";
        if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device_) == cudaSuccess)
            clock_ = std::make_unique<cuda::NvmlClock>(bus_id);
    }

    std::optional<DeviceClockSample> sample_device_clock() const override {
        return clock_ ? clock_->sample() : std::nullopt;
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
    BackendKind kind() const override {
        return BackendKind::cuda;
    }
    std::string device_name() const override {
        return prop_.name;
    }
    cudaStream_t stream() const {
        return compute_->get();
    }
    DType dt() const {
        return cuda::dtype_of(options_.precision);
    }

    // ---- memory ----
    void* allocate(size_t bytes, MemoryCategory category) override {
        if (bytes == 0) return nullptr;
        // cudaMalloc is not recorded by a capture: the replays would all use this one buffer
        // while the code that asked for it expects a fresh one (and the runtime refuses it).
        if (capturing())
            throw BackendError("allocate(" + std::to_string(bytes) + " bytes, " +
                               to_string(category) +
                               ") while the step was being captured into a graph: ops never "
                               "allocate (kernels/ops.h); reserve the buffer before the capture");
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
        info.own_bytes = own_memory_ ? own_memory_->observe(info.used_bytes) : 0;
        return info;
    }
    // Reads the counter itself rather than through device_memory_info(), which would first
    // observe: it would count what other processes changed during the pause as this one's.
    void rebase_device_memory() override {
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        if (own_memory_) own_memory_->rebase(total_b - free_b);
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
    void copy_to_host_blocking(void* dst, const void* src, size_t bytes) override {
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
    void synchronize_device() override {
        CUDA_CHECK(cudaStreamSynchronize(copy_->get()));
        CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
    std::unique_ptr<TimingEvent> create_event() override {
        return std::make_unique<CudaTimingEvent>(stream());
    }
    // ---- graph capture (run.cuda_graph) ----
    // ThreadLocal: this thread may make no capture-unsafe call (cudaMalloc, a synchronisation,
    // a query of captured work) until the capture ends — the call fails and the capture is
    // invalidated —, while the loader threads, which never touch the compute stream, are not
    // affected (Global would hold them to it too). Both GEMM libraries are capture-safe here:
    // classic cuBLAS has its workspace set once (cublasSetWorkspace at construction), so it
    // allocates none during the capture, and cuBLASLt is always given ours explicitly.
    void begin_capture_device() override {
        CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    }
    std::unique_ptr<StepGraph> end_capture_device() override {
        cudaGraph_t g = nullptr;
        const cudaError_t st = cudaStreamEndCapture(stream(), &g);
        cuda::CudaGraph graph(g);
        if (st != cudaSuccess) {
            cudaGetLastError();  // clear the capture's error
            throw BackendError(std::string("cudaStreamEndCapture: ") + cudaGetErrorName(st) + " (" +
                               cudaGetErrorString(st) +
                               "): a call inside the capture was not capturable (a host "
                               "synchronisation or query, an allocation, work on another stream "
                               "not joined back to the compute stream)");
        }
        return std::make_unique<CudaStepGraph>(std::move(graph), stream());
    }
    void abort_capture_device() noexcept override {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream(), &status) == cudaSuccess &&
            status != cudaStreamCaptureStatusNone) {
            cudaGraph_t g = nullptr;
            cudaStreamEndCapture(stream(), &g);  // an invalidated capture gives no graph
            if (g) cudaGraphDestroy(g);
        }
        cudaGetLastError();
    }
    // ---- the copy stream (offload): events order it against the compute stream ----
    cudaStream_t stream_of(Stream s) const {
        return s == Stream::copy ? copy_->get() : stream();
    }
    std::unique_ptr<StreamEvent> create_stream_event() override {
        return std::make_unique<CudaStreamEvent>();
    }
    void record_event(StreamEvent& event, Stream s) override {
        CUDA_CHECK(cudaEventRecord(cuda_event(event).get(), stream_of(s)));
    }
    void wait_event(Stream s, const StreamEvent& event) override {
        CUDA_CHECK(cudaStreamWaitEvent(stream_of(s), cuda_event(event).get(), 0));
    }
    void wait_event_on_host(const StreamEvent& event) override {
        CUDA_CHECK(cudaEventSynchronize(cuda_event(event).get()));
    }
    void copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction,
                    Stream s) override {
        if (bytes == 0) return;
        const bool to_host = direction == CopyDirection::to_host;
        // From pageable memory cudaMemcpyAsync would stage through a driver buffer and return
        // only when the host side is consumed: no overlap, and a silent performance bug.
        if (!is_pinned(to_host ? dst : src, bytes))
            throw BackendError(
                "copy_async: the host side must be pinned memory from allocate_host(.., true)");
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes,
                                   to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                   stream_of(s)));
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

    // ---- kernels: one per op of the op table (kernels/ops.h) ----
    // Each binds an op's typed arguments to its launcher (kernels.cuh) on the compute stream,
    // in the backend's compute dtype.
    void kernel(const op::CastParams& a) {
        if (dt() == DType::bf16)
            cuda::cast_fp32_to_bf16(static_cast<cuda::bf16*>(a.dst), a.src, a.n, stream());
        else
            copy_device(a.dst, a.src, a.n * sizeof(float));
    }
    void kernel(const op::FillZero& a) {
        memset_zero(a.dst, a.bytes);
    }
    // kernels.memory_access: packed128 runs the 128-bit kernels of packed128.cu for the
    // memory-bound ops below (the LayerNorm forwards: the two_pass step; welford and
    // thread_per_row keep their scalar kernels, the lesson of their own ladder; the LayerNorm
    // backward: its dinp kernel).
    bool packed128() const {
        return kernel_choice().memory_access == MemoryAccess::packed128;
    }
    bool packed128_layernorm() const {
        return packed128() && layernorm_forward_impl() == LayerNormForwardImpl::two_pass;
    }
    void kernel(const op::EncoderForward& a) {
        if (packed128())
            cuda::encoder_forward_packed128(dt(), a.out, a.inp, a.wte, a.wpe, a.B, a.T, a.C,
                                            stream());
        else
            cuda::encoder_forward(dt(), a.out, a.inp, a.wte, a.wpe, a.B, a.T, a.C, stream());
    }
    void kernel(const op::EncoderBackward& a) {
        cuda::encoder_backward(dt(), a.dwte, a.dwpe, a.dout, a.inp, a.B, a.T, a.C, enc_ws_,
                               enc_ws_bytes_, stream());
    }
    void kernel(const op::LayerNormForward& a) {
        if (packed128_layernorm())
            return cuda::layernorm_forward_packed128(dt(), a.out, a.mean, a.rstd, a.inp, a.weight,
                                                     a.bias, a.N, a.C, stream());
        cuda::layernorm_forward(dt(), layernorm_forward_impl(), a.out, a.mean, a.rstd, a.inp,
                                a.weight, a.bias, a.N, a.C, stream());
    }
    void kernel(const op::LayerNormBackward& a) {
        if (packed128())
            return cuda::layernorm_backward_packed128(dt(), a.dinp, a.dweight, a.dbias, a.dout,
                                                      a.inp, a.weight, a.mean, a.rstd, a.N, a.C,
                                                      stream());
        cuda::layernorm_backward(dt(), a.dinp, a.dweight, a.dbias, a.dout, a.inp, a.weight, a.mean,
                                 a.rstd, a.N, a.C, stream());
    }
    void kernel(const op::FusedResidualLayerNormForward& a) {
        if (packed128_layernorm())
            return cuda::fused_residual_layernorm_forward_packed128(
                dt(), a.residual, a.out, a.mean, a.rstd, a.inp1, a.inp2, a.weight, a.bias, a.N, a.C,
                stream());
        cuda::fused_residual_layernorm_forward(dt(), layernorm_forward_impl(), a.residual, a.out,
                                               a.mean, a.rstd, a.inp1, a.inp2, a.weight, a.bias,
                                               a.N, a.C, stream());
    }
    // -- matmul: the ladder step of kernels.matmul (LoRA, int8 and attention keep theirs) --
    MatmulImpl matmul_impl() const override {
        const MatmulImpl m = options_.kernels.matmul;
        return m == MatmulImpl::auto_ ? MatmulImpl::cublaslt : m;
    }
    static void check_matmul_impl(MatmulImpl impl) {
        if (!is_cuda_matmul(impl))
            throw BackendError(std::string("kernels.matmul: ") + to_string(impl) +
                               " is a step of the CPU backend's ladder; the CUDA backend has "
                               "naive, tiled, cublas and cublaslt (auto = cublaslt)");
    }
    void kernel(const op::MatmulForward& a) {
        cuda::matmul_forward(ctx_, matmul_impl(), a.out, a.inp, a.weight, a.bias, a.N, a.C, a.OC,
                             a.epilogue == MatmulEpilogue::gelu, a.pre_act, stream());
    }
    void kernel(const op::MatmulBackward& a) {
        cuda::matmul_backward(ctx_, matmul_impl(), a.dinp, a.dweight, a.dbias, a.dout, a.inp,
                              a.weight, a.N, a.C, a.OC, stream());
    }
    void kernel(const op::MatmulInt8Forward& a) {
        cuda::matmul_int8_forward(dt(), a.out, a.inp, a.weight, a.scale, a.bias, a.N, a.C, a.OC,
                                  stream());
    }
    void kernel(const op::MatmulInt8Backward& a) {
        cuda::matmul_int8_backward(dt(), a.dinp, a.dbias, a.dout, a.weight, a.scale, a.N, a.C, a.OC,
                                   stream());
    }
    void kernel(const op::LoraForward& a) {
        cuda::lora_forward(ctx_, a.out, a.u, a.inp, a.A, a.B, a.N, a.C, a.OC, a.R, a.scale,
                           stream());
    }
    void kernel(const op::LoraBackward& a) {
        cuda::lora_backward(ctx_, a.dinp, a.dA, a.dB, a.du, a.dout, a.inp, a.u, a.A, a.B, a.N, a.C,
                            a.OC, a.R, a.scale, stream());
    }

    // -- attention --
    size_t attention_workspace_needed(AttentionImpl impl, DType dt, int B, int T, int C, int NH) {
#if defined(MT_HAVE_CUDNN)
        // [cuDNN's plan workspace | the backward's dQ|dK|dV (B,T,3C) bf16]
        if (impl == AttentionImpl::cudnn)
            return cudnn_plan_bytes(B, T, C, NH) + size_t(B) * T * 3 * C * sizeof(cuda::bf16);
#endif
        if (impl == AttentionImpl::flash_tc)
            return cuda::flash_tc_attention_workspace_bytes(B, T, C, NH);
        return impl == AttentionImpl::flash
                   ? cuda::flash_attention_workspace_bytes(B, T, C, NH)
                   : cuda::naive_attention_workspace_bytes(dt, B, T, C, NH);
    }
#if defined(MT_HAVE_CUDNN)
    // The cuDNN handle and plan cache, made on first use (cuDNN loads its libraries then).
    // Building a shape's plans happens in reserve_attention_workspace, outside the timed step;
    // a shape first seen in an op (data.seq_len_jitter's shorter batches) is built there.
    // (Without MT_HAVE_CUDNN, check_attention_impl refuses cudnn before any of this.)
    cuda::CudnnAttention& cudnn_attention() {
        if (!cudnn_) cudnn_ = std::make_unique<cuda::CudnnAttention>(stream());
        return *cudnn_;
    }
    size_t cudnn_plan_bytes(int B, int T, int C, int NH) {
        return (cudnn_attention().workspace_bytes(B, T, C, NH) + 255) / 256 * 256;
    }
#endif
    // Grows the attention workspace to fit (B,T,C,NH). Called outside the timed step (see the
    // workspace policy at the top of this file).
    void reserve_attention_workspace(AttentionImpl impl, int B, int T, int C, int NH) override {
        check_attention_impl(impl);
        if (impl == AttentionImpl::flash_tc) cuda::flash_tc_check_shape("workspace", C, NH);
        const size_t need = attention_workspace_needed(impl, dt(), B, T, C, NH);
        if (need <= attn_ws_bytes_) return;
        synchronize();
        deallocate(attn_ws_);
        attn_ws_ = nullptr;
        attn_ws_bytes_ = 0;
        attn_ws_ = allocate(need, MemoryCategory::workspace);
        attn_ws_bytes_ = need;
    }
    void* attention_workspace(AttentionImpl impl, int B, int T, int C, int NH, const char* op) {
        const size_t need = attention_workspace_needed(impl, dt(), B, T, C, NH);
        if (need > attn_ws_bytes_)
            throw BackendError(std::string(op) + ": the attention workspace for B=" +
                               std::to_string(B) + " T=" + std::to_string(T) +
                               " C=" + std::to_string(C) + " NH=" + std::to_string(NH) + " needs " +
                               format_mib(need) + " but " + format_mib(attn_ws_bytes_) +
                               " is reserved; call reserve_attention_workspace first "
                               "(GPT::allocate_activations does) so ops never allocate");
        return attn_ws_;
    }
    // flash_tc: the tensor-core kernels take bf16 operands only (the spec refuses the rest at
    // validation; this catches a backend made another way).
    void check_attention_impl(AttentionImpl impl) const {
        if (impl == AttentionImpl::flash_tc) {
            if (options_.precision != Precision::bf16)
                throw BackendError(
                    std::string("kernels.attention: flash_tc needs run.precision bf16 (its "
                                "tensor-core MMAs take bf16 operands), got ") +
                    to_string(options_.precision) +
                    "; set run.precision: bf16 or use kernels.attention: flash");
            return;
        }
        if (impl != AttentionImpl::cudnn) return;
#if defined(MT_HAVE_CUDNN)
        if (options_.precision != Precision::bf16)
            throw BackendError(std::string("kernels.attention: cudnn needs run.precision bf16 "
                                           "(cuDNN's fused attention computes in 16-bit), got ") +
                               to_string(options_.precision) +
                               "; set run.precision: bf16 or use kernels.attention: flash");
#else
        throw BackendError(kCudnnNotBuilt);
#endif
    }
    void kernel(const op::AttentionForward& a) {
        check_attention_impl(a.impl);
        if (a.impl == AttentionImpl::flash_tc) {
            cuda::flash_tc_attention_forward(a.out, a.saved, a.qkv, a.B, a.T, a.C, a.NH, stream());
            return;
        }
#if defined(MT_HAVE_CUDNN)
        if (a.impl == AttentionImpl::cudnn) {
            void* ws = attention_workspace(a.impl, a.B, a.T, a.C, a.NH, "attention_forward");
            cudnn_attention().forward(a.out, a.saved, a.qkv, a.B, a.T, a.C, a.NH, ws,
                                      attn_ws_bytes_);
            return;
        }
#endif
        if (a.impl == AttentionImpl::flash) {
            cuda::flash_attention_forward(dt(), a.out, a.saved, a.qkv, a.B, a.T, a.C, a.NH,
                                          stream());
        } else {
            void* ws = attention_workspace(a.impl, a.B, a.T, a.C, a.NH, "attention_forward");
            cuda::naive_attention_forward(ctx_, dt(), a.out, a.saved, a.qkv, a.B, a.T, a.C, a.NH,
                                          ws, stream());
        }
    }
    void kernel(const op::AttentionBackward& a) {
        check_attention_impl(a.impl);
        void* ws = attention_workspace(a.impl, a.B, a.T, a.C, a.NH, "attention_backward");
#if defined(MT_HAVE_CUDNN)
        if (a.impl == AttentionImpl::cudnn) {
            // cuDNN overwrites dQ|dK|dV: into the scratch behind its plan workspace, then
            // dqkv += scratch (the op's accumulate; 3 x (B,T,3C) bf16 of extra traffic).
            const size_t plan = cudnn_plan_bytes(a.B, a.T, a.C, a.NH);
            void* grad = static_cast<char*>(ws) + plan;
            cudnn_attention().backward(grad, a.dout, a.qkv, a.out, a.saved, a.B, a.T, a.C, a.NH, ws,
                                       plan);
            cuda::residual_forward(dt(), a.dqkv, a.dqkv, grad, size_t(a.B) * a.T * 3 * a.C,
                                   stream());
            return;
        }
#endif
        if (a.impl == AttentionImpl::flash_tc)
            cuda::flash_tc_attention_backward(a.dqkv, a.dout, a.qkv, a.out, a.saved, a.B, a.T, a.C,
                                              a.NH, ws, stream());
        else if (a.impl == AttentionImpl::flash)
            cuda::flash_attention_backward(dt(), a.dqkv, a.dout, a.qkv, a.out, a.saved, a.B, a.T,
                                           a.C, a.NH, ws, stream());
        else
            cuda::naive_attention_backward(ctx_, dt(), a.dqkv, a.dout, a.qkv, a.saved, a.B, a.T,
                                           a.C, a.NH, ws, stream());
    }

    // -- pointwise --
    void kernel(const op::GeluForward& a) {
        if (packed128()) return cuda::gelu_forward_packed128(dt(), a.out, a.inp, a.n, stream());
        cuda::gelu_forward(dt(), a.out, a.inp, a.n, stream());
    }
    void kernel(const op::GeluBackward& a) {
        if (packed128())
            return cuda::gelu_backward_packed128(dt(), a.dinp, a.inp, a.dout, a.n, stream());
        cuda::gelu_backward(dt(), a.dinp, a.inp, a.dout, a.n, stream());
    }
    void kernel(const op::ResidualForward& a) {
        if (packed128())
            return cuda::residual_forward_packed128(dt(), a.out, a.inp1, a.inp2, a.n, stream());
        cuda::residual_forward(dt(), a.out, a.inp1, a.inp2, a.n, stream());
    }
    void kernel(const op::ResidualBackward& a) {
        if (packed128())
            return cuda::residual_backward_packed128(dt(), a.dinp1, a.dinp2, a.dout, a.n, stream());
        cuda::residual_backward(dt(), a.dinp1, a.dinp2, a.dout, a.n, stream());
    }

    // -- classifier --
    void kernel(const op::ClassifierFused& a) {
        cuda::classifier_fused(dt(), a.losses, a.logits, a.targets, a.N, a.V, a.Vp, a.dloss,
                               stream());
    }
    void kernel(const op::SoftmaxForward& a) {
        cuda::softmax_forward(dt(), a.probs, a.logits, a.N, a.V, a.Vp, stream());
    }
    void kernel(const op::CrossEntropyForward& a) {
        cuda::crossentropy_forward(a.losses, a.probs, a.targets, a.N, a.V, a.Vp, stream());
    }
    void kernel(const op::CrossEntropySoftmaxBackward& a) {
        cuda::crossentropy_softmax_backward(dt(), a.dlogits, a.probs, a.targets, a.N, a.V, a.Vp,
                                            a.dloss, stream());
    }
    void kernel(const op::LossMean& a) {
        cuda::sum_scaled(a.loss, a.losses, static_cast<size_t>(a.N), 1.0f / static_cast<float>(a.N),
                         partials_, stream());
    }

    // -- optimizer --
    void kernel(const op::GlobalNormClip& a) {
        cuda::sum_squares(a.norm_sq, a.grads, a.n, partials_, stream());
        cuda::clip_scale(a.clip_scale, a.norm_sq, a.max_norm, stream());
    }
    void kernel(const op::AdamWUpdate& a) {
        cuda::adamw(a.impl, a.params, a.grads, a.m, a.v, a.tensors, adamw_scalars(a.hp), a.scalars,
                    a.grad_scale, stream());
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
    std::unique_ptr<cuda::NvmlClock> clock_;  // SM clock / throttle reasons (null: no NVML)
    // This process's share of the device's used bytes (device_memory_info updates it: mutable).
    mutable std::optional<OwnDeviceMemory> own_memory_;
    cuda::BlasContext ctx_;
    std::unordered_map<void*, DeviceAlloc> device_allocs_;
    std::map<void*, HostAlloc> host_allocs_;  // ordered: pinned-range lookup
    std::mutex alloc_mutex_;  // loader threads may allocate host batches concurrently
    void* lt_ws_ = nullptr;
    size_t lt_ws_bytes_ = 0;
    float* partials_ = nullptr;
    void* attn_ws_ = nullptr;
    size_t attn_ws_bytes_ = 0;
#if defined(MT_HAVE_CUDNN)
    std::unique_ptr<cuda::CudnnAttention> cudnn_;  // kernels.attention: cudnn (after compute_)
#endif
    void* enc_ws_ = nullptr;  // encoder_backward's sort scratch
    size_t enc_ws_bytes_ = 0;
};

}  // namespace

cudaStream_t cuda::compute_stream_of(Backend& backend) {
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    if (!cuda)
        throw BackendError(std::string("compute_stream_of: the ") + to_string(backend.kind()) +
                           " backend has no CUDA stream (a CUDA backend is needed)");
    return cuda->stream();
}

std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options) {
    return std::make_unique<CudaBackend>(options);
}

}  // namespace mt

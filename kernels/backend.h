// The Backend interface: everything the model, the optimizer policy and the harness may ask of a
// compute device. Two implementations: kernels/cpu (our packed GEMM / Eigen + OpenMP, fp32) and
// kernels/cuda (CUDA kernels + cuBLAS/cuBLASLt). Nothing above this header knows which one it
// talks to.
//
// A backend provides device primitives (memory, copies, events, synchronisation) as virtuals and
// one kernel per op of the op table (kernels/ops.h) in its KernelTable. Ops are run through one
// non-virtual front, Backend::run(op): it checks the request (the same checks on every backend),
// opens the op's profiler scope (OpObserver, with the op's analytic cost) and calls the kernel.
// Ops are asynchronous on the CUDA backend (enqueued on the compute stream) and synchronous on
// the CPU backend; synchronize() waits for all enqueued work.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "kernels/device_clock.h"
#include "kernels/ops.h"
#include "kernels/types.h"

namespace mt {

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
    size_t used_bytes = 0;  // total - free on CUDA (every process), current RSS on CPU
    // What this process holds: CUDA: beyond its context, from the device-wide counter
    // (kernels/own_device_memory.h: others' share taken out); CPU: its RSS (= used_bytes).
    size_t own_bytes = 0;
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

// ---- streams and cross-stream events (offload) ----------------------------------------------

// The CUDA backend runs every op on its compute stream and copies on a second, copy stream, so
// a copy can overlap compute (activation and optimizer-state offload, model/activation_offload.h
// and optim/optimizer_offload.h). A StreamEvent marks a point in one stream; another stream (or
// the host) can wait for it. The CPU backend does all work synchronously, in call order: there
// its events are no-ops and its copies are complete when copy_async returns, which is the same
// ordering the events express.
enum class Stream { compute, copy };
enum class CopyDirection { to_host, to_device };  // device -> pinned host, pinned host -> device
class StreamEvent {
  public:
    virtual ~StreamEvent() = default;
};

// ---- graphs (run.cuda_graph) -----------------------------------------------------------------

// Device work recorded once and replayed with one launch: on CUDA a cudaGraph_t instantiated
// into a cudaGraphExec_t (Backend::end_capture makes it). A replay runs the same kernels, in the
// same order, with the arguments they were captured with — pointers, shapes and by-value scalars
// are frozen, so what changes from one replay to the next must live in device memory those
// pointers read (the batch, AdamW's learning rate and bias corrections), refreshed by copies
// enqueued before the replay.
class StepGraph {
  public:
    virtual ~StepGraph() = default;
    // Enqueues the recorded work once more on the compute stream (asynchronous, like an op).
    virtual void replay() = 0;
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
    // This process resumes work after a pause in which other processes on the device (other
    // variants' workers between round slices) may have allocated or freed: what the device
    // holds beyond this process's last own_bytes is theirs (kernels/own_device_memory.h).
    // Nothing to do where own_bytes is measured per process (CPU: RSS).
    virtual void rebase_device_memory() {}

    // -- data movement & synchronisation --
    virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;  // h2d, ordered
                                                                                // before later ops
    virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;     // d2d
    virtual void memset_zero(void* dst, size_t bytes) = 0;
    virtual std::unique_ptr<TimingEvent> create_event() = 0;

    // -- host synchronisation points --
    // The two ways the host waits for the device, as non-virtual fronts (like run()): each call
    // is counted and the host time spent inside it is added up (HostSyncStats), so the harness
    // can say how often a step stopped the host and how long it waited there (run.host_sync,
    // engine/training_session.h). CUDA: a cudaStreamSynchronize, so the wait is the enqueued work's
    // remaining time; CPU: ops are synchronous, so the wait is ~0 — but the call is still
    // counted, being where a device would stall the host.
    // copy_to_host: a blocking device-to-host copy (waits for the work enqueued before it).
    void copy_to_host(void* dst, const void* src, size_t bytes) {
        refuse_host_wait_in_capture("copy_to_host()", bytes);
        const HostWait wait(*this);
        copy_to_host_blocking(dst, src, bytes);
    }
    // Waits for all enqueued work.
    void synchronize() {
        refuse_host_wait_in_capture("synchronize()", 0);
        const HostWait wait(*this);
        synchronize_device();
    }
    struct HostSyncStats {
        long long count = 0;  // synchronize() + copy_to_host() calls since construction
        double wait_ms = 0;   // host steady_clock time spent inside them
    };
    HostSyncStats host_sync_stats() const {
        return {host_syncs_.load(std::memory_order_relaxed),
                static_cast<double>(host_wait_ns_.load(std::memory_order_relaxed)) * 1e-6};
    }
    // run.host_sync: every_op — run() synchronises after every op, as naive debug code does
    // (e.g. CUDA_LAUNCH_BLOCKING=1 or a cudaDeviceSynchronize after each launch). Off by default.
    void set_sync_after_every_op(bool on) { sync_after_every_op_ = on; }
    bool sync_after_every_op() const { return sync_after_every_op_; }
    // -- the copy stream (offload) --
    // Events are created up front (not inside a step: creating one may allocate).
    virtual std::unique_ptr<StreamEvent> create_stream_event() = 0;
    // Marks the point of `stream` after everything enqueued on it so far.
    virtual void record_event(StreamEvent& event, Stream stream) = 0;
    // Work enqueued on `stream` after this call starts only once `event`'s point is reached (the
    // host does not wait). Uses the event's most recent record_event.
    virtual void wait_event(Stream stream, const StreamEvent& event) = 0;
    // The host blocks until `event`'s point is reached.
    virtual void wait_event_on_host(const StreamEvent& event) = 0;
    // Copies `bytes` between device memory and PINNED host memory (allocate_host(.., true);
    // BackendError otherwise) on `stream`, asynchronously: neither side may be touched until an
    // event recorded on `stream` after it has been reached.
    virtual void copy_async(void* dst, const void* src, size_t bytes, CopyDirection direction,
                            Stream stream) = 0;
    // Named ranges for profilers (NVTX on CUDA; no-op on CPU).
    virtual void range_push(const char* name) { (void)name; }
    virtual void range_pop() {}
    // The device's SM clock and throttle reasons now (kernels/device_clock.h): the CUDA backend
    // reads them through NVML when the driver's library loads; nullopt otherwise (the CPU
    // backend, no driver). Microseconds; never throws.
    virtual std::optional<DeviceClockSample> sample_device_clock() const { return std::nullopt; }

    // -- graph capture (run.cuda_graph) --
    // Between begin_capture() and end_capture() the work enqueued on the compute stream (ops,
    // copy_device, memset_zero) is recorded, not run; end_capture() returns it as a StepGraph.
    // Nothing may make the host wait meanwhile — a graph has no host in it: synchronize() and
    // copy_to_host() throw BackendError naming the call (so does run.host_sync every_op's
    // synchronisation after each op), and the CUDA backend refuses allocate(). A backend without
    // graphs (the CPU's ops run as the host calls them) throws BackendError from begin_capture.
    // abort_capture() ends a capture that failed, discarding what it recorded (for error paths;
    // a no-op when none is open). `what` names the captured work in messages.
    void begin_capture(const std::string& what);
    std::unique_ptr<StepGraph> end_capture();
    void abort_capture() noexcept;
    bool capturing() const { return !capture_what_.empty(); }

    // -- ops --
    // Runs one op of the op table (kernels/ops.h): checks it, opens its profiler scope, calls
    // this backend's kernel. Throws BackendError for a bad request or a missing kernel.
    template <class Op>
    void run(const Op& op) {
        op.check();
        const auto kernel = kernels_.*KernelSlot<Op>::entry;
        if (!kernel)
            throw BackendError(std::string(Op::name) + ": the " + to_string(kind()) +
                               " backend has no kernel for this op");
        {
            OpRecord record = op.record(static_cast<double>(compute_elem_bytes()));
            record.impl = implementation(op);
            OpScope scope(observer_, record);
            kernel(*this, op);
        }
        if (sync_after_every_op_) synchronize();  // outside the op's profiler scope
    }
    // The kernels this backend runs, one per op. Mutable so a test can swap one (e.g. for a
    // deliberately wrong variant); production code never does.
    KernelTable& kernels() { return kernels_; }

    // -- kernel choices --
    // The run's `kernels:` section (BackendOptions::kernels): the one copy, which each backend's
    // constructor checks against what it can run. The model reads its call sequence and its
    // attention variant here; the backend's kernels read the two ladders only through
    // matmul_impl() and layernorm_forward_impl().
    const KernelChoice& kernel_choice() const { return options_.kernels; }
    // kernels.matmul resolved: auto becomes this backend's fastest GEMM. The matmul kernels run
    // this step.
    virtual MatmulImpl matmul_impl() const { return options_.kernels.matmul; }
    // kernels.layernorm_forward: the step the LayerNorm forward kernels run.
    LayerNormForwardImpl layernorm_forward_impl() const {
        return options_.kernels.layernorm_forward;
    }
    // Which implementation `op` runs here, as the per-op table prints it (OpRecord::impl,
    // KernelStat::impl): the variant the op names itself (attention's `impl`), or the ladder
    // step this backend's kernel dispatches on for it (the same functions the kernels call),
    // or "" for an op with one implementation. AdamW names its variant in its record's name
    // ("adamw_fused"), so its column stays "". The spellings are string literals (enum_name).
    template <class Op>
    requires requires { Op::name; }
    std::string_view implementation(const Op&) const { return {}; }
    std::string_view implementation(const op::MatmulForward&) const {
        return enum_name(matmul_impl());
    }
    std::string_view implementation(const op::MatmulBackward&) const {
        return enum_name(matmul_impl());
    }
    std::string_view implementation(const op::LayerNormForward&) const {
        return enum_name(layernorm_forward_impl());
    }
    std::string_view implementation(const op::FusedResidualLayerNormForward&) const {
        return enum_name(layernorm_forward_impl());
    }
    std::string_view implementation(const op::AttentionForward& a) const {
        return enum_name(a.impl);
    }
    std::string_view implementation(const op::AttentionBackward& a) const {
        return enum_name(a.impl);
    }
    // The fused classifier is one variant of kernels.classifier (the unfused one is three ops).
    std::string_view implementation(const op::ClassifierFused&) const {
        return enum_name(ClassifierImpl::fused);
    }
    // Sets kernels.matmul and returns the previous choice: the peak probes measure the
    // machine with the fastest step (auto), whatever step the run teaches, then restore it.
    MatmulImpl exchange_matmul_impl(MatmulImpl m) {
        return std::exchange(options_.kernels.matmul, m);
    }

    // Per-op profiling hook (profile.kernels): every run() reports to it; nullptr disables.
    void set_op_observer(OpObserver* observer) { observer_ = observer; }
    OpObserver* op_observer() const { return observer_; }

    // Reserves what the attention kernels of `impl` need beyond their arguments for batches up
    // to (B,T) (CUDA: the score / dO*O workspace), so that no op allocates. The model calls it
    // when it plans its activations; a no-op where nothing is needed.
    virtual void reserve_attention_workspace(AttentionImpl impl, int B, int T, int C, int NH) {
        (void)impl, (void)B, (void)T, (void)C, (void)NH;
    }

  protected:
    explicit Backend(BackendOptions options) : options_(options) {}
    // What the fronts copy_to_host() and synchronize() call: the backend's own wait.
    virtual void copy_to_host_blocking(void* dst, const void* src, size_t bytes) = 0;
    virtual void synchronize_device() = 0;
    // What the capture fronts call (see begin_capture). The defaults: no graphs here.
    virtual void begin_capture_device();
    virtual std::unique_ptr<StepGraph> end_capture_device();
    virtual void abort_capture_device() noexcept {}
    // Allocator accounting helpers for implementations.
    void account_alloc(MemoryCategory c, size_t bytes);
    void account_free(MemoryCategory c, size_t bytes);

    BackendOptions options_;
    MemoryStats stats_;
    KernelTable kernels_;  // filled by each implementation's constructor
    OpObserver* observer_ = nullptr;

  private:
    // Counts one host wait and adds the host time it took (RAII around the backend's wait).
    class HostWait {
      public:
        explicit HostWait(Backend& b) : b_(b), t0_(std::chrono::steady_clock::now()) {}
        ~HostWait() {
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::steady_clock::now() - t0_)
                                .count();
            b_.host_syncs_.fetch_add(1, std::memory_order_relaxed);
            b_.host_wait_ns_.fetch_add(static_cast<long long>(ns), std::memory_order_relaxed);
        }
        HostWait(const HostWait&) = delete;
        HostWait& operator=(const HostWait&) = delete;

      private:
        Backend& b_;
        std::chrono::steady_clock::time_point t0_;
    };
    // Throws BackendError when a capture is open: `call` would make the host wait inside it.
    void refuse_host_wait_in_capture(const char* call, size_t bytes) const {
        if (capturing()) throw_host_wait_in_capture(call, bytes);
    }
    [[noreturn]] void throw_host_wait_in_capture(const char* call, size_t bytes) const;
    std::string capture_what_;  // the work being captured; empty: no capture open
    // Atomic: a loader or synchroniser thread may wait on the device too.
    std::atomic<long long> host_syncs_{0}, host_wait_ns_{0};
    bool sync_after_every_op_ = false;
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

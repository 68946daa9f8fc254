// NCCL collectives for data parallelism on the CUDA backend (the interface and its piece
// conventions: kernels/collectives.h).
//
// What NCCL does here: the gradient synchroniser's reduce-scatter (sum) and all-gather over the
// ranks' pieces of one flat device buffer, between the GPUs of one job. Rank 0 makes the unique
// id, the caller's `broadcast` (MPI, outside this file) gives it to every rank, and each rank
// joins the communicator on the backend's device.
//
// Start: NCCL's non-blocking mode (ncclConfig_t::blocking = 0). ncclCommInitRankConfig returns
// at once and this file polls ncclCommGetAsyncError with the timeout, so a rank that never joins
// (died before the init, or hangs elsewhere) gives a CommError after timeout_s instead of a hang.
// In that mode any NCCL call may return ncclInProgress; `settle` then polls the communicator the
// same way before the next call, as NCCL requires.
//
// Why its own stream: the communication then overlaps the backward pass of the layers that are
// still running on the compute stream (the synchroniser reduces a gradient bucket as soon as
// backward has produced it). The stream is non-blocking, so it never synchronises implicitly
// with the legacy default stream either.
//
// Ordering after backward's kernels: fence(slot) records event[slot] on the backend's compute
// stream, after the kernels that produce the operation's input; the operation issued later with
// the same slot first makes the communication stream wait on that event (cudaStreamWaitEvent
// captures the event's latest record at the time of the call, so the fence must happen before
// the issue on the host: the synchroniser hands the slot over from the step's thread to its
// communication thread). The other direction needs no event: the caller waits (wait(), a host
// block) before the optimizer reads the reduced gradients.
//
// In place, with NCCL's conventions. Equal counts c: ncclReduceScatter with
// recvbuff = sendbuff + rank*c, and ncclAllGather with sendbuff = recvbuff + rank*c. Uneven
// counts (the last piece is usually shorter): one group (ncclGroupStart/End, one launch) of
// ncclReduce(root = r) per piece r, whose send and receive buffer are both piece r (only the
// root's receive buffer is written), and one group of ncclBroadcast(root = r) per piece, in
// place on piece r. Zero-length pieces are skipped.
//
// wait(): after each operation an event is recorded on the communication stream; wait() polls
// them (and ncclCommGetAsyncError) every 50 us, so on a timeout the message names the first
// operation that has not completed. On a timeout or an asynchronous error the communicator is
// aborted (ncclCommAbort: its kernels stop instead of waiting forever for a peer) and every later
// call throws.
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/nccl_collectives.h"
#include "kernels/cuda/runtime.cuh"

namespace mt {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::microseconds(50);

const char* nccl_result_name(ncclResult_t r) {
    switch (r) {
        case ncclSuccess:
            return "ncclSuccess";
        case ncclUnhandledCudaError:
            return "ncclUnhandledCudaError";
        case ncclSystemError:
            return "ncclSystemError";
        case ncclInternalError:
            return "ncclInternalError";
        case ncclInvalidArgument:
            return "ncclInvalidArgument";
        case ncclInvalidUsage:
            return "ncclInvalidUsage";
        case ncclRemoteError:
            return "ncclRemoteError";
        case ncclInProgress:
            return "ncclInProgress";
        default:
            return "ncclUnknownResult";
    }
}

std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
}

// Sets the backend's device as the calling thread's current one and returns it: the members
// created after it (the stream) and NCCL's init must be on that device.
int use_device_of(const Backend& backend) {
    const int device = backend.options().device_index;
    CUDA_CHECK(cudaSetDevice(device));
    return device;
}

#define NCCL_CALL(call) check((call), #call, __LINE__)

class NcclCollectives final : public Collectives {
  public:
    NcclCollectives(Backend& backend, int rank, int size, const BroadcastFromRank0& broadcast,
                    double timeout_s)
        : rank_(rank),
          size_(size),
          timeout_s_(timeout_s),
          device_(use_device_of(backend)),
          compute_(cuda::compute_stream_of(backend)) {
        // Test hook: a one-GPU machine can only run one rank, where every piece list is "equal";
        // this makes the grouped (uneven) path run there too.
        const char* force = std::getenv("MT_NCCL_FORCE_PIECEWISE");
        force_piecewise_ = force && std::string(force) == "1";

        int version = 0;
        NCCL_CALL(ncclGetVersion(&version));
        // NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch.
        describe_ = "NCCL " + std::to_string(version / 10000) + "." +
                    std::to_string(version / 100 % 100) + "." + std::to_string(version % 100);

        ncclUniqueId id{};
        if (rank_ == 0) NCCL_CALL(ncclGetUniqueId(&id));
        if (broadcast) {
            broadcast(&id, sizeof id);
        } else if (size_ > 1) {
            throw std::invalid_argument(where() +
                                        "NCCL needs a broadcast from rank 0 to pass its unique id "
                                        "to the other ranks, and none was given");
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;  // see the top of the file
        in_flight_ = "start of the communicator (ncclCommInitRankConfig)";
        NCCL_CALL(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
        settle();
        in_flight_.clear();
    }

    ~NcclCollectives() override {
        if (!comm_) return;
        cudaSetDevice(device_);
        // Unwinding from an error elsewhere: the peers will not finish with us, so do not wait
        // timeout_s for them; otherwise flush what was issued and free NCCL's resources.
        bool clean = std::uncaught_exceptions() == 0;
        if (clean) {
            ncclResult_t st = ncclCommFinalize(comm_);
            const auto deadline = Clock::now() + timeout();
            while (st == ncclInProgress && Clock::now() < deadline) {
                std::this_thread::sleep_for(kPollInterval);
                if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) st = ncclInternalError;
            }
            clean = st == ncclSuccess;
        }
        if (clean)
            ncclCommDestroy(comm_);
        else
            ncclCommAbort(comm_);
    }

    NcclCollectives(const NcclCollectives&) = delete;
    NcclCollectives& operator=(const NcclCollectives&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string describe() const override { return describe_; }

    void reserve_slots(size_t n) override {
        CUDA_CHECK(cudaSetDevice(device_));
        fences_.reserve(n);
        while (fences_.size() < n) fences_.emplace_back(false);
    }

    void fence(size_t slot) override {
        CUDA_CHECK(cudaEventRecord(fence_event(slot, "fence"), compute_));
    }

    void reduce_scatter_sum(float* buf, std::span<const size_t> counts, size_t slot) override {
        const Layout l = begin("reduce-scatter", buf, counts, slot);
        if (l.total > 0) {
            const cudaStream_t s = comm_stream_.get();
            if (l.equal) {
                const size_t c = counts[0];
                NCCL_CALL(ncclReduceScatter(buf + size_t(rank_) * c, buf + size_t(rank_) * c, c,
                                            ncclFloat32, ncclSum, comm_, s));
            } else {
                NCCL_CALL(ncclGroupStart());
                size_t off = 0;
                for (int r = 0; r < size_; ++r) {
                    if (counts[r] > 0)
                        NCCL_CALL(ncclReduce(buf + off, buf + off, counts[r], ncclFloat32, ncclSum,
                                             r, comm_, s));
                    off += counts[r];
                }
                NCCL_CALL(ncclGroupEnd());
            }
            settle();
        }
        end();
    }

    void all_gather(float* buf, std::span<const size_t> counts, size_t slot) override {
        const Layout l = begin("all-gather", buf, counts, slot);
        if (l.total > 0) {
            const cudaStream_t s = comm_stream_.get();
            if (l.equal) {
                const size_t c = counts[0];
                NCCL_CALL(ncclAllGather(buf + size_t(rank_) * c, buf, c, ncclFloat32, comm_, s));
            } else {
                NCCL_CALL(ncclGroupStart());
                size_t off = 0;
                for (int r = 0; r < size_; ++r) {
                    if (counts[r] > 0)
                        NCCL_CALL(ncclBroadcast(buf + off, buf + off, counts[r], ncclFloat32, r,
                                                comm_, s));
                    off += counts[r];
                }
                NCCL_CALL(ncclGroupEnd());
            }
            settle();
        }
        end();
    }

    void wait() override {
        require_alive("wait");
        CUDA_CHECK(cudaSetDevice(device_));
        const auto deadline = Clock::now() + timeout();
        size_t done = 0;  // pending_[0, done) have completed
        while (done < pending_.size()) {
            const cudaError_t q = cudaEventQuery(done_[done].get());
            if (q == cudaSuccess) {
                ++done;
                continue;
            }
            in_flight_ = pending_[done];
            if (q != cudaErrorNotReady) {
                cudaGetLastError();  // clear it if it is not sticky
                fail(where() + "NCCL " + in_flight_ + " failed on the device: " +
                     cudaGetErrorName(q) + " (" + cudaGetErrorString(q) + ")");
            }
            poll_async_error();
            if (Clock::now() >= deadline) fail(timeout_message());
            std::this_thread::sleep_for(kPollInterval);
        }
        pending_.clear();
        in_flight_.clear();
    }

  private:
    struct Layout {
        size_t total = 0;
        bool equal = true;  // every piece has counts[0] elements: the single-call path
    };

    std::string where() const {
        return "rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": ";
    }
    std::chrono::nanoseconds timeout() const {
        return std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::duration<double>(timeout_s_));
    }
    std::string timeout_message() const {
        return where() + "NCCL " + in_flight_ + " did not complete within " + seconds(timeout_s_) +
               " s (dist.timeout_s): another rank has died, hangs, or is in a different place "
               "of the program";
    }

    cudaEvent_t fence_event(size_t slot, const char* what) const {
        if (slot >= fences_.size())
            throw std::out_of_range(where() + what + ": slot " + std::to_string(slot) +
                                    " was not reserved (reserve_slots gave " +
                                    std::to_string(fences_.size()) + ")");
        return fences_[slot].get();
    }

    void require_alive(const char* what) const {
        if (!comm_)
            throw CommError(where() + "NCCL " + what +
                            ": the communicator was aborted after an earlier failure");
    }

    // Checks the arguments, names the operation for the error messages and orders the
    // communication stream after the compute stream's fence of `slot`.
    Layout begin(const char* op, float* buf, std::span<const size_t> counts, size_t slot) {
        require_alive(op);
        if (counts.size() != size_t(size_))
            throw std::invalid_argument(where() + "NCCL " + op + ": " +
                                        std::to_string(counts.size()) + " piece counts for " +
                                        std::to_string(size_) + " ranks");
        Layout l;
        for (size_t c : counts) {
            l.total += c;
            l.equal = l.equal && c == counts[0];
        }
        l.equal = l.equal && !force_piecewise_;
        if (l.total > 0 && !buf)
            throw std::invalid_argument(where() + "NCCL " + op + ": null buffer for " +
                                        std::to_string(l.total) + " floats");
        in_flight_ = std::string(op) + " (slot " + std::to_string(slot) + ": " +
                     std::to_string(l.total) + " floats in " + std::to_string(size_) +
                     (l.equal ? " equal" : " uneven") + " pieces)";
        CUDA_CHECK(cudaSetDevice(device_));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream_.get(), fence_event(slot, op), 0));
        return l;
    }

    // Marks the end of the operation just issued on the communication stream, for wait().
    void end() {
        if (done_.size() <= pending_.size()) done_.emplace_back(false);
        CUDA_CHECK(cudaEventRecord(done_[pending_.size()].get(), comm_stream_.get()));
        pending_.push_back(in_flight_);
        in_flight_.clear();
    }

    void check(ncclResult_t st, const char* call, int line) {
        if (st == ncclSuccess || st == ncclInProgress) return;  // in progress: settle() polls
        std::string desc = ncclGetErrorString(st);
        if (comm_) {
            const char* last = ncclGetLastError(comm_);
            if (last && *last) desc += std::string(": ") + last;
        }
        fail(where() +
             format_gpu_error("NCCL", nccl_result_name(st), desc.c_str(), call, __FILE__, line));
    }

    // Throws CommError when the communicator reports an asynchronous error.
    void poll_async_error() {
        ncclResult_t st = ncclSuccess;
        NCCL_CALL(ncclCommGetAsyncError(comm_, &st));
        if (st != ncclSuccess && st != ncclInProgress)
            fail(where() + "NCCL " + in_flight_ + " failed: " + nccl_result_name(st) + " (" +
                 ncclGetErrorString(st) + ")" +
                 (ncclGetLastError(comm_) ? std::string(": ") + ncclGetLastError(comm_) : ""));
    }

    // Non-blocking mode: polls until the last NCCL call has finished on the host (for a
    // collective: has been enqueued on the stream), within the timeout.
    void settle() {
        const auto deadline = Clock::now() + timeout();
        for (;;) {
            ncclResult_t st = ncclSuccess;
            NCCL_CALL(ncclCommGetAsyncError(comm_, &st));
            if (st == ncclSuccess) return;
            if (st != ncclInProgress)
                fail(where() + "NCCL " + in_flight_ + " failed: " + nccl_result_name(st) + " (" +
                     ncclGetErrorString(st) + ")");
            if (Clock::now() >= deadline) fail(timeout_message());
            std::this_thread::sleep_for(kPollInterval);
        }
    }

    // Aborts the communicator (its kernels stop waiting for peers) and throws.
    [[noreturn]] void fail(const std::string& msg) {
        if (comm_) {
            ncclCommAbort(comm_);
            comm_ = nullptr;
        }
        throw CommError(msg);
    }

    int rank_, size_;
    double timeout_s_;
    int device_;
    cudaStream_t compute_;                 // the backend's, not owned
    cuda::CudaStream comm_stream_;         // after device_: created on the backend's device
    std::vector<cuda::CudaEvent> fences_;  // recorded on compute_, waited on by comm_stream_
    std::vector<cuda::CudaEvent> done_;    // done_[i] marks the end of pending_[i]; reused
    std::vector<std::string> pending_;     // operations issued since the last wait()
    std::string in_flight_;                // what the error messages name
    std::string describe_;
    bool force_piecewise_ = false;
    ncclComm_t comm_ = nullptr;
};

#undef NCCL_CALL

}  // namespace

std::unique_ptr<Collectives> create_nccl_collectives(Backend& backend, int rank, int size,
                                                     const BroadcastFromRank0& broadcast,
                                                     double timeout_s) {
    if (backend.kind() != BackendKind::cuda)
        throw BackendError(std::string("NCCL collectives need the CUDA backend, not the ") +
                           to_string(backend.kind()) + " backend");
    if (size < 1 || rank < 0 || rank >= size)
        throw std::invalid_argument("NCCL collectives: rank " + std::to_string(rank) + " of " +
                                    std::to_string(size) + " does not exist");
    if (!(timeout_s > 0))
        throw std::invalid_argument("NCCL collectives: timeout_s must be > 0, got " +
                                    seconds(timeout_s));
    return std::make_unique<NcclCollectives>(backend, rank, size, broadcast, timeout_s);
}

}  // namespace mt

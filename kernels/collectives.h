// Collectives: the communication data parallelism needs, over the ranks of one job, on a
// backend's memory. Two implementations:
//   distributed/mpi_collectives.cpp          MPI on host memory (the CPU backend)
//   kernels/cuda/nccl_collectives.cu  NCCL on device memory, on its own stream (the CUDA backend)
// The gradient synchroniser (distributed/grad_sync.h) is written once against this interface.
//
// A rank's piece. Every operation works on one contiguous range buf[0, n) that is cut into
// size() consecutive pieces, piece r = [offset_r, offset_r + counts[r]) with offset_r the sum
// of counts[0..r). Counts may differ (the last piece is usually shorter) and may be zero.
//
//   reduce_scatter_sum: on rank r, piece r becomes the elementwise sum over all ranks of their
//                       piece r; the other pieces are left unspecified (scratch).
//   all_gather:         every rank's piece r becomes rank r's piece r.
// An all-reduce is a reduce_scatter_sum followed by an all_gather of the same pieces. The
// synchroniser uses exactly that pair for ZeRO stage 0, so stage 0 and stage 1 sum every element
// in the same order and their parameters stay bitwise equal.
//
// Ordering. Operations are issued from one thread (the synchroniser's communication thread),
// in order. `fence(slot)` is called on the thread that issues the compute (the step's thread)
// once the kernels that produce an operation's input have been issued; the operation issued
// later with the same `slot` starts only after them (CUDA: an event recorded on the compute
// stream that the communication stream waits on; CPU: the kernels have already run, nothing to
// do). The fence of a slot happens-before the issue of its operation (the synchroniser fences,
// then hands the operation to its thread through a mutex-guarded queue), and a slot is not
// fenced again before its operation was issued. `wait()` blocks the calling host thread until
// every operation issued so far is complete, and throws CommError (with what the library said)
// on failure or when `timeout_s` passes. After a CommError the object is dead: every later call
// throws, and the caller ends the job (World::abort).
// Gradients and parameters are fp32 (the master copies), so the element type is fixed.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

namespace mt {

// A collective failed, or a rank did not answer within the timeout (it died, hangs or is in a
// different place of the program). The message names the operation, this rank and the timeout.
struct CommError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

class Collectives {
  public:
    virtual ~Collectives() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // "MPI (Open MPI 4.1.4)", "NCCL 2.27.3": the transport, for the report.
    virtual std::string describe() const = 0;

    // Slots for fence(): the synchroniser uses one per gradient bucket plus one for the
    // parameter all-gather. Called once before the first fence.
    virtual void reserve_slots(size_t n) = 0;
    virtual void fence(size_t slot) = 0;

    // buf: backend memory of sum(counts) floats. Issued in order; see the top of the file.
    virtual void reduce_scatter_sum(float* buf, std::span<const size_t> counts, size_t slot) = 0;
    virtual void all_gather(float* buf, std::span<const size_t> counts, size_t slot) = 0;
    // Blocks until every operation issued so far has completed; CommError on failure/timeout.
    virtual void wait() = 0;
};

}  // namespace mt

#include <cstdint>
#include <functional>
#include <memory>

namespace mt {

class Backend;

// Copies `bytes` bytes at `data` from rank 0 to every rank (the others' buffers are overwritten):
// how NCCL's unique id travels, through MPI, without the CUDA backend knowing MPI.
using BroadcastFromRank0 = std::function<void(void* data, size_t bytes)>;

// The device collectives of `backend` for rank `rank` of `size` (kernels/backend_factory.cpp):
// CUDA: NCCL on the backend's device, bootstrapped with `broadcast`; CPU: nullptr (host memory is
// the CPU backend's memory, so the caller uses its MPI collectives). Throws BackendError when the
// build has no NCCL, CommError when NCCL fails to start. Every wait gives up after timeout_s.
std::unique_ptr<Collectives> create_device_collectives(Backend& backend, int rank, int size,
                                                       const BroadcastFromRank0& broadcast,
                                                       double timeout_s);

}  // namespace mt

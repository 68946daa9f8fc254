// Waiting for a non-blocking MPI operation with a deadline (distributed/world.h: every wait is
// timed). Only distributed/*.cpp include this header, and only when the build has MPI.
#pragma once

#include <mpi.h>

#include <string>

namespace mt::dist_detail {

// Polls `request` with MPI_Test until it completes; throws CommError after timeout_s, naming
// `what`, the rank and the size. MPI's non-blocking collectives advance only inside MPI calls
// (no progress thread), so the poll policy trades transfer rate against the cores: it spins for
// the first 500 µs (a small bucket completes in that time), then sleeps 20 µs between polls.
// Measured on 2 cores with 2 ranks (configs/labs/data_parallel.yaml): yielding instead of
// sleeping doubles the all-reduce probe (0.4 -> 0.85 GB/s, as fast as blocking MPI calls) but,
// while backward computes beside an overlapped bucket, the spinning thread takes the compute
// thread's core and the overlapped step got slower (compute ~250 -> ~380 ms); sleeping keeps the
// cores for the ranks still computing, which is what overlap is for.
void wait_for(MPI_Request& request, double timeout_s, const std::string& what, int rank, int size);

// Throws CommError naming `call` when an MPI call did not return MPI_SUCCESS.
void check_mpi(int rc, const char* call);

}  // namespace mt::dist_detail

// Waiting for a non-blocking MPI operation with a deadline (dist/world.h: every wait is timed).
// Only dist/*.cpp include this header, and only when the build has MPI.
#pragma once

#include <mpi.h>

#include <string>

namespace mt::dist_detail {

// Polls `request` with MPI_Test until it completes; throws CommError after timeout_s, naming
// `what`, the rank and the size. MPI's non-blocking collectives advance only inside MPI calls
// (no progress thread), so the poll rate is the transfer rate: it spins for the first 500 µs
// (a bucket on one machine often completes in that time), then sleeps 20 µs between polls so a
// waiting rank leaves the cores to the ranks still computing.
void wait_for(MPI_Request& request, double timeout_s, const std::string& what, int rank, int size);

// Throws CommError naming `call` when an MPI call did not return MPI_SUCCESS.
void check_mpi(int rc, const char* call);

}  // namespace mt::dist_detail

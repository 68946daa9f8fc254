// The world of a data-parallel job: which rank this process is, how many there are, and the
// host-side collectives the harness needs (a broadcast, sums, gathers), each with a timeout.
//
// `mpirun -np N microtrain ...` starts N processes; World::join() in main() makes them one MPI
// job (MPI_Init_thread with MPI_THREAD_MULTIPLE: the gradient synchroniser's thread and the
// step's thread both talk). A process not started by a launcher is a world of one rank and never
// touches MPI, exactly as a build without MPI (MT_HAVE_MPI undefined) is.
//
// Timeouts. MPI's blocking calls wait forever for a rank that died or took another branch; every
// wait here is a non-blocking operation polled until it completes or `timeout_s` passes, then a
// CommError names the operation, this rank and the timeout. The caller then ends the job
// (abort()), so one failed rank never leaves the others hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/collectives.h"

namespace mt {

class World {
  public:
    // Joins the job when this process was started by a launcher (Open MPI's mpirun sets
    // OMPI_COMM_WORLD_SIZE; PMI/PMIx launchers set PMI_SIZE / PMIX_RANK); otherwise a world of
    // one. Throws CommError when launched by mpirun with several ranks but this build has no
    // MPI, or when MPI cannot give MPI_THREAD_MULTIPLE. Call once, from main().
    static std::unique_ptr<World> join(int* argc, char*** argv);
    // The process's world: the one join() made, or a world of one when none was made (tests).
    static World& current();

    World(const World&) = delete;
    World& operator=(const World&) = delete;
    ~World();  // MPI_Finalize (not after abort())

    int rank() const { return rank_; }
    int size() const { return size_; }
    bool distributed() const { return size_ > 1; }
    // "MPI (Open MPI v4.1.4, ...)" or "single process (no MPI)".
    const std::string& transport() const { return transport_; }

    // Host collectives over every rank, in the same order on every rank. `what` names the
    // operation in a timeout's message ("the config check", "the loss of step 12").
    void broadcast(void* data, size_t bytes, double timeout_s, const char* what);
    void allreduce_sum(double* x, int n, double timeout_s, const char* what);
    void allreduce_max(double* x, int n, double timeout_s, const char* what);
    // all[r * n .. r * n + n) = rank r's mine[0 .. n).
    void all_gather(const float* mine, int n, float* all, double timeout_s, const char* what);
    // Rank 0 receives every rank's string (in rank order); the others receive an empty vector.
    std::vector<std::string> gather(const std::string& mine, double timeout_s, const char* what);

    // MPI collectives on host memory over a communicator of their own (so they never match
    // the calls above), for the gradient synchroniser. Throws CommError on a world of one.
    std::unique_ptr<Collectives> host_collectives(double timeout_s);

    // Ends every rank of the job now (MPI_Abort), after the caller printed why. On a world of
    // one: std::exit(code).
    [[noreturn]] void abort(int code);

  private:
    World() = default;
    int rank_ = 0, size_ = 1;
    bool mpi_ = false;
    std::string transport_ = "single process (no MPI)";
};

// Under mpirun, rank 0's stdout is a pty that mpirun drains; when it ends a job (Ctrl-C on
// mpirun) it stops draining for its grace period before it signals the ranks, and a rank that
// prints would block there, miss the signal and never write its report. This makes stdout
// non-blocking on a distributed world, so a print that cannot go out is dropped instead. No-op
// on a world of one.
void keep_output_from_blocking(const World& world);

// The environment variable that says a launcher started this process with several ranks, and
// that count (0 when none: a plain process).
int launcher_world_size();

}  // namespace mt

// The world of a data-parallel job (see world.h).
#include "distributed/world.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#if defined(MT_HAVE_MPI)
#include <mpi.h>

#include "distributed/mpi_collectives.h"
#include "distributed/mpi_wait.h"
#endif

namespace mt {
namespace {

World* g_current = nullptr;

int env_int(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : 0;
}

}  // namespace

int launcher_world_size() {
    if (int n = env_int("OMPI_COMM_WORLD_SIZE")) return n;
    if (int n = env_int("PMI_SIZE")) return n;
    if (int n = env_int("PMIX_SIZE")) return n;
    return std::getenv("PMIX_RANK") ? 1 : 0;
}

#if defined(MT_HAVE_MPI)
namespace dist_detail {

void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw CommError(std::string(call) + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

void wait_for(MPI_Request& request, double timeout_s, const std::string& what, int rank, int size) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto spin_until = start + std::chrono::microseconds(500);
    const auto deadline = start + std::chrono::duration_cast<clock::duration>(
                                      std::chrono::duration<double>(timeout_s));
    for (;;) {
        int done = 0;
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) return;
        const auto now = clock::now();
        if (now > deadline) {
            char t[32];
            std::snprintf(t, sizeof t, "%g", timeout_s);
            throw CommError("rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " +
                            what + " did not complete within " + t +
                            " s (dist.timeout_s): another rank has died, hangs, or is at a "
                            "different place of the program (see its output above)");
        }
        if (now > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

}  // namespace dist_detail

using dist_detail::check_mpi;
using dist_detail::wait_for;

std::unique_ptr<World> World::join(int* argc, char*** argv) {
    std::unique_ptr<World> w(new World());
    if (launcher_world_size() == 0) {
        g_current = w.get();
        return w;
    }
    int provided = 0;
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    w->mpi_ = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size_);
    // Errors come back as return codes (turned into CommError), not as an abort inside MPI.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (const size_t cut = v.find_first_of(",\n"); cut != std::string::npos) v.resize(cut);
    w->transport_ = "MPI (" + v + ")";
    if (provided < MPI_THREAD_MULTIPLE && w->size_ > 1) {
        MPI_Finalize();
        w->mpi_ = false;
        throw CommError("the MPI library (" + v +
                        ") does not provide MPI_THREAD_MULTIPLE, which data parallel needs (the "
                        "gradient synchroniser's thread and the step's thread both use MPI); "
                        "use an MPI built with thread support (Debian's openmpi-bin has it)");
    }
    g_current = w.get();
    return w;
}

World::~World() {
    if (g_current == this) g_current = nullptr;
    if (mpi_) MPI_Finalize();
}

void World::broadcast(void* data, size_t bytes, double timeout_s, const char* what) {
    if (!distributed()) return;
    if (bytes > INT_MAX) throw CommError(std::string(what) + ": broadcast of more than 2^31 bytes");
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD, &req),
              "MPI_Ibcast");
    wait_for(req, timeout_s, what, rank_, size_);
}

void World::allreduce_sum(double* x, int n, double timeout_s, const char* what) {
    if (!distributed()) return;
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &req),
              "MPI_Iallreduce");
    wait_for(req, timeout_s, what, rank_, size_);
}

void World::allreduce_max(double* x, int n, double timeout_s, const char* what) {
    if (!distributed()) return;
    MPI_Request req;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req),
              "MPI_Iallreduce");
    wait_for(req, timeout_s, what, rank_, size_);
}

void World::all_gather(const float* mine, int n, float* all, double timeout_s, const char* what) {
    if (!distributed()) {
        std::memcpy(all, mine, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    MPI_Request req;
    check_mpi(MPI_Iallgather(mine, n, MPI_FLOAT, all, n, MPI_FLOAT, MPI_COMM_WORLD, &req),
              "MPI_Iallgather");
    wait_for(req, timeout_s, what, rank_, size_);
}

std::vector<std::string> World::gather(const std::string& mine, double timeout_s,
                                       const char* what) {
    if (!distributed()) return {mine};
    if (mine.size() > INT_MAX) throw CommError(std::string(what) + ": more than 2^31 bytes");
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(rank_ == 0 ? size_ : 0);
    MPI_Request req;
    check_mpi(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &req),
              "MPI_Igather");
    wait_for(req, timeout_s, what, rank_, size_);
    std::vector<int> displs(lens.size());
    long long total = 0;
    for (size_t r = 0; r < lens.size(); ++r) {
        displs[r] = static_cast<int>(total);
        total += lens[r];
        if (total > INT_MAX) throw CommError(std::string(what) + ": more than 2^31 bytes");
    }
    std::string buf(static_cast<size_t>(total), '\0');
    check_mpi(MPI_Igatherv(mine.data(), len, MPI_BYTE, buf.data(), lens.data(), displs.data(),
                           MPI_BYTE, 0, MPI_COMM_WORLD, &req),
              "MPI_Igatherv");
    wait_for(req, timeout_s, what, rank_, size_);
    std::vector<std::string> out;
    for (size_t r = 0; r < lens.size(); ++r)
        out.push_back(buf.substr(static_cast<size_t>(displs[r]), static_cast<size_t>(lens[r])));
    return out;
}

std::unique_ptr<Collectives> World::host_collectives(double timeout_s) {
    if (!distributed()) throw CommError("host_collectives: a world of one rank has no peers");
    return create_mpi_collectives(MPI_COMM_WORLD, transport_, timeout_s);
}

void World::abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
}

#else  // no MPI in this build: a world of one, always

std::unique_ptr<World> World::join(int*, char***) {
    std::unique_ptr<World> w(new World());
    if (launcher_world_size() > 1)
        throw CommError("started by mpirun with " + std::to_string(launcher_world_size()) +
                        " ranks, but this build of microtrain has no MPI (CMake did not find it "
                        "or MT_ENABLE_MPI=OFF); install libopenmpi-dev (tools/setup.sh does) "
                        "and rebuild");
    g_current = w.get();
    return w;
}

World::~World() {
    if (g_current == this) g_current = nullptr;
}

void World::broadcast(void*, size_t, double, const char*) {}
void World::allreduce_sum(double*, int, double, const char*) {}
void World::allreduce_max(double*, int, double, const char*) {}
void World::all_gather(const float* mine, int n, float* all, double, const char*) {
    std::memcpy(all, mine, static_cast<size_t>(n) * sizeof(float));
}
std::vector<std::string> World::gather(const std::string& mine, double, const char*) {
    return {mine};
}
std::unique_ptr<Collectives> World::host_collectives(double) {
    throw CommError("host_collectives: this build has no MPI");
}
void World::abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::exit(code);
}

#endif

void keep_output_from_blocking(const World& world) {
    if (!world.distributed()) return;
    const int flags = fcntl(STDOUT_FILENO, F_GETFL);
    if (flags >= 0) fcntl(STDOUT_FILENO, F_SETFL, flags | O_NONBLOCK);
}

World& World::current() {
    if (g_current) return *g_current;
    static World single;  // tests and tools that never called join()
    return single;
}

}  // namespace mt

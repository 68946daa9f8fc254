// MPI collectives on host memory: the CPU backend's transport for data parallel.
//
// reduce_scatter_sum is MPI_Ireduce_scatter with one count per rank (pieces may be uneven): every
// rank sends its whole buffer and receives the sum of its piece into a scratch buffer, which is
// copied onto its piece. all_gather is MPI_Iallgatherv in place (each rank's contribution is
// already at its piece's offset). Both are ring-like in Open MPI for large buffers: a rank sends
// (N-1)/N of the buffer in each, which is what distributed/grad_sync.cpp counts as bytes sent.
// The calls run on the synchroniser's thread and complete before they return (wait() has nothing
// left to do); each is polled with a deadline (distributed/mpi_wait.h).
#include "distributed/mpi_collectives.h"

#include <climits>
#include <cstring>
#include <vector>

#include "distributed/mpi_wait.h"

namespace mt {
namespace {

using dist_detail::check_mpi;
using dist_detail::wait_for;

class MpiCollectives final : public Collectives {
  public:
    MpiCollectives(MPI_Comm comm, std::string transport, double timeout_s)
        : transport_(std::move(transport)), timeout_s_(timeout_s) {
        check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~MpiCollectives() override { MPI_Comm_free(&comm_); }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string describe() const override { return transport_; }
    void reserve_slots(size_t) override {}
    void fence(size_t) override {}  // CPU kernels are synchronous: their output is ready

    void reduce_scatter_sum(float* buf, std::span<const size_t> counts, size_t) override {
        const Layout l = layout(counts, "reduce-scatter");
        scratch_.resize(counts[static_cast<size_t>(rank_)]);
        MPI_Request req;
        check_mpi(MPI_Ireduce_scatter(buf, scratch_.data(), l.counts.data(), MPI_FLOAT, MPI_SUM,
                                      comm_, &req),
                  "MPI_Ireduce_scatter");
        wait_for(req, timeout_s_, "the reduce-scatter of a gradient bucket", rank_, size_);
        std::memcpy(buf + l.displs[static_cast<size_t>(rank_)], scratch_.data(),
                    scratch_.size() * sizeof(float));
    }

    void all_gather(float* buf, std::span<const size_t> counts, size_t) override {
        const Layout l = layout(counts, "all-gather");
        MPI_Request req;
        check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, l.counts.data(),
                                  l.displs.data(), MPI_FLOAT, comm_, &req),
                  "MPI_Iallgatherv");
        wait_for(req, timeout_s_, "the all-gather of a bucket", rank_, size_);
    }

    void wait() override {}

  private:
    struct Layout {
        std::vector<int> counts, displs;
    };
    Layout layout(std::span<const size_t> counts, const char* what) const {
        if (counts.size() != static_cast<size_t>(size_))
            throw CommError(std::string(what) + ": " + std::to_string(counts.size()) +
                            " pieces for " + std::to_string(size_) + " ranks");
        Layout l;
        size_t off = 0;
        for (size_t c : counts) {
            if (off + c > static_cast<size_t>(INT_MAX))
                throw CommError(std::string(what) +
                                ": a bucket of more than 2^31 floats (lower "
                                "dist.bucket_mb)");
            l.counts.push_back(static_cast<int>(c));
            l.displs.push_back(static_cast<int>(off));
            off += c;
        }
        return l;
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    std::string transport_;
    double timeout_s_;
    std::vector<float> scratch_;  // the received piece of a reduce-scatter (reused)
};

}  // namespace

std::unique_ptr<Collectives> create_mpi_collectives(MPI_Comm comm, const std::string& transport,
                                                    double timeout_s) {
    return std::make_unique<MpiCollectives>(comm, transport, timeout_s);
}

}  // namespace mt

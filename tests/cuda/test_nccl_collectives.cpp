// NCCL collectives (kernels/cuda/nccl_collectives.cu) on one GPU: a one-rank communicator, where
// reduce-scatter and all-gather must leave every piece as it was (bitwise), on the single-call
// path (equal pieces) and on the grouped path (forced by MT_NCCL_FORCE_PIECEWISE=1, since one
// rank never has uneven pieces); the fence orders a collective after the compute stream's work;
// a collective that cannot start times out with a CommError that names rank, size and timeout.
// Without NCCL in the build every test skips; without a device the GPU tests skip.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/collectives.h"
#include "tests/cuda/cuda_test_util.h"

#if defined(MT_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda/nccl_collectives.h"
#endif

namespace mt {
namespace {

#define MT_SKIP_WITHOUT_NCCL() GTEST_SKIP() << "this build has no NCCL"

// The CPU backend needs no device collectives: its memory is host memory (MPI's).
TEST(DeviceCollectives, FactoryGivesNoneForTheCpuBackend) {
    auto cpu = create_backend(BackendKind::cpu);
    EXPECT_EQ(create_device_collectives(
                  *cpu, 0, 1, [](void*, size_t) {}, 10.0),
              nullptr);
}

TEST(NcclCollectives, RejectsACpuBackend) {
#if defined(MT_HAVE_NCCL)
    auto cpu = create_backend(BackendKind::cpu);
    try {
        create_nccl_collectives(
            *cpu, 0, 1, [](void*, size_t) {}, 10.0);
        FAIL() << "no BackendError";
    } catch (const BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("CUDA backend"), std::string::npos) << e.what();
    }
#else
    MT_SKIP_WITHOUT_NCCL();
#endif
}

#if defined(MT_HAVE_NCCL)

std::vector<float> pattern(size_t n) {
    std::vector<float> v = test::randn(n, 7);
    if (n > 0) v[0] = -0.0f;  // a bit pattern a stray "+ 0" would change
    return v;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Blocks the compute stream until released: a host function enqueued on it spins on a flag.
// The destructor releases it, so a failing test never leaves the backend's stream stuck.
class ComputeGate {
  public:
    explicit ComputeGate(Backend& gpu) {
        cudaLaunchHostFunc(
            cuda::compute_stream_of(gpu),
            [](void* p) {
                auto* open = static_cast<std::atomic<bool>*>(p);
                while (!open->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            },
            &open_);
    }
    ~ComputeGate() { release(); }
    void release() { open_.store(true); }

  private:
    std::atomic<bool> open_{false};
};

// Param: true = the grouped per-piece path (ncclReduce / ncclBroadcast per root).
class OneRankNccl : public ::testing::TestWithParam<bool> {
  protected:
    void SetUp() override {
        MT_SKIP_WITHOUT_CUDA();
        if (GetParam())
            setenv("MT_NCCL_FORCE_PIECEWISE", "1", 1);
        else
            unsetenv("MT_NCCL_FORCE_PIECEWISE");
        gpu = create_backend(BackendKind::cuda);
        coll = create_device_collectives(
            *gpu, 0, 1, [](void*, size_t) {}, timeout_s);
        ASSERT_NE(coll, nullptr);
        coll->reserve_slots(2);
    }
    void TearDown() override { unsetenv("MT_NCCL_FORCE_PIECEWISE"); }

    // Runs `op` on a buffer of n floats and returns (before, after).
    template <class Op>
    std::pair<std::vector<float>, std::vector<float>> run(size_t n, Op op) {
        const auto before = pattern(n);
        DeviceBuffer buf(*gpu, (n + 1) * sizeof(float), MemoryCategory::grads);
        if (n > 0) gpu->copy_to_device(buf.get(), before.data(), n * sizeof(float));
        coll->fence(0);
        op(buf.as<float>(), n);
        coll->wait();
        std::vector<float> after(n);
        if (n > 0) gpu->copy_to_host(after.data(), buf.get(), n * sizeof(float));
        return {before, after};
    }

    double timeout_s = 30.0;
    std::unique_ptr<Backend> gpu;
    std::unique_ptr<Collectives> coll;
};

TEST_P(OneRankNccl, ReduceScatterLeavesPiecesUnchanged) {
    for (size_t n : {size_t(4099), size_t(1), size_t(0)}) {
        auto [before, after] = run(n, [&](float* buf, size_t count) {
            const size_t counts[] = {count};
            coll->reduce_scatter_sum(buf, counts, 0);
        });
        EXPECT_TRUE(bitwise_equal(before, after)) << n << " floats";
    }
}

TEST_P(OneRankNccl, AllGatherLeavesPiecesUnchanged) {
    for (size_t n : {size_t(4099), size_t(1), size_t(0)}) {
        auto [before, after] = run(n, [&](float* buf, size_t count) {
            const size_t counts[] = {count};
            coll->all_gather(buf, counts, 0);
        });
        EXPECT_TRUE(bitwise_equal(before, after)) << n << " floats";
    }
}

TEST_P(OneRankNccl, AllReducePairLeavesBufferUnchanged) {
    auto [before, after] = run(100000, [&](float* buf, size_t count) {
        const size_t counts[] = {count};
        coll->reduce_scatter_sum(buf, counts, 0);
        coll->all_gather(buf, counts, 0);
    });
    EXPECT_TRUE(bitwise_equal(before, after));
}

// wait() may only return once the compute stream has passed the fence: while the compute stream
// is held before a memset, wait() must not return; once released, the memset is complete when
// wait() returns (no synchronisation in between).
TEST_P(OneRankNccl, FenceOrdersCollectiveAfterComputeStreamWork) {
    const size_t n = 1 << 16;
    DeviceBuffer buf(*gpu, n * sizeof(float), MemoryCategory::grads);
    const auto ones = std::vector<float>(n, 1.0f);
    gpu->copy_to_device(buf.get(), ones.data(), n * sizeof(float));
    gpu->synchronize();
    ComputeGate gate(*gpu);
    gpu->memset_zero(buf.get(), n * sizeof(float));
    coll->fence(1);
    const size_t counts[] = {n};
    coll->all_gather(buf.as<float>(), counts, 1);
    auto waited = std::async(std::launch::async, [&] { coll->wait(); });
    EXPECT_EQ(waited.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
        << "wait() returned while the compute stream was still held before the fence";
    gate.release();
    waited.get();
    EXPECT_EQ(cudaStreamQuery(cuda::compute_stream_of(*gpu)), cudaSuccess)
        << "the collective completed before the compute stream reached the fence";
    std::vector<float> after(n);
    gpu->copy_to_host(after.data(), buf.get(), n * sizeof(float));
    EXPECT_TRUE(bitwise_equal(after, std::vector<float>(n, 0.0f)));
}

INSTANTIATE_TEST_SUITE_P(Paths, OneRankNccl, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                             return i.param ? std::string("GroupedPieces")
                                            : std::string("SingleCall");
                         });

class OneRankNcclPlain : public ::testing::Test {
  protected:
    void SetUp() override {
        MT_SKIP_WITHOUT_CUDA();
        gpu = create_backend(BackendKind::cuda);
    }
    std::unique_ptr<Backend> gpu;
};

TEST_F(OneRankNcclPlain, DescribeNamesNcclAndItsVersion) {
    auto coll = create_device_collectives(
        *gpu, 0, 1, [](void*, size_t) {}, 30.0);
    const std::string d = coll->describe();
    EXPECT_EQ(d.rfind("NCCL ", 0), 0u) << d;
    EXPECT_EQ(coll->rank(), 0);
    EXPECT_EQ(coll->size(), 1);
}

TEST_F(OneRankNcclPlain, WaitWithNothingIssuedReturns) {
    auto coll = create_device_collectives(
        *gpu, 0, 1, [](void*, size_t) {}, 30.0);
    coll->wait();
}

// A collective held behind a fence that the compute stream does not reach in time: wait() gives
// up after the timeout with a message naming the operation, rank, size and timeout.
TEST_F(OneRankNcclPlain, WaitTimesOutWithACommErrorNamingRankSizeAndTimeout) {
    auto coll = create_device_collectives(
        *gpu, 0, 1, [](void*, size_t) {}, 0.5);
    coll->reserve_slots(1);
    DeviceBuffer buf(*gpu, 1024 * sizeof(float), MemoryCategory::grads);
    ComputeGate gate(*gpu);
    // On the timeout, wait() aborts the communicator, and ncclCommAbort waits for the device
    // (it frees device memory), which the gate holds: it returns only once the gate opens. So
    // another thread opens it well after the 0.5 s timeout (a peer that hangs is not a host
    // function on our own stream; this is the test's stand-in for one). Seen on an H200: without
    // the opener the test hung.
    std::thread opener([&gate] {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        gate.release();
    });
    coll->fence(0);
    const size_t counts[] = {1024};
    coll->reduce_scatter_sum(buf.as<float>(), counts, 0);
    const auto t0 = std::chrono::steady_clock::now();
    try {
        coll->wait();
        FAIL() << "no CommError";
    } catch (const CommError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("rank 0 of 1"), std::string::npos) << m;
        EXPECT_NE(m.find("reduce-scatter"), std::string::npos) << m;
        EXPECT_NE(m.find("within 0.5 s"), std::string::npos) << m;
    }
    std::printf("  wait() threw after %.2f s (timeout 0.5 s, the gate opens at 3 s)\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    opener.join();
    gpu->synchronize();
    // Aborted: later calls say so instead of touching a dead communicator.
    EXPECT_THROW(coll->wait(), CommError);
}

#else  // !MT_HAVE_NCCL

TEST(NcclCollectives, OneRankReduceScatterAndAllGather) {
    MT_SKIP_WITHOUT_NCCL();
}

#endif

}  // namespace
}  // namespace mt

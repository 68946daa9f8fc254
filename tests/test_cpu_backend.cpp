// CpuBackend plumbing: per-category allocator accounting (current, peak, reset_peaks),
// alignment, clear errors for unsupported options and bad pointers, events, device identity and
// memory info, copies, and that ops dispatch to the attention variant the options chose.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/sanitizers.h"

// Under AddressSanitizer (the asan preset) an impossible request must come back as nullptr,
// as from the real allocator, so the backend can report OutOfMemoryError (ImpossibleAllocation
// below); by default ASan aborts the process instead. The asan test preset sets the same option
// in ASAN_OPTIONS; this covers running the executable by hand. ASAN_OPTIONS still overrides it.
#ifdef MT_UNDER_ASAN
extern "C" const char* __asan_default_options() {
    return "allocator_may_return_null=1";
}
#endif

namespace {

using mt::MemoryCategory;

size_t idx(MemoryCategory c) {
    return static_cast<size_t>(c);
}

std::string construction_error(const mt::BackendOptions& o) {
    try {
        mt::create_backend(mt::BackendKind::cpu, o);
    } catch (const mt::BackendError& e) {
        return e.what();
    }
    return "";
}

TEST(CpuBackend, AllocatorTracksCurrentAndPeakPerCategory) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    EXPECT_EQ(be->kind(), mt::BackendKind::cpu);
    void* a = be->allocate(1000, MemoryCategory::params);
    void* b = be->allocate(3000, MemoryCategory::activations);
    void* c = be->allocate(500, MemoryCategory::activations);
    auto s = be->memory_stats();
    EXPECT_EQ(s.current[idx(MemoryCategory::params)], 1000u);
    EXPECT_EQ(s.current[idx(MemoryCategory::activations)], 3500u);
    EXPECT_EQ(s.current[idx(MemoryCategory::grads)], 0u);
    EXPECT_EQ(s.current_total, 4500u);
    EXPECT_EQ(s.peak_total, 4500u);
    be->deallocate(b);
    s = be->memory_stats();
    EXPECT_EQ(s.current[idx(MemoryCategory::activations)], 500u);
    EXPECT_EQ(s.peak[idx(MemoryCategory::activations)], 3500u);
    EXPECT_EQ(s.current_total, 1500u);
    EXPECT_EQ(s.peak_total, 4500u);
    void* d = be->allocate_host(200, /*pinned=*/true);
    EXPECT_EQ(be->memory_stats().current[idx(MemoryCategory::data)], 200u);
    be->deallocate_host(d);
    be->deallocate(a);
    be->deallocate(c);
    s = be->memory_stats();
    EXPECT_EQ(s.current_total, 0u);
    EXPECT_EQ(s.peak_total, 4500u);
}

TEST(CpuBackend, ResetPeaksDropsPeaksToCurrent) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    mt::DeviceBuffer keep(*be, 100, MemoryCategory::grads);
    { mt::DeviceBuffer tmp(*be, 10000, MemoryCategory::workspace); }
    EXPECT_EQ(be->memory_stats().peak[idx(MemoryCategory::workspace)], 10000u);
    be->reset_peaks();
    const auto s = be->memory_stats();
    EXPECT_EQ(s.peak[idx(MemoryCategory::workspace)], 0u);
    EXPECT_EQ(s.peak[idx(MemoryCategory::grads)], 100u);
    EXPECT_EQ(s.peak_total, 100u);
}

TEST(CpuBackend, AllocationsAre256ByteAligned) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    std::vector<mt::DeviceBuffer> bufs;
    for (size_t n : {1u, 7u, 256u, 1000u, 65537u}) {
        bufs.emplace_back(*be, n, MemoryCategory::activations);
        EXPECT_EQ(reinterpret_cast<std::uintptr_t>(bufs.back().get()) % 256, 0u) << n;
    }
}

TEST(CpuBackend, ImpossibleAllocationIsOutOfMemoryNamingTheCategory) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    try {
        be->allocate(size_t{1} << 62, MemoryCategory::activations);
        FAIL() << "expected OutOfMemoryError";
    } catch (const mt::OutOfMemoryError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
        EXPECT_NE(msg.find("available"), std::string::npos) << msg;
    }
    EXPECT_EQ(be->memory_stats().current_total, 0u);
}

TEST(CpuBackend, DeallocatingAForeignPointerIsAnError) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    int x = 0;
    EXPECT_THROW(be->deallocate(&x), mt::BackendError);
    EXPECT_NO_THROW(be->deallocate(nullptr));
}

TEST(CpuBackend, Bf16AndTf32AreRejectedPointingToCuda) {
    mt::BackendOptions o;
    o.precision = mt::Precision::bf16;
    EXPECT_EQ(construction_error(o),
              "the CPU backend runs fp32 only; precision bf16 needs backend: cuda");
    o.precision = mt::Precision::tf32;
    const auto msg = construction_error(o);
    EXPECT_NE(msg.find("fp32 only"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tf32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("backend: cuda"), std::string::npos) << msg;
}

TEST(CpuBackend, CudnnAttentionIsRejectedNamingTheCpuVariants) {
    mt::BackendOptions o;
    o.kernels.attention = mt::AttentionImpl::cudnn;
    const auto msg = construction_error(o);
    EXPECT_NE(msg.find("cudnn"), std::string::npos) << msg;
    EXPECT_NE(msg.find("naive or flash"), std::string::npos) << msg;
}

TEST(CpuBackend, EventsMeasureNonNegativeElapsedTime) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    auto start = be->create_event();
    auto stop = be->create_event();
    start->record();
    volatile double sink = 0;
    for (int i = 0; i < 100000; i++) sink = sink + i;
    stop->record();
    be->synchronize();
    EXPECT_GE(stop->elapsed_ms_since(*start), 0.0);
    auto unrecorded = be->create_event();
    EXPECT_THROW(unrecorded->elapsed_ms_since(*start), mt::BackendError);
}

TEST(CpuBackend, DeviceNameNamesTheCpuThreadCountIsaLevelAndGemm) {
    const int saved_threads = omp_get_max_threads();
    mt::BackendOptions o;
    o.num_threads = 1;
    auto be = mt::create_backend(mt::BackendKind::cpu, o);
    EXPECT_EQ(omp_get_max_threads(), 1);
    omp_set_num_threads(saved_threads);
    const auto name = be->device_name();
    EXPECT_EQ(name.rfind("CPU: ", 0), 0u) << name;
    const std::string level = mt::cpu::to_string(mt::cpu::cpu_isa_from_environment());
    EXPECT_NE(
        name.find("(1 thread, " + level + " kernels, " +
                  mt::cpu::kernel_table(mt::cpu::cpu_isa_from_environment()).gemm_impl_name() +
                  " GEMM)"),
        std::string::npos)
        << name;
    o.num_threads = -2;
    EXPECT_NE(construction_error(o).find("num_threads"), std::string::npos);
}

TEST(CpuBackend, DeviceMemoryInfoReportsResidentSetAndTotal) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    const auto info = be->device_memory_info();
    EXPECT_TRUE(info.available);
    EXPECT_GT(info.used_bytes, 0u);
    EXPECT_GT(info.total_bytes, info.used_bytes);
    EXPECT_LE(info.free_bytes, info.total_bytes);
}

TEST(CpuBackend, CopiesMemsetAndCastParamsMoveTheBytes) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    std::vector<float> host = {1, 2, 3, 4, 5}, back(5, 0.0f);
    mt::DeviceBuffer d1(*be, 5 * sizeof(float), MemoryCategory::params);
    mt::DeviceBuffer d2(*be, 5 * sizeof(float), MemoryCategory::params);
    be->copy_to_device(d1.get(), host.data(), 5 * sizeof(float));
    be->copy_device(d2.get(), d1.get(), 5 * sizeof(float));
    be->copy_to_host(back.data(), d2.get(), 5 * sizeof(float));
    EXPECT_EQ(back, host);
    be->run(mt::op::CastParams{.dst = d2.get(), .src = host.data() + 1, .n = 4});
    be->copy_to_host(back.data(), d2.get(), 4 * sizeof(float));
    EXPECT_EQ(back[0], 2.0f);
    EXPECT_EQ(back[3], 5.0f);
    be->memset_zero(d1.get(), 5 * sizeof(float));
    be->copy_to_host(back.data(), d1.get(), 5 * sizeof(float));
    EXPECT_EQ(back, std::vector<float>(5, 0.0f));
}

// A large memset is split among the team (kernels/cpu/cpu_backend.cpp): every byte of the range
// and none outside it, for any team size, an odd length and a start off any alignment.
TEST(CpuBackend, MemsetZeroClearsExactlyItsBytesForEveryThreadCount) {
    const int saved_threads = omp_get_max_threads();
    constexpr size_t kGuard = 64, kOffset = 5;
    for (const size_t bytes : {size_t{(1u << 20) - 1}, size_t{(3u << 20) + 37}})
        for (const int threads : {1, 2, 3, 4}) {
            mt::BackendOptions o;
            o.num_threads = threads;
            auto be = mt::create_backend(mt::BackendKind::cpu, o);
            std::vector<unsigned char> buf(kOffset + bytes + kGuard, 0xAB);
            be->memset_zero(buf.data() + kOffset, bytes);
            for (size_t i = 0; i < kOffset; ++i)
                ASSERT_EQ(buf[i], 0xAB) << "before the range, byte " << i << ", " << threads;
            for (size_t i = kOffset; i < kOffset + bytes; ++i)
                ASSERT_EQ(buf[i], 0)
                    << "byte " << i - kOffset << " of " << bytes << ", " << threads;
            for (size_t i = kOffset + bytes; i < buf.size(); ++i)
                ASSERT_EQ(buf[i], 0xAB) << "after the range, byte " << i << ", " << threads;
        }
    omp_set_num_threads(saved_threads);
}

TEST(CpuBackend, AttentionDispatchesToTheChosenVariantAndItsSavedSize) {
    const int B = 2, T = 9, C = 12, NH = 3;
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> qkv(B * T * 3 * C);
    for (auto& x : qkv) x = u(rng);
    std::vector<float> outs[2];
    for (mt::AttentionImpl impl : {mt::AttentionImpl::naive, mt::AttentionImpl::flash}) {
        auto be = mt::create_backend(mt::BackendKind::cpu);
        const size_t saved = mt::attention_saved_elems(impl, B, T, NH);
        EXPECT_EQ(saved,
                  impl == mt::AttentionImpl::naive ? size_t{B * NH * T * T} : size_t{B * NH * T});
        std::vector<float> out(B * T * C), sv(saved), ref(B * T * C), refsv(saved);
        const mt::op::AttentionForward op{.impl = impl,
                                          .out = out.data(),
                                          .saved = sv.data(),
                                          .qkv = qkv.data(),
                                          .B = B,
                                          .T = T,
                                          .C = C,
                                          .NH = NH};
        be->run(op);
        if (impl == mt::AttentionImpl::naive)
            mt::cpu::attention_forward_naive(ref.data(), refsv.data(), qkv.data(), B, T, C, NH);
        else
            mt::cpu::attention_forward_flash(ref.data(), refsv.data(), qkv.data(), B, T, C, NH);
        EXPECT_EQ(out, ref);
        EXPECT_EQ(sv, refsv);
        mt::op::AttentionForward five_heads = op;
        five_heads.NH = 5;  // C = 12 is no multiple of 5
        EXPECT_THROW(be->run(five_heads), mt::BackendError);
        outs[impl == mt::AttentionImpl::naive ? 0 : 1] = out;
    }
    for (size_t i = 0; i < outs[0].size(); i++) EXPECT_NEAR(outs[0][i], outs[1][i], 1e-5);
}

TEST(CpuBackend, GeluEpilogueWithoutPreActBufferIsAnError) {
    auto be = mt::create_backend(mt::BackendKind::cpu);
    std::vector<float> x(4, 1.0f), w(4, 1.0f), out(4);
    EXPECT_THROW(be->run(mt::op::MatmulForward{.out = out.data(),
                                               .inp = x.data(),
                                               .weight = w.data(),
                                               .N = 2,
                                               .C = 2,
                                               .OC = 2,
                                               .epilogue = mt::MatmulEpilogue::gelu}),
                 mt::BackendError);
}

}  // namespace

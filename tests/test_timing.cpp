// Step statistics, the PhaseTimer, the memory tracker, the per-op profiler, the peak cache and
// the CPU time of other processes (/proc parsing).
// No assertion on how fast anything is: only on arithmetic and bookkeeping.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/cpu_load.h"
#include "engine/memory.h"
#include "engine/profile.h"
#include "engine/timing.h"
#include "kernels/backend.h"
#include "kernels/huge_pages.h"

namespace mt {
namespace {

TEST(Statistics, PercentilesMatchNumpyLinearInterpolation) {
    // numpy.percentile([1..10], [10, 25, 50, 75, 90]) = [1.9, 3.25, 5.5, 7.75, 9.1]
    std::vector<double> v = {7, 3, 10, 1, 5, 9, 2, 8, 4, 6};  // unsorted on purpose
    const SeriesStats s = compute_stats(v);
    EXPECT_EQ(s.n, 10u);
    EXPECT_DOUBLE_EQ(s.mean, 5.5);
    EXPECT_DOUBLE_EQ(s.median, 5.5);
    EXPECT_NEAR(s.p10, 1.9, 1e-12);
    EXPECT_NEAR(s.q1, 3.25, 1e-12);
    EXPECT_NEAR(s.q3, 7.75, 1e-12);
    EXPECT_NEAR(s.p90, 9.1, 1e-12);
    EXPECT_NEAR(s.iqr(), 4.5, 1e-12);
    EXPECT_NEAR(s.iqr_over_median(), 4.5 / 5.5, 1e-12);
    EXPECT_DOUBLE_EQ(s.min, 1);
    EXPECT_DOUBLE_EQ(s.max, 10);
}

TEST(Statistics, SampleStandardDeviationUsesNMinusOne) {
    const SeriesStats s = compute_stats({2, 4, 4, 4, 5, 5, 7, 9});
    EXPECT_DOUBLE_EQ(s.mean, 5.0);
    EXPECT_NEAR(s.std, std::sqrt(32.0 / 7.0), 1e-12);
    EXPECT_DOUBLE_EQ(s.median, 4.5);
}

TEST(Statistics, EmptyAndSingleValueSeries) {
    const SeriesStats e = compute_stats({});
    EXPECT_EQ(e.n, 0u);
    EXPECT_EQ(e.median, 0);
    EXPECT_EQ(e.iqr_over_median(), 0);
    const SeriesStats one = compute_stats({3.5});
    EXPECT_EQ(one.median, 3.5);
    EXPECT_EQ(one.p10, 3.5);
    EXPECT_EQ(one.p90, 3.5);
    EXPECT_EQ(one.std, 0);
    EXPECT_THROW(percentile_sorted({}, 50), std::invalid_argument);
}

TEST(Statistics, PercentileEndpointsAreMinAndMax) {
    const std::vector<double> v = {1, 2, 4, 8};
    EXPECT_EQ(percentile_sorted(v, 0), 1);
    EXPECT_EQ(percentile_sorted(v, 100), 8);
    EXPECT_NEAR(percentile_sorted(v, 50), 3.0, 1e-12);  // halfway between 2 and 4
}

TEST(Phases, NamesRoundTrip) {
    for (Phase p : kAllPhases) EXPECT_EQ(phase_from_string(to_string(p)), p);
    EXPECT_FALSE(phase_from_string("other").has_value());
}

TEST(PhaseTimer, OtherIsWallMinusSumOfPhases) {
    auto backend = create_backend(BackendKind::cpu);
    PhaseTimer timer(*backend);
    timer.begin_step();
    for (Phase p : kAllPhases) {
        timer.begin(p);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        timer.end(p);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // time in no phase
    const PhaseTimes t = timer.finish_step();
    double sum = 0;
    for (Phase p : kAllPhases) {
        EXPECT_GE(t[p], 1.0) << to_string(p);  // sleep_for sleeps at least that long
        sum += t[p];
    }
    EXPECT_DOUBLE_EQ(t.phase_sum_ms(), sum);
    EXPECT_DOUBLE_EQ(t.other_ms(), t.wall_ms - sum);
    EXPECT_GE(t.other_ms(), 2.0);  // the 2 ms outside every phase land in `other`
    ASSERT_EQ(timer.last_intervals().size(), static_cast<size_t>(kPhaseCount));
    // Intervals are in order and do not overlap.
    double prev_end = 0;
    for (const PhaseInterval& iv : timer.last_intervals()) {
        EXPECT_GE(iv.start_ms, prev_end - 1e-6);
        prev_end = iv.start_ms + iv.duration_ms;
    }
    EXPECT_LE(prev_end, t.wall_ms + 1e-6);
}

TEST(PhaseTimer, RepeatedPhasesAccumulateAcrossMicroSteps) {
    auto backend = create_backend(BackendKind::cpu);
    PhaseTimer timer(*backend);
    for (int step = 0; step < 2; ++step) {  // the event pool is reused on the second step
        timer.begin_step();
        for (int m = 0; m < 3; ++m) {
            timer.begin(Phase::data);
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            timer.end(Phase::data);
            timer.begin(Phase::forward);
            timer.end(Phase::forward);
        }
        const PhaseTimes t = timer.finish_step();
        double data_sum = 0;
        int micro = 0;
        for (const PhaseInterval& iv : timer.last_intervals())
            if (iv.phase == Phase::data) {
                EXPECT_EQ(iv.micro_step, micro++);
                data_sum += iv.duration_ms;
            }
        EXPECT_EQ(micro, 3);
        EXPECT_NEAR(t[Phase::data], data_sum, 1e-9);
        EXPECT_GE(t[Phase::data], 0.9);
        EXPECT_EQ(t[Phase::h2d], 0.0);  // never entered
    }
}

TEST(PhaseTimer, RejectsMisnestedPhases) {
    auto backend = create_backend(BackendKind::cpu);
    PhaseTimer timer(*backend);
    EXPECT_THROW(timer.begin(Phase::data), std::logic_error);  // no step
    timer.begin_step();
    EXPECT_THROW(timer.begin_step(), std::logic_error);
    timer.begin(Phase::data);
    EXPECT_THROW(timer.begin(Phase::h2d), std::logic_error);  // data still open
    EXPECT_THROW(timer.end(Phase::h2d), std::logic_error);    // not the open phase
    EXPECT_THROW(timer.finish_step(), std::logic_error);      // data still open
    timer.end(Phase::data);
    EXPECT_THROW(timer.end(Phase::data), std::logic_error);  // nothing open
    EXPECT_NO_THROW(timer.finish_step());
}

// run.host_sync none: closed steps keep their events until read_deferred(), which returns
// them in order; a deferred step's wall runs to the next step's start, the last to its end.
TEST(PhaseTimer, DeferredStepsAreReadTogetherInOrder) {
    auto backend = create_backend(BackendKind::cpu);
    PhaseTimer timer(*backend);
    timer.reserve_events(3, 8);
    for (int s = 0; s < 3; ++s) {
        timer.begin_step();
        timer.begin(Phase::forward);
        timer.end(Phase::forward);
        if (s == 1) {  // a second micro-step's forward in the middle step only
            timer.begin(Phase::forward);
            timer.end(Phase::forward);
        }
        timer.end_step_deferred();
    }
    EXPECT_EQ(timer.deferred_steps(), 3u);
    timer.begin_step();
    EXPECT_THROW(timer.finish_step(), std::logic_error);    // deferred steps are unread
    EXPECT_THROW(timer.read_deferred(), std::logic_error);  // a step is running
    timer.end_step_deferred();
    const std::vector<DeferredStepTimes> t = timer.read_deferred();
    ASSERT_EQ(t.size(), 4u);
    EXPECT_EQ(timer.deferred_steps(), 0u);
    EXPECT_EQ(t[0].intervals.size(), 1u);
    EXPECT_EQ(t[1].intervals.size(), 2u);
    EXPECT_EQ(t[3].intervals.size(), 0u);
    for (const DeferredStepTimes& d : t) EXPECT_GE(d.times.wall_ms, d.times[Phase::forward]);
    for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i].host_start, t[i - 1].host_start);
    EXPECT_TRUE(timer.read_deferred().empty());
    // The pools are reused from the start again: an ordinary step reads as before.
    timer.begin_step();
    timer.begin(Phase::sync);
    timer.end(Phase::sync);
    EXPECT_EQ(timer.finish_step().ms.size(), static_cast<size_t>(kPhaseCount));
    EXPECT_EQ(timer.last_intervals().size(), 1u);
}

TEST(MemoryTracker, TransientAllocationInsideAPhaseIsNotMissed) {
    auto backend = create_backend(BackendKind::cpu);
    DeviceBuffer resident(*backend, 1 << 20, MemoryCategory::params);
    MemoryTracker mem(*backend);
    mem.setup_done();
    EXPECT_GE(mem.summary().at_setup.current_total, size_t(1) << 20);

    mem.phase_begin(Phase::data);
    mem.phase_end(Phase::data);
    mem.phase_begin(Phase::forward);
    {
        // Allocated and freed inside the phase: sampling at the boundaries alone would miss it.
        DeviceBuffer scratch(*backend, 4 << 20, MemoryCategory::activations);
    }
    mem.phase_end(Phase::forward);
    mem.phase_begin(Phase::backward);
    mem.phase_end(Phase::backward);
    mem.finish();

    const MemorySummary& s = mem.summary();
    const auto& fwd = s.phases[static_cast<int>(Phase::forward)];
    EXPECT_TRUE(fwd.seen);
    EXPECT_GE(fwd.tracked_peak_total, size_t(5) << 20);
    EXPECT_GE(fwd.transient_peak, size_t(4) << 20);
    EXPECT_GE(fwd.tracked_peak[static_cast<int>(MemoryCategory::activations)], size_t(4) << 20);
    const auto& bwd = s.phases[static_cast<int>(Phase::backward)];
    EXPECT_LT(bwd.tracked_peak_total, size_t(5) << 20);  // peaks were reset after forward
    EXPECT_EQ(bwd.transient_peak, 0u);
    EXPECT_FALSE(s.phases[static_cast<int>(Phase::sync)].seen);
    EXPECT_EQ(s.peak_phase(), Phase::forward);
    EXPECT_EQ(s.largest_category(), MemoryCategory::activations);
    EXPECT_GE(s.tracked_peak_total, size_t(5) << 20);
    EXPECT_EQ(s.device_kind, "RSS");
    EXPECT_GT(s.process_peak_rss, 0u);
    // What of the process sits on 2 MiB pages, where the kernel says (whole pages only).
    EXPECT_EQ(s.process_huge_page_bytes.has_value(), huge_page_resident_bytes() >= 0);
    EXPECT_EQ(s.process_huge_page_bytes.value_or(0) % kHugePageBytes, 0u);
}

TEST(MemoryTracker, NoPeakPhaseWhenEverythingIsAllocatedAtSetup) {
    auto backend = create_backend(BackendKind::cpu);
    DeviceBuffer resident(*backend, 1 << 20, MemoryCategory::params);
    MemoryTracker mem(*backend);
    mem.setup_done();
    for (Phase p : kAllPhases) {
        mem.phase_begin(p);
        mem.phase_end(p);
    }
    EXPECT_FALSE(mem.summary().peak_phase().has_value());
}

TEST(Roofline, VerdictAgainstTheRidgePoint) {
    MachinePeaks peaks;
    peaks.flops_per_s = 100e9;
    peaks.bytes_per_s = 10e9;  // ridge = 10 flop/byte
    EXPECT_DOUBLE_EQ(peaks.ridge(), 10.0);
    EXPECT_EQ(roofline_bound(100.0, peaks), Bound::compute);
    EXPECT_EQ(roofline_bound(1.0, peaks), Bound::memory);
    EXPECT_EQ(roofline_bound(0.0, peaks), Bound::memory);  // pure data movement
    EXPECT_DOUBLE_EQ(roofline_attainable(1.0, peaks), 10e9);
    EXPECT_DOUBLE_EQ(roofline_attainable(1000.0, peaks), 100e9);
    EXPECT_EQ(roofline_bound(5.0, MachinePeaks{}), Bound::unknown);
}

TEST(KernelProfiler, AggregatesOpsByNameOverMeasuredStepsOnly) {
    auto backend = create_backend(BackendKind::cpu);
    KernelProfiler prof(*backend);
    auto start = backend->create_event();
    const OpRecord mm{"matmul_forward", 2000.0, 20.0};  // intensity 100
    const OpRecord gelu{"gelu_forward", 10.0, 10.0};    // intensity 1
    for (int step = 0; step < 3; ++step) {
        start->record();
        for (int i = 0; i < 2; ++i) {
            OpScope s(&prof, mm);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        { OpScope s(&prof, gelu); }
        prof.finish_step(/*accumulate=*/step > 0, *start);  // step 0 = warm-up
        EXPECT_EQ(prof.last_step_ops().size(), 3u);
        EXPECT_EQ(prof.last_step_ops()[0].name, "matmul_forward");
    }
    MachinePeaks peaks;
    peaks.flops_per_s = 100e9;
    peaks.bytes_per_s = 10e9;
    const auto table = prof.table(/*mean_step_ms=*/10.0, /*measured_steps=*/2, peaks);
    ASSERT_EQ(table.size(), 2u);
    const KernelStat& k = table[0];  // sorted by total time: the sleeping matmul first
    EXPECT_EQ(k.name, "matmul_forward");
    EXPECT_EQ(k.calls, 4);  // 2 per step x 2 measured steps
    EXPECT_DOUBLE_EQ(k.flops, 8000.0);
    EXPECT_DOUBLE_EQ(k.bytes, 80.0);
    EXPECT_DOUBLE_EQ(k.intensity(), 100.0);
    EXPECT_EQ(k.bound, Bound::compute);
    EXPECT_NEAR(k.ms_per_step, k.total_ms / 2, 1e-12);
    EXPECT_NEAR(k.pct_of_step, 100.0 * k.ms_per_step / 10.0, 1e-9);
    EXPECT_NEAR(k.gflops_per_s(), 8000.0 / (k.total_ms * 1e-3) / 1e9, 1e-9);
    EXPECT_EQ(table[1].name, "gelu_forward");
    EXPECT_EQ(table[1].calls, 2);
    EXPECT_EQ(table[1].bound, Bound::memory);
}

TEST(Peaks, CpuProbeIsCachedAndAnswersPeakFlops) {
    const auto dir =
        std::filesystem::temp_directory_path() / ("mt_test_peaks_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    ::setenv("MICROTRAIN_CACHE_DIR", dir.c_str(), 1);
    BackendOptions o;
    o.num_threads = 1;
    auto backend = create_backend(BackendKind::cpu, o);
    EXPECT_FALSE(peak_flops(backend->device_name(), Precision::fp32).has_value());
    const MachinePeaks first = measure_peaks(*backend);
    EXPECT_FALSE(first.from_cache);
    EXPECT_GT(first.flops_per_s, 0);
    EXPECT_GT(first.bytes_per_s, 0);
    EXPECT_NE(first.flops_source.find("1024^3"), std::string::npos);
    // The probe's buffers do not count towards the run's peaks.
    EXPECT_EQ(backend->memory_stats().peak_total, 0u);

    const auto file = dir / "cpu_peaks.json";
    ASSERT_TRUE(std::filesystem::exists(file));
    std::ifstream in(file);
    const auto j = nlohmann::json::parse(in);
    EXPECT_DOUBLE_EQ(j["devices"][backend->device_name()]["flops_per_s"].get<double>(),
                     first.flops_per_s);

    const MachinePeaks second = measure_peaks(*backend);
    EXPECT_TRUE(second.from_cache);
    EXPECT_DOUBLE_EQ(second.flops_per_s, first.flops_per_s);
    const auto pf = peak_flops(backend->device_name(), Precision::fp32);
    ASSERT_TRUE(pf.has_value());
    EXPECT_DOUBLE_EQ(*pf, first.flops_per_s);
    // Unknown GPUs get no made-up peak.
    EXPECT_FALSE(peak_flops("Imaginary GPU 9000", Precision::bf16).has_value());
    std::filesystem::remove_all(dir);
}

TEST(Peaks, CorruptCacheIsRemeasured) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("mt_test_peaks_bad_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    { std::ofstream(dir / "cpu_peaks.json") << "{ not json"; }
    ::setenv("MICROTRAIN_CACHE_DIR", dir.c_str(), 1);
    BackendOptions o;
    o.num_threads = 1;
    auto backend = create_backend(BackendKind::cpu, o);
    EXPECT_FALSE(peak_flops(backend->device_name(), Precision::fp32).has_value());
    const MachinePeaks p = measure_peaks(*backend);
    EXPECT_FALSE(p.from_cache);
    EXPECT_TRUE(peak_flops(backend->device_name(), Precision::fp32).has_value());
    std::filesystem::remove_all(dir);
}

TEST(Peaks, ReprobeKeepsTheBestFigureEverMeasured) {
    // A probe on a busy machine under-estimates the peak; a forced re-probe that measures less
    // than the cache must not replace it (else MFU would exceed 100% on a quiet machine).
    const auto dir = std::filesystem::temp_directory_path() /
                     ("mt_test_peaks_best_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    ::setenv("MICROTRAIN_CACHE_DIR", dir.c_str(), 1);
    BackendOptions o;
    o.num_threads = 1;
    auto backend = create_backend(BackendKind::cpu, o);
    const MachinePeaks first = measure_peaks(*backend);
    const auto file = dir / "cpu_peaks.json";
    nlohmann::json j;
    {
        std::ifstream in(file);
        j = nlohmann::json::parse(in);
    }
    const double high = first.flops_per_s * 3.0;  // a quiet machine's best, say
    j["devices"][backend->device_name()]["flops_per_s"] = high;
    { std::ofstream(file) << j.dump(); }
    const MachinePeaks again = measure_peaks(*backend, /*force=*/true);
    EXPECT_DOUBLE_EQ(again.flops_per_s, high);
    EXPECT_DOUBLE_EQ(*peak_flops(backend->device_name(), Precision::fp32), high);
    std::filesystem::remove_all(dir);
}

// Issue #25 item 14: a cache holding 1e300 FLOP/s was kept forever (every MFU ~0). An
// implausible figure is ignored, and a cached one orders of magnitude above a fresh probe is
// replaced by it.
TEST(Peaks, ImplausibleOrFarBetterCachedPeaksAreReplacedByAProbe) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("mt_test_peaks_implausible_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    ::setenv("MICROTRAIN_CACHE_DIR", dir.c_str(), 1);
    BackendOptions o;
    o.num_threads = 1;
    auto backend = create_backend(BackendKind::cpu, o);
    measure_peaks(*backend);  // writes the cache
    const auto file = dir / "cpu_peaks.json";
    auto set_cached = [&](double flops) {
        nlohmann::json j;
        {
            std::ifstream in(file);
            j = nlohmann::json::parse(in);
        }
        j["devices"][backend->device_name()]["flops_per_s"] = flops;
        std::ofstream(file) << j.dump();
    };
    set_cached(1e300);
    EXPECT_FALSE(peak_flops(backend->device_name(), Precision::fp32).has_value());
    const MachinePeaks a = measure_peaks(*backend);
    EXPECT_FALSE(a.from_cache);
    EXPECT_LT(a.flops_per_s, 1e16);
    set_cached(a.flops_per_s * 1000.0);
    const MachinePeaks b = measure_peaks(*backend, /*force=*/true);
    EXPECT_LT(b.flops_per_s, a.flops_per_s * 100.0);
    EXPECT_LT(*peak_flops(backend->device_name(), Precision::fp32), a.flops_per_s * 100.0);
    std::filesystem::remove_all(dir);
}

// ---- the CPU time of other processes (engine/cpu_load.h) ---------------------------------------

// /proc/stat's first lines and a /proc/<pid>/stat whose command name holds ") (" and spaces.
constexpr const char* kProcStatA =
    "cpu  1000 20 300 50000 40 5 6 7 11 0\n"
    "cpu0 500 10 150 25000 20 2 3 3 5 0\n";
constexpr const char* kProcStatB =
    "cpu  1250 20 350 50200 45 6 8 9 13 0\n"
    "cpu0 600 10 170 25100 22 3 4 4 6 0\n";
constexpr const char* kPidStatA =
    "4242 (my (odd) prog) S 1 4242 4242 0 -1 4194560 900 0 0 0 120 30 0 0 20 0 3 0 777 "
    "123456 789 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
constexpr const char* kPidStatB =
    "4242 (my (odd) prog) R 1 4242 4242 0 -1 4194560 950 0 0 0 200 50 0 0 20 0 3 0 777 "
    "123456 789 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";

TEST(CpuLoad, ParsesTheBusyTicksOfEveryCpu) {
    // user + nice + system + irq + softirq + steal; idle, iowait and guest are not added.
    EXPECT_EQ(busy_ticks_from_proc_stat(kProcStatA), 1000u + 20 + 300 + 5 + 6 + 7);
    EXPECT_EQ(busy_ticks_from_proc_stat(kProcStatB), 1250u + 20 + 350 + 6 + 8 + 9);
    EXPECT_FALSE(busy_ticks_from_proc_stat("cpu0 1 2 3 4 5 6 7 8\n").has_value());
    EXPECT_FALSE(busy_ticks_from_proc_stat("cpu  1 2 3\n").has_value());  // too few fields
    EXPECT_FALSE(busy_ticks_from_proc_stat("").has_value());
}

TEST(CpuLoad, ParsesTheStealTicksOfEveryCpu) {
    // The 8th number of the "cpu" line (user nice system idle iowait irq softirq steal).
    EXPECT_EQ(steal_ticks_from_proc_stat(kProcStatA), 7u);
    EXPECT_EQ(steal_ticks_from_proc_stat(kProcStatB), 9u);
    EXPECT_FALSE(steal_ticks_from_proc_stat("cpu  1 2 3 4 5 6 7\n").has_value());  // no steal
    EXPECT_FALSE(steal_ticks_from_proc_stat("intr 1 2 3 4 5 6 7 8\n").has_value());
    const CpuLoadSample a = cpu_load_sample_from(kProcStatA, kPidStatA);
    const CpuLoadSample b = cpu_load_sample_from(kProcStatB, kPidStatB);
    ASSERT_TRUE(a.valid && b.valid);
    EXPECT_EQ(a.steal_ticks, 7u);
    const double ms_per_tick = 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
    EXPECT_DOUBLE_EQ(steal_ms(a, b), 2 * ms_per_tick);  // a part of other_cpu_ms (205 ticks)
    EXPECT_LE(steal_ms(a, b), other_cpu_ms(a, b));
    EXPECT_EQ(steal_ms(b, a), 0.0);  // a counter never runs backwards: 0, not < 0
    EXPECT_EQ(steal_ms(CpuLoadSample{}, b), 0.0);
}

// NVML's throttle-reason bits by name (kernels/device_clock.h): the report prints these.
TEST(DeviceClock, NamesEveryThrottleReasonBit) {
    EXPECT_TRUE(throttle_reason_names(0).empty());
    EXPECT_EQ(throttle_reason_names(0x4), std::vector<std::string>{"sw_power_cap"});
    EXPECT_EQ(throttle_reason_names(0x1ff),
              (std::vector<std::string>{"gpu_idle", "applications_clocks_setting", "sw_power_cap",
                                        "hw_slowdown", "sync_boost", "sw_thermal", "hw_thermal",
                                        "hw_power_brake", "display_clock_setting"}));
    EXPECT_EQ(throttle_reason_names(0x48 | (1ull << 40)),
              (std::vector<std::string>{"hw_slowdown", "hw_thermal", "bit_40"}));
    // The slowdowns the report calls out: not idle, not a configured clock.
    EXPECT_EQ(throttle_reason_names(kSlowdownReasons),
              (std::vector<std::string>{"sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
                                        "hw_thermal", "hw_power_brake"}));
    const DeviceClockSample c = combine({1980, 0x1}, {1410, 0x4});
    EXPECT_EQ(c.sm_clock_mhz, 1410u);
    EXPECT_EQ(c.throttle_reasons, 0x5u);
}

// The CPU backend has no device clock: no sample, nothing thrown.
TEST(DeviceClock, TheCpuBackendHasNone) {
    const auto backend = create_backend(BackendKind::cpu);
    EXPECT_FALSE(backend->sample_device_clock().has_value());
}

TEST(CpuLoad, ParsesUtimePlusStimeAfterTheCommandName) {
    EXPECT_EQ(own_ticks_from_proc_pid_stat(kPidStatA), 120u + 30);
    EXPECT_EQ(own_ticks_from_proc_pid_stat(kPidStatB), 200u + 50);
    EXPECT_FALSE(own_ticks_from_proc_pid_stat("4242 (x) S 1 2").has_value());
    EXPECT_FALSE(own_ticks_from_proc_pid_stat("no parenthesis").has_value());
}

TEST(CpuLoad, OtherCpuTimeIsTheMachinesBusyTimeMinusOurs) {
    const CpuLoadSample a = cpu_load_sample_from(kProcStatA, kPidStatA);
    const CpuLoadSample b = cpu_load_sample_from(kProcStatB, kPidStatB);
    ASSERT_TRUE(a.valid);
    ASSERT_TRUE(b.valid);
    // busy +305 ticks (1643 - 1338), ours +100 (250 - 150): others took 205 ticks.
    const double ms_per_tick = 1000.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
    EXPECT_DOUBLE_EQ(other_cpu_ms(a, b), 205 * ms_per_tick);
    // Our own time growing faster than the machine's (samples read a moment apart): 0, not < 0.
    EXPECT_EQ(other_cpu_ms(a, cpu_load_sample_from(kProcStatA, kPidStatB)), 0.0);
    // No /proc: no figure.
    EXPECT_FALSE(cpu_load_sample_from("", kPidStatA).valid);
    EXPECT_EQ(other_cpu_ms(CpuLoadSample{}, b), 0.0);
}

TEST(CpuLoad, ALiveSampleOfThisMachineIsValidAndMonotonic) {
    const CpuLoadSample a = CpuLoadSample::take();
    if (!a.valid) GTEST_SKIP() << "no /proc here";
    volatile double x = 0;
    for (int i = 0; i < 2000000; ++i) x = x + 1e-9 * i;  // some CPU time of our own
    const CpuLoadSample b = CpuLoadSample::take();
    ASSERT_TRUE(b.valid);
    EXPECT_GE(b.busy_ticks, a.busy_ticks);
    EXPECT_GE(b.own_ticks, a.own_ticks);
    const double other = other_cpu_ms(a, b);
    EXPECT_TRUE(std::isfinite(other));
    EXPECT_GE(other, 0.0);
}

}  // namespace
}  // namespace mt

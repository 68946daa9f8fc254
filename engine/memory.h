// Memory tracking for a run: the backend allocator's per-category bytes, sampled per phase.
//
// Two views, reported side by side:
// - tracked: what went through Backend::allocate, per MemoryCategory (params, grads, optimizer,
//   activations, workspace, data). At each phase begin the allocator's peaks are reset, at each
//   phase end they are read, so a transient peak inside a phase is attributed to that phase and
//   never missed by sampling.
// - device: Backend::device_memory_info().own_bytes sampled at every phase boundary — on CUDA
//   this process's share of cudaMemGetInfo (cuBLAS workspaces and fragmentation included, its
//   context and other processes not: kernels/own_device_memory.h), the process RSS on CPU. Plus
//   on CPU the kernel's own high-water mark getrusage(RUSAGE_SELF).ru_maxrss (whole process,
//   monotonic: it includes earlier variants of the same run).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>

#include "engine/timing.h"
#include "kernels/backend.h"
#include "kernels/text.h"  // to_mib, kMiB

namespace mt {

// Peak resident set size of this process in bytes since it started or since the last
// reset_peak_rss() (/proc/self/status VmHWM; getrusage's ru_maxrss without /proc); 0 if
// unavailable.
size_t process_peak_rss_bytes();
// Sets the peak RSS to the current RSS (/proc/self/clear_refs), so that a peak read later is
// what came after: the runner resets it once the machine's peak probe (its GEMM and copy
// buffers, hundreds of MiB, freed again) is done, so a variant's peak is its own whether or not
// it ran the probe. False where the kernel does not support it (the peak then includes it).
bool reset_peak_rss();
// Current resident set size in bytes (/proc/self/statm); 0 if unavailable.
size_t process_current_rss_bytes();
// Physical memory of the machine in bytes (sysconf); 0 if unknown.
size_t physical_memory_bytes();
// Host memory available to a new allocation: MemAvailable of /proc/meminfo; 0 if unknown. (The
// CPU backend's device_memory_info() also applies a container's limit; this is for the host side
// of a GPU run: the sample cache of data.cache.)
size_t host_available_bytes();

struct PhaseMemory {
    bool seen = false;              // the phase ran at least once
    size_t tracked_peak_total = 0;  // allocator peak of the sum inside the phase
    std::array<size_t, kMemoryCategoryCount> tracked_peak{};  // per category inside the phase
    size_t device_used_peak = 0;  // max device_memory_info().own_bytes at its boundaries
    // Max over occurrences of (peak inside the phase - bytes live when it began): what the phase
    // allocates transiently (or keeps, on first use) on top of what was already there.
    size_t transient_peak = 0;
};

struct MemorySummary {
    // After setup (model, optimizer, loader allocated), before the first step.
    MemoryStats at_setup;
    // Over setup and every step (warm-up included: memory is claimed there).
    std::array<size_t, kMemoryCategoryCount> tracked_peak{};
    size_t tracked_peak_total = 0;
    std::array<PhaseMemory, kPhaseCount> phases{};
    bool device_available = false;
    std::string device_kind;  // "cudaMemGetInfo" or "RSS"
    size_t device_total = 0;  // device capacity (CUDA) or physical RAM (CPU); 0 if unknown
    size_t device_used_peak = 0;
    size_t process_peak_rss = 0;  // CPU: VmHWM since reset_peak_rss (whole process); 0 on CUDA
    // CPU: the process's anonymous memory on 2 MiB pages at the end of the run (AnonHugePages,
    // kernels/huge_pages.h); nullopt on CUDA or where the kernel does not say. The kernel grants
    // a huge page only when it finds 2 MiB of free contiguous memory, which a busy machine may
    // lack, and counts a huge page whole, touched or not; without it the buffer gets 4 KiB pages,
    // only those touched counted. So the same config on a busier machine peaks lower, by at most
    // this much (in practice the untouched tails of the huge pages).
    std::optional<size_t> process_huge_page_bytes;
    // The phase whose tracked peak is highest (nullopt before any step).
    // (Precisely: among the phases whose peak equals the highest, the one that allocated the most
    // on top of what was live when it began; nullopt when no phase allocates anything, i.e. the
    // peak is what setup allocated, held through every phase.)
    std::optional<Phase> peak_phase() const;
    // The category with the most bytes at its peak.
    MemoryCategory largest_category() const;
};

// Wraps a backend and accumulates a MemorySummary. Usage: after setup call setup_done(); then
// phase_begin(p) / phase_end(p) around each phase (the runner does this next to the PhaseTimer).
class MemoryTracker {
  public:
    explicit MemoryTracker(Backend& backend);
    void setup_done();
    void phase_begin(Phase p);
    void phase_end(Phase p);
    const MemorySummary& summary() const { return summary_; }
    // Refreshes process_peak_rss and process_huge_page_bytes (call at the end of the run).
    void finish();

  private:
    void sample_device(Phase* p);
    Backend& backend_;
    size_t phase_begin_total_ = 0;
    MemorySummary summary_;
};

}  // namespace mt

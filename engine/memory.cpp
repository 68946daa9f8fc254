// MemoryTracker and process memory queries (see memory.h).
#include "engine/memory.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "kernels/huge_pages.h"

namespace mt {

size_t process_peak_rss_bytes() {
    // VmHWM, the high-water mark that reset_peak_rss() resets; getrusage's ru_maxrss where
    // /proc is absent.
    if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && std::fgets(line, sizeof line, f))
            found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
        std::fclose(f);
        if (found) return static_cast<size_t>(kib) * 1024;
    }
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

bool reset_peak_rss() {
    // First give the heap's free pages back, so the current RSS is what is in use.
    malloc_trim(0);
    // Linux >= 4.0: writing 5 to clear_refs sets the high-water mark to the current RSS.
    std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = std::fputs("5", f) >= 0;
    return std::fclose(f) == 0 && ok;
}

size_t process_current_rss_bytes() {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long pages_total = 0, pages_resident = 0;
    const int n = std::fscanf(f, "%llu %llu", &pages_total, &pages_resident);
    std::fclose(f);
    if (n != 2) return 0;
    const long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<size_t>(pages_resident) * static_cast<size_t>(page) : 0;
}

size_t physical_memory_bytes() {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0) return 0;
    return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

size_t host_available_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    size_t kb = 0;
    while (f >> key >> kb >> unit)
        if (key == "MemAvailable:") return kb * 1024;
    return 0;
}

std::optional<Phase> MemorySummary::peak_phase() const {
    size_t top = 0;
    for (const PhaseMemory& m : phases)
        if (m.seen) top = std::max(top, m.tracked_peak_total);
    std::optional<Phase> best;
    size_t best_transient = 0;
    for (Phase p : kAllPhases) {
        const PhaseMemory& m = phases[static_cast<int>(p)];
        if (m.seen && m.tracked_peak_total == top && m.transient_peak > best_transient) {
            best = p;
            best_transient = m.transient_peak;
        }
    }
    return best;
}

MemoryCategory MemorySummary::largest_category() const {
    int best = 0;
    for (int c = 1; c < kMemoryCategoryCount; ++c)
        if (tracked_peak[c] > tracked_peak[best]) best = c;
    return static_cast<MemoryCategory>(best);
}

MemoryTracker::MemoryTracker(Backend& backend) : backend_(backend) {
    summary_.device_kind = backend.kind() == BackendKind::cuda ? "cudaMemGetInfo" : "RSS";
}

void MemoryTracker::sample_device(Phase* p) {
    const DeviceMemoryInfo info = backend_.device_memory_info();
    if (!info.available) return;
    summary_.device_available = true;
    if (info.total_bytes) summary_.device_total = info.total_bytes;
    summary_.device_used_peak = std::max(summary_.device_used_peak, info.own_bytes);
    if (p) {
        PhaseMemory& m = summary_.phases[static_cast<int>(*p)];
        m.device_used_peak = std::max(m.device_used_peak, info.own_bytes);
    }
}

void MemoryTracker::setup_done() {
    // The allocator's peak so far covers every allocation made during setup.
    const MemoryStats s = backend_.memory_stats();
    summary_.at_setup = s;
    for (int c = 0; c < kMemoryCategoryCount; ++c)
        summary_.tracked_peak[c] = std::max(summary_.tracked_peak[c], s.peak[c]);
    summary_.tracked_peak_total = std::max(summary_.tracked_peak_total, s.peak_total);
    if (backend_.kind() == BackendKind::cpu && summary_.device_total == 0)
        summary_.device_total = physical_memory_bytes();
    sample_device(nullptr);
}

void MemoryTracker::phase_begin(Phase p) {
    backend_.reset_peaks();
    phase_begin_total_ = backend_.memory_stats().current_total;
    sample_device(&p);
}

void MemoryTracker::phase_end(Phase p) {
    const MemoryStats s = backend_.memory_stats();
    PhaseMemory& m = summary_.phases[static_cast<int>(p)];
    m.seen = true;
    m.tracked_peak_total = std::max(m.tracked_peak_total, s.peak_total);
    if (s.peak_total > phase_begin_total_)
        m.transient_peak = std::max(m.transient_peak, s.peak_total - phase_begin_total_);
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
        m.tracked_peak[c] = std::max(m.tracked_peak[c], s.peak[c]);
        summary_.tracked_peak[c] = std::max(summary_.tracked_peak[c], s.peak[c]);
    }
    summary_.tracked_peak_total = std::max(summary_.tracked_peak_total, s.peak_total);
    sample_device(&p);
}

void MemoryTracker::finish() {
    if (backend_.kind() != BackendKind::cpu) return;
    summary_.process_peak_rss = process_peak_rss_bytes();
    if (const long long huge = huge_page_resident_bytes(); huge >= 0)
        summary_.process_huge_page_bytes = static_cast<size_t>(huge);
}

}  // namespace mt

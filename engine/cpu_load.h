// The CPU time other processes take while a step runs: a machine shared with other work slows a
// step without any phase of it saying why, and a variant measured during someone else's build
// looks slower than it is (the variants run one after another). Each step records it
// (StepRecord::other_cpu_ms) so the report can tell a busy machine from a slow variant.
//
// From two samples of Linux's /proc (the first line of /proc/stat: every CPU's time since boot in
// clock ticks, USER_HZ = sysconf(_SC_CLK_TCK); /proc/self/stat: this process's utime and stime):
//   other = (busy_b - busy_a) - (own_b - own_a),   busy = user + nice + system + irq + softirq
//                                                         + steal (guest time is inside user)
// in ticks, converted to ms and clamped at 0 (the two files are read a moment apart, so the
// difference of two small counts can dip below 0). Tick resolution: 1000 / USER_HZ ms (10 ms at
// the usual 100 Hz), summed over every CPU, so a short step reads 0 or a multiple of it. Where
// /proc is absent (not Linux) a sample is invalid and the CPU time is 0. A sample is two small
// file reads (microseconds), taken at the start and the end of each step.
//
// Steal (the 8th number of the line) is the time the hypervisor ran something else while this
// machine's virtual CPUs wanted to run: a noisy neighbour on a cloud VM, invisible to the
// processes of this machine. It is part of `busy` above, so other_cpu_ms includes it; steal_ms
// says how much of it was steal (StepRecord::steal_ms). 0 on bare metal.
#pragma once

#include <optional>
#include <string_view>

namespace mt {

struct CpuLoadSample {
    bool valid = false;                  // false: /proc could not be read or parsed
    unsigned long long busy_ticks = 0;   // every CPU's busy time since boot
    unsigned long long own_ticks = 0;    // this process's utime + stime (all its threads)
    unsigned long long steal_ticks = 0;  // every CPU's steal time since boot (inside busy_ticks)
    // Reads /proc/stat and /proc/self/stat now.
    static CpuLoadSample take();
};

// The busy ticks of every CPU from /proc/stat's text (its first line, "cpu  user nice system
// idle iowait irq softirq steal ..."); nullopt when the text is not that.
std::optional<unsigned long long> busy_ticks_from_proc_stat(std::string_view proc_stat);
// The steal ticks of every CPU (the line's 8th number) from the same text; nullopt likewise.
std::optional<unsigned long long> steal_ticks_from_proc_stat(std::string_view proc_stat);
// utime + stime (fields 14 and 15) from /proc/<pid>/stat's text; nullopt when malformed. The
// command name (field 2) is in parentheses and may hold spaces or ')': fields are counted from
// the last ')'.
std::optional<unsigned long long> own_ticks_from_proc_pid_stat(std::string_view pid_stat);
// A sample from the two files' texts (what take() reads).
CpuLoadSample cpu_load_sample_from(std::string_view proc_stat, std::string_view pid_stat);

// The CPU time (ms) other processes took between samples a and b (b taken after a), >= 0; 0
// unless both samples are valid.
double other_cpu_ms(const CpuLoadSample& a, const CpuLoadSample& b);
// The steal time (ms, summed over every CPU) between samples a and b, >= 0; 0 unless both are
// valid. A part of other_cpu_ms(a, b) (up to the two reads' skew).
double steal_ms(const CpuLoadSample& a, const CpuLoadSample& b);

}  // namespace mt

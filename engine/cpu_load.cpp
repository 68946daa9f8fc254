// The CPU time of other processes, from /proc (see cpu_load.h).
#include "engine/cpu_load.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <string>

namespace mt {

namespace {

// The file's first bytes (enough for /proc/stat's first line and all of /proc/self/stat); ""
// when it cannot be read. One read(): both files are generated whole by the kernel on open.
std::string read_head(const char* path) {
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    std::array<char, 4096> buf;
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    ::close(fd);
    return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

// The whitespace-separated unsigned numbers at the start of `s` (stops at the first non-number).
std::array<unsigned long long, 16> leading_numbers(std::string_view s, size_t* count) {
    std::array<unsigned long long, 16> out{};
    size_t n = 0;
    size_t i = 0;
    while (n < out.size()) {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
        const auto [end, ec] = std::from_chars(s.data() + i, s.data() + s.size(), out[n]);
        if (ec != std::errc() || end == s.data() + i) break;
        i = static_cast<size_t>(end - s.data());
        ++n;
    }
    *count = n;
    return out;
}

// The numbers of /proc/stat's first line ("cpu" then at least user nice system idle iowait irq
// softirq steal: kernels since 2.6.11); nullopt when the text does not start with that line.
std::optional<std::array<unsigned long long, 16>> all_cpu_ticks(std::string_view text) {
    if (text.substr(0, 4) != "cpu " && text.substr(0, 4) != "cpu\t") return std::nullopt;
    text = text.substr(0, text.find('\n')).substr(3);
    size_t n = 0;
    const auto v = leading_numbers(text, &n);
    if (n < 8) return std::nullopt;
    return v;
}

}  // namespace

std::optional<unsigned long long> busy_ticks_from_proc_stat(std::string_view text) {
    const auto v = all_cpu_ticks(text);
    if (!v) return std::nullopt;
    // user + nice + system + irq + softirq + steal (idle and iowait are not busy).
    return (*v)[0] + (*v)[1] + (*v)[2] + (*v)[5] + (*v)[6] + (*v)[7];
}

std::optional<unsigned long long> steal_ticks_from_proc_stat(std::string_view text) {
    const auto v = all_cpu_ticks(text);
    if (!v) return std::nullopt;
    return (*v)[7];
}

std::optional<unsigned long long> own_ticks_from_proc_pid_stat(std::string_view text) {
    const size_t close = text.rfind(')');
    if (close == std::string_view::npos) return std::nullopt;
    // After "pid (comm)": field 3 (state, a letter), then fields 4.. as numbers; utime and stime
    // are fields 14 and 15, the 11th and 12th numbers after the state.
    std::string_view rest = text.substr(close + 1);
    const size_t state = rest.find_first_not_of(' ');
    if (state == std::string_view::npos) return std::nullopt;
    rest = rest.substr(state + 1);
    // ppid, pgrp, session, tty_nr and tpgid may be negative (-1): skip the 10 fields before utime
    // as words, not numbers.
    for (int field = 4; field < 14; ++field) {
        const size_t start = rest.find_first_not_of(' ');
        if (start == std::string_view::npos) return std::nullopt;
        const size_t end = rest.find(' ', start);
        if (end == std::string_view::npos) return std::nullopt;
        rest = rest.substr(end);
    }
    size_t n = 0;
    const auto v = leading_numbers(rest, &n);
    if (n < 2) return std::nullopt;
    return v[0] + v[1];
}

CpuLoadSample cpu_load_sample_from(std::string_view proc_stat, std::string_view pid_stat) {
    CpuLoadSample s;
    const auto busy = busy_ticks_from_proc_stat(proc_stat);
    const auto steal = steal_ticks_from_proc_stat(proc_stat);
    const auto own = own_ticks_from_proc_pid_stat(pid_stat);
    if (!busy || !steal || !own) return s;
    s.valid = true;
    s.busy_ticks = *busy;
    s.own_ticks = *own;
    s.steal_ticks = *steal;
    return s;
}

CpuLoadSample CpuLoadSample::take() {
    return cpu_load_sample_from(read_head("/proc/stat"), read_head("/proc/self/stat"));
}

namespace {

double ms_per_tick() {
    static const long ticks_per_s = ::sysconf(_SC_CLK_TCK);
    return ticks_per_s > 0 ? 1000.0 / static_cast<double>(ticks_per_s) : 0.0;
}

}  // namespace

double steal_ms(const CpuLoadSample& a, const CpuLoadSample& b) {
    if (!a.valid || !b.valid || b.steal_ticks < a.steal_ticks) return 0.0;
    return static_cast<double>(b.steal_ticks - a.steal_ticks) * ms_per_tick();
}

double other_cpu_ms(const CpuLoadSample& a, const CpuLoadSample& b) {
    if (!a.valid || !b.valid) return 0.0;
    // Signed: either counter's difference may be smaller than the other's (read a moment apart).
    const double busy = static_cast<double>(b.busy_ticks) - static_cast<double>(a.busy_ticks);
    const double own = static_cast<double>(b.own_ticks) - static_cast<double>(a.own_ticks);
    return std::max(0.0, (busy - own) * ms_per_tick());
}

}  // namespace mt

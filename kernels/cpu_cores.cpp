// The cores this process may use (see cpu_cores.h).
#include "kernels/cpu_cores.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

namespace mt {

namespace {

// The whole of a small text file, "" when it cannot be read (no cgroup mount, no such group).
std::string read_small_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) return "";
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// The CPUs in the affinity mask, sized for any machine (CPU_ALLOC: more than 1024 CPUs too).
int affinity_cpus() {
    for (int n = 1024; n <= (1 << 20); n *= 2) {
        cpu_set_t* set = CPU_ALLOC(n);
        const size_t size = CPU_ALLOC_SIZE(n);
        const int rc = sched_getaffinity(0, size, set);
        const int count = rc == 0 ? CPU_COUNT_S(size, set) : 0;
        CPU_FREE(set);
        if (rc == 0) return std::max(count, 1);
    }
    return 1;
}

// `path` and each group above it, up to the mount's root: "/a/b" -> "/a/b", "/a", "".
std::vector<std::string> this_and_ancestors(std::string path) {
    std::vector<std::string> out;
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
        out.push_back(path);
        const size_t slash = path.rfind('/');
        if (path.empty() || slash == std::string::npos) break;
        path = path.substr(0, slash);
    }
    return out;
}

struct Quota {
    double cpus = 0;  // 0: no limit found
    std::string file;
};

// The tightest quota on the group `path` (as /proc/self/cgroup names it) and its ancestors.
void tighten(Quota& q, double cpus, const std::string& file) {
    if (cpus > 0 && (q.cpus == 0 || cpus < q.cpus)) q = {cpus, file};
}

Quota cgroup_quota(const std::string& proc, const std::string& mount) {
    Quota q;
    std::istringstream lines(read_small_file(proc + "/self/cgroup"));
    for (std::string line; std::getline(lines, line);) {
        // "hierarchy-id:controllers:path"; v2's unified hierarchy is "0::path".
        const size_t a = line.find(':'), b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        if (controllers.empty()) {
            for (const std::string& g : this_and_ancestors(path))
                tighten(q, cgroup_v2_quota_cpus(read_small_file(mount + g + "/cpu.max")),
                        "cgroup cpu.max");
            continue;
        }
        std::string list = "," + controllers + ",";
        if (list.find(",cpu,") == std::string::npos) continue;
        for (const std::string& dir : {mount + "/" + controllers, mount + "/cpu"})
            for (const std::string& g : this_and_ancestors(path))
                tighten(q,
                        cgroup_v1_quota_cpus(read_small_file(dir + g + "/cpu.cfs_quota_us"),
                                             read_small_file(dir + g + "/cpu.cfs_period_us")),
                        "cgroup cpu.cfs_quota_us");
    }
    return q;
}

std::string cpus_text(double cpus) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", cpus);
    return buf;
}

}  // namespace

double cgroup_v2_quota_cpus(const std::string& cpu_max) {
    std::istringstream in(cpu_max);
    std::string quota;
    double period = 0;
    if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
    char* end = nullptr;
    const double q = std::strtod(quota.c_str(), &end);
    return end && *end == '\0' && q > 0 ? q / period : 0;
}

double cgroup_v1_quota_cpus(const std::string& quota_us, const std::string& period_us) {
    std::istringstream q(quota_us), p(period_us);
    double quota = 0, period = 0;
    if (!(q >> quota) || !(p >> period) || quota <= 0 || period <= 0) return 0;
    return quota / period;
}

UsableCores usable_cpu_cores(const std::string& proc, const std::string& sys_fs_cgroup) {
    const int mask = affinity_cpus();
    UsableCores u;
    u.count = mask;
    u.source = "affinity mask: " + std::to_string(mask) + " CPU" + (mask == 1 ? "" : "s");
    const Quota q = cgroup_quota(proc, sys_fs_cgroup);
    if (q.cpus > 0 && std::ceil(q.cpus) < mask) {
        u.count = std::max(1, static_cast<int>(std::ceil(q.cpus)));
        u.source = q.file + " " + cpus_text(q.cpus) + (q.cpus == 1 ? " CPU" : " CPUs") + " (" +
                   u.source + ")";
    }
    return u;
}

}  // namespace mt

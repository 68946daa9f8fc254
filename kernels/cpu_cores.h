// How many CPU cores this process may actually use: the default thread count of the CPU backend.
//
// A machine's core count is not what a process gets. Two limits stand between them:
// - the affinity mask (taskset, numactl, `mpirun --bind-to`, a Kubernetes static CPU policy):
//   the CPUs the scheduler may run this process on at all;
// - the cgroup CPU quota (docker --cpus, a Kubernetes CPU limit, systemd CPUQuota=): the CPU
//   time the process's group may use per period, cgroup v2's `cpu.max` ("150000 100000" = 1.5
//   CPUs) or v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`, on the process's own group and on
//   every group above it (the tightest wins).
// libgomp's default thread count honours the mask but not the quota: on a 64-core host a
// container limited to 2 CPUs starts 64 threads, which the kernel throttles every period, and
// every OpenMP barrier then waits for a thread that has used up the group's time. The usable
// count is the mask's CPUs capped by the quota rounded UP (1.5 CPUs -> 2 threads: one thread
// would leave half a CPU idle; the throttling of a half-used second core costs less than that).
#pragma once

#include <string>

namespace mt {

struct UsableCores {
    int count = 1;       // >= 1
    std::string source;  // "affinity mask: 2 CPUs", "cgroup cpu.max 1.5 CPUs (affinity mask: 4)"
};

// This process's usable cores, read from the affinity mask and the cgroup files under `proc`
// (its `self/cgroup`) and `sys_fs_cgroup` (the cgroup mount): the defaults are the real ones; a
// test passes a directory tree of its own.
UsableCores usable_cpu_cores(const std::string& proc = "/proc",
                             const std::string& sys_fs_cgroup = "/sys/fs/cgroup");

// The CPUs a cgroup quota grants, from the files' text: v2 `cpu.max` ("max 100000": no limit)
// and v1 `cpu.cfs_quota_us` + `cpu.cfs_period_us` (quota -1: no limit). 0 when there is no
// limit or the text is not a quota.
double cgroup_v2_quota_cpus(const std::string& cpu_max);
double cgroup_v1_quota_cpus(const std::string& quota_us, const std::string& period_us);

}  // namespace mt

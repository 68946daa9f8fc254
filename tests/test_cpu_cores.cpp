// The CPU backend's default thread count: the cores the affinity mask and the cgroup quota leave
// this process (kernels/cpu_cores.h), read from a directory tree the test writes.
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "engine/training_session.h"
#include "kernels/cpu_cores.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

int mask_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    return CPU_COUNT(&set);
}

// For its lifetime, this process's affinity mask narrowed to one CPU; then the mask and OpenMP's
// thread count (which a backend built inside sets) as they were.
class OneCpuMask {
  public:
    OneCpuMask() : threads_before_(omp_get_max_threads()) {
        CPU_ZERO(&saved_);
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(first_allowed_cpu(), &one);
        narrowed_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0 &&
                    sched_setaffinity(0, sizeof one, &one) == 0;
    }
    ~OneCpuMask() {
        if (narrowed_) sched_setaffinity(0, sizeof saved_, &saved_);
        omp_set_num_threads(threads_before_);
    }
    OneCpuMask(const OneCpuMask&) = delete;
    OneCpuMask& operator=(const OneCpuMask&) = delete;
    bool narrowed() const { return narrowed_; }
    int threads_before() const { return threads_before_; }

  private:
    cpu_set_t saved_;
    int threads_before_;
    bool narrowed_ = false;
};

// A fake /proc and /sys/fs/cgroup under a temporary directory.
class CgroupTree : public ::testing::Test {
  protected:
    void SetUp() override {
        root_ = fs::temp_directory_path() /
                ("mt_cpu_cores_" + std::to_string(::getpid()) + "_" +
                 ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(root_);
        fs::create_directories(root_ / "proc/self");
        fs::create_directories(root_ / "sys");
    }
    void TearDown() override { fs::remove_all(root_); }
    void write(const std::string& rel, const std::string& text) {
        fs::create_directories((root_ / rel).parent_path());
        std::ofstream(root_ / rel) << text;
    }
    UsableCores cores() {
        return usable_cpu_cores((root_ / "proc").string(), (root_ / "sys").string());
    }
    fs::path root_;
};

TEST(CgroupQuota, V2CpuMaxIsQuotaOverPeriodAndMaxIsNoLimit) {
    EXPECT_DOUBLE_EQ(cgroup_v2_quota_cpus("150000 100000\n"), 1.5);
    EXPECT_DOUBLE_EQ(cgroup_v2_quota_cpus("max 100000\n"), 0);
    EXPECT_DOUBLE_EQ(cgroup_v2_quota_cpus(""), 0);
    EXPECT_DOUBLE_EQ(cgroup_v2_quota_cpus("12x 100000"), 0);
    EXPECT_DOUBLE_EQ(cgroup_v2_quota_cpus("100000 0"), 0);
}

TEST(CgroupQuota, V1QuotaMinusOneIsNoLimit) {
    EXPECT_DOUBLE_EQ(cgroup_v1_quota_cpus("200000\n", "100000\n"), 2.0);
    EXPECT_DOUBLE_EQ(cgroup_v1_quota_cpus("-1\n", "100000\n"), 0);
    EXPECT_DOUBLE_EQ(cgroup_v1_quota_cpus("", "100000"), 0);
}

// No cgroup files at all (a chroot, macOS-like /proc): the affinity mask alone.
TEST_F(CgroupTree, WithoutCgroupsTheAffinityMaskIsTheCount) {
    const UsableCores u = cores();
    EXPECT_EQ(u.count, mask_cpus());
    EXPECT_EQ(u.source.rfind("affinity mask: ", 0), 0u) << u.source;
}

// docker --cpus 1 on the group's parent, no limit on the group itself: the parent's quota holds.
TEST_F(CgroupTree, AQuotaOnAGroupAboveCapsTheCount) {
    write("proc/self/cgroup", "0::/job/step\n");
    write("sys/job/cpu.max", "100000 100000\n");
    write("sys/job/step/cpu.max", "max 100000\n");
    const UsableCores u = cores();
    EXPECT_EQ(u.count, 1);
    if (mask_cpus() > 1) {
        EXPECT_EQ(u.source.rfind("cgroup cpu.max 1 CPU (affinity mask: ", 0), 0u) << u.source;
    }
}

// 1.5 CPUs round up to 2 threads (where the mask has 2 or more CPUs); a looser quota elsewhere
// in the hierarchy does not loosen it.
TEST_F(CgroupTree, AFractionalQuotaRoundsUpAndTheTightestWins) {
    write("proc/self/cgroup", "0::/a/b\n");
    write("sys/cpu.max", "400000 100000\n");
    write("sys/a/b/cpu.max", "150000 100000\n");
    const UsableCores u = cores();
    EXPECT_EQ(u.count, std::min(2, mask_cpus()));
    if (mask_cpus() > 2) {
        EXPECT_EQ(u.source.rfind("cgroup cpu.max 1.5 CPUs", 0), 0u) << u.source;
    }
}

TEST_F(CgroupTree, CgroupV1CpuControllerQuotaIsRead) {
    write("proc/self/cgroup", "4:memory:/x\n3:cpu,cpuacct:/x\n");
    write("sys/cpu,cpuacct/x/cpu.cfs_quota_us", "100000\n");
    write("sys/cpu,cpuacct/x/cpu.cfs_period_us", "100000\n");
    const UsableCores u = cores();
    EXPECT_EQ(u.count, 1);
    if (mask_cpus() > 1) {
        EXPECT_EQ(u.source.rfind("cgroup cpu.cfs_quota_us 1 CPU", 0), 0u) << u.source;
    }
}

// A quota above the mask's CPUs changes nothing: the mask is the tighter limit.
TEST_F(CgroupTree, AQuotaLooserThanTheMaskIsNotNamed) {
    write("proc/self/cgroup", "0::/\n");
    write("sys/cpu.max", std::to_string(100000 * (mask_cpus() + 3)) + " 100000\n");
    const UsableCores u = cores();
    EXPECT_EQ(u.count, mask_cpus());
    EXPECT_EQ(u.source.rfind("affinity mask: ", 0), 0u) << u.source;
}

// run.threads unset: the CPU backend runs on the usable cores, not on libgomp's default (which
// it read when the process started). Narrowing the affinity mask to one CPU after start makes
// the two differ on any machine with two or more CPUs.
TEST(DefaultThreads, UnsetRunThreadsRunOnTheUsableCores) {
    if (std::getenv("OMP_NUM_THREADS")) GTEST_SKIP() << "OMP_NUM_THREADS is set: it is kept";
    if (mask_cpus() < 2) GTEST_SKIP() << "one CPU: nothing to narrow";
    const OneCpuMask one;
    ASSERT_TRUE(one.narrowed());
    RunConfig cfg;  // run.threads 0
    const auto backend = create_training_backend(cfg, BackendKind::cpu);
    EXPECT_GE(one.threads_before(), 2);
    EXPECT_EQ(omp_get_max_threads(), 1);
}

// More threads than usable cores is named with the cores' source and the run.threads that fits;
// as many threads as cores, or fewer, says nothing.
TEST(ThreadsBeyondCores, MoreThreadsThanUsableCoresAreNamedWithTheFix) {
    const UsableCores two{2, "cgroup cpu.max 2 CPUs (affinity mask: 8 CPUs)"};
    const auto w = threads_beyond_cores(8, two);
    ASSERT_TRUE(w.has_value());
    EXPECT_EQ(w->what,
              "runs 8 threads on 2 usable cores (cgroup cpu.max 2 CPUs (affinity mask: "
              "8 CPUs))");
    EXPECT_NE(w->fix.find("every barrier waits for the one descheduled"), std::string::npos);
    EXPECT_NE(w->fix.find("set it to 2 or fewer"), std::string::npos) << w->fix;
    EXPECT_FALSE(threads_beyond_cores(2, two).has_value());
    EXPECT_FALSE(threads_beyond_cores(1, two).has_value());
    const auto one = threads_beyond_cores(2, UsableCores{1, "affinity mask: 1 CPU"});
    ASSERT_TRUE(one.has_value());
    EXPECT_EQ(one->what, "runs 2 threads on 1 usable core (affinity mask: 1 CPU)");
}

// A built CPU backend is judged by the threads it runs against the mask it runs in: run.threads
// 2 in a mask narrowed to one CPU is warned about, run.threads 1 is not.
TEST(ThreadsBeyondCores, ABackendWithMoreThreadsThanItsMaskIsWarnedAbout) {
    if (mask_cpus() < 2) GTEST_SKIP() << "one CPU: nothing to narrow";
    const OneCpuMask one;
    ASSERT_TRUE(one.narrowed());
    RunConfig two;
    two.run.threads = 2;
    const auto over = threads_beyond_cores(*create_training_backend(two, BackendKind::cpu));
    RunConfig fits;
    fits.run.threads = 1;
    const auto within = threads_beyond_cores(*create_training_backend(fits, BackendKind::cpu));
    ASSERT_TRUE(over.has_value());
    EXPECT_EQ(over->what, "runs 2 threads on 1 usable core (affinity mask: 1 CPU)");
    EXPECT_FALSE(within.has_value());
}

}  // namespace
}  // namespace mt

// What several tests share: a temporary directory, a substring expectation, and running the
// microtrain binary (MT_BINARY, set by CMakeLists.txt) through the shell, also on one CPU.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#define EXPECT_CONTAINS(haystack, needle) \
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string(needle), std::string(haystack))

namespace mt {

// A fresh directory under the system's temporary one, removed with its contents at the end.
class TempDir {
  public:
    explicit TempDir(const std::string& prefix = "mt_test") {
        std::string t = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
        if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed for " + t);
        path_ = t;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
};

// Loads `yaml` as exp.yaml from a fresh temporary directory through `load` (the spec's
// load_experiment, passed in so this header needs no library) and returns the message of the
// exception of type E it threw ("" when it loaded).
template <typename E, typename Load>
std::string load_error_of(const std::string& yaml, Load load) {
    TempDir dir("mt_spec");
    const std::string path = dir.file("exp.yaml");
    {
        std::FILE* f = std::fopen(path.c_str(), "w");
        if (!f) throw std::runtime_error("cannot write " + path);
        std::fputs(yaml.c_str(), f);
        std::fclose(f);
    }
    try {
        load(path);
    } catch (const E& e) {
        return e.what();
    }
    return "";
}

struct CliResult {
    int rc = -1;         // the exit status; -1 when a signal ended the process
    std::string output;  // stdout + stderr
};

// Runs `command` through the shell with stderr folded into stdout.
inline CliResult run_shell(const std::string& command) {
    const std::string cmd = command + " 2>&1";
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("popen failed for: " + cmd);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// `microtrain <args>` (in directory `cwd` when given).
inline CliResult run_microtrain(const std::string& args, const std::string& cwd = "") {
    // Appended piecewise: GCC 12 warns (-Wrestrict, a known false positive) on "'" + string.
    std::string cmd = cwd.empty() ? "" : "cd '" + cwd + "' && ";
    cmd += "'";
    cmd += MT_BINARY;
    cmd += "' ";
    cmd += args;
    return run_shell(cmd);
}

// The first CPU in this process's affinity mask.
inline int first_allowed_cpu() {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0)
        throw std::runtime_error("sched_getaffinity failed");
    int cpu = 0;
    while (!CPU_ISSET(cpu, &mask)) ++cpu;
    return cpu;
}

// `microtrain <args>` in an affinity mask of one CPU (taskset -c): a process whose usable cores
// are 1 on any machine.
inline CliResult run_microtrain_on_one_cpu(const std::string& args) {
    std::string cmd = "taskset -c " + std::to_string(first_allowed_cpu()) + " '";
    cmd += MT_BINARY;
    cmd += "' ";
    cmd += args;
    return run_shell(cmd);
}

// The environment an mpirun under test needs (tests/test_data_parallel.cpp,
// tests/test_train_dist.cpp): root allowed (CI runs as root), oversubscription (2 ranks on 2
// cores), no single-copy transfers (ptrace-based CMA is often forbidden in containers); and,
// for the asan build, Open MPI's own allocations that live until exit are suppressed
// (tests/lsan-mpi.supp), which needs its plugins kept loaded (disable_dlclose) so that
// LeakSanitizer can name the module a leak comes from.
inline std::string mpi_test_env() {
    // fast_unwind_on_malloc=0: Open MPI is built without frame pointers, so the fast unwinder
    // stops inside it and a suppression could not see which library allocated.
    return "ASAN_OPTIONS=${ASAN_OPTIONS}:fast_unwind_on_malloc=0 "
           "LSAN_OPTIONS=suppressions=" MT_SOURCE_DIR
           "/tests/lsan-mpi.supp "
           "OMPI_MCA_mca_base_component_disable_dlclose=1 "
           "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
           "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 ";
}

}  // namespace mt

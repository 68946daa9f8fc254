// The OpenMP wait policy, chosen before libgomp loads its settings (see openmp_wait.h).
#include "kernels/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace mt {

namespace {

constexpr const char* kChosenMark = "MT_OPENMP_WAIT_CHOSEN";

const char* env(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}

}  // namespace

void choose_openmp_wait_policy(char** argv) {
    if (env("OMP_WAIT_POLICY") || env("GOMP_SPINCOUNT") || env(kChosenMark)) return;
    setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1);
    setenv(kChosenMark, "1", 1);
    // The same binary, the same arguments, now with the policy in its environment. On failure
    // (no /proc: a chroot) the process goes on with libgomp's default, and says so.
    execv("/proc/self/exe", argv);
    unsetenv("GOMP_SPINCOUNT");
    setenv(kChosenMark, "exec-failed", 1);
}

std::string openmp_wait_policy() {
    const char* mark = env(kChosenMark);
    const char* spin = env("GOMP_SPINCOUNT");
    if (mark && std::string(mark) == "1" && spin && std::string(spin) == kDefaultSpinCount)
        return std::string("GOMP_SPINCOUNT=") + spin + " (microtrain's default)";
    if (const char* policy = env("OMP_WAIT_POLICY"))
        return std::string(policy) + " (OMP_WAIT_POLICY)";
    if (spin) return std::string("GOMP_SPINCOUNT=") + spin;
    if (mark) return "libgomp's default (spin, then sleep): microtrain could not re-execute itself";
    return "libgomp's default (spin, then sleep)";
}

}  // namespace mt

// How the CPU backend's OpenMP threads wait at the end of a parallel region, chosen before the
// OpenMP runtime starts.
//
// Every CPU kernel is an OpenMP parallel region that ends in a barrier, a few hundred per step.
// libgomp's default is to spin at the barrier (300,000 iterations) before it sleeps: on a quiet
// machine the threads are back within microseconds. On a machine where another process takes a
// core, a spinning thread burns its time slice waiting for a sibling that the scheduler took off
// its core, at every barrier: the quickstart's step took 4.3 s with the default and 0.97 s with
// OMP_WAIT_POLICY=passive (2 threads, 2 cores, load average ~10 from other builds). Passive
// (sleep at once) costs a quiet machine about 5 % (futex wake-ups at every barrier). A short
// spin gets both: GOMP_SPINCOUNT=1000 measured within 2 % of the default on the quiet machine
// and within 5 % of passive beside a neighbour burning a core (bench/README.md, "OpenMP wait
// policy"; bench/openmp_wait.sh), so it is microtrain's default.
//
// libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, before main: no call
// can change them afterwards. So main() calls choose_openmp_wait_policy() first: when the user
// set neither variable, it sets GOMP_SPINCOUNT=1000 and executes the same binary again
// (MT_OPENMP_WAIT_CHOSEN marks the second start); a user's own setting is kept untouched.
#pragma once

#include <string>

namespace mt {

inline constexpr const char* kDefaultSpinCount = "1000";  // GOMP_SPINCOUNT

// Before anything else in main (before MPI_Init: the re-executed process joins the job). Returns
// only when the policy is in place (or the re-execution failed: then it runs with the default
// and openmp_wait_policy() says so).
void choose_openmp_wait_policy(char** argv);

// What this process runs with, for the report: "GOMP_SPINCOUNT=1000 (microtrain's default)",
// "passive (OMP_WAIT_POLICY)", "GOMP_SPINCOUNT=10000", "libgomp's default (spin, then sleep)".
std::string openmp_wait_policy();

}  // namespace mt

// How the CPU backend's OpenMP threads wait at the end of a parallel region, chosen before the
// OpenMP runtime starts.
//
// Every CPU kernel is an OpenMP parallel region that ends in a barrier, a few hundred per step.
// libgomp's default is to spin at the barrier (about 300,000 iterations) before it sleeps: on a
// quiet machine the threads are back within microseconds. On a machine where another process
// takes a core, a spinning thread burns its time slice waiting for a sibling that the scheduler
// took off its core, at every barrier: the quickstart's step went from 0.97 s to 4.3 s (median
// of 10, 2 threads, 2 cores, load average ~10 from other builds) between OMP_WAIT_POLICY=passive
// and the default — a neighbour becomes a disaster instead of a fair share. microtrain's users
// measure on shared machines, so passive (a thread that finds nothing to do sleeps at once) is
// its default; what that costs on a quiet machine is in bench/README.md ("OpenMP wait policy").
//
// libgomp reads OMP_WAIT_POLICY (and GOMP_SPINCOUNT) once, when it is loaded, before main: no
// call can change it afterwards. So main() calls choose_openmp_wait_policy() first: when the user
// set neither variable, it sets OMP_WAIT_POLICY=passive and executes the same binary again
// (MT_OPENMP_WAIT_CHOSEN marks the second start); a user's own setting is kept untouched.
#pragma once

#include <string>

namespace mt {

inline constexpr const char* kDefaultOpenMpWaitPolicy = "passive";

// Before anything else in main (before MPI_Init: the re-executed process joins the job). Returns
// only when the policy is in place (or the re-execution failed: then it runs with the default
// and openmp_wait_policy() says so).
void choose_openmp_wait_policy(char** argv);

// What this process runs with, for the report: "passive (microtrain's default)",
// "active (OMP_WAIT_POLICY)", "GOMP_SPINCOUNT=10000", "libgomp's default (spin, then sleep)".
std::string openmp_wait_policy();

}  // namespace mt

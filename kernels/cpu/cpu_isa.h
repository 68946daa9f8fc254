// The CPU backend's ISA levels: which compiled kernel set runs, chosen at run time.
//
// One build compiles the CPU kernels once per level (CMakeLists.txt, "CPU ISA levels"):
//   avx512    x86-64-v4 (AVX-512 F/BW/DQ/VL + FMA): the packed GEMM's 12x32 zmm kernel;
//   avx2      x86-64-v3 (AVX2 + FMA): the packed GEMM's 6x16 ymm kernel;
//   baseline  x86-64 (SSE2): Eigen's GEMM, the other kernels as the compiler vectorises them.
// (On a CPU that is not x86-64 only `baseline` exists, compiled for the target's defaults.)
// The backend runs the best level this CPU supports, or the one MT_CPU_ISA names; a level the
// CPU lacks is refused with the features it is missing.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/kernel_table.h"

namespace mt::cpu {

enum class CpuIsa { baseline, avx2, avx512 };

// "baseline", "avx2", "avx512": the values of MT_CPU_ISA and the names the device line shows.
const char* to_string(CpuIsa isa);
// The level of that name (nullopt: not a level's name).
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// The CPU features the levels need. __builtin_cpu_supports (GCC >= 11, clang) reports a feature
// only when the OS also saves its registers (XGETBV: YMM state for AVX2, ZMM and mask state for
// AVX-512), so a feature here is one a program can use.
struct CpuFeatures {
    bool avx2 = false, fma = false;
    bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
};
CpuFeatures detect_cpu_features();

// The features `isa` needs that `cpu` lacks, by their /proc/cpuinfo names (empty: it runs).
std::vector<std::string> missing_cpu_features(CpuIsa isa, const CpuFeatures& cpu);

// The levels `cpu` runs in this build, best first (what select_cpu_isa("") picks is the first;
// MT_CPU_ISA accepts each). Never empty: baseline runs everywhere.
std::vector<CpuIsa> runnable_cpu_isa_levels(const CpuFeatures& cpu);

// The level to run: `requested` (MT_CPU_ISA's value; empty = the best level `cpu` supports).
// Throws BackendError for a name that is not a level, or a level `cpu` lacks (naming the missing
// features). `cpu` is a parameter so tests can pretend to be a CPU without AVX-512.
CpuIsa select_cpu_isa(std::string_view requested, const CpuFeatures& cpu);

// select_cpu_isa(MT_CPU_ISA from the environment, this CPU's features).
CpuIsa cpu_isa_from_environment();

// The level's kernels.
const KernelTable& kernel_table(CpuIsa isa);

// The kernels the free functions of kernels.h and gemm.h run (dispatch.cpp): the level of
// cpu_isa_from_environment(), chosen on the first call (which throws what it throws).
const KernelTable& default_kernel_table();

}  // namespace mt::cpu

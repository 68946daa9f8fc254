// Choosing the CPU ISA level at run time (cpu_isa.h). Compiled for the build's default target
// (plain x86-64), like the rest of the backend glue: nothing here may need AVX.
#include "kernels/cpu/cpu_isa.h"

#include <cstdlib>

#include "kernels/text.h"
#include "kernels/types.h"

namespace mt::cpu {
namespace {

constexpr CpuIsa kAllLevels[] = {CpuIsa::avx512, CpuIsa::avx2, CpuIsa::baseline};  // best first

bool compiled(CpuIsa isa) {
#if defined(__x86_64__)
    (void)isa;
    return true;
#else
    return isa == CpuIsa::baseline;
#endif
}

std::string names_of(const std::vector<CpuIsa>& levels) {
    std::vector<std::string> names;
    for (CpuIsa isa : levels) names.push_back(to_string(isa));
    return join(names, ", ");
}

std::string level_names() {
    std::vector<CpuIsa> levels;
    for (CpuIsa isa : kAllLevels)
        if (compiled(isa)) levels.push_back(isa);
    return names_of(levels);
}

}  // namespace

const char* to_string(CpuIsa isa) {
    switch (isa) {
        case CpuIsa::baseline:
            return "baseline";
        case CpuIsa::avx2:
            return "avx2";
        case CpuIsa::avx512:
            return "avx512";
    }
    return "?";
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
    for (CpuIsa isa : kAllLevels)
        if (name == to_string(isa)) return isa;
    return std::nullopt;
}

CpuFeatures detect_cpu_features() {
    CpuFeatures f;
#if defined(__x86_64__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
#endif
    return f;
}

std::vector<std::string> missing_cpu_features(CpuIsa isa, const CpuFeatures& cpu) {
    std::vector<std::string> missing;
    auto need = [&](bool have, const char* name) {
        if (!have) missing.push_back(name);
    };
    if (isa == CpuIsa::avx2 || isa == CpuIsa::avx512) {  // x86-64-v4 includes x86-64-v3
        need(cpu.avx2, "avx2");
        need(cpu.fma, "fma");
    }
    if (isa == CpuIsa::avx512) {
        need(cpu.avx512f, "avx512f");
        need(cpu.avx512bw, "avx512bw");
        need(cpu.avx512dq, "avx512dq");
        need(cpu.avx512vl, "avx512vl");
    }
    return missing;
}

std::vector<CpuIsa> runnable_cpu_isa_levels(const CpuFeatures& cpu) {
    std::vector<CpuIsa> levels;
    for (CpuIsa isa : kAllLevels)
        if (compiled(isa) && missing_cpu_features(isa, cpu).empty()) levels.push_back(isa);
    return levels;
}

CpuIsa select_cpu_isa(std::string_view requested, const CpuFeatures& cpu) {
    if (requested.empty()) return runnable_cpu_isa_levels(cpu).front();
    const std::optional<CpuIsa> isa = parse_cpu_isa(requested);
    if (!isa)
        throw BackendError("MT_CPU_ISA=" + std::string(requested) +
                           ": not a CPU ISA level; use one of " + level_names() +
                           ", or unset it to run the best level this CPU has");
    if (!compiled(*isa))
        throw BackendError("MT_CPU_ISA=" + std::string(requested) +
                           ": this build has no such level (it is not for x86-64); it has " +
                           level_names());
    if (const auto missing = missing_cpu_features(*isa, cpu); !missing.empty())
        throw BackendError("MT_CPU_ISA=" + std::string(requested) +
                           ": this CPU cannot run that level, it lacks " + join(missing, ", ") +
                           "; choose a level it runs (" + names_of(runnable_cpu_isa_levels(cpu)) +
                           ") or unset MT_CPU_ISA to run the best one it has");
    return *isa;
}

CpuIsa cpu_isa_from_environment() {
    const char* env = std::getenv("MT_CPU_ISA");
    return select_cpu_isa(env ? env : "", detect_cpu_features());
}

const KernelTable& kernel_table(CpuIsa isa) {
    switch (isa) {
#if defined(__x86_64__)
        case CpuIsa::avx512:
            return isa_avx512::kernel_table();
        case CpuIsa::avx2:
            return isa_avx2::kernel_table();
#endif
        default:
            return isa_baseline::kernel_table();
    }
}

const KernelTable& default_kernel_table() {
    static const KernelTable& table = kernel_table(cpu_isa_from_environment());
    return table;
}

}  // namespace mt::cpu

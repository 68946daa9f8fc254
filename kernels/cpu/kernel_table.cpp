// This ISA level's KernelTable (kernel_table.h): compiled once per level, like the kernels, and
// the only symbol of the level's object that the rest of the program can see.
#include "kernels/cpu/kernel_table.h"

#if !defined(MT_CPU_LEVEL_NS)
#error "kernel_table.cpp is compiled once per CPU ISA level, with MT_CPU_LEVEL_NS defined"
#endif

namespace mt::cpu::MT_CPU_LEVEL_NS {

const KernelTable& kernel_table() {
    // Unqualified names find this level's functions first (kernels.h declares them here too).
    static constexpr KernelTable table = {
#define MT_CPU_KERNEL_ENTRY(name) .name = &name,
        MT_CPU_KERNEL_TABLE(MT_CPU_KERNEL_ENTRY)
#undef MT_CPU_KERNEL_ENTRY
            .gemm = &gemm,
    };
    return table;
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

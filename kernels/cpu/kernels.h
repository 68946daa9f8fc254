// The CPU kernels as free functions on fp32 host pointers, one group per op family (the .cpp
// files beside this header), so tests can call them directly without a Backend. The declarations
// are in kernels_api.inc; the functions in mt::cpu run the kernels of the process's ISA level
// (cpu_isa.h: MT_CPU_ISA, else the best the CPU runs), each level's own being in
// mt::cpu::isa_<level> (docs/design.md, "The CPU backend's ISA levels"). What each op
// computes is written once, in the op table (kernels/ops.h); CpuBackend (cpu_backend.cpp) binds
// each op to the kernel (or the variant) below. Variants of one op sit side by side.
//
// Conventions (the same as kernels/backend.h):
// - Row-major, last index fastest; N = B*T rows, C channels, OC output channels, NH heads.
// - Linear weights are PyTorch's (OC, C) layout.
// - Every backward ACCUMULATES (+=) into the gradients it is given.
// - No op allocates memory it does not get from its caller (the GEMM packs its panels in
//   per-thread buffers obtained once, on a thread's first GEMM; see gemm.cpp). Parallel loops use
//   OpenMP; every reduction is done in a fixed order, so the result does not depend on how
//   threads are scheduled.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/math.h"
#include "kernels/ops.h"

namespace mt::cpu {

#include "kernels/cpu/kernels_api.inc"

#if defined(MT_CPU_LEVEL_NS)
namespace MT_CPU_LEVEL_NS {
#include "kernels/cpu/kernels_api.inc"
}  // namespace MT_CPU_LEVEL_NS
#endif

}  // namespace mt::cpu

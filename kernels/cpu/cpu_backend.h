// The CPU backend: our packed GEMM (AVX-512 or AVX2) + OpenMP loops, fp32 only, in the kernel set
// of the ISA level chosen at construction (kernels/cpu/cpu_isa.h: MT_CPU_ISA, else the best the
// CPU runs; Eigen's GEMM on the baseline level). One file per op family beside this header
// (encoder.cpp, layernorm.cpp, matmul.cpp, attention.cpp, ...), the class in cpu_backend.cpp.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace mt {
// Throws BackendError for what the CPU cannot run: precision bf16 or tf32 (fp32 only; tf32 would
// silently be fp32), attention cudnn (naive and flash exist), num_threads outside
// 0..kMaxThreads, MT_CPU_ISA naming a level that does not exist or that this CPU lacks.
// num_threads > 0 calls omp_set_num_threads; 0 leaves OpenMP's setting as it is.
std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options);
}  // namespace mt

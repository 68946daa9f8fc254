// The CPU backend: our packed AVX-512 GEMM (Eigen's where AVX-512 is not compiled) + OpenMP
// loops, fp32 only. One file per op family beside this
// header (encoder.cpp, layernorm.cpp, matmul.cpp, attention.cpp, ...), the class in
// cpu_backend.cpp.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace mt {
// Throws BackendError for what the CPU cannot run: precision bf16 or tf32 (fp32 only; tf32 would
// silently be fp32), attention cudnn (naive and flash exist), num_threads outside
// 0..kMaxThreads.
// num_threads > 0 calls omp_set_num_threads; 0 leaves OpenMP's setting as it is.
std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options);
}  // namespace mt

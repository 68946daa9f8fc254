// The CPU backend: Eigen GEMMs + OpenMP loops, fp32 only. One file per op family beside this
// header (encoder.cpp, layernorm.cpp, matmul.cpp, attention.cpp, ...), the class in cpu_backend.cpp.
#pragma once

#include <memory>

#include "kernels/backend.h"

namespace mt {
// Throws BackendError for a precision the CPU cannot run (bf16).
std::unique_ptr<Backend> create_cpu_backend(const BackendOptions& options);
}  // namespace mt

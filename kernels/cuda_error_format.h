// Plain-C++ formatting of CUDA / cuBLAS / cuDNN failures, kept free of CUDA headers so the CPU
// test suite can pin the exact wording (tests/test_peak_flops.cpp). The CUDA backend's
// CUDA_CHECK / CUBLAS_CHECK macros (kernels/cuda/runtime.cuh) call these with the library's own
// name and description of the status.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace mt {

// "<library> error <status_name> (<description>) in <call> at <file>:<line>"
// e.g. "CUDA error cudaErrorInvalidValue (invalid argument) in cudaMemcpyAsync(...) at
// kernels/cuda/cuda_backend.cu:120". `file` is shortened to the part from "kernels/" on.
std::string format_gpu_error(const char* library, const char* status_name, const char* description,
                             const char* call, const char* file, int line);

// The out-of-memory message: which category asked for how much, what the device had free out
// of its total, what each category holds right now, and what to shrink.
//   tracked: bytes currently allocated per MemoryCategory (params, grads, optimizer,
//   activations, workspace, data).
std::string format_out_of_memory(const char* category, size_t bytes_asked, size_t free_bytes,
                                 size_t total_bytes, const std::array<size_t, 6>& tracked);

// Bytes as MiB with two decimals: "12.50 MiB".
std::string format_mib(size_t bytes);

}  // namespace mt

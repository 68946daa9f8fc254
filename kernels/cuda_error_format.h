// Plain-C++ formatting of CUDA / cuBLAS / cuDNN failures, kept free of CUDA headers (and in
// kernels/, not kernels/cuda/) so the CPU test suite can pin the exact wording
// (tests/test_peak_flops.cpp) in builds without the CUDA backend. The CUDA backend's
// CUDA_CHECK / CUBLAS_CHECK macros (kernels/cuda/runtime.cuh) call these with the library's own
// name and description of the status.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "kernels/text.h"

namespace mt {

// "<library> error <status_name> (<description>) in <call> at <file>:<line>"
// e.g. "CUDA error cudaErrorInvalidValue (invalid argument) in cudaMemcpyAsync(...) at
// kernels/cuda/cuda_backend.cu:120". `file` is shortened to the part from "kernels/" on.
inline std::string format_gpu_error(const char* library, const char* status_name,
                                    const char* description, const char* call, const char* file,
                                    int line);

// The out-of-memory message: which category asked for how much, what the device had free out
// of its total, what each category holds right now, and what to shrink.
//   tracked: bytes currently allocated per MemoryCategory (params, grads, optimizer,
//   activations, workspace, data).
inline std::string format_out_of_memory(const char* category, size_t bytes_asked, size_t free_bytes,
                                        size_t total_bytes, const std::array<size_t, 6>& tracked);

// ---- definitions ----

inline std::string format_gpu_error(const char* library, const char* status_name,
                                    const char* description, const char* call, const char* file,
                                    int line) {
    std::string f = file ? file : "?";
    if (auto pos = f.rfind("kernels/"); pos != std::string::npos) f = f.substr(pos);
    std::string s;  // append(): GCC 12 warns (-Wrestrict, false positive) on chained operator+
    s.append(library).append(" error ").append(status_name ? status_name : "?");
    if (description && *description &&
        std::strcmp(description, status_name ? status_name : "") != 0)
        s.append(" (").append(description).append(")");
    s.append(" in ").append(call ? call : "?").append(" at ").append(f).append(":");
    s.append(std::to_string(line));
    return s;
}

inline std::string format_out_of_memory(const char* category, size_t bytes_asked, size_t free_bytes,
                                        size_t total_bytes, const std::array<size_t, 6>& tracked) {
    static constexpr const char* names[6] = {"params",      "grads",     "optimizer",
                                             "activations", "workspace", "data"};
    std::string s = std::string("CUDA out of memory: category '") + category + "' asked for " +
                    format_mib(bytes_asked) + "; the device has " + format_mib(free_bytes) +
                    " free of " + format_mib(total_bytes) + " total. Allocated now:";
    size_t sum = 0;
    for (int i = 0; i < 6; ++i) {
        s += std::string(" ") + names[i] + " " + format_mib(tracked[i]) + (i < 5 ? "," : ";");
        sum += tracked[i];
    }
    s += " tracked total " + format_mib(sum) +
         " (the rest of the used memory is the CUDA context, cuBLAS and other processes). "
         "To fit: reduce data.batch_size or data.seq_len, set run.recompute (gelu or "
         "layernorm_gelu), use run.precision: bf16, or pick a smaller model; compare with the "
         "analytic estimate printed before the run.";
    return s;
}

}  // namespace mt

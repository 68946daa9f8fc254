#include "kernels/cuda_error_format.h"

#include <cstdio>
#include <cstring>

namespace mt {

std::string format_mib(size_t bytes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

std::string format_gpu_error(const char* library, const char* status_name, const char* description,
                             const char* call, const char* file, int line) {
    std::string f = file ? file : "?";
    if (auto pos = f.rfind("kernels/"); pos != std::string::npos) f = f.substr(pos);
    std::string s = std::string(library) + " error " + (status_name ? status_name : "?");
    if (description && *description &&
        std::strcmp(description, status_name ? status_name : "") != 0)
        s += std::string(" (") + description + ")";
    s += std::string(" in ") + (call ? call : "?") + " at " + f + ":" + std::to_string(line);
    return s;
}

std::string format_out_of_memory(const char* category, size_t bytes_asked, size_t free_bytes,
                                 size_t total_bytes, const std::array<size_t, 6>& tracked) {
    static const char* names[6] = {"params",      "grads",     "optimizer",
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

// Backend plumbing shared by every implementation: names, allocator accounting, the factory.
#include "kernels/backend.h"

#include <algorithm>

#include "kernels/cpu/cpu_backend.h"
#if defined(MT_HAVE_CUDA)
#include "kernels/cuda/cuda_backend.h"
#endif

namespace mt {

const char* to_string(BackendKind k) {
    return k == BackendKind::cpu ? "cpu" : "cuda";
}
const char* to_string(Precision p) {
    switch (p) {
        case Precision::fp32:
            return "fp32";
        case Precision::tf32:
            return "tf32";
        case Precision::bf16:
            return "bf16";
    }
    return "?";
}
const char* to_string(AttentionImpl a) {
    switch (a) {
        case AttentionImpl::naive:
            return "naive";
        case AttentionImpl::flash:
            return "flash";
        case AttentionImpl::cudnn:
            return "cudnn";
    }
    return "?";
}
const char* to_string(ClassifierImpl c) {
    return c == ClassifierImpl::fused ? "fused" : "unfused";
}
const char* to_string(AdamWImpl a) {
    switch (a) {
        case AdamWImpl::unfused:
            return "unfused";
        case AdamWImpl::multi_tensor:
            return "multi_tensor";
        case AdamWImpl::fused:
            return "fused";
    }
    return "?";
}
const char* to_string(LayerNormImpl l) {
    return l == LayerNormImpl::fused_residual ? "fused_residual" : "separate";
}
const char* to_string(MemoryCategory c) {
    static const char* names[kMemoryCategoryCount] = {"params",      "grads",     "optimizer",
                                                      "activations", "workspace", "data"};
    return names[static_cast<int>(c)];
}

void Backend::account_alloc(MemoryCategory c, size_t bytes) {
    auto i = static_cast<int>(c);
    stats_.current[i] += bytes;
    stats_.peak[i] = std::max(stats_.peak[i], stats_.current[i]);
    stats_.current_total += bytes;
    stats_.peak_total = std::max(stats_.peak_total, stats_.current_total);
}

void Backend::account_free(MemoryCategory c, size_t bytes) {
    auto i = static_cast<int>(c);
    stats_.current[i] -= std::min(stats_.current[i], bytes);
    stats_.current_total -= std::min(stats_.current_total, bytes);
}

void Backend::reset_peaks() {
    stats_.peak = stats_.current;
    stats_.peak_total = stats_.current_total;
}

bool cuda_available(std::string* why_not) {
#if defined(MT_HAVE_CUDA)
    return cuda_device_available(why_not);
#else
    if (why_not) *why_not = "this build has no CUDA backend (nvcc was not found at configure time)";
    return false;
#endif
}

std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options) {
    if (kind == BackendKind::cpu) return create_cpu_backend(options);
#if defined(MT_HAVE_CUDA)
    return create_cuda_backend(options);
#else
    throw BackendError(
        "backend 'cuda' is not available: this build has no CUDA backend (nvcc was not found "
        "when CMake configured it); use backend: cpu, or rebuild on a machine with the CUDA "
        "toolkit");
#endif
}

}  // namespace mt

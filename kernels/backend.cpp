// Backend plumbing shared by every implementation: allocator accounting.
// (The factory that knows the concrete backends is kernels/backend_factory.cpp.)
#include "kernels/backend.h"

#include <algorithm>

namespace mt {

std::string Backend::implementation(std::string_view op) const {
    const KernelChoice& k = options_.kernels;
    if (op == "matmul_forward" || op == "matmul_gelu_forward" || op == "matmul_backward")
        return to_string(matmul_impl());
    if (op == "attention_forward" || op == "attention_backward") return to_string(k.attention);
    if (op == "layernorm_forward" || op == "fused_residual_layernorm_forward")
        return to_string(k.layernorm_forward);
    if (op == "classifier_fused") return to_string(k.classifier);
    return "";
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

}  // namespace mt

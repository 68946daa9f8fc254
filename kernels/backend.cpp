// Backend plumbing shared by every implementation: allocator accounting.
// (The factory that knows the concrete backends is kernels/backend_factory.cpp.)
#include "kernels/backend.h"

#include <algorithm>

namespace mt {

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

// The vocabulary's few functions (see types.h).
#include "kernels/types.h"

namespace mt {

std::string thread_count_error(std::string_view field, int threads) {
    if (threads >= 0 && threads <= kMaxThreads) return {};
    return std::string(field) + " (run.threads, --threads) must be in 0.." +
           std::to_string(kMaxThreads) + " (0 = OpenMP's default, one per core), got " +
           std::to_string(threads);
}

}  // namespace mt

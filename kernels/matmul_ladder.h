// The matmul ladders as an order: which rung comes after which on each backend (the report names
// the next rung of an op that runs far below its roofline). The rungs themselves, and which
// backend has which, are defined once in kernels/types.h (MatmulImpl, is_cpu_matmul,
// is_cuda_matmul); MatmulImpl lists each backend's rungs slowest first.
#pragma once

#include <optional>

#include "kernels/types.h"

namespace mt {

// The rung above `m` on `backend`'s matmul ladder, or nullopt at the top or for a step that
// backend does not have (auto included: it is already the backend's fastest). `has_packed`:
// whether the CPU kernel set in use has a packed GEMM (the baseline ISA level has none:
// kernels/cpu/cpu_isa.h), else that rung is skipped.
inline std::optional<MatmulImpl> next_matmul_rung(BackendKind backend, MatmulImpl m,
                                                  bool has_packed = true) {
    const auto on_backend = [&](MatmulImpl x) {
        if (x == MatmulImpl::packed && !has_packed) return false;
        return backend == BackendKind::cpu ? is_cpu_matmul(x) : is_cuda_matmul(x);
    };
    if (m == MatmulImpl::auto_ || !on_backend(m)) return std::nullopt;
    const int rungs = static_cast<int>(EnumSpelling<MatmulImpl>::names.size());
    for (int i = static_cast<int>(m) + 1; i < rungs; ++i)
        if (on_backend(static_cast<MatmulImpl>(i))) return static_cast<MatmulImpl>(i);
    return std::nullopt;
}

}  // namespace mt

// What every backend's AdamW does before it launches anything: check the request (1-based
// step, sorted disjoint slices inside the buffer) and compute the per-step scalars of
// math::adamw_update on the host, in the same double arithmetic, so the CPU and CUDA
// implementations start from bitwise-identical bias corrections. Header-only: the CUDA
// library uses it without linking mt_core.
#pragma once

#include <cmath>
#include <span>
#include <string>

#include "kernels/backend.h"
#include "kernels/math.h"

namespace mt {

using TensorSlice = Backend::TensorSlice;

// The per-step scalars of math::adamw_update (bias corrections 1 - beta^t, in double, rounded
// once to float).
inline math::AdamWScalars adamw_scalars(const Backend::AdamWParams& hp) {
    math::AdamWScalars s;
    s.lr = hp.lr;
    s.beta1 = hp.beta1;
    s.beta2 = hp.beta2;
    s.eps = hp.eps;
    s.weight_decay = hp.weight_decay;
    s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), hp.step));
    s.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), hp.step));
    return s;
}

inline void check_adamw_slices(std::span<const TensorSlice> tensors, size_t total) {
    size_t end_prev = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        const TensorSlice& t = tensors[i];
        if (t.offset < end_prev) {
            throw BackendError("adamw_update: tensor slice " + std::to_string(i) + " (offset " +
                               std::to_string(t.offset) +
                               ") starts before the previous slice ends (" +
                               std::to_string(end_prev) +
                               "); slices must be sorted by offset and must not overlap");
        }
        if (t.offset > total || t.count > total - t.offset) {
            throw BackendError("adamw_update: tensor slice " + std::to_string(i) + " [" +
                               std::to_string(t.offset) + ", " +
                               std::to_string(t.offset + t.count) + ") ends past the buffer of " +
                               std::to_string(total) + " floats");
        }
        end_prev = t.offset + t.count;
    }
}

// Throws BackendError unless hp.step >= 1 and the slices are valid (check_adamw_slices);
// returns the step's scalars.
inline math::AdamWScalars prepare_adamw(std::span<const TensorSlice> tensors, size_t total,
                                        const Backend::AdamWParams& hp) {
    if (hp.step < 1)
        throw BackendError("adamw_update: step must be >= 1 (1-based, for bias correction), got " +
                           std::to_string(hp.step));
    check_adamw_slices(tensors, total);
    return adamw_scalars(hp);
}

}  // namespace mt

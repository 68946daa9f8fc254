// Symmetric per-row int8 quantisation of a weight matrix (model.quantize_frozen: int8).
//
// Each row o of W (rows, cols) gets one fp32 scale s[o] = max_c |W[o,c]| / 127 and int8 values
// q[o,c] = round(W[o,c] / s[o]) in [-127, 127], so W[o,c] ~= s[o] q[o,c] with an error of at
// most s[o]/2 per element. A row is one output channel of a Linear layer (PyTorch's (OC, C)
// layout), the granularity at which weight magnitudes differ most. Host code: the model
// quantises once when the weights are set; the matmul kernels dequantise on the fly.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mt {

inline float dequantize_int8(int8_t q, float scale) {
    return static_cast<float>(q) * scale;
}

// w (rows, cols) -> q (rows, cols), scales (rows). An all-zero row gets scale 0 (and q 0).
inline void quantize_int8_per_row(const float* w, int rows, int cols, int8_t* q, float* scales) {
    for (int o = 0; o < rows; ++o) {
        const float* row = w + static_cast<long long>(o) * cols;
        int8_t* qrow = q + static_cast<long long>(o) * cols;
        float maxabs = 0.0f;
        for (int c = 0; c < cols; ++c) maxabs = std::max(maxabs, std::fabs(row[c]));
        const float s = maxabs / 127.0f;
        scales[o] = s;
        const float inv = s > 0 ? 1.0f / s : 0.0f;
        for (int c = 0; c < cols; ++c)
            qrow[c] =
                static_cast<int8_t>(std::clamp(std::nearbyint(row[c] * inv), -127.0f, 127.0f));
    }
}

}  // namespace mt

// Analytic costs of each op: floating-point operations and the bytes a perfect implementation
// must move to/from main memory (each input read once, each output written once). The profile
// divides these by the measured time to get achieved FLOP/s and GB/s, and compares
// flops/bytes (arithmetic intensity) with the machine's ridge point for the roofline verdict.
// `e` is the bytes of one activation element in compute precision (4 fp32, 2 bf16).
#pragma once

#include <cstddef>

#include "kernels/backend.h"

namespace mt::cost {

inline double d(long long x) { return static_cast<double>(x); }

// out (N,OC) = inp (N,C) W^T + b
inline OpRecord matmul_forward(long long N, long long C, long long OC, double e) {
    return {"matmul_forward", 2.0 * d(N) * d(C) * d(OC) + d(N) * d(OC),
            e * (d(N) * d(C) + d(OC) * d(C) + d(N) * d(OC) + d(OC))};
}
// dinp = dout W (2NC*OC), dW = dout^T inp (2NC*OC), db = sum dout (N*OC)
inline OpRecord matmul_backward(long long N, long long C, long long OC, double e) {
    return {"matmul_backward", 4.0 * d(N) * d(C) * d(OC) + d(N) * d(OC),
            e * (d(N) * d(OC) + d(N) * d(C) + d(OC) * d(C) + 2.0 * d(N) * d(C)) +
                4.0 * (2.0 * d(OC) * d(C) + 2.0 * d(OC))};
}
inline OpRecord layernorm_forward(long long N, long long C, double e) {
    return {"layernorm_forward", 8.0 * d(N) * d(C), e * (2.0 * d(N) * d(C) + 2.0 * d(C)) + 8.0 * d(N)};
}
inline OpRecord layernorm_backward(long long N, long long C, double e) {
    return {"layernorm_backward", 14.0 * d(N) * d(C),
            e * (4.0 * d(N) * d(C) + d(C)) + 8.0 * d(N) + 4.0 * 4.0 * d(C)};
}
inline OpRecord fused_residual_layernorm_forward(long long N, long long C, double e) {
    return {"fused_residual_layernorm_forward", 9.0 * d(N) * d(C),
            e * (4.0 * d(N) * d(C) + 2.0 * d(C)) + 8.0 * d(N)};
}
inline OpRecord encoder_forward(long long B, long long T, long long C, double e) {
    return {"encoder_forward", d(B) * d(T) * d(C), e * 3.0 * d(B) * d(T) * d(C) + 4.0 * d(B) * d(T)};
}
inline OpRecord encoder_backward(long long B, long long T, long long C, double e) {
    return {"encoder_backward", 2.0 * d(B) * d(T) * d(C),
            e * d(B) * d(T) * d(C) + 4.0 * 4.0 * d(B) * d(T) * d(C)};
}
// Causal attention, counting the work of the causal half only (T(T+1)/2 score pairs):
// QK^T and PV are 2*hs flops per pair each, softmax ~5 flops per pair.
inline OpRecord attention_forward(long long B, long long T, long long C, long long NH, double e,
                                  size_t saved_elems) {
    double pairs = d(B) * d(NH) * d(T) * d(T + 1) / 2.0;
    double hs = d(C) / d(NH);
    return {"attention_forward", pairs * (4.0 * hs + 5.0),
            e * (3.0 * d(B) * d(T) * d(C) + d(B) * d(T) * d(C)) + 4.0 * d(saved_elems)};
}
inline OpRecord attention_backward(long long B, long long T, long long C, long long NH, double e,
                                   size_t saved_elems) {
    double pairs = d(B) * d(NH) * d(T) * d(T + 1) / 2.0;
    double hs = d(C) / d(NH);
    return {"attention_backward", pairs * (8.0 * hs + 6.0),
            e * (3.0 * d(B) * d(T) * d(C) + 2.0 * d(B) * d(T) * d(C) + 2.0 * 3.0 * d(B) * d(T) * d(C)) +
                4.0 * d(saved_elems)};
}
inline OpRecord gelu_forward(size_t n, double e) { return {"gelu_forward", 12.0 * d(n), 2.0 * e * d(n)}; }
inline OpRecord gelu_backward(size_t n, double e) {
    return {"gelu_backward", 18.0 * d(n), 4.0 * e * d(n)};
}
inline OpRecord residual_forward(size_t n, double e) {
    return {"residual_forward", d(n), 3.0 * e * d(n)};
}
inline OpRecord residual_backward(size_t n, double e) {
    return {"residual_backward", 2.0 * d(n), 5.0 * e * d(n)};
}
// Fused classifier: one read of the logits, one write of their gradient (in place), ~6 flops per
// logit (max, exp, sum, normalise, subtract, scale).
inline OpRecord classifier_fused(long long N, long long Vp, double e, bool write_grad) {
    return {"classifier_fused", 6.0 * d(N) * d(Vp),
            e * d(N) * d(Vp) * (write_grad ? 2.0 : 1.0) + 8.0 * d(N)};
}
inline OpRecord softmax_forward(long long N, long long Vp, double e) {
    return {"softmax_forward", 4.0 * d(N) * d(Vp), e * d(N) * d(Vp) + 4.0 * d(N) * d(Vp)};
}
inline OpRecord crossentropy_forward(long long N) {
    return {"crossentropy_forward", d(N), 12.0 * d(N)};
}
inline OpRecord crossentropy_softmax_backward(long long N, long long Vp, double e) {
    return {"crossentropy_softmax_backward", 2.0 * d(N) * d(Vp), 4.0 * d(N) * d(Vp) + e * d(N) * d(Vp)};
}
inline OpRecord global_norm(size_t n) { return {"global_norm", 2.0 * d(n), 4.0 * d(n)}; }
// AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter, ~16 flops.
inline OpRecord adamw(size_t n) { return {"adamw", 16.0 * d(n), 28.0 * d(n)}; }
inline OpRecord cast_params(size_t n, double e) { return {"cast_params", 0.0, (4.0 + e) * d(n)}; }

}  // namespace mt::cost

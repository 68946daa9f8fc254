// Scalar math shared by the CPU and CUDA backends, so both compute the same function the same
// way (the CPU backend is the oracle for every CUDA kernel).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif

namespace mt::math {

inline constexpr float kLayerNormEps = 1e-5f;
inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCubic = 0.044715f;

// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
MT_HD float gelu(float x) {
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// d gelu / dx = 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx,  du/dx = sqrt(2/pi)(1 + 3*0.044715 x^2)
MT_HD float gelu_grad(float x) {
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    float t = tanhf(u);
    float sech2 = 1.0f - t * t;
    return 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
}

// Online softmax: running (max m, normaliser d) over a stream of scores. Folding in x:
//   m' = max(m, x);  d' = d * exp(m - m') + exp(x - m')
// Used by the flash attention kernels and the classifier's single pass over the logits.
struct OnlineSoftmax {
    float max = -INFINITY;
    float sum = 0.0f;
};
MT_HD OnlineSoftmax online_softmax_update(OnlineSoftmax s, float x) {
    float m = fmaxf(s.max, x);
    s.sum = s.sum * expf(s.max - m) + expf(x - m);
    s.max = m;
    return s;
}
// Merge two partial states (parallel reductions).
MT_HD OnlineSoftmax online_softmax_merge(OnlineSoftmax a, OnlineSoftmax b) {
    float m = fmaxf(a.max, b.max);
    if (m == -INFINITY) return a;
    OnlineSoftmax r;
    r.max = m;
    r.sum = a.sum * expf(a.max - m) + b.sum * expf(b.max - m);
    return r;
}

// One AdamW element update (decoupled weight decay, bias correction folded into the step).
// Every AdamW implementation on every backend calls exactly this, in this order of operations,
// which is what makes unfused / multi_tensor / fused bitwise identical.
//   g  = grad * grad_scale
//   m  = b1 m + (1 - b1) g
//   v  = b2 v + (1 - b2) g^2
//   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p),  mhat = m / (1 - b1^t), vhat = v / (1 - b2^t)
struct AdamWScalars {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1;  // 1 - beta1^t
    float bias_correction2;  // 1 - beta2^t
};
MT_HD void adamw_update(float& p, float& m, float& v, float grad, float grad_scale,
                        const AdamWScalars& s, bool decay) {
    float g = grad * grad_scale;
    m = s.beta1 * m + (1.0f - s.beta1) * g;
    v = s.beta2 * v + (1.0f - s.beta2) * g * g;
    float mhat = m / s.bias_correction1;
    float vhat = v / s.bias_correction2;
    float wd = decay ? s.weight_decay : 0.0f;
    p -= s.lr * (mhat / (sqrtf(vhat) + s.eps) + wd * p);
}

}  // namespace mt::math

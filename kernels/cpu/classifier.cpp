// Classifier: softmax cross-entropy over the first V of Vp logit columns (Vp = V rounded up to
// a multiple of 128 so the LM-head GEMM has friendly shapes; columns V..Vp-1 are padding and
// take no part in the softmax).
//
// With p = softmax(x) over a row and y its target:  loss = -log p_y = log sum_i exp(x_i) - x_y,
// and d loss / d x_i = p_i - [i == y]. With the mean over N rows, dloss = 1/N scales every row.
//
// fused: one kernel per row, and no (N,Vp) probability tensor. Pass 1 over the row folds the
//   logits into an online-softmax state (max m, sum l of exp(x - m)), block by block: each block
//   takes its max (vectorised), sums exp(x - block max), and is merged with
//   math::online_softmax_merge, so there is one exp per logit, not the two an element-wise
//   online update costs. Pass 2 writes dlogits = (exp(x - m)/l - onehot) dloss over the logits
//   in place (the row is still in cache) and zeros the padding. Traffic: one read of the logits,
//   one write of their gradient.
// unfused: what a framework's three ops do: softmax writes probs (N,Vp), cross-entropy reads
//   them for the loss, the backward reads them again to write dlogits. Two extra (N,Vp) fp32
//   tensors of traffic, and the probs tensor itself in memory.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/ops.h"

namespace mt::cpu {
namespace {

// Clear error for a target outside [0, V) (the op would read outside the row otherwise).
void check_targets(const int* targets, int N, int V, const char* op) {
    for (int n = 0; n < N; n++) {
        if (targets[n] < 0 || targets[n] >= V) {
            throw BackendError(std::string(op) + ": target of row " + std::to_string(n) + " is " +
                               std::to_string(targets[n]) + ", outside the vocabulary [0, " +
                               std::to_string(V) +
                               "); check that the data's token ids fit model.vocab_size");
        }
    }
}

// Online-softmax state of x[0..V), one exp per element.
inline math::OnlineSoftmax row_softmax_state(const float* x, int V) {
    constexpr int kBlock = 256;
    math::OnlineSoftmax state;
    for (int i0 = 0; i0 < V; i0 += kBlock) {
        const int i1 = std::min(V, i0 + kBlock);
        float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
        for (int i = i0; i < i1; i++) bm = std::max(bm, x[i]);
        float bs = 0.0f;
        for (int i = i0; i < i1; i++) bs += std::exp(x[i] - bm);
        state = math::online_softmax_merge(state, math::OnlineSoftmax{bm, bs});
    }
    return state;
}

}  // namespace

// fused: loss and, when dloss != 0, the gradient in place; one row per work item.
void classifier_fused(float* losses, float* logits, const int* targets, int N, int V, int Vp,
                      float dloss) {
    check_targets(targets, N, V, "classifier_fused");
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float* x = logits + static_cast<long long>(n) * Vp;
        const int y = targets[n];
        const math::OnlineSoftmax st = row_softmax_state(x, V);
        losses[n] = std::log(st.sum) + st.max - x[y];
        if (dloss == 0.0f) continue;  // forward only: the logits stay as they are
        const float inv = 1.0f / st.sum;
        for (int i = 0; i < V; i++) x[i] = std::exp(x[i] - st.max) * inv * dloss;
        x[y] -= dloss;  // (p_y - 1) dloss, as p_y dloss - dloss
        std::fill(x + V, x + Vp, 0.0f);
    }
}

// unfused 1/3: probs = softmax(logits[:, :V]), padding zero.
void softmax_forward(float* probs, const float* logits, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = logits + static_cast<long long>(n) * Vp;
        float* p = probs + static_cast<long long>(n) * Vp;
        float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
        for (int i = 0; i < V; i++) maxv = std::max(maxv, x[i]);
        float sum = 0.0f;
        for (int i = 0; i < V; i++) {
            p[i] = std::exp(x[i] - maxv);
            sum += p[i];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < V; i++) p[i] *= inv;
        std::fill(p + V, p + Vp, 0.0f);
    }
}

// unfused 2/3: losses = -log probs[target]
void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int Vp) {
    check_targets(targets, N, Vp, "crossentropy_forward");
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        losses[n] = -std::log(probs[static_cast<long long>(n) * Vp + targets[n]]);
}

// unfused 3/3: dlogits = (probs - onehot) dloss, overwriting, padding zero.
void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, int N,
                                   int V, int Vp, float dloss) {
    check_targets(targets, N, V, "crossentropy_softmax_backward");
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* p = probs + static_cast<long long>(n) * Vp;
        float* d = dlogits + static_cast<long long>(n) * Vp;
#pragma omp simd
        for (int i = 0; i < V; i++) d[i] = p[i] * dloss;
        d[targets[n]] -= dloss;
        std::fill(d + V, d + Vp, 0.0f);
    }
}

}  // namespace mt::cpu

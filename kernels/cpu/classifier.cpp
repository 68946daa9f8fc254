// Classifier: softmax cross-entropy over the first V of Vp logit columns (Vp = V rounded up to
// a multiple of 128 so the LM-head GEMM has friendly shapes; columns V..Vp-1 are padding and
// take no part in the softmax).
//
// With p = softmax(x) over a row and y its target:  loss = -log p_y = log sum_i exp(x_i) - x_y,
// and d loss / d x_i = p_i - [i == y]. With the mean over N rows, dloss = 1/N scales every row.
//
// fused: one work item per row (rows parallel across threads), and no (N,Vp) probability
//   tensor. A row of the 50k vocabulary is 200 KiB: it comes from DRAM once and then stays in
//   L2 for the row's sweeps, each vectorised (fast_math.h, Eigen's pexp, one exp per logit):
//   the max; then, chunk by chunk of kChunk logits (16 KiB, in L1), x = exp(x - max) in place
//   and its sum; then the gradient dlogits = (exp(x - max)/sum - onehot) dloss, scaling the
//   stored exponentials in place; the padding is zeroed. With dloss == 0 (forward only) the
//   sum is taken without writing. Traffic: one DRAM read of the logits, one write of their
//   gradient.
// unfused: what a framework's three ops do: softmax writes probs (N,Vp), cross-entropy reads
//   them for the loss, the backward reads them again to write dlogits. Two extra (N,Vp) fp32
//   tensors of traffic, and the probs tensor itself in memory.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
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

constexpr int kChunk = 4096;  // logits per exp-and-sum chunk (16 KiB)

// sum_i exp(x_i - m) over the row; with `store`, x_i is replaced by exp(x_i - m). Chunk sums
// are added in chunk order (fixed for a given V).
inline float row_exp_sum(float* x, int V, float m, bool store) {
    float sum = 0.0f;
    for (int i0 = 0; i0 < V; i0 += kChunk) {
        const size_t n = static_cast<size_t>(std::min(V - i0, kChunk));
        sum +=
            store ? fast::exp_shift_sum_inplace(x + i0, n, m) : fast::exp_shift_sum(x + i0, n, m);
    }
    return sum;
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
        const float xy = x[y];
        const float m = fast::max_of(x, static_cast<size_t>(V));
        const bool grad = dloss != 0.0f;  // forward only: the logits stay as they are
        const float sum = row_exp_sum(x, V, m, grad);
        losses[n] = std::log(sum) + m - xy;
        if (!grad) continue;
        const float scale = dloss / sum;
        Eigen::Map<Eigen::ArrayXf>(x, V) *= scale;  // p dloss, the row still in L2
        x[y] -= dloss;                              // (p_y - 1) dloss, as p_y dloss - dloss
        std::fill(x + V, x + Vp, 0.0f);
    }
}

// unfused 1/3: probs = softmax(logits[:, :V]), padding zero.
void softmax_forward(float* probs, const float* logits, int N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float* x = logits + static_cast<long long>(n) * Vp;
        float* p = probs + static_cast<long long>(n) * Vp;
        const float maxv = fast::max_of(x, static_cast<size_t>(V));
        std::copy(x, x + V, p);
        const float sum = row_exp_sum(p, V, maxv, true);  // the same vectorised exp as fused
        const float inv = 1.0f / sum;
#pragma omp simd
        for (int i = 0; i < V; i++) p[i] *= inv;
        std::fill(p + V, p + Vp, 0.0f);
    }
}

// unfused 2/3: losses = -log probs[target]
void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int V,
                          int Vp) {
    check_targets(targets, N, V, "crossentropy_forward");
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

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

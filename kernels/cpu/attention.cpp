// Causal multi-head self-attention, forward and backward, two variants.
//
// qkv (B,T,3C) holds [Q | K | V] for every token; head h owns channels [h*hs, (h+1)*hs) of each
// part (hs = C/NH). For one (b, h) and query t:
//   s[t2] = q_t . k_t2 / sqrt(hs)           for t2 <= t (causal: t2 > t is masked, never computed)
//   p[t2] = exp(s[t2] - max) / sum exp(.)   (softmax over t2 <= t)
//   out_t = sum_t2 p[t2] v_t2
// Backward, with do_t = dout at t:
//   dp[t2] = do_t . v_t2,   dv_t2 += p[t2] do_t
//   ds[t2] = p[t2] (dp[t2] - D_t),   D_t = sum_t2 p[t2] dp[t2] = do_t . out_t
//   dq_t += ds[t2] k_t2 / sqrt(hs),   dk_t2 += ds[t2] q_t / sqrt(hs)
// D_t = do_t . out_t holds because out_t = sum p v: it needs no row of scratch, so both
// backward variants run in one pass over the keys.
//
// naive: the forward keeps the probabilities, att (B,NH,T,T) (zero above the diagonal): O(T^2)
//   memory per layer, read back by the backward.
// flash: the forward walks the keys in blocks with an online softmax (running max m and sum l,
//   rescaling the partial output when the max grows) and keeps only lse = m + log l (B,NH,T);
//   the backward recomputes p = exp(s - lse). O(T) memory, one extra q.k per pair in backward.
//
// Parallelism: forward rows (b,h,t) are independent; the triangle makes later rows costlier, so
// rows are dealt round-robin. In the backward, every query t of a head adds into the same dk/dv
// rows, so a thread owns a whole (b,h): race-free without atomics, and deterministic.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/ops.h"

namespace mt::cpu {
namespace {

inline float dot(const float* a, const float* b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// y += a x
inline void axpy(float* y, float a, const float* x, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

// Addresses of one head's slices. qkv row stride 3C, out/dout row stride C.
struct Head {
    const float* q;  // row t at q + t*C3
    const float* k;
    const float* v;
    long long C3;
    Head(const float* qkv, int b, int h, int T, int C, int hs)
        : q(qkv + static_cast<long long>(b) * T * 3 * C + static_cast<long long>(h) * hs),
          k(q + C),
          v(q + 2 * C),
          C3(3LL * C) {}
};

// Shared backward: for each query, one pass over its keys; prob(t, t2, s_fn) supplies p.
template <class ProbFn>
void attention_backward_head(float* dqkv, const float* dout, const float* qkv, const float* out,
                             int b, int h, int T, int C, int NH, ProbFn prob) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const Head x(qkv, b, h, T, C, hs);
    float* dq = dqkv + static_cast<long long>(b) * T * 3 * C + static_cast<long long>(h) * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const long long orow0 = static_cast<long long>(b) * T * C + static_cast<long long>(h) * hs;
    for (int t = 0; t < T; t++) {
        const float* q = x.q + t * x.C3;
        const float* dO = dout + orow0 + static_cast<long long>(t) * C;
        const float* o = out + orow0 + static_cast<long long>(t) * C;
        float* dqt = dq + t * x.C3;
        const float D = dot(dO, o, hs);
        for (int t2 = 0; t2 <= t; t2++) {
            const float* k = x.k + t2 * x.C3;
            const float* v = x.v + t2 * x.C3;
            const float p = prob(t, t2, q, k, scale);
            const float dp = dot(dO, v, hs);
            const float ds = p * (dp - D) * scale;  // d loss / d (q.k), softmax and scale folded
            axpy(dqt, ds, k, hs);
            axpy(dk + t2 * x.C3, ds, q, hs);
            axpy(dv + t2 * x.C3, p, dO, hs);
        }
    }
}

}  // namespace

// naive forward: full score row, softmax, then P V; the probabilities are kept in att.
void attention_forward_naive(float* out, float* att, const float* qkv, int B, int T, int C,
                             int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(3) schedule(static, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const Head x(qkv, b, h, T, C, hs);
                const float* q = x.q + t * x.C3;
                float* row = att + ((static_cast<long long>(b) * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float s = dot(q, x.k + t2 * x.C3, hs) * scale;
                    row[t2] = s;
                    maxv = std::max(maxv, s);
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float e = std::exp(row[t2] - maxv);
                    row[t2] = e;
                    sum += e;
                }
                const float inv = 1.0f / sum;
                for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
                for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;  // the masked triangle
                float* o =
                    out + (static_cast<long long>(b) * T + t) * C + static_cast<long long>(h) * hs;
                std::fill(o, o + hs, 0.0f);
                for (int t2 = 0; t2 <= t; t2++) axpy(o, row[t2], x.v + t2 * x.C3, hs);
            }
        }
    }
}

// naive backward: p read from att.
void attention_backward_naive(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* att, int B, int T, int C, int NH) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* A = att + (static_cast<long long>(b) * NH + h) * T * T;
            attention_backward_head(dqkv, dout, qkv, out, b, h, T, C, NH,
                                    [A, T](int t, int t2, const float*, const float*, float) {
                                        return A[static_cast<long long>(t) * T + t2];
                                    });
        }
    }
}

// flash forward: keys in blocks of kBlock with an online softmax; the output row is the
// accumulator (rescaled by exp(m_old - m_new) when the running max grows); keeps lse only.
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C,
                             int NH) {
    constexpr int kBlock = 64;  // keys per block: the block's scores live on the stack
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(3) schedule(static, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const Head x(qkv, b, h, T, C, hs);
                const float* q = x.q + t * x.C3;
                float* o =
                    out + (static_cast<long long>(b) * T + t) * C + static_cast<long long>(h) * hs;
                std::fill(o, o + hs, 0.0f);
                float m = -INFINITY, l = 0.0f;
                float s[kBlock];
                for (int k0 = 0; k0 <= t; k0 += kBlock) {
                    const int nk = std::min(t + 1 - k0, kBlock);
                    float bm = -INFINITY;
                    for (int j = 0; j < nk; j++) {
                        s[j] = dot(q, x.k + (k0 + j) * x.C3, hs) * scale;
                        bm = std::max(bm, s[j]);
                    }
                    const float mnew = std::max(m, bm);
                    const float corr = std::exp(m - mnew);  // 0 on the first block (m = -inf)
                    l *= corr;
#pragma omp simd
                    for (int i = 0; i < hs; i++) o[i] *= corr;
                    for (int j = 0; j < nk; j++) {
                        const float p = std::exp(s[j] - mnew);
                        l += p;
                        axpy(o, p, x.v + (k0 + j) * x.C3, hs);
                    }
                    m = mnew;
                }
                const float inv = 1.0f / l;
#pragma omp simd
                for (int i = 0; i < hs; i++) o[i] *= inv;
                lse[(static_cast<long long>(b) * NH + h) * T + t] = m + std::log(l);
            }
        }
    }
}

// flash backward: p = exp(q.k scale - lse) recomputed for every pair.
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float* L = lse + (static_cast<long long>(b) * NH + h) * T;
            const int hs = C / NH;
            attention_backward_head(
                dqkv, dout, qkv, out, b, h, T, C, NH,
                [L, hs](int t, int, const float* q, const float* k, float scale) {
                    return std::exp(dot(q, k, hs) * scale - L[t]);
                });
        }
    }
}

}  // namespace mt::cpu

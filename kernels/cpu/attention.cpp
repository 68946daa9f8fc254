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
//   memory per layer, read back by the backward. Both directions run as GEMMs per (b,h) over
//   blocks of queries (Eigen, single-threaded inside the parallel loop; Q, K, V, dQ, dK, dV are
//   strided views into qkv/dqkv, row stride 3C, no copies), and the causal structure is used by
//   block: a query block [t0, t0+nq) only meets keys [0, t0+nq), so the key blocks above the
//   diagonal are never computed. Forward per query block:
//     S = Q K^T scale (written into att's rows)  ->  row softmax in place over t2 <= t
//     (vectorised exp; the rest of the row zeroed)  ->  O = P V.
//   Backward per query block and key chunk, with a (32 x 512) dS tile on the stack:
//     dP = dO V^T,  dS = P (dP - D) scale,  dQ += dS K,  dK += dS^T Q,  dV += P^T dO
//   (P is zero above the diagonal, so those dS entries vanish and need no mask).
// flash: the forward walks the keys in blocks with an online softmax (running max m and sum l,
//   rescaling the partial output when the max grows) and keeps only lse = m + log l (B,NH,T);
//   the backward recomputes p = exp(s - lse). O(T) memory, one extra Q K^T GEMM in backward.
//   The same blocked GEMM structure as naive, with the score tiles on the stack.
//
// Parallelism: naive forward and backward deal whole heads (b,h) to threads; flash forward rows
// (b,h,t) are independent and, as the triangle makes later rows costlier, dealt round-robin. In the
// backward, every query t of a head adds into the same dk/dv rows, so a thread owns a whole (b,h):
// race-free without atomics, and deterministic.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/eigen_core.h"
#include "kernels/cpu/fast_math.h"
#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using Strided = Eigen::Map<RowMat, 0, Stride>;  // rows of a wider row-major buffer
using CStrided = Eigen::Map<const RowMat, 0, Stride>;

inline float dot(const float* a, const float* b, int n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
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

}  // namespace

// naive forward: per head, query blocks of kQ; S = Q K^T scale into att, softmax, O = P V.
void attention_forward_naive(float* out, float* att, const float* qkv, int B, int T, int C,
                             int NH) {
    constexpr int kQ = 64;  // queries per block
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long C3 = 3LL * C;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const Head x(qkv, b, h, T, C, hs);
            float* A = att + (static_cast<long long>(b) * NH + h) * T * T;
            float* o = out + static_cast<long long>(b) * T * C + static_cast<long long>(h) * hs;
            for (int t0 = 0; t0 < T; t0 += kQ) {
                const int nq = std::min(kQ, T - t0), nk = t0 + nq;  // keys this block can see
                CStrided Q(x.q + t0 * C3, nq, hs, Stride(C3));
                CStrided K(x.k, nk, hs, Stride(C3));
                CStrided V(x.v, nk, hs, Stride(C3));
                Strided S(A + static_cast<long long>(t0) * T, nq, nk, Stride(T));
                S.noalias() = (Q * scale) * K.transpose();  // (nq,hs)(hs,nk)
                for (int i = 0; i < nq; i++) {
                    const int t = t0 + i;
                    float* row = A + static_cast<long long>(t) * T;
                    const float m = fast::max_of(row, static_cast<size_t>(t + 1));
                    const float sum =
                        fast::exp_shift_sum_inplace(row, static_cast<size_t>(t + 1), m);
                    const float inv = 1.0f / sum;
#pragma omp simd
                    for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
                    std::fill(row + t + 1, row + T, 0.0f);  // the masked triangle
                }
                Strided O(o + static_cast<long long>(t0) * C, nq, hs, Stride(C));
                O.noalias() = S * V;  // (nq,nk)(nk,hs); S now holds P
            }
        }
    }
}

// naive backward: per head, query blocks of kQ x key chunks of kK through a dS tile.
void attention_backward_naive(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* att, int B, int T, int C, int NH) {
    constexpr int kQ = 32, kK = 512;  // the dS tile: 64 KiB on the stack
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long C3 = 3LL * C;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const Head x(qkv, b, h, T, C, hs);
            const float* A = att + (static_cast<long long>(b) * NH + h) * T * T;
            float* dq = dqkv + static_cast<long long>(b) * T * C3 + static_cast<long long>(h) * hs;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const long long orow0 =
                static_cast<long long>(b) * T * C + static_cast<long long>(h) * hs;
            for (int t0 = 0; t0 < T; t0 += kQ) {
                const int nq = std::min(kQ, T - t0), tend = t0 + nq;
                float D[kQ];  // D_t = do_t . out_t
                for (int i = 0; i < nq; i++) {
                    const long long r = orow0 + static_cast<long long>(t0 + i) * C;
                    D[i] = dot(dout + r, out + r, hs);
                }
                const Eigen::Map<const Eigen::ArrayXf> Dv(D, nq);
                CStrided Q(x.q + t0 * C3, nq, hs, Stride(C3));
                CStrided dO(dout + orow0 + static_cast<long long>(t0) * C, nq, hs, Stride(C));
                Strided dQ(dq + t0 * C3, nq, hs, Stride(C3));
                for (int k0 = 0; k0 < tend; k0 += kK) {
                    const int nk = std::min(kK, tend - k0);
                    CStrided K(x.k + k0 * C3, nk, hs, Stride(C3));
                    CStrided V(x.v + k0 * C3, nk, hs, Stride(C3));
                    Strided dK(dk + k0 * C3, nk, hs, Stride(C3));
                    Strided dV(dv + k0 * C3, nk, hs, Stride(C3));
                    CStrided P(A + static_cast<long long>(t0) * T + k0, nq, nk, Stride(T));
                    alignas(64) float tile[kQ * kK];
                    Eigen::Map<RowMat> dS(tile, nq, nk);
                    dS.noalias() = dO * V.transpose();  // dP (nq,nk)
                    dS.array() = P.array() * (dS.array().colwise() - Dv) * scale;
                    dQ.noalias() += dS * K;              // (nq,nk)(nk,hs)
                    dK.noalias() += dS.transpose() * Q;  // (nk,nq)(nq,hs)
                    dV.noalias() += P.transpose() * dO;  // (nk,nq)(nq,hs)
                }
            }
        }
    }
}

// flash forward: per head, query blocks of kQ x key blocks of kQ; the block's scores live in a
// (kQ x kQ) tile on the stack; online softmax per query row (running max m and sum l, the
// output rows rescaled by exp(m_old - m_new) when the max grows), O += P V per key block.
// Keeps lse = m + log l only.
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C,
                             int NH) {
    constexpr int kQ = 64;  // queries per block = keys per block
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long C3 = 3LL * C;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const Head x(qkv, b, h, T, C, hs);
            float* o = out + static_cast<long long>(b) * T * C + static_cast<long long>(h) * hs;
            float* L = lse + (static_cast<long long>(b) * NH + h) * T;
            for (int t0 = 0; t0 < T; t0 += kQ) {
                const int nq = std::min(kQ, T - t0);
                CStrided Q(x.q + t0 * C3, nq, hs, Stride(C3));
                Strided O(o + static_cast<long long>(t0) * C, nq, hs, Stride(C));
                O.setZero();
                float m[kQ], l[kQ];
                std::fill(m, m + nq, -INFINITY);
                std::fill(l, l + nq, 0.0f);
                for (int k0 = 0; k0 < t0 + nq; k0 += kQ) {
                    const int nk = std::min(kQ, t0 + nq - k0);
                    CStrided K(x.k + k0 * C3, nk, hs, Stride(C3));
                    CStrided V(x.v + k0 * C3, nk, hs, Stride(C3));
                    alignas(64) float tile[kQ * kQ];
                    Eigen::Map<RowMat> S(tile, nq, nk);
                    S.noalias() = (Q * scale) * K.transpose();
                    for (int i = 0; i < nq; i++) {
                        const int nvalid = std::min(nk, t0 + i - k0 + 1);  // keys t2 <= t
                        float* srow = tile + i * nk;
                        if (nvalid <= 0) {  // the whole block lies above the diagonal for row i
                            std::fill(srow, srow + nk, 0.0f);
                            continue;
                        }
                        const float bm = fast::max_of(srow, static_cast<size_t>(nvalid));
                        const float mnew = std::max(m[i], bm);
                        const float corr = std::exp(m[i] - mnew);  // 0 on the first block
                        l[i] = l[i] * corr +
                               fast::exp_shift_sum_inplace(srow, static_cast<size_t>(nvalid), mnew);
                        std::fill(srow + nvalid, srow + nk, 0.0f);
                        O.row(i) *= corr;
                        m[i] = mnew;
                    }
                    O.noalias() += S * V;  // (nq,nk)(nk,hs), S holding exp(s - m)
                }
                for (int i = 0; i < nq; i++) {
                    O.row(i) *= 1.0f / l[i];
                    L[t0 + i] = m[i] + std::log(l[i]);
                }
            }
        }
    }
}

// flash backward: as the naive backward, with the P tile recomputed as exp(Q K^T scale - lse)
// (zero above the diagonal) instead of read from att. Two (32 x 256) tiles on the stack.
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
    constexpr int kQ = 32, kK = 256;
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long C3 = 3LL * C;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const Head x(qkv, b, h, T, C, hs);
            const float* L = lse + (static_cast<long long>(b) * NH + h) * T;
            float* dq = dqkv + static_cast<long long>(b) * T * C3 + static_cast<long long>(h) * hs;
            float* dk = dq + C;
            float* dv = dq + 2 * C;
            const long long orow0 =
                static_cast<long long>(b) * T * C + static_cast<long long>(h) * hs;
            for (int t0 = 0; t0 < T; t0 += kQ) {
                const int nq = std::min(kQ, T - t0), tend = t0 + nq;
                float D[kQ];
                for (int i = 0; i < nq; i++) {
                    const long long r = orow0 + static_cast<long long>(t0 + i) * C;
                    D[i] = dot(dout + r, out + r, hs);
                }
                const Eigen::Map<const Eigen::ArrayXf> Dv(D, nq);
                CStrided Q(x.q + t0 * C3, nq, hs, Stride(C3));
                CStrided dO(dout + orow0 + static_cast<long long>(t0) * C, nq, hs, Stride(C));
                Strided dQ(dq + t0 * C3, nq, hs, Stride(C3));
                for (int k0 = 0; k0 < tend; k0 += kK) {
                    const int nk = std::min(kK, tend - k0);
                    CStrided K(x.k + k0 * C3, nk, hs, Stride(C3));
                    CStrided V(x.v + k0 * C3, nk, hs, Stride(C3));
                    Strided dK(dk + k0 * C3, nk, hs, Stride(C3));
                    Strided dV(dv + k0 * C3, nk, hs, Stride(C3));
                    alignas(64) float ptile[kQ * kK], dtile[kQ * kK];
                    Eigen::Map<RowMat> P(ptile, nq, nk), dS(dtile, nq, nk);
                    P.noalias() = (Q * scale) * K.transpose();
                    for (int i = 0; i < nq; i++) {
                        const int nvalid = std::clamp(t0 + i - k0 + 1, 0, nk);
                        float* prow = ptile + i * nk;
                        fast::exp_shift_inplace(prow, static_cast<size_t>(nvalid), L[t0 + i]);
                        std::fill(prow + nvalid, prow + nk, 0.0f);
                    }
                    dS.noalias() = dO * V.transpose();  // dP
                    dS.array() = P.array() * (dS.array().colwise() - Dv) * scale;
                    dQ.noalias() += dS * K;
                    dK.noalias() += dS.transpose() * Q;
                    dV.noalias() += P.transpose() * dO;
                }
            }
        }
    }
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

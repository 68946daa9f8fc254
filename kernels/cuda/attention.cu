// Causal multi-head attention, two implementations.
// Layout: qkv (B,T,3C) = [Q | K | V], head h of Q at columns h*hs .. h*hs+hs-1 (hs = C/NH);
// out (B,T,C) has head h at columns h*hs. scale = 1/sqrt(hs).
//
// naive: the textbook sequence, every intermediate in memory. Scores S = scale Q K^T and
//   probabilities P (B,NH,T,T) are materialised (P is what the backward keeps: 4 B T^2 NH
//   bytes per layer), QK^T and PV are cuBLAS strided-batched GEMMs reading Q/K/V straight out
//   of the (B,T,3C) layout (leading dimension 3C, batch stride hs over heads, one call per
//   batch row), and a causal softmax kernel runs in between.
// flash: our own fused tiled kernels with the online softmax (kernels/math.h): each block
//   streams key/value tiles through shared memory and keeps running (max, sum, output) per
//   query row, so the T x T matrix never exists. The forward saves only the logsumexp (B,NH,T);
//   the backward recomputes P tile by tile from it.
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <set>

#include "kernels/cuda/matmul.cuh"

namespace mt::cuda {

namespace {

constexpr int kSoftmaxRowsPerBlock = 8;

void gemm_sb(BlasContext& ctx, bool ta, bool tb, int m, int n, int k, float alpha, const void* A,
             cudaDataType_t tA, int lda, long long sA, const void* B, cudaDataType_t tB, int ldb,
             long long sB, float beta, void* Cm, cudaDataType_t tC, int ldc, long long sC,
             int batch) {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx.blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, tA,
                                            lda, sA, B, tB, ldb, sB, &beta, Cm, tC, ldc, sC, batch,
                                            ctx.compute_type(), CUBLAS_GEMM_DEFAULT));
}

inline const char* bytes_at(const void* p, size_t elems, size_t e) {
    return static_cast<const char*>(p) + elems * e;
}
inline char* bytes_at(void* p, size_t elems, size_t e) {
    return static_cast<char*>(p) + elems * e;
}

}  // namespace

// ================================ naive ======================================================

// Causal softmax over rows of already-scaled scores, in place: p[j] = exp(s[j]-max)/sum for
// j <= i, 0 above the diagonal. One warp per row (row r of a (rows, T) block, query i = r % T).
// Optionally also writes a bf16 copy (the PV GEMM under bf16 needs both operands in bf16).
__global__ void causal_softmax_kernel(float* att, bf16* att_bf16, int rows, int T) {
    const int lane = threadIdx.x % 32;
    const int r = blockIdx.x * kSoftmaxRowsPerBlock + threadIdx.x / 32;
    if (r >= rows) return;
    const int i = r % T;
    float* row = att + size_t(r) * T;
    float mx = -INFINITY;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, row[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) sum += expf(row[j] - mx);
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) {
        const float p = j <= i ? expf(row[j] - mx) * inv : 0.0f;
        row[j] = p;
        if (att_bf16) att_bf16[size_t(r) * T + j] = __float2bfloat16_rn(p);
    }
}

// Softmax backward fused with the score scale, in place on dP:
//   dS[j] = scale * P[j] * (dP[j] - sum_k P[k] dP[k])   (0 above the diagonal).
__global__ void causal_softmax_backward_kernel(float* dp, bf16* ds_bf16, const float* P, int rows,
                                               int T, float scale) {
    const int lane = threadIdx.x % 32;
    const int r = blockIdx.x * kSoftmaxRowsPerBlock + threadIdx.x / 32;
    if (r >= rows) return;
    const int i = r % T;
    float* d = dp + size_t(r) * T;
    const float* p = P + size_t(r) * T;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) {
        const float ds = j <= i ? scale * p[j] * (d[j] - dot) : 0.0f;
        d[j] = ds;
        if (ds_bf16) ds_bf16[size_t(r) * T + j] = __float2bfloat16_rn(ds);
    }
}

size_t naive_attention_workspace_bytes(DType dt, int /*B*/, int T, int /*C*/, int NH) {
    // Per batch row (the GEMMs loop over b): dP / dS (NH,T,T) fp32, plus under bf16 a bf16
    // copy of P or dS (NH,T,T) for the bf16 GEMMs.
    const size_t tt = size_t(NH) * T * T;
    size_t bytes = tt * sizeof(float);
    if (dt == DType::bf16) bytes += (tt * sizeof(bf16) + 255) / 256 * 256;
    return bytes;
}

void naive_attention_forward(BlasContext& ctx, DType dt, void* out, float* probs, const void* qkv,
                             int B, int T, int C, int NH, void* workspace, cudaStream_t s) {
    const int hs = C / NH;
    const size_t e = dt == DType::bf16 ? 2 : 4;
    const cudaDataType_t t = ctx.act_type();
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const size_t tt = size_t(NH) * T * T;
    bf16* p16 = dt == DType::bf16
                    ? reinterpret_cast<bf16*>(static_cast<char*>(workspace) + tt * sizeof(float))
                    : nullptr;
    const int rows = NH * T;
    for (int b = 0; b < B; ++b) {
        const void* q = bytes_at(qkv, size_t(b) * T * 3 * C, e);
        const void* k = bytes_at(q, C, e);
        const void* v = bytes_at(q, 2 * size_t(C), e);
        float* pb = probs + size_t(b) * tt;
        // S^T (T x T col-major) = K Q^T, i.e. row-major S[i][j] = scale q_i . k_j
        gemm_sb(ctx, true, false, T, T, hs, scale, k, t, 3 * C, hs, q, t, 3 * C, hs, 0.0f, pb,
                CUDA_R_32F, T, (long long)T * T, NH);
        causal_softmax_kernel<<<ceil_div(rows, kSoftmaxRowsPerBlock), 32 * kSoftmaxRowsPerBlock, 0,
                                s>>>(pb, p16, rows, T);
        CUDA_CHECK_LAUNCH("causal_softmax_kernel");
        // Y^T (hs x T) = V^T P^T, written straight into out's (B,T,C) layout (ldc = C).
        const void* pmat = p16 ? static_cast<const void*>(p16) : pb;
        gemm_sb(ctx, false, false, hs, T, T, 1.0f, v, t, 3 * C, hs, pmat,
                p16 ? CUDA_R_16BF : CUDA_R_32F, T, (long long)T * T, 0.0f,
                bytes_at(out, size_t(b) * T * C, e), t, C, hs, NH);
    }
}

void naive_attention_backward(BlasContext& ctx, DType dt, void* dqkv, const void* dout,
                              const void* qkv, const float* probs, int B, int T, int C, int NH,
                              void* workspace, cudaStream_t s) {
    const int hs = C / NH;
    const size_t e = dt == DType::bf16 ? 2 : 4;
    const cudaDataType_t t = ctx.act_type();
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const size_t tt = size_t(NH) * T * T;
    float* dp = static_cast<float*>(workspace);
    bf16* x16 = dt == DType::bf16
                    ? reinterpret_cast<bf16*>(static_cast<char*>(workspace) + tt * sizeof(float))
                    : nullptr;
    const cudaDataType_t tx = x16 ? CUDA_R_16BF : CUDA_R_32F;
    const int rows = NH * T;
    for (int b = 0; b < B; ++b) {
        const void* q = bytes_at(qkv, size_t(b) * T * 3 * C, e);
        const void* k = bytes_at(q, C, e);
        const void* v = bytes_at(q, 2 * size_t(C), e);
        void* dq = bytes_at(dqkv, size_t(b) * T * 3 * C, e);
        void* dk = bytes_at(dq, C, e);
        void* dv = bytes_at(dq, 2 * size_t(C), e);
        const void* dO = bytes_at(dout, size_t(b) * T * C, e);
        const float* pb = probs + size_t(b) * tt;
        const void* pmat = pb;
        if (x16) {
            cast_fp32_to_bf16(x16, pb, tt, s);
            pmat = x16;
        }
        // dV^T (hs x T) += dO^T P          (dV[j] += sum_i P[i][j] dO[i])
        gemm_sb(ctx, false, true, hs, T, T, 1.0f, dO, t, C, hs, pmat, tx, T, (long long)T * T, 1.0f,
                dv, t, 3 * C, hs, NH);
        // dP (row-major T x T) = dO V^T
        gemm_sb(ctx, true, false, T, T, hs, 1.0f, v, t, 3 * C, hs, dO, t, C, hs, 0.0f, dp,
                CUDA_R_32F, T, (long long)T * T, NH);
        causal_softmax_backward_kernel<<<ceil_div(rows, kSoftmaxRowsPerBlock),
                                         32 * kSoftmaxRowsPerBlock, 0, s>>>(dp, x16, pb, rows, T,
                                                                            scale);
        CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
        const void* dsmat = x16 ? static_cast<const void*>(x16) : dp;
        // dQ^T (hs x T) += K^T dS^T        (dQ[i] += sum_j dS[i][j] k_j)
        gemm_sb(ctx, false, false, hs, T, T, 1.0f, k, t, 3 * C, hs, dsmat, tx, T, (long long)T * T,
                1.0f, dq, t, 3 * C, hs, NH);
        // dK^T (hs x T) += Q^T dS          (dK[j] += sum_i dS[i][j] q_i)
        gemm_sb(ctx, false, true, hs, T, T, 1.0f, q, t, 3 * C, hs, dsmat, tx, T, (long long)T * T,
                1.0f, dk, t, 3 * C, hs, NH);
    }
}

// ================================ flash ======================================================

namespace {
constexpr int kFwdRowsPerWarp = 4;
constexpr int kFwdWarps = 4;
constexpr int kFwdBr = kFwdRowsPerWarp * kFwdWarps;  // 16 query rows per block
constexpr int kBc = 32;                              // keys per tile (= warp width)
constexpr int kBwdTile = 32;                         // query and key tile of the backward
constexpr int kDPerLane = kFlashMaxHeadSize / 32;    // output columns per lane (forward)

size_t fwd_smem_bytes(int hs) {
    return sizeof(float) * (size_t(kFwdBr) * hs + size_t(kBc) * (hs + 1) + size_t(kBc) * hs);
}
size_t dkdv_smem_bytes(int hs) {
    return sizeof(float) * (4 * size_t(kBwdTile) * (hs + 1) + 2 * kBwdTile * (kBwdTile + 1) +
                            2 * size_t(kBwdTile) * hs + 2 * kBwdTile);
}
size_t dq_smem_bytes(int hs) {
    return sizeof(float) * (4 * size_t(kBwdTile) * (hs + 1) + kBwdTile * (kBwdTile + 1) +
                            size_t(kBwdTile) * hs + 2 * kBwdTile);
}

template <class K>
void set_smem(K kernel, size_t bytes, const char* name, const char* fallback) {
    if (bytes <= 48 * 1024) return;
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > static_cast<size_t>(optin))
        throw BackendError(std::string("flash attention: ") + name + " needs " +
                           std::to_string(bytes) + " bytes of shared memory, the device allows " +
                           std::to_string(optin) + "; use kernels.attention: " + fallback);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
}
}  // namespace

// Flash forward: block = (16 query rows of one (b,h)), 4 warps x 4 rows. For each key tile of
// 32 keys in shared memory, lane j scores key j against the row (Q pre-scaled), the warp
// shuffles give the tile max and sum, the running state is rescaled by exp(m_old - m_new), and
// P.V accumulates with lane owning output columns lane, lane+32, ... (registers). Only
// out and lse = m + log(l) are written: O(T) memory instead of O(T^2).
template <class T>
__global__ void __launch_bounds__(128)
    flash_attention_forward_kernel(T* out, float* lse, const T* qkv, int T_, int C, int NH) {
    extern __shared__ float smem[];
    const int hs = C / NH;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kFwdBr;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* Qs = smem;                 // [kFwdBr][hs]
    float* Ks = Qs + kFwdBr * hs;     // [kBc][hs+1] (padded: lane j reads row j)
    float* Vs = Ks + kBc * (hs + 1);  // [kBc][hs]
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const size_t C3 = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;

    for (int idx = threadIdx.x; idx < kFwdBr * hs; idx += blockDim.x) {
        const int r = idx / hs, d = idx % hs, i = q0 + r;
        Qs[idx] = i < T_ ? to_float(base[size_t(i) * C3 + d]) * scale : 0.0f;
    }
    float m[kFwdRowsPerWarp], l[kFwdRowsPerWarp], acc[kFwdRowsPerWarp][kDPerLane];
#pragma unroll
    for (int r = 0; r < kFwdRowsPerWarp; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < kDPerLane; ++k) acc[r][k] = 0.0f;
    }
    const int q_last = min(q0 + kFwdBr, T_) - 1;  // last query row of this block
    for (int k0 = 0; k0 <= q_last; k0 += kBc) {   // block-uniform trip count
        __syncthreads();  // previous tile fully consumed (and Qs written, first time)
        for (int idx = threadIdx.x; idx < kBc * hs; idx += blockDim.x) {
            const int j = idx / hs, d = idx % hs, key = k0 + j;
            const bool ok = key < T_;
            Ks[j * (hs + 1) + d] = ok ? to_float(base[size_t(key) * C3 + C + d]) : 0.0f;
            Vs[j * hs + d] = ok ? to_float(base[size_t(key) * C3 + 2 * C + d]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kFwdRowsPerWarp; ++r) {
            const int row = warp * kFwdRowsPerWarp + r, i = q0 + row;
            if (i >= T_) continue;  // warp-uniform: every lane skips together
            const int key = k0 + lane;
            float sc = -INFINITY;
            if (key <= i) {
                float dot = 0.0f;
                for (int d = 0; d < hs; ++d) dot += Qs[row * hs + d] * Ks[lane * (hs + 1) + d];
                sc = dot;
            }
            // k0 <= q0 <= i, so key k0 is always visible: the tile max is finite.
            const float m_new = fmaxf(m[r], warp_max(sc));
            const float p = key <= i ? expf(sc - m_new) : 0.0f;
            const float alpha = expf(m[r] - m_new);  // exp(-inf) = 0 on the first tile
            l[r] = l[r] * alpha + warp_sum(p);
            m[r] = m_new;
#pragma unroll
            for (int k = 0; k < kDPerLane; ++k) acc[r][k] *= alpha;
            for (int j = 0; j < kBc; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
                for (int k = 0; k < kDPerLane; ++k) {
                    const int d = lane + 32 * k;
                    if (d < hs) acc[r][k] += pj * Vs[j * hs + d];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kFwdRowsPerWarp; ++r) {
        const int i = q0 + warp * kFwdRowsPerWarp + r;
        if (i >= T_) continue;
        const float inv = 1.0f / l[r];
        T* o = out + (size_t(b) * T_ + i) * C + size_t(h) * hs;
#pragma unroll
        for (int k = 0; k < kDPerLane; ++k) {
            const int d = lane + 32 * k;
            if (d < hs) o[d] = from_float<T>(acc[r][k] * inv);
        }
        if (lane == 0) lse[(size_t(b) * NH + h) * T_ + i] = m[r] + logf(l[r]);
    }
}

// Flash backward, step 1: D[b,h,i] = sum_d dO[i,d] O[i,d] (= sum_j P_ij dP_ij), one warp per row.
template <class T>
__global__ void flash_backward_preprocess_kernel(float* Dout, const T* dout, const T* out, int B,
                                                 int T_, int C, int NH) {
    const int lane = threadIdx.x % 32;
    const size_t row = blockIdx.x * size_t(blockDim.x / 32) + threadIdx.x / 32;
    if (row >= size_t(B) * NH * T_) return;
    const int hs = C / NH;
    const int i = static_cast<int>(row % T_);
    const int h = static_cast<int>((row / T_) % NH);
    const int b = static_cast<int>(row / (size_t(T_) * NH));
    const size_t off = (size_t(b) * T_ + i) * C + size_t(h) * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32) acc += to_float(dout[off + d]) * to_float(out[off + d]);
    acc = warp_sum(acc);
    if (lane == 0) Dout[row] = acc;
}

namespace {
// Loads rows r0..r0+31 of a (T, ld) matrix slice (columns col..col+hs-1) into a padded
// [32][hs+1] fp32 tile, zero past T, multiplied by `mul`.
template <class T>
__device__ void load_tile(float* dst, const T* src, size_t ld, int r0, int T_, int hs, float mul) {
    for (int idx = threadIdx.x; idx < kBwdTile * hs; idx += blockDim.x) {
        const int r = idx / hs, d = idx % hs, g = r0 + r;
        dst[r * (hs + 1) + d] = g < T_ ? to_float(src[size_t(g) * ld + d]) * mul : 0.0f;
    }
}

// The shared core of both backward kernels: for the 32x32 tile of (query i0+qi, key j0+kj)
// pairs, P = exp(q.k - lse) (Q pre-scaled) and dS = P (dO.v - D), zero where masked (key >
// query or query >= T). Thread mapping: 1024 entries over 128 threads, 8 each; within a warp
// the lane indexes the `lane_is_query` side (conflict-free: padded rows), the other side is a
// broadcast. Stores P and dS at [a][b] = [key][query] when lane_is_query, else [query][key].
__device__ void tile_p_ds(float* Ps, float* dSs, const float* Qs, const float* dOs, const float* Ks,
                          const float* Vs, const float* lse_s, const float* D_s, int i0, int j0,
                          int T_, int hs, bool lane_is_query) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int rr = 0; rr < kBwdTile / 4; ++rr) {
        const int other = warp + 4 * rr;
        const int qi = lane_is_query ? lane : other;
        const int kj = lane_is_query ? other : lane;
        const int gi = i0 + qi, gj = j0 + kj;
        float p = 0.0f, ds = 0.0f;
        if (gi < T_ && gj <= gi) {
            float s = 0.0f, dp = 0.0f;
            const float* q = Qs + qi * (hs + 1);
            const float* o = dOs + qi * (hs + 1);
            const float* k = Ks + kj * (hs + 1);
            const float* v = Vs + kj * (hs + 1);
            for (int d = 0; d < hs; ++d) {
                s += q[d] * k[d];
                dp += o[d] * v[d];
            }
            p = expf(s - lse_s[qi]);
            ds = p * (dp - D_s[qi]);
        }
        const int a = lane_is_query ? kj : qi, bidx = lane_is_query ? qi : kj;
        if (Ps) Ps[a * (kBwdTile + 1) + bidx] = p;
        dSs[a * (kBwdTile + 1) + bidx] = ds;
    }
}
}  // namespace

// Flash backward, step 2: dK and dV. One block per 32-key tile of one (b,h) walks every query
// tile at or below the diagonal, recomputes P and dS for the 32x32 tile, and accumulates
//   dV_j += sum_i P_ij dO_i,   dK_j += sum_i dS_ij (scale q_i)
// in shared memory (each thread owns fixed (j,d) entries: no races, no atomics). Deterministic.
template <class T>
__global__ void __launch_bounds__(128)
    flash_attention_backward_dkdv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                         const float* Dsum, int T_, int C, int NH) {
    extern __shared__ float smem[];
    const int hs = C / NH, hp = hs + 1;
    const int b = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * kBwdTile;
    float* Ks = smem;
    float* Vs = Ks + kBwdTile * hp;
    float* Qs = Vs + kBwdTile * hp;
    float* dOs = Qs + kBwdTile * hp;
    float* Ps = dOs + kBwdTile * hp;  // [key][query], padded 33
    float* dSs = Ps + kBwdTile * (kBwdTile + 1);
    float* dKacc = dSs + kBwdTile * (kBwdTile + 1);  // [32][hs]
    float* dVacc = dKacc + kBwdTile * hs;
    float* lse_s = dVacc + kBwdTile * hs;
    float* D_s = lse_s + kBwdTile;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const size_t C3 = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    const T* dObase = dout + size_t(b) * T_ * C + size_t(h) * hs;
    const size_t stat = (size_t(b) * NH + h) * T_;

    load_tile(Ks, base + C, C3, j0, T_, hs, 1.0f);
    load_tile(Vs, base + 2 * C, C3, j0, T_, hs, 1.0f);
    for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) dKacc[e] = dVacc[e] = 0.0f;
    for (int i0 = j0; i0 < T_; i0 += kBwdTile) {  // block-uniform
        __syncthreads();                          // previous tile's Qs/dOs/Ps/dSs fully consumed
        load_tile(Qs, base, C3, i0, T_, hs, scale);
        load_tile(dOs, dObase, C, i0, T_, hs, 1.0f);
        if (threadIdx.x < kBwdTile) {
            const int g = i0 + threadIdx.x;
            lse_s[threadIdx.x] = g < T_ ? lse[stat + g] : 0.0f;
            D_s[threadIdx.x] = g < T_ ? Dsum[stat + g] : 0.0f;
        }
        __syncthreads();
        tile_p_ds(Ps, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, T_, hs, true);
        __syncthreads();
        for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) {
            const int j = e / hs, d = e % hs;
            float sv = 0.0f, sk = 0.0f;
            for (int i = 0; i < kBwdTile; ++i) {
                sv += Ps[j * (kBwdTile + 1) + i] * dOs[i * hp + d];
                sk += dSs[j * (kBwdTile + 1) + i] * Qs[i * hp + d];
            }
            dVacc[e] += sv;
            dKacc[e] += sk;
        }
    }
    // Each thread writes back exactly the entries it accumulated: no barrier needed.
    T* dbase = dqkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) {
        const int j = e / hs, d = e % hs, g = j0 + j;
        if (g >= T_) continue;
        T* dk = dbase + size_t(g) * C3 + C + d;
        T* dv = dbase + size_t(g) * C3 + 2 * C + d;
        *dk = from_float<T>(to_float(*dk) + dKacc[e]);
        *dv = from_float<T>(to_float(*dv) + dVacc[e]);
    }
}

// Flash backward, step 3: dQ. One block per 32-query tile walks the key tiles up to the
// diagonal, recomputes dS and accumulates dQ_i += scale sum_j dS_ij k_j (shared memory, owned
// entries). Recomputing instead of atomically adding dQ from the dK/dV kernel costs one more
// QK^T and dO V^T per tile but keeps the result deterministic and needs no fp32 dQ buffer.
template <class T>
__global__ void __launch_bounds__(128)
    flash_attention_backward_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse,
                                       const float* Dsum, int T_, int C, int NH) {
    extern __shared__ float smem[];
    const int hs = C / NH, hp = hs + 1;
    const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBwdTile;
    float* Qs = smem;
    float* dOs = Qs + kBwdTile * hp;
    float* Ks = dOs + kBwdTile * hp;
    float* Vs = Ks + kBwdTile * hp;
    float* dSs = Vs + kBwdTile * hp;                 // [query][key], padded 33
    float* dQacc = dSs + kBwdTile * (kBwdTile + 1);  // [32][hs]
    float* lse_s = dQacc + kBwdTile * hs;
    float* D_s = lse_s + kBwdTile;
    const float scale = 1.0f / sqrtf(static_cast<float>(hs));
    const size_t C3 = 3 * size_t(C);
    const T* base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    const T* dObase = dout + size_t(b) * T_ * C + size_t(h) * hs;
    const size_t stat = (size_t(b) * NH + h) * T_;

    load_tile(Qs, base, C3, i0, T_, hs, scale);
    load_tile(dOs, dObase, C, i0, T_, hs, 1.0f);
    if (threadIdx.x < kBwdTile) {
        const int g = i0 + threadIdx.x;
        lse_s[threadIdx.x] = g < T_ ? lse[stat + g] : 0.0f;
        D_s[threadIdx.x] = g < T_ ? Dsum[stat + g] : 0.0f;
    }
    for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) dQacc[e] = 0.0f;
    for (int j0 = 0; j0 <= i0; j0 += kBwdTile) {  // tiles are aligned: j0 <= i0 covers j <= i
        __syncthreads();
        load_tile(Ks, base + C, C3, j0, T_, hs, 1.0f);
        load_tile(Vs, base + 2 * C, C3, j0, T_, hs, 1.0f);
        __syncthreads();
        tile_p_ds(nullptr, dSs, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, T_, hs, false);
        __syncthreads();
        for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) {
            const int i = e / hs, d = e % hs;
            float acc = 0.0f;
            for (int j = 0; j < kBwdTile; ++j) acc += dSs[i * (kBwdTile + 1) + j] * Ks[j * hp + d];
            dQacc[e] += acc;
        }
    }
    T* dbase = dqkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    for (int e = threadIdx.x; e < kBwdTile * hs; e += blockDim.x) {
        const int i = e / hs, d = e % hs, g = i0 + i;
        if (g >= T_) continue;
        T* dq = dbase + size_t(g) * C3 + d;
        *dq = from_float<T>(to_float(*dq) + scale * dQacc[e]);
    }
}

size_t flash_attention_workspace_bytes(int B, int T, int /*C*/, int NH) {
    return size_t(B) * NH * T * sizeof(float);
}

static void check_flash_shape(int C, int NH) {
    const int hs = C / NH;
    if (hs > kFlashMaxHeadSize || hs % 2 != 0)
        throw BackendError(
            "flash attention supports even head sizes up to " + std::to_string(kFlashMaxHeadSize) +
            " (n_embd / n_head = " + std::to_string(hs) + "); use kernels.attention: naive");
}

void flash_attention_forward(DType dt, void* out, float* lse, const void* qkv, int B, int T, int C,
                             int NH, cudaStream_t s) {
    check_flash_shape(C, NH);
    const int hs = C / NH;
    const dim3 grid(ceil_div(T, kFwdBr), NH, B);
    const size_t smem = fwd_smem_bytes(hs);
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        set_smem(flash_attention_forward_kernel<E>, smem, "flash_attention_forward_kernel",
                 "naive");
        flash_attention_forward_kernel<E><<<grid, 32 * kFwdWarps, smem, s>>>(
            static_cast<E*>(out), lse, static_cast<const E*>(qkv), T, C, NH);
    });
    CUDA_CHECK_LAUNCH("flash_attention_forward_kernel");
}

void flash_attention_backward(DType dt, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int B, int T, int C, int NH,
                              void* workspace, cudaStream_t s) {
    check_flash_shape(C, NH);
    const int hs = C / NH;
    float* Dsum = static_cast<float*>(workspace);
    const size_t rows = size_t(B) * NH * T;
    const dim3 grid(ceil_div(T, kBwdTile), NH, B);
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        flash_backward_preprocess_kernel<E><<<ceil_div(rows, 8), 256, 0, s>>>(
            Dsum, static_cast<const E*>(dout), static_cast<const E*>(out), B, T, C, NH);
        CUDA_CHECK_LAUNCH("flash_backward_preprocess_kernel");
        const size_t s1 = dkdv_smem_bytes(hs), s2 = dq_smem_bytes(hs);
        set_smem(flash_attention_backward_dkdv_kernel<E>, s1, "flash_attention_backward_dkdv",
                 "naive");
        set_smem(flash_attention_backward_dq_kernel<E>, s2, "flash_attention_backward_dq", "naive");
        flash_attention_backward_dkdv_kernel<E>
            <<<grid, 128, s1, s>>>(static_cast<E*>(dqkv), static_cast<const E*>(dout),
                                   static_cast<const E*>(qkv), lse, Dsum, T, C, NH);
        CUDA_CHECK_LAUNCH("flash_attention_backward_dkdv_kernel");
        flash_attention_backward_dq_kernel<E>
            <<<grid, 128, s2, s>>>(static_cast<E*>(dqkv), static_cast<const E*>(dout),
                                   static_cast<const E*>(qkv), lse, Dsum, T, C, NH);
        CUDA_CHECK_LAUNCH("flash_attention_backward_dq_kernel");
    });
}

// ================================ flash_tc ===================================================
//
// The same algorithm as `flash` (online softmax forward, logsumexp saved, P recomputed in the
// backward), with every product on the tensor cores: warp-level
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32     D (16x8) += A (16x16) B (16x8)
// bf16 operands, fp32 accumulators. bf16 only; head sizes 64 and 128 (the kernels are templated
// on the head size HS so every loop over it unrolls and every fragment lives in registers).
//
// ---- The m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16") ----
// In a warp, lane = 4 g + t (g = lane/4 the "group", 0..7; t = lane%4, 0..3). Each 32-bit
// register holds two bf16, the lower-indexed element in the low half.
//   A (16x16, row-major "row"): 4 registers   a0 = A[g  ][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                                             a2 = A[g  ][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B (16x8, "col"):            2 registers   b0 = B[2t..2t+1][g]      b1 = B[2t+8..2t+9][g]
//   C/D (16x8, fp32):           4 floats      c0,c1 = C[g][2t..2t+1]   c2,c3 = C[g+8][2t..2t+1]
// So a thread holds two rows (g and g+8) of every 16-row accumulator, and the four lanes of a
// quad (same g) together hold a whole row: row reductions are two __shfl_xor (1 and 2).
// The C layout of two adjacent 16x8 tiles (columns 0..7 and 8..15) is exactly the A layout of
// one 16x16 tile: the scores S = Q K^T, once exponentiated and rounded to bf16, are the A
// operand of P V without touching shared memory (c0c1 of tile 2k -> a0, c2c3 -> a1, c0c1 of
// tile 2k+1 -> a2, c2c3 -> a3).
//
// ldmatrix.x4 loads four 8x8 bf16 matrices from shared memory; lane l gives the address of row
// l%8 of matrix l/8 and receives, of each matrix, row l/4, columns 2(l%4)..+1 (with .trans: the
// transposed matrix, i.e. rows 2(l%4)..+1 of column l/4). Two address patterns serve all our
// operands (frag_rows / frag_nk below):
//   - A from a row-major [m][k] tile, and B from a row-major [k][n] tile with .trans (V, dO,
//     Q, K when they are the right-hand factor of P V, P^T dO, dS^T Q, dS K);
//   - B from a row-major [n][k] tile without .trans (K in Q K^T, Q in K Q^T, dO in V dO^T, V in
//     dO V^T): B = X^T with X stored row-major is exactly the "col" layout.
// Shared-memory rows are HS + 8 bf16 long (16 bytes of padding): the 8 row addresses of one
// 8x8 matrix then fall 4 banks apart and cover all 32 banks, so ldmatrix is conflict-free.
//
// ---- Forward: one block = 64 query rows of one (b, h); 4 warps, warp w owns rows 16w..16w+15 --
//   shared memory: Q tile [64][HS+8], K tile [64][HS+8], V tile [64][HS+8] (bf16)
//                  = 27 KB for HS 64, 51 KB for HS 128 (opted in above 48 KB, once per device)
//   registers:     S / P for the warp's 16 x 64 scores: 8 C fragments = 32 floats per thread;
//                  O accumulator 16 x HS: HS/8 C fragments = HS/2 floats per thread;
//                  m (running max) and l (running sum) for the thread's two rows.
// For each key tile of 64 (cp.async copies K, then V, so V lands while Q K^T runs):
//   S = Q K^T                    (HS/16 x 8 MMAs per warp)
//   m_new = max(m, rowmax(S))    scaled into the log2 domain: exp(x) = exp2(x log2 e)
//   P = exp2(S - m_new), l = l exp2(m - m_new) + rowsum(P), O = O exp2(m - m_new)
//   O += bf16(P) V               (4 x HS/8 MMAs per warp)
// and at the end out = O / l, lse = (m + log2 l) ln 2 (natural log, as flash saves it).
// Causality: key tile k0 is needed only while k0 <= the block's last query, and with square
// 64 x 64 tiles every tile left of the diagonal is fully visible: only the diagonal tile is
// masked (key > query -> -inf), and in it warp w skips the 16-key groups entirely above its rows.
// About half of the T x T square is never loaded or multiplied. The last query/key tile past T
// is zero-filled by cp.async (src-size 0: no out-of-bounds reads); padded rows are never stored,
// and padded keys are above the diagonal of every real query, so the mask removes them.
// Traffic per key tile: K and V, 2 x 64 x HS bf16 (16 / 32 KB) from L2/HBM, for 2 x 64 x 64 x HS
// multiply-adds per block: 64 FLOP per byte, compute bound on the tensor cores.
//
// ---- Backward: P is recomputed, never stored ----
// Storing P would cost B NH T^2 values per layer (the naive variant's memory); recomputing it
// from Q, K and the saved logsumexp, P = exp(scale q.k - lse), costs one extra Q K^T per tile
// on the tensor cores. D_i = rowsum(dO_i * O_i) (= sum_j P_ij dP_ij) comes first (workspace),
// then two kernels, each owning its outputs so nothing is added atomically (deterministic):
//   dkdv: one block per 64 keys (warp w owns keys 16w..+15), walks the query tiles from the
//         diagonal down, in fixed order; per tile (transposed so the keys are the MMA rows):
//           S^T = K Q^T, P^T = exp2(S^T scale log2e - lse_i log2e), dP^T = V dO^T,
//           dV += P^T dO, dS^T = P^T (dP^T - D_i), dK += dS^T Q
//         registers: dK and dV accumulators (2 x HS/2 floats), S^T/P^T and dP^T fragments.
//   dq:   one block per 64 queries (warp w owns queries 16w..+15), walks the key tiles up to
//         the diagonal: S = Q K^T, P, dP = dO V^T, dS = P (dP - D), dQ += dS K.
//   and the scale goes on at the end: dK = scale dS^T Q, dQ = scale dS K.
// The inner tile (queries per step in dkdv, keys per step in dq) is 64 for HS 64 and 32 for
// HS 128, which keeps the fp32 accumulators plus the score fragments in registers (no spills).
// Shared memory: dkdv K, V [64][HS+8] + Q, dO [inner][HS+8] + lse, D; dq the mirror image.
// Traffic per inner tile: dkdv loads Q and dO (2 x inner x HS bf16) for four 64 x inner x HS
// products (S^T, dP^T, dV, dK): 128 FLOP per byte; dq loads K and V for three (S, dP, dQ): 96.
// Like flash, the results are added into dqkv (the op's +=), read and written once per element.
// The forward is __launch_bounds__(128, 1): without the minimum of 1 block, sm_80's ptxas
// trimmed the HS 64 forward to 96 registers and spilled. The backward kernels keep ptxas's own
// choice (asking for 1 block there raised the dq kernel from 128 to ~200 registers: half the
// blocks per SM, for nothing).
namespace {
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcTile = 16 * kTcWarps;  // 64: the rows a block owns (queries or keys)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int HS>
struct TcShape {
    static_assert(HS == 64 || HS == 128, "flash_tc: head size 64 or 128");
    static constexpr int kStride = HS + 8;              // bf16 per shared-memory row
    static constexpr int kInner = HS == 128 ? 32 : 64;  // backward inner tile
    static constexpr size_t kTileBytes = size_t(kTcTile) * kStride * sizeof(bf16);
    static constexpr size_t kInnerBytes = size_t(kInner) * kStride * sizeof(bf16);
    static constexpr size_t kForwardSmem = 3 * kTileBytes;  // Q, K, V
    static constexpr size_t kBackwardSmem =
        2 * kTileBytes + 2 * kInnerBytes + 2 * kInner * sizeof(float);  // + lse, D
};

[[maybe_unused]] __device__ __forceinline__ uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Every instruction below needs sm_80+ (bf16 mma.sync and cp.async; ldmatrix sm_75): compiled
// for an older architecture (CMAKE_CUDA_ARCHITECTURES 70 or 75) they become a trap, so the rest
// of the CUDA backend still builds there, and the launcher refuses such a device before any runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MT_TC_ASM(...) asm volatile(__VA_ARGS__)
#else
#define MT_TC_ASM(...) __trap()
#endif
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
    MT_TC_ASM("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
              : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
              : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
    MT_TC_ASM("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
              : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
              : "r"(smem_u32(p)));
}
// d += A B, one m16n8k16 tensor-core MMA (bf16 in, fp32 accumulate).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
    MT_TC_ASM(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}
// The A operand of a 16-key step of P V (or P^T dO, dS^T Q, dS K) from the C fragments of the
// two 8-column score tiles 2k and 2k+1 (see the fragment layout above).
__device__ __forceinline__ void c_pair_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                            const float (&c1)[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}
// Lane's ldmatrix address for the 16x16 block at (r0, c0) of a row-major tile: A operands, and
// with .trans the B operands of two adjacent 8-column n-tiles from a [k][n] tile
// (r[0], r[1] = b0, b1 of columns c0..c0+7; r[2], r[3] = those of c0+8..c0+15).
template <int HS>
__device__ __forceinline__ const bf16* frag_rows(const bf16* tile, int r0, int c0, int lane) {
    return tile + (r0 + lane % 16) * TcShape<HS>::kStride + c0 + (lane / 16) * 8;
}
// Lane's ldmatrix address (no .trans) for the B operands of n-tiles n0..n0+7 and n0+8..n0+15
// over k0..k0+15, from a row-major [n][k] tile: r[0], r[1] = b0, b1 of the first n-tile, r[2],
// r[3] of the second.
template <int HS>
__device__ __forceinline__ const bf16* frag_nk(const bf16* tile, int n0, int k0, int lane) {
    return tile + (n0 + lane % 8 + (lane / 16) * 8) * TcShape<HS>::kStride + k0 +
           ((lane / 8) % 2) * 8;
}

// Asynchronous 16-byte global -> shared copy; `valid` false zero-fills (src-size 0: nothing is
// read, `src` only has to be a legal address). The "memory" clobbers keep the compiler from
// moving ordinary shared-memory accesses across the copy, its commit and its wait.
__device__ __forceinline__ void cp_async_16(bf16* dst, const bf16* src, bool valid) {
    MT_TC_ASM("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
              "r"(valid ? 16 : 0)
              : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
    MT_TC_ASM("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    MT_TC_ASM("cp.async.wait_group %0;\n" ::"n"(N) : "memory");  // the tile is readable after
}

// Starts copying rows r0..r0+ROWS-1 (columns 0..HS-1) of a row-major matrix with leading
// dimension `ld` into a [ROWS][HS+8] tile; rows at or past T are zero-filled. 16 bytes per
// thread per step, consecutive threads on consecutive 16-byte chunks of a row (coalesced).
template <int HS, int ROWS>
__device__ __forceinline__ void tile_load_async(bf16* dst, const bf16* src, size_t ld, int r0,
                                                int T) {
    constexpr int kChunksPerRow = HS / 8;
    for (int c = threadIdx.x; c < ROWS * kChunksPerRow; c += kTcThreads) {
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
        const bool valid = r0 + r < T;
        cp_async_16(dst + r * TcShape<HS>::kStride + col,
                    valid ? src + size_t(r0 + r) * ld + col : src, valid);
    }
}

// S (16 x N) = A (16 x HS, rows a_r0.. of tile A) B^T where B is the [N][HS] tile `Bt`: the
// warp's score block, N/8 C fragments. Only the first `groups` 16-column groups are computed
// (warp-uniform; the rest stay 0 and are masked by the caller).
template <int HS, int N>
__device__ __forceinline__ void warp_scores(float (&s)[N / 8][4], const bf16* A, int a_r0,
                                            const bf16* Bt, int lane, int groups = N / 16) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HS / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, frag_rows<HS>(A, a_r0, kk * 16, lane));
#pragma unroll
        for (int nn = 0; nn < N / 16; ++nn) {
            if (nn >= groups) break;
            uint32_t b[4];
            ldmatrix_x4(b, frag_nk<HS>(Bt, nn * 16, kk * 16, lane));
            mma_16816(s[2 * nn], a, b[0], b[1]);
            mma_16816(s[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

// acc (16 x HS) += P (16 x K, C fragments in registers) X (K x HS, the row-major tile X), over
// the first `groups` 16-row steps of K (warp-uniform; the caller knows the rest of P is 0).
template <int HS, int K>
__device__ __forceinline__ void warp_accumulate(float (&acc)[HS / 8][4], const float (&p)[K / 8][4],
                                                const bf16* X, int lane, int groups = K / 16) {
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk) {
        if (kk >= groups) break;
        uint32_t a[4];
        c_pair_to_a(a, p[2 * kk], p[2 * kk + 1]);
#pragma unroll
        for (int nn = 0; nn < HS / 16; ++nn) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, frag_rows<HS>(X, kk * 16, nn * 16, lane));
            mma_16816(acc[2 * nn], a, b[0], b[1]);
            mma_16816(acc[2 * nn + 1], a, b[2], b[3]);
        }
    }
}

// dst[row][..] += scale * acc for the warp's 16 rows r0.. (rows at or past T skipped), bf16
// read-modify-write of two adjacent elements per access. The op's += contract.
template <int HS>
__device__ __forceinline__ void warp_add_rows(bf16* dst, size_t ld, int r0, int T,
                                              const float (&acc)[HS / 8][4], float scale,
                                              int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = r0 + g + 8 * half;
        if (row >= T) continue;
        bf16* p = dst + size_t(row) * ld + 2 * t;
#pragma unroll
        for (int j = 0; j < HS / 8; ++j) {
            __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(p + 8 * j);
            const float2 old = __bfloat1622float2(*q);
            *q = __floats2bfloat162_rn(old.x + scale * acc[j][2 * half],
                                       old.y + scale * acc[j][2 * half + 1]);
        }
    }
}
}  // namespace

template <int HS>
__global__ void __launch_bounds__(kTcThreads, 1)
    flash_tc_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                            float scale_log2) {
    using Sh = TcShape<HS>;
    constexpr int kS = Sh::kStride;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    bf16* Qs = reinterpret_cast<bf16*>(tc_smem);  // [64][HS+8]
    bf16* Ks = Qs + kTcTile * kS;                 // [64][HS+8]
    bf16* Vs = Ks + kTcTile * kS;                 // [64][HS+8]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // The last query tiles have the most key tiles: start them first (less tail imbalance).
    const int q0 = (gridDim.x - 1 - blockIdx.x) * kTcTile;
    const int b = blockIdx.z, h = blockIdx.y;
    const size_t C3 = 3 * size_t(C);
    const bf16* q_base = qkv + size_t(b) * T * C3 + size_t(h) * HS;

    tile_load_async<HS, kTcTile>(Qs, q_base, C3, q0, T);
    cp_async_commit();

    float o[HS / 8][4];
#pragma unroll
    for (int j = 0; j < HS / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g+8 (log2 domain)
    const int row0 = q0 + 16 * warp;                           // the warp's first query

    for (int k0 = 0; k0 <= q0; k0 += kTcTile) {  // block-uniform: key tiles up to the diagonal
        __syncthreads();                         // the previous K, V tiles are consumed
        tile_load_async<HS, kTcTile>(Ks, q_base + C, C3, k0, T);
        cp_async_commit();
        tile_load_async<HS, kTcTile>(Vs, q_base + 2 * C, C3, k0, T);
        cp_async_commit();
        cp_async_wait<1>();  // Q and K have landed (V may still be in flight)
        __syncthreads();
        const bool diagonal = k0 == q0;
        // In the diagonal tile, keys past k0 + 16 (warp + 1) - 1 follow all of the warp's rows.
        const int groups = diagonal ? warp + 1 : kTcTile / 16;

        float s[kTcTile / 8][4];
        warp_scores<HS, kTcTile>(s, Qs, 16 * warp, Ks, lane, groups);
        // Scale into the log2 domain and mask the diagonal tile (key > query -> -inf).
#pragma unroll
        for (int j = 0; j < kTcTile / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = k0 + 8 * j + 2 * t + (e & 1), row = row0 + g + 8 * (e / 2);
                s[j][e] = diagonal && key > row ? -INFINITY : s[j][e] * scale_log2;
            }
            // Online softmax, per row: the thread's 16 values, then across the quad.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = m[r];
#pragma unroll
            for (int j = 0; j < kTcTile / 8; ++j)
                mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Key k0 <= every query of the block is visible: mx is finite. exp2(-inf) = 0 on
            // the first tile.
            const float alpha = exp2f(m[r] - mx);
            m[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < kTcTile / 8; ++j) {
                s[j][2 * r] = exp2f(s[j][2 * r] - mx);
                s[j][2 * r + 1] = exp2f(s[j][2 * r + 1] - mx);
                sum += s[j][2 * r] + s[j][2 * r + 1];
            }
            l[r] = l[r] * alpha + sum;  // the thread's share; the quad adds up at the end
#pragma unroll
            for (int j = 0; j < HS / 8; ++j) {
                o[j][2 * r] *= alpha;
                o[j][2 * r + 1] *= alpha;
            }
        }
        cp_async_wait<0>();  // V has landed
        __syncthreads();
        warp_accumulate<HS, kTcTile>(o, s, Vs, lane, groups);
    }

    // out = O / l, staged through the warp's own Q rows (no other warp reads them) so the
    // global stores are 16-byte, coalesced rows.
    const size_t stat = (size_t(b) * NH + h) * T;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        const int row = row0 + g + 8 * r;
        if (t == 0 && row < T) lse[stat + row] = m[r] * kLn2 + logf(l[r]);
        const float inv = 1.0f / l[r];
        bf16* dst = Qs + (16 * warp + g + 8 * r) * kS + 2 * t;
#pragma unroll
        for (int j = 0; j < HS / 8; ++j)
            *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
                __floats2bfloat162_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
    __syncwarp();
    bf16* o_base = out + size_t(b) * T * C + size_t(h) * HS;
    constexpr int kChunksPerRow = HS / 8;
    for (int c = lane; c < 16 * kChunksPerRow; c += 32) {
        const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8, row = row0 + r;
        if (row < T)
            *reinterpret_cast<uint4*>(o_base + size_t(row) * C + col) =
                *reinterpret_cast<const uint4*>(Qs + (16 * warp + r) * kS + col);
    }
}

// dK, dV for 64 keys (see the backward notes above). Every (key, query) pair below the diagonal
// is visited once, in increasing query order: the sums have a fixed order.
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    flash_tc_backward_dkdv_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                  const float* Dsum, int T, int C, int NH, float scale,
                                  float scale_log2) {
    using Sh = TcShape<HS>;
    constexpr int kS = Sh::kStride, kIn = Sh::kInner;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    bf16* Ks = reinterpret_cast<bf16*>(tc_smem);               // [64][HS+8]
    bf16* Vs = Ks + kTcTile * kS;                              // [64][HS+8]
    bf16* Qs = Vs + kTcTile * kS;                              // [kIn][HS+8]
    bf16* dOs = Qs + kIn * kS;                                 // [kIn][HS+8]
    float* lse2_s = reinterpret_cast<float*>(dOs + kIn * kS);  // [kIn] lse log2(e)
    float* D_s = lse2_s + kIn;                                 // [kIn]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int j0 = blockIdx.x * kTcTile, b = blockIdx.z, h = blockIdx.y;  // tile 0 is heaviest
    const size_t C3 = 3 * size_t(C);
    const bf16* q_base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
    const bf16* do_base = dout + size_t(b) * T * C + size_t(h) * HS;
    const size_t stat = (size_t(b) * NH + h) * T;
    const int key0 = j0 + 16 * warp;  // the warp's first key

    tile_load_async<HS, kTcTile>(Ks, q_base + C, C3, j0, T);
    tile_load_async<HS, kTcTile>(Vs, q_base + 2 * C, C3, j0, T);
    cp_async_commit();
    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int j = 0; j < HS / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

    for (int i0 = j0; i0 < T; i0 += kIn) {  // block-uniform; queries before j0 see no key here
        __syncthreads();                    // the previous Q, dO, lse, D are consumed
        tile_load_async<HS, kIn>(Qs, q_base, C3, i0, T);
        tile_load_async<HS, kIn>(dOs, do_base, C, i0, T);
        cp_async_commit();
        if (threadIdx.x < kIn) {
            // A padded query gets lse = +inf: its P is exactly 0 (and its dO rows are zero).
            const int i = i0 + threadIdx.x;
            lse2_s[threadIdx.x] = i < T ? lse[stat + i] * kLog2e : INFINITY;
            D_s[threadIdx.x] = i < T ? Dsum[stat + i] : 0.0f;
        }
        cp_async_wait<0>();
        __syncthreads();
        const bool masked = i0 < j0 + kTcTile - 1;  // some query of the tile precedes some key

        float pt[kIn / 8][4], dpt[kIn / 8][4];  // P^T, dP^T: 16 keys x kIn queries
        warp_scores<HS, kIn>(pt, Ks, 16 * warp, Qs, lane);
        warp_scores<HS, kIn>(dpt, Vs, 16 * warp, dOs, lane);
#pragma unroll
        for (int j = 0; j < kIn / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qi = 8 * j + 2 * t + (e & 1), key = key0 + g + 8 * (e / 2);
                const float p =
                    masked && key > i0 + qi ? 0.0f : exp2f(pt[j][e] * scale_log2 - lse2_s[qi]);
                pt[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - D_s[qi]);  // dS^T
            }
        warp_accumulate<HS, kIn>(dv, pt, dOs, lane);  // dV += P^T dO
        warp_accumulate<HS, kIn>(dk, dpt, Qs, lane);  // dK += dS^T Q   (scale at the end)
    }
    bf16* d_base = dqkv + size_t(b) * T * C3 + size_t(h) * HS;
    warp_add_rows<HS>(d_base + C, C3, key0, T, dk, scale, lane);
    warp_add_rows<HS>(d_base + 2 * C, C3, key0, T, dv, 1.0f, lane);
}

// dQ for 64 queries: the key tiles up to the diagonal, in increasing order.
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    flash_tc_backward_dq_kernel(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                                const float* Dsum, int T, int C, int NH, float scale,
                                float scale_log2) {
    using Sh = TcShape<HS>;
    constexpr int kS = Sh::kStride, kIn = Sh::kInner;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    bf16* Qs = reinterpret_cast<bf16*>(tc_smem);  // [64][HS+8]
    bf16* dOs = Qs + kTcTile * kS;                // [64][HS+8]
    bf16* Ks = dOs + kTcTile * kS;                // [kIn][HS+8]
    bf16* Vs = Ks + kIn * kS;                     // [kIn][HS+8]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int i0 = (gridDim.x - 1 - blockIdx.x) * kTcTile, b = blockIdx.z, h = blockIdx.y;
    const size_t C3 = 3 * size_t(C);
    const bf16* q_base = qkv + size_t(b) * T * C3 + size_t(h) * HS;
    const bf16* do_base = dout + size_t(b) * T * C + size_t(h) * HS;
    const size_t stat = (size_t(b) * NH + h) * T;
    const int row0 = i0 + 16 * warp;  // the warp's first query

    tile_load_async<HS, kTcTile>(Qs, q_base, C3, i0, T);
    tile_load_async<HS, kTcTile>(dOs, do_base, C, i0, T);
    cp_async_commit();
    float lse2[2], Drow[2];  // rows g, g+8; padded rows get P = 0
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = row0 + g + 8 * r;
        lse2[r] = row < T ? lse[stat + row] * kLog2e : INFINITY;
        Drow[r] = row < T ? Dsum[stat + row] : 0.0f;
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int j = 0; j < HS / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.0f;

    const int key_end = min(i0 + kTcTile, T);
    for (int j0 = 0; j0 < key_end; j0 += kIn) {  // block-uniform
        __syncthreads();                         // the previous K, V are consumed
        tile_load_async<HS, kIn>(Ks, q_base + C, C3, j0, T);
        tile_load_async<HS, kIn>(Vs, q_base + 2 * C, C3, j0, T);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        const bool masked = j0 + kIn - 1 > i0;  // some key of the tile follows some query

        float s[kIn / 8][4], dp[kIn / 8][4];  // S / P / dS and dP: 16 queries x kIn keys
        warp_scores<HS, kIn>(s, Qs, 16 * warp, Ks, lane);
        warp_scores<HS, kIn>(dp, dOs, 16 * warp, Vs, lane);
#pragma unroll
        for (int j = 0; j < kIn / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e / 2, key = j0 + 8 * j + 2 * t + (e & 1), row = row0 + g + 8 * r;
                const float p = masked && key > row ? 0.0f : exp2f(s[j][e] * scale_log2 - lse2[r]);
                s[j][e] = p * (dp[j][e] - Drow[r]);  // dS
            }
        warp_accumulate<HS, kIn>(dq, s, Ks, lane);  // dQ += dS K   (scale at the end)
    }
    warp_add_rows<HS>(dqkv + size_t(b) * T * C3 + size_t(h) * HS, C3, row0, T, dq, scale, lane);
}

namespace {
// What a device needs before its first flash_tc launch, done once per device (later launches pay
// a lookup): compute capability 8.0+ (bf16 mma.sync), and the opt-in of every kernel above 48 KB
// of dynamic shared memory (cudaFuncSetAttribute holds per kernel and per device, so each
// instantiation is set by name here rather than "once per launcher", which could skip one).
void prepare_device_once() {
    static std::mutex mu;
    static std::set<int> ready;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mu);
    if (ready.count(dev)) return;
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major < 8)
        throw BackendError(
            "kernels.attention: flash_tc needs bf16 tensor-core MMA, compute "
            "capability 8.0 or newer; device " +
            std::to_string(dev) + " has " + std::to_string(major) +
            ".x; use kernels.attention: flash");
    set_smem(flash_tc_forward_kernel<64>, TcShape<64>::kForwardSmem, "flash_tc_forward_kernel<64>",
             "flash");
    set_smem(flash_tc_forward_kernel<128>, TcShape<128>::kForwardSmem,
             "flash_tc_forward_kernel<128>", "flash");
    set_smem(flash_tc_backward_dkdv_kernel<64>, TcShape<64>::kBackwardSmem,
             "flash_tc_backward_dkdv_kernel<64>", "flash");
    set_smem(flash_tc_backward_dkdv_kernel<128>, TcShape<128>::kBackwardSmem,
             "flash_tc_backward_dkdv_kernel<128>", "flash");
    set_smem(flash_tc_backward_dq_kernel<64>, TcShape<64>::kBackwardSmem,
             "flash_tc_backward_dq_kernel<64>", "flash");
    set_smem(flash_tc_backward_dq_kernel<128>, TcShape<128>::kBackwardSmem,
             "flash_tc_backward_dq_kernel<128>", "flash");
    ready.insert(dev);
}

}  // namespace

void flash_tc_check_shape(const char* what, int C, int NH) {
    if (NH <= 0 || C % NH != 0)
        throw BackendError(std::string("flash_tc attention (") + what + "): n_embd " +
                           std::to_string(C) + " is not a multiple of n_head " +
                           std::to_string(NH) + " (the heads split the channels evenly)");
    const int hs = C / NH;
    if (!flash_tc_supports_head_size(hs))
        throw BackendError(std::string("flash_tc attention (") + what +
                           "): kernels for head size 64 or 128, got n_embd / n_head = " +
                           std::to_string(hs) + "; use kernels.attention: flash");
}

namespace {

// The shape and alignment a call must have (host arithmetic only), then the device preparation.
void check_flash_tc_call(const char* what, int C, int NH,
                         std::initializer_list<const void*> pointers) {
    flash_tc_check_shape(what, C, NH);
    for (const void* p : pointers)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
            throw BackendError(std::string("flash_tc attention (") + what +
                               "): a tensor is not 16-byte aligned (its 16-byte cp.async loads "
                               "and stores need it); use kernels.attention: flash");
    prepare_device_once();
}

template <int HS>
void flash_tc_forward_launch(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH,
                             cudaStream_t s) {
    constexpr size_t smem = TcShape<HS>::kForwardSmem;
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const dim3 grid(ceil_div(T, kTcTile), NH, B);
    flash_tc_forward_kernel<HS>
        <<<grid, kTcThreads, smem, s>>>(out, lse, qkv, T, C, NH, scale * kLog2e);
    CUDA_CHECK_LAUNCH("flash_tc_forward_kernel");
}

template <int HS>
void flash_tc_backward_launch(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse,
                              const float* Dsum, int B, int T, int C, int NH, cudaStream_t s) {
    constexpr size_t smem = TcShape<HS>::kBackwardSmem;
    const float scale = 1.0f / sqrtf(static_cast<float>(HS));
    const dim3 grid(ceil_div(T, kTcTile), NH, B);
    flash_tc_backward_dkdv_kernel<HS><<<grid, kTcThreads, smem, s>>>(dqkv, dout, qkv, lse, Dsum, T,
                                                                     C, NH, scale, scale * kLog2e);
    CUDA_CHECK_LAUNCH("flash_tc_backward_dkdv_kernel");
    flash_tc_backward_dq_kernel<HS><<<grid, kTcThreads, smem, s>>>(dqkv, dout, qkv, lse, Dsum, T, C,
                                                                   NH, scale, scale * kLog2e);
    CUDA_CHECK_LAUNCH("flash_tc_backward_dq_kernel");
}
}  // namespace

size_t flash_tc_attention_workspace_bytes(int B, int T, int C, int NH) {
    return flash_attention_workspace_bytes(B, T, C, NH);  // D (B,NH,T) fp32, as flash
}

void flash_tc_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                                cudaStream_t s) {
    check_flash_tc_call("forward", C, NH, {out, qkv});
    auto* o = static_cast<bf16*>(out);
    const auto* x = static_cast<const bf16*>(qkv);
    if (C / NH == 64)
        flash_tc_forward_launch<64>(o, lse, x, B, T, C, NH, s);
    else
        flash_tc_forward_launch<128>(o, lse, x, B, T, C, NH, s);
}

void flash_tc_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                 const float* lse, int B, int T, int C, int NH, void* workspace,
                                 cudaStream_t s) {
    check_flash_tc_call("backward", C, NH, {dqkv, dout, qkv});
    float* Dsum = static_cast<float*>(workspace);
    const auto* dO = static_cast<const bf16*>(dout);
    const size_t rows = size_t(B) * NH * T;
    flash_backward_preprocess_kernel<bf16>
        <<<ceil_div(rows, 8), 256, 0, s>>>(Dsum, dO, static_cast<const bf16*>(out), B, T, C, NH);
    CUDA_CHECK_LAUNCH("flash_backward_preprocess_kernel");
    auto* d = static_cast<bf16*>(dqkv);
    const auto* x = static_cast<const bf16*>(qkv);
    if (C / NH == 64)
        flash_tc_backward_launch<64>(d, dO, x, lse, Dsum, B, T, C, NH, s);
    else
        flash_tc_backward_launch<128>(d, dO, x, lse, Dsum, B, T, C, NH, s);
}

}  // namespace mt::cuda

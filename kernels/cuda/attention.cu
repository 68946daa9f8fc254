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
void set_smem(K kernel, size_t bytes, const char* name) {
    if (bytes <= 48 * 1024) return;
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > static_cast<size_t>(optin))
        throw BackendError(std::string("flash attention: ") + name + " needs " +
                           std::to_string(bytes) + " bytes of shared memory, the device allows " +
                           std::to_string(optin) + "; use kernels.attention: naive");
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
        set_smem(flash_attention_forward_kernel<E>, smem, "flash_attention_forward_kernel");
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
        set_smem(flash_attention_backward_dkdv_kernel<E>, s1, "flash_attention_backward_dkdv");
        set_smem(flash_attention_backward_dq_kernel<E>, s2, "flash_attention_backward_dq");
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

}  // namespace mt::cuda

// Linear layers: the matmul ladder (kernels.matmul: naive | tiled | cublas | cublaslt, further
// down) and its default step, cuBLASLt, first. Row-major (N,C) activations are column-major (C x N)
// matrices to cuBLAS, and a row-major PyTorch weight (OC,C) is a column-major (C x OC) matrix,
// so every product is written "transposed":
//   forward   out^T (OC x N)  = W (OC x C)    . inp^T (C x N)     A = W,   op T
//   dinp      dinp^T (C x N) += W^T (C x OC)  . dout^T (OC x N)   beta = 1
//   dweight   dW^T (C x OC)  += inp^T (C x N) . dout (N x OC)     beta = 1, fp32 output
// The bias (length OC = rows of the column-major output) and GELU are applied in cuBLASLt's
// epilogue while the tile is still in registers (BIAS, GELU_AUX_BIAS): no extra pass over the
// (N,OC) output. GELU_AUX_BIAS also writes the pre-activation (the "aux" matrix) that the GELU
// backward needs.
#include "kernels/cuda/matmul.cuh"

namespace mt::cuda {

namespace {

// Largest power of two (<= 256) dividing the address: what cuBLASLt's heuristic may assume.
int alignment_of(const void* p) {
    auto a = reinterpret_cast<uintptr_t>(p);
    int al = 256;
    while (al > 1 && (a % al) != 0) al /= 2;
    return al;
}

struct LtDesc {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~LtDesc() {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (c) cublasLtMatrixLayoutDestroy(c);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (op) cublasLtMatmulDescDestroy(op);
    }
};

// D (m x n, ldd) = alpha op(A) op(B) + beta D, column-major, with an optional epilogue.
// Returns false (instead of throwing) when cuBLASLt has no algorithm for this combination, so
// the caller can fall back to a plain GEMM + a separate epilogue kernel.
bool lt_matmul(BlasContext& ctx, cudaStream_t s, bool transa, bool transb, int m, int n, int k,
               const void* A, cudaDataType_t ta, int lda, const void* B, cudaDataType_t tb, int ldb,
               void* D, cudaDataType_t td, int ldd, float beta, cublasLtEpilogue_t epilogue,
               const void* bias, void* aux, int ldaux) {
    const auto key = std::make_tuple(int(transa), int(transb), m, n, k, lda, ldb, ldd,
                                     int(ta) * 1000 + int(tb) * 10 + int(td), int(epilogue),
                                     std::min({alignment_of(A), alignment_of(B), alignment_of(D)}),
                                     beta == 0.0f ? 0 : 1);
    if (ctx.unsupported.count(key)) return false;
    LtDesc d;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, ctx.compute_type(), CUDA_R_32F));
    const cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                sizeof epilogue));
    if (bias) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                    sizeof bias));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &td,
                                                    sizeof td));
    }
    if (aux) {
        const int64_t ld = ldaux;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                    &aux, sizeof aux));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                    sizeof ld));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &td, sizeof td));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, ta, transa ? k : m, transa ? m : k, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, tb, transb ? n : k, transb ? k : n, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, td, m, n, ldd));

    cublasLtMatmulAlgo_t algo;
    if (auto it = ctx.algo_cache.find(key); it != ctx.algo_cache.end()) {
        algo = it->second;
    } else {
        CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
        const size_t ws = ctx.lt_workspace_bytes;
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const uint32_t al_a = alignment_of(A), al_b = alignment_of(B), al_d = alignment_of(D);
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
            d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
        cublasLtMatmulHeuristicResult_t result{};
        int returned = 0;
        const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.op, d.a, d.b, d.c, d.c,
                                                                 d.pref, 1, &result, &returned);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && returned == 0)) {
            ctx.unsupported[key] = true;
            return false;
        }
        CUBLAS_CHECK(st);
        algo = result.algo;
        ctx.algo_cache.emplace(key, algo);
    }
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(ctx.lt, d.op, &alpha, A, d.a, B, d.b, &beta, D, d.c, D, d.c, &algo,
                                ctx.lt_workspace, ctx.lt_workspace_bytes, s));
    return true;
}

[[noreturn]] void no_algorithm(const char* what, int m, int n, int k) {
    throw BackendError(std::string("cuBLASLt found no algorithm for ") + what + " (m=" +
                       std::to_string(m) + ", n=" + std::to_string(n) + ", k=" + std::to_string(k) +
                       "); check that the shapes are positive and the buffers are 16-byte "
                       "aligned");
}

// D (m x n) (+)= op(A) op(B) through the classic cublasGemmEx (on the backend's stream, set
// once by the backend): no epilogue, any leading dimension.
void cublas_gemm(BlasContext& ctx, bool transa, bool transb, int m, int n, int k, const void* A,
                 cudaDataType_t ta, int lda, const void* B, cudaDataType_t tb, int ldb, void* D,
                 cudaDataType_t td, int ldd, float beta) {
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(ctx.blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N,
                              transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A, ta, lda, B,
                              tb, ldb, &beta, D, td, ldd, ctx.compute_type(), CUBLAS_GEMM_DEFAULT));
}

// cublaslt: the Linear forward with cuBLASLt's BIAS / GELU_AUX_BIAS epilogues (the default).
void matmul_forward_cublaslt(BlasContext& ctx, void* out, const void* inp, const void* weight,
                             const void* bias, int N, int C, int OC, bool gelu, void* pre_act,
                             cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    const DType dt = dtype_of(ctx.precision);
    // cuBLASLt reads the bias with vector loads: only hand it a 16-byte aligned one.
    const bool bias_ok = bias && alignment_of(bias) >= 16;
    if (gelu) {
        if (!pre_act)
            throw BackendError("matmul_forward: the gelu epilogue needs a pre_act buffer (N,OC)");
        if (bias_ok && OC % 8 == 0 && alignment_of(pre_act) >= 16 &&
            lt_matmul(ctx, s, true, false, OC, N, C, weight, t, C, inp, t, C, out, t, OC, 0.0f,
                      CUBLASLT_EPILOGUE_GELU_AUX_BIAS, bias, pre_act, OC))
            return;
        // Fallback: GEMM into pre_act, then one kernel adds the bias and applies GELU.
        if (!lt_matmul(ctx, s, true, false, OC, N, C, weight, t, C, inp, t, C, pre_act, t, OC, 0.0f,
                       CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
            no_algorithm("matmul_forward", OC, N, C);
        bias_gelu_epilogue(dt, pre_act, out, bias, N, OC, s);
        return;
    }
    if (bias_ok && lt_matmul(ctx, s, true, false, OC, N, C, weight, t, C, inp, t, C, out, t, OC,
                             0.0f, CUBLASLT_EPILOGUE_BIAS, bias, nullptr, 0))
        return;
    if (!lt_matmul(ctx, s, true, false, OC, N, C, weight, t, C, inp, t, C, out, t, OC, 0.0f,
                   CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_forward", OC, N, C);
    if (bias) bias_gelu_epilogue(dt, out, nullptr, bias, N, OC, s);
}

// cublaslt: the backward's two GEMMs through cuBLASLt with beta = 1 (accumulate).
void matmul_backward_cublaslt(BlasContext& ctx, void* dinp, float* dweight, float* dbias,
                              const void* dout, const void* inp, const void* weight, int N, int C,
                              int OC, cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    // dinp^T (C x N) += W^T . dout^T: A = W stored (C x OC) op N, B = dout stored (OC x N) op N.
    if (dinp && !lt_matmul(ctx, s, false, false, C, N, OC, weight, t, C, dout, t, OC, dinp, t, C,
                           1.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_backward (dinp)", C, N, OC);
    // dW^T (C x OC) += inp^T . dout: A = inp stored (C x N) op N, B = dout stored (OC x N) op T.
    if (dweight && !lt_matmul(ctx, s, false, true, C, OC, N, inp, t, C, dout, t, OC, dweight,
                              CUDA_R_32F, C, 1.0f, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        no_algorithm("matmul_backward (dweight)", C, OC, N);
    if (dbias) bias_backward(dtype_of(ctx.precision), dbias, dout, N, OC, s);
}

}  // namespace

// ---- the matmul ladder (kernels.matmul: naive | tiled | cublas | cublaslt) -------------------
// The same three products of a Linear layer, four ways, from no reuse to cuBLASLt's fused
// epilogues. Our own kernels (naive, tiled) see each product as one row-major GEMM
//   D (M x Ncol) (+)= A (M x K) . B^T (K x Ncol)       D[i,j] = sum_k A(i,k) B(j,k)
// with each operand an (R x K) matrix stored either K-contiguous (element (r,k) at r*K + k) or
// K-strided (at k*R + r), so no operand is ever copied or transposed in memory:
//   forward   out (N,OC)    = inp . W^T     A = inp (N,C)   K-contig,  B = W (OC,C)   K-contig
//   dinp      dinp (N,C)   += dout . W      A = dout (N,OC) K-contig,  B = W as (C,OC) K-strided
//   dweight   dW (OC,C)    += dout^T . inp  A = dout as (OC,N) K-strided, B = inp as (C,N)
//   K-strided
// Both load compute-precision elements (fp32 or bf16), multiply and accumulate in fp32 — also
// under run.precision: tf32, which only cuBLAS's tensor cores honour — and store D in its type
// (compute precision, fp32 for dW). The bias and GELU are a separate pass (bias_gelu_epilogue,
// bias_backward): what cuBLASLt's epilogues save is a kernel of its own in an nsys trace (in the
// per-op table it is part of the matmul op's time).
namespace {

// Element (r, k) of an (R x K) operand stored K-contiguous or K-strided (see above).
template <bool kKContiguous, class T>
__device__ __forceinline__ float operand_at(const T* X, int R, int K, int r, int k) {
    return to_float(kKContiguous ? X[size_t(r) * K + k] : X[size_t(k) * R + r]);
}

// naive: one thread per output element, a dot product over K straight from global memory.
// What it teaches: no reuse — every operand element is fetched again by each of the Ncol (or M)
// threads that need it, K loads per output, so the GEMM runs at the speed of L1/L2, not of the
// FMA units. A warp is 32 adjacent columns j of one row i: A(i,k) is one broadcast load, B(j,k)
// is 32 loads (coalesced when B is K-strided, 32 separate lines when it is K-contiguous).
template <class T, class TD, bool kAContig, bool kBContig>
__global__ void matmul_naive_kernel(TD* D, const T* A, const T* B, int M, int Ncol, int K,
                                    bool accumulate) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= Ncol) return;
    for (int i = blockIdx.y * blockDim.y + threadIdx.y; i < M; i += gridDim.y * blockDim.y) {
        float acc = 0.0f;
        for (int k = 0; k < K; ++k)
            acc += operand_at<kAContig>(A, M, K, i, k) * operand_at<kBContig>(B, Ncol, K, j, k);
        TD* d = D + size_t(i) * Ncol + j;
        if (accumulate) acc += to_float(*d);
        *d = from_float<TD>(acc);
    }
}

constexpr int kTile = 64;      // output tile per block: kTile x kTile
constexpr int kTileK = 16;     // slice of K staged per step
constexpr int kTileSide = 16;  // 16 x 16 = 256 threads, each a 4 x 4 register block
constexpr int kTileThreads = kTileSide * kTileSide;
constexpr int kPerThread = kTile / kTileSide;  // 4

// Stages the (kTile x kTileK) slice of an operand at rows r0.., columns k0.. into s[k][r] as fp32
// (zero outside the matrix). Consecutive threads read consecutive addresses of whichever index is
// contiguous in memory (coalesced loads either way); the +1 column keeps the shared-memory
// stores of the K-contiguous case off a single bank.
template <bool kKContiguous, class T>
__device__ __forceinline__ void stage_tile(float (*s)[kTile + 1], const T* X, int R, int K, int r0,
                                           int k0) {
    for (int idx = threadIdx.x; idx < kTile * kTileK; idx += kTileThreads) {
        const int r = kKContiguous ? idx / kTileK : idx % kTile;
        const int k = kKContiguous ? idx % kTileK : idx / kTile;
        const bool inside = r0 + r < R && k0 + k < K;
        s[k][r] = inside ? operand_at<kKContiguous>(X, R, K, r0 + r, k0 + k) : 0.0f;
    }
}

// tiled: a 64 x 64 block of D per thread block, the K dimension walked in slices of 16 that are
// staged in shared memory. What it teaches: reuse — each element of A and B is read from global
// memory once per tile and then used 64 times from shared memory (by the 16 threads of its row
// or column, 4 outputs each), and each thread keeps its 4 x 4 outputs in registers, so one
// shared-memory load feeds 4 FMAs: 64x fewer global loads than naive. Thread (tx, ty) owns rows
// ty + 16 a and columns tx + 16 b (a, b < 4): adjacent threads read adjacent shared words (no
// bank conflicts) and store adjacent columns (coalesced). No tensor cores: that is cuBLAS's step.
template <class T, class TD, bool kAContig, bool kBContig>
__global__ void __launch_bounds__(kTileThreads)
    matmul_tiled_kernel(TD* D, const T* A, const T* B, int M, int Ncol, int K, bool accumulate) {
    __shared__ float as[kTileK][kTile + 1];  // A tile, as[k][i]
    __shared__ float bs[kTileK][kTile + 1];  // B tile, bs[k][j]
    const int i0 = blockIdx.y * kTile, j0 = blockIdx.x * kTile;
    const int tx = threadIdx.x % kTileSide, ty = threadIdx.x / kTileSide;
    float acc[kPerThread][kPerThread] = {};
    for (int k0 = 0; k0 < K; k0 += kTileK) {
        stage_tile<kAContig>(as, A, M, K, i0, k0);
        stage_tile<kBContig>(bs, B, Ncol, K, j0, k0);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kTileK; ++k) {
            float a[kPerThread], b[kPerThread];
#pragma unroll
            for (int u = 0; u < kPerThread; ++u) {
                a[u] = as[k][ty + kTileSide * u];
                b[u] = bs[k][tx + kTileSide * u];
            }
#pragma unroll
            for (int u = 0; u < kPerThread; ++u)
#pragma unroll
                for (int v = 0; v < kPerThread; ++v) acc[u][v] += a[u] * b[v];
        }
        __syncthreads();  // the tile is overwritten by the next slice
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
        const int i = i0 + ty + kTileSide * u;
        if (i >= M) continue;
#pragma unroll
        for (int v = 0; v < kPerThread; ++v) {
            const int j = j0 + tx + kTileSide * v;
            if (j >= Ncol) continue;
            TD* d = D + size_t(i) * Ncol + j;
            *d = from_float<TD>(acc[u][v] + (accumulate ? to_float(*d) : 0.0f));
        }
    }
}

// D (M x Ncol) (+)= A . B^T with the naive or the tiled kernel.
template <bool kAContig, bool kBContig, class T, class TD>
void own_gemm(bool tiled, TD* D, const T* A, const T* B, int M, int Ncol, int K, bool accumulate,
              cudaStream_t s) {
    if (tiled) {
        if (ceil_div(M, kTile) > 65535u)
            throw BackendError("kernels.matmul: tiled: " + std::to_string(M) +
                               " rows are more than its grid covers (65535 tiles of 64)");
        const dim3 grid(ceil_div(Ncol, kTile), ceil_div(M, kTile));
        matmul_tiled_kernel<T, TD, kAContig, kBContig>
            <<<grid, kTileThreads, 0, s>>>(D, A, B, M, Ncol, K, accumulate);
        CUDA_CHECK_LAUNCH("matmul_tiled_kernel");
    } else {
        const dim3 block(32, 8);  // 32 adjacent columns per warp: coalesced stores
        const dim3 grid(ceil_div(Ncol, 32), std::min(ceil_div(M, 8), 65535u));
        matmul_naive_kernel<T, TD, kAContig, kBContig>
            <<<grid, block, 0, s>>>(D, A, B, M, Ncol, K, accumulate);
        CUDA_CHECK_LAUNCH("matmul_naive_kernel");
    }
}

// naive / tiled forward: the GEMM into out (or pre_act under GELU), then one pass adds the bias
// and applies GELU.
void matmul_forward_own(bool tiled, DType dt, void* out, const void* inp, const void* weight,
                        const void* bias, int N, int C, int OC, bool gelu, void* pre_act,
                        cudaStream_t s) {
    void* gemm_out = gelu ? pre_act : out;
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        own_gemm<true, true>(tiled, static_cast<T*>(gemm_out), static_cast<const T*>(inp),
                             static_cast<const T*>(weight), N, OC, C, false, s);
    });
    if (gelu || bias) bias_gelu_epilogue(dt, gemm_out, gelu ? out : nullptr, bias, N, OC, s);
}

// naive / tiled backward: dinp += dout W; dW += dout^T inp (fp32); dbias += column sums.
void matmul_backward_own(bool tiled, DType dt, void* dinp, float* dweight, float* dbias,
                         const void* dout, const void* inp, const void* weight, int N, int C,
                         int OC, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        const T* g = static_cast<const T*>(dout);
        if (dinp)
            own_gemm<true, false>(tiled, static_cast<T*>(dinp), g, static_cast<const T*>(weight), N,
                                  C, OC, true, s);
        if (dweight)
            own_gemm<false, false>(tiled, dweight, g, static_cast<const T*>(inp), OC, C, N, true,
                                   s);
    });
    if (dbias) bias_backward(dt, dbias, dout, N, OC, s);
}

// cublas: the classic cublasGemmEx, as a framework without cuBLASLt calls it — tensor cores
// (tf32 / bf16), but the bias and GELU are a separate pass over the (N,OC) output (one more
// read and write of it, two with GELU): what cuBLASLt's epilogues save. The products are the
// cuBLASLt path's (column-major view at the top of this file).
void matmul_forward_cublas(BlasContext& ctx, void* out, const void* inp, const void* weight,
                           const void* bias, int N, int C, int OC, bool gelu, void* pre_act,
                           cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    void* gemm_out = gelu ? pre_act : out;
    cublas_gemm(ctx, true, false, OC, N, C, weight, t, C, inp, t, C, gemm_out, t, OC, 0.0f);
    if (gelu || bias)
        bias_gelu_epilogue(dtype_of(ctx.precision), gemm_out, gelu ? out : nullptr, bias, N, OC, s);
}

void matmul_backward_cublas(BlasContext& ctx, void* dinp, float* dweight, float* dbias,
                            const void* dout, const void* inp, const void* weight, int N, int C,
                            int OC, cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    if (dinp) cublas_gemm(ctx, false, false, C, N, OC, weight, t, C, dout, t, OC, dinp, t, C, 1.0f);
    if (dweight)
        cublas_gemm(ctx, false, true, C, OC, N, inp, t, C, dout, t, OC, dweight, CUDA_R_32F, C,
                    1.0f);
    if (dbias) bias_backward(dtype_of(ctx.precision), dbias, dout, N, OC, s);
}

[[noreturn]] void not_a_cuda_step(MatmulImpl impl) {
    throw BackendError(std::string("kernels.matmul: ") + to_string(impl) +
                       " is a CPU step of the ladder; the CUDA backend has naive, tiled, cublas "
                       "and cublaslt (auto = cublaslt)");
}

}  // namespace

void matmul_forward(BlasContext& ctx, MatmulImpl impl, void* out, const void* inp,
                    const void* weight, const void* bias, int N, int C, int OC, bool gelu,
                    void* pre_act, cudaStream_t s) {
    if (gelu && !pre_act)
        throw BackendError("matmul_forward: the gelu epilogue needs a pre_act buffer (N,OC)");
    const DType dt = dtype_of(ctx.precision);
    switch (impl) {
        case MatmulImpl::naive:
        case MatmulImpl::tiled:
            return matmul_forward_own(impl == MatmulImpl::tiled, dt, out, inp, weight, bias, N, C,
                                      OC, gelu, pre_act, s);
        case MatmulImpl::cublas:
            return matmul_forward_cublas(ctx, out, inp, weight, bias, N, C, OC, gelu, pre_act, s);
        case MatmulImpl::auto_:
        case MatmulImpl::cublaslt:
            return matmul_forward_cublaslt(ctx, out, inp, weight, bias, N, C, OC, gelu, pre_act, s);
        default:
            not_a_cuda_step(impl);
    }
}

void matmul_backward(BlasContext& ctx, MatmulImpl impl, void* dinp, float* dweight, float* dbias,
                     const void* dout, const void* inp, const void* weight, int N, int C, int OC,
                     cudaStream_t s) {
    switch (impl) {
        case MatmulImpl::naive:
        case MatmulImpl::tiled:
            return matmul_backward_own(impl == MatmulImpl::tiled, dtype_of(ctx.precision), dinp,
                                       dweight, dbias, dout, inp, weight, N, C, OC, s);
        case MatmulImpl::cublas:
            return matmul_backward_cublas(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC,
                                          s);
        case MatmulImpl::auto_:
        case MatmulImpl::cublaslt:
            return matmul_backward_cublaslt(ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC,
                                            s);
        default:
            not_a_cuda_step(impl);
    }
}

// ---- int8 weights ---------------------------------------------------------------------------
// A shared-memory tiled GEMM that reads the int8 weight (1 byte per element instead of 4 or 2)
// and dequantises it while staging a tile: W[o,c] = scale[o] q[o,c] is formed in shared memory,
// never in global memory. What it teaches: the weight's share of a Linear layer's traffic drops
// 4x (fp32) / 2x (bf16) at the price of our own tiled GEMM instead of cuBLAS's tensor cores.
// One 64x64 output tile per block, 16x16 threads, each thread a 4x4 register sub-tile; the sum
// over the shared dimension runs in 32-wide steps in a fixed order (deterministic).
namespace {
constexpr int kI8Tile = 64, kI8K = 32, kI8Threads = 16;

// out (N,M) (+)= X (N,K) Wk (K,M), X in compute precision, where the weight element (k, m) is
//   forward  (transposed = true):  q[m*K + k] * scale[m]    (W (OC=M, C=K) read as W^T)
//   backward (transposed = false): q[k*M + m] * scale[k]    (W (OC=K, C=M))
template <class T, bool kTransposed>
__global__ void matmul_int8_kernel(T* out, const T* X, const int8_t* q, const float* scale,
                                   const T* bias, int N, int K, int M, bool accumulate) {
    __shared__ float xs[kI8K][kI8Tile + 1];  // X tile, transposed: xs[k][n]
    __shared__ float ws[kI8K][kI8Tile + 1];  // dequantised W tile: ws[k][m]
    const int n0 = blockIdx.y * kI8Tile, m0 = blockIdx.x * kI8Tile;
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kI8Threads + tx;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += kI8K) {
        for (int i = tid; i < kI8Tile * kI8K; i += kI8Threads * kI8Threads) {
            const int r = i / kI8K, k = i % kI8K;  // consecutive threads read consecutive k
            const int n = n0 + r, m = m0 + r, kk = k0 + k;
            xs[k][r] = (n < N && kk < K) ? to_float(X[size_t(n) * K + kk]) : 0.0f;
            float w = 0.0f;
            if (m < M && kk < K)
                w = kTransposed ? float(q[size_t(m) * K + kk]) * scale[m]
                                : float(q[size_t(kk) * M + m]) * scale[kk];
            ws[k][r] = w;
        }
        __syncthreads();
        for (int k = 0; k < kI8K; ++k) {
            float xv[4], wv[4];
            for (int i = 0; i < 4; ++i) xv[i] = xs[k][ty * 4 + i], wv[i] = ws[k][tx * 4 + i];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] += xv[i] * wv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        const int n = n0 + ty * 4 + i;
        if (n >= N) continue;
        for (int j = 0; j < 4; ++j) {
            const int m = m0 + tx * 4 + j;
            if (m >= M) continue;
            float v = acc[i][j] + (bias ? to_float(bias[m]) : 0.0f);
            T* o = out + size_t(n) * M + m;
            if (accumulate) v += to_float(*o);
            *o = from_float<T>(v);
        }
    }
}

template <bool kTransposed>
void launch_matmul_int8(DType dt, void* out, const void* X, const int8_t* q, const float* scale,
                        const void* bias, int N, int K, int M, bool accumulate, cudaStream_t s) {
    const dim3 grid(ceil_div(M, kI8Tile), ceil_div(N, kI8Tile)), block(kI8Threads, kI8Threads);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        matmul_int8_kernel<T, kTransposed>
            <<<grid, block, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(X), q, scale,
                                    static_cast<const T*>(bias), N, K, M, accumulate);
    });
    CUDA_CHECK_LAUNCH("matmul_int8_kernel");
}
}  // namespace

void matmul_int8_forward(DType dt, void* out, const void* inp, const int8_t* weight,
                         const float* scale, const void* bias, int N, int C, int OC,
                         cudaStream_t s) {
    launch_matmul_int8<true>(dt, out, inp, weight, scale, bias, N, C, OC, false, s);
}

void matmul_int8_backward(DType dt, void* dinp, float* dbias, const void* dout,
                          const int8_t* weight, const float* scale, int N, int C, int OC,
                          cudaStream_t s) {
    if (dinp) launch_matmul_int8<false>(dt, dinp, dout, weight, scale, nullptr, N, OC, C, true, s);
    if (dbias) bias_backward(dt, dbias, dout, N, OC, s);
}

// ---- LoRA ---------------------------------------------------------------------------------
// The adapter's thin GEMMs through cuBLASLt like the base layer's, in the same transposed
// column-major view (see the top of this file); the (N,R) intermediate is scaled in place by a
// pointwise kernel (lt_matmul's alpha is 1).
namespace {
template <class T>
__global__ void scale_kernel(T* x, size_t n, float s) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        x[i] = from_float<T>(to_float(x[i]) * s);
}
void scale_in_place(DType dt, void* x, size_t n, float scale, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        scale_kernel<T><<<std::min<unsigned>(ceil_div(n, 256), 4096), 256, 0, s>>>(
            static_cast<T*>(x), n, scale);
    });
    CUDA_CHECK_LAUNCH("scale_kernel");
}
// D (m x n) (+)= op(A) op(B) with no epilogue. A small rank makes leading dimensions (R
// elements) that cuBLASLt's kernels may not take; the classic cublasGemmEx (on the backend's
// stream, set once by the backend) takes any.
void gemm_any(BlasContext& ctx, cudaStream_t s, bool transa, bool transb, int m, int n, int k,
              const void* A, cudaDataType_t ta, int lda, const void* B, cudaDataType_t tb, int ldb,
              void* D, cudaDataType_t td, int ldd, float beta) {
    if (lt_matmul(ctx, s, transa, transb, m, n, k, A, ta, lda, B, tb, ldb, D, td, ldd, beta,
                  CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0))
        return;
    cublas_gemm(ctx, transa, transb, m, n, k, A, ta, lda, B, tb, ldb, D, td, ldd, beta);
}
}  // namespace

void lora_forward(BlasContext& ctx, void* out, void* u, const void* inp, const void* A,
                  const void* B, int N, int C, int OC, int R, float scale, cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    // u^T (R x N) = A (R x C) . inp^T (C x N): A stored (C x R) op T, inp stored (C x N).
    gemm_any(ctx, s, true, false, R, N, C, A, t, C, inp, t, C, u, t, R, 0.0f);
    scale_in_place(dtype_of(ctx.precision), u, size_t(N) * R, scale, s);
    // out^T (OC x N) += B (OC x R) . u^T (R x N): B stored (R x OC) op T, u stored (R x N).
    gemm_any(ctx, s, true, false, OC, N, R, B, t, R, u, t, R, out, t, OC, 1.0f);
}

void lora_backward(BlasContext& ctx, void* dinp, float* dA, float* dB, void* du, const void* dout,
                   const void* inp, const void* u, const void* A, const void* B, int N, int C,
                   int OC, int R, float scale, cudaStream_t s) {
    const cudaDataType_t t = ctx.act_type();
    // dB^T (R x OC) += u^T (R x N) . dout (N x OC): u stored (R x N), dout stored (OC x N) op T.
    gemm_any(ctx, s, false, true, R, OC, N, u, t, R, dout, t, OC, dB, CUDA_R_32F, R, 1.0f);
    // du^T (R x N) = B^T (R x OC) . dout^T (OC x N): B stored (R x OC), dout stored (OC x N).
    gemm_any(ctx, s, false, false, R, N, OC, B, t, R, dout, t, OC, du, t, R, 0.0f);
    scale_in_place(dtype_of(ctx.precision), du, size_t(N) * R, scale, s);
    // dA^T (C x R) += inp^T (C x N) . du (N x R): inp stored (C x N), du stored (R x N) op T.
    gemm_any(ctx, s, false, true, C, R, N, inp, t, C, du, t, R, dA, CUDA_R_32F, C, 1.0f);
    // dinp^T (C x N) += A^T (C x R) . du^T (R x N): A stored (C x R), du stored (R x N).
    if (dinp) gemm_any(ctx, s, false, false, C, N, R, A, t, C, du, t, R, dinp, t, C, 1.0f);
}

}  // namespace mt::cuda

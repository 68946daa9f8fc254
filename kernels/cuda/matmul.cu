// Linear layers through cuBLASLt. Row-major (N,C) activations are column-major (C x N)
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

}  // namespace

void matmul_forward(BlasContext& ctx, void* out, const void* inp, const void* weight,
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

void matmul_backward(BlasContext& ctx, void* dinp, float* dweight, float* dbias, const void* dout,
                     const void* inp, const void* weight, int N, int C, int OC, cudaStream_t s) {
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

}  // namespace mt::cuda

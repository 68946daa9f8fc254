// cuBLAS / cuBLASLt context of the CUDA backend and the Linear-layer GEMMs (the matmul ladder).
#pragma once

#include <map>
#include <tuple>

#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

// Everything a GEMM needs: the handles, the cuBLASLt workspace (reserved once by the backend,
// category `workspace`) and the precision that picks types and the compute mode.
struct BlasContext {
    cublasHandle_t blas = nullptr;  // classic API (strided-batched attention GEMMs)
    cublasLtHandle_t lt = nullptr;
    void* lt_workspace = nullptr;
    size_t lt_workspace_bytes = 0;
    Precision precision = Precision::fp32;
    // Heuristic results cached per (shape, types, epilogue, alignment): asking cuBLASLt's
    // heuristic costs tens of microseconds, far more than a launch.
    std::map<std::tuple<int, int, int, int, int, int, int, int, int, int, int, int>,
             cublasLtMatmulAlgo_t>
        algo_cache;
    std::map<std::tuple<int, int, int, int, int, int, int, int, int, int, int, int>, bool>
        unsupported;

    cublasComputeType_t compute_type() const {
        return precision == Precision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    }
    cudaDataType_t act_type() const {
        return precision == Precision::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    }
};

// The Linear layer, by the step of the matmul ladder `impl` (kernels.matmul; auto = cublaslt):
// naive and tiled are our own kernels (fp32 math whatever the precision), cublas the classic
// cublasGemmEx, cublaslt cuBLASLt with its epilogues (matmul.cu says what each teaches).
// out (N,OC) = inp (N,C) W^T (+ bias); with gelu: pre_act = inp W^T + bias, out = gelu(pre_act).
void matmul_forward(BlasContext& ctx, MatmulImpl impl, void* out, const void* inp,
                    const void* weight, const void* bias, int N, int C, int OC, bool gelu,
                    void* pre_act, cudaStream_t s);
// dinp += dout W; dweight += dout^T inp (fp32); dbias += sum_n dout. Null pointers are skipped.
void matmul_backward(BlasContext& ctx, MatmulImpl impl, void* dinp, float* dweight, float* dbias,
                     const void* dout, const void* inp, const void* weight, int N, int C, int OC,
                     cudaStream_t s);

// model.quantize_frozen: int8. W = scale * q (OC,C), dequantised inside a tiled kernel.
void matmul_int8_forward(DType dt, void* out, const void* inp, const int8_t* weight,
                         const float* scale, const void* bias, int N, int C, int OC,
                         cudaStream_t s);
void matmul_int8_backward(DType dt, void* dinp, float* dbias, const void* dout,
                          const int8_t* weight, const float* scale, int N, int C, int OC,
                          cudaStream_t s);
// model.lora: u = scale inp A^T; out += u B^T (see op::LoraForward / LoraBackward).
void lora_forward(BlasContext& ctx, void* out, void* u, const void* inp, const void* A,
                  const void* B, int N, int C, int OC, int R, float scale, cudaStream_t s);
void lora_backward(BlasContext& ctx, void* dinp, float* dA, float* dB, void* du, const void* dout,
                   const void* inp, const void* u, const void* A, const void* B, int N, int C,
                   int OC, int R, float scale, cudaStream_t s);

}  // namespace mt::cuda

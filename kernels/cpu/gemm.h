// The CPU GEMM engine under matmul.cpp: C (M,N) (+)= A (M,K) B (K,N), fp32, row-major buffers.
//
// The ladder of kernels.matmul, side by side in gemm.cpp, each step what the next one fixes:
// - gemm_naive: one output at a time, a dot product straight from memory (no reuse);
// - gemm_blocked: cache-blocked loops the compiler vectorises (reuse from L1/L2, no packing);
// - gemm_packed: our own packed GEMM with an AVX-512 12x32 register micro-kernel (compiled
//   where the compiler targets AVX-512F; the default there);
// - gemm_eigen ("blas"): Eigen's GEMM on shape-determined pieces, what a framework would call
//   (the portable fallback, and the peer bench/cpu_gemm.cpp measures the packed one against).
// All give results that do not depend on the thread count (the sum over k is split into chunks
// that depend only on K, and threads split only M and N).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace mt::cpu {

// One GEMM operand: a row-major buffer with leading dimension `ld` (elements between rows),
// holding either the logical matrix (transposed = false) or its transpose (transposed = true).
// Logical A (M,K): A[i,k] = data[i*ld + k], or data[k*ld + i] when transposed.
// Logical B (K,N): B[k,j] = data[k*ld + j], or data[j*ld + k] when transposed.
struct GemmOperand {
    const float* data;
    long ld;
    bool transposed;
};

// An int8 operand with one fp32 scale per stored row (model.quantize_frozen: int8, symmetric
// per output channel): the stored matrix S (rows, ld) has S[r,c] = scale[r] * q[r*ld + c].
// As B: logical B (K,N) = S (transposed = false: scale per k) or S^T (transposed = true, a
// PyTorch weight (OC,C) read as W^T: scale per column j).
struct GemmInt8Operand {
    const int8_t* q;
    const float* scale;
    long ld;
    bool transposed;
};

// C (M,N), row-major with leading dimension ldc:  C = A B  (accumulate = false)  or  C += A B.
// Uses gemm_packed where it is compiled, else gemm_eigen.
void gemm(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc, bool accumulate);

void gemm_eigen(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate);
void gemm_naive(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate);
void gemm_blocked(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                  bool accumulate);

// The ladder step `impl` (naive, blocked, packed or blas; auto = gemm()). Throws
// std::logic_error for a CUDA step or packed where it is not compiled.
void gemm(MatmulImpl impl, int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
          bool accumulate);
// What `auto` resolves to in this build: packed where it is compiled (and no BLAS was asked
// for), else blas.
MatmulImpl gemm_fastest();

// C (+)= A B with an int8 B, dequantised where B is read: gemm_packed converts int8 to fp32 and
// applies the scales while packing B's panels (the weight crosses memory at 1 byte per element
// and the micro-kernel is the fp32 one); the Eigen fallback dequantises B tile by tile.
void gemm_int8(int M, int N, int K, GemmOperand A, GemmInt8Operand B, float* C, long ldc,
               bool accumulate);

// False where the build does not target AVX-512F; gemm_packed then throws std::logic_error.
bool gemm_packed_available();
void gemm_packed(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                 bool accumulate);

// "packed-avx512" or "eigen": what gemm() runs, for reports and probes.
const char* gemm_impl_name();

}  // namespace mt::cpu

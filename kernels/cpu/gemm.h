// The CPU GEMM engine under matmul.cpp: C (M,N) (+)= A (M,K) B (K,N), fp32, row-major buffers.
//
// The ladder of kernels.matmul, side by side in gemm.cpp, each step what the next one fixes:
// - gemm_naive: one output at a time, a dot product straight from memory (no reuse);
// - gemm_blocked: cache-blocked loops the compiler vectorises (reuse from L1/L2, no packing);
// - gemm_packed: our own packed GEMM, on the avx512 level with a 12x32 register micro-kernel
//   (24 zmm accumulators), on the avx2 level with a 6x16 one (12 ymm); the default on both;
// - gemm_eigen ("blas"): Eigen's GEMM on shape-determined pieces, what a framework would call
//   (the baseline level's GEMM, and the peer bench/cpu_gemm.cpp measures the packed one against).
// All give results that do not depend on the thread count (the sum over k is split into chunks,
// and gemm_packed's long sums into slices, that depend only on the shape; threads split only M
// and N, or take whole slices).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace mt::cpu {

// The operand types live in a namespace of their own, not in mt::cpu: argument-dependent lookup
// would otherwise find the dispatched mt::cpu::gemm* beside a level's own (an ambiguous call
// inside every level, which declares the same functions in mt::cpu::isa_<level>).
namespace gemm_operands {

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

}  // namespace gemm_operands
using gemm_operands::GemmInt8Operand;
using gemm_operands::GemmOperand;

#include "kernels/cpu/gemm_api.inc"

#if defined(MT_CPU_LEVEL_NS)
namespace MT_CPU_LEVEL_NS {
#include "kernels/cpu/gemm_api.inc"
}  // namespace MT_CPU_LEVEL_NS
#endif

}  // namespace mt::cpu

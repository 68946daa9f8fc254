// KernelTable: one ISA level's CPU kernels as function pointers (ggml's op-table idea), the one
// door between the backend glue (compiled for plain x86-64) and the kernels compiled once per
// level (kernels/cpu/*.cpp but cpu_backend.cpp, cpu_isa.cpp and dispatch.cpp).
//
// Why a table and not just three namespaces: each level's translation units are compiled with
// that level's -march, and everything they instantiate from a header (Eigen's templates, our
// inline helpers in kernels/math.h, fast_math.h) gets the SAME mangled name in every level but
// different instructions. A static link keeps one copy of each such (COMDAT) function, so the
// baseline level could end up running AVX-512 code: SIGILL on an AVX2 machine, an ODR violation
// no test on an AVX-512 machine notices. CMakeLists.txt therefore links each level's objects into
// one relocatable object and makes every symbol in it local except its kernel_table() (see
// "CPU ISA levels" there); tools/check-cpu-levels.sh proves it on every build (ctest
// cpu_isa_levels). Everything else reaches a level through the table kernel_table() returns.
#pragma once

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

namespace mt::cpu {

// The kernels of kernels_api.inc and gemm_api.inc, by name, in the table's order (gemm has two
// overloads: the table holds the ladder one, gemm(MatmulImpl, ...), as `gemm` below).
#define MT_CPU_KERNEL_TABLE(X)          \
    X(encoder_forward)                  \
    X(encoder_backward)                 \
    X(layernorm_forward)                \
    X(layernorm_backward)               \
    X(fused_residual_layernorm_forward) \
    X(matmul_forward)                   \
    X(matmul_forward_gelu)              \
    X(matmul_backward)                  \
    X(matmul_int8_forward)              \
    X(matmul_int8_backward)             \
    X(lora_forward)                     \
    X(lora_backward)                    \
    X(attention_forward_naive)          \
    X(attention_backward_naive)         \
    X(attention_forward_flash)          \
    X(attention_backward_flash)         \
    X(gelu_forward)                     \
    X(gelu_backward)                    \
    X(residual_forward)                 \
    X(residual_backward)                \
    X(classifier_fused)                 \
    X(softmax_forward)                  \
    X(crossentropy_forward)             \
    X(crossentropy_softmax_backward)    \
    X(sum_scaled)                       \
    X(global_norm_squared)              \
    X(clip_scale)                       \
    X(adamw_unfused_workspace_elems)    \
    X(adamw_unfused)                    \
    X(adamw_multi_tensor)               \
    X(adamw_fused)                      \
    X(exp_shift_sum)                    \
    X(exp_shift_sum_inplace)            \
    X(gemm_eigen)                       \
    X(gemm_naive)                       \
    X(gemm_blocked)                     \
    X(gemm_fastest)                     \
    X(gemm_int8)                        \
    X(gemm_packed_available)            \
    X(gemm_packed)                      \
    X(gemm_impl_name)

struct KernelTable {
#define MT_CPU_KERNEL_POINTER(name) decltype(&::mt::cpu::name) name;
    MT_CPU_KERNEL_TABLE(MT_CPU_KERNEL_POINTER)
#undef MT_CPU_KERNEL_POINTER
    void (*gemm)(MatmulImpl impl, int M, int N, int K, GemmOperand A, GemmOperand B, float* C,
                 long ldc, bool accumulate);
};

// Each level's table (kernel_table.cpp, compiled once per level): the only global symbol of its
// object. Which levels exist: cpu_isa.h.
namespace isa_baseline {
const KernelTable& kernel_table();
}
#if defined(__x86_64__)
namespace isa_avx2 {
const KernelTable& kernel_table();
}
namespace isa_avx512 {
const KernelTable& kernel_table();
}
#endif

}  // namespace mt::cpu

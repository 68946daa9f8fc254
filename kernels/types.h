// The vocabulary every layer above the kernels shares: backend kinds, precisions, kernel
// implementation choices (the YAML `kernels:` section), memory categories, and the errors a
// backend throws. Plain C++, no dependencies, so the op table (kernels/ops.h), the model, the
// harness and both backends can all include it.
#pragma once

#include <array>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/enum_names.h"

namespace mt {

// ---- enums shared by config, backend and reports --------------------------------------------

enum class BackendKind { cpu, cuda };
enum class Precision { fp32, tf32, bf16 };
// flash_tc: flash on the tensor cores (CUDA, bf16, head size 64 or 128).
enum class AttentionImpl { naive, flash, cudnn, flash_tc };
enum class ClassifierImpl { unfused, fused };
enum class AdamWImpl { unfused, multi_tensor, fused };
enum class LayerNormImpl { separate, fused_residual };  // fused_residual: residual add + LN
enum class MatmulEpilogue { none, gelu };               // gelu: out = gelu(x W^T + b)
// The GEMM under the matmul ops (kernels.matmul), a ladder per backend. auto: the backend's
// fastest (packed on the CPU's avx512 and avx2 ISA levels, blas on baseline; cublaslt on CUDA).
// CPU: naive | blocked | packed | blas.  CUDA: naive | tiled | cublas | cublaslt.
enum class MatmulImpl { auto_, naive, blocked, packed, blas, tiled, cublas, cublaslt };
// How the LayerNorm forward computes a row's statistics (kernels.layernorm_forward).
// two_pass: mean, then the variance from a second read of the row (the row is in cache);
// welford: one read, a running (count, mean, M2) merged across lanes; thread_per_row (CUDA
// only): one thread walks a whole row, two-pass: uncoalesced loads, the coalescing lesson.
enum class LayerNormForwardImpl { two_pass, welford, thread_per_row };
// How the memory-bound CUDA kernels (GELU, residual, the two_pass LayerNorm forwards, the
// encoder forward) move their data (kernels.memory_access): scalar (one element per load)
// or packed128 (16 bytes per load/store, streaming cache hints; kernels/cuda/packed128.cuh).
// CUDA only: the CPU backend's vector width is its ISA level (MT_CPU_ISA).
enum class MemoryAccess { scalar, packed128 };

// Every allocation is tagged with one of these; current and peak bytes are tracked per category.
enum class MemoryCategory : int { params, grads, optimizer, activations, workspace, data };
inline constexpr int kMemoryCategoryCount = 6;

// Spellings (kernels/enum_names.h), as the YAML file, the reports and results.json write them.
template <>
struct EnumSpelling<BackendKind> {
    static constexpr std::array<std::string_view, 2> names{"cpu", "cuda"};
};
template <>
struct EnumSpelling<Precision> {
    static constexpr std::array<std::string_view, 3> names{"fp32", "tf32", "bf16"};
};
template <>
struct EnumSpelling<AttentionImpl> {
    static constexpr std::array<std::string_view, 4> names{"naive", "flash", "cudnn", "flash_tc"};
};
template <>
struct EnumSpelling<ClassifierImpl> {
    static constexpr std::array<std::string_view, 2> names{"unfused", "fused"};
};
template <>
struct EnumSpelling<AdamWImpl> {
    static constexpr std::array<std::string_view, 3> names{"unfused", "multi_tensor", "fused"};
};
template <>
struct EnumSpelling<LayerNormImpl> {
    static constexpr std::array<std::string_view, 2> names{"separate", "fused_residual"};
};
template <>
struct EnumSpelling<MatmulImpl> {
    static constexpr std::array<std::string_view, 8> names{"auto", "naive", "blocked", "packed",
                                                           "blas", "tiled", "cublas",  "cublaslt"};
};
template <>
struct EnumSpelling<LayerNormForwardImpl> {
    static constexpr std::array<std::string_view, 3> names{"two_pass", "welford", "thread_per_row"};
};
template <>
struct EnumSpelling<MemoryAccess> {
    static constexpr std::array<std::string_view, 2> names{"scalar", "packed128"};
};
template <>
struct EnumSpelling<MemoryCategory> {
    static constexpr std::array<std::string_view, kMemoryCategoryCount> names{
        "params", "grads", "optimizer", "activations", "workspace", "data"};
};
// to_string(e): the spelling as a C string (every spelling is a literal, so NUL-terminated).
template <class E>
requires requires {
    EnumSpelling<E>::names;
}
const char* to_string(E e) {
    return enum_name(e).data();
}

// Which implementation each op family uses (the YAML `kernels:` section). One copy, owned by
// the backend (BackendOptions::kernels), which refuses at construction what it cannot run; the
// model reads it from there (Backend::kernel_choice) to pick its call sequence (classifier,
// layernorm, fuse_gelu) and the variant its attention ops name, and the backend's kernels read
// the ladder steps (matmul, layernorm_forward) through Backend::matmul_impl and
// Backend::layernorm_forward_impl.
struct KernelChoice {
    AttentionImpl attention = AttentionImpl::naive;
    ClassifierImpl classifier = ClassifierImpl::fused;
    LayerNormImpl layernorm = LayerNormImpl::separate;
    bool fuse_gelu = false;  // matmul with the GELU epilogue for c_fc
    MatmulImpl matmul = MatmulImpl::auto_;
    LayerNormForwardImpl layernorm_forward = LayerNormForwardImpl::two_pass;
    MemoryAccess memory_access = MemoryAccess::scalar;
};

// kernels.attention: flash_tc (the CUDA tensor-core flash attention, bf16) has kernels for these
// head sizes (n_embd / n_head); the spec refuses the others at validation.
inline bool flash_tc_supports_head_size(int hs) {
    return hs == 64 || hs == 128;
}

// The ladder steps each backend has (the others are refused with the list of these).
inline bool is_cpu_matmul(MatmulImpl m) {
    return m == MatmulImpl::auto_ || m == MatmulImpl::naive || m == MatmulImpl::blocked ||
           m == MatmulImpl::packed || m == MatmulImpl::blas;
}
inline bool is_cuda_matmul(MatmulImpl m) {
    return m == MatmulImpl::auto_ || m == MatmulImpl::naive || m == MatmulImpl::tiled ||
           m == MatmulImpl::cublas || m == MatmulImpl::cublaslt;
}

// The most CPU threads any entry may ask for (run.threads, --threads, num_threads): far above any
// machine's cores, far below what makes the OpenMP runtime fail to create its team. Checked
// where a count comes in: the spec's key table (run.threads) and the --threads flags that bypass
// it (`train --one-batch`, `step`, the benches). Below them, the engine's entry
// (create_training_backend, std::invalid_argument) and the CPU backend (BackendError) refuse a
// count that came another way, both in thread_count_error's words.
inline constexpr int kMaxThreads = 1024;
// Why `threads`, the value of the entry's `field`, is not a thread count (0..kMaxThreads); ""
// when it is one.
std::string thread_count_error(std::string_view field, int threads);

struct BackendOptions {
    Precision precision = Precision::fp32;
    KernelChoice kernels;  // the run's kernel choices: the only copy (see KernelChoice)
    int num_threads = 0;   // CPU: OpenMP threads (0 = OpenMP's default), at most kMaxThreads
    int device_index = 0;  // CUDA device
};

// ---- errors ---------------------------------------------------------------------------------

// Thrown by a backend for an impossible request (bad shape, unsupported precision...).
struct BackendError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// Thrown by allocate() when a category cannot get its bytes; the message names the category,
// the bytes asked, what is free and total, so the user knows what to shrink.
struct OutOfMemoryError : BackendError {
    using BackendError::BackendError;
};

}  // namespace mt

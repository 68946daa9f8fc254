// Packed128<T>: 16 bytes of elements moved by ONE load or store instruction (kernels.memory_access:
// packed128). 16 bytes = 4 fp32 or 8 bf16.
//
// Why 128-bit accesses help a memory-bound kernel. A kernel like GELU or the residual add does a
// few flops per element and moves 2-3 elements; its time is bytes / bandwidth, if the GPU can
// keep enough bytes in flight. With one fp32 (4 B) per thread and instruction, a warp asks for
// 128 B per load instruction; with 16 B per thread, 512 B: the same bytes need 4x fewer load
// instructions (8x fewer for bf16, whose scalar loads move only 2 B), 4x fewer address
// computations, and 4x fewer memory requests that each SM must track while they are in flight.
// HBM3 on an H100 needs tens of KiB in flight per SM to approach its roof (bandwidth x latency);
// the scalar kernels reach it only with many resident warps, the packed ones with few. Every 8
// consecutive threads of a warp cover one full 128-byte line, so each request is whole
// 32-byte sectors, none half-used. The SASS shows it: LDG.E.128 / STG.E.128 instead of LDG.E /
// LDG.E.U16.
//
// What it does NOT change: the bytes. GELU forward still moves 8 B per element in fp32 (read 4,
// write 4) and 4 B in bf16; the residual add 12 / 6 B; the LayerNorm forward ~8 / 4 B (its
// re-reads of a row hit L1). The gain, where there is one, is in achieved GB/s: how close the
// kernel gets to the HBM roof (~3.35 TB/s H100 SXM, ~4.8 TB/s H200), which the per-op table's
// memory-bound rows show. A kernel already at the roof gains nothing.
//
// Cache hints (the *cs variants: "cache streaming", PTX ld.global.cs / st.global.cs, CUDA's
// __ldcs / __stcs). Data read or written once by this kernel, and not soon again, is marked
// evict-first: the L2 lets those lines go first, so what IS reused (the LayerNorm weight and
// bias, read by every row; the embedding rows of frequent tokens) stays resident. It is a hint
// only (the SASS carries .EF); the results are the same bits either way. Plain load128 /
// store128 keep the default policy: use them for data that is reused, or read soon after
// (a LayerNorm output goes straight into the next matmul).
//
// Requirements, checked by the launchers (packed128.cu) before they take this path: every
// pointer 16-byte aligned (cudaMalloc gives 256, but a tensor at an offset inside a buffer need
// not be: a LoRA of odd rank shifts what follows it) and, for row-wise kernels, the row length a
// multiple of the pack width (so every row starts aligned). Otherwise the launcher runs the
// scalar kernel, which computes the same elementwise bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/runtime.cuh"

namespace mt::cuda {

// 16 bytes of T, loaded and stored as one int4 (a 128-bit register quadruple). Element access
// is by index into the bytes; the compiler keeps the pack in registers (no local memory) as long
// as the loops over it are unrolled with constant bounds, as every use below does.
template <class T>
struct alignas(16) Packed128 {
    static constexpr int size = int(sizeof(int4) / sizeof(T));  // 4 fp32 or 8 bf16
    T payload[size];

    __device__ __forceinline__ static Packed128 bit_cast(int4 bits) {
        Packed128 p;
        static_assert(sizeof(Packed128) == sizeof(int4));
        memcpy(&p, &bits, sizeof(int4));  // a register move, not a copy through memory
        return p;
    }
    __device__ __forceinline__ int4 bits() const {
        int4 b;
        memcpy(&b, this, sizeof(int4));
        return b;
    }
    __device__ __forceinline__ T& operator[](int i) { return payload[i]; }
    __device__ __forceinline__ const T& operator[](int i) const { return payload[i]; }
};

// The pack width of T, for host code sizing grids and checking row lengths.
template <class T>
inline constexpr int kPackSize = int(sizeof(int4) / sizeof(T));

// Load / store 16 bytes at `p` (16-byte aligned). Default cache policy: for reused data.
template <class T>
__device__ __forceinline__ Packed128<T> load128(const T* p) {
    return Packed128<T>::bit_cast(*reinterpret_cast<const int4*>(p));
}
template <class T>
__device__ __forceinline__ void store128(T* p, Packed128<T> v) {
    *reinterpret_cast<int4*>(p) = v.bits();
}
// Streaming variants (evict-first in L2): for data this kernel reads or writes once.
template <class T>
__device__ __forceinline__ Packed128<T> load128cs(const T* p) {
    return Packed128<T>::bit_cast(__ldcs(reinterpret_cast<const int4*>(p)));
}
template <class T>
__device__ __forceinline__ void store128cs(T* p, Packed128<T> v) {
    __stcs(reinterpret_cast<int4*>(p), v.bits());
}

// Host: is `p` (null allowed: no access) on a 16-byte boundary?
inline bool aligned16(const void* p) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

}  // namespace mt::cuda

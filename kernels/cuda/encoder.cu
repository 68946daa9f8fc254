// Token + position embedding, forward and backward.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

// Embedding gather: out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]. One thread per output element;
// consecutive threads read consecutive channels of one embedding row (coalesced).
template <class T>
__global__ void encoder_forward_kernel(T* out, const int* inp, const T* wte, const T* wpe, int B,
                                       int T_, int C) {
    const size_t n = size_t(B) * T_ * C;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t bt = i / C;
        const int c = static_cast<int>(i % C);
        const int t = static_cast<int>(bt % T_);
        const int tok = inp[bt];
        out[i] =
            from_float<T>(to_float(wte[size_t(tok) * C + c]) + to_float(wpe[size_t(t) * C + c]));
    }
}

// ---- token-embedding gradient, deterministic ------------------------------------------------
// dwte[inp[b,t],:] += dout[b,t,:] is a scatter-add: repeated tokens hit the same row. fp32
// atomics would make the order of the additions (and so the last bits) vary run to run. Instead,
// per chunk of at most kEncoderBackwardChunk positions (as llm.c's encoder backward, but on the
// device, with no host sync):
//   1. pos[i] = i; CUB's radix sort of the (token, position) pairs by token. It is stable, so
//      within one token the positions stay in increasing order, and deterministic;
//   2. one block per run of equal tokens (the block at the run's first sorted index) adds the
//      run's dout rows into the token's dwte row in that order, one thread per channel.
// Each dwte row is written by one block, with no atomics. Chunks run in order on the stream, so
// every row receives its positions in increasing (b,t) order: exactly the CPU backend's order
// (kernels/cpu/encoder.cpp), and the same bits every run.
constexpr int kEncoderBackwardChunk = 1 << 16;

__global__ void encoder_iota_kernel(int* out, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = i;
}

// Block i: nothing unless sorted index i starts a run of its token; then, for each channel c of
// the thread, row[c] += dout[pos[j], c] for j over the run, in sorted (= position) order.
template <class T>
__global__ void encoder_backward_wte_runs_kernel(float* dwte, const T* dout, const int* tok_sorted,
                                                 const int* pos_sorted, int n, int C) {
    const int i = blockIdx.x;
    const int tok = tok_sorted[i];
    if (i > 0 && tok_sorted[i - 1] == tok) return;  // not the first of its run
    int end = i + 1;
    while (end < n && tok_sorted[end] == tok) ++end;
    float* row = dwte + size_t(tok) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];  // the += rule, and the CPU's order: row, then each position
#pragma unroll 4
        for (int j = i; j < end; ++j) acc += to_float(dout[size_t(pos_sorted[j]) * C + c]);
        row[c] = acc;
    }
}

namespace {

size_t align256(size_t bytes) {
    return (bytes + 255) & ~size_t(255);
}

// CUB's temporary storage for sorting n (int token, int position) pairs (a host-side query).
size_t sort_temp_bytes(int n) {
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, bytes, static_cast<const int*>(nullptr), static_cast<int*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), n));
    return bytes;
}

// The workspace, carved in 256-byte aligned pieces: sorted tokens, positions, sorted
// positions (kEncoderBackwardChunk ints each), then CUB's temporary storage.
struct EncoderScratch {
    int *tok_sorted, *pos, *pos_sorted;
    void* sort_temp;
    size_t sort_temp_bytes;
};
EncoderScratch carve(void* workspace, size_t bytes) {
    const size_t ints = align256(size_t(kEncoderBackwardChunk) * sizeof(int));
    char* p = static_cast<char*>(workspace);
    if (bytes < 3 * ints)
        throw BackendError("encoder_backward: the workspace is smaller than its index arrays");
    return {reinterpret_cast<int*>(p), reinterpret_cast<int*>(p + ints),
            reinterpret_cast<int*>(p + 2 * ints), p + 3 * ints, bytes - 3 * ints};
}

template <class E>
void encoder_backward_wte(float* dwte, const E* dout, const int* inp, size_t N, int C,
                          const EncoderScratch& w, cudaStream_t s) {
    const int first_chunk = static_cast<int>(std::min<size_t>(N, kEncoderBackwardChunk));
    encoder_iota_kernel<<<ceil_div(first_chunk, 256), 256, 0, s>>>(w.pos, first_chunk);
    CUDA_CHECK_LAUNCH("encoder_iota_kernel");
    const int threads = std::min(1024, std::max(32, (C + 31) / 32 * 32));
    for (size_t first = 0; first < N; first += kEncoderBackwardChunk) {
        const int n = static_cast<int>(std::min<size_t>(N - first, kEncoderBackwardChunk));
        size_t temp = w.sort_temp_bytes;
        if (sort_temp_bytes(n) > temp)
            throw BackendError("encoder_backward: CUB needs more sort storage than reserved");
        CUDA_CHECK(cub::DeviceRadixSort::SortPairs(w.sort_temp, temp, inp + first, w.tok_sorted,
                                                   static_cast<const int*>(w.pos), w.pos_sorted, n,
                                                   0, int(sizeof(int) * 8), s));
        encoder_backward_wte_runs_kernel<E>
            <<<n, threads, 0, s>>>(dwte, dout + first * C, w.tok_sorted, w.pos_sorted, n, C);
        CUDA_CHECK_LAUNCH("encoder_backward_wte_runs_kernel");
    }
}

}  // namespace

size_t encoder_backward_workspace_bytes() {
    return 3 * align256(size_t(kEncoderBackwardChunk) * sizeof(int)) +
           align256(sort_temp_bytes(kEncoderBackwardChunk));
}

// Position-embedding gradient: dwpe[t,c] += sum_b dout[b,t,c]. Every (t,c) is owned by one
// thread that walks the batch in order: deterministic, no atomics, and (starting from dwpe[t,c])
// the CPU backend's order of additions.
template <class T>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const T* dout, int B, int T_, int C) {
    const size_t n = size_t(T_) * C;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float acc = dwpe[i];
        for (int b = 0; b < B; ++b) acc += to_float(dout[size_t(b) * n + i]);
        dwpe[i] = acc;
    }
}

void encoder_forward(DType dt, void* out, const int* inp, const void* wte, const void* wpe, int B,
                     int T, int C, cudaStream_t s) {
    const size_t n = size_t(B) * T * C;
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        encoder_forward_kernel<E><<<std::max(1u, ceil_div(n, 256)), 256, 0, s>>>(
            static_cast<E*>(out), inp, static_cast<const E*>(wte), static_cast<const E*>(wpe), B, T,
            C);
    });
    CUDA_CHECK_LAUNCH("encoder_forward_kernel");
}

void encoder_backward(DType dt, float* dwte, float* dwpe, const void* dout, const int* inp, int B,
                      int T, int C, void* workspace, size_t workspace_bytes, cudaStream_t s) {
    const EncoderScratch w = carve(workspace, workspace_bytes);
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        // A null gradient is a frozen embedding: its part is not run.
        if (dwte)
            encoder_backward_wte<E>(dwte, static_cast<const E*>(dout), inp, size_t(B) * T, C, w, s);
        if (!dwpe) return;
        encoder_backward_wpe_kernel<E><<<std::max(1u, ceil_div(size_t(T) * C, 256)), 256, 0, s>>>(
            dwpe, static_cast<const E*>(dout), B, T, C);
        CUDA_CHECK_LAUNCH("encoder_backward_wpe_kernel");
    });
}

}  // namespace mt::cuda

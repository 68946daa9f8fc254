// Token + position embedding, forward and backward.
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

// Token-embedding gradient: a scatter-add, dwte[inp[b,t],:] += dout[b,t,:]. Repeated tokens hit
// the same row, so this uses fp32 atomics: correct, but the summation order (and so the last
// bits) may vary run to run. A deterministic version would sort (token, position) pairs first.
template <class T>
__global__ void encoder_backward_wte_kernel(float* dwte, const T* dout, const int* inp, int B,
                                            int T_, int C) {
    const size_t n = size_t(B) * T_ * C;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const size_t bt = i / C;
        const int c = static_cast<int>(i % C);
        atomicAdd(&dwte[size_t(inp[bt]) * C + c], to_float(dout[i]));
    }
}

// Position-embedding gradient: dwpe[t,c] += sum_b dout[b,t,c]. Every (t,c) is owned by one
// thread that walks the batch in order: deterministic, no atomics.
template <class T>
__global__ void encoder_backward_wpe_kernel(float* dwpe, const T* dout, int B, int T_, int C) {
    const size_t n = size_t(T_) * C;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float acc = 0.0f;
        for (int b = 0; b < B; ++b) acc += to_float(dout[size_t(b) * n + i]);
        dwpe[i] += acc;
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
                      int T, int C, cudaStream_t s) {
    const size_t n = size_t(B) * T * C;
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        encoder_backward_wte_kernel<E><<<std::max(1u, ceil_div(n, 256)), 256, 0, s>>>(
            dwte, static_cast<const E*>(dout), inp, B, T, C);
        CUDA_CHECK_LAUNCH("encoder_backward_wte_kernel");
        encoder_backward_wpe_kernel<E><<<std::max(1u, ceil_div(size_t(T) * C, 256)), 256, 0, s>>>(
            dwpe, static_cast<const E*>(dout), B, T, C);
        CUDA_CHECK_LAUNCH("encoder_backward_wpe_kernel");
    });
}

}  // namespace mt::cuda

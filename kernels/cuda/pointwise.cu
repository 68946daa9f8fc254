// Elementwise kernels (GELU, residual, casts, the fallback matmul epilogue) and the bias-gradient
// column reduction. All are memory-bound: the comment on each says how many bytes per element
// it moves, which is all that decides its speed.
#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

namespace {
constexpr int kThreads = 256;
inline unsigned grid_for(size_t n) {
    return std::max(1u, std::min(ceil_div(n, kThreads), 1u << 20));
}
}  // namespace

// GELU forward: reads x, writes gelu(x): 2 elements of traffic per element (grid-stride loop).
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(math::gelu(to_float(inp[i])));
}

// GELU backward, accumulating: dinp += dout * gelu'(x); recomputes tanh instead of storing it.
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dinp[i] = from_float<T>(to_float(dinp[i]) +
                                to_float(dout[i]) * math::gelu_grad(to_float(inp[i])));
}

// Residual forward: out = a + b (3 elements of traffic per element).
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// Residual backward: the gradient flows unchanged into both branches (accumulated). The two
// destinations may alias (then the element receives 2*dout), so no __restrict__ here.
template <class T>
__global__ void residual_backward_kernel(T* d1, T* d2, const T* dout, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float g = to_float(dout[i]);
        d1[i] = from_float<T>(to_float(d1[i]) + g);
        d2[i] = from_float<T>(to_float(d2[i]) + g);
    }
}

// fp32 -> bf16 weight copy for bf16 compute: 6 bytes per parameter, once per optimizer step.
__global__ void cast_fp32_to_bf16_kernel(bf16* dst, const float* src, size_t n) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x)
        dst[i] = __float2bfloat16_rn(src[i]);
}

// Unfused matmul epilogue (what cuBLASLt's BIAS / GELU_AUX_BIAS epilogues save): one extra
// read + write of the (N,OC) output, plus one more write for the GELU output.
template <class T>
__global__ void bias_gelu_epilogue_kernel(T* x, T* gelu_out, const T* bias, int N, int OC) {
    const size_t n = size_t(N) * OC;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float v = to_float(x[i]);
        if (bias) v += to_float(bias[i % OC]);
        const T vt = from_float<T>(v);
        x[i] = vt;
        if (gelu_out) gelu_out[i] = from_float<T>(math::gelu(to_float(vt)));
    }
}

// Bias gradient: dbias[c] += sum_n dout[n,c]. A column reduction with a fixed order: block
// (32, 32) owns 32 adjacent columns (coalesced 128-byte row segments), each threadIdx.y sums
// every 32nd row, then a shared-memory tree over y. Deterministic (no atomics).
template <class T>
__global__ void bias_backward_kernel(float* dbias, const T* dout, int N, int OC) {
    __shared__ float part[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (c < OC)
        for (int n = threadIdx.y; n < N; n += 32) acc += to_float(dout[size_t(n) * OC + c]);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < OC) {
        float total = 0.0f;
        for (int y = 0; y < 32; ++y) total += part[y][threadIdx.x];
        dbias[c] += total;
    }
}

void gelu_forward(DType dt, void* out, const void* inp, size_t n, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_forward_kernel<T>
            <<<grid_for(n), kThreads, 0, s>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
    });
    CUDA_CHECK_LAUNCH("gelu_forward_kernel");
}

void gelu_backward(DType dt, void* dinp, const void* inp, const void* dout, size_t n,
                   cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_backward_kernel<T><<<grid_for(n), kThreads, 0, s>>>(
            static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n);
    });
    CUDA_CHECK_LAUNCH("gelu_backward_kernel");
}

void residual_forward(DType dt, void* out, const void* a, const void* b, size_t n, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        residual_forward_kernel<T><<<grid_for(n), kThreads, 0, s>>>(
            static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
    });
    CUDA_CHECK_LAUNCH("residual_forward_kernel");
}

void residual_backward(DType dt, void* d1, void* d2, const void* dout, size_t n, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        residual_backward_kernel<T><<<grid_for(n), kThreads, 0, s>>>(
            static_cast<T*>(d1), static_cast<T*>(d2), static_cast<const T*>(dout), n);
    });
    CUDA_CHECK_LAUNCH("residual_backward_kernel");
}

void cast_fp32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s) {
    cast_fp32_to_bf16_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, src, n);
    CUDA_CHECK_LAUNCH("cast_fp32_to_bf16_kernel");
}

void bias_gelu_epilogue(DType dt, void* x, void* gelu_out, const void* bias, int N, int OC,
                        cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        bias_gelu_epilogue_kernel<T><<<grid_for(size_t(N) * OC), kThreads, 0, s>>>(
            static_cast<T*>(x), static_cast<T*>(gelu_out), static_cast<const T*>(bias), N, OC);
    });
    CUDA_CHECK_LAUNCH("bias_gelu_epilogue_kernel");
}

void bias_backward(DType dt, float* dbias, const void* dout, int N, int OC, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        bias_backward_kernel<T>
            <<<ceil_div(OC, 32), dim3(32, 32), 0, s>>>(dbias, static_cast<const T*>(dout), N, OC);
    });
    CUDA_CHECK_LAUNCH("bias_backward_kernel");
}

}  // namespace mt::cuda

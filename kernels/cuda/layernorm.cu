// LayerNorm over the last dimension (eps 1e-5), forward, backward, and fused residual+LN.
// Forward and the dinp part of backward use one warp per row: the row statistics are warp
// shuffles (no shared memory, no __syncthreads). The parameter gradients are column
// reductions over all N rows, done by a second kernel with a fixed order (deterministic).
#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

namespace {
constexpr int kRowsPerBlock = 8;  // 8 warps = 256 threads, one row per warp
}

// LayerNorm forward: one warp per row; mean and variance by two passes over the row (the
// second pass hits L1/L2), stores mean/rstd (fp32) so backward does not recompute them.
template <class T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp,
                                         const T* weight, const T* bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;  // whole warp leaves together
    const T* x = inp + size_t(row) * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += to_float(x[c]);
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float d = to_float(x[c]) - m;
        var += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + math::kLayerNormEps);
    T* o = out + size_t(row) * C;
    for (int c = lane; c < C; c += 32)
        o[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// Residual add fused into LayerNorm: residual = a + b is written once and normalised while it
// is hot, saving the separate residual kernel's re-read of (N,C). Statistics use the stored
// (rounded, under bf16) residual, exactly what an unfused LayerNorm would read.
template <class T>
__global__ void fused_residual_layernorm_forward_kernel(T* residual, T* out, float* mean,
                                                        float* rstd, const T* a, const T* b,
                                                        const T* weight, const T* bias, int N,
                                                        int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const T r = from_float<T>(to_float(a[base + c]) + to_float(b[base + c]));
        residual[base + c] = r;
        sum += to_float(r);
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {  // same thread re-reads what it wrote: ordered
        const float d = to_float(residual[base + c]) - m;
        var += d * d;
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + math::kLayerNormEps);
    for (int c = lane; c < C; c += 32)
        out[base + c] = from_float<T>((to_float(residual[base + c]) - m) * r * to_float(weight[c]) +
                                      to_float(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// LayerNorm backward, input gradient: with xhat = (x - mean) rstd and g = dout * weight,
//   dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)).
// One warp per row, two shuffle reductions; accumulates into dinp.
template <class T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp,
                                               const T* weight, const float* mean,
                                               const float* rstd, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        const float xhat = (to_float(inp[base + c]) - m) * r;
        const float g = to_float(dout[base + c]) * to_float(weight[c]);
        sg += g;
        sgx += g * xhat;
    }
    sg = warp_sum(sg) / C;
    sgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        const float xhat = (to_float(inp[base + c]) - m) * r;
        const float g = to_float(dout[base + c]) * to_float(weight[c]);
        dinp[base + c] = from_float<T>(to_float(dinp[base + c]) + r * (g - sg - xhat * sgx));
    }
}

// LayerNorm backward, parameter gradients: dweight[c] += sum_n dout*xhat, dbias[c] += sum_n dout.
// Column reduction like the bias gradient: block (32,32) owns 32 columns, y strides the rows,
// fixed-order tree in shared memory. Recomputes xhat from inp, mean, rstd (no stored xhat).
template <class T>
__global__ void layernorm_backward_params_kernel(float* dweight, float* dbias, const T* dout,
                                                 const T* inp, const float* mean, const float* rstd,
                                                 int N, int C) {
    __shared__ float pw[32][33];
    __shared__ float pb[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float aw = 0.0f, ab = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += 32) {
            const size_t i = size_t(n) * C + c;
            const float d = to_float(dout[i]);
            aw += d * (to_float(inp[i]) - mean[n]) * rstd[n];
            ab += d;
        }
    pw[threadIdx.y][threadIdx.x] = aw;
    pb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float tw = 0.0f, tb = 0.0f;
        for (int y = 0; y < 32; ++y) {
            tw += pw[y][threadIdx.x];
            tb += pb[y][threadIdx.x];
        }
        if (dweight) dweight[c] += tw;  // null: a frozen parameter
        if (dbias) dbias[c] += tb;
    }
}

void layernorm_forward(DType dt, void* out, float* mean, float* rstd, const void* inp,
                       const void* weight, const void* bias, int N, int C, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        layernorm_forward_kernel<T><<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
            static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
            static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
    });
    CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

void fused_residual_layernorm_forward(DType dt, void* residual, void* out, float* mean, float* rstd,
                                      const void* inp1, const void* inp2, const void* weight,
                                      const void* bias, int N, int C, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        fused_residual_layernorm_forward_kernel<T>
            <<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
                static_cast<T*>(residual), static_cast<T*>(out), mean, rstd,
                static_cast<const T*>(inp1), static_cast<const T*>(inp2),
                static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
    });
    CUDA_CHECK_LAUNCH("fused_residual_layernorm_forward_kernel");
}

void layernorm_backward(DType dt, void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        layernorm_backward_dinp_kernel<T><<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
            static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
            static_cast<const T*>(weight), mean, rstd, N, C);
        CUDA_CHECK_LAUNCH("layernorm_backward_dinp_kernel");
        if (!dweight && !dbias) return;  // both frozen
        layernorm_backward_params_kernel<T>
            <<<ceil_div(C, 32), dim3(32, 32), 0, s>>>(dweight, dbias, static_cast<const T*>(dout),
                                                      static_cast<const T*>(inp), mean, rstd, N, C);
        CUDA_CHECK_LAUNCH("layernorm_backward_params_kernel");
    });
}

}  // namespace mt::cuda

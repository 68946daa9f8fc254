// LayerNorm over the last dimension (eps 1e-5), forward, backward, and fused residual+LN.
// Forward and the dinp part of backward use one warp per row: the row statistics are warp
// shuffles (no shared memory, no __syncthreads). The parameter gradients are column
// reductions over all N rows, done by a second kernel with a fixed order (deterministic).
// The forward has three steps (kernels.layernorm_forward), each for the plain and the fused
// residual LayerNorm: two_pass (the default), welford and thread_per_row, in that order below.
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

// ---- kernels.layernorm_forward: welford ------------------------------------------------------
// A running (count, mean, M2 = sum of squared deviations) per lane over its strided elements
// (Welford 1962: mean += d/n, M2 += d (x - mean_new), with d = x - mean_old), then the 32
// lanes' triples merged pairwise down a shuffle tree (Chan et al. 1979):
//   n = na + nb,  d = mean_b - mean_a,  mean = mean_a + d nb/n,  M2 = M2a + M2b + d^2 na nb / n.
// One read of the row for the statistics instead of two, and no cancellation: M2 is a sum of
// squared deviations from a running mean, never E[x^2] - E[x]^2 (which loses every digit of
// the variance of a row with mean 1000 and std 1 in fp32).
namespace {
struct Welford {
    float n = 0.0f, mean = 0.0f, m2 = 0.0f;
    __device__ __forceinline__ void add(float x) {
        n += 1.0f;
        const float d = x - mean;
        mean += d / n;
        m2 += d * (x - mean);
    }
    __device__ __forceinline__ void merge(float nb, float mean_b, float m2_b) {
        if (nb == 0.0f) return;  // a lane with no element (C < 32)
        const float total = n + nb, d = mean_b - mean;
        mean += d * (nb / total);
        m2 += m2_b + d * d * (n * nb / total);
        n = total;
    }
};

// Merges the warp's 32 lanes into lane 0 (tree of shuffles down), then broadcasts lane 0's
// (mean, rstd) so every lane normalises with the same bits.
__device__ __forceinline__ void warp_welford_stats(Welford w, int C, float& mean, float& rstd) {
    for (int o = 16; o > 0; o >>= 1) {
        const float nb = __shfl_down_sync(0xffffffffu, w.n, o);
        const float mb = __shfl_down_sync(0xffffffffu, w.mean, o);
        const float m2b = __shfl_down_sync(0xffffffffu, w.m2, o);
        w.merge(nb, mb, m2b);
    }
    mean = __shfl_sync(0xffffffffu, w.mean, 0);
    rstd = __shfl_sync(0xffffffffu, 1.0f / sqrtf(w.m2 / C + math::kLayerNormEps), 0);
}
}  // namespace

// welford: warp per row like two_pass, the statistics in one read of the row (see above).
template <class T>
__global__ void layernorm_forward_welford_kernel(T* out, float* mean, float* rstd, const T* inp,
                                                 const T* weight, const T* bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;  // whole warp leaves together
    const T* x = inp + size_t(row) * C;
    Welford w;
    for (int c = lane; c < C; c += 32) w.add(to_float(x[c]));
    float m, r;
    warp_welford_stats(w, C, m, r);
    T* o = out + size_t(row) * C;
    for (int c = lane; c < C; c += 32)
        o[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// welford with the residual add: the pass that writes residual = a + b also feeds the running
// statistics, so the residual is read back only to normalise it (two_pass reads it twice).
template <class T>
__global__ void fused_residual_layernorm_forward_welford_kernel(T* residual, T* out, float* mean,
                                                                float* rstd, const T* a, const T* b,
                                                                const T* weight, const T* bias,
                                                                int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    Welford w;
    for (int c = lane; c < C; c += 32) {
        const T r = from_float<T>(to_float(a[base + c]) + to_float(b[base + c]));
        residual[base + c] = r;
        w.add(to_float(r));  // the stored (rounded) value, as an unfused LayerNorm reads it
    }
    float m, rs;
    warp_welford_stats(w, C, m, rs);
    for (int c = lane; c < C; c += 32)  // same thread re-reads what it wrote: ordered
        out[base + c] = from_float<T>(
            (to_float(residual[base + c]) - m) * rs * to_float(weight[c]) + to_float(bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

// ---- kernels.layernorm_forward: thread_per_row -----------------------------------------------
// thread_per_row: one thread walks a whole row, two passes, as a CPU loop would. What it
// teaches: coalescing. At step c the 32 threads of a warp read x[row*C + c] for 32 rows, i.e.
// addresses C elements apart: 32 memory transactions for 32 useful values (a warp-per-row
// kernel reads 32 adjacent values in one), and only N/32 warps for the whole tensor.
constexpr int kThreadRowsPerBlock = 128;

template <class T>
__device__ __forceinline__ void row_normalize(T* o, const T* x, const T* weight, const T* bias,
                                              int C, float& mean, float& rstd) {
    float sum = 0.0f;
    for (int c = 0; c < C; ++c) sum += to_float(x[c]);
    const float m = sum / C;
    float var = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float d = to_float(x[c]) - m;
        var += d * d;
    }
    const float r = 1.0f / sqrtf(var / C + math::kLayerNormEps);
    for (int c = 0; c < C; ++c)
        o[c] = from_float<T>((to_float(x[c]) - m) * r * to_float(weight[c]) + to_float(bias[c]));
    mean = m;
    rstd = r;
}

template <class T>
__global__ void layernorm_forward_thread_per_row_kernel(T* out, float* mean, float* rstd,
                                                        const T* inp, const T* weight,
                                                        const T* bias, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    row_normalize(out + base, inp + base, weight, bias, C, mean[row], rstd[row]);
}

// thread_per_row with the residual add: one pass writes residual = a + b, then the two-pass
// normalisation of the stored residual (the same thread reads back what it wrote).
template <class T>
__global__ void fused_residual_layernorm_forward_thread_per_row_kernel(
    T* residual, T* out, float* mean, float* rstd, const T* a, const T* b, const T* weight,
    const T* bias, int N, int C) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    for (int c = 0; c < C; ++c)
        residual[base + c] = from_float<T>(to_float(a[base + c]) + to_float(b[base + c]));
    row_normalize(out + base, residual + base, weight, bias, C, mean[row], rstd[row]);
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

void layernorm_forward(DType dt, LayerNormForwardImpl impl, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int N, int C,
                       cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        auto* o = static_cast<T*>(out);
        const auto *x = static_cast<const T*>(inp), *w = static_cast<const T*>(weight),
                   *b = static_cast<const T*>(bias);
        const unsigned warp_blocks = ceil_div(N, kRowsPerBlock);
        switch (impl) {
            case LayerNormForwardImpl::two_pass:
                layernorm_forward_kernel<T>
                    <<<warp_blocks, 32 * kRowsPerBlock, 0, s>>>(o, mean, rstd, x, w, b, N, C);
                break;
            case LayerNormForwardImpl::welford:
                layernorm_forward_welford_kernel<T>
                    <<<warp_blocks, 32 * kRowsPerBlock, 0, s>>>(o, mean, rstd, x, w, b, N, C);
                break;
            case LayerNormForwardImpl::thread_per_row:
                layernorm_forward_thread_per_row_kernel<T>
                    <<<ceil_div(N, kThreadRowsPerBlock), kThreadRowsPerBlock, 0, s>>>(
                        o, mean, rstd, x, w, b, N, C);
                break;
        }
    });
    CUDA_CHECK_LAUNCH("layernorm_forward kernel");
}

void fused_residual_layernorm_forward(DType dt, LayerNormForwardImpl impl, void* residual,
                                      void* out, float* mean, float* rstd, const void* inp1,
                                      const void* inp2, const void* weight, const void* bias, int N,
                                      int C, cudaStream_t s) {
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        auto *res = static_cast<T*>(residual), *o = static_cast<T*>(out);
        const auto *x1 = static_cast<const T*>(inp1), *x2 = static_cast<const T*>(inp2);
        const auto *w = static_cast<const T*>(weight), *b = static_cast<const T*>(bias);
        const unsigned warp_blocks = ceil_div(N, kRowsPerBlock);
        switch (impl) {
            case LayerNormForwardImpl::two_pass:
                fused_residual_layernorm_forward_kernel<T>
                    <<<warp_blocks, 32 * kRowsPerBlock, 0, s>>>(res, o, mean, rstd, x1, x2, w, b, N,
                                                                C);
                break;
            case LayerNormForwardImpl::welford:
                fused_residual_layernorm_forward_welford_kernel<T>
                    <<<warp_blocks, 32 * kRowsPerBlock, 0, s>>>(res, o, mean, rstd, x1, x2, w, b, N,
                                                                C);
                break;
            case LayerNormForwardImpl::thread_per_row:
                fused_residual_layernorm_forward_thread_per_row_kernel<T>
                    <<<ceil_div(N, kThreadRowsPerBlock), kThreadRowsPerBlock, 0, s>>>(
                        res, o, mean, rstd, x1, x2, w, b, N, C);
                break;
        }
    });
    CUDA_CHECK_LAUNCH("fused_residual_layernorm_forward kernel");
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
    });
    layernorm_backward_params(dt, dweight, dbias, dout, inp, mean, rstd, N, C, s);
}

void layernorm_backward_params(DType dt, float* dweight, float* dbias, const void* dout,
                               const void* inp, const float* mean, const float* rstd, int N, int C,
                               cudaStream_t s) {
    if (!dweight && !dbias) return;  // both frozen
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        layernorm_backward_params_kernel<T>
            <<<ceil_div(C, 32), dim3(32, 32), 0, s>>>(dweight, dbias, static_cast<const T*>(dout),
                                                      static_cast<const T*>(inp), mean, rstd, N, C);
    });
    CUDA_CHECK_LAUNCH("layernorm_backward_params_kernel");
}

}  // namespace mt::cuda

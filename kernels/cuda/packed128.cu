// kernels.memory_access: packed128 — the memory-bound kernels with 128-bit loads and stores
// (Packed128, packed128.cuh: why it helps, what the cache hints do). Each kernel here computes
// the same per-element expression, in the same order, as its scalar twin (pointwise.cu,
// layernorm.cu, encoder.cu): the elementwise ones give the same bits; the LayerNorm forward's
// statistics (and the backward's two row sums) sum a row in another order (each lane adds W
// contiguous elements, W = 4 fp32 or 8 bf16, instead of every 32nd), so mean/rstd may differ in the
// last bits (fp32 rounding of a 768-term sum: a few ulp, ~1e-6 relative) and the output by as much.
//
// Every launcher checks what the packed kernel assumes and otherwise runs the scalar kernel
// (same results, slower): each pointer 16-byte aligned; for row-wise kernels the row length C a
// multiple of W; for the kernels with __restrict__ pointers, that the buffers do not overlap (a
// restrict pointer is a promise to the compiler that nothing else reaches its bytes; breaking
// it is undefined behaviour, so it is checked, not assumed). The residual kernels keep no
// __restrict__: the model runs residual_forward in place (out == inp1, cuDNN's backward) and
// residual_backward with both gradients the same buffer (then an element receives 2*dout).
// A flat kernel's n need not be a multiple of W: the last n % W elements are a scalar tail.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/packed128.cuh"

namespace mt::cuda {

namespace {
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = 8;  // LayerNorm: one warp per row, as layernorm.cu

// Grid for a grid-stride loop over `packs` packs (at least one block, so the tail runs).
inline unsigned grid_for_packs(size_t packs) {
    return std::max(1u, std::min(ceil_div(packs, kThreads), 1u << 20));
}
// Do the byte ranges [p, p + bytes) and [q, q + bytes) share a byte? (null: no range.)
bool overlap(const void* p, const void* q, size_t bytes) {
    if (!p || !q || bytes == 0) return false;
    const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
    return a < b + bytes && b < a + bytes;
}
inline size_t dtype_size(DType dt) {
    return dt == DType::bf16 ? sizeof(bf16) : sizeof(float);
}
bool all_aligned16(std::initializer_list<const void*> ps) {
    for (const void* p : ps)
        if (!aligned16(p)) return false;
    return true;
}
}  // namespace

// ---- pointwise (pointwise.cu's twins) -------------------------------------------------------
// Thread i handles packs i, i + stride, ...: consecutive threads take consecutive 16-byte packs,
// so a warp's access is 512 contiguous bytes (4 full 128-byte lines) per instruction.

// GELU forward: inp (n) -> out (n). Per element: read 1, write 1. inp is read once (streamed);
// out is read next by the c_proj matmul (default policy).
template <class T>
__global__ void gelu_forward_packed128_kernel(T* __restrict__ out, const T* __restrict__ inp,
                                              size_t n) {
    constexpr int W = Packed128<T>::size;
    const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    const size_t packs = n / W;
    for (size_t p = tid; p < packs; p += stride) {
        const Packed128<T> x = load128cs(inp + p * W);
        Packed128<T> y;
#pragma unroll
        for (int k = 0; k < W; ++k) y[k] = from_float<T>(math::gelu(to_float(x[k])));
        store128(out + p * W, y);
    }
    for (size_t i = packs * W + tid; i < n; i += stride)  // tail: the last n % W elements
        out[i] = from_float<T>(math::gelu(to_float(inp[i])));
}

// GELU backward, accumulating: dinp (n) += dout (n) * gelu'(inp (n)). Per element: read 3,
// write 1. inp and dout are streamed (last use); dinp is read-modify-write.
template <class T>
__global__ void gelu_backward_packed128_kernel(T* __restrict__ dinp, const T* __restrict__ inp,
                                               const T* __restrict__ dout, size_t n) {
    constexpr int W = Packed128<T>::size;
    const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    const size_t packs = n / W;
    for (size_t p = tid; p < packs; p += stride) {
        const Packed128<T> x = load128cs(inp + p * W), g = load128cs(dout + p * W);
        Packed128<T> d = load128(dinp + p * W);
#pragma unroll
        for (int k = 0; k < W; ++k)
            d[k] = from_float<T>(to_float(d[k]) + to_float(g[k]) * math::gelu_grad(to_float(x[k])));
        store128(dinp + p * W, d);
    }
    for (size_t i = packs * W + tid; i < n; i += stride)
        dinp[i] = from_float<T>(to_float(dinp[i]) +
                                to_float(dout[i]) * math::gelu_grad(to_float(inp[i])));
}

// Residual forward: out (n) = a (n) + b (n). Per element: read 2, write 1. No __restrict__:
// out may be a (in place). Both loads precede the store, so in place is exact.
template <class T>
__global__ void residual_forward_packed128_kernel(T* out, const T* a, const T* b, size_t n) {
    constexpr int W = Packed128<T>::size;
    const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    const size_t packs = n / W;
    for (size_t p = tid; p < packs; p += stride) {
        const Packed128<T> x = load128cs(a + p * W), y = load128cs(b + p * W);
        Packed128<T> r;
#pragma unroll
        for (int k = 0; k < W; ++k) r[k] = from_float<T>(to_float(x[k]) + to_float(y[k]));
        store128(out + p * W, r);
    }
    for (size_t i = packs * W + tid; i < n; i += stride)
        out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

// Residual backward: d1 (n) += dout (n); d2 (n) += dout (n). Per element: read 3, write 2.
// d1 and d2 may be one buffer: d1 is loaded, updated and stored before d2 is loaded, as the
// scalar kernel does, so that element receives 2*dout with the same roundings.
template <class T>
__global__ void residual_backward_packed128_kernel(T* d1, T* d2, const T* dout, size_t n) {
    constexpr int W = Packed128<T>::size;
    const size_t tid = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    const size_t packs = n / W;
    for (size_t p = tid; p < packs; p += stride) {
        const Packed128<T> g = load128cs(dout + p * W);
        Packed128<T> x = load128(d1 + p * W);
#pragma unroll
        for (int k = 0; k < W; ++k) x[k] = from_float<T>(to_float(x[k]) + to_float(g[k]));
        store128(d1 + p * W, x);
        Packed128<T> y = load128(d2 + p * W);
#pragma unroll
        for (int k = 0; k < W; ++k) y[k] = from_float<T>(to_float(y[k]) + to_float(g[k]));
        store128(d2 + p * W, y);
    }
    for (size_t i = packs * W + tid; i < n; i += stride) {
        const float g = to_float(dout[i]);
        d1[i] = from_float<T>(to_float(d1[i]) + g);
        d2[i] = from_float<T>(to_float(d2[i]) + g);
    }
}

// ---- LayerNorm forward, two_pass (layernorm.cu's twins) -------------------------------------
// One warp per row of C (C % W == 0): lane l owns the packs starting at channels
// (l + 32j) * W. Three sweeps of the row: sum, squared deviations, normalise. The row (3 KiB
// fp32 at C = 768) stays in L1 between sweeps; DRAM traffic per element: read 1, write 1, plus
// weight and bias (C each, shared by all rows, default policy so the L2 keeps them).

// inp (N,C) -> out (N,C), mean (N), rstd (N).
template <class T>
__global__ void layernorm_forward_packed128_kernel(T* __restrict__ out, float* __restrict__ mean,
                                                   float* __restrict__ rstd,
                                                   const T* __restrict__ inp,
                                                   const T* __restrict__ weight,
                                                   const T* __restrict__ bias, int N, int C) {
    constexpr int W = Packed128<T>::size;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;  // whole warp leaves together
    const T* x = inp + size_t(row) * C;
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> v = load128(x + c);
#pragma unroll
        for (int k = 0; k < W; ++k) sum += to_float(v[k]);
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> v = load128(x + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float d = to_float(v[k]) - m;
            var += d * d;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + math::kLayerNormEps);
    T* o = out + size_t(row) * C;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> v = load128cs(x + c);  // the row's last read: evict-first
        const Packed128<T> w = load128(weight + c), b = load128(bias + c);
        Packed128<T> y;
#pragma unroll
        for (int k = 0; k < W; ++k)
            y[k] = from_float<T>((to_float(v[k]) - m) * r * to_float(w[k]) + to_float(b[k]));
        store128(o + c, y);  // read next by the matmul: default policy
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// residual (N,C) = a + b (rounded to T), then the LayerNorm of residual: out, mean, rstd. a and b
// are read once (streamed); the statistics read the stored residual, as the scalar kernel does.
template <class T>
__global__ void fused_residual_layernorm_forward_packed128_kernel(
    T* __restrict__ residual, T* __restrict__ out, float* __restrict__ mean,
    float* __restrict__ rstd, const T* __restrict__ a, const T* __restrict__ b,
    const T* __restrict__ weight, const T* __restrict__ bias, int N, int C) {
    constexpr int W = Packed128<T>::size;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    float sum = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> x = load128cs(a + base + c), y = load128cs(b + base + c);
        Packed128<T> s;
#pragma unroll
        for (int k = 0; k < W; ++k) {
            s[k] = from_float<T>(to_float(x[k]) + to_float(y[k]));
            sum += to_float(s[k]);
        }
        store128(residual + base + c, s);  // reused: the next residual add and the backward
    }
    const float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {  // the same lane re-reads its own packs
        const Packed128<T> s = load128(residual + base + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float d = to_float(s[k]) - m;
            var += d * d;
        }
    }
    const float r = 1.0f / sqrtf(warp_sum(var) / C + math::kLayerNormEps);
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> s = load128(residual + base + c);
        const Packed128<T> w = load128(weight + c), bb = load128(bias + c);
        Packed128<T> y;
#pragma unroll
        for (int k = 0; k < W; ++k)
            y[k] = from_float<T>((to_float(s[k]) - m) * r * to_float(w[k]) + to_float(bb[k]));
        store128(out + base + c, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// ---- LayerNorm backward, dinp (layernorm.cu's twin) ------------------------------------------
// dinp (N,C) += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)), g = dout * weight, xhat =
// (inp - mean) * rstd. One warp per row (C % W == 0), two sweeps: the two row sums, then dinp.
// Per element: read inp, dout twice (the second from L1; streamed on the last read), dinp
// read-modify-write; weight shared by all rows. The row sums change order as in the forward.
template <class T>
__global__ void layernorm_backward_dinp_packed128_kernel(
    T* __restrict__ dinp, const T* __restrict__ dout, const T* __restrict__ inp,
    const T* __restrict__ weight, const float* __restrict__ mean, const float* __restrict__ rstd,
    int N, int C) {
    constexpr int W = Packed128<T>::size;
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32;
    if (row >= N) return;
    const size_t base = size_t(row) * C;
    const float m = mean[row], r = rstd[row];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> x = load128(inp + base + c), d = load128(dout + base + c);
        const Packed128<T> w = load128(weight + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float xhat = (to_float(x[k]) - m) * r;
            const float g = to_float(d[k]) * to_float(w[k]);
            sg += g;
            sgx += g * xhat;
        }
    }
    sg = warp_sum(sg) / C;
    sgx = warp_sum(sgx) / C;
    for (int c = lane * W; c < C; c += 32 * W) {
        const Packed128<T> x = load128cs(inp + base + c), d = load128cs(dout + base + c);
        const Packed128<T> w = load128(weight + c);
        Packed128<T> o = load128(dinp + base + c);
#pragma unroll
        for (int k = 0; k < W; ++k) {
            const float xhat = (to_float(x[k]) - m) * r;
            const float g = to_float(d[k]) * to_float(w[k]);
            o[k] = from_float<T>(to_float(o[k]) + r * (g - sg - xhat * sgx));
        }
        store128(dinp + base + c, o);
    }
}

// ---- encoder forward (encoder.cu's twin) ----------------------------------------------------
// out (B,T,C) = wte[inp[b,t]] (V,C) + wpe[t] (T,C), C % W == 0. One thread per pack of one
// output row. Per element: read 2 (wte, wpe rows; both reused: a token recurs, wpe[t] serves
// every b, so default policy), write 1.
template <class T>
__global__ void encoder_forward_packed128_kernel(T* __restrict__ out, const int* __restrict__ inp,
                                                 const T* __restrict__ wte,
                                                 const T* __restrict__ wpe, int B, int T_, int C) {
    constexpr int W = Packed128<T>::size;
    const size_t packs = size_t(B) * T_ * C / W;
    for (size_t p = blockIdx.x * size_t(blockDim.x) + threadIdx.x; p < packs;
         p += size_t(gridDim.x) * blockDim.x) {
        const size_t i = p * W;
        const size_t bt = i / C;
        const int c = static_cast<int>(i % C);
        const int t = static_cast<int>(bt % T_);
        const Packed128<T> e = load128(wte + size_t(inp[bt]) * C + c);
        const Packed128<T> q = load128(wpe + size_t(t) * C + c);
        Packed128<T> y;
#pragma unroll
        for (int k = 0; k < W; ++k) y[k] = from_float<T>(to_float(e[k]) + to_float(q[k]));
        store128(out + i, y);
    }
}

// ---- launchers: the packed kernel where its assumptions hold, else the scalar one ------------

void gelu_forward_packed128(DType dt, void* out, const void* inp, size_t n, cudaStream_t s) {
    if (!all_aligned16({out, inp}) || overlap(out, inp, n * dtype_size(dt)))
        return gelu_forward(dt, out, inp, n, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_forward_packed128_kernel<T><<<grid_for_packs(n / kPackSize<T>), kThreads, 0, s>>>(
            static_cast<T*>(out), static_cast<const T*>(inp), n);
    });
    CUDA_CHECK_LAUNCH("gelu_forward_packed128_kernel");
}

void gelu_backward_packed128(DType dt, void* dinp, const void* inp, const void* dout, size_t n,
                             cudaStream_t s) {
    const size_t bytes = n * dtype_size(dt);
    if (!all_aligned16({dinp, inp, dout}) || overlap(dinp, inp, bytes) ||
        overlap(dinp, dout, bytes))
        return gelu_backward(dt, dinp, inp, dout, n, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        gelu_backward_packed128_kernel<T><<<grid_for_packs(n / kPackSize<T>), kThreads, 0, s>>>(
            static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n);
    });
    CUDA_CHECK_LAUNCH("gelu_backward_packed128_kernel");
}

void residual_forward_packed128(DType dt, void* out, const void* a, const void* b, size_t n,
                                cudaStream_t s) {
    if (!all_aligned16({out, a, b})) return residual_forward(dt, out, a, b, n, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        residual_forward_packed128_kernel<T><<<grid_for_packs(n / kPackSize<T>), kThreads, 0, s>>>(
            static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
    });
    CUDA_CHECK_LAUNCH("residual_forward_packed128_kernel");
}

void residual_backward_packed128(DType dt, void* d1, void* d2, const void* dout, size_t n,
                                 cudaStream_t s) {
    if (!all_aligned16({d1, d2, dout})) return residual_backward(dt, d1, d2, dout, n, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        residual_backward_packed128_kernel<T><<<grid_for_packs(n / kPackSize<T>), kThreads, 0, s>>>(
            static_cast<T*>(d1), static_cast<T*>(d2), static_cast<const T*>(dout), n);
    });
    CUDA_CHECK_LAUNCH("residual_backward_packed128_kernel");
}

namespace {
// The LayerNorm and encoder kernels need whole packs per row: C % W == 0 (768 is; 770, 13 and 1
// are not, in fp32 or bf16: those shapes run the scalar kernels).
bool packs_rows(DType dt, int C) {
    return C % (dt == DType::bf16 ? kPackSize<bf16> : kPackSize<float>) == 0;
}
}  // namespace

void layernorm_forward_packed128(DType dt, void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int N, int C,
                                 cudaStream_t s) {
    const size_t bytes = size_t(N) * C * dtype_size(dt);
    if (!packs_rows(dt, C) || !all_aligned16({out, inp, weight, bias}) || overlap(out, inp, bytes))
        return layernorm_forward(dt, LayerNormForwardImpl::two_pass, out, mean, rstd, inp, weight,
                                 bias, N, C, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        layernorm_forward_packed128_kernel<T>
            <<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
                static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
    });
    CUDA_CHECK_LAUNCH("layernorm_forward_packed128_kernel");
}

void fused_residual_layernorm_forward_packed128(DType dt, void* residual, void* out, float* mean,
                                                float* rstd, const void* inp1, const void* inp2,
                                                const void* weight, const void* bias, int N, int C,
                                                cudaStream_t s) {
    const size_t bytes = size_t(N) * C * dtype_size(dt);
    const bool disjoint = !overlap(residual, out, bytes) && !overlap(residual, inp1, bytes) &&
                          !overlap(residual, inp2, bytes) && !overlap(out, inp1, bytes) &&
                          !overlap(out, inp2, bytes);
    if (!packs_rows(dt, C) || !all_aligned16({residual, out, inp1, inp2, weight, bias}) ||
        !disjoint)
        return fused_residual_layernorm_forward(dt, LayerNormForwardImpl::two_pass, residual, out,
                                                mean, rstd, inp1, inp2, weight, bias, N, C, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        fused_residual_layernorm_forward_packed128_kernel<T>
            <<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
                static_cast<T*>(residual), static_cast<T*>(out), mean, rstd,
                static_cast<const T*>(inp1), static_cast<const T*>(inp2),
                static_cast<const T*>(weight), static_cast<const T*>(bias), N, C);
    });
    CUDA_CHECK_LAUNCH("fused_residual_layernorm_forward_packed128_kernel");
}

void encoder_forward_packed128(DType dt, void* out, const int* inp, const void* wte,
                               const void* wpe, int B, int T, int C, cudaStream_t s) {
    if (!packs_rows(dt, C) || !all_aligned16({out, wte, wpe}))
        return encoder_forward(dt, out, inp, wte, wpe, B, T, C, s);
    dispatch(dt, [&](auto tag) {
        using E = decltype(tag);
        encoder_forward_packed128_kernel<E>
            <<<grid_for_packs(size_t(B) * T * C / kPackSize<E>), kThreads, 0, s>>>(
                static_cast<E*>(out), inp, static_cast<const E*>(wte), static_cast<const E*>(wpe),
                B, T, C);
    });
    CUDA_CHECK_LAUNCH("encoder_forward_packed128_kernel");
}

void layernorm_backward_packed128(DType dt, void* dinp, float* dweight, float* dbias,
                                  const void* dout, const void* inp, const void* weight,
                                  const float* mean, const float* rstd, int N, int C,
                                  cudaStream_t s) {
    const size_t bytes = size_t(N) * C * dtype_size(dt);
    if (!packs_rows(dt, C) || !all_aligned16({dinp, dout, inp, weight}) ||
        overlap(dinp, dout, bytes) || overlap(dinp, inp, bytes))
        return layernorm_backward(dt, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, s);
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        layernorm_backward_dinp_packed128_kernel<T>
            <<<ceil_div(N, kRowsPerBlock), 32 * kRowsPerBlock, 0, s>>>(
                static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
                static_cast<const T*>(weight), mean, rstd, N, C);
    });
    CUDA_CHECK_LAUNCH("layernorm_backward_dinp_packed128_kernel");
    layernorm_backward_params(dt, dweight, dbias, dout, inp, mean, rstd, N, C, s);
}

}  // namespace mt::cuda

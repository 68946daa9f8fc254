// Deterministic two-stage reductions (loss mean, global gradient norm) and the clip scale.
// Stage 1: a FIXED grid (depends only on n) of blocks each sums a grid-stride slice into one
// partial; stage 2: one block sums the partials in a fixed tree. Same n -> same bits, every run
// (atomicAdd-based reductions would not be).
#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

namespace {
constexpr int kThreads = 256;
unsigned partial_blocks(size_t n) {
    return std::max(1u, std::min<unsigned>(ceil_div(n, kThreads * 4), kReducePartials));
}
}  // namespace

// Stage 1: partials[block] = sum of x[i] (or x[i]^2) over the block's grid-stride slice.
template <bool kSquare>
__global__ void reduce_partials_kernel(float* partials, const float* x, size_t n) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float v = x[i];
        acc += kSquare ? v * v : v;
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Stage 2: out[0] = scale * sum of `count` partials (one block of 1024 threads).
__global__ void reduce_final_kernel(float* out, const float* partials, int count, float scale) {
    __shared__ float scratch[32];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = acc * scale;
}

// Clip factor on the device, so the host never waits for the norm: min(1, c / (||g|| + 1e-6)).
__global__ void clip_scale_kernel(float* out, const float* norm_sq, float max_norm) {
    out[0] = fminf(1.0f, max_norm / (sqrtf(norm_sq[0]) + 1e-6f));
}

template <bool kSquare>
static void two_stage(float* out, const float* x, size_t n, float scale, float* partials,
                      cudaStream_t s) {
    const unsigned blocks = partial_blocks(n);
    reduce_partials_kernel<kSquare><<<blocks, kThreads, 0, s>>>(partials, x, n);
    CUDA_CHECK_LAUNCH("reduce_partials_kernel");
    reduce_final_kernel<<<1, 1024, 0, s>>>(out, partials, static_cast<int>(blocks), scale);
    CUDA_CHECK_LAUNCH("reduce_final_kernel");
}

void sum_scaled(float* out, const float* x, size_t n, float scale, float* partials,
                cudaStream_t s) {
    two_stage<false>(out, x, n, scale, partials, s);
}

void sum_squares(float* out, const float* x, size_t n, float* partials, cudaStream_t s) {
    two_stage<true>(out, x, n, 1.0f, partials, s);
}

void clip_scale(float* out, const float* norm_sq, float max_norm, cudaStream_t s) {
    clip_scale_kernel<<<1, 1, 0, s>>>(out, norm_sq, max_norm);
    CUDA_CHECK_LAUNCH("clip_scale_kernel");
}

}  // namespace mt::cuda

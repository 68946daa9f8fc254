// Softmax cross-entropy over the first V of Vp logit columns (the Vp-V padding columns are
// excluded from the softmax and get zero gradient). Two implementations:
//   fused:   one block per row; online softmax (kernels/math.h) finds max and normaliser in ONE
//            read of the row, then the gradient overwrites the logits in place. No (N,Vp)
//            probability tensor exists: saves writing and re-reading 4*N*Vp bytes.
//   unfused: softmax -> probs (N,Vp fp32), cross-entropy from probs, gradient from probs, as a
//            framework would run three ops.
#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

namespace {
constexpr int kRowThreads = 512;

// Block-wide merge of per-thread online-softmax states. Every thread must call it; all
// receive the merged state. `sm` holds 2*32 floats.
__device__ math::OnlineSoftmax block_merge(math::OnlineSoftmax st, float* sm) {
    for (int o = 16; o > 0; o >>= 1) {
        math::OnlineSoftmax other;
        other.max = __shfl_xor_sync(0xffffffffu, st.max, o);
        other.sum = __shfl_xor_sync(0xffffffffu, st.sum, o);
        st = math::online_softmax_merge(st, other);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    if (lane == 0) {
        sm[warp] = st.max;
        sm[32 + warp] = st.sum;
    }
    __syncthreads();
    math::OnlineSoftmax w;
    if (lane < nwarps) {
        w.max = sm[lane];
        w.sum = sm[32 + lane];
    }
    for (int o = 16; o > 0; o >>= 1) {
        math::OnlineSoftmax other;
        other.max = __shfl_xor_sync(0xffffffffu, w.max, o);
        other.sum = __shfl_xor_sync(0xffffffffu, w.sum, o);
        w = math::online_softmax_merge(w, other);
    }
    return w;  // every warp computed the same merge of the same values
}
}  // namespace

// Fused classifier: one block per row n. Pass 1 streams the V logits once through the online
// softmax; pass 2 (only when a gradient is wanted) writes dlogits = (p - onehot) * dloss over
// the same row in place (the second read mostly hits L2). losses[n] = logsumexp - logit[target].
// An out-of-range target gives a NaN loss (loud, never a silent wrong number).
template <class T>
__global__ void classifier_fused_kernel(float* losses, T* logits, const int* targets, int V, int Vp,
                                        float dloss) {
    __shared__ float sm[64];
    T* row = logits + size_t(blockIdx.x) * Vp;
    const int target = targets[blockIdx.x];
    const bool valid = target >= 0 && target < V;
    // Read the target logit before any thread can overwrite it in pass 2 (the merge below has
    // a __syncthreads between this read and every write).
    const float xt = (threadIdx.x == 0 && valid) ? to_float(row[target]) : 0.0f;
    math::OnlineSoftmax st;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        st = math::online_softmax_update(st, to_float(row[j]));
    st = block_merge(st, sm);
    if (threadIdx.x == 0)
        losses[blockIdx.x] = valid ? st.max + logf(st.sum) - xt : __int_as_float(0x7fc00000);
    if (dloss == 0.0f) return;
    const float inv = 1.0f / st.sum;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        const float p = j < V ? expf(to_float(row[j]) - st.max) * inv : 0.0f;
        row[j] = from_float<T>((p - (j == target ? 1.0f : 0.0f)) * dloss);
    }
}

// Unfused step 1: probs (N,Vp fp32) = softmax over the first V columns; padding -> 0.
template <class T>
__global__ void softmax_forward_kernel(float* probs, const T* logits, int V, int Vp) {
    __shared__ float sm[64];
    const T* row = logits + size_t(blockIdx.x) * Vp;
    float* p = probs + size_t(blockIdx.x) * Vp;
    math::OnlineSoftmax st;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        st = math::online_softmax_update(st, to_float(row[j]));
    st = block_merge(st, sm);
    const float inv = 1.0f / st.sum;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x)
        p[j] = j < V ? expf(to_float(row[j]) - st.max) * inv : 0.0f;
}

// Unfused step 2: losses[n] = -log probs[n, target[n]] (one thread per row; NaN for a bad
// target).
__global__ void crossentropy_forward_kernel(float* losses, const float* probs, const int* targets,
                                            int N, int V, int Vp) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int t = targets[n];
    losses[n] = (t >= 0 && t < V) ? -logf(probs[size_t(n) * Vp + t]) : __int_as_float(0x7fc00000);
}

// Unfused step 3: dlogits (N,Vp) = (probs - onehot) * dloss, zero in the padding (overwrites).
template <class T>
__global__ void crossentropy_softmax_backward_kernel(T* dlogits, const float* probs,
                                                     const int* targets, int N, int V, int Vp,
                                                     float dloss) {
    const size_t n = size_t(N) * Vp;
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const int row = static_cast<int>(i / Vp), j = static_cast<int>(i % Vp);
        const float g = j < V ? (probs[i] - (j == targets[row] ? 1.0f : 0.0f)) * dloss : 0.0f;
        dlogits[i] = from_float<T>(g);
    }
}

void classifier_fused(DType dt, float* losses, void* logits, const int* targets, int N, int V,
                      int Vp, float dloss, cudaStream_t s) {
    if (N == 0) return;
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        classifier_fused_kernel<T>
            <<<N, kRowThreads, 0, s>>>(losses, static_cast<T*>(logits), targets, V, Vp, dloss);
    });
    CUDA_CHECK_LAUNCH("classifier_fused_kernel");
}

void softmax_forward(DType dt, float* probs, const void* logits, int N, int V, int Vp,
                     cudaStream_t s) {
    if (N == 0) return;
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        softmax_forward_kernel<T>
            <<<N, kRowThreads, 0, s>>>(probs, static_cast<const T*>(logits), V, Vp);
    });
    CUDA_CHECK_LAUNCH("softmax_forward_kernel");
}

void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int V,
                          int Vp, cudaStream_t s) {
    if (N == 0) return;
    crossentropy_forward_kernel<<<ceil_div(N, 256), 256, 0, s>>>(losses, probs, targets, N, V, Vp);
    CUDA_CHECK_LAUNCH("crossentropy_forward_kernel");
}

void crossentropy_softmax_backward(DType dt, void* dlogits, const float* probs, const int* targets,
                                   int N, int V, int Vp, float dloss, cudaStream_t s) {
    const size_t n = size_t(N) * Vp;
    if (n == 0) return;
    dispatch(dt, [&](auto tag) {
        using T = decltype(tag);
        crossentropy_softmax_backward_kernel<T>
            <<<std::min(ceil_div(n, 256), 1u << 20), 256, 0, s>>>(static_cast<T*>(dlogits), probs,
                                                                  targets, N, V, Vp, dloss);
    });
    CUDA_CHECK_LAUNCH("crossentropy_softmax_backward_kernel");
}

}  // namespace mt::cuda

// AdamW, three implementations of the SAME arithmetic (mt::math::adamw_update), differing only
// in how the work is launched:
//   unfused:      per tensor, one kernel per term (m, then v, then the parameter): 3 launches
//                 per tensor, and m and v are re-read by the parameter kernel (44 B/param
//                 instead of 28).
//   multi_tensor: per tensor, one kernel doing the whole update (1 launch per tensor).
//   fused:        ONE launch over the flat buffer; the weight-decay mask comes from the slice
//                 table passed as a kernel parameter, bias correction and the clip scale are
//                 folded in (the clip scale is read from device memory: no host round trip).
// Bitwise identity between the three: this file is compiled with --fmad=false (see
// CMakeLists.txt), so every + and * rounds separately and the unfused kernels, which spell the
// same operations term by term, give the same bits as math::adamw_update.
#include <algorithm>
#include <vector>

#include "kernels/cuda/kernels.cuh"

namespace mt::cuda {

namespace {
constexpr int kThreads = 256;
inline unsigned grid_for(size_t n) {
    return std::max(1u, std::min(ceil_div(n, kThreads), 1u << 16));
}
__device__ __forceinline__ float load_scale(const float* p) {
    return p ? *p : 1.0f;
}
// The step's scalars: from device memory when given (run.cuda_graph: refreshed by a copy before
// every replay), else the by-value kernel argument. The same floats either way.
__device__ __forceinline__ math::AdamWScalars load_scalars(const math::AdamWScalars* device,
                                                           const math::AdamWScalars& value) {
    return device ? *device : value;
}

// Contiguous runs of the flat buffer with one weight-decay flag each (adjacent slices with the
// same flag merged). Passed by value as a kernel parameter (CUDA >= 12.1 allows 32 KiB).
constexpr int kMaxRuns = 1024;
struct Runs {
    unsigned long long start[kMaxRuns];
    unsigned long long end[kMaxRuns];
    unsigned decay_bits[kMaxRuns / 32];
    int count;
};
}  // namespace

// unfused term 1: m = b1 m + (1-b1) g,  g = grad * scale.
__global__ void adamw_m_kernel(float* m, const float* grad, const float* scale_p, size_t n,
                               math::AdamWScalars s_arg, const math::AdamWScalars* s_dev) {
    const math::AdamWScalars s = load_scalars(s_dev, s_arg);
    const float scale = load_scale(scale_p);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float g = grad[i] * scale;
        m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
    }
}

// unfused term 2: v = b2 v + (1-b2) g^2.
__global__ void adamw_v_kernel(float* v, const float* grad, const float* scale_p, size_t n,
                               math::AdamWScalars s_arg, const math::AdamWScalars* s_dev) {
    const math::AdamWScalars s = load_scalars(s_dev, s_arg);
    const float scale = load_scale(scale_p);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float g = grad[i] * scale;
        v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
    }
}

// unfused term 3: p -= lr (mhat / (sqrt(vhat) + eps) + wd p).
__global__ void adamw_param_kernel(float* p, const float* m, const float* v, size_t n,
                                   math::AdamWScalars s_arg, const math::AdamWScalars* s_dev,
                                   bool decay) {
    const math::AdamWScalars s = load_scalars(s_dev, s_arg);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        const float mhat = m[i] / s.bias_correction1;
        const float vhat = v[i] / s.bias_correction2;
        const float wd = decay ? s.weight_decay : 0.0f;
        p[i] -= s.lr * (mhat / (sqrtf(vhat) + s.eps) + wd * p[i]);
    }
}

// multi_tensor: the whole update for one tensor in one pass (28 bytes per parameter).
__global__ void adamw_tensor_kernel(float* p, const float* grad, float* m, float* v,
                                    const float* scale_p, size_t n, math::AdamWScalars s_arg,
                                    const math::AdamWScalars* s_dev, bool decay) {
    const math::AdamWScalars s = load_scalars(s_dev, s_arg);
    const float scale = load_scale(scale_p);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
         i += size_t(gridDim.x) * blockDim.x) {
        float pi = p[i], mi = m[i], vi = v[i];
        math::adamw_update(pi, mi, vi, grad[i], scale, s, decay);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

// fused: one launch over [runs.start[0], runs.end[count-1]) of the flat buffers. Each thread's
// indices increase monotonically (grid-stride), so its run pointer only moves forward: the
// decay lookup is O(1) amortised. Elements in gaps between runs are left alone.
__global__ void adamw_fused_kernel(float* p, const float* grad, float* m, float* v,
                                   const float* scale_p, const __grid_constant__ Runs runs,
                                   math::AdamWScalars s_arg, const math::AdamWScalars* s_dev) {
    const math::AdamWScalars s = load_scalars(s_dev, s_arg);
    const float scale = load_scale(scale_p);
    const size_t first = runs.start[0], last = runs.end[runs.count - 1];
    size_t i = first + blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    // First run whose end is past i (binary search once per thread).
    int lo = 0, hi = runs.count;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (runs.end[mid] <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    int r = lo;
    for (; i < last; i += size_t(gridDim.x) * blockDim.x) {
        while (r < runs.count && i >= runs.end[r]) ++r;
        if (r == runs.count) break;
        if (i < runs.start[r]) continue;  // gap between slices
        const bool decay = (runs.decay_bits[r / 32] >> (r % 32)) & 1u;
        float pi = p[i], mi = m[i], vi = v[i];
        math::adamw_update(pi, mi, vi, grad[i], scale, s, decay);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

void adamw(AdamWImpl impl, float* params, const float* grads, float* m, float* v,
           std::span<const TensorSlice> slices, const math::AdamWScalars& sc,
           const math::AdamWScalars* device_scalars, const float* grad_scale, cudaStream_t s) {
    if (impl == AdamWImpl::unfused) {
        for (const auto& t : slices) {
            if (t.count == 0) continue;
            const unsigned g = grid_for(t.count);
            adamw_m_kernel<<<g, kThreads, 0, s>>>(m + t.offset, grads + t.offset, grad_scale,
                                                  t.count, sc, device_scalars);
            CUDA_CHECK_LAUNCH("adamw_m_kernel");
            adamw_v_kernel<<<g, kThreads, 0, s>>>(v + t.offset, grads + t.offset, grad_scale,
                                                  t.count, sc, device_scalars);
            CUDA_CHECK_LAUNCH("adamw_v_kernel");
            adamw_param_kernel<<<g, kThreads, 0, s>>>(params + t.offset, m + t.offset, v + t.offset,
                                                      t.count, sc, device_scalars, t.decay);
            CUDA_CHECK_LAUNCH("adamw_param_kernel");
        }
        return;
    }
    if (impl == AdamWImpl::multi_tensor) {
        for (const auto& t : slices) {
            if (t.count == 0) continue;
            adamw_tensor_kernel<<<grid_for(t.count), kThreads, 0, s>>>(
                params + t.offset, grads + t.offset, m + t.offset, v + t.offset, grad_scale,
                t.count, sc, device_scalars, t.decay);
            CUDA_CHECK_LAUNCH("adamw_tensor_kernel");
        }
        return;
    }
    // fused: merge adjacent slices with the same flag (op::AdamWUpdate::check has made sure they
    // are sorted by offset and disjoint).
    std::vector<TensorSlice> merged;
    for (const auto& t : slices) {
        if (t.count == 0) continue;
        if (!merged.empty()) {
            TensorSlice& back = merged.back();
            if (t.offset == back.offset + back.count && t.decay == back.decay) {
                back.count += t.count;
                continue;
            }
        }
        merged.push_back(t);
    }
    // Usually one launch; a parameter table with more than kMaxRuns runs takes a few.
    for (size_t base = 0; base < merged.size(); base += kMaxRuns) {
        Runs runs{};
        runs.count = static_cast<int>(std::min<size_t>(kMaxRuns, merged.size() - base));
        size_t elems = 0;
        for (int r = 0; r < runs.count; ++r) {
            const TensorSlice& t = merged[base + r];
            runs.start[r] = t.offset;
            runs.end[r] = t.offset + t.count;
            if (t.decay) runs.decay_bits[r / 32] |= 1u << (r % 32);
            elems = t.offset + t.count - runs.start[0];
        }
        adamw_fused_kernel<<<grid_for(elems), kThreads, 0, s>>>(params, grads, m, v, grad_scale,
                                                                runs, sc, device_scalars);
        CUDA_CHECK_LAUNCH("adamw_fused_kernel");
    }
}

}  // namespace mt::cuda

// AdamW, three implementations of one update (math::adamw_update), bitwise identical.
//
// Per element:  g = grad * scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//               p -= lr (mhat / (sqrt(vhat) + eps) + wd p),  mhat = m/(1-b1^t), vhat = v/(1-b2^t)
// What differs is how often memory is walked, which is the whole cost of this memory-bound op:
//
// unfused: what a framework's per-parameter, per-operation step does. For each tensor, one pass
//   per term: (1) g = grad*scale into a temporary, (2) m from g, (3) v from g, (4) p from m, v.
//   Traffic per element: 8 + 12 + 12 + 16 = 48 bytes (vs 28 fused), plus a temporary the size
//   of the largest tensor. The temporary is the caller's `g_tmp`; CpuBackend reserves it under
//   the `workspace` category on the first unfused step (sized by the largest tensor, which the
//   backend cannot know at construction) and keeps it for every later step.
//   The passes evaluate exactly the sub-expressions math::adamw_update evaluates, in the same
//   order, and the build keeps -ffp-contract=off (ISO C++20, no -ffast-math), so no pass is
//   contracted into an FMA differently: the result is bitwise that of math::adamw_update.
// multi_tensor: one pass per tensor (one parallel loop, a "launch", per tensor), each element
//   fully updated by math::adamw_update: 28 bytes per element, but one launch per tensor.
// fused: one parallel pass over the whole flat buffer; the decay flag of each element comes
//   from the slice that covers it (found per chunk by binary search over the sorted slices).
//
// Vectorising any of these does not change results: IEEE +, *, / and sqrt are correctly
// rounded in every SIMD lane exactly as in scalar code. (mt_core is built with -fno-math-errno:
// otherwise sqrtf's possible errno write keeps GCC from vectorising these loops.)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/kernels.h"

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

// math::adamw_update over n contiguous elements. The decay flag is a template argument so that
// the select inside math::adamw_update folds away and the loop is branch-free (vectorisable);
// the scalars are a local copy so the compiler knows the stores to p, m, v cannot change them.
template <bool Decay>
void update_run(float* p, const float* g, float* m, float* v, size_t n, math::AdamWScalars s,
                float grad_scale) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) math::adamw_update(p[i], m[i], v[i], g[i], grad_scale, s, Decay);
}

void update_run(float* p, const float* g, float* m, float* v, size_t n, const math::AdamWScalars& s,
                float grad_scale, bool decay) {
    if (decay)
        update_run<true>(p, g, m, v, n, s, grad_scale);
    else
        update_run<false>(p, g, m, v, n, s, grad_scale);
}

}  // namespace

size_t adamw_unfused_workspace_elems(std::span<const TensorSlice> tensors) {
    size_t n = 0;
    for (const TensorSlice& t : tensors) n = std::max(n, t.count);
    return n;
}

// unfused: four passes per tensor, one term each (see the top of the file).
void adamw_unfused(float* params, const float* grads, float* m, float* v, float* g_tmp,
                   std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                   float grad_scale) {
    for (const TensorSlice& t : tensors) {
        const long long n = static_cast<long long>(t.count);
        float* p = params + t.offset;
        const float* gr = grads + t.offset;
        float* mt = m + t.offset;
        float* vt = v + t.offset;
        float* g = g_tmp;
        const float wd = t.decay ? s.weight_decay : 0.0f;
        // (1) g = grad * scale
#pragma omp parallel for simd schedule(static)
        for (long long i = 0; i < n; i++) g[i] = gr[i] * grad_scale;
            // (2) m = b1 m + (1 - b1) g
#pragma omp parallel for simd schedule(static)
        for (long long i = 0; i < n; i++) mt[i] = s.beta1 * mt[i] + (1.0f - s.beta1) * g[i];
            // (3) v = b2 v + (1 - b2) g g
#pragma omp parallel for simd schedule(static)
        for (long long i = 0; i < n; i++) vt[i] = s.beta2 * vt[i] + (1.0f - s.beta2) * g[i] * g[i];
            // (4) p -= lr (mhat / (sqrt(vhat) + eps) + wd p)
#pragma omp parallel for simd schedule(static)
        for (long long i = 0; i < n; i++) {
            const float mhat = mt[i] / s.bias_correction1;
            const float vhat = vt[i] / s.bias_correction2;
            p[i] -= s.lr * (mhat / (std::sqrt(vhat) + s.eps) + wd * p[i]);
        }
    }
}

// multi_tensor: one parallel loop per tensor, math::adamw_update per element.
void adamw_multi_tensor(float* params, const float* grads, float* m, float* v,
                        std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                        float grad_scale) {
    for (const TensorSlice& t : tensors) {
        const long long n = static_cast<long long>(t.count);
        float* p = params + t.offset;
        const float* g = grads + t.offset;
        float* mt = m + t.offset;
        float* vt = v + t.offset;
        const bool decay = t.decay;
        // one parallel loop per tensor; each thread updates one contiguous share of it
#pragma omp parallel
        {
            const long long nt = omp_get_num_threads(), id = omp_get_thread_num();
            const long long i0 = n * id / nt, i1 = n * (id + 1) / nt;
            update_run(p + i0, g + i0, mt + i0, vt + i0, static_cast<size_t>(i1 - i0), s,
                       grad_scale, decay);
        }
    }
}

// fused: one parallel pass over [0, total) in fixed chunks; within a chunk, each covered run
// of elements takes the decay flag of its slice.
void adamw_fused(float* params, const float* grads, float* m, float* v,
                 std::span<const TensorSlice> tensors, size_t total, const math::AdamWScalars& s,
                 float grad_scale) {
    constexpr size_t kChunk = size_t{1} << 15;  // 32K elements: 4 arrays x 128 KiB per item
    const long long nchunks = static_cast<long long>((total + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
    for (long long c = 0; c < nchunks; c++) {
        const size_t c0 = static_cast<size_t>(c) * kChunk, c1 = std::min(total, c0 + kChunk);
        // first slice that ends after c0 (slices are sorted and disjoint)
        auto it = std::partition_point(tensors.begin(), tensors.end(), [c0](const TensorSlice& t) {
            return t.offset + t.count <= c0;
        });
        for (; it != tensors.end() && it->offset < c1; ++it) {
            const size_t i0 = std::max(c0, it->offset), i1 = std::min(c1, it->offset + it->count);
            update_run(params + i0, grads + i0, m + i0, v + i0, i1 - i0, s, grad_scale, it->decay);
        }
    }
}

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

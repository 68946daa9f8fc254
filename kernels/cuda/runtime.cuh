// CUDA runtime plumbing shared by every CUDA source: status checks that name the call, file and
// line; RAII owners for streams, events and cuBLAS/cuBLASLt handles; element-type helpers and
// warp/block reductions. Only kernels/cuda/ includes this header.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda_error_format.h"

namespace mt::cuda {

// ---- status checks --------------------------------------------------------------------------

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
const char* cublas_status_name(cublasStatus_t status);

#define CUDA_CHECK(call)                                                         \
    do {                                                                         \
        cudaError_t mt_status_ = (call);                                         \
        if (mt_status_ != cudaSuccess)                                           \
            ::mt::cuda::throw_cuda_error(mt_status_, #call, __FILE__, __LINE__); \
    } while (0)

#define CUBLAS_CHECK(call)                                                         \
    do {                                                                           \
        cublasStatus_t mt_status_ = (call);                                        \
        if (mt_status_ != CUBLAS_STATUS_SUCCESS)                                   \
            ::mt::cuda::throw_cublas_error(mt_status_, #call, __FILE__, __LINE__); \
    } while (0)

// After a <<<>>> launch: reports a bad launch configuration at once (cheap, no sync). Errors
// inside the kernel surface at the next synchronising call, which is also checked.
#define CUDA_CHECK_LAUNCH(kernel_name)                                                   \
    do {                                                                                 \
        cudaError_t mt_status_ = cudaGetLastError();                                     \
        if (mt_status_ != cudaSuccess)                                                   \
            ::mt::cuda::throw_cuda_error(mt_status_, "launch of " kernel_name, __FILE__, \
                                         __LINE__);                                      \
    } while (0)

// ---- RAII -----------------------------------------------------------------------------------

class CudaStream {
  public:
    CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
    ~CudaStream() {
        if (s_) cudaStreamDestroy(s_);
    }
    CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
    CudaStream& operator=(CudaStream&&) = delete;
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;
    cudaStream_t get() const { return s_; }

  private:
    cudaStream_t s_ = nullptr;
};

class CudaEvent {
  public:
    explicit CudaEvent(bool timing) {
        CUDA_CHECK(
            cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
    }
    ~CudaEvent() {
        if (e_) cudaEventDestroy(e_);
    }
    CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    CudaEvent& operator=(CudaEvent&&) = delete;
    CudaEvent(const CudaEvent&) = delete;
    CudaEvent& operator=(const CudaEvent&) = delete;
    cudaEvent_t get() const { return e_; }

  private:
    cudaEvent_t e_ = nullptr;
};

// A captured graph (cudaStreamEndCapture's result): the recorded nodes, not yet runnable.
class CudaGraph {
  public:
    explicit CudaGraph(cudaGraph_t g) : g_(g) {}
    ~CudaGraph() {
        if (g_) cudaGraphDestroy(g_);
    }
    CudaGraph(CudaGraph&& o) noexcept : g_(std::exchange(o.g_, nullptr)) {}
    CudaGraph& operator=(CudaGraph&&) = delete;
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;
    cudaGraph_t get() const { return g_; }

  private:
    cudaGraph_t g_ = nullptr;
};

// An instantiated graph (cudaGraphInstantiate): what cudaGraphLaunch replays.
class CudaGraphExec {
  public:
    explicit CudaGraphExec(const CudaGraph& graph) {
        CUDA_CHECK(cudaGraphInstantiate(&e_, graph.get(), 0));
    }
    ~CudaGraphExec() {
        if (e_) cudaGraphExecDestroy(e_);
    }
    CudaGraphExec(CudaGraphExec&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    CudaGraphExec& operator=(CudaGraphExec&&) = delete;
    CudaGraphExec(const CudaGraphExec&) = delete;
    CudaGraphExec& operator=(const CudaGraphExec&) = delete;
    cudaGraphExec_t get() const { return e_; }

  private:
    cudaGraphExec_t e_ = nullptr;
};

class CublasHandle {
  public:
    CublasHandle() { CUBLAS_CHECK(cublasCreate(&h_)); }
    ~CublasHandle() {
        if (h_) cublasDestroy(h_);
    }
    CublasHandle(const CublasHandle&) = delete;
    CublasHandle& operator=(const CublasHandle&) = delete;
    cublasHandle_t get() const { return h_; }

  private:
    cublasHandle_t h_ = nullptr;
};

class CublasLtHandle {
  public:
    CublasLtHandle() { CUBLAS_CHECK(cublasLtCreate(&h_)); }
    ~CublasLtHandle() {
        if (h_) cublasLtDestroy(h_);
    }
    CublasLtHandle(const CublasLtHandle&) = delete;
    CublasLtHandle& operator=(const CublasLtHandle&) = delete;
    cublasLtHandle_t get() const { return h_; }

  private:
    cublasLtHandle_t h_ = nullptr;
};

// ---- element types --------------------------------------------------------------------------

// The compute-precision element type of activations and weight copies.
enum class DType { f32, bf16 };
inline DType dtype_of(Precision p) {
    return p == Precision::bf16 ? DType::bf16 : DType::f32;
}

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_float(float x) {
    return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
    return __bfloat162float(x);
}
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
    return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
    return __float2bfloat16_rn(x);
}

inline unsigned ceil_div(size_t a, size_t b) {
    return static_cast<unsigned>((a + b - 1) / b);
}

// ---- reductions (every lane of the warp must call these: full mask) -------------------------

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; every thread of the block must call it (it contains __syncthreads) and
// every thread receives the total. `scratch` holds >= 32 floats of shared memory. The summation
// order is fixed by the block shape, so results are deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int nwarps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

}  // namespace mt::cuda

namespace mt::cuda {
// Calls launch(float{}) or launch(bf16{}) so a launcher can instantiate its kernel for the
// compute type:
//   dispatch(dt, [&](auto tag) { using T = decltype(tag); my_kernel<T><<<...>>>(...); });
template <class Launch>
void dispatch(DType dt, Launch&& launch) {
    if (dt == DType::bf16)
        launch(bf16{});
    else
        launch(float{});
}
}  // namespace mt::cuda

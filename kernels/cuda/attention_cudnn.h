// kernels.attention: cudnn — cuDNN 9's fused scaled-dot-product attention (SDPA), forward and
// backward, through the cudnn-frontend graph API. Everything that touches cuDNN lives in ONE
// translation unit, attention_cudnn.cpp, compiled only in a build configured with
// MT_ENABLE_CUDNN=ON (the `cudnn` preset; headers from tools/fetch-cudnn-frontend.sh), which
// defines MT_HAVE_CUDNN. This header includes no cuDNN or CUDA header, so the backend that
// owns a CudnnAttention compiles the same either way.
#pragma once

#include <cstddef>
#include <memory>

namespace mt::cuda {

// One cuDNN handle bound to the backend's compute stream, and the cuDNN execution plans built
// for each attention shape (B, T, NH, HS) and direction, built once and reused. bf16 activations
// only: cuDNN's SDPA computes in fp16/bf16 (the backend refuses other precisions first).
//
// Memory: the plans need a device workspace (cuDNN reports its size once a plan is built). The
// backend reserves workspace_bytes() of it outside any op (reserve_attention_workspace) and
// passes it to forward/backward: nothing here allocates device memory in an op.
class CudnnAttention {
  public:
    // `stream` is the cudaStream_t every SDPA call is enqueued on (the compute stream).
    explicit CudnnAttention(void* stream);
    ~CudnnAttention();
    CudnnAttention(const CudnnAttention&) = delete;
    CudnnAttention& operator=(const CudnnAttention&) = delete;

    // Builds (if not built yet) the forward and backward plans for this shape and returns the
    // device workspace both need (the larger of the two). Throws BackendError when cuDNN cannot run
    // the shape (e.g. a head size that is not a multiple of 8), naming the shape and the other
    // variants.
    size_t workspace_bytes(int B, int T, int C, int NH);

    // out (B,T,C) bf16 = softmax(causal(Q K^T / sqrt(hs))) V; stats (B,NH,T) fp32 = the
    // logsumexp of each row of scaled scores (what the backward recomputes P from).
    void forward(void* out, float* stats, const void* qkv, int B, int T, int C, int NH,
                 void* workspace, size_t workspace_bytes);
    // dqkv_out (B,T,3C) bf16 = d/dqkv (OVERWRITTEN: cuDNN has no accumulate), from dout
    // (B,T,C), qkv, out and the forward's stats.
    void backward(void* dqkv_out, const void* dout, const void* qkv, const void* out,
                  const float* stats, int B, int T, int C, int NH, void* workspace,
                  size_t workspace_bytes);

  private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace mt::cuda

// Host launchers of every CUDA kernel. What each op computes is written once, in the op table
// (kernels/ops.h); CudaBackend (cuda_backend.cu) binds each op to its launcher here. Each takes
// device buffers, sizes and the stream to enqueue on, and never allocates; `dt` says whether
// activations / weight copies are fp32 or bf16 (parameter gradients, mean/rstd, losses and
// probabilities are always fp32). Shapes as in kernels/backend.h: N = B*T rows, C channels, OC
// output channels.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/cuda/runtime.cuh"
#include "kernels/math.h"
#include "kernels/ops.h"

namespace mt::cuda {

// ---- encoder.cu ----
// out (B,T,C) = wte[inp[b,t]] + wpe[t]
void encoder_forward(DType dt, void* out, const int* inp, const void* wte, const void* wpe, int B,
                     int T, int C, cudaStream_t s);
// dwte[inp[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t]. Deterministic, no atomics: every
// gradient row adds its positions in increasing (b,t) order, as the CPU backend does. The wte
// part sorts (token, position) pairs in chunks of a fixed size, in `workspace` (at least
// encoder_backward_workspace_bytes(), which needs the current device; independent of B, T, C).
size_t encoder_backward_workspace_bytes();
void encoder_backward(DType dt, float* dwte, float* dwpe, const void* dout, const int* inp, int B,
                      int T, int C, void* workspace, size_t workspace_bytes, cudaStream_t s);

// ---- layernorm.cu ----
// The forward by kernels.layernorm_forward: two_pass, welford or thread_per_row (layernorm.cu).
void layernorm_forward(DType dt, LayerNormForwardImpl impl, void* out, float* mean, float* rstd,
                       const void* inp, const void* weight, const void* bias, int N, int C,
                       cudaStream_t s);
void layernorm_backward(DType dt, void* dinp, float* dweight, float* dbias, const void* dout,
                        const void* inp, const void* weight, const float* mean, const float* rstd,
                        int N, int C, cudaStream_t s);
// The parameter-gradient half of layernorm_backward (dweight, dbias; null: frozen, skipped).
void layernorm_backward_params(DType dt, float* dweight, float* dbias, const void* dout,
                               const void* inp, const float* mean, const float* rstd, int N, int C,
                               cudaStream_t s);
void fused_residual_layernorm_forward(DType dt, LayerNormForwardImpl impl, void* residual,
                                      void* out, float* mean, float* rstd, const void* inp1,
                                      const void* inp2, const void* weight, const void* bias, int N,
                                      int C, cudaStream_t s);

// ---- pointwise.cu ----
void gelu_forward(DType dt, void* out, const void* inp, size_t n, cudaStream_t s);
void gelu_backward(DType dt, void* dinp, const void* inp, const void* dout, size_t n,
                   cudaStream_t s);
void residual_forward(DType dt, void* out, const void* inp1, const void* inp2, size_t n,
                      cudaStream_t s);
void residual_backward(DType dt, void* dinp1, void* dinp2, const void* dout, size_t n,
                       cudaStream_t s);
// dst (n, bf16) = round-to-nearest-even(src (n, fp32))
void cast_fp32_to_bf16(bf16* dst, const float* src, size_t n, cudaStream_t s);
// Fallback matmul epilogue when cuBLASLt's cannot be used (misaligned bias, no algorithm):
// x (N,OC) holds inp W^T. x += bias (if bias); when gelu_out: gelu_out = gelu(x).
void bias_gelu_epilogue(DType dt, void* x, void* gelu_out, const void* bias, int N, int OC,
                        cudaStream_t s);
// dbias (OC) += sum_n dout (N,OC): the bias-gradient column reduction (deterministic).
void bias_backward(DType dt, float* dbias, const void* dout, int N, int OC, cudaStream_t s);

// ---- packed128.cu (kernels.memory_access: packed128) ----
// The same ops with 128-bit loads/stores (Packed128, packed128.cuh); same arguments and results
// as the scalar launchers above (bitwise for the elementwise ones; the LayerNorm statistics sum
// in another order). Where a kernel's assumption fails (a pointer not 16-byte aligned, C not a
// multiple of the pack width, overlapping buffers under __restrict__) the launcher runs the
// scalar kernel. The LayerNorm forwards are the two_pass step; the LayerNorm backward vectorises
// its dinp part.
void gelu_forward_packed128(DType dt, void* out, const void* inp, size_t n, cudaStream_t s);
void gelu_backward_packed128(DType dt, void* dinp, const void* inp, const void* dout, size_t n,
                             cudaStream_t s);
void residual_forward_packed128(DType dt, void* out, const void* inp1, const void* inp2, size_t n,
                                cudaStream_t s);
void residual_backward_packed128(DType dt, void* dinp1, void* dinp2, const void* dout, size_t n,
                                 cudaStream_t s);
void layernorm_forward_packed128(DType dt, void* out, float* mean, float* rstd, const void* inp,
                                 const void* weight, const void* bias, int N, int C,
                                 cudaStream_t s);
void fused_residual_layernorm_forward_packed128(DType dt, void* residual, void* out, float* mean,
                                                float* rstd, const void* inp1, const void* inp2,
                                                const void* weight, const void* bias, int N, int C,
                                                cudaStream_t s);
void encoder_forward_packed128(DType dt, void* out, const int* inp, const void* wte,
                               const void* wpe, int B, int T, int C, cudaStream_t s);
// The dinp part packed (its two row sums in another order); dweight/dbias: the scalar kernel.
void layernorm_backward_packed128(DType dt, void* dinp, float* dweight, float* dbias,
                                  const void* dout, const void* inp, const void* weight,
                                  const float* mean, const float* rstd, int N, int C,
                                  cudaStream_t s);

// ---- classifier.cu ----
void classifier_fused(DType dt, float* losses, void* logits, const int* targets, int N, int V,
                      int Vp, float dloss, cudaStream_t s);
void softmax_forward(DType dt, float* probs, const void* logits, int N, int V, int Vp,
                     cudaStream_t s);
void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int V,
                          int Vp, cudaStream_t s);
void crossentropy_softmax_backward(DType dt, void* dlogits, const float* probs, const int* targets,
                                   int N, int V, int Vp, float dloss, cudaStream_t s);

// ---- reduce.cu ----
// Number of per-block partial sums the two-stage reductions use (the caller provides a
// workspace of this many floats).
inline constexpr int kReducePartials = 1024;
// out[0] = scale * sum_i x[i]     (deterministic: fixed grid, fixed tree)
void sum_scaled(float* out, const float* x, size_t n, float scale, float* partials, cudaStream_t s);
// out[0] = sum_i x[i]^2           (deterministic)
void sum_squares(float* out, const float* x, size_t n, float* partials, cudaStream_t s);
// out[0] = min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6))
void clip_scale(float* out, const float* norm_sq, float max_norm, cudaStream_t s);

// ---- adamw.cu ----
// The three implementations of op::AdamWUpdate; `slices` sorted and disjoint (the op's check).
// `device_scalars`: when set, the kernels read the step's scalars there instead of `sc`
// (op::AdamWUpdate::scalars).
void adamw(AdamWImpl impl, float* params, const float* grads, float* m, float* v,
           std::span<const TensorSlice> slices, const math::AdamWScalars& sc,
           const math::AdamWScalars* device_scalars, const float* grad_scale, cudaStream_t s);

// ---- attention.cu ----
struct BlasContext;  // defined in matmul.cuh
// Naive: scores materialised. saved = probs (B,NH,T,T) fp32. Workspace: see
// naive_attention_workspace_bytes.
size_t naive_attention_workspace_bytes(DType dt, int B, int T, int C, int NH);
void naive_attention_forward(BlasContext& ctx, DType dt, void* out, float* probs, const void* qkv,
                             int B, int T, int C, int NH, void* workspace, cudaStream_t s);
void naive_attention_backward(BlasContext& ctx, DType dt, void* dqkv, const void* dout,
                              const void* qkv, const float* probs, int B, int T, int C, int NH,
                              void* workspace, cudaStream_t s);
// Flash: saved = logsumexp (B,NH,T). Workspace: D = rowsum(dO * O) (B,NH,T) fp32.
size_t flash_attention_workspace_bytes(int B, int T, int C, int NH);
inline constexpr int kFlashMaxHeadSize = 128;
void flash_attention_forward(DType dt, void* out, float* lse, const void* qkv, int B, int T, int C,
                             int NH, cudaStream_t s);
void flash_attention_backward(DType dt, void* dqkv, const void* dout, const void* qkv,
                              const void* out, const float* lse, int B, int T, int C, int NH,
                              void* workspace, cudaStream_t s);
// flash_tc: flash on the tensor cores (mma.sync m16n8k16 bf16, fp32 accumulate); bf16 only, head
// size 64 or 128 (flash_tc_supports_head_size), 16-byte aligned tensors, compute capability 8.0+
// (each launcher throws BackendError otherwise). saved = logsumexp (B,NH,T), as flash. Workspace:
// D = rowsum(dO * O) (B,NH,T) fp32. The backward adds into dqkv, deterministically.
// Throws BackendError naming `what` unless NH divides C into heads of a size flash_tc has.
void flash_tc_check_shape(const char* what, int C, int NH);
size_t flash_tc_attention_workspace_bytes(int B, int T, int C, int NH);
void flash_tc_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                                cudaStream_t s);
void flash_tc_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out,
                                 const float* lse, int B, int T, int C, int NH, void* workspace,
                                 cudaStream_t s);

}  // namespace mt::cuda

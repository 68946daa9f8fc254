// The CPU kernels as free functions on fp32 host pointers, one group per op family (the .cpp
// files beside this header), so tests can call them directly without a Backend. What each op
// computes is written once, in the op table (kernels/ops.h); CpuBackend (cpu_backend.cpp) binds
// each op to the kernel (or the variant) below. Variants of one op sit side by side.
//
// Conventions (the same as kernels/backend.h):
// - Row-major, last index fastest; N = B*T rows, C channels, OC output channels, NH heads.
// - Linear weights are PyTorch's (OC, C) layout.
// - Every backward ACCUMULATES (+=) into the gradients it is given.
// - No op allocates memory it does not get from its caller (the GEMM packs its panels in
//   per-thread buffers obtained once, on a thread's first GEMM; see gemm.cpp). Parallel loops use
//   OpenMP; every reduction is done in a fixed order, so the result does not depend on how
//   threads are scheduled.
#pragma once

#include <cstddef>
#include <span>

#include "kernels/math.h"
#include "kernels/ops.h"

namespace mt::cpu {

// ---- encoder.cpp ----------------------------------------------------------------------------
// out (B,T,C) = wte[inp[b,t]] (Vp,C) + wpe[t] (maxT,C)
void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C);
// dwte[inp[b,t]] += dout[b,t];  dwpe[t] += sum_b dout[b,t]
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C);

// ---- layernorm.cpp --------------------------------------------------------------------------
// out (N,C) = (inp - mean) * rstd * w + b, eps = math::kLayerNormEps; mean (N), rstd (N) saved.
// `impl`: how the row statistics are computed (kernels.layernorm_forward: two_pass or welford).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C,
                       LayerNormForwardImpl impl = LayerNormForwardImpl::two_pass);
// dinp (N,C) += ..., dw (C) += ..., db (C) += ...
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C);
// residual (N,C) = inp1 + inp2;  out = layernorm(residual)  (one pass over the rows)
void fused_residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                      const float* inp1, const float* inp2, const float* w,
                                      const float* b, int N, int C,
                                      LayerNormForwardImpl impl = LayerNormForwardImpl::two_pass);

// ---- matmul.cpp -----------------------------------------------------------------------------
// `impl`: the GEMM of the kernels.matmul ladder (gemm.h; auto = the build's fastest).
// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC)   [bias may be null]
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, MatmulImpl impl = MatmulImpl::auto_);
// pre_act (N,OC) = inp @ weight^T + bias;  out (N,OC) = gelu(pre_act)   (GELU epilogue)
void matmul_forward_gelu(float* out, float* pre_act, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC,
                         MatmulImpl impl = MatmulImpl::auto_);
// dinp (N,C) += dout (N,OC) @ weight (OC,C);  dweight (OC,C) += dout^T @ inp;
// dbias (OC) += sum_n dout[n,:].  dinp and dbias may be null.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC,
                     MatmulImpl impl = MatmulImpl::auto_);
void matmul_int8_forward(float* out, const float* inp, const int8_t* weight, const float* scale,
                         const float* bias, int N, int C, int OC);
void matmul_int8_backward(float* dinp, float* dbias, const float* dout, const int8_t* weight,
                          const float* scale, int N, int C, int OC);
void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B, int N,
                  int C, int OC, int R, float scale);
void lora_backward(float* dinp, float* dA, float* dB, float* du, const float* dout,
                   const float* inp, const float* u, const float* A, const float* B, int N, int C,
                   int OC, int R, float scale);

// ---- attention.cpp --------------------------------------------------------------------------
// Causal multi-head self-attention. qkv (B,T,3C) = [Q | K | V], head h owns channels
// [h*hs, (h+1)*hs) of each, hs = C/NH. out (B,T,C).
// naive: att (B,NH,T,T) receives the softmax probabilities (zero above the diagonal).
void attention_forward_naive(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
// dqkv (B,T,3C) += d/dqkv, reading the saved probabilities.
void attention_backward_naive(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* att, int B, int T, int C, int NH);
// flash: online softmax over key blocks, lse (B,NH,T) = log sum_t2 exp(score) is all it keeps.
void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C, int NH);
// dqkv += d/dqkv, recomputing the probabilities from Q, K and lse.
void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH);

// ---- pointwise.cpp --------------------------------------------------------------------------
void gelu_forward(float* out, const float* inp, size_t n);                          // out = gelu(x)
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);     // += dout gelu'
void residual_forward(float* out, const float* inp1, const float* inp2, size_t n);  // a + b
void residual_backward(float* dinp1, float* dinp2, const float* dout, size_t n);    // += dout

// ---- classifier.cpp -------------------------------------------------------------------------
// Softmax cross-entropy over the first V of Vp logit columns; targets must lie in [0, V)
// (throws BackendError naming the row otherwise).
// fused: losses (N) = -log p[target]; when dloss != 0, logits (N,Vp) are overwritten by
// dlogits = (p - onehot) * dloss with zeros in the padded columns V..Vp-1; when dloss == 0 the
// logits are left untouched.
void classifier_fused(float* losses, float* logits, const int* targets, int N, int V, int Vp,
                      float dloss);
// probs (N,Vp) = softmax(logits[:, :V]), zero in the padded columns.
void softmax_forward(float* probs, const float* logits, int N, int V, int Vp);
// losses (N) = -log probs[n, targets[n]]
void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int V,
                          int Vp);
// dlogits (N,Vp) = (probs - onehot) * dloss (overwrites; zero in the padded columns)
void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, int N,
                                   int V, int Vp, float dloss);

// ---- reductions.cpp -------------------------------------------------------------------------
// out[0] = sum_i inp[i] * scale. Summed in double in a fixed blocked order: bitwise the same
// for any thread count.
void sum_scaled(float* out, const float* inp, size_t n, float scale);
// out[0] = sum_i g[i]^2, the same fixed-order blocked double sum.
void global_norm_squared(float* out, const float* g, size_t n);
// scale_out[0] = min(1, max_norm / (sqrt(norm_sq[0]) + 1e-6))
void clip_scale(float* scale_out, const float* norm_sq, float max_norm);

// ---- adamw.cpp ------------------------------------------------------------------------------
// The per-step scalars: adamw_scalars (kernels/ops.h); the request checks: op::AdamWUpdate.
// Largest slice count: the unfused variant's temporary needs this many floats.
size_t adamw_unfused_workspace_elems(std::span<const TensorSlice> tensors);
// unfused: per tensor, one pass per term as an unfused framework step does: g = grad*scale into
// `g_tmp` (>= the tensor's count floats), then an m pass, a v pass and a parameter pass.
void adamw_unfused(float* params, const float* grads, float* m, float* v, float* g_tmp,
                   std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                   float grad_scale);
// multi_tensor: one pass per tensor, math::adamw_update per element.
void adamw_multi_tensor(float* params, const float* grads, float* m, float* v,
                        std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                        float grad_scale);
// fused: one parallel pass over the flat buffer [0,total); each element's decay flag comes
// from the slice that covers it.
void adamw_fused(float* params, const float* grads, float* m, float* v,
                 std::span<const TensorSlice> tensors, size_t total, const math::AdamWScalars& s,
                 float grad_scale);

}  // namespace mt::cpu

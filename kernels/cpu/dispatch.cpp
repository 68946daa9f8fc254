// The free functions of kernels.h and gemm.h: each runs the same function of the process's ISA
// level (default_kernel_table(): MT_CPU_ISA, else the best level this CPU has). Tests and benches
// call these; CpuBackend holds its own level's table and calls it directly.
#include "kernels/cpu/cpu_isa.h"

namespace mt::cpu {

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C) {
    default_kernel_table().encoder_forward(out, inp, wte, wpe, B, T, C);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C) {
    default_kernel_table().encoder_backward(dwte, dwpe, dout, inp, B, T, C);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int N, int C, LayerNormForwardImpl impl) {
    default_kernel_table().layernorm_forward(out, mean, rstd, inp, w, b, N, C, impl);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int N, int C) {
    default_kernel_table().layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

void fused_residual_layernorm_forward(float* residual, float* out, float* mean, float* rstd,
                                      const float* inp1, const float* inp2, const float* w,
                                      const float* b, int N, int C, LayerNormForwardImpl impl) {
    default_kernel_table().fused_residual_layernorm_forward(residual, out, mean, rstd, inp1, inp2,
                                                            w, b, N, C, impl);
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, MatmulImpl impl) {
    default_kernel_table().matmul_forward(out, inp, weight, bias, N, C, OC, impl);
}

void matmul_forward_gelu(float* out, float* pre_act, const float* inp, const float* weight,
                         const float* bias, int N, int C, int OC, MatmulImpl impl) {
    default_kernel_table().matmul_forward_gelu(out, pre_act, inp, weight, bias, N, C, OC, impl);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, MatmulImpl impl) {
    default_kernel_table().matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, impl);
}

void matmul_int8_forward(float* out, const float* inp, const int8_t* weight, const float* scale,
                         const float* bias, int N, int C, int OC) {
    default_kernel_table().matmul_int8_forward(out, inp, weight, scale, bias, N, C, OC);
}

void matmul_int8_backward(float* dinp, float* dbias, const float* dout, const int8_t* weight,
                          const float* scale, int N, int C, int OC) {
    default_kernel_table().matmul_int8_backward(dinp, dbias, dout, weight, scale, N, C, OC);
}

void lora_forward(float* out, float* u, const float* inp, const float* A, const float* B, int N,
                  int C, int OC, int R, float scale) {
    default_kernel_table().lora_forward(out, u, inp, A, B, N, C, OC, R, scale);
}

void lora_backward(float* dinp, float* dA, float* dB, float* du, const float* dout,
                   const float* inp, const float* u, const float* A, const float* B, int N, int C,
                   int OC, int R, float scale) {
    default_kernel_table().lora_backward(dinp, dA, dB, du, dout, inp, u, A, B, N, C, OC, R, scale);
}

void attention_forward_naive(float* out, float* att, const float* qkv, int B, int T, int C,
                             int NH) {
    default_kernel_table().attention_forward_naive(out, att, qkv, B, T, C, NH);
}

void attention_backward_naive(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* att, int B, int T, int C, int NH) {
    default_kernel_table().attention_backward_naive(dqkv, dout, qkv, out, att, B, T, C, NH);
}

void attention_forward_flash(float* out, float* lse, const float* qkv, int B, int T, int C,
                             int NH) {
    default_kernel_table().attention_forward_flash(out, lse, qkv, B, T, C, NH);
}

void attention_backward_flash(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH) {
    default_kernel_table().attention_backward_flash(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

void gelu_forward(float* out, const float* inp, size_t n) {
    default_kernel_table().gelu_forward(out, inp, n);
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
    default_kernel_table().gelu_backward(dinp, inp, dout, n);
}

void residual_forward(float* out, const float* inp1, const float* inp2, size_t n) {
    default_kernel_table().residual_forward(out, inp1, inp2, n);
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, size_t n) {
    default_kernel_table().residual_backward(dinp1, dinp2, dout, n);
}

void classifier_fused(float* losses, float* logits, const int* targets, int N, int V, int Vp,
                      float dloss) {
    default_kernel_table().classifier_fused(losses, logits, targets, N, V, Vp, dloss);
}

void softmax_forward(float* probs, const float* logits, int N, int V, int Vp) {
    default_kernel_table().softmax_forward(probs, logits, N, V, Vp);
}

void crossentropy_forward(float* losses, const float* probs, const int* targets, int N, int V,
                          int Vp) {
    default_kernel_table().crossentropy_forward(losses, probs, targets, N, V, Vp);
}

void crossentropy_softmax_backward(float* dlogits, const float* probs, const int* targets, int N,
                                   int V, int Vp, float dloss) {
    default_kernel_table().crossentropy_softmax_backward(dlogits, probs, targets, N, V, Vp, dloss);
}

void sum_scaled(float* out, const float* inp, size_t n, float scale) {
    default_kernel_table().sum_scaled(out, inp, n, scale);
}

void global_norm_squared(float* out, const float* g, size_t n) {
    default_kernel_table().global_norm_squared(out, g, n);
}

void clip_scale(float* scale_out, const float* norm_sq, float max_norm) {
    default_kernel_table().clip_scale(scale_out, norm_sq, max_norm);
}

size_t adamw_unfused_workspace_elems(std::span<const TensorSlice> tensors) {
    return default_kernel_table().adamw_unfused_workspace_elems(tensors);
}

void adamw_unfused(float* params, const float* grads, float* m, float* v, float* g_tmp,
                   std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                   float grad_scale) {
    default_kernel_table().adamw_unfused(params, grads, m, v, g_tmp, tensors, s, grad_scale);
}

void adamw_multi_tensor(float* params, const float* grads, float* m, float* v,
                        std::span<const TensorSlice> tensors, const math::AdamWScalars& s,
                        float grad_scale) {
    default_kernel_table().adamw_multi_tensor(params, grads, m, v, tensors, s, grad_scale);
}

void adamw_fused(float* params, const float* grads, float* m, float* v,
                 std::span<const TensorSlice> tensors, size_t total, const math::AdamWScalars& s,
                 float grad_scale) {
    default_kernel_table().adamw_fused(params, grads, m, v, tensors, total, s, grad_scale);
}

float exp_shift_sum(const float* x, size_t n, float shift) {
    return default_kernel_table().exp_shift_sum(x, n, shift);
}

float exp_shift_sum_inplace(float* x, size_t n, float shift) {
    return default_kernel_table().exp_shift_sum_inplace(x, n, shift);
}

void gemm(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc, bool accumulate) {
    default_kernel_table().gemm(MatmulImpl::auto_, M, N, K, A, B, C, ldc, accumulate);
}

void gemm_eigen(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate) {
    default_kernel_table().gemm_eigen(M, N, K, A, B, C, ldc, accumulate);
}

void gemm_naive(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate) {
    default_kernel_table().gemm_naive(M, N, K, A, B, C, ldc, accumulate);
}

void gemm_blocked(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                  bool accumulate) {
    default_kernel_table().gemm_blocked(M, N, K, A, B, C, ldc, accumulate);
}

void gemm(MatmulImpl impl, int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
          bool accumulate) {
    default_kernel_table().gemm(impl, M, N, K, A, B, C, ldc, accumulate);
}

MatmulImpl gemm_fastest() {
    return default_kernel_table().gemm_fastest();
}

void gemm_int8(int M, int N, int K, GemmOperand A, GemmInt8Operand B, float* C, long ldc,
               bool accumulate) {
    default_kernel_table().gemm_int8(M, N, K, A, B, C, ldc, accumulate);
}

bool gemm_packed_available() {
    return default_kernel_table().gemm_packed_available();
}

void gemm_packed(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                 bool accumulate) {
    default_kernel_table().gemm_packed(M, N, K, A, B, C, ldc, accumulate);
}

const char* gemm_impl_name() {
    return default_kernel_table().gemm_impl_name();
}

}  // namespace mt::cpu

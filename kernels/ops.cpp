// The op table's checks and analytic costs (kernels/ops.h), one section per op. The checks run
// in Backend::run before any backend's kernel, so a bad request gets the same message on every
// backend. Data-dependent checks (a target id outside the vocabulary) need the data on the host
// and stay in the kernels that can read it.
#include "kernels/ops.h"

#include <cmath>
#include <string>

namespace mt {
namespace {

double d(long long x) {
    return static_cast<double>(x);
}

[[noreturn]] void fail(std::string_view op, const std::string& what) {
    throw BackendError(std::string(op) + ": " + what);
}
void require_buffer(std::string_view op, const void* p, const char* arg) {
    if (!p) fail(op, std::string(arg) + " is null; this argument is required");
}
void require_positive(std::string_view op, long long v, const char* arg) {
    if (v <= 0) fail(op, std::string(arg) + " must be >= 1, got " + std::to_string(v));
}
void require_heads(std::string_view op, int C, int NH) {
    require_positive(op, NH, "NH (n_head)");
    if (C % NH != 0)
        fail(op, "n_embd (" + std::to_string(C) + ") must be a multiple of n_head (" +
                     std::to_string(NH) + ")");
}
void require_vocab(std::string_view op, int V, int Vp) {
    if (V <= 0 || V > Vp)
        fail(op, "vocab_size V=" + std::to_string(V) + " must be in 1..Vp=" + std::to_string(Vp) +
                     " (the padded vocabulary)");
}

}  // namespace

math::AdamWScalars adamw_scalars(const AdamWParams& hp) {
    math::AdamWScalars s;
    s.lr = hp.lr;
    s.beta1 = hp.beta1;
    s.beta2 = hp.beta2;
    s.eps = hp.eps;
    s.weight_decay = hp.weight_decay;
    s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta1), hp.step));
    s.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(hp.beta2), hp.step));
    return s;
}

size_t attention_saved_elems(AttentionImpl impl, int B, int T, int NH) {
    const size_t bnh = static_cast<size_t>(B) * static_cast<size_t>(NH);
    return impl == AttentionImpl::flash || impl == AttentionImpl::cudnn ||
                   impl == AttentionImpl::flash_tc
               ? bnh * static_cast<size_t>(T)
               : bnh * static_cast<size_t>(T) * static_cast<size_t>(T);
}

namespace op {

// ---- encoder ----
void EncoderForward::check() const {
    require_positive(name, B, "B");
    require_positive(name, T, "T");
    require_positive(name, C, "C");
    require_buffer(name, out, "out");
    require_buffer(name, inp, "inp");
    require_buffer(name, wte, "wte");
    require_buffer(name, wpe, "wpe");
}
OpRecord EncoderForward::record(double e) const {
    return {name, d(B) * d(T) * d(C), e * 3.0 * d(B) * d(T) * d(C) + 4.0 * d(B) * d(T)};
}
void EncoderBackward::check() const {
    require_positive(name, B, "B");
    require_positive(name, T, "T");
    require_positive(name, C, "C");
    if (!dwte && !dwpe) fail(name, "nothing to compute: dwte and dwpe are both null");
    require_buffer(name, dout, "dout");
    require_buffer(name, inp, "inp");
}
OpRecord EncoderBackward::record(double e) const {
    return {name, 2.0 * d(B) * d(T) * d(C),
            e * d(B) * d(T) * d(C) + 4.0 * 4.0 * d(B) * d(T) * d(C)};
}

// ---- layernorm ----
void LayerNormForward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_buffer(name, out, "out");
    require_buffer(name, mean, "mean");
    require_buffer(name, rstd, "rstd");
    require_buffer(name, inp, "inp");
    require_buffer(name, weight, "weight");
    require_buffer(name, bias, "bias");
}
OpRecord LayerNormForward::record(double e) const {
    return {name, 8.0 * d(N) * d(C), e * (2.0 * d(N) * d(C) + 2.0 * d(C)) + 8.0 * d(N)};
}
void LayerNormBackward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_buffer(name, dinp, "dinp");
    require_buffer(name, dout, "dout");
    require_buffer(name, inp, "inp");
    require_buffer(name, weight, "weight");
    require_buffer(name, mean, "mean");
    require_buffer(name, rstd, "rstd");
}
OpRecord LayerNormBackward::record(double e) const {
    return {name, 14.0 * d(N) * d(C),
            e * (4.0 * d(N) * d(C) + d(C)) + 8.0 * d(N) + 4.0 * 4.0 * d(C)};
}
void FusedResidualLayerNormForward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_buffer(name, residual, "residual");
    require_buffer(name, out, "out");
    require_buffer(name, mean, "mean");
    require_buffer(name, rstd, "rstd");
    require_buffer(name, inp1, "inp1");
    require_buffer(name, inp2, "inp2");
    require_buffer(name, weight, "weight");
    require_buffer(name, bias, "bias");
}
OpRecord FusedResidualLayerNormForward::record(double e) const {
    return {name, 9.0 * d(N) * d(C), e * (4.0 * d(N) * d(C) + 2.0 * d(C)) + 8.0 * d(N)};
}

// ---- matmul ----
void MatmulForward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_positive(name, OC, "OC");
    require_buffer(name, out, "out");
    require_buffer(name, inp, "inp");
    require_buffer(name, weight, "weight");
    if (epilogue == MatmulEpilogue::gelu && !pre_act)
        fail(name, "the gelu epilogue needs a pre_act buffer (N,OC) for the backward; got null");
}
// out = inp W^T + b: 2 N C OC multiply-adds + N OC bias adds.
OpRecord MatmulForward::record(double e) const {
    const std::string_view shown =
        epilogue == MatmulEpilogue::gelu ? std::string_view("matmul_gelu_forward") : name;
    return {shown, 2.0 * d(N) * d(C) * d(OC) + d(N) * d(OC),
            e * (d(N) * d(C) + d(OC) * d(C) + d(N) * d(OC) + d(OC))};
}
void MatmulBackward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_positive(name, OC, "OC");
    require_buffer(name, dout, "dout");
    require_buffer(name, weight, "weight");
    if (!dinp && !dweight && !dbias)
        fail(name, "nothing to compute: dinp, dweight and dbias are all null");
    if (dweight) require_buffer(name, inp, "inp (needed for dweight)");
}
// dinp = dout W (2 N C OC), dW = dout^T inp (2 N C OC), db = sum dout (N OC); only the products
// asked for. Bytes: dout and W read, dinp read+written; inp read and dW read+written (fp32) for
// the weight gradient; db read+written.
OpRecord MatmulBackward::record(double e) const {
    double flops = 0, bytes = e * d(N) * d(OC) + e * d(OC) * d(C);
    if (dinp) flops += 2.0 * d(N) * d(C) * d(OC), bytes += 2.0 * e * d(N) * d(C);
    if (dweight) flops += 2.0 * d(N) * d(C) * d(OC), bytes += e * d(N) * d(C) + 8.0 * d(OC) * d(C);
    if (dbias) flops += d(N) * d(OC), bytes += 8.0 * d(OC);
    return {name, flops, bytes};
}

// ---- int8 weights ----
void MatmulInt8Forward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_positive(name, OC, "OC");
    require_buffer(name, out, "out");
    require_buffer(name, inp, "inp");
    require_buffer(name, weight, "weight");
    require_buffer(name, scale, "scale");
}
// The fp32 matmul's flops plus the dequantisation (one multiply per weight element per row
// tile is an implementation detail: not counted); the weight is read as 1 byte + a 4-byte scale
// per row.
OpRecord MatmulInt8Forward::record(double e) const {
    return {name, 2.0 * d(N) * d(C) * d(OC) + d(N) * d(OC),
            e * (d(N) * d(C) + d(N) * d(OC) + d(OC)) + d(OC) * d(C) + 4.0 * d(OC)};
}
void MatmulInt8Backward::check() const {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_positive(name, OC, "OC");
    require_buffer(name, dout, "dout");
    require_buffer(name, weight, "weight");
    require_buffer(name, scale, "scale");
    if (!dinp && !dbias) fail(name, "nothing to compute: dinp and dbias are both null");
}
OpRecord MatmulInt8Backward::record(double e) const {
    double flops = 0, bytes = e * d(N) * d(OC);
    if (dinp)
        flops += 2.0 * d(N) * d(C) * d(OC),
            bytes += d(OC) * d(C) + 4.0 * d(OC) + 2.0 * e * d(N) * d(C);
    if (dbias) flops += d(N) * d(OC), bytes += 8.0 * d(OC);
    return {name, flops, bytes};
}

// ---- LoRA ----
namespace {
void require_lora_shape(std::string_view name, int N, int C, int OC, int R) {
    require_positive(name, N, "N");
    require_positive(name, C, "C");
    require_positive(name, OC, "OC");
    require_positive(name, R, "R");
}
}  // namespace
void LoraForward::check() const {
    require_lora_shape(name, N, C, OC, R);
    require_buffer(name, out, "out");
    require_buffer(name, u, "u");
    require_buffer(name, inp, "inp");
    require_buffer(name, A, "A");
    require_buffer(name, B, "B");
}
// u = inp A^T (2NCR), scaled (NR), out += u B^T (2N R OC). Reads inp, A, B, out; writes u, out.
OpRecord LoraForward::record(double e) const {
    return {name, 2.0 * d(N) * d(R) * (d(C) + d(OC)) + d(N) * d(R),
            e * (d(N) * d(C) + d(R) * d(C) + d(OC) * d(R) + 2.0 * d(N) * d(OC) + d(N) * d(R))};
}
void LoraBackward::check() const {
    require_lora_shape(name, N, C, OC, R);
    require_buffer(name, dA, "dA");
    require_buffer(name, dB, "dB");
    require_buffer(name, du, "du");
    require_buffer(name, dout, "dout");
    require_buffer(name, inp, "inp");
    require_buffer(name, u, "u");
    require_buffer(name, A, "A");
    require_buffer(name, B, "B");
}
// dB (2N OC R), du (2N OC R + NR), dA (2NRC), dinp (2NRC when asked).
OpRecord LoraBackward::record(double e) const {
    double flops = 4.0 * d(N) * d(OC) * d(R) + d(N) * d(R) + 2.0 * d(N) * d(R) * d(C);
    double bytes =
        e * (d(N) * d(OC) + 2.0 * d(N) * d(R) + d(N) * d(C) + d(R) * d(C) + d(OC) * d(R)) +
        8.0 * (d(R) * d(C) + d(OC) * d(R));
    if (dinp) flops += 2.0 * d(N) * d(R) * d(C), bytes += 2.0 * e * d(N) * d(C);
    return {name, flops, bytes};
}

// ---- attention ----
// Causal attention, counting the work of the causal half only (T(T+1)/2 score pairs): QK^T and
// PV are 2 hs flops per pair each, softmax ~5 flops per pair (backward: 8 hs + 6).
void AttentionForward::check() const {
    require_positive(name, B, "B");
    require_positive(name, T, "T");
    require_heads(name, C, NH);
    require_buffer(name, out, "out");
    require_buffer(name, saved, "saved");
    require_buffer(name, qkv, "qkv");
}
OpRecord AttentionForward::record(double e) const {
    const double pairs = d(B) * d(NH) * d(T) * d(T + 1) / 2.0, hs = d(C) / d(NH);
    const double saved_elems = d(static_cast<long long>(attention_saved_elems(impl, B, T, NH)));
    return {name, pairs * (4.0 * hs + 5.0),
            e * (3.0 * d(B) * d(T) * d(C) + d(B) * d(T) * d(C)) + 4.0 * saved_elems};
}
void AttentionBackward::check() const {
    require_positive(name, B, "B");
    require_positive(name, T, "T");
    require_heads(name, C, NH);
    require_buffer(name, dqkv, "dqkv");
    require_buffer(name, dout, "dout");
    require_buffer(name, qkv, "qkv");
    require_buffer(name, out, "out");
    require_buffer(name, saved, "saved");
}
OpRecord AttentionBackward::record(double e) const {
    const double pairs = d(B) * d(NH) * d(T) * d(T + 1) / 2.0, hs = d(C) / d(NH);
    const double saved_elems = d(static_cast<long long>(attention_saved_elems(impl, B, T, NH)));
    const double btc = d(B) * d(T) * d(C);
    return {name, pairs * (8.0 * hs + 6.0),
            e * (3.0 * btc + 2.0 * btc + 2.0 * 3.0 * btc) + 4.0 * saved_elems};
}

// ---- pointwise ----
void GeluForward::check() const {
    require_buffer(name, out, "out");
    require_buffer(name, inp, "inp");
}
OpRecord GeluForward::record(double e) const {
    return {name, 12.0 * d(static_cast<long long>(n)), 2.0 * e * d(static_cast<long long>(n))};
}
void GeluBackward::check() const {
    require_buffer(name, dinp, "dinp");
    require_buffer(name, inp, "inp");
    require_buffer(name, dout, "dout");
}
OpRecord GeluBackward::record(double e) const {
    return {name, 18.0 * d(static_cast<long long>(n)), 4.0 * e * d(static_cast<long long>(n))};
}
void ResidualForward::check() const {
    require_buffer(name, out, "out");
    require_buffer(name, inp1, "inp1");
    require_buffer(name, inp2, "inp2");
}
OpRecord ResidualForward::record(double e) const {
    return {name, d(static_cast<long long>(n)), 3.0 * e * d(static_cast<long long>(n))};
}
void ResidualBackward::check() const {
    require_buffer(name, dinp1, "dinp1");
    require_buffer(name, dinp2, "dinp2");
    require_buffer(name, dout, "dout");
}
OpRecord ResidualBackward::record(double e) const {
    return {name, 2.0 * d(static_cast<long long>(n)), 5.0 * e * d(static_cast<long long>(n))};
}

// ---- classifier ----
void ClassifierFused::check() const {
    require_positive(name, N, "N");
    require_vocab(name, V, Vp);
    require_buffer(name, losses, "losses");
    require_buffer(name, logits, "logits");
    require_buffer(name, targets, "targets");
}
// One read of the logits, one write of their gradient (in place) when dloss != 0; ~6 flops per
// logit (max, exp, sum, normalise, subtract, scale).
OpRecord ClassifierFused::record(double e) const {
    return {name, 6.0 * d(N) * d(Vp), e * d(N) * d(Vp) * (dloss != 0.0f ? 2.0 : 1.0) + 8.0 * d(N)};
}
void SoftmaxForward::check() const {
    require_positive(name, N, "N");
    require_vocab(name, V, Vp);
    require_buffer(name, probs, "probs");
    require_buffer(name, logits, "logits");
}
OpRecord SoftmaxForward::record(double e) const {
    return {name, 4.0 * d(N) * d(Vp), e * d(N) * d(Vp) + 4.0 * d(N) * d(Vp)};
}
void CrossEntropyForward::check() const {
    require_positive(name, N, "N");
    require_vocab(name, V, Vp);
    require_buffer(name, losses, "losses");
    require_buffer(name, probs, "probs");
    require_buffer(name, targets, "targets");
}
OpRecord CrossEntropyForward::record(double) const {
    return {name, d(N), 12.0 * d(N)};
}
void CrossEntropySoftmaxBackward::check() const {
    require_positive(name, N, "N");
    require_vocab(name, V, Vp);
    require_buffer(name, dlogits, "dlogits");
    require_buffer(name, probs, "probs");
    require_buffer(name, targets, "targets");
}
OpRecord CrossEntropySoftmaxBackward::record(double e) const {
    return {name, 2.0 * d(N) * d(Vp), 4.0 * d(N) * d(Vp) + e * d(N) * d(Vp)};
}
void LossMean::check() const {
    require_positive(name, N, "N");
    require_buffer(name, loss, "loss");
    require_buffer(name, losses, "losses");
}
OpRecord LossMean::record(double) const {
    return {name, d(N), 4.0 * d(N)};
}

// ---- optimizer ----
void GlobalNormClip::check() const {
    require_buffer(name, norm_sq, "norm_sq");
    require_buffer(name, clip_scale, "clip_scale");
    require_buffer(name, grads, "grads");
    if (!(max_norm > 0))
        fail(name, "max_norm must be > 0 (clipping off means: do not run this op), got " +
                       std::to_string(max_norm));
}
OpRecord GlobalNormClip::record(double) const {
    return {name, 2.0 * d(static_cast<long long>(n)), 4.0 * d(static_cast<long long>(n))};
}
void AdamWUpdate::check() const {
    require_buffer(name, params, "params");
    require_buffer(name, grads, "grads");
    require_buffer(name, m, "m");
    require_buffer(name, v, "v");
    if (hp.step < 1)
        fail("adamw_update",
             "step must be >= 1 (1-based, for bias correction), got " + std::to_string(hp.step));
    size_t end_prev = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        const TensorSlice& t = tensors[i];
        if (t.offset < end_prev)
            fail("adamw_update",
                 "tensor slice " + std::to_string(i) + " (offset " + std::to_string(t.offset) +
                     ") starts before the previous slice ends (" + std::to_string(end_prev) +
                     "); slices must be sorted by offset and must not overlap");
        if (t.offset > total || t.count > total - t.offset)
            fail("adamw_update",
                 "tensor slice " + std::to_string(i) + " [" + std::to_string(t.offset) + ", " +
                     std::to_string(t.offset + t.count) + ") ends past the buffer of " +
                     std::to_string(total) + " floats");
        end_prev = t.offset + t.count;
    }
}
// Reads p, g, m, v and writes p, m, v: 28 bytes per parameter, ~16 flops.
OpRecord AdamWUpdate::record(double) const {
    static constexpr std::string_view names[] = {"adamw_unfused", "adamw_multi_tensor",
                                                 "adamw_fused"};
    const double count = d(static_cast<long long>(total));
    return {names[static_cast<int>(impl)], 16.0 * count, 28.0 * count};
}

// ---- precision and memory ----
void CastParams::check() const {
    require_buffer(name, dst, "dst");
    require_buffer(name, src, "src");
}
OpRecord CastParams::record(double e) const {
    return {name, 0.0, (4.0 + e) * d(static_cast<long long>(n))};
}
void FillZero::check() const {
    if (bytes) require_buffer(name, dst, "dst");
}
OpRecord FillZero::record(double) const {
    return {what, 0.0, d(static_cast<long long>(bytes))};
}

}  // namespace op
}  // namespace mt

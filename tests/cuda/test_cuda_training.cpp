// A whole GPT training step on the GPU against the CPU backend: same weights, same batch ->
// same loss and gradients (fp32), and the loss over 10 AdamW steps tracks the CPU's (fp32 tight,
// bf16 within 2%), for every kernel variant (kernels.memory_access packed128 too) and for LoRA /
// frozen / int8-frozen models (their frozen tensors have no gradient on either side). Skips without
// a device.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

struct Rig {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<GPT> model;
    std::unique_ptr<AdamW> opt;
    DeviceBuffer in, tg;
    int B, T;
    Rig(BackendKind kind, Precision precision, KernelChoice k, const TrainableOptions& trainable,
        const GPTConfig& cfg, const std::vector<float>& params, const std::vector<int>& inputs,
        const std::vector<int>& targets, int B_, int T_)
        : B(B_), T(T_) {
        BackendOptions bo;
        bo.precision = precision;
        bo.kernels = k;
        backend = create_backend(kind, bo);
        ModelOptions mo;
        mo.trainable = trainable;
        model = std::make_unique<GPT>(*backend, cfg, mo);
        model->set_params(params);
        model->allocate_activations(B, T);
        AdamWConfig oc;
        oc.impl = AdamWImpl::fused;
        opt = std::make_unique<AdamW>(*model, oc);
        const size_t bytes = inputs.size() * sizeof(int);
        in = DeviceBuffer(*backend, bytes, MemoryCategory::data);
        tg = DeviceBuffer(*backend, bytes, MemoryCategory::data);
        backend->copy_to_device(in.get(), inputs.data(), bytes);
        backend->copy_to_device(tg.get(), targets.data(), bytes);
    }
    float step(bool update) {
        model->zero_grad();
        model->forward(in.as<int>(), tg.as<int>(), B, T);
        const float loss = model->loss();
        model->backward();
        if (update) opt->step();
        return loss;
    }
};

struct Case {
    const char* name;
    Precision precision;
    KernelChoice kernels;
    TrainableOptions trainable = {};
};

class CudaTraining : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override { MT_SKIP_WITHOUT_CUDA(); }
};

TrainableOptions lora(bool int8) {
    TrainableOptions t;
    t.lora.rank = 4;
    t.lora.alpha = 8.0f;
    t.quantize_frozen = int8 ? QuantizeFrozen::int8 : QuantizeFrozen::none;
    return t;
}
TrainableOptions freeze(std::vector<std::string> names, bool int8) {
    TrainableOptions t;
    t.freeze = std::move(names);
    t.quantize_frozen = int8 ? QuantizeFrozen::int8 : QuantizeFrozen::none;
    return t;
}

KernelChoice kc(AttentionImpl a, ClassifierImpl c, LayerNormImpl l, bool gelu) {
    KernelChoice k;
    k.attention = a;
    k.classifier = c;
    k.layernorm = l;
    k.fuse_gelu = gelu;
    return k;
}

// kernels.memory_access: packed128 (the 128-bit memory-bound kernels) on top of `k`.
KernelChoice packed128(KernelChoice k) {
    k.memory_access = MemoryAccess::packed128;
    return k;
}

INSTANTIATE_TEST_SUITE_P(
    Variants, CudaTraining,
    ::testing::Values(
        Case{"fp32_naive", Precision::fp32,
             kc(AttentionImpl::naive, ClassifierImpl::fused, LayerNormImpl::separate, false)},
        Case{"fp32_flash_fusedall", Precision::fp32,
             kc(AttentionImpl::flash, ClassifierImpl::fused, LayerNormImpl::fused_residual, true)},
        Case{"fp32_unfused_classifier", Precision::fp32,
             kc(AttentionImpl::naive, ClassifierImpl::unfused, LayerNormImpl::separate, false)},
        Case{"bf16_naive", Precision::bf16,
             kc(AttentionImpl::naive, ClassifierImpl::fused, LayerNormImpl::separate, false)},
        Case{"bf16_flash", Precision::bf16,
             kc(AttentionImpl::flash, ClassifierImpl::fused, LayerNormImpl::fused_residual, true)},
        Case{"fp32_lora", Precision::fp32,
             kc(AttentionImpl::naive, ClassifierImpl::fused, LayerNormImpl::separate, true),
             lora(false)},
        Case{"bf16_lora_int8", Precision::bf16,
             kc(AttentionImpl::flash, ClassifierImpl::fused, LayerNormImpl::fused_residual, true),
             lora(true)},
        Case{"fp32_freeze_lower_int8", Precision::fp32,
             kc(AttentionImpl::naive, ClassifierImpl::fused, LayerNormImpl::separate, false),
             freeze({"wte", "wpe", "h.0"}, true)},
        Case{"fp32_packed128", Precision::fp32,
             packed128(kc(AttentionImpl::flash, ClassifierImpl::fused, LayerNormImpl::separate,
                          false))},
        Case{"bf16_packed128_fused", Precision::bf16,
             packed128(kc(AttentionImpl::flash, ClassifierImpl::fused,
                          LayerNormImpl::fused_residual, true))},
        Case{"fp32_lora_packed128", Precision::fp32,
             packed128(kc(AttentionImpl::naive, ClassifierImpl::fused,
                          LayerNormImpl::fused_residual, false)),
             lora(false)},
        Case{"fp32_freeze_some", Precision::fp32,
             kc(AttentionImpl::flash, ClassifierImpl::unfused, LayerNormImpl::separate, false),
             freeze({"h.1.attn", "ln_f.weight", "wpe"}, false)}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

GPTConfig small_config() {
    GPTConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.max_seq_len = 32;
    c.vocab_size = 200;  // padded to 256: the padding columns are exercised
    return c;
}

TEST_P(CudaTraining, StepAndTenStepLossMatchCpu) {
    const Case c = GetParam();
    const GPTConfig cfg = small_config();
    const int B = 2, T = 32;
    // Weights from the CPU's deterministic init, so both sides start identical.
    std::vector<float> params;
    {
        auto cpu = create_backend(BackendKind::cpu);
        ModelOptions mo;
        mo.trainable = c.trainable;
        GPT init(*cpu, cfg, mo);
        init.init_weights(1337);
        params = init.get_params();
        // LoRA's B starts at zero, which would make dA zero on both sides: perturb it.
        const auto noise = test::randn(params.size(), 9, 0.02f);
        for (const auto& t : init.parameter_table().tensors())
            if (t.lora)
                for (size_t i = 0; i < t.count; ++i) params[t.offset + i] += noise[t.offset + i];
    }
    const auto tokens = test::randint(size_t(B) * T + 1, cfg.vocab_size, 5);
    std::vector<int> inputs(tokens.begin(), tokens.end() - 1),
        targets(tokens.begin() + 1, tokens.end());
    KernelChoice cpu_k = c.kernels;
    cpu_k.memory_access = MemoryAccess::scalar;  // packed128 is the CUDA kernels' load width
    Rig cpu(BackendKind::cpu, Precision::fp32, cpu_k, c.trainable, cfg, params, inputs, targets, B,
            T);
    Rig gpu(BackendKind::cuda, c.precision, c.kernels, c.trainable, cfg, params, inputs, targets, B,
            T);
    const bool bf16 = c.precision == Precision::bf16;

    // One forward + backward: loss and every parameter gradient.
    const float lc = cpu.step(false), lg = gpu.step(false);
    EXPECT_NEAR(lg, lc, bf16 ? 2e-2 * lc : 1e-4 * lc);
    const auto gc = cpu.model->get_grads(), gg = gpu.model->get_grads();
    for (const auto& t : cpu.model->parameter_table().tensors()) {
        std::vector<float> a(gg.begin() + t.offset, gg.begin() + t.offset + t.count);
        std::vector<float> b(gc.begin() + t.offset, gc.begin() + t.offset + t.count);
        // Gradients are O(1e-2..1e-4); fp32 1e-3 relative + 1e-6, bf16 10% + 1e-3 (bf16
        // activations and activation gradients are rounded at every op of the chain).
        EXPECT_TRUE(
            test::close(a, b, bf16 ? test::Tol{1e-1, 1e-3} : test::Tol{1e-3, 1e-6}, t.name));
    }

    // Ten optimizer steps from the same start: the loss curves stay together.
    Rig cpu2(BackendKind::cpu, Precision::fp32, cpu_k, c.trainable, cfg, params, inputs, targets, B,
             T);
    Rig gpu2(BackendKind::cuda, c.precision, c.kernels, c.trainable, cfg, params, inputs, targets,
             B, T);
    float first = 0, last_c = 0, last_g = 0;
    for (int s = 0; s < 10; ++s) {
        last_c = cpu2.step(true);
        last_g = gpu2.step(true);
        if (s == 0) first = last_c;
        // Adam normalises each update, so gradient bits that differ in the last place can move a
        // near-zero-gradient parameter by +-lr: 2e-3 relative on the loss after 10 steps.
        EXPECT_NEAR(last_g, last_c, bf16 ? 2e-2 * last_c : 2e-3 * last_c) << "step " << s;
    }
    EXPECT_LT(last_c, first) << "the CPU reference did not learn: the test would prove nothing";
    EXPECT_TRUE(std::isfinite(last_g));
}

}  // namespace
}  // namespace mt

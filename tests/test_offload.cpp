// Offload on the CPU backend, where every copy is synchronous: what can be checked without a GPU.
//   run.offload activations: the rotating slots and the per-layer ranges of the activation plan
//     (every layer's saved activations survive the trip through the host buffer: losses and
//     gradients bitwise equal to the plain run), the smaller activation arena, the host arena,
//     and the estimate that predicts both.
//   optim.offload: the chunked host update is bitwise the one-pass update; AdamW with offload
//     gives bitwise the weights and moments of AdamW on the device and holds no device state.
//   The knobs: CUDA-only (a CPU variant is skipped with "needs a GPU (...)"), their bad values.
// The stream/event ordering itself needs a device: tests/cuda/test_cuda_offload.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "engine/training_session.h"
#include "experiment/runner.h"
#include "experiment/spec.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/optimizer_offload.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// 6 layers: with 3 device slots, layers 0..2 travel to the host and back.
GPTConfig six_layers() {
    GPTConfig c;
    c.n_layer = 6;
    c.n_head = 2;
    c.n_embd = 32;
    c.max_seq_len = 16;
    c.vocab_size = 128;
    return c;
}
constexpr int kB = 2, kT = 16;

std::unique_ptr<Backend> cpu_backend(const KernelChoice& kernels = {}) {
    BackendOptions o;
    o.num_threads = 1;
    o.kernels = kernels;
    return create_backend(BackendKind::cpu, o);
}

std::vector<int> tokens(uint32_t seed) {
    std::vector<int> t(static_cast<size_t>(kB) * kT);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int>((i * 37 + seed * 11) % 128);
    return t;
}

// One model on its own backend with its batch on the "device".
struct Rig {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<GPT> model;
    DeviceBuffer in, tg;
    Rig(const GPTConfig& cfg, ModelOptions mo, const KernelChoice& kernels = {})
        : backend(cpu_backend(kernels)) {
        model = std::make_unique<GPT>(*backend, cfg, mo);
        model->init_weights(42);
        model->allocate_activations(kB, kT);
        const std::vector<int> x = tokens(1), y = tokens(2);
        in = DeviceBuffer(*backend, x.size() * 4, MemoryCategory::data);
        tg = DeviceBuffer(*backend, y.size() * 4, MemoryCategory::data);
        backend->copy_to_device(in.get(), x.data(), x.size() * 4);
        backend->copy_to_device(tg.get(), y.data(), y.size() * 4);
    }
    float forward_backward() {
        model->zero_grad();
        model->forward(in.as<int>(), tg.as<int>(), kB, kT);
        const float loss = model->loss();
        model->backward();
        return loss;
    }
};

struct PlanCase {
    const char* name;
    LayerNormImpl layernorm;
    bool fuse_gelu;
    Recompute recompute;
    AttentionImpl attention;
};

void PrintTo(const PlanCase& p, std::ostream* os) {
    *os << p.name;
}

class ActivationOffloadCpu : public ::testing::TestWithParam<PlanCase> {};

INSTANTIATE_TEST_SUITE_P(
    Plans, ActivationOffloadCpu,
    ::testing::Values(
        PlanCase{"separate_ln", LayerNormImpl::separate, false, Recompute::none,
                 AttentionImpl::naive},
        // The fused residual+LayerNorm writes layer l+1's ln_1 from layer l: across slots.
        PlanCase{"fused_ln_gelu", LayerNormImpl::fused_residual, true, Recompute::none,
                 AttentionImpl::naive},
        PlanCase{"recompute_gelu_flash", LayerNormImpl::fused_residual, false, Recompute::gelu,
                 AttentionImpl::flash},
        PlanCase{"recompute_ln_gelu", LayerNormImpl::separate, false, Recompute::layernorm_gelu,
                 AttentionImpl::naive}),
    [](const auto& info) { return std::string(info.param.name); });

KernelChoice kernels_of(const PlanCase& p) {
    KernelChoice k;
    k.layernorm = p.layernorm;
    k.fuse_gelu = p.fuse_gelu;
    k.attention = p.attention;
    return k;
}

ModelOptions options_of(const PlanCase& p, OffloadMode offload) {
    ModelOptions mo;
    mo.recompute = p.recompute;
    mo.offload = offload;
    return mo;
}

TEST_P(ActivationOffloadCpu, LossesAndGradientsAreBitwiseThoseOfThePlainRun) {
    Rig plain(six_layers(), options_of(GetParam(), OffloadMode::none), kernels_of(GetParam()));
    Rig off(six_layers(), options_of(GetParam(), OffloadMode::activations), kernels_of(GetParam()));
    AdamW opt_plain(*plain.model, AdamWConfig{});
    AdamW opt_off(*off.model, AdamWConfig{});
    for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(plain.forward_backward(), off.forward_backward()) << "step " << step;
        EXPECT_EQ(plain.model->get_grads(), off.model->get_grads()) << "step " << step;
        opt_plain.step();
        opt_off.step();
    }
    EXPECT_EQ(plain.model->get_params(), off.model->get_params());
}

TEST_P(ActivationOffloadCpu, TheDeviceKeepsThreeLayersAndTheEstimateSaysSo) {
    Rig plain(six_layers(), options_of(GetParam(), OffloadMode::none), kernels_of(GetParam()));
    Rig off(six_layers(), options_of(GetParam(), OffloadMode::activations), kernels_of(GetParam()));
    const auto act = static_cast<int>(MemoryCategory::activations);
    const auto data = static_cast<int>(MemoryCategory::data);
    const MemoryStats p = plain.backend->memory_stats(), o = off.backend->memory_stats();
    EXPECT_LT(o.current[act], p.current[act]);
    // The estimate is what the allocator saw: the arena, and the host arena under `data`.
    const MemoryEstimate ep = GPT::estimate_memory(
        six_layers(), options_of(GetParam(), OffloadMode::none), kB, kT, *plain.backend);
    const MemoryEstimate eo = GPT::estimate_memory(
        six_layers(), options_of(GetParam(), OffloadMode::activations), kB, kT, *off.backend);
    EXPECT_EQ(ep.activations, p.current[act]);
    EXPECT_EQ(eo.activations, o.current[act]);
    EXPECT_EQ(ep.host_pinned, 0u);
    EXPECT_GT(eo.host_pinned, 0u);
    EXPECT_EQ(o.current[data] - p.current[data], eo.host_pinned);
    EXPECT_EQ(eo.device_total() + eo.host_pinned, eo.total());
    // Three of six layers travel: the host holds as much per-layer memory as the device saves
    // (these shapes make every part of a layer's host range a multiple of 256 bytes).
    EXPECT_EQ(p.current[act] - o.current[act], eo.host_pinned);
}

TEST(ActivationOffload, ChangesNothingWhenTheModelHasNoMoreLayersThanSlots) {
    GPTConfig cfg = six_layers();
    cfg.n_layer = ActivationOffload::kSlots;
    ModelOptions off;
    off.offload = OffloadMode::activations;
    auto be = cpu_backend();
    const MemoryEstimate a = GPT::estimate_memory(cfg, ModelOptions{}, kB, kT, *be);
    const MemoryEstimate b = GPT::estimate_memory(cfg, off, kB, kT, *be);
    EXPECT_EQ(a.activations, b.activations);
    EXPECT_EQ(b.host_pinned, 0u);
}

TEST(ActivationOffload, AForwardWithoutTargetsLeavesTheNextTrainingStepIntact) {
    ModelOptions off;
    off.offload = OffloadMode::activations;
    Rig plain(six_layers(), ModelOptions{});
    Rig o(six_layers(), off);
    // An evaluation forward (no loss, no backward: nothing goes to the host) in between.
    o.model->forward(o.in.as<int>(), nullptr, kB, kT);
    EXPECT_EQ(plain.forward_backward(), o.forward_backward());
    EXPECT_EQ(plain.model->get_grads(), o.model->get_grads());
}

// ---- optimizer-state offload ----------------------------------------------------------------

TEST(OptimizerOffload, ChunkedHostUpdateIsBitwiseTheOnePassUpdate) {
    auto device = cpu_backend(), host = cpu_backend();
    const size_t n = 5000;
    // Three tensors whose boundaries fall inside chunks of 1000, mixed decay.
    const std::vector<TensorSlice> slices{{0, 1500, true}, {1500, 700, false}, {2200, 2800, true}};
    std::vector<float> p0(n), g(n);
    for (size_t i = 0; i < n; ++i) {
        p0[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
        g[i] = 0.003f * static_cast<float>(static_cast<int>(i % 31) - 15);
    }
    for (bool clip : {false, true}) {
        DeviceBuffer dp(*device, n * 4, MemoryCategory::params),
            dg(*device, n * 4, MemoryCategory::grads);
        DeviceBuffer scale(*device, 4, MemoryCategory::workspace);
        const float half = 0.5f;
        device->copy_to_device(dp.get(), p0.data(), n * 4);
        device->copy_to_device(dg.get(), g.data(), n * 4);
        device->copy_to_device(scale.get(), &half, 4);
        OptimizerOffload off(*device, *host, n, slices, 1000);
        std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
        for (int t = 1; t <= 3; ++t) {
            const AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t};
            off.update(dp.as<float>(), dg.as<float>(), clip ? scale.as<float>() : nullptr, hp, 0);
            host->run(op::AdamWUpdate{.params = p.data(),
                                      .grads = g.data(),
                                      .m = m.data(),
                                      .v = v.data(),
                                      .tensors = slices,
                                      .total = n,
                                      .hp = hp,
                                      .grad_scale = clip ? &half : nullptr});
        }
        std::vector<float> got(n);
        device->copy_to_host(got.data(), dp.get(), n * 4);
        EXPECT_EQ(got, p) << "clip " << clip;
        EXPECT_EQ(off.get_m(), m);
        EXPECT_EQ(off.get_v(), v);
    }
}

AdamWConfig offloaded(bool on) {
    AdamWConfig c;
    c.grad_clip = 0.5f;  // small enough to clip: the clip factor travels with the gradients
    c.offload = on;
    return c;
}

TEST(OptimizerOffload, AdamWMatchesTheDeviceUpdateBitwiseAndHoldsNoDeviceState) {
    Rig plain(six_layers(), ModelOptions{});
    Rig off(six_layers(), ModelOptions{});
    auto host = cpu_backend();
    AdamW opt_plain(*plain.model, offloaded(false));
    AdamW opt_off(*off.model, offloaded(true), {}, host.get());
    const auto optimizer = static_cast<int>(MemoryCategory::optimizer);
    EXPECT_GT(plain.backend->memory_stats().current[optimizer], 0u);
    EXPECT_EQ(off.backend->memory_stats().current[optimizer], 0u);
    for (int step = 0; step < 3; ++step) {
        EXPECT_EQ(plain.forward_backward(), off.forward_backward()) << "step " << step;
        opt_plain.step();
        opt_off.step();
        EXPECT_EQ(opt_plain.last_grad_norm(), opt_off.last_grad_norm());
    }
    EXPECT_EQ(plain.model->get_params(), off.model->get_params());
    EXPECT_EQ(opt_plain.get_m(), opt_off.get_m());
    EXPECT_EQ(opt_plain.get_v(), opt_off.get_v());
}

TEST(OptimizerOffload, WeightsAndStateSetFromOutsideAreTakenUp) {
    Rig plain(six_layers(), ModelOptions{});
    Rig off(six_layers(), ModelOptions{});
    auto host = cpu_backend();
    AdamW opt_plain(*plain.model, offloaded(false));
    AdamW opt_off(*off.model, offloaded(true), {}, host.get());
    plain.forward_backward();
    off.forward_backward();
    opt_plain.step();
    opt_off.step();
    // As a checkpoint load does: new weights, then moments and the step count.
    std::vector<float> w = plain.model->get_params();
    for (float& x : w) x *= 0.5f;
    const std::vector<float> m = opt_plain.get_m(), v = opt_plain.get_v();
    plain.model->set_params(w);
    off.model->set_params(w);
    opt_plain.set_state(m, v, 1);
    opt_off.set_state(m, v, 1);
    EXPECT_EQ(plain.forward_backward(), off.forward_backward());
    opt_plain.step();
    opt_off.step();
    EXPECT_EQ(plain.model->get_params(), off.model->get_params());
    EXPECT_EQ(opt_plain.get_v(), opt_off.get_v());
}

TEST(OptimizerOffload, IsRefusedWithoutAHostBackendAndWithAZeroOnePartition) {
    Rig r(six_layers(), ModelOptions{});
    auto host = cpu_backend();
    EXPECT_THROW(
        {
            AdamW opt(*r.model, offloaded(true));
            (void)opt;
        },
        std::invalid_argument);
    AdamWPartition zero1;
    zero1.owned.push_back({0, 100});
    try {
        AdamW opt(*r.model, offloaded(true), zero1, host.get());
        (void)opt;
        FAIL() << "ZeRO-1 with offload was accepted";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("dist.zero: 1"), std::string::npos) << e.what();
    }
}

// ---- the knobs ------------------------------------------------------------------------------

class OffloadKnobs : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("mt_test_offload_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        ::setenv("MICROTRAIN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string write(const std::string& variants, const std::string& extra = "") {
        const std::string path = (dir_ / "exp.yaml").string();
        std::ofstream(path) << "backend: cpu\n"
                               "model: { n_layer: 6, n_embd: 32, n_head: 2, max_seq_len: 16, "
                               "vocab_size: 128 }\n"
                               "data: { source: synthetic, batch_size: 2, seq_len: 16 }\n"
                               "run: { warmup_steps: 1, measure_steps: 2, threads: 1 }\n"
                            << extra << "variants:\n"
                            << variants << "report: { out_dir: " << (dir_ / "runs").string()
                            << " }\n";
        return path;
    }
    std::string error_of(const std::string& variants, const std::string& extra = "") {
        try {
            load_experiment(write(variants, extra));
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    fs::path dir_;
};

TEST_F(OffloadKnobs, AreCudaOnlyFeatures) {
    RunConfig c;
    c.run.offload = OffloadMode::activations;
    c.optim.offload = true;
    EXPECT_EQ(cuda_only_features(c),
              (std::vector<std::string>{"run.offload activations", "optim.offload"}));
}

TEST_F(OffloadKnobs, CpuVariantsAreSkippedAsNeedingAGpu) {
    const ExperimentSpec spec = load_experiment(
        write("  - name: baseline\n"
              "  - name: offload-activations\n    set: { run.offload: activations }\n"
              "  - name: offload-optimizer\n    set: { optim.offload: true }\n"));
    RunnerOptions o;
    o.out = nullptr;
    o.handle_sigint = false;
    const ExperimentRun ex = run_experiment(spec, o);
    ASSERT_EQ(ex.results.variants.size(), 3u);
    EXPECT_EQ(ex.results.variants[0].status, RunStatus::ok) << ex.results.variants[0].message;
    EXPECT_EQ(ex.results.variants[1].status, RunStatus::skipped);
    EXPECT_NE(ex.results.variants[1].message.find("needs a GPU (run.offload activations)"),
              std::string::npos)
        << ex.results.variants[1].message;
    EXPECT_EQ(ex.results.variants[2].status, RunStatus::skipped);
    EXPECT_NE(ex.results.variants[2].message.find("needs a GPU (optim.offload)"), std::string::npos)
        << ex.results.variants[2].message;
}

TEST_F(OffloadKnobs, ValidateNotesThatTheyNeedAGpu) {
    const std::string path =
        write("  - name: a\n  - name: b\n    set: { run.offload: activations }\n");
    std::string out;
    std::unique_ptr<FILE, int (*)(FILE*)> f(
        ::popen((std::string(MT_BINARY) + " validate " + path + " 2>&1").c_str(), "r"), ::pclose);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) out.append(buf, n);
    EXPECT_EQ(::pclose(f.release()), 0) << out;
    EXPECT_NE(out.find("note: needs a GPU (run.offload activations); backend is cpu"),
              std::string::npos)
        << out;
}

TEST_F(OffloadKnobs, BadValuesSayWhatIsExpected) {
    const std::string bad_mode =
        error_of("  - name: a\n  - name: b\n    set: { run.offload: weights }\n");
    EXPECT_NE(bad_mode.find("key 'run.offload' (variant 'b'): expected one of none | activations, "
                            "got 'weights'"),
              std::string::npos)
        << bad_mode;
    const std::string bad_bool =
        error_of("  - name: a\n  - name: b\n    set: { optim.offload: cpu }\n");
    EXPECT_NE(bad_bool.find("optim.offload"), std::string::npos) << bad_bool;
    const std::string zero1 = error_of(
        "  - name: a\n  - name: b\n    set: { optim.offload: true }\n", "dist: { zero: 1 }\n");
    EXPECT_NE(zero1.find("expected optim.offload: false with dist.zero: 1"), std::string::npos)
        << zero1;
}

TEST_F(OffloadKnobs, TheEstimateMovesTheMomentsToPinnedHostMemory) {
    const ExperimentSpec spec =
        load_experiment(write("  - name: a\n  - name: b\n    set: { optim.offload: true }\n"));
    auto be = cpu_backend();
    MemoryEstimate plain, off;
    check_memory_fits(spec.variants[0], *be, &plain);
    check_memory_fits(spec.variants[1], *be, &off);
    const size_t n = static_cast<size_t>(six_layers().parameter_count());
    EXPECT_GT(plain.optimizer, 0u);
    EXPECT_EQ(off.optimizer, 0u);
    EXPECT_EQ(off.host_pinned, OptimizerOffload::host_bytes(n));
    EXPECT_EQ(off.data, plain.data + off.host_pinned);
}

}  // namespace
}  // namespace mt

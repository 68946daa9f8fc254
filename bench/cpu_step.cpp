// cpu_step: times microtrain's training step on the CPU backend, phase by phase, the way
// bench/torch_cpu_step.py times PyTorch eager, so bench/run_cpu_bench.sh can put them side by
// side. A benchmark, not a test: it prints numbers and asserts nothing about them.
//
//   cpu_step --preset gpt2-mini -B 4 -T 256 --threads 2 --warmup 2 --steps 5 [--json out.json]
//            [--probe] [--profile]
//
// One step = zero_grad + forward (to the loss, read back) + backward + optimizer (global-norm
// clip + fused AdamW), timed with std::chrono::steady_clock between the calls (CPU ops are
// synchronous, so a clock read after a call is when its work is done). Phases:
//   forward   = model.forward(...) + model.loss()
//   backward  = model.zero_grad() + model.backward()     (PyTorch: zero_grad + loss.backward())
//   optimizer = AdamW::step()                            (PyTorch: clip_grad_norm_ + opt.step())
// step = their sum measured end to end (one clock read per boundary, nothing in between).
//
// Model FLOPs per step are GPT::training_flops_per_step (6 N_matmul_params B T + 12 L C T B T, the
// nanoGPT/PaLM count); achieved GFLOP/s = that / median step time. The same formula is evaluated
// independently by the PyTorch script, so both sides are divided by the same work.
//
// --probe measures, in this process, after the steps and with the same thread count:
//   sgemm: the backend's own matmul_forward (kernels/cpu/gemm.h — the packed AVX-512 GEMM, or
//          Eigen's where that is not compiled — with mt_core's flags, exactly the GEMM the model
//          runs) on 1024x1024x1024 and on the model's largest GEMM (the LM head,
//          (B*T, C) x (C, Vp)), median of 5 reps after 1 warm-up. 2 M K N flops per rep. The
//          roofline's compute peak is the faster of the two (the best GEMM rate seen here).
//   copy:  a 256 MiB memcpy split across the threads (each copies its contiguous slice),
//          median of 5; bandwidth counts bytes read + written (2 x 256 MiB), the same convention
//          as the analytic bytes in kernels/op_costs.h.
// Peak RSS (getrusage ru_maxrss) is read before the probes, so their buffers never count.
//
// --profile (implies --probe) attaches an OpObserver to the model: each op the model scopes
// (kernels/op_costs.h gives its analytic flops and bytes) is timed with steady_clock over the
// measured steps and aggregated per op and, for matmuls, per layer shape. The table gives
// ms/step, % of step, GFLOP/s, GB/s, the arithmetic intensity and the roofline verdict against
// the probes: ridge = sgemm probe FLOP/s / copy GB/s; an op below the ridge is memory-bound and
// its attainable rate is intensity x bandwidth, above it compute-bound (attainable = sgemm
// probe). "% roof" = achieved / attainable. Two bandwidths are measured: DRAM (256 MiB copy)
// and in-cache (a copy of a quarter of the L3 size, from sysfs); an op whose analytic bytes per
// call fit in the L3 is judged against the in-cache rate (mem-LLC), otherwise DRAM (mem-DRAM). Time
// not inside any op (memsets of gradient scratch, the clip-scale scalar, loss read-back) is listed
// as "(outside ops)".
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double median(std::vector<double> v) {
    if (v.empty()) throw std::invalid_argument("median of an empty series");
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

json series_json(const std::vector<double>& v) {
    return {{"median", median(v)},
            {"min", *std::min_element(v.begin(), v.end())},
            {"max", *std::max_element(v.begin(), v.end())},
            {"all", v}};
}

// Peak resident set size of this process in MiB (Linux reports ru_maxrss in KiB).
double peak_rss_mib() {
    rusage ru{};
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

std::string cpu_model() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) {
            auto s = line.substr(line.find(':') + 1);
            return s.substr(std::min(s.size(), s.find_first_not_of(" \t")));
        }
    return "unknown";
}

// ---- probes -----------------------------------------------------------------------------------

struct GemmProbe {
    int M = 0, K = 0, N = 0;
    double gflops = 0;  // median over reps
};

// out (M,N) = a (M,K) b(N,K)^T through the backend's matmul_forward (no bias): the GEMM the
// model runs, with mt_core's compile flags. Operands are filled with small values (not zeros, so
// no denormal or zero shortcut can flatter the number).
GemmProbe probe_gemm(mt::Backend& be, int M, int K, int N, int reps) {
    using mt::MemoryCategory;
    mt::DeviceBuffer a(be, sizeof(float) * size_t(M) * K, MemoryCategory::workspace);
    mt::DeviceBuffer b(be, sizeof(float) * size_t(N) * K, MemoryCategory::workspace);
    mt::DeviceBuffer c(be, sizeof(float) * size_t(M) * N, MemoryCategory::workspace);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (size_t i = 0; i < size_t(M) * K; ++i) a.as<float>()[i] = u(rng);
    for (size_t i = 0; i < size_t(N) * K; ++i) b.as<float>()[i] = u(rng);
    std::vector<double> ms;
    for (int r = 0; r < reps + 1; ++r) {
        const auto t0 = Clock::now();
        be.run(mt::op::MatmulForward{.out = c.get(),
                                     .inp = a.get(),
                                     .weight = b.get(),
                                     .bias = nullptr,
                                     .N = M,
                                     .C = K,
                                     .OC = N});
        const auto t1 = Clock::now();
        if (r > 0) ms.push_back(ms_between(t0, t1));  // rep 0 warms caches and the pack buffers
    }
    if (!std::isfinite(c.as<float>()[0]))
        throw std::runtime_error("sgemm probe produced a non-finite value");
    return {M, K, N, 2.0 * M * K * N / (median(ms) * 1e-3) / 1e9};
}

// Copy bandwidth: `bytes` memcpy'd `inner` times per timed rep, each of the OpenMP threads
// copying one contiguous slice. Returns GB/s counting read + write (2 x bytes per copy).
double probe_copy_gbps(size_t bytes, int reps, int inner) {
    std::vector<char> src(bytes), dst(bytes);
    std::memset(src.data(), 1, bytes);  // touch every page before timing
    std::memset(dst.data(), 2, bytes);
    std::vector<double> ms;
    for (int r = 0; r < reps + 1; ++r) {
        const auto t0 = Clock::now();
        for (int i = 0; i < inner; ++i)
#pragma omp parallel
        {
            const size_t nt = static_cast<size_t>(omp_get_num_threads());
            const size_t id = static_cast<size_t>(omp_get_thread_num());
            const size_t chunk = (bytes + nt - 1) / nt;
            const size_t lo = std::min(bytes, id * chunk), hi = std::min(bytes, lo + chunk);
            std::memcpy(dst.data() + lo, src.data() + lo, hi - lo);
        }
        const auto t1 = Clock::now();
        if (r > 0) ms.push_back(ms_between(t0, t1));
    }
    if (dst[bytes / 2] != 1) throw std::runtime_error("copy probe: the copy did not happen");
    return 2.0 * static_cast<double>(bytes) * inner / (median(ms) * 1e-3) / 1e9;
}

// Size of the last-level (L3) cache in bytes from sysfs; 0 when the kernel does not say.
size_t llc_bytes() {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string s;
    if (!(f >> s) || s.empty()) return 0;
    size_t mult = 1;
    if (s.back() == 'K') mult = size_t(1) << 10;
    if (s.back() == 'M') mult = size_t(1) << 20;
    try {
        return static_cast<size_t>(std::stoull(s)) * mult;
    } catch (const std::exception&) {
        return 0;
    }
}

// ---- per-op profile ---------------------------------------------------------------------------

// Names each matmul call by the layer whose shape produced its analytic cost, so the table can
// tell the LM head from the MLP: "matmul_forward fc (1024x256 -> 1024)".
class ShapeNamer {
  public:
    ShapeNamer(const mt::GPTConfig& cfg, int B, int T) {
        const long long N = static_cast<long long>(B) * T, C = cfg.n_embd;
        const long long Vp = cfg.padded_vocab_size();
        const struct {
            const char* layer;
            long long in, out;
        } layers[] = {{"qkv", C, 3 * C},
                      {"attn_proj", C, C},
                      {"fc", C, 4 * C},
                      {"fc_proj", 4 * C, C},
                      {"lm_head", C, Vp}};
        for (const auto& l : layers) {
            // Layers of identical shape (tiny: lm_head C->Vp=256 is fc's C->4C) share one row.
            std::string layer;
            for (const auto& o : layers)
                if (o.in == l.in && o.out == l.out)
                    layer += (layer.empty() ? "" : "+") + std::string(o.layer);
            const std::string shape = " " + layer + " (N" + std::to_string(N) + " " +
                                      std::to_string(l.in) + "->" + std::to_string(l.out) + ")";
            names_.push_back({"matmul_forward",
                              mt::op::MatmulForward{.N = static_cast<int>(N),
                                                    .C = static_cast<int>(l.in),
                                                    .OC = static_cast<int>(l.out)}
                                  .record(4)
                                  .flops,
                              "matmul_forward" + shape});
            names_.push_back({"matmul_gelu_forward",
                              mt::op::MatmulForward{.N = static_cast<int>(N),
                                                    .C = static_cast<int>(l.in),
                                                    .OC = static_cast<int>(l.out)}
                                  .record(4)
                                  .flops,
                              "matmul_gelu_forward" + shape});
            names_.push_back({"matmul_backward",
                              mt::op::MatmulBackward{.N = static_cast<int>(N),
                                                     .C = static_cast<int>(l.in),
                                                     .OC = static_cast<int>(l.out)}
                                  .record(4)
                                  .flops,
                              "matmul_backward" + shape});
        }
    }
    std::string name(const mt::OpRecord& op) const {
        for (const auto& n : names_)
            if (op.name == n.op && std::abs(op.flops - n.flops) <= 1e-9 * n.flops) return n.label;
        return std::string(op.name);
    }

  private:
    struct Entry {
        std::string op;
        double flops;
        std::string label;
    };
    std::vector<Entry> names_;
};

struct OpStat {
    long long calls = 0;
    double ms = 0, flops = 0, bytes = 0;
    bool is_matmul = false;
};

// The model's OpObserver: steady_clock at op_begin/op_end (ops are synchronous on the CPU), a
// stack for nesting (time is charged to the innermost op only, so nothing counts twice).
class StepProfiler final : public mt::OpObserver {
  public:
    explicit StepProfiler(ShapeNamer namer) : namer_(std::move(namer)) {}
    bool recording = false;

    void op_begin(const mt::OpRecord& op) override {
        const auto now = Clock::now();
        // The enclosing op (if any) pauses: bank its own time so far.
        if (!stack_.empty()) stack_.back().self_ms += ms_between(stack_.back().t0, now);
        stack_.push_back({op, now, 0.0});
    }
    void op_end(const mt::OpRecord& op) override {
        const auto now = Clock::now();
        if (stack_.empty() || stack_.back().op.name != op.name)
            throw std::logic_error("op_end(" + std::string(op.name) + ") without its op_begin");
        Open o = stack_.back();
        stack_.pop_back();
        const double self_ms = o.self_ms + ms_between(o.t0, now);
        if (!stack_.empty()) stack_.back().t0 = now;  // the enclosing op resumes
        if (!recording) return;
        OpStat& s = stats_[namer_.name(op)];
        s.calls++;
        s.ms += self_ms;
        s.flops += op.flops;
        s.bytes += op.bytes;
        s.is_matmul = op.name.find("matmul") != std::string_view::npos;
    }
    const std::map<std::string, OpStat>& stats() const { return stats_; }

  private:
    struct Open {
        mt::OpRecord op;
        Clock::time_point t0;  // when this op last (re)started running
        double self_ms;        // own time banked before a nested op paused it
    };
    ShapeNamer namer_;
    std::vector<Open> stack_;
    std::map<std::string, OpStat> stats_;
};

// ---- the benchmark ----------------------------------------------------------------------------

struct Args {
    std::string preset;
    int B = 4, T = 0, threads = 2, warmup = 2, steps = 5;
    uint64_t seed = 1337;
    std::string json_path;
    bool probe = false, profile = false;
    std::string attention = "naive", classifier = "fused", layernorm = "separate";
    bool fuse_gelu = false;
};

int run(const Args& a) {
    auto cfg = mt::gpt_preset(a.preset);
    if (!cfg) {
        std::string names;
        for (const auto& n : mt::gpt_preset_names()) names += (names.empty() ? "" : ", ") + n;
        std::fprintf(stderr, "cpu_step: unknown --preset '%s'; expected one of: %s\n",
                     a.preset.c_str(), names.c_str());
        return 2;
    }
    const int T = a.T > 0 ? a.T : cfg->max_seq_len;
    if (T > cfg->max_seq_len) {
        std::fprintf(stderr,
                     "cpu_step: -T %d exceeds max_seq_len %d of preset '%s'; use -T <= %d\n", T,
                     cfg->max_seq_len, a.preset.c_str(), cfg->max_seq_len);
        return 2;
    }
    const int B = a.B;

    mt::BackendOptions bopt;
    bopt.precision = mt::Precision::fp32;
    bopt.num_threads = a.threads;
    bopt.kernels.attention =
        a.attention == "flash" ? mt::AttentionImpl::flash : mt::AttentionImpl::naive;
    bopt.kernels.classifier =
        a.classifier == "unfused" ? mt::ClassifierImpl::unfused : mt::ClassifierImpl::fused;
    bopt.kernels.layernorm = a.layernorm == "fused_residual" ? mt::LayerNormImpl::fused_residual
                                                             : mt::LayerNormImpl::separate;
    bopt.kernels.fuse_gelu = a.fuse_gelu;
    auto backend = mt::create_backend(mt::BackendKind::cpu, bopt);

    mt::ModelOptions mopt;
    mopt.kernels = bopt.kernels;
    mt::GPT model(*backend, *cfg, mopt);
    model.init_weights(a.seed);
    model.allocate_activations(B, T);
    mt::AdamWConfig ocfg;  // the PyTorch side uses the same values
    ocfg.lr = 3e-4f;
    ocfg.beta1 = 0.9f;
    ocfg.beta2 = 0.95f;
    ocfg.eps = 1e-8f;
    ocfg.weight_decay = 0.1f;
    ocfg.grad_clip = 1.0f;
    ocfg.impl = mt::AdamWImpl::fused;
    mt::AdamW opt(model, ocfg);

    // Synthetic batch: B*T+1 uniform tokens, targets = inputs shifted by one (as nanoGPT's
    // get_batch).
    const size_t n = static_cast<size_t>(B) * T;
    std::vector<int> tokens(n + 1);
    std::mt19937 rng(static_cast<uint32_t>(a.seed));
    for (auto& t : tokens) t = static_cast<int>(rng() % static_cast<uint32_t>(cfg->vocab_size));
    std::vector<int> in(tokens.begin(), tokens.end() - 1), tg(tokens.begin() + 1, tokens.end());
    mt::DeviceBuffer d_in(*backend, n * sizeof(int), mt::MemoryCategory::data);
    mt::DeviceBuffer d_tg(*backend, n * sizeof(int), mt::MemoryCategory::data);
    backend->copy_to_device(d_in.get(), in.data(), n * sizeof(int));
    backend->copy_to_device(d_tg.get(), tg.data(), n * sizeof(int));

    std::unique_ptr<StepProfiler> prof;
    if (a.profile) {
        prof = std::make_unique<StepProfiler>(ShapeNamer(*cfg, B, T));
        model.backend().set_op_observer(prof.get());
    }

    const double flops = model.training_flops_per_step(B, T);
    const size_t nparams = model.parameter_table().total_count();
    std::printf("cpu_step: microtrain %s (%s), %zu params, B=%d T=%d, %s\n", a.preset.c_str(),
                cfg->describe().c_str(), nparams, B, T, backend->device_name().c_str());
    std::printf("  kernels: attention=%s classifier=%s layernorm=%s fuse_gelu=%s%s\n",
                a.attention.c_str(), a.classifier.c_str(), a.layernorm.c_str(),
                a.fuse_gelu ? "on" : "off", a.profile ? "  [profiling: per-op clocks on]" : "");

    std::vector<double> fwd, bwd, optm, step, losses;
    for (int s = 0; s < a.warmup + a.steps; ++s) {
        const bool measured = s >= a.warmup;
        if (prof) prof->recording = measured;
        const auto t0 = Clock::now();
        model.forward(d_in.as<int>(), d_tg.as<int>(), B, T);
        const float loss = model.loss();
        const auto t1 = Clock::now();
        model.zero_grad();
        model.backward();
        const auto t2 = Clock::now();
        opt.step();
        backend->synchronize();
        const auto t3 = Clock::now();
        if (!std::isfinite(loss)) {
            std::fprintf(stderr, "cpu_step: loss is not finite (%f) at step %d\n", loss, s + 1);
            return 1;
        }
        std::printf("  step %2d %-7s loss %.4f  %9.1f ms (fwd %.1f bwd %.1f opt %.1f)\n", s + 1,
                    measured ? "" : "warmup", loss, ms_between(t0, t3), ms_between(t0, t1),
                    ms_between(t1, t2), ms_between(t2, t3));
        std::fflush(stdout);
        losses.push_back(loss);
        if (!measured) continue;
        fwd.push_back(ms_between(t0, t1));
        bwd.push_back(ms_between(t1, t2));
        optm.push_back(ms_between(t2, t3));
        step.push_back(ms_between(t0, t3));
    }
    model.backend().set_op_observer(nullptr);
    const double rss = peak_rss_mib();  // before the probes allocate anything
    const double step_ms = median(step);
    const double gflops = flops / (step_ms * 1e-3) / 1e9;

    json out;
    out["impl"] = "microtrain";
    out["preset"] = a.preset;
    out["model"] = {{"n_layer", cfg->n_layer},
                    {"n_head", cfg->n_head},
                    {"n_embd", cfg->n_embd},
                    {"vocab_size", cfg->vocab_size},
                    {"padded_vocab_size", cfg->padded_vocab_size()},
                    {"max_seq_len", cfg->max_seq_len},
                    {"params", nparams}};
    out["B"] = B;
    out["T"] = T;
    out["threads"] = a.threads;
    out["warmup"] = a.warmup;
    out["steps"] = a.steps;
    out["device"] = backend->device_name();
    out["cpu_model"] = cpu_model();
    out["kernels"] = {{"attention", a.attention},
                      {"classifier", a.classifier},
                      {"layernorm", a.layernorm},
                      {"fuse_gelu", a.fuse_gelu}};
    out["profiled"] = a.profile;
    out["step_ms"] = series_json(step);
    out["forward_ms"] = series_json(fwd);
    out["backward_ms"] = series_json(bwd);
    out["optimizer_ms"] = series_json(optm);
    out["tokens_per_s"] = static_cast<double>(n) / (step_ms * 1e-3);
    out["flops_per_step"] = flops;
    out["gflops"] = gflops;
    out["peak_rss_mib"] = rss;
    out["losses"] = losses;

    std::printf("  median step %.1f ms  (forward %.1f, backward %.1f, optimizer %.1f)\n", step_ms,
                median(fwd), median(bwd), median(optm));
    std::printf("  %.0f tokens/s, %.3f GFLOP/step, %.1f GFLOP/s, peak RSS %.0f MiB\n",
                static_cast<double>(n) / (step_ms * 1e-3), flops / 1e9, gflops, rss);

    double peak_flops = 0, bw = 0, bw_llc = 0;
    const size_t llc = llc_bytes();
    if (a.probe || a.profile) {
        const GemmProbe sq = probe_gemm(*backend, 1024, 1024, 1024, 5);
        const GemmProbe lm = probe_gemm(*backend, B * T, cfg->n_embd, cfg->padded_vocab_size(), 5);
        bw = probe_copy_gbps(size_t(256) << 20, 5, 1) * 1e9;
        // In-cache copy: source + destination = half the LLC, 20 copies per timed rep.
        if (llc >= (size_t(1) << 20)) bw_llc = probe_copy_gbps(llc / 4, 5, 20) * 1e9;
        peak_flops = std::max(sq.gflops, lm.gflops) * 1e9;
        out["probe"] = {{"sgemm_impl", std::string(mt::cpu::gemm_impl_name()) +
                                           " via CpuBackend::matmul_forward"},
                        {"sgemm_1024_gflops", sq.gflops},
                        {"sgemm_model_gflops", lm.gflops},
                        {"sgemm_model_shape", {lm.M, lm.K, lm.N}},
                        {"copy_gbps", bw / 1e9},
                        {"copy_mib", 256},
                        {"copy_llc_gbps", bw_llc / 1e9},
                        {"copy_llc_mib", static_cast<double>(llc / 4) / (1 << 20)},
                        {"llc_mib", static_cast<double>(llc) / (1 << 20)}};
        std::printf(
            "  probe: sgemm 1024^3 %.1f GFLOP/s, sgemm %dx%dx%d (LM head) %.1f GFLOP/s, "
            "copy %.1f GB/s DRAM, %.1f GB/s in LLC (read+write); step reaches %.0f%% of the "
            "1024^3 probe\n",
            sq.gflops, lm.M, lm.K, lm.N, lm.gflops, bw / 1e9, bw_llc / 1e9,
            100.0 * gflops / sq.gflops);
    }

    if (prof) {
        const double ridge = peak_flops / bw;  // flops per byte, against DRAM
        std::vector<std::pair<std::string, OpStat>> rows(prof->stats().begin(),
                                                         prof->stats().end());
        std::sort(rows.begin(), rows.end(),
                  [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
        const double steps = a.steps;
        double op_ms = 0;
        for (const auto& [k, s] : rows) op_ms += s.ms;
        const double mean_step = [&] {
            double t = 0;
            for (double v : step) t += v;
            return t / static_cast<double>(step.size());
        }();
        std::printf(
            "\n  per-op profile: mean over %d measured steps, step %.1f ms (mean); "
            "sgemm probe (best of the two) %.1f GFLOP/s, copy %.1f GB/s DRAM (ridge %.1f flop/B), "
            "%.1f GB/s in the "
            "%.0f MiB LLC\n",
            a.steps, mean_step, peak_flops / 1e9, bw / 1e9, ridge, bw_llc / 1e9,
            static_cast<double>(llc) / (1 << 20));
        std::printf("  %-44s %6s %9s %6s %8s %7s %7s %-8s %6s\n", "op", "calls", "ms/step", "%step",
                    "GFLOP/s", "GB/s", "flop/B", "bound", "%roof");
        json table = json::array();
        for (const auto& [name, s] : rows) {
            const double sec = s.ms * 1e-3;
            const double fl = sec > 0 ? s.flops / sec : 0, by = sec > 0 ? s.bytes / sec : 0;
            const double intensity = s.bytes > 0 ? s.flops / s.bytes : 0;
            // An op whose analytic bytes per call fit in the LLC streams (mostly) from cache
            // (its inputs were just written by the op before): its bandwidth roof is the
            // in-cache copy rate, otherwise DRAM's.
            const bool in_llc = bw_llc > 0 && s.bytes / static_cast<double>(s.calls) <= llc;
            const double op_bw = in_llc ? bw_llc : bw;
            const bool compute = intensity >= peak_flops / op_bw;
            const char* bound = compute ? "compute" : in_llc ? "mem-LLC" : "mem-DRAM";
            // Memory-bound ops are judged on bandwidth (achieved GB/s over the copy probe),
            // which equals achieved / attainable FLOP/s but also works for flop-free ops.
            const double roof = compute ? 100.0 * fl / peak_flops : 100.0 * by / op_bw;
            std::printf("  %-44s %6.0f %9.2f %5.1f%% %8.1f %7.1f %7.1f %-8s %5.0f%%\n",
                        name.c_str(), s.calls / steps, s.ms / steps,
                        100.0 * s.ms / steps / mean_step, fl / 1e9, by / 1e9, intensity, bound,
                        roof);
            table.push_back({{"op", name},
                             {"calls_per_step", s.calls / steps},
                             {"ms_per_step", s.ms / steps},
                             {"pct_of_step", 100.0 * s.ms / steps / mean_step},
                             {"gflops", fl / 1e9},
                             {"gbps", by / 1e9},
                             {"flops_per_byte", intensity},
                             {"bound", bound},
                             {"pct_of_roofline", roof}});
        }
        const double outside = mean_step - op_ms / steps;
        std::printf("  %-44s %6s %9.2f %5.1f%%\n", "(outside ops: memsets, clip scale, loss read)",
                    "", outside, 100.0 * outside / mean_step);
        out["profile"] = {{"ops", table},
                          {"outside_ops_ms_per_step", outside},
                          {"mean_step_ms", mean_step},
                          {"ridge_flops_per_byte", ridge}};
    }

    if (!a.json_path.empty()) {
        mt::write_file_atomic(a.json_path, out.dump(2) + "\n");
        std::printf("  wrote %s\n", a.json_path.c_str());
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{
        "cpu_step: times microtrain's CPU training step (forward, backward, optimizer) "
        "for bench/run_cpu_bench.sh"};
    Args a;
    app.add_option("--preset", a.preset, "Model preset (tiny, gpt2-mini, gpt2-124M, ...)")
        ->required();
    app.add_option("-B,--batch", a.B, "Batch size")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("-T,--seq-len", a.T, "Sequence length (default: the preset's max_seq_len)")
        ->check(CLI::PositiveNumber);
    app.add_option("--threads", a.threads, "OpenMP threads")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--warmup", a.warmup, "Warm-up steps (not measured)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--steps", a.steps, "Measured steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    app.add_option("--seed", a.seed, "Seed for weights and the synthetic batch")
        ->capture_default_str();
    app.add_option("--json", a.json_path, "Write the results as JSON to this file (atomically)");
    app.add_flag("--probe", a.probe, "Measure the sgemm and copy-bandwidth probes after the steps");
    app.add_flag("--profile", a.profile,
                 "Time every op and print the per-op roofline table (implies --probe)");
    app.add_option("--attention", a.attention, "Attention kernel")
        ->capture_default_str()
        ->check(CLI::IsMember({"naive", "flash"}));
    app.add_option("--classifier", a.classifier, "Classifier kernel")
        ->capture_default_str()
        ->check(CLI::IsMember({"fused", "unfused"}));
    app.add_option("--layernorm", a.layernorm, "LayerNorm variant")
        ->capture_default_str()
        ->check(CLI::IsMember({"separate", "fused_residual"}));
    app.add_flag("--fuse-gelu", a.fuse_gelu, "c_fc matmul with the GELU epilogue");
    CLI11_PARSE(app, argc, argv);
    try {
        return run(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "cpu_step: error: %s\n", e.what());
        return 1;
    }
}

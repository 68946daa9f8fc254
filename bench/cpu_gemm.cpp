// cpu_gemm: microtrain's own packed AVX-512 GEMM (kernels/cpu/gemm.cpp, gemm_packed) side by
// side with Eigen's GEMM (gemm_eigen, the portable fallback and the peer) on the GEMMs a
// training step really runs, in one process, alternating which goes first. A benchmark, not a
// test: it prints numbers and asserts nothing about them.
//
//   cpu_gemm [--threads 2] [--reps 7] [--preset gpt2-124M -B 4 -T 128] [--json out.json]
//            [--ladder [--ladder-reps 3]]
//
// Shapes: for every distinct linear layer of the preset (qkv, attn proj, fc, fc proj, LM head)
// the three GEMMs of matmul.cpp — forward  out (N,OC) = inp (N,C) W^T,
//                                  dinp     (N,C)  += dout (N,OC) W,
//                                  dweight  (OC,C) += dout^T (OC,N) inp (N,C)  — with N = B*T,
// plus a square 1024^3. Each (shape, impl) is timed `reps` times after one warm-up; the table
// gives the median ms, GFLOP/s (2 M N K per call) and the spread (min..max), and the ratio
// packed / Eigen of the medians (< 1 = packed faster).
//
// Then the int8 weight (model.quantize_frozen: int8): the forward and dinp GEMMs of each linear
// layer with the weight as an int8 operand (gemm_int8: dequantised while gemm_packed packs it)
// beside the same GEMM on the fp32 weight, alternating; ratio int8 / fp32 of the medians.
//
// --ladder: then the whole kernels.matmul ladder (naive, blocked, packed, eigen = blas) on the
// same shapes, each step timed `--ladder-reps` times (naive is slow: 3 by default), rotating
// which step goes first; GFLOP/s per step and each step's speed-up over the one before.
//
// The compute roof: before the GEMMs, an FMA probe runs 12 independent chains of AVX-512 FMAs
// per thread on registers only (no memory traffic at all: the most any fp32 kernel can issue on
// these cores), best of 3; the step line gives each GEMM's rate as a share of it.
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "kernels/cpu/gemm.h"
#include "kernels/quantize.h"
#include "model/gpt.h"

namespace {

using Clock = std::chrono::steady_clock;
using mt::cpu::GemmOperand;

struct Shape {
    std::string name;
    int M, N, K;
    bool a_transposed, b_transposed, accumulate;
    long lda, ldb;  // leading dimensions of the stored buffers
};

struct Series {
    std::vector<double> ms;
    double median() const {
        std::vector<double> v = ms;
        std::sort(v.begin(), v.end());
        const size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }
    double min() const { return *std::min_element(ms.begin(), ms.end()); }
    double max() const { return *std::max_element(ms.begin(), ms.end()); }
};

// The three GEMMs of one linear layer inp (N,C) -> out (N,OC), stored exactly as matmul.cpp
// hands them to gemm(): W is (OC,C) row-major.
void add_linear(std::vector<Shape>& shapes, const std::string& layer, int N, int C, int OC) {
    shapes.push_back({layer + " fwd", N, OC, C, false, true, false, C, C});
    shapes.push_back({layer + " dinp", N, C, OC, false, false, true, OC, C});
    shapes.push_back({layer + " dW", OC, C, N, true, false, true, OC, C});
}

// Register-only FMA throughput of all threads, GFLOP/s. 12 accumulators hide the FMA latency
// (4 cycles x 2 pipes needs >= 8 chains); each FMA on 16 lanes is 32 flops. Compiled for
// AVX-512F whatever the bench's flags: only called when gemm_packed (AVX-512) is available.
__attribute__((target("avx512f"))) double fma_peak_gflops() {
    constexpr long kIters = 20'000'000;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = Clock::now();
        float sink = 0;
#pragma omp parallel reduction(+ : sink)
        {
            __m512 acc[12];
            for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * i);
            const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
            for (long it = 0; it < kIters; ++it)
                for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
            __m512 s = acc[0];
            for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, s);
            for (float x : lanes) sink += x;  // keeps the loop alive
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        const double flops = 2.0 * 16 * 12 * kIters * omp_get_max_threads();
        if (sink != 0) best = std::max(best, flops / s * 1e-9);
    }
    return best;
}

// The int8-weight table: for each forward / dinp shape (B is the weight), gemm_packed on the
// fp32 weight against gemm_int8 on its per-row int8 quantisation.
void time_int8_weights(const std::vector<Shape>& shapes, int reps) {
    std::printf("\nint8 weight (dequantised while packed) vs fp32 weight, both gemm_packed:\n");
    std::printf("%-18s %6s %6s %6s | %9s %15s | %9s %15s | %6s\n", "gemm", "M", "N", "K", "fp32 ms",
                "spread ms", "int8 ms", "spread ms", "ratio");
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (const Shape& s : shapes) {
        if (s.name.find(" dW") != std::string::npos || s.name.rfind("lm_head", 0) == 0 ||
            s.name.rfind("square", 0) == 0)
            continue;  // the weight is B only in fwd and dinp; the LM head (wte) stays fp32
        std::vector<float> a(static_cast<size_t>(s.M) * s.K), w(static_cast<size_t>(s.K) * s.N);
        for (float& x : a) x = uni(rng);
        for (float& x : w) x = uni(rng);
        // The stored weight is (OC,C): rows = N for fwd (transposed), K for dinp.
        const int rows = s.b_transposed ? s.N : s.K, cols = s.b_transposed ? s.K : s.N;
        std::vector<int8_t> q(w.size());
        std::vector<float> scale(rows), c(static_cast<size_t>(s.M) * s.N, 0.f);
        mt::quantize_int8_per_row(w.data(), rows, cols, q.data(), scale.data());
        const GemmOperand A{a.data(), s.lda, s.a_transposed}, W{w.data(), s.ldb, s.b_transposed};
        const mt::cpu::GemmInt8Operand Q{q.data(), scale.data(), s.ldb, s.b_transposed};
        auto time_one = [&](bool int8) {
            const auto t0 = Clock::now();
            if (int8)
                mt::cpu::gemm_int8(s.M, s.N, s.K, A, Q, c.data(), s.N, s.accumulate);
            else
                mt::cpu::gemm_packed(s.M, s.N, s.K, A, W, c.data(), s.N, s.accumulate);
            return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        time_one(true), time_one(false);
        Series f32, i8;
        for (int r = 0; r < reps; ++r) {
            if (r % 2 == 0) {
                f32.ms.push_back(time_one(false));
                i8.ms.push_back(time_one(true));
            } else {
                i8.ms.push_back(time_one(true));
                f32.ms.push_back(time_one(false));
            }
        }
        std::printf("%-18s %6d %6d %6d | %9.2f %6.2f..%-7.2f | %9.2f %6.2f..%-7.2f | %6.3f\n",
                    s.name.c_str(), s.M, s.N, s.K, f32.median(), f32.min(), f32.max(), i8.median(),
                    i8.min(), i8.max(), i8.median() / f32.median());
    }
}

// The ladder table (--ladder): every step of kernels.matmul on every shape; the rotation of the
// order spreads a slow-then-fast machine over all steps. Returns the rows for --json.
nlohmann::json time_ladder(const std::vector<Shape>& shapes, int reps) {
    using Fn = void (*)(int, int, int, GemmOperand, GemmOperand, float*, long, bool);
    const std::pair<const char*, Fn> steps[] = {{"naive", mt::cpu::gemm_naive},
                                                {"blocked", mt::cpu::gemm_blocked},
                                                {"packed", mt::cpu::gemm_packed},
                                                {"blas", mt::cpu::gemm_eigen}};
    constexpr int kSteps = 4;
    std::printf(
        "\nthe kernels.matmul ladder, GFLOP/s (median of %d; x = speed-up over the step "
        "before):\n%-18s %6s %6s %6s |",
        reps, "gemm", "M", "N", "K");
    for (const auto& st : steps) std::printf(" %16s |", st.first);
    std::printf("\n");
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    nlohmann::json rows = nlohmann::json::array();
    for (const Shape& s : shapes) {
        std::vector<float> a(static_cast<size_t>(s.M) * s.K), b(static_cast<size_t>(s.K) * s.N);
        for (float& x : a) x = uni(rng);
        for (float& x : b) x = uni(rng);
        std::vector<float> c(static_cast<size_t>(s.M) * s.N, 0.f);
        const GemmOperand A{a.data(), s.lda, s.a_transposed}, B{b.data(), s.ldb, s.b_transposed};
        Series series[kSteps];
        auto time_one = [&](int i) {
            const auto t0 = Clock::now();
            steps[i].second(s.M, s.N, s.K, A, B, c.data(), s.N, s.accumulate);
            series[i].ms.push_back(
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        };
        for (int i = 0; i < kSteps; ++i) time_one(i);  // warm-up
        for (Series& se : series) se.ms.clear();
        for (int r = 0; r < reps; ++r)
            for (int i = 0; i < kSteps; ++i) time_one((i + r) % kSteps);
        const double flops = 2.0 * s.M * s.N * s.K;
        std::printf("%-18s %6d %6d %6d |", s.name.c_str(), s.M, s.N, s.K);
        nlohmann::json row = {{"gemm", s.name}, {"M", s.M}, {"N", s.N}, {"K", s.K}};
        for (int i = 0; i < kSteps; ++i) {
            const double g = flops / series[i].median() * 1e-6;
            const double x = i > 0 ? series[i - 1].median() / series[i].median() : 1.0;
            std::printf(" %7.1f (%5.1fx) |", g, x);
            row[std::string(steps[i].first) + "_ms"] = series[i].ms;
        }
        std::printf("\n");
        rows.push_back(row);
    }
    return rows;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"microtrain packed GEMM vs Eigen GEMM on a training step's shapes"};
    int threads = 2, reps = 7, B = 4, T = 128;
    std::string preset = "gpt2-124M", json_path;
    app.add_option("--threads", threads, "OpenMP threads for both")
        ->check(CLI::Range(1, mt::kMaxThreads));
    app.add_option("--reps", reps, "timed calls per (shape, impl)")->check(CLI::Range(3, 1000));
    app.add_option("--preset", preset, "model preset whose layer shapes are timed");
    app.add_option("-B", B, "batch size")->check(CLI::PositiveNumber);
    app.add_option("-T", T, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--json", json_path, "also write the results here (atomically)");
    bool ladder = false;
    int ladder_reps = 3;
    app.add_flag("--ladder", ladder, "also time every step of kernels.matmul on the same shapes");
    app.add_option("--ladder-reps", ladder_reps, "timed calls per (shape, step) of the ladder")
        ->check(CLI::Range(1, 1000));
    CLI11_PARSE(app, argc, argv);

    if (!mt::cpu::gemm_packed_available()) {
        std::fprintf(stderr,
                     "cpu_gemm: this build does not target AVX-512F, so only Eigen's GEMM is "
                     "compiled; nothing to compare (build with -DMT_NATIVE=ON on an AVX-512 "
                     "machine)\n");
        return 2;
    }
    omp_set_num_threads(threads);

    const auto found = mt::gpt_preset(preset);
    if (!found) {
        std::string names;
        for (const auto& n : mt::gpt_preset_names()) names += (names.empty() ? "" : ", ") + n;
        std::fprintf(stderr, "cpu_gemm: unknown --preset '%s'; expected one of: %s\n",
                     preset.c_str(), names.c_str());
        return 2;
    }
    const mt::GPTConfig cfg = *found;
    const int N = B * T, C = cfg.n_embd, Vp = cfg.padded_vocab_size();
    std::vector<Shape> shapes;
    add_linear(shapes, "qkv", N, C, 3 * C);
    add_linear(shapes, "attn_proj", N, C, C);
    add_linear(shapes, "fc", N, C, 4 * C);
    add_linear(shapes, "fc_proj", N, 4 * C, C);
    add_linear(shapes, "lm_head", N, C, Vp);
    shapes.push_back({"square 1024^3", 1024, 1024, 1024, false, false, false, 1024, 1024});

    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    auto random_buffer = [&](size_t n) {
        std::vector<float> v(n);
        for (float& x : v) x = uni(rng);
        return v;
    };

    const double fma_peak = fma_peak_gflops();
    std::printf("cpu_gemm: preset %s B%d T%d (N = %d tokens), %d threads, %d reps, packed = %s\n",
                preset.c_str(), B, T, N, threads, reps, mt::cpu::gemm_impl_name());
    std::printf("FMA peak (registers only, %d threads): %.1f GFLOP/s\n", threads, fma_peak);
    std::printf("%-18s %6s %6s %6s | %9s %7s %15s | %9s %7s %15s | %6s\n", "gemm", "M", "N", "K",
                "packed ms", "GFLOP/s", "spread ms", "eigen ms", "GFLOP/s", "spread ms", "ratio");
    nlohmann::json rows = nlohmann::json::array();
    double total_packed = 0, total_eigen = 0, step_flops = 0;
    for (const Shape& s : shapes) {
        const size_t a_size = static_cast<size_t>(s.M) * s.K,
                     b_size = static_cast<size_t>(s.K) * s.N;
        const std::vector<float> a = random_buffer(a_size), b = random_buffer(b_size);
        std::vector<float> c(static_cast<size_t>(s.M) * s.N, 0.f);
        const GemmOperand A{a.data(), s.lda, s.a_transposed}, Bop{b.data(), s.ldb, s.b_transposed};
        auto time_one = [&](bool packed) {
            const auto t0 = Clock::now();
            if (packed)
                mt::cpu::gemm_packed(s.M, s.N, s.K, A, Bop, c.data(), s.N, s.accumulate);
            else
                mt::cpu::gemm_eigen(s.M, s.N, s.K, A, Bop, c.data(), s.N, s.accumulate);
            return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        time_one(true), time_one(false);  // warm-up: page in, fill the pack buffers
        Series packed, eigen;
        for (int r = 0; r < reps; ++r) {
            // Alternate which goes first so a slow-then-fast machine favours neither.
            if (r % 2 == 0) {
                packed.ms.push_back(time_one(true));
                eigen.ms.push_back(time_one(false));
            } else {
                eigen.ms.push_back(time_one(false));
                packed.ms.push_back(time_one(true));
            }
        }
        const double flops = 2.0 * s.M * s.N * s.K;
        const double pm = packed.median(), em = eigen.median();
        std::printf(
            "%-18s %6d %6d %6d | %9.2f %7.1f %6.2f..%-7.2f | %9.2f %7.1f %6.2f..%-7.2f | %6.3f\n",
            s.name.c_str(), s.M, s.N, s.K, pm, flops / pm * 1e-6, packed.min(), packed.max(), em,
            flops / em * 1e-6, eigen.min(), eigen.max(), pm / em);
        rows.push_back({{"gemm", s.name},
                        {"M", s.M},
                        {"N", s.N},
                        {"K", s.K},
                        {"packed_ms", packed.ms},
                        {"eigen_ms", eigen.ms},
                        {"packed_median_ms", pm},
                        {"eigen_median_ms", em},
                        {"ratio_packed_over_eigen", pm / em}});
        if (s.name.rfind("square", 0) != 0) {
            // Per training step: every transformer layer's GEMMs once per layer, the LM head once.
            const int times = s.name.rfind("lm_head", 0) == 0 ? 1 : cfg.n_layer;
            total_packed += times * pm;
            total_eigen += times * em;
            step_flops += times * flops;
        }
    }
    std::printf(
        "step's GEMMs (x%d layers + LM head): packed %.1f ms (%.1f GFLOP/s, %.0f%% of FMA peak), "
        "eigen %.1f ms (%.1f GFLOP/s, %.0f%%), ratio %.3f\n",
        cfg.n_layer, total_packed, step_flops / total_packed * 1e-6,
        100 * step_flops / total_packed * 1e-6 / fma_peak, total_eigen,
        step_flops / total_eigen * 1e-6, 100 * step_flops / total_eigen * 1e-6 / fma_peak,
        total_packed / total_eigen);
    time_int8_weights(shapes, reps);
    const nlohmann::json ladder_rows = ladder ? time_ladder(shapes, ladder_reps) : nlohmann::json();
    if (!json_path.empty()) {
        nlohmann::json out = {{"preset", preset},
                              {"B", B},
                              {"T", T},
                              {"threads", threads},
                              {"reps", reps},
                              {"gemms", rows},
                              {"fma_peak_gflops", fma_peak},
                              {"step_gemm_ms_packed", total_packed},
                              {"step_gemm_ms_eigen", total_eigen},
                              {"ladder", ladder_rows}};
        mt::write_file_atomic(json_path, out.dump(2) + "\n");
    }
    return 0;
}

// cpu_gemm: microtrain's own packed GEMMs (kernels/cpu/gemm.cpp, gemm_packed) of every CPU ISA
// level this CPU runs (packed-avx512, packed-avx2; kernels/cpu/cpu_isa.h) side by side with
// Eigen's GEMM (gemm_eigen of the process's level: MT_CPU_ISA, else the best; the baseline
// level's GEMM and the peer) on the GEMMs a training step really runs, in one process, rotating
// which goes first. A benchmark, not a test: it prints numbers and asserts nothing about them.
//
//   cpu_gemm [--threads 2] [--reps 7] [--preset gpt2-124M -B 4 -T 128] [--json out.json]
//            [--ladder [--ladder-reps 3]]
//
// Shapes: for every distinct linear layer of the preset (qkv, attn proj, fc, fc proj, LM head)
// the three GEMMs of matmul.cpp — forward  out (N,OC) = inp (N,C) W^T,
//                                  dinp     (N,C)  += dout (N,OC) W,
//                                  dweight  (OC,C) += dout^T (OC,N) inp (N,C)  — with N = B*T,
// plus a square 1024^3. Each (shape, impl) is timed `reps` times after one warm-up; the table
// gives the median ms, GFLOP/s (2 M N K per call) and the spread (min..max) of each, and the
// ratio of each packed GEMM to Eigen's, of the medians (< 1 = packed faster).
//
// Then the int8 weight (model.quantize_frozen: int8): the forward and dinp GEMMs of each linear
// layer with the weight as an int8 operand (gemm_int8: dequantised while gemm_packed packs it)
// beside the same GEMM on the fp32 weight, alternating; ratio int8 / fp32 of the medians (the
// process's level: MT_CPU_ISA=avx2 times the avx2 one).
//
// --ladder: then the whole kernels.matmul ladder of the process's level (naive, blocked, packed,
// eigen = blas) on the same shapes, each step timed `--ladder-reps` times (naive is slow: 3 by
// default), rotating which step goes first; GFLOP/s per step and each step's speed-up over the one
// before.
//
// The compute roof: before the GEMMs, an FMA probe runs 12 independent chains of FMAs of the
// widest vectors the CPU has (AVX-512, else AVX2) per thread on registers only (no memory
// traffic at all: the most any fp32 kernel can issue on these cores), best of 3, and again after
// them; the better of the two is the roof (a busy host during one probe reads as a low roof). The
// step line gives each GEMM's rate as a share of it, or says the host was busy where a rate is
// above both probes.
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "kernels/cpu/cpu_isa.h"
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

// Register-only FMA throughput of all threads, GFLOP/s: 12 accumulators hide the FMA latency
// (4 cycles x 2 pipes needs >= 8 chains); each FMA on 16 (AVX-512) or 8 (AVX2) lanes is 32 or
// 16 flops. Each is compiled for its ISA whatever the bench's flags, and called only where the
// CPU has it. kFmaIters FMAs per chain; the flops of a run of `lanes`-wide FMAs over `seconds`:
constexpr long kFmaIters = 20'000'000;
double fma_gflops(int lanes, double seconds) {
    return 2.0 * lanes * 12 * kFmaIters * omp_get_max_threads() / seconds * 1e-9;
}

__attribute__((target("avx512f"))) double fma_peak_avx512() {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = Clock::now();
        float sink = 0;
#pragma omp parallel reduction(+ : sink)
        {
            __m512 acc[12];
            for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(1.0f + 1e-7f * i);
            const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
            for (long it = 0; it < kFmaIters; ++it)
                for (int i = 0; i < 12; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
            __m512 s = acc[0];
            for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, acc[i]);
            alignas(64) float lanes[16];
            _mm512_store_ps(lanes, s);
            for (float x : lanes) sink += x;  // keeps the loop alive
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (sink != 0) best = std::max(best, fma_gflops(16, s));
    }
    return best;
}

__attribute__((target("avx2,fma"))) double fma_peak_avx2() {
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = Clock::now();
        float sink = 0;
#pragma omp parallel reduction(+ : sink)
        {
            __m256 acc[12];
            for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + 1e-7f * i);
            const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
            for (long it = 0; it < kFmaIters; ++it)
                for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
            __m256 s = acc[0];
            for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, s);
            for (float x : lanes) sink += x;  // keeps the loop alive
        }
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (sink != 0) best = std::max(best, fma_gflops(8, s));
    }
    return best;
}

// The widest FMA the CPU has (0 without AVX2+FMA: no packed GEMM to compare then).
double fma_peak_gflops() {
    const mt::cpu::CpuFeatures cpu = mt::cpu::detect_cpu_features();
    if (mt::cpu::missing_cpu_features(mt::cpu::CpuIsa::avx512, cpu).empty())
        return fma_peak_avx512();
    if (mt::cpu::missing_cpu_features(mt::cpu::CpuIsa::avx2, cpu).empty()) return fma_peak_avx2();
    return 0;
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

// The GEMMs compared in the main table: for every level this CPU runs that has a packed GEMM,
// best first, that packed GEMM and Eigen's compiled for the same level (its peer: the same
// vector width), e.g. packed-avx512, eigen-avx512, packed-avx2, eigen-avx2.
struct Contender {
    std::string name;
    void (*fn)(int, int, int, GemmOperand, GemmOperand, float*, long, bool);
    int peer = -1;  // the index of the Eigen GEMM a packed one is compared with (-1: is Eigen)
};
std::vector<Contender> packed_per_level() {
    std::vector<Contender> out;
    for (mt::cpu::CpuIsa isa : mt::cpu::runnable_cpu_isa_levels(mt::cpu::detect_cpu_features())) {
        if (isa == mt::cpu::CpuIsa::baseline) continue;  // no packed GEMM: Eigen is its GEMM
        const mt::cpu::KernelTable& level = mt::cpu::kernel_table(isa);
        const int packed = static_cast<int>(out.size());
        out.push_back(
            {std::string("packed-") + mt::cpu::to_string(isa), level.gemm_packed, packed + 1});
        out.push_back({std::string("eigen-") + mt::cpu::to_string(isa), level.gemm_eigen});
    }
    return out;
}

// The main table's results: a JSON row per shape, and per contender the GEMM time of one
// training step (every layer's GEMMs once per layer, the LM head once) and its flops.
struct LevelTable {
    nlohmann::json rows = nlohmann::json::array();
    std::vector<double> step_ms;
    double step_flops = 0;
    nlohmann::json step_json(const std::vector<Contender>& contenders) const {
        nlohmann::json j;
        for (size_t i = 0; i < contenders.size(); ++i) j[contenders[i].name] = step_ms[i];
        return j;
    }
};

// Times every contender on every shape, `reps` rounds after a warm-up, rotating which goes
// first so a slow-then-fast machine favours none; prints the table.
LevelTable time_levels(const std::vector<Shape>& shapes, const std::vector<Contender>& contenders,
                       int reps, int n_layer) {
    const size_t n = contenders.size();
    std::printf("%-18s %6s %6s %6s |", "gemm", "M", "N", "K");
    for (const Contender& c : contenders)
        std::printf(" %13s ms GFLOP/s %13s |", c.name.c_str(), "spread ms");
    for (const Contender& c : contenders)
        if (c.peer >= 0) std::printf(" %s/eigen", c.name.c_str());
    std::printf("\n");
    std::mt19937 rng(1234);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    LevelTable table;
    table.step_ms.assign(n, 0.0);
    for (const Shape& s : shapes) {
        std::vector<float> a(static_cast<size_t>(s.M) * s.K), b(static_cast<size_t>(s.K) * s.N);
        for (float& x : a) x = uni(rng);
        for (float& x : b) x = uni(rng);
        std::vector<float> c(static_cast<size_t>(s.M) * s.N, 0.f);
        const GemmOperand A{a.data(), s.lda, s.a_transposed}, Bop{b.data(), s.ldb, s.b_transposed};
        std::vector<Series> series(n);
        auto time_one = [&](size_t i) {
            const auto t0 = Clock::now();
            contenders[i].fn(s.M, s.N, s.K, A, Bop, c.data(), s.N, s.accumulate);
            return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        };
        for (size_t i = 0; i < n; ++i) time_one(i);  // warm-up: page in, fill the pack buffers
        for (int r = 0; r < reps; ++r)
            for (size_t k = 0; k < n; ++k) {
                const size_t i = (k + static_cast<size_t>(r)) % n;
                series[i].ms.push_back(time_one(i));
            }
        const double flops = 2.0 * s.M * s.N * s.K;
        std::printf("%-18s %6d %6d %6d |", s.name.c_str(), s.M, s.N, s.K);
        nlohmann::json row = {{"gemm", s.name}, {"M", s.M}, {"N", s.N}, {"K", s.K}};
        for (size_t i = 0; i < n; ++i) {
            const double m = series[i].median();
            std::printf(" %16.2f %7.1f %6.2f..%-7.2f |", m, flops / m * 1e-6, series[i].min(),
                        series[i].max());
            row[contenders[i].name + "_ms"] = series[i].ms;
            row[contenders[i].name + "_median_ms"] = m;
        }
        for (size_t i = 0; i < n; ++i) {
            if (contenders[i].peer < 0) continue;
            const double ratio = series[i].median() / series[contenders[i].peer].median();
            std::printf(" %*.3f", static_cast<int>(contenders[i].name.size() + 6), ratio);
            row["ratio_" + contenders[i].name + "_over_eigen"] = ratio;
        }
        std::printf("\n");
        table.rows.push_back(row);
        if (s.name.rfind("square", 0) != 0) {
            const int times = s.name.rfind("lm_head", 0) == 0 ? 1 : n_layer;
            for (size_t i = 0; i < n; ++i) table.step_ms[i] += times * series[i].median();
            table.step_flops += times * flops;
        }
    }
    return table;
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

    try {  // MT_CPU_ISA naming no level, or one this CPU lacks: say so, do not abort
        mt::cpu::cpu_isa_from_environment();
    } catch (const mt::BackendError& e) {
        std::fprintf(stderr, "cpu_gemm: %s\n", e.what());
        return 2;
    }
    if (!mt::cpu::gemm_packed_available()) {
        std::fprintf(stderr,
                     "cpu_gemm: the process's CPU ISA level (%s) has no packed GEMM: "
                     "this CPU lacks AVX2+FMA, or MT_CPU_ISA=baseline; nothing to compare\n",
                     mt::cpu::to_string(mt::cpu::cpu_isa_from_environment()));
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

    const std::vector<Contender> contenders = packed_per_level();
    std::printf(
        "cpu_gemm: preset %s B%d T%d (N = %d tokens), %d threads, %d reps, process level %s\n",
        preset.c_str(), B, T, N, threads, reps,
        mt::cpu::to_string(mt::cpu::cpu_isa_from_environment()));
    // The probe before and after the GEMMs, the better of the two: a neighbour that takes the
    // core during one probe reads as a low roof, and every GEMM as a share of it too high.
    const double fma_before = fma_peak_gflops();
    const LevelTable table = time_levels(shapes, contenders, reps, cfg.n_layer);
    const double fma_after = fma_peak_gflops();
    const double fma_peak = std::max(fma_before, fma_after);
    std::printf(
        "FMA peak (registers only, %d threads): %.1f GFLOP/s (probe before the GEMMs %.1f, "
        "after %.1f)\n",
        threads, fma_peak, fma_before, fma_after);
    std::printf("step's GEMMs (x%d layers + LM head):", cfg.n_layer);
    for (size_t i = 0; i < contenders.size(); ++i) {
        const double gflops = table.step_flops / table.step_ms[i] * 1e-6;
        // Above the roof means the probes were both disturbed: no share is shown then.
        const std::string share = gflops <= fma_peak
                                      ? std::to_string(std::lround(100 * gflops / fma_peak)) + "%"
                                      : "n/a: above both probes, the host was busy";
        std::printf(" %s %.1f ms (%.1f GFLOP/s, %s of FMA peak)%s", contenders[i].name.c_str(),
                    table.step_ms[i], gflops, share.c_str(),
                    i + 1 < contenders.size() ? "," : "\n");
    }
    time_int8_weights(shapes, reps);
    const nlohmann::json ladder_rows = ladder ? time_ladder(shapes, ladder_reps) : nlohmann::json();
    if (!json_path.empty()) {
        nlohmann::json out = {
            {"preset", preset},
            {"B", B},
            {"T", T},
            {"threads", threads},
            {"reps", reps},
            {"process_level", mt::cpu::to_string(mt::cpu::cpu_isa_from_environment())},
            {"gemms", table.rows},
            {"fma_peak_gflops", fma_peak},
            {"fma_probe_before_gflops", fma_before},
            {"fma_probe_after_gflops", fma_after},
            {"step_gemm_ms", table.step_json(contenders)},
            {"ladder", ladder_rows}};
        mt::write_file_atomic(json_path, out.dump(2) + "\n");
    }
    return 0;
}

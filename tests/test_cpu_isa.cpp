// The CPU backend's ISA levels (kernels/cpu/cpu_isa.h): which level runs, how a forced level the
// CPU lacks is refused (through select_cpu_isa's CpuFeatures seam: this machine may have them
// all), what the device line says, and that every level the CPU runs trains the same model to
// the same losses, bitwise the same for any thread count within a level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "engine/training_session.h"
#include "experiment/spec.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/kernel_table.h"

namespace mt {
namespace {

using cpu::CpuFeatures;
using cpu::CpuIsa;

constexpr CpuIsa kLevels[] = {CpuIsa::baseline, CpuIsa::avx2, CpuIsa::avx512};

CpuFeatures all_features() {
    return {true, true, true, true, true, true};
}
CpuFeatures avx2_only() {
    CpuFeatures f;
    f.avx2 = f.fma = true;
    return f;
}

// Sets MT_CPU_ISA for the scope, then restores what was there.
class ScopedCpuIsa {
  public:
    explicit ScopedCpuIsa(const std::string& value) {
        if (const char* old = std::getenv("MT_CPU_ISA")) saved_ = old;
        ::setenv("MT_CPU_ISA", value.c_str(), 1);
    }
    ~ScopedCpuIsa() {
        if (saved_)
            ::setenv("MT_CPU_ISA", saved_->c_str(), 1);
        else
            ::unsetenv("MT_CPU_ISA");
    }
    ScopedCpuIsa(const ScopedCpuIsa&) = delete;
    ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

  private:
    std::optional<std::string> saved_;
};

bool cpu_runs(CpuIsa isa) {
    return cpu::missing_cpu_features(isa, cpu::detect_cpu_features()).empty();
}

std::string construction_error(const BackendOptions& o) {
    try {
        create_backend(BackendKind::cpu, o);
    } catch (const BackendError& e) {
        return e.what();
    }
    return "";
}

TEST(CpuIsa, PicksTheBestLevelTheCpuHas) {
    EXPECT_EQ(cpu::select_cpu_isa("", all_features()), CpuIsa::avx512);
    EXPECT_EQ(cpu::select_cpu_isa("", avx2_only()), CpuIsa::avx2);
    CpuFeatures avx2_without_fma;
    avx2_without_fma.avx2 = true;
    EXPECT_EQ(cpu::select_cpu_isa("", avx2_without_fma), CpuIsa::baseline);
    CpuFeatures avx512_without_vl = all_features();
    avx512_without_vl.avx512vl = false;  // e.g. Knights Landing: AVX-512F without VL
    EXPECT_EQ(cpu::select_cpu_isa("", avx512_without_vl), CpuIsa::avx2);
    EXPECT_EQ(cpu::select_cpu_isa("", CpuFeatures{}), CpuIsa::baseline);
}

TEST(CpuIsa, RunnableLevelsAreListedBestFirstAndEndInBaseline) {
    EXPECT_EQ(cpu::runnable_cpu_isa_levels(all_features()),
              (std::vector<CpuIsa>{CpuIsa::avx512, CpuIsa::avx2, CpuIsa::baseline}));
    EXPECT_EQ(cpu::runnable_cpu_isa_levels(avx2_only()),
              (std::vector<CpuIsa>{CpuIsa::avx2, CpuIsa::baseline}));
    EXPECT_EQ(cpu::runnable_cpu_isa_levels(CpuFeatures{}), std::vector<CpuIsa>{CpuIsa::baseline});
    // This CPU: the first runnable level is the one the backend picks without MT_CPU_ISA.
    const CpuFeatures here = cpu::detect_cpu_features();
    EXPECT_EQ(cpu::runnable_cpu_isa_levels(here).front(), cpu::select_cpu_isa("", here));
}

TEST(CpuIsa, ForcedLevelRunsWhereTheCpuHasIt) {
    for (CpuIsa isa : kLevels)
        EXPECT_EQ(cpu::select_cpu_isa(cpu::to_string(isa), all_features()), isa);
    EXPECT_EQ(cpu::select_cpu_isa("baseline", CpuFeatures{}), CpuIsa::baseline);
}

TEST(CpuIsa, RefusesALevelTheCpuLacksNamingItsMissingFeatures) {
    try {
        cpu::select_cpu_isa("avx512", avx2_only());
        FAIL() << "avx512 was accepted on a CPU with AVX2 only";
    } catch (const BackendError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("MT_CPU_ISA=avx512"), std::string::npos) << m;
        EXPECT_NE(m.find("lacks avx512f, avx512bw, avx512dq, avx512vl"), std::string::npos) << m;
        EXPECT_NE(m.find("choose a level it runs (avx2, baseline)"), std::string::npos) << m;
    }
    try {
        cpu::select_cpu_isa("avx2", CpuFeatures{});
        FAIL() << "avx2 was accepted on a CPU without AVX2";
    } catch (const BackendError& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("lacks avx2, fma"), std::string::npos) << m;
        EXPECT_NE(m.find("choose a level it runs (baseline)"), std::string::npos) << m;
    }
}

TEST(CpuIsa, BackendRefusesANameThatIsNotALevel) {
    const ScopedCpuIsa forced("avx3");
    const std::string m = construction_error(BackendOptions{});
    EXPECT_NE(m.find("MT_CPU_ISA=avx3: not a CPU ISA level"), std::string::npos) << m;
    EXPECT_NE(m.find("avx512, avx2, baseline"), std::string::npos) << m;
}

TEST(CpuIsa, DeviceNameNamesEachLevelAndItsGemm) {
    if (std::string(cpu::kernel_table(CpuIsa::baseline).gemm_impl_name()) == "eigen+blas")
        GTEST_SKIP() << "an MT_USE_BLAS build runs Eigen over a BLAS on every level";
    const char* gemm_of[] = {"eigen", "packed-avx2", "packed-avx512"};  // in kLevels' order
    for (CpuIsa isa : kLevels) {
        if (!cpu_runs(isa)) continue;
        const ScopedCpuIsa forced(cpu::to_string(isa));
        BackendOptions o;
        o.num_threads = 1;
        const std::string name = create_backend(BackendKind::cpu, o)->device_name();
        const std::string want = std::string("(1 thread, ") + cpu::to_string(isa) + " kernels, " +
                                 gemm_of[static_cast<int>(isa)] + " GEMM)";
        EXPECT_NE(name.find(want), std::string::npos) << name << " lacks " << want;
    }
}

// The avx2 level's exp (fast_math.h exp8) runs the AVX-512 pexp's algorithm on 256-bit
// registers: the same exponentials bit for bit, so the softmaxes, GELU and classifier of the two
// levels differ only where their GEMMs do. Each level's exp is also checked against float64 on
// its own (CpuFastMath, run once per level); this is the cross-check where both run.
TEST(CpuIsa, Avx2AndAvx512LevelsComputeBitwiseTheSameExponentials) {
    if (!cpu_runs(CpuIsa::avx2) || !cpu_runs(CpuIsa::avx512))
        GTEST_SKIP() << "needs a CPU that runs both the avx2 and the avx512 level";
    std::vector<float> x;
    for (int i = -2000; i <= 2000; i++) x.push_back(0.047f * static_cast<float>(i));  // -94..94
    x.insert(x.end(), {-INFINITY, -88.5f, -88.37f, -87.4f, -1e-30f, 0.0f, 1e-30f, 88.3f});
    for (float shift : {0.0f, 3.25f, -40.0f}) {
        std::vector<float> a = x, b = x;
        const float sum_a =
            cpu::kernel_table(CpuIsa::avx2).exp_shift_sum_inplace(a.data(), a.size(), shift);
        const float sum_b =
            cpu::kernel_table(CpuIsa::avx512).exp_shift_sum_inplace(b.data(), b.size(), shift);
        for (size_t i = 0; i < x.size(); i++)
            ASSERT_EQ(a[i], b[i]) << "exp(" << x[i] << " - " << shift << ")";
        EXPECT_EQ(sum_a, sum_b) << "shift " << shift;
    }
}

TEST(CpuIsa, PackedMatmulIsRefusedOnTheBaselineLevel) {
    const ScopedCpuIsa forced("baseline");
    BackendOptions o;
    o.kernels.matmul = MatmulImpl::packed;
    const std::string m = construction_error(o);
    EXPECT_NE(m.find("kernels.matmul: packed needs the CPU ISA level avx2 or avx512"),
              std::string::npos)
        << m;
}

// The tiny model of tests/test_training.cpp: 2 layers, C 32, V 128, B 2, T 16, seed 7.
RunConfig tiny_config(int threads) {
    RunConfig c;
    c.variant = "tiny";
    c.backend = BackendChoice::cpu;
    c.model.n_layer = 2;
    c.model.n_embd = 32;
    c.model.n_head = 2;
    c.model.max_seq_len = 16;
    c.model.vocab_size = 128;
    c.data.batch_size = 2;
    c.data.seq_len = 16;
    c.optim.lr = 1e-3f;
    c.run.seed = 7;
    c.run.threads = threads;
    c.profile.trace = false;
    return c;
}

// The losses of 5 training steps with the kernels of `isa`.
std::vector<double> losses_on(CpuIsa isa, int threads) {
    const ScopedCpuIsa forced(cpu::to_string(isa));
    const RunConfig c = tiny_config(threads);
    TrainingSession session(create_training_backend(c, BackendKind::cpu), c, {});
    std::vector<double> losses;
    for (int s = 0; s < 5; ++s) losses.push_back(session.step(s, false).loss);
    return losses;
}

// Levels differ only in rounding (FMA or not, vector widths, GEMM blocking), so the losses agree
// to float rounding. Measured on an AVX-512 machine: all three levels give bitwise the same 5
// losses here (each loss is a float mean, and AdamW's normalised step hides gradients' last
// bits); 1e-5 relative leaves room for other CPUs and compilers, while a wrong kernel moves the
// loss far more (a missed K chunk or tile changes the logits at the first step).
TEST(CpuIsa, EveryLevelTrainsToTheSameLossesBitwiseAcrossThreadCounts) {
    const std::vector<double> reference = losses_on(CpuIsa::baseline, 1);
    for (CpuIsa isa : kLevels) {
        if (!cpu_runs(isa)) {
            std::cout << "[ skipped  ] level " << cpu::to_string(isa) << ": this CPU lacks it\n";
            continue;
        }
        const std::vector<double> one = losses_on(isa, 1), three = losses_on(isa, 3);
        EXPECT_EQ(one, three) << cpu::to_string(isa) << ": 1 vs 3 threads";
        ASSERT_EQ(one.size(), reference.size());
        for (size_t s = 0; s < one.size(); ++s)
            EXPECT_NEAR(one[s], reference[s], 1e-5 * std::abs(reference[s]))
                << cpu::to_string(isa) << " step " << s;
    }
}

}  // namespace
}  // namespace mt

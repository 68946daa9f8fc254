// The loss check can fail: on the default (markov) synthetic data the loss falls, a variant that
// computes the same thing another way stays within the tolerance derived from the baseline's
// step-to-step spread, and a variant with a deliberately wrong gradient (a test-only LayerNorm
// backward that drops the two mean terms of the chain rule) is told "do not keep".
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "engine/synthetic.h"
#include "experiment/runner.h"
#include "experiment/spec.h"
#include "kernels/ops.h"
#include "report/comparison.h"
#include "report/render.h"
#include "report/results.h"
#include "report/run_folder.h"
#include "report/step_files.h"
#include "report/suggestions.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// dinp += rstd * dout * w: LayerNorm's backward without the -mean(dxhat) and -xhat*mean(dxhat *
// xhat) terms (a classic mistake: it differentiates as if mean and rstd were constants). dweight
// and dbias are right. fp32 only.
void layernorm_backward_dropping_the_mean_terms(Backend&, const op::LayerNormBackward& a) {
    auto* dinp = static_cast<float*>(a.dinp);
    const auto* dout = static_cast<const float*>(a.dout);
    const auto* inp = static_cast<const float*>(a.inp);
    const auto* w = static_cast<const float*>(a.weight);
    for (int n = 0; n < a.N; ++n) {
        const size_t off = static_cast<size_t>(n) * a.C;
        for (int c = 0; c < a.C; ++c) {
            const float xhat = (inp[off + c] - a.mean[n]) * a.rstd[n];
            a.dweight[c] += dout[off + c] * xhat;
            a.dbias[c] += dout[off + c];
        }
        for (int c = 0; c < a.C; ++c) dinp[off + c] += a.rstd[n] * dout[off + c] * w[c];
    }
}

class LossCheckTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("mt_test_loss_check_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
        ::setenv("MICROTRAIN_CACHE_DIR", (dir_ / "cache").c_str(), 1);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // A small model on the default synthetic data (markov), no compare.loss_tolerance.
    std::string write_yaml(const std::string& variants, const std::string& compare_extra = "") {
        const std::string path = (dir_ / "loss.yaml").string();
        std::ofstream(path) << "name: loss-check\n"
                               "backend: cpu\n"
                               "model: { n_layer: 2, n_embd: 64, n_head: 4, max_seq_len: 32, "
                               "vocab_size: 512 }\n"
                               "data: { batch_size: 8, seq_len: 32 }\n"
                               "optim: { lr: 3.0e-3, impl: unfused }\n"
                               "run: { seed: 11, warmup_steps: 2, measure_steps: 20, threads: 1 }\n"
                               "profile: { trace: false }\n"
                               "variants:\n"
                            << variants << "compare: { baseline: baseline" << compare_extra
                            << " }\n"
                               "report: { out_dir: "
                            << (dir_ / "runs").string() << " }\n";
        return path;
    }

    static RunnerOptions quiet() {
        RunnerOptions o;
        o.out = nullptr;
        o.handle_sigint = false;
        return o;
    }

    fs::path dir_;
};

const ComparisonRow& verdict_of(const Results& r, const std::string& name) {
    for (const ComparisonRow& v : r.comparison.rows)
        if (v.variant == name) return v;
    throw std::runtime_error("no verdict for " + name);
}

TEST_F(LossCheckTest, WrongGradientVariantIsToldDoNotKeep) {
    const ExperimentSpec spec =
        load_experiment(write_yaml("  - name: baseline\n"
                                   "  - name: fused-adamw\n"
                                   "    set: { optim.impl: fused }\n"
                                   "  - name: wrong-gradient\n"
                                   "    set: { run.recompute: gelu }\n"));
    // A knob that leaves the losses bitwise the same, beside the injected defect: a variant with
    // the baseline's config is an A/A control, which is judged as the machine's, not a knob's.
    RunnerOptions o = quiet();
    o.inject_variant = "wrong-gradient";
    o.modify_backend = [](Backend& b) {
        b.kernels().layernorm_backward = &layernorm_backward_dropping_the_mean_terms;
    };
    const Results res = run_experiment(spec, o).results;
    ASSERT_EQ(res.variants.size(), 3u);
    for (const VariantResult& v : res.variants) ASSERT_EQ(v.status, RunStatus::ok) << v.message;

    // The tolerance was derived (no compare.loss_tolerance) and is a real, positive spread.
    EXPECT_FALSE(res.experiment.loss_tolerance.has_value());
    ASSERT_TRUE(res.comparison.loss_tolerance_nats.has_value());
    EXPECT_GT(*res.comparison.loss_tolerance_nats, 0.0);
    EXPECT_NE(res.comparison.loss_tolerance_basis.find("step-to-step"), std::string::npos)
        << res.comparison.loss_tolerance_basis;

    const ComparisonRow& fused = verdict_of(res, "fused-adamw");
    ASSERT_TRUE(fused.loss_within_tolerance.has_value());
    EXPECT_TRUE(*fused.loss_within_tolerance) << fused.verdict;

    const ComparisonRow& wrong = verdict_of(res, "wrong-gradient");
    std::printf("  tolerance: %.4f nats (%s)\n  fused-adamw: %s\n  wrong-gradient: %s\n",
                *res.comparison.loss_tolerance_nats, res.comparison.loss_tolerance_basis.c_str(),
                fused.verdict.c_str(), wrong.verdict.c_str());
    ASSERT_TRUE(wrong.loss_within_tolerance.has_value());
    EXPECT_FALSE(*wrong.loss_within_tolerance) << wrong.verdict;
    EXPECT_EQ(wrong.decision, Decision::reject);
    EXPECT_NE(wrong.verdict.find("loss not within tolerance: do not keep"), std::string::npos)
        << wrong.verdict;
    // By a margin, not by luck: the wrong variant's final loss is off by over twice the tolerance.
    ASSERT_TRUE(wrong.delta_final_loss.has_value());
    EXPECT_GT(std::fabs(*wrong.delta_final_loss), 2 * *res.comparison.loss_tolerance_nats)
        << wrong.verdict;
}

TEST_F(LossCheckTest, DefaultSyntheticDataIsLearnedUniformIsNot) {
    const ExperimentSpec spec =
        load_experiment(write_yaml("  - name: baseline\n"
                                   "  - name: uniform\n"
                                   "    set: { data.synthetic: uniform }\n"));
    const ExperimentRun ex = run_experiment(spec, quiet());
    ASSERT_EQ(ex.results.variants.size(), 2u);
    const auto& markov = ex.results.variants[0].steps;
    const auto& uniform = ex.results.variants[1].steps;
    // markov: at least 10% below the first step by the last; uniform: within 2% of ln V.
    EXPECT_LT(markov.back().loss, 0.9 * markov.front().loss)
        << markov.front().loss << " -> " << markov.back().loss;
    const double lnV = std::log(512.0);
    EXPECT_NEAR(uniform.back().loss, lnV, 0.02 * lnV);
    // And the comparison says so: uniform data is not the same experiment's loss.
    const Results res = ex.results;
    EXPECT_FALSE(verdict_of(res, "uniform").loss_within_tolerance.value_or(true));
}

TEST_F(LossCheckTest, GivenRelativeToleranceIsAppliedToTheBaselineMeanLoss) {
    const ExperimentSpec spec =
        load_experiment(write_yaml("  - name: baseline\n", ", loss_tolerance: 0.05"));
    const Results res = run_experiment(spec, quiet()).results;
    ASSERT_TRUE(res.experiment.loss_tolerance.has_value());
    ASSERT_TRUE(res.variants[0].loss.mean_measured.has_value());
    EXPECT_DOUBLE_EQ(*res.comparison.loss_tolerance_nats,
                     0.05 * *res.variants[0].loss.mean_measured);
    EXPECT_NE(res.comparison.loss_tolerance_basis.find("compare.loss_tolerance"),
              std::string::npos);
}

// Results built by hand: the derived tolerance is the robust std of the baseline's successive
// loss changes around their median, over sqrt(2); the check compares only the steps both ran.
Results two_variant_results(const std::vector<double>& base, const std::vector<double>& other) {
    Results r;
    r.experiment.baseline = "base";
    for (const auto& [name, losses] : {std::pair{"base", base}, std::pair{"other", other}}) {
        VariantResult v;
        v.name = name;
        v.stats.step_ms.n = losses.size();
        v.stats.step_ms.median = 10;
        double sum = 0;
        for (size_t i = 0; i < losses.size(); ++i) {
            StepRow s;
            s.step = static_cast<int>(i);
            s.loss = losses[i];
            sum += losses[i];
            v.steps.push_back(s);
        }
        v.loss.mean_measured = sum / losses.size();
        v.loss.final = losses.back();
        r.variants.push_back(v);
    }
    return r;
}

TEST(LossTolerance, DerivedFromTheBaselineStepToStepSpread) {
    // Changes -0.10, -0.30, -0.15, -0.20, -0.10:
    const std::vector<double> base{5.0, 4.90, 4.60, 4.45, 4.25, 4.15};
    // median change -0.15; |dev| 0.05, 0.15, 0, 0.05, 0.05 -> MAD 0.05
    const double want = 1.4826 * 0.05 / std::sqrt(2.0);
    Results r = two_variant_results(base, base);
    const Comparison c = build_comparison(r);
    ASSERT_TRUE(c.loss_tolerance_nats.has_value());
    EXPECT_NEAR(*c.loss_tolerance_nats, want, 1e-9);
    EXPECT_TRUE(c.rows[1].loss_within_tolerance.value_or(false));
    EXPECT_DOUBLE_EQ(*c.rows[1].delta_mean_loss, 0.0);

    // Shifted by 2x the tolerance at the end only: the mean moves little, the final loss fails.
    std::vector<double> drift = base;
    drift.back() += 2 * want;
    const Comparison d = build_comparison(two_variant_results(base, drift));
    EXPECT_FALSE(d.rows[1].loss_within_tolerance.value_or(true));
    EXPECT_NE(d.rows[1].verdict.find("loss not within tolerance: do not keep"), std::string::npos)
        << d.rows[1].verdict;
}

TEST(LossTolerance, ComparesOnlyTheStepsBothVariantsMeasured) {
    // The variant stopped after 3 steps (interrupted): its 3 losses equal the baseline's first 3.
    const std::vector<double> base{5.0, 4.90, 4.60, 4.45, 4.25, 4.15};
    const Comparison c = build_comparison(two_variant_results(base, {5.0, 4.90, 4.60}));
    ASSERT_TRUE(c.rows[1].delta_mean_loss.has_value());
    EXPECT_DOUBLE_EQ(*c.rows[1].delta_mean_loss, 0.0);
    EXPECT_DOUBLE_EQ(*c.rows[1].delta_final_loss, 0.0);
    EXPECT_TRUE(c.rows[1].loss_within_tolerance.value_or(false));
}

TEST(SyntheticTokens, MarkovStreamIsDeterministicRandomAccessAndPredictable) {
    const int V = 1024;
    SyntheticTokens a(SyntheticKind::markov, V, 5), b(SyntheticKind::markov, V, 5);
    std::vector<int> whole(8192), part(100);
    a.read(0, 8192, whole.data());
    b.read(3000, 100, part.data());  // mid-chunk, crossing a chunk boundary at 3072
    for (int i = 0; i < 100; ++i) ASSERT_EQ(part[i], whole[3000 + i]) << i;
    for (int t : whole) ASSERT_TRUE(t >= 0 && t < V);
    // Each token has at most kBranches successors (chunk starts excepted): the conditional
    // entropy is far below ln V, which is what makes the stream learnable.
    std::map<int, std::map<int, int>> next;
    for (size_t i = 0; i + 1 < whole.size(); ++i)
        if ((i + 1) % SyntheticTokens::kChunkTokens != 0) next[whole[i]][whole[i + 1]]++;
    for (const auto& [tok, succ] : next)
        EXPECT_LE(succ.size(), static_cast<size_t>(SyntheticTokens::kBranches)) << tok;
    // A different seed is a different stream.
    SyntheticTokens c(SyntheticKind::markov, V, 6);
    std::vector<int> other(8192);
    c.read(0, 8192, other.data());
    EXPECT_NE(other, whole);
}

}  // namespace
}  // namespace mt

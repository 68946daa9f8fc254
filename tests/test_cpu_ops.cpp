// The CPU kernels (kernels/cpu/ops.h) against independent references: every backward against
// central finite differences of a scalar loss L = sum(out * r) with random r (so dout = r), every
// forward against a plain double-precision reference, and the accumulate (+=) convention.
// Shapes are small and deliberately not multiples of the SIMD width (C = 13, OC = 7, T = 1, 5).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/math.h"
#include "tests/cpu_isa_environment.h"

namespace {

using Vec = std::vector<float>;

Vec random_vec(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

double weighted_sum(const Vec& out, const Vec& r) {
    double s = 0;
    for (size_t i = 0; i < out.size(); i++) s += static_cast<double>(out[i]) * r[i];
    return s;
}

// Central differences of loss() w.r.t. x, compared with `analytic` on up to max_samples elements
// (evenly spread). |a - fd| <= rtol * max(|a|, |fd|) + atol.
void expect_matches_fd(const char* what, Vec& x, const std::function<double()>& loss,
                       const Vec& analytic, size_t max_samples = 200, float h = 1e-3f,
                       double rtol = 1e-2, double atol = 2e-3) {
    ASSERT_EQ(x.size(), analytic.size()) << what;
    const size_t stride = std::max<size_t>(1, x.size() / max_samples);
    size_t checked = 0;
    for (size_t i = 0; i < x.size(); i += stride) {
        const float orig = x[i];
        x[i] = orig + h;
        const double lp = loss();
        x[i] = orig - h;
        const double lm = loss();
        x[i] = orig;
        const double fd = (lp - lm) / (2.0 * h);
        const double a = analytic[i];
        EXPECT_LE(std::abs(a - fd), rtol * std::max(std::abs(a), std::abs(fd)) + atol)
            << what << "[" << i << "]: analytic " << a << " vs finite difference " << fd;
        checked++;
    }
    EXPECT_GT(checked, 0u);
}

void expect_near_vec(const Vec& a, const Vec& b, double tol, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); i++)
        ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::abs(b[i]))) << what << "[" << i << "]";
}

Vec doubled(const Vec& v) {
    Vec r(v);
    for (auto& x : r) x *= 2.0f;
    return r;
}

// ---- encoder --------------------------------------------------------------------------------

TEST(CpuEncoder, ForwardAddsTokenAndPositionEmbeddings) {
    std::mt19937 rng(1);
    const int B = 2, T = 5, C = 13, V = 7;
    Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), out(B * T * C);
    std::vector<int> inp = {3, 0, 6, 3, 3, 1, 2, 6, 0, 5};
    mt::cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                EXPECT_EQ(out[(b * T + t) * C + c], wte[inp[b * T + t] * C + c] + wpe[t * C + c]);
}

TEST(CpuEncoder, BackwardMatchesFiniteDifferencesWithRepeatedTokens) {
    std::mt19937 rng(2);
    const int B = 2, T = 5, C = 13, V = 7;
    Vec wte = random_vec(V * C, rng), wpe = random_vec(T * C, rng), out(B * T * C);
    std::vector<int> inp = {3, 0, 6, 3, 3, 1, 2, 6, 0, 5};  // token 3 three times
    Vec r = random_vec(out.size(), rng);
    Vec dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
    mt::cpu::encoder_backward(dwte.data(), dwpe.data(), r.data(), inp.data(), B, T, C);
    auto loss = [&] {
        mt::cpu::encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
        return weighted_sum(out, r);
    };
    expect_matches_fd("dwte", wte, loss, dwte, 1000);
    expect_matches_fd("dwpe", wpe, loss, dwpe, 1000);
    // accumulate: a second call doubles the gradients
    Vec dwte1 = dwte, dwpe1 = dwpe;
    mt::cpu::encoder_backward(dwte.data(), dwpe.data(), r.data(), inp.data(), B, T, C);
    expect_near_vec(dwte, doubled(dwte1), 1e-6, "dwte twice");
    expect_near_vec(dwpe, doubled(dwpe1), 1e-6, "dwpe twice");
}

// ---- layernorm ------------------------------------------------------------------------------

TEST(CpuLayerNorm, ForwardMatchesDoubleReference) {
    std::mt19937 rng(3);
    const int N = 6, C = 13;
    Vec x = random_vec(N * C, rng, -3, 3), w = random_vec(C, rng), b = random_vec(C, rng);
    Vec out(N * C), mean(N), rstd(N);
    mt::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(),
                               N, C);
    for (int n = 0; n < N; n++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += x[n * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= C;
        const double s = 1.0 / std::sqrt(v + 1e-5);
        EXPECT_NEAR(mean[n], m, 1e-6);
        EXPECT_NEAR(rstd[n], s, 1e-5 * s);
        for (int c = 0; c < C; c++)
            EXPECT_NEAR(out[n * C + c], (x[n * C + c] - m) * s * w[c] + b[c], 1e-5);
    }
}

TEST(CpuLayerNorm, BackwardMatchesFiniteDifferencesAndAccumulates) {
    std::mt19937 rng(4);
    for (int C : {13, 70}) {
        const int N = 5;
        Vec x = random_vec(N * C, rng, -2, 2), w = random_vec(C, rng), b = random_vec(C, rng);
        Vec out(N * C), mean(N), rstd(N), r = random_vec(N * C, rng);
        auto loss = [&] {
            mt::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                       b.data(), N, C);
            return weighted_sum(out, r);
        };
        loss();
        Vec dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
        mt::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), N, C);
        expect_matches_fd("dinp", x, loss, dx);
        expect_matches_fd("dweight", w, loss, dw);
        expect_matches_fd("dbias", b, loss, db);
        loss();
        Vec dx1 = dx, dw1 = dw, db1 = db;
        mt::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(),
                                    mean.data(), rstd.data(), N, C);
        expect_near_vec(dx, doubled(dx1), 1e-6, "dinp twice");
        expect_near_vec(dw, doubled(dw1), 1e-6, "dweight twice");
        expect_near_vec(db, doubled(db1), 1e-6, "dbias twice");
    }
}

TEST(CpuLayerNorm, FusedResidualEqualsResidualThenLayerNorm) {
    std::mt19937 rng(5);
    const int N = 7, C = 13;
    Vec a = random_vec(N * C, rng), bb = random_vec(N * C, rng);
    Vec w = random_vec(C, rng), b = random_vec(C, rng);
    Vec res1(N * C), out1(N * C), m1(N), s1(N), res2(N * C), out2(N * C), m2(N), s2(N);
    mt::cpu::residual_forward(res1.data(), a.data(), bb.data(), res1.size());
    mt::cpu::layernorm_forward(out1.data(), m1.data(), s1.data(), res1.data(), w.data(), b.data(),
                               N, C);
    mt::cpu::fused_residual_layernorm_forward(res2.data(), out2.data(), m2.data(), s2.data(),
                                              a.data(), bb.data(), w.data(), b.data(), N, C);
    EXPECT_EQ(res1, res2);
    EXPECT_EQ(out1, out2);
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(s1, s2);
}

// ---- matmul ---------------------------------------------------------------------------------

void matmul_reference(Vec& out, const Vec& x, const Vec& w, const float* bias, int N, int C,
                      int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += static_cast<double>(x[n * C + c]) * w[o * C + c];
            out[n * OC + o] = static_cast<float>(s);
        }
}

TEST(CpuMatmul, ForwardMatchesNaiveReferenceWithAndWithoutBias) {
    std::mt19937 rng(6);
    for (auto [N, C, OC] : {std::tuple{5, 13, 7}, std::tuple{1, 3, 1}, std::tuple{33, 40, 65}}) {
        Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng);
        Vec out(N * OC), ref(N * OC);
        mt::cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
        matmul_reference(ref, x, w, b.data(), N, C, OC);
        expect_near_vec(out, ref, 1e-5, "out with bias");
        mt::cpu::matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC);
        matmul_reference(ref, x, w, nullptr, N, C, OC);
        expect_near_vec(out, ref, 1e-5, "out without bias");
    }
}

TEST(CpuMatmul, BackwardMatchesFiniteDifferencesAndAccumulates) {
    std::mt19937 rng(7);
    const int N = 5, C = 13, OC = 7;
    Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng);
    Vec out(N * OC), r = random_vec(N * OC, rng);
    auto loss = [&] {
        mt::cpu::matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
        return weighted_sum(out, r);
    };
    Vec dx(x.size(), 0.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
    mt::cpu::matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C,
                             OC);
    expect_matches_fd("dinp", x, loss, dx, 1000);
    expect_matches_fd("dweight", w, loss, dw, 1000);
    expect_matches_fd("dbias", b, loss, db, 1000);
    Vec dx1 = dx, dw1 = dw, db1 = db;
    mt::cpu::matmul_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), N, C,
                             OC);
    expect_near_vec(dx, doubled(dx1), 1e-6, "dinp twice");
    expect_near_vec(dw, doubled(dw1), 1e-6, "dweight twice");
    expect_near_vec(db, doubled(db1), 1e-6, "dbias twice");
    // dinp and dbias are optional: dweight alone still accumulates the same amount.
    Vec dw_only(w.size(), 0.0f);
    mt::cpu::matmul_backward(nullptr, dw_only.data(), nullptr, r.data(), x.data(), w.data(), N, C,
                             OC);
    expect_near_vec(dw_only, dw1, 1e-6, "dweight without dinp/dbias");
}

TEST(CpuMatmul, GeluEpilogueEqualsMatmulThenGelu) {
    std::mt19937 rng(8);
    const int N = 9, C = 13, OC = 21;
    Vec x = random_vec(N * C, rng), w = random_vec(OC * C, rng), b = random_vec(OC, rng);
    Vec mm(N * OC), g(N * OC), out(N * OC), pre(N * OC);
    mt::cpu::matmul_forward(mm.data(), x.data(), w.data(), b.data(), N, C, OC);
    mt::cpu::gelu_forward(g.data(), mm.data(), mm.size());
    mt::cpu::matmul_forward_gelu(out.data(), pre.data(), x.data(), w.data(), b.data(), N, C, OC);
    EXPECT_EQ(pre, mm);
    EXPECT_EQ(out, g);
}

// ---- attention ------------------------------------------------------------------------------

// Double-precision causal attention: out (B,T,C) from qkv (B,T,3C).
Vec attention_reference(const Vec& qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
    Vec out(static_cast<size_t>(B) * T * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float* q = &qkv[(b * T + t) * 3 * C + h * hs];
                std::vector<double> s(t + 1);
                double mx = -1e300, sum = 0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = &qkv[(b * T + t2) * 3 * C + C + h * hs];
                    double d = 0;
                    for (int i = 0; i < hs; i++) d += static_cast<double>(q[i]) * k[i];
                    s[t2] = d * scale;
                    mx = std::max(mx, s[t2]);
                }
                for (auto& e : s) sum += (e = std::exp(e - mx));
                for (int i = 0; i < hs; i++) {
                    double o = 0;
                    for (int t2 = 0; t2 <= t; t2++)
                        o += s[t2] / sum * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    out[(b * T + t) * C + h * hs + i] = static_cast<float>(o);
                }
            }
    return out;
}

enum class Attn { naive, flash };
const char* name(Attn a) {
    return a == Attn::naive ? "naive" : "flash";
}

size_t saved_elems(Attn a, int B, int T, int NH) {
    return a == Attn::naive ? static_cast<size_t>(B) * NH * T * T : static_cast<size_t>(B) * NH * T;
}
void attn_forward(Attn a, Vec& out, Vec& saved, const Vec& qkv, int B, int T, int C, int NH) {
    if (a == Attn::naive)
        mt::cpu::attention_forward_naive(out.data(), saved.data(), qkv.data(), B, T, C, NH);
    else
        mt::cpu::attention_forward_flash(out.data(), saved.data(), qkv.data(), B, T, C, NH);
}
void attn_backward(Attn a, Vec& dqkv, const Vec& dout, const Vec& qkv, const Vec& out,
                   const Vec& saved, int B, int T, int C, int NH) {
    if (a == Attn::naive)
        mt::cpu::attention_backward_naive(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          saved.data(), B, T, C, NH);
    else
        mt::cpu::attention_backward_flash(dqkv.data(), dout.data(), qkv.data(), out.data(),
                                          saved.data(), B, T, C, NH);
}

struct AttnShape {
    int B, T, C, NH;
};
// T = 70 crosses the flash variant's 64-key block; T = 1 is a single key.
const AttnShape kAttnShapes[] = {{2, 5, 12, 2}, {1, 1, 6, 3}, {2, 7, 9, 3}, {1, 70, 8, 2}};

TEST(CpuAttention, ForwardMatchesDoubleReference) {
    std::mt19937 rng(9);
    for (Attn a : {Attn::naive, Attn::flash})
        for (const auto& s : kAttnShapes) {
            Vec qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng, -2, 2);
            Vec out(static_cast<size_t>(s.B) * s.T * s.C), saved(saved_elems(a, s.B, s.T, s.NH));
            attn_forward(a, out, saved, qkv, s.B, s.T, s.C, s.NH);
            expect_near_vec(out, attention_reference(qkv, s.B, s.T, s.C, s.NH), 1e-5, name(a));
        }
}

TEST(CpuAttention, NaiveSavesRowStochasticCausalProbabilities) {
    std::mt19937 rng(10);
    const int B = 2, T = 6, C = 12, NH = 3;
    Vec qkv = random_vec(B * T * 3 * C, rng), out(B * T * C), att(B * NH * T * T);
    mt::cpu::attention_forward_naive(out.data(), att.data(), qkv.data(), B, T, C, NH);
    for (int row = 0; row < B * NH * T; row++) {
        const int t = row % T;
        double sum = 0;
        for (int t2 = 0; t2 < T; t2++) {
            const float p = att[row * T + t2];
            if (t2 > t) {
                EXPECT_EQ(p, 0.0f) << "masked probability above the diagonal";
            }
            sum += p;
        }
        EXPECT_NEAR(sum, 1.0, 1e-6);
    }
}

TEST(CpuAttention, FlashSavesLogSumExpOfScores) {
    std::mt19937 rng(11);
    const int B = 1, T = 70, C = 8, NH = 2, hs = C / NH;
    Vec qkv = random_vec(B * T * 3 * C, rng, -2, 2), out(B * T * C), lse(B * NH * T);
    mt::cpu::attention_forward_flash(out.data(), lse.data(), qkv.data(), B, T, C, NH);
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < T; t++) {
            double sum = 0;
            for (int t2 = 0; t2 <= t; t2++) {
                double d = 0;
                for (int i = 0; i < hs; i++)
                    d += static_cast<double>(qkv[t * 3 * C + h * hs + i]) *
                         qkv[t2 * 3 * C + C + h * hs + i];
                sum += std::exp(d / std::sqrt(static_cast<double>(hs)));
            }
            EXPECT_NEAR(lse[h * T + t], std::log(sum), 1e-5);
        }
}

TEST(CpuAttention, SingleTokenOutputIsItsValue) {
    std::mt19937 rng(12);
    for (Attn a : {Attn::naive, Attn::flash}) {
        const int B = 3, T = 1, C = 6, NH = 2;
        Vec qkv = random_vec(B * T * 3 * C, rng), out(B * T * C), saved(saved_elems(a, B, T, NH));
        attn_forward(a, out, saved, qkv, B, T, C, NH);
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) EXPECT_FLOAT_EQ(out[b * C + c], qkv[b * 3 * C + 2 * C + c]);
    }
}

TEST(CpuAttention, OutputAtTDoesNotDependOnLaterTokens) {
    std::mt19937 rng(13);
    for (Attn a : {Attn::naive, Attn::flash}) {
        const int B = 1, T = 7, C = 9, NH = 3, tcut = 3;
        Vec qkv = random_vec(B * T * 3 * C, rng), out1(B * T * C), out2(B * T * C);
        Vec saved(saved_elems(a, B, T, NH));
        attn_forward(a, out1, saved, qkv, B, T, C, NH);
        for (int t = tcut + 1; t < T; t++)
            for (int c = 0; c < 3 * C; c++) qkv[t * 3 * C + c] += 5.0f;
        attn_forward(a, out2, saved, qkv, B, T, C, NH);
        for (int t = 0; t <= tcut; t++)
            for (int c = 0; c < C; c++)
                EXPECT_EQ(out1[t * C + c], out2[t * C + c]) << name(a) << " t=" << t;
        bool later_changed = false;
        for (int c = 0; c < C; c++) later_changed |= out1[(T - 1) * C + c] != out2[(T - 1) * C + c];
        EXPECT_TRUE(later_changed) << "perturbing the last tokens must change their own output";
    }
}

TEST(CpuAttention, BackwardMatchesFiniteDifferencesAndAccumulates) {
    std::mt19937 rng(14);
    for (Attn a : {Attn::naive, Attn::flash})
        for (const auto& s : kAttnShapes) {
            if (s.T > 10) continue;  // FD cost; the long shape is covered by FlashMatchesNaive
            Vec qkv = random_vec(static_cast<size_t>(s.B) * s.T * 3 * s.C, rng);
            Vec out(static_cast<size_t>(s.B) * s.T * s.C), saved(saved_elems(a, s.B, s.T, s.NH));
            Vec r = random_vec(out.size(), rng);
            auto loss = [&] {
                attn_forward(a, out, saved, qkv, s.B, s.T, s.C, s.NH);
                return weighted_sum(out, r);
            };
            loss();
            Vec dqkv(qkv.size(), 0.0f);
            attn_backward(a, dqkv, r, qkv, out, saved, s.B, s.T, s.C, s.NH);
            SCOPED_TRACE(::testing::Message() << name(a) << " B=" << s.B << " T=" << s.T
                                              << " C=" << s.C << " NH=" << s.NH);
            expect_matches_fd("dqkv", qkv, loss, dqkv, 400);
            loss();
            Vec d1 = dqkv;
            attn_backward(a, dqkv, r, qkv, out, saved, s.B, s.T, s.C, s.NH);
            expect_near_vec(dqkv, doubled(d1), 1e-6, "dqkv twice");
        }
}

TEST(CpuAttention, FlashMatchesNaiveForwardAndBackward) {
    std::mt19937 rng(15);
    const int B = 2, T = 70, C = 16, NH = 2;
    Vec qkv = random_vec(B * T * 3 * C, rng, -2, 2), r = random_vec(B * T * C, rng);
    Vec out_n(B * T * C), out_f(B * T * C), att(B * NH * T * T), lse(B * NH * T);
    mt::cpu::attention_forward_naive(out_n.data(), att.data(), qkv.data(), B, T, C, NH);
    mt::cpu::attention_forward_flash(out_f.data(), lse.data(), qkv.data(), B, T, C, NH);
    expect_near_vec(out_f, out_n, 1e-5, "out");
    Vec d_n(qkv.size(), 0.0f), d_f(qkv.size(), 0.0f);
    mt::cpu::attention_backward_naive(d_n.data(), r.data(), qkv.data(), out_n.data(), att.data(), B,
                                      T, C, NH);
    mt::cpu::attention_backward_flash(d_f.data(), r.data(), qkv.data(), out_f.data(), lse.data(), B,
                                      T, C, NH);
    expect_near_vec(d_f, d_n, 1e-4, "dqkv");
}

// ---- pointwise ------------------------------------------------------------------------------

TEST(CpuPointwise, GeluForwardMatchesTanhFormulaInDouble) {
    std::mt19937 rng(16);
    Vec x = random_vec(37, rng, -5, 5), y(x.size());
    mt::cpu::gelu_forward(y.data(), x.data(), x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double v = x[i];
        const double ref =
            0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
        EXPECT_NEAR(y[i], ref, 1e-6 * (1 + std::abs(ref)));
    }
}

TEST(CpuPointwise, GeluBackwardMatchesFiniteDifferencesAndAccumulates) {
    std::mt19937 rng(17);
    Vec x = random_vec(37, rng, -4, 4), y(x.size()), r = random_vec(x.size(), rng);
    auto loss = [&] {
        mt::cpu::gelu_forward(y.data(), x.data(), x.size());
        return weighted_sum(y, r);
    };
    Vec dx(x.size(), 0.0f);
    mt::cpu::gelu_backward(dx.data(), x.data(), r.data(), x.size());
    expect_matches_fd("dinp", x, loss, dx);
    Vec d1 = dx;
    mt::cpu::gelu_backward(dx.data(), x.data(), r.data(), x.size());
    expect_near_vec(dx, doubled(d1), 1e-6, "dinp twice");
}

TEST(CpuPointwise, ResidualForwardAddsAndBackwardAccumulatesIntoBothInputs) {
    std::mt19937 rng(18);
    const size_t n = 29;
    Vec a = random_vec(n, rng), b = random_vec(n, rng), out(n), r = random_vec(n, rng);
    mt::cpu::residual_forward(out.data(), a.data(), b.data(), n);
    for (size_t i = 0; i < n; i++) EXPECT_EQ(out[i], a[i] + b[i]);
    auto loss = [&] {
        mt::cpu::residual_forward(out.data(), a.data(), b.data(), n);
        return weighted_sum(out, r);
    };
    Vec da(n, 0.5f), db(n, -0.25f);  // non-zero start: the backward adds
    mt::cpu::residual_backward(da.data(), db.data(), r.data(), n);
    for (size_t i = 0; i < n; i++) {
        EXPECT_EQ(da[i], 0.5f + r[i]);
        EXPECT_EQ(db[i], -0.25f + r[i]);
    }
    Vec ga(n, 0.0f), gb(n, 0.0f);
    mt::cpu::residual_backward(ga.data(), gb.data(), r.data(), n);
    expect_matches_fd("dinp1", a, loss, ga);
    expect_matches_fd("dinp2", b, loss, gb);
}

// ---- classifier -----------------------------------------------------------------------------

struct ClassifierCase {
    int N = 6, V = 13, Vp = 16;
    Vec logits;
    std::vector<int> targets;
    explicit ClassifierCase(std::mt19937& rng, int N_ = 6, int V_ = 13, int Vp_ = 16)
        : N(N_), V(V_), Vp(Vp_) {
        logits = random_vec(static_cast<size_t>(N) * Vp, rng, -3, 3);
        for (int n = 0; n < N; n++)
            for (int i = V; i < Vp; i++) logits[n * Vp + i] = 100.0f;  // padding: must be ignored
        std::uniform_int_distribution<int> u(0, V - 1);
        for (int n = 0; n < N; n++) targets.push_back(u(rng));
        targets[0] = V - 1;  // the last real column
    }
};

double mean_loss_reference(const ClassifierCase& c, const Vec& logits) {
    double total = 0;
    for (int n = 0; n < c.N; n++) {
        double mx = -1e300, sum = 0;
        for (int i = 0; i < c.V; i++) mx = std::max(mx, static_cast<double>(logits[n * c.Vp + i]));
        for (int i = 0; i < c.V; i++) sum += std::exp(logits[n * c.Vp + i] - mx);
        total += std::log(sum) + mx - logits[n * c.Vp + c.targets[n]];
    }
    return total / c.N;
}

TEST(CpuClassifier, FusedLossMatchesDoubleReferenceAndGradientMatchesFiniteDifferences) {
    std::mt19937 rng(19);
    ClassifierCase c(rng);
    Vec logits = c.logits, losses(c.N);
    mt::cpu::classifier_fused(losses.data(), logits.data(), c.targets.data(), c.N, c.V, c.Vp,
                              1.0f / c.N);
    double mean = 0;
    for (float l : losses) mean += l;
    EXPECT_NEAR(mean / c.N, mean_loss_reference(c, c.logits), 1e-5);
    // gradient (now in `logits`) against FD of the mean loss, computed with the fused op itself
    Vec x = c.logits;
    auto loss = [&] {
        Vec tmp = x, l(c.N);
        mt::cpu::classifier_fused(l.data(), tmp.data(), c.targets.data(), c.N, c.V, c.Vp, 0.0f);
        double s = 0;
        for (float v : l) s += v;
        return s / c.N;
    };
    expect_matches_fd("dlogits", x, loss, logits, 1000, 1e-3f, 1e-2, 2e-4);
}

TEST(CpuClassifier, FusedZeroesPaddedColumns) {
    std::mt19937 rng(20);
    ClassifierCase c(rng);
    Vec logits = c.logits, losses(c.N);
    mt::cpu::classifier_fused(losses.data(), logits.data(), c.targets.data(), c.N, c.V, c.Vp, 0.5f);
    for (int n = 0; n < c.N; n++) {
        double row = 0;
        for (int i = c.V; i < c.Vp; i++) EXPECT_EQ(logits[n * c.Vp + i], 0.0f);
        for (int i = 0; i < c.V; i++) row += logits[n * c.Vp + i];
        EXPECT_NEAR(row, 0.0, 1e-6) << "(p - onehot) sums to zero over a row";
    }
}

TEST(CpuClassifier, FusedWithZeroDlossLeavesLogitsUntouched) {
    std::mt19937 rng(21);
    ClassifierCase c(rng);
    Vec logits = c.logits, losses(c.N);
    mt::cpu::classifier_fused(losses.data(), logits.data(), c.targets.data(), c.N, c.V, c.Vp, 0.0f);
    EXPECT_EQ(0, std::memcmp(logits.data(), c.logits.data(), logits.size() * sizeof(float)));
    for (float l : losses) EXPECT_GT(l, 0.0f);
}

TEST(CpuClassifier, FusedMatchesUnfusedLossAndGradient) {
    std::mt19937 rng(22);
    ClassifierCase c(rng, 9, 300, 384);  // V spans more than one 256-column block
    const float dloss = 1.0f / c.N;
    Vec fused = c.logits, lf(c.N);
    mt::cpu::classifier_fused(lf.data(), fused.data(), c.targets.data(), c.N, c.V, c.Vp, dloss);
    Vec probs(c.logits.size()), lu(c.N), dlogits(c.logits.size(), 7.0f);
    mt::cpu::softmax_forward(probs.data(), c.logits.data(), c.N, c.V, c.Vp);
    mt::cpu::crossentropy_forward(lu.data(), probs.data(), c.targets.data(), c.N, c.V, c.Vp);
    mt::cpu::crossentropy_softmax_backward(dlogits.data(), probs.data(), c.targets.data(), c.N, c.V,
                                           c.Vp, dloss);
    expect_near_vec(lf, lu, 1e-5, "losses");
    expect_near_vec(fused, dlogits, 1e-6, "dlogits");
    for (int n = 0; n < c.N; n++)
        for (int i = c.V; i < c.Vp; i++) {
            EXPECT_EQ(probs[n * c.Vp + i], 0.0f);
            EXPECT_EQ(dlogits[n * c.Vp + i], 0.0f);
        }
}

TEST(CpuClassifier, UnfusedBackwardMatchesFiniteDifferencesOfMeanLoss) {
    std::mt19937 rng(23);
    ClassifierCase c(rng);
    Vec x = c.logits, probs(x.size()), l(c.N), d(x.size());
    auto loss = [&] {
        mt::cpu::softmax_forward(probs.data(), x.data(), c.N, c.V, c.Vp);
        mt::cpu::crossentropy_forward(l.data(), probs.data(), c.targets.data(), c.N, c.V, c.Vp);
        double s = 0;
        for (float v : l) s += v;
        return s / c.N;
    };
    loss();
    mt::cpu::crossentropy_softmax_backward(d.data(), probs.data(), c.targets.data(), c.N, c.V, c.Vp,
                                           1.0f / c.N);
    expect_matches_fd("dlogits", x, loss, d, 1000, 1e-3f, 1e-2, 2e-4);
}

TEST(CpuClassifier, TargetOutsideVocabularyIsAClearError) {
    std::mt19937 rng(24);
    ClassifierCase c(rng);
    c.targets[2] = c.V;  // a padded column is not a valid class
    Vec logits = c.logits, losses(c.N);
    try {
        mt::cpu::classifier_fused(losses.data(), logits.data(), c.targets.data(), c.N, c.V, c.Vp,
                                  1.0f);
        FAIL() << "expected BackendError";
    } catch (const mt::BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("vocab"), std::string::npos) << e.what();
    }
}

// ---- reductions -----------------------------------------------------------------------------

TEST(CpuReductions, GlobalNormSquaredMatchesDoubleReferenceForAwkwardSizes) {
    std::mt19937 rng(25);
    for (size_t n : {size_t{1}, size_t{13}, size_t{255}, size_t{257}, size_t{100003}}) {
        Vec g = random_vec(n, rng);
        double ref = 0;
        for (float x : g) ref += static_cast<double>(x) * x;
        float out = -1;
        mt::cpu::global_norm_squared(&out, g.data(), n);
        EXPECT_NEAR(out, ref, 1e-6 * ref) << "n=" << n;
    }
    float out = -1;
    mt::cpu::global_norm_squared(&out, nullptr, 0);
    EXPECT_EQ(out, 0.0f);
}

TEST(CpuReductions, GlobalNormSquaredIsBitwiseReproducibleAcrossThreadCounts) {
    std::mt19937 rng(26);
    Vec g = random_vec(1 << 20, rng, -1e-2f, 1e-2f);
    const int saved = omp_get_max_threads();
    std::vector<float> results;
    for (int threads : {1, 2, 3, 7}) {
        omp_set_num_threads(threads);
        float out;
        mt::cpu::global_norm_squared(&out, g.data(), g.size());
        results.push_back(out);
        float again;
        mt::cpu::global_norm_squared(&again, g.data(), g.size());
        EXPECT_EQ(std::memcmp(&out, &again, sizeof(float)), 0);
    }
    omp_set_num_threads(saved);
    for (float r : results) EXPECT_EQ(std::memcmp(&r, &results[0], sizeof(float)), 0);
}

TEST(CpuReductions, SumScaledMatchesDoubleReference) {
    std::mt19937 rng(27);
    for (size_t n : {size_t{1}, size_t{7}, size_t{4099}}) {
        Vec x = random_vec(n, rng, 0, 10);
        double ref = 0;
        for (float v : x) ref += v;
        float out = -1;
        mt::cpu::sum_scaled(&out, x.data(), n, 1.0f / static_cast<float>(n));
        EXPECT_NEAR(out, ref / n, 1e-6 * ref / n);
    }
}

TEST(CpuReductions, ClipScaleIsOneBelowTheThresholdAndMaxNormOverNormAbove) {
    float s = 0;
    const float small = 0.25f;  // norm 0.5
    mt::cpu::clip_scale(&s, &small, 1.0f);
    EXPECT_EQ(s, 1.0f);
    const float big = 16.0f;  // norm 4
    mt::cpu::clip_scale(&s, &big, 1.0f);
    EXPECT_NEAR(s, 0.25f, 1e-6f);
    const float zero = 0.0f;
    mt::cpu::clip_scale(&s, &zero, 1.0f);
    EXPECT_EQ(s, 1.0f);
}

}  // namespace

// The backend-ops test (in the manner of ggml's test-backend-ops): it walks the op table
// (kernels/ops.h) and checks every op through the front the model uses, Backend::run.
//
//   BackendOps/CpuMatchesFloat64.<Case>   the CPU backend against an independent reference
//       written here: forward ops against naive float64 loops, backward ops against central
//       finite differences (in double, through those float64 forwards) of L = sum(dout * fwd(x))
//       for every input that has a gradient, with gradients starting non-zero (the += rule).
//   BackendOps/Cuda<Precision>MatchesCpu.<Case>   every other backend against the CPU backend
//       on the same inputs (Mirror, tests/cuda/cuda_test_util.h): today CUDA at fp32 and bf16
//       (and tf32 for one matmul case). Without a usable CUDA device these skip, saying why
//       (ctest lists them as skipped, not passed).
//   BackendOps.<Behaviour>   coverage (every op in kOpNames has a case of each kind) and the
//       front's own rules: the same rejection on every backend, "has no kernel" for a null
//       entry, a bad request never reaching the kernel.
//
// Adding an op's case is one block: CPU_CASE(OpStruct, CaseName) { ... } or
// BACKEND_CASE(OpStruct, CaseName) { ... uses Mirror& m ... }; each registers itself as a test
// and under the op's name in the coverage table.
//
// Shapes are small and awkward: C not a multiple of 8/16 (13, 15), T = 1, NH = 3, a padded
// vocabulary (V < Vp). Tolerances: |got - want| <= atol + rtol |want|, each stated with why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/quantize.h"
#include "tests/cpu_isa_environment.h"
#include "tests/cuda/cuda_test_util.h"

namespace mt {
namespace {

using test::Mirror;
using test::randint;
using test::randn;
using test::Tol;
using Vec = std::vector<float>;
using F64 = std::vector<double>;

// ---- the case registry ----------------------------------------------------------------------

// How many cases each op has of each kind; EveryOpHasACase compares it with kOpNames.
struct CaseCounts {
    int cpu = 0;    // CpuMatchesFloat64 cases
    int other = 0;  // <other backend>MatchesCpu cases
};
std::map<std::string, CaseCounts, std::less<>>& case_counts() {
    static std::map<std::string, CaseCounts, std::less<>> counts;
    return counts;
}

class CpuCase : public ::testing::Test {
  public:
    explicit CpuCase(void (*body)()) : body_(body) {}
    void TestBody() override { body_(); }

  private:
    void (*body_)();
};

// One case of another backend against the CPU: skips cleanly without a usable device.
class BackendCase : public ::testing::Test {
  public:
    BackendCase(void (*body)(Mirror&), Precision precision) : body_(body), precision_(precision) {}
    void TestBody() override {
        std::string why;
        if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA backend to compare: " << why;
        Mirror m(precision_);
        body_(m);
    }

  private:
    void (*body_)(Mirror&);
    Precision precision_;
};

// The suite of the other backend at precision p. Today that backend is CUDA (Mirror pairs the
// CPU with it); another backend would get its own suites and a Mirror of its own.
const char* other_suite(Precision p) {
    switch (p) {
        case Precision::fp32:
            return "BackendOps/CudaFp32MatchesCpu";
        case Precision::bf16:
            return "BackendOps/CudaBf16MatchesCpu";
        case Precision::tf32:
            return "BackendOps/CudaTf32MatchesCpu";
    }
    return "?";
}

bool register_cpu_case(std::string_view op, const char* name, void (*body)(), const char* file,
                       int line) {
    case_counts()[std::string(op)].cpu++;
    ::testing::RegisterTest("BackendOps/CpuMatchesFloat64", name, nullptr, nullptr, file, line,
                            [=]() -> ::testing::Test* { return new CpuCase(body); });
    return true;
}
bool register_backend_case(std::string_view op, const char* name, void (*body)(Mirror&),
                           std::initializer_list<Precision> precisions, const char* file,
                           int line) {
    case_counts()[std::string(op)].other++;
    for (Precision p : precisions)
        ::testing::RegisterTest(other_suite(p), name, nullptr, nullptr, file, line,
                                [=]() -> ::testing::Test* { return new BackendCase(body, p); });
    return true;
}

// CPU_CASE(Op, Name) { body }: a CpuMatchesFloat64 case of op::Op.
#define CPU_CASE(Op, Name)                                                           \
    void cpu_case_##Name();                                                          \
    [[maybe_unused]] const bool cpu_case_##Name##_registered =                       \
        register_cpu_case(op::Op::name, #Name, cpu_case_##Name, __FILE__, __LINE__); \
    void cpu_case_##Name()
// BACKEND_CASE(Op, Name) { body using Mirror& m }: the other backend against the CPU, at fp32
// and bf16; BACKEND_CASE_AT(Op, Name, precisions...) at the precisions given.
#define BACKEND_CASE_AT(Op, Name, ...)                                                    \
    void backend_case_##Name(Mirror& m);                                                  \
    [[maybe_unused]] const bool backend_case_##Name##_registered = register_backend_case( \
        op::Op::name, #Name, backend_case_##Name, {__VA_ARGS__}, __FILE__, __LINE__);     \
    void backend_case_##Name([[maybe_unused]] Mirror& m)
#define BACKEND_CASE(Op, Name) BACKEND_CASE_AT(Op, Name, Precision::fp32, Precision::bf16)

// ---- helpers: the CPU backend, conversions, comparisons --------------------------------------

// The CPU backend every CpuMatchesFloat64 case runs on. Its memory is host memory, so the cases
// hand it std::vector storage directly.
Backend& cpu() {
    static const std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    return *backend;
}

F64 f64(const Vec& v) {
    return F64(v.begin(), v.end());
}

// |got - want| <= atol + rtol |want| element-wise, reporting the first and the worst miss.
::testing::AssertionResult close64(const F64& got, const F64& want, Tol tol, const char* what) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure()
               << what << ": size " << got.size() << " vs " << want.size();
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = std::fabs(got[i] - want[i]);
        if (!(d <= tol.atol + tol.rtol * std::fabs(want[i])) && bad++ == 0) first = i;
        if (d > worst || std::isnan(d)) worst = d;
    }
    if (bad == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": " << bad << " of " << got.size() << " elements beyond rtol " << tol.rtol
           << " atol " << tol.atol << "; first at " << first << " (got " << got[first] << ", want "
           << want[first] << "), max abs diff " << worst;
}
::testing::AssertionResult close64(const Vec& got, const F64& want, Tol tol, const char* what) {
    return close64(f64(got), want, tol, what);
}

// A gradient buffer that starts non-zero: matches() compares what the op ADDED (now - start)
// with the expected gradient, which pins the += convention.
struct Grad {
    explicit Grad(Vec start) : start(std::move(start)), now(this->start) {}
    float* data() { return now.data(); }
    ::testing::AssertionResult matches(const F64& want, Tol tol, const char* what) const {
        F64 added(now.size());
        for (size_t i = 0; i < now.size(); ++i) added[i] = double(now[i]) - double(start[i]);
        return close64(added, want, tol, what);
    }
    Vec start, now;
};

// dL/dx by central differences of L(x) = sum_j dout_j fwd(x)_j, all in double. h = 1e-5 on O(1)
// inputs: truncation O(h^2) ~ 1e-10 and cancellation O(1e-16 |L| / h) ~ 1e-10, both far below
// any fp32 kernel error. Every element is differenced (the shapes are small).
F64 fd_grad(const std::function<F64(const F64&)>& fwd, F64 x, const F64& dout, double h = 1e-5) {
    auto L = [&](const F64& xx) {
        const F64 y = fwd(xx);
        double s = 0;
        for (size_t j = 0; j < y.size(); ++j) s += dout[j] * y[j];
        return s;
    };
    F64 g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double orig = x[i];
        x[i] = orig + h;
        const double lp = L(x);
        x[i] = orig - h;
        const double lm = L(x);
        x[i] = orig;
        g[i] = (lp - lm) / (2 * h);
    }
    return g;
}

// fp32 forward vs float64: a few roundings of O(1) values, sums of <= ~40 terms
// (40 * 2^-24 ~ 2.4e-6 relative to the sum of |terms|); the worst element here uses 15% of it.
constexpr Tol kFwdTol{2e-6, 1e-6};
// fp32 backward vs finite differences: the kernel sums up to ~N*T rounded products per element;
// the double-precision finite difference is good to ~1e-9. The worst element uses 14% of it.
constexpr Tol kGradTol{1e-5, 1e-6};

// ---- float64 references (naive loops; nothing from kernels/cpu) ------------------------------

F64 gelu_ref(const F64& x) {
    F64 y(x.size());
    const double k = std::sqrt(2.0 / M_PI);
    for (size_t i = 0; i < x.size(); ++i)
        y[i] = 0.5 * x[i] * (1.0 + std::tanh(k * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
    return y;
}

// out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]
F64 encoder_ref(const std::vector<int>& inp, const F64& wte, const F64& wpe, int B, int T, int C) {
    F64 out(size_t(B) * T * C);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c)
                out[(size_t(b) * T + t) * C + c] =
                    wte[size_t(inp[b * T + t]) * C + c] + wpe[size_t(t) * C + c];
    return out;
}

// Per row: mean, var = mean((x - mean)^2) (biased, as GPT-2), rstd = 1/sqrt(var + eps),
// out = (x - mean) rstd w + b.
struct LayerNormRef {
    F64 out, mean, rstd;
};
LayerNormRef layernorm_ref(const F64& x, const F64& w, const F64& b, int N, int C) {
    LayerNormRef r{F64(x.size()), F64(N), F64(N)};
    for (int n = 0; n < N; ++n) {
        const double* row = &x[size_t(n) * C];
        double m = 0, v = 0;
        for (int c = 0; c < C; ++c) m += row[c];
        m /= C;
        for (int c = 0; c < C; ++c) v += (row[c] - m) * (row[c] - m);
        const double s = 1.0 / std::sqrt(v / C + double(math::kLayerNormEps));
        for (int c = 0; c < C; ++c) r.out[size_t(n) * C + c] = (row[c] - m) * s * w[c] + b[c];
        r.mean[n] = m;
        r.rstd[n] = s;
    }
    return r;
}

// out (N,OC) = inp (N,C) W(OC,C)^T + bias (empty bias: none)
F64 matmul_ref(const F64& inp, const F64& w, const F64& bias, int N, int C, int OC) {
    F64 out(size_t(N) * OC);
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double s = bias.empty() ? 0.0 : bias[o];
            for (int c = 0; c < C; ++c) s += inp[size_t(n) * C + c] * w[size_t(o) * C + c];
            out[size_t(n) * OC + o] = s;
        }
    return out;
}

// Causal attention. qkv (B,T,3C) row = [q | k | v], head h owns channels [h hs, (h+1) hs):
//   out[b,t,h] = sum_{u<=t} p_u v[b,u,h],  p = softmax_u(q[b,t,h] . k[b,u,h] / sqrt(hs))
F64 attention_ref(const F64& qkv, int B, int T, int C, int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / std::sqrt(double(hs));
    F64 out(size_t(B) * T * C, 0.0);
    auto at = [&](int b, int t, int part, int h, int i) {
        return qkv[(size_t(b) * T + t) * 3 * C + size_t(part) * C + size_t(h) * hs + i];
    };
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
            for (int t = 0; t < T; ++t) {
                F64 s(t + 1);
                for (int u = 0; u <= t; ++u) {
                    for (int i = 0; i < hs; ++i) s[u] += at(b, t, 0, h, i) * at(b, u, 1, h, i);
                    s[u] *= scale;
                }
                const double mx = *std::max_element(s.begin(), s.end());
                double z = 0;
                for (auto& e : s) z += (e = std::exp(e - mx));
                for (int u = 0; u <= t; ++u)
                    for (int i = 0; i < hs; ++i)
                        out[(size_t(b) * T + t) * C + size_t(h) * hs + i] +=
                            s[u] / z * at(b, u, 2, h, i);
            }
    return out;
}

// probs (N,Vp) = softmax over the first V columns of each row; padding columns 0.
F64 softmax_ref(const F64& logits, int N, int V, int Vp) {
    F64 p(size_t(N) * Vp, 0.0);
    for (int n = 0; n < N; ++n) {
        const double* row = &logits[size_t(n) * Vp];
        const double mx = *std::max_element(row, row + V);
        double z = 0;
        for (int v = 0; v < V; ++v) z += std::exp(row[v] - mx);
        for (int v = 0; v < V; ++v) p[size_t(n) * Vp + v] = std::exp(row[v] - mx) / z;
    }
    return p;
}
// losses (N) = -log softmax(logits)[target]
F64 crossentropy_ref(const F64& logits, const std::vector<int>& tg, int N, int V, int Vp) {
    const F64 p = softmax_ref(logits, N, V, Vp);
    F64 loss(N);
    for (int n = 0; n < N; ++n) loss[n] = -std::log(p[size_t(n) * Vp + tg[n]]);
    return loss;
}

F64 constant(size_t n, double value) {
    return F64(n, value);
}

// ==== CpuMatchesFloat64 cases, in table order ================================================

// ---- encoder ----

CPU_CASE(EncoderForward, EncoderForward) {
    const int B = 2, T = 5, C = 13, Vp = 7;
    const std::vector<int> inp = {3, 0, 6, 3, 3, 1, 2, 6, 0, 5};
    const Vec wte = randn(size_t(Vp) * C, 101), wpe = randn(size_t(T) * C, 102);
    Vec out(size_t(B) * T * C);
    cpu().run(op::EncoderForward{.out = out.data(),
                                 .inp = inp.data(),
                                 .wte = wte.data(),
                                 .wpe = wpe.data(),
                                 .B = B,
                                 .T = T,
                                 .C = C});
    // One fp32 add per element: correctly rounded, so within 2^-24 relative.
    EXPECT_TRUE(close64(out, encoder_ref(inp, f64(wte), f64(wpe), B, T, C), {1e-7, 0}, "out"));
}

CPU_CASE(EncoderBackward, EncoderBackwardWithRepeatedTokens) {
    const int B = 2, T = 5, C = 13, Vp = 7;
    const std::vector<int> inp = {3, 0, 6, 3, 3, 1, 2, 6, 0, 5};  // token 3 three times
    const Vec wte = randn(size_t(Vp) * C, 111), wpe = randn(size_t(T) * C, 112);
    const Vec dout = randn(size_t(B) * T * C, 113);
    Grad dwte(randn(wte.size(), 114)), dwpe(randn(wpe.size(), 115));
    cpu().run(op::EncoderBackward{.dwte = dwte.data(),
                                  .dwpe = dwpe.data(),
                                  .dout = dout.data(),
                                  .inp = inp.data(),
                                  .B = B,
                                  .T = T,
                                  .C = C});
    const F64 dte = fd_grad([&](const F64& x) { return encoder_ref(inp, x, f64(wpe), B, T, C); },
                            f64(wte), f64(dout));
    const F64 dpe = fd_grad([&](const F64& x) { return encoder_ref(inp, f64(wte), x, B, T, C); },
                            f64(wpe), f64(dout));
    EXPECT_TRUE(dwte.matches(dte, kGradTol, "dwte"));
    EXPECT_TRUE(dwpe.matches(dpe, kGradTol, "dwpe"));
}

// ---- layernorm ----

CPU_CASE(LayerNormForward, LayerNormForward) {
    const int N = 5, C = 13;
    const Vec x = randn(size_t(N) * C, 201, 2.0f), w = randn(C, 202), b = randn(C, 203);
    Vec out(x.size()), mean(N), rstd(N);
    cpu().run(op::LayerNormForward{.out = out.data(),
                                   .mean = mean.data(),
                                   .rstd = rstd.data(),
                                   .inp = x.data(),
                                   .weight = w.data(),
                                   .bias = b.data(),
                                   .N = N,
                                   .C = C});
    const LayerNormRef r = layernorm_ref(f64(x), f64(w), f64(b), N, C);
    EXPECT_TRUE(close64(out, r.out, kFwdTol, "out"));
    EXPECT_TRUE(close64(mean, r.mean, kFwdTol, "mean"));
    EXPECT_TRUE(close64(rstd, r.rstd, kFwdTol, "rstd"));
}

CPU_CASE(LayerNormBackward, LayerNormBackward) {
    const int N = 4, C = 13;
    const Vec x = randn(size_t(N) * C, 211, 2.0f), w = randn(C, 212), b = randn(C, 213);
    const Vec dout = randn(x.size(), 214);
    Vec out(x.size()), mean(N), rstd(N);  // the forward's saved mean/rstd feed the backward
    cpu().run(op::LayerNormForward{.out = out.data(),
                                   .mean = mean.data(),
                                   .rstd = rstd.data(),
                                   .inp = x.data(),
                                   .weight = w.data(),
                                   .bias = b.data(),
                                   .N = N,
                                   .C = C});
    Grad dx(randn(x.size(), 215)), dw(randn(C, 216)), db(randn(C, 217));
    cpu().run(op::LayerNormBackward{.dinp = dx.data(),
                                    .dweight = dw.data(),
                                    .dbias = db.data(),
                                    .dout = dout.data(),
                                    .inp = x.data(),
                                    .weight = w.data(),
                                    .mean = mean.data(),
                                    .rstd = rstd.data(),
                                    .N = N,
                                    .C = C});
    const F64 X = f64(x), W = f64(w), Bi = f64(b), D = f64(dout);
    auto ln = [&](const F64& xx, const F64& ww, const F64& bb) {
        return layernorm_ref(xx, ww, bb, N, C).out;
    };
    EXPECT_TRUE(
        dx.matches(fd_grad([&](const F64& v) { return ln(v, W, Bi); }, X, D), kGradTol, "dinp"));
    EXPECT_TRUE(
        dw.matches(fd_grad([&](const F64& v) { return ln(X, v, Bi); }, W, D), kGradTol, "dweight"));
    EXPECT_TRUE(
        db.matches(fd_grad([&](const F64& v) { return ln(X, W, v); }, Bi, D), kGradTol, "dbias"));
}

CPU_CASE(FusedResidualLayerNormForward, FusedResidualLayerNormForward) {
    const int N = 3, C = 15;
    const Vec a = randn(size_t(N) * C, 221), b = randn(a.size(), 222);
    const Vec w = randn(C, 223), bias = randn(C, 224);
    Vec res(a.size()), out(a.size()), mean(N), rstd(N);
    cpu().run(op::FusedResidualLayerNormForward{.residual = res.data(),
                                                .out = out.data(),
                                                .mean = mean.data(),
                                                .rstd = rstd.data(),
                                                .inp1 = a.data(),
                                                .inp2 = b.data(),
                                                .weight = w.data(),
                                                .bias = bias.data(),
                                                .N = N,
                                                .C = C});
    F64 sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = double(a[i]) + double(b[i]);
    // The kernel normalises the fp32-rounded residual, so the reference does too.
    const LayerNormRef r = layernorm_ref(f64(res), f64(w), f64(bias), N, C);
    EXPECT_TRUE(close64(res, sum, {1e-7, 0}, "residual"));  // one correctly rounded add
    EXPECT_TRUE(close64(out, r.out, kFwdTol, "out"));
    EXPECT_TRUE(close64(mean, r.mean, kFwdTol, "mean"));
    EXPECT_TRUE(close64(rstd, r.rstd, kFwdTol, "rstd"));
}

// ---- matmul ----

CPU_CASE(MatmulForward, MatmulForward) {
    const int N = 7, C = 13, OC = 9;
    const Vec x = randn(size_t(N) * C, 301), w = randn(size_t(OC) * C, 302), b = randn(OC, 303);
    Vec out(size_t(N) * OC);
    cpu().run(op::MatmulForward{.out = out.data(),
                                .inp = x.data(),
                                .weight = w.data(),
                                .bias = b.data(),
                                .N = N,
                                .C = C,
                                .OC = OC});
    EXPECT_TRUE(close64(out, matmul_ref(f64(x), f64(w), f64(b), N, C, OC), kFwdTol, "out"));
}

CPU_CASE(MatmulForward, MatmulForwardWithoutBias) {
    const int N = 1, C = 13, OC = 17;  // a single row
    const Vec x = randn(size_t(N) * C, 311), w = randn(size_t(OC) * C, 312);
    Vec out(size_t(N) * OC);
    cpu().run(op::MatmulForward{
        .out = out.data(), .inp = x.data(), .weight = w.data(), .N = N, .C = C, .OC = OC});
    EXPECT_TRUE(close64(out, matmul_ref(f64(x), f64(w), {}, N, C, OC), kFwdTol, "out"));
}

CPU_CASE(MatmulForward, MatmulForwardGeluEpilogue) {
    const int N = 6, C = 13, OC = 19;
    const Vec x = randn(size_t(N) * C, 321), w = randn(size_t(OC) * C, 322, 0.5f);
    const Vec b = randn(OC, 323);
    Vec out(size_t(N) * OC), pre(out.size());
    cpu().run(op::MatmulForward{.out = out.data(),
                                .inp = x.data(),
                                .weight = w.data(),
                                .bias = b.data(),
                                .N = N,
                                .C = C,
                                .OC = OC,
                                .epilogue = MatmulEpilogue::gelu,
                                .pre_act = pre.data()});
    const F64 want_pre = matmul_ref(f64(x), f64(w), f64(b), N, C, OC);
    EXPECT_TRUE(close64(pre, want_pre, kFwdTol, "pre_act"));
    EXPECT_TRUE(close64(out, gelu_ref(want_pre), kFwdTol, "out = gelu(pre_act)"));
}

CPU_CASE(MatmulBackward, MatmulBackward) {
    const int N = 7, C = 13, OC = 9;
    const Vec x = randn(size_t(N) * C, 331), w = randn(size_t(OC) * C, 332), b = randn(OC, 333);
    const Vec dout = randn(size_t(N) * OC, 334);
    Grad dx(randn(x.size(), 335)), dw(randn(w.size(), 336)), db(randn(OC, 337));
    cpu().run(op::MatmulBackward{.dinp = dx.data(),
                                 .dweight = dw.data(),
                                 .dbias = db.data(),
                                 .dout = dout.data(),
                                 .inp = x.data(),
                                 .weight = w.data(),
                                 .N = N,
                                 .C = C,
                                 .OC = OC});
    const F64 X = f64(x), W = f64(w), Bi = f64(b), D = f64(dout);
    auto mm = [&](const F64& xx, const F64& ww, const F64& bb) {
        return matmul_ref(xx, ww, bb, N, C, OC);
    };
    EXPECT_TRUE(
        dx.matches(fd_grad([&](const F64& v) { return mm(v, W, Bi); }, X, D), kGradTol, "dinp"));
    EXPECT_TRUE(
        dw.matches(fd_grad([&](const F64& v) { return mm(X, v, Bi); }, W, D), kGradTol, "dweight"));
    EXPECT_TRUE(
        db.matches(fd_grad([&](const F64& v) { return mm(X, W, v); }, Bi, D), kGradTol, "dbias"));
}

CPU_CASE(MatmulBackward, MatmulBackwardWeightOnly) {
    const int N = 5, C = 13, OC = 3;  // dinp and dbias null: only dweight is asked for
    const Vec x = randn(size_t(N) * C, 341), w = randn(size_t(OC) * C, 342);
    const Vec dout = randn(size_t(N) * OC, 343);
    Grad dw(randn(w.size(), 344));
    cpu().run(op::MatmulBackward{.dweight = dw.data(),
                                 .dout = dout.data(),
                                 .inp = x.data(),
                                 .weight = w.data(),
                                 .N = N,
                                 .C = C,
                                 .OC = OC});
    const F64 fd = fd_grad([&](const F64& v) { return matmul_ref(f64(x), v, {}, N, C, OC); },
                           f64(w), f64(dout));
    EXPECT_TRUE(dw.matches(fd, kGradTol, "dweight"));
}

CPU_CASE(MatmulBackward, MatmulBackwardInputOnlyForAFrozenWeight) {
    const int N = 6, C = 13, OC = 7;  // dweight null (frozen), inp null: only dinp and dbias
    const Vec x = randn(size_t(N) * C, 345), w = randn(size_t(OC) * C, 346), b = randn(OC, 347);
    const Vec dout = randn(size_t(N) * OC, 348);
    Grad dx(randn(x.size(), 349)), db(randn(OC, 350));
    cpu().run(op::MatmulBackward{.dinp = dx.data(),
                                 .dbias = db.data(),
                                 .dout = dout.data(),
                                 .weight = w.data(),
                                 .N = N,
                                 .C = C,
                                 .OC = OC});
    const F64 X = f64(x), W = f64(w), Bi = f64(b), D = f64(dout);
    EXPECT_TRUE(
        dx.matches(fd_grad([&](const F64& v) { return matmul_ref(v, W, Bi, N, C, OC); }, X, D),
                   kGradTol, "dinp"));
    EXPECT_TRUE(
        db.matches(fd_grad([&](const F64& v) { return matmul_ref(X, W, v, N, C, OC); }, Bi, D),
                   kGradTol, "dbias"));
}

// ---- int8 weights ----

// A weight quantised per row (kernels/quantize.h) and its exact dequantised value in double,
// which the references multiply by: the kernels must equal the matmul with W = scale * q.
struct Int8Weight {
    std::vector<int8_t> q;
    Vec scale;
    F64 dequantised;
};
Int8Weight int8_weight(int OC, int C, uint32_t seed) {
    const Vec w = randn(size_t(OC) * C, seed, 0.3f);
    Int8Weight r{std::vector<int8_t>(w.size()), Vec(OC), F64(w.size())};
    quantize_int8_per_row(w.data(), OC, C, r.q.data(), r.scale.data());
    for (size_t i = 0; i < w.size(); ++i)
        r.dequantised[i] = double(r.q[i]) * double(r.scale[i / size_t(C)]);
    return r;
}

TEST(Quantize, Int8PerRowRoundTripsWithinHalfAStep) {
    const int OC = 5, C = 33;
    Vec w = randn(size_t(OC) * C, 360);
    for (int c = 0; c < C; ++c) w[size_t(4) * C + c] = 0.0f;  // an all-zero row: scale 0
    std::vector<int8_t> q(w.size());
    Vec scale(OC);
    quantize_int8_per_row(w.data(), OC, C, q.data(), scale.data());
    EXPECT_EQ(scale[4], 0.0f);
    for (int o = 0; o < OC; ++o) {
        float maxabs = 0;
        for (int c = 0; c < C; ++c) maxabs = std::max(maxabs, std::fabs(w[size_t(o) * C + c]));
        EXPECT_FLOAT_EQ(scale[o], maxabs / 127.0f) << "row " << o;
        for (int c = 0; c < C; ++c) {
            const size_t i = size_t(o) * C + c;
            EXPECT_LE(std::abs(int(q[i])), 127);
            EXPECT_LE(std::fabs(dequantize_int8(q[i], scale[o]) - w[i]), 0.5f * scale[o] * 1.0001f)
                << "row " << o << " col " << c;
        }
    }
}

// C = 300 and OC = 70 cross the CPU kernel's dequantisation tiles (256 columns, 64 rows).
CPU_CASE(MatmulInt8Forward, MatmulInt8ForwardEqualsTheDequantisedMatmul) {
    const int N = 5, C = 300, OC = 70;
    const Int8Weight w = int8_weight(OC, C, 361);
    const Vec x = randn(size_t(N) * C, 362), b = randn(OC, 363);
    Vec out(size_t(N) * OC), out_nobias(out.size());
    cpu().run(op::MatmulInt8Forward{.out = out.data(),
                                    .inp = x.data(),
                                    .weight = w.q.data(),
                                    .scale = w.scale.data(),
                                    .bias = b.data(),
                                    .N = N,
                                    .C = C,
                                    .OC = OC});
    cpu().run(op::MatmulInt8Forward{.out = out_nobias.data(),
                                    .inp = x.data(),
                                    .weight = w.q.data(),
                                    .scale = w.scale.data(),
                                    .N = N,
                                    .C = C,
                                    .OC = OC});
    // 300-term sums: the fp32 tolerance scaled for the longer sum (300 * 2^-24 relative).
    const Tol tol{2e-5, 2e-5};
    EXPECT_TRUE(close64(out, matmul_ref(f64(x), w.dequantised, f64(b), N, C, OC), tol, "out"));
    EXPECT_TRUE(
        close64(out_nobias, matmul_ref(f64(x), w.dequantised, {}, N, C, OC), tol, "out (no bias)"));
}

CPU_CASE(MatmulInt8Backward, MatmulInt8BackwardMatchesFiniteDifferences) {
    const int N = 4, C = 270, OC = 67;
    const Int8Weight w = int8_weight(OC, C, 364);
    const Vec x = randn(size_t(N) * C, 365), b = randn(OC, 366), dout = randn(size_t(N) * OC, 367);
    Grad dx(randn(x.size(), 368)), db(randn(OC, 369));
    cpu().run(op::MatmulInt8Backward{.dinp = dx.data(),
                                     .dbias = db.data(),
                                     .dout = dout.data(),
                                     .weight = w.q.data(),
                                     .scale = w.scale.data(),
                                     .N = N,
                                     .C = C,
                                     .OC = OC});
    const F64 X = f64(x), Bi = f64(b), D = f64(dout);
    const F64& W = w.dequantised;
    EXPECT_TRUE(
        dx.matches(fd_grad([&](const F64& v) { return matmul_ref(v, W, Bi, N, C, OC); }, X, D),
                   kGradTol, "dinp"));
    EXPECT_TRUE(
        db.matches(fd_grad([&](const F64& v) { return matmul_ref(X, W, v, N, C, OC); }, Bi, D),
                   kGradTol, "dbias"));
}

// ---- LoRA ----

// The adapter's contribution scale (x A^T) B^T, (N,OC), and u = scale x A^T, (N,R), in double.
F64 lora_u_ref(const F64& x, const F64& A, int N, int C, int R, double scale) {
    F64 u = matmul_ref(x, A, {}, N, C, R);
    for (auto& v : u) v *= scale;
    return u;
}
F64 lora_ref(const F64& x, const F64& A, const F64& B, int N, int C, int OC, int R, double scale) {
    return matmul_ref(lora_u_ref(x, A, N, C, R, scale), B, {}, N, R, OC);
}

CPU_CASE(LoraForward, LoraForwardAddsTheScaledLowRankProduct) {
    const int N = 6, C = 13, OC = 11, R = 3;
    const float scale = 16.0f / R;
    const Vec x = randn(size_t(N) * C, 370), A = randn(size_t(R) * C, 371, 0.3f);
    const Vec B = randn(size_t(OC) * R, 372, 0.3f), base = randn(size_t(N) * OC, 373);
    Vec out = base, u(size_t(N) * R);
    cpu().run(op::LoraForward{.out = out.data(),
                              .u = u.data(),
                              .inp = x.data(),
                              .A = A.data(),
                              .B = B.data(),
                              .N = N,
                              .C = C,
                              .OC = OC,
                              .R = R,
                              .scale = scale});
    F64 want = lora_ref(f64(x), f64(A), f64(B), N, C, OC, R, scale);
    for (size_t i = 0; i < want.size(); ++i) want[i] += base[i];  // accumulated into out
    EXPECT_TRUE(close64(out, want, Tol{1e-5, 1e-5}, "out"));
    EXPECT_TRUE(close64(u, lora_u_ref(f64(x), f64(A), N, C, R, scale), Tol{1e-5, 1e-5}, "u"));
}

CPU_CASE(LoraBackward, LoraBackwardMatchesFiniteDifferences) {
    const int N = 5, C = 13, OC = 11, R = 4;
    const float scale = 2.0f;
    const Vec x = randn(size_t(N) * C, 380), A = randn(size_t(R) * C, 381, 0.3f);
    const Vec B = randn(size_t(OC) * R, 382, 0.3f), dout = randn(size_t(N) * OC, 383);
    Vec u(size_t(N) * R), out(size_t(N) * OC), du(u.size());
    cpu().run(op::LoraForward{.out = out.data(),
                              .u = u.data(),
                              .inp = x.data(),
                              .A = A.data(),
                              .B = B.data(),
                              .N = N,
                              .C = C,
                              .OC = OC,
                              .R = R,
                              .scale = scale});
    Grad dx(randn(x.size(), 384)), dA(randn(A.size(), 385)), dB(randn(B.size(), 386));
    cpu().run(op::LoraBackward{.dinp = dx.data(),
                               .dA = dA.data(),
                               .dB = dB.data(),
                               .du = du.data(),
                               .dout = dout.data(),
                               .inp = x.data(),
                               .u = u.data(),
                               .A = A.data(),
                               .B = B.data(),
                               .N = N,
                               .C = C,
                               .OC = OC,
                               .R = R,
                               .scale = scale});
    const F64 X = f64(x), FA = f64(A), FB = f64(B), D = f64(dout);
    auto f = [&](const F64& xx, const F64& aa, const F64& bb) {
        return lora_ref(xx, aa, bb, N, C, OC, R, scale);
    };
    EXPECT_TRUE(
        dx.matches(fd_grad([&](const F64& v) { return f(v, FA, FB); }, X, D), kGradTol, "dinp"));
    EXPECT_TRUE(
        dA.matches(fd_grad([&](const F64& v) { return f(X, v, FB); }, FA, D), kGradTol, "dA"));
    EXPECT_TRUE(
        dB.matches(fd_grad([&](const F64& v) { return f(X, FA, v); }, FB, D), kGradTol, "dB"));
}

// ---- attention ----

struct AttnShape {
    int B, T, C, NH;
};
// hs = 5 (not a SIMD width), NH = 3, and T = 1 (a single causal position).
constexpr AttnShape kAttnShapes[] = {{2, 6, 15, 3}, {1, 1, 15, 3}};
constexpr AttentionImpl kCpuAttnImpls[] = {AttentionImpl::naive, AttentionImpl::flash};

CPU_CASE(AttentionForward, AttentionForwardNaiveAndFlash) {
    for (const AttnShape s : kAttnShapes)
        for (const AttentionImpl impl : kCpuAttnImpls) {
            SCOPED_TRACE(std::string(to_string(impl)) + " T=" + std::to_string(s.T));
            const size_t BTC = size_t(s.B) * s.T * s.C;
            const Vec qkv = randn(3 * BTC, 401);
            Vec out(BTC), saved(attention_saved_elems(impl, s.B, s.T, s.NH));
            cpu().run(op::AttentionForward{.impl = impl,
                                           .out = out.data(),
                                           .saved = saved.data(),
                                           .qkv = qkv.data(),
                                           .B = s.B,
                                           .T = s.T,
                                           .C = s.C,
                                           .NH = s.NH});
            EXPECT_TRUE(close64(out, attention_ref(f64(qkv), s.B, s.T, s.C, s.NH), kFwdTol, "out"));
        }
}

CPU_CASE(AttentionBackward, AttentionBackwardNaiveAndFlash) {
    for (const AttnShape s : kAttnShapes)
        for (const AttentionImpl impl : kCpuAttnImpls) {
            SCOPED_TRACE(std::string(to_string(impl)) + " T=" + std::to_string(s.T));
            const size_t BTC = size_t(s.B) * s.T * s.C;
            const Vec qkv = randn(3 * BTC, 411), dout = randn(BTC, 412);
            Vec out(BTC), saved(attention_saved_elems(impl, s.B, s.T, s.NH));
            cpu().run(op::AttentionForward{.impl = impl,
                                           .out = out.data(),
                                           .saved = saved.data(),
                                           .qkv = qkv.data(),
                                           .B = s.B,
                                           .T = s.T,
                                           .C = s.C,
                                           .NH = s.NH});
            Grad dqkv(randn(3 * BTC, 413));
            cpu().run(op::AttentionBackward{.impl = impl,
                                            .dqkv = dqkv.data(),
                                            .dout = dout.data(),
                                            .qkv = qkv.data(),
                                            .out = out.data(),
                                            .saved = saved.data(),
                                            .B = s.B,
                                            .T = s.T,
                                            .C = s.C,
                                            .NH = s.NH});
            const F64 fd =
                fd_grad([&](const F64& v) { return attention_ref(v, s.B, s.T, s.C, s.NH); },
                        f64(qkv), f64(dout));
            EXPECT_TRUE(dqkv.matches(fd, kGradTol, "dqkv"));
        }
}

// ---- pointwise ----

CPU_CASE(GeluForward, GeluForward) {
    const Vec x = randn(37, 501, 2.0f);  // 37: two SIMD blocks and a tail
    Vec out(x.size());
    cpu().run(op::GeluForward{.out = out.data(), .inp = x.data(), .n = x.size()});
    // exp-based evaluation (fast_math.h), a few ulp from the tanh form.
    EXPECT_TRUE(close64(out, gelu_ref(f64(x)), {1e-6, 1e-7}, "out"));
}

CPU_CASE(GeluBackward, GeluBackward) {
    const Vec x = randn(37, 511, 2.0f), dout = randn(37, 512);
    Grad dx(randn(37, 513));
    cpu().run(op::GeluBackward{.dinp = dx.data(), .inp = x.data(), .dout = dout.data(), .n = 37});
    EXPECT_TRUE(dx.matches(fd_grad(gelu_ref, f64(x), f64(dout)), kGradTol, "dinp"));
}

CPU_CASE(ResidualForward, ResidualForward) {
    const Vec a = randn(37, 521), b = randn(37, 522);
    Vec out(37);
    cpu().run(op::ResidualForward{.out = out.data(), .inp1 = a.data(), .inp2 = b.data(), .n = 37});
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]) << i;  // exact
}

CPU_CASE(ResidualBackward, ResidualBackward) {
    const Vec a = randn(37, 531), b = randn(37, 532), dout = randn(37, 533);
    Grad d1(randn(37, 534)), d2(randn(37, 535));
    cpu().run(
        op::ResidualBackward{.dinp1 = d1.data(), .dinp2 = d2.data(), .dout = dout.data(), .n = 37});
    auto sum = [](const F64& x, const F64& y) {
        F64 r(x.size());
        for (size_t i = 0; i < x.size(); ++i) r[i] = x[i] + y[i];
        return r;
    };
    const F64 A = f64(a), Bv = f64(b), D = f64(dout);
    EXPECT_TRUE(
        d1.matches(fd_grad([&](const F64& v) { return sum(v, Bv); }, A, D), kGradTol, "dinp1"));
    EXPECT_TRUE(
        d2.matches(fd_grad([&](const F64& v) { return sum(A, v); }, Bv, D), kGradTol, "dinp2"));
}

// ---- classifier (V = 37 real columns of Vp = 48) ----

constexpr int kN = 5, kV = 37, kVp = 48;

// Logits with junk in the padding columns, which must play no part.
Vec padded_logits(uint32_t seed) {
    Vec l = randn(size_t(kN) * kVp, seed, 2.0f);
    for (int n = 0; n < kN; ++n)
        for (int v = kV; v < kVp; ++v) l[size_t(n) * kVp + v] = 50.0f;
    return l;
}
// Expects every padding column of (N,Vp) `x` to be exactly 0.
void expect_zero_padding(const Vec& x, const char* what) {
    for (int n = 0; n < kN; ++n)
        for (int v = kV; v < kVp; ++v) EXPECT_EQ(x[size_t(n) * kVp + v], 0.0f) << what << n << v;
}

CPU_CASE(ClassifierFused, ClassifierFusedLossAndGradient) {
    const std::vector<int> tg = randint(kN, kV, 601);
    const Vec logits0 = padded_logits(602);
    const float dloss = 1.0f / kN;
    Vec logits = logits0, losses(kN);
    cpu().run(op::ClassifierFused{.losses = losses.data(),
                                  .logits = logits.data(),
                                  .targets = tg.data(),
                                  .N = kN,
                                  .V = kV,
                                  .Vp = kVp,
                                  .dloss = dloss});
    auto ce = [&](const F64& l) { return crossentropy_ref(l, tg, kN, kV, kVp); };
    EXPECT_TRUE(close64(losses, ce(f64(logits0)), kFwdTol, "losses"));
    // The logits now hold d(dloss * sum_n loss_n)/dlogits (overwritten, not accumulated).
    const F64 fd = fd_grad(ce, f64(logits0), constant(kN, dloss));
    EXPECT_TRUE(close64(logits, fd, kGradTol, "dlogits (in place)"));
    expect_zero_padding(logits, "dlogits padding ");
}

CPU_CASE(ClassifierFused, ClassifierFusedWithoutGradientLeavesLogitsUntouched) {
    const std::vector<int> tg = randint(kN, kV, 611);
    const Vec logits0 = padded_logits(612);
    Vec logits = logits0, losses(kN);
    cpu().run(op::ClassifierFused{.losses = losses.data(),
                                  .logits = logits.data(),
                                  .targets = tg.data(),
                                  .N = kN,
                                  .V = kV,
                                  .Vp = kVp});
    EXPECT_TRUE(
        close64(losses, crossentropy_ref(f64(logits0), tg, kN, kV, kVp), kFwdTol, "losses"));
    EXPECT_EQ(0, std::memcmp(logits.data(), logits0.data(), logits.size() * 4));
}

CPU_CASE(SoftmaxForward, SoftmaxForward) {
    const Vec logits = padded_logits(621);
    Vec probs(logits.size(), -1.0f);
    cpu().run(op::SoftmaxForward{
        .probs = probs.data(), .logits = logits.data(), .N = kN, .V = kV, .Vp = kVp});
    // Probabilities in (0, 1): an absolute bound (rounding of exp and of the 1/sum).
    EXPECT_TRUE(close64(probs, softmax_ref(f64(logits), kN, kV, kVp), {1e-5, 1e-7}, "probs"));
    expect_zero_padding(probs, "probs padding ");
}

CPU_CASE(CrossEntropyForward, CrossEntropyForward) {
    const std::vector<int> tg = randint(kN, kV, 631);
    const F64 p = softmax_ref(f64(padded_logits(632)), kN, kV, kVp);
    const Vec probs(p.begin(), p.end());
    Vec losses(kN);
    cpu().run(op::CrossEntropyForward{.losses = losses.data(),
                                      .probs = probs.data(),
                                      .targets = tg.data(),
                                      .N = kN,
                                      .V = kV,
                                      .Vp = kVp});
    F64 want(kN);
    for (int n = 0; n < kN; ++n) want[n] = -std::log(double(probs[size_t(n) * kVp + tg[n]]));
    EXPECT_TRUE(close64(losses, want, {1e-6, 1e-7}, "losses"));  // one logf
}

CPU_CASE(CrossEntropySoftmaxBackward, CrossEntropySoftmaxBackward) {
    const std::vector<int> tg = randint(kN, kV, 641);
    const Vec logits = padded_logits(642);
    const F64 p = softmax_ref(f64(logits), kN, kV, kVp);
    const Vec probs(p.begin(), p.end());
    const float dloss = 0.5f;
    Vec dlogits = randn(logits.size(), 643);  // garbage: the op overwrites
    cpu().run(op::CrossEntropySoftmaxBackward{.dlogits = dlogits.data(),
                                              .probs = probs.data(),
                                              .targets = tg.data(),
                                              .N = kN,
                                              .V = kV,
                                              .Vp = kVp,
                                              .dloss = dloss});
    const F64 fd = fd_grad([&](const F64& l) { return crossentropy_ref(l, tg, kN, kV, kVp); },
                           f64(logits), constant(kN, dloss));
    EXPECT_TRUE(close64(dlogits, fd, kGradTol, "dlogits"));
    expect_zero_padding(dlogits, "dlogits padding ");
}

CPU_CASE(LossMean, LossMean) {
    const Vec losses = randn(7, 651, 3.0f);
    float loss = -1.0f;
    cpu().run(op::LossMean{.loss = &loss, .losses = losses.data(), .N = 7});
    double want = 0;
    for (float l : losses) want += l;
    EXPECT_TRUE(close64(Vec{loss}, {want / 7}, {1e-6, 1e-7}, "loss"));  // 7 fp32 adds
}

// ---- optimizer ----

CPU_CASE(GlobalNormClip, GlobalNormAndClipScale) {
    const Vec g = randn(1001, 701);
    double want_sq = 0;
    for (float x : g) want_sq += double(x) * x;  // ~1001: norm ~31.6
    for (const float max_norm : {1.0f, 1e3f}) {
        SCOPED_TRACE("max_norm " + std::to_string(max_norm));
        float norm_sq = -1, scale = -1;
        cpu().run(op::GlobalNormClip{.norm_sq = &norm_sq,
                                     .clip_scale = &scale,
                                     .grads = g.data(),
                                     .n = g.size(),
                                     .max_norm = max_norm});
        // 1001 positive terms summed in fp32: ~1e-6 relative.
        EXPECT_TRUE(close64(Vec{norm_sq}, {want_sq}, {1e-5, 0}, "norm_sq"));
        const double want = std::min(1.0, max_norm / (std::sqrt(want_sq) + 1e-6));
        EXPECT_TRUE(close64(Vec{scale}, {want}, {1e-5, 0}, "clip_scale"));
        if (max_norm > 100) {
            EXPECT_EQ(scale, 1.0f);  // under the limit: exactly untouched
        }
    }
}

// A flat buffer of three tensors, mixed decay, gap-free.
const TensorSlice kCpuSlices[] = {{0, 100, true}, {100, 37, false}, {137, 50, true}};
constexpr size_t kCpuTotal = 187;
AdamWParams adamw_hparams(int step) {
    return {.lr = 1e-2f,
            .beta1 = 0.9f,
            .beta2 = 0.95f,
            .eps = 1e-8f,
            .weight_decay = 0.1f,
            .step = step};
}

struct AdamState {
    std::vector<float> p, m, v;
};
struct AdamState64 {
    F64 p, m, v;
};

// Three steps of the kernel `impl` on the CPU backend, gradients scaled by 0.37 or not.
AdamState cpu_adamw(AdamWImpl impl, bool with_scale) {
    AdamState s{randn(kCpuTotal, 801), Vec(kCpuTotal, 0.0f), Vec(kCpuTotal, 0.0f)};
    const float scale = 0.37f;
    for (int t = 1; t <= 3; ++t) {
        const Vec g = randn(kCpuTotal, 810 + t, 0.1f);
        cpu().run(op::AdamWUpdate{.impl = impl,
                                  .params = s.p.data(),
                                  .grads = g.data(),
                                  .m = s.m.data(),
                                  .v = s.v.data(),
                                  .tensors = kCpuSlices,
                                  .total = kCpuTotal,
                                  .hp = adamw_hparams(t),
                                  .grad_scale = with_scale ? &scale : nullptr});
    }
    return s;
}
// The same three steps in double, straight from the formula in ops.h.
AdamState64 adamw_ref(bool with_scale) {
    AdamState64 s{f64(randn(kCpuTotal, 801)), F64(kCpuTotal, 0.0), F64(kCpuTotal, 0.0)};
    for (int t = 1; t <= 3; ++t) {
        const F64 g = f64(randn(kCpuTotal, 810 + t, 0.1f));
        const AdamWParams hp = adamw_hparams(t);
        const double b1 = hp.beta1, b2 = hp.beta2;
        for (const TensorSlice& sl : kCpuSlices)
            for (size_t i = sl.offset; i < sl.offset + sl.count; ++i) {
                const double gi = g[i] * (with_scale ? double(0.37f) : 1.0);
                s.m[i] = b1 * s.m[i] + (1 - b1) * gi;
                s.v[i] = b2 * s.v[i] + (1 - b2) * gi * gi;
                const double mhat = s.m[i] / (1 - std::pow(b1, t));
                const double vhat = s.v[i] / (1 - std::pow(b2, t));
                const double wd = sl.decay ? double(hp.weight_decay) : 0.0;
                s.p[i] -= double(hp.lr) * (mhat / (std::sqrt(vhat) + double(hp.eps)) + wd * s.p[i]);
            }
    }
    return s;
}

CPU_CASE(AdamWUpdate, AdamWImplsMatchFloat64AndEachOtherBitwise) {
    for (const bool with_scale : {false, true}) {
        SCOPED_TRACE(with_scale ? "grad_scale 0.37" : "no grad_scale");
        const AdamState64 want = adamw_ref(with_scale);
        const AdamState fused = cpu_adamw(AdamWImpl::fused, with_scale);
        // Three fp32 steps: each rounds m, v, p (2^-24 relative); the update is lr * O(1).
        EXPECT_TRUE(close64(fused.p, want.p, {1e-6, 1e-7}, "params"));
        EXPECT_TRUE(close64(fused.m, want.m, {1e-5, 1e-9}, "m"));
        EXPECT_TRUE(close64(fused.v, want.v, {1e-5, 1e-12}, "v"));
        for (const AdamWImpl impl : {AdamWImpl::unfused, AdamWImpl::multi_tensor}) {
            const AdamState o = cpu_adamw(impl, with_scale);
            EXPECT_EQ(0, std::memcmp(o.p.data(), fused.p.data(), kCpuTotal * 4)) << to_string(impl);
            EXPECT_EQ(0, std::memcmp(o.m.data(), fused.m.data(), kCpuTotal * 4)) << to_string(impl);
            EXPECT_EQ(0, std::memcmp(o.v.data(), fused.v.data(), kCpuTotal * 4)) << to_string(impl);
        }
    }
}

// ---- precision and memory ----

CPU_CASE(CastParams, CastParamsIsACopyUnderFp32) {
    const Vec src = randn(777, 901, 3.0f);
    Vec dst(src.size(), -1.0f);
    cpu().run(op::CastParams{.dst = dst.data(), .src = src.data(), .n = src.size()});
    EXPECT_EQ(0, std::memcmp(dst.data(), src.data(), src.size() * 4));
}

// Records the names the profiler sees.
struct NameRecorder final : OpObserver {
    void op_begin(const OpRecord& r) override { names.emplace_back(r.name); }
    void op_end(const OpRecord&) override {}
    std::vector<std::string> names;
};

CPU_CASE(FillZero, FillZeroClearsExactlyItsBytes) {
    std::vector<unsigned char> buf(400, 0xAB);
    NameRecorder rec;
    cpu().set_op_observer(&rec);
    cpu().run(op::FillZero{.dst = buf.data(), .bytes = 397, .what = "zero_grad"});
    cpu().run(op::FillZero{});  // zero bytes, no buffer: allowed, a no-op
    cpu().set_op_observer(nullptr);
    for (size_t i = 0; i < 397; ++i) ASSERT_EQ(buf[i], 0) << i;
    for (size_t i = 397; i < 400; ++i) EXPECT_EQ(buf[i], 0xAB) << i;  // one past: untouched
    EXPECT_EQ(rec.names, (std::vector<std::string>{"zero_grad", "fill_zero"}));
}

// ==== other backends against the CPU backend (ported from tests/cuda/test_cuda_ops.cpp) ======
// fp32: test::kFp32Tol (rtol 1e-4, atol 1e-5): summation orders only. bf16: test::kBf16Tol
// (rtol/atol 2e-2) with the CPU fed the same bf16-rounded inputs. fp32 outputs (parameter
// gradients, mean/rstd, losses) keep fp32 tolerances where the inputs alone differ.

// Which side of the Mirror an op's arguments come from.
enum class Side { cpu, other };
void* at(const Mirror::Buf& b, Side s) {
    return s == Side::cpu ? b.c.get() : b.g.get();
}
float* f32_at(const Mirror::Buf& b, Side s) {
    return static_cast<float*>(at(b, s));
}
const int* ints_at(const Mirror::Buf& b, Side s) {
    return static_cast<const int*>(at(b, s));
}
// Runs the op make(side) builds on the CPU backend and on the other backend.
template <class Make>
void run_both(Mirror& m, Make make) {
    m.cpu->run(make(Side::cpu));
    m.gpu->run(make(Side::other));
}
// Under bf16 the weight gradients sum N bf16 products: rtol 2e-2, atol 5e-2.
Tol dweight_tol(const Mirror& m) {
    return m.bf16() ? Tol{2e-2, 5e-2} : test::kFp32Tol;
}

// ---- encoder ----

constexpr int kEncB = 3, kEncT = 17, kEncC = 48, kEncV = 40;

BACKEND_CASE(EncoderForward, EncoderForward) {
    const int B = kEncB, T = kEncT, C = kEncC;
    auto inp = m.ints(randint(size_t(B) * T, kEncV, 1));
    auto wte = m.act(randn(size_t(kEncV) * C, 2)), wpe = m.act(randn(size_t(T) * C, 3));
    auto out = m.act_zeros(size_t(B) * T * C);
    run_both(m, [&](Side s) {
        return op::EncoderForward{.out = at(out, s),
                                  .inp = ints_at(inp, s),
                                  .wte = at(wte, s),
                                  .wpe = at(wpe, s),
                                  .B = B,
                                  .T = T,
                                  .C = C};
    });
    EXPECT_TRUE(m.same(out, "encoder out"));
}

BACKEND_CASE(EncoderBackward, EncoderBackward) {
    const int B = kEncB, T = kEncT, C = kEncC;
    auto inp = m.ints(randint(size_t(B) * T, kEncV, 1));
    auto dout = m.act(randn(size_t(B) * T * C, 4));
    auto dwte = m.f32(randn(size_t(kEncV) * C, 5)), dwpe = m.f32(randn(size_t(T) * C, 6));
    run_both(m, [&](Side s) {
        return op::EncoderBackward{.dwte = f32_at(dwte, s),
                                   .dwpe = f32_at(dwpe, s),
                                   .dout = at(dout, s),
                                   .inp = ints_at(inp, s),
                                   .B = B,
                                   .T = T,
                                   .C = C};
    });
    EXPECT_TRUE(m.same(dwte, "dwte", test::kFp32Tol));  // fp32 grads from the same inputs
    EXPECT_TRUE(m.same(dwpe, "dwpe", test::kFp32Tol));
}

// The wte gradient is deterministic (encoder.cu sorts positions by token, no atomics): on inputs
// where a few tokens take most positions and B*T = 72000 spans two of the launcher's sort chunks
// (kEncoderBackwardChunk = 65536 positions), two runs from the same start give the same bits, and
// both match the CPU. Token 0 is hot everywhere, token 1 only in the first chunk, token 2 only
// in the second, token 5 never (its row must stay as it was).
BACKEND_CASE(EncoderBackward, EncoderBackwardIsBitwiseReproducibleWithHotTokensAcrossChunks) {
    const int B = 2, T = 36000, C = 24, V = 6;
    const size_t N = size_t(B) * T;
    std::vector<int> tokens = randint(N, 5, 20);
    for (size_t i = 0; i < N; ++i) {
        if (i % 3 == 0) tokens[i] = 0;
        if (tokens[i] == 1 && i >= 65536) tokens[i] = 3;
        if (tokens[i] == 2 && i < 65536) tokens[i] = 4;
    }
    auto inp = m.ints(tokens);
    auto dout = m.act(randn(N * C, 21, 0.05f));
    const Vec wte0 = randn(size_t(V) * C, 22), wpe0 = randn(size_t(T) * C, 23);
    auto dwte = m.f32(wte0), dwpe = m.f32(wpe0);
    auto dwte2 = m.f32(wte0), dwpe2 = m.f32(wpe0);
    auto make = [&](Side s, Mirror::Buf& wte, Mirror::Buf& wpe) {
        return op::EncoderBackward{.dwte = f32_at(wte, s),
                                   .dwpe = f32_at(wpe, s),
                                   .dout = at(dout, s),
                                   .inp = ints_at(inp, s),
                                   .B = B,
                                   .T = T,
                                   .C = C};
    };
    m.cpu->run(make(Side::cpu, dwte, dwpe));
    m.gpu->run(make(Side::other, dwte, dwpe));
    m.gpu->run(make(Side::other, dwte2, dwpe2));
    const Vec a = m.gpu_values(dwte), b = m.gpu_values(dwte2);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "dwte differs between runs";
    const Vec pa = m.gpu_values(dwpe), pb = m.gpu_values(dwpe2);
    EXPECT_EQ(0, std::memcmp(pa.data(), pb.data(), pa.size() * 4)) << "dwpe differs between runs";
    // Up to 24000 fp32 additions per row element, partial sums O(10): if the orders differed,
    // rounding could reach ~1e-4; the kernel adds in the CPU's order, so it should be 0.
    EXPECT_TRUE(m.same(dwte, "dwte", {1e-4, 1e-3}));
    EXPECT_TRUE(m.same(dwpe, "dwpe", test::kFp32Tol));
    for (int c = 0; c < C; ++c) EXPECT_EQ(a[size_t(5) * C + c], wte0[size_t(5) * C + c]) << c;
}

// ---- layernorm (C = 80: not a multiple of 32, tail lanes) ----

BACKEND_CASE(LayerNormForward, LayerNormForward) {
    const int N = 45, C = 80;
    auto inp = m.act(randn(size_t(N) * C, 10, 2.0f));
    auto w = m.act(randn(C, 11)), b = m.act(randn(C, 12));
    auto out = m.act_zeros(size_t(N) * C);
    auto mean = m.f32_zeros(N), rstd = m.f32_zeros(N);
    run_both(m, [&](Side s) {
        return op::LayerNormForward{.out = at(out, s),
                                    .mean = f32_at(mean, s),
                                    .rstd = f32_at(rstd, s),
                                    .inp = at(inp, s),
                                    .weight = at(w, s),
                                    .bias = at(b, s),
                                    .N = N,
                                    .C = C};
    });
    EXPECT_TRUE(m.same(out, "ln out"));
    EXPECT_TRUE(m.same(mean, "ln mean", test::kFp32Tol));
    EXPECT_TRUE(m.same(rstd, "ln rstd", test::kFp32Tol));
}

BACKEND_CASE(LayerNormBackward, LayerNormBackward) {
    const int N = 45, C = 80;
    auto inp = m.act(randn(size_t(N) * C, 10, 2.0f));
    auto w = m.act(randn(C, 11)), b = m.act(randn(C, 12));
    auto out = m.act_zeros(size_t(N) * C);
    auto mean = m.f32_zeros(N), rstd = m.f32_zeros(N);
    m.cpu->run(op::LayerNormForward{.out = out.c.get(),
                                    .mean = mean.cf(),
                                    .rstd = rstd.cf(),
                                    .inp = inp.c.get(),
                                    .weight = w.c.get(),
                                    .bias = b.c.get(),
                                    .N = N,
                                    .C = C});
    // Same mean/rstd on both sides (the CPU's), so only the backward is compared.
    m.gpu->copy_to_device(mean.g.get(), m.cpu_values(mean).data(), N * 4);
    m.gpu->copy_to_device(rstd.g.get(), m.cpu_values(rstd).data(), N * 4);
    auto dout = m.act(randn(size_t(N) * C, 13)), dinp = m.act(randn(size_t(N) * C, 14));
    auto dw = m.f32(randn(C, 15)), db = m.f32(randn(C, 16));
    run_both(m, [&](Side s) {
        return op::LayerNormBackward{.dinp = at(dinp, s),
                                     .dweight = f32_at(dw, s),
                                     .dbias = f32_at(db, s),
                                     .dout = at(dout, s),
                                     .inp = at(inp, s),
                                     .weight = at(w, s),
                                     .mean = f32_at(mean, s),
                                     .rstd = f32_at(rstd, s),
                                     .N = N,
                                     .C = C};
    });
    EXPECT_TRUE(m.same(dinp, "ln dinp"));
    EXPECT_TRUE(m.same(dw, "ln dweight", dweight_tol(m)));
    EXPECT_TRUE(m.same(db, "ln dbias", test::kFp32Tol));
}

BACKEND_CASE(FusedResidualLayerNormForward, FusedResidualLayerNormForward) {
    const int N = 33, C = 64;
    auto a = m.act(randn(size_t(N) * C, 20)), b = m.act(randn(size_t(N) * C, 21));
    auto w = m.act(randn(C, 22)), bias = m.act(randn(C, 23));
    auto res = m.act_zeros(size_t(N) * C), out = m.act_zeros(size_t(N) * C);
    auto mean = m.f32_zeros(N), rstd = m.f32_zeros(N);
    run_both(m, [&](Side s) {
        return op::FusedResidualLayerNormForward{.residual = at(res, s),
                                                 .out = at(out, s),
                                                 .mean = f32_at(mean, s),
                                                 .rstd = f32_at(rstd, s),
                                                 .inp1 = at(a, s),
                                                 .inp2 = at(b, s),
                                                 .weight = at(w, s),
                                                 .bias = at(bias, s),
                                                 .N = N,
                                                 .C = C};
    });
    EXPECT_TRUE(m.same(res, "residual"));
    EXPECT_TRUE(m.same(out, "ln out"));
    EXPECT_TRUE(m.same(mean, "mean", m.tol()));  // of the rounded residual
    EXPECT_TRUE(m.same(rstd, "rstd", m.tol()));
}

// ---- matmul ----

BACKEND_CASE(MatmulForward, MatmulForward) {
    const int N = 74, C = 64, OC = 96;
    auto inp = m.act(randn(size_t(N) * C, 30));
    auto w = m.act(randn(size_t(OC) * C, 31, 0.2f)), b = m.act(randn(OC, 32));
    auto out = m.act_zeros(size_t(N) * OC);
    run_both(m, [&](Side s) {
        return op::MatmulForward{.out = at(out, s),
                                 .inp = at(inp, s),
                                 .weight = at(w, s),
                                 .bias = at(b, s),
                                 .N = N,
                                 .C = C,
                                 .OC = OC};
    });
    EXPECT_TRUE(m.same(out, "matmul out"));
}

BACKEND_CASE(MatmulBackward, MatmulBackward) {
    const int N = 74, C = 64, OC = 96;
    auto inp = m.act(randn(size_t(N) * C, 30)), w = m.act(randn(size_t(OC) * C, 31, 0.2f));
    auto dout = m.act(randn(size_t(N) * OC, 33)), dinp = m.act(randn(size_t(N) * C, 34));
    auto dw = m.f32(randn(size_t(OC) * C, 35)), db = m.f32(randn(OC, 36));
    run_both(m, [&](Side s) {
        return op::MatmulBackward{.dinp = at(dinp, s),
                                  .dweight = f32_at(dw, s),
                                  .dbias = f32_at(db, s),
                                  .dout = at(dout, s),
                                  .inp = at(inp, s),
                                  .weight = at(w, s),
                                  .N = N,
                                  .C = C,
                                  .OC = OC};
    });
    EXPECT_TRUE(m.same(dinp, "matmul dinp"));
    EXPECT_TRUE(m.same(dw, "matmul dweight", dweight_tol(m)));
    EXPECT_TRUE(m.same(db, "matmul dbias", m.bf16() ? m.tol() : test::kFp32Tol));
}

BACKEND_CASE(MatmulForward, MatmulForwardWithoutBias) {
    const int N = 40, C = 32, OC = 128;
    auto inp = m.act(randn(size_t(N) * C, 37)), w = m.act(randn(size_t(OC) * C, 38, 0.2f));
    auto out = m.act_zeros(size_t(N) * OC);
    run_both(m, [&](Side s) {
        return op::MatmulForward{
            .out = at(out, s), .inp = at(inp, s), .weight = at(w, s), .N = N, .C = C, .OC = OC};
    });
    EXPECT_TRUE(m.same(out, "matmul out (no bias)"));
}

BACKEND_CASE(MatmulBackward, MatmulBackwardWithNullDinpAndDbias) {
    const int N = 40, C = 32, OC = 128;
    auto inp = m.act(randn(size_t(N) * C, 37)), w = m.act(randn(size_t(OC) * C, 38, 0.2f));
    auto dout = m.act(randn(size_t(N) * OC, 39));
    auto dw = m.f32(randn(size_t(OC) * C, 40));
    run_both(m, [&](Side s) {
        return op::MatmulBackward{.dweight = f32_at(dw, s),
                                  .dout = at(dout, s),
                                  .inp = at(inp, s),
                                  .weight = at(w, s),
                                  .N = N,
                                  .C = C,
                                  .OC = OC};
    });
    EXPECT_TRUE(m.same(dw, "dweight", dweight_tol(m)));
}

BACKEND_CASE(MatmulBackward, MatmulBackwardInputOnlyForAFrozenWeight) {
    const int N = 40, C = 32, OC = 128;
    auto w = m.act(randn(size_t(OC) * C, 44, 0.2f)), dout = m.act(randn(size_t(N) * OC, 45));
    auto dinp = m.act(randn(size_t(N) * C, 46));
    auto db = m.f32(randn(OC, 47));
    run_both(m, [&](Side s) {
        return op::MatmulBackward{.dinp = at(dinp, s),
                                  .dbias = f32_at(db, s),
                                  .dout = at(dout, s),
                                  .weight = at(w, s),
                                  .N = N,
                                  .C = C,
                                  .OC = OC};
    });
    EXPECT_TRUE(m.same(dinp, "dinp"));
    EXPECT_TRUE(m.same(db, "dbias", m.bf16() ? m.tol() : test::kFp32Tol));
}

// The int8 weight and its scales, uploaded bitwise to both sides.
struct Int8Mirror {
    DeviceBuffer cq, gq, cs, gs;
    Int8Mirror(Mirror& m, int OC, int C, uint32_t seed) {
        const Int8Weight w = int8_weight(OC, C, seed);
        cq = DeviceBuffer(*m.cpu, w.q.size(), MemoryCategory::params);
        gq = DeviceBuffer(*m.gpu, w.q.size(), MemoryCategory::params);
        cs = DeviceBuffer(*m.cpu, w.scale.size() * 4, MemoryCategory::params);
        gs = DeviceBuffer(*m.gpu, w.scale.size() * 4, MemoryCategory::params);
        m.cpu->copy_to_device(cq.get(), w.q.data(), w.q.size());
        m.gpu->copy_to_device(gq.get(), w.q.data(), w.q.size());
        m.cpu->copy_to_device(cs.get(), w.scale.data(), w.scale.size() * 4);
        m.gpu->copy_to_device(gs.get(), w.scale.data(), w.scale.size() * 4);
    }
    const int8_t* q(Side s) const { return (s == Side::cpu ? cq : gq).as<int8_t>(); }
    const float* scale(Side s) const { return (s == Side::cpu ? cs : gs).as<float>(); }
};

// Shapes that are not multiples of the CUDA kernel's 64x64 tiles or its 32-wide k steps.
BACKEND_CASE(MatmulInt8Forward, MatmulInt8Forward) {
    const int N = 74, C = 100, OC = 130;
    const Int8Mirror w(m, OC, C, 48);
    auto inp = m.act(randn(size_t(N) * C, 49)), b = m.act(randn(OC, 50));
    auto out = m.act_zeros(size_t(N) * OC);
    run_both(m, [&](Side s) {
        return op::MatmulInt8Forward{.out = at(out, s),
                                     .inp = at(inp, s),
                                     .weight = w.q(s),
                                     .scale = w.scale(s),
                                     .bias = at(b, s),
                                     .N = N,
                                     .C = C,
                                     .OC = OC};
    });
    EXPECT_TRUE(m.same(out, "int8 matmul out"));
}

BACKEND_CASE(MatmulInt8Backward, MatmulInt8Backward) {
    const int N = 74, C = 100, OC = 130;
    const Int8Mirror w(m, OC, C, 51);
    auto dout = m.act(randn(size_t(N) * OC, 52)), dinp = m.act(randn(size_t(N) * C, 53));
    auto db = m.f32(randn(OC, 54));
    run_both(m, [&](Side s) {
        return op::MatmulInt8Backward{.dinp = at(dinp, s),
                                      .dbias = f32_at(db, s),
                                      .dout = at(dout, s),
                                      .weight = w.q(s),
                                      .scale = w.scale(s),
                                      .N = N,
                                      .C = C,
                                      .OC = OC};
    });
    EXPECT_TRUE(m.same(dinp, "int8 matmul dinp"));
    EXPECT_TRUE(m.same(db, "int8 matmul dbias", m.bf16() ? m.tol() : test::kFp32Tol));
}

// R = 4: bf16 leading dimensions of 8 bytes, below what cuBLASLt's kernels take.
BACKEND_CASE(LoraForward, LoraForward) {
    const int N = 40, C = 64, OC = 96, R = 4;
    auto inp = m.act(randn(size_t(N) * C, 55)), A = m.act(randn(size_t(R) * C, 56, 0.2f));
    auto B = m.act(randn(size_t(OC) * R, 57, 0.2f)), out = m.act(randn(size_t(N) * OC, 58));
    auto u = m.act_zeros(size_t(N) * R);
    run_both(m, [&](Side s) {
        return op::LoraForward{.out = at(out, s),
                               .u = at(u, s),
                               .inp = at(inp, s),
                               .A = at(A, s),
                               .B = at(B, s),
                               .N = N,
                               .C = C,
                               .OC = OC,
                               .R = R,
                               .scale = 2.0f};
    });
    EXPECT_TRUE(m.same(u, "lora u"));
    EXPECT_TRUE(m.same(out, "lora out"));
}

BACKEND_CASE(LoraBackward, LoraBackward) {
    const int N = 40, C = 64, OC = 96, R = 8;
    auto inp = m.act(randn(size_t(N) * C, 59)), A = m.act(randn(size_t(R) * C, 60, 0.2f));
    auto B = m.act(randn(size_t(OC) * R, 61, 0.2f)), u = m.act(randn(size_t(N) * R, 62));
    auto dout = m.act(randn(size_t(N) * OC, 63)), dinp = m.act(randn(size_t(N) * C, 64));
    auto du = m.act_zeros(size_t(N) * R);
    auto dA = m.f32(randn(size_t(R) * C, 65)), dB = m.f32(randn(size_t(OC) * R, 66));
    run_both(m, [&](Side s) {
        return op::LoraBackward{.dinp = at(dinp, s),
                                .dA = f32_at(dA, s),
                                .dB = f32_at(dB, s),
                                .du = at(du, s),
                                .dout = at(dout, s),
                                .inp = at(inp, s),
                                .u = at(u, s),
                                .A = at(A, s),
                                .B = at(B, s),
                                .N = N,
                                .C = C,
                                .OC = OC,
                                .R = R,
                                .scale = 0.5f};
    });
    EXPECT_TRUE(m.same(dinp, "lora dinp"));
    EXPECT_TRUE(m.same(dA, "lora dA", dweight_tol(m)));
    EXPECT_TRUE(m.same(dB, "lora dB", dweight_tol(m)));
}

// The bias at an odd element offset cannot go to cuBLASLt's epilogue: the fallback kernel must
// give the same numbers.
BACKEND_CASE(MatmulForward, MatmulForwardWithMisalignedBias) {
    const int N = 20, C = 32, OC = 64;
    auto inp = m.act(randn(size_t(N) * C, 41)), w = m.act(randn(size_t(OC) * C, 42, 0.2f));
    auto b = m.act(randn(OC + 1, 43));
    auto out = m.act_zeros(size_t(N) * OC);
    const size_t e = m.gpu->compute_elem_bytes();
    run_both(m, [&](Side s) {
        const char* bias = static_cast<const char*>(at(b, s)) + (s == Side::cpu ? 4 : e);
        return op::MatmulForward{.out = at(out, s),
                                 .inp = at(inp, s),
                                 .weight = at(w, s),
                                 .bias = bias,
                                 .N = N,
                                 .C = C,
                                 .OC = OC};
    });
    EXPECT_TRUE(m.same(out, "matmul out (misaligned bias)"));
}

BACKEND_CASE(MatmulForward, MatmulForwardGeluEpilogue) {
    const int N = 64, C = 64, OC = 256;
    auto inp = m.act(randn(size_t(N) * C, 44)), w = m.act(randn(size_t(OC) * C, 45, 0.2f));
    auto b = m.act(randn(OC, 46));
    auto out = m.act_zeros(size_t(N) * OC), pre = m.act_zeros(size_t(N) * OC);
    run_both(m, [&](Side s) {
        return op::MatmulForward{.out = at(out, s),
                                 .inp = at(inp, s),
                                 .weight = at(w, s),
                                 .bias = at(b, s),
                                 .N = N,
                                 .C = C,
                                 .OC = OC,
                                 .epilogue = MatmulEpilogue::gelu,
                                 .pre_act = at(pre, s)};
    });
    // cuBLASLt's GELU epilogue evaluates its GELU its own way (its docs do not pin the tanh
    // form): 1e-3 relative + 5e-4 absolute under fp32, which also bounds erf-vs-tanh GELU.
    EXPECT_TRUE(m.same(pre, "pre-activation", m.tol()));
    EXPECT_TRUE(m.same(out, "gelu(out)", m.bf16() ? test::kBf16Tol : Tol{1e-3, 5e-4}));
}

// tf32 (10-bit mantissa matmul inputs): rtol/atol 5e-3.
BACKEND_CASE_AT(MatmulForward, MatmulForwardWithinTf32Rounding, Precision::tf32) {
    const int N = 64, C = 128, OC = 64;
    auto inp = m.act(randn(size_t(N) * C, 47)), w = m.act(randn(size_t(OC) * C, 48, 0.1f));
    auto b = m.act(randn(OC, 49));
    auto out = m.act_zeros(size_t(N) * OC);
    run_both(m, [&](Side s) {
        return op::MatmulForward{.out = at(out, s),
                                 .inp = at(inp, s),
                                 .weight = at(w, s),
                                 .bias = at(b, s),
                                 .N = N,
                                 .C = C,
                                 .OC = OC};
    });
    EXPECT_TRUE(m.same(out, "tf32 matmul", Tol{5e-3, 5e-3}));
}

// ---- attention (shape of tests/cuda/test_cuda_attention.cpp's first: T not a tile multiple) --

constexpr AttnShape kGpuAttn{2, 37, 64, 4};

BACKEND_CASE(AttentionForward, AttentionForwardNaiveAndFlash) {
    const int B = kGpuAttn.B, T = kGpuAttn.T, C = kGpuAttn.C, NH = kGpuAttn.NH;
    for (const AttentionImpl impl : kCpuAttnImpls) {
        SCOPED_TRACE(to_string(impl));
        m.gpu->reserve_attention_workspace(impl, B, T, C, NH);
        const size_t BTC = size_t(B) * T * C;
        auto qkv = m.act(randn(3 * BTC, 100)), out = m.act_zeros(BTC);
        auto saved = m.f32_zeros(attention_saved_elems(impl, B, T, NH));
        run_both(m, [&](Side s) {
            return op::AttentionForward{.impl = impl,
                                        .out = at(out, s),
                                        .saved = f32_at(saved, s),
                                        .qkv = at(qkv, s),
                                        .B = B,
                                        .T = T,
                                        .C = C,
                                        .NH = NH};
        });
        EXPECT_TRUE(m.same(out, "attention out"));
        EXPECT_TRUE(m.same(saved, impl == AttentionImpl::flash ? "logsumexp" : "probs", m.tol()));
    }
}

BACKEND_CASE(AttentionBackward, AttentionBackwardNaiveAndFlash) {
    const int B = kGpuAttn.B, T = kGpuAttn.T, C = kGpuAttn.C, NH = kGpuAttn.NH;
    for (const AttentionImpl impl : kCpuAttnImpls) {
        SCOPED_TRACE(to_string(impl));
        m.gpu->reserve_attention_workspace(impl, B, T, C, NH);
        const size_t BTC = size_t(B) * T * C;
        auto qkv = m.act(randn(3 * BTC, 100)), out = m.act_zeros(BTC);
        auto saved = m.f32_zeros(attention_saved_elems(impl, B, T, NH));
        m.cpu->run(op::AttentionForward{.impl = impl,
                                        .out = out.c.get(),
                                        .saved = saved.cf(),
                                        .qkv = qkv.c.get(),
                                        .B = B,
                                        .T = T,
                                        .C = C,
                                        .NH = NH});
        // Feed the other backend the CPU's forward results, so only the backward is compared.
        m.upload_act(out, m.cpu_values(out));
        m.gpu->copy_to_device(saved.g.get(), m.cpu_values(saved).data(), saved.n * 4);
        auto dout = m.act(randn(BTC, 200));
        auto dqkv = m.act(randn(3 * BTC, 300));  // non-zero: backward accumulates
        run_both(m, [&](Side s) {
            return op::AttentionBackward{.impl = impl,
                                         .dqkv = at(dqkv, s),
                                         .dout = at(dout, s),
                                         .qkv = at(qkv, s),
                                         .out = at(out, s),
                                         .saved = f32_at(saved, s),
                                         .B = B,
                                         .T = T,
                                         .C = C,
                                         .NH = NH};
        });
        EXPECT_TRUE(m.same(dqkv, "dqkv"));
    }
}

// ---- pointwise (n = 1000) ----

BACKEND_CASE(GeluForward, GeluForward) {
    auto x = m.act(randn(1000, 50, 2.0f)), out = m.act_zeros(1000);
    run_both(
        m, [&](Side s) { return op::GeluForward{.out = at(out, s), .inp = at(x, s), .n = 1000}; });
    EXPECT_TRUE(m.same(out, "gelu"));
}

BACKEND_CASE(GeluBackward, GeluBackward) {
    auto x = m.act(randn(1000, 50, 2.0f)), dout = m.act(randn(1000, 52));
    auto dinp = m.act(randn(1000, 53));
    run_both(m, [&](Side s) {
        return op::GeluBackward{
            .dinp = at(dinp, s), .inp = at(x, s), .dout = at(dout, s), .n = 1000};
    });
    EXPECT_TRUE(m.same(dinp, "gelu backward"));
}

BACKEND_CASE(ResidualForward, ResidualForward) {
    auto x = m.act(randn(1000, 50, 2.0f)), y = m.act(randn(1000, 51)), r = m.act_zeros(1000);
    run_both(m, [&](Side s) {
        return op::ResidualForward{.out = at(r, s), .inp1 = at(x, s), .inp2 = at(y, s), .n = 1000};
    });
    EXPECT_TRUE(m.same(r, "residual"));
}

BACKEND_CASE(ResidualBackward, ResidualBackward) {
    auto dout = m.act(randn(1000, 52)), d1 = m.act(randn(1000, 54)), d2 = m.act(randn(1000, 55));
    run_both(m, [&](Side s) {
        return op::ResidualBackward{
            .dinp1 = at(d1, s), .dinp2 = at(d2, s), .dout = at(dout, s), .n = 1000};
    });
    EXPECT_TRUE(m.same(d1, "residual d1"));
    EXPECT_TRUE(m.same(d2, "residual d2"));
}

// ---- classifier ----

op::ClassifierFused fused_classifier(const Mirror::Buf& losses, const Mirror::Buf& logits,
                                     const Mirror::Buf& tg, Side s, int N, int V, int Vp,
                                     float dloss) {
    return {.losses = f32_at(losses, s),
            .logits = at(logits, s),
            .targets = ints_at(tg, s),
            .N = N,
            .V = V,
            .Vp = Vp,
            .dloss = dloss};
}

BACKEND_CASE(ClassifierFused, ClassifierFused) {
    const int N = 23, V = 300, Vp = 384;
    auto logits = m.act(randn(size_t(N) * Vp, 60, 3.0f));
    auto tg = m.ints(randint(N, V, 61));
    auto losses = m.f32_zeros(N);
    run_both(m,
             [&](Side s) { return fused_classifier(losses, logits, tg, s, N, V, Vp, 1.0f / N); });
    EXPECT_TRUE(m.same(losses, "losses", m.tol()));
    EXPECT_TRUE(m.same(logits, "dlogits (in place)", m.bf16() ? m.tol() : Tol{1e-4, 1e-7}));
}

BACKEND_CASE(ClassifierFused, ClassifierFusedWithoutGradientLeavesLogitsUntouched) {
    const int N = 5, V = 100, Vp = 128;
    auto logits = m.act(randn(size_t(N) * Vp, 62));
    const auto before = m.gpu_values(logits);
    auto tg = m.ints(randint(N, V, 63));
    auto losses = m.f32_zeros(N);
    m.gpu->run(fused_classifier(losses, logits, tg, Side::other, N, V, Vp, 0.0f));
    const auto after = m.gpu_values(logits);
    EXPECT_EQ(0, std::memcmp(before.data(), after.data(), before.size() * 4));
}

// The unfused chain softmax -> crossentropy -> crossentropy_softmax_backward (N = 19, V = 250 of
// Vp = 256), each step on both backends from the CPU's previous step.
constexpr int kUnN = 19, kUnV = 250, kUnVp = 256;

BACKEND_CASE(SoftmaxForward, SoftmaxForward) {
    auto logits = m.act(randn(size_t(kUnN) * kUnVp, 64, 2.0f));
    auto probs = m.f32_zeros(size_t(kUnN) * kUnVp);
    run_both(m, [&](Side s) {
        return op::SoftmaxForward{
            .probs = f32_at(probs, s), .logits = at(logits, s), .N = kUnN, .V = kUnV, .Vp = kUnVp};
    });
    EXPECT_TRUE(m.same(probs, "probs", Tol{1e-4, 1e-7}));
}

// probs = the CPU's softmax of the seed-64 logits, on both sides.
Mirror::Buf unfused_probs(Mirror& m) {
    auto logits = m.act(randn(size_t(kUnN) * kUnVp, 64, 2.0f));
    auto probs = m.f32_zeros(size_t(kUnN) * kUnVp);
    m.cpu->run(op::SoftmaxForward{
        .probs = probs.cf(), .logits = logits.c.get(), .N = kUnN, .V = kUnV, .Vp = kUnVp});
    return m.f32(m.cpu_values(probs));
}

BACKEND_CASE(CrossEntropyForward, CrossEntropyForward) {
    auto probs = unfused_probs(m);
    auto tg = m.ints(randint(kUnN, kUnV, 65));
    auto losses = m.f32_zeros(kUnN);
    run_both(m, [&](Side s) {
        return op::CrossEntropyForward{.losses = f32_at(losses, s),
                                       .probs = f32_at(probs, s),
                                       .targets = ints_at(tg, s),
                                       .N = kUnN,
                                       .V = kUnV,
                                       .Vp = kUnVp};
    });
    EXPECT_TRUE(m.same(losses, "losses", test::kFp32Tol));
}

BACKEND_CASE(CrossEntropySoftmaxBackward, CrossEntropySoftmaxBackward) {
    auto probs = unfused_probs(m);
    auto tg = m.ints(randint(kUnN, kUnV, 65));
    auto dlogits = m.act_zeros(size_t(kUnN) * kUnVp);
    run_both(m, [&](Side s) {
        return op::CrossEntropySoftmaxBackward{.dlogits = at(dlogits, s),
                                               .probs = f32_at(probs, s),
                                               .targets = ints_at(tg, s),
                                               .N = kUnN,
                                               .V = kUnV,
                                               .Vp = kUnVp,
                                               .dloss = 0.5f};
    });
    EXPECT_TRUE(m.same(dlogits, "dlogits", m.bf16() ? m.tol() : Tol{1e-4, 1e-7}));
}

// On the other backend alone: the fused kernel computes what the unfused chain does.
BACKEND_CASE(ClassifierFused, ClassifierFusedMatchesTheUnfusedChain) {
    const auto host = randn(size_t(kUnN) * kUnVp, 64, 2.0f);
    auto logits = m.act(host), fused_logits = m.act(host);
    auto tg = m.ints(randint(kUnN, kUnV, 65));
    auto probs = m.f32_zeros(size_t(kUnN) * kUnVp), losses = m.f32_zeros(kUnN);
    auto dlogits = m.act_zeros(size_t(kUnN) * kUnVp), fused_losses = m.f32_zeros(kUnN);
    const Side g = Side::other;
    m.gpu->run(op::SoftmaxForward{
        .probs = probs.gf(), .logits = logits.g.get(), .N = kUnN, .V = kUnV, .Vp = kUnVp});
    m.gpu->run(op::CrossEntropyForward{.losses = losses.gf(),
                                       .probs = probs.gf(),
                                       .targets = ints_at(tg, g),
                                       .N = kUnN,
                                       .V = kUnV,
                                       .Vp = kUnVp});
    m.gpu->run(op::CrossEntropySoftmaxBackward{.dlogits = dlogits.g.get(),
                                               .probs = probs.gf(),
                                               .targets = ints_at(tg, g),
                                               .N = kUnN,
                                               .V = kUnV,
                                               .Vp = kUnVp,
                                               .dloss = 0.5f});
    m.gpu->run(fused_classifier(fused_losses, fused_logits, tg, g, kUnN, kUnV, kUnVp, 0.5f));
    EXPECT_TRUE(test::close(m.gpu_values(fused_losses), m.gpu_values(losses), m.tol(),
                            "fused vs unfused loss"));
    EXPECT_TRUE(test::close(m.gpu_values(fused_logits), m.gpu_values(dlogits), m.tol(),
                            "fused vs unfused grad"));
}

// ---- reductions: n = 1,000,003 (several partial blocks + a ragged tail) of |x|, no
// cancellation: sums of 1e6 positive terms on different trees agree within 1e-4 relative ----

constexpr size_t kRedN = 1'000'003;
Vec abs_randn(size_t n, uint32_t seed) {
    Vec xs = randn(n, seed);
    for (auto& v : xs) v = std::fabs(v);
    return xs;
}

BACKEND_CASE(LossMean, LossMeanIsCloseAndDeterministic) {
    auto x = m.f32(abs_randn(kRedN, 70));
    auto out = m.f32_zeros(1), again = m.f32_zeros(1);
    const int N = static_cast<int>(kRedN);
    run_both(m, [&](Side s) {
        return op::LossMean{.loss = f32_at(out, s), .losses = f32_at(x, s), .N = N};
    });
    EXPECT_TRUE(m.same(out, "loss mean", Tol{1e-4, 0.0}));
    m.gpu->run(op::LossMean{.loss = again.gf(), .losses = x.gf(), .N = N});
    EXPECT_EQ(m.gpu_values(out), m.gpu_values(again)) << "two runs differ: not deterministic";
}

BACKEND_CASE(GlobalNormClip, GlobalNormIsCloseAndDeterministic) {
    auto x = m.f32(abs_randn(kRedN, 70));
    auto out = m.f32_zeros(2), again = m.f32_zeros(2);  // [norm_sq, clip_scale]
    run_both(m, [&](Side s) {
        return op::GlobalNormClip{.norm_sq = f32_at(out, s),
                                  .clip_scale = f32_at(out, s) + 1,
                                  .grads = f32_at(x, s),
                                  .n = kRedN,
                                  .max_norm = 1.0f};
    });
    EXPECT_TRUE(m.same(out, "norm^2 / clip scale", Tol{1e-4, 0.0}));
    m.gpu->run(op::GlobalNormClip{.norm_sq = again.gf(),
                                  .clip_scale = again.gf() + 1,
                                  .grads = x.gf(),
                                  .n = kRedN,
                                  .max_norm = 1.0f});
    EXPECT_EQ(m.gpu_values(out), m.gpu_values(again)) << "two runs differ: not deterministic";
}

BACKEND_CASE(GlobalNormClip, ClipScaleScalesOnlyAboveMaxNorm) {
    // One gradient each: norm 2 (> max_norm 1: scaled by 1/(2 + 1e-6)) and norm 0.5 (untouched).
    auto grads = m.f32({2.0f, 0.5f});
    auto norm_sq = m.f32_zeros(2), scale = m.f32_zeros(2);
    for (int i = 0; i < 2; ++i)
        run_both(m, [&](Side s) {
            return op::GlobalNormClip{.norm_sq = f32_at(norm_sq, s) + i,
                                      .clip_scale = f32_at(scale, s) + i,
                                      .grads = f32_at(grads, s) + i,
                                      .n = 1,
                                      .max_norm = 1.0f};
        });
    const auto got = m.gpu_values(scale);
    EXPECT_NEAR(got[0], 1.0f / (2.0f + 1e-6f), 1e-7);
    EXPECT_EQ(got[1], 1.0f);
    EXPECT_TRUE(m.same(scale, "clip scale", test::kFp32Tol));
}

// ---- optimizer (fp32 state under every precision) ----

const TensorSlice kGpuSlices[] = {{0, 1000, true}, {1000, 37, false}, {1037, 5000, true}};
constexpr size_t kGpuTotal = 6037;

// Three AdamW steps of `impl` on `be` (ported from tests/cuda/test_cuda_backend.cpp's run_adamw).
AdamState backend_adamw(Backend& be, AdamWImpl impl, bool with_scale) {
    const size_t bytes = kGpuTotal * 4;
    DeviceBuffer p(be, bytes, MemoryCategory::params), g(be, bytes, MemoryCategory::grads);
    DeviceBuffer m(be, bytes, MemoryCategory::optimizer), v(be, bytes, MemoryCategory::optimizer);
    DeviceBuffer scale(be, 4, MemoryCategory::workspace);
    be.copy_to_device(p.get(), randn(kGpuTotal, 1).data(), bytes);
    be.memset_zero(m.get(), bytes);
    be.memset_zero(v.get(), bytes);
    const float sc = 0.37f;
    be.copy_to_device(scale.get(), &sc, 4);
    for (int t = 1; t <= 3; ++t) {
        be.copy_to_device(g.get(), randn(kGpuTotal, 10 + t, 0.1f).data(), bytes);
        be.run(op::AdamWUpdate{.impl = impl,
                               .params = p.as<float>(),
                               .grads = g.as<float>(),
                               .m = m.as<float>(),
                               .v = v.as<float>(),
                               .tensors = kGpuSlices,
                               .total = kGpuTotal,
                               .hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t},
                               .grad_scale = with_scale ? scale.as<float>() : nullptr});
    }
    be.synchronize();
    AdamState s{Vec(kGpuTotal), Vec(kGpuTotal), Vec(kGpuTotal)};
    be.copy_to_host(s.p.data(), p.get(), bytes);
    be.copy_to_host(s.m.data(), m.get(), bytes);
    be.copy_to_host(s.v.data(), v.get(), bytes);
    return s;
}

BACKEND_CASE(AdamWUpdate, AdamWImplsBitwiseIdenticalAndCloseToCpu) {
    for (const bool with_scale : {false, true}) {
        SCOPED_TRACE(with_scale ? "grad_scale 0.37" : "no grad_scale");
        const AdamState fused = backend_adamw(*m.gpu, AdamWImpl::fused, with_scale);
        for (const AdamWImpl impl : {AdamWImpl::unfused, AdamWImpl::multi_tensor}) {
            const AdamState o = backend_adamw(*m.gpu, impl, with_scale);
            EXPECT_EQ(0, std::memcmp(o.p.data(), fused.p.data(), kGpuTotal * 4)) << to_string(impl);
            EXPECT_EQ(0, std::memcmp(o.m.data(), fused.m.data(), kGpuTotal * 4)) << to_string(impl);
            EXPECT_EQ(0, std::memcmp(o.v.data(), fused.v.data(), kGpuTotal * 4)) << to_string(impl);
        }
        const AdamState c = backend_adamw(*m.cpu, AdamWImpl::fused, with_scale);
        // The same math::adamw_update on both; only FMA contraction may differ.
        EXPECT_TRUE(test::close(fused.p, c.p, {1e-6, 1e-7}, "params"));
        EXPECT_TRUE(test::close(fused.m, c.m, {1e-6, 1e-9}, "m"));
        EXPECT_TRUE(test::close(fused.v, c.v, {1e-6, 1e-12}, "v"));
    }
}

// ---- precision and memory ----

BACKEND_CASE(CastParams, CastParamsRoundsToNearestEven) {
    const auto host = randn(777, 80, 3.0f);
    auto src = m.f32(host);
    DeviceBuffer dst(*m.gpu, host.size() * m.gpu->compute_elem_bytes(), MemoryCategory::params);
    m.gpu->run(op::CastParams{.dst = dst.get(), .src = src.gf(), .n = host.size()});
    m.gpu->synchronize();
    if (m.bf16()) {
        std::vector<uint16_t> got(host.size());
        m.gpu->copy_to_host(got.data(), dst.get(), got.size() * 2);
        for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(got[i], test::f32_to_bf16(host[i])) << i;
    } else {
        Vec got(host.size());
        m.gpu->copy_to_host(got.data(), dst.get(), got.size() * 4);
        EXPECT_EQ(0, std::memcmp(got.data(), host.data(), got.size() * 4));
    }
}

BACKEND_CASE(FillZero, FillZeroClearsExactlyItsBytes) {
    auto buf = m.f32(randn(100, 90));  // 400 bytes; 397 cleared, the last 3 bytes kept
    run_both(m, [&](Side s) { return op::FillZero{.dst = at(buf, s), .bytes = 397}; });
    const Vec got = m.gpu_values(buf), want = m.cpu_values(buf);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), 400));
    EXPECT_EQ(got[0], 0.0f);
}

// ==== the front: coverage, identical rejections, missing kernels =============================

TEST(BackendOps, EveryOpHasACase) {
    for (const std::string_view name : kOpNames) {
        const auto it = case_counts().find(name);
        const CaseCounts c = it == case_counts().end() ? CaseCounts{} : it->second;
        EXPECT_GT(c.cpu, 0) << "op " << name << " has no CPU_CASE (CpuMatchesFloat64) here";
        EXPECT_GT(c.other, 0) << "op " << name << " has no BACKEND_CASE (other vs CPU) here";
    }
    // Every case names an op of the table (no stale case for a removed op).
    for (const auto& [name, counts] : case_counts())
        EXPECT_NE(std::find(std::begin(kOpNames), std::end(kOpNames), name), std::end(kOpNames))
            << "a case names " << name << ", which is not in kOpNames";
}

// Every backend this process can create: the CPU, and CUDA at fp32 and bf16 when a device
// answers.
std::vector<std::unique_ptr<Backend>> every_backend() {
    std::vector<std::unique_ptr<Backend>> all;
    all.push_back(create_backend(BackendKind::cpu));
    if (cuda_available())
        for (const Precision p : {Precision::fp32, Precision::bf16}) {
            BackendOptions o;
            o.precision = p;
            all.push_back(create_backend(BackendKind::cuda, o));
        }
    return all;
}

// The message run(op) throws, or "" when it does not throw.
template <class Op>
std::string rejection(Backend& be, const Op& op) {
    try {
        be.run(op);
    } catch (const BackendError& e) {
        return e.what();
    }
    return "";
}

TEST(BackendOps, BadRequestIsRejectedIdenticallyOnEveryBackend) {
    const int B = 1, T = 2, C = 10, NH = 3;  // C not a multiple of NH
    for (const auto& be : every_backend()) {
        SCOPED_TRACE(be->device_name());
        DeviceBuffer qkv(*be, 3 * B * T * C * 4, MemoryCategory::activations);
        DeviceBuffer out(*be, B * T * C * 4, MemoryCategory::activations);
        DeviceBuffer saved(*be, B * NH * T * T * 4, MemoryCategory::activations);
        EXPECT_EQ(rejection(*be, op::AttentionForward{.out = out.get(),
                                                      .saved = saved.as<float>(),
                                                      .qkv = qkv.get(),
                                                      .B = B,
                                                      .T = T,
                                                      .C = C,
                                                      .NH = NH}),
                  "attention_forward: n_embd (10) must be a multiple of n_head (3)");
        EXPECT_EQ(rejection(*be, op::GeluForward{.inp = qkv.get(), .n = 4}),
                  "gelu_forward: out is null; this argument is required");
    }
}

TEST(BackendOps, BadRequestNeverReachesTheKernel) {
    auto be = create_backend(BackendKind::cpu);
    static int calls;
    calls = 0;
    be->kernels().gelu_forward = [](Backend&, const op::GeluForward&) { ++calls; };
    float x = 1.0f, y = 0.0f;
    EXPECT_THROW(be->run(op::GeluForward{.inp = &x, .n = 1}), BackendError);  // out null
    EXPECT_EQ(calls, 0);
    be->run(op::GeluForward{.out = &y, .inp = &x, .n = 1});  // a good request does reach it
    EXPECT_EQ(calls, 1);
}

TEST(BackendOps, NullKernelEntryThrowsHasNoKernel) {
    auto be = create_backend(BackendKind::cpu);
    be->kernels().residual_forward = nullptr;
    float a = 1.0f, b = 2.0f, out = 0.0f;
    EXPECT_EQ(rejection(*be, op::ResidualForward{.out = &out, .inp1 = &a, .inp2 = &b, .n = 1}),
              "residual_forward: the cpu backend has no kernel for this op");
    EXPECT_EQ(out, 0.0f);
    // The other entries are untouched.
    be->run(op::GeluForward{.out = &out, .inp = &a, .n = 1});
    EXPECT_NE(out, 0.0f);
}

}  // namespace
}  // namespace mt

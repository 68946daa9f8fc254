// The three CPU AdamW implementations (unfused, multi_tensor, fused) produce bitwise-identical
// parameters and moments over several steps, with mixed decay flags, a clip scale, odd tensor
// sizes and gaps between tensors; the fused one matches a double-precision reference; bad
// slice tables are clear errors; and the Backend entry point reserves the unfused temporary
// as tracked `workspace` memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/kernels.h"
#include "tests/cpu_isa_environment.h"

namespace {

using mt::Backend;
using Slice = mt::TensorSlice;

// One AdamW step through the op table's front (Backend::run), as the optimizer makes it.
void adamw_update(Backend& backend, mt::AdamWImpl impl, float* p, const float* g, float* m,
                  float* v, const std::vector<Slice>& slices, size_t total,
                  const mt::AdamWParams& hp, const float* grad_scale) {
    backend.run(mt::op::AdamWUpdate{.impl = impl,
                                    .params = p,
                                    .grads = g,
                                    .m = m,
                                    .v = v,
                                    .tensors = slices,
                                    .total = total,
                                    .hp = hp,
                                    .grad_scale = grad_scale});
}

// The op's request checks alone (what Backend::run calls before any kernel).
void check_adamw_slices(const std::vector<Slice>& slices, size_t total) {
    float x = 0;
    mt::op::AdamWUpdate{.impl = mt::AdamWImpl::fused,
                        .params = &x,
                        .grads = &x,
                        .m = &x,
                        .v = &x,
                        .tensors = slices,
                        .total = total,
                        .hp = {1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1}}
        .check();
}

struct State {
    std::vector<float> p, m, v;
};

// Tensors of awkward sizes, alternating decay, with gaps [a few floats] no slice covers.
std::vector<Slice> make_slices(size_t* total) {
    const size_t counts[] = {13, 1, 70000, 7, 40000, 129, 33000};  // 70000 spans chunks
    std::vector<Slice> s;
    size_t off = 0;
    bool decay = true;
    for (size_t c : counts) {
        s.push_back({off, c, decay});
        decay = !decay;
        off += c + 3;  // 3-float gap
    }
    *total = off;
    return s;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

mt::AdamWParams hparams(int step) {
    return {3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(AdamWImpls, UnfusedMultiTensorAndFusedAreBitwiseIdenticalOverSteps) {
    size_t total = 0;
    const auto slices = make_slices(&total);
    std::mt19937 rng(42);
    State init{random_vec(total, rng, -1, 1), std::vector<float>(total, 0.0f),
               std::vector<float>(total, 0.0f)};
    State a = init, b = init, c = init;
    std::vector<float> tmp(mt::cpu::adamw_unfused_workspace_elems(slices));
    const float clip = 0.37f;
    for (int step = 1; step <= 5; step++) {
        const auto grads = random_vec(total, rng, -2, 2);
        const auto s = mt::adamw_scalars(hparams(step));
        mt::cpu::adamw_unfused(a.p.data(), grads.data(), a.m.data(), a.v.data(), tmp.data(), slices,
                               s, clip);
        mt::cpu::adamw_multi_tensor(b.p.data(), grads.data(), b.m.data(), b.v.data(), slices, s,
                                    clip);
        mt::cpu::adamw_fused(c.p.data(), grads.data(), c.m.data(), c.v.data(), slices, total, s,
                             clip);
        EXPECT_TRUE(same_bits(a.p, b.p)) << "params unfused vs multi_tensor, step " << step;
        EXPECT_TRUE(same_bits(b.p, c.p)) << "params multi_tensor vs fused, step " << step;
        EXPECT_TRUE(same_bits(a.m, c.m) && same_bits(b.m, c.m)) << "m, step " << step;
        EXPECT_TRUE(same_bits(a.v, c.v) && same_bits(b.v, c.v)) << "v, step " << step;
    }
    // the parameters did move, and the gaps between tensors did not
    EXPECT_FALSE(same_bits(c.p, init.p));
    for (size_t i = 0; i + 1 < slices.size(); i++)
        for (size_t g = slices[i].offset + slices[i].count; g < slices[i + 1].offset; g++) {
            EXPECT_EQ(c.p[g], init.p[g]);
            EXPECT_EQ(a.p[g], init.p[g]);
            EXPECT_EQ(b.p[g], init.p[g]);
            EXPECT_EQ(c.m[g], 0.0f);
        }
}

TEST(AdamWImpls, FusedMatchesDoublePrecisionReference) {
    size_t total = 0;
    const auto slices = make_slices(&total);
    std::mt19937 rng(7);
    auto p = random_vec(total, rng, -1, 1);
    std::vector<float> m(total, 0.0f), v(total, 0.0f);
    std::vector<double> pd(p.begin(), p.end()), md(total, 0.0), vd(total, 0.0);
    const float clip = 0.5f;
    for (int step = 1; step <= 3; step++) {
        const auto grads = random_vec(total, rng, -1, 1);
        const auto hp = hparams(step);
        mt::cpu::adamw_fused(p.data(), grads.data(), m.data(), v.data(), slices, total,
                             mt::adamw_scalars(hp), clip);
        const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
        for (const Slice& s : slices)
            for (size_t i = s.offset; i < s.offset + s.count; i++) {
                const double g = static_cast<double>(grads[i]) * clip;
                md[i] = 0.9 * md[i] + 0.1 * g;
                vd[i] = 0.95 * vd[i] + 0.05 * g * g;
                const double upd = (md[i] / bc1) / (std::sqrt(vd[i] / bc2) + 1e-8);
                pd[i] -= static_cast<double>(hp.lr) * (upd + (s.decay ? 0.1 : 0.0) * pd[i]);
            }
    }
    double worst = 0;
    for (size_t i = 0; i < total; i++) {
        const double rel = std::abs(p[i] - pd[i]) / std::max(1e-3, std::abs(pd[i]));
        worst = std::max(worst, rel);
    }
    EXPECT_LT(worst, 1e-5) << "largest relative difference to the double reference";
    double worst_m = 0;
    for (size_t i = 0; i < total; i++)
        worst_m = std::max(worst_m, std::abs(m[i] - md[i]) / std::max(1e-3, std::abs(md[i])));
    EXPECT_LT(worst_m, 1e-5);
}

TEST(AdamWImpls, SliceTableErrorsNameTheSliceAndTheRule) {
    const std::vector<Slice> overlap = {{0, 10, true}, {5, 10, false}};
    try {
        check_adamw_slices(overlap, 100);
        FAIL() << "overlapping slices must be rejected";
    } catch (const mt::BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("slice 1"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
    const std::vector<Slice> past_end = {{0, 10, true}, {10, 91, false}};
    try {
        check_adamw_slices(past_end, 100);
        FAIL() << "a slice past the buffer must be rejected";
    } catch (const mt::BackendError& e) {
        EXPECT_NE(std::string(e.what()).find("past the buffer of 100"), std::string::npos)
            << e.what();
    }
    EXPECT_NO_THROW(check_adamw_slices(std::vector<Slice>{{0, 10, true}, {10, 90, false}}, 100));
}

TEST(AdamWImpls, BackendVariantsAgreeAndUnfusedTemporaryIsTrackedWorkspace) {
    auto backend = mt::create_backend(mt::BackendKind::cpu);
    size_t total = 0;
    const auto slices = make_slices(&total);
    std::mt19937 rng(3);
    const auto p0 = random_vec(total, rng, -1, 1);
    const auto g = random_vec(total, rng, -1, 1);
    const float clip = 0.8f;
    std::vector<std::vector<float>> results;
    const int ws = static_cast<int>(mt::MemoryCategory::workspace);
    for (mt::AdamWImpl impl :
         {mt::AdamWImpl::unfused, mt::AdamWImpl::multi_tensor, mt::AdamWImpl::fused}) {
        auto p = p0;
        std::vector<float> m(total, 0.0f), v(total, 0.0f);
        for (int step = 1; step <= 2; step++)
            adamw_update(*backend, impl, p.data(), g.data(), m.data(), v.data(), slices, total,
                         hparams(step), &clip);
        results.push_back(p);
        if (impl == mt::AdamWImpl::unfused) {
            EXPECT_EQ(backend->memory_stats().current[ws], 70000 * sizeof(float))
                << "the unfused temporary is sized by the largest tensor";
        }
    }
    EXPECT_TRUE(same_bits(results[0], results[1]));
    EXPECT_TRUE(same_bits(results[1], results[2]));
    // a null scale means 1: same as passing 1.0
    auto p1 = p0, p2 = p0;
    std::vector<float> m1(total, 0.0f), v1(total, 0.0f), m2(total, 0.0f), v2(total, 0.0f);
    const float one = 1.0f;
    adamw_update(*backend, mt::AdamWImpl::fused, p1.data(), g.data(), m1.data(), v1.data(), slices,
                 total, hparams(1), nullptr);
    adamw_update(*backend, mt::AdamWImpl::fused, p2.data(), g.data(), m2.data(), v2.data(), slices,
                 total, hparams(1), &one);
    EXPECT_TRUE(same_bits(p1, p2));
    EXPECT_THROW(adamw_update(*backend, mt::AdamWImpl::fused, p1.data(), g.data(), m1.data(),
                              v1.data(), slices, total, hparams(0), nullptr),
                 mt::BackendError);
}

}  // namespace

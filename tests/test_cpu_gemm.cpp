// The CPU GEMM engine (kernels/cpu/gemm.h): every step of the kernels.matmul ladder (naive,
// blocked, packed, eigen = blas) against a plain
// double-precision product, for every operand layout (A and B each plain or transposed), with and
// without accumulation, on shapes that hit every edge of the packed GEMM's blocking (partial
// 12-row and 32-column tiles, K not a multiple of 16, K split into several chunks, N split into
// several blocks, M into several blocks, leading dimensions wider than the matrix), plus the
// properties the trainer relies on: bitwise the same result for any thread count, and a padded
// C (ldc > N) whose padding is never written.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "tests/cpu_isa_environment.h"

namespace {

using mt::cpu::GemmOperand;
using Vec = std::vector<float>;

struct Shape {
    int M, N, K;
};

// Stores logical X (rows, cols) into a buffer with leading dimension ld, transposed or not;
// the padding columns hold a sentinel the GEMM must never read into the result.
struct Stored {
    Vec buf;
    long ld;
    bool transposed;
    GemmOperand op() const { return {buf.data(), ld, transposed}; }
};

Stored store(const Vec& x, int rows, int cols, bool transposed, int pad) {
    const int srows = transposed ? cols : rows, scols = transposed ? rows : cols;
    Stored s{Vec(static_cast<size_t>(srows) * (scols + pad), 1e30f), scols + pad, transposed};
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            const long at =
                transposed ? static_cast<long>(j) * s.ld + i : static_cast<long>(i) * s.ld + j;
            s.buf[at] = x[static_cast<size_t>(i) * cols + j];
        }
    return s;
}

Vec random_vec(size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Vec v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

using GemmFn = void (*)(int, int, int, GemmOperand, GemmOperand, float*, long, bool);

// Runs fn on every layout and both accumulate modes and compares with a double reference:
// |c - ref| <= 1e-5 * sum_k |a_ik b_kj| + 1e-6 (the bound of a float sum of K products).
void check_against_reference(const char* name, GemmFn fn, const Shape& s) {
    std::mt19937 rng(1234u + s.M * 7 + s.N * 13 + s.K);
    const Vec a = random_vec(static_cast<size_t>(s.M) * s.K, rng);
    const Vec b = random_vec(static_cast<size_t>(s.K) * s.N, rng);
    const Vec c0 = random_vec(static_cast<size_t>(s.M) * s.N, rng);
    std::vector<double> ref(static_cast<size_t>(s.M) * s.N), mag(ref.size());
    for (int i = 0; i < s.M; i++)
        for (int j = 0; j < s.N; j++) {
            double acc = 0, m = 0;
            for (int k = 0; k < s.K; k++) {
                const double p = double(a[size_t(i) * s.K + k]) * b[size_t(k) * s.N + j];
                acc += p;
                m += std::abs(p);
            }
            ref[size_t(i) * s.N + j] = acc;
            mag[size_t(i) * s.N + j] = m;
        }
    constexpr int kPadC = 3;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (bool accumulate : {false, true}) {
                const Stored A = store(a, s.M, s.K, ta, 5), B = store(b, s.K, s.N, tb, 2);
                const long ldc = s.N + kPadC;
                Vec c(static_cast<size_t>(s.M) * ldc, -7.0f);  // -7 marks the padding
                for (int i = 0; i < s.M; i++)
                    for (int j = 0; j < s.N; j++) c[size_t(i) * ldc + j] = c0[size_t(i) * s.N + j];
                fn(s.M, s.N, s.K, A.op(), B.op(), c.data(), ldc, accumulate);
                int bad = 0;
                for (int i = 0; i < s.M && bad < 5; i++) {
                    for (int j = 0; j < s.N && bad < 5; j++) {
                        const double want =
                            ref[size_t(i) * s.N + j] + (accumulate ? c0[size_t(i) * s.N + j] : 0.0);
                        const double got = c[size_t(i) * ldc + j];
                        const double tol = 1e-5 * (mag[size_t(i) * s.N + j] + 1.0) + 1e-6;
                        if (!(std::abs(got - want) <= tol)) {
                            ADD_FAILURE() << name << " M" << s.M << " N" << s.N << " K" << s.K
                                          << " transA=" << ta << " transB=" << tb
                                          << " accumulate=" << accumulate << ": C[" << i << "," << j
                                          << "] = " << got << ", reference " << want;
                            bad++;
                        }
                    }
                    for (int j = s.N; j < ldc; j++)
                        if (c[size_t(i) * ldc + j] != -7.0f) {
                            ADD_FAILURE() << name << ": wrote C's padding at row " << i;
                            bad++;
                        }
                }
            }
}

// Edges of the packed GEMMs' blocking (avx512: MR 12, NR 32, NC <= 384; avx2: MR 6, NR 16,
// NC <= 256; both KC <= 384, MC <= 1536), and long sums (K >= 16 max(M, N)), which are cut into
// K slices: 5 chunks in 3 slices of 2, 2 and 1; 11 chunks in 4 slices; a ragged 389-row C whose
// rows cross the 384-row blocks of a slice.
const Shape kShapes[] = {
    {1, 1, 1},      {5, 7, 3},      {12, 32, 16},  {13, 33, 17},    {11, 31, 15},  {24, 64, 385},
    {37, 100, 800}, {64, 770, 40},  {100, 45, 9},  {1600, 40, 20},  {3, 1000, 64}, {48, 96, 1},
    {29, 389, 769}, {24, 40, 1600}, {6, 16, 4000}, {389, 37, 6300},
};

TEST(CpuGemm, EigenMatchesDoubleReferenceForEveryLayout) {
    for (const Shape& s : kShapes) check_against_reference("gemm_eigen", mt::cpu::gemm_eigen, s);
}

TEST(CpuGemm, PackedMatchesDoubleReferenceForEveryLayout) {
    if (!mt::cpu::gemm_packed_available())
        GTEST_SKIP() << "this CPU ISA level has no packed GEMM (" << mt::cpu::gemm_impl_name()
                     << ")";
    for (const Shape& s : kShapes) check_against_reference("gemm_packed", mt::cpu::gemm_packed, s);
}

// The ladder's first two steps: same contract, same tolerance; gemm_blocked's tiles (32 rows,
// 256 columns, 256 of K) are crossed by the shapes with M > 32, N > 256 and K > 256.
TEST(CpuGemm, NaiveMatchesDoubleReferenceForEveryLayout) {
    for (const Shape& s : kShapes) check_against_reference("gemm_naive", mt::cpu::gemm_naive, s);
}

TEST(CpuGemm, BlockedMatchesDoubleReferenceForEveryLayout) {
    for (const Shape& s : kShapes)
        check_against_reference("gemm_blocked", mt::cpu::gemm_blocked, s);
}

// gemm(impl, ...) runs the step it names: bitwise the named function's result (the steps sum in
// different orders, so a wrong dispatch shows up as differing bits), and refuses a CUDA step.
TEST(CpuGemm, LadderDispatchRunsTheNamedStepAndRefusesCudaSteps) {
    using mt::MatmulImpl;
    std::mt19937 rng(5);
    const int M = 37, N = 300, K = 700;
    const Vec a = random_vec(static_cast<size_t>(M) * K, rng);
    const Vec b = random_vec(static_cast<size_t>(N) * K, rng);
    const GemmOperand A{a.data(), K, false}, B{b.data(), K, true};  // x W^T, the forward's form
    std::vector<std::pair<MatmulImpl, GemmFn>> steps = {
        {MatmulImpl::naive, mt::cpu::gemm_naive},
        {MatmulImpl::blocked, mt::cpu::gemm_blocked},
        {MatmulImpl::blas, mt::cpu::gemm_eigen},
        {MatmulImpl::auto_, mt::cpu::gemm}};
    if (mt::cpu::gemm_packed_available())
        steps.push_back({MatmulImpl::packed, mt::cpu::gemm_packed});
    std::vector<Vec> results;
    for (const auto& [impl, fn] : steps) {
        Vec via_impl(static_cast<size_t>(M) * N), via_fn(via_impl.size());
        mt::cpu::gemm(impl, M, N, K, A, B, via_impl.data(), N, false);
        fn(M, N, K, A, B, via_fn.data(), N, false);
        EXPECT_EQ(via_impl, via_fn) << mt::to_string(impl);
        results.push_back(via_impl);
    }
    EXPECT_NE(results[0], results[1]) << "naive and blocked sum in the same order: the check above "
                                         "could not tell them apart";
    for (MatmulImpl cuda : {MatmulImpl::tiled, MatmulImpl::cublas, MatmulImpl::cublaslt}) {
        Vec c(static_cast<size_t>(M) * N);
        EXPECT_THROW(mt::cpu::gemm(cuda, M, N, K, A, B, c.data(), N, false), std::logic_error);
    }
}

TEST(CpuGemm, ZeroKOverwritesWithZerosOrLeavesAccumulatorAlone) {
    for (GemmFn fn :
         {mt::cpu::gemm_eigen, mt::cpu::gemm, mt::cpu::gemm_naive, mt::cpu::gemm_blocked}) {
        Vec c(6, 3.0f);
        const float dummy = 0;
        fn(2, 3, 0, {&dummy, 1, false}, {&dummy, 1, false}, c.data(), 3, true);
        EXPECT_EQ(c, Vec(6, 3.0f));
        fn(2, 3, 0, {&dummy, 1, false}, {&dummy, 1, false}, c.data(), 3, false);
        EXPECT_EQ(c, Vec(6, 0.0f));
    }
}

// The trainer promises bitwise-identical results for any thread count; the GEMM is most of it.
// The shapes: the packed GEMM cuts C's columns among the threads when N > M and its rows when
// M > N, in pieces whose edges fall inside a register tile for some thread counts; a long sum
// (K >= 16 max(M, N)) is cut into K slices that the threads share.
TEST(CpuGemm, ResultIsBitwiseTheSameForAnyThreadCount) {
    const int saved = omp_get_max_threads();
    for (const Shape s : {Shape{130, 1000, 800}, Shape{1000, 130, 800}, Shape{64, 48, 4000}}) {
        std::mt19937 rng(7);
        const Vec a = random_vec(size_t(s.M) * s.K, rng), b = random_vec(size_t(s.N) * s.K, rng);
        for (GemmFn fn : {mt::cpu::gemm, mt::cpu::gemm_naive, mt::cpu::gemm_blocked}) {
            std::vector<Vec> results;
            for (int threads : {1, 2, 3, 4}) {
                omp_set_num_threads(threads);
                Vec c(size_t(s.M) * s.N, 0.5f);
                fn(s.M, s.N, s.K, {a.data(), s.K, false}, {b.data(), s.K, true}, c.data(), s.N,
                   true);
                results.push_back(std::move(c));
            }
            for (size_t i = 1; i < results.size(); i++)
                EXPECT_EQ(results[i], results[0])
                    << "threads " << i + 1 << " vs 1, M " << s.M << " N " << s.N;
        }
    }
    omp_set_num_threads(saved);
}

// gemm() is bitwise the implementation gemm_impl_name() reports (the two implementations sum in
// different orders, so a wrong dispatch or a wrong name shows up as differing bits).
TEST(CpuGemm, ImplementationNameSaysWhatRuns) {
    const std::string name = mt::cpu::gemm_impl_name();
    const bool packed = name == "packed-avx512" || name == "packed-avx2";
    ASSERT_TRUE(packed || name == "eigen" || name == "eigen+blas") << name;
    EXPECT_EQ(packed, mt::cpu::gemm_packed_available()) << name;
    const GemmFn named = packed ? mt::cpu::gemm_packed : mt::cpu::gemm_eigen;
    std::mt19937 rng(99);
    const int M = 37, N = 70, K = 1000;
    const Vec a = random_vec(static_cast<size_t>(M) * K, rng);
    const Vec b = random_vec(static_cast<size_t>(K) * N, rng);
    Vec via_gemm(static_cast<size_t>(M) * N), via_named(via_gemm.size());
    mt::cpu::gemm(M, N, K, {a.data(), K, false}, {b.data(), N, false}, via_gemm.data(), N, false);
    named(M, N, K, {a.data(), K, false}, {b.data(), N, false}, via_named.data(), N, false);
    EXPECT_EQ(via_gemm, via_named) << "gemm() is not " << name;
    if (mt::cpu::gemm_packed_available()) {  // the two really differ, so the check above can fail
        Vec other(via_gemm.size());
        const GemmFn unnamed =
            named == mt::cpu::gemm_packed ? mt::cpu::gemm_eigen : mt::cpu::gemm_packed;
        unnamed(M, N, K, {a.data(), K, false}, {b.data(), N, false}, other.data(), N, false);
        EXPECT_NE(other, via_gemm);
    }
}

}  // namespace

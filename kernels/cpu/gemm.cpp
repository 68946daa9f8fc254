// The CPU GEMM engine: C (M,N) (+)= A (M,K) B (K,N) in fp32. See gemm.h for the interface.
//
// Almost all of GPT-2's FLOPs are GEMMs (the Linear layers and the LM head), so this file is
// where the CPU step time is decided. The four steps of the kernels.matmul ladder live here side
// by side, in the order a student climbs it: naive, blocked, packed, eigen ("blas"). Each step
// keeps the one before's correctness and removes its bottleneck; configs/labs/kernel_ladder.yaml
// times them inside a training step and docs/labs.md explains each jump with its figures.
//
// gemm_naive — C[i,j] = sum_k A[i,k] B[k,j], one output at a time, threads over rows of C.
//   Nothing is reused on purpose: every multiply-add loads both operands from wherever they
//   are, and for a (K,N) B that is a stride-N walk down a column (a new cache line, often a new
//   page, per element). The scalar sum has one dependency chain (no SIMD, one FMA in flight).
//
// gemm_blocked — the same sum with the loops reordered and tiled for the cache: a KB x NB block
//   of B is reused by all rows of a row block, and the innermost loop is unit-stride so the
//   compiler vectorises it (C row segment += a_ik * B row segment: a broadcast and a vector FMA
//   per 16 floats). For the forward's W^T (B stored transposed) the unit-stride form is a dot
//   product of an A row with a W row instead. Still missing, and what packing adds: the C
//   segment is loaded and stored for every k (no register tile: bound by L1 load/store ports,
//   not FMAs), and B is read with its own stride (TLB and prefetcher misses).
//
// gemm_packed — the BLIS/GotoBLAS recipe, one driver for two register tiles: this file is
//   compiled once per CPU ISA level (cpu_isa.h), and the avx512 level's tile (below, for 32 zmm
//   registers of 16 floats) or the avx2 level's (6x16 in 12 ymm accumulators, see "the avx2
//   level") is the one its compilation gets; the baseline level has none. For AVX-512:
//
//   cut C along its longer side into 2 pieces per thread (threads take these, dynamic schedule);
//   in each piece, one thread alone:
//   for each M block of MC rows                      (A block, MC x KC: lives in L3)
//     for each K chunk of KC                         (the only split of the sum over k)
//       pack A block -> panels of MR=12 rows, k-major: Ap[panel][k][0..11]
//       for each N block of NC columns
//         pack B block -> panels of NR=32 columns, k-major: Bp[panel][k][0..31]  (L2)
//         for each A panel (12 x KC, stays in L1)
//           for each B panel (KC x 32, streamed from L2)
//             micro-kernel: a 12x32 tile of C in 24 zmm accumulators; per k, 2 vector loads
//             of B, 12 broadcasts of A, 24 FMAs (64 flops per cycle per core at 2 FMA pipes)
//
//   Why packing: the micro-kernel then reads both operands as unit-stride streams, whatever the
//   layout of the caller's matrices (X W^T in the forward, dY W and dY^T X in the backward), and
//   each packed element is reused MR or NR times from a cache level that can feed the FMAs.
//   Traffic per micro-kernel call: KC*(12+32)*4 bytes in, 2*12*32*KC flops out, i.e. 4.4
//   flops per byte from L1/L2, and C is read and written once per K chunk.
//   The transposed operands (W (OC,C) read as W^T in the forward, dY (N,OC) as dY^T) are packed
//   with 16x16 in-register transposes, so no operand is ever read with a large stride one float
//   at a time.
//
//   Determinism: the sum over k is split into chunks that depend only on K, and inside a chunk
//   the micro-kernel adds in k order; threads only split M and N. So the result is bitwise the
//   same for any thread count. Threads share nothing and never wait for each other inside a
//   GEMM: a piece that cuts the rows packs all of B, one that cuts the columns all of A, and the
//   longer side is cut so that the operand every piece packs whole is the smaller. A long sum
//   (K >= 16 max(M, N): the LM head's dY W) is the exception: there both operands are long, so
//   the K chunks are grouped into up to 4 slices fixed by the shape, one piece each, whose
//   partial products are added to C in slice order (long_sum).
//   Memory: each thread packs into two buffers of its own (thread_local, fixed maximum sizes,
//   obtained once on the thread's first GEMM and reused for the life of the thread); no GEMM
//   allocates after that.
//
// gemm_eigen — Eigen's GEMM (itself cache-blocked and packed, with a generic SIMD kernel) on
//   shape-determined pieces of C, one single-threaded Eigen GEMM per piece. Eigen's own parallel
//   GEMM makes the threads share packed panels and spin at every panel, which on 2 cores measured
//   1.3-1.7x slower for the LM-head shapes. The baseline level's GEMM, and the peer
//   bench/cpu_gemm.cpp compares gemm_packed with (Eigen compiled for the same level).
#include "kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

// First: it keeps GCC 12's false uninitialized warnings out of the intrinsic headers.
#include "kernels/cpu/eigen_core.h"
#include "kernels/huge_pages.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mt::cpu::MT_CPU_LEVEL_NS {
namespace {

// Zeroes C (M,N) for the K = 0 product.
void zero_rows(float* C, long ldc, int M, int N) {
    for (int i = 0; i < M; i++) std::fill_n(C + i * ldc, N, 0.0f);
}

// Logical A[i,k] and B[k,j] of an operand, whatever its storage.
inline float at_a(const GemmOperand& A, long i, long k) {
    return A.transposed ? A.data[k * A.ld + i] : A.data[i * A.ld + k];
}
inline float at_b(const GemmOperand& B, long k, long j) {
    return B.transposed ? B.data[j * B.ld + k] : B.data[k * B.ld + j];
}

// gemm_blocked's tiles: a row block of C is one thread's; a B block of kBlockK x kBlockN floats
// (256 x 256 x 4 = 256 KiB) stays in L2 while all kBlockM rows use it.
constexpr int kBlockM = 32, kBlockK = 256, kBlockN = 256;

// C rows [i0, i1), columns [j0, j1) (+)= A B over k in [k0, k1), the axpy form: for each
// (i, k), C[i, j0:j1] += A[i,k] B[k, j0:j1] (unit stride in j when B is stored (K,N)).
void blocked_axpy(const GemmOperand& A, const GemmOperand& B, float* C, long ldc, int i0, int i1,
                  int j0, int j1, int k0, int k1) {
    for (int i = i0; i < i1; i++) {
        float* c = C + i * ldc;
        for (int k = k0; k < k1; k++) {
            const float aik = at_a(A, i, k);
            if (B.transposed) {
                for (int j = j0; j < j1; j++) c[j] += aik * at_b(B, k, j);
            } else {
                const float* b = B.data + static_cast<long>(k) * B.ld;
#pragma omp simd
                for (int j = j0; j < j1; j++) c[j] += aik * b[j];
            }
        }
    }
}

// The dot form for A stored (M,K) and B stored transposed (N,K), the forward's x W^T: C[i,j] +=
// A[i, k0:k1] . W[j, k0:k1], both rows unit-stride (the vectorised sum runs in a fixed order).
void blocked_dot(const GemmOperand& A, const GemmOperand& B, float* C, long ldc, int i0, int i1,
                 int j0, int j1, int k0, int k1) {
    for (int i = i0; i < i1; i++) {
        const float* a = A.data + i * A.ld;
        float* c = C + i * ldc;
        for (int j = j0; j < j1; j++) {
            const float* w = B.data + static_cast<long>(j) * B.ld;
            float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
            for (int k = k0; k < k1; k++) acc += a[k] * w[k];
            c[j] += acc;
        }
    }
}

// ---- gemm_eigen -------------------------------------------------------------------------------

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using CMap = Eigen::Map<const RowMat, 0, Stride>;
using Map = Eigen::Map<RowMat, 0, Stride>;

// Calls f with the Eigen expression for rows [r0, r0+nr) of logical A (M,K).
template <class F>
void with_a_rows(GemmOperand A, int r0, int nr, int K, F f) {
    if (A.transposed)
        f(CMap(A.data + r0, K, nr, Stride(A.ld)).transpose());
    else
        f(CMap(A.data + r0 * A.ld, nr, K, Stride(A.ld)));
}

// Calls f with the Eigen expression for columns [c0, c0+nc) of logical B (K,N).
template <class F>
void with_b_cols(GemmOperand B, int c0, int nc, int K, F f) {
    if (B.transposed)
        f(CMap(B.data + c0 * B.ld, nc, K, Stride(B.ld)).transpose());
    else
        f(CMap(B.data + c0, K, nc, Stride(B.ld)));
}

// Runs block(r0, nr, c0, nc) over a partition of the (rows, cols) output into pieces along its
// longer side: up to 8 pieces, each a multiple of 16 long (column pieces start on a 64-byte
// boundary) and at least 64, fewer when the side is short. The pieces depend only on the shape.
template <class Block>
void parallel_pieces(int rows, int cols, Block block) {
    constexpr int kMaxPieces = 8, kMinPiece = 64, kAlign = 16;
    const bool by_rows = rows >= cols;
    const int n = by_rows ? rows : cols;
    int step = (n + kMaxPieces - 1) / kMaxPieces;
    step = std::max(kMinPiece, (step + kAlign - 1) / kAlign * kAlign);
    const int pieces = (n + step - 1) / step;
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pieces; p++) {
        const int a = p * step, len = std::min(n, a + step) - a;
        if (by_rows)
            block(a, len, 0, cols);
        else
            block(0, rows, a, len);
    }
}

}  // namespace

void gemm_eigen(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) zero_rows(C, ldc, M, N);
        return;
    }
    parallel_pieces(M, N, [&](int r0, int nr, int c0, int nc) {
        Map c(C + r0 * ldc + c0, nr, nc, Stride(ldc));
        with_a_rows(A, r0, nr, K, [&](const auto& a) {
            with_b_cols(B, c0, nc, K, [&](const auto& b) {
                if (accumulate)
                    c.noalias() += a * b;
                else
                    c.noalias() = a * b;
            });
        });
    });
}

// ---- gemm_naive, gemm_blocked ------------------------------------------------------------------

void gemm_naive(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                bool accumulate) {
    if (M <= 0 || N <= 0) return;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += at_a(A, i, k) * at_b(B, k, j);
            float& c = C[i * ldc + j];
            c = accumulate ? c + acc : acc;
        }
}

void gemm_blocked(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                  bool accumulate) {
    if (M <= 0 || N <= 0) return;
    const bool dot_form = B.transposed && !A.transposed;
    const int row_blocks = (M + kBlockM - 1) / kBlockM;
#pragma omp parallel for schedule(static)
    for (int rb = 0; rb < row_blocks; rb++) {
        const int i0 = rb * kBlockM, i1 = std::min(M, i0 + kBlockM);
        if (!accumulate)
            for (int i = i0; i < i1; i++) std::fill_n(C + i * ldc, N, 0.0f);
        for (int j0 = 0; j0 < N; j0 += kBlockN) {
            const int j1 = std::min(N, j0 + kBlockN);
            for (int k0 = 0; k0 < K; k0 += kBlockK) {  // k blocks in order: deterministic
                const int k1 = std::min(K, k0 + kBlockK);
                if (dot_form)
                    blocked_dot(A, B, C, ldc, i0, i1, j0, j1, k0, k1);
                else
                    blocked_axpy(A, B, C, ldc, i0, i1, j0, j1, k0, k1);
            }
        }
    }
}

// ---- gemm_packed --------------------------------------------------------------------------------

#if defined(__AVX2__) || defined(__AVX512F__)
namespace {

// Packing a panel of an A stored (M,K) (dY in the backward's dY W: the LM head's (B*T, Vp)
// logit gradient, 200 KiB a row) reads kc floats from each of the panel's rows: short streams
// far apart, which the hardware prefetcher barely starts on before they end, so the pack waits
// on DRAM. Each step of 16 k therefore also asks for the same line of each row of the next
// panel, one panel ahead (the LM head's dY W on 2 cores, avx2: 3-5 % faster; bench/README.md,
// "The LM head's backward"). Prefetches never fault.
inline void prefetch_next_rows(GemmOperand A, int i, int rows, int k) {
    for (int r = 0; r < rows; r++)
        _mm_prefetch(reinterpret_cast<const char*>(A.data + static_cast<long>(i + r) * A.ld + k),
                     _MM_HINT_T0);
}

}  // namespace
#endif

#if defined(__AVX512F__)

// ---- the avx512 level: 12x32 tile, 24 zmm accumulators ---------------------------------------

#define MT_GEMM_PACKED_NAME "packed-avx512"

namespace {

constexpr int kMR = 12;       // rows of the register tile (A broadcasts)
constexpr int kNR = 32;       // columns of the register tile (two zmm of B)
constexpr int kKCMax = 384;   // K chunk: an A panel is 12*384*4 = 18 KiB (L1 is 48 KiB)
constexpr int kNCMax = 384;   // N block: a packed B block is 384*384*4 = 576 KiB (L2 is 1 MiB)
constexpr int kMCMax = 1536;  // M block: a packed A block is 1536*384*4 = 2.25 MiB (in L3)
static_assert(kMCMax % kMR == 0 && kNCMax % kNR == 0);

// Lanes [0, n) set; none for n <= 0, all for n >= 16.
inline __mmask16 first_lanes(int n) {
    if (n <= 0) return 0;
    return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// In-register transpose of a 16x16 block: r[i] lane j  ->  r[j] lane i.
// Stage 1 interleaves pairs of rows (unpack), stage 2 builds 4x4 transposes inside each 128-bit
// lane (shuffle), stages 3-4 move the 128-bit lanes to their final rows (shuffle_f32x4).
inline void transpose16x16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g+c], 128-bit lane L: column 4L+c of rows 4g..4g+3.
    for (int g = 0; g < 4; g++) {
        r[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        const __m512 v0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);  // lanes 0,2 of groups 0,1
        const __m512 v1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);  // lanes 1,3 of groups 0,1
        const __m512 w0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        const __m512 w1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(v0, w0, 0x88);       // column c
        t[8 + c] = _mm512_shuffle_f32x4(v0, w0, 0xDD);   // column 8+c
        t[4 + c] = _mm512_shuffle_f32x4(v1, w1, 0x88);   // column 4+c
        t[12 + c] = _mm512_shuffle_f32x4(v1, w1, 0xDD);  // column 12+c
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

// Packs rows [i0, i0+mr) x k [p0, p0+kc) of logical A into one panel: dst[k*12 + i], rows
// beyond mr zero (the micro-kernel always computes 12 rows; the store drops the padding).
// next_mr: rows of the next panel (0: none), whose lines it prefetches (see prefetch_next_rows).
void pack_a_panel(float* dst, GemmOperand A, int i0, int mr, int next_mr, int p0, int kc) {
    constexpr __mmask16 kPanel = (1u << kMR) - 1u;
    if (A.transposed) {  // A stored (K,M): the 12 values for one k are contiguous
        const __mmask16 rows = first_lanes(mr);
        for (int k = 0; k < kc; k++) {
            const __m512 v = _mm512_maskz_loadu_ps(rows, A.data + (p0 + k) * A.ld + i0);
            _mm512_mask_storeu_ps(dst + k * kMR, kPanel, v);
        }
        return;
    }
    // A stored (M,K): load 16 k from each row, transpose, store 12 lanes per k.
    for (int k0 = 0; k0 < kc; k0 += 16) {
        prefetch_next_rows(A, i0 + kMR, next_mr, p0 + k0);
        const int kk = std::min(16, kc - k0);
        const __mmask16 kmask = first_lanes(kk);
        __m512 r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < mr ? _mm512_maskz_loadu_ps(kmask, A.data + (i0 + i) * A.ld + p0 + k0)
                          : _mm512_setzero_ps();
        transpose16x16(r);
        for (int t = 0; t < kk; t++) _mm512_mask_storeu_ps(dst + (k0 + t) * kMR, kPanel, r[t]);
    }
}

// Packs columns [j0, j0+nr) x k [p0, p0+kc) of logical B into one panel: dst[k*32 + j] (dst is
// 64-byte aligned), columns beyond nr zero.
void pack_b_panel(float* dst, GemmOperand B, int j0, int nr, int p0, int kc) {
    if (!B.transposed) {  // B stored (K,N): the 32 values for one k are contiguous
        const __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);
        for (int k = 0; k < kc; k++) {
            const float* src = B.data + (p0 + k) * B.ld + j0;
            _mm512_store_ps(dst + k * kNR, _mm512_maskz_loadu_ps(m0, src));
            _mm512_store_ps(dst + k * kNR + 16, _mm512_maskz_loadu_ps(m1, src + 16));
        }
        return;
    }
    // B stored (N,K) (a PyTorch weight read as W^T): 16 columns at a time, 16 k per transpose.
    for (int h = 0; h < 2; h++) {
        const int cols = std::clamp(nr - 16 * h, 0, 16);
        for (int k0 = 0; k0 < kc; k0 += 16) {
            const int kk = std::min(16, kc - k0);
            const __mmask16 kmask = first_lanes(kk);
            __m512 r[16];
            for (int j = 0; j < 16; j++)
                r[j] = j < cols ? _mm512_maskz_loadu_ps(kmask,
                                                        B.data + (j0 + 16 * h + j) * B.ld + p0 + k0)
                                : _mm512_setzero_ps();
            transpose16x16(r);
            for (int t = 0; t < kk; t++) _mm512_store_ps(dst + (k0 + t) * kNR + 16 * h, r[t]);
        }
    }
}

// 16 int8 values from p (n < 16: the first n, the rest 0) as 16 fp32 lanes times `scale`.
inline __m512 load16_i8_scaled(const int8_t* p, int n, __m512 scale) {
    __m128i bytes;
    if (n >= 16) {
        bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {
        alignas(16) int8_t tail[16] = {};
        std::copy(p, p + std::max(n, 0), tail);
        bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)), scale);
}

// pack_b_panel for an int8 B: the same panel layout, each value converted to fp32 and scaled
// as it is packed, so the micro-kernel runs unchanged on the dequantised panel.
void pack_b_panel(float* dst, GemmInt8Operand B, int j0, int nr, int p0, int kc) {
    if (!B.transposed) {  // S (K,N): the 32 values for one k are contiguous, scale[k]
        for (int k = 0; k < kc; k++) {
            const int8_t* src = B.q + (p0 + k) * B.ld + j0;
            const __m512 s = _mm512_set1_ps(B.scale[p0 + k]);
            _mm512_store_ps(dst + k * kNR, load16_i8_scaled(src, std::min(nr, 16), s));
            _mm512_store_ps(dst + k * kNR + 16, load16_i8_scaled(src + 16, nr - 16, s));
        }
        return;
    }
    // S (N,K), a weight (OC,C): row j of S is column j of B, scaled by scale[j]; 16 k per
    // transpose as in the fp32 packing.
    for (int h = 0; h < 2; h++) {
        const int cols = std::clamp(nr - 16 * h, 0, 16);
        for (int k0 = 0; k0 < kc; k0 += 16) {
            const int kk = std::min(16, kc - k0);
            __m512 r[16];
            for (int j = 0; j < 16; j++) {
                const long row = j0 + 16 * h + j;
                r[j] = j < cols ? load16_i8_scaled(B.q + row * B.ld + p0 + k0, kk,
                                                   _mm512_set1_ps(B.scale[row]))
                                : _mm512_setzero_ps();
            }
            transpose16x16(r);
            for (int t = 0; t < kk; t++) _mm512_store_ps(dst + (k0 + t) * kNR + 16 * h, r[t]);
        }
    }
}

// The register tile: C[0..mr) x [0..nr) (+)= Ap (12 x kc) Bp (kc x 32).
// 24 accumulators + 2 B vectors + 1 broadcast = 27 of the 32 zmm registers; per k, 2 loads and
// 12 broadcast-FMA pairs keep both FMA pipes busy (the 24 independent chains hide the 4-cycle
// FMA latency).
void micro_kernel_12x32(int kc, const float* __restrict ap, const float* __restrict bp,
                        float* __restrict c, long ldc, int mr, int nr, bool accumulate) {
    __m512 acc[kMR][2];
#pragma GCC unroll 12
    for (int i = 0; i < kMR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int i = 0; i < mr; i++) {  // C's tile is needed at the end: start fetching it now
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + kNR - 1), _MM_HINT_T0);
    }
#pragma GCC unroll 2
    for (int k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll 12
        for (int i = 0; i < kMR; i++) {
            const __m512 a = _mm512_set1_ps(ap[i]);
            acc[i][0] = _mm512_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);
        }
        ap += kMR;
        bp += kNR;
    }
    if (mr == kMR && nr == kNR) {
#pragma GCC unroll 12
        for (int i = 0; i < kMR; i++) {
            float* row = c + i * ldc;
            if (accumulate) {
                acc[i][0] = _mm512_add_ps(_mm512_loadu_ps(row), acc[i][0]);
                acc[i][1] = _mm512_add_ps(_mm512_loadu_ps(row + 16), acc[i][1]);
            }
            _mm512_storeu_ps(row, acc[i][0]);
            _mm512_storeu_ps(row + 16, acc[i][1]);
        }
        return;
    }
    const __mmask16 m0 = first_lanes(nr), m1 = first_lanes(nr - 16);
#pragma GCC unroll 12
    for (int i = 0; i < kMR; i++) {
        if (i >= mr) break;
        float* row = c + i * ldc;
        if (accumulate) {
            acc[i][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), acc[i][0]);
            acc[i][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), acc[i][1]);
        }
        _mm512_mask_storeu_ps(row, m0, acc[i][0]);
        _mm512_mask_storeu_ps(row + 16, m1, acc[i][1]);
    }
}

constexpr auto micro_kernel = micro_kernel_12x32;

}  // namespace

#elif defined(__AVX2__) && defined(__FMA__)

// ---- the avx2 level: 6x16 tile, 12 ymm accumulators -----------------------------------------
// The same recipe on 16 ymm registers of 8 floats (BLIS's Haswell kernel shape): a 6x16 tile of C
// in 12 accumulators + 2 B vectors + 1 broadcast = 15 of the 16 registers; per k, 2 loads of B,
// 6 broadcasts of A and 12 FMAs. 12 independent chains cover the FMA latency (4-5 cycles) of 2
// FMA pipes. The packing reads each source unit-stride and transposes 8x8 blocks in registers
// where the panel's order is the source's transpose, as the avx512 level does with 16x16 ones.
// (Plain C++ packing loops, which the compiler left scalar, took 12 % of a gpt2-mini step's
// cycles against 8 % for the avx512 level's.)

#define MT_GEMM_PACKED_NAME "packed-avx2"

namespace {

constexpr int kMR = 6;        // rows of the register tile (A broadcasts)
constexpr int kNR = 16;       // columns of the register tile (two ymm of B)
constexpr int kKCMax = 384;   // K chunk: an A panel is 6*384*4 = 9 KiB, a B panel 24 KiB (L1)
constexpr int kNCMax = 256;   // N block: a packed B block is 384*256*4 = 384 KiB (L2: 512 KiB+)
constexpr int kMCMax = 1536;  // M block: a packed A block is 1536*384*4 = 2.25 MiB (in L3)
static_assert(kMCMax % kMR == 0 && kNCMax % kNR == 0);

// Lanes [0, n) of an AVX2 load mask (all lanes for n >= 8, none for n <= 0): vmaskmovps loads
// only those, the others read as 0 and never fault, so a panel's edge needs no scalar loop.
inline __m256i first_lanes8(int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(std::clamp(n, 0, 8)), lane);
}

// In-register transpose of an 8x8 block: r[i] lane j  ->  r[j] lane i (unpack pairs of rows,
// shuffle 4x4 blocks inside the 128-bit halves, then swap the halves).
inline void transpose8x8(__m256 r[8]) {
    __m256 t[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    __m256 u[8];
    for (int g = 0; g < 2; g++) {
        u[4 * g + 0] = _mm256_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 1] = _mm256_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);      // low halves: column c
        r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);  // high halves: column 4+c
    }
}

// Packs rows [i0, i0+mr) x k [p0, p0+kc) of logical A into one panel: dst[k*6 + i], rows beyond
// mr zero (the micro-kernel always computes 6 rows; the store drops the padding). Each k's 6
// values are written as one 8-lane store whose last 2 lanes the next k overwrites: the buffer
// has a spare line past its end for the final one (PackBuffer). next_mr: rows of the next panel
// (0: none), whose lines it prefetches (see prefetch_next_rows).
void pack_a_panel(float* dst, GemmOperand A, int i0, int mr, int next_mr, int p0, int kc) {
    if (A.transposed) {  // A stored (K,M): the 6 values for one k are contiguous
        const __m256i rows = first_lanes8(mr);
        for (int k = 0; k < kc; k++)
            _mm256_storeu_ps(
                dst + k * kMR,
                _mm256_maskload_ps(A.data + static_cast<long>(p0 + k) * A.ld + i0, rows));
        return;
    }
    // A stored (M,K): 8 k from each of the 6 rows (2 zero rows), transposed to 8 k-vectors.
    for (int k0 = 0; k0 < kc; k0 += 8) {
        if (k0 % 16 == 0) prefetch_next_rows(A, i0 + kMR, next_mr, p0 + k0);
        const int kk = std::min(8, kc - k0);
        const __m256i kmask = first_lanes8(kk);
        __m256 r[8];
        for (int i = 0; i < 8; i++)
            r[i] = i < mr ? _mm256_maskload_ps(A.data + static_cast<long>(i0 + i) * A.ld + p0 + k0,
                                               kmask)
                          : _mm256_setzero_ps();
        transpose8x8(r);
        for (int t = 0; t < kk; t++) _mm256_storeu_ps(dst + (k0 + t) * kMR, r[t]);
    }
}

// Packs columns [j0, j0+nr) x k [p0, p0+kc) of logical B into one panel: dst[k*16 + j] (dst is
// 32-byte aligned), columns beyond nr zero.
void pack_b_panel(float* dst, GemmOperand B, int j0, int nr, int p0, int kc) {
    if (!B.transposed) {  // B stored (K,N): the 16 values for one k are contiguous
        const __m256i m0 = first_lanes8(nr), m1 = first_lanes8(nr - 8);
        for (int k = 0; k < kc; k++) {
            const float* src = B.data + static_cast<long>(p0 + k) * B.ld + j0;
            _mm256_store_ps(dst + k * kNR, _mm256_maskload_ps(src, m0));
            _mm256_store_ps(dst + k * kNR + 8, _mm256_maskload_ps(src + 8, m1));
        }
        return;
    }
    // B stored (N,K) (a PyTorch weight read as W^T): 8 columns at a time, 8 k per transpose.
    for (int h = 0; h < 2; h++) {
        const int cols = std::clamp(nr - 8 * h, 0, 8);
        for (int k0 = 0; k0 < kc; k0 += 8) {
            const int kk = std::min(8, kc - k0);
            const __m256i kmask = first_lanes8(kk);
            __m256 r[8];
            for (int j = 0; j < 8; j++)
                r[j] = j < cols
                           ? _mm256_maskload_ps(
                                 B.data + static_cast<long>(j0 + 8 * h + j) * B.ld + p0 + k0, kmask)
                           : _mm256_setzero_ps();
            transpose8x8(r);
            for (int t = 0; t < kk; t++) _mm256_store_ps(dst + (k0 + t) * kNR + 8 * h, r[t]);
        }
    }
}

// The int8 B, packed by plain C++ the compiler vectorises where it can (model.quantize_frozen
// only): the same panel layout, columns beyond nr zero. `at(k, j)` reads logical B (k, j
// within the panel); `by_rows_of_k` says which loop order reads the source unit-stride.
template <class At>
void pack_b_panel_with(float* dst, int nr, int kc, bool by_rows_of_k, At at) {
    if (by_rows_of_k) {  // S (K,N): the 16 values for one k are contiguous
        for (int k = 0; k < kc; k++)
            for (int j = 0; j < kNR; j++) dst[k * kNR + j] = j < nr ? at(k, j) : 0.0f;
        return;
    }
    for (int j = 0; j < kNR; j++)  // S (N,K), a weight read as W^T: row j unit-stride
        for (int k = 0; k < kc; k++) dst[k * kNR + j] = j < nr ? at(k, j) : 0.0f;
}

// Each int8 value converted to fp32 and scaled as it is packed (the scale of the stored row: per
// k for S (K,N), per column j for S (N,K)).
void pack_b_panel(float* dst, GemmInt8Operand B, int j0, int nr, int p0, int kc) {
    pack_b_panel_with(dst, nr, kc, !B.transposed, [&](int k, int j) {
        const long kk = p0 + k, jj = j0 + j;
        const long row = B.transposed ? jj : kk, col = B.transposed ? kk : jj;
        return static_cast<float>(B.q[row * B.ld + col]) * B.scale[row];
    });
}

// The register tile: C[0..mr) x [0..nr) (+)= Ap (6 x kc) Bp (kc x 16), summed in k order from
// zero, then added to C: the same order as the avx512 kernel's, whatever the tile's position.
void micro_kernel_6x16(int kc, const float* __restrict ap, const float* __restrict bp,
                       float* __restrict c, long ldc, int mr, int nr, bool accumulate) {
    __m256 acc[kMR][2];
#pragma GCC unroll 6
    for (int i = 0; i < kMR; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int i = 0; i < mr; i++)  // C's tile is needed at the end: start fetching it now
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int k = 0; k < kc; k++) {
        const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
#pragma GCC unroll 6
        for (int i = 0; i < kMR; i++) {
            const __m256 a = _mm256_broadcast_ss(ap + i);
            acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
        }
        ap += kMR;
        bp += kNR;
    }
    if (mr == kMR && nr == kNR) {
#pragma GCC unroll 6
        for (int i = 0; i < kMR; i++) {
            float* row = c + i * ldc;
            if (accumulate) {
                acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(row), acc[i][0]);
                acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(row + 8), acc[i][1]);
            }
            _mm256_storeu_ps(row, acc[i][0]);
            _mm256_storeu_ps(row + 8, acc[i][1]);
        }
        return;
    }
    // An edge tile: through a buffer, the same adds per element. Every accumulator is stored
    // with a constant index (an unrolled loop), so the compiler keeps them all in registers in
    // the k loop; an acc[i] read with a run-time i would make it keep a copy on the stack and
    // store all 12 there on every k (measured: half the speed).
    alignas(32) float t[kMR][kNR];
#pragma GCC unroll 6
    for (int i = 0; i < kMR; i++) {
        _mm256_store_ps(t[i], acc[i][0]);
        _mm256_store_ps(t[i] + 8, acc[i][1]);
    }
    for (int i = 0; i < mr; i++) {
        float* row = c + i * ldc;
        for (int j = 0; j < nr; j++) row[j] = accumulate ? row[j] + t[i][j] : t[i][j];
    }
}

constexpr auto micro_kernel = micro_kernel_6x16;

}  // namespace

#endif

#if defined(MT_GEMM_PACKED_NAME)

// ---- the packed driver, for either level's tile ------------------------------------------------

namespace {

// A 64-byte aligned float buffer of a fixed size, obtained on first use. One per thread.
class PackBuffer {
  public:
    explicit PackBuffer(size_t floats) : floats_(floats) {}
    PackBuffer(const PackBuffer&) = delete;
    PackBuffer& operator=(const PackBuffer&) = delete;
    ~PackBuffer() { std::free(p_); }
    float* get() {
        if (!p_) {
            // One spare line that a packing's last overlapping vector store may write into; the
            // A block (2.25 MiB) lands on huge pages (kernels/huge_pages.h).
            constexpr size_t kAlign = 64;
            p_ =
                static_cast<float*>(allocate_host_buffer(floats_ * sizeof(float) + kAlign, kAlign));
            if (!p_) throw std::bad_alloc();
        }
        return p_;
    }

  private:
    size_t floats_;
    float* p_ = nullptr;
};

float* a_pack_buffer() {
    thread_local PackBuffer buf(static_cast<size_t>(kMCMax) * kKCMax);
    return buf.get();
}
float* b_pack_buffer() {
    thread_local PackBuffer buf(static_cast<size_t>(kKCMax) * kNCMax);
    return buf.get();
}

inline int ceil_div(int a, int b) {
    return (a + b - 1) / b;
}

// Pieces of C per thread in gemm_packed (see gemm_packed_impl). Measured on 2 cores
// (bench/cpu_gemm, the step's GEMMs): 1, 2 and 4 within noise on a quiet machine; with a
// neighbour burning one core, 2 was 2-6 % faster than 1 and 4 (which packs more twice).
constexpr int kPiecesPerThread = 2;

}  // namespace

bool gemm_packed_available() {
    return true;
}

namespace {

// The three steps both loop nests below are made of. Blocks are packed panel by panel, in order
// (the avx2 packing's overlapping stores rely on it); an A block's row count is a multiple of kMR
// except at the end of C, so a panel never straddles two blocks.

// Rows [i0, i0+mcur) x k [p0, p0+kc) of A into the A block, each panel prefetching the next's rows.
inline void pack_a_block(float* apack, GemmOperand A, int i0, int mcur, int p0, int kc) {
    for (int ip = 0; ip < ceil_div(mcur, kMR); ip++)
        pack_a_panel(apack + ip * kMR * kc, A, i0 + ip * kMR, std::min(kMR, mcur - ip * kMR),
                     std::clamp(mcur - (ip + 1) * kMR, 0, kMR), p0, kc);
}

// Columns [j0, j0+ncur) x k [p0, p0+kc) of B into the B block.
template <class BOp>
void pack_b_block(float* bpack, BOp B, int j0, int ncur, int p0, int kc) {
    for (int q = 0; q < ceil_div(ncur, kNR); q++)
        pack_b_panel(bpack + q * kNR * kc, B, j0 + q * kNR, std::min(kNR, ncur - q * kNR), p0, kc);
}

// C (mcur, ncur) at c (+)= the packed A block times the packed B block: every A panel (L1)
// against every B panel (streamed from L2).
void multiply_blocks(int mcur, int ncur, int kc, const float* apack, const float* bpack, float* c,
                     long ldc, bool accumulate) {
    for (int ip = 0; ip < ceil_div(mcur, kMR); ip++)
        for (int q = 0; q < ceil_div(ncur, kNR); q++)
            micro_kernel(kc, apack + ip * kMR * kc, bpack + q * kNR * kc,
                         c + static_cast<long>(ip) * kMR * ldc + q * kNR, ldc,
                         std::min(kMR, mcur - ip * kMR), std::min(kNR, ncur - q * kNR), accumulate);
}

// One thread's share of the product: rows [i_begin, i_end) x columns [j_begin, j_end) of C, the
// BLIS loop nest on this thread's own packed A block (MC x KC, L3) and B block (KC x NC, L2).
// Nothing is shared with the other threads, so nothing waits for them.
template <class BOp>
void packed_piece(int i_begin, int i_end, int j_begin, int j_end, int K, int kc_step, GemmOperand A,
                  BOp B, float* C, long ldc, bool accumulate) {
    float* const apack = a_pack_buffer();
    float* const bpack = b_pack_buffer();
    for (int i0 = i_begin; i0 < i_end; i0 += kMCMax) {
        const int mcur = std::min(kMCMax, i_end - i0);
        for (int p0 = 0; p0 < K; p0 += kc_step) {
            const int kc = std::min(K, p0 + kc_step) - p0;
            pack_a_block(apack, A, i0, mcur, p0, kc);
            for (int j0 = j_begin; j0 < j_end; j0 += kNCMax) {
                const int ncur = std::min(kNCMax, j_end - j0);
                pack_b_block(bpack, B, j0, ncur, p0, kc);
                multiply_blocks(mcur, ncur, kc, apack, bpack, C + i0 * ldc + j0, ldc,
                                accumulate || p0 > 0);
            }
        }
    }
}

// A long sum (K far longer than both sides of C: the LM head's dY W, (B*T, Vp) x (Vp, C)) cut
// by rows would make every piece pack all of B (W: 50 MiB, 4 times on 2 threads x 2 pieces,
// 25 Mcycles a thread for B's packing alone). Instead the sum over k is cut into up to
// kLongSumSlices slices of whole K chunks, one piece each, that pack disjoint parts of A and B;
// slice 0 accumulates into C, the others write partial products that are then added to C in
// slice order. The slices depend on the shape alone, so the result still does not depend on the
// thread count (it differs in rounding from the unsliced sum; both are within the float bound).
// Measured on dY W (avx2, 2 cores): B's packing 6 instead of 25 Mcycles a thread, the GEMM 3-4 %
// faster than cut by rows (bench/README.md, "The LM head's backward"). Only for N <= kNCMax (one
// B block per K chunk), so the levels may differ for 256 < N <= 384; they promise no bitwise
// agreement (tests/test_cpu_isa.cpp).
constexpr int kLongSumSlices = 4;
constexpr long kLongSumMaxOutputs = 1l << 20;  // M*N of a sliced product: 12 MiB of partials
constexpr int kLongSumRows = 384;              // rows of A packed at a time (576 KiB, L2)

float* long_sum_partials() {
    thread_local PackBuffer buf(static_cast<size_t>(kLongSumSlices - 1) * kLongSumMaxOutputs);
    return buf.get();
}

// Number of K slices for C (M,N) (+)= A B over K, 1 when the sum is not long. K chunks are
// kc_step long; a slice is a run of whole chunks, and no slice is empty.
int long_sum_slices(int M, int N, int K, int kchunks) {
    if (K < 16 * std::max(M, N) || N > kNCMax || static_cast<long>(M) * N > kLongSumMaxOutputs ||
        kchunks < kLongSumSlices)
        return 1;
    return ceil_div(kchunks, ceil_div(kchunks, kLongSumSlices));
}

// One slice: C (M,N) (+)= A[:, k_begin:k_end) B[k_begin:k_end, :), N <= kNCMax. The BLIS order
// for a long sum: for each K chunk, B (KC x N) packed once into L2; then A in blocks of
// kLongSumRows rows, each packed and multiplied by all of B. C is read and written once per K
// chunk (from L3: 1 MiB for the LM head), the price of packing B once.
template <class BOp>
void long_sum_slice(int M, int N, int k_begin, int k_end, int kc_step, GemmOperand A, BOp B,
                    float* C, long ldc, bool accumulate) {
    float* const apack = a_pack_buffer();
    float* const bpack = b_pack_buffer();
    for (int p0 = k_begin; p0 < k_end; p0 += kc_step) {
        const int kc = std::min(k_end, p0 + kc_step) - p0;
        pack_b_block(bpack, B, 0, N, p0, kc);
        for (int i0 = 0; i0 < M; i0 += kLongSumRows) {
            const int mcur = std::min(kLongSumRows, M - i0);
            pack_a_block(apack, A, i0, mcur, p0, kc);
            multiply_blocks(mcur, N, kc, apack, bpack, C + i0 * ldc, ldc,
                            accumulate || p0 > k_begin);
        }
    }
}

// The sliced product: the slices in parallel (dynamic: a thread that lost its core hands its
// share to the others), then C += partial 1, 2, ... in that order, rows in parallel.
template <class BOp>
void long_sum(int M, int N, int K, int kchunks, int kc_step, int slices, int threads, GemmOperand A,
              BOp B, float* C, long ldc, bool accumulate) {
    const int per_slice = ceil_div(kchunks, slices);
    float* const partials = long_sum_partials();
    const long plane = static_cast<long>(M) * N;
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min(threads, slices))
    for (int s = 0; s < slices; s++) {
        const int k0 = s * per_slice * kc_step, k1 = std::min(K, (s + 1) * per_slice * kc_step);
        if (s == 0)
            long_sum_slice(M, N, k0, k1, kc_step, A, B, C, ldc, accumulate);
        else
            long_sum_slice(M, N, k0, k1, kc_step, A, B, partials + (s - 1) * plane, N, false);
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int i = 0; i < M; i++) {
        float* c = C + i * ldc;
        for (int s = 1; s < slices; s++) {
            const float* part = partials + (s - 1) * plane + static_cast<long>(i) * N;
#pragma omp simd
            for (int j = 0; j < N; j++) c[j] += part[j];
        }
    }
}

// The packed GEMM for a B operand of type BOp (fp32 GemmOperand, or GemmInt8Operand whose
// panels are dequantised as they are packed).
//
// Threads: C is cut along its longer side into pieces, one packed_piece each, with no barrier
// anywhere. Cutting the rows makes every piece pack all of B (K x N), cutting the columns all of
// A (M x K): the longer side is cut so the operand packed more than once is the smaller one.
// kPiecesPerThread pieces per thread, taken dynamically, let a thread that lost its core to
// another process hand part of its share to the others. (The first version shared one packed A
// block between the threads, with two barriers per K chunk: the step's GEMMs ran 1.50x faster on
// 2 threads than on 1, and 10-25 % slower than Eigen's; bench/README.md has the figures.)
// The pieces only decide who computes which outputs, never the order of a sum (the K chunks
// depend on K alone), so they may depend on the thread count: the result does not.
template <class BOp>
void gemm_packed_impl(int M, int N, int K, GemmOperand A, BOp B, float* C, long ldc,
                      bool accumulate) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        if (!accumulate) zero_rows(C, ldc, M, N);
        return;
    }
    // K chunks: as equal as possible, each <= kKCMax; a function of K alone (determinism).
    const int kchunks = ceil_div(K, kKCMax);
    const int kc_step = ceil_div(K, kchunks);

    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (const int slices = long_sum_slices(M, N, K, kchunks); slices > 1)
        return long_sum(M, N, K, kchunks, kc_step, slices, threads, A, B, C, ldc, accumulate);
    const bool by_rows = M >= N;
    const int side = by_rows ? M : N, align = by_rows ? kMR : kNR;
    const int piece = ceil_div(ceil_div(side, threads * kPiecesPerThread), align) * align;
    const int pieces = ceil_div(side, piece);
#pragma omp parallel for schedule(dynamic, 1) num_threads(std::min(threads, pieces))
    for (int p = 0; p < pieces; p++) {
        const int a = p * piece, b = std::min(side, a + piece);
        if (by_rows)
            packed_piece(a, b, 0, N, K, kc_step, A, B, C, ldc, accumulate);
        else
            packed_piece(0, M, a, b, K, kc_step, A, B, C, ldc, accumulate);
    }
}
}  // namespace

void gemm_packed(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
                 bool accumulate) {
    gemm_packed_impl(M, N, K, A, B, C, ldc, accumulate);
}

#endif  // MT_GEMM_PACKED_NAME

// ---- int8 B ---------------------------------------------------------------------------------

#if defined(MT_GEMM_PACKED_NAME) && !defined(EIGEN_USE_BLAS)
void gemm_int8(int M, int N, int K, GemmOperand A, GemmInt8Operand B, float* C, long ldc,
               bool accumulate) {
    gemm_packed_impl(M, N, K, A, B, C, ldc, accumulate);
}
#else
// Without the packed GEMM: B dequantised into a 64 KiB stack tile of kTileK x kTileN at a time
// (L2-resident), each tile multiplied by gemm_eigen; tiles walk K in a fixed order.
void gemm_int8(int M, int N, int K, GemmOperand A, GemmInt8Operand B, float* C, long ldc,
               bool accumulate) {
    constexpr int kTileK = 256, kTileN = 64;
    alignas(64) float tile[kTileK * kTileN];
    if (K <= 0) return gemm_eigen(M, N, K, A, {nullptr, 0, false}, C, ldc, accumulate);
    for (int j0 = 0; j0 < N; j0 += kTileN) {
        const int nj = std::min(kTileN, N - j0);
        for (int p0 = 0; p0 < K; p0 += kTileK) {
            const int pk = std::min(kTileK, K - p0);
            for (int k = 0; k < pk; k++)  // tile[k][j] = B[p0+k, j0+j]
                for (int j = 0; j < nj; j++) {
                    const long r = B.transposed ? j0 + j : p0 + k,
                               c = B.transposed ? p0 + k : j0 + j;
                    tile[k * kTileN + j] = static_cast<float>(B.q[r * B.ld + c]) * B.scale[r];
                }
            const GemmOperand a_part{A.transposed ? A.data + p0 * A.ld : A.data + p0, A.ld,
                                     A.transposed};
            gemm_eigen(M, nj, pk, a_part, {tile, kTileN, false}, C + j0, ldc, accumulate || p0 > 0);
        }
    }
}
#endif

// ---- the dispatch -------------------------------------------------------------------------------
// The packed kernel wherever it is compiled, unless the build asked for a BLAS (MT_USE_BLAS ->
// EIGEN_USE_BLAS): then gemm() is Eigen's front end over that BLAS, as asked.

#if defined(MT_GEMM_PACKED_NAME) && !defined(EIGEN_USE_BLAS)

const char* gemm_impl_name() {
    return MT_GEMM_PACKED_NAME;
}

MatmulImpl gemm_fastest() {
    return MatmulImpl::packed;
}

void gemm(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc, bool accumulate) {
    gemm_packed(M, N, K, A, B, C, ldc, accumulate);
}

#else

#if defined(EIGEN_USE_BLAS)
const char* gemm_impl_name() {
    return "eigen+blas";
}
#else
const char* gemm_impl_name() {
    return "eigen";
}
#endif

MatmulImpl gemm_fastest() {
    return MatmulImpl::blas;
}

void gemm(int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc, bool accumulate) {
    gemm_eigen(M, N, K, A, B, C, ldc, accumulate);
}

#endif

void gemm(MatmulImpl impl, int M, int N, int K, GemmOperand A, GemmOperand B, float* C, long ldc,
          bool accumulate) {
    switch (impl) {
        case MatmulImpl::auto_:
            return gemm(M, N, K, A, B, C, ldc, accumulate);
        case MatmulImpl::naive:
            return gemm_naive(M, N, K, A, B, C, ldc, accumulate);
        case MatmulImpl::blocked:
            return gemm_blocked(M, N, K, A, B, C, ldc, accumulate);
        case MatmulImpl::packed:
            return gemm_packed(M, N, K, A, B, C, ldc, accumulate);
        case MatmulImpl::blas:
            return gemm_eigen(M, N, K, A, B, C, ldc, accumulate);
        default:
            throw std::logic_error(std::string("gemm: kernels.matmul ") + to_string(impl) +
                                   " is a CUDA step; the CPU ladder is naive, blocked, packed, "
                                   "blas");
    }
}

#if !defined(MT_GEMM_PACKED_NAME)

bool gemm_packed_available() {
    return false;
}

void gemm_packed(int, int, int, GemmOperand, GemmOperand, float*, long, bool) {
    throw std::logic_error(
        "gemm_packed: the baseline CPU ISA level has no packed GEMM (it needs AVX2+FMA or "
        "AVX-512; MT_CPU_ISA=baseline or a CPU without them); use gemm() or gemm_eigen()");
}

#endif

}  // namespace mt::cpu::MT_CPU_LEVEL_NS

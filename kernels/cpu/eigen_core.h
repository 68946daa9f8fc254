// <Eigen/Core> for the CPU kernels, without GCC 12's false uninitialized warnings. With AVX-512,
// GCC 12 reports `__Y` "(maybe) used uninitialized" inside its own avx512fintrin.h wherever an
// intrinsic is inlined (Eigen's packet math, the packed GEMM's kernel): -Wmaybe-uninitialized in
// optimised builds, -Wuninitialized under the sanitizers. It is the intrinsic's unused lane
// operand, neither our code nor Eigen's. GCC judges such a warning by the pragmas in force where
// the warned line is, i.e. in the intrinsic header, which a kernel file first reaches through
// this include: the suppression covers that header only, not the kernels. Include it before any
// other path to <immintrin.h>. Clang has neither false positive (nor -Wmaybe-uninitialized).
#pragma once

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
#else
#include <Eigen/Core>
#endif

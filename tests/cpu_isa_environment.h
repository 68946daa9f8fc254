// For the CPU kernel tests that ctest runs once per ISA level (CMakeLists.txt: MT_CPU_LEVEL_TESTS,
// the entries named isa_<level>:...; each sets MT_CPU_ISA=<level>): a global test environment
// that skips the whole binary, with the reason, where MT_CPU_ISA names a level this CPU lacks
// (avx512 on an AVX2-only CI machine) and tags the skip so that ctest lists the cases as skipped,
// not passed, and says which level the tests run. A name that is not a level is not skipped: the
// tests then fail on the backend's error, as a typo should.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/text.h"

namespace mt::testing_support {

class CpuIsaEnvironment : public ::testing::Environment {
  public:
    void SetUp() override {
        const char* env = std::getenv("MT_CPU_ISA");
        const std::optional<cpu::CpuIsa> isa = cpu::parse_cpu_isa(env ? env : "");
        if (isa) {
            const auto missing = cpu::missing_cpu_features(*isa, cpu::detect_cpu_features());
            if (!missing.empty()) {
                const std::string reason =
                    "MT_CPU_ISA=" + std::string(env) + ": this CPU lacks " + join(missing, ", ");
                // gtest reports the binary's cases as passed when its environment skips them;
                // ctest counts a case as skipped when its output has gtest's skip tag, so say it.
                std::cout << "[  SKIPPED ] every case: " << reason << "\n";
                GTEST_SKIP() << reason;
            }
        }
        std::cout << "[ CPU ISA  ] kernels of the level "
                  << cpu::to_string(cpu::cpu_isa_from_environment())
                  << (isa ? " (MT_CPU_ISA)" : " (the best this CPU has)") << "\n";
    }
};

inline ::testing::Environment* const kCpuIsaEnvironment =
    ::testing::AddGlobalTestEnvironment(new CpuIsaEnvironment);

}  // namespace mt::testing_support

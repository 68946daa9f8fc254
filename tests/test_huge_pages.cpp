// Large CPU buffers on 2 MiB pages (kernels/huge_pages.h): the policy from MT_CPU_HUGE_PAGES and
// the kernel's THP mode, what an allocation gets, and what the run record says.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "kernels/huge_pages.h"
#include "kernels/types.h"
#include "tests/test_util.h"

namespace mt {
namespace {

constexpr const char* kMadvise = "always [madvise] never\n";

TEST(HugePages, PolicyAdvisesUnlessTheVariableOrTheKernelSaysNo) {
    const HugePagePolicy by_default = huge_page_policy_for(nullptr, kMadvise);
    EXPECT_TRUE(by_default.advise);
    EXPECT_EQ(by_default.text, "2 MiB pages for buffers of 2 MiB or more (THP: madvise)");
    EXPECT_TRUE(huge_page_policy_for("1", "[always] madvise never").advise);
    EXPECT_TRUE(huge_page_policy_for("", kMadvise).advise);  // set but empty: unset

    const HugePagePolicy off = huge_page_policy_for("0", kMadvise);
    EXPECT_FALSE(off.advise);
    EXPECT_EQ(off.text, "off (MT_CPU_HUGE_PAGES=0)");

    const HugePagePolicy never = huge_page_policy_for("1", "always madvise [never]");
    EXPECT_FALSE(never.advise);
    EXPECT_NE(never.text.find("disabled"), std::string::npos) << never.text;

    // No sysfs (a container without it): advised, and the record says the effect is unknown.
    const HugePagePolicy unknown = huge_page_policy_for(nullptr, "");
    EXPECT_TRUE(unknown.advise);
    EXPECT_NE(unknown.text.find("unknown"), std::string::npos) << unknown.text;
}

TEST(HugePages, AValueOtherThanZeroOrOneIsRefusedNamingTheVariable) {
    try {
        huge_page_policy_for("yes", kMadvise);
        FAIL() << "MT_CPU_HUGE_PAGES=yes was accepted";
    } catch (const BackendError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("MT_CPU_HUGE_PAGES=yes"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected 1"), std::string::npos) << msg;
        EXPECT_NE(msg.find("or 0"), std::string::npos) << msg;
    }
}

// The THPeligible flag of the mapping that holds `p` in /proc/self/smaps ("" when not found).
std::string thp_eligible(const void* p) {
    std::ifstream f("/proc/self/smaps");
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::string line;
    bool inside = false;
    while (std::getline(f, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
            inside = lo <= addr && addr < hi;
        } else if (inside && line.rfind("THPeligible:", 0) == 0) {
            std::string value = line.substr(std::strlen("THPeligible:"));
            return value.substr(value.find_first_not_of(" \t"));
        }
    }
    return "";
}

TEST(HugePages, ABufferOfTwoMiBOrMoreIsAlignedAndEligibleWhereTheKernelAllowsIt) {
    if (!huge_page_policy().advise)
        GTEST_SKIP() << "huge pages are off here: " << huge_page_policy().text;
    const size_t bytes = 3 * kHugePageBytes + 100;
    void* big = allocate_host_buffer(bytes, 64);
    ASSERT_NE(big, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big) % kHugePageBytes, 0u);
    std::memset(big, 1, bytes);  // every byte of the request is usable
    const std::string eligible = thp_eligible(big);
    if (eligible.empty()) {
        std::free(big);
        GTEST_SKIP() << "this kernel's /proc/self/smaps has no THPeligible";
    }
    EXPECT_EQ(eligible, "1") << huge_page_policy().text;
    std::free(big);

    void* small = allocate_host_buffer(kHugePageBytes / 2, 64);  // below the threshold
    ASSERT_NE(small, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small) % 64, 0u);
    std::free(small);
}

// `microtrain run` of a two-step tiny experiment under `env_prefix`: its exit status and output,
// and the environment block of its results.json (null when there is none).
struct RunOutcome {
    CliResult cli;
    nlohmann::json environment;
};
RunOutcome run_under(const std::string& env_prefix) {
    TempDir dir("mt_huge_pages");
    const std::string f = dir.file("e.yaml");
    std::ofstream(f) << "name: e\nbackend: cpu\nmodel: {preset: tiny}\n"
                        "data: {batch_size: 1, seq_len: 8}\n"
                        "run: {warmup_steps: 0, measure_steps: 2, rounds: 1}\n";
    RunOutcome o;
    o.cli = run_shell(env_prefix + " '" + MT_BINARY + "' run -q '" + f + "' --out-dir '" +
                      dir.file("out") + "'");
    if (std::filesystem::exists(dir.file("out")))
        for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("out")))
            if (e.path().filename() == "results.json")
                o.environment = nlohmann::json::parse(std::ifstream(e.path()))["environment"];
    return o;
}

TEST(HugePages, TheRunRecordNamesThePolicyAndABadValueStopsTheRun) {
    const RunOutcome off = run_under("env MT_CPU_HUGE_PAGES=0");
    ASSERT_EQ(off.cli.rc, 0) << off.cli.output;
    EXPECT_EQ(off.environment.value("huge_pages", ""), "off (MT_CPU_HUGE_PAGES=0)")
        << off.environment.dump();

    const RunOutcome dflt = run_under("env -u MT_CPU_HUGE_PAGES");
    ASSERT_EQ(dflt.cli.rc, 0) << dflt.cli.output;
    EXPECT_EQ(dflt.environment.value("huge_pages", ""),
              huge_page_policy_for(nullptr, transparent_huge_page_setting()).text);

    const RunOutcome bad = run_under("env MT_CPU_HUGE_PAGES=2");
    EXPECT_NE(bad.cli.rc, 0);
    EXPECT_NE(bad.cli.output.find("MT_CPU_HUGE_PAGES=2: expected 1"), std::string::npos)
        << bad.cli.output;
}

}  // namespace
}  // namespace mt

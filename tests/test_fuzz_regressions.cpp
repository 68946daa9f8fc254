// Replays the fuzz targets' seed corpora and every input a fuzzer ever crashed on
// (tests/fuzz/corpus/<target>/, tests/fuzz/regressions/<target>/) through the same code the
// libFuzzer targets run (tests/fuzz/targets.h), so a fixed parser crash stays fixed in the
// ordinary suite, under the release build and under ASan, without clang. Each input must be
// accepted or rejected with the parser's own error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "tests/fuzz/targets.h"

namespace {

namespace fs = std::filesystem;

// The files in tests/fuzz/<kind>/<target>/, sorted (empty if the folder does not exist).
std::vector<fs::path> inputs(const std::string& kind, const std::string& target) {
    std::vector<fs::path> out;
    const fs::path dir = fs::path(MT_SOURCE_DIR) / "tests" / "fuzz" / kind / target;
    if (fs::is_directory(dir))
        for (const auto& e : fs::directory_iterator(dir))
            if (e.is_regular_file()) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

void replay(const std::string& target, const std::function<void(const std::string&)>& run,
            size_t min_seeds) {
    const auto seeds = inputs("corpus", target);
    EXPECT_GE(seeds.size(), min_seeds) << "tests/fuzz/corpus/" << target << " lost its seeds";
    std::vector<fs::path> all = seeds;
    for (auto& r : inputs("regressions", target)) all.push_back(r);
    for (const auto& p : all) {
        SCOPED_TRACE(p.string());
        try {
            run(p.string());
        } catch (const std::exception& e) {
            ADD_FAILURE() << "escaped the parser's own error type: " << e.what();
        }
    }
}

TEST(FuzzRegressions, SafetensorsInputsAreLoadedOrRejectedWithCheckpointError) {
    replay("safetensors", mt::fuzz::safetensors, 4);
}

TEST(FuzzRegressions, BatchInputsAreReadOrRejectedWithCheckpointOrDataError) {
    replay("batch", mt::fuzz::batch, 2);
}

TEST(FuzzRegressions, TokenInputsAreReadOrRejectedWithDataError) {
    replay("tokens", mt::fuzz::tokens, 2);
}

TEST(FuzzRegressions, ExperimentInputsAreLoadedOrRejectedWithSpecError) {
    replay("experiment", mt::fuzz::experiment, 4);
}

TEST(FuzzRegressions, TrainCheckpointInputsAreReadOrRejectedWithSafeTensorsError) {
    replay("train_checkpoint", mt::fuzz::train_checkpoint, 2);
}

TEST(FuzzRegressions, PretrainedFoldersAreLoadedOrRejectedWithCheckpointError) {
    replay("pretrained", mt::fuzz::pretrained, 3);
}

TEST(FuzzRegressions, ResultsInputsAreComparedOrRejectedWithReportError) {
    replay("results", mt::fuzz::results, 2);
}

}  // namespace

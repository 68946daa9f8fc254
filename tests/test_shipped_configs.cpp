// Every experiment file the project ships (configs/*.yaml, configs/labs/*.yaml, bench/*.yaml) is
// one a user runs as documented: each must pass `microtrain validate`, so a key renamed or a
// bound tightened elsewhere cannot leave a lab or the quickstart broken until someone runs it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> shipped_experiment_files() {
    std::vector<fs::path> files;
    for (const char* dir : {"configs", "configs/labs", "bench"})
        for (const fs::directory_entry& e : fs::directory_iterator(fs::path(MT_SOURCE_DIR) / dir))
            if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
    return files;
}

TEST(ShippedConfigs, EveryExperimentFileTheProjectShipsValidates) {
    const std::vector<fs::path> files = shipped_experiment_files();
    ASSERT_GE(files.size(), 15u) << "configs/ and bench/ hold fewer experiment files than shipped";
    for (const fs::path& f : files) {
        // train-tiny.yaml is a `train` config (one run, no variants): validate reads both.
        const CliResult r = run_microtrain("validate '" + f.string() + "'");
        EXPECT_EQ(r.rc, 0) << f << "\n" << r.output;
        EXPECT_NE(r.output.find("is valid"), std::string::npos) << f << "\n" << r.output;
    }
}

}  // namespace
}  // namespace mt

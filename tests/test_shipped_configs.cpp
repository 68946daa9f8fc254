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

// The fine-tuning lab starts from the base its finetune_base.yaml trains (model.init_from:
// runs/lab-finetune-base-train, which a fresh checkout lacks). One step of that base, in a
// temporary run directory, stands in for it: the lab validates against its dimensions.
std::string trained_finetune_base(const TempDir& dir) {
    const std::string out = dir.file("lab-finetune-base-train");
    const CliResult r = run_microtrain("train '" MT_SOURCE_DIR
                                       "/configs/labs/finetune_base.yaml' "
                                       "--steps 1 --out-dir '" +
                                       out + "'");
    EXPECT_EQ(r.rc, 0) << r.output;
    return out;
}

TEST(ShippedConfigs, EveryExperimentFileTheProjectShipsValidates) {
    const std::vector<fs::path> files = shipped_experiment_files();
    ASSERT_GE(files.size(), 15u) << "configs/ and bench/ hold fewer experiment files than shipped";
    TempDir base_dir;
    const std::string base = trained_finetune_base(base_dir);
    for (const fs::path& f : files) {
        // train-tiny.yaml is a `train` config (one run, no variants): validate reads both.
        const std::string set =
            f.filename() == "finetune.yaml" ? " --set 'model.init_from=" + base + "'" : "";
        const CliResult r = run_microtrain("validate '" + f.string() + "'" + set);
        EXPECT_EQ(r.rc, 0) << f << "\n" << r.output;
        EXPECT_NE(r.output.find("is valid"), std::string::npos) << f << "\n" << r.output;
    }
}

TEST(ShippedConfigs, TheFinetuneLabWithoutItsBaseSaysWhichCommandTrainsIt) {
    // The lab's own init_from, resolved in an empty folder: this checkout's runs/ may hold the
    // base already.
    TempDir cwd;
    const CliResult r = run_microtrain("validate '" MT_SOURCE_DIR
                                       "/configs/labs/finetune.yaml' "
                                       "--set model.init_from=runs/lab-finetune-base-train",
                                       cwd.path().string());
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("model.init_from"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("`name: lab-finetune-base`"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt

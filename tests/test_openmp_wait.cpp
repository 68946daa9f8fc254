// microtrain's OpenMP wait policy (kernels/openmp_wait.h): a short spin unless the user chose, set
// before libgomp reads it (by executing itself again), and named in results.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_util.h"

namespace mt {
namespace {

// `microtrain run` of a two-step tiny experiment under `env_prefix` (an `env ...` command
// prefix); the environment block of its results.json.
nlohmann::json environment_of_a_run(const std::string& env_prefix) {
    TempDir dir("mt_omp");
    const std::string f = dir.file("e.yaml");
    std::ofstream(f) << "name: e\nbackend: cpu\nmodel: {preset: tiny}\n"
                        "data: {batch_size: 1, seq_len: 8}\n"
                        "run: {warmup_steps: 0, measure_steps: 2, rounds: 1}\n";
    std::string cmd = env_prefix + " '";
    cmd += MT_BINARY;
    cmd += "' run -q '" + f + "' --out-dir '" + dir.file("out") + "'";
    const CliResult r = run_shell(cmd);
    EXPECT_EQ(r.rc, 0) << r.output;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir.file("out")))
        if (e.path().filename() == "results.json")
            return nlohmann::json::parse(std::ifstream(e.path()))["environment"];
    ADD_FAILURE() << "no results.json: " << r.output;
    return {};
}

TEST(OpenMpWait, AShortSpinIsTheDefaultWhenTheUserChoseNothing) {
    // ctest sets OMP_WAIT_POLICY for every test: unset here, as on a user's shell.
    const nlohmann::json env = environment_of_a_run("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT");
    EXPECT_EQ(env.value("openmp_wait", ""), "GOMP_SPINCOUNT=1000 (microtrain's default)")
        << env.dump();
}

TEST(OpenMpWait, AUsersOwnSettingIsKeptAndNamed) {
    EXPECT_EQ(environment_of_a_run("env OMP_WAIT_POLICY=active").value("openmp_wait", ""),
              "active (OMP_WAIT_POLICY)");
    EXPECT_EQ(environment_of_a_run("env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=10000")
                  .value("openmp_wait", ""),
              "GOMP_SPINCOUNT=10000");
}

}  // namespace
}  // namespace mt

// kernels.attention: cudnn in an experiment file: cuDNN's fused attention is 16-bit only, so
// the spec refuses it with any run.precision but bf16 at validation, naming the key that set it
// (the base file's kernels.attention, or the variant's run.precision), before any backend runs.
#include <gtest/gtest.h>

#include <string>

#include "experiment/spec.h"
#include "tests/test_util.h"

using namespace mt;

namespace {

// The SpecError message of `yaml` loaded as exp.yaml ("" when it loaded).
std::string error_of(const std::string& yaml) {
    return load_error_of<SpecError>(yaml, [](const std::string& p) { load_experiment(p, {}); });
}

const char* kBase = "name: cudnn\nmodel: { preset: tiny }\ndata: { batch_size: 2, seq_len: 16 }\n";

}  // namespace

TEST(SpecAttentionCudnn, Fp32IsRefusedAtTheAttentionKeyWithTheFix) {
    const std::string msg = error_of(std::string(kBase) + "kernels: { attention: cudnn }\n");
    EXPECT_NE(msg.find("exp.yaml:4:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("key 'kernels.attention': expected run.precision: bf16 with "
                       "kernels.attention: cudnn, got fp32; cuDNN's fused attention computes in "
                       "16-bit: set run.precision: bf16 or use kernels.attention: flash"),
              std::string::npos)
        << msg;
}

TEST(SpecAttentionCudnn, AVariantThatLowersThePrecisionIsBlamed) {
    const std::string msg = error_of(std::string(kBase) +
                                     "kernels: { attention: cudnn }\nrun: { precision: bf16 }\n"
                                     "variants:\n  - name: base\n  - name: tf32\n"
                                     "    set: { run.precision: tf32 }\n");
    EXPECT_NE(msg.find("key 'run.precision' (variant 'tf32'): expected run.precision: bf16"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("got tf32"), std::string::npos) << msg;
}

TEST(SpecAttentionCudnn, Bf16Validates) {
    EXPECT_EQ(
        error_of(std::string(kBase) + "kernels: { attention: cudnn }\nrun: { precision: bf16 }\n"),
        "");
}

// kernels.attention: flash_tc in an experiment file: our tensor-core flash attention runs on
// CUDA only, takes bf16 operands only and has kernels for head sizes 64 and 128, so the spec
// refuses every other combination at validation, naming the key that set it (the base file's
// kernels.attention, or a variant's backend / run.precision / model.n_head) and the fix, before
// any backend runs.
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

// tiny's n_embd is 64: one head gives head size 64.
const char* kBase =
    "name: flash_tc\nmodel: { preset: tiny, n_head: 1 }\ndata: { batch_size: 2, seq_len: 16 }\n";

}  // namespace

TEST(SpecAttentionFlashTc, Bf16OnCudaWithHeadSize64Validates) {
    EXPECT_EQ(
        error_of(std::string(kBase) +
                 "backend: cuda\nkernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"),
        "");
    // backend auto: the GPU is found (or the run skipped as needing one) at run time.
    EXPECT_EQ(error_of(std::string(kBase) +
                       "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"),
              "");
}

TEST(SpecAttentionFlashTc, HeadSize128Validates) {
    EXPECT_EQ(error_of("name: flash_tc\nmodel: { preset: tiny, n_embd: 256, n_head: 2 }\n"
                       "data: { batch_size: 2, seq_len: 16 }\n"
                       "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"),
              "");
}

TEST(SpecAttentionFlashTc, Fp32IsRefusedAtTheAttentionKeyWithTheFix) {
    const std::string msg = error_of(std::string(kBase) + "kernels: { attention: flash_tc }\n");
    EXPECT_NE(msg.find("exp.yaml:4:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("key 'kernels.attention': expected run.precision: bf16 with "
                       "kernels.attention: flash_tc, got fp32; its tensor-core MMAs take bf16 "
                       "operands: set run.precision: bf16 or use kernels.attention: flash"),
              std::string::npos)
        << msg;
}

TEST(SpecAttentionFlashTc, AVariantThatSetsTf32IsBlamed) {
    const std::string msg = error_of(std::string(kBase) +
                                     "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"
                                     "variants:\n  - name: base\n  - name: tf32\n"
                                     "    set: { run.precision: tf32 }\n");
    EXPECT_NE(msg.find("key 'run.precision' (variant 'tf32'): expected run.precision: bf16"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("got tf32"), std::string::npos) << msg;
}

TEST(SpecAttentionFlashTc, TheCpuBackendIsRefusedNamingFlash) {
    const std::string msg =
        error_of(std::string(kBase) +
                 "backend: cpu\nkernels: { attention: flash_tc }\nrun: { precision: bf16 }\n");
    EXPECT_NE(msg.find("expected backend: cuda (or auto) with kernels.attention: flash_tc, got "
                       "backend: cpu"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("kernels.attention: flash on the CPU"), std::string::npos) << msg;
}

TEST(SpecAttentionFlashTc, AVariantThatMovesToTheCpuIsBlamed) {
    const std::string msg = error_of(std::string(kBase) +
                                     "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"
                                     "variants:\n  - name: gpu\n  - name: cpu\n"
                                     "    set: { backend: cpu }\n");
    EXPECT_NE(msg.find("key 'backend' (variant 'cpu'): expected backend: cuda"), std::string::npos)
        << msg;
}

TEST(SpecAttentionFlashTc, AnUnsupportedHeadSizeIsRefusedWithTheDivision) {
    // tiny: n_embd 64, n_head 4: head size 16.
    const std::string msg = error_of(
        "name: flash_tc\nmodel: { preset: tiny }\ndata: { batch_size: 2, seq_len: 16 }\n"
        "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n");
    EXPECT_NE(msg.find("key 'kernels.attention': expected a head size (model.n_embd / "
                       "model.n_head) of 64 or 128 with kernels.attention: flash_tc, got 64 / 4 = "
                       "16; choose n_head = n_embd / 64 or n_embd / 128, or use "
                       "kernels.attention: flash"),
              std::string::npos)
        << msg;
}

TEST(SpecAttentionFlashTc, AVariantThatChangesTheHeadCountIsBlamed) {
    const std::string msg = error_of(std::string(kBase) +
                                     "kernels: { attention: flash_tc }\nrun: { precision: bf16 }\n"
                                     "variants:\n  - name: one_head\n  - name: two_heads\n"
                                     "    set: { model.n_head: 2 }\n");
    EXPECT_NE(msg.find("key 'model.n_head' (variant 'two_heads'): expected a head size"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("got 64 / 2 = 32"), std::string::npos) << msg;
}

TEST(SpecAttentionFlashTc, IsACudaOnlyFeature) {
    RunConfig c;
    c.kernels.attention = AttentionImpl::flash_tc;
    c.run.precision = Precision::bf16;
    EXPECT_EQ(cuda_only_features(c),
              (std::vector<std::string>{"run.precision bf16", "kernels.attention flash_tc"}));
}

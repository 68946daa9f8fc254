// The keys of what trains (model.lora, model.quantize_frozen, optim.freeze): they parse in a
// section, in a variant's `set:` and through --set, round-trip through their printed form, and a
// bad value is refused at its position with what was expected and how to fix it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "experiment/spec.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

class TrainableSpec : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() / (std::string("mt_trainable_spec_") + info->name() + "_" +
                                            std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path() const { return (dir_ / "exp.yaml").string(); }
    std::string write(const std::string& text) {
        std::ofstream(path()) << text;
        return path();
    }
    std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
        write(text);
        try {
            load_experiment(path(), sets);
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    std::string at(int line, int col) const {
        return path() + ":" + std::to_string(line) + ":" + std::to_string(col);
    }
    fs::path dir_;
};

const char* kOneVariant = R"(name: unit
backend: cpu
model: { preset: tiny }
data: { source: synthetic, batch_size: 2, seq_len: 16 }
variants:
  - name: full
)";

const char* kBase = R"(name: unit
backend: cpu
model: { preset: tiny }
data: { source: synthetic, batch_size: 2, seq_len: 16 }
variants:
  - name: full
  - name: lora
    set: { model.lora: { rank: 4, alpha: 8, targets: [attn.c_attn, mlp.c_fc] } }
  - name: frozen
    set: { optim.freeze: [wte, h.0] }
)";

TEST_F(TrainableSpec, LoraAndFreezeParseInVariantsAndRoundTripThroughTheirPrintedForm) {
    write(kBase);
    const ExperimentSpec spec = load_experiment(path(), {});
    ASSERT_EQ(spec.variants.size(), 3u);
    const TrainableOptions& lora = spec.variants[1].trainable;
    EXPECT_EQ(lora.lora.rank, 4);
    EXPECT_EQ(lora.lora.alpha, 8.0f);
    EXPECT_EQ(lora.lora.targets,
              (std::vector<LoraTarget>{LoraTarget::attn_c_attn, LoraTarget::mlp_c_fc}));
    EXPECT_EQ(spec.variants[1].changed.at("model.lora"),
              "{rank: 4, alpha: 8, targets: [attn.c_attn, mlp.c_fc]}");
    EXPECT_EQ(spec.variants[2].trainable.freeze, (std::vector<std::string>{"wte", "h.0"}));
    EXPECT_EQ(spec.variants[2].changed.at("optim.freeze"), "[wte, h.0]");
    EXPECT_EQ(spec.variants[0].trainable, TrainableOptions{});

    // The printed forms, given back through --set, give the same options.
    write(kOneVariant);
    write(kOneVariant);
    const ExperimentSpec a =
        load_experiment(path(), {"model.lora=" + spec.variants[1].changed.at("model.lora")});
    EXPECT_EQ(a.variants[0].trainable.lora, lora.lora);
    const ExperimentSpec b =
        load_experiment(path(), {"optim.freeze=" + spec.variants[2].changed.at("optim.freeze")});
    EXPECT_EQ(b.variants[0].trainable.freeze, spec.variants[2].trainable.freeze);
}

TEST_F(TrainableSpec, BadLoraValuesSayWhatWasExpected) {
    const std::string head = "name: unit\nbackend: cpu\nmodel: { preset: tiny, lora: ";
    const std::string tail = " }\ndata: { batch_size: 2, seq_len: 16 }\n";
    EXPECT_EQ(error_of(head + "8" + tail),
              at(3, 30) +
                  ": key 'model.lora': expected a mapping like { key: value, ... }, got '8'; "
                  "write a mapping like { key: value, ... }");
    EXPECT_NE(error_of(head + "{ rank: 8, alpa: 16 }" + tail)
                  .find("unknown key 'alpa' in model.lora; its keys are rank, alpha, targets"),
              std::string::npos);
    EXPECT_NE(error_of(head + "{ rank: -1 }" + tail)
                  .find("expected rank an integer from 0 (no adapters)"),
              std::string::npos);
    EXPECT_NE(error_of(head + "{ rank: 4, targets: [attn.c_attn, lm_head] }" + tail)
                  .find("expected targets among attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, "
                        "got 'lm_head' (element 2)"),
              std::string::npos);
    EXPECT_NE(error_of(head + "{ rank: 4, alpha: 0 }" + tail).find("expected alpha a number in (0"),
              std::string::npos);
    // tiny has n_embd 64: a rank above it is refused when the config resolves, at the key.
    const std::string big = error_of(head + "{ rank: 65 }" + tail);
    EXPECT_EQ(
        big.rfind(at(3, 30) + ": key 'model.lora': expected rank <= model.n_embd (64), got rank 65",
                  0),
        0u)
        << big;
}

TEST_F(TrainableSpec, FreezeNamesAreCheckedAgainstTheModelAtTheirPosition) {
    const std::string msg = error_of(
        "name: unit\nbackend: cpu\nmodel: { preset: tiny }\ndata: { batch_size: 2, seq_len: 16 }\n"
        "optim: { freeze: [wte, h.2] }\n");
    EXPECT_EQ(msg.rfind(at(5, 18) + ": key 'optim.freeze': 'h.2' names no parameter", 0), 0u)
        << msg;
    EXPECT_NE(msg.find("(the model has h.0 .. h.1)"), std::string::npos) << msg;
    EXPECT_NE(
        error_of(kBase, {"optim.freeze=wte"}).find("expected a list of names like [wte, h.0]"),
        std::string::npos);
    EXPECT_NE(error_of(kBase, {"optim.freeze=[wte, wpe, h, ln_f]"})
                  .find("optim.freeze freezes every parameter: nothing would train"),
              std::string::npos);
}

TEST_F(TrainableSpec, Int8StorageNeedsSomethingFrozen) {
    const std::string msg = error_of(kOneVariant, {"model.quantize_frozen=int8"});
    EXPECT_NE(
        msg.find("key 'model.quantize_frozen': int8 stores frozen Linear weights as int8, but no "
                 "Linear weight is frozen"),
        std::string::npos)
        << msg;
    EXPECT_EQ(error_of(kOneVariant, {"model.quantize_frozen=int8", "optim.freeze=[h.0]"}), "");
    const std::string both = error_of(kBase, {"optim.freeze=[h.0]"});
    EXPECT_NE(both.find("(variant 'lora'): model.lora already freezes every base weight (only the "
                        "adapters train); remove optim.freeze or model.lora"),
              std::string::npos)
        << both;
    EXPECT_NE(error_of(kBase, {"model.quantize_frozen=int4"}).find("one of none | int8"),
              std::string::npos);
}

}  // namespace

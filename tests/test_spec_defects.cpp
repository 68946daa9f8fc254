// The experiment-file defects of issue #12 (item 5), one test each: files yaml-cpp would misread
// silently, numbers that narrow when stored, resources and sizes bounded before work starts,
// and the loader's messages for odd paths. Each test reproduces the defect and pins the message.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/data.h"
#include "experiment/spec.h"
#include "experiment/spec_text.h"
#include "model/gpt.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

class SpecDefects : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               (std::string("mt_spec_defects_") + info->name() + "_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override {
        std::error_code ec;
        fs::permissions(dir_ / "locked.yaml", fs::perms::owner_all, ec);
        fs::remove_all(dir_, ec);
    }
    std::string write(const std::string& name, const std::string& text) {
        const fs::path p = dir_ / name;
        std::ofstream(p, std::ios::binary) << text;
        return p.string();
    }
    std::string error_at(const std::string& path, const std::vector<std::string>& sets = {}) {
        try {
            load_experiment(path, sets);
        } catch (const SpecError& e) {
            return e.what();
        }
        return "";
    }
    std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
        return error_at(write("exp.yaml", text), sets);
    }
    std::string at(int line, int col) const {
        return (dir_ / "exp.yaml").string() + ":" + std::to_string(line) + ":" +
               std::to_string(col);
    }
    fs::path dir_;
};

#define EXPECT_CONTAINS(haystack, needle) \
    EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "in: " << (haystack)
#define EXPECT_STARTS_WITH(haystack, prefix) \
    EXPECT_EQ(std::string(haystack).rfind(prefix, 0), 0u) << "in: " << (haystack)

// ---- silently misread files -------------------------------------------------------------------

TEST_F(SpecDefects, UnclosedDoubleQuoteIsRejectedAtItsOpeningQuote) {
    // yaml-cpp would read `exp\nmodel: { n_layer: 12 }` as the name and keep n_layer 2.
    const std::string msg = error_of("name: \"exp\nmodel: { n_layer: 12 }\n");
    EXPECT_STARTS_WITH(msg, at(1, 7) +
                                ": a double-quoted string opens here and is not closed "
                                "before the end of the line");
    EXPECT_CONTAINS(msg, "Close it with \" on the same line");
}

TEST_F(SpecDefects, UnclosedSingleQuoteAtTheEndOfTheFileIsRejected) {
    EXPECT_STARTS_WITH(error_of("run: { seed: 1 }\nname: 'exp"),
                       at(2, 7) +
                           ": a single-quoted string opens here and is not closed before "
                           "the end of the file");
}

TEST_F(SpecDefects, UnclosedQuoteInDataPathAndVariantNameIsRejected) {
    EXPECT_STARTS_WITH(error_of("data: { source: text, path: \"a.txt }\nrun: {}\n"),
                       at(1, 29) + ": a double-quoted string opens here");
    EXPECT_STARTS_WITH(error_of("variants:\n  - name: 'fast\n  - name: slow\n"),
                       at(2, 11) + ": a single-quoted string opens here");
}

TEST_F(SpecDefects, ClosedQuotesEscapesCommentsAndBlockScalarsStillLoad) {
    EXPECT_EQ(error_of("name: \"a\\\"b\" # it's \"fine\"\n"), at(1, 7) +
                                                                  ": key 'name': expected a name "
                                                                  "of 1 to 64 characters from "
                                                                  "A-Z a-z 0-9 . _ + - (not "
                                                                  "starting with '.'), got "
                                                                  "'a\"b'; the experiment name "
                                                                  "names the run folder, so "
                                                                  "write it like `my-run_2`");
    EXPECT_EQ(error_of("name: 'it''s'\n").find("unclosed"), std::string::npos);
    EXPECT_EQ(error_of("# don't \"\nname: x\nvariants:\n  - name: a # it's\n"), "");
    EXPECT_EQ(error_of("name: x\nreport: { out_dir: it's-here }\n"), "");
    // A block scalar's content is not scanned for quotes.
    EXPECT_CONTAINS(error_of("name: |\n  it's \"open\n  more\nrun: {}\n"), "key 'name'");
}

TEST_F(SpecDefects, SecondYamlDocumentIsRejectedWithItsLine) {
    EXPECT_STARTS_WITH(error_of("name: a\n---\nname: b\n"),
                       at(2, 1) + ": a second YAML document starts here ('---')");
    EXPECT_EQ(error_of("---\nname: a\n"), "");  // one explicit document is fine
    EXPECT_STARTS_WITH(error_of("name: a\n...\nrun: {}\n"),
                       at(3, 1) + ": content after the end of the document ('...' at line 2)");
}

TEST_F(SpecDefects, DuplicateKeysInCompareReportAndVariantItemsAreRejected) {
    EXPECT_EQ(error_of("compare: { baseline: a, baseline: b }\n"),
              at(1, 25) + ": key 'compare.baseline': given twice (first at " + at(1, 12) +
                  "); remove one of them");
    EXPECT_EQ(error_of("report:\n  out_dir: a\n  out_dir: b\n"),
              at(3, 3) + ": key 'report.out_dir': given twice (first at " + at(2, 3) +
                  "); remove one of them");
    EXPECT_EQ(error_of("variants:\n  - name: a\n    name: b\n"),
              at(3, 5) + ": key 'variants[0].name': given twice (first at " + at(2, 5) +
                  "); remove one of them");
    EXPECT_EQ(error_of("variants:\n  - name: a\n    set: { run.seed: 1, run.seed: 2 }\n"),
              at(3, 25) + ": key 'variants[0].set.run.seed': given twice (first at " + at(3, 12) +
                  "); remove one of them");
    EXPECT_EQ(
        error_of("model: {}\nmodel: {}\n"),
        at(2, 1) + ": key 'model': given twice (first at " + at(1, 1) + "); merge them into one");
}

TEST_F(SpecDefects, SetValuesGetTheSameTextChecks) {
    EXPECT_EQ(error_of("name: x\n", {"data.path=\"a.txt"}),
              "--set data.path=\"a.txt: in the value at column 1: a double-quoted string opens "
              "here and is not closed before the end of the file; YAML would read the following "
              "lines into it, hiding the keys there. Close it with \" on the same line (a quoted "
              "value must fit on one line)");
    EXPECT_CONTAINS(error_of("name: x\n", {"run.seed=" + std::string(10000, '[')}),
                    "in the value at column 64: nesting too deep");
    EXPECT_CONTAINS(error_of("name: x\n", {"run.seed=1\n---\n2"}),
                    "a second YAML document starts here");
}

TEST_F(SpecDefects, NulByteIsRejectedNotTruncated) {
    EXPECT_STARTS_WITH(error_of(std::string("name: ab\0cd\n", 12)),
                       at(1, 9) + ": the file contains a NUL byte");
}

TEST_F(SpecDefects, NulEscapeInAStringIsRejectedNotTruncated) {
    EXPECT_EQ(error_of("report: { out_dir: \"runs\\0x\" }\n"),
              at(1, 20) +
                  ": key 'report.out_dir': expected text without a NUL character, got "
                  "one (a \\0 escape) at character 5; remove it");
    EXPECT_CONTAINS(error_of("data: { source: text, path: \"a\\0.txt\" }\n"),
                    "key 'data.path': expected text without a NUL character");
}

TEST_F(SpecDefects, NonUtf8IsRejectedWithThePositionOfTheByte) {
    EXPECT_STARTS_WITH(error_of("run: {}\nname: caf\xe9\n"),
                       at(2, 10) + ": invalid UTF-8 (byte 0xE9)");
    EXPECT_CONTAINS(error_of("name: \xc0\xaf\n"), "invalid UTF-8 (byte 0xC0)");      // overlong
    EXPECT_CONTAINS(error_of("name: \xed\xa0\x80\n"), "invalid UTF-8 (byte 0xED)");  // surrogate
    EXPECT_EQ(error_of("# caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\nname: x\n"), "");
}

TEST_F(SpecDefects, TaggedQuotedStringMustCloseToo) {
    EXPECT_STARTS_WITH(error_of("name: !!str \"exp\nmodel: { n_layer: 12 }\n"),
                       at(1, 13) + ": a double-quoted string opens here");
}

TEST_F(SpecDefects, EmptyFileIsNotAMapping) {
    EXPECT_EQ(error_of(""), (dir_ / "exp.yaml").string() +
                                ":1:1: expected a mapping of experiment settings (name, model, "
                                "data, optim, run, variants, ...) at the top level, got nothing "
                                "(an empty value); see configs/quickstart.yaml for the shape");
}

// Found by tests/fuzz/fuzz_experiment: a file starting with ',' made yaml-cpp's LoadAll loop
// forever (a 976-byte file ran 77 s and grew memory). ',' ']' '}' cannot start a value outside a
// flow collection; the pre-scan says so at their position.
TEST_F(SpecDefects, StrayFlowIndicatorOutsideBracketsIsRejectedAtOnce) {
    EXPECT_STARTS_WITH(error_of(", fp32 master weights\nname: x\n"),
                       at(1, 1) + ": a ',' outside a [ ] list or { } mapping");
    EXPECT_STARTS_WITH(error_of("name: x\nrun: ]\n"),
                       at(2, 6) + ": a ']' outside a [ ] list or { } mapping");
    EXPECT_STARTS_WITH(error_of("name: x\nvariants:\n  - }\n"),
                       at(3, 5) + ": a '}' outside a [ ] list or { } mapping");
    // Inside brackets, and inside a plain value, they are fine.
    EXPECT_EQ(error_of("name: x\noptim: { betas: [0.9, 0.95] }\nvariants:\n  - name: a\n  - name: "
                       "b\n    set: { run.seed: 3 }\n"),
              "");
}

TEST_F(SpecDefects, NamesAreCheckedUpFrontForCharactersAndLength) {
    const std::string long_name(300, 'a');
    const std::string msg = error_of("name: " + long_name + "\n");
    EXPECT_STARTS_WITH(msg, at(1, 7) + ": key 'name': expected a name of 1 to 64 characters");
    EXPECT_CONTAINS(msg, "(300 characters)");
    EXPECT_STARTS_WITH(error_of("name: \"caf\\u00e9\"\n"),
                       at(1, 7) + ": key 'name': expected a name of 1 to 64 characters");
    EXPECT_CONTAINS(error_of("name: \"caf\\u00e9\"\n"), "got 'caf\\xC3\\xA9'");
    EXPECT_STARTS_WITH(error_of("variants:\n  - name: a/b\n"),
                       at(2, 11) + ": key 'variants[0].name': expected a name of 1 to 64");
    EXPECT_CONTAINS(error_of("variants:\n  - name: '..'\n"), "not starting with '.'");
    EXPECT_CONTAINS(error_of("name: x\n", {"name=a b"}), "--set name=a b: key 'name'");
    EXPECT_EQ(error_of("name: gpt2-124M_fp32+flash.v2\nvariants:\n  - name: A.b_c-d+e\n"), "");
}

TEST_F(SpecDefects, DefaultNameFromAnOddFileNameIsMadeSafe) {
    const std::string path = write("my exp!.yaml", "run: {}\n");
    EXPECT_EQ(load_experiment(path).name, "my-exp-");
}

TEST_F(SpecDefects, FilesAboveTheSizeLimitAreRefusedBeforeParsing) {
    std::string big = "name: x\n";
    big += "# " + std::string(kMaxExperimentFileBytes, 'x') + "\n";
    const std::string msg = error_of(big);
    EXPECT_STARTS_WITH(msg, (dir_ / "exp.yaml").string() + ": the experiment file is ");
    EXPECT_CONTAINS(msg, "more than the limit of 1048576 bytes (1 MiB)");
}

TEST_F(SpecDefects, DeepNestingIsRejectedBeforeYamlCppRecursesIntoIt) {
    const std::string deep = "name: x\nrun: " + std::string(10000, '[') + std::string(10000, ']');
    EXPECT_STARTS_WITH(error_of(deep + "\n"), at(2, 6 + kMaxExperimentNesting - 1) +
                                                  ": nesting too deep: more than 64 "
                                                  "levels of lists and mappings");
    std::string glued = "run: [a";
    for (int i = 0; i < 10000; ++i) glued += "[a";
    EXPECT_CONTAINS(error_of(glued + "\n"), ": nesting too deep");
    std::string block = "a:\n";
    for (int i = 1; i <= 100; ++i) block += std::string(static_cast<size_t>(i), ' ') + "a:\n";
    EXPECT_CONTAINS(error_of(block), ": nesting too deep: more than 64 levels");
}

TEST_F(SpecDefects, AnchorsAndAliasesAreRefused) {
    EXPECT_STARTS_WITH(error_of("optim: { lr: &x 1.0e-3 }\nrun: { seed: *x }\n"),
                       at(1, 14) + ": an anchor (&name) is not supported");
}

// ---- numbers that narrow ------------------------------------------------------------------------

TEST_F(SpecDefects, FloatsThatWouldRoundToZeroAreRejected) {
    EXPECT_EQ(error_of("optim: { lr: 1e-50 }\n"),
              at(1, 14) +
                  ": key 'optim.lr': expected a number > 0, got 1e-50: too small for the 32-bit "
                  "float it is stored in: a nonzero value must be at least 1.1754944e-38 "
                  "(smaller would round to 0); typical values are 1e-4 to 1e-3");
    EXPECT_CONTAINS(error_of("optim: { grad_clip: 1e-50 }\n"),
                    "key 'optim.grad_clip': expected a number >= 0, got 1e-50: too small");
    EXPECT_EQ(error_of("optim: { grad_clip: 0 }\n"), "");  // 0 means off, and stays allowed
}

TEST_F(SpecDefects, FloatsThatWouldBecomeInfAreRejected) {
    EXPECT_CONTAINS(error_of("optim: { weight_decay: 3.5e38 }\n"),
                    "got 3.5e+38: out of range for the 32-bit float it is stored in: at most "
                    "3.4028235e+38");
    EXPECT_CONTAINS(error_of("optim: { lr: 1e400 }\n"), "it is out of range");
}

TEST_F(SpecDefects, BetasThatWouldRoundToOneAreRejected) {
    EXPECT_EQ(error_of("optim: { betas: [0.9, 0.99999999] }\n"),
              at(1, 17) +
                  ": key 'optim.betas': expected both betas in [0, 1), got [0.9, 0.99999999]: "
                  "0.99999999 rounds to 1 in the 32-bit float it is stored in (at most "
                  "0.99999994); typical values are [0.9, 0.95]");
    EXPECT_EQ(error_of("optim: { betas: [0.9, 0.99999994] }\n"), "");
}

TEST_F(SpecDefects, IntegersOutOfRangeSaySoWithTheBound) {
    EXPECT_EQ(error_of("run: { measure_steps: 2147483648 }\n"),
              at(1, 23) +
                  ": key 'run.measure_steps': expected an integer from 1 to 2147483647, got "
                  "2147483648: out of range, at most 2147483647 (the largest 32-bit integer)");
    EXPECT_CONTAINS(error_of("run: { measure_steps: 99999999999999999999999 }\n"),
                    "got 99999999999999999999999: out of range, at most 2147483647");
    EXPECT_CONTAINS(error_of("run: { measure_steps: -99999999999999999999999 }\n"),
                    "expected an integer >= 1, got -99999999999999999999999");
    EXPECT_CONTAINS(error_of("run: { seed: 99999999999999999999999 }\n"),
                    "out of range, at most 18446744073709551615");
}

TEST_F(SpecDefects, ModelDimensionsHaveBoundsThatKeepSizesFromOverflowing) {
    EXPECT_EQ(error_of("model: { n_layer: 2147483647 }\n"),
              at(1, 19) +
                  ": key 'model.n_layer': expected an integer from 1 to 1024, got 2147483647: "
                  "out of range, at most 1024 (the trainer's bound; GPT-3 175B has 96 layers, 96 "
                  "heads, 12288 channels)");
    EXPECT_CONTAINS(error_of("model: { vocab_size: 2147483647 }\n"),
                    "key 'model.vocab_size': expected an integer from 2 to 16777216");
    // Each dimension within its bound, the parameter count is not.
    EXPECT_CONTAINS(
        error_of("model: { n_layer: 1024, n_embd: 65536, n_head: 1 }\n"),
        "key 'model.n_layer': expected a model this trainer can hold: the model has "
        "52777449553920 parameters (L1024 C65536 H1 T32 V256), more than the 68719476736 (2^36)");
}

TEST(GPTConfigBounds, HugeVocabIsAClearErrorWithoutOverflow) {
    GPTConfig c;
    c.vocab_size = 2147483647;  // (vocab_size + 127) overflowed int in padded_vocab_size()
    EXPECT_EQ(c.padded_vocab_size() % 128, 0);
    try {
        c.validate();
        FAIL() << "validated";
    } catch (const std::invalid_argument& e) {
        EXPECT_STREQ(e.what(), "vocab_size must be in [2, 16777216], got 2147483647");
    }
    EXPECT_THROW(ParameterTable{c}, std::invalid_argument);  // before sizing any tensor
    c = GPTConfig{};
    c.n_layer = 2147483647;
    EXPECT_THROW(ParameterTable{c}, std::invalid_argument);
}

TEST(GPTConfigBounds, ParameterCountMatchesTheTableAndReportsOverflow) {
    const GPTConfig c = *gpt_preset("gpt2-124M");
    EXPECT_EQ(static_cast<size_t>(c.parameter_count()), ParameterTable(c).total_count());
    GPTConfig huge;
    huge.n_layer = 2147483647;
    huge.n_embd = 2147483647;
    EXPECT_EQ(huge.parameter_count(), -1);
}

TEST_F(SpecDefects, BatchPositionsMustFitAnInt) {
    EXPECT_CONTAINS(
        error_of("model: { max_seq_len: 65536 }\ndata: { batch_size: 65536, seq_len: 65536 }\n"),
        "expected data.batch_size x data.seq_len <= 2147483647, got 65536 x 65536 = 4294967296");
}

// ---- resources checked before work starts -------------------------------------------------------

TEST_F(SpecDefects, WorkersPrefetchAndThreadsAreBounded) {
    EXPECT_CONTAINS(error_of("data: { workers: 100000 }\n"),
                    "key 'data.workers': expected an integer from 0 to 256, got 100000: out of "
                    "range, at most 256 (each worker is a thread");
    EXPECT_CONTAINS(error_of("data: { prefetch: 100000 }\n"),
                    "key 'data.prefetch': expected an integer from 1 to 1024, got 100000");
    EXPECT_CONTAINS(error_of("run: { threads: 100000 }\n"),
                    "key 'run.threads': expected an integer from 0 to 1024, got 100000: out of "
                    "range, at most 1024 (OpenMP threads");
    EXPECT_CONTAINS(error_of("name: x\n", {"run.threads=100000"}), "--set run.threads=100000");
}

// ---- messages for odd paths ---------------------------------------------------------------------

TEST_F(SpecDefects, SymlinkLoopSaysSo) {
    const fs::path a = dir_ / "a.yaml", b = dir_ / "b.yaml";
    fs::create_symlink(b, a);
    fs::create_symlink(a, b);
    EXPECT_EQ(error_at(a.string()), a.string() +
                                        ": cannot open the experiment file: too many levels of "
                                        "symbolic links (a symlink loop); point the path at the "
                                        "file itself");
}

TEST_F(SpecDefects, MissingDirectoryFifoAndUnreadableAreReportedAsWhatTheyAre) {
    EXPECT_EQ(error_at((dir_ / "none.yaml").string()),
              (dir_ / "none.yaml").string() +
                  ": cannot open the experiment file: it does not exist; check the path");
    EXPECT_EQ(error_at(dir_.string()),
              dir_.string() + ": is a directory; give the path of a YAML experiment file");
    const std::string fifo = (dir_ / "pipe.yaml").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    EXPECT_EQ(error_at(fifo),  // without blocking on the FIFO's missing writer
              fifo +
                  ": is a FIFO (named pipe), not a regular file; give the path of a YAML "
                  "experiment file");
    const std::string locked = write("locked.yaml", "name: x\n");
    fs::permissions(locked, fs::perms::none);
    if (::geteuid() != 0) {  // root reads it anyway
        EXPECT_EQ(error_at(locked), locked +
                                        ": cannot open the experiment file: permission "
                                        "denied; check the file's permissions");
    }
}

TEST_F(SpecDefects, DataPathSymlinkLoopAndFifoAreReportedWithoutBlocking) {
    fs::create_symlink(dir_ / "l2.bin", dir_ / "l1.bin");
    fs::create_symlink(dir_ / "l1.bin", dir_ / "l2.bin");
    EXPECT_EQ(error_of("data: { source: tokens, path: l1.bin }\n"),
              at(1, 31) + ": key 'data.path': expected an llm.c token file (.bin), got '" +
                  (dir_ / "l1.bin").string() +
                  "' which cannot be opened: too many levels of symbolic links (a loop)");
    ASSERT_EQ(::mkfifo((dir_ / "p.txt").c_str(), 0600), 0);
    EXPECT_EQ(error_of("data: { source: text, path: p.txt }\n"),
              at(1, 29) + ": key 'data.path': expected a UTF-8 text file, got '" +
                  (dir_ / "p.txt").string() + "' which is a FIFO (named pipe), not a regular file");
}

struct Proc {
    int rc = -1;
    std::string out;
};
Proc run_cmd(const std::string& cmd) {
    Proc p;
    std::unique_ptr<FILE, int (*)(FILE*)> f(::popen((cmd + " 2>&1").c_str(), "r"), ::pclose);
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f.get())) > 0) p.out.append(buf.data(), n);
    const int status = ::pclose(f.release());
    p.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return p;
}

TEST_F(SpecDefects, ValidateAndRunExitTwoOnTheseErrors) {
    const std::string path = write("exp.yaml", "name: \"exp\nmodel: { n_layer: 12 }\n");
    for (const char* cmd : {" validate ", " run "}) {
        const Proc p = run_cmd(std::string(MT_BINARY) + cmd + path);
        EXPECT_EQ(p.rc, 2) << p.out;
        EXPECT_CONTAINS(p.out, at(1, 7) + ": a double-quoted string opens here");
    }
    // Item 14: `--set k=v FILE` is one override and the file, with options after the file too
    // ("file is required" before: --set took the file as a second override).
    const std::string file = write("x.yaml", "name: x\n");
    for (const std::string& args :
         {" validate --set run.bogus=1 " + file, " run --set run.bogus=1 " + file + " --quiet",
          " train --set run.bogus=1 " + file + " --steps 1"}) {
        const Proc p = run_cmd(std::string(MT_BINARY) + args);
        EXPECT_EQ(p.rc, 2) << args << p.out;
        EXPECT_CONTAINS(p.out, "unknown key 'run.bogus'");
    }
    const std::string lr = write("lr.yaml", "optim: { lr: 1e-50 }\n");
    const Proc p = run_cmd(std::string(MT_BINARY) + " validate " + lr);
    EXPECT_EQ(p.rc, 2) << p.out;
}

// ---- issue #25: nothing silently wrong ------------------------------------------------------

// Item 6: the runner counts warm-up and measured steps in one int; a sum past 2^31-1 ran no
// step at all and exited 0.
TEST_F(SpecDefects, WarmupPlusMeasureStepsPastInt32IsRefused) {
    const std::string msg = error_of("run: { warmup_steps: 2147483000, measure_steps: 1000 }\n");
    EXPECT_CONTAINS(msg, "run.warmup_steps + run.measure_steps <= 2147483647");
    EXPECT_CONTAINS(msg, "2147483000 + 1000 = 2147484000");
    EXPECT_EQ(error_of("run: { warmup_steps: 2147483000, measure_steps: 647 }\n"), "");
}

// Item 6, the same class: the samples of one optimizer step (B x T x grad_accum, times the
// ranks in the report) are counted in 64 bits; a bound keeps them far from overflowing.
TEST_F(SpecDefects, TokensPerOptimizerStepAreBounded) {
    const std::string msg =
        error_of("data: { batch_size: 65536, seq_len: 32 }\nrun: { grad_accum: 2147483647 }\n");
    EXPECT_CONTAINS(msg, "key 'run.grad_accum'");
    EXPECT_CONTAINS(msg, "tokens per optimizer step");
}

// Item 8: data.val_path is checked as data.path is, when the file is loaded, not when `train`
// starts (after creating its run directory).
TEST_F(SpecDefects, ValPathIsCheckedLikeDataPath) {
    write_token_file((dir_ / "train.bin").string(), std::vector<uint16_t>(1000, 7));
    const std::string head =
        "data: { source: tokens, path: train.bin, batch_size: 2, seq_len: 8, val_path: ";
    // Too short for one batch (2 x 8 + 1 = 17 tokens).
    write_token_file((dir_ / "short.bin").string(), std::vector<uint16_t>(10, 7));
    std::string msg = error_of(head + "short.bin }\n");
    EXPECT_CONTAINS(msg, "key 'data.val_path'");
    EXPECT_CONTAINS(msg, "with 10 tokens");
    // Empty, and truncated (the header promises more tokens than the file holds).
    write("empty.bin", "");
    msg = error_of(head + "empty.bin }\n");
    EXPECT_CONTAINS(msg, "key 'data.val_path'");
    EXPECT_CONTAINS(msg, "empty.bin");
    write_token_file((dir_ / "cut.bin").string(), std::vector<uint16_t>(100, 7));
    fs::resize_file(dir_ / "cut.bin", fs::file_size(dir_ / "cut.bin") - 50);
    msg = error_of(head + "cut.bin }\n");
    EXPECT_CONTAINS(msg, "key 'data.val_path'");
    EXPECT_CONTAINS(msg, "cut.bin");
    // A directory.
    fs::create_directories(dir_ / "sub");
    EXPECT_CONTAINS(error_of(head + "sub }\n"), "key 'data.val_path'");
    // A good one loads.
    write_token_file((dir_ / "val.bin").string(), std::vector<uint16_t>(100, 7));
    EXPECT_EQ(error_of(head + "val.bin }\n"), "");
}

// Item 11: the simulated link's duration overflowed its clock (1e-30 Gbit/s: no delay at all
// while the report said a link was simulated) or hung (1e-12). The key is bounded.
TEST_F(SpecDefects, SimulatedLinkBandwidthIsBounded) {
    for (const char* gbps : {"1e-30", "1e-12", "0.0001", "1e7"}) {
        const std::string msg =
            error_of(std::string("dist: { simulate_link_gbps: ") + gbps + " }\n");
        EXPECT_CONTAINS(msg, "key 'dist.simulate_link_gbps'");
        EXPECT_CONTAINS(msg, "0 or a number in [0.01, 1e+06]");
    }
    for (const char* gbps : {"0", "0.01", "10", "1e6"})
        EXPECT_EQ(error_of(std::string("dist: { simulate_link_gbps: ") + gbps + " }\n"), "");
}

// Item 5: a key that another key's value makes meaningless was silently ignored (data.path
// without a file source trained on synthetic data; LoRA's alpha without rank trained the whole
// model). Each pair is an error naming both keys.
TEST_F(SpecDefects, KeysWithNoEffectUnderAnotherKeyAreRefused) {
    write_token_file((dir_ / "my.bin").string(), std::vector<uint16_t>(1000, 7));
    std::string msg = error_of("data: { path: my.bin }\n");
    EXPECT_CONTAINS(msg,
                    "key 'data.path': has no effect with data.source: synthetic (the default)");
    EXPECT_CONTAINS(msg, "set data.source: tokens");
    msg = error_of("model: { lora: { alpha: 16, targets: [attn.c_attn] } }\n");
    EXPECT_CONTAINS(msg, "key 'model.lora'");
    EXPECT_CONTAINS(msg, "no rank");
    EXPECT_CONTAINS(msg, "every parameter would train");
    EXPECT_CONTAINS(error_of("model: { lora: { rank: 0, targets: [attn.c_attn] } }\n"), "rank 0");
    const std::pair<const char*, const char*> pairs[] = {
        {"data: { source: tokens, path: my.bin, synthetic: uniform }\n", "data.synthetic"},
        {"data: { workers: 0, prefetch: 4 }\n", "data.prefetch"},
        {"optim: { warmup_steps: 10 }\n", "optim.warmup_steps"},
        {"optim: { schedule: constant, decay_steps: 10 }\n", "optim.decay_steps"},
        {"optim: { min_lr_ratio: 0.1 }\n", "optim.min_lr_ratio"},
        {"profile: { trace: false, trace_steps: 5 }\n", "profile.trace_steps"},
    };
    for (const auto& [text, key] : pairs)
        EXPECT_CONTAINS(error_of(text), std::string("key '") + key + "': has no effect with");
    EXPECT_CONTAINS(error_of("train: { eval_every: 0, eval_batches: 8 }\n"),
                    "key 'train.eval_batches': has no effect with train.eval_every: 0");
    EXPECT_EQ(error_of("train: { eval_every: 5, eval_batches: 8 }\n"), "");
    // Meaningful under the other key's value: accepted.
    EXPECT_EQ(error_of("data: { source: tokens, path: my.bin }\n"), "");
    EXPECT_EQ(error_of("optim: { schedule: cosine, warmup_steps: 10, decay_steps: 100 }\n"), "");
    EXPECT_EQ(error_of("model: { lora: { rank: 4, alpha: 8 } }\n"), "");
    // A base detail for the variants that switch the mode on, or off: accepted.
    EXPECT_EQ(error_of("data: { workers: 0, prefetch: 4 }\n"
                       "variants:\n  - name: a\n  - name: b\n    set: { data.workers: 2 }\n"),
              "");
    EXPECT_EQ(
        error_of("data: { source: tokens, path: my.bin }\n"
                 "variants:\n  - name: a\n  - name: b\n    set: { data.source: synthetic }\n"),
        "");
}

// Item 14: `n_layer: +2` (YAML allows the '+') was reported as out of range.
TEST_F(SpecDefects, AnIntegerWithAPlusSignIsItsValue) {
    const std::string path = write("exp.yaml", "model: { n_layer: +2 }\nrun: { seed: +7 }\n");
    const ExperimentSpec spec = load_experiment(path);
    EXPECT_EQ(spec.base.model.n_layer, 2);
    EXPECT_EQ(spec.base.run.seed, 7u);
    EXPECT_CONTAINS(error_of("model: { n_layer: +-2 }\n"), "expected an integer");
}

// Item 14: `--set model=tiny` suggested "did you mean 'name'?".
TEST_F(SpecDefects, SetOfASectionSuggestsTheKeyThatTakesTheValue) {
    const std::string msg = error_of("name: x\n", {"model=tiny"});
    EXPECT_CONTAINS(msg, "--set model=tiny: 'model' is a section, not a key");
    EXPECT_CONTAINS(msg, "did you mean 'model.preset=tiny'?");
    EXPECT_CONTAINS(error_of("name: x\n", {"optim=3"}), "such as optim.lr=...");
}

// Item 14: a NUL in a key cut the message at a valid-looking key ('model.n_la').
TEST_F(SpecDefects, ANulInAKeyIsShownEscaped) {
    const std::string msg = error_of("model: { \"n_la\\0yer\": 2 }\n");
    EXPECT_CONTAINS(msg, "unknown key 'model.n_la\\x00yer'");
    EXPECT_EQ(msg.find('\0'), std::string::npos);
}

}  // namespace

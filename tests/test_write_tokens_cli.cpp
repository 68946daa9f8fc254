// `microtrain write-tokens` end to end: the binary (MT_BINARY) writes exactly the synthetic stream
// the loader would draw (engine/synthetic.h) as an llm.c token file that read_token_file and
// `validate` accept; the same arguments write the same file; bad arguments and an unwritable
// path fail with a message naming the problem and leave no file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/data.h"
#include "engine/synthetic.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::vector<uint16_t> expected_stream(SyntheticKind kind, int vocab, uint64_t seed, int count) {
    std::vector<int> ids(count);
    SyntheticTokens(kind, vocab, seed).read(0, count, ids.data());
    return {ids.begin(), ids.end()};
}

std::string bytes_of(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(WriteTokensCli, WritesTheUniformStreamAsAnLlmcTokenFile) {
    TempDir d;
    // More than two of the command's 65536-token chunks, so the chunk seams are covered.
    const int count = 2 * 65536 + 3;
    const CliResult r = run_microtrain("write-tokens '" + d.file("t.bin") + "' --count " +
                                       std::to_string(count) + " --vocab-size 512 --seed 5");
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "131075 tokens");
    const std::vector<uint16_t> got = read_token_file(d.file("t.bin"));
    EXPECT_EQ(got, expected_stream(SyntheticKind::uniform, 512, 5, count));
    // llm.c's layout: 256 int32 of header, then 2 bytes a token.
    EXPECT_EQ(fs::file_size(d.file("t.bin")), 256u * 4 + 2u * count);
}

TEST(WriteTokensCli, MarkovStreamIsTheLoadersStreamAndDefaultsAreGpt2Vocab) {
    TempDir d;
    ASSERT_EQ(run_microtrain("write-tokens '" + d.file("m.bin") +
                             "' --count 3000 --synthetic markov --seed 9")
                  .rc,
              0);
    EXPECT_EQ(read_token_file(d.file("m.bin")),
              expected_stream(SyntheticKind::markov, 50257, 9, 3000));
}

TEST(WriteTokensCli, SameArgumentsWriteTheSameBytesAndAnotherSeedDiffers) {
    TempDir d;
    for (const char* name : {"a.bin", "b.bin"})
        ASSERT_EQ(run_microtrain("write-tokens '" + d.file(name) + "' --count 1000 --seed 2").rc,
                  0);
    ASSERT_EQ(run_microtrain("write-tokens '" + d.file("c.bin") + "' --count 1000 --seed 3").rc, 0);
    EXPECT_EQ(bytes_of(d.file("a.bin")), bytes_of(d.file("b.bin")));
    EXPECT_NE(bytes_of(d.file("a.bin")), bytes_of(d.file("c.bin")));
}

TEST(WriteTokensCli, WrittenFileIsAcceptedAsDataSourceTokens) {
    TempDir d;
    ASSERT_EQ(
        run_microtrain("write-tokens '" + d.file("train.bin") + "' --count 400 --vocab-size 256")
            .rc,
        0);
    std::ofstream(d.file("exp.yaml")) << "name: tokens\nbackend: cpu\nmodel: { preset: tiny }\n"
                                         "data: { source: tokens, path: '"
                                      << d.file("train.bin")
                                      << "', batch_size: 2, seq_len: 16 }\n"
                                         "variants:\n  - name: baseline\n";
    const CliResult r = run_microtrain("validate '" + d.file("exp.yaml") + "'");
    EXPECT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "OK:");
}

TEST(WriteTokensCli, UnknownStreamKindFailsListingTheChoicesAndWritesNothing) {
    TempDir d;
    const CliResult r =
        run_microtrain("write-tokens '" + d.file("x.bin") + "' --count 10 --synthetic zipf");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "--synthetic 'zipf': expected one of markov, uniform");
    EXPECT_FALSE(fs::exists(d.file("x.bin")));
}

TEST(WriteTokensCli, VocabularyBeyondUint16AndZeroCountAreRefused) {
    TempDir d;
    const CliResult big =
        run_microtrain("write-tokens '" + d.file("x.bin") + "' --count 10 --vocab-size 65537");
    EXPECT_NE(big.rc, 0) << big.output;
    EXPECT_CONTAINS(big.output, "--vocab-size");
    const CliResult zero = run_microtrain("write-tokens '" + d.file("x.bin") + "' --count 0");
    EXPECT_NE(zero.rc, 0) << zero.output;
    EXPECT_CONTAINS(zero.output, "--count");
    EXPECT_FALSE(fs::exists(d.file("x.bin")));
}

TEST(WriteTokensCli, UnwritablePathFailsNamingIt) {
    TempDir d;
    const std::string path = d.file("no-such-dir/t.bin");
    const CliResult r = run_microtrain("write-tokens '" + path + "' --count 10");
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, path);
}

}  // namespace
}  // namespace mt

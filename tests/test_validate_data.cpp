// `microtrain validate` reads the data files as the loader will: a token >= vocab_size, invalid
// UTF-8 text or a FIFO as data.path fail there (exit 2, the file named), before any run starts.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/data.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// `microtrain validate FILE` under `timeout 30`, so a hang fails the test (exit 124).
CliResult validate(const std::string& file) {
    return run_shell("timeout 30 '" + std::string(MT_BINARY) + "' validate '" + file + "'");
}

class ValidateDataTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("mt_test_validate_data_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    // An experiment reading `data_path` as `source` with a 512-token vocabulary.
    std::string experiment(const std::string& source, const std::string& data_path) {
        const std::string path = (dir_ / "exp.yaml").string();
        std::ofstream(path) << "name: data-check\nbackend: cpu\n"
                               "model: { n_layer: 1, n_embd: 32, n_head: 2, max_seq_len: 16, "
                               "vocab_size: 512 }\n"
                               "data: { source: "
                            << source << ", path: '" << data_path
                            << "', batch_size: 2, seq_len: 8 }\n"
                               "variants:\n  - name: baseline\n";
        return path;
    }

    fs::path dir_;
};

TEST_F(ValidateDataTest, GoodTokenFileValidates) {
    const std::string tokens = (dir_ / "ok.bin").string();
    write_token_file(tokens, std::vector<uint16_t>(100, 7));
    const CliResult r = validate(experiment("tokens", tokens));
    EXPECT_EQ(r.rc, 0) << r.output;
    EXPECT_NE(r.output.find("OK:"), std::string::npos) << r.output;
}

TEST_F(ValidateDataTest, TokenAtOrAboveVocabSizeFailsValidateNamingItsOffset) {
    std::vector<uint16_t> t(100, 7);
    t[42] = 600;  // >= vocab_size 512
    const std::string tokens = (dir_ / "big.bin").string();
    write_token_file(tokens, t);
    const CliResult r = validate(experiment("tokens", tokens));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("token 600 at token offset 42"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("model.vocab_size 512"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("variant 'baseline'"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("OK:"), std::string::npos) << r.output;
}

TEST_F(ValidateDataTest, InvalidUtf8TextFailsValidateNamingTheByte) {
    const std::string text = (dir_ / "bad.txt").string();
    std::ofstream(text, std::ios::binary)
        << std::string(40, 'a') << "\xff\xfe" << std::string(40, 'b');
    // vocab 512 >= 256, as byte-level text needs.
    const CliResult r = validate(experiment("text", text));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("not valid UTF-8 at byte offset 40"), std::string::npos) << r.output;
}

TEST_F(ValidateDataTest, FifoAsDataPathIsRejectedWithoutBlocking) {
    const std::string fifo = (dir_ / "pipe").string();
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const CliResult r = validate(experiment("tokens", fifo));
    EXPECT_EQ(r.rc, 2) << r.output;  // not 124: timeout would mean it blocked
    EXPECT_NE(r.output.find("key 'data.path'"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("is a FIFO (named pipe), not a regular file"), std::string::npos)
        << r.output;
}

TEST_F(ValidateDataTest, SymlinkLoopAsDataPathSaysSo) {
    const fs::path a = dir_ / "a", b = dir_ / "b";
    fs::create_symlink(b, a);
    fs::create_symlink(a, b);
    const CliResult r = validate(experiment("tokens", a.string()));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("too many levels of symbolic links"), std::string::npos) << r.output;
}

TEST_F(ValidateDataTest, DirectoryAsDataPathIsRejected) {
    const CliResult r = validate(experiment("text", dir_.string()));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("got the directory"), std::string::npos) << r.output;
}

// Issue #25 item 8: data.val_path is read like data.path, so a token >= vocab_size in the
// validation file fails `validate` (naming the key), not `train` after creating its directory.
TEST_F(ValidateDataTest, TokenAtOrAboveVocabSizeInValPathFailsValidate) {
    const std::string tokens = (dir_ / "ok.bin").string(), val = (dir_ / "val.bin").string();
    write_token_file(tokens, std::vector<uint16_t>(100, 7));
    std::vector<uint16_t> t(100, 7);
    t[3] = 600;  // >= vocab_size 512
    write_token_file(val, t);
    const std::string path = experiment("tokens", tokens);
    std::string text;
    {
        std::ifstream in(path);
        text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string at = "batch_size: 2";
    text.insert(text.find(at), "val_path: '" + val + "', ");
    std::ofstream(path) << text;
    const CliResult r = validate(path);
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_NE(r.output.find("data.val_path"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("token 600 at token offset 3"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(val), std::string::npos) << r.output;
}

}  // namespace
}  // namespace mt

// Data: llm.c token files, the three sources, window layout, deterministic order, workers, and
// clean shutdown.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/data.h"

namespace fs = std::filesystem;
using namespace mt;

namespace {

class DataTest : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() /
               (std::string("mt_data_") + info->name() + "_" + std::to_string(::getpid()));
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }
    std::string path(const std::string& name) const { return (dir_ / name).string(); }

    // Raw bytes: header ints then payload, for malformed files.
    std::string write_raw(const std::string& name, std::vector<int32_t> header,
                          size_t payload_bytes) {
        header.resize(256, 0);
        std::ofstream f(path(name), std::ios::binary);
        f.write(reinterpret_cast<const char*>(header.data()), 1024);
        const std::string payload(payload_bytes, '\0');
        f.write(payload.data(), static_cast<std::streamsize>(payload.size()));
        return path(name);
    }

    fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const DataError& e) {
        return e.what();
    }
    return "";
}

// The batches as plain vectors (inputs then targets), for comparisons.
std::vector<std::vector<int>> take(DataLoader& loader, int n) {
    std::vector<std::vector<int>> out;
    for (int i = 0; i < n; ++i) {
        const Batch& b = loader.next();
        EXPECT_EQ(b.index, static_cast<uint64_t>(i));
        const size_t e = static_cast<size_t>(b.B) * b.T;
        std::vector<int> v(b.inputs, b.inputs + e);
        v.insert(v.end(), b.targets, b.targets + e);
        out.push_back(std::move(v));
    }
    return out;
}

DataConfig tokens_config(const std::string& p, int B, int T) {
    DataConfig c;
    c.source = DataSource::tokens;
    c.path = p;
    c.batch_size = B;
    c.seq_len = T;
    return c;
}

}  // namespace

TEST_F(DataTest, TokenFileRoundTrips) {
    std::vector<uint16_t> tokens(5000);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i * 7919 % 65536);
    write_token_file(path("t.bin"), tokens);
    EXPECT_EQ(fs::file_size(path("t.bin")), 1024 + 2 * tokens.size());
    EXPECT_EQ(read_token_file(path("t.bin")), tokens);
    EXPECT_EQ(token_file_count(path("t.bin")), tokens.size());
    write_token_file(path("empty.bin"), {});
    EXPECT_TRUE(read_token_file(path("empty.bin")).empty());
    // No temporary file is left beside the target.
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
    EXPECT_EQ(files, 2);
}

TEST_F(DataTest, TokenFileWithBadMagicIsRejected) {
    const std::string p = write_raw("bad.bin", {1234, 1, 10}, 20);
    EXPECT_EQ(error_of([&] { read_token_file(p); }),
              "'" + p + "': bad magic number 1234 (expected 20240520): not an llm.c token file");
}

TEST_F(DataTest, TokenFileWithWrongVersionIsRejected) {
    const std::string p = write_raw("v.bin", {20240520, 7, 10}, 20);
    EXPECT_EQ(error_of([&] { read_token_file(p); }),
              "'" + p + "': unsupported version 7 (expected 1: uint16 tokens)");
}

TEST_F(DataTest, TruncatedTokenFileIsRejectedWithExpectedAndActualSize) {
    const std::string p = write_raw("short.bin", {20240520, 1, 100}, 150);
    EXPECT_EQ(error_of([&] { read_token_file(p); }),
              "'" + p + "': truncated: the header says 100 tokens, expected 1224 bytes, got 1174");
    EXPECT_EQ(error_of([&] { token_file_count(p); }), error_of([&] { read_token_file(p); }));
    { std::ofstream(path("tiny.bin")) << "abc"; }
    EXPECT_EQ(error_of([&] { read_token_file(path("tiny.bin")); }),
              "'" + path("tiny.bin") +
                  "': truncated: an llm.c token file starts with a 1024-byte header, expected at "
                  "least 1024 bytes, got 3");
    const std::string q = write_raw("long.bin", {20240520, 1, 10}, 22);
    EXPECT_NE(error_of([&] { read_token_file(q); }).find("trailing data"), std::string::npos);
}

// A FIFO or a directory named as a token file is rejected at once: opening a FIFO used to wait
// for a writer forever.
TEST_F(DataTest, TokenFileThatIsNotARegularFileIsRejectedWithoutWaiting) {
    const std::string fifo = path("fifo.bin");
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
    EXPECT_EQ(error_of([&] { read_token_file(fifo); }),
              "'" + fifo + "': not a regular file: expected an llm.c token file (.bin)");
    EXPECT_EQ(error_of([&] { token_file_count(fifo); }), error_of([&] { read_token_file(fifo); }));
    EXPECT_NE(error_of([&] { read_token_file(dir_.string()); }).find("not a regular file"),
              std::string::npos);
}

TEST_F(DataTest, SourceShorterThanOneBatchIsRejected) {
    write_token_file(path("s.bin"), std::vector<uint16_t>(64, 1));
    // B=4, T=16 needs 4*16+1 = 65 tokens.
    EXPECT_EQ(error_of([&] { DataLoader l(tokens_config(path("s.bin"), 4, 16), 256, 1); }),
              "'" + path("s.bin") +
                  "': has 64 tokens, but one batch needs 65 (batch_size 4 x seq_len 16 + 1); use "
                  "a longer file or a smaller batch_size / seq_len");
    write_token_file(path("ok.bin"), std::vector<uint16_t>(65, 1));
    EXPECT_NO_THROW(DataLoader(tokens_config(path("ok.bin"), 4, 16), 256, 1));
}

// This process's memory from /proc/self/status, in bytes: `field` is "RssAnon" (private memory,
// what a copy of the file would add) or "VmHWM" (the peak resident set since clear_refs 5).
size_t status_bytes(const std::string& field) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind(field + ":", 0) == 0)
            return std::stoull(line.substr(field.size() + 1)) * 1024;
    return 0;
}

// A token file is mapped, not copied: the loader of a 64 MiB file adds far less than 64 MiB of
// private memory (its pages are the page cache's, shared between ranks and reclaimable), and
// checking it (validate's check_data_source) streams it: the peak resident set stays far below
// the file's size. The bad-token errors stay located (OutOfVocabTokenIsRejected... below).
TEST_F(DataTest, ATokenFileIsMappedAndCheckedWithoutACopy) {
    if (status_bytes("RssAnon") == 0) GTEST_SKIP() << "no /proc/self/status";
    const size_t n = size_t{32} << 20;  // 64 MiB of tokens
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % 251);
    write_token_file(path("big.bin"), t);
    t = {};
    const size_t limit = size_t{16} << 20;
    {
        std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
        const size_t before = status_bytes("VmHWM");
        check_data_source(tokens_config(path("big.bin"), 2, 8), 256);
        EXPECT_LT(status_bytes("VmHWM") - before, limit);
    }
    const size_t before = status_bytes("RssAnon");
    DataLoader loader(tokens_config(path("big.bin"), 2, 8), 256, 1);
    EXPECT_LT(status_bytes("RssAnon") - before, limit);
    EXPECT_EQ(loader.next().inputs[0] >= 0, true);
}

TEST_F(DataTest, OutOfVocabTokenIsRejectedWithFileOffsetAndValue) {
    std::vector<uint16_t> t(300, 5);
    t[123] = 300;
    t[200] = 511;
    write_token_file(path("v.bin"), t);
    EXPECT_EQ(error_of([&] { DataLoader l(tokens_config(path("v.bin"), 2, 8), 256, 1); }),
              "'" + path("v.bin") +
                  "': token 300 at token offset 123 (byte 1270) is >= model.vocab_size 256; the "
                  "file was tokenised for a larger vocabulary: set model.vocab_size to at least "
                  "512");
}

TEST_F(DataTest, RowsAreConsecutiveWindowsAndTargetsAreInputsShiftedByOne) {
    // Token i has value i, so a row's values reveal where its window starts.
    const int T = 8, B = 3, n = 1000;
    std::vector<uint16_t> t(n);
    for (int i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i);
    write_token_file(path("seq.bin"), t);
    DataLoader loader(tokens_config(path("seq.bin"), B, T), 1024, 42);
    for (int step = 0; step < 10; ++step) {
        const Batch& b = loader.next();
        ASSERT_EQ(b.B, B);
        ASSERT_EQ(b.T, T);
        for (int r = 0; r < B; ++r) {
            const int start = b.inputs[r * T];
            EXPECT_EQ(start % T, 0);  // windows start at multiples of T
            for (int k = 0; k < T; ++k) {
                EXPECT_EQ(b.inputs[r * T + k], start + k);
                EXPECT_EQ(b.targets[r * T + k], start + k + 1);
            }
        }
    }
}

TEST_F(DataTest, EachEpochVisitsEveryWindowOnceThenWraps) {
    const int T = 4, B = 5;
    const int windows = 20;  // (81 - 1) / 4
    std::vector<uint16_t> t(windows * T + 1);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i);
    write_token_file(path("e.bin"), t);
    DataLoader loader(tokens_config(path("e.bin"), B, T), 1024, 3);
    std::vector<int> epoch0, epoch1;
    for (int i = 0; i < 2 * windows / B; ++i) {
        const Batch& b = loader.next();
        for (int r = 0; r < B; ++r)
            (i < windows / B ? epoch0 : epoch1).push_back(b.inputs[r * T] / T);
    }
    EXPECT_EQ(std::set<int>(epoch0.begin(), epoch0.end()).size(), size_t(windows));
    EXPECT_EQ(std::set<int>(epoch1.begin(), epoch1.end()).size(), size_t(windows));
    EXPECT_NE(epoch0, epoch1);  // reshuffled per epoch
    std::vector<int> sorted = epoch0;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_NE(epoch0, sorted);  // shuffled, not sequential
}

TEST_F(DataTest, OrderIsDeterministicForASeedAndDiffersForAnother) {
    std::vector<uint16_t> t(4000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(i % 997);
    write_token_file(path("d.bin"), t);
    const DataConfig c = tokens_config(path("d.bin"), 4, 16);
    DataLoader a(c, 1000, 11), b(c, 1000, 11), other(c, 1000, 12);
    const auto ta = take(a, 30), tb = take(b, 30), to = take(other, 30);
    EXPECT_EQ(ta, tb);
    EXPECT_NE(ta, to);

    DataConfig s;
    s.batch_size = 4;
    s.seq_len = 16;
    DataLoader sa(s, 50257, 5), sb(s, 50257, 5), sc(s, 50257, 6);
    const auto xa = take(sa, 5), xb = take(sb, 5), xc = take(sc, 5);
    EXPECT_EQ(xa, xb);
    EXPECT_NE(xa, xc);
}

TEST_F(DataTest, SyntheticTokensAreUniformInVocabRange) {
    DataConfig c;
    c.synthetic = SyntheticKind::uniform;
    c.batch_size = 8;
    c.seq_len = 64;
    const int V = 10;
    DataLoader loader(c, V, 1);
    std::vector<int> counts(V, 0);
    for (int i = 0; i < 20; ++i) {
        const Batch& b = loader.next();
        for (int k = 0; k < b.B * b.T; ++k) {
            ASSERT_GE(b.inputs[k], 0);
            ASSERT_LT(b.inputs[k], V);
            ++counts[b.inputs[k]];
            if ((k + 1) % b.T != 0) {
                EXPECT_EQ(b.targets[k], b.inputs[k + 1]);
            }
        }
    }
    // 10240 draws over 10 values: each near 1024 (6 sigma ~ 180).
    for (int v = 0; v < V; ++v) EXPECT_NEAR(counts[v], 1024, 200) << v;
    EXPECT_GE(loader.num_tokens(), size_t(1) << 20);
}

TEST_F(DataTest, DefaultSyntheticTokensFollowTheMarkovChainInVocabRange) {
    DataConfig c;  // synthetic markov: the default
    c.batch_size = 8;
    c.seq_len = 64;
    const int V = 300;
    DataLoader loader(c, V, 1);
    std::map<int, std::set<int>> successors;
    std::vector<int> counts(V, 0);
    for (int i = 0; i < 20; ++i) {
        const Batch& b = loader.next();
        for (int k = 0; k < b.B * b.T; ++k) {
            ASSERT_GE(b.inputs[k], 0);
            ASSERT_LT(b.inputs[k], V);
            ASSERT_LT(b.targets[k], V);
            ++counts[b.inputs[k]];
            if ((k + 1) % b.T != 0) {
                EXPECT_EQ(b.targets[k], b.inputs[k + 1]);
            }
            successors[b.inputs[k]].insert(b.targets[k]);
        }
    }
    // Skewed (Zipf) frequencies: token 0 is far more frequent than the uniform share (~34).
    EXPECT_GT(counts[0], 5 * 10240 / V);
    // Few successors per token (4 branches, plus the restart at a chunk boundary now and then).
    size_t many = 0;
    for (const auto& [tok, next] : successors) many += next.size() > 6;
    EXPECT_LE(many, successors.size() / 20) << "tokens with more than 6 distinct successors";
}

TEST_F(DataTest, WorkersGiveExactlyTheSameBatchesAsSynchronousLoading) {
    std::vector<uint16_t> t(3000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 31) % 500);
    write_token_file(path("w.bin"), t);
    for (DataSource src : {DataSource::tokens, DataSource::synthetic}) {
        DataConfig c = tokens_config(path("w.bin"), 4, 12);
        c.source = src;
        DataLoader sync(c, 500, 9);
        const auto want = take(sync, 120);  // several epochs of the file
        for (int workers : {1, 2, 3}) {
            for (int prefetch : {1, 3}) {
                DataConfig cw = c;
                cw.workers = workers;
                cw.prefetch = prefetch;
                cw.preprocess_us = workers == 2 ? 5 : 0;
                DataLoader async(cw, 500, 9);
                EXPECT_EQ(take(async, 120), want)
                    << "workers " << workers << " prefetch " << prefetch;
            }
        }
    }
}

TEST_F(DataTest, TextSourceUsesUtf8BytesAsTokens) {
    const std::string text = "h\xc3\xa9llo w\xc3\xb6rld, a small text. ";  // é, ö
    std::string body;
    while (body.size() < 400) body += text;
    std::ofstream(path("t.txt"), std::ios::binary) << body;
    DataConfig c;
    c.source = DataSource::text;
    c.path = path("t.txt");
    c.batch_size = 2;
    c.seq_len = 16;
    DataLoader loader(c, 256, 1);
    EXPECT_EQ(loader.num_tokens(), body.size());
    bool saw_high = false;
    for (int i = 0; i < 10; ++i) {
        const Batch& b = loader.next();
        for (int r = 0; r < b.B; ++r) {
            // Find the window in the text: inputs are bytes at [start, start+T).
            std::string row;
            for (int k = 0; k < b.T; ++k) {
                const int tok = b.inputs[r * b.T + k];
                ASSERT_GE(tok, 0);
                ASSERT_LT(tok, 256);
                saw_high |= tok >= 0x80;
                row.push_back(static_cast<char>(tok));
            }
            EXPECT_NE(body.find(row), std::string::npos);
        }
    }
    EXPECT_TRUE(saw_high);  // bytes above 127 come through unsigned

    EXPECT_EQ(error_of([&] { DataLoader l(c, 100, 1); }),
              "'" + path("t.txt") +
                  "': model.vocab_size must be >= 256 for byte-level text, got 100; set "
                  "model.vocab_size: 256");
    std::ofstream(path("bad.txt"), std::ios::binary) << body << "\xff" << body;
    c.path = path("bad.txt");
    EXPECT_EQ(error_of([&] { DataLoader l(c, 256, 1); }),
              "'" + path("bad.txt") + "': not valid UTF-8 at byte offset " +
                  std::to_string(body.size()) +
                  "; source text expects a UTF-8 text file (use source tokens for an llm.c token "
                  "file)");
}

TEST_F(DataTest, DestructorReturnsWithAFullRingAndBlockedWorkers) {
    DataConfig c;
    c.batch_size = 2;
    c.seq_len = 8;
    c.workers = 3;
    c.prefetch = 2;
    {
        DataLoader never_read(c, 100, 1);  // workers fill the ring and block
    }
    {
        DataLoader l(c, 100, 1);
        l.next();
        l.next();
        // Workers refill the ring and block again; the destructor must wake and join them.
    }
    {
        // Workers busy in a long simulated preprocessing spin (4 x 0.5 s per batch): the
        // destructor stops them mid-spin instead of waiting for the batch.
        c.preprocess_us = 500000;
        c.batch_size = 4;
        DataLoader l(c, 100, 1);
    }
    SUCCEED();
}

TEST_F(DataTest, InvalidConfigIsRejected) {
    DataConfig c;
    c.prefetch = 0;
    c.workers = 1;
    EXPECT_EQ(error_of([&] { DataLoader l(c, 100, 1); }),
              "data config: prefetch must be >= 1, got 0");
    c = DataConfig{};
    c.source = DataSource::tokens;
    EXPECT_EQ(error_of([&] { DataLoader l(c, 100, 1); }),
              "data config: source tokens needs a path (data.path)");
}

TEST_F(DataTest, DescribeLabelsPreprocessingAsSimulated) {
    DataConfig c;
    c.workers = 2;
    c.prefetch = 4;
    c.preprocess_us = 300;
    DataLoader l(c, 100, 1);
    const std::string d = l.describe();
    EXPECT_NE(d.find("synthetic"), std::string::npos) << d;
    EXPECT_NE(d.find("B4 T64, workers 2, prefetch 4"), std::string::npos) << d;
    EXPECT_NE(d.find("preprocess 300 us/sample (simulated)"), std::string::npos) << d;
}

TEST_F(DataTest, HostBatchesComeFromTheBackendUnderTheDataCategory) {
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    const auto data = static_cast<int>(MemoryCategory::data);
    const size_t before = backend->memory_stats().current[data];
    {
        DataConfig c;
        c.batch_size = 4;
        c.seq_len = 16;
        c.workers = 2;
        c.prefetch = 3;
        DataLoader l(c, 100, 1, backend.get());
        // 3 slots x (inputs + targets) x B*T int32.
        EXPECT_GE(backend->memory_stats().current[data] - before, 3u * 2 * 4 * 16 * sizeof(int));
        const auto a = take(l, 4);
        c.workers = 0;
        DataLoader plain(c, 100, 1);  // no backend: std::vector slots, same batches
        EXPECT_EQ(take(plain, 4), a);
    }
    EXPECT_EQ(backend->memory_stats().current[data], before);
}

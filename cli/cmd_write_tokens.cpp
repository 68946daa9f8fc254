// `microtrain write-tokens OUT --count N [--vocab-size V] [--seed S] [--synthetic uniform|markov]`:
// writes N tokens of one of microtrain's synthetic streams (engine/synthetic.h) as an llm.c
// token file (engine/data.h: the 256-int32 header, then uint16 tokens). The same file is what
// `data.source: tokens` reads, and what llm.c's own trainer reads as a shard: tools/gpu-bench.sh
// writes its train and val shards with it, so the peer trains on tokens microtrain made. The
// stream is a pure function of (kind, vocab size, seed, position): the same arguments write the
// same bytes. Exit 0 written, 2 for arguments or a file that cannot be written.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/data.h"
#include "engine/synthetic.h"

namespace mt {
namespace {

// uint16 tokens: llm.c's format holds ids below 65536; the header's count is an int32.
constexpr int kMaxVocab = 65536;
constexpr int64_t kMaxTokens = INT32_MAX;

struct WriteTokensArgs {
    std::string out;
    int64_t count = 0;
    int vocab_size = 50257;  // GPT-2's tokenizer
    uint64_t seed = 1;
    std::string synthetic = "uniform";
};

int run_write_tokens(const WriteTokensArgs& a) {
    const auto kind = parse_enum<SyntheticKind>(a.synthetic);
    if (!kind) {
        std::fprintf(stderr, "microtrain write-tokens: --synthetic '%s': expected one of %s\n",
                     a.synthetic.c_str(), enum_choices<SyntheticKind>().c_str());
        return 2;
    }
    const SyntheticTokens stream(*kind, a.vocab_size, a.seed);
    std::vector<uint16_t> tokens(static_cast<size_t>(a.count));
    // In chunks, through an int buffer (the stream's unit): the whole file never exists twice.
    constexpr int kChunk = 1 << 16;
    std::vector<int> chunk(kChunk);
    for (int64_t start = 0; start < a.count; start += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, a.count - start));
        stream.read(static_cast<uint64_t>(start), n, chunk.data());
        std::copy_n(chunk.begin(), n, tokens.begin() + start);
    }
    try {
        write_token_file(a.out, tokens);
    } catch (const DataError& e) {
        std::fprintf(stderr, "microtrain write-tokens: %s\n", e.what());
        return 2;
    }
    std::printf("wrote %s: %lld tokens, %s synthetic stream, vocab %d, seed %llu\n", a.out.c_str(),
                static_cast<long long>(a.count), a.synthetic.c_str(), a.vocab_size,
                static_cast<unsigned long long>(a.seed));
    return 0;
}

}  // namespace

void register_write_tokens_command(CLI::App& app, int& exit_code) {
    auto a = std::make_shared<WriteTokensArgs>();
    CLI::App* cmd = app.add_subcommand(
        "write-tokens",
        "Write a synthetic token stream as an llm.c token file (data.source: tokens reads it; "
        "so does llm.c)");
    cmd->add_option("out", a->out, "The token file to write (replaced atomically)")->required();
    cmd->add_option("--count", a->count, "How many tokens")
        ->required()
        ->check(CLI::Range(int64_t{1}, kMaxTokens));
    cmd->add_option("--vocab-size", a->vocab_size,
                    "Tokens are drawn from [0, vocab-size) (default 50257, GPT-2's)")
        ->check(CLI::Range(1, kMaxVocab));
    cmd->add_option("--seed", a->seed, "Seed of the stream (default 1)");
    cmd->add_option("--synthetic", a->synthetic,
                    "uniform (hashed, nothing to learn: speed runs; the default) or markov (a "
                    "learnable chain), as data.synthetic");
    cmd->callback([a, &exit_code] { exit_code = run_write_tokens(*a); });
}

}  // namespace mt

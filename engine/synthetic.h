// Synthetic token streams: the data of an experiment that names no file. Both are pure functions
// of (kind, vocab_size, seed, position), so the loader can read any window of the stream in any
// order, from any thread, and batch i is the same on every run.
//
//   markov   (the default) a seeded sparse Markov chain over the vocabulary. Each token has
//            kBranches successors, drawn once from a Zipf(1) distribution over the vocabulary;
//            the next token takes successor j with probability kBranchProbability[j]. A model
//            learns it in two visible stages: first the skewed unigram frequencies (the loss
//            falls from ln V towards the unigram entropy, ~6.5 nats at V = 8192, within tens of
//            steps), then the successor table (towards the branch entropy, ~1.09 nats). A
//            variant whose gradients are wrong falls more slowly, so the loss check can catch it.
//   uniform  token p = hash(seed, p) mod V: nothing to learn, the loss stays at ln V whatever
//            the model computes. For pure speed runs, where only the time matters.
//
// Position p of the markov stream lies in chunk p / kChunkTokens; each chunk restarts the chain
// from a seeded Zipf-distributed token, so reading a window costs at most one chunk of walking
// (kChunkTokens steps), not a walk from the start of the stream.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/enum_names.h"

namespace mt {

enum class SyntheticKind { markov, uniform };
template <>
struct EnumSpelling<SyntheticKind> {
    static constexpr std::array<std::string_view, 2> names{"markov", "uniform"};
};

// splitmix64: a 64-bit bijective mixer; hashes (seed, position) into tokens and derives the
// loader's per-epoch shuffle seeds, identically on every platform.
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

class SyntheticTokens {
  public:
    static constexpr int kBranches = 4;
    static constexpr std::array<double, kBranches> kBranchProbability{0.6, 0.2, 0.12, 0.08};
    static constexpr uint64_t kChunkTokens = 1024;

    // vocab_size >= 1. The markov tables take (kBranches * 4 + 8) bytes per vocabulary entry.
    SyntheticTokens(SyntheticKind kind, int vocab_size, uint64_t seed);

    // Writes tokens [start, start + count) of the stream into out (each in [0, vocab_size)).
    void read(uint64_t start, int count, int* out) const;

    SyntheticKind kind() const { return kind_; }

  private:
    int zipf_token(uint64_t random_bits) const;            // inverse CDF of Zipf(1) over [0, vocab)
    int successor(int token, uint64_t branch_bits) const;  // branch j by kBranchProbability

    SyntheticKind kind_;
    int vocab_;
    uint64_t seed_;
    std::vector<double> zipf_cdf_;     // (V) cumulative Zipf(1) probabilities, last = 1
    std::vector<int32_t> successors_;  // (V, kBranches) row-major
};

}  // namespace mt

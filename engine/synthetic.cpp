#include "engine/synthetic.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace mt {

namespace {

// Stream salts: the uniform stream keeps its historical salt so its tokens are unchanged.
constexpr uint64_t kUniformSalt = 0xD47A5EEDull;
constexpr uint64_t kTableSalt = 0x7AB1E5ull;   // the successor table
constexpr uint64_t kChunkSalt = 0xC4B57ull;    // each chunk's first token
constexpr uint64_t kBranchSalt = 0xB7A9C4ull;  // the branch taken at each position

// A uniform double in [0, 1) from the top 53 bits.
double unit_interval(uint64_t bits) {
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

}  // namespace

SyntheticTokens::SyntheticTokens(SyntheticKind kind, int vocab_size, uint64_t seed)
    : kind_(kind), vocab_(vocab_size), seed_(seed) {
    if (vocab_size < 1)
        throw std::invalid_argument("synthetic tokens: vocab_size must be >= 1, got " +
                                    std::to_string(vocab_size));
    if (kind_ == SyntheticKind::uniform) {
        seed_ = splitmix64(seed ^ kUniformSalt);
        return;
    }
    // Zipf(1): P(rank r) = (1 / (r + 1)) / H_V. Rank r is token r: which ids are frequent does
    // not matter to a model whose embeddings start random.
    zipf_cdf_.resize(static_cast<size_t>(vocab_));
    double total = 0;
    for (int r = 0; r < vocab_; ++r) zipf_cdf_[r] = total += 1.0 / (r + 1.0);
    for (double& c : zipf_cdf_) c /= total;
    zipf_cdf_.back() = 1.0;
    successors_.resize(static_cast<size_t>(vocab_) * kBranches);
    const uint64_t table_seed = splitmix64(seed ^ kTableSalt);
    for (size_t i = 0; i < successors_.size(); ++i)
        successors_[i] = zipf_token(splitmix64(table_seed + i));
}

int SyntheticTokens::zipf_token(uint64_t random_bits) const {
    const double u = unit_interval(random_bits);
    const auto it = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u);
    return static_cast<int>(std::min<ptrdiff_t>(it - zipf_cdf_.begin(), vocab_ - 1));
}

int SyntheticTokens::successor(int token, uint64_t branch_bits) const {
    const double u = unit_interval(branch_bits);
    int j = 0;
    double acc = kBranchProbability[0];
    while (j + 1 < kBranches && u >= acc) acc += kBranchProbability[++j];
    return successors_[static_cast<size_t>(token) * kBranches + j];
}

void SyntheticTokens::read(uint64_t start, int count, int* out) const {
    if (kind_ == SyntheticKind::uniform) {
        for (int i = 0; i < count; ++i)
            out[i] =
                static_cast<int>(splitmix64(seed_ + start + i) % static_cast<uint64_t>(vocab_));
        return;
    }
    // Walk the chain from the start of start's chunk; restart at every chunk boundary.
    const uint64_t chunk_seed = splitmix64(seed_ ^ kChunkSalt);
    const uint64_t branch_seed = splitmix64(seed_ ^ kBranchSalt);
    uint64_t p = start - start % kChunkTokens;
    int token = 0;
    for (int emitted = 0; emitted < count; ++p) {
        token = p % kChunkTokens == 0 ? zipf_token(splitmix64(chunk_seed + p / kChunkTokens))
                                      : successor(token, splitmix64(branch_seed + p));
        if (p >= start) out[emitted++] = token;
    }
}

}  // namespace mt
